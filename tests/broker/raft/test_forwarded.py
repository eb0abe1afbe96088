"""broker/raft/forwarded.py: a forwarded command's identity in its entry, and the window
of identities a group applied (what each member uses to apply a command forwarded
twice only once). The byte layouts are those FORMAT.md gives ("Forwarded commands").
"""

from __future__ import annotations

import random

import pytest

from quorumqueue.broker.raft import forwarded
from quorumqueue.broker.raft.forwarded import (APPLY, HELD, MAX_ORIGINS, SEEN, WINDOW,
                                                AppliedIds, Identity, dump_snapshot,
                                                load_snapshot, unwrap, wrap)

ORIGIN = 0x0123456789ABCDEF


def ident(seq: int, origin: int = ORIGIN, awaited: bool = True) -> Identity:
    return Identity(origin, seq, awaited)


def test_the_wrapper_is_the_documented_bytes_and_unwraps():
    data = wrap(ident(5), b"\x07")
    assert data == bytes.fromhex("fe01" "0123456789abcdef" "0000000000000005") + b"\x07"
    assert unwrap(data) == (ident(5), b"\x07")
    assert unwrap(wrap(ident(6, awaited=False), b"{}")) == (ident(6, awaited=False), b"{}")


@pytest.mark.parametrize("data", [b"\x01\x00", b"\xff" + bytes(8) + b"\x0d", b'{"op":1}'])
def test_an_entry_without_an_identity_is_the_command_as_it_was(data):
    assert unwrap(data) == (None, data)


def test_a_damaged_or_newer_wrapper_is_refused():
    with pytest.raises(ValueError, match="shorter than its 18-byte identity"):
        unwrap(b"\xfe\x01\x00")
    with pytest.raises(ValueError, match="unknown flags 0x03"):
        unwrap(b"\xfe\x03" + bytes(16) + b"\x07")


def test_an_identity_applied_is_seen_and_keeps_its_reply():
    applied = AppliedIds()
    assert not applied.seen(ident(1))
    applied.record(ident(1), 10, ("error", 406, "PRECONDITION_FAILED - x"))
    applied.record(ident(2, awaited=False), 11, 3)  # nobody waits: not kept
    assert applied.seen(ident(1)) and applied.seen(ident(2))
    assert applied.reply(ident(1)) == ("error", 406, "PRECONDITION_FAILED - x")
    assert applied.reply(ident(2)) is None
    assert not applied.seen(ident(1, origin=ORIGIN + 1))  # another node's run
    assert not applied.seen(ident(3))


def test_identities_applied_out_of_order_inside_the_window():
    """Retries append a node's forwards out of order: a seq below the highest one
    applied is new until it is applied, and seen after."""
    applied = AppliedIds()
    for seq in (1, 2, 5, 3):
        applied.record(ident(seq), seq, None)
    assert [applied.seen(ident(s)) for s in range(1, 7)] == [True, True, True, False, True,
                                                             False]
    applied.record(ident(4), 9, "x")
    assert applied.seen(ident(4)) and applied.reply(ident(4)) == "x"


def test_an_origin_first_seen_above_one_remembers_what_it_has_not_applied():
    applied = AppliedIds()
    applied.record(ident(7), 1, None)
    assert not any(applied.seen(ident(s)) for s in range(1, 7))
    applied.record(ident(3), 2, None)
    assert applied.seen(ident(3)) and not applied.seen(ident(4))


def test_the_window_is_bounded_and_older_seqs_are_applied_again():
    applied = AppliedIds()
    applied.record(ident(1), 1, "first")
    applied.record(ident(3), 2, None)          # 2 missing
    applied.record(ident(2 + WINDOW), 3, None)
    window = applied.origins[ORIGIN]
    assert window.floor == 2 and min(window.missing) == 4 and window.replies == {}
    # below the floor nothing is known: applied (at least once, never lost)
    assert not applied.seen(ident(1)) and not applied.seen(ident(2))
    applied.record(ident(10 * WINDOW), 4, None)  # a jump: missing stays within WINDOW
    assert len(applied.origins[ORIGIN].missing) == WINDOW - 1


def test_at_most_max_origins_and_the_least_recent_goes():
    applied = AppliedIds()
    for origin in range(MAX_ORIGINS):
        applied.record(ident(1, origin=origin), origin + 1, None)
    applied.record(ident(2, origin=0), 100, None)   # origin 0 is the most recent now
    applied.record(ident(1, origin=999), 101, None)
    assert len(applied.origins) == MAX_ORIGINS
    assert not applied.seen(ident(1, origin=1)) and applied.seen(ident(1, origin=0))


def test_two_members_applying_the_same_entries_agree():
    """Deterministic: the same entries in the same order give the same window (what
    makes it replicated state), whatever the replies' object identity."""
    rng = random.Random(7)
    entries = [ident(rng.randint(1, 3 * WINDOW), origin=rng.randint(1, 40),
                     awaited=rng.random() < 0.5) for _ in range(5000)]
    members = [AppliedIds(), AppliedIds()]
    for applied in members:
        for index, identity in enumerate(entries, 1):
            if not applied.seen(identity):
                applied.record(identity, index, [index])
    assert members[0] == members[1]


def test_a_snapshot_holds_the_identities_and_the_machines_bytes():
    applied = AppliedIds()
    applied.record(ident(1), 4, ("error", 404, "NOT_FOUND - gone"))
    applied.record(ident(4), 5, None)
    applied.record(ident(1, origin=9), 6, None)
    data = dump_snapshot(applied, b"QQFS machine", list)
    assert data.startswith(b"QQAI\x00\x02")
    restored, machine = load_snapshot(data, tuple)
    assert machine == b"QQFS machine" and restored == applied
    assert restored.reply(ident(1)) == ("error", 404, "NOT_FOUND - gone")
    assert restored.seen(ident(4)) and not restored.seen(ident(2))
    # the eviction order survives too
    assert list(restored.origins) == list(applied.origins) == [ORIGIN, 9]


def test_a_snapshot_written_before_identities_is_the_machines_alone():
    applied, machine = load_snapshot(b"QQFS\x00\x03...", tuple)
    assert machine == b"QQFS\x00\x03..." and applied == AppliedIds()
    applied, machine = load_snapshot(b'{"version": 1}', tuple)
    assert machine == b'{"version": 1}' and not applied.origins


def test_a_snapshot_of_an_unknown_version_is_refused():
    data = bytearray(dump_snapshot(AppliedIds(), b"", list))
    data[5] = 3
    with pytest.raises(ValueError, match="unknown applied-identities snapshot version 3"):
        load_snapshot(bytes(data), tuple)


def test_no_command_or_envelope_starts_with_the_wrappers_octet():
    from quorumqueue.broker.fifo import commands, envelope

    assert forwarded.FORWARDED != envelope.TIMED
    with pytest.raises(ValueError, match="unknown fifo command tag 254"):
        commands.decode(bytes([forwarded.FORWARDED]) + bytes(32))


@pytest.mark.parametrize("seed", range(5))
def test_admit_and_keep_reply_are_seen_and_record_in_one_call(seed):
    """The apply loop's `admit` (then `keep_reply`) decides and records exactly as
    `seen` then `record` do: the same entries skipped, the same windows, replies and
    eviction order, over forwards out of order, repeated, past WINDOW and from more
    than MAX_ORIGINS origins."""
    rng = random.Random(seed)
    origins = [rng.getrandbits(64) for _ in range(MAX_ORIGINS + 4)]
    entries = []
    for _ in range(3000):
        origin = rng.choice(origins[:3]) if rng.random() < 0.9 else rng.choice(origins)
        seq = max(1, rng.randint(0, 2 * WINDOW + 50) if rng.random() < 0.2
                  else rng.randint(1, 60))
        entries.append(Identity(origin, seq, rng.random() < 0.5))
    entries += [Identity(origins[0], seq, True) for seq in range(1, WINDOW + 300)]
    by_two_calls, by_admit = AppliedIds(), AppliedIds()
    for index, identity in enumerate(entries, start=1):
        reply = rng.choice([None, "ok", index])
        skipped = by_two_calls.seen(identity)
        if not skipped:
            by_two_calls.record(identity, index, reply)
        admitted = by_admit.admit(identity, index)
        if admitted:
            by_admit.keep_reply(identity, reply)
        assert admitted is not skipped, (index, identity)
    assert by_admit == by_two_calls
    assert list(by_admit.origins) == list(by_two_calls.origins)  # the eviction order


def test_a_seq_resent_after_window_later_forwards_were_applied_is_applied_not_skipped():
    """The resend of a forward lost with its leader, appended after WINDOW later
    forwards of its node were applied (a follower publishing fast while the leader
    changes): the apply loop's `admit` lets it through, whether it was never applied
    (it is stored: nothing confirmed is lost) or was applied already (stored twice:
    at least once). Nothing below the floor is ever taken for applied."""
    applied = AppliedIds()
    for seq in range(2, WINDOW + 100):             # seq 1 lost with the old leader
        assert applied.admit(Identity(ORIGIN, seq, True), seq)
    assert applied.origins[ORIGIN].floor > 1
    assert not applied.seen(Identity(ORIGIN, 1, True))
    assert applied.admit(Identity(ORIGIN, 1, True), WINDOW + 100)   # the resend: applied
    # one applied before, then WINDOW later ones: applied again (a duplicate, not a loss)
    assert applied.admit(Identity(ORIGIN, 2, True), WINDOW + 101)
    # inside the window a repeat is still skipped
    assert not applied.admit(Identity(ORIGIN, WINDOW + 99, True), WINDOW + 102)


# -- order: admit_in_order, take_released ------------------------------------------------


def apply_in_order(applied: AppliedIds, appends, start: int = 1) -> list[tuple[int, int]]:
    """What a member applies, as (origin, seq), for identities appended at indexes
    start, start + 1, ...: before each entry what the one before let through (as
    queues/quorum/groups.py does), then the entry if admitted; at the end what is due."""
    out = []
    for index, identity in enumerate(appends, start):
        if index >= applied.give_up_at:
            applied.give_up(index)
        while (released := applied.take_released()) is not None:
            out.append((released[0].origin, released[0].seq))
        if applied.admit_in_order(identity, index, 1) == APPLY:
            out.append((identity.origin, identity.seq))
    while (released := applied.take_released()) is not None:
        out.append((released[0].origin, released[0].seq))
    return out


def apply_until(applied: AppliedIds, appends, cut: int) -> list[tuple[int, int]]:
    """apply_in_order of appends[:cut] but for what the last entry let through: the
    point where the apply loop takes a snapshot (the entry's effects)."""
    out = apply_in_order(applied, appends[:cut - 1]) if cut > 1 else []
    index, identity = cut, appends[cut - 1]
    if index >= applied.give_up_at:
        applied.give_up(index)
    while (released := applied.take_released()) is not None:
        out.append((released[0].origin, released[0].seq))
    if applied.admit_in_order(identity, index, 1) == APPLY:
        out.append((identity.origin, identity.seq))
    return out


def shuffled_with_repeats(rng: random.Random, origins, count: int) -> list[Identity]:
    """Each origin's seqs 1..count, each appended 1-3 times, in an order where an
    append comes at most a few dozen places early (retries after a leader change)."""
    appends = [(seq + rng.random() * 30, Identity(origin, seq, True))
               for origin in origins for seq in range(1, count + 1)
               for _ in range(rng.choice((1, 1, 1, 2, 3)))]
    return [identity for _key, identity in sorted(appends, key=lambda item: item[0])]


@pytest.mark.parametrize("seed", range(5))
def test_each_origins_forwards_are_applied_once_in_their_seq_order(seed):
    """However a node's forwards are reordered and repeated in the log (within the
    window), each is applied once, in the order its node sent it."""
    rng = random.Random(seed)
    origins = [rng.getrandbits(64) for _ in range(3)]
    applied = AppliedIds()
    out = apply_in_order(applied, shuffled_with_repeats(rng, origins, 200))
    for origin in origins:
        assert [seq for o, seq in out if o == origin] == list(range(1, 201))
    assert applied.lowest_pending() is None and not applied.released


@pytest.mark.parametrize("seed", range(5))
def test_a_snapshot_at_any_point_restored_then_the_rest_applies_as_a_full_run(seed):
    rng = random.Random(seed)
    appends = shuffled_with_repeats(rng, [1, 2], 80)
    whole = AppliedIds()
    expected = apply_in_order(whole, appends)
    for cut in rng.sample(range(1, len(appends)), 8):
        first = AppliedIds()
        before = apply_until(first, appends, cut)
        restored, machine = load_snapshot(dump_snapshot(first, b"m", list), tuple)
        assert restored == first and machine == b"m"
        assert before + apply_in_order(restored, appends[cut:], cut + 1) == expected
        assert restored == whole


def test_a_repeat_of_a_held_forward_waits_beside_it_and_is_handed_out_with_it():
    applied = AppliedIds()
    assert applied.admit_in_order(ident(1), 1, 1) == APPLY
    assert applied.admit_in_order(ident(3), 2, 1) == HELD
    assert applied.admit_in_order(ident(3), 3, 2) == HELD     # appended again
    assert applied.lowest_pending() == 2 and applied.pending_indexes() == [2, 3]
    assert applied.take_released() is None
    assert applied.admit_in_order(ident(2), 4, 2) == APPLY
    assert applied.take_released() == (ident(3), [(2, 1, 0), (3, 2, 0)])
    assert applied.take_released() is None and applied.lowest_pending() is None
    assert applied.admit_in_order(ident(3), 5, 2) == SEEN


def test_a_forward_more_than_window_above_the_highest_applied_gives_the_gap_up():
    """The window tells apart only WINDOW seqs: a held forward that far ahead means the
    gap will not fill (its node gave up or died); what is held goes, in order, and the
    seqs skipped are applied if they still come."""
    applied = AppliedIds()
    applied.admit_in_order(ident(1), 1, 1)
    assert applied.admit_in_order(ident(3), 2, 1) == HELD
    assert applied.admit_in_order(ident(WINDOW + 2), 3, 1) == HELD
    assert [applied.take_released()[0].seq for _ in range(2)] == [3, WINDOW + 2]
    assert applied.take_released() is None
    assert applied.admit_in_order(ident(2), 4, 1) == APPLY   # late (at the floor now)
    assert applied.admit_in_order(ident(3), 5, 1) == SEEN    # a repeat inside the window


def test_a_held_gap_is_given_up_hold_entries_after_its_oldest_entry():
    applied = AppliedIds()
    applied.admit_in_order(ident(1), 1, 1)
    applied.admit_in_order(ident(3), 2, 1)
    assert applied.give_up_at == 2 + forwarded.HOLD_ENTRIES
    applied.give_up(applied.give_up_at - 1)
    assert applied.take_released() is None
    applied.give_up(applied.give_up_at)
    assert applied.take_released()[0].seq == 3 and applied.give_up_at == forwarded.NEVER


def test_a_held_gap_is_given_up_by_an_entry_stamped_hold_ms_after_it():
    """By leader time too: the entry HOLD_MS after the held one's own stamp (an idle
    queue's leader proposes a Tick then), not this member's clock."""
    applied = AppliedIds()
    applied.admit_in_order(ident(1), 1, 1, 5_000)
    applied.admit_in_order(ident(3), 2, 1, 6_000)
    applied.admit_in_order(ident(4), 3, 1, 7_000)
    assert applied.give_up_ms == 6_000 + forwarded.HOLD_MS
    applied.give_up(4, 5_999 + forwarded.HOLD_MS)
    assert applied.take_released() is None
    restored, _machine = load_snapshot(dump_snapshot(applied, b"", list), tuple)
    assert restored == applied and restored.give_up_ms == applied.give_up_ms
    restored.give_up(5, 6_000 + forwarded.HOLD_MS)
    assert [restored.take_released()[0].seq for _ in range(2)] == [3, 4]
    assert restored.give_up_ms == forwarded.NEVER


def test_an_origin_holding_forwards_is_not_evicted():
    applied = AppliedIds()
    applied.admit_in_order(ident(2, origin=0), 1, 1)            # waits for 1
    for origin in range(1, MAX_ORIGINS + 5):
        applied.admit_in_order(ident(1, origin=origin), origin + 1, 1)
    assert 0 in applied.origins and len(applied.origins) == MAX_ORIGINS
    applied.admit_in_order(ident(1, origin=0), 100, 1)
    assert applied.take_released()[0] == ident(2, origin=0)


def test_a_version_1_snapshot_loads_with_nothing_pending_and_keeps_order_after():
    """A snapshot written before pending entries existed (version 1, origins of six
    fields) restores its windows; forwards after it are held and ordered."""
    document = (b'{"origins":[["0123456789abcdef",0,4,5,[2],[[1,["error",404,"NOT_FOUND - '
                b'gone"]]]]]}')
    data = b"QQAI\x00\x01" + len(document).to_bytes(4, "big") + document + b"QQFS m"
    applied, machine = load_snapshot(data, tuple)
    assert machine == b"QQFS m" and applied.lowest_pending() is None
    assert applied.reply(ident(1)) == ("error", 404, "NOT_FOUND - gone")
    assert applied.seen(ident(3)) and not applied.seen(ident(2))
    assert apply_in_order(applied, [ident(6), ident(2), ident(5), ident(4)], 6) == [
        (ORIGIN, 2), (ORIGIN, 5), (ORIGIN, 6)]   # 6 waited for 5; 4 was applied before
