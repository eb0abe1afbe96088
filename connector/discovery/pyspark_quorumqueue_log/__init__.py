"""Makes `spark.read.format("quorumqueue.log")` work right after `pip install`.

The analytics jobs' data source over the broker's log files (jobs/log_source.py),
found by PySpark the same way as the connector (see ../pyspark_quorumqueue/): one
`DefaultSource` per top-level `pyspark_*` module.
"""

from quorumqueue.jobs.log_source import QuorumQueueLogDataSource as DefaultSource

__all__ = ["DefaultSource"]
