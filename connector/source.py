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
"""

from __future__ import annotations

from pyspark.sql.datasource import (DataSource, DataSourceReader, DataSourceStreamReader,
                                    DataSourceStreamWriter, DataSourceWriter)
from pyspark.sql.types import StructType

from .options import (Mode, OptionError, parse_batch_read_options, parse_read_options,
                      parse_source_options)
from .schema import SCHEMA

NAME = "quorumqueue"


class QuorumQueueDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return NAME

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

            return ConsumeStreamReader(options)
        from .lease_reader import LeaseStreamReader

        return LeaseStreamReader(options)

    def reader(self, schema: StructType) -> DataSourceReader:
        """`spark.read.format("quorumqueue")`: drain or peek (batch_reader.py)."""
        options = parse_batch_read_options(self.options)
        _check_schema(schema)
        from .batch_reader import QueueBatchReader
        from .connection import detect_mode

        return QueueBatchReader(options, detect_mode(options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """`df.writeStream.format("quorumqueue")`: the sink (sink.py)."""
        from .sink import stream_writer

        return stream_writer(self.options, schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """`df.write.format("quorumqueue")`: the sink (sink.py)."""
        from .sink import batch_writer

        return batch_writer(self.options, schema, overwrite)


def _check_schema(schema: StructType) -> None:
    if schema != SCHEMA:
        raise OptionError(f"the quorumqueue source has a fixed schema and cannot read "
                          f"as {schema.simpleString()}; drop .schema(...) and select "
                          f"or cast columns instead (its schema: {SCHEMA.simpleString()})")
