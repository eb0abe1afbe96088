"""py-spy flame graphs of the broker under load: where its CPU goes, per path.

    python bench/profile_flames.py [--profiles consume-1n,publish-3n,sink,queues100-3n,perftest-1n]
        [--messages 200000] [--seconds 30] [--rate 100] [--out bench/results/profiles]

Each profile starts fresh brokers, drives one load, and samples the broker process(es)
with ``py-spy record --pid`` (py-spy must be installed: ``pip install py-spy``; it reads
the broker's memory through ptrace, so the user needs ptrace permission over its own
processes). Two samplers per process, both ``--nonblocking`` (the broker is never
paused) and ``--nolineno`` (frames are functions): one writes the flame graph
(``NAME.svg``, ``--threads``: one tower per thread), the other py-spy's collapsed
stacks (``NAME.txt``), from which ``NAME.top.txt`` lists the top frames by own
samples ("self") and by samples with the frame anywhere on the stack ("total"), each
as a share of the process's samples. ``--native`` samples C frames too (the
interpreter's own, such as the cyclic garbage collector's ``gc_collect_main``; py-spy
then pauses the broker for each sample, and a thread blocked in a C wait counts as
busy) into ``NAME-native.*``. py-spy samples only threads that are running
(idle threads are left out), so a share is of the broker's busy CPU time; ``busy``
is the loop thread's samples over (seconds x rate), how much of the wall time that
thread was busy.

Profiles:

- ``consume-1n``: 1 node, a quorum queue filled with ``--messages`` persistent 1 KB
  messages by PerfTest (not sampled), then drained by PerfTest's consumer (prefetch
  1000, one ack per message, PerfTest's default): the consume path alone.
- ``publish-3n``: 3 nodes, a quorum queue declared on node 1, PerfTest publishing
  ``--messages`` persistent 1 KB messages with confirms (1000 in flight) to the
  queue's leader: the leader and one follower sampled at once.
- ``sink``: 1 node, the Spark sink (``df.write.format("quorumqueue")``, ``local[2]``,
  2 partitions) writing ``--messages`` (at most 200,000) 1 KB rows into a quorum queue,
  as bench/connector_sink.py measures it: the broker's side of the sink (keyed publishes).
- ``perftest-1n``: 1 node, PerfTest's 1q-1kb scenario of bench/perftest.py (1 producer
  with confirms, 1000 in flight, and 1 consumer, qos 1000, an ack per message, at once,
  1 KB persistent messages, one quorum queue) for ``--seconds``: issue 18's "PerfTest
  1P/1C" row on one node, where publish, delivery and acks share the broker's loop.
- ``queues100-3n``: 3 nodes, PerfTest's 100-queue point of bench/perftest_curves.py
  (100 quorum queues, 1 producer and 1 consumer each, 1 KB, ``--seconds``) against
  node 1, all three nodes sampled: where quorumqueue fell to a few percent of
  RabbitMQ's rate in the sweep.

Progress goes to stderr. Not here: the figures the profiles explain (bench/perftest.py,
bench/perftest_curves.py, bench/connector_sink.py).
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from bench.perftest import JARS, PERFTEST_MAIN, check_jars  # noqa: E402

PROFILES = ("consume-1n", "publish-3n", "sink", "queues100-3n", "perftest-1n")
QUORUM_ARGS = ["--queue-args", "x-queue-type=quorum", "--auto-delete", "false"]


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def py_spy() -> str:
    """py-spy's binary: on PATH, beside this Python, or where its package put it (a venv
    that reads another's site-packages finds the binary in that one's bin/)."""
    found = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if not found:
        from importlib import metadata
        try:
            files = metadata.distribution("py-spy").files or []
        except metadata.PackageNotFoundError:
            files = []
        found = next((str(f.locate().resolve()) for f in files if f.name == "py-spy"), None)
    if not found:
        sys.exit("error: py-spy not found; install it with `python -m pip install py-spy`")
    return found


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU of ``pid`` so far (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Spy:
    """Two py-spy samplers on one process: a flame graph and collapsed stacks."""

    native = False  # set by --native: C frames too (py-spy then pauses the process per sample)

    def __init__(self, pid: int, out_base: Path, rate: int) -> None:
        if Spy.native:
            out_base = out_base.with_name(out_base.name + "-native")
        self.pid, self.out_base, self.rate = pid, out_base, rate
        common = [py_spy(), "record", "--pid", str(pid), "--rate", str(rate), "--nolineno",
                  *(["--native"] if Spy.native else ["--nonblocking"])]
        self.processes = [
            subprocess.Popen(common + ["--threads", "--format", "flamegraph", "-o", f"{out_base}.svg"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True),
            subprocess.Popen(common + ["--threads", "--format", "raw", "-o", f"{out_base}.txt"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True),
        ]
        self.began = time.monotonic()
        self.cpu_began = process_cpu_seconds(pid)
        self.seconds = self.cpu_seconds = 0.0

    def stop(self) -> None:
        self.seconds = time.monotonic() - self.began
        self.cpu_seconds = process_cpu_seconds(self.pid) - self.cpu_began
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        for process in self.processes:
            try:
                _, errors = process.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                process.kill()
                _, errors = process.communicate()
            if not Path(f"{self.out_base}.svg").exists() and "Permission" in (errors or ""):
                sys.exit(f"error: py-spy was refused ptrace on pid {self.pid}: {errors.strip()}")
        say(f"  sampled pid {self.pid} for {self.seconds:.1f} s -> {self.out_base}.svg")


def perftest(uri: str, *flags: str) -> None:
    command = ["java", "-cp", f"{JARS}/*", PERFTEST_MAIN, "--uri", uri, *flags]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if done.returncode != 0 or "test stopped" not in done.stdout:
        raise RuntimeError(f"PerfTest exited {done.returncode}:\n{done.stdout[-1500:]}\n{done.stderr[-1500:]}")


def profile_consume_1n(out: Path, messages: int, rate: int) -> list[Path]:
    from tests.support.broker import BrokerProcess

    with BrokerProcess() as broker:
        queue = f"profile-consume-{os.urandom(3).hex()}"
        say(f"consume-1n: filling {queue} with {messages:,} x 1 KB (PerfTest, not sampled)")
        perftest(broker.uri, "--queue", queue, *QUORUM_ARGS, "--flag", "persistent", "--confirm", "1000",
                 "--size", "1024", "--producers", "1", "--consumers", "0", "--pmessages", str(messages))
        say("consume-1n: draining with PerfTest's consumer (qos 1000, an ack per message), sampling")
        spy = Spy(broker.process.pid, out / "consume-1n", rate)
        began = time.monotonic()
        perftest(broker.uri, "--queue", queue, "--predeclared", "--qos", "1000", "--producers", "0",
                 "--consumers", "1", "--cmessages", str(messages))
        say(f"consume-1n: {messages / (time.monotonic() - began):,.0f} msg/s while sampled "
            "(PerfTest's start included)")
        spy.stop()
    return [summarise(spy.out_base, spy, f"consume-1n: {messages:,} x 1 KB drained by PerfTest")]


def profile_publish_3n(out: Path, messages: int, rate: int) -> list[Path]:
    import pika

    from bench.clusters import QuorumQueueCluster

    with QuorumQueueCluster(3) as cluster:
        queue = f"profile-publish-{os.urandom(3).hex()}"
        first = cluster.uris()[0]
        with pika.BlockingConnection(pika.URLParameters(first)) as connection:
            connection.channel().queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
        cluster.wait_queue_known(queue)
        leader = cluster.leader_index(queue)
        follower = (leader + 1) % 3
        names = cluster.names
        say(f"publish-3n: leader {names[leader]}, follower {names[follower]}; publishing "
            f"{messages:,} x 1 KB to the leader with PerfTest, sampling both")
        spies = [Spy(cluster.local.pid(names[leader]), out / "publish-3n-leader", rate),
                 Spy(cluster.local.pid(names[follower]), out / "publish-3n-follower", rate)]
        began = time.monotonic()
        perftest(cluster.uris()[leader], "--queue", queue, "--predeclared", "--flag", "persistent",
                 "--confirm", "1000", "--size", "1024", "--producers", "1", "--consumers", "0",
                 "--pmessages", str(messages))
        say(f"publish-3n: {messages / (time.monotonic() - began):,.0f} msg/s while sampled "
            "(PerfTest's start included)")
        for spy in spies:
            spy.stop()
    return [summarise(spies[0].out_base, spies[0], f"publish-3n leader: {messages:,} x 1 KB"),
            summarise(spies[1].out_base, spies[1], f"publish-3n follower: {messages:,} x 1 KB")]


def profile_sink(out: Path, messages: int, rate: int) -> list[Path]:
    from bench import connector_sink
    from tests.support.broker import BrokerProcess

    with BrokerProcess() as broker, ExitStack() as stack:
        say("sink: starting Spark (local[2]) and warming up its Python workers")
        spark = connector_sink.start_spark()
        stack.callback(spark.stop)
        connector_sink.warm_up(spark, broker)
        say(f"sink: the Spark sink writes {messages:,} x 1 KB rows, sampling the broker")
        settings = argparse.Namespace(messages=messages, size=1024, partitions=2)
        spy = Spy(broker.process.pid, out / "sink", rate)
        try:
            rate_seen = connector_sink.measure_sink(spark, broker, settings)
        finally:
            spy.stop()
        say(f"sink: {rate_seen:,.0f} msg/s while sampled")
    return [summarise(spy.out_base, spy, f"sink: {messages:,} x 1 KB rows from Spark")]


def run_sampled(name: str, uri: str, scenario: str, seconds: int, spies: list[Spy]) -> None:
    """bench/perftest.py's `scenario` against `uri` for `seconds`, then the samplers
    stopped; PerfTest's received rate and p99 said (or why it gave none)."""
    from bench.perftest import SCENARIOS, parse_summary, perftest_command

    command = perftest_command(uri, SCENARIOS[scenario], seconds,
                               f"profile-{scenario}-{os.urandom(3).hex()}")
    done = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 300)
    for spy in spies:
        spy.stop()
    try:
        summary = parse_summary(done.stdout)
        say(f"{name}: received {summary.receiving:,.0f} msg/s, p99 "
            f"{summary.latency_us['99th'] / 1000:,.0f} ms")
    except ValueError as error:
        say(f"{name}: PerfTest gave no summary ({error}): {done.stdout[-400:]}")


def profile_queues100_3n(out: Path, seconds: int, rate: int) -> list[Path]:
    """PerfTest's 100-queue point of bench/perftest_curves.py on 3 nodes, every node sampled."""
    from bench.clusters import QuorumQueueCluster

    with QuorumQueueCluster(3) as cluster:
        names = cluster.names
        say(f"queues100-3n: PerfTest 100 queues x 1P/1C (1 KB) on node 1 for {seconds} s, sampling all 3 nodes")
        spies = [Spy(cluster.local.pid(name), out / f"queues100-3n-node{index + 1}", rate)
                 for index, name in enumerate(names)]
        run_sampled("queues100-3n", cluster.uris()[0], "100q-1kb", seconds, spies)
    return [summarise(spy.out_base, spy,
                      f"queues100-3n node {index + 1}{' (PerfTest connects here)' if index == 0 else ''}: "
                      f"100 queues x 1P/1C, 1 KB, {seconds} s")
            for index, spy in enumerate(spies)]


def profile_perftest_1n(out: Path, seconds: int, rate: int) -> list[Path]:
    """PerfTest's 1q-1kb scenario (1 producer and 1 consumer at once) on 1 node, sampled."""
    from tests.support.broker import BrokerProcess

    with BrokerProcess() as broker:
        say(f"perftest-1n: PerfTest 1 queue x 1P/1C (1 KB) for {seconds} s, sampling")
        spy = Spy(broker.process.pid, out / "perftest-1n", rate)
        run_sampled("perftest-1n", broker.uri, "1q-1kb", seconds, [spy])
    return [summarise(spy.out_base, spy, f"perftest-1n: 1 queue x 1P/1C, 1 KB, {seconds} s")]


def read_collapsed(path: Path) -> list[tuple[list[str], int]]:
    stacks = []
    for line in path.read_text().splitlines():
        frames, _, count = line.rpartition(" ")
        if frames and count.isdigit():
            stacks.append((frames.split(";"), int(count)))
    return stacks


def short(frame: str) -> str:
    """``name (path/to/file.py)`` -> ``name (file.py)``; thread roots unchanged."""
    name, _, where = frame.partition(" (")
    return f"{name} ({where.rstrip(')').rsplit('/', 1)[-1]})" if where else frame


def top_frames(stacks: list[tuple[list[str], int]], limit: int = 15) -> dict:
    """Per thread (the stacks' root with ``--threads``): samples; over the process: the
    frames with the most own samples and with the most samples anywhere on the stack."""
    total = sum(count for _, count in stacks)
    threads: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    anywhere: collections.Counter[str] = collections.Counter()
    for frames, count in stacks:
        threads[frames[0]] += count
        body = [short(f) for f in frames[1:]] or [frames[0]]
        own[body[-1]] += count
        for frame in set(body):
            anywhere[frame] += count
    # a thread's root (click, runpy, threading) holds nearly every sample: no information
    common = {frame for thread in threads for frame in thread_root(stacks, thread)} - set(own)
    inclusive = [(frame, n) for frame, n in anywhere.most_common() if frame not in common]
    return {"total": total, "threads": threads.most_common(),
            "self": own.most_common(limit), "inclusive": inclusive[:limit + 5]}


def thread_root(stacks: list[tuple[list[str], int]], thread: str, share: float = 0.9) -> list[str]:
    """The frames a thread's stacks start with, position by position, while one frame holds
    ``share`` of the thread's samples there (non-blocking sampling truncates a few stacks)."""
    mine = [([short(f) for f in frames[1:]], count) for frames, count in stacks if frames[0] == thread]
    total = sum(count for _, count in mine)
    root: list[str] = []
    while True:
        here: collections.Counter[str] = collections.Counter()
        for body, count in mine:
            if len(body) > len(root) + 1 and body[:len(root)] == root:
                here[body[len(root)]] += count
        if not here:
            return root
        frame, count = here.most_common(1)[0]
        if count < share * total:
            return root
        root.append(frame)


def summarise(base: Path, spy: Spy, title: str) -> Path:
    stacks = read_collapsed(Path(f"{base}.txt"))
    top = top_frames(stacks)
    total = top["total"] or 1
    loop_samples = top["threads"][0][1] if top["threads"] else 0
    lines = [title,
             f"sampled {spy.seconds:.1f} s at {spy.rate} Hz: {top['total']} busy samples; busiest thread "
             f"{loop_samples / max(spy.seconds * spy.rate, 1):.0%} of the wall time; process CPU "
             f"{spy.cpu_seconds:.1f} s ({spy.cpu_seconds / max(spy.seconds, 0.001):.0%} of one core)",
             "", "threads (share of busy samples):"]
    lines += [f"  {count / total:6.1%}  {thread}" for thread, count in top["threads"]]
    lines += ["", "self (own samples):"]
    lines += [f"  {count / total:6.1%}  {frame}" for frame, count in top["self"]]
    lines += ["", "total (anywhere on the stack; each thread's common root left out):"]
    lines += [f"  {count / total:6.1%}  {frame}" for frame, count in top["inclusive"]]
    path = Path(f"{base}.top.txt")
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:len(top["threads"]) + 4 + 10]) + "\n")
    return path


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profiles", default=",".join(PROFILES), help="comma-separated: " + ", ".join(PROFILES))
    parser.add_argument("--messages", type=int, default=200_000, help="messages per profile")
    parser.add_argument("--seconds", type=int, default=30, help="length of the queues100-3n run")
    parser.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    parser.add_argument("--native", action="store_true",
                        help="C frames too (the interpreter's, e.g. the garbage collector): NAME-native.*; "
                             "py-spy pauses the broker for each sample")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "bench" / "results" / "profiles")
    arguments = parser.parse_args(argv)
    arguments.profile_list = [name.strip() for name in arguments.profiles.split(",") if name.strip()]
    unknown = [name for name in arguments.profile_list if name not in PROFILES]
    if unknown or not arguments.profile_list:
        parser.error(f"unknown profile(s) {unknown}; known: {', '.join(PROFILES)}")
    if arguments.messages < 1 or arguments.rate < 1:
        parser.error("--messages and --rate must be at least 1")
    return arguments


def main(argv: list[str] | None = None) -> None:
    arguments = parse_arguments(argv)
    check_jars()
    py_spy()
    arguments.out.mkdir(parents=True, exist_ok=True)
    Spy.native = arguments.native
    run = {"consume-1n": profile_consume_1n, "publish-3n": profile_publish_3n, "sink": profile_sink,
           "queues100-3n": profile_queues100_3n, "perftest-1n": profile_perftest_1n}
    for name in arguments.profile_list:
        amount = {"sink": min(arguments.messages, 200_000), "queues100-3n": arguments.seconds,
                  "perftest-1n": arguments.seconds}.get(
            name, arguments.messages)
        for path in run[name](arguments.out, amount, arguments.rate):
            say(f"wrote {path}")


if __name__ == "__main__":
    main()
