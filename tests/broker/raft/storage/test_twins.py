"""The storage's hand-inlined copies ("twins") agree with their originals on random
inputs: LogStore.append's checks of a run in C passes (`_one_run`) and its ENTRIES
records (`encode_run`) against the per-entry checks and `encode_entries`."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quorumqueue.broker.raft.storage import LogStore
from quorumqueue.broker.raft.storage.log_store import _check_entries, _one_run
from quorumqueue.broker.raft.storage.wal import OWN_BUFFER_BYTES, encode_entries
from quorumqueue.broker.raft.types import LogEntry

from .support import G1, config, log_of, reopen

# a well-formed run of 1 to 8 entries, and at most two faults at random places: an
# index, term, kind or data that is not (or that is, but ends the run)
FAULTS = {"index_repeats": (0, 0, 0, None), "index_skips": (2, 0, 0, None),
          "term_rises": (1, 1, 0, None), "term_falls": (1, -1, 0, None),
          "term_too_big": (1, 1 << 64, 0, None), "kind_changes": (1, 0, 1, None),
          "kind_256": (1, 0, 256, None), "kind_negative": (1, 0, -1, None),
          "data_str": (1, 0, 0, "text"), "data_bytearray": (1, 0, 0, bytearray(b"ba")),
          "data_big": (1, 0, 0, b"y" * OWN_BUFFER_BYTES)}
steps = st.tuples(st.sampled_from([0, 1]),                      # the run's term step
                  st.sampled_from([0, 1, 255, 0, 1, 256, -1]),  # the run's kind
                  st.lists(st.binary(max_size=24), min_size=1, max_size=8),
                  st.lists(st.tuples(st.integers(0, 7), st.sampled_from(sorted(FAULTS))),
                           max_size=2))


def entries_of(expected: int, last_term: int, drawn) -> list[LogEntry]:
    term_step, kind, bodies, faults = drawn
    at = {position % len(bodies): FAULTS[name] for position, name in faults}
    entries, index, term = [], expected - 1, last_term + term_step
    for position, body in enumerate(bodies):
        index_step, term_change, kind_change, data = at.get(position, (1, 0, 0, None))
        index, term = index + index_step, term + term_change
        entries.append(LogEntry(index, term, kind + kind_change,
                                body if data is None else data))
    return entries


@settings(max_examples=400, deadline=None)
@given(st.integers(1, 3), st.integers(0, 4), steps)
def test_a_run_checked_in_c_passes_is_what_the_per_entry_checks_accept(expected, last_term,
                                                                       drawn):
    """`_one_run` takes a run only if the per-entry checks accept every entry, of one
    term and kind, each under OWN_BUFFER_BYTES; its records are encode_entries'."""
    entries = entries_of(expected, last_term, drawn)
    run = _one_run(entries, expected, last_term)
    if run is None:
        return
    _check_entries(G1, entries, expected, last_term)  # raises if it took a bad one
    term, kind, run_datas, lengths = run
    assert len(entries) >= 2
    assert {(entry.term, entry.kind, type(entry.data)) for entry in entries} == {
        (term, kind, bytes)}
    assert run_datas == [entry.data for entry in entries]
    assert lengths == [len(entry.data) for entry in entries]
    assert max(lengths) < OWN_BUFFER_BYTES


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 4), steps)
def test_an_append_of_many_entries_keeps_or_refuses_them_as_the_per_entry_checks_say(
        tmp_path_factory, last_term, drawn):
    """LogStore.append of a run: refused with the per-entry checks' error, nothing
    kept; or kept, read back, recovered after a reopen, with the memory table's bytes
    of its data, and written as encode_entries writes it."""
    directory = tmp_path_factory.mktemp("store")
    store = LogStore(str(directory), config())
    store.append(G1, [LogEntry(1, last_term, 0, b"first")])
    entries = entries_of(2, last_term, drawn)
    try:
        _check_entries(G1, entries, 2, last_term)
    except ValueError as error:
        with pytest.raises(ValueError) as raised:
            store.append(G1, entries)
        assert str(raised.value) == str(error)
        assert store.last_index(G1) == 1
        return
    before, mem_before = len(store._pending.records), store.memtable_bytes(G1)
    store.append(G1, entries)
    assert store._pending.records[before:] == encode_entries(store._wal.gids[G1], entries)
    assert store.memtable_bytes(G1) - mem_before == sum(map(len, (e.data for e in entries))) + (
        (mem_before - len(b"first")) * len(entries))
    expected_log = [(1, last_term, 0, b"first")] + [
        (e.index, e.term, e.kind, bytes(e.data)) for e in entries]
    assert log_of(store, G1) == expected_log
    store.flush()
    store.close()
    assert log_of(reopen(directory), G1) == expected_log
