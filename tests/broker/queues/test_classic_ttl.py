"""Classic queues: message TTL, queue TTL and which messages die for which reason,
with time driven by the test (broker/queues/classic.py).

RabbitMQ behaviours checked (the TTL guide, the dead letter exchanges guide, the
queue length guide, as rabbit_amqqueue_process applies them to classic queues):
x-message-ttl and the policy's message-ttl, the lower wins; a message's
`expiration`, the lower of it and the queue's; TTL 0 delivers only to a consumer
that can take the message at once; expired messages leave from the head, on the
timer and before anything is handed out, never delivered; unacked messages do not
expire, requeued ones keep their expiry; deaths for `rejected`, `expired` and
`maxlen` (drop-head and reject-publish-dlx), none for acks, requeues, purges or
reject-publish; x-expires deletes a queue unused (no consumer, basic.get or
declare) for its period; expiries kept across a restart.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from quorumqueue.broker.amqp import codec
from quorumqueue.broker.queues.actions import carry_out
from quorumqueue.broker.queues.base import Confirm
from quorumqueue.broker.queues.classic import ClassicQueue
from quorumqueue.broker.queues.message import Message
from quorumqueue.broker.storage.message_store import RecoveredMessage

START = 1_700_000_000_000  # a wall-clock time in ms


@dataclass
class FakeNode:
    """The ClassicHost: the clock the test drives, and what the queue handed over."""

    clock_ms: int = START
    deaths: list = field(default_factory=list)    # (body, reason)
    expired_queues: list = field(default_factory=list)
    wakes: list = field(default_factory=list)  # ms the queue asked to be woken at

    def dead_letter(self, queue, message, reason) -> None:
        self.deaths.append((message.body, reason))

    def expire_queue(self, queue) -> None:
        self.expired_queues.append(queue.name)

    def wake_at(self, queue, ms) -> None:
        self.wakes.append(ms)


@dataclass
class Policy:
    definition: dict


class FakeChannel:
    is_open = True

    def __init__(self) -> None:
        self.delivered: list[bytes] = []
        self.unacked: list = []
        self.got: list = []
        self.charged = 0  # deliveries decided (consumer.charge) and not yet carried out

    def deliver(self, consumer, queue, entry, redelivered, exchange, routing_key, header,
                body, charged=False) -> None:
        self.delivered.append(body)
        if not consumer.no_ack:
            self.unacked.append(entry)
            self.charged -= charged

    def get_ok(self, queue, entry, no_ack, redelivered, exchange, routing_key, remaining,
               header, body) -> None:
        self.got.append(body)
        if not no_ack:
            self.unacked.append(entry)

    def get_empty(self) -> None:
        self.got.append(None)


@dataclass(eq=False)
class FakeConsumer:
    channel: FakeChannel
    prefetch: int = 10
    no_ack: bool = False
    tag: str = "c"
    priority: int = 0
    exclusive: bool = False

    def has_capacity(self) -> bool:
        return len(self.channel.unacked) + self.channel.charged < self.prefetch

    def charge(self) -> None:
        if not self.no_ack:
            self.channel.charged += 1


def message(body: bytes, expiration: str | None = None) -> Message:
    values = {"expiration": expiration} if expiration is not None else {}
    _class, properties = codec.decode_properties(codec.encode_properties(len(body), values))
    return Message("ex", "rk", properties, body)


def new_queue(node: FakeNode, policy=None, **arguments) -> ClassicQueue:
    queue = ClassicQueue("/", "q", True, None, False, arguments, node=node)
    queue.policy_changed(policy)
    return queue


def publish(queue: ClassicQueue, *bodies: bytes, expiration: str | None = None,
            confirm: Confirm | None = None) -> None:
    for body in bodies:
        carry_out(queue.publish(message(body, expiration), None, confirm))


def ready_bodies(queue: ClassicQueue) -> list[bytes]:
    return [entry.message.body for entry in queue.ready_entries()]


# ---------------------------------------------------------------- message TTL


def test_queue_ttl_expires_messages_on_the_timer_without_a_consumer():
    node = FakeNode()
    queue = new_queue(node, **{"x-message-ttl": 1000})
    publish(queue, b"a", b"b")
    node.clock_ms += 999
    queue.tick(node.clock_ms)
    assert ready_bodies(queue) == [b"a", b"b"]
    node.clock_ms += 1
    queue.tick(node.clock_ms)
    assert ready_bodies(queue) == [] and queue.ready_bytes == 0
    assert node.deaths == [(b"a", "expired"), (b"b", "expired")]


def test_the_lower_of_argument_and_policy_ttl_wins_for_messages_published_after():
    """The TTL guide: both set, the lower applies; a change does not touch queued
    messages' expiries (RabbitMQ computes a message's expiry when it is published)."""
    node = FakeNode()
    queue = new_queue(node, Policy({"message-ttl": 500}), **{"x-message-ttl": 2000})
    publish(queue, b"policy-500")
    queue.policy_changed(Policy({"message-ttl": 5000}))  # now the argument's 2000
    publish(queue, b"argument-2000")
    node.clock_ms += 500
    queue.tick(node.clock_ms)
    assert ready_bodies(queue) == [b"argument-2000"]
    node.clock_ms += 1500
    queue.tick(node.clock_ms)
    assert node.deaths == [(b"policy-500", "expired"), (b"argument-2000", "expired")]


def test_per_message_expiration_the_lower_of_it_and_the_queue_ttl():
    node = FakeNode()
    queue = new_queue(node, **{"x-message-ttl": 1000})
    publish(queue, b"own-300", expiration="300")
    publish(queue, b"queue-1000", expiration="60000")
    node.clock_ms += 300
    queue.tick(node.clock_ms)
    assert ready_bodies(queue) == [b"queue-1000"]
    node.clock_ms += 700
    queue.tick(node.clock_ms)
    assert ready_bodies(queue) == []
    plain = new_queue(node)
    publish(plain, b"own", expiration="10")
    publish(plain, b"forever")
    node.clock_ms += 10
    plain.tick(node.clock_ms)
    assert ready_bodies(plain) == [b"forever"]


def test_only_heads_expire_a_short_ttl_behind_a_long_one_waits_but_is_never_delivered():
    """The TTL guide ("Caveats"): only expired messages at the head are removed; the
    short-lived one is counted until it reaches the head, and it is not delivered."""
    node = FakeNode()
    queue = new_queue(node)
    publish(queue, b"long", expiration="10000")
    publish(queue, b"short", expiration="100")
    node.clock_ms += 200
    queue.tick(node.clock_ms)
    assert ready_bodies(queue) == [b"long", b"short"]
    channel = FakeChannel()
    carry_out(queue.consume(channel, FakeConsumer(channel)))
    assert channel.delivered == [b"long"]
    assert node.deaths == [(b"short", "expired")]


def test_an_expired_head_is_never_delivered_or_got_even_before_the_timer_runs():
    node = FakeNode()
    queue = new_queue(node, **{"x-message-ttl": 100})
    publish(queue, b"old")
    node.clock_ms += 100  # no tick
    channel = FakeChannel()
    carry_out(queue.basic_get(channel, no_ack=True))
    assert channel.got == [None]
    publish(queue, b"fresh")
    node.clock_ms += 100
    carry_out(queue.consume(channel, FakeConsumer(channel)))
    assert channel.delivered == []
    assert node.deaths == [(b"old", "expired"), (b"fresh", "expired")]


def test_ttl_zero_delivers_only_to_a_consumer_that_can_take_it_at_once():
    """The TTL guide: with a TTL of 0 a message expires on reaching the queue unless
    it can be delivered to a consumer straight away."""
    node = FakeNode()
    queue = new_queue(node, **{"x-message-ttl": 0})
    channel = FakeChannel()
    carry_out(queue.consume(channel, FakeConsumer(channel, prefetch=1)))
    publish(queue, b"taken", b"no-room")
    assert channel.delivered == [b"taken"]
    assert queue.ready_count == 0 and node.deaths == [(b"no-room", "expired")]
    plain = new_queue(node)
    publish(plain, b"zero", expiration="0")
    assert plain.ready_count == 0 and node.deaths[-1] == (b"zero", "expired")


def test_unacked_messages_do_not_expire_and_requeued_ones_keep_their_expiry():
    node = FakeNode()
    queue = new_queue(node, **{"x-message-ttl": 1000})
    publish(queue, b"m")
    channel = FakeChannel()
    carry_out(queue.basic_get(channel, no_ack=False))
    node.clock_ms += 5000
    queue.tick(node.clock_ms)
    assert queue.unacked_count == 1 and node.deaths == []
    carry_out(queue.settle(channel, channel.unacked, True))  # requeued: its expiry passed
    queue.tick(node.clock_ms)
    assert queue.ready_count == 0 and queue.unacked_count == 0
    assert node.deaths == [(b"m", "expired")]


def test_expiries_survive_a_restart_through_the_message_store_records():
    """A durable queue's recovered messages keep the expiry written with them: one
    that passed while the broker was down expires at the first tick."""
    node = FakeNode()
    queue = new_queue(node, **{"x-message-ttl": 60_000})
    header = codec.encode_properties(4, {"delivery_mode": 2})
    queue.recover_stored([
        RecoveredMessage(1, "ex", "rk", header, b"gone", expires=START - 1),
        RecoveredMessage(2, "ex", "rk", header, b"kept", expires=START + 10),
        RecoveredMessage(3, "ex", "rk", header, b"none")])
    queue.tick(node.clock_ms)
    assert ready_bodies(queue) == [b"kept", b"none"]
    node.clock_ms += 10
    queue.tick(node.clock_ms)
    assert ready_bodies(queue) == [b"none"]
    assert node.deaths == [(b"gone", "expired"), (b"kept", "expired")]


# ---------------------------------------------------------------- dead-letter reasons


def test_reject_without_requeue_dies_rejected_acks_and_requeues_do_not():
    node = FakeNode()
    queue = new_queue(node)
    publish(queue, b"acked", b"requeued", b"rejected")
    channel = FakeChannel()
    for _ in range(3):
        carry_out(queue.basic_get(channel, no_ack=False))
    acked, requeued, rejected = channel.unacked
    carry_out(queue.settle(channel, [acked], None))
    carry_out(queue.settle(channel, [requeued], True))
    carry_out(queue.settle(channel, [rejected], False))
    assert node.deaths == [(b"rejected", "rejected")]
    assert ready_bodies(queue) == [b"requeued"]
    queue.purge(None)
    assert node.deaths == [(b"rejected", "rejected")]  # purge is no death


def test_drop_head_dies_maxlen_counting_body_bytes():
    """x-max-length-bytes counts message bodies (the queue length guide)."""
    node = FakeNode()
    queue = new_queue(node, **{"x-max-length-bytes": 5})
    publish(queue, b"abc", b"de", b"f")
    assert ready_bodies(queue) == [b"de", b"f"] and queue.ready_bytes == 3
    assert node.deaths == [(b"abc", "maxlen")]


def test_reject_publish_dlx_nacks_and_dead_letters_reject_publish_only_nacks():
    """The queue length guide: reject-publish-dlx rejects the publish and
    dead-letters the message; reject-publish does not dead-letter it."""
    for overflow, deaths in (("reject-publish-dlx", [(b"over", "maxlen")]),
                             ("reject-publish", [])):
        node = FakeNode()
        queue = new_queue(node, **{"x-max-length": 1, "x-overflow": overflow})
        publish(queue, b"kept")
        confirm = Confirm(None, 1, None)
        publish(queue, b"over", confirm=confirm)
        assert confirm.ok is False
        assert ready_bodies(queue) == [b"kept"] and node.deaths == deaths


def test_a_policy_lowering_max_length_drops_from_the_head_as_maxlen():
    node = FakeNode()
    queue = new_queue(node)
    publish(queue, b"1", b"2", b"3")
    queue.policy_changed(Policy({"max-length": 1, "overflow": "drop-head"}))
    assert ready_bodies(queue) == [b"3"]
    assert node.deaths == [(b"1", "maxlen"), (b"2", "maxlen")]


# ---------------------------------------------------------------- queue TTL


def test_an_unused_queue_is_handed_for_deletion_after_its_period_and_again_later():
    node = FakeNode()
    queue = new_queue(node, **{"x-expires": 1000})  # the period starts
    node.clock_ms += 999
    queue.tick(node.clock_ms)
    assert node.expired_queues == []
    node.clock_ms += 1
    queue.tick(node.clock_ms)
    queue.tick(node.clock_ms + 5000)
    assert node.expired_queues == ["q"]
    queue.tick(node.clock_ms + 10_000)  # still not deleted (no metadata majority): again
    assert node.expired_queues == ["q", "q"]


def test_consumers_gets_and_declares_keep_a_queue_alive_publishes_do_not():
    """RabbitMQ's classic queues: unused means no consumers, no basic.get and no
    redeclaration for the period; publishing does not count."""
    node = FakeNode()
    queue = new_queue(node, Policy({"expires": 2000}), **{"x-expires": 1000})  # 1000
    queue.tick(node.clock_ms)
    channel = FakeChannel()
    consumer = FakeConsumer(channel)
    carry_out(queue.consume(channel, consumer))
    node.clock_ms += 10_000
    queue.tick(node.clock_ms)
    queue.cancel(channel, consumer)  # the period starts again
    node.clock_ms += 900
    carry_out(queue.basic_get(channel, no_ack=True))
    node.clock_ms += 900
    queue.declare_ok(None)
    node.clock_ms += 900
    publish(queue, b"publishing is no use")
    queue.tick(node.clock_ms)
    assert node.expired_queues == []
    node.clock_ms += 100
    queue.tick(node.clock_ms)
    assert node.expired_queues == ["q"]


# ---------------------------------------------------------------- on time


def test_a_queue_asks_to_be_woken_when_a_ready_message_or_the_queue_expires():
    """RabbitMQ's classic queue sets its ttl timer for the head's expiry and its
    expiry timer for the end of the x-expires period: the queue names those moments
    (ClassicHost.wake_at), so that the node runs its tick then, not at the next
    half-second sweep. A message behind a longer-lived head asks too; its moment
    finds only the head, which then names its own."""
    node = FakeNode()
    queue = new_queue(node, **{"x-message-ttl": 1000, "x-expires": 5000})
    publish(queue, b"a")
    publish(queue, b"b", expiration="50")
    assert node.wakes == [START + 1000, START + 50]
    node.clock_ms = START + 50
    queue.tick(node.clock_ms)
    assert ready_bodies(queue) == [b"a", b"b"] and node.wakes[-1] == START + 1000
    node.clock_ms = START + 1000
    queue.tick(node.clock_ms)
    assert ready_bodies(queue) == [] and node.deaths == [(b"a", "expired"),
                                                         (b"b", "expired")]
    assert node.wakes[-1] == START + 5000  # the declaration started the period
    queue.touch(START + 2000)               # a basic.get: the period starts again
    assert node.wakes[-1] == START + 7000
    node.clock_ms = START + 7000
    queue.tick(node.clock_ms)
    assert node.expired_queues == ["q"]
