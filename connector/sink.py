"""`df.writeStream.format("quorumqueue")` and `df.write.format("quorumqueue")`: the sink.

Responsibilities
    `stream_writer` / `batch_writer` (called by the data source on the driver, when a
    query or a write starts) parse the options, check the DataFrame's columns and
    that the destination exists, so mistakes fail at start naming the option or
    column. The writers' `write` runs once per task on an executor: it publishes the
    task's rows with publisher confirms (publisher.py) and fails the task unless the
    broker confirmed every one.

How it works
    Each task publishes with an idempotency key the bundled broker de-duplicates on
    (sink_rows.py, docs/behaviour/idempotent-publishing.md):
    - streaming: publisher `spark-query/<query id>/<partition>`, seq from
      (batch id, row): Spark sets the query id (stable across restarts) and the
      batch id as the task's local properties `sql.streaming.queryId` and
      `streaming.sql.batchId`. A task retry, or a batch that Spark runs again after a
      restart because its commit log entry is missing, publishes the same rows with
      the same keys, and the broker confirms them without storing them twice.
    - `df.write`: publisher `spark-write/<random id of the write>/<partition>`, seq
      from the row: retries of a task are de-duplicated; running the write again is a
      new write.
    Against another broker (RabbitMQ) the headers are ordinary headers and the sink
    is at-least-once: a retried task or a replayed batch publishes its rows again.

    Messages become visible when the broker confirms them, inside the task: AMQP has
    no transaction spanning tasks, so `commit` has nothing left to do, and `abort`
    cannot take back what succeeded tasks published (a replay does not add it twice
    to the bundled broker).

Invariants
    - A task returns only when every one of its rows was confirmed (none nacked or
      returned); otherwise it raises.
    - The key of a row depends only on (query, partition, batch, row) or (write,
      partition, row): so replays are only exact if the query produces the same rows
      in the same partitions in the same order, which Spark's own exactly-once
      contract already asks of sources.

Not here
    Row conversion and column rules (sink_rows.py), the AMQP work (publisher.py), the
    options (options.py).
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pika
import pika.exceptions
import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (DataSourceArrowWriter, DataSourceStreamArrowWriter,
                                    WriterCommitMessage)
from pyspark.sql.types import StructType

from .options import EXCHANGE, OptionError, SinkOptions, parse_sink_options
from .publisher import ConfirmedPublisher
from .sink_rows import (ROWS_PER_BATCH_ID, IdempotencyKey, InputPlan, input_plan,
                        returned_row, to_outgoing)
from .worker_gc import freeze_once

QUERY_ID_PROPERTY = "sql.streaming.queryId"   # StreamExecution.QUERY_ID_KEY
BATCH_ID_PROPERTY = "streaming.sql.batchId"   # MicroBatchExecution.BATCH_ID_KEY


@dataclass
class PublishedCount(WriterCommitMessage):
    partition: int
    messages: int


class QuorumQueueStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: SinkOptions, plan: InputPlan) -> None:
        self.options = options
        self.plan = plan

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PublishedCount:
        freeze_once()
        context = TaskContext.get()
        query = context.getLocalProperty(QUERY_ID_PROPERTY)
        batch = context.getLocalProperty(BATCH_ID_PROPERTY)
        if not query or batch is None:
            raise RuntimeError(f"the quorumqueue stream writer ran outside a micro-batch "
                               f"(no '{QUERY_ID_PROPERTY}' / '{BATCH_ID_PROPERTY}' task "
                               "property); continuous processing is not supported")
        partition = context.partitionId()
        key = IdempotencyKey(f"spark-query/{query}/{partition}", int(batch) * ROWS_PER_BATCH_ID)
        return _publish(self.options, self.plan, key, partition, iterator)

    def commit(self, messages: list[PublishedCount | None], batchId: int) -> None:
        pass  # every message was confirmed inside its task

    def abort(self, messages: list[PublishedCount | None], batchId: int) -> None:
        pass  # published messages cannot be taken back; a replay is de-duplicated


class QuorumQueueBatchWriter(DataSourceArrowWriter):
    def __init__(self, options: SinkOptions, plan: InputPlan) -> None:
        self.options = options
        self.plan = plan
        self.write_id = uuid.uuid4().hex  # chosen on the driver: every task attempt shares it

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PublishedCount:
        freeze_once()
        partition = TaskContext.get().partitionId()
        key = IdempotencyKey(f"spark-write/{self.write_id}/{partition}", 0)
        return _publish(self.options, self.plan, key, partition, iterator)

    def commit(self, messages: list[PublishedCount | None]) -> None:
        pass  # every message was confirmed inside its task

    def abort(self, messages: list[PublishedCount | None]) -> None:
        pass  # published messages cannot be taken back


def stream_writer(raw_options, schema: StructType) -> QuorumQueueStreamWriter:
    options, plan = _prepare(raw_options, schema)
    return QuorumQueueStreamWriter(options, plan)


def batch_writer(raw_options, schema: StructType, overwrite: bool) -> QuorumQueueBatchWriter:
    if overwrite:
        raise OptionError("the quorumqueue sink cannot overwrite a queue (save mode "
                          "'overwrite'); use mode 'append', or purge the queue first")
    options, plan = _prepare(raw_options, schema)
    return QuorumQueueBatchWriter(options, plan)


def _prepare(raw_options, schema: StructType) -> tuple[SinkOptions, InputPlan]:
    options = parse_sink_options(raw_options)
    plan = input_plan(schema, options)
    check_destination(options)
    return options, plan


def _publish(options: SinkOptions, plan: InputPlan, key: IdempotencyKey, partition: int,
             batches: Iterator[pa.RecordBatch]) -> PublishedCount:
    messages = to_outgoing(batches, plan, options, key)
    first = next(messages, None)
    if first is None:  # an empty partition (shuffles make many): no connection at all
        return PublishedCount(partition, 0)
    publisher = ConfirmedPublisher(options.addresses, options.mandatory,
                                   options.confirm_timeout_ms / 1000, returned_row,
                                   options.reconnect_timeout_ms / 1000)
    return PublishedCount(partition, publisher.run(itertools.chain([first], messages)))


def check_destination(options: SinkOptions) -> None:
    """Fail at start if option 'exchange' names no exchange (the default exchange
    always exists); reaching the broker also checks option 'uri'. Spark creates the
    stream writer again for every batch's commit (PySpark's sink commit runner), so
    an unreachable broker is retried for option reconnectTimeout here too."""
    from .connection import BrokerUnreachable, first_reachable
    from .reconnect import Reconnect

    def check(address) -> None:
        connection = pika.BlockingConnection(address.parameters())
        try:
            if options.exchange:
                connection.channel().exchange_declare(options.exchange, passive=True)
        except pika.exceptions.ChannelClosedByBroker as error:
            raise OptionError(f"option '{EXCHANGE}': {error.reply_text} (the sink does not "
                              "declare exchanges; declare it first)") from None
        finally:
            if connection.is_open:
                connection.close()

    retry = Reconnect(options.reconnect_timeout_ms, "quorumqueue sink (driver)")
    while True:
        try:
            first_reachable(options.addresses, check)
        except BrokerUnreachable as error:
            retry.lost(error, "every node")
            continue
        retry.recovered()
        return
