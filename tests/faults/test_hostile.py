"""The hostile-input fuzzer's short seeded run (the long form: `make faults`), and
the checker's own tests: it must see the faults it looks for.

The run: a broker process attacked for SHORT seconds by mutated replays of a
recorded pika session over many connections while a healthy client publishes with
confirms and consumes from a quorum queue (hostile.py says what is judged).
"""

from __future__ import annotations

import random
import socket
import struct
import time

import pytest

from quorumqueue.broker.cluster.wire import (INITIATOR, Challenge, FrameReader, decode_handshake,
                                             decode_proof, encode_challenge,
                                             handshake_proof)
from quorumqueue.broker.cluster.wire import frame as cluster_frame
from tests.faults.hostile import attack, check_answer, parse_answer, run
from tests.faults.mutations import (FRAME_END, PROTOCOL_HEADER, Mutation, Mutator,
                                    cluster_port_attack, record_session, split_frames)
from tests.support.broker import BrokerProcess

pytestmark = pytest.mark.timeout(300)

SHORT = 12.0  # seconds of attack


def test_a_short_seeded_attack_finds_nothing():
    result = run(SHORT, seed=17, attackers=3)
    assert result.ok, result.summary()
    assert result.connections >= 20, result.summary()
    assert result.kinds["random"] and set(result.kinds) - {"random"}, result.summary()
    assert result.confirmed >= 20, result.summary()


# ---------------------------------------------------------------- the checker


def frame(frame_type: int, channel: int, payload: bytes) -> bytes:
    return struct.pack(">BHI", frame_type, channel, len(payload)) + payload + bytes([FRAME_END])


def close(code: int, text: str, ids: tuple[int, int] = (10, 50), channel: int = 0) -> bytes:
    raw = text.encode()
    return frame(1, channel, struct.pack(">HHHB", *ids, code, len(raw)) + raw
                 + struct.pack(">HH", 0, 0))


OVERSIZE = Mutation("oversize-frame", "", b"", {
    "code": 501, "text": "FRAME_ERROR - type 3, all octets = <<>>: {frame_too_large,9,1}",
    "closes": True})


def test_the_checker_accepts_rabbitmq_s_answer():
    answer = close(501, "FRAME_ERROR - type 3, all octets = <<>>: {frame_too_large,9,1}")
    assert check_answer(OVERSIZE, answer, closed=True) == []


@pytest.mark.parametrize("answer, closed, problem", [
    (close(501, "FRAME_ERROR - something else"), True, "closed with 501"),
    (close(505, "FRAME_ERROR - type 3, all octets = <<>>: {frame_too_large,9,1}"), True,
     "close (10, 50) with code 505"),
    (close(501, "FRAME_ERROR - type 3, all octets = <<>>: {frame_too_large,9,1}"), False,
     "stayed open"),
    (b"", True, "no connection.close"),
    (close(501, "FRAME_ERROR - type 3, all octets = <<>>: {frame_too_large,9,1}")[:-1]
     + b"\x00", True, "malformed frame"),
])
def test_the_checker_sees_an_answer_unlike_rabbitmq_s(answer, closed, problem):
    problems = check_answer(OVERSIZE, answer, closed)
    assert any(problem in found for found in problems), problems


def test_the_checker_sees_bad_codes_texts_and_methods_after_close():
    random_mutation = Mutation("random", "", b"")
    assert check_answer(random_mutation, close(404, "NOT_FOUND - no queue 'q'", (20, 40), 1),
                        closed=False) == []
    assert check_answer(random_mutation, close(404, "no queue 'q'", (20, 40), 1), False)
    assert check_answer(random_mutation, close(499, "WHATEVER - x"), True)
    after = close(505, "UNEXPECTED_FRAME - x") + close(404, "NOT_FOUND - x", (20, 40), 1)
    assert any("after connection.close" in problem
               for problem in check_answer(random_mutation, after, True))
    not_amqp = Mutation("not-amqp", "", b"", {"answer": PROTOCOL_HEADER})
    assert check_answer(not_amqp, PROTOCOL_HEADER, closed=True) == []
    assert check_answer(not_amqp, PROTOCOL_HEADER, closed=False)


def test_inter_node_port_attacks_never_know_the_cookie_and_expect_a_challenge_at_most():
    rng = random.Random(9)
    challenge = cluster_frame(encode_challenge(Challenge(b"n" * 32)))
    for _ in range(200):
        mutation = cluster_port_attack(rng, ["qq1@localhost", "qq2@localhost"], "c00kie")
        if mutation.detail.startswith("wrong-cookie"):
            hello, proof = FrameReader().feed(mutation.data)[:2]
            handshake = decode_handshake(hello)
            assert b"c00kie" not in mutation.data
            assert decode_proof(proof).digest != handshake_proof(
                "c00kie", INITIATOR, handshake, b"n" * 32)
        assert check_answer(mutation, b"", closed=True) == []
        assert check_answer(mutation, challenge, closed=True) == []
        assert check_answer(mutation, b"\x00\x00\x00\x03abc", closed=False)
        assert check_answer(mutation, challenge + challenge, closed=True)


def test_mutations_are_seeded_and_known_answers_cut_the_stream_at_the_damage():
    frames = [PROTOCOL_HEADER, frame(1, 0, b"\x00\x0a\x00\x0b"),
              frame(1, 0, struct.pack(">HHHIH", 10, 31, 0, 8192, 0)),
              frame(1, 0, b"\x00\x0a\x00\x28"), frame(1, 1, b"\x00\x14\x00\x0a"),
              frame(1, 1, b"\x00\x32\x00\x0a"), frame(1, 0, b"\x00\x0a\x00\x32")]
    mutator = Mutator(frames)
    assert mutator.frame_max == 8192
    assert mutator.mutate(random.Random(5)).data == mutator.mutate(random.Random(5)).data
    rng = random.Random(3)
    for _ in range(200):
        mutation = mutator.mutate(rng)
        if mutation.kind == "oversize-frame":
            assert len(mutation.data) < len(b"".join(frames))  # nothing after the header
        if mutation.kind not in ("random", "not-amqp"):
            assert mutation.data.startswith(b"".join(frames[:4]))  # the connection is open


def test_the_recorded_session_replays_cleanly():
    """Unmutated, the recording is a valid session: the broker answers it without a
    single close but the final close-ok (so known answers follow from the damage)."""
    with BrokerProcess() as broker:
        frames = record_session(broker.port)
        assert split_frames(b"".join(frames)) == frames
        answer, closed = attack(broker.port, Mutation("random", "", b"".join(frames)),
                                random.Random(1))
        parsed, problems = parse_answer(answer, closed)
    assert closed and not problems
    methods = [struct.unpack_from(">HH", payload) for kind, _c, payload in parsed if kind == 1]
    assert methods[-1] == (10, 51)
    assert (20, 40) not in methods and (10, 50) not in methods
    # The recording waited for each confirm; the replay sends everything at once, so
    # channel 1 may be closed before its publishes are confirmed, and a channel that
    # closes drops the confirms it still owes (RabbitMQ's channel does the same). So
    # the confirms are at most the three publishes', and the basic.get that follows
    # them on the same channel finds a message (routing is in order).
    assert methods.count((60, 80)) <= 3
    assert (60, 71) in methods and (60, 72) not in methods  # get-ok, never get-empty


def test_a_framing_error_while_the_client_sends_on_loses_none_of_the_answer():
    """The client has a large delivery waiting unread when it sends a bad frame end,
    then sends on. The broker stops reading there and closes; a socket closed with
    the client's bytes still arriving answers them with a TCP reset, which threw
    away the unsent tail of the delivery and the connection.close saying why (a
    short seeded attack found it). The answer now arrives whole, ending in
    RabbitMQ's 501 FRAME_ERROR close."""
    with BrokerProcess() as broker:
        frames = record_session(broker.port)
        nack = 23
        assert struct.unpack_from(">BHIHH", frames[nack]) == (1, 1, 13, 60, 120)
        bad_end = frames[nack][:-1] + bytes([FRAME_END ^ 1])
        with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as sock:
            sock.sendall(b"".join(frames[:nack]))  # ... basic.consume: the large delivery
            deadline = time.monotonic() + 60
            while _unread(sock) < 100_000:  # the delivery has begun, the client holds it
                assert time.monotonic() < deadline, "no delivery came"
                time.sleep(0.02)
            sock.sendall(bad_end)
            time.sleep(0.3)  # the broker has closed (before: the socket was gone)
            try:
                sock.sendall(b"".join(frames[nack + 1:]))
            except OSError:
                pass
            answer = bytearray()
            while received := _recv(sock):
                answer += received
    parsed, problems = parse_answer(bytes(answer), closed=True)
    assert problems == []
    kind, channel, payload = parsed[-1]
    assert (kind, channel) == (1, 0)
    assert struct.unpack_from(">HHH", payload) == (10, 50, 501)
    assert any(kind == 3 and len(body) == 37872 for kind, _c, body in parsed)  # its tail


def _unread(sock: socket.socket) -> int:
    """How many answer bytes wait for this client, unread."""
    try:
        return len(sock.recv(1 << 20, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except BlockingIOError:
        return 0


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except OSError:  # a reset
        return b""
