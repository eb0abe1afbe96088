"""One node in-process: CPU per message of confirmed publishes and of a consume.

    python bench/inprocess_node.py [--messages 20000] [--size 1024] [--runs 3]
                                   [--single-acks N] [--at-once] [--json PATH]

No sockets, no fsync, no other process: the sans-I/O session and the node as the
broker assembles them (`tests/broker/node/harness.py`), driven by this process. Per
run, a fresh node and a fresh durable quorum queue; **publish**: `--messages`
persistent messages of `--size` bytes with confirms, fed to the session in reads of
about 64 KB (what a socket read hands the broker), the node flushed and the
session's output taken after each read (the shell's part); **consume**:
`basic.consume` with manual acks, prefetch 1,000, `multiple=true` every 500
deliveries, until every message was delivered and acked (it stops with an error
if deliveries stop short); with `--single-acks N`, a basic.ack per delivery
(`multiple=false`, as PerfTest acks), N of them per read, the node flushed after
each read (the consumer's acks as a socket would hand them in). Prints the CPU
microseconds per message of each phase (`time.process_time`), per run and the
median. `--at-once`: PerfTest's default shape instead of two phases, a producer and a
consumer connection publishing and consuming at the same time (the producer keeps at
most 1,000 unconfirmed, a read of about 64 KB at a time; the consumer has prefetch
1,000 and acks each delivery, `--single-acks` (default 50) of them per read), CPU
microseconds per message of the whole run, clients included: a figure that moves less with the machine's load than the socket
benchmarks, used to compare builds (bench/README.md,
"Compiled hot modules").
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from pamqp import commands  # noqa: E402

from tests.broker.node.harness import Client, content_frames, marshal, method, new_node  # noqa: E402

READ_SIZE = 64 * 1024
PREFETCH = 1000
# basic.deliver's class and method ids as they open its frame payload after the
# channel and size: counted in the session's output (the bodies are b"x" only).
DELIVER_MARK = b"\x00\x3c\x00\x3c"
CONFIRM_MARK = b"\x00\x3c\x00\x50"  # basic.ack, a confirm: the delivery tag follows
CONFIRM_WINDOW = 1000


def one_run(messages: int, size: int, single_acks: int = 0) -> tuple[float, float]:
    """(publish, consume) CPU microseconds per message of one fresh node; with
    `single_acks`, one basic.ack per delivery, that many per read."""
    client = Client(new_node())
    client.handshake()
    client.open_channel(1)
    client.declare_queue(1, "bench", durable=True, arguments={"x-queue-type": "quorum"})
    client.call(1, commands.Confirm.Select(), "Confirm.SelectOk")
    props = commands.Basic.Properties(delivery_mode=2)
    one = (marshal(method(commands.Basic.Publish, exchange="", routing_key="bench"), 1)
           + content_frames(1, b"x" * size, props, client.frame_max))
    per_read = max(1, READ_SIZE // len(one))

    started = time.process_time()
    sent = 0
    while sent < messages:
        count = min(per_read, messages - sent)
        client.send_bytes(one * count)
        sent += count
        client.read_raw()
    client.read_raw()
    publish = time.process_time() - started

    client.call(1, commands.Basic.Qos(prefetch_count=PREFETCH), "Basic.QosOk")
    client.send(1, method(commands.Basic.Consume, queue="bench", consumer_tag="c"))
    started = time.process_time()
    delivered = acked = 0
    ack = (marshal(method(commands.Basic.Ack, delivery_tag=0, multiple=False), 1)
           if single_acks else b"")
    while acked < messages:
        arrived = client.read_raw().count(DELIVER_MARK)
        delivered += arrived
        if single_acks and delivered > acked:
            while acked < delivered:  # the tag: the 8 octets before the bits and frame end
                count = min(single_acks, delivered - acked)
                client.send_bytes(b"".join(
                    ack[:-10] + (tag).to_bytes(8, "big") + ack[-2:]
                    for tag in range(acked + 1, acked + count + 1)))
                acked += count
                if acked < delivered:
                    delivered += client.read_raw().count(DELIVER_MARK)
        elif single_acks:
            raise SystemExit(f"consume stalled: delivered {delivered} of {messages}")
        elif delivered - acked >= PREFETCH // 2 or (delivered == messages and acked < delivered):
            client.send(1, commands.Basic.Ack(delivery_tag=delivered, multiple=True))
            acked = delivered
        elif not arrived:  # nothing came and nothing is left to ack: nothing will come
            raise SystemExit(f"consume stalled: delivered {delivered} of {messages}")
    consume = time.process_time() - started
    if delivered != messages:
        raise SystemExit(f"delivered {delivered} of {messages}")
    return publish / messages * 1e6, consume / messages * 1e6


def at_once_run(messages: int, size: int, acks_per_read: int) -> float:
    """CPU microseconds per message of one fresh node with a confirmed producer and
    an acking consumer at once (PerfTest's default shape), clients included."""
    node = new_node()
    producer, consumer = Client(node), Client(node)
    for client in (producer, consumer):
        client.handshake()
        client.open_channel(1)
    producer.declare_queue(1, "bench", durable=True, arguments={"x-queue-type": "quorum"})
    producer.call(1, commands.Confirm.Select(), "Confirm.SelectOk")
    consumer.call(1, commands.Basic.Qos(prefetch_count=PREFETCH), "Basic.QosOk")
    consumer.send(1, method(commands.Basic.Consume, queue="bench", consumer_tag="c"))
    consumer.read_raw()
    props = commands.Basic.Properties(delivery_mode=2)
    one = (marshal(method(commands.Basic.Publish, exchange="", routing_key="bench"), 1)
           + content_frames(1, b"x" * size, props, producer.frame_max))
    per_read = max(1, READ_SIZE // len(one))
    ack = marshal(method(commands.Basic.Ack, delivery_tag=0, multiple=False), 1)

    started = time.process_time()
    sent = confirmed = delivered = acked = 0
    while acked < messages:
        before = (sent, confirmed, delivered)
        room = min(per_read, CONFIRM_WINDOW - (sent - confirmed), messages - sent)
        if room > 0:
            producer.send_bytes(one * room)
            sent += room
        out = producer.read_raw()
        at = out.rfind(CONFIRM_MARK)
        if at >= 0:  # confirms come in order: the last one's tag covers the rest
            confirmed = int.from_bytes(out[at + 4:at + 12], "big")
        delivered += consumer.read_raw().count(DELIVER_MARK)
        while acked < delivered:  # the tag: the 8 octets before the bits and frame end
            count = min(acks_per_read, delivered - acked)
            consumer.send_bytes(b"".join(ack[:-10] + tag.to_bytes(8, "big") + ack[-2:]
                                         for tag in range(acked + 1, acked + count + 1)))
            acked += count
        if (sent, confirmed, delivered) == before and acked == delivered:
            raise SystemExit(f"stalled: sent {sent}, confirmed {confirmed}, "
                             f"delivered {delivered} of {messages}")
    consumer.read_raw()
    return (time.process_time() - started) / messages * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--single-acks", type=int, default=0, metavar="N",
                        help="a basic.ack per delivery, N per read (default: multiple "
                             "acks every 500)")
    parser.add_argument("--at-once", action="store_true",
                        help="a producer and a consumer at the same time (PerfTest's "
                             "default shape): CPU per message of the whole run")
    parser.add_argument("--gc", choices=("server", "default"), default="server",
                        help="server: Python's garbage collector tuned as a broker "
                             "process tunes it (run.py tune_gc: frozen after start, gen0 "
                             "threshold 50,000); default: the interpreter's defaults")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.gc == "server":
        from quorumqueue.broker.server.run import tune_gc

        tune_gc()
    if args.at_once:
        runs = [at_once_run(args.messages, args.size, args.single_acks or 50)
                for _ in range(args.runs)]
        for index, cpu in enumerate(runs):
            print(f"run {index}: at once {cpu:6.2f} us/msg")
        print(f"median: at once {statistics.median(runs):6.2f} us/msg")
        if args.json:
            args.json.write_text(json.dumps({"runs": runs, "at_once_us": statistics.median(runs)}))
        return
    runs = [one_run(args.messages, args.size, args.single_acks) for _ in range(args.runs)]
    for index, (publish, consume) in enumerate(runs):
        print(f"run {index}: publish {publish:6.2f} us/msg  consume {consume:6.2f} us/msg")
    publish = statistics.median(run[0] for run in runs)
    consume = statistics.median(run[1] for run in runs)
    print(f"median: publish {publish:6.2f} us/msg  consume {consume:6.2f} us/msg")
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "publish_us": publish,
                                         "consume_us": consume}))


if __name__ == "__main__":
    main()
