"""The connection and channel state machines (broker/amqp/connection.py, channel.py),
driven without a node: frames in (marshalled by pamqp), events and frames out.

Tables: every (channel state, frame) pair and every (content state, frame) pair with
the outcome AMQP 0-9-1 (spec 1.5.2 channel class, 4.2.6 content framing) and RabbitMQ
(rabbit_reader, rabbit_command_assembler) give it, written out here rather than read
from the code's own tables; the handshake (spec 1.4.2) state by state; heartbeats
(spec 4.2.7) and the close-ok timeout with time passed in. Every script also runs fed
one byte at a time, as h11's tests do, and must give the same events and output.
"""

from __future__ import annotations

import struct

import pytest
from pamqp import body as pamqp_body
from pamqp import commands
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header
from pamqp import heartbeat as pamqp_heartbeat

from quorumqueue.broker.amqp import codec, spec
from quorumqueue.broker.amqp.channel import ChannelState, ContentState
from quorumqueue.broker.amqp.connection import (SILENT_CLOSE_DELAY, Connection,
                                                ConnectionState)
from quorumqueue.broker.amqp.errors import AMQPError
from quorumqueue.broker.amqp.events import (ChannelClosed, ChannelCloseRequested,
                                            ChannelOpened, ConnectionClosed,
                                            ConnectionCloseRequested, ContentReceived,
                                            LoginRequested, MethodReceived, VhostRequested)

CAPABILITIES = {"authentication_failure_close": True, "connection.blocked": True}


def frame(value, channel: int = 0) -> bytes:
    return pamqp_frame.marshal(value, channel)


def raw(frame_type: int, channel: int, payload: bytes) -> bytes:
    return struct.pack(">BHI", frame_type, channel, len(payload)) + payload + b"\xce"


def publish(channel: int = 1, routing_key: str = "q") -> bytes:
    return frame(commands.Basic.Publish(exchange="", routing_key=routing_key), channel)


def header(channel: int = 1, size: int = 3) -> bytes:
    return frame(pamqp_header.ContentHeader(0, size, commands.Basic.Properties()), channel)


def body(channel: int = 1, data: bytes = b"abc") -> bytes:
    return frame(pamqp_body.ContentBody(data), channel)


START_OK = frame(commands.Connection.StartOk(
    client_properties={"capabilities": CAPABILITIES}, mechanism="PLAIN",
    response="\0guest\0guest", locale="en_US"))
TUNE_OK = frame(commands.Connection.TuneOk(channel_max=0, frame_max=131072, heartbeat=10))
OPEN = frame(commands.Connection.Open(virtual_host="/"))


class Driver:
    """Feeds bytes (whole or one at a time), answers the handshake's two questions
    and (unless `answer_closes` is False) a client's channel.close and connection.close
    at once, as the node does when nothing waits on a channel; records events and
    decoded output."""

    def __init__(self, bytewise: bool = False, channel_max: int = 2047,
                 answer_closes: bool = True) -> None:
        self.bytewise = bytewise
        self.answer_closes = answer_closes
        self.connection = Connection({"product": "test"}, frame_max=131072,
                                     channel_max=channel_max, heartbeat=60,
                                     max_message_size=1000, now=0.0)
        self.events: list = []

    def feed(self, data: bytes, now: float = 0.0) -> list:
        chunks = [data[i:i + 1] for i in range(len(data))] if self.bytewise else [data]
        events = []
        for chunk in chunks:
            self.connection.receive_data(chunk, now)
            events += self.drain()
        return events

    def drain(self) -> list:
        events = []
        while (event := self.connection.next_event()) is not None:
            events.append(event)
            if isinstance(event, LoginRequested):
                self.connection.accept_login()
            elif isinstance(event, VhostRequested):
                self.connection.accept_open()
            elif isinstance(event, ChannelCloseRequested) and self.answer_closes:
                self.connection.channel_closed(event.channel)
            elif isinstance(event, ConnectionCloseRequested) and self.answer_closes:
                self.connection.close_accepted()
        self.events += events
        return events

    def output(self) -> list[str]:
        """What was sent, as 'Class.Method' names (closes with code and text)."""
        data = self.connection.data_to_send()
        if data.startswith(b"AMQP"):
            data = data[8:]
        names, position = [], 0
        while position < len(data):
            consumed, channel, value = pamqp_frame.unmarshal(data[position:])
            position += consumed
            name = getattr(value, "name", type(value).__name__)
            if name in ("Connection.Close", "Channel.Close"):
                name += f" {value.reply_code} {value.reply_text} {value.class_id}/{value.method_id}"
            names.append(f"{channel}:{name}")
        return names

    def open(self, *channels: int) -> "Driver":
        self.feed(spec.PROTOCOL_HEADER + START_OK + TUNE_OK + OPEN)
        for number in channels:
            self.feed(frame(commands.Channel.Open(), number))
        self.output()
        self.events.clear()
        return self


bytewise = pytest.mark.parametrize("bytewise", [False, True], ids=["whole", "bytewise"])


# ---------------------------------------------------------------- handshake (spec 1.4.2)


@bytewise
def test_the_handshake_step_by_step(bytewise):
    """Each step answers with the next server method, or waits for the node's answer
    (login, vhost) before it reads on."""
    driver = Driver(bytewise)
    connection = driver.connection
    assert driver.feed(spec.PROTOCOL_HEADER) == []
    assert driver.output() == ["0:Connection.Start"]
    assert connection.state is ConnectionState.AWAITING_START_OK
    connection.receive_data(START_OK + TUNE_OK + OPEN, 0.0)
    login = connection.next_event()
    assert login == LoginRequested("PLAIN", b"\0guest\0guest")
    assert connection.state is ConnectionState.AUTHENTICATING
    with pytest.raises(RuntimeError):  # the node must answer first
        connection.next_event()
    connection.accept_login()
    assert driver.output() == ["0:Connection.Tune"]
    assert connection.next_event() == VhostRequested("/")
    assert (connection.frame_max, connection.channel_max, connection.heartbeat) == \
        (131072, 2047, 10)
    connection.accept_open()
    assert driver.output() == ["0:Connection.OpenOk"]
    assert connection.state is ConnectionState.OPEN
    assert connection.next_event() is None


HANDSHAKE_ERRORS = [
    # (fed after the protocol header, expected output, close reason)
    ("tune-ok before start-ok", TUNE_OK,
     ["0:Connection.Close 503 COMMAND_INVALID - expected 'connection.start_ok', got "
      "'connection.tune_ok' 10/31"]),
    ("a method on channel 1", frame(commands.Connection.StartOk(
        client_properties={}, mechanism="PLAIN", response="\0a\0b", locale="en_US"), 1),
     ["0:Connection.Close 503 COMMAND_INVALID - expected connection method on channel 0 "
      "during handshake, got channel 1 10/11"]),
    ("a content header", header(0),
     ["0:Connection.Close 505 UNEXPECTED_FRAME - type 2, all octets = "
      "<<0,60,0,0,0,0,0,0,0,0,0,3,0,0>> 0/0"]),
    ("an unoffered mechanism", frame(commands.Connection.StartOk(
        client_properties={}, mechanism="EXTERNAL", response="", locale="en_US")),
     ["0:Connection.Close 503 COMMAND_INVALID - unknown authentication mechanism "
      "'EXTERNAL' 10/11"]),
    ("connection.close", frame(commands.Connection.Close(200, "bye", 0, 0)),
     ["0:Connection.CloseOk"]),
]


@bytewise
@pytest.mark.parametrize("case", HANDSHAKE_ERRORS, ids=lambda case: case[0])
def test_handshake_errors_close_and_end_the_connection(case, bytewise):
    """RabbitMQ: during the handshake an error sends connection.close and drops the
    connection at once (no close-ok is awaited)."""
    _description, data, expected = case
    driver = Driver(bytewise)
    driver.feed(spec.PROTOCOL_HEADER)
    driver.output()
    events = driver.feed(data)
    assert driver.output() == expected
    assert isinstance(events[-1], ConnectionClosed)
    assert driver.connection.state is ConnectionState.CLOSED
    assert driver.feed(OPEN) == [] and driver.output() == []


# (what the client sent before it went silent, what rabbit_reader waited for); the
# step before open where the node owes the answer (login, vhost) is not the client's
STALLED_HANDSHAKES = [
    ("nothing", b"", "handshake"),
    ("part of the protocol header", b"AMQ", "handshake"),
    ("the protocol header", spec.PROTOCOL_HEADER, "frame_header"),
    ("part of start-ok", spec.PROTOCOL_HEADER + START_OK[:20], "frame_header"),
    ("start-ok (before tune-ok)", spec.PROTOCOL_HEADER + START_OK, "frame_header"),
    ("tune-ok (before open)", spec.PROTOCOL_HEADER + START_OK + TUNE_OK, "frame_header"),
]


@pytest.mark.parametrize("case", STALLED_HANDSHAKES, ids=lambda case: case[0])
def test_a_handshake_not_finished_within_handshake_timeout_ends_without_a_word(case):
    """rabbit_reader: a connection not open handshake_timeout (10 s) after its accept
    is dropped, nothing sent (RabbitMQ 3.10.8 resets it), and logged as
    {handshake_timeout,handshake} before the protocol header, else
    {handshake_timeout,frame_header}."""
    _description, data, waited_for = case
    driver = Driver()
    driver.feed(data, now=1.0)
    driver.output()
    driver.connection.tick(9.9)
    assert driver.drain() == [] and driver.connection.state is not ConnectionState.CLOSED
    driver.connection.tick(10.0)
    assert driver.drain() == [ConnectionClosed(f"{{handshake_timeout,{waited_for}}}")]
    assert driver.connection.handshake_timed_out == waited_for
    assert driver.output() == []


def test_handshake_timeout_ends_at_open_ok_and_may_be_infinity():
    """Once open, the connection is heartbeats' business; handshake_timeout =
    infinity (0 here) never ends a handshake."""
    driver = Driver().open()
    driver.feed(frame(pamqp_heartbeat.Heartbeat()), now=12.0)
    driver.connection.tick(12.0)
    assert driver.drain() == [] and driver.connection.state is ConnectionState.OPEN
    patient = Connection({"product": "test"}, frame_max=131072, channel_max=10,
                         heartbeat=60, max_message_size=1000, now=0.0, handshake_timeout=0)
    patient.tick(3600.0)
    assert patient.state is ConnectionState.AWAITING_HEADER


TUNED_ERRORS = [
    # (fed after tune-ok, then what RabbitMQ 3.10.8 answers; found by the hostile-input
    # fuzzer comparing the two, tests/faults/hostile.py)
    ("tune-ok again", TUNE_OK, ["0:Connection.Close 504 CHANNEL_ERROR - unexpected method "
                                "in connection state opening 10/31"]),
    ("channel.close-ok on channel 0", frame(commands.Channel.CloseOk()),
     ["0:Connection.Close 504 CHANNEL_ERROR - unexpected method in connection state "
      "opening 20/41"]),
    ("channel.open before connection.open", raw(1, 1, b"\x00\x14\x00\x0a\x00"),
     ["0:Connection.Close 505 UNEXPECTED_FRAME - type 1, all octets = <<0,20,0,10,0>> "
      "0/0"]),
]


@bytewise
@pytest.mark.parametrize("case", TUNED_ERRORS, ids=lambda case: case[0])
def test_errors_after_tune_ok_are_rabbitmq_s(case, bytewise):
    _description, data, expected = case
    driver = Driver(bytewise)
    driver.feed(spec.PROTOCOL_HEADER + START_OK + TUNE_OK)
    driver.output()
    events = driver.feed(data)
    assert driver.output() == expected
    assert isinstance(events[-1], ConnectionClosed)
    assert driver.connection.state is ConnectionState.CLOSED


@bytewise
@pytest.mark.parametrize("value", [commands.Connection.TuneOk(0, 131072, 0),
                                   commands.Connection.StartOk({}, "PLAIN", "\0a\0b", "en_US"),
                                   commands.Basic.Qos(0, 1, False)],
                         ids=lambda value: value.name)
def test_a_method_channel_0_has_no_use_for_once_open_is_504(value, bytewise):
    """rabbit_reader (RabbitMQ 3.10.8): 504 "unexpected method in connection state
    running", for connection methods of the handshake and other classes alike."""
    driver = Driver(bytewise).open()
    driver.feed(frame(value))
    class_id, method_id = value.index >> 16, value.index & 0xFFFF
    assert driver.output() == [f"0:Connection.Close 504 CHANNEL_ERROR - unexpected method "
                               f"in connection state running {class_id}/{method_id}"]
    assert driver.connection.state is ConnectionState.CLOSING


def test_refused_login_with_authentication_failure_close():
    connection = Driver().connection
    connection.receive_data(spec.PROTOCOL_HEADER + START_OK, 0.0)
    assert isinstance(connection.next_event(), LoginRequested)
    connection.data_to_send()
    connection.refuse_login()
    assert connection.next_event() == ConnectionClosed(
        "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. For "
        "details see the broker logfile.")
    assert connection.data_to_send().startswith(codec.connection_close(
        403, "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. "
        "For details see the broker logfile.", 10, 11)[:11])
    assert connection.state is ConnectionState.CLOSED
    assert connection.linger == SILENT_CLOSE_DELAY  # the shell closes the socket later


def test_only_refusals_before_tune_ok_linger():
    """RabbitMQ's SILENT_CLOSE_DELAY: an error before the connection is tuned keeps
    the socket open a while (password guessing is slow); later errors do not."""
    early = Driver().connection
    early.receive_data(spec.PROTOCOL_HEADER + frame(commands.Connection.StartOk(
        client_properties={}, mechanism="EXTERNAL", response="", locale="en_US")), 0.0)
    assert isinstance(early.next_event(), ConnectionClosed)
    assert early.linger == SILENT_CLOSE_DELAY
    late = Driver().connection
    late.receive_data(spec.PROTOCOL_HEADER + START_OK, 0.0)
    late.next_event()
    late.accept_login()
    late.receive_data(frame(commands.Connection.TuneOk(frame_max=131072))
                      + frame(commands.Connection.Open(virtual_host="/")), 0.0)
    assert isinstance(late.next_event(), VhostRequested)
    late.fail(AMQPError(spec.NOT_ALLOWED, "vhost / not found", 10, 40))
    assert late.state is ConnectionState.CLOSED and late.linger == 0


# ---------------------------------------------------------------- channels (spec 1.5.2)

# A channel's state before the frame, the frame, then what the server sends, the
# event the node gets, and the channel's state after (None: the number is free).
# Connection errors leave the connection CLOSING and every channel gone.
CHANNEL_TABLE = [
    (None, "channel.open", ["1:Channel.OpenOk"], [ChannelOpened(1)], ChannelState.OPEN),
    (None, "method", ["0:Connection.Close 504 CHANNEL_ERROR - expected 'channel.open' 50/10"],
     [], None),
    # (rabbit_reader gives any frame on a new number to a fresh command assembler,
    # which wants a method first: 505, where a method gets rabbit_channel's 504)
    (None, "content header", ["0:Connection.Close 505 UNEXPECTED_FRAME - expected method "
                              "frame, got non method frame instead 0/0"], [], None),
    (None, "channel.close", ["0:Connection.Close 504 CHANNEL_ERROR - expected "
                             "'channel.open' 20/40"], [], None),
    (ChannelState.OPEN, "channel.open", ["0:Connection.Close 504 CHANNEL_ERROR - second "
                                         "'channel.open' seen 20/10"],
     [ChannelClosed(1)], None),
    (ChannelState.OPEN, "method", [], ["method"], ChannelState.OPEN),
    (ChannelState.OPEN, "connection method", [
        "0:Connection.Close 503 COMMAND_INVALID - connection method 'connection.open' on "
        "channel 1 10/40"], [ChannelClosed(1)], None),
    (ChannelState.OPEN, "channel.close", ["1:Channel.CloseOk"], [ChannelCloseRequested(1)],
     None),
    (ChannelState.OPEN, "channel.close-ok", ["0:Connection.Close 504 CHANNEL_ERROR - "
                                             "unexpected channel.close-ok 20/41"],
     [ChannelClosed(1)], None),
    (ChannelState.OPEN, "content header", [
        "0:Connection.Close 505 UNEXPECTED_FRAME - expected method frame, got non method "
        "frame instead 0/0"], [ChannelClosed(1)], None),
    (ChannelState.CLOSING, "method", [], [], ChannelState.CLOSING),
    (ChannelState.CLOSING, "content header", [], [], ChannelState.CLOSING),
    # still closing until the client's close-ok: rabbit_channel's 504 for a second open
    (ChannelState.CLOSING, "channel.open", ["0:Connection.Close 504 CHANNEL_ERROR - second "
                                            "'channel.open' seen 20/10"], [], None),
    (ChannelState.CLOSING, "connection method", [], [], ChannelState.CLOSING),
    (ChannelState.CLOSING, "channel.close-ok", [], [], None),
    # both sides closed at once: the client's close is answered, and the channel waits
    # for the close-ok of the server's close (rabbit_channel's closing state)
    (ChannelState.CLOSING, "channel.close", ["1:Channel.CloseOk"], [], ChannelState.CLOSING),
]

FRAMES = {
    "channel.open": frame(commands.Channel.Open(), 1),
    "channel.close": frame(commands.Channel.Close(200, "bye", 0, 0), 1),
    "channel.close-ok": frame(commands.Channel.CloseOk(), 1),
    "method": frame(commands.Queue.Declare(queue="q"), 1),
    "connection method": frame(commands.Connection.Open(virtual_host="/"), 1),
    "content header": header(1),
}


def channel_in(state: ChannelState | None, bytewise: bool) -> Driver:
    driver = Driver(bytewise).open(*([1] if state is not None else []))
    if state is ChannelState.CLOSING:  # the server closed it with a channel error
        driver.connection.fail(codec.AMQPError(404, "gone"), 1)
        driver.drain()
        driver.output()
        driver.events.clear()
    return driver


@bytewise
@pytest.mark.parametrize("case", CHANNEL_TABLE, ids=lambda c: f"{c[0]}+{c[1]}")
def test_channel_lifecycle_table(case, bytewise):
    state, kind, output, events, after = case
    driver = channel_in(state, bytewise)
    got = driver.feed(FRAMES[kind])
    assert driver.output() == output
    if events == ["method"]:
        assert [type(e) for e in got] == [MethodReceived]
        assert (got[0].channel, got[0].class_id, got[0].method_id) == (1, 50, 10)
        assert got[0].method.queue == "q"
    else:
        assert got == events
    machine = driver.connection.channels.get(1)
    assert (machine.state if machine is not None else None) is after


# (content state, frame) -> output and the content state after (None: connection closed)
CONTENT_TABLE = [
    (ContentState.IDLE, "basic.publish", [], ContentState.AWAITING_HEADER),
    (ContentState.IDLE, "content body", [
        "0:Connection.Close 505 UNEXPECTED_FRAME - expected method frame, got non method "
        "frame instead 0/0"], None),
    (ContentState.AWAITING_HEADER, "content header", [], ContentState.AWAITING_BODY),
    (ContentState.AWAITING_HEADER, "method", [
        "0:Connection.Close 505 UNEXPECTED_FRAME - expected content header for class 60, "
        "got non content header frame instead 60/40"], None),
    (ContentState.AWAITING_HEADER, "content body", [
        "0:Connection.Close 505 UNEXPECTED_FRAME - expected content header for class 60, "
        "got non content header frame instead 60/40"], None),
    (ContentState.AWAITING_BODY, "channel.close", [
        "0:Connection.Close 505 UNEXPECTED_FRAME - expected content body, got non content "
        "body frame instead 60/40"], None),
    (ContentState.AWAITING_BODY, "content header", [
        "0:Connection.Close 505 UNEXPECTED_FRAME - expected content body, got non content "
        "body frame instead 60/40"], None),
    (ContentState.AWAITING_BODY, "content body", [], ContentState.AWAITING_BODY),
]

CONTENT_FRAMES = {**FRAMES, "basic.publish": publish(), "content header": header(size=9),
                  "content body": body()}
BEFORE = {ContentState.IDLE: b"", ContentState.AWAITING_HEADER: publish(),
          ContentState.AWAITING_BODY: publish() + header(size=9)}


@bytewise
@pytest.mark.parametrize("case", CONTENT_TABLE, ids=lambda c: f"{c[0]}+{c[1]}")
def test_content_table(case, bytewise):
    state, kind, output, after = case
    driver = Driver(bytewise).open(1)
    driver.feed(BEFORE[state])
    assert driver.connection.channels[1].content is state
    assert driver.feed(CONTENT_FRAMES[kind]) in ([], [ChannelClosed(1)])
    assert driver.output() == output
    machine = driver.connection.channels.get(1)
    assert (machine.content if machine is not None else None) is after


@bytewise
def test_a_message_is_one_event_after_its_last_body_frame(bytewise):
    """spec 4.2.6: basic.publish, a content header, body frames adding up to its size."""
    driver = Driver(bytewise).open(1)
    assert driver.feed(publish() + header(size=7) + body(data=b"abc")) == []
    [event] = driver.feed(body(data=b"defg"))
    assert isinstance(event, ContentReceived)
    assert (event.channel, event.method.routing_key, event.properties.body_size,
            event.body) == (1, "q", 7, b"abcdefg")
    [empty] = driver.feed(publish(routing_key="e") + header(size=0))
    assert (empty.method.routing_key, empty.body) == ("e", b"")


def test_content_over_max_message_size_closes_the_channel():
    """RabbitMQ: a body size above max_message_size is 406 on basic.publish, a channel
    error; the content is dropped unread."""
    driver = Driver().open(1)
    events = driver.feed(publish() + header(size=1001))
    assert events == [ChannelClosed(1)]
    assert driver.output() == ["1:Channel.Close 406 PRECONDITION_FAILED - message size "
                               "1001 is larger than configured max size 1000 60/40"]
    assert driver.feed(body(data=b"x" * 1001)) == [] and driver.output() == []


def test_next_content_takes_only_whole_clean_messages_of_the_same_channel():
    """A run of publishes: `next_content(channel)` returns the next message on that
    channel when it is whole in what was received and reads without error; anything
    else (another channel, a method, a partial message, a message that fails) is left
    unread, for `next_event` to read in order, its error included."""
    driver = Driver().open(1, 2)
    connection = driver.connection
    message = publish() + header() + body()
    connection.receive_data(message + message + publish(2) + header(2) + body(2)
                            + message + publish(routing_key="big") + header(size=1001)
                            + message[:-3], 0.0)
    first = connection.next_event()
    assert isinstance(first, ContentReceived) and first.body == b"abc"
    assert connection.next_content(1) == ContentReceived(1, first.method, first.properties,
                                                         b"abc")
    assert connection.next_content(1) is None                 # channel 2's message is next
    assert connection.next_event().channel == 2
    assert isinstance(connection.next_content(1), ContentReceived)
    assert connection.next_content(1) is None                 # over max_message_size
    assert driver.output() == []                              # read nothing, sent nothing
    assert connection.next_event() == ChannelClosed(1)        # the error, in its order
    assert driver.output() == ["1:Channel.Close 406 PRECONDITION_FAILED - message size "
                               "1001 is larger than configured max size 1000 60/40"]
    assert connection.next_content(1) is None                 # the channel is closing
    assert connection.next_event() is None                    # a partial frame: more to come


def test_next_content_leaves_a_partial_message_for_later():
    driver = Driver().open(1)
    connection = driver.connection
    message = publish() + header() + body()
    connection.receive_data(message + message[:-1], 0.0)
    assert isinstance(connection.next_event(), ContentReceived)
    assert connection.next_content(1) is None
    connection.receive_data(message[-1:], 0.0)
    assert isinstance(connection.next_content(1), ContentReceived)
    assert connection.channels[1].content is ContentState.IDLE


# ---------------------------------------------------------------- channel_max


def test_channel_max_counts_open_channels_not_numbers():
    """rabbit_reader: channel numbers are free; the channel_max+1-th open channel is
    530 with no method ids. A channel the server is closing no longer counts."""
    driver = Driver(channel_max=2).open(65535, 3)
    driver.connection.fail(codec.AMQPError(404, "gone"), 3)
    driver.drain()
    driver.feed(frame(commands.Channel.Open(), 4))
    assert driver.output() == ["3:Channel.Close 404 NOT_FOUND - gone 0/0", "4:Channel.OpenOk"]
    driver.feed(frame(commands.Channel.Open(), 5))
    assert driver.output() == ["0:Connection.Close 530 NOT_ALLOWED - number of channels "
                               "opened (2) has reached the negotiated channel_max (2) 0/0"]


def test_a_users_channels_on_all_its_connections_count_against_max_channels():
    """User limits (max-channels): the quota the user's connections share counts their
    OPEN channels; past it, channel.open is 530 with no method ids (rabbit_reader's
    is_over_limits), and closed channels, refused ones and ended connections give
    their channels back."""
    from quorumqueue.broker.amqp.connection import ChannelQuota

    quota = ChannelQuota("bob", limit=3)
    first, second = Driver().open(), Driver().open()
    first.connection.quota = second.connection.quota = quota
    first.feed(frame(commands.Channel.Open(), 1) + frame(commands.Channel.Open(), 2))
    second.feed(frame(commands.Channel.Open(), 1))
    assert quota.open == 3 and second.output() == ["1:Channel.OpenOk"]
    first.feed(frame(commands.Channel.Close(200, "", 0, 0), 2))
    second.feed(frame(commands.Channel.Open(), 2))
    assert second.output() == ["2:Channel.OpenOk"] and quota.open == 3
    second.connection.fail(codec.AMQPError(404, "gone"), 2)  # a closing channel is gone
    assert quota.open == 2
    first.output()
    first.feed(frame(commands.Channel.Open(), 3))
    first.feed(frame(commands.Channel.Open(), 4))
    assert first.output() == ["3:Channel.OpenOk", "0:Connection.Close 530 NOT_ALLOWED - "
                              "number of channels opened for user 'bob' has reached the "
                              "maximum allowed user limit of (3) 0/0"]
    assert quota.open == 1  # the closed connection's channels are given back
    quota.limit = -1  # no limit
    second.feed(frame(commands.Channel.Open(), 5) + frame(commands.Channel.Open(), 6))
    assert quota.open == 3


def test_content_over_the_hard_max_message_size_says_max_size():
    """rabbit_channel:check_msg_size: 'configured' only below the 512 MiB hard limit."""
    from quorumqueue.broker.amqp.channel import MAX_MESSAGE_SIZE

    driver = Driver().open(1)
    driver.connection.max_message_size = MAX_MESSAGE_SIZE
    driver.feed(publish() + header(size=MAX_MESSAGE_SIZE + 1))
    assert driver.output() == [f"1:Channel.Close 406 PRECONDITION_FAILED - message size "
                               f"{MAX_MESSAGE_SIZE + 1} is larger than max size "
                               f"{MAX_MESSAGE_SIZE} 60/40"]


# ---------------------------------------------------------------- closing (spec 1.4.2.9)


def test_after_connection_close_only_close_and_close_ok_count():
    driver = Driver().open(1)
    driver.connection.fail(codec.AMQPError(541, "broken"), 1)
    assert driver.drain() == [ChannelClosed(1)]
    assert driver.output() == ["0:Connection.Close 541 INTERNAL_ERROR - broken 0/0"]
    assert driver.feed(FRAMES["method"] + raw(9, 1, b"") + header(1)) == []
    assert driver.output() == []
    assert driver.feed(frame(commands.Connection.Close(200, "", 0, 0))) == [
        ConnectionClosed("INTERNAL_ERROR - broken")]
    assert driver.output() == ["0:Connection.CloseOk"]


def test_framing_error_sends_close_and_ends_the_connection():
    driver = Driver().open(1)
    events = driver.feed(FRAMES["method"][:-1] + b"\x00")
    assert events == [ChannelClosed(1), ConnectionClosed(
        "FRAME_ERROR - type 1, all octets = <<0,50,0,10,0,0,1,113,0,0,0,0,0>>: "
        "{invalid_frame_end_marker,\n" + " " * 57 + "0}")]  # rabbit_reader's ~p layout
    assert driver.connection.state is ConnectionState.CLOSED


def test_a_deeply_nested_field_table_is_a_frame_error():
    """RabbitMQ decodes any depth; pamqp would overflow Python's stack, so a table
    nested deeper than MAX_TABLE_DEPTH is 501 naming the method, never a traceback."""
    table = struct.pack(">I", 0)
    for _ in range(5000):
        table = struct.pack(">I", len(table) + 3) + b"\x01aF" + table
    driver = Driver().open(1)
    driver.feed(raw(1, 1, struct.pack(">HHH", 50, 10, 0) + b"\x01q\x00" + table))
    assert driver.output() == ["0:Connection.Close 501 FRAME_ERROR - cannot decode "
                               "queue.declare arguments: field table nested deeper than "
                               "100 levels 50/10"]


# ---------------------------------------------------------------- time (spec 4.2.7)


def test_heartbeats_and_the_close_ok_timeout_follow_the_time_given():
    driver = Driver().open()  # heartbeat 10 from TUNE_OK
    connection = driver.connection
    connection.tick(4.9)
    assert driver.output() == []
    connection.tick(5.0)
    assert driver.output() == ["0:Heartbeat"]
    connection.sent(5.0)
    driver.feed(frame(pamqp_heartbeat.Heartbeat()), now=15.0)
    connection.tick(35.0)
    assert connection.state is ConnectionState.OPEN
    connection.tick(35.1)
    assert driver.drain() == [ConnectionClosed("missed heartbeats from client, timeout: 10s")]

    driver = Driver().open()
    driver.connection.fail(codec.AMQPError(541, "broken"))
    driver.connection.tick(4.9)
    assert driver.connection.state is ConnectionState.CLOSING
    driver.connection.tick(5.0)
    assert driver.drain() == [ConnectionClosed("INTERNAL_ERROR - broken")]


def test_a_blocked_connection_is_not_timed_out():
    driver = Driver().open()
    driver.connection.block("low on memory")
    assert driver.output() == ["0:Connection.Blocked"]
    driver.connection.tick(100.0)
    assert driver.connection.state is ConnectionState.OPEN
    assert driver.output() == ["0:Heartbeat"]
    driver.connection.unblock()
    assert driver.output() == ["0:Connection.Unblocked"]


def described(event) -> tuple:
    if isinstance(event, MethodReceived) and hasattr(event.method, "name"):
        # pamqp methods compare by identity: compare their fields
        return (type(event).__name__, event.channel, event.method.name, dict(event.method))
    return (type(event).__name__, repr(event))


@pytest.mark.parametrize("seed", range(3))
def test_any_chunking_gives_the_same_events_and_output(seed):
    """The same script in random chunks, whole and byte by byte: same events, same bytes."""
    import random

    script = (frame(commands.Channel.Open(), 1) + frame(commands.Channel.Open(), 2)
              + publish(1) + header(1, 5) + FRAMES["method"].replace(b"\x00\x01", b"\x00\x02", 1)
              + body(1, b"ab") + body(1, b"cde") + frame(commands.Basic.Ack(3), 2)
              + FRAMES["channel.close"] + FRAMES["channel.open"])
    outcomes = []
    for chunking in ("whole", "bytewise", "random"):
        driver = Driver(chunking == "bytewise").open()
        if chunking == "random":
            rng = random.Random(seed)
            position = 0
            while position < len(script):
                size = rng.randint(1, 40)
                driver.feed(script[position:position + size])
                position += size
        else:
            driver.feed(script)
        outcomes.append(([described(e) for e in driver.events], driver.output()))
    assert outcomes[0] == outcomes[1] == outcomes[2]
    assert [type(e).__name__ for e in driver.events] == [
        "ChannelOpened", "ChannelOpened", "MethodReceived", "ContentReceived",
        "MethodReceived", "ChannelCloseRequested", "ChannelOpened"]


def test_a_client_close_is_answered_when_the_node_says_and_discards_what_follows():
    """The client's channel.close: the node answers it (`channel_closed`) once the
    channel's earlier methods are done; meanwhile frames on the channel are discarded
    and the number stays taken; a connection ending meanwhile releases the channel."""
    driver = Driver(answer_closes=False).open(1)
    assert driver.feed(FRAMES["channel.close"]) == [ChannelCloseRequested(1)]
    assert driver.feed(FRAMES["method"] + publish() + header() + body()
                       + FRAMES["channel.open"]) == []
    assert driver.output() == []
    assert driver.connection.channels[1].state is ChannelState.CLOSE_REQUESTED
    driver.connection.channel_closed(1)
    assert driver.output() == ["1:Channel.CloseOk"] and 1 not in driver.connection.channels
    driver.connection.channel_closed(1)  # once only
    assert driver.output() == []

    failing = Driver(answer_closes=False).open(1)
    failing.feed(FRAMES["channel.close"])
    failing.connection.fail(codec.AMQPError(404, "no queue 'q'", 50, 20), 1)
    assert failing.drain() == [ChannelClosed(1)]
    assert failing.output() == ["1:Channel.Close 404 NOT_FOUND - no queue 'q' 50/20",
                                "1:Channel.CloseOk"]
    failing.feed(FRAMES["channel.close-ok"])
    assert 1 not in failing.connection.channels

    ending = Driver(answer_closes=False).open(1)
    ending.feed(FRAMES["channel.close"])
    ending.connection.fail(codec.AMQPError(320, "bye",
                                           connection_level=True))
    assert ending.drain() == [ChannelClosed(1)]
    assert ending.output() == ["0:Connection.Close 320 CONNECTION_FORCED - bye 0/0"]
    ending.connection.channel_closed(1)
    assert ending.output() == []


def test_a_client_connection_close_is_answered_when_the_node_says():
    """The client's connection.close: close-ok once the node has let its channels
    finish (`close_accepted`); what the client sends meanwhile is discarded; then
    every channel gets ChannelClosed and ConnectionClosed comes last."""
    driver = Driver(answer_closes=False).open(1)
    close = frame(commands.Connection.Close(200, "bye", 0, 0))
    assert driver.feed(close) == [ConnectionCloseRequested()]
    assert driver.feed(FRAMES["method"] + publish() + header() + body() + close) == []
    assert driver.output() == []
    driver.connection.fail(codec.AMQPError(404, "no queue 'q'", 50, 20), 1)  # ignored
    assert driver.output() == [] and driver.drain() == []
    driver.connection.close_accepted()
    assert driver.output() == ["0:Connection.CloseOk"]
    assert driver.drain() == [ChannelClosed(1), ConnectionClosed("client closed the connection")]
    assert driver.connection.state is ConnectionState.CLOSED


def test_chunks_to_send_are_the_bytes_data_to_send_joins_and_keep_no_mutable_view():
    """The shell hands chunks_to_send to the transport as they are (writelines) and
    the socket may take them later: views of bytes (a delivery's body) stay views,
    not copies; anything else is copied, so a buffer changed after the call does not
    change what goes out. Joined, they are what data_to_send returns."""
    connection = Connection({"product": "test"}, frame_max=131072, channel_max=10,
                            heartbeat=0, max_message_size=1000, now=0.0)
    connection.urgent.clear()      # connection.start, not what this is about
    body = bytes(range(256)) * 4
    scratch = bytearray(b"scratch")
    view = memoryview(body)[10:500]
    connection.outbound += [b"head", view, memoryview(scratch)[1:4], scratch]
    chunks = connection.chunks_to_send()
    assert chunks[1] is view
    scratch[:] = b"changed"
    assert b"".join(chunks) == b"head" + body[10:500] + b"cra" + b"scratch"
    assert connection.chunks_to_send() == [] and connection.data_to_send() == b""
    connection.outbound += [b"a", memoryview(b"bc")]
    assert connection.data_to_send() == b"abc"


# ---------------------------------------------------------------- handover (workers)


@bytewise
def test_a_message_begun_in_an_earlier_read_is_read_again_whole_from_the_mark(bytewise):
    """A connection handed to another worker (node/handover.py) gives it the bytes of
    the event it stopped at: the mark, set before that event's first frame, keeps
    them across reads, however the client's bytes were split; every channel is
    between messages again."""
    driver = Driver(bytewise).open(1, 2)
    connection = driver.connection
    message = publish(routing_key="q1") + header(size=4) + body(data=b"abcd")
    rest = frame(commands.Basic.Qos(prefetch_count=5), 1)
    connection.mark()
    events = driver.feed(publish(2) + message + rest)
    # channel 1's message and method (channel 2's publish has no content yet)
    assert [(type(event), event.channel) for event in events] == [(ContentReceived, 1),
                                                                  (MethodReceived, 1)]
    assert connection.rewind_to_mark()
    assert connection.unread() == publish(2) + message + rest
    assert all(machine.content is ContentState.IDLE for machine in connection.channels.values())
    assert not connection.rewind_to_mark()  # a mark is used once


def test_no_mark_inside_a_message_or_with_events_queued():
    driver = Driver().open(1)
    connection = driver.connection
    driver.feed(publish() + header(size=3))
    connection.mark()
    assert not connection.rewind_to_mark()  # channel 1 is inside a message
    driver.feed(body())
    connection.mark()
    assert connection.rewind_to_mark()


def test_a_connection_resumed_open_reads_on_where_its_first_worker_stopped():
    """The adopting worker's connection: open, its channels open, the tune values the
    first worker agreed, and the unread bytes read first."""
    from quorumqueue.broker.amqp.connection import ChannelQuota

    quota = ChannelQuota("guest")
    connection = Connection({"product": "test"}, frame_max=131072, channel_max=2047,
                            heartbeat=60, max_message_size=1000, now=0.0)
    connection.resume_open(frame_max=8192, channel_max=16, heartbeat=10,
                           client_properties={"product": "pika"}, capabilities={},
                           mechanism="PLAIN", channels=[1, 3], quota=quota,
                           unread=publish(3) + header(3) + body(3))
    assert (connection.state, connection.frame_max, connection.reader.frame_max,
            connection.channel_max, connection.heartbeat) == (ConnectionState.OPEN, 8192,
                                                              8192, 16, 10)
    assert quota.open == 2 and sorted(connection.channels) == [1, 3]
    event = connection.next_event()
    assert isinstance(event, ContentReceived) and (event.channel, event.body) == (3, b"abc")
    connection.handed_over()
    assert quota.open == 0 and connection.state is ConnectionState.CLOSED
    assert connection.next_event() is None
