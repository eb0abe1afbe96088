"""pyproject.toml's package list, and the module PySpark discovers the source by.

pyproject.toml and connector/README.md: the folders ship as `quorumqueue.<folder>` (no generic top-level
names), and `spark.readStream.format("quorumqueue")` works right after `pip install`
with no register call, because PySpark registers the `DefaultSource` of every
top-level `pyspark_*` module it finds with `pkgutil.iter_modules()`.
"""

from __future__ import annotations

import pkgutil
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_folder_is_listed_and_mapped():
    mapping = SETUPTOOLS["package-dir"]
    found = set()
    for folder in ("broker", "cli", "client", "connector", "jobs"):
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / folder)
            if "discovery" in relative.parts:
                continue
            found.add(".".join(("quorumqueue", folder, *relative.parts)))
    listed = set(SETUPTOOLS["packages"])
    assert found - listed == set(), "folders missing from [tool.setuptools] packages"
    assert listed - found == {"pyspark_quorumqueue", "pyspark_quorumqueue_log"}
    for package in listed:
        top = ".".join(package.split(".")[:2]) if package.startswith("quorumqueue.") else package
        assert top in mapping, f"{top} has no package-dir entry"
    for module in ("pyspark_quorumqueue", "pyspark_quorumqueue_log"):
        assert (ROOT / mapping[module] / "__init__.py").is_file()


def test_pyspark_discovers_the_source_module():
    found = [module for module in pkgutil.iter_modules() if module.name == "pyspark_quorumqueue"]
    assert found, ("pyspark_quorumqueue is not on sys.path as a file, so PySpark will not "
                   "find the source: run `make setup` (an editable install needs its .pth)")
    import pyspark_quorumqueue
    from pyspark.sql.datasource import DataSource

    from quorumqueue.connector.source import QuorumQueueDataSource

    assert pyspark_quorumqueue.DefaultSource is QuorumQueueDataSource
    assert issubclass(QuorumQueueDataSource, DataSource)
    assert QuorumQueueDataSource.name() == "quorumqueue"


def test_pyspark_discovers_the_log_source_module():
    found = [m for m in pkgutil.iter_modules() if m.name == "pyspark_quorumqueue_log"]
    assert found, "pyspark_quorumqueue_log is not on sys.path: run `make setup`"
    import pyspark_quorumqueue_log

    from quorumqueue.jobs.log_source import QuorumQueueLogDataSource

    assert pyspark_quorumqueue_log.DefaultSource is QuorumQueueLogDataSource
    assert QuorumQueueLogDataSource.name() == "quorumqueue.log"


def test_the_web_ui_files_ship_as_package_data():
    """include-package-data is off: the management web UI (broker/management/ui/,
    served by the broker at / and /ui/) ships only through [tool.setuptools.package-data]."""
    from fnmatch import fnmatch

    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]["quorumqueue.broker.management"]
    files = [path.relative_to(ROOT / "broker" / "management").as_posix()
             for path in (ROOT / "broker" / "management" / "ui").iterdir() if path.is_file()]
    assert "ui/index.html" in files
    for name in files:
        assert any(fnmatch(name, pattern) for pattern in patterns), f"{name} would not ship"
