"""Differential test of the hostile-input fuzzer's known answers: RabbitMQ 3.10.8 and
quorumqueue answer a damaged session alike.

A pika session recorded against quorumqueue (tests/faults/mutations.py's
`record_session`) is damaged at a seeded frame after connection.open in the ways
whose answer RabbitMQ defines (`KNOWN_ANSWERS`: a protocol header that is not
AMQP, a bad frame end octet, a frame over frame_max, a heartbeat on a channel, an
unknown frame type) and sent to both brokers. Both must answer with the same
protocol header or the same first connection.close, code and text to the character
(the snippet of the bad frame and Erlang's line wrapping included).
"""

from __future__ import annotations

import random

import pytest

from tests.faults.hostile import attack, first_close
from tests.faults.mutations import Mutator, record_session

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
