"""Leader failover time of a quorum queue on a 3-node quorumqueue cluster, over N kills.

    python bench/cluster_failover.py [--rounds 20] [--rate 200] [--json PATH]

A 3-node cluster (``bench/clusters.py``: real node processes on loopback), one
durable quorum queue declared through node 1, and a publisher that publishes
persistent messages with confirms continuously (``--rate`` per second, each with a
unique id) through a node that is not the one to be killed. Each round:

1. wait until every node names the same leader for the queue and the publisher,
   moved to this round's node (the non-leaders take turns), gets confirms;
2. SIGKILL the leader; the clock starts when the signal is sent;
3. **leader**: poll ``cluster.status`` on both survivors until one names a leader
   other than the dead node (the time is when that answer arrived; a call takes
   ~7 ms on an idle node, tens of ms during an election: stderr shows the slowest);
4. **confirm**: the first confirm, at the publisher, of a message published after
   the killed process was reaped (it cannot have been committed by the old leader);
5. restart the killed node and wait until it has caught up: its replica reports a
   commit index at least the leader's, read once the node accepted AMQP.

Then it prints every round, the median and p99 (nearest rank: with 20 rounds, the
worst) of both figures, and whether the medians meet the < 2 s target. At the end
the publisher stops, a consumer drains the queue, and the fault tests' checker
(``tests/support/history.py``) asserts that every confirmed id was delivered, that
nothing was delivered that was never published, and that nothing unconfirmed was
delivered twice as new; a violation fails the run. Progress goes to stderr, the
table to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import math
import statistics
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

import aiormq  # noqa: E402
import pika.exceptions  # noqa: E402

from bench.clusters import QuorumQueueCluster, queue_status, wait_for  # noqa: E402
from quorumqueue.client.management import call  # noqa: E402
from tests.support.history import ID_HEADER, AckingConsumer, History, check, report  # noqa: E402

QUEUE = "bench-failover"
TARGET_MEDIAN_S = 2.0
ROUND_TIMEOUT_S = 30.0  # a figure not seen by then fails the run
CATCH_UP_TIMEOUT_S = 60.0
POLL_INTERVAL_S = 0.005
FAILURES = (AssertionError, TimeoutError, RuntimeError, OSError, pika.exceptions.AMQPError)


@dataclass(frozen=True, slots=True)
class Round:
    number: int
    killed: str  # the queue's leader, SIGKILLed
    killed_metadata_leader: bool  # it also led the metadata group
    publisher_on: str
    new_leader: str
    leader_s: float  # kill -> a survivor's cluster.status names the new leader
    confirm_s: float  # kill -> first confirm of a message published after the kill
    restart_s: float  # restart -> the node accepts AMQP again
    catch_up_s: float  # accepts AMQP -> its commit index reaches the leader's


# -- the publisher: asyncio (aiormq) in a thread of its own ----------------------------------


class ContinuousPublisher:
    """Publishes ids ``f-000001``... at ``rate`` per second with confirms, many in flight,
    through one node at a time (``move_to``), and writes every outcome into ``history``.
    Times (time.monotonic()) are kept per sequence number: ``published_at[n - 1]`` and
    ``confirmed_at[n]``; ``arrivals`` lists confirm times in arrival order."""

    def __init__(self, queue: str, history: History, rate: float) -> None:
        self.queue, self.history, self.interval = queue, history, 1.0 / rate
        self.published_at: list[float] = []
        self.confirmed_at: dict[int, float] = {}
        self.arrivals: list[float] = []
        self.uri: str | None = None
        self.error: BaseException | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="failover publisher",
                                        daemon=True)
        self._connection = None
        self._task: asyncio.Task | None = None
        self._outstanding: set[asyncio.Task] = set()

    def start(self, uri: str) -> ContinuousPublisher:
        self._thread.start()
        self.move_to(uri)
        return self

    def move_to(self, uri: str) -> None:
        """Publish through ``uri`` from now on; the messages in flight on the old
        connection get up to 10 s to be confirmed before it is closed."""
        asyncio.run_coroutine_threadsafe(self._move_to(uri), self._loop).result(30)

    def stop(self, drain_timeout: float = 30.0) -> None:
        """Stop publishing, wait up to ``drain_timeout`` for outstanding confirms, close."""
        if not self._thread.is_alive():
            return
        try:
            asyncio.run_coroutine_threadsafe(self._close(drain_timeout), self._loop).result(
                drain_timeout + 15)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            if not self._thread.is_alive():
                self._loop.close()
        if self.error is not None:
            raise RuntimeError(f"the publisher failed: {self.error!r}") from self.error

    def confirmed_since(self, moment: float) -> int:
        return len(self.arrivals) - bisect.bisect_left(self.arrivals, moment)

    def first_confirm_of_published_after(self, moment: float) -> float | None:
        """The earliest confirm time among messages published at or after ``moment``."""
        if self.error is not None:
            raise RuntimeError(f"the publisher failed: {self.error!r}")
        first = bisect.bisect_left(self.published_at, moment) + 1
        times = [self.confirmed_at[n] for n in range(first, len(self.published_at) + 1)
                 if n in self.confirmed_at]
        return min(times) if times else None

    async def _move_to(self, uri: str) -> None:
        await self._close(settle_timeout=10.0)
        self.uri = uri
        self._connection = await aiormq.connect(uri)
        channel = await self._connection.channel(publisher_confirms=True)
        self.history.note("publisher", f"publishing through {uri}")
        self._task = asyncio.ensure_future(self._publish(channel))

    async def _close(self, settle_timeout: float) -> None:
        """Stop publishing, give the messages in flight ``settle_timeout`` seconds to
        be confirmed (the rest count as unknown), close the connection."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._outstanding:
            await asyncio.wait(self._outstanding, timeout=settle_timeout)
        for task in list(self._outstanding):
            task.cancel()
        await asyncio.gather(*self._outstanding, return_exceptions=True)
        connection, self._connection = self._connection, None
        if connection is not None:
            await connection.close()

    async def _publish(self, channel) -> None:
        next_at = time.monotonic()
        try:
            while True:
                if channel.is_closed:
                    raise RuntimeError(f"the channel to {self.uri} closed")
                sequence = len(self.published_at) + 1
                message_id = f"f-{sequence:06d}"
                properties = aiormq.spec.Basic.Properties(
                    delivery_mode=2, message_id=message_id, headers={ID_HEADER: message_id})
                self.published_at.append(time.monotonic())
                self.history.record("published", message_id)
                task = asyncio.ensure_future(self._confirm(channel, sequence, properties))
                self._outstanding.add(task)
                task.add_done_callback(self._outstanding.discard)
                next_at += self.interval
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        except asyncio.CancelledError:
            raise
        except BaseException as error:  # noqa: BLE001 - reported by stop()
            self.error = error

    async def _confirm(self, channel, sequence: int, properties) -> None:
        message_id = properties.message_id
        try:
            outcome = await channel.basic_publish(message_id.encode(), routing_key=self.queue,
                                                  properties=properties, mandatory=True)
        except (aiormq.exceptions.PublishError, aiormq.exceptions.DeliveryError) as error:
            self.history.record("nacked", message_id)
            self.history.note("publisher", f"{message_id}: {type(error).__name__}")
        except BaseException as error:  # connection lost, cancelled at stop: outcome unknown
            self.history.record("unknown", message_id)
            if not isinstance(error, asyncio.CancelledError):
                self.history.note("publisher", f"{message_id}: {error!r}")
        else:
            if isinstance(outcome, aiormq.spec.Basic.Ack):
                now = time.monotonic()
                self.confirmed_at[sequence] = now
                self.arrivals.append(now)
                self.history.record("confirmed", message_id)
            else:
                self.history.record("nacked", message_id)


# -- one round -------------------------------------------------------------------------------


def agreed_leader(uris: list[str], queue: str) -> str | None:
    """The leader every node at ``uris`` names, if each sees every member online; else None."""
    rows = [queue_status(uri, queue) for uri in uris]
    if any(row is None or sorted(row["online"]) != sorted(row["members"]) for row in rows):
        return None
    leaders = {row["leader"] for row in rows}
    return leaders.pop() if len(leaders) == 1 else None


def commit_index(uri: str, queue: str) -> int | None:
    for row in call(uri, "queues.list", vhost="/"):
        if row["name"] == queue:
            return row.get("commit_index")
    return None


def run_round(number: int, cluster: QuorumQueueCluster, publisher: ContinuousPublisher) -> Round:
    local = cluster.local
    leader = wait_for("every node to name the same leader",
                      lambda: agreed_leader(cluster.uris(), QUEUE), timeout=CATCH_UP_TIMEOUT_S)
    others = [name for name in cluster.names if name != leader]
    publisher_on = others[number % len(others)]
    if publisher.uri != local.uri(publisher_on):
        publisher.move_to(local.uri(publisher_on))
    moved = time.monotonic()
    wait_for(f"confirms through {publisher_on}", lambda: publisher.confirmed_since(moved) >= 20,
             timeout=ROUND_TIMEOUT_S)
    metadata_leader = call(local.uri(others[0]), "cluster.status")["metadata_leader"]
    print(f"[round {number}] killing {leader} (queue leader"
          f"{', metadata leader' if metadata_leader == leader else ''}); publishing through "
          f"{publisher_on}", file=sys.stderr)

    killed_at = time.monotonic()
    local.kill(leader)
    dead_at = time.monotonic()
    survivors = [local.uri(name) for name in others]
    new_leader, leader_at, slowest_poll = _poll_new_leader(survivors, leader)
    confirm_at = wait_for("a confirm of a message published after the kill",
                          lambda: publisher.first_confirm_of_published_after(dead_at),
                          timeout=ROUND_TIMEOUT_S, interval=POLL_INTERVAL_S)

    restart_began = time.monotonic()
    local.restart(leader)
    ready_at = time.monotonic()
    target = wait_for("the new leader's commit index",
                      lambda: commit_index(local.uri(new_leader), QUEUE))
    wait_for(f"{leader} to catch up to index {target}",
             lambda: (commit_index(local.uri(leader), QUEUE) or 0) >= target,
             timeout=CATCH_UP_TIMEOUT_S)
    caught_up_at = time.monotonic()
    result = Round(number, leader, metadata_leader == leader, publisher_on, new_leader,
                   leader_at - killed_at, confirm_at - killed_at, ready_at - restart_began,
                   caught_up_at - ready_at)
    print(f"[round {number}] new leader {new_leader} after {result.leader_s:.3f} s (slowest "
          f"status call {slowest_poll * 1000:.0f} ms), first confirm after {result.confirm_s:.3f} s; "
          f"{leader} back in {result.restart_s:.1f} s, caught up {result.catch_up_s:.1f} s later",
          file=sys.stderr)
    return result


def _poll_new_leader(survivors: list[str], dead: str) -> tuple[str, float, float]:
    """(new leader, when a survivor's answer named it, the slowest status call)."""
    deadline = time.monotonic() + ROUND_TIMEOUT_S
    slowest = 0.0
    while time.monotonic() < deadline:
        for uri in survivors:
            asked = time.monotonic()
            try:
                leader = (queue_status(uri, QUEUE) or {}).get("leader")
            except Exception:  # noqa: BLE001 - a survivor busy electing may time out once
                continue
            finally:
                slowest = max(slowest, time.monotonic() - asked)
            if leader not in (None, dead):
                return leader, time.monotonic(), slowest
        time.sleep(POLL_INTERVAL_S)
    raise TimeoutError(f"no survivor named a leader other than {dead} within {ROUND_TIMEOUT_S:g} s")


# -- the report ------------------------------------------------------------------------------


def percentile(values: list[float], fraction: float) -> float:
    """Nearest rank: the smallest value with at least ``fraction`` of them at or below it."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def summarize(rounds: list[Round]) -> dict[str, dict[str, float | bool]]:
    summary = {}
    for figure in ("leader_s", "confirm_s", "restart_s", "catch_up_s"):
        values = [getattr(one, figure) for one in rounds]
        summary[figure] = {"median": statistics.median(values), "p99": percentile(values, 0.99),
                           "min": min(values), "max": max(values)}
    for figure in ("leader_s", "confirm_s"):
        summary[figure]["meets_target"] = summary[figure]["median"] < TARGET_MEDIAN_S
    return summary


def render(rounds: list[Round], summary: dict) -> str:
    lines = [f"{'round':>5}  {'killed':<14} {'publisher on':<14} {'new leader':<14} "
             f"{'leader s':>8} {'confirm s':>9} {'restart s':>9} {'catch-up s':>10}"]
    for one in rounds:
        killed = one.killed + ("*" if one.killed_metadata_leader else "")
        lines.append(f"{one.number:>5}  {killed:<14} {one.publisher_on:<14} {one.new_leader:<14} "
                     f"{one.leader_s:>8.3f} {one.confirm_s:>9.3f} {one.restart_s:>9.1f} "
                     f"{one.catch_up_s:>10.1f}")
    lines.append("(* the killed node also led the metadata group)")
    lines.append("")
    names = {"leader_s": "kill -> new leader in cluster.status",
             "confirm_s": "kill -> first confirm after the kill"}
    for figure, name in names.items():
        entry = summary[figure]
        verdict = "meets" if entry["meets_target"] else "MISSES"
        lines.append(f"{name}: median {entry['median']:.3f} s, p99 {entry['p99']:.3f} s "
                     f"(min {entry['min']:.3f}, max {entry['max']:.3f}) - median {verdict} "
                     f"the < {TARGET_MEDIAN_S:g} s target")
    return "\n".join(lines)


def declare(uri: str) -> None:
    """Declare the durable quorum queue through ``uri``."""

    async def declare_queue() -> None:
        connection = await aiormq.connect(uri)
        try:
            channel = await connection.channel()
            await channel.queue_declare(QUEUE, durable=True, arguments={"x-queue-type": "quorum"})
        finally:
            await connection.close()

    asyncio.run(declare_queue())


def drain_and_check(cluster: QuorumQueueCluster, history: History, timeout: float) -> str:
    """Consume everything (fault tests' consumer) until every confirmed id arrived; check."""
    with history.lock:
        confirmed = list(history.confirmed)
    print(f"draining: {len(confirmed):,} confirmed messages to find ...", file=sys.stderr)
    drain_began = len(history.events)
    consumer = AckingConsumer(cluster.uris(), QUEUE, history, prefetch=500).start()
    try:
        missing = consumer.wait_for(confirmed, timeout)
        if missing:
            history.note("drain", f"{len(missing)} confirmed ids not delivered after {timeout:g} s")
        time.sleep(0.5)  # whatever else the queue holds (unconfirmed ids) arrives too
    finally:
        consumer.stop()
    with history.lock:
        by_node = Counter(delivery.node for delivery in history.deliveries)
        for event in history.events[drain_began:]:
            print(f"  {event}", file=sys.stderr)
    print("drained: " + ", ".join(
        f"{count:,} from {cluster.names[cluster.uris().index(uri)]}"
        for uri, count in by_node.items()), file=sys.stderr)
    return str(check(history))


def first_errors(cluster: QuorumQueueCluster, lines_after: int = 20) -> dict[str, str]:
    """Per node that logged an [ERROR], its first one with the lines after it (a
    traceback): a node can fail on its own while the cluster carries on."""
    found = {}
    for name in cluster.names:
        lines = cluster.local.log(name, tail=10**9).splitlines()
        first = next((i for i, line in enumerate(lines) if "[ERROR]" in line), None)
        if first is not None:
            found[name] = "\n".join(lines[first:first + lines_after])
    return found


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20, help="leader kills")
    parser.add_argument("--rate", type=float, default=200.0, help="publishes per second")
    parser.add_argument("--drain-timeout", type=float, default=120.0,
                        help="seconds to wait for every confirmed message at the end")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    arguments = parser.parse_args(argv)
    if arguments.rounds < 1:
        parser.error("--rounds must be at least 1")
    if not 1 <= arguments.rate <= 5000:
        parser.error("--rate must be between 1 and 5000 publishes per second")
    return arguments


def main(argv: list[str] | None = None) -> int:
    arguments = parse_arguments(argv)
    history = History()
    rounds: list[Round] = []
    checked, failure, errors = "", None, {}
    print("[cluster] starting 3 nodes ...", file=sys.stderr)
    try:
        with QuorumQueueCluster(3) as cluster:
            print(f"[cluster] up after {cluster.startup_s:.1f} s: " + ", ".join(
                f"{name} ({uri})" for name, uri in zip(cluster.names, cluster.uris())),
                file=sys.stderr)
            try:
                checked = run(cluster, history, rounds, arguments)
            except FAILURES as error:
                failure = f"{type(error).__name__}: {error}"
                for name in cluster.names:
                    print(f"--- the end of {name}'s log ---\n{cluster.local.log(name, 3000)}",
                          file=sys.stderr)
            errors = first_errors(cluster)
            for name, excerpt in errors.items():
                print(f"--- {name} logged errors; the first ---\n{excerpt}", file=sys.stderr)
    except FAILURES as error:
        failure = f"{type(error).__name__}: {error}"
    summary = summarize(rounds) if rounds else {}
    if rounds:
        print()
        print(render(rounds, summary))
    if failure:
        print(f"counts so far: {report(history)}", file=sys.stderr)
        sys.exit(f"FAILED after {len(rounds)} round(s): {failure}")
    print(f"\nno confirmed message lost: {checked}")
    if errors:
        print(f"nodes that logged errors (first one on stderr): {', '.join(errors)}")
    if arguments.json:
        document = {"settings": {"rounds": arguments.rounds, "rate": arguments.rate, "nodes": 3},
                    "rounds": [asdict(one) for one in rounds], "summary": summary,
                    "target_median_s": TARGET_MEDIAN_S, "history": checked,
                    "node_errors": errors}
        arguments.json.write_text(json.dumps(document, indent=2) + "\n")
        print(f"results written to {arguments.json}", file=sys.stderr)
    return 0


def run(cluster: QuorumQueueCluster, history: History, rounds: list[Round],
        arguments: argparse.Namespace) -> str:
    """The rounds (appended to ``rounds`` as they end), then the drain; the check's counts."""
    declare(cluster.uris()[0])
    publisher = ContinuousPublisher(QUEUE, history, arguments.rate)
    try:
        publisher.start(cluster.uris()[1])
        for number in range(1, arguments.rounds + 1):
            rounds.append(run_round(number, cluster, publisher))
    finally:
        publisher.stop()
    return drain_and_check(cluster, history, arguments.drain_timeout)


if __name__ == "__main__":
    sys.exit(main())
