"""minMessagesPerTrigger with maxTriggerDelay (connector/admission.py), pure: the gate
a reader asks before planning a batch, with time passed in (milliseconds).

As Kafka's minOffsetsPerTrigger/maxTriggerDelay: fewer messages than the minimum wait,
but never longer than the delay since the last batch (or since the first question)."""

from __future__ import annotations

from quorumqueue.connector.admission import MinimumGate


def test_enough_messages_make_a_batch_at_once():
    gate = MinimumGate(min_messages=10, max_delay_ms=60_000)
    assert gate.admit(10, now_ms=0)
    assert gate.admit(25, now_ms=1)


def test_too_few_wait_until_the_delay_has_passed_since_the_first_question():
    gate = MinimumGate(min_messages=10, max_delay_ms=60_000)
    assert not gate.admit(3, now_ms=1_000)
    assert not gate.admit(9, now_ms=60_999)
    assert gate.admit(9, now_ms=61_000)


def test_the_delay_runs_again_from_each_batch():
    gate = MinimumGate(min_messages=10, max_delay_ms=1_000)
    assert gate.admit(10, now_ms=5_000)          # a batch at 5 s
    assert not gate.admit(2, now_ms=5_999)
    assert gate.admit(2, now_ms=6_000)           # the delay passed: the trickle goes
    assert not gate.admit(2, now_ms=6_500)       # ... and the next wait starts there


def test_nothing_available_never_makes_a_batch_however_long_it_waited():
    gate = MinimumGate(min_messages=1, max_delay_ms=10)
    assert not gate.admit(0, now_ms=0)
    assert not gate.admit(0, now_ms=1_000_000)
    assert gate.admit(1, now_ms=1_000_001)
