"""The asyncio shell that carries envelopes between the nodes of a cluster.

Responsibilities: listen for peers; connect to them lazily and reconnect with
backoff; queue, batch and write the frames `send` is given; check the handshake of
every accepted connection; deliver what arrives to `on_message`; count what happens
(`stats()`, for `cluster status`).

How it works: each direction has its own connection. Node A sends to B only on the
connection A opened to B (`_Outbound`); a connection A accepts (`_Inbound`) only
receives. So there is nothing to de-duplicate and a peer's frames arrive in the
order they were sent, over one TCP stream, within each of two lanes: Raft's small
messages (heartbeats, votes, answers) go in an urgent lane written before the other
frames waiting (Rpcs, appends with entries, snapshots), so one group's heartbeat
does not wait behind megabytes of other groups' appends (with 100 groups busy, that
wait outlasted the election timeout and every group lost its leader at once; Raft
does not need its messages in order). `send` encodes the envelope, appends the
frame to the peer's bounded queue (`_Outgoing`) and, if the peer is connected,
schedules one flush with `loop.call_soon`: every frame queued in this event-loop
iteration leaves in one `transport.write`, and nothing waits for an answer before
sending the next (batching and pipelining). A new connection writes the handshake
(wire.Handshake, with a random nonce) first. The accepting side answers a handshake
that names this cluster and this node with a `Challenge` (its own random nonce); the
connecting side answers with a `Proof`, an HMAC of the cookie over both nonces, the
names and the direction (wire.handshake_proof); the accepting side compares it in
constant time and, if it matches, answers with a `Resume` that carries its own proof,
which the connecting side checks in turn. Only then does the connecting side write,
and only frames after a matching proof are delivered. The cookie itself never
crosses the wire, and a proof is good for one handshake only (the nonces are new
each time), so a peer without the cookie learns nothing it can use and a recorded
answer replayed later is refused. A peer whose proof does not match is logged ("the
cookie does not match", and what to do) and closed; nothing more is read from it.

With TLS (`ssl_server` and `ssl_client`, both or neither: the cluster.tls keys,
config.py) every connection is TLS before the handshake is written: the listener
refuses a peer that does not present a certificate its CA signed, and a
connecting node refuses a listener whose certificate it cannot verify, so a plain
peer or one with another CA's certificate never gets as far as the handshake.
Without TLS the cookie still never travels, but the frames do in clear, and a
machine in the middle of a connection could relay one node's proof to another as
Erlang distribution allows too: use that on a trusted network only.

Rpcs are delivered reliably, Raft messages are not (Raft retransmits; the node's
requests, replies and deliveries do not). This node's stream of Rpcs to a peer has a
random session id (the handshake carries it; a new one for every run and every peer
added again), and the transport's own run another (its Resumes carry it). `send`
numbers every Rpc for its peer (1, 2, ...) and keeps it until the peer
acknowledges it: the receiver delivers a sender's Rpcs once each, in order, skipping
numbers it already delivered, and sends back an `RpcAck` (the highest delivered)
ACK_DELAY after receiving some. A connection that breaks may take Rpcs with it
(written, never read); the next connection's `Resume` says what the peer delivered,
and the Rpcs after that are written again before anything new. A `Resume` from a
new session of the peer (it restarted) drops what its previous run never
acknowledged instead: the node's cluster layer knows a restarted peer by its boot id
and acts on that. Across one run of each side, so, no Rpc is lost or delivered twice
while it stays within the bounds below; past them the oldest are given up and the
receiver logs the gap.

Invariants:
- `send` never blocks and never raises because a peer is unreachable or slow:
  memory per peer is bounded by the queue (`max_queued_frames`, `max_queued_bytes`
  per lane; the oldest frames are dropped and counted), the Rpcs kept for
  retransmission (the same bounds again) and the transport's write buffer (`write_high_water` plus one
  batch: while asyncio has paused writing, frames wait in the queue). Raft
  retransmits, so a dropped Raft frame costs a round, not safety. Busy is not dead:
  the bulk lane of a peer that is connected and was heard from within
  `silent_after` is not trimmed (what bounds it then is what the senders keep in
  flight: Raft's window per follower, publishers' unconfirmed messages); only a peer
  disconnected or silent for longer loses its oldest frames.
- Per peer and per run of both sides, Rpcs reach `on_message` at most once each and
  in the order sent, and every one within the bounds arrives. Raft messages keep
  their order within a lane; a small one may overtake a bulk one.
- `on_message(from_node, envelope)` runs synchronously in the event loop, in arrival
  order, only for frames after an accepted handshake, never after `stop()`.
- A peer's bad handshake or malformed frame closes that one connection with an
  error log naming the peer and the fault; the node carries on.
- After `stop()` no task, timer or connection of the transport is left.

Not here: the connection protocols and per-peer state (`links.py`); encoding and
framing (`wire.py`); what messages mean, membership and retries of requests (the
node's cluster layer); connecting to peers before the first `send`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from collections import Counter
from collections.abc import Callable

from ..cluster.wire import (COOKIE_MISMATCH, HEADER_SIZE, INITIATOR, MAX_FRAME_SIZE,
                            NONCE_SIZE, RESPONDER, Challenge, Envelope, Handshake, RaftEnvelope,
                            Resume, Rpc, RpcAck, WireError, decode, decode_handshake,
                            decode_proof, encode, encode_challenge, frame, handshake_problems,
                            handshake_proof, proofs_match)
from ..raft.messages import AppendEntries, InstallSnapshot
from .cluster_links import _COUNTERS, TransportStats, _Inbound, _Outbound, _Outgoing, _Peer

log = logging.getLogger("quorumqueue.cluster")

MiB = 1024 * 1024
ACK_DELAY = 0.05  # seconds a receiver gathers Rpcs before acknowledging them

__all__ = ["ClusterTransport", "TransportStats"]


class ClusterTransport:
    """Frames between this node and its peers; see the module docstring."""

    def __init__(self, node_name: str, cluster_name: str, cookie: str, host: str,
                 port: int, peers: dict[str, tuple[str, int]],
                 on_message: Callable[[str, Envelope], None],
                 on_peer_down: Callable[[str], None] | None = None, *,
                 max_queued_frames: int = 100_000, max_queued_bytes: int = 64 * MiB,
                 write_high_water: int = 8 * MiB, backoff_initial: float = 0.05,
                 backoff_max: float = 1.0, connect_timeout: float = 5.0,
                 silent_after: float = 5.0,
                 handshake_timeout: float = 10.0,
                 max_frame_size: int = MAX_FRAME_SIZE,
                 ssl_server: ssl.SSLContext | None = None,
                 ssl_client: ssl.SSLContext | None = None,
                 guard: Callable | None = None) -> None:
        if (ssl_server is None) != (ssl_client is None):
            raise ValueError("ssl_server and ssl_client go together (TLS both ways or none)")
        for name, value in (("max_queued_frames", max_queued_frames),
                            ("max_queued_bytes", max_queued_bytes),
                            ("write_high_water", write_high_water),
                            ("backoff_initial", backoff_initial),
                            ("connect_timeout", connect_timeout),
                            ("silent_after", silent_after),
                            ("handshake_timeout", handshake_timeout),
                            ("max_frame_size", max_frame_size)):
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        if backoff_max < backoff_initial:
            raise ValueError(f"backoff_max ({backoff_max}) must be >= backoff_initial "
                             f"({backoff_initial})")
        self.node_name = node_name
        self.cluster_name = cluster_name
        self.host = host
        self.port = port                # the bound port once started (port 0 picks one)
        self.max_queued_frames = max_queued_frames
        self.max_queued_bytes = max_queued_bytes
        self.write_high_water = write_high_water
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.connect_timeout = connect_timeout
        self.silent_after = silent_after
        self.handshake_timeout = handshake_timeout
        self.max_frame_size = max_frame_size
        self._cookie = cookie
        self._ssl_server = ssl_server
        self._ssl_client = ssl_client
        # wraps the listener's protocol factory: the node's socket limit (sockets.py)
        self._guard = guard
        self._on_message = on_message
        self._on_peer_down = on_peer_down
        self._peers: dict[str, _Peer] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._running = False           # between start() and stop()
        self._connections: set[_Connection] = set()     # every open connection
        self._retiring: set[asyncio.Task] = set()       # connect tasks of removed peers
        self._totals: Counter[str] = Counter()
        self._counters: dict[str, Counter[str]] = {}    # per peer name
        # reliable Rpcs: this run's session (in Resumes), per sender [the session of its
        # stream to us, last seq delivered] (kept across its connections), and the
        # senders owed an RpcAck
        self.session = int.from_bytes(os.urandom(7), "big") | 1
        self._senders: dict[str, list[int]] = {}
        self._acks_due: set[str] = set()
        for name, address in peers.items():
            self.add_peer(name, address)

    # -- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        """Listen on host:port; `.port` is the bound port afterwards."""
        if self._loop is not None:
            raise RuntimeError("ClusterTransport.start() called twice")
        self._loop = asyncio.get_running_loop()
        def inbound() -> _Inbound:
            return _Inbound(self)

        factory = inbound if self._guard is None else self._guard(inbound, "inter-node")
        self._server = await self._loop.create_server(
            factory, self.host, self.port, reuse_address=True,
            ssl=self._ssl_server,
            ssl_handshake_timeout=self.handshake_timeout if self._ssl_server else None)
        self.port = self._server.sockets[0].getsockname()[1]
        self._running = True
        log.info("node %r listening for cluster %r on %s:%d", self.node_name,
                 self.cluster_name, self.host, self.port)

    async def stop(self, grace: float = 1.0) -> None:
        """Close the listener, cancel connection attempts, write what is queued to
        connected peers, close every connection (aborting those not closed within
        `grace` seconds). Queued frames of unconnected peers are discarded."""
        if not self._running:
            return
        self._running = False
        self._server.close()
        tasks = [peer.connect_task for peer in self._peers.values() if peer.connect_task]
        tasks += self._retiring
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for peer in self._peers.values():
            if peer.flush_handle is not None:
                peer.flush_handle.cancel()
            self._flush(peer, ignore_pause=True)
            peer.outgoing.take()
        connections = list(self._connections)
        for connection in connections:
            connection.transport.close()
        if connections:
            _, slow = await asyncio.wait([c.closed for c in connections], timeout=grace)
            for connection in connections:
                if not connection.closed.done():
                    connection.transport.abort()
            if slow:
                await asyncio.wait(slow)
        await self._server.wait_closed()
        log.info("node %r stopped its cluster transport", self.node_name)

    # -- peers ------------------------------------------------------------------------

    def add_peer(self, name: str, address: tuple[str, int]) -> None:
        """Know `name` at `address`. A known peer given a new address is replaced
        (its connection closed, its queue dropped); the same address changes nothing."""
        if name == self.node_name:
            raise ValueError(f"node {name!r} cannot be its own peer")
        host, port = address
        if not isinstance(host, str) or not isinstance(port, int) or not 0 < port < 65536:
            raise ValueError(f"peer {name!r} address must be (host, port), got {address!r}")
        current = self._peers.get(name)
        if current is not None:
            if current.address == (host, port):
                return
            self.remove_peer(name)
        self._peers[name] = _Peer(name, (host, port),
                                  _Outgoing(self.max_queued_frames, self.max_queued_bytes))

    def remove_peer(self, name: str) -> None:
        """Forget `name`: stop connecting, close our connection to it, drop its queue.
        Connections it opened to us stay (they are only read from)."""
        peer = self._peers.pop(name, None)
        if peer is None:
            return
        if peer.connect_task is not None:
            peer.connect_task.cancel()
            self._retiring.add(peer.connect_task)
            peer.connect_task.add_done_callback(self._retiring.discard)
        if peer.flush_handle is not None:
            peer.flush_handle.cancel()
        if peer.link is not None:
            peer.link.transport.close()
        peer.outgoing.take()

    def peers(self) -> dict[str, tuple[str, int]]:
        return {name: peer.address for name, peer in self._peers.items()}

    def is_connected(self, peer: str) -> bool:
        """Whether our connection to `peer` is open (handshake written; a peer that
        refuses the handshake closes it again)."""
        state = self._peers.get(peer)
        return (state is not None and state.link is not None
                and not state.link.transport.is_closing())

    def stats(self, peer: str | None = None) -> TransportStats:
        """Counters for one peer, or totals over all peers (and unknown senders)."""
        counter = self._totals if peer is None else self._counters.get(peer, Counter())
        peers = self._peers.values() if peer is None else (
            [self._peers[peer]] if peer in self._peers else [])
        return TransportStats(**{name: counter[name] for name in _COUNTERS},
                              queued_frames=sum(len(p.outgoing) for p in peers),
                              queued_bytes=sum(p.outgoing.bytes + p.outgoing.urgent_bytes
                                               for p in peers),
                              buffered_bytes=sum(p.link.transport.get_write_buffer_size()
                                                 for p in peers if p.link is not None),
                              unacked_frames=sum(len(p.unacked) for p in peers))

    # -- sending ----------------------------------------------------------------------

    def call_soon(self, callback: Callable[[], None]) -> None:
        """Run `callback` on the transport's loop at its next iteration (the node's
        cluster layer gathers what it sends in one iteration this way)."""
        if self._loop is None:
            raise RuntimeError("ClusterTransport.call_soon() before start()")
        self._loop.call_soon(callback)

    def send(self, peer: str, envelope: Envelope) -> None:
        """Queue `envelope` for `peer`; it leaves with this iteration's batch once
        connected. Raises KeyError for an unknown peer and WireError for an envelope
        that cannot be encoded or framed; after stop() the envelope is dropped."""
        if self._loop is None:
            raise RuntimeError("ClusterTransport.send() before start()")
        state = self._peers.get(peer)
        if state is None:
            raise KeyError(f"unknown cluster peer {peer!r}; known peers: "
                           f"{sorted(self._peers)}")
        if not self._running:
            self._count(peer, "frames_dropped")
            return
        if type(envelope) is Rpc:  # numbered, and kept until the peer acknowledges it
            state.rpc_seq += 1
            data = frame(encode(Rpc(envelope.kind, envelope.body, state.rpc_seq)),
                         self.max_frame_size)
            self._keep_unacked(state, state.rpc_seq, data)
        else:
            data = frame(encode(envelope), self.max_frame_size)
            if type(envelope) is RaftEnvelope:
                message = envelope.message
                kind = type(message)
                urgent = not (kind is InstallSnapshot
                              or (kind is AppendEntries and message.entries))
                self._queue(state, data, urgent)
                return
        self._queue(state, data)

    def _queue(self, state: _Peer, data: bytes, urgent: bool = False) -> None:
        peer = state.name
        # a peer connected and heard from within silent_after is busy, not dead: its
        # bulk lane keeps every frame (what bounds it then is what the senders keep in
        # flight: Raft's window per follower, the publishers' unconfirmed messages);
        # dropping them would only make Raft send them again
        may_drop = (state.link is None
                    or self._loop.time() - state.last_heard > self.silent_after)
        dropped = state.outgoing.push(data, urgent, may_drop)
        if dropped:
            self._count(peer, "frames_dropped", dropped)
            if not state.dropping:
                state.dropping = True
                log.warning("queue for peer %r is full (%d frames, %d bytes): dropping "
                            "the oldest frames", peer, len(state.outgoing),
                            state.outgoing.bytes + state.outgoing.urgent_bytes)
        if state.link is not None:
            self._schedule_flush(state)
        else:
            self._ensure_connecting(state)

    def _keep_unacked(self, peer: _Peer, seq: int, data: bytes) -> None:
        """Keep a sent Rpc until acknowledged, within the queue's bounds (the oldest
        given up first: the receiver then sees a gap)."""
        unacked = peer.unacked
        unacked.append((seq, data))
        peer.unacked_bytes += len(data)
        while ((len(unacked) > self.max_queued_frames
                or peer.unacked_bytes > self.max_queued_bytes) and len(unacked) > 1):
            peer.unacked_bytes -= len(unacked.popleft()[1])
            self._count(peer.name, "frames_dropped")

    def _acknowledged(self, peer: _Peer, seq: int) -> None:
        unacked = peer.unacked
        while unacked and unacked[0][0] <= seq:
            peer.unacked_bytes -= len(unacked.popleft()[1])

    def _schedule_flush(self, peer: _Peer) -> None:
        if peer.flush_handle is None and len(peer.outgoing) and self._running:
            peer.flush_handle = self._loop.call_soon(self._flush, peer)

    def _flush(self, peer: _Peer, ignore_pause: bool = False) -> None:
        peer.flush_handle = None
        link = peer.link
        if (link is None or link.transport.is_closing() or (link.paused and not ignore_pause)
                or not len(peer.outgoing)):
            return
        frames = peer.outgoing.take()
        peer.written_seq = peer.rpc_seq  # every numbered Rpc was written or dropped
        peer.dropping = False
        data = frames[0] if len(frames) == 1 else b"".join(frames)
        link.transport.write(data)
        self._count(peer.name, "frames_sent", len(frames))
        self._count(peer.name, "bytes_sent", len(data))
        self._count(peer.name, "writes")

    def _hello(self, peer: _Peer) -> Handshake:
        """The handshake a new connection to `peer` opens with (a fresh nonce)."""
        return Handshake(self.cluster_name, self.node_name, peer.name, peer.session,
                         os.urandom(NONCE_SIZE))

    def _proof(self, role: str, hello: Handshake, challenge: bytes) -> bytes:
        return handshake_proof(self._cookie, role, hello, challenge)

    # -- connecting -------------------------------------------------------------------

    def _ensure_connecting(self, peer: _Peer) -> None:
        if peer.link is None and peer.connect_task is None and self._running:
            peer.connect_task = self._loop.create_task(
                self._connect(peer), name=f"cluster-connect-{self.node_name}-{peer.name}")

    async def _connect(self, peer: _Peer) -> None:
        """Attempt until a connection is made or the transport stops, waiting
        `peer.delay` before each. `_running` is checked on every turn, not only the
        task's cancellation: Python 3.11's asyncio.wait_for loses a cancellation that
        arrives as the attempt finishes (it returns or raises the attempt's result)."""
        try:
            while self._running:
                if peer.delay:
                    await asyncio.sleep(peer.delay)
                    if not self._running:
                        return
                host, port = peer.address
                try:
                    _, link = await asyncio.wait_for(
                        self._loop.create_connection(
                            lambda: _Outbound(self, peer), host, port, ssl=self._ssl_client,
                            server_hostname=host if self._ssl_client else None),
                        self.connect_timeout)
                except (OSError, TimeoutError) as exc:
                    self._connect_failed(peer, exc)
                    continue
                if not link.lost:
                    return
                # lost before this task resumed: _link_lost set the delay; try again
        finally:
            peer.connect_task = None

    def _connect_failed(self, peer: _Peer, exc: BaseException) -> None:
        self._count(peer.name, "connect_failures")
        peer.failures += 1
        peer.delay = self._next_delay(peer.delay)
        reason = str(exc) or type(exc).__name__
        if peer.failures == 1:
            log.warning("cannot connect to peer %r at %s:%d (%s); retrying with backoff "
                        "up to %.1f s", peer.name, *peer.address, reason, self.backoff_max)
        else:
            log.debug("connection attempt %d to peer %r failed: %s", peer.failures,
                      peer.name, reason)
        self._report_down(peer)

    def _next_delay(self, delay: float) -> float:
        return min(max(delay * 2, self.backoff_initial), self.backoff_max)

    def _link_made(self, link: _Outbound, resume: Resume) -> None:
        """The peer answered our handshake: write again what it has not acknowledged
        (if it is the same run of the peer), then everything queued."""
        peer = link.peer
        if peer.pending_link is link:
            peer.pending_link = None
        if not self._running or self._peers.get(peer.name) is not peer:
            link.transport.close()
            return
        again: list[bytes] = []
        if peer.remote_session is not None and resume.session != peer.remote_session:
            # the peer restarted: what its previous run did not acknowledge went with
            # it (the node's cluster layer handles a restarted peer); nothing written
            # to that run is sent to this one
            while peer.unacked and peer.unacked[0][0] <= peer.written_seq:
                peer.unacked_bytes -= len(peer.unacked.popleft()[1])
        else:
            self._acknowledged(peer, resume.delivered)
            again = [data for seq, data in peer.unacked if seq <= peer.written_seq]
        peer.remote_session = resume.session
        peer.link = link
        if again:
            data = b"".join(again)
            link.transport.write(data)
            self._count(peer.name, "retransmitted", len(again))
            self._count(peer.name, "frames_sent", len(again))
            self._count(peer.name, "bytes_sent", len(data))
            self._count(peer.name, "writes")
        if peer.ever_connected:
            self._count(peer.name, "reconnects")
        log.info("connected to peer %r at %s:%d%s", peer.name, *peer.address,
                 f" after {peer.failures} failed attempts" if peer.failures else "")
        peer.ever_connected = True
        peer.down_reported = False
        peer.failures = 0
        self._schedule_flush(peer)

    def _link_lost(self, link: _Outbound, exc: BaseException | None) -> None:
        peer = link.peer
        if peer.pending_link is link:  # closed before it answered the handshake
            peer.pending_link = None
            if self._running and self._peers.get(peer.name) is peer:
                self._connect_failed(peer, exc or ConnectionError("closed before it "
                                                                   "answered the handshake"))
                self._ensure_connecting(peer)
            return
        if peer.link is not link:
            return
        peer.link = None
        if not self._running or self._peers.get(peer.name) is not peer:
            return
        lived = self._loop.time() - link.made_at
        # A connection that lived restarts the backoff; one closed at once (a refused
        # handshake, a crashing peer) keeps doubling it.
        peer.delay = (self.backoff_initial if lived >= self.backoff_max
                      else self._next_delay(peer.delay))
        log.warning("lost connection to peer %r at %s:%d (%s); reconnecting", peer.name,
                    *peer.address, exc or "closed by the peer")
        self._report_down(peer)
        self._ensure_connecting(peer)

    def _report_down(self, peer: _Peer) -> None:
        if peer.down_reported or self._on_peer_down is None:
            return
        peer.down_reported = True
        try:
            self._on_peer_down(peer.name)
        except Exception:
            log.exception("on_peer_down(%r) raised", peer.name)

    # -- receiving --------------------------------------------------------------------

    def _received(self, conn: _Inbound, data: bytes) -> None:
        if not self._running:
            return
        if conn.from_node is not None:
            peer = self._peers.get(conn.from_node)
            if peer is not None:
                peer.last_heard = self._loop.time()
        try:
            payloads = conn.reader.feed(data)
        except WireError as exc:
            self._close_malformed(conn, exc)
            return
        for payload in payloads:
            if not self._running or conn.transport.is_closing():
                return
            if conn.from_node is None:
                if not self._accept_handshake(conn, payload):
                    return
                continue
            try:
                envelope = decode(payload)
                if type(envelope) is Resume:
                    raise WireError("a Resume after the handshake")
            except WireError as exc:
                self._close_malformed(conn, exc)
                return
            self._count(conn.from_node, "frames_received")
            self._count(conn.from_node, "bytes_received", HEADER_SIZE + len(payload))
            if type(envelope) is Rpc and envelope.seq:
                sender = conn.sender
                if envelope.seq <= sender[1]:
                    self._count(conn.from_node, "duplicates")
                    continue
                if sender[1] and envelope.seq != sender[1] + 1:
                    self._count(conn.from_node, "gaps")
                    log.warning("%d messages from peer %r were lost (its queue for this "
                                "node overflowed)", envelope.seq - sender[1] - 1,
                                conn.from_node)
                sender[1] = envelope.seq
                self._ack_later(conn.from_node)
            elif type(envelope) is RpcAck:
                peer = self._peers.get(conn.from_node)
                if peer is not None and envelope.session == peer.session:
                    self._acknowledged(peer, envelope.seq)
                continue
            self._on_message(conn.from_node, envelope)

    def _accept_handshake(self, conn: _Inbound, payload: bytes) -> bool:
        """The connection's first frames: its Handshake, answered with a Challenge;
        then its Proof, answered (if it proves the cookie) with a Resume carrying this
        node's proof. False: refused and closed, nothing more read from it."""
        if conn.hello is None:
            try:
                hello = decode_handshake(payload)
            except WireError as exc:
                return self._refuse(conn, "", str(exc))
            problems = handshake_problems(hello, cluster_name=self.cluster_name,
                                          node_name=self.node_name)
            if problems:
                return self._refuse(conn, hello.from_node, "; ".join(problems))
            conn.hello, conn.challenge = hello, os.urandom(NONCE_SIZE)
            conn.transport.write(frame(encode_challenge(Challenge(conn.challenge))))
            return True
        hello = conn.hello
        try:
            proof = decode_proof(payload)
        except WireError as exc:
            return self._refuse(conn, hello.from_node, str(exc))
        if not proofs_match(proof.digest, self._proof(INITIATOR, hello, conn.challenge)):
            return self._refuse(conn, hello.from_node, COOKIE_MISMATCH)
        conn.from_node = hello.from_node
        conn.reader.max_frame_size = self.max_frame_size   # a peer now: whole frames
        conn.timer.cancel()
        sender = self._senders.get(hello.from_node)
        if sender is None or sender[0] != hello.session:  # a new run of that node
            sender = self._senders[hello.from_node] = [hello.session, 0]
        conn.sender = sender
        conn.transport.write(frame(encode(Resume(
            self.session, sender[1], self._proof(RESPONDER, hello, conn.challenge)))))
        log.debug("accepted cluster connection from node %r at %s", conn.from_node,
                  conn.address)
        return True

    def _refuse(self, conn: _Inbound, from_node: str, why: str) -> bool:
        who = f"node {from_node!r} at " if from_node else ""
        log.error("refused cluster connection from %s%s: %s", who, conn.address, why)
        self._totals["refused"] += 1
        conn.transport.close()
        return False

    def _close_malformed(self, conn: _Inbound, exc: WireError) -> None:
        who = f"node {conn.from_node!r} at " if conn.from_node else ""
        log.error("closing cluster connection from %s%s: malformed frame: %s", who,
                  conn.address, exc)
        if conn.from_node:
            self._count(conn.from_node, "malformed")
        else:
            self._totals["malformed"] += 1
        conn.transport.close()

    def _ack_later(self, sender: str) -> None:
        if sender not in self._acks_due:
            self._acks_due.add(sender)
            self._loop.call_later(ACK_DELAY, self._send_ack, sender)

    def _send_ack(self, sender: str) -> None:
        self._acks_due.discard(sender)
        state, peer = self._senders.get(sender), self._peers.get(sender)
        if state is None or peer is None or not self._running:
            return
        self._queue(peer, frame(encode(RpcAck(state[0], state[1]))))

    def _count(self, peer: str, name: str, amount: int = 1) -> None:
        self._totals[name] += amount
        counter = self._counters.get(peer)
        if counter is None:
            counter = self._counters[peer] = Counter()
        counter[name] += amount
