"""How many messages per CPU-second the load generator can handle, vs pika's codec.

    python bench/loadgen_overhead.py [--messages 50000] [--size 1024]

No broker and no socket: the publisher's encoding and the consumer's frame
parsing run against in-memory bytes, so the numbers are the generator's ceiling
(messages per second of CPU). For comparison the same messages go through
pika's frame codec alone (``pika.frame`` marshal / ``decode_frame``), which is a
lower bound on what a pika-based generator would spend -- pika also dispatches
every frame through its channel and callback machinery. The benchmark is valid
while these ceilings are far above the brokers' rates.
"""

from __future__ import annotations

import argparse
import struct
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pika  # noqa: E402
import pika.frame  # noqa: E402
import pika.spec  # noqa: E402

from bench import amqp_wire as wire  # noqa: E402
from bench.amqp_loadgen import CONSUME_CHANNEL, LoadSettings, _Generator  # noqa: E402

CHUNK = 65536  # bytes per data_received, like a busy socket read


class _NullTransport:
    def write(self, data: bytes) -> None:
        pass

    def close(self) -> None:
        pass


def deliveries(count: int, size: int) -> bytes:
    """``count`` basic.deliver + header + body frames, bodies numbered 0..count-1."""
    frames = bytearray()
    properties = struct.pack(">HHQHB", wire.BASIC_CLASS, 0, size, wire.DELIVERY_MODE_FLAG, wire.PERSISTENT)
    header = wire.FRAME_HEADER_STRUCT.pack(wire.FRAME_HEADER, CONSUME_CHANNEL, len(properties)) + properties + b"\xce"
    filler = bytes(size - 8)
    for sequence in range(count):
        deliver = wire.shortstr("ctag") + struct.pack(">QB", sequence + 1, 0) + wire.shortstr("") + wire.shortstr("q")
        frames += wire.method_frame(CONSUME_CHANNEL, wire.BASIC_DELIVER, deliver) + header
        body = struct.pack(">Q", sequence) + filler
        frames += wire.FRAME_HEADER_STRUCT.pack(wire.FRAME_BODY, CONSUME_CHANNEL, size) + body + b"\xce"
    return bytes(frames)


def cpu_seconds(work) -> float:
    began = time.process_time()
    work()
    return time.process_time() - began


def generator_publish(messages: int, size: int) -> float:
    block = wire.PublishBlock.build(1, "q", size, 131072, 1000)
    step = block.count
    return cpu_seconds(lambda: [block.stamp(first, min(step, messages - first)) for first in range(0, messages, step)])


def pika_publish(messages: int, size: int) -> float:
    body, properties = bytes(size), pika.BasicProperties(delivery_mode=2)

    def work() -> None:
        for _ in range(messages):
            method = pika.frame.Method(1, pika.spec.Basic.Publish(exchange="", routing_key="q")).marshal()
            header = pika.frame.Header(1, size, properties).marshal()
            b"".join((method, header, pika.frame.Body(1, body).marshal()))

    return cpu_seconds(work)


def generator_consume(data: bytes, messages: int) -> float:
    generator = _Generator(LoadSettings("127.0.0.1", 0, messages=messages))
    generator.transport = _NullTransport()  # type: ignore[assignment]
    generator.consuming = True
    chunks = [data[start : start + CHUNK] for start in range(0, len(data), CHUNK)]
    seconds = cpu_seconds(lambda: [generator.data_received(chunk) for chunk in chunks])
    assert generator.consumed == messages and generator.never_delivered() == 0, generator.failure
    return seconds


def pika_consume(data: bytes, messages: int) -> float:
    chunks = [data[start : start + CHUNK] for start in range(0, len(data), CHUNK)]

    def work() -> None:
        buffer, bodies = b"", 0
        for chunk in chunks:
            buffer += chunk
            while True:
                used, frame = pika.frame.decode_frame(buffer)
                if not used:
                    break
                buffer = buffer[used:]
                bodies += isinstance(frame, pika.frame.Body)
        assert bodies == messages

    return cpu_seconds(work)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--size", type=int, default=1024)
    arguments = parser.parse_args()
    messages, size = arguments.messages, arguments.size
    data = deliveries(messages, size)
    print(f"{messages:,} messages of {size} B; ceiling = messages per CPU-second")
    print(f"{'':<28} {'bench generator':>16} {'pika codec only':>16} {'ratio':>7}")
    for phase, ours, theirs in (
        ("publish (encode + write)", generator_publish(messages, size), pika_publish(messages, size)),
        ("consume (parse + check)", generator_consume(data, messages), pika_consume(data, messages)),
    ):
        print(f"{phase:<28} {messages / ours:>14,.0f}/s {messages / theirs:>14,.0f}/s {theirs / ours:>6.1f}x")


if __name__ == "__main__":
    main()
