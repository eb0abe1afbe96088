"""Batch reads: `spark.read.format("quorumqueue")` drains, or peeks at, queues.

    spark.read.format("quorumqueue").option("uri", uri).option("queue", "orders")
         .option("maxMessages", "1000").load()               # drain: read and settle
         ...option("peek", "true")...                        # read, return to the queue

Responsibilities
    Read up to `maxMessages` messages from each queue, and settle them (drain, the
    default) or return them to the queue (`peek`), once per execution of the read.

How it works
    One partition per queue; its executor does the whole read.
    - Lease mode (the bundled broker): a fresh lease (`spark-read-<uuid>`) is grown by
      `maxMessages`, read in chunks, then settled (drain) or released (peek). It is
      created with a 10-minute timeout, so the messages of an executor that dies
      mid-read go back to the queue.
    - Consume mode (any AMQP 0-9-1 broker): basic.get with manual acks until
      `maxMessages` or get-empty, then one cumulative ack (drain) or nack with requeue
      (peek).
    The `offset` column numbers the messages of one read of one queue from 1.

Invariants
    - Nothing is settled before Spark has taken every row of the partition; a read
      that fails or is abandoned returns its messages to the queue (lease released,
      channel closed).
    - Spark runs the read again for every action on the DataFrame and for retried
      tasks: a drain then takes the next messages. Cache the DataFrame, or write it
      once (connector/README.md, "Batch reads").
    - Peeked messages come back redelivered, their delivery count one higher on
      quorum queues (a return counts as a delivery; see `x-delivery-limit`).

Not here
    Streaming reads (lease_reader.py, consume_reader.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pika
import pika.exceptions
import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from ..client.delivery import Delivery
from ..client.lease_client import LeaseClient
from ..client.management import ManagementError
from .connection import open_connection, open_lease_client
from .options import BatchReadOptions, Mode
from .schema import to_record_batch
from .worker_gc import freeze_once

# Messages per Arrow record batch handed to Spark.
READ_CHUNK = 2_000
# The lease of a batch read lapses after this long idle (a dead executor's messages).
READ_LEASE_TIMEOUT_MS = 10 * 60 * 1000


@dataclass(frozen=True)
class QueueRead(InputPartition):
    """One partition: the read of one queue."""

    queue: str

    @property
    def value(self):  # InputPartition's field, shown by Spark in plans
        return self.queue


class QueueBatchReader(DataSourceReader):
    def __init__(self, options: BatchReadOptions, mode: Mode) -> None:
        self.options = options
        self.mode = mode

    def partitions(self) -> list[QueueRead]:
        return [QueueRead(queue) for queue in self.options.queues]

    def read(self, partition: QueueRead) -> Iterator[pa.RecordBatch]:
        freeze_once()
        if self.mode is Mode.LEASE:
            return self._read_lease(partition.queue)
        return self._read_consume(partition.queue)

    # ------------------------------------------------------------------ lease mode

    def _read_lease(self, queue: str) -> Iterator[pa.RecordBatch]:
        lease = f"spark-read-{uuid.uuid4().hex}"
        client = open_lease_client(self.options)
        done = False
        try:
            try:
                first, end = client.grow(queue, lease, self.options.max_messages,
                                         timeout_ms=READ_LEASE_TIMEOUT_MS)
            except ManagementError as error:
                raise _lease_error(queue, error) from None
            for low in range(first - 1, end, READ_CHUNK):
                messages = client.read(queue, lease, low, min(low + READ_CHUNK, end))
                yield to_record_batch(queue, messages, self.options.include_headers)
            if end >= first:
                if self.options.peek:
                    client.release(queue, lease, fence=False)
                else:
                    client.settle(queue, lease, end)
            done = True
        finally:
            if not done:
                _release_quietly(client, queue, lease)
            client.close()

    # ------------------------------------------------------------------ consume mode

    def _read_consume(self, queue: str) -> Iterator[pa.RecordBatch]:
        connection = open_connection(self.options)
        try:
            channel = connection.channel()
            last_tag, seq, chunk = None, 0, []
            while seq < self.options.max_messages:
                try:
                    method, properties, body = channel.basic_get(queue, auto_ack=False)
                except pika.exceptions.ChannelClosedByBroker as refusal:
                    raise RuntimeError(f"cannot read queue '{queue}' (option 'queue'): "
                                       f"{refusal.reply_code} {refusal.reply_text}") from None
                if method is None:  # get-empty
                    break
                seq += 1
                last_tag = method.delivery_tag
                chunk.append(Delivery(seq, body, method.exchange, method.routing_key,
                                      method.redelivered, properties, method.delivery_tag))
                if len(chunk) == READ_CHUNK:
                    yield to_record_batch(queue, chunk, self.options.include_headers)
                    chunk = []
            if chunk:
                yield to_record_batch(queue, chunk, self.options.include_headers)
            if last_tag is not None:
                if self.options.peek:
                    channel.basic_nack(last_tag, multiple=True, requeue=True)
                else:
                    channel.basic_ack(last_tag, multiple=True)
        finally:
            # Closing returns whatever was not acked (a failed or abandoned read).
            if connection.is_open:
                connection.close()


def _lease_error(queue: str, error: ManagementError) -> Exception:
    text = str(error)
    if "not a quorum queue" in text:
        return RuntimeError(f"queue '{queue}' cannot be read in lease mode: {text}; set "
                            "option 'mode' to 'consume' to read it with basic.get")
    return RuntimeError(f"cannot read queue '{queue}' (option 'queue'): {text}")


def _release_quietly(client: LeaseClient, queue: str, lease: str) -> None:
    """Best effort: if this fails too, the lease's timeout returns the messages."""
    try:
        client.release(queue, lease, fence=False)
    except (ManagementError, pika.exceptions.AMQPError, OSError):
        pass

