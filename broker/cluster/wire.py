"""What crosses between cluster nodes, as bytes: envelopes, the handshake, framing.

Responsibilities: the closed vocabulary of the inter-node wire (`RaftEnvelope`,
`Rpc`, and the `Handshake`, `Challenge`, `Proof` and `Resume` that open every
connection); encoding it with msgpack and decoding it back with every field
checked; the proofs of the cookie (`handshake_proof`, `proofs_match`);
length-prefixed framing and an incremental `FrameReader`; saying what in a
handshake does not match this node. No I/O, no clock, no randomness (the transport
draws the nonces), no state beyond the reader's buffer.

How it works: every envelope is one msgpack array whose first item is a small
integer tag. A Raft message is positional, `[tag, group, term, from_, to, ...the
other fields in dataclass order]`, laid out by `_LAYOUTS`, the one table both
directions read. A log entry is `[index, term, kind, data]` and a SnapshotMeta
`[index, term, [members...]]`. An Rpc is `[RPC_TAG, kind, body]`, or `[RPC_TAG, kind,
body, seq]` when the transport numbered it (reliable delivery: server/cluster_transport.py), and an
`RpcAck` (the receiver delivered a session's Rpcs up to seq) `[ACK_TAG, session, seq]`.
The handshake has a shape of its own, `[MAGIC, VERSION, cluster_name, from_node,
to_node, session, nonce]`, so neither is ever taken for the other. It proves the
cookie without sending it, as Erlang distribution's handshake does: the accepting
side answers with a `Challenge` `[CHALLENGE_TAG, nonce]` of its own, the connecting
side with a `Proof` `[PROOF_TAG, digest]`, and the accepting side, once the digest
checks, with a `Resume` `[RESUME_TAG, session, delivered, digest]` that carries its
own proof. Each digest is HMAC-SHA256 keyed by the cookie (its SHA-256) over both
nonces, the cluster name, both node names and the direction (`handshake_proof`),
compared in constant time (`proofs_match`): a node that does
not hold the cookie sees only random nonces and digests it cannot reuse (the next
handshake has other nonces; a digest for one direction is not one for the other).
Strings travel as msgpack str, bytes as bin (use_bin_type=True, raw=False). A frame
is a 4-byte big-endian payload length and the payload.

Invariants: `decode(encode(e)) == e` for every valid envelope (tuples come back
where the dataclasses hold tuples; an Rpc body holds lists, never tuples, so it
round-trips too). `decode` checks every field's type (Raft integers are
non-negative ints, never bools), so whatever it returns is safe to step into the
Raft core. Every failure, on either side, is a `WireError` with a message naming
the field; nothing from msgpack escapes. A frame longer than the maximum is
refused as soon as its header arrives, before it is buffered.

Not here: sockets, queues, retries, back-pressure (`server/cluster_transport.py`); what the Rpc
kinds mean (the node's cluster layer); chunking of big snapshots (a snapshot
travels in one InstallSnapshot, so it must fit in one frame).
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass, field, fields
from typing import Any, TypeAlias

import msgpack

from ..raft.messages import (AppendEntries, AppendEntriesResponse, InstallSnapshot,
                             InstallSnapshotResponse, Message, RequestVote,
                             RequestVoteResponse, TimeoutNow)
from ..raft.types import LogEntry, SnapshotMeta

MAX_FRAME_SIZE = 256 * 1024 * 1024   # bytes of payload; the reader refuses more
# ... until the peer has proved the cookie: the handshake's frames (Handshake,
# Challenge, Proof, Resume) are small, so a stranger cannot make a node buffer more
# (Erlang distribution's handshake messages carry 16-bit lengths, the same bound)
HANDSHAKE_MAX_FRAME_SIZE = 65535
MAGIC = "quorumqueue-cluster"        # first item of a handshake
# the wire version this module speaks: 3 since forwarded commands travel in batches
# (a "propose" Rpc carries lists: broker/cluster/cluster.py), 4 since the handshake
# proves the cookie by challenge and response instead of sending it, 5 since an
# AppendEntries carries `quiet` (raft/messages.py)
VERSION = 5
RPC_TAG = 16                         # tags 1..7 are the Raft messages (_LAYOUTS)
ACK_TAG = 17
RESUME_TAG = 18
CHALLENGE_TAG = 19                   # handshake only: never decoded by `decode`
PROOF_TAG = 20
NONCE_SIZE = 32                      # bytes of every handshake nonce (os.urandom)
DIGEST_SIZE = 32                     # bytes of an HMAC-SHA256 digest

_HEADER = struct.Struct(">I")
HEADER_SIZE = _HEADER.size


class WireError(ValueError):
    """Bytes that are not a valid frame, envelope or handshake (or a value that
    cannot be encoded). The message names what was wrong."""


@dataclass(frozen=True, slots=True)
class RaftEnvelope:
    group: str                 # the Raft group (metadata group or a queue's uid)
    message: Message


@dataclass(frozen=True, slots=True)
class Rpc:
    kind: str                  # what the node-level request or reply is
    body: dict[Any, Any]       # str, int (-2^63 .. 2^64-1), float, bytes, bool, None,
                               # lists and dicts of them; no tuples
    # the sending transport's number for it within its session (0: not numbered);
    # not part of what the Rpc says, so not compared
    seq: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class RpcAck:
    """The receiver delivered every Rpc of the sender's `session` up to `seq`."""
    session: int
    seq: int


@dataclass(frozen=True, slots=True)
class Resume:
    """The accepting side's answer to a proven handshake: its own session (one per
    run), the last Rpc seq it delivered from the connecting node's session (0: none),
    and its own proof of the cookie (`handshake_proof`, role RESPONDER)."""
    session: int
    delivered: int
    proof: bytes = field(repr=False)


Envelope: TypeAlias = RaftEnvelope | Rpc | RpcAck | Resume


@dataclass(frozen=True, slots=True)
class Handshake:
    """The first frame of a connection (the connecting side's)."""
    cluster_name: str
    from_node: str             # the connecting node
    to_node: str               # the node it means to reach
    session: int = 0           # the connecting transport's session (one per run)
    nonce: bytes = b""         # NONCE_SIZE random bytes: the accepting side's challenge


@dataclass(frozen=True, slots=True)
class Challenge:
    """The accepting side's answer to a Handshake: its nonce, for the connecting side
    to prove the cookie over."""
    nonce: bytes


@dataclass(frozen=True, slots=True)
class Proof:
    """The connecting side's answer to a Challenge (`handshake_proof`, role INITIATOR)."""
    digest: bytes = field(repr=False)


INITIATOR, RESPONDER = "initiator", "responder"   # who proves, in `handshake_proof`


# -- Raft message layouts -------------------------------------------------------------

_NAT, _STR, _BOOL, _ENTRIES, _META, _OPT_BYTES = "nat", "str", "bool", "entries", "meta", "opt_bytes"

_COMMON = (("term", _NAT), ("from_", _STR), ("to", _STR))
_LAYOUTS: dict[type, tuple[int, tuple[tuple[str, str], ...]]] = {
    RequestVote: (1, _COMMON + (("last_index", _NAT), ("last_term", _NAT),
                                ("pre_vote", _BOOL), ("leadership_transfer", _BOOL))),
    RequestVoteResponse: (2, _COMMON + (("granted", _BOOL), ("pre_vote", _BOOL))),
    AppendEntries: (3, _COMMON + (("prev_index", _NAT), ("prev_term", _NAT),
                                  ("entries", _ENTRIES), ("leader_commit", _NAT),
                                  ("quiet", _BOOL))),
    AppendEntriesResponse: (4, _COMMON + (("success", _BOOL), ("match_index", _NAT),
                                          ("rejected_index", _NAT), ("hint_index", _NAT),
                                          ("hint_term", _NAT))),
    InstallSnapshot: (5, _COMMON + (("meta", _META), ("data", _OPT_BYTES))),
    InstallSnapshotResponse: (6, _COMMON + (("match_index", _NAT),)),
    TimeoutNow: (7, _COMMON),
}
_BY_TAG = {tag: (cls, layout) for cls, (tag, layout) in _LAYOUTS.items()}

for _cls, (_, _layout) in _LAYOUTS.items():   # a field added to messages.py must be laid out
    if tuple(f.name for f in fields(_cls)) != tuple(name for name, _ in _layout):
        raise TypeError(f"wire layout of {_cls.__name__} does not match its fields")


# -- encoding -------------------------------------------------------------------------

def encode(envelope: Envelope) -> bytes:
    """The msgpack payload of `envelope` (frame it with `frame`)."""
    match envelope:
        case RaftEnvelope(group=group, message=message):
            layout = _LAYOUTS.get(type(message))
            if layout is None:
                raise WireError(f"cannot encode {type(message).__name__}: not a Raft message")
            if type(group) is not str:
                raise WireError(f"cannot encode RaftEnvelope: group must be a str, got "
                                f"{_show(group)}")
            tag, layout_fields = layout
            items: list[Any] = [tag, group]
            for name, kind in layout_fields:
                value = getattr(message, name)
                if kind == _ENTRIES:
                    value = [[e.index, e.term, e.kind, e.data] for e in value]
                elif kind == _META:
                    value = [value.index, value.term, list(value.members)]
                items.append(value)
            what = type(message).__name__
        case Rpc(kind=kind, body=body):
            if type(kind) is not str:
                raise WireError(f"cannot encode Rpc: kind must be a str, got {_show(kind)}")
            if type(body) is not dict:
                raise WireError(f"cannot encode Rpc {kind!r}: body must be a dict, got "
                                f"{_show(body)}")
            _check_primitive(body, f"Rpc {kind!r} body")
            items = [RPC_TAG, kind, body, envelope.seq] if envelope.seq else [RPC_TAG, kind,
                                                                              body]
            what = f"Rpc {kind!r}"
        case RpcAck(session=session, seq=seq):
            items = [ACK_TAG, _nat(session, "RpcAck.session"), _nat(seq, "RpcAck.seq")]
            what = "RpcAck"
        case Resume(session=session, delivered=delivered, proof=proof):
            items = [RESUME_TAG, _nat(session, "Resume.session"),
                     _nat(delivered, "Resume.delivered"), _digest(proof, "Resume.proof")]
            what = "Resume"
        case _:
            raise WireError(f"cannot encode {type(envelope).__name__}: "
                            "not a RaftEnvelope or an Rpc (nor the transport's RpcAck "
                            "or Resume)")
    return _pack(items, what)


def encode_handshake(handshake: Handshake) -> bytes:
    items: list[Any] = [MAGIC, VERSION, handshake.cluster_name, handshake.from_node,
                        handshake.to_node]
    for name, value in zip(("cluster_name", "from_node", "to_node"), items[2:]):
        if type(value) is not str:
            raise WireError(f"cannot encode handshake: {name} must be a str, got "
                            f"{_show(value)}")
    items.append(_nat(handshake.session, "handshake session"))
    items.append(_nonce(handshake.nonce, "handshake nonce"))
    return _pack(items, "handshake")


def encode_challenge(challenge: Challenge) -> bytes:
    return _pack([CHALLENGE_TAG, _nonce(challenge.nonce, "Challenge.nonce")], "Challenge")


def encode_proof(proof: Proof) -> bytes:
    return _pack([PROOF_TAG, _digest(proof.digest, "Proof.digest")], "Proof")


def handshake_proof(cookie: str, role: str, handshake: Handshake, challenge: bytes) -> bytes:
    """What `role` (INITIATOR: the connecting node, RESPONDER: the accepting one) shows
    to prove it holds `cookie` in the handshake that opened with `handshake` and was
    challenged with `challenge`: HMAC-SHA256 keyed by the cookie (the SHA-256 of its
    UTF-8 octets) over the role, the cluster name, both node names and both nonces.
    The other side computes the same and compares with `proofs_match` (constant
    time)."""
    if role not in (INITIATOR, RESPONDER):
        raise ValueError(f"role must be {INITIATOR!r} or {RESPONDER!r}, got {role!r}")
    transcript = msgpack.packb([MAGIC, VERSION, role, handshake.cluster_name,
                                handshake.from_node, handshake.to_node, handshake.nonce,
                                challenge], use_bin_type=True)
    # keyed by the cookie's SHA-256, not the octets themselves: HMAC pads a short key
    # with zeros, so "k" and "k\0" would be one key; digests of one length are not
    key = hashlib.sha256(cookie.encode()).digest()
    return hmac.new(key, transcript, hashlib.sha256).digest()


def proofs_match(received: bytes, expected: bytes) -> bool:
    """Whether a received proof is the expected one, in time that depends on the
    lengths only (hmac.compare_digest): a guesser learns nothing from the timing."""
    return hmac.compare_digest(received, expected)


def frame(payload: bytes, max_frame_size: int = MAX_FRAME_SIZE) -> bytes:
    """`payload` behind its 4-byte big-endian length."""
    if len(payload) > max_frame_size:
        raise WireError(f"payload of {len(payload)} bytes exceeds the maximum frame size "
                        f"of {max_frame_size} bytes")
    return _HEADER.pack(len(payload)) + payload


def _pack(items: list[Any], what: str) -> bytes:
    try:
        return msgpack.packb(items, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise WireError(f"cannot encode {what}: {exc}") from exc


# -- decoding -------------------------------------------------------------------------

def decode(payload: bytes) -> Envelope:
    """The envelope `payload` holds; WireError if it is not exactly one valid one."""
    items = _unpack(payload, "envelope")
    if type(items) is not list or not items:
        raise WireError(f"envelope must be a non-empty array, got {_show(items)}")
    tag = items[0]
    if type(tag) is not int:
        raise WireError(f"envelope tag must be an int, got {_show(tag)}")
    if tag == RPC_TAG:
        return _decode_rpc(items)
    if tag == ACK_TAG:
        if len(items) != 3:
            raise WireError(f"RpcAck must have 3 items, got {len(items)}")
        return RpcAck(*(_nat(value, f"RpcAck[{i}]") for i, value in enumerate(items[1:], 1)))
    if tag == RESUME_TAG:
        if len(items) != 4:
            raise WireError(f"Resume must have 4 items (tag, session, delivered, proof), "
                            f"got {len(items)}")
        return Resume(_nat(items[1], "Resume.session"), _nat(items[2], "Resume.delivered"),
                      _digest(items[3], "Resume.proof"))
    found = _BY_TAG.get(tag)
    if found is None:
        raise WireError(f"unknown envelope tag {tag}")
    cls, layout = found
    name = cls.__name__
    if len(items) != 2 + len(layout):
        raise WireError(f"{name} must have {2 + len(layout)} items (tag, group and "
                        f"{len(layout)} fields), got {len(items)}")
    group = items[1]
    if type(group) is not str:
        raise WireError(f"{name} group must be a str, got {_show(group)}")
    values = [_decode_field(kind, value, f"{name}.{field_name}")
              for (field_name, kind), value in zip(layout, items[2:])]
    return RaftEnvelope(group, cls(*values))


_SHAPE = f"[{MAGIC!r}, version, cluster, from, to, session, nonce]"


def decode_handshake(payload: bytes) -> Handshake:
    """The Handshake `payload` holds. A handshake of another wire version is refused
    by its version before anything else is read (version 3 and older carried the
    cookie itself: it is never looked at)."""
    items = _unpack(payload, "handshake")
    if type(items) is not list or len(items) < 2 or items[0] != MAGIC:
        raise WireError(f"not a quorumqueue cluster handshake (expected {_SHAPE})")
    version = items[1]
    if type(version) is not int or version != VERSION:
        raise WireError(f"handshake version {version!r} is not supported "
                        f"(this node speaks version {VERSION}: run the same quorumqueue "
                        "version on every node)")
    if len(items) != 7:
        raise WireError(f"not a quorumqueue cluster handshake (expected {_SHAPE})")
    for name, value in zip(("cluster_name", "from_node", "to_node"), items[2:5]):
        if type(value) is not str:
            raise WireError(f"handshake {name} must be a str, got {_show(value)}")
    return Handshake(*items[2:5], session=_nat(items[5], "handshake session"),
                     nonce=_nonce(items[6], "handshake nonce"))


def decode_challenge(payload: bytes) -> Challenge:
    items = _unpack(payload, "Challenge")
    if type(items) is not list or len(items) != 2 or items[0] != CHALLENGE_TAG:
        raise WireError(f"expected a Challenge [{CHALLENGE_TAG}, nonce], got "
                        f"{_show(items)}")
    return Challenge(_nonce(items[1], "Challenge.nonce"))


def decode_proof(payload: bytes) -> Proof:
    items = _unpack(payload, "Proof")
    if type(items) is not list or len(items) != 2 or items[0] != PROOF_TAG:
        raise WireError(f"expected a Proof [{PROOF_TAG}, digest], got {_show(items)}")
    return Proof(_digest(items[1], "Proof.digest"))


def handshake_problems(handshake: Handshake, *, cluster_name: str,
                       node_name: str) -> list[str]:
    """What in `handshake` does not match this node (empty: challenge it for the
    cookie)."""
    problems = []
    if handshake.cluster_name != cluster_name:
        problems.append(f"cluster name {handshake.cluster_name!r} is not this node's "
                        f"{cluster_name!r}")
    if handshake.to_node != node_name:
        problems.append(f"it is addressed to node {handshake.to_node!r}, this node is "
                        f"{node_name!r}")
    return problems


# what a node logs when a peer's proof of the cookie fails, either way round
COOKIE_MISMATCH = ("the cookie does not match this node's cookie (give every node of "
                   "the cluster the same cluster.cookie, or the same "
                   "~/.quorumqueue.cookie file, and restart the odd one)")


def _unpack(payload: bytes, what: str) -> Any:
    try:
        return msgpack.unpackb(payload, raw=False, use_list=True, strict_map_key=False)
    # msgpack reports malformed input with several exception types of its own plus
    # ValueError (bad UTF-8, trailing data) and TypeError (an unhashable map key).
    except (msgpack.UnpackException, ValueError, TypeError) as exc:
        detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        raise WireError(f"{what} is not valid msgpack ({detail})") from exc


def _decode_rpc(items: list[Any]) -> Rpc:
    if len(items) not in (3, 4):
        raise WireError(f"Rpc must have 3 items (tag, kind, body) or 4 (and seq), got "
                        f"{len(items)}")
    _, kind, body, *numbered = items
    if type(kind) is not str:
        raise WireError(f"Rpc kind must be a str, got {_show(kind)}")
    if type(body) is not dict:
        raise WireError(f"Rpc {kind!r} body must be a map, got {_show(body)}")
    _check_primitive(body, f"Rpc {kind!r} body")
    return Rpc(kind, body, _nat(numbered[0], f"Rpc {kind!r} seq") if numbered else 0)


def _decode_field(kind: str, value: Any, where: str) -> Any:
    if kind == _NAT:
        return _nat(value, where)
    if kind == _STR:
        if type(value) is not str:
            raise WireError(f"{where} must be a str, got {_show(value)}")
        return value
    if kind == _BOOL:
        if type(value) is not bool:
            raise WireError(f"{where} must be a bool, got {_show(value)}")
        return value
    if kind == _OPT_BYTES:
        if value is not None and type(value) is not bytes:
            raise WireError(f"{where} must be bytes or nil, got {_show(value)}")
        return value
    if kind == _ENTRIES:
        return _decode_entries(value, where)
    if kind == _META:
        if type(value) is not list or len(value) != 3:
            raise WireError(f"{where} must be [index, term, members], got {_show(value)}")
        index, term, members = value
        if type(members) is not list or any(type(m) is not str for m in members):
            raise WireError(f"{where}.members must be an array of str, got {_show(members)}")
        return SnapshotMeta(_nat(index, f"{where}.index"), _nat(term, f"{where}.term"),
                            tuple(members))
    raise AssertionError(f"unknown field kind {kind}")


def _decode_entries(value: Any, where: str) -> tuple[LogEntry, ...]:
    if type(value) is not list:
        raise WireError(f"{where} must be an array, got {_show(value)}")
    entries = []
    for position, item in enumerate(value):
        if type(item) is not list or len(item) != 4:
            raise WireError(f"{where}[{position}] must be [index, term, kind, data], "
                            f"got {_show(item)}")
        index, term, entry_kind, data = item
        if (type(index) is not int or index < 0 or type(term) is not int or term < 0
                or type(entry_kind) is not int or entry_kind < 0):
            raise WireError(f"{where}[{position}] index, term and kind must be "
                            f"non-negative ints, got {_show(item)}")
        if type(data) is not bytes:
            raise WireError(f"{where}[{position}].data must be bytes, got {_show(data)}")
        entries.append(LogEntry(index, term, entry_kind, data))
    return tuple(entries)


def _nonce(value: Any, where: str) -> bytes:
    if type(value) is not bytes or len(value) != NONCE_SIZE:
        raise WireError(f"{where} must be {NONCE_SIZE} bytes, got {_show(value)}")
    return value


def _digest(value: Any, where: str) -> bytes:
    if type(value) is not bytes or len(value) != DIGEST_SIZE:
        raise WireError(f"{where} must be a {DIGEST_SIZE}-byte digest, got {_show(value)}")
    return value


def _nat(value: Any, where: str) -> int:
    if type(value) is not int or value < 0:
        raise WireError(f"{where} must be a non-negative int, got {_show(value)}")
    return value


_PRIMITIVES = (str, int, bytes, bool, float, type(None))


def _check_primitive(value: Any, where: str) -> None:
    """Raise unless `value` is made only of what survives a msgpack round trip."""
    kind = type(value)
    if kind in _PRIMITIVES:
        return
    if kind is list:
        for position, item in enumerate(value):
            _check_primitive(item, f"{where}[{position}]")
    elif kind is dict:
        for key, item in value.items():
            if type(key) not in _PRIMITIVES:
                raise WireError(f"{where} has a key of type {type(key).__name__}; keys must "
                                "be str, int, float, bytes, bool or None")
            _check_primitive(item, f"{where}[{key!r}]")
    else:
        hint = " (use a list)" if kind is tuple else ""
        raise WireError(f"{where} is of type {kind.__name__}{hint}; only str, int, float, "
                        "bytes, bool, None, list and dict travel")


def _show(value: Any) -> str:
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


# -- framing --------------------------------------------------------------------------

class FrameReader:
    """Cuts a byte stream into frame payloads. After a WireError the stream is lost
    (close the connection): the reader does not resynchronise."""

    __slots__ = ("_buffer", "max_frame_size")

    def __init__(self, max_frame_size: int = MAX_FRAME_SIZE) -> None:
        self._buffer = bytearray()     # bytes received but not yet a whole frame
        self.max_frame_size = max_frame_size

    def feed(self, data: bytes) -> list[bytes]:
        """Payloads of every frame completed by `data`, in order."""
        buffer = self._buffer
        buffer += data
        payloads: list[bytes] = []
        start = 0
        with memoryview(buffer) as view:
            while len(buffer) - start >= HEADER_SIZE:
                (length,) = _HEADER.unpack_from(buffer, start)
                if length > self.max_frame_size:
                    raise WireError(f"frame of {length} bytes exceeds the maximum frame "
                                    f"size of {self.max_frame_size} bytes")
                end = start + HEADER_SIZE + length
                if len(buffer) < end:
                    break
                payloads.append(view[start + HEADER_SIZE:end].tobytes())
                start = end
        if start:
            del buffer[:start]
        return payloads

    @property
    def buffered(self) -> int:
        """Bytes held towards the next frame."""
        return len(self._buffer)
