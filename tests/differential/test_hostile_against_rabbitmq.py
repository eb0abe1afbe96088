"""Differential test of the hostile-input fuzzer's known answers: RabbitMQ 3.10.8 and
quorumqueue answer a damaged session alike.

A pika session recorded against quorumqueue (tests/faults/mutations.py's
`record_session`) is damaged at a seeded frame after connection.open in the ways
whose answer RabbitMQ defines (`KNOWN_ANSWERS`: a protocol header that is not
AMQP, a bad frame end octet, a frame over frame_max, a heartbeat on a channel, an
unknown frame type) and sent to both brokers. Both must answer with the same
protocol header or the same first connection.close, code and text to the character
(the snippet of the bad frame and Erlang's line wrapping included). So must frames
out of place that comparing the fuzzer's random damage on both brokers found
answered differently (fixed since).
"""

from __future__ import annotations

import random
import struct

import pytest

from tests.faults.hostile import attack, first_close
from tests.faults.mutations import Mutation, Mutator, record_session

MUTATIONS = 30


@pytest.fixture(scope="module")
def mutator(broker) -> Mutator:
    return Mutator(record_session(broker.port))


@pytest.mark.parametrize("seed", range(MUTATIONS))
def test_a_damaged_session_is_answered_as_rabbitmq_answers_it(seed, mutator, rabbitmq,
                                                              broker):
    mutation = mutator.known(random.Random(seed))
    theirs = first_close(*attack(rabbitmq.port, mutation, random.Random(seed),
                                 until_close=True))
    ours = first_close(*attack(broker.port, mutation, random.Random(seed), until_close=True))
    assert theirs != ("no connection.close",), mutation.detail
    assert ours == theirs, mutation.detail


def _raw(frame_type: int, channel: int, payload: bytes) -> bytes:
    return struct.pack(">BHI", frame_type, channel, len(payload)) + payload + b"\xce"


# the recorded frames: 0 protocol header, 1 start-ok, 2 tune-ok, 3 open, 4 channel.open
DAMAGED_SESSIONS = {
    "tune-ok after open": lambda f: f[:4] + [f[2]],
    "start-ok after open": lambda f: f[:4] + [f[1]],
    "basic.qos on channel 0": lambda f: f[:4] + [_raw(1, 0, struct.pack(">HHIHB", 60, 10,
                                                                        0, 1, 0))],
    "tune-ok twice": lambda f: f[:3] + [f[2]],
    "channel.close-ok on channel 0 before open": lambda f: f[:3] + [
        _raw(1, 0, struct.pack(">HH", 20, 41))],
    "channel.open before connection.open": lambda f: f[:3] + [f[4]],
    "content body on an unopened channel": lambda f: f[:5] + [_raw(3, 5, b"abc")],
    "content header on an unopened channel": lambda f: f[:5] + [
        _raw(2, 5, struct.pack(">HHQH", 60, 0, 3, 0))],
}


@pytest.mark.parametrize("case", sorted(DAMAGED_SESSIONS))
def test_frames_out_of_place_are_answered_as_rabbitmq_answers_them(case, mutator, rabbitmq,
                                                                   broker):
    """Found by comparing the fuzzer's random damage on both brokers: once tuned, a
    method channel 0 has no use for is rabbit_reader's 504 "unexpected method in
    connection state opening|running", a frame off channel 0 before open-ok is 505
    with the frame's snippet, and content as a channel's first frame is 505. (Before
    tune-ok RabbitMQ closes without a word, quorumqueue with a 503 saying why.)"""
    mutation = Mutation("x", case, b"".join(DAMAGED_SESSIONS[case](mutator.frames)))
    theirs = first_close(*attack(rabbitmq.port, mutation, random.Random(1), until_close=True))
    ours = first_close(*attack(broker.port, mutation, random.Random(1), until_close=True))
    assert theirs != ("no connection.close",)
    assert ours == theirs
