"""Queue length rates: RabbitMQ's `messages_details`, `messages_ready_details` and
`messages_unacknowledged_details` (`{"rate": change per second}`).

Responsibilities: sample every queue's counts every `collect_statistics_interval`
(RabbitMQ's key and default, 5000 ms) and give the rate of change between the last
two samples, per queue and summed for the overview's queue totals.

How it works: a task on the broker's loop asks each queue's `stats_later` (so a
queue served by another node is counted by that node, as listing it is), but only
while someone uses the API (a request in the last ACTIVE_SECONDS): a node nobody
watches does not pay for samples, and the first requests after a quiet spell answer
without rates until two samples exist (RabbitMQ, too, lists a new queue without
them until its statistics arrive).

The overview's `message_stats` (publish, confirm, deliver_get, ack, ... and their
`_details` rates) and each queue's (publish, deliver, deliver_no_ack, get,
get_no_ack, deliver_get, redeliver, ack, and rates) are the cluster's: RabbitMQ's
management plugin sums the statistics every node keeps of what its channels did,
and so does `gather`. Each node counts what its own clients do (node/counters.py;
a queue's: the queue-type interface's `message_counts`, queues/base.py); the node
answering a request asks every other node for its counts (cluster/replica_rpc.py
"message_stats": one Rpc per node, answered from memory) and adds them to its own.
Pulled when asked rather than pushed: RabbitMQ's plugin, too, keeps the samples on
the node that made them and collects them from every node when a request comes, and
a node nobody asks then sends nothing (counts change with every message; pushing
them, as cluster/tracking.py pushes connection counts for the limits that need them
at once, would cost traffic on every node whether anyone watches or not). The
sampling task gathers the same way, so the rates are those of the summed counts.

A node that does not answer (unreachable, or silent for REPLY_TIMEOUT) counts with
what it last told this node, since this node started (nothing if it never told
it): its clients' past work does not vanish from the totals while it is cut off.
A node removed from the cluster stops counting. A node's counters start from 0
when it starts, as RabbitMQ's do, so a restarted node's totals drop; a rate is never
below 0 (a count that fell gives 0 for that interval). While a node is
unreachable, nodes that asked it at different times may show different totals; once
every node answers, every node shows the same.

Not here: per-exchange message_stats (not counted).
"""

from __future__ import annotations

import asyncio
import logging
import time

from ..cluster import replica_rpc
from ..queues.base import MessageCounts

log = logging.getLogger("quorumqueue.broker")

ACTIVE_SECONDS = 120.0
FIELDS = ("messages", "messages_ready", "messages_unacknowledged")


class Rates:
    def __init__(self, node, interval_s: float, wake) -> None:
        self.node = node
        self.interval = interval_s
        self.wake = wake
        self.last_request = 0.0
        # (vhost, name) -> [(monotonic seconds, {field: count}), at most two]
        self.samples: dict[tuple[str, str], list[tuple[float, dict]]] = {}
        # the cluster's summed message counters: [(monotonic seconds, message_stats)]
        self.counter_samples: list[tuple[float, dict]] = []
        # another node -> its last answer to "message_stats" (cluster/replica_rpc.py)
        self.reported: dict[str, dict] = {}
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    def used(self) -> None:
        """An API request arrived: keep sampling."""
        self.last_request = time.monotonic()

    def details(self, vhost: str, name: str) -> dict:
        """The `*_details` fields of one queue, or {} until two samples exist."""
        pair = self.samples.get((vhost, name))
        if pair is None or len(pair) < 2:
            return {}
        (before, old), (after, new) = pair
        elapsed = after - before
        return {f"{field}_details": {"rate": round((new[field] - old[field]) / elapsed, 1)}
                for field in FIELDS}

    def queue_message_stats(self, queue, totals: "Totals") -> dict:
        """One queue's message_stats: the cluster's counts (`totals`), and rates once
        two samples exist."""
        stats = totals.queue(queue)
        pair = self.samples.get((queue.vhost, queue.name))
        if pair is not None and len(pair) == 2:
            (before, old), (after, new) = pair
            _add_rates(stats, old["message_stats"], new["message_stats"], after - before)
        return stats

    def message_stats(self, totals: "Totals") -> dict:
        """The overview's message_stats: the cluster's counts (`totals`), and rates
        once two samples exist."""
        stats = dict(totals.node)
        if len(self.counter_samples) == 2:
            (before, old), (after, new) = self.counter_samples
            _add_rates(stats, old, new, after - before)
        return stats

    async def gather(self) -> "Totals":
        """Every node's message counters summed: this node's now, each other node's
        as it answers, or as it last answered (see the module header)."""
        node = self.node
        cluster = node.cluster
        others = [name for name in cluster.nodes if name != node.name]
        if others:
            loop = asyncio.get_running_loop()
            futures = {}
            for name in others:
                future = futures[name] = loop.create_future()
                replica_rpc.ask(cluster, name, "", "message_stats", {},
                                lambda answer, future=future: (
                                    None if future.done() else future.set_result(answer)))
            self.wake()
            # replica_rpc answers None after REPLY_TIMEOUT; the extra second covers a tick
            await asyncio.wait(futures.values(), timeout=replica_rpc.REPLY_TIMEOUT + 1)
            for name, future in futures.items():
                answer = future.result() if future.done() else None
                if isinstance(answer, dict):
                    self.reported[name] = answer
        for name in list(self.reported):
            if name not in cluster.nodes:
                del self.reported[name]
        return Totals([node.message_stats(), *self.reported.values()])

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            if time.monotonic() - self.last_request > ACTIVE_SECONDS:
                self.samples.clear()
                self.counter_samples.clear()
                continue
            try:
                await self._sample()
            except asyncio.CancelledError:
                raise
            except Exception:  # a sampling bug must not end the sampling for good
                log.exception("management: sampling queue counts failed")

    async def _sample(self) -> None:
        node = self.node
        totals = await self.gather()
        self.counter_samples.append((time.monotonic(), dict(totals.node)))
        del self.counter_samples[:-2]
        queues = [queue for vhost in list(node.vhosts.values())
                  for queue in list(vhost.queues.values())]
        if not queues:
            self.samples.clear()
            return
        loop = asyncio.get_running_loop()
        futures = []
        for queue in queues:
            future = loop.create_future()
            queue.stats_later(node.name, lambda stats, future=future: (
                None if future.done() else future.set_result(stats)))
            futures.append(future)
        self.wake()
        results = await asyncio.wait_for(asyncio.gather(*futures), self.interval * 4 + 30)
        now = time.monotonic()
        seen = set()
        for queue, stats in zip(queues, results):
            key = (queue.vhost, queue.name)
            seen.add(key)
            counts = {"messages": stats["ready"] + stats["unacked"],
                      "messages_ready": stats["ready"],
                      "messages_unacknowledged": stats["unacked"],
                      "message_stats": totals.queue(queue)}
            pair = self.samples.setdefault(key, [])
            pair.append((now, counts))
            del pair[:-2]
        for key in set(self.samples) - seen:
            del self.samples[key]


class Totals:
    """The message counters of several nodes (their "message_stats" answers) summed:
    `node`, the overview's; `queue(queue)`, one queue's."""

    def __init__(self, answers: list[dict]) -> None:
        self.node: dict[str, int] = {}
        self.queues: dict[str, MessageCounts] = {}   # queue record uid -> counts
        for answer in answers:
            counts = answer.get("node")
            if isinstance(counts, dict):
                for field, count in counts.items():
                    if isinstance(field, str) and type(count) is int:
                        self.node[field] = self.node.get(field, 0) + count
            queues = answer.get("queues")
            if not isinstance(queues, dict):
                continue
            for group, row in queues.items():
                if (isinstance(row, list) and len(row) == len(MessageCounts.__slots__)
                        and all(type(count) is int for count in row)):
                    self.queues.setdefault(group, MessageCounts()).add_row(row)

    def queue(self, queue) -> dict[str, int]:
        counts = self.queues.get(queue.group)
        return (counts or MessageCounts()).as_dict()


def _add_rates(stats: dict, old: dict, new: dict, elapsed: float) -> None:
    """`FIELD_details: {"rate"}` for each count of `stats` in both samples: counts only
    grow, so a total that fell (a node restarted) gives 0, never a negative rate."""
    for field in list(stats):
        if field in old and field in new:
            stats[f"{field}_details"] = {
                "rate": round(max(0, new[field] - old[field]) / elapsed, 1)}
