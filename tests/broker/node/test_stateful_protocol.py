"""Hypothesis stateful tests of the connection and channel state machines (AMQP 0-9-1).

A `RuleBasedStateMachine` plays a client against the sans-I/O session core (the
connection and channel machines of broker/amqp with a node behind them) and sends
valid and invalid frames in any order: channel.open (also of an open channel),
channel.close and close-ok (also of channels never opened), queue.declare,
confirm.select, basic.get and basic.ack of the tags it gave (also twice),
basic.publish and its content header and body frames as separate
rules (so content split arbitrarily, interleaved with other channels' frames, cut
off by a close or a method, or over the declared size), basic.ack/nack/reject of
delivery tags never given, heartbeats on channel 0 and on others, frames over
frame_max, bad end octets, garbage octets, connection.close and close-ok, time
passing (with heartbeats of 10 s negotiated or none). Every rule's bytes are fed in
arbitrary chunks.

A model follows the connection (open, closing: the server sent connection.close,
closed) and every channel (free, open with its content state, closing: the server
sent channel.close), and predicts each rule's answer as RabbitMQ gives it
(rabbit_reader, rabbit_command_assembler, rabbit_channel): open-ok and close-ok,
504 CHANNEL_ERROR for a method on a channel that is not open or opened twice, 505
UNEXPECTED_FRAME for content out of order (also as a channel's first frame) or a
heartbeat off channel 0, 501
FRAME_ERROR for an oversize frame, a bad end octet or a body over the declared size,
406 PRECONDITION_FAILED for an unknown delivery tag or a message over
max_message_size, nothing for frames on a closing channel or connection (spec
1.4.2.9, 1.5.2.5) but a close-ok for a channel.close that crossed the server's
(the channel stays closing until the client's close-ok) and 504 for a channel.open
before that close-ok, a confirm for each published message in confirm mode. It also
follows the queue, which outlives connections: declare-ok's message count is the
messages published and not got, plus those got but not acked when their channel or
connection ended (RabbitMQ requeues them); get-ok or get-empty accordingly, and
delivery tags 1, 2, ... per channel.

Invariants after every rule: receive_data never raises; the output is whole frames
a client (pamqp) decodes; every close carries an AMQP reply code and RabbitMQ's
`NAME - detail` text; nothing but close-ok after connection.close and nothing at all
after the connection ended; a channel number is free again after its close, and
opening it again succeeds. The node serves a fresh connection at the end.

Bounded for the default run (STATEFUL_EXAMPLES, default 250 programs of up to 40
rules: 500 took 100 s at a load average of 20); `make faults` sets
QUORUMQUEUE_FUZZ_EXAMPLES for the long form.
"""

from __future__ import annotations

import os
import struct

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition,
                                 rule)
from pamqp import body as pamqp_body
from pamqp import commands
from pamqp import header as pamqp_header

from quorumqueue.broker.amqp import spec
from quorumqueue.broker.config import Settings
from tests.broker.node.harness import Client, decode_stream, marshal, method, new_node, name
from tests.broker.node.test_fuzz import assert_node_still_works, check_output

pytestmark = pytest.mark.filterwarnings("ignore:This command is deprecated")

STATEFUL_EXAMPLES = int(os.environ.get("QUORUMQUEUE_FUZZ_EXAMPLES", "250"))
FRAME_MAX = 8192
MAX_MESSAGE_SIZE = 4096
CHANNELS = st.sampled_from([1, 1, 1, 2, 3, 65535])  # mostly the one open from the start
QUEUE = "stateful"

FREE, OPEN, CLOSING = "free", "open", "closing"
HEARTBEAT = b"\x08\x00\x00\x00\x00\x00\x00\xce"


class Model:
    """What the client knows of the connection: the server's answers follow from it."""

    def __init__(self) -> None:
        self.connection = OPEN           # OPEN, CLOSING (server sent close) or "closed"
        self.channels: dict[int, str] = {}          # number -> OPEN or CLOSING
        self.content: dict[int, int | None] = {}    # OPEN number -> None idle,
        # -1 awaiting the header, n >= 0 body octets still due
        self.confirming: set[int] = set()
        self.published: dict[int, int] = {}         # confirm-mode number -> messages
        self.delivered: dict[int, int] = {}         # number -> the last delivery tag
        self.unacked: dict[int, set[int]] = {}      # number -> tags not acked yet
        self.closing_since = 0.0  # when the server sent connection.close
        self.heartbeat = 0        # negotiated in tune-ok (seconds; 0: none)
        self.last_received = self.last_sent = 0.0  # the core's heartbeat clocks
        self.chaos = False  # garbage octets were sent: answers no longer predictable

    def state(self, number: int) -> str:
        return self.channels.get(number, FREE)


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    """`data` cut at the given offsets (taken modulo its length)."""
    points = sorted({cut % (len(data) + 1) for cut in cuts} | {0, len(data)})
    return [data[a:b] for a, b in zip(points, points[1:])]


def raw(frame_type: int, channel: int, payload: bytes, end: int = spec.FRAME_END) -> bytes:
    return struct.pack(">BHI", frame_type, channel, len(payload)) + payload + bytes([end])


class ProtocolMachine(RuleBasedStateMachine):
    """One node; a connection at a time (a new one once the last is closed)."""

    def __init__(self) -> None:
        super().__init__()
        self.node = new_node(Settings(max_message_size=MAX_MESSAGE_SIZE))
        self.client: Client | None = None
        self.model = Model()
        self.output_state: dict = {}
        # the queue, which outlives connections: declared yet, messages ready (None:
        # unknown since garbage was sent)
        self.declared = False
        self.ready: int | None = 0

    # ------------------------------------------------------------ plumbing

    def connect(self, heartbeat: int = 0) -> None:
        if self.ready is None:  # garbage left the queue unknown: start it afresh
            self.client = Client(self.node)
            self.client.handshake()
            self.client.open_channel(1)
            self.client.call(1, commands.Queue.Delete(queue=QUEUE), "Queue.DeleteOk")
            self.declared, self.ready = False, 0
        self.client = Client(self.node)
        self.client.handshake(frame_max=FRAME_MAX, heartbeat=heartbeat)
        self.client.open_channel(1)  # most programs then start with something to say
        self.model = Model()
        self.model.heartbeat = heartbeat
        self.model.last_received = self.model.last_sent = self.client.now
        self.model.channels[1], self.model.content[1] = OPEN, None
        self.output_state = {}
        self.queue_declare(1)

    def send(self, data: bytes, cuts: list[int]) -> list[tuple[int, object]]:
        """Feed `data` in chunks; return the decoded answer (checked frame by frame)."""
        client = self.client
        for part in chunked(data, cuts):
            client.session.receive_data(part, client.now)  # must never raise
        out = client.read_raw()
        check_output(out, self.output_state)
        if self.model.connection != "closed":
            self.model.last_received = client.now
            if out:
                self.model.last_sent = client.now
        if self.model.connection == "closed":
            assert out == b"", f"output after the connection ended: {out[:64]!r}"
        return decode_stream(out)

    def expect(self, frames, *expected: tuple) -> None:
        """Unless garbage made the stream unpredictable, the answer is exactly
        `expected`: (channel, name) or (channel, name, reply code) per frame."""
        if self.model.chaos:
            return
        got = []
        for channel, value in frames:
            entry = (channel, name(value))
            if entry[1] in ("Connection.Close", "Channel.Close"):
                entry += (value.reply_code,)
            got.append(entry)
        assert got == list(expected), (got, expected)

    def connection_error(self, frames, code: int) -> None:
        """The connection is closed by the server with `code`: connection.close is
        sent, every channel is gone, only close-ok is read from now on."""
        self.expect(frames, (0, "Connection.Close", code))
        self.requeue_all()
        self.model.connection = CLOSING
        self.model.closing_since = self.client.now
        self.model.channels.clear()
        self.model.content.clear()

    def channel_error(self, frames, number: int, code: int) -> None:
        self.expect(frames, (number, "Channel.Close", code))
        self.requeue(number)
        self.model.channels[number] = CLOSING
        self.model.content.pop(number, None)
        self.model.confirming.discard(number)

    def silent(self) -> bool:
        """Frames are discarded unanswered: the connection is closing or closed."""
        return self.model.connection != OPEN

    # ------------------------------------------------------------ rules: channels

    @initialize(heartbeat=st.sampled_from([0, 10]))
    def start(self, heartbeat) -> None:
        self.connect(heartbeat)

    @rule(number=CHANNELS, cuts=st.lists(st.integers(0, 64), max_size=3))
    def channel_open(self, number, cuts):
        frames = self.send(marshal(commands.Channel.Open(), number), cuts)
        state = self.model.state(number)
        if self.silent():
            self.expect(frames)
        elif state == CLOSING:  # before the client's close-ok: rabbit_channel's 504
            self.connection_error(frames, spec.CHANNEL_ERROR)  # second 'channel.open'
        elif state == FREE:   # also a number closed before: it can be reopened
            self.expect(frames, (number, "Channel.OpenOk"))
            self.model.channels[number] = OPEN
            self.model.content[number] = None
        elif self.model.content[number] is not None:
            self.connection_error(frames, spec.UNEXPECTED_FRAME)
        else:
            self.connection_error(frames, spec.CHANNEL_ERROR)  # second 'channel.open'

    @rule(number=CHANNELS, cuts=st.lists(st.integers(0, 64), max_size=3))
    def channel_close(self, number, cuts):
        frames = self.send(marshal(method(commands.Channel.Close, reply_code=200,
                                          reply_text="bye", class_id=0, method_id=0),
                                   number), cuts)
        state = self.model.state(number)
        if self.silent():
            self.expect(frames)
        elif state == FREE:
            self.connection_error(frames, spec.CHANNEL_ERROR)   # expected 'channel.open'
        elif state == OPEN and self.model.content[number] is not None:
            self.connection_error(frames, spec.UNEXPECTED_FRAME)
        elif state == CLOSING:  # both sides closed at once: close-ok, and the channel
            # stays closing until the client's close-ok for the server's close
            self.expect(frames, (number, "Channel.CloseOk"))
        else:
            self.expect(frames, (number, "Channel.CloseOk"))
            self.forget(number)

    @rule(number=CHANNELS)
    def channel_close_ok(self, number):
        frames = self.send(marshal(commands.Channel.CloseOk(), number), [])
        state = self.model.state(number)
        if self.silent():
            self.expect(frames)
        elif state == CLOSING:
            self.expect(frames)
            self.forget(number)
        elif state == OPEN and self.model.content[number] is not None:
            self.connection_error(frames, spec.UNEXPECTED_FRAME)
        else:  # never opened, or open: 504 either way
            self.connection_error(frames, spec.CHANNEL_ERROR)

    def requeue(self, number: int) -> None:
        """A channel that ends gives its unacknowledged messages back to the queue."""
        unacked = self.model.unacked.pop(number, set())
        self.model.delivered.pop(number, None)
        if self.ready is not None:
            self.ready += len(unacked)

    def requeue_all(self) -> None:
        for number in list(self.model.unacked):
            self.requeue(number)

    def forget(self, number: int) -> None:
        self.requeue(number)
        self.model.channels.pop(number, None)
        self.model.content.pop(number, None)
        self.model.confirming.discard(number)
        self.model.published.pop(number, None)

    # ------------------------------------------------------------ rules: methods

    def method_rule(self, number: int, value, answer: str | None,
                    channel_code: int | None = None) -> list:
        """A channel method: `answer` on an open idle channel (or a channel error)."""
        data = value if isinstance(value, bytes) else marshal(value, number)
        frames = self.send(data, [])
        state = self.model.state(number)
        if self.silent() or state == CLOSING:
            self.expect(frames)
        elif state == FREE:
            self.connection_error(frames, spec.CHANNEL_ERROR)
        elif self.model.content[number] is not None:
            self.connection_error(frames, spec.UNEXPECTED_FRAME)
        elif channel_code is not None:
            self.channel_error(frames, number, channel_code)
        else:
            self.expect(frames, *([(number, answer)] if answer else []))
            return frames
        return []

    @rule(number=CHANNELS)
    def queue_declare(self, number):
        """declare-ok counts the messages ready: published, not got, or given back."""
        frames = self.method_rule(number, commands.Queue.Declare(queue=QUEUE),
                                  "Queue.DeclareOk")
        if frames:
            self.declared = True
            if self.ready is not None and not self.model.chaos:
                assert frames[0][1].message_count == self.ready, (frames, self.ready)

    @rule(number=CHANNELS)
    def basic_get(self, number):
        """basic.get with manual ack: get-ok and the message (its header, and a body
        frame unless empty) while the queue has one, get-empty after; 404 before the
        queue was declared."""
        frames = self.send(marshal(commands.Basic.Get(queue=QUEUE), number), [])
        state = self.model.state(number)
        if self.silent() or state == CLOSING:
            self.expect(frames)
        elif state == FREE:
            self.connection_error(frames, spec.CHANNEL_ERROR)
        elif self.model.content[number] is not None:
            self.connection_error(frames, spec.UNEXPECTED_FRAME)
        elif self.model.chaos or self.ready is None:
            pass
        elif not self.declared:
            self.channel_error(frames, number, spec.NOT_FOUND)
        elif self.ready == 0:
            self.expect(frames, (number, "Basic.GetEmpty"))
        else:
            names = [name(value) for _c, value in frames]
            assert names[:2] == ["Basic.GetOk", "ContentHeader"], names
            assert set(names[2:]) <= {"ContentBody"}, names
            tag = self.model.delivered.get(number, 0) + 1
            assert frames[0][1].delivery_tag == tag
            self.model.delivered[number] = tag
            self.model.unacked.setdefault(number, set()).add(tag)
            self.ready -= 1

    @rule(number=CHANNELS, data=st.data())
    def basic_ack(self, number, data):
        """basic.ack of a tag got on this channel: once is fine, twice is rabbit_channel's
        406 "unknown delivery tag"."""
        given = self.model.delivered.get(number, 0)
        if not given:
            return
        tag = data.draw(st.integers(1, given), label="tag")
        known = tag in self.model.unacked.get(number, set())
        self.method_rule(number, raw(spec.FRAME_METHOD, number,
                                     struct.pack(">HHQB", spec.BASIC, 80, tag, 0)),
                         None, channel_code=None if known
                         else spec.PRECONDITION_FAILED)
        if known and self.model.state(number) == OPEN and not self.silent():
            self.model.unacked[number].discard(tag)

    @rule(number=CHANNELS)
    def confirm_select(self, number):
        if self.method_rule(number, commands.Confirm.Select(), "Confirm.SelectOk"):
            self.model.confirming.add(number)
            self.model.published.setdefault(number, 0)

    @rule(number=CHANNELS, tag=st.integers(10 ** 6, 2 ** 64 - 1),
          kind=st.sampled_from([80, 120, 90]))
    def unknown_delivery_tag(self, number, tag, kind):
        """basic.ack (80), nack (120), reject (90) of a tag never given, up to the
        spec's unsigned 64 bits: rabbit_channel's 406 "unknown delivery tag N"."""
        payload = struct.pack(">HHQB", spec.BASIC, kind, tag, 0)
        self.method_rule(number, raw(spec.FRAME_METHOD, number, payload), None,
                         channel_code=spec.PRECONDITION_FAILED)

    # ------------------------------------------------------------ rules: content

    @rule(number=CHANNELS)
    def basic_publish(self, number):
        frames = self.send(marshal(commands.Basic.Publish(exchange="", routing_key=QUEUE),
                                   number), [])
        state = self.model.state(number)
        if self.silent() or state == CLOSING:
            self.expect(frames)
        elif state == FREE:
            self.connection_error(frames, spec.CHANNEL_ERROR)
        elif self.model.content[number] is not None:
            self.connection_error(frames, spec.UNEXPECTED_FRAME)
        else:
            self.expect(frames)
            self.model.content[number] = -1

    @rule(number=CHANNELS, size=st.one_of(st.integers(0, 300),
                                          st.integers(MAX_MESSAGE_SIZE - 2,
                                                      MAX_MESSAGE_SIZE + 2)),
          cuts=st.lists(st.integers(0, 64), max_size=3))
    def content_header(self, number, size, cuts):
        header = pamqp_header.ContentHeader(0, size, commands.Basic.Properties(
            delivery_mode=2, message_id="m"))
        frames = self.send(marshal(header, number), cuts)
        state = self.model.state(number)
        if self.silent() or state == CLOSING:
            self.expect(frames)
        elif state == FREE:  # rabbit_reader: a new number's first frame must be a method
            self.connection_error(frames, spec.UNEXPECTED_FRAME)
        elif self.model.content[number] != -1:
            self.connection_error(frames, spec.UNEXPECTED_FRAME)
        elif size > MAX_MESSAGE_SIZE:
            self.channel_error(frames, number, spec.PRECONDITION_FAILED)
        elif size == 0:
            self.message_complete(number, frames)
        else:
            self.expect(frames)
            self.model.content[number] = size

    @rule(number=CHANNELS, size=st.integers(0, 400),
          cuts=st.lists(st.integers(0, 512), max_size=4))
    def content_body(self, number, size, cuts):
        frames = self.send(marshal(pamqp_body.ContentBody(b"b" * size), number), cuts)
        state = self.model.state(number)
        due = self.model.content.get(number)
        if self.silent() or state == CLOSING:
            self.expect(frames)
        elif state == FREE:
            self.connection_error(frames, spec.UNEXPECTED_FRAME)
        elif due is None or due == -1:
            self.connection_error(frames, spec.UNEXPECTED_FRAME)
        elif size > due:  # as RabbitMQ 4.x: the body overruns the declared size
            self.connection_error(frames, spec.FRAME_ERROR)
        elif size == due:
            self.message_complete(number, frames)
        else:
            self.expect(frames)
            self.model.content[number] = due - size

    @rule(number=CHANNELS, size=st.integers(0, 300),
          cuts=st.lists(st.integers(0, 512), max_size=4))
    def whole_message(self, number, size, cuts):
        """basic.publish, its header and its body in a row (the rules above, one
        after the other): a message that reaches the queue, once declared."""
        self.basic_publish(number)
        self.content_header(number, size, [])
        if size and self.model.content.get(number) == size:
            self.content_body(number, size, cuts)

    def message_complete(self, number: int, frames) -> None:
        self.model.content[number] = None
        if self.declared and self.ready is not None:
            self.ready += 1
        if number in self.model.confirming:
            self.model.published[number] += 1
            if not self.model.chaos:
                assert [name(value) for _c, value in frames] == ["Basic.Ack"], frames
                assert frames[0][1].delivery_tag == self.model.published[number]
        else:
            self.expect(frames)

    # ------------------------------------------------------------ rules: framing

    @rule(number=st.sampled_from([0, 0, 1, 7]))
    def heartbeat(self, number):
        frames = self.send(raw(spec.FRAME_HEARTBEAT, number, b""), [])
        if self.silent():
            self.expect(frames)
        elif number == 0:
            self.expect(frames)
        else:  # rabbit_reader: a heartbeat on a channel is an unexpected frame
            self.connection_error(frames, spec.UNEXPECTED_FRAME)

    @rule(number=CHANNELS, over=st.integers(1, 2 ** 20))
    def oversize_frame(self, number, over):
        """A frame header announcing more than frame_max: 501 at once, from the
        header alone (rabbit_reader frame_too_large)."""
        size = FRAME_MAX - spec.FRAME_OVERHEAD + over
        frames = self.send(struct.pack(">BHI", spec.FRAME_BODY, number, size), [])
        self.framing_error(frames)


    @rule(number=CHANNELS, end=st.integers(0, 255).filter(lambda end: end != spec.FRAME_END))
    def bad_frame_end(self, number, end):
        frames = self.send(raw(spec.FRAME_METHOD, number, b"\x00\x14\x00\x0a\x00", end), [])
        self.framing_error(frames)


    def framing_error(self, frames) -> None:
        """rabbit_reader: connection.close 501, then the socket is dropped at once;
        a connection already closing just ends."""
        if self.silent():
            self.expect(frames)
        else:
            self.connection_error(frames, spec.FRAME_ERROR)
        self.model.connection = "closed"

    @rule(data=st.binary(min_size=1, max_size=64),
          cuts=st.lists(st.integers(0, 64), max_size=3))
    def garbage(self, data, cuts):
        """Arbitrary octets: only the invariants hold from here on."""
        self.model.chaos = True
        self.ready = None
        self.send(data, cuts)

    # ------------------------------------------------------------ rules: the connection

    @rule()
    def connection_close(self):
        frames = self.send(marshal(method(commands.Connection.Close, reply_code=200,
                                          reply_text="", class_id=0, method_id=0), 0), [])
        if self.model.connection == "closed":
            self.expect(frames)
        else:  # also while closing: spec 1.4.2.9, both sides sent close
            self.expect(frames, (0, "Connection.CloseOk"))
            self.requeue_all()
            self.model.connection = "closed"

    @rule()
    def connection_close_ok(self):
        frames = self.send(marshal(commands.Connection.CloseOk(), 0), [])
        self.expect(frames)
        self.requeue_all()
        self.model.connection = "closed"  # close-ok ends the connection in any state

    @rule(seconds=st.sampled_from([0.5, 6.0, 25.0]))
    def time_passes(self, seconds):
        """A closing connection gives up on close-ok after CLOSE_OK_TIMEOUT (5 s);
        with heartbeats of H seconds (spec 4.2.7, as rabbit_heartbeat) the server
        sends one after H/2 s without sending, and drops a client silent for over
        2H s, without a word."""
        model, now = self.model, self.client.now + seconds
        self.client.now = now
        self.client.session.tick(now)
        out = self.client.read_raw()
        check_output(out, self.output_state)
        if model.chaos:
            return
        beat = False
        if model.connection == CLOSING and now - model.closing_since >= 5.0:
            model.connection = "closed"
        elif model.connection != "closed" and model.heartbeat:
            if now - model.last_received > 2 * model.heartbeat:
                self.requeue_all()
                model.connection = "closed"
            elif now - model.last_sent >= model.heartbeat / 2:
                beat = True
                model.last_sent = now
        assert out == (HEARTBEAT if beat else b""), out[:64]

    @precondition(lambda self: self.model.connection == "closed")
    @rule(heartbeat=st.sampled_from([0, 10]))
    def reconnect(self, heartbeat):
        self.connect(heartbeat)

    # ------------------------------------------------------------ invariants

    @invariant()
    def model_agrees_with_the_core(self):
        if self.client is None:
            return
        if self.model.chaos:  # the model only learns whether the connection ended
            if self.client.session.closed:
                self.model.connection = "closed"
            return
        closed = self.client.session.closed
        assert closed == (self.model.connection == "closed"), (closed, self.model.connection)
        if not closed and self.model.connection == OPEN:
            machines = self.client.session.connection.channels
            assert {number: machine.state.value for number, machine in machines.items()} \
                == self.model.channels

    def teardown(self):
        if self.client is not None and not self.client.session.closed:
            self.client.session.connection_lost()
        assert_node_still_works(self.node)


ProtocolMachine.TestCase.settings = settings(
    max_examples=STATEFUL_EXAMPLES, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
TestProtocolMachine = ProtocolMachine.TestCase
