"""Many consumers on one quorum queue: fair round-robin, each consumer's messages in
queue order, each consumer's deliveries of a run of publishes written as one run of
frames (queues/quorum/groups.py `_apply_entries`, the held batches).

RabbitMQ's quorum queue hands ready messages to the consumers with capacity in turn
(rabbit_fifo's service queue; the quorum queues guide, "Consumer Prefetch"); a
consumer's deliveries keep the queue's order (AMQP 0-9-1 section 4.7, message
ordering guarantees); delivery tags are per channel and increase in the order the
client receives them (section 1.8.3.9, basic.deliver)."""

from __future__ import annotations

from pamqp import commands

from tests.broker.node.harness import Client, Delivery, method, new_node, properties

CONSUMERS = 10


def client_with_consumers(tags_by_channel: dict[int, list[str]],
                          prefetch: int = 0) -> Client:
    client = Client(new_node())
    client.handshake()
    publisher = max(tags_by_channel) + 1
    for channel in (*tags_by_channel, publisher):
        client.open_channel(channel)
    client.declare_queue(publisher, "q", durable=True, arguments={"x-queue-type": "quorum"})
    for channel, tags in tags_by_channel.items():
        if prefetch:
            client.call(channel, commands.Basic.Qos(prefetch_count=prefetch), "Basic.QosOk")
        for tag in tags:
            client.call(channel, method(commands.Basic.Consume, queue="q", consumer_tag=tag),
                        "Basic.ConsumeOk")
    client.publisher = publisher
    return client


def publish_in_one_read(client: Client, bodies: list[bytes]) -> list[Delivery]:
    """`bodies` fed as one read (one run of Enqueues), then what the node sends."""
    for body in bodies:
        client.publish(client.publisher, "", "q", body, properties(delivery_mode=2))
    return [d for d in client.read_deliveries() if isinstance(d, Delivery)]


def runs(deliveries: list[Delivery]) -> list[str]:
    """The consumer tags in the order their deliveries arrive, one per unbroken run."""
    out: list[str] = []
    for delivery in deliveries:
        if not out or out[-1] != delivery.method.consumer_tag:
            out.append(delivery.method.consumer_tag)
    return out


def test_ten_consumers_share_a_run_of_publishes_in_turn_each_in_queue_order():
    """Ten consumers on ten channels, 50 messages published in one read: each gets
    five, message n going to the consumer after the one message n-1 went to (in the
    order they consumed), each its own in publish order with delivery tags 1-5; and
    each consumer's five arrive as one run of frames, not interleaved one message
    per consumer (before the held batches were per consumer: 50 runs)."""
    tags = [f"c{n}" for n in range(CONSUMERS)]
    client = client_with_consumers({n + 1: [tag] for n, tag in enumerate(tags)})
    bodies = [b"m%02d" % n for n in range(50)]
    deliveries = publish_in_one_read(client, bodies)

    assert sorted(d.body for d in deliveries) == bodies
    owner = {d.body: d.method.consumer_tag for d in deliveries}
    first = tags.index(owner[bodies[0]])
    assert [owner[body] for body in bodies] == [tags[(first + n) % CONSUMERS]
                                                for n in range(50)]
    for channel, tag in enumerate(tags, 1):
        mine = [d for d in deliveries if d.method.consumer_tag == tag]
        assert {d.channel for d in mine} == {channel}
        assert [d.body for d in mine] == [body for body in bodies if owner[body] == tag]
        assert [d.method.delivery_tag for d in mine] == [1, 2, 3, 4, 5]
        assert not any(d.method.redelivered for d in mine)
    assert runs(deliveries) == [tags[(first + n) % CONSUMERS] for n in range(CONSUMERS)]


def test_with_prefetch_one_every_ack_lets_the_next_message_through_in_turn():
    """Prefetch 1 on each of ten channels, 25 messages: the first ten go one to each
    consumer; then each ack of one consumer frees only its own slot and the next
    message in queue order goes to it; every message is delivered once, in order."""
    tags = [f"c{n}" for n in range(CONSUMERS)]
    client = client_with_consumers({n + 1: [tag] for n, tag in enumerate(tags)},
                                   prefetch=1)
    bodies = [b"m%02d" % n for n in range(25)]
    delivered = publish_in_one_read(client, bodies)
    assert [d.body for d in delivered] == bodies[:CONSUMERS]
    assert len({d.method.consumer_tag for d in delivered}) == CONSUMERS
    pending = list(delivered)
    while pending:
        done = pending.pop(0)
        client.send(done.channel, commands.Basic.Ack(delivery_tag=done.method.delivery_tag))
        got = [d for d in client.read_deliveries() if isinstance(d, Delivery)]
        assert len(got) == (1 if len(delivered) < len(bodies) else 0)
        for delivery in got:
            assert delivery.method.consumer_tag == done.method.consumer_tag
            delivered.append(delivery)
            pending.append(delivery)
    assert [d.body for d in delivered] == bodies


def test_two_consumers_on_one_channel_keep_their_order_and_increasing_tags():
    """Two consumers on one channel (and one on another), 30 messages in one read:
    the turns go a, b, c; each consumer's messages in publish order; the channel's
    delivery tags increase in the order its frames arrive, 1-20 with none skipped;
    one multiple ack of the last tag settles all twenty, and the queue is empty."""
    client = client_with_consumers({1: ["a", "b"], 2: ["c"]})
    bodies = [b"m%02d" % n for n in range(30)]
    deliveries = publish_in_one_read(client, bodies)
    owner = {d.body: d.method.consumer_tag for d in deliveries}
    first = "abc".index(owner[bodies[0]])
    assert [owner[body] for body in bodies] == ["abc"[(first + n) % 3] for n in range(30)]
    for tag in "abc":
        mine = [d.body for d in deliveries if d.method.consumer_tag == tag]
        assert mine == [body for body in bodies if owner[body] == tag]
    on_one = [d.method.delivery_tag for d in deliveries if d.channel == 1]
    assert on_one == list(range(1, 21))
    client.send(1, commands.Basic.Ack(delivery_tag=20, multiple=True))
    client.send(2, commands.Basic.Ack(delivery_tag=10, multiple=True))
    client.read()
    client.send(3, method(commands.Queue.Declare, queue="q", passive=True))
    declared = client.expect_one("Queue.DeclareOk", channel=3)
    assert declared.message_count == 0
