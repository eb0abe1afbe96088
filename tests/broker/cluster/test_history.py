"""The fault-test checker (tests/support/history.py) on hand-built histories, then the
workload's clients against one real broker killed with SIGKILL mid-run.

The rules: every confirmed message is delivered at least once, no
message appears that was never published, nothing unconfirmed appears twice as new.
"""

from __future__ import annotations

import time

import pytest

from tests.support.cluster import CONVERGE_TIMEOUT
from tests.support.history import (Delivery, History, Workload, check, report,
                                   violations)


def history(published=(), confirmed=(), nacked=(), unknown=(), deliveries=(),
            acked=None) -> History:
    """deliveries: ids, or (id, redelivered) pairs."""
    made = [Delivery(d, False) if isinstance(d, str) else Delivery(*d) for d in deliveries]
    return History(published=list(published), confirmed=list(confirmed),
                   nacked=list(nacked), unknown=list(unknown), deliveries=made,
                   acked=list(acked if acked is not None else (d.id for d in made)))


# -- histories that pass ------------------------------------------------------------


def test_every_confirmed_message_delivered_once_passes_with_counts():
    counts = check(history(published=["a", "b", "c"], confirmed=["a", "b", "c"],
                           deliveries=["a", "b", "c"]))
    assert counts == report(history(published=["a", "b", "c"], confirmed=["a", "b", "c"],
                                    deliveries=["a", "b", "c"]))
    assert (counts.published, counts.confirmed, counts.delivered, counts.deliveries,
            counts.acked) == (3, 3, 3, 3, 3)
    assert str(counts).startswith("published 3: confirmed 3, nacked 0, unknown 0")


def test_redeliveries_of_a_message_are_allowed():
    counts = check(history(published=["a"], confirmed=["a"],
                           deliveries=["a", ("a", True), ("a", True)]))
    assert (counts.deliveries, counts.delivered, counts.redelivered,
            counts.duplicated_new) == (3, 1, 2, 0)


@pytest.mark.parametrize("outcome", ["unknown", "nacked"])
def test_unconfirmed_messages_may_be_lost_or_delivered_once(outcome):
    lost = history(published=["a", "b"], confirmed=["a"], deliveries=["a"],
                   **{outcome: ["b"]})
    kept = history(published=["a", "b"], confirmed=["a"], deliveries=["a", "b"],
                   **{outcome: ["b"]})
    assert violations(lost) == [] and violations(kept) == []
    assert getattr(check(kept), outcome) == 1


def test_a_confirmed_message_twice_as_new_passes_unless_strict():
    twice = history(published=["a"], confirmed=["a"], deliveries=["a", "a"])
    assert check(twice).duplicated_new == 1
    assert violations(twice, strict_duplicates=True) == [
        "delivered twice or more with redelivered=false: 1 ids: a (x2)"]


def test_published_but_never_confirmed_or_delivered_passes():
    assert violations(history(published=["a", "b"], confirmed=["a"], unknown=["b"],
                              deliveries=["a"])) == []


# -- each violation -----------------------------------------------------------------


def test_a_confirmed_message_never_delivered_is_lost():
    found = violations(history(published=["a", "b", "c"], confirmed=["a", "b", "c"],
                               deliveries=["b"]))
    assert found == ["confirmed but never delivered (lost): 2 ids: a, c"]


def test_a_delivered_message_never_published_is_invented():
    found = violations(history(published=["a"], confirmed=["a"],
                               deliveries=["a", "zz", ("yy", True)]))
    assert found == ["delivered but never published: 2 ids: yy, zz"]


def test_an_unconfirmed_message_twice_as_new_is_duplicated():
    found = violations(history(published=["a", "b"], confirmed=["a"], unknown=["b"],
                               deliveries=["a", "b", "b", ("b", True)]))
    assert found == ["not confirmed, yet delivered twice or more with redelivered=false: "
                     "1 ids: b (x2)"]


def test_every_violation_is_reported_at_once_with_the_counts():
    broken = history(published=["a", "b"], confirmed=["a"], unknown=["b"],
                     deliveries=["b", "b", "ghost"])
    with pytest.raises(AssertionError) as raised:
        check(broken)
    message = str(raised.value)
    assert message.splitlines()[1:4] == [
        "- confirmed but never delivered (lost): 1 ids: a",
        "- delivered but never published: 1 ids: ghost",
        "- not confirmed, yet delivered twice or more with redelivered=false: 1 ids: b (x2)",
    ]
    assert "(published 2: confirmed 1, nacked 0, unknown 1; delivered 2 ids in 3 " \
           "deliveries (0 redelivered, 1 ids twice as new); acked 2)" in message


def test_long_lists_of_ids_are_cut_short_with_the_total():
    ids = [f"m-{i:03d}" for i in range(25)]
    [found] = violations(history(published=ids, confirmed=ids))
    assert found.startswith("confirmed but never delivered (lost): 25 ids: m-000, m-001")
    assert found.endswith("m-019 ... and 5 more")


def test_the_history_serializes_for_artifacts():
    import json

    dumped = json.loads(history(published=["a"], confirmed=["a"],
                                deliveries=[("a", True)]).to_json())
    assert dumped["deliveries"] == [["a", True, ""]] and dumped["confirmed"] == ["a"]


# -- the clients, against one real node -----------------------------------------------


@pytest.mark.timeout(300)  # the waits inside have their own bounds
def test_the_workload_reconnects_after_a_kill_and_the_history_checks(fresh_broker):
    queue = "history-kill"
    with Workload([fresh_broker.uri], queue, interval=0.002) as workload:
        _wait(lambda: len(workload.history.confirmed) >= 30, "30 confirms")
        fresh_broker.stop(kill=True)
        fresh_broker.start()
        before = len(workload.history.confirmed)
        _wait(lambda: len(workload.history.confirmed) >= before + 30,
              "30 more confirms after the restart")
        result = workload.finish(drain_timeout=CONVERGE_TIMEOUT)
    counts = check(result)
    assert workload.publisher.connections >= 2 and workload.consumer.connections >= 2
    assert counts.confirmed >= 60 and counts.delivered >= counts.confirmed
    assert set(result.acked) <= {d.id for d in result.deliveries}


def _wait(condition, what: str, timeout: float = CONVERGE_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
