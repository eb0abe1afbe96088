"""The loaders of bench/connector_vs_kafka.py: the same bodies into Kafka or a quorum queue.

    python bench/vs_kafka_loader.py fill kafka --bootstrap HOST:PORT --topic T --messages N --size S
    python bench/vs_kafka_loader.py fill quorumqueue --port P --queue Q --messages N --size S
    python bench/vs_kafka_loader.py steady kafka|quorumqueue ... --rate R --seconds T --size S

The benchmark runs each loader as a process of its own, in a session of its own
(setsid), so that on Linux the CPU is shared between it, the brokers and Spark as
between equals. Prints one JSON line at the end: messages sent, seconds, its own CPU.

Bodies (`body`): an 8-byte big-endian sequence number, then the load generator's
pattern (bytes 0..255 repeated, bench/amqp_wire.py) up to `--size`; `steady` puts the
send time (time.time_ns(), 8 bytes big-endian) after the sequence number, so the reader
measures publish -> arrival from the body.

- `fill kafka`: confluent-kafka (librdkafka) producer, acks=all, no key (librdkafka
  spreads keyless records over the partitions), flushed at the end; the benchmark then
  checks the topic's end offsets.
- `fill quorumqueue`: declares the durable quorum queue `--queue`, publishes with
  confirms (the raw-asyncio generator of bench/amqp_loadgen.py, 1,000 in flight) and
  checks the queue holds them all.
- `steady`: `--rate` messages per second for `--seconds`, each sent when due (a
  millisecond tick): Kafka with acks=all and linger.ms=0 (sent at once, as the AMQP
  side is; librdkafka's default would hold a record up to 5 ms), the quorum queue with
  confirms, both waiting for every acknowledgement at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import struct
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from bench import amqp_wire as wire  # noqa: E402
from bench.amqp_loadgen import (PUBLISH_CHANNEL, LoadError, LoadSettings, connect,  # noqa: E402
                                publish_all, queue_counts)

STAMP = struct.Struct(">QQ")  # sequence number, send time (ns)
CONFIRM_TIMEOUT_S = 60.0


def body(sequence: int, size: int) -> bytes:
    pattern = bytes(range(256)) * (size // 256 + 1)
    return sequence.to_bytes(8, "big") + pattern[8:size]


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("fill", "steady"))
    parser.add_argument("target", choices=("kafka", "quorumqueue"))
    parser.add_argument("--bootstrap", help="Kafka's bootstrap server")
    parser.add_argument("--topic")
    parser.add_argument("--port", type=int, help="the bundled broker's AMQP port (127.0.0.1)")
    parser.add_argument("--queue")
    parser.add_argument("--messages", type=int, default=0, help="fill: how many")
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--rate", type=int, default=2000, help="steady: messages per second")
    parser.add_argument("--seconds", type=float, default=30.0, help="steady: for how long")
    arguments = parser.parse_args(argv)
    if arguments.target == "kafka" and not (arguments.bootstrap and arguments.topic):
        parser.error("kafka needs --bootstrap and --topic")
    if arguments.target == "quorumqueue" and not (arguments.port and arguments.queue):
        parser.error("quorumqueue needs --port and --queue")
    if arguments.size < STAMP.size:
        parser.error(f"--size must be at least {STAMP.size}")
    return arguments


def kafka_producer(bootstrap: str, **settings):
    from confluent_kafka import Producer

    return Producer({"bootstrap.servers": bootstrap, "acks": "all", **settings})


def fill_kafka(bootstrap: str, topic: str, messages: int, size: int) -> int:
    producer = kafka_producer(bootstrap, **{"linger.ms": 10, "batch.num.messages": 10000})
    produce, poll = producer.produce, producer.poll
    for sequence in range(messages):
        value = body(sequence, size)
        while True:
            try:
                produce(topic, value)
                break
            except BufferError:  # librdkafka's queue is full: let it send
                poll(0.01)
    if producer.flush(CONFIRM_TIMEOUT_S):
        raise RuntimeError(f"Kafka: records still unacknowledged after {CONFIRM_TIMEOUT_S}s")
    return messages


def steady_kafka(bootstrap: str, topic: str, rate: int, seconds: float, size: int) -> int:
    producer = kafka_producer(bootstrap, **{"linger.ms": 0})
    template = bytearray(body(0, size))
    total = int(rate * seconds)
    sent = 0
    began = time.monotonic()
    while sent < total:
        due = min(total, int((time.monotonic() - began) * rate) + 1)
        while sent < due:
            STAMP.pack_into(template, 0, sent, time.time_ns())
            producer.produce(topic, bytes(template))
            sent += 1
        producer.poll(0)
        time.sleep(0.001)
    if producer.flush(CONFIRM_TIMEOUT_S):
        raise RuntimeError(f"Kafka: records still unacknowledged after {CONFIRM_TIMEOUT_S}s")
    return sent


async def _declared(port: int, queue: str, messages: int, size: int):
    generator = await connect(LoadSettings(host="127.0.0.1", port=port, messages=messages,
                                           size=size, queue_type="quorum"))
    declare = wire.queue_declare(PUBLISH_CHANNEL, queue, durable=True,
                                 arguments={"x-queue-type": "quorum"})
    await generator.call(PUBLISH_CHANNEL, declare, wire.QUEUE_DECLARE_OK)
    await generator.call(PUBLISH_CHANNEL, wire.confirm_select(PUBLISH_CHANNEL),
                         wire.CONFIRM_SELECT_OK)
    return generator


async def fill_quorumqueue(port: int, queue: str, messages: int, size: int) -> int:
    generator = await _declared(port, queue, messages, size)
    try:
        ready_before, _ = await queue_counts(generator, queue)
        if ready_before:
            raise LoadError(f"queue {queue} is not empty ({ready_before} ready)")
        await publish_all(generator, queue)
    finally:
        generator.transport.close()
    return messages


async def steady_quorumqueue(port: int, queue: str, rate: int, seconds: float, size: int) -> int:
    total = int(rate * seconds)
    generator = await _declared(port, queue, total, size)
    try:
        block = wire.PublishBlock.build(PUBLISH_CHANNEL, queue, size, generator.frame_max, 1)
        frames, at = block.frames, block.sequence_offsets[0]
        began = time.monotonic()
        while generator.published < total:
            due = min(total, int((time.monotonic() - began) * rate) + 1)
            while generator.published < due:
                STAMP.pack_into(frames, at, generator.published, time.time_ns())
                generator.transport.write(bytes(frames))
                generator.published += 1
            await asyncio.sleep(0.001)
        deadline = time.monotonic() + CONFIRM_TIMEOUT_S
        while generator.confirmed < total:
            if generator.failure is not None:
                raise generator.failure
            if time.monotonic() > deadline:
                raise LoadError(f"{total - generator.confirmed} publishes unconfirmed after "
                                f"{CONFIRM_TIMEOUT_S}s")
            await asyncio.sleep(0.01)
    finally:
        generator.transport.close()
    return total


def main(argv: list[str] | None = None) -> int:
    arguments = parse_arguments(argv)
    began = time.perf_counter()
    a = arguments
    if a.mode == "fill" and a.target == "kafka":
        sent = fill_kafka(a.bootstrap, a.topic, a.messages, a.size)
    elif a.mode == "fill":
        sent = asyncio.run(fill_quorumqueue(a.port, a.queue, a.messages, a.size))
    elif a.target == "kafka":
        sent = steady_kafka(a.bootstrap, a.topic, a.rate, a.seconds, a.size)
    else:
        sent = asyncio.run(steady_quorumqueue(a.port, a.queue, a.rate, a.seconds, a.size))
    print(json.dumps({"messages": sent, "seconds": time.perf_counter() - began,
                      "cpu_s": time.process_time()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
