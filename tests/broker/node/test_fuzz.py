"""Hypothesis fuzzing of the session core: garbage in, only AMQP closes out.

After a valid handshake, random bytes, random method payloads in valid frame
envelopes, and valid client scripts mutated at the frame level (flipped bytes,
truncation, duplicated, dropped and reordered frames, wrong channel numbers, wrong
size fields), fed in random chunks, must never make `Session.receive_data` raise.
Whatever the session answers must be well-formed frames; every connection.close and
channel.close must carry a reply code AMQP defines (spec section 1.9 constants) and
RabbitMQ's `NAME - detail` reply text; after connection.close only close-ok may follow
(spec 1.4.2.9); and the node must stay healthy: a second connection can still declare,
publish and get.
"""

from __future__ import annotations

import re
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands
from pamqp import exceptions as pamqp_exceptions
from pamqp import frame as pamqp_frame

from quorumqueue.broker.amqp import spec
from quorumqueue.broker.config import Settings
from tests.broker.node.harness import (AMQP_REPLY_CODES, Client, content_frames, marshal,
                                       method, new_node, properties)

# pamqp warns when it decodes basic.recover-async, which fuzzed input often is
pytestmark = pytest.mark.filterwarnings("ignore:This command is deprecated")

FUZZ = settings(max_examples=120, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
REPLY_TEXT = re.compile(rb"^([A-Z_]+) - .")
CLOSE_METHODS = {(10, 50): "connection.close", (20, 40): "channel.close"}


# ---------------------------------------------------------------- checking the output


def split_frames(data: bytes) -> list[tuple[int, int, bytes]]:
    """The server's output as (type, channel, payload); it must be whole frames."""
    frames, position = [], 0
    if data.startswith(b"AMQP"):
        assert data[:8] == spec.PROTOCOL_HEADER
        position = 8
    while position < len(data):
        assert len(data) - position >= 8, f"partial frame header at {position}"
        frame_type, channel, size = struct.unpack_from(">BHI", data, position)
        end = position + 7 + size
        assert end < len(data), "frame runs past the output"
        assert data[end] == spec.FRAME_END, "bad frame end octet in the server's output"
        assert frame_type in (1, 2, 3, 8), frame_type
        frames.append((frame_type, channel, data[position + 7:end]))
        position = end + 1
    return frames


def check_output(data: bytes, state: dict) -> None:
    """Frame-level invariants of what the session sent; `state` spans calls."""
    for frame_type, channel, payload in split_frames(data):
        raw = struct.pack(">BHI", frame_type, channel, len(payload)) + payload + b"\xce"
        if frame_type == spec.FRAME_METHOD:
            class_id, method_id = struct.unpack_from(">HH", payload)
            ids = (class_id, method_id)
            if state.get("connection_closed"):
                assert ids == spec.CONNECTION_CLOSE_OK, \
                    f"{spec.method_name(*ids)} after connection.close"
            if ids in CLOSE_METHODS:
                code = struct.unpack_from(">H", payload, 4)[0]
                length = payload[6]
                text = payload[7:7 + length]
                assert code in AMQP_REPLY_CODES, (code, text)
                match = REPLY_TEXT.match(text)
                assert match, text
                assert match.group(1).decode() == spec.REPLY_NAMES[code], text
                assert len(payload) == 7 + length + 4
                if ids == spec.CONNECTION_CLOSE:
                    assert channel == 0
                    state["connection_closed"] = True
                else:
                    assert channel != 0
            try:  # everything else pamqp (a client) must be able to read
                pamqp_frame.unmarshal(raw)
            except pamqp_exceptions.UnmarshalingException as error:
                # short strings echoed back from non-UTF-8 client input stay raw
                assert isinstance(error.__cause__, UnicodeDecodeError) or \
                    "codec can't decode" in str(error), error
        elif frame_type == spec.FRAME_HEARTBEAT:
            assert channel == 0 and payload == b""


def feed(client: Client, stream: bytes, chunks: list[int], state: dict) -> None:
    """Feed `stream` in chunks of the given sizes (cycled); the session must not raise."""
    position, index = 0, 0
    while position < len(stream):
        size = chunks[index % len(chunks)] if chunks else len(stream)
        index += 1
        client.session.receive_data(stream[position:position + size], client.now)
        position += size
        check_output(client.read_raw(), state)
    client.now += 1000.0
    client.session.tick(client.now)  # timers must cope with whatever state is left
    check_output(client.read_raw(), state)


def assert_node_still_works(node) -> None:
    """A fresh connection on the same node can declare, publish and get."""
    for vhost in node.vhosts.values():
        for queue in vhost.queues.values():
            assert queue.ready_count == sum(len(level) for level in queue.levels)
            assert queue.unacked_count >= 0
    other = Client(node)
    other.handshake()
    other.open_channel(1)
    other.declare_queue(1, "after-fuzz")
    other.publish(1, "", "after-fuzz", b"still works")
    assert other.get(1, "after-fuzz").body == b"still works"


def fuzzed_session(node=None) -> tuple[Client, dict]:
    client = Client(node or new_node(Settings(max_message_size=4096)))
    client.handshake(frame_max=8192)
    client.open_channel(1)
    return client, {}


chunkings = st.lists(st.integers(min_value=1, max_value=64), max_size=4)


# ---------------------------------------------------------------- random input


@FUZZ
@given(data=st.binary(max_size=400), chunks=chunkings)
def test_random_bytes_after_the_handshake(data, chunks):
    """Arbitrary octets after the handshake: AMQP closes only, node unharmed."""
    client, state = fuzzed_session()
    feed(client, data, chunks, state)
    assert_node_still_works(client.node)


@FUZZ
@given(data=st.binary(max_size=200), chunks=chunkings)
def test_random_bytes_instead_of_a_handshake(data, chunks):
    """spec 4.2.2: arbitrary octets where the protocol header belongs."""
    client = Client(new_node())
    state: dict = {}
    feed(client, data, chunks, state)
    assert_node_still_works(client.node)


method_ids = st.sampled_from(sorted(commands.INDEX_MAPPING)).map(
    lambda index: struct.pack(">I", index))


@FUZZ
@given(frames=st.lists(st.tuples(st.sampled_from([0, 1, 1, 1, 2]), method_ids,
                                 st.binary(max_size=40)), min_size=1, max_size=8),
       chunks=chunkings)
def test_random_arguments_for_every_method(frames, chunks):
    """Well-framed method frames of every class and method with random arguments:
    decoders must turn anything undecodable into 501, never an exception."""
    client, state = fuzzed_session()
    stream = b"".join(struct.pack(">BHI", 1, channel, len(ids + args)) + ids + args + b"\xce"
                      for channel, ids, args in frames)
    feed(client, stream, chunks, state)
    assert_node_still_works(client.node)


# ---------------------------------------------------------------- mutated valid scripts


def publish(channel: int, exchange: str, routing_key: str, body: bytes, **props) -> list[bytes]:
    frames = [marshal(method(commands.Basic.Publish, exchange=exchange,
                             routing_key=routing_key), channel)]
    content = content_frames(channel, body, properties(**props) if props else None,
                             frame_max=64)
    position = 0
    while position < len(content):  # split the concatenated content back into frames
        size = struct.unpack_from(">I", content, position + 3)[0]
        frames.append(content[position:position + 8 + size])
        position += 8 + size
    return frames


ACTIONS = {
    "open 2": lambda: [marshal(commands.Channel.Open(), 2)],
    "declare": lambda: [marshal(commands.Queue.Declare(queue="q"), 1)],
    "declare exclusive": lambda: [marshal(commands.Queue.Declare(queue="ex", exclusive=True),
                                          2)],
    "declare limited": lambda: [marshal(commands.Queue.Declare(
        queue="lim", arguments={"x-max-length": 1, "x-overflow": "reject-publish"}), 1)],
    "exchange": lambda: [marshal(commands.Exchange.Declare(exchange="t",
                                                           exchange_type="topic"), 1)],
    "bind": lambda: [marshal(commands.Queue.Bind(queue="q", exchange="t",
                                                 routing_key="a.#"), 1)],
    "confirm": lambda: [marshal(commands.Confirm.Select(), 2)],
    "tx": lambda: [marshal(commands.Tx.Select(), 1)],
    "commit": lambda: [marshal(commands.Tx.Commit(), 1)],
    "rollback": lambda: [marshal(commands.Tx.Rollback(), 1)],
    "qos": lambda: [marshal(commands.Basic.Qos(prefetch_count=1), 1)],
    "consume": lambda: [marshal(commands.Basic.Consume(queue="q", consumer_tag="c"), 1)],
    "cancel": lambda: [marshal(commands.Basic.Cancel(consumer_tag="c"), 1)],
    "publish q": lambda: publish(1, "", "q", b"x" * 150, delivery_mode=2),
    "publish t": lambda: publish(2, "t", "a.b.c", b"hello", headers={"h": 1}),
    "publish lim": lambda: publish(2, "", "lim", b"l"),
    "publish empty": lambda: publish(1, "", "q", b""),
    "get": lambda: [marshal(commands.Basic.Get(queue="q"), 1)],
    "ack": lambda: [marshal(commands.Basic.Ack(delivery_tag=1, multiple=True), 1)],
    "nack": lambda: [marshal(commands.Basic.Nack(delivery_tag=2, requeue=True), 1)],
    "reject": lambda: [marshal(commands.Basic.Reject(delivery_tag=1, requeue=False), 1)],
    "recover": lambda: [marshal(commands.Basic.Recover(requeue=True), 1)],
    "purge": lambda: [marshal(commands.Queue.Purge(queue="q"), 1)],
    "delete": lambda: [marshal(commands.Queue.Delete(queue="q"), 2)],
    "close 1": lambda: [marshal(commands.Channel.Close(reply_code=200, reply_text="",
                                                       class_id=0, method_id=0), 1)],
    "close-ok 1": lambda: [marshal(commands.Channel.CloseOk(), 1)],
    "reopen 1": lambda: [marshal(commands.Channel.Open(), 1)],
    "heartbeat": lambda: [b"\x08\x00\x00\x00\x00\x00\x00\xce"],
    "connection close": lambda: [marshal(commands.Connection.Close(
        reply_code=200, reply_text="", class_id=0, method_id=0), 0)],
    "connection close-ok": lambda: [marshal(commands.Connection.CloseOk(), 0)],
}

scripts = st.lists(st.sampled_from(sorted(ACTIONS)), min_size=1, max_size=14).map(
    lambda names: [frame for name in names for frame in ACTIONS[name]()])

mutations = st.lists(st.one_of(
    st.tuples(st.just("flip"), st.integers(min_value=0), st.integers(min_value=0, max_value=7)),
    st.tuples(st.just("truncate"), st.integers(min_value=0), st.integers(min_value=0)),
    st.tuples(st.just("duplicate"), st.integers(min_value=0)),
    st.tuples(st.just("drop"), st.integers(min_value=0)),
    st.tuples(st.just("swap"), st.integers(min_value=0), st.integers(min_value=0)),
    st.tuples(st.just("channel"), st.integers(min_value=0),
              st.sampled_from([0, 1, 2, 3, 2047, 2048, 65535])),
    st.tuples(st.just("size"), st.integers(min_value=0),
              st.sampled_from([-3, -1, 1, 2, 100, 8200, 2 ** 31])),
), max_size=4)


def mutate(frames: list[bytes], ops: list[tuple]) -> bytes:
    frames = list(frames)
    for op in ops:
        if not frames:
            break
        index = op[1] % len(frames)
        frame = bytearray(frames[index])
        if not frame:  # truncated away already
            continue
        if op[0] == "flip":
            frame[op[1] % len(frame)] ^= 1 << op[2]
            frames[index] = bytes(frame)
        elif op[0] == "truncate":
            frames[index] = bytes(frame[:op[2] % len(frame)])
        elif op[0] == "duplicate":
            frames.insert(index, bytes(frame))
        elif op[0] == "drop":
            del frames[index]
        elif op[0] == "swap":
            other = op[2] % len(frames)
            frames[index], frames[other] = frames[other], frames[index]
        elif op[0] == "channel" and len(frame) >= 3:
            frame[1:3] = struct.pack(">H", op[2])
            frames[index] = bytes(frame)
        elif op[0] == "size" and len(frame) >= 7:
            size = max(0, min(2 ** 32 - 1, struct.unpack_from(">I", frame, 3)[0] + op[2]))
            frame[3:7] = struct.pack(">I", size)
            frames[index] = bytes(frame)
    return b"".join(frames)


@settings(max_examples=250, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(frames=scripts, ops=mutations, chunks=chunkings, alarm=st.booleans())
def test_mutated_client_scripts(frames, ops, chunks, alarm):
    """Legal client scripts damaged at the frame level (spec 4.2.3 framing), with or
    without a resource alarm (connection.blocked/unblocked join the output)."""
    client, state = fuzzed_session()
    if alarm:
        client.node.set_alarm("memory", True)
    feed(client, mutate(frames, ops), chunks, state)
    client.node.set_alarm("memory", False)
    check_output(client.read_raw(), state)
    assert_node_still_works(client.node)


@settings(max_examples=60, deadline=None)
@given(frames=scripts, chunks=chunkings)
def test_unmutated_scripts_close_nothing_but_with_amqp_codes(frames, chunks):
    """The scripts themselves are legal frame sequences (if not always legal method
    sequences): they run through, bytewise or chunked, with the same invariants."""
    client, state = fuzzed_session()
    feed(client, b"".join(frames), chunks, state)
    assert_node_still_works(client.node)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(first=scripts, ops=mutations, second=scripts)
def test_two_fuzzed_sessions_share_a_node(first, ops, second):
    """Two connections interleave on one node (exclusive queues, shared queue 'q',
    consumers on one and publishes on the other) and one of them is fuzzed."""
    node = new_node(Settings(max_message_size=4096))
    one, state_one = fuzzed_session(node)
    two, state_two = fuzzed_session(node)
    stream_one = mutate(first, ops)
    stream_two = b"".join(second)
    half_one, half_two = len(stream_one) // 2, len(stream_two) // 2
    for client, data, state in ((one, stream_one[:half_one], state_one),
                                (two, stream_two[:half_two], state_two),
                                (one, stream_one[half_one:], state_one),
                                (two, stream_two[half_two:], state_two)):
        feed(client, data, [], state)
    one.session.connection_lost()
    check_output(two.read_raw(), state_two)
    assert_node_still_works(node)
