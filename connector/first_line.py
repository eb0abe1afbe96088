"""Errors Spark shows as their message alone, on the first line.

PySpark's workers (the planner and the streaming source runner among them) report an
exception as a traceback unless the environment variable SPARK_HIDE_TRACEBACK is
set (pyspark.util.handle_worker_exception), and Spark prints what the worker sent
after its own prefix (`[PYTHON_DATA_SOURCE_ERROR] ...: `,
`[PYTHON_STREAMING_DATA_SOURCE_RUNTIME_ERROR] ...: `). `message_alone()` sets it in
the worker about to report the error, which exits right after, so no other error
loses its traceback (and never in another process, where a Spark session started
later would inherit it). Used for the errors that say what the user must do:
an OptionError (source.py) and a fenced lease (lease_reader.py).
"""

from __future__ import annotations

import os
import sys

# What PySpark's worker reads when it reports an error (pyspark.util.handle_worker_exception).
HIDE_TRACEBACK = "SPARK_HIDE_TRACEBACK"


def message_alone() -> None:
    """Have this PySpark worker report the error being raised as its message alone."""
    if in_a_pyspark_worker():  # elsewhere (a test, a driver) nothing reads it
        os.environ[HIDE_TRACEBACK] = "1"


def in_a_pyspark_worker() -> bool:
    """Whether this process is a PySpark worker (run as `python -m pyspark.daemon`, or
    a `pyspark.` worker module), which exits after reporting an error."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return spec is not None and spec.name.startswith("pyspark.")
