"""broker/raft/forwarded.py: a forwarded command's identity in its entry, and the window
of identities a group applied (what each member uses to apply a command forwarded
twice only once). The byte layouts are those FORMAT.md gives ("Forwarded commands").
"""

from __future__ import annotations

import random

import pytest

from quorumqueue.broker.raft import forwarded
from quorumqueue.broker.raft.forwarded import (MAX_ORIGINS, WINDOW, AppliedIds, Identity,
                                                dump_snapshot, load_snapshot, unwrap, wrap)

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
    assert data.startswith(b"QQAI\x00\x01")
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
    data[5] = 2
    with pytest.raises(ValueError, match="unknown applied-identities snapshot version 2"):
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
