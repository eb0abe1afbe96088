"""Global QoS on classic queues, against RabbitMQ 3.10.8: basic.qos(global=true)
limits the channel as a whole.

What RabbitMQ 3.10.8 does (rabbit_limiter, the consumer prefetch guide), found by
running these scenarios on it:
- the shared limit counts the channel's unacknowledged deliveries, from every queue;
  a per-consumer prefetch (global=false, for consumers created after it) applies
  besides; a shared limit set while more are unacked holds until enough are acked;
- a no-ack consumer has no prefetch of its own and its deliveries are not counted,
  but while the channel's unacked deliveries are at the shared limit it gets nothing
  either (the limiter tells its queue to wait); once below, it takes everything;
- freed capacity is shared: RabbitMQ resumes the queues that waited in a random
  order, so two queues consumed on one channel with a shared prefetch of 1 split the
  deliveries (observed 24/16, 22/18, 20/20, 12/28 of 40); quorumqueue served the
  first consumer's queue until it was empty (40/0), and gave a no-ack consumer its
  whole queue at the limit.
Quorum queues refuse global QoS (540 NOT_IMPLEMENTED; test_against_rabbitmq.py's
quorum_queue_global_qos).

Counts are read with a passive queue.declare on another channel after the consume-ok
or ack that decides them, so no scenario waits for something not to happen: a queue
acts on a consume before it answers a later declare, on both brokers. The same
raw-frame client (probe.py) runs on both and the transcripts are compared.
"""

from __future__ import annotations

import collections
import uuid

from pamqp import commands as amqp

from tests.differential.probe import Probe


def _fill(c: Probe, queue: str, count: int) -> None:
    c.call(1, amqp.Queue.Declare(queue=queue, arguments={"x-expires": 120_000}))
    for number in range(count):
        c.publish(1, "", queue, f"{number}")
    c.barrier(1)


def _count(c: Probe, queue: str) -> None:
    c.call(1, amqp.Queue.Declare(queue=queue, passive=True))


def no_ack_consumer_at_the_limit(c: Probe, tag: str) -> None:
    """Shared prefetch 2: an acking consumer takes two; a no-ack consumer on the
    same channel then gets nothing until they are acked, and all of its queue after."""
    acked, free = f"gq-{tag}-acked", f"gq-{tag}-noack"
    c.call(1, amqp.Channel.Open())
    _fill(c, acked, 2)
    _fill(c, free, 5)
    c.call(2, amqp.Channel.Open())
    c.call(2, amqp.Basic.Qos(prefetch_count=2, global_=True))
    c.call(2, amqp.Basic.Consume(queue=acked, consumer_tag="acking"))
    c.collect(2)
    c.call(2, amqp.Basic.Consume(queue=free, consumer_tag="no-ack", no_ack=True))
    _count(c, free)  # 5: held back by the channel's limit
    c.send(2, amqp.Basic.Ack(delivery_tag=2, multiple=True))
    c.collect(5)
    _count(c, free)


def shared_and_per_consumer_limits(c: Probe, tag: str) -> None:
    """A per-consumer prefetch of 3, then a shared one of 2 while 3 are unacked:
    one ack frees nothing (2 still unacked), two more let 2 go."""
    queue = f"gq-{tag}-both"
    c.call(1, amqp.Channel.Open())
    _fill(c, queue, 10)
    c.call(2, amqp.Channel.Open())
    c.call(2, amqp.Basic.Qos(prefetch_count=3, global_=False))
    c.call(2, amqp.Basic.Consume(queue=queue, consumer_tag="c"))
    c.collect(3)
    c.call(2, amqp.Basic.Qos(prefetch_count=2, global_=True))
    c.send(2, amqp.Basic.Ack(delivery_tag=1))
    c.barrier(2)
    _count(c, queue)  # 7: nothing more went
    c.send(2, amqp.Basic.Ack(delivery_tag=3, multiple=True))
    c.collect(2)
    _count(c, queue)


def _observe(uri: str, scenario) -> list:
    tag = uuid.uuid4().hex[:8]
    with Probe.open(uri) as c:
        scenario(c, tag)
        return [_untagged(entry, tag) for entry in c.transcript]


def _untagged(value, tag: str):
    if isinstance(value, str):
        return value.replace(tag, "<run>")
    if isinstance(value, dict):
        return {key: _untagged(item, tag) for key, item in value.items()}
    if isinstance(value, list):
        return [_untagged(item, tag) for item in value]
    return value


def test_a_no_ack_consumer_waits_while_the_channel_is_at_its_shared_limit(rabbitmq,
                                                                         broker) -> None:
    expected = _observe(rabbitmq.uri, no_ack_consumer_at_the_limit)
    counts = [entry["reply"]["message_count"] for entry in expected
              if entry.get("reply", {}).get("method") == "Queue.DeclareOk"]
    assert counts[-2:] == [5, 0]
    assert _observe(broker.uri, no_ack_consumer_at_the_limit) == expected


def test_a_shared_limit_counts_with_a_per_consumer_one_as_in_rabbitmq(rabbitmq,
                                                                      broker) -> None:
    expected = _observe(rabbitmq.uri, shared_and_per_consumer_limits)
    assert _observe(broker.uri, shared_and_per_consumer_limits) == expected


PER_QUEUE = 40


def _shares(uri: str) -> collections.Counter:
    """Two queues of 40, one consumer each on one channel with a shared prefetch of
    1, each delivery acked as it arrives: which queue each of the first 40 came from."""
    tag = uuid.uuid4().hex[:8]
    queues = [f"gq-{tag}-share-{n}" for n in (1, 2)]
    seen: collections.Counter = collections.Counter()
    with Probe.open(uri, timeout=30.0) as c:
        c.call(1, amqp.Channel.Open())
        for queue in queues:
            _fill(c, queue, PER_QUEUE)
        c.call(2, amqp.Channel.Open())
        c.call(2, amqp.Basic.Qos(prefetch_count=1, global_=True))
        for number, queue in enumerate(queues):
            c.call(2, amqp.Basic.Consume(queue=queue, consumer_tag=f"c{number}"))
        for _ in range(PER_QUEUE):
            [delivery] = c.collect(1)
            seen[delivery["routing_key"]] += 1
            c.send(2, amqp.Basic.Ack(delivery_tag=delivery["delivery_tag"]))
    return collections.Counter({queues.index(queue): n for queue, n in seen.items()})


def test_freed_capacity_is_shared_by_the_channels_queues_as_in_rabbitmq(rabbitmq,
                                                                       broker) -> None:
    """RabbitMQ's split is random, so what is compared is that each queue gets a
    fair part (at least a fifth) of the first 40 deliveries on both brokers."""
    for uri in (rabbitmq.uri, broker.uri):
        shares = _shares(uri)
        assert sum(shares.values()) == PER_QUEUE
        assert min(shares[0], shares[1]) >= PER_QUEUE // 5, (uri, shares)
