"""Makes `spark.readStream.format("quorumqueue")` work right after `pip install`.

PySpark (4.0+) registers Python data sources by themselves: at a session's first
data-source lookup it imports every top-level module whose name starts with
`pyspark_` (`pkgutil.iter_modules()`, so the module must be a file on `sys.path`)
and registers its `DefaultSource` under `DefaultSource.name()`. This is that module,
installed at the top level of site-packages (pyproject.toml: `py-modules`); it is
the only top-level name quorumqueue adds besides the `quorumqueue` namespace.
"""

from quorumqueue.connector.source import QuorumQueueDataSource as DefaultSource

__all__ = ["DefaultSource"]
