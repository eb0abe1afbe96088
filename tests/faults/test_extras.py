"""The checkers of extras.py (single active consumer, at-least-once dead lettering) on
fabricated histories: each must pass a sound one and catch a broken one."""

from __future__ import annotations

from tests.faults.extras import (
    DlxHistory, SacDelivery, SacHistory, dlx_violations, sac_violations)


def sac_history(deliveries, faults=(), ends=None) -> SacHistory:
    ids = sorted({d[2] for d in deliveries})
    return SacHistory(published_at={i: float(int(i[2:])) for i in ids}, confirmed=set(ids),
                      deliveries=[SacDelivery(*d) for d in deliveries],
                      session_ends=dict(ends or {}), faults=list(faults))


def test_a_handover_after_a_partition_with_late_deliveries_to_the_old_consumer_passes():
    # s-1..s-3 to a-1; a-1's node cut off at 3.5 s (healed at 8 s); b-1 takes over
    # from s-4 (a-1's unacked s-3 comes back to it, redelivered); a-1 still receives
    # s-3 late, at the heal: it was handed out before the leader took a-1 for gone
    history = sac_history([
        (1.1, "a-1", "s-000001", False), (2.1, "a-1", "s-000002", False),
        (6.0, "b-1", "s-000003", True), (6.1, "b-1", "s-000004", False),
        (8.2, "a-1", "s-000003", False), (9.1, "b-1", "s-000009", False)],
        faults=[(3.5, 8.0)])
    assert sac_violations(history) == ([], {"handovers": 1, "sessions": 2, "fresh": 5})


def test_a_handover_after_the_old_session_ended_passes():
    history = sac_history([(1.1, "a-1", "s-000001", False), (2.5, "b-1", "s-000002", False)],
                          ends={"a-1": 2.4})
    assert sac_violations(history)[0] == []


def test_two_consumers_served_at_once_in_calm_are_caught():
    history = sac_history([
        (1.1, "a-1", "s-000001", False), (2.1, "b-1", "s-000002", False),
        (3.1, "a-1", "s-000003", False), (4.1, "b-1", "s-000004", False)],
        faults=[(30.0, 32.0)])
    found, counts = sac_violations(history)
    assert counts["handovers"] == 3
    assert found == ["single active consumer handed over with no fault and no session end "
                     "(two active): 3: a-1->b-1 between s-000001 and s-000002 (0.0-1.1s); "
                     "b-1->a-1 between s-000002 and s-000003 (1.0-2.1s); "
                     "a-1->b-1 between s-000003 and s-000004 (2.0-3.1s)"]


def test_a_consumer_receiving_out_of_queue_order_is_caught():
    history = sac_history([(1.1, "a-1", "s-000002", False), (1.2, "a-1", "s-000001", False)])
    assert sac_violations(history)[0] == [
        "session a-1 received out of queue order: 1 ids: s-000001"]


def test_every_rejected_message_reaching_the_target_passes_duplicates_counted():
    history = DlxHistory(published={"d-000001", "d-000002", "d-000003", "d-000006"},
                         confirmed={"d-000001", "d-000002", "d-000003", "d-000006"},
                         source_delivered={"d-000001", "d-000002", "d-000003", "d-000006"},
                         rejected={"d-000003"},
                         target=["d-000003", "d-000006", "d-000003"])
    assert dlx_violations(history) == ([], {"rejected": 2, "in_target": 2,
                                            "target_duplicates": 1})


def test_a_lost_dead_letter_and_a_stray_one_are_caught():
    history = DlxHistory(published={"d-000001", "d-000002", "d-000003", "d-000006"},
                         confirmed={"d-000001", "d-000003", "d-000006"},
                         source_delivered={"d-000003", "d-000006"},
                         rejected={"d-000003", "d-000006"},
                         target=["d-000003", "d-000002"])
    found, counts = dlx_violations(history)
    assert found == [
        "rejected but never in the dead-letter target (lost): 1 ids: d-000006",
        "confirmed but never delivered from the source (lost): 1 ids: d-000001",
        "in the dead-letter target but never rejected or never published: 1 ids: d-000002"]
    assert counts["in_target"] == 1


def test_a_rejected_subset_id_the_source_never_handed_out_is_reported_apart():
    """Still ready in the source (a consumer stuck): not the dead-letter worker's loss."""
    history = DlxHistory(published={"d-000003", "d-000006"},
                         confirmed={"d-000003", "d-000006"},
                         source_delivered={"d-000003"}, rejected={"d-000003"},
                         target=["d-000003"])
    assert dlx_violations(history)[0] == [
        "confirmed, never rejected by the source consumer, never in the dead-letter "
        "target (lost before dead lettering): 1 ids: d-000006"]
