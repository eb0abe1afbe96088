"""`spark.read.format("quorumqueue.log")`: the broker's quorum log as a DataFrame.

    log = spark.read.format("quorumqueue.log").load("/var/lib/quorumqueue")
    log.groupBy("queue", "file_kind").agg(F.sum("disk_bytes")).show()

Responsibilities: list a node's log files on the driver, read them in parallel (files
packed into input partitions), and hand Spark Arrow record batches with the columns of
`log_files.COLUMNS`. Registered without a register call, like the connector: PySpark
imports the top-level module `pyspark_quorumqueue_log` (connector/discovery/) and
registers its `DefaultSource`.

Options (names case-insensitive, as everywhere in Spark):
    path       one data directory, or several comma-separated (one per node); the
               broker's --data-dir. Required (`.load(path)` sets it).
    node       the node name for the `node` column (only with one path); default: the
               data directory's name.

How it works: the driver lists the files when Spark plans the scan and packs them
into partitions of at most about PARTITION_BYTES (largest first, each into the
lightest partition; a multiple of the cores Spark has, at most one per file);
executors parse them with the broker's own checks into Arrow record batches
(log_files.read_batches: segment entries column-wise, broker/raft/storage/scan.py).
A live broker may be writing: a torn tail becomes a TORN_TAIL row, a vanished file
yields nothing, corruption or an unknown format version fails the query naming the
file and offset.

Not here: the analyses (jobs/segment_compaction.py, jobs/memory_footprint.py, next).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from .log_files import COLUMNS, LogFile, list_files, read_batches

NAME = "quorumqueue.log"
BATCH_ROWS = 8192
PARTITION_BYTES = 128 << 20
SCHEMA_DDL = ", ".join(f"`{name}` {kind}" for name, kind in COLUMNS)
KNOWN_OPTIONS = ("path", "paths", "node")


class LogSourceError(ValueError):
    pass


@dataclass(frozen=True)
class FilePartition(InputPartition):
    files: tuple[LogFile, ...]


class QuorumQueueLogDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        _directories(self.options)   # bad options fail at load()
        return SCHEMA_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        from pyspark import SparkContext

        context = SparkContext._active_spark_context
        cores = context.defaultParallelism if context is not None else 2
        return LogReader(_directories(self.options), self.options.get("node"), cores)


class LogReader(DataSourceReader):
    def __init__(self, directories: list[str], node: str | None, cores: int = 2) -> None:
        self.directories = directories
        self.node = node
        self.cores = cores

    def partitions(self) -> list[FilePartition]:
        files = [file for directory in self.directories
                 for file in list_files(directory, self.node)]
        return [FilePartition(tuple(group)) for group in pack(files, self.cores)]

    def read(self, partition: FilePartition) -> Iterator["pyarrow.RecordBatch"]:  # noqa: F821
        """The files' batches in order; small ones (snapshots, short WAL files) are
        combined up to BATCH_ROWS rows, so a thousand snapshots are not a thousand
        Arrow messages."""
        small, rows = [], 0
        for file in partition.files:
            for batch in read_batches(file, BATCH_ROWS):
                if batch.num_rows >= BATCH_ROWS // 2:
                    yield from _combined(small)
                    small, rows = [], 0
                    yield batch
                else:
                    small.append(batch)
                    rows += batch.num_rows
                    if rows >= BATCH_ROWS // 2:
                        yield from _combined(small)
                        small, rows = [], 0
        yield from _combined(small)


def pack(files: list[LogFile], cores: int) -> list[list[LogFile]]:
    """Files into partitions of at most about PARTITION_BYTES: largest first, each into
    the lightest partition; a multiple of `cores` partitions (so the last wave of tasks
    keeps every core busy), at most one per file; files in their listed order within a
    partition."""
    sizes = {file: _size(file) for file in files}
    count = -(-sum(sizes.values()) // PARTITION_BYTES)
    count = min(max(cores, -(-count // cores) * cores), len(files))
    bins: list[list[LogFile]] = [[] for _ in range(count)]
    loads = [0] * count
    for file in sorted(files, key=lambda f: -sizes[f]):
        lightest = loads.index(min(loads))
        bins[lightest].append(file)
        loads[lightest] += sizes[file]
    order = {file: position for position, file in enumerate(files)}
    return [sorted(group, key=order.__getitem__) for group in bins if group]


def _combined(batches: list) -> list:
    if len(batches) <= 1:
        return batches
    import pyarrow as pa

    return pa.Table.from_batches(batches).combine_chunks().to_batches()


def _size(file: LogFile) -> int:
    try:
        return os.path.getsize(os.path.join(file.data_dir, file.path))
    except FileNotFoundError:
        return 0


def _directories(options) -> list[str]:
    unknown = sorted(key for key in options if key.lower() not in KNOWN_OPTIONS)
    if unknown:
        raise LogSourceError(f"unknown option(s) {', '.join(map(repr, unknown))} for "
                             f"format '{NAME}'; it takes {', '.join(KNOWN_OPTIONS[::2])}")
    raw = options.get("path") or options.get("paths") or ""
    if raw.startswith("["):           # load(["a", "b"]) passes a JSON list
        import json

        raw = ",".join(json.loads(raw))
    directories = [part.strip() for part in raw.split(",") if part.strip()]
    if not directories:
        raise LogSourceError(f"format '{NAME}' needs option 'path': the broker's data "
                             "directory, e.g. .load('/var/lib/quorumqueue')")
    missing = [d for d in directories if not os.path.isdir(d)]
    if missing:
        raise LogSourceError(f"option 'path': no such directory: {', '.join(missing)}")
    if options.get("node") and len(directories) > 1:
        raise LogSourceError("option 'node' names one node; with several paths each "
                             "node is named after its data directory")
    return directories
