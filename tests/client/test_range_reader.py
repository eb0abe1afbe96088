"""The range reader's frame reading (client/range_reader.py), fed through a scripted
socket: whatever sizes the socket hands its bytes in, the delivery bodies come out
whole and in order, and a body's payload is received straight into the body rather
than through the reader's buffer (the kernel's copy is the only one).

The broker side of a range read is tested against the bundled broker in
tests/broker/server/test_leases.py; here only the bytes after the handshake.
"""

from __future__ import annotations

import pika.exceptions
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import body as pamqp_body
from pamqp import commands, frame
from pamqp import header as pamqp_header

from quorumqueue.client.range_reader import CHANNEL, RECV_BYTES, RangeReader
from quorumqueue.client.management import ManagementError

FRAME_MAX = 4096


class ScriptedSocket:
    """Hands out `stream` at most `sizes[i]` octets per recv_into (cycling)."""

    def __init__(self, stream: bytes, sizes: list[int]) -> None:
        self.stream, self.sizes, self.at, self.calls = stream, sizes, 0, 0
        self.into_chunk = 0   # octets received into the reader's own buffer chunk
        self.chunk = None

    def recv_into(self, view) -> int:
        if self.at >= len(self.stream):
            return 0
        size = min(len(view), self.sizes[self.calls % len(self.sizes)],
                   len(self.stream) - self.at)
        self.calls += 1
        view[:size] = self.stream[self.at:self.at + size]
        self.at += size
        if view.obj is self.chunk.obj:
            self.into_chunk += size
        return size

    def settimeout(self, _timeout) -> None:
        pass

    def sendall(self, _data) -> None:
        pass

    def close(self) -> None:
        pass


def reader_over(sock: ScriptedSocket) -> RangeReader:
    """A RangeReader past its handshake, reading `sock` (no broker)."""
    reader = RangeReader.__new__(RangeReader)
    reader.uri, reader.timeout, reader.vhost = "amqp://test", 5.0, "/"
    reader._buffer, reader._position = bytearray(), 0
    reader._chunk = memoryview(bytearray(RECV_BYTES))
    reader.usable, reader.reused, reader.pool_key = True, False, None
    reader.frame_max = FRAME_MAX
    reader._socket = sock
    sock.chunk = reader._chunk
    return reader


def range_stream(bodies: list[bytes]) -> bytes:
    """What the broker sends for a range: consume-ok, a delivery per body (its
    payload cut into frames of at most FRAME_MAX - 8 octets), the closing cancel."""
    frames = [frame.marshal(commands.Basic.ConsumeOk("range-t"), CHANNEL)]
    for tag, body in enumerate(bodies, 1):
        frames.append(frame.marshal(commands.Basic.Deliver("range-t", tag, False, "", "q"),
                                    CHANNEL))
        frames.append(frame.marshal(pamqp_header.ContentHeader(0, len(body)), CHANNEL))
        step = FRAME_MAX - 8
        frames += [frame.marshal(pamqp_body.ContentBody(body[at:at + step]), CHANNEL)
                   for at in range(0, len(body), step)]
    frames.append(frame.marshal(commands.Basic.Cancel("range-t"), CHANNEL))
    return b"".join(frames)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.binary(max_size=3 * FRAME_MAX), max_size=6),
       st.lists(st.integers(1, 3 * FRAME_MAX), min_size=1, max_size=8))
def test_bodies_come_whole_whatever_sizes_the_socket_hands_out(bodies, sizes):
    sock = ScriptedSocket(range_stream(bodies), sizes)
    reader = reader_over(sock)
    assert [bytes(body) for body in reader.read("q", "lease", 0, 10)] == bodies
    assert reader.usable  # the range completed: the connection can be kept
    assert sock.at == len(sock.stream)


def test_a_large_body_is_received_into_the_body_not_through_the_buffer():
    """A 1 MiB delivery read with large recvs: the payload goes straight into the body
    (before, every octet went through the reader's 1 MiB chunk and its buffer)."""
    body = bytes(range(256)) * 4096
    sock = ScriptedSocket(range_stream([body]), [1 << 20])
    reader = reader_over(sock)
    assert [bytes(b) for b in reader.read("q", "lease", 0, 1)] == [body]
    assert sock.into_chunk < len(body) // 10, sock.into_chunk


def test_a_frame_without_its_end_octet_is_a_lost_stream():
    stream = bytearray(range_stream([b"x" * 5000]))
    last_body_end = stream.rindex(b"\xce", 0, len(stream) - 20)
    stream[last_body_end] = 0
    reader = reader_over(ScriptedSocket(bytes(stream), [7]))
    with pytest.raises(pika.exceptions.StreamLostError, match="end octet"):
        list(reader.read("q", "lease", 0, 1))


def test_a_stream_that_ends_inside_a_body_is_a_lost_stream():
    stream = range_stream([b"x" * 9000])
    reader = reader_over(ScriptedSocket(stream[:len(stream) - 3000], [1 << 20]))
    with pytest.raises(pika.exceptions.StreamLostError):
        list(reader.read("q", "lease", 0, 1))
    assert not reader.usable


def test_a_socket_timeout_inside_a_body_says_the_range_stalled():
    class Stalling(ScriptedSocket):
        def recv_into(self, view):
            if self.at > 5000:
                raise TimeoutError
            return super().recv_into(view)

    reader = reader_over(Stalling(range_stream([b"x" * 9000]), [1 << 20]))
    with pytest.raises(ManagementError, match="stalled"):
        list(reader.read("q", "lease", 0, 1))


def _entries_body(first_seq: int, count: int, size: int) -> bytes:
    """An "entries" delivery body of `count` messages of `size` octets."""
    from quorumqueue.broker.amqp import codec
    from quorumqueue.broker.amqp.lease_records import pack_entries
    from quorumqueue.broker.fifo import commands

    header = codec.encode_properties(size, {})
    return pack_entries(first_seq, [commands.encode_enqueue("", seq, 0, "", "q", header,
                                                            b"%08d" % seq + b"x" * (size - 8))
                                    for seq in range(first_seq, first_seq + count)], {})


def test_small_deliveries_are_decoded_together_until_a_group_is_full():
    """read_groups: deliveries received back to back into one buffer make one
    EntryColumns once they hold group_messages messages; a delivery that does not fit
    the buffer starts another; a single large delivery is a group of its own. The
    groups hold every message once, in order, whatever the socket hands out."""
    counts = [3, 3, 2, 5, 1, 40, 2]
    bodies, seq = [], 1
    for count in counts:
        bodies.append(_entries_body(seq, count, 100))
        seq += count
    for sizes in ([1 << 20], [7, 300, 5000]):
        reader = reader_over(ScriptedSocket(range_stream(bodies), sizes))
        groups = list(reader.read_groups("q", "lease", 0, seq - 1, group_bytes=2_500,
                                         group_messages=6))
        # 3+3; 2+5 (7 >= 6); 1 (the 40's 4,000+ octets do not fit after it); 40; 2
        assert [len(group) for group in groups] == [6, 7, 1, 40, 2]
        assert [m.seq for group in groups for m in group] == list(range(1, seq))
        assert [m.body[:8] for group in groups for m in group] == [
            b"%08d" % number for number in range(1, seq)]
        assert reader.usable
