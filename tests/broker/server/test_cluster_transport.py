"""The cluster transport (broker/server/cluster_transport.py) over real loopback sockets.

Each test runs one scenario in its own event loop with asyncio.run (as
tests/broker/server/test_aio_pika.py does), on 127.0.0.1 and ports the kernel picks.
Waits poll a condition with a deadline; nothing asserts on timing.

Checked: envelopes both ways between two and three nodes, per-peer order, batching
(a burst is one write), a multi-MB AppendEntries, a peer that starts late or
restarts on the same port, the queue bound and write back-pressure, handshakes
refused for cluster name, cookie and to-node, the cookie proven both ways by
challenge and response without crossing the wire (a replayed answer refused), a
malformed frame closing only its connection, and stop() leaving no task behind.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket

import msgpack
import pytest

from quorumqueue.broker.server.cluster_transport import ClusterTransport
from quorumqueue.broker.cluster.wire import (INITIATOR, NONCE_SIZE, RESPONDER, VERSION,
                                             Challenge,
                                             FrameReader, Handshake, Proof, RaftEnvelope,
                                             Resume, Rpc, decode, decode_challenge,
                                             decode_handshake, decode_proof, encode,
                                             encode_challenge, encode_handshake, encode_proof,
                                             frame, handshake_proof)
from quorumqueue.broker.raft.messages import (AppendEntries, AppendEntriesResponse,
                                              InstallSnapshot, RequestVote, TimeoutNow)
from quorumqueue.broker.raft.types import COMMAND, LogEntry, SnapshotMeta

pytestmark = pytest.mark.timeout(120)

LOCAL = "127.0.0.1"


def run(scenario):
    asyncio.run(asyncio.wait_for(scenario(), timeout=90))


class Node:
    """A started transport and what it delivered."""

    def __init__(self, transport: ClusterTransport) -> None:
        self.transport = transport
        self.got: list[tuple[str, object]] = []
        self.down: list[str] = []

    @property
    def address(self) -> tuple[str, int]:
        return (LOCAL, self.transport.port)

    def sent_from(self, peer: str) -> list[object]:
        return [envelope for sender, envelope in self.got if sender == peer]


async def start(name: str, *, cluster: str = "test", cookie: str = "secret", port: int = 0,
                peers: dict | None = None, **options) -> Node:
    options = {"backoff_initial": 0.01, "backoff_max": 0.1, **options}
    node = Node(None)
    node.transport = ClusterTransport(
        name, cluster, cookie, LOCAL, port, peers or {},
        lambda sender, envelope: node.got.append((sender, envelope)), node.down.append,
        **options)
    await node.transport.start()
    return node


def mesh(*nodes: Node) -> None:
    for node in nodes:
        for other in nodes:
            if other is not node:
                node.transport.add_peer(other.transport.node_name, other.address)


async def until(condition, timeout: float = 60.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.005)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOCAL, 0))
        return sock.getsockname()[1]


def traffic(sender: str, to: str, count: int) -> list:
    """Raft envelopes of several kinds interleaved with Rpcs, numbered for order."""
    out = []
    for i in range(count):
        match i % 4:
            case 0:
                out.append(RaftEnvelope("meta", RequestVote(i, sender, to, i, i)))
            case 1:
                entry = LogEntry(i, 1, COMMAND, f"{sender}->{to} #{i}".encode())
                out.append(RaftEnvelope("%2F/q1", AppendEntries(1, sender, to, i - 1, 1,
                                                                (entry,), i - 1)))
            case 2:
                out.append(Rpc("declare", {"seq": i, "from": sender, "args": [1, b"\x00"]}))
            case 3:
                out.append(RaftEnvelope("%2F/q1", AppendEntriesResponse(1, sender, to, True,
                                                                        i)))
    return out


def urgent(envelope) -> bool:
    """Raft's small messages (heartbeats, votes, answers): the transport's urgent lane."""
    return isinstance(envelope, RaftEnvelope) and not (
        isinstance(envelope.message, InstallSnapshot)
        or (isinstance(envelope.message, AppendEntries) and envelope.message.entries))


def in_lanes(envelopes: list) -> list:
    """The order one burst (one write) arrives in: the urgent lane first, then Rpcs
    and Raft's appends with entries, each lane in the order sent."""
    return [e for e in envelopes if urgent(e)] + [e for e in envelopes if not urgent(e)]


def lanes(envelopes: list) -> tuple[list, list]:
    """Each lane's envelopes in order: what the transport keeps across bursts."""
    return [e for e in envelopes if urgent(e)], [e for e in envelopes if not urgent(e)]


# -- exchanging -----------------------------------------------------------------------

def test_two_nodes_exchange_envelopes_both_ways_in_order_one_write_per_burst():
    async def scenario():
        a, b = await start("a"), await start("b")
        mesh(a, b)
        a_to_b, b_to_a = traffic("a", "b", 400), traffic("b", "a", 400)
        for envelope in a_to_b:                  # one iteration: queued, then one write
            a.transport.send("b", envelope)
        for envelope in b_to_a:
            b.transport.send("a", envelope)
        await until(lambda: len(a.got) == 400 and len(b.got) == 400)
        assert b.got == [("a", e) for e in in_lanes(a_to_b)]
        assert a.got == [("b", e) for e in in_lanes(b_to_a)]
        # each side acknowledges the other's Rpcs ACK_DELAY after it received them, in
        # a frame and a write of its own (more than one when they arrived in parts)
        await until(lambda: a.transport.stats("b").unacked_frames == 0
                    and b.transport.stats("a").unacked_frames == 0)
        sent = a.transport.stats("b")
        acks = sent.frames_sent - 400
        assert acks >= 1 and (sent.writes, sent.frames_dropped) == (1 + acks, 0)
        assert b.transport.stats("a").frames_received == 400 + acks
        assert b.transport.stats("a").bytes_received == sent.bytes_sent
        assert a.transport.is_connected("b") and b.transport.is_connected("a")

        writes = sent.writes
        burst = traffic("a", "b", 100)
        for envelope in burst:
            a.transport.send("b", envelope)
        await until(lambda: len(b.got) == 500)
        assert b.sent_from("a")[400:] == in_lanes(burst)
        assert a.transport.stats("b").writes == writes + 1
        await a.transport.stop()
        await b.transport.stop()
    run(scenario)


def test_three_nodes_each_receive_from_both_others_in_order():
    async def scenario():
        nodes = [await start(name) for name in "abc"]
        mesh(*nodes)
        sent = {}
        for round_ in range(5):                  # several iterations, several writes
            for node in nodes:
                for other in nodes:
                    if other is node:
                        continue
                    me, to = node.transport.node_name, other.transport.node_name
                    batch = traffic(me, to, 40)[round_ * 8:(round_ + 1) * 8]
                    sent.setdefault((me, to), []).extend(batch)
                    for envelope in batch:
                        node.transport.send(to, envelope)
            await asyncio.sleep(0)
        await until(lambda: all(len(n.got) == 80 for n in nodes))
        for (me, to), envelopes in sent.items():
            receiver = nodes["abc".index(to)]
            assert lanes(receiver.sent_from(me)) == lanes(envelopes)
        for node in nodes:
            await node.transport.stop()
    run(scenario)


def test_a_several_megabyte_append_entries_arrives_intact():
    async def scenario():
        a, b = await start("a"), await start("b")
        mesh(a, b)
        entries = tuple(LogEntry(i, 3, COMMAND, os.urandom(128 * 1024)) for i in range(1, 41))
        big = RaftEnvelope("%2F/big", AppendEntries(3, "a", "b", 0, 0, entries, 40))
        snapshot = RaftEnvelope("%2F/big", InstallSnapshot(
            3, "a", "b", SnapshotMeta(40, 3, ("a", "b")), os.urandom(3 * 1024 * 1024)))
        a.transport.send("b", big)
        a.transport.send("b", snapshot)
        a.transport.send("b", RaftEnvelope("%2F/big", TimeoutNow(3, "a", "b")))
        await until(lambda: len(b.got) == 3)
        # the small TimeoutNow overtakes the megabytes queued before it
        assert b.sent_from("a") == [RaftEnvelope("%2F/big", TimeoutNow(3, "a", "b")),
                                    big, snapshot]
        await a.transport.stop()
        await b.transport.stop()
    run(scenario)


# -- unreachable, late and restarted peers --------------------------------------------

def test_a_peer_that_starts_late_receives_what_was_queued_within_the_bound():
    async def scenario():
        port = free_port()
        a = await start("a", peers={"b": (LOCAL, port)}, max_queued_frames=10)
        sent = traffic("a", "b", 25)
        for envelope in sent:
            a.transport.send("b", envelope)      # never blocks, never raises
        await until(lambda: a.transport.stats("b").connect_failures >= 2)
        stats = a.transport.stats("b")
        # each lane keeps its newest 10 (13 urgent and 12 others were sent)
        assert (stats.frames_dropped, stats.queued_frames) == (5, 20)
        assert a.down == ["b"]                   # once per outage, not per attempt
        assert not a.transport.is_connected("b")

        b = await start("b", port=port)
        await until(lambda: len(b.got) == 20)
        quick, bulk = lanes(sent)
        assert b.sent_from("a") == quick[-10:] + bulk[-10:]   # the oldest were dropped
        assert a.transport.is_connected("b")
        assert a.transport.stats("b").reconnects == 0   # a first connection
        await a.transport.stop()
        await b.transport.stop()
    run(scenario)


def test_a_peer_restarted_on_the_same_port_is_reconnected_to():
    async def scenario():
        a, b = await start("a"), await start("b")
        mesh(a, b)
        a.transport.send("b", Rpc("ping", {"n": 1}))
        await until(lambda: len(b.got) == 1)
        port = b.transport.port
        await b.transport.stop()
        await until(lambda: a.down == ["b"])            # on_peer_down, once
        assert not a.transport.is_connected("b")
        a.transport.send("b", Rpc("ping", {"n": 2}))      # queued while b is down

        b2 = await start("b", port=port)
        await until(lambda: len(b2.got) == 1)
        assert b2.got == [("a", Rpc("ping", {"n": 2}))]
        assert a.transport.stats("b").reconnects == 1
        await a.transport.stop()
        await b2.transport.stop()
    run(scenario)


def test_write_back_pressure_bounds_memory_by_dropping_the_oldest_frames():
    async def scenario():
        held: list[asyncio.StreamWriter] = []
        sink = socket.socket()
        sink.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sink.bind((LOCAL, 0))
        server = await asyncio.start_server(lambda reader, writer: held.append(writer),
                                            sock=sink)        # accepts, never reads
        high, bound = 64 * 1024, 1024 * 1024
        a = await start("a", peers={"sink": sink.getsockname()}, write_high_water=high,
                        max_queued_bytes=bound)
        chunk = Rpc("blob", {"data": b"\x00" * 100_000})
        for _ in range(2000):
            a.transport.send("sink", chunk)
            await asyncio.sleep(0)
            stats = a.transport.stats("sink")
            assert stats.queued_bytes <= bound
            assert stats.buffered_bytes <= high + bound
            if stats.frames_dropped > 10:
                break
        assert a.transport.stats("sink").frames_dropped > 10
        await a.transport.stop(grace=0.05)      # the sink never drains: aborted
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()
    run(scenario)


# -- refusing and surviving bad peers -------------------------------------------------

@pytest.mark.parametrize("case, fault", [
    ("cluster", "refused cluster connection from node 'a' at 127.0.0.1:"),
    ("cluster", "cluster name 'other' is not this node's 'test'"),
    ("cookie", "the cookie does not match this node's cookie"),
    ("to_node", "it is addressed to node 'c', this node is 'b'"),
])
def test_a_bad_handshake_is_refused_and_nothing_is_delivered(case, fault, caplog):
    async def scenario():
        b = await start("b")
        a = await start("a", cluster="other" if case == "cluster" else "test",
                        cookie="guess" if case == "cookie" else "secret")
        target = "c" if case == "to_node" else "b"
        a.transport.add_peer(target, b.address)
        for envelope in traffic("a", target, 5):
            a.transport.send(target, envelope)
        await until(lambda: b.transport.stats().refused >= 2)   # refused, and again
        assert b.got == [] and b.transport.stats().frames_received == 0
        await a.transport.stop()
        await b.transport.stop()

    with caplog.at_level(logging.ERROR, logger="quorumqueue.cluster"):
        run(scenario)
    assert fault in caplog.text
    assert "secret" not in caplog.text and "guess" not in caplog.text


async def read_until_closed(reader: asyncio.StreamReader) -> bytes:
    data = b""
    while chunk := await reader.read(65536):
        data += chunk
    return data


async def raw_client(port: int, data: bytes, cookie: str | None = None) -> bytes:
    """Connect, prove `cookie` as node 'x' (if given), write `data`, and return what
    arrives until the node closes (after the handshake's Challenge and Resume)."""
    reader, writer = await asyncio.open_connection(LOCAL, port)
    try:
        if cookie is not None:
            await prove(reader, writer, cookie)
        writer.write(data)
        return await read_until_closed(reader)
    finally:
        writer.close()
        await writer.wait_closed()


class Frames:
    """The frames arriving on a stream, one at a time, and every byte received."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self.reader, self.frames, self.pending, self.received = reader, FrameReader(), [], b""

    async def next(self) -> bytes | None:
        """The next frame's payload, or None if the connection closed first."""
        while not self.pending:
            data = await self.reader.read(65536)
            if not data:
                return None
            self.received += data
            self.pending = self.frames.feed(data)
        return self.pending.pop(0)


async def prove(reader, writer, cookie: str, hello: Handshake | None = None,
                proof: bytes | None = None) -> tuple[bytes, list]:
    """Play the connecting side of the handshake as node 'x' with `cookie` (or send
    `proof` as it is). Returns every byte received and the frames: the Challenge, then
    the Resume if the node accepted the proof."""
    hello = hello or Handshake("test", "x", "b", 1, os.urandom(NONCE_SIZE))
    frames, got = Frames(reader), []
    writer.write(frame(encode_handshake(hello)))
    challenge = await frames.next()
    got.append(challenge)
    nonce = decode_challenge(challenge).nonce
    writer.write(frame(encode_proof(Proof(
        proof or handshake_proof(cookie, INITIATOR, hello, nonce)))))
    resume = await frames.next()
    if resume is not None:
        got.append(resume)
        assert decode(resume).proof == handshake_proof(cookie, RESPONDER, hello, nonce)
    return frames.received, got


@pytest.mark.parametrize("data, proven, delivered, fault", [
    (frame(encode(Rpc("ok", {}))) + frame(b"\xc1junk") + frame(encode(Rpc("no", {}))),
     True, 1, "closing cluster connection from node 'x' at 127.0.0.1:"),
    (frame(b"\x93\x03\xa1g\x01"), True, 0, "malformed frame: AppendEntries must have"),
    (b"\x7f\xff\xff\xff", True, 0, "exceeds the maximum frame size"),
    (b"GET / HTTP/1.1\r\nHost: b\r\n\r\n", False, 0, "exceeds the maximum frame size"),
    (frame(b"\x92\x01\x02") + frame(encode_handshake(Handshake("test", "x", "b", 1,
                                                                b"n" * NONCE_SIZE))),
     False, 0, "not a quorumqueue cluster handshake"),
    # a node of wire version 3 (its cookie in the handshake) gets nothing, and the log
    # says why in words an operator can act on
    (frame(msgpack.packb(["quorumqueue-cluster", 3, "test", "x", "b", "secret", 1])),
     False, 0, f"handshake version 3 is not supported (this node speaks version {VERSION}: "
     "run the same quorumqueue version on every node)"),
], ids=["garbage-after-good-frames", "bad-envelope", "oversized", "http", "no-handshake",
        "version-3-peer"])
def test_a_malformed_frame_closes_only_that_connection(data, proven, delivered, fault,
                                                       caplog):
    async def scenario():
        b = await start("b")
        answer = await raw_client(b.transport.port, data, "secret" if proven else None)
        assert answer == b""                       # b closed it without another word
        assert b.sent_from("x") == [Rpc("ok", {})][:delivered]
        a = await start("a")                                      # b carries on
        mesh(a, b)
        a.transport.send("b", Rpc("still", {"up": True}))
        await until(lambda: b.sent_from("a") == [Rpc("still", {"up": True})])
        await a.transport.stop()
        await b.transport.stop()

    with caplog.at_level(logging.ERROR, logger="quorumqueue.cluster"):
        run(scenario)
    assert fault in caplog.text


def test_before_the_cookie_is_proved_only_handshake_sized_frames_are_read(caplog):
    """Issue 30: 8 strangers each announcing a 256 MB frame (the most a peer may send)
    and sending its first MiB: each is closed at its frame's header, nothing of it
    buffered; before, the node read on towards 256 MB each (55 MB -> 1.19 GB, its loop
    stalled). A peer that proved the cookie still sends frames of megabytes
    (test_a_several_megabyte_append_entries_arrives_intact)."""
    header = (256 * 1024 * 1024).to_bytes(4, "big")

    async def stranger(port: int) -> bytes:
        """What the node sends before it closes (a reset counts as a close)."""
        try:
            return await raw_client(port, header + os.urandom(1 << 20))
        except ConnectionResetError:
            return b""

    async def scenario():
        b = await start("b", handshake_timeout=120.0)
        answers = await asyncio.wait_for(asyncio.gather(*(
            stranger(b.transport.port) for _ in range(8))), timeout=60)
        assert answers == [b""] * 8
        assert b.transport.stats().malformed == 8
        await b.transport.stop()

    with caplog.at_level(logging.ERROR, logger="quorumqueue.cluster"):
        run(scenario)
    assert caplog.text.count("exceeds the maximum frame size of 65535 bytes") == 8


@pytest.mark.parametrize("cookie, answered", [("secret", True), ("guess", False),
                                             ("", False), ("secret\x00", False)])
def test_the_cluster_port_answers_only_a_peer_that_proves_the_cookie(cookie, answered,
                                                                     caplog):
    """Issue 17: the inter-node port tells a peer nothing but its Challenge (a random
    nonce) until the peer proves the cookie, never sends the cookie, and takes
    nothing from a peer whose proof does not match; the right cookie is answered with
    a Resume carrying the node's own proof, and Rpcs after it are delivered."""
    async def scenario():
        b = await start("b")
        reader, writer = await asyncio.open_connection(LOCAL, b.transport.port)
        received, got = await prove(reader, writer, cookie)
        writer.write(frame(encode(Rpc("hi", {}))))
        assert b"secret" not in received
        if answered:
            await until(lambda: b.got)
            assert [len(got), type(decode(got[1]))] == [2, Resume]
            assert b.sent_from("x") == [Rpc("hi", {})]
        else:
            assert len(got) == 1                 # the Challenge, then closed
            assert await read_until_closed(reader) == b""
            assert b.got == [] and b.transport.stats().refused == 1
        writer.close()
        await b.transport.stop()

    with caplog.at_level(logging.ERROR, logger="quorumqueue.cluster"):
        run(scenario)
    assert ("the cookie does not match" in caplog.text) is not answered
    if not answered:
        assert "give every node of the cluster the same cluster.cookie" in caplog.text


def test_a_replayed_proof_from_an_earlier_handshake_is_refused(caplog):
    """A recorded handshake and proof, sent again, do not prove the cookie: the node's
    Challenge is new on every connection."""
    async def scenario():
        b = await start("b")
        hello = Handshake("test", "x", "b", 1, os.urandom(NONCE_SIZE))
        reader, writer = await asyncio.open_connection(LOCAL, b.transport.port)
        _, got = await prove(reader, writer, "secret", hello)
        assert len(got) == 2                     # proven: Challenge and Resume
        recorded = handshake_proof("secret", INITIATOR, hello, decode_challenge(got[0]).nonce)
        writer.close()
        reader, writer = await asyncio.open_connection(LOCAL, b.transport.port)
        _, got = await prove(reader, writer, "", hello, proof=recorded)
        writer.write(frame(encode(Rpc("replayed", {}))))
        assert len(got) == 1 and await read_until_closed(reader) == b""
        assert b.transport.stats().refused == 1 and b.sent_from("x") == []
        writer.close()
        await b.transport.stop()

    with caplog.at_level(logging.ERROR, logger="quorumqueue.cluster"):
        run(scenario)
    assert "refused cluster connection from node 'x'" in caplog.text
    assert "the cookie does not match" in caplog.text


class Impostor:
    """A listener at a peer's address that does not know the cookie: it records every
    byte a connecting node sends it and answers like a node, with a Resume whose proof
    is `answer(connection number, hello, challenge)` (None: the cookie `guess`'s)."""

    def __init__(self, guess: str = "guess", answer=None) -> None:
        self.guess, self.answer = guess, answer
        self.received: list[bytes] = []      # per connection, everything it got
        self.server: asyncio.Server | None = None

    async def start(self) -> tuple[str, int]:
        self.server = await asyncio.start_server(self._serve, LOCAL, 0)
        return (LOCAL, self.server.sockets[0].getsockname()[1])

    async def _serve(self, reader, writer) -> None:
        number = len(self.received)
        self.received.append(b"")
        frames = Frames(reader)
        try:
            hello = decode_handshake(await frames.next())
            challenge = os.urandom(NONCE_SIZE)
            writer.write(frame(encode_challenge(Challenge(challenge))))
            decode_proof(await frames.next())
            proof = (self.answer(number, hello, challenge) if self.answer
                     else handshake_proof(self.guess, RESPONDER, hello, challenge))
            writer.write(frame(encode(Resume(7, 0, proof))))
            while await frames.next() is not None:
                pass
        finally:
            self.received[number] = frames.received
            writer.close()

    async def stop(self) -> None:
        self.server.close()
        await self.server.wait_closed()


def test_a_node_dialling_an_impostor_refuses_it_and_never_sends_the_cookie(caplog):
    """Issue 17: the connecting side checks the listener's proof too. A listener with
    the wrong cookie gets a handshake and a proof it cannot use (no cookie in the
    bytes), and no envelope: the node closes on its Resume."""
    async def scenario():
        impostor = Impostor()
        a = await start("a")
        a.transport.add_peer("b", await impostor.start())
        a.transport.send("b", Rpc("private", {"data": "for b only"}))
        await until(lambda: len(impostor.received) >= 2)         # refused, and again
        assert not a.transport.is_connected("b")
        await a.transport.stop()
        await impostor.stop()
        # a dial in flight when the transport stopped may close before its first byte
        dialled = [received for received in impostor.received if received]
        assert dialled
        for received in dialled:
            assert b"secret" not in received and b"for b only" not in received
            payloads = FrameReader().feed(received)
            assert len(payloads) <= 2                             # hello, proof
            decode_handshake(payloads[0])

    with caplog.at_level(logging.ERROR, logger="quorumqueue.cluster"):
        run(scenario)
    assert "closing the connection to peer 'b' at 127.0.0.1:" in caplog.text
    assert "it did not prove the cookie: the cookie does not match" in caplog.text


def test_a_replayed_resume_from_an_earlier_handshake_is_refused(caplog):
    """A machine in b's place that recorded b's genuine Resume (here: computed with
    the cookie for the first connection) replays it on the next connection: the
    connecting node's nonce is new, so the proof does not match and it is refused."""
    recorded = []

    def answer(number, hello, challenge):
        if number == 0:
            recorded.append(handshake_proof("secret", RESPONDER, hello, challenge))
        return recorded[0]

    async def scenario():
        impostor = Impostor(answer=answer)
        a = await start("a")
        a.transport.add_peer("b", await impostor.start())
        a.transport.send("b", Rpc("first", {}))
        await until(lambda: a.transport.is_connected("b"))   # the genuine answer
        a.transport.remove_peer("b")
        a.transport.add_peer("b", (LOCAL, impostor.server.sockets[0].getsockname()[1]))
        a.transport.send("b", Rpc("second", {}))
        await until(lambda: len(impostor.received) >= 3)
        assert not a.transport.is_connected("b")
        assert all(b"second" not in received for received in impostor.received[1:])
        await a.transport.stop()
        await impostor.stop()

    with caplog.at_level(logging.ERROR, logger="quorumqueue.cluster"):
        run(scenario)
    assert "it did not prove the cookie: the cookie does not match" in caplog.text


def test_a_connection_without_a_handshake_is_closed_after_the_timeout(caplog):
    async def scenario():
        b = await start("b", handshake_timeout=0.05)
        assert await raw_client(b.transport.port, b"") == b""
        await b.transport.stop()

    with caplog.at_level(logging.ERROR, logger="quorumqueue.cluster"):
        run(scenario)
    assert "no handshake within 0.05 s" in caplog.text


# -- peers and lifecycle --------------------------------------------------------------

def test_peers_are_added_replaced_and_removed():
    async def scenario():
        a, b = await start("a"), await start("b")
        with pytest.raises(RuntimeError, match="before start"):
            ClusterTransport("z", "test", "k", LOCAL, 0, {}, print).send("b", Rpc("x", {}))
        with pytest.raises(ValueError, match="own peer"):
            a.transport.add_peer("a", b.address)
        with pytest.raises(KeyError, match="unknown cluster peer 'b'"):
            a.transport.send("b", Rpc("x", {}))
        a.transport.add_peer("b", (LOCAL, free_port()))
        a.transport.add_peer("b", b.address)                  # a new address replaces
        assert a.transport.peers() == {"b": b.address}
        a.transport.send("b", Rpc("x", {}))
        await until(lambda: len(b.got) == 1)
        a.transport.remove_peer("b")
        assert a.transport.peers() == {} and not a.transport.is_connected("b")
        with pytest.raises(KeyError):
            a.transport.send("b", Rpc("x", {}))
        a.transport.remove_peer("b")                          # idempotent
        await a.transport.stop()
        await b.transport.stop()
    run(scenario)


def test_stop_leaves_no_task_and_no_connection_behind():
    async def scenario():
        before = asyncio.all_tasks()
        a, b = await start("a"), await start("b")
        mesh(a, b)
        a.transport.add_peer("gone", (LOCAL, free_port()))   # retrying in backoff
        a.transport.send("gone", Rpc("x", {}))
        a.transport.send("b", Rpc("x", {}))
        b.transport.send("a", Rpc("y", {}))
        await until(lambda: len(b.got) == 1 and len(a.got) == 1)
        a.transport.send("b", Rpc("last", {}))                # queued, flushed by stop
        _, silent = await asyncio.open_connection(*a.address)   # no handshake yet
        await until(lambda: a.transport.stats("gone").connect_failures >= 1)
        await a.transport.stop()
        await b.transport.stop()
        await b.transport.stop()                                # idempotent
        assert asyncio.all_tasks() == before
        a.transport.send("b", Rpc("after", {}))                 # dropped, no error
        assert a.transport.stats("b").frames_dropped == 1
        assert not a.transport.is_connected("b")
        silent.close()
        await silent.wait_closed()
    run(scenario)


def test_stop_ends_a_connection_attempt_whose_cancellation_was_swallowed(monkeypatch):
    """Python 3.11's asyncio.wait_for can lose a cancellation: when the attempt it
    waits for finishes as the cancel arrives, it returns (or raises) the attempt's
    result instead. A connecting task that then caught a refused connection kept
    retrying, and stop() waited for it for ever (seen under CPU load). Here every
    cancelled attempt is turned into a refusal; stop() must still end."""
    real_wait_for = asyncio.wait_for

    async def swallowing_wait_for(awaitable, timeout):
        try:
            return await real_wait_for(awaitable, timeout)
        except asyncio.CancelledError:
            raise ConnectionRefusedError("the attempt finished as the cancel arrived")

    async def scenario():
        a = await start("a", connect_timeout=30.0)
        loop = asyncio.get_running_loop()
        attempts = []

        async def hanging_connection(*args, **kwargs):
            attempts.append(args)
            await loop.create_future()  # never answers: the task waits in wait_for

        monkeypatch.setattr(loop, "create_connection", hanging_connection)
        monkeypatch.setattr(asyncio, "wait_for", swallowing_wait_for)
        a.transport.add_peer("slow", (LOCAL, free_port()))
        a.transport.send("slow", Rpc("x", {}))
        await until(lambda: attempts)
        await real_wait_for(a.transport.stop(), 10)
        assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("cluster-")]
    run(scenario)


# -- reliable Rpcs --------------------------------------------------------------------

def test_rpcs_lost_with_a_broken_connection_arrive_once_and_in_order_after_it():
    """Rpcs written into a connection that dies (held by a stalled proxy, then reset)
    are written again on the next connection, and each reaches the peer exactly once,
    in order, however many times the link breaks."""
    from tests.support.cluster import TcpProxy

    async def scenario():
        b = await start("b")
        with TcpProxy(b.transport.port, name="a->b") as proxy:
            a = await start("a", peers={"b": (LOCAL, proxy.port)})
            b.transport.add_peer("a", a.address)  # b's acknowledgements go straight
            sent = []
            for round_number in range(3):
                for i in range(50):
                    rpc = Rpc("n", {"i": len(sent)})
                    sent.append(rpc)
                    a.transport.send("b", rpc)
                # everything so far arrived (the first time: a is connected)
                await until(lambda: len(b.sent_from("a")) == len(sent))
                proxy.cut("stall", "forward")   # what a writes now is held...
                for i in range(50):
                    rpc = Rpc("n", {"i": len(sent)})
                    sent.append(rpc)
                    a.transport.send("b", rpc)
                await until(lambda: a.transport.stats("b").queued_frames == 0)
                proxy.cut("drop")               # ...and lost with the connection
                await asyncio.sleep(0.2)
                proxy.heal()
            await until(lambda: len(b.sent_from("a")) == len(sent))
            assert b.sent_from("a") == sent
            assert a.transport.stats("b").retransmitted >= 50
            await until(lambda: a.transport.stats("b").unacked_frames == 0)
            await a.transport.stop()
        await b.transport.stop()
    run(scenario)


def test_a_restarted_peer_gets_only_what_was_sent_after_it_went_away():
    """What the peer's previous run did not acknowledge is not written to its next run
    (that run knows nothing of it); Rpcs queued while it was away are."""
    async def scenario():
        a, b = await start("a"), await start("b")
        mesh(a, b)
        b.transport._send_ack = lambda sender: None  # b stops before acknowledging them
        for i in range(5):
            a.transport.send("b", Rpc("old", {"i": i}))
        await until(lambda: len(b.got) == 5)
        port = b.transport.port
        await b.transport.stop()
        await until(lambda: a.down == ["b"])
        assert a.transport.stats("b").unacked_frames == 5
        a.transport.send("b", Rpc("new", {}))
        b2 = await start("b", port=port, peers={"a": a.address})
        await until(lambda: len(b2.got) == 1)
        assert b2.got == [("a", Rpc("new", {}))]
        await until(lambda: a.transport.stats("b").unacked_frames == 0)
        await a.transport.stop()
        await b2.transport.stop()
    run(scenario)


def test_a_peer_removed_and_added_again_gets_a_new_stream():
    """Numbering starts at 1 again for a peer added again (a node that rejoined at a
    new address): a new session, so the receiver does not take the new Rpcs for ones
    it already delivered."""
    async def scenario():
        a, b = await start("a"), await start("b")
        mesh(a, b)
        for i in range(3):
            a.transport.send("b", Rpc("first", {"i": i}))
        await until(lambda: len(b.got) == 3)
        a.transport.remove_peer("b")
        a.transport.add_peer("b", b.address)
        for i in range(2):
            a.transport.send("b", Rpc("second", {"i": i}))
        await until(lambda: len(b.got) == 5)
        assert [e.kind for e in b.sent_from("a")] == ["first"] * 3 + ["second"] * 2
        await a.transport.stop()
        await b.transport.stop()
    run(scenario)


# -- a busy peer is not a dead one ------------------------------------------------------

def test_a_busy_peer_keeps_every_frame_and_heartbeats_overtake_the_backlog():
    """A peer that reads slowly but is still talking to us (a node busy with 100
    queues) is not trimmed to the queue's bound: every append reaches it, in order;
    and a heartbeat sent behind megabytes of appends leaves before them, so no group
    loses its leader because other groups' appends are queued ahead of its heartbeat
    (the 3-node 100-queue collapse: bench/README.md, perftest_curves.py)."""
    from tests.support.cluster import TcpProxy

    async def scenario():
        b = await start("b")
        with TcpProxy(b.transport.port, name="a->b") as proxy:
            a = await start("a", peers={"b": (LOCAL, proxy.port)}, max_queued_frames=20,
                            write_high_water=64 * 1024)
            b.transport.add_peer("a", a.address)
            a.transport.send("b", Rpc("hello", {}))
            await until(lambda: len(b.got) == 1)
            proxy.cut("stall", "forward")       # b stops reading what a writes

            def over_its_bound() -> bool:
                stats = a.transport.stats("b")
                return stats.queued_frames >= 20 or stats.frames_dropped > 0

            # 64 KiB appends until the kernel's buffers are full and the transport queues: how
            # many depends on the sockets' buffer autotuning (up to net.ipv4.tcp_rmem's
            # maximum, 32 MiB on some machines); at most 1,024 (64 MiB)
            appends = []
            for i in range(1024):
                if over_its_bound():
                    break
                envelope = RaftEnvelope("%2F/q1", AppendEntries(
                    1, "a", "b", i, 1, (LogEntry(i + 1, 1, COMMAND, os.urandom(64 * 1024)),), i))
                appends.append(envelope)
                a.transport.send("b", envelope)
                if i % 20 == 0:                 # b still talks to a: busy, not dead
                    b.transport.send("a", Rpc("alive", {"i": i}))
                    await asyncio.sleep(0.01)
            await until(over_its_bound)
            heartbeat = RaftEnvelope("%2F/q2", AppendEntries(1, "a", "b", 0, 0, (), 0))
            a.transport.send("b", heartbeat)
            assert a.transport.stats("b").frames_dropped == 0
            proxy.heal()
            await until(lambda: len(b.got) == 1 + len(appends) + 1)
            got = b.sent_from("a")
            assert [e for e in got if e != heartbeat][1:] == appends
            assert got.index(heartbeat) < got.index(appends[-1])  # it overtook the queue
            assert a.transport.stats("b").frames_dropped == 0
            await a.transport.stop()
        await b.transport.stop()
    run(scenario)
