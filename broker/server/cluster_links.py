"""The connections and per-peer state behind the cluster transport (transport.py).

Responsibilities: the counters a transport keeps (`TransportStats`); one peer's queue
of frames not yet written (`_Outgoing`, bounded, oldest dropped first) and what this
node knows about sending to it (`_Peer`: its connection, backoff, and the reliable
Rpcs it has not acknowledged); the two asyncio protocols: `_Outbound`, the
connection this node opens to a peer (writes the handshake, answers the peer's
Challenge with a Proof, checks the peer's proof in its `Resume`, then only writes),
and `_Inbound`, a connection a peer opened (reads frames, hands them to the
transport, which challenges the handshake and checks the proof).

How it works and the invariants: transport.py's module docstring (the reliable Rpc
protocol, the bounds); these classes hold state and call back into their
ClusterTransport (`owner`), which decides.

Not here: sending, connecting, receiving and acknowledging (transport.py), the wire
format (wire.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import deque
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from ..cluster.wire import (COOKIE_MISMATCH, HANDSHAKE_MAX_FRAME_SIZE, INITIATOR, RESPONDER,
                            FrameReader, Handshake, Proof, Resume, WireError, decode,
                            decode_challenge, encode_handshake, encode_proof, frame,
                            proofs_match)

if TYPE_CHECKING:  # pragma: no cover
    from .cluster_transport import ClusterTransport

log = logging.getLogger("quorumqueue.cluster")

@dataclass(frozen=True, slots=True)
class TransportStats:
    frames_sent: int = 0        # frames written to a connection (one lost with it is lost)
    bytes_sent: int = 0         # their bytes, frame headers included
    writes: int = 0             # transport.write calls that carried them (batches)
    frames_received: int = 0    # frames delivered to on_message
    bytes_received: int = 0     # their bytes, frame headers included
    frames_dropped: int = 0     # oldest frames dropped from a full queue
    reconnects: int = 0         # connections made again after a failure or a loss
    connect_failures: int = 0   # connection attempts that failed
    refused: int = 0            # accepted connections closed for a bad handshake
    malformed: int = 0          # accepted connections closed for a malformed frame
    queued_frames: int = 0      # now: frames waiting for a connection or for the buffer
    queued_bytes: int = 0       # now: their bytes
    buffered_bytes: int = 0     # now: bytes in connections' write buffers (back-pressure)
    retransmitted: int = 0      # Rpcs written again on a new connection (not acknowledged)
    duplicates: int = 0         # Rpcs received again and not delivered a second time
    gaps: int = 0               # times Rpcs were missing (the sender dropped them: bounds)
    unacked_frames: int = 0     # now: Rpcs sent and not yet acknowledged by the peer


_GAUGES = ("queued_frames", "queued_bytes", "buffered_bytes", "unacked_frames")
_COUNTERS = tuple(f.name for f in fields(TransportStats) if f.name not in _GAUGES)


class _Outgoing:
    """One peer's frames not yet written, in two lanes: `urgent` (Raft's small
    messages: heartbeats, votes, answers) leaves before `frames` (everything else,
    in the order sent), so a group's heartbeat never waits behind megabytes of other
    groups' appends. Each lane is bounded on its own, the oldest dropped first; the
    bulk lane only when the caller allows it (a peer that is busy, not dead, keeps
    its frames: transport.py). A single frame larger than the byte bound is kept
    (alone): frames are bounded by wire's maximum frame size instead."""

    __slots__ = ("frames", "bytes", "urgent", "urgent_bytes", "max_frames", "max_bytes")

    def __init__(self, max_frames: int, max_bytes: int) -> None:
        self.frames: deque[bytes] = deque()
        self.bytes = 0                 # == sum(map(len, self.frames))
        self.urgent: deque[bytes] = deque()
        self.urgent_bytes = 0          # == sum(map(len, self.urgent))
        self.max_frames = max_frames
        self.max_bytes = max_bytes

    def __len__(self) -> int:
        return len(self.frames) + len(self.urgent)

    def push(self, data: bytes, urgent: bool = False, may_drop: bool = True) -> int:
        """Queue `data`; returns how many older frames were dropped to make room."""
        dropped = 0
        if urgent:
            lane = self.urgent
            lane.append(data)
            self.urgent_bytes += len(data)
            while ((len(lane) > self.max_frames or self.urgent_bytes > self.max_bytes)
                   and len(lane) > 1):
                self.urgent_bytes -= len(lane.popleft())
                dropped += 1
            return dropped
        frames = self.frames
        frames.append(data)
        self.bytes += len(data)
        if may_drop:
            while ((len(frames) > self.max_frames or self.bytes > self.max_bytes)
                   and len(frames) > 1):
                self.bytes -= len(frames.popleft())
                dropped += 1
        return dropped

    def take(self) -> list[bytes]:
        """Every queued frame, the urgent ones first."""
        frames = list(self.urgent)
        frames.extend(self.frames)
        self.urgent.clear()
        self.frames.clear()
        self.bytes = self.urgent_bytes = 0
        return frames


class _Peer:
    """What this node knows about sending to one peer."""

    __slots__ = ("name", "address", "outgoing", "link", "connect_task", "flush_handle",
                 "delay", "ever_connected", "down_reported", "failures", "dropping",
                 "pending_link", "rpc_seq", "written_seq", "unacked", "unacked_bytes",
                 "remote_session", "session", "last_heard")

    def __init__(self, name: str, address: tuple[str, int], outgoing: _Outgoing) -> None:
        self.name = name
        self.address = address
        self.outgoing = outgoing
        self.link: _Outbound | None = None     # the open outbound connection, if any
        self.connect_task: asyncio.Task | None = None   # at most one at a time
        self.flush_handle: asyncio.Handle | None = None  # at most one flush scheduled
        self.delay = 0.0                # wait before the next connection attempt
        self.ever_connected = False
        self.down_reported = False      # on_peer_down called for the current outage
        self.failures = 0               # failed attempts in the current outage
        self.dropping = False           # drops logged for the current full spell
        self.pending_link: _Outbound | None = None  # connected, its Resume not yet read
        # reliable Rpcs (module docstring): numbered from 1 in this transport's session
        self.rpc_seq = 0                # the last number given
        self.written_seq = 0            # every Rpc up to here was written (or dropped)
        self.unacked: deque[tuple[int, bytes]] = deque()  # (seq, frame), oldest first
        self.unacked_bytes = 0
        self.remote_session: int | None = None  # the peer's run, from its last Resume
        # this node's stream of numbered Rpcs to the peer: a new one with every _Peer
        # (a peer removed and added again starts numbering at 1 in a new session)
        self.session = int.from_bytes(os.urandom(7), "big") | 1
        self.last_heard = float("-inf")  # loop time of the last bytes it sent us


class _Connection(asyncio.Protocol):
    def __init__(self, owner: ClusterTransport) -> None:
        self.owner = owner
        self.transport: asyncio.Transport | None = None
        self.closed = owner._loop.create_future()   # resolved by connection_lost
        self.made_at = 0.0

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.made_at = self.owner._loop.time()
        self.owner._connections.add(self)

    def connection_lost(self, exc) -> None:
        self.owner._connections.discard(self)
        if not self.closed.done():
            self.closed.set_result(None)


class _Outbound(_Connection):
    """Our connection to a peer: writes the handshake, answers the peer's Challenge
    with a Proof, checks the peer's proof in its Resume, then only writes."""

    def __init__(self, owner: ClusterTransport, peer: _Peer) -> None:
        super().__init__(owner)
        self.peer = peer
        self.paused = False             # asyncio's write buffer is over the high-water mark
        self.lost = False
        # the peer answers only its Challenge and Resume: handshake-sized frames
        self.reader: FrameReader | None = FrameReader(
            min(owner.max_frame_size, HANDSHAKE_MAX_FRAME_SIZE))
        self.timer: asyncio.TimerHandle | None = None
        self.hello: Handshake | None = None     # what this connection opened with
        self.challenge: bytes | None = None     # the peer's nonce, once it sent one

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        transport.set_write_buffer_limits(high=self.owner.write_high_water)
        self.hello = self.owner._hello(self.peer)
        transport.write(frame(encode_handshake(self.hello)))
        self.peer.pending_link = self
        self.timer = self.owner._loop.call_later(self.owner.handshake_timeout,
                                                 self._resume_timed_out)

    def data_received(self, data: bytes) -> None:
        if self.reader is None:
            log.error("peer %r sent %d bytes on this node's outbound connection, which "
                      "only writes once resumed; closing it", self.peer.name, len(data))
            self.transport.close()
            return
        try:
            payloads = self.reader.feed(data)
        except WireError as exc:
            self._refuse(f"it answered this node's handshake with a malformed frame ({exc})")
            return
        for payload in payloads:
            if self.reader is None:     # resumed: the peer says nothing more
                self._refuse("it sent more after its Resume")
                return
            if self.challenge is None:  # the peer's Challenge: prove the cookie
                try:
                    self.challenge = decode_challenge(payload).nonce
                except WireError as exc:
                    self._refuse(f"it answered this node's handshake with something "
                                 f"other than a Challenge ({exc})")
                    return
                self.transport.write(frame(encode_proof(Proof(self.owner._proof(
                    INITIATOR, self.hello, self.challenge)))))
                continue
            try:
                resume = decode(payload)
            except WireError as exc:
                resume = exc
            if not isinstance(resume, Resume):
                what = resume if isinstance(resume, WireError) else type(resume).__name__
                self._refuse(f"it answered this node's proof with something other than "
                             f"a Resume ({what})")
                return
            if not proofs_match(resume.proof, self.owner._proof(RESPONDER, self.hello,
                                                                 self.challenge)):
                self._refuse(f"it did not prove the cookie: {COOKIE_MISMATCH}")
                return
            self.reader = None
            self.timer.cancel()
            self.owner._link_made(self, resume)

    def _refuse(self, why: str) -> None:
        log.error("closing the connection to peer %r at %s:%d: %s", self.peer.name,
                  *self.peer.address, why)
        self.reader = None
        self.transport.close()

    def _resume_timed_out(self) -> None:
        log.error("closing the connection to peer %r: no answer to the handshake within "
                  "%g s", self.peer.name, self.owner.handshake_timeout)
        self.transport.close()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self.owner._schedule_flush(self.peer)

    def connection_lost(self, exc) -> None:
        self.lost = True
        if self.timer is not None:
            self.timer.cancel()
        super().connection_lost(exc)
        self.owner._link_lost(self, exc)


class _Inbound(_Connection):
    """A connection a peer opened to us: reads only."""

    def __init__(self, owner: ClusterTransport) -> None:
        super().__init__(owner)
        # handshake-sized frames until the peer proves the cookie (then max_frame_size)
        self.reader = FrameReader(min(owner.max_frame_size, HANDSHAKE_MAX_FRAME_SIZE))
        self.hello: Handshake | None = None  # its handshake, once read and challenged
        self.challenge: bytes | None = None  # the nonce this node challenged it with
        self.from_node: str | None = None   # set once its proof of the cookie checks
        self.sender: list[int] | None = None  # [its session, last Rpc seq delivered]
        self.address = "?"
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        peername = transport.get_extra_info("peername") or ("?", 0)
        self.address = f"{peername[0]}:{peername[1]}"
        if not self.owner._running:          # accepted while stop() was closing
            transport.close()
            return
        self.timer = self.owner._loop.call_later(self.owner.handshake_timeout,
                                                 self._handshake_timed_out)

    def data_received(self, data: bytes) -> None:
        self.owner._received(self, data)

    def _handshake_timed_out(self) -> None:
        log.error("closing cluster connection from %s: no handshake within %g s",
                  self.address, self.owner.handshake_timeout)
        self.transport.close()

    def connection_lost(self, exc) -> None:
        if self.timer is not None:
            self.timer.cancel()
        super().connection_lost(exc)
