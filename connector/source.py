"""`spark.readStream.format("quorumqueue")` and `spark.read.format("quorumqueue")`: the
data source Spark instantiates.

Spark finds it without a register call: at the first data-source lookup of a
session, PySpark imports every top-level module whose name starts with `pyspark_`
and registers its `DefaultSource` under `DefaultSource.name()`. The top-level module
`pyspark_quorumqueue` (connector/discovery/) re-exports this class.

The class itself is thin: it names the source, declares the schema, and on
`schema` (called by `load()`) and `streamReader` (called when the query starts)
parses the options, so an unknown or invalid one fails at `load()` naming it, or at
the latest when the query starts if the caller gave its own schema. `streamReader`
then settles the mode (asking the broker when `mode` is unset) and hands over to
the mode's reader (lease_reader.py, consume_reader.py); `reader` does the same for
batch reads (batch_reader.py); `streamWriter` and `writer` hand over to the sink
(sink.py). Spark calls `streamReader` on the driver, in the
process that answers offset calls and again where it plans the scan; executors get
the reader pickled, so constructing one does no I/O beyond the mode check.

An `OptionError` reaches the user as its message on the first line of the error.
Spark runs these methods in a Python worker and raises an AnalysisException reading
`[PYTHON_DATA_SOURCE_ERROR] Failed to create Python data source instance: ` followed
by the text the worker sent: by default a traceback of the connector's frames, the
message naming the option on its last line. Raising one of PySpark's error classes
instead changes nothing (the worker formats every exception the same way). The
worker sends the exception line alone when the environment variable
SPARK_HIDE_TRACEBACK is set, which is what the session setting
`spark.sql.execution.pyspark.udf.hideTraceback.enabled` does for every worker;
`_options_checked` sets it for an OptionError only (first_line.py). Not for `streamReader`: when Spark starts a query, PySpark (4.2 and 4.3)
runs it in its streaming source runner, whose `finally: reader.stop()` replaces any
exception from `streamReader` with an UnboundLocalError; only the traceback, which
chains the two, still shows the option's message (options given with `.schema(...)`
are first checked there; without one, `schema` checked them at `load()`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import TypeVar

from pyspark.sql.datasource import (DataSource, DataSourceReader, DataSourceStreamReader,
                                    DataSourceStreamWriter, DataSourceWriter)
from pyspark.sql.types import StructType

from .first_line import message_alone
from .options import (Mode, OptionError, consume_mode_pattern_error,
                      parse_batch_read_options, parse_read_options, parse_source_options)
from .schema import SCHEMA

NAME = "quorumqueue"

Method = TypeVar("Method", bound=Callable)


def _options_checked(method: Method) -> Method:
    """`method`, whose OptionError Spark shows as its message (see the module header)."""
    @wraps(method)
    def checked(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except OptionError:
            message_alone()
            raise
    return checked  # type: ignore[return-value]


class QuorumQueueDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return NAME

    @_options_checked
    def schema(self) -> StructType:
        # Spark calls schema() at load() (reads only: writes never call it), so bad
        # options fail there, before a query even starts. It does not say whether the
        # read is a stream or a batch: streamReader and reader check that.
        parse_read_options(self.options)
        return SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = parse_source_options(self.options)
        _check_schema(schema)
        from .connection import detect_mode

        if detect_mode(options) is Mode.CONSUME:
            from .consume_reader import ConsumeStreamReader

            if options.queue_pattern is not None:
                raise OptionError(consume_mode_pattern_error())

            return ConsumeStreamReader(options)
        from .lease_reader import LeaseStreamReader

        return LeaseStreamReader(options)

    @_options_checked
    def reader(self, schema: StructType) -> DataSourceReader:
        """`spark.read.format("quorumqueue")`: drain or peek (batch_reader.py)."""
        options = parse_batch_read_options(self.options)
        _check_schema(schema)
        from .batch_reader import QueueBatchReader
        from .connection import detect_mode

        return QueueBatchReader(options, detect_mode(options))

    @_options_checked
    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """`df.writeStream.format("quorumqueue")`: the sink (sink.py)."""
        from .sink import stream_writer

        return stream_writer(self.options, schema)

    @_options_checked
    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """`df.write.format("quorumqueue")`: the sink (sink.py)."""
        from .sink import batch_writer

        return batch_writer(self.options, schema, overwrite)


def _check_schema(schema: StructType) -> None:
    if schema != SCHEMA:
        raise OptionError(f"the quorumqueue source has a fixed schema and cannot read "
                          f"as {schema.simpleString()}; drop .schema(...) and select "
                          f"or cast columns instead (its schema: {SCHEMA.simpleString()})")
