"""The cluster wire format (broker/cluster/wire.py): envelopes, handshake, framing.

Round trips of every Raft message (Raft paper §5.2, §5.3, §7; thesis §3.10 for
TimeoutNow) and of Rpc bodies as Hypothesis properties; malformed input as a table
whose every row must raise WireError naming the fault; frames fed split at every
byte and concatenated.
"""

from __future__ import annotations

import typing

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quorumqueue.broker.cluster.wire import (ACK_TAG, CHALLENGE_TAG, INITIATOR, MAGIC,
                                             MAX_FRAME_SIZE, PROOF_TAG, RESPONDER, RPC_TAG,
                                             VERSION, Challenge, FrameReader, Handshake,
                                             Proof, RaftEnvelope, Resume, Rpc, RpcAck,
                                             WireError, decode, decode_challenge,
                                             decode_handshake, decode_proof, encode,
                                             encode_challenge, encode_handshake, encode_proof,
                                             frame, handshake_problems, handshake_proof,
                                             proofs_match)
from quorumqueue.broker.raft.messages import (AppendEntries, AppendEntriesResponse,
                                              InstallSnapshot, InstallSnapshotResponse,
                                              Message, RequestVote, RequestVoteResponse,
                                              TimeoutNow)
from quorumqueue.broker.raft.types import COMMAND, MEMBERSHIP, NOOP, LogEntry, SnapshotMeta

PROPERTY = settings(max_examples=200, deadline=None)

# -- examples and strategies ----------------------------------------------------------

ENTRIES = (LogEntry(4, 2, NOOP, b""), LogEntry(5, 2, COMMAND, b"\x00enqueue"),
           LogEntry(6, 3, MEMBERSHIP, b"a,b,c"))
EXAMPLES = [
    RequestVote(7, "a", "b", last_index=12, last_term=6, pre_vote=True,
                leadership_transfer=True),
    RequestVoteResponse(7, "b", "a", granted=True, pre_vote=True),
    AppendEntries(3, "a", "b", prev_index=3, prev_term=2, entries=ENTRIES, leader_commit=5),
    AppendEntries(3, "a", "b", prev_index=3, prev_term=2, entries=(), leader_commit=5),
    AppendEntriesResponse(3, "b", "a", success=False, match_index=0, rejected_index=9,
                          hint_index=4, hint_term=2),
    InstallSnapshot(4, "a", "c", SnapshotMeta(100, 3, ("a", "b", "c")), b"\x01" * 1000),
    InstallSnapshot(4, "a", "c", SnapshotMeta(100, 3, ()), None),
    InstallSnapshotResponse(4, "c", "a", match_index=100),
    TimeoutNow(9, "a", "b"),
    AppendEntries(3, "a", "b", prev_index=3, prev_term=2, entries=(), leader_commit=5,
                  quiet=True),
]

nats = st.integers(min_value=0, max_value=2**64 - 1)
names = st.text(max_size=12)
entries = st.lists(st.builds(LogEntry, nats, nats, st.sampled_from([COMMAND, NOOP, MEMBERSHIP]),
                             st.binary(max_size=200)), max_size=30).map(tuple)
messages = st.one_of(
    st.builds(RequestVote, nats, names, names, nats, nats, st.booleans(), st.booleans()),
    st.builds(RequestVoteResponse, nats, names, names, st.booleans(), st.booleans()),
    st.builds(AppendEntries, nats, names, names, nats, nats, entries, nats, st.booleans()),
    st.builds(AppendEntriesResponse, nats, names, names, st.booleans(), nats, nats, nats,
              nats),
    st.builds(InstallSnapshot, nats, names, names,
              st.builds(SnapshotMeta, nats, nats, st.lists(names, max_size=7).map(tuple)),
              st.none() | st.binary(max_size=2000)),
    st.builds(InstallSnapshotResponse, nats, names, names, nats),
    st.builds(TimeoutNow, nats, names, names),
)
primitives = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2**63, max_value=2**64 - 1)
    | st.floats(allow_nan=False) | st.text(max_size=20) | st.binary(max_size=40),
    lambda children: (st.lists(children, max_size=5)
                      | st.dictionaries(st.text(max_size=8) | st.integers(-2**63, 2**64 - 1),
                                        children, max_size=5)),
    max_leaves=12)


# -- round trips ----------------------------------------------------------------------

def test_the_examples_cover_every_raft_message():
    assert {type(m) for m in EXAMPLES} == set(typing.get_args(Message))


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
def test_every_raft_message_round_trips(message):
    envelope = RaftEnvelope("%2F/orders/8f3a", message)
    decoded = decode(encode(envelope))
    assert decoded == envelope
    for name in ("entries",) if isinstance(message, AppendEntries) else ():
        assert type(getattr(decoded.message, name)) is tuple


@PROPERTY
@given(group=names, message=messages)
def test_any_raft_message_round_trips(group, message):
    assert decode(encode(RaftEnvelope(group, message))) == RaftEnvelope(group, message)


@settings(max_examples=60, deadline=None)
@given(kind=names, body=st.dictionaries(st.text(max_size=8), primitives, max_size=4))
def test_any_rpc_body_round_trips(kind, body):
    assert decode(encode(Rpc(kind, body))) == Rpc(kind, body)


def test_bytes_stay_bytes_strings_stay_str_and_tuples_come_back_as_tuples():
    rpc = decode(encode(Rpc("join", {"name": "c", "cookie_hash": b"\xff\x00", "big": 2**64 - 1,
                                     "nested": [{"x": None, "y": 1.5, "z": False}]})))
    assert type(rpc.body["name"]) is str and type(rpc.body["cookie_hash"]) is bytes
    assert rpc.body["big"] == 2**64 - 1
    snapshot = decode(encode(RaftEnvelope("g", EXAMPLES[5]))).message
    assert type(snapshot.meta.members) is tuple and type(snapshot.data) is bytes


def test_the_transport_s_numbering_and_acknowledgements_round_trip():
    numbered = Rpc("deliver", {"k": "x"}, seq=7)
    assert decode(encode(numbered)).seq == 7 and decode(encode(numbered)) == numbered
    assert msgpack.unpackb(encode(numbered)) == [RPC_TAG, "deliver", {"k": "x"}, 7]
    assert msgpack.unpackb(encode(Rpc("ping", {}))) == [RPC_TAG, "ping", {}]  # unnumbered
    assert decode(encode(RpcAck(2**55, 9))) == RpcAck(2**55, 9)
    assert msgpack.unpackb(encode(RpcAck(1, 2))) == [ACK_TAG, 1, 2]
    assert decode(encode(Resume(5, 0, b"p" * 32))) == Resume(5, 0, b"p" * 32)
    handshake = Handshake("prod", "a", "b", session=3, nonce=b"n" * 32)
    assert decode_handshake(encode_handshake(handshake)).session == 3
    with pytest.raises(WireError, match="RpcAck.seq must be a non-negative int"):
        encode(RpcAck(1, -1))
    with pytest.raises(WireError, match="seq must be a non-negative int"):
        decode(msgpack.packb([RPC_TAG, "x", {}, "7"]))


def test_raft_messages_are_positional_arrays_with_a_small_tag():
    payload = encode(RaftEnvelope("g", RequestVote(1, "a", "b", 0, 0)))
    assert msgpack.unpackb(payload) == [1, "g", 1, "a", "b", 0, 0, False, False]
    assert len(payload) == 13
    heartbeat = encode(RaftEnvelope("g", AppendEntries(5, "a", "b", 10, 5, (), 10)))
    assert b"prev_index" not in heartbeat and len(heartbeat) < 20


# -- malformed input ------------------------------------------------------------------

def packed(*items):
    return msgpack.packb(list(items), use_bin_type=True)


VOTE = (1, "g", 1, "a", "b", 0, 0, False, False)
APPEND = (3, "g", 1, "a", "b", 0, 0, [[1, 1, 0, b"x"]], 0, False)
SNAPSHOT = (5, "g", 1, "a", "b", [1, 1, ["a"]], None)


@pytest.mark.parametrize("payload, fault", [
    (b"", "not valid msgpack"),
    (b"\xc1", "not valid msgpack"),                               # reserved byte
    (b"\x92\x01", "not valid msgpack"),                           # truncated array
    (packed(*VOTE) + b"\x00", "not valid msgpack"),               # trailing data
    (b"\x92\xa2\xff\xfe\x00", "not valid msgpack"),               # invalid UTF-8
    (msgpack.packb({"tag": 1}), "non-empty array"),
    (packed(), "non-empty array"),
    (packed("RequestVote", "g"), "tag must be an int"),
    (packed(True, *VOTE[1:]), "tag must be an int"),               # True is not tag 1
    (packed(99, "g"), "unknown envelope tag 99"),
    (packed(*VOTE[:-1]), "RequestVote must have 9 items"),
    (packed(*VOTE, False), "RequestVote must have 9 items"),
    (packed(1, b"g", *VOTE[2:]), "RequestVote group must be a str"),
    (packed(1, "g", -1, *VOTE[3:]), "RequestVote.term must be a non-negative int"),
    (packed(1, "g", "1", *VOTE[3:]), "RequestVote.term must be a non-negative int"),
    (packed(1, "g", True, *VOTE[3:]), "RequestVote.term must be a non-negative int"),
    (packed(1, "g", 1, 7, *VOTE[4:]), "RequestVote.from_ must be a str"),
    (packed(*VOTE[:-1], 1), "RequestVote.leadership_transfer must be a bool"),
    (packed(*APPEND[:7], {}, 0, False), "AppendEntries.entries must be an array"),
    (packed(*APPEND[:7], [[1, 1, 0]], 0, False), r"AppendEntries.entries\[0\] must be \[index"),
    (packed(*APPEND[:7], [[1, 1, 0, b"x"], [2, -1, 0, b"y"]], 0, False),
     r"entries\[1\] index, term and kind must be non-negative"),
    (packed(*APPEND[:7], [[1, 1, 0, "x"]], 0, False), r"entries\[0\].data must be bytes"),
    (packed(*SNAPSHOT[:5], [1, 1], None), r"InstallSnapshot.meta must be \[index, term, members\]"),
    (packed(*SNAPSHOT[:5], [1, 1, "a"], None), "InstallSnapshot.meta.members must be an array"),
    (packed(*SNAPSHOT[:5], [1, 1, [1]], None), "InstallSnapshot.meta.members must be an array"),
    (packed(*SNAPSHOT[:5], [-1, 1, []], None), "InstallSnapshot.meta.index must be"),
    (packed(*SNAPSHOT[:6], "data"), "InstallSnapshot.data must be bytes or nil"),
    (packed(RPC_TAG, "join"), "Rpc must have 3 items"),
    (packed(RPC_TAG, 1, {}), "Rpc kind must be a str"),
    (packed(RPC_TAG, "join", [1]), "Rpc 'join' body must be a map"),
    (packed(RPC_TAG, "join", {"t": msgpack.ExtType(5, b"x")}), r"body\['t'\] is of type ExtType"),
    (packed(RPC_TAG, "join", {"k": [[msgpack.Timestamp(1, 0)]]}),
     r"body\['k'\]\[0\]\[0\] is of type Timestamp"),
])
def test_malformed_envelopes_raise_wire_error_naming_the_fault(payload, fault):
    with pytest.raises(WireError, match=fault):
        decode(payload)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=64))
def test_arbitrary_bytes_decode_or_raise_wire_error(payload):
    try:
        decode(payload)
    except WireError:
        pass


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
def test_every_truncation_raises_wire_error(message):
    payload = encode(RaftEnvelope("g", message))
    for cut in range(len(payload)):
        with pytest.raises(WireError):
            decode(payload[:cut])


@pytest.mark.parametrize("envelope, fault", [
    (Rpc("join", {"members": ("a", "b")}), r"body\['members'\] is of type tuple \(use a list\)"),
    (Rpc("join", {"members": {"a"}}), r"body\['members'\] is of type set"),
    (Rpc("join", {"n": 2**64}), "cannot encode Rpc 'join'"),
    (Rpc("join", {("a",): 1}), "key of type tuple"),
    (Rpc("join", ["not", "a", "dict"]), "body must be a dict"),
    (Rpc(7, {}), "kind must be a str"),
    (RaftEnvelope("g", "hello"), "cannot encode str: not a Raft message"),
    (RaftEnvelope(None, TimeoutNow(1, "a", "b")), "group must be a str"),
    ("hello", "not a RaftEnvelope or an Rpc"),
])
def test_what_cannot_travel_is_refused_at_encode(envelope, fault):
    with pytest.raises(WireError, match=fault):
        encode(envelope)


# -- handshake ------------------------------------------------------------------------

NONCE_A, NONCE_B = b"a" * 32, b"b" * 32
HELLO = Handshake("prod", "a", "b", session=3, nonce=NONCE_A)


def test_the_handshake_messages_round_trip_and_carry_no_cookie():
    assert decode_handshake(encode_handshake(HELLO)) == HELLO
    assert msgpack.unpackb(encode_handshake(HELLO)) == [MAGIC, VERSION, "prod", "a", "b", 3,
                                                        NONCE_A]
    assert decode_challenge(encode_challenge(Challenge(NONCE_B))) == Challenge(NONCE_B)
    assert msgpack.unpackb(encode_challenge(Challenge(NONCE_B))) == [CHALLENGE_TAG, NONCE_B]
    digest = handshake_proof("s3cret", INITIATOR, HELLO, NONCE_B)
    assert decode_proof(encode_proof(Proof(digest))) == Proof(digest)
    assert msgpack.unpackb(encode_proof(Proof(digest))) == [PROOF_TAG, digest]
    assert "s3cret" not in repr(Proof(digest)) and digest.hex() not in repr(Proof(digest))


def test_a_proof_holds_for_one_cookie_one_handshake_and_one_direction_only():
    """Issue 17 / Erlang distribution's handshake: the digest is keyed by the cookie
    and covers both nonces, the cluster, both node names and who proves, so a digest
    seen once is good for nothing else; the cookie is not in it."""
    base = handshake_proof("k\u00e9y", INITIATOR, HELLO, NONCE_B)
    assert len(base) == 32 and base == handshake_proof("k\u00e9y", INITIATOR, HELLO, NONCE_B)
    others = [
        handshake_proof("k\u00e9z", INITIATOR, HELLO, NONCE_B),      # another cookie
        handshake_proof("k\u00e9y\x00", INITIATOR, HELLO, NONCE_B),  # HMAC pads keys
        handshake_proof("k\u00e9y", RESPONDER, HELLO, NONCE_B),      # the other direction
        handshake_proof("k\u00e9y", INITIATOR, HELLO, b"c" * 32),    # another challenge
        handshake_proof("k\u00e9y", INITIATOR, Handshake("prod", "a", "b", 3, b"d" * 32),
                        NONCE_B),                                    # another nonce
        handshake_proof("k\u00e9y", INITIATOR, Handshake("test", "a", "b", 3, NONCE_A),
                        NONCE_B),
        handshake_proof("k\u00e9y", INITIATOR, Handshake("prod", "c", "b", 3, NONCE_A),
                        NONCE_B),
        handshake_proof("k\u00e9y", INITIATOR, Handshake("prod", "a", "c", 3, NONCE_A),
                        NONCE_B),
        handshake_proof("k\u00e9y", INITIATOR, Handshake("prod", "b", "a", 3, NONCE_B),
                        NONCE_A),                                    # the roles swapped
    ]
    assert base not in others and len(set(others)) == len(others)
    assert "k\u00e9y".encode() not in base
    with pytest.raises(ValueError, match="role must be"):
        handshake_proof("k", "other", HELLO, NONCE_B)


@pytest.mark.parametrize("payload, fault", [
    (b"\xc1", "not valid msgpack"),
    (packed("rabbitmq", 1, "c", "a", "b", "k"), "not a quorumqueue cluster handshake"),
    (packed(MAGIC, VERSION, "c", "a", "b"), "not a quorumqueue cluster handshake"),
    (packed(MAGIC), "not a quorumqueue cluster handshake"),
    (packed(*VOTE), "not a quorumqueue cluster handshake"),
    (packed(MAGIC, VERSION + 1, "c", "a", "b", 1, NONCE_A),
     f"version {VERSION + 1} is not supported"),
    # a node of version 3 sends its cookie in the handshake: refused by the version
    (packed(MAGIC, 3, "c", "a", "b", "k", 1), "handshake version 3 is not supported "
     f"\\(this node speaks version {VERSION}: run the same quorumqueue version on every"),
    (packed(MAGIC, VERSION, "c", "a", "b", 1), "not a quorumqueue cluster handshake"),
    (packed(MAGIC, VERSION, "c", "a", "b", -1, NONCE_A), "session must be a non-negative"),
    (packed(MAGIC, True, "c", "a", "b", 1, NONCE_A), "version True is not supported"),
    (packed(MAGIC, VERSION, "c", "a", b"b", 1, NONCE_A), "to_node must be a str"),
    (packed(MAGIC, VERSION, "c", "a", "b", 1, b"short"), "nonce must be 32 bytes"),
    (packed(MAGIC, VERSION, "c", "a", "b", 1, "a" * 32), "nonce must be 32 bytes"),
])
def test_malformed_handshakes_raise_wire_error(payload, fault):
    with pytest.raises(WireError, match=fault):
        decode_handshake(payload)


@pytest.mark.parametrize("decoder, payload, fault", [
    (decode_challenge, packed(PROOF_TAG, NONCE_B), "expected a Challenge"),
    (decode_challenge, packed(CHALLENGE_TAG, b"x"), "Challenge.nonce must be 32 bytes"),
    (decode_proof, packed(CHALLENGE_TAG, NONCE_B), "expected a Proof"),
    (decode_proof, packed(PROOF_TAG, b"x" * 31), "Proof.digest must be a 32-byte digest"),
    (decode_proof, packed(PROOF_TAG, b"x" * 32, 1), "expected a Proof"),
    (decode, packed(18, 1, 0), "Resume must have 4 items"),
    (decode, packed(18, 1, 0, "x" * 32), "Resume.proof must be a 32-byte digest"),
])
def test_malformed_challenges_proofs_and_resumes_raise_wire_error(decoder, payload, fault):
    with pytest.raises(WireError, match=fault):
        decoder(payload)


@pytest.mark.parametrize("handshake, problems", [
    (Handshake("prod", "a", "b"), []),
    (Handshake("test", "a", "b"), ["cluster name 'test' is not this node's 'prod'"]),
    (Handshake("prod", "a", "c"), ["it is addressed to node 'c', this node is 'b'"]),
    (Handshake("test", "a", "c"), ["cluster name 'test' is not this node's 'prod'",
                                   "it is addressed to node 'c', this node is 'b'"]),
])
def test_handshake_problems_name_what_does_not_match(handshake, problems):
    assert handshake_problems(handshake, cluster_name="prod", node_name="b") == problems


def test_proofs_are_compared_in_constant_time(monkeypatch):
    """Issue 17: the proof check must not tell a guesser, by its timing, how many of
    its first octets are right: it goes through hmac.compare_digest, whose time
    depends on the lengths only."""
    from quorumqueue.broker.cluster import wire
    compared = []
    real = wire.hmac.compare_digest
    monkeypatch.setattr(wire.hmac, "compare_digest",
                        lambda a, b: compared.append((a, b)) or real(a, b))
    right = handshake_proof("k\u00e9y", INITIATOR, HELLO, NONCE_B)
    wrong = handshake_proof("k", INITIATOR, HELLO, NONCE_B)
    assert proofs_match(right, right) and not proofs_match(wrong, right)
    assert compared == [(right, right), (wrong, right)]


# -- framing --------------------------------------------------------------------------

def test_frames_split_at_every_byte_come_out_whole_and_in_order():
    payloads = [encode(RaftEnvelope("g", m)) for m in EXAMPLES] + [b""]
    stream = b"".join(frame(p) for p in payloads)
    reader = FrameReader()
    out = []
    for i in range(len(stream)):
        out += reader.feed(stream[i:i + 1])
    assert out == payloads and reader.buffered == 0


def test_concatenated_frames_come_out_of_one_feed():
    reader = FrameReader()
    assert reader.feed(frame(b"one") + frame(b"two") + frame(b"thr")) == [b"one", b"two",
                                                                          b"thr"]
    assert reader.feed(frame(b"four")[:5]) == [] and reader.buffered == 5
    assert reader.feed(frame(b"four")[5:] + frame(b"x")) == [b"four", b"x"]


@PROPERTY
@given(payloads=st.lists(st.binary(max_size=300), max_size=20), data=st.data())
def test_any_cutting_of_a_stream_yields_the_payloads(payloads, data):
    stream = b"".join(frame(p) for p in payloads)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    reader = FrameReader()
    out = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)]):
        out += reader.feed(stream[start:end])
    assert out == payloads


def test_a_frame_over_the_maximum_is_refused_by_its_header_alone():
    reader = FrameReader(max_frame_size=1000)
    assert reader.feed(frame(b"x" * 1000)) == [b"x" * 1000]
    with pytest.raises(WireError, match="frame of 1001 bytes exceeds the maximum frame "
                                        "size of 1000 bytes"):
        reader.feed((1001).to_bytes(4, "big"))
    assert FrameReader().max_frame_size == MAX_FRAME_SIZE == 256 * 1024 * 1024
    with pytest.raises(WireError, match="exceeds the maximum frame size of 268435456 bytes"):
        FrameReader().feed(b"\xff\xff\xff\xff")


def test_frame_refuses_a_payload_over_the_maximum():
    assert frame(b"abc") == b"\x00\x00\x00\x03abc"
    with pytest.raises(WireError, match="payload of 11 bytes exceeds"):
        frame(b"x" * 11, max_frame_size=10)
