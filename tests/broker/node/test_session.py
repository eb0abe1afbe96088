"""The connection state machine, driven purely through `Session` by the harness.

Handshake (AMQP 0-9-1 spec 4.2.2 protocol header, 1.4.2 connection class, RabbitMQ's
authentication and loopback rules), heartbeats (spec 4.2.7), channel lifecycles and
their errors (spec 4.2.3, 1.5.2, section 1.9 hard vs soft errors) and RabbitMQ's
connection.blocked extension. Frames go in as pamqp marshals them, come out as
pamqp decodes them, and every scenario also runs with input fed one byte at a time.
"""

from __future__ import annotations

import pytest
from pamqp import commands

from quorumqueue.broker.amqp import spec
from quorumqueue.broker.amqp.connection import ConnectionState
from quorumqueue.broker.config import Settings
from tests.broker.node.harness import (Client, content_frames, marshal, method, name,
                                       new_node, raw_frame)

byte_modes = pytest.mark.parametrize("byte_at_a_time", [False, True],
                                     ids=["whole", "bytewise"])


def opened(node=None, byte_at_a_time: bool = False, **handshake) -> Client:
    client = Client(node or new_node(), byte_at_a_time=byte_at_a_time)
    client.handshake(**handshake)
    client.open_channel(1)
    return client


def close_of(frame) -> tuple:
    return (frame.reply_code, frame.reply_text, frame.class_id, frame.method_id)


# ---------------------------------------------------------------- handshake


@byte_modes
def test_handshake_then_publish_and_get(byte_at_a_time):
    """spec 2.2.4: header, start/start-ok, tune/tune-ok, open/open-ok; then a message
    published on one channel comes back by basic.get."""
    client = Client(new_node(), byte_at_a_time=byte_at_a_time)
    client.handshake()
    assert client.start.version_major == 0 and client.start.version_minor == 9
    assert client.start.mechanisms.split() == ["PLAIN", "AMQPLAIN"]
    capabilities = client.start.server_properties["capabilities"]
    assert capabilities["publisher_confirms"] and capabilities["connection.blocked"]
    assert (client.tune.channel_max, client.tune.frame_max, client.tune.heartbeat) == \
        (2047, 131072, 60)
    client.open_channel(1)
    client.declare_queue(1, "q")
    client.publish(1, "", "q", b"x" * 300_000)  # several body frames at frame_max
    delivery = client.get(1, "q")
    assert delivery.body == b"x" * 300_000
    assert client.get(1, "q") is None


@pytest.mark.parametrize("header", [b"AMQP\x00\x00\x09\x00", b"AMQP\x01\x01\x00\x09",
                                    b"AMQP\x00\x00\x08\x00", b"GET / HTTP/1.1\r\n"])
def test_wrong_protocol_header_is_answered_with_ours_then_closed(header):
    """spec 4.2.2: a server that does not support the requested protocol writes a valid
    protocol header and closes the socket."""
    client = Client(new_node())
    client.send_bytes(header)
    assert client.session.data_to_send() == b"AMQP\x00\x00\x09\x01"
    assert client.session.closed


def test_bad_password_with_authentication_failure_close_gets_403():
    """RabbitMQ: a client advertising authentication_failure_close gets connection.close
    403 ACCESS_REFUSED (on connection.start-ok) before the socket closes."""
    client = Client(new_node())
    client.send_bytes(spec.PROTOCOL_HEADER)
    client.expect_one("Connection.Start")
    client.start_ok(password="wrong")
    close = client.expect_one("Connection.Close")
    assert close_of(close) == (403, "ACCESS_REFUSED - Login was refused using "
                               "authentication mechanism PLAIN. For details see the broker "
                               "logfile.", 10, 11)
    assert client.session.closed


def test_bad_password_without_the_capability_is_a_silent_close():
    """RabbitMQ (pre authentication_failure_close clients): the socket just closes."""
    client = Client(new_node())
    client.send_bytes(spec.PROTOCOL_HEADER)
    client.expect_one("Connection.Start")
    client.start_ok(password="wrong", capabilities={})
    assert client.read() == []
    assert client.session.closed


@pytest.mark.parametrize("peer", ["10.0.0.5", "192.168.1.20", "::ffff:10.0.0.5"])
def test_guest_is_refused_from_a_non_loopback_peer(peer):
    """RabbitMQ loopback_users: guest may only connect from localhost."""
    client = Client(new_node(), peer_host=peer)
    client.send_bytes(spec.PROTOCOL_HEADER)
    client.expect_one("Connection.Start")
    client.start_ok()
    assert client.expect_one("Connection.Close").reply_code == 403
    assert client.session.closed


@pytest.mark.parametrize("peer", ["127.0.0.1", "::1", "127.0.0.2"])
def test_guest_is_accepted_from_loopback(peer):
    """RabbitMQ loopback_users: any loopback address counts, IPv4 or IPv6."""
    client = Client(new_node(), peer_host=peer)
    client.handshake()
    assert client.session.state is ConnectionState.OPEN


def test_other_users_may_connect_from_anywhere():
    """RabbitMQ: only loopback_users are tied to localhost."""
    node = new_node()
    node.users.add("alice", "secret")
    client = Client(node, peer_host="10.0.0.5")
    client.handshake(username="alice", password="secret")
    assert client.session.user.name == "alice"


@byte_modes
def test_amqplain_login(byte_at_a_time):
    """RabbitMQ's AMQPLAIN: the response is a field table (without its length prefix)
    holding LOGIN and PASSWORD."""
    client = Client(new_node(), byte_at_a_time=byte_at_a_time)
    client.handshake(mechanism="AMQPLAIN")
    assert client.session.user.name == "guest"


def test_amqplain_with_a_wrong_password_is_refused():
    """RabbitMQ: a failed AMQPLAIN login is 403 naming the mechanism."""
    client = Client(new_node())
    client.send_bytes(spec.PROTOCOL_HEADER)
    client.expect_one("Connection.Start")
    client.start_ok(password="nope", mechanism="AMQPLAIN")
    close = client.expect_one("Connection.Close")
    assert close.reply_code == 403 and "AMQPLAIN" in close.reply_text


def test_unknown_sasl_mechanism_is_command_invalid():
    """RabbitMQ (rabbit_reader:auth_mechanism_to_module): a mechanism the server did
    not offer is 503 COMMAND_INVALID, not a failed login."""
    client = Client(new_node())
    client.send_bytes(spec.PROTOCOL_HEADER)
    client.expect_one("Connection.Start")
    client.start_ok(mechanism="EXTERNAL")
    close = client.expect_one("Connection.Close")
    assert close.reply_code == 503
    assert close.reply_text.startswith("COMMAND_INVALID - ")
    assert "EXTERNAL" in close.reply_text
    assert client.session.closed


@pytest.mark.parametrize("frame_max", [4096, 8191])
def test_tune_ok_frame_max_below_8192_is_not_allowed(frame_max):
    """RabbitMQ 3.13+ refuses tune-ok frame_max below 8192 with 530 NOT_ALLOWED."""
    client = Client(new_node())
    client.send_bytes(spec.PROTOCOL_HEADER)
    client.expect_one("Connection.Start")
    client.start_ok()
    client.expect_one("Connection.Tune")
    client.send(0, commands.Connection.TuneOk(channel_max=0, frame_max=frame_max))
    close = client.expect_one("Connection.Close")
    assert close_of(close) == (530, f"NOT_ALLOWED - frame_max={frame_max} < 8192 min size",
                               10, 31)
    assert client.session.closed


def test_tune_ok_frame_max_zero_means_the_server_maximum():
    """spec 1.4.2.6.2: zero means no limit beyond the server's."""
    client = Client(new_node())
    client.handshake(frame_max=0)
    assert client.session.frame_max == 131072


def test_tune_ok_frame_max_above_the_server_maximum_is_not_allowed():
    """spec 1.4.2.6.2: the client may lower frame-max, not raise it (RabbitMQ: 530)."""
    client = Client(new_node())
    client.send_bytes(spec.PROTOCOL_HEADER)
    client.expect_one("Connection.Start")
    client.start_ok()
    client.expect_one("Connection.Tune")
    client.send(0, commands.Connection.TuneOk(frame_max=131073))
    assert client.expect_one("Connection.Close").reply_code == 530


def test_unknown_vhost_is_not_allowed():
    """RabbitMQ: connection.open to a vhost that does not exist is 530 NOT_ALLOWED."""
    client = Client(new_node())
    client.send_bytes(spec.PROTOCOL_HEADER)
    client.expect_one("Connection.Start")
    client.start_ok()
    client.expect_one("Connection.Tune")
    client.send(0, commands.Connection.TuneOk(frame_max=131072),
                commands.Connection.Open(virtual_host="nowhere"))
    close = client.expect_one("Connection.Close")
    assert close_of(close) == (530, "NOT_ALLOWED - vhost nowhere not found", 10, 40)
    assert client.session.closed


def test_vhost_the_user_has_no_access_to_is_not_allowed():
    """RabbitMQ: connection.open to a vhost without permissions is 530 NOT_ALLOWED."""
    node = new_node()
    node.vhosts["other"] = type(node.vhosts["/"])("other")
    client = Client(node)
    client.send_bytes(spec.PROTOCOL_HEADER)
    client.expect_one("Connection.Start")
    client.start_ok()
    client.expect_one("Connection.Tune")
    client.send(0, commands.Connection.TuneOk(frame_max=131072),
                commands.Connection.Open(virtual_host="other"))
    close = client.expect_one("Connection.Close")
    assert close.reply_code == 530 and "other" in close.reply_text


def test_a_method_out_of_handshake_order_is_command_invalid():
    """spec 2.2.4: the handshake is a fixed sequence; anything else is a hard error."""
    client = Client(new_node())
    client.send_bytes(spec.PROTOCOL_HEADER)
    client.expect_one("Connection.Start")
    client.send(0, commands.Connection.Open(virtual_host="/"))
    close = client.expect_one("Connection.Close")
    assert close.reply_code == 503 and (close.class_id, close.method_id) == (10, 40)


def test_client_close_is_answered_with_close_ok():
    """spec 1.4.2.9: connection.close from the client is answered with close-ok."""
    client = opened()
    client.send(0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0,
                                          method_id=0))
    client.expect_one("Connection.CloseOk")
    assert client.session.closed


# ---------------------------------------------------------------- heartbeats (4.2.7)


def test_idle_server_sends_heartbeats_at_half_the_interval():
    """RabbitMQ sends a heartbeat when nothing was sent for half the negotiated
    timeout; the harness plays the shell and reports sends with `sent(now)`."""
    client = Client(new_node())
    client.handshake(heartbeat=10)
    for now in (1.0, 4.9):
        client.now = now
        client.heartbeat()
        client.session.tick(now)
        assert client.read() == []
    client.now = 5.0
    client.session.tick(5.0)
    assert client.read_names() == ["Heartbeat"]
    client.session.tick(6.0)  # just sent: not again until another half interval
    assert client.read() == []
    client.now = 10.0
    client.heartbeat()
    client.session.tick(10.0)
    assert client.read_names() == ["Heartbeat"]
    assert not client.session.closed


def test_missing_client_heartbeats_for_two_intervals_close_the_session():
    """spec 4.2.7: a peer that receives nothing for two heartbeat intervals considers
    the connection dead (RabbitMQ closes the socket without a close method)."""
    client = Client(new_node())
    client.handshake(heartbeat=10)
    client.session.tick(20.0)
    assert not client.session.closed
    client.now = 15.0
    client.heartbeat()  # any input counts as a sign of life
    client.session.tick(35.0)
    assert not client.session.closed
    client.session.tick(35.1)
    assert client.session.closed
    assert "missed heartbeats" in client.session.close_reason
    assert all(name(value) == "Heartbeat" for _c, value in client.read())


def test_heartbeat_zero_disables_heartbeats():
    """spec 1.4.2.6.3: heartbeat 0 means no heartbeats in either direction."""
    client = Client(new_node())
    client.handshake(heartbeat=0)
    client.session.tick(10_000.0)
    assert client.read() == [] and not client.session.closed


def test_heartbeat_on_a_non_zero_channel_is_unexpected_frame():
    """spec 4.2.7 heartbeats belong to channel 0; RabbitMQ (rabbit_reader handle_frame)
    answers one on another channel with 505 UNEXPECTED_FRAME."""
    client = opened()
    client.send_bytes(raw_frame(spec.FRAME_HEARTBEAT, 1, b""))
    assert client.expect_one("Connection.Close").reply_code == 505


# ---------------------------------------------------------------- connection-level errors


def expect_connection_close(client: Client, code: int, class_method=None,
                            state: ConnectionState = ConnectionState.CLOSING) -> object:
    close = client.expect_one("Connection.Close", channel=0)
    assert close.reply_code == code, close.reply_text
    assert close.reply_text.startswith(spec.REPLY_NAMES[code] + " - ")
    if class_method is not None:
        assert (close.class_id, close.method_id) == class_method
    assert client.session.state is state
    return close


def finish_close(client: Client) -> None:
    """spec 1.4.2.9: after connection.close the peer discards everything but close and
    close-ok; close-ok ends the connection."""
    client.send(1, commands.Channel.Open())
    client.send(0, commands.Connection.Open(virtual_host="/"))
    assert client.read() == []
    client.send(0, commands.Connection.CloseOk())
    assert client.session.closed
    assert client.read() == []


@byte_modes
def test_method_on_an_unopened_channel_is_channel_error(byte_at_a_time):
    """RabbitMQ: a method other than channel.open on a channel that is not open is a
    504 CHANNEL_ERROR connection error naming the method."""
    client = opened(byte_at_a_time=byte_at_a_time)
    client.send(7, commands.Queue.Declare(queue="q"))
    close = expect_connection_close(client, 504, (50, 10))
    assert close.reply_text == "CHANNEL_ERROR - expected 'channel.open'"
    finish_close(client)


def test_content_on_an_unopened_channel_is_unexpected_frame():
    """RabbitMQ 3.10.8: a content frame on a channel that is not open is 505
    UNEXPECTED_FRAME (a new number's first frame must be a method; a method other
    than channel.open there is 504, as the test above shows)."""
    client = opened()
    client.send_bytes(content_frames(9, b"abc"))
    close = expect_connection_close(client, 505)
    assert close.reply_text == ("UNEXPECTED_FRAME - expected method frame, got non method "
                                "frame instead")


def test_second_channel_open_is_channel_error():
    """RabbitMQ: channel.open on an open channel is 504 CHANNEL_ERROR."""
    client = opened()
    client.send(1, commands.Channel.Open())
    expect_connection_close(client, 504, (20, 10))
    finish_close(client)


def test_channel_numbers_above_channel_max_open():
    """RabbitMQ (rabbit_reader, 3.10 as 4.x) bounds how many channels are open, not
    their numbers: channel 65535 opens under channel_max 5 (clients such as the Java
    client's test suite use high channel numbers)."""
    client = Client(new_node(Settings(channel_max=5)))
    client.handshake()
    for number in (6, 2048, 65535):
        client.open_channel(number)
    client.declare_queue(65535, "high")


def channel_max_client(channel_max: int) -> Client:
    client = Client(new_node(Settings(channel_max=channel_max)))
    client.handshake()
    return client


def test_channel_max_bounds_the_channels_open_at_once():
    """RabbitMQ: the channel past channel_max is refused with a connection error, 530
    NOT_ALLOWED, no class or method ids, the text of rabbit_reader:create_channel."""
    client = channel_max_client(2)
    client.open_channel(1)
    client.open_channel(7)
    client.send(9, commands.Channel.Open())
    close = expect_connection_close(client, 530, (0, 0))
    assert close.reply_text == ("NOT_ALLOWED - number of channels opened (2) has reached "
                                "the negotiated channel_max (2)")
    finish_close(client)


@pytest.mark.parametrize("closed_by", ["client", "server"])
def test_a_closed_channel_frees_its_place_under_channel_max(closed_by):
    """A channel the client closed, or the server closed with a channel error (even
    before close-ok), no longer counts against channel_max (RabbitMQ 3.10 the same)."""
    client = channel_max_client(2)
    client.open_channel(1)
    client.open_channel(7)
    if closed_by == "client":
        client.call(7, commands.Channel.Close(reply_code=200, reply_text="", class_id=0,
                                              method_id=0), "Channel.CloseOk")
    else:
        client.send(7, commands.Queue.Declare(queue="missing", passive=True))
        client.expect_one("Channel.Close", channel=7)
    client.open_channel(9)
    client.send(10, commands.Channel.Open())
    assert expect_connection_close(client, 530).reply_text.endswith("(2) has reached the "
                                                                    "negotiated channel_max (2)")


def test_tune_ok_lowers_channel_max():
    """spec 1.4.2.6.1: the client may lower channel-max in tune-ok; the limit is then
    the client's."""
    client = Client(new_node())
    client.send_bytes(spec.PROTOCOL_HEADER)
    client.expect_one("Connection.Start")
    client.start_ok()
    client.expect_one("Connection.Tune")
    client.send(0, commands.Connection.TuneOk(channel_max=1, frame_max=131072),
                commands.Connection.Open(virtual_host="/"))
    client.expect_one("Connection.OpenOk")
    client.open_channel(300)
    client.send(1, commands.Channel.Open())
    assert expect_connection_close(client, 530).reply_text.endswith("channel_max (1)")


@byte_modes
def test_header_frame_without_a_publish_is_unexpected_frame(byte_at_a_time):
    """spec 4.2.6: a content header must follow a content method; otherwise RabbitMQ
    closes the connection with 505 UNEXPECTED_FRAME."""
    client = opened(byte_at_a_time=byte_at_a_time)
    client.send_bytes(content_frames(1, b"abc"))
    expect_connection_close(client, 505)
    finish_close(client)


def test_body_frame_without_a_header_is_unexpected_frame():
    """spec 4.2.6: a body frame must follow a content header (505)."""
    client = opened()
    client.send(1, method(commands.Basic.Publish, exchange="", routing_key="q"))
    client.send_bytes(raw_frame(spec.FRAME_BODY, 1, b"abc"))
    expect_connection_close(client, 505)


def test_method_while_expecting_a_body_is_unexpected_frame():
    """spec 4.2.6: content frames must follow without other frames on that channel;
    RabbitMQ (rabbit_command_assembler): 505 UNEXPECTED_FRAME naming the basic.publish
    whose content was interrupted."""
    client = opened()
    client.send(1, method(commands.Basic.Publish, exchange="", routing_key="q"))
    client.send_bytes(content_frames(1, b"abcdef")[:-(8 + 6)])  # header only
    client.send(1, commands.Queue.Declare(queue="q"))
    close = expect_connection_close(client, 505, (60, 40))
    assert "expected content body" in close.reply_text
    finish_close(client)


def test_body_larger_than_declared_is_frame_error():
    """spec 4.2.6.2: body frames must add up to the header's body-size."""
    client = opened()
    client.send(1, method(commands.Basic.Publish, exchange="", routing_key="q"))
    client.send_bytes(content_frames(1, b"abc")[:-(8 + 3)]
                      + raw_frame(spec.FRAME_BODY, 1, b"abcd"))
    expect_connection_close(client, 501)


def test_content_on_another_channel_does_not_interleave():
    """spec 4.2.6: content of one channel may interleave with frames of other channels."""
    client = opened()
    client.open_channel(2)
    client.declare_queue(2, "q")
    frames = content_frames(1, b"hello")
    client.send(1, method(commands.Basic.Publish, exchange="", routing_key="q"))
    client.send_bytes(frames[:-(8 + 5)])
    assert client.declare_queue(2, "q").message_count == 0
    client.send_bytes(frames[-(8 + 5):])
    assert client.get(2, "q").body == b"hello"


def test_undecodable_method_arguments_are_a_frame_error():
    """RabbitMQ: unparsable method arguments are 501 naming the method."""
    client = opened()
    client.send_bytes(raw_frame(spec.FRAME_METHOD, 1, b"\x00\x32\x00\x0a\x00\x00\x09q"))
    expect_connection_close(client, 501, (50, 10))


def test_oversize_frame_is_a_frame_error():
    """The negotiated frame_max bounds every frame (spec 4.2.3)."""
    client = Client(new_node())
    client.handshake(frame_max=8192)
    client.open_channel(1)
    client.send_bytes(raw_frame(spec.FRAME_BODY, 1, b"x" * 8185))
    close = expect_connection_close(client, 501, state=ConnectionState.CLOSED)
    assert "frame_too_large" in close.reply_text


def test_a_framing_error_sends_close_then_drops_the_connection():
    """RabbitMQ (rabbit_reader:fatal_frame_error): after a bad frame end octet the
    stream cannot be resynchronised, so the close is sent and the connection dropped
    without waiting for close-ok; later input is ignored."""
    client = opened()
    client.send_bytes(raw_frame(spec.FRAME_METHOD, 1, b"\x00\x3c\x00\x50" + b"\x00" * 9,
                                end=0) + marshal(commands.Channel.Open(), 2))
    expect_connection_close(client, 501, state=ConnectionState.CLOSED)
    client.send(2, commands.Channel.Open())
    assert client.read() == []


def test_errors_after_connection_close_are_discarded():
    """spec 1.4.2.9: once connection.close is sent, everything but close and close-ok
    is discarded, including frames that would be errors themselves."""
    client = opened()
    client.send(5, commands.Queue.Declare(queue="q"))
    expect_connection_close(client, 504)
    client.send_bytes(raw_frame(spec.FRAME_METHOD, 0, b"\x00\x0a\x00\x32\x01")  # bad close
                      + raw_frame(spec.FRAME_METHOD, 0, b"\x03\xe7\x00\x01")  # unknown
                      + raw_frame(spec.FRAME_HEARTBEAT, 3, b""))
    assert client.read() == []
    client.send(0, commands.Connection.Close(reply_code=200, reply_text="", class_id=0,
                                             method_id=0))
    client.expect_one("Connection.CloseOk")
    assert client.session.closed


def test_close_ok_timeout_drops_the_connection():
    """RabbitMQ: a client that never answers connection.close is dropped."""
    client = opened()
    client.send(5, commands.Queue.Declare(queue="q"))
    expect_connection_close(client, 504)
    client.session.tick(client.now + 4.9)
    assert not client.session.closed
    client.session.tick(client.now + 5.0)
    assert client.session.closed


# ---------------------------------------------------------------- channel-level errors


def channel_error_cases():
    """(description, setup on channel 1, failing frames, code, class/method, text)."""
    def exclusive_elsewhere(client):
        other = Client(client.node)
        other.handshake()
        other.open_channel(1)
        other.declare_queue(1, "mine", exclusive=True)

    return [
        ("passive declare of a missing queue", None,
         marshal(commands.Queue.Declare(queue="nope", passive=True), 1),
         404, (50, 10), "NOT_FOUND - no queue 'nope' in vhost '/'"),
        ("publish to a missing exchange", None,
         marshal(method(commands.Basic.Publish, exchange="nope", routing_key="k"), 1)
         + content_frames(1, b"m"),
         404, (60, 40), "NOT_FOUND - no exchange 'nope' in vhost '/'"),
        ("bind to a missing exchange", lambda c: c.declare_queue(1, "q"),
         marshal(commands.Queue.Bind(queue="q", exchange="nope"), 1),
         404, (50, 20), "NOT_FOUND - no exchange 'nope' in vhost '/'"),
        ("redeclare with another durable flag", lambda c: c.declare_queue(1, "q"),
         marshal(commands.Queue.Declare(queue="q", durable=True), 1),
         406, (50, 10), "PRECONDITION_FAILED - inequivalent arg 'durable' for queue 'q' in "
                        "vhost '/': received 'true' but current is 'false'"),
        ("ack of an unknown delivery tag", None,
         marshal(commands.Basic.Ack(delivery_tag=5), 1),
         406, (60, 80), "PRECONDITION_FAILED - unknown delivery tag 5"),
        ("reject of an unknown delivery tag", None,
         marshal(commands.Basic.Reject(delivery_tag=1), 1),
         406, (60, 90), "PRECONDITION_FAILED - unknown delivery tag 1"),
        ("message above max_message_size", None,
         marshal(method(commands.Basic.Publish, exchange="", routing_key="q"), 1)
         + content_frames(1, b"x" * 2000),
         406, (60, 40), "PRECONDITION_FAILED - message size 2000 is larger than configured "
                        "max size 1000"),
        ("user_id that is not the authenticated user", lambda c: c.declare_queue(1, "q"),
         marshal(method(commands.Basic.Publish, exchange="", routing_key="q"), 1)
         + content_frames(1, b"m", commands.Basic.Properties(user_id="mallory")),
         406, (60, 40), "PRECONDITION_FAILED - user_id property set to 'mallory' but "
                        "authenticated user was 'guest'"),
        ("declare of a reserved amq. queue name", None,
         marshal(method(commands.Queue.Declare, queue="amq.mine"), 1),
         403, (50, 10), "ACCESS_REFUSED - queue name 'amq.mine' contains reserved prefix "
                        "'amq.*'"),
        ("delete of the default exchange", None,
         marshal(method(commands.Exchange.Delete, exchange=""), 1),
         403, (40, 20), "ACCESS_REFUSED - operation not permitted on the default exchange"),
        ("consume from another connection's exclusive queue", exclusive_elsewhere,
         marshal(commands.Basic.Consume(queue="mine"), 1),
         405, (60, 20), "RESOURCE_LOCKED - cannot obtain exclusive access to locked queue "
                        "'mine' in vhost '/'. It could be originally declared on another "
                        "connection or the exclusive property value does not match that of "
                        "the original declaration."),
    ]


@pytest.mark.parametrize("byte_at_a_time", [False, True], ids=["whole", "bytewise"])
@pytest.mark.parametrize("case", channel_error_cases(), ids=lambda case: case[0])
def test_soft_errors_close_only_the_channel(case, byte_at_a_time):
    """spec 1.9 / RabbitMQ: 403, 404, 405 and 406 are channel errors: channel.close
    with the reply code, RabbitMQ's text and the failing method's class and method
    ids; the connection and its other channels keep working."""
    _description, setup, frames, code, class_method, text = case
    client = Client(new_node(Settings(max_message_size=1000)), byte_at_a_time=byte_at_a_time)
    client.handshake()
    client.open_channel(1)
    client.open_channel(2)
    if setup is not None:
        setup(client)
    client.send_bytes(frames)
    close = client.expect_one("Channel.Close", channel=1)
    assert close_of(close) == (code, text, *class_method)
    assert client.session.state is ConnectionState.OPEN
    # the other channel keeps working
    client.declare_queue(2, "other")
    client.publish(2, "", "other", b"still here")
    assert client.get(2, "other").body == b"still here"
    # after channel.close only close-ok counts on that channel (spec 1.5.2.6; a
    # channel.open there is RabbitMQ's 504, the lifecycle table's row)
    client.send_bytes(marshal(commands.Queue.Declare(queue="ignored"), 1)
                      + marshal(method(commands.Basic.Publish, exchange="", routing_key="x"), 1)
                      + content_frames(1, b"ignored"))
    assert client.read() == []
    assert "ignored" not in client.node.vhosts["/"].queues
    client.send(1, commands.Channel.CloseOk())
    assert client.read() == []
    client.open_channel(1)  # the number is free again
    client.declare_queue(1, "again")


def test_client_channel_close_while_the_server_closes_gets_close_ok():
    """Both peers closed the channel at once: answer close with close-ok; the client's
    close-ok for the server's close then frees the number (RabbitMQ's closing channel)."""
    client = opened()
    client.send(1, commands.Queue.Declare(queue="nope", passive=True))
    client.expect_one("Channel.Close")
    client.send(1, commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0,
                                       method_id=0))
    client.expect_one("Channel.CloseOk", channel=1)
    client.send(1, commands.Channel.CloseOk())
    client.open_channel(1)


def test_unacked_messages_return_to_the_queue_when_the_server_closes_a_channel():
    """spec 1.5.2.6: closing a channel requeues its unacked messages (redelivered)."""
    client = opened()
    client.declare_queue(1, "q")
    client.publish(1, "", "q", b"one")
    assert client.get(1, "q", no_ack=False).body == b"one"
    client.send(1, commands.Basic.Ack(delivery_tag=99))
    client.expect_one("Channel.Close")
    client.open_channel(2)
    delivery = client.get(2, "q")
    assert delivery.body == b"one" and delivery.method.redelivered


def test_client_channel_close_and_reopen():
    """spec 1.5.2.6/1.5.2.7: a closed channel number can be opened again."""
    client = opened()
    client.call(1, commands.Channel.Close(reply_code=200, reply_text="done", class_id=0,
                                       method_id=0),
                "Channel.CloseOk")
    client.open_channel(1)


# ---------------------------------------------------------------- connection.blocked


def blocked_capable(node) -> Client:
    client = opened(node)
    client.declare_queue(1, "q")
    return client


def test_memory_alarm_blocks_a_publisher_and_clearing_it_unblocks():
    """RabbitMQ connection.blocked extension: a client that advertised the
    connection.blocked capability and has published gets connection.blocked with the
    alarm as reason, and connection.unblocked when it clears; the shell stops reading."""
    node = new_node()
    client = blocked_capable(node)
    client.publish(1, "", "q", b"m")
    node.set_alarm("memory", True)
    blocked = client.expect_one("Connection.Blocked", channel=0)
    assert blocked.reason == "low on memory"
    assert client.session.paused
    node.set_alarm("memory", True)  # no change, nothing sent
    assert client.read() == []
    node.set_alarm("memory", False)
    client.expect_one("Connection.Unblocked", channel=0)
    assert not client.session.paused


def test_a_connection_that_has_not_published_is_blocked_on_its_first_publish():
    """RabbitMQ blocks only publishing connections (consumers keep consuming); a
    connection becomes blocked when it publishes during an alarm."""
    node = new_node()
    client = blocked_capable(node)
    node.set_alarm("disk", True)
    assert client.read() == [] and not client.session.paused
    client.publish(1, "", "q", b"m")
    blocked = client.expect_one("Connection.Blocked")
    assert blocked.reason == "low on disk space"
    assert client.session.paused
    node.set_alarm("memory", True)  # a second alarm: still one blocked state
    assert client.read() == []
    node.set_alarm("disk", False)
    assert client.read() == [] and client.session.paused
    node.set_alarm("memory", False)
    client.expect_one("Connection.Unblocked")


def test_clients_without_the_capability_are_paused_silently():
    """RabbitMQ: without connection.blocked capability the socket is just not read."""
    node = new_node()
    client = Client(node)
    client.handshake(capabilities={})
    client.open_channel(1)
    client.declare_queue(1, "q")
    client.publish(1, "", "q", b"m")
    node.set_alarm("memory", True)
    assert client.read() == []
    assert client.session.paused
    node.set_alarm("memory", False)
    assert client.read() == [] and not client.session.paused


def test_no_blocked_or_unblocked_after_connection_close():
    """spec 1.4.2.9: after connection.close the server sends nothing but close-ok, so a
    publisher that fails during an alarm is not told it is blocked (or unblocked)."""
    node = new_node()
    node.set_alarm("memory", True)
    client = blocked_capable(node)
    client.send_bytes(marshal(method(commands.Basic.Publish, exchange="", routing_key="q"), 1)
                      + content_frames(1, b"m") + marshal(commands.Queue.Declare(queue="q"), 9))
    expect_connection_close(client, 504)
    node.set_alarm("memory", False)
    assert client.read() == []


def test_blocked_connections_are_not_closed_for_missed_heartbeats():
    """RabbitMQ does not time out a connection it stopped reading from."""
    node = new_node()
    client = Client(node)
    client.handshake(heartbeat=5)
    client.open_channel(1)
    client.declare_queue(1, "q")
    client.publish(1, "", "q", b"m")
    node.set_alarm("memory", True)
    client.session.tick(100.0)
    assert not client.session.closed
