"""broker/node's hand-inlined copies ("twins") agree with their originals."""
from __future__ import annotations

from types import SimpleNamespace
from unittest.mock import patch

from hypothesis import given, settings
from hypothesis import strategies as st

from quorumqueue.broker.amqp import codec, spec
from quorumqueue.broker.amqp.errors import AMQPError
from quorumqueue.broker.amqp.events import ContentReceived
from quorumqueue.broker.node import handlers
from quorumqueue.broker.node.node import Node
from quorumqueue.broker.node.session import Session
from quorumqueue.broker.node.vhost import VHost

names = st.sampled_from(["", "q", "orders", "amq.gen-1", "é"])


@settings(max_examples=300, deadline=None)
@given(st.sets(names, max_size=4), names)
def test_the_default_exchange_routes_as_vhost_route_does(declared, routing_key):
    """Node._route's default-exchange case (twin of VHost.route's first case, no
    headers closure built): the same queues as `VHost.route` through the default
    exchange, and a routing cache key, as the general path gives (the default
    exchange never reads headers)."""
    vhost = VHost("/")
    for name in declared:
        vhost.queues[name] = SimpleNamespace(name=name)
    properties = SimpleNamespace(selected_keys=(), decoded=lambda: {"headers": {"h": 1}})
    read = []
    queues, key = Node._route(None, vhost, "", routing_key, properties)
    expected = vhost.route(vhost.exchange(""), routing_key, lambda: read.append(1))
    assert queues == expected and key == ("", routing_key) and not read


class _Received:
    """The connection's side of `Session._handle_events`: what one read received,
    as events. `fail` closes the channel, and the channel's later messages are
    discarded, as the real connection discards what follows a channel's error.
    `next_content` hands over the next event only when it is a message on that
    channel (the real one reads only whole messages it would not fail on)."""

    def __init__(self, events: list[ContentReceived]) -> None:
        self.pending = list(events)
        self.closed: set[int] = set()
        self.failed: list[tuple[int, int]] = []
        self.urgent = False

    def _drop_closed(self) -> None:
        while self.pending and self.pending[0].channel in self.closed:
            self.pending.pop(0)

    def next_event(self) -> ContentReceived | None:
        self._drop_closed()
        return self.pending.pop(0) if self.pending else None

    def next_content(self, number: int) -> ContentReceived | None:
        self._drop_closed()
        if self.pending and self.pending[0].channel == number:
            return self.pending.pop(0)
        return None

    def fail(self, error: AMQPError, channel: int) -> None:
        self.failed.append((channel, error.code))
        self.closed.add(channel)


def _session(events: list[ContentReceived]) -> Session:
    session = object.__new__(Session)  # the fields `_handle_events` and `_content` use
    session.connection = _Received(events)
    session.channels = {number: SimpleNamespace(number=number, held=None)
                        for number in (1, 2, 3)}
    session.node = SimpleNamespace(dirty=set())
    session._out, session._handling, session.input_held = [], False, False
    session.has_published = False
    session._placing = False  # a node of one process: no handover (node/handover.py)
    return session


def _publish_recording(published: list[tuple[int, bytes]]):
    """handlers.publish: the run's messages up to the first whose body starts with
    b"!" are published; that one fails (its position and error)."""
    def publish(session, channel, run):
        assert all(event.channel == channel.number for event in run)
        for position, event in enumerate(run):
            if event.body.startswith(b"!"):
                return position, AMQPError(spec.PRECONDITION_FAILED, "PRECONDITION_FAILED")
            published.append((event.channel, event.body))
        return None
    return publish


messages = st.lists(st.tuples(st.sampled_from([1, 2, 3]), st.sampled_from([b"m", b"!"])),
                    min_size=1, max_size=12)


@settings(max_examples=300, deadline=None)
@given(messages, st.sampled_from([None, 1, 2, 3, 5]))
def test_a_run_of_published_messages_is_published_as_content_publishes_each(steps, budget):
    """Session._handle_events hands the messages that follow a message on its
    channel to handlers.publish as one run (twin of `Session._content`, once per
    run). Its budget may cut the run. It publishes the same messages, in the same
    order, fails the same channels with the same codes, and sets `has_published`,
    as `_content` does for each message in turn."""
    events = [ContentReceived(channel, codec.Publish("", "q", False, False), None,
                              body + bytes([at]))
              for at, (channel, body) in enumerate(steps)]
    run_published: list = []
    one_published: list = []
    runs, one = _session(events), _session(events)
    with patch.object(handlers, "publish", _publish_recording(run_published)):
        while runs._handle_events(budget) or runs.input_held:
            runs.input_held = False
    with patch.object(handlers, "publish", _publish_recording(one_published)):
        while (event := one.connection.next_event()) is not None:
            one._content(event)
    assert run_published == one_published
    assert runs.connection.failed == one.connection.failed
    assert runs.has_published and one.has_published
