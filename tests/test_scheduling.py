"""The order `make test` hands test files to its workers (tests/conftest.py): the
slowest files first, each file's tests in their own order, and the Makefile keeps
pytest-xdist from reordering the files (--no-loadscope-reorder)."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

from tests import conftest

ROOT = Path(__file__).resolve().parents[1]


def test_the_slowest_files_go_first_then_the_slow_folders_then_the_rest():
    names = ["tests/broker/fifo/test_machine.py::a", "tests/connector/test_options.py::b",
             "tests/connector/test_delta_restart.py::c", "tests/jobs/test_cli.py::d",
             "tests/connector/test_kafka_options.py::e", "tests/broker/fifo/test_machine.py::f",
             "tests/jobs/test_orders_to_delta.py::g", "tests/connector/test_delta_restart.py::h"]
    items = [SimpleNamespace(nodeid=name) for name in names]
    conftest.pytest_collection_modifyitems(items)
    assert [item.nodeid for item in items] == [
        "tests/connector/test_delta_restart.py::c", "tests/connector/test_delta_restart.py::h",
        "tests/jobs/test_orders_to_delta.py::g", "tests/connector/test_kafka_options.py::e",
        "tests/jobs/test_cli.py::d", "tests/connector/test_options.py::b",
        "tests/broker/fifo/test_machine.py::a", "tests/broker/fifo/test_machine.py::f"]


def test_every_listed_file_exists():
    missing = [path for path in conftest.LONGEST_FILES if not (ROOT / path).is_file()]
    assert missing == [], "renamed or removed: update tests/conftest.py's LONGEST_FILES"


def test_make_test_keeps_the_order():
    (xdist,) = re.findall(r"^XDIST := (.*)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert "--dist loadfile" in xdist and "--no-loadscope-reorder" in xdist
