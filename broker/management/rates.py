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
`_details` rates) come from this node's message counters (node/counters.py, the
ones the Prometheus endpoint reports), sampled with the queue counts: counts since
this node started, rates between the last two samples. RabbitMQ sums them over the
cluster; here they are this node's (what its clients published and were given).

Each queue's `message_stats` (publish, deliver, deliver_no_ack, get, get_no_ack,
deliver_get, redeliver, ack, and their `_details` rates once two samples exist) come
from the queue-type interface's `message_stats()` (queues/base.py: this node's
counters of that queue), sampled with its counts. Like the overview's, they are this
node's: in a cluster, what this node's clients published to the queue and were
delivered from it (RabbitMQ sums every node's channels).

Not here: per-exchange message_stats (not counted).
"""

from __future__ import annotations

import asyncio
import logging
import time

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
        # the node's message counters: [(monotonic seconds, message_stats counts)]
        self.counter_samples: list[tuple[float, dict]] = []
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

    def queue_message_stats(self, queue) -> dict:
        """One queue's message_stats: counts now, rates once two samples exist."""
        stats = queue.message_stats()
        pair = self.samples.get((queue.vhost, queue.name))
        if pair is not None and len(pair) == 2:
            (before, old), (after, new) = pair
            old, new = old["message_stats"], new["message_stats"]
            elapsed = after - before
            for field in list(stats):
                stats[f"{field}_details"] = {
                    "rate": round((new[field] - old[field]) / elapsed, 1)}
        return stats

    def message_stats(self) -> dict:
        """The overview's message_stats: counts now, rates once two samples exist."""
        stats = message_counts(self.node.counters)
        if len(self.counter_samples) == 2:
            (before, old), (after, new) = self.counter_samples
            elapsed = after - before
            for field in stats.copy():
                stats[f"{field}_details"] = {
                    "rate": round((new[field] - old[field]) / elapsed, 1)}
        return stats

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
        self.counter_samples.append((time.monotonic(), message_counts(node.counters)))
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
                      "message_stats": queue.message_stats()}
            pair = self.samples.setdefault(key, [])
            pair.append((now, counts))
            del pair[:-2]
        for key in set(self.samples) - seen:
            del self.samples[key]


def message_counts(counters) -> dict:
    """RabbitMQ's message_stats counts from the node's Counters (all queue types)."""
    types = list(counters.by_type.values())
    deliver = sum(t.consume_manual_ack for t in types)
    deliver_no_ack = sum(t.consume_auto_ack for t in types)
    get = sum(t.get_manual_ack for t in types)
    get_no_ack = sum(t.get_auto_ack for t in types)
    return {"publish": counters.received, "confirm": counters.confirmed,
            "return_unroutable": counters.unroutable_returned,
            "drop_unroutable": counters.unroutable_dropped,
            "deliver": deliver, "deliver_no_ack": deliver_no_ack, "get": get,
            "get_no_ack": get_no_ack,
            "deliver_get": deliver + deliver_no_ack + get + get_no_ack,
            "redeliver": sum(t.redelivered for t in types),
            "ack": sum(t.acknowledged for t in types)}
