"""The executor's side of the Spark source without Spark: CPU per message of a lease
read (the "entries" read since issue 28; the "packed" one before), in the reader and
in the broker.

    python bench/lease_read_cpu.py [--messages 100000] [--size 256] [--profile DIR]

One bundled broker; a durable quorum queue filled with `--messages` persistent
messages of `--size` bytes (the load generator, publisher confirms), all granted to
one lease. Then `LeaseStreamReader.read` (connector/lease_reader.py, what a Spark
executor runs per partition) reads them as partitions of 20,000 (the source's
PARTITION_MESSAGES until it became 25,000; kept, so that figures compare) into Arrow
record batches, once untimed (imports, first connections) and once timed. Prints the
wall time, the reader's process CPU and the broker's (from /proc) per message: what
the source's Python worker and the broker spend per message, without Spark's JVM,
which the source's bench
(connector_source.py) includes. With `--profile DIR`, py-spy (``pip install
py-spy``) samples the broker during the timed read into DIR/broker.txt (collapsed
stacks) and cProfile the reader into DIR/reader.txt.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from bench.amqp_loadgen import LoadSettings, connect, declare_fresh_queue, publish_all  # noqa: E402
from bench.profile_flames import py_spy  # noqa: E402
from tests.support.broker import BrokerProcess  # noqa: E402

PARTITION = 20_000


def cpu_seconds(pid: int) -> float:
    """User + system CPU of process `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _fill(port: int, messages: int, size: int) -> str:
    generator = await connect(LoadSettings(host="127.0.0.1", port=port, messages=messages,
                                           size=size, queue_type="quorum"))
    try:
        queue = await declare_fresh_queue(generator, "lease-read")
        await publish_all(generator, queue)
    finally:
        generator.transport.close()
    return queue


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=256, help="body bytes (>= 8)")
    parser.add_argument("--profile", type=Path, help="write py-spy and cProfile output here")
    arguments = parser.parse_args(argv)
    from quorumqueue.client.lease_client import LeaseClient
    from quorumqueue.connector.lease_reader import LeaseStreamReader
    from quorumqueue.connector.offsets import LeaseRange
    from quorumqueue.connector.options import parse_source_options

    total = arguments.messages
    broker = BrokerProcess()
    broker.start()
    try:
        queue = asyncio.run(_fill(broker.port, total, arguments.size))
        with LeaseClient(broker.uri) as client:
            client.grow(queue, "bench", total)
        reader = LeaseStreamReader(parse_source_options({"uri": broker.uri, "queue": queue}))
        ranges = [LeaseRange(queue, "bench", start, min(total, start + PARTITION))
                  for start in range(0, total, PARTITION)]

        def read_all() -> int:
            return sum(batch.num_rows for part in ranges for batch in reader.read(part))

        assert read_all() == total  # untimed: imports, the first connections
        spy = profiler = None
        if arguments.profile:
            arguments.profile.mkdir(parents=True, exist_ok=True)
            spy = subprocess.Popen(
                [py_spy(), "record", "--pid", str(broker.process.pid),
                 "--nonblocking", "--nolineno", "--format", "raw", "--rate", "200",
                 "--output", str(arguments.profile / "broker.txt")],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.5)  # py-spy attaching
            profiler = cProfile.Profile()
            profiler.enable()
        broker_before, cpu_before = cpu_seconds(broker.process.pid), time.process_time()
        began = time.perf_counter()
        rows = read_all()
        wall = time.perf_counter() - began
        cpu, broker_cpu = (time.process_time() - cpu_before,
                           cpu_seconds(broker.process.pid) - broker_before)
        if profiler is not None:
            profiler.disable()
            with open(arguments.profile / "reader.txt", "w") as out:
                pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(25)
        if spy is not None:
            spy.send_signal(2)
            spy.wait()
        assert rows == total, rows
    finally:
        broker.cleanup()
    print(f"{total:,} x {arguments.size} B in {len(ranges)} partition(s): wall {wall:.2f} s; "
          f"reader CPU {cpu:.2f} s ({cpu / total * 1e6:.2f} us/message), broker CPU "
          f"{broker_cpu:.2f} s ({broker_cpu / total * 1e6:.2f} us/message); load average "
          f"{os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
