"""`spark.readStream.format("quorumqueue")`: the data source Spark instantiates.

Spark finds it without a register call: at the first data-source lookup of a
session, PySpark imports every top-level module whose name starts with `pyspark_`
and registers its `DefaultSource` under `DefaultSource.name()`. The top-level module
`pyspark_quorumqueue` (connector/discovery/) re-exports this class.

The class itself is thin: it names the source, declares the schema, and on
`schema` (called by `load()`) and `streamReader` (called when the query starts)
parses the options, so an unknown or invalid one fails at `load()` naming it, or at
the latest when the query starts if the caller gave its own schema. `streamReader`
then settles the mode (asking the broker when `mode` is unset) and hands over to
the mode's reader. Spark calls `streamReader` on the driver, in the
process that answers offset calls and again where it plans the scan; executors get
the reader pickled, so constructing one does no I/O beyond the mode check.
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource, DataSourceStreamReader
from pyspark.sql.types import StructType

from .options import Mode, OptionError, parse_source_options
from .schema import SCHEMA

NAME = "quorumqueue"


class QuorumQueueDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        # Spark calls schema() at load() (reads only: writes never call it), so bad
        # options fail there, before a query even starts.
        parse_source_options(self.options)
        return SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = parse_source_options(self.options)
        if schema != SCHEMA:
            raise OptionError(f"the quorumqueue source has a fixed schema and cannot read "
                              f"as {schema.simpleString()}; drop .schema(...) and select "
                              f"or cast columns instead (its schema: {SCHEMA.simpleString()})")
        from .connection import detect_mode

        mode = detect_mode(options)
        if mode is Mode.CONSUME:
            raise NotImplementedError(
                "consume mode (any AMQP 0-9-1 broker, e.g. RabbitMQ) is not implemented yet; "
                "the quorumqueue source reads only from the bundled broker for now "
                "(option 'mode' = 'lease')")
        from .lease_reader import LeaseStreamReader

        return LeaseStreamReader(options)
