"""What each quorum queue's log means now: which entries are live, where the cursors are.

Responsibilities: for every group in a node's data directory, the facts the analyses
need beyond the raw rows of log_files.py — the snapshot index, the release cursor
the store has applied, the lowest index the queue still needs, the last index, and
the set of live raft indexes (message bodies still ready, returned, checked out or
leased), computed exactly as the broker would after a restart.

How it works: the broker's own recovery (`broker/raft/storage/recovery.py`) runs in
read-only mode over the files — the same replay rules as FORMAT.md, changing nothing
on disk — and yields each group's segments, memory table and snapshot. The queue's
fifo state is restored from the snapshot (or, without one, from the queue's
arguments in metadata.json) and the COMMAND entries above the snapshot are applied
with the broker's pure state machine (`broker/fifo/machine.py`), skipping a forwarded
command whose identity was applied before and holding one that came before a lower
seq of its node until its turn, as every member does (the identities applied and
held come from the snapshot too: `broker/raft/forwarded.py`). `live_indexes` and
`lowest_live_index` of that state are the answer.

Invariants: nothing is written; the result equals the state a broker restarted on
these files would hold (the machine is deterministic).

Not here: the raw rows (log_files.py), Spark, the analyses.
"""

from __future__ import annotations

import os
from array import array
from dataclasses import dataclass

from ..broker.fifo import snapshot as fifo_snapshot
from ..broker.fifo.commands import Meta, decode_reply
from ..broker.fifo.envelope import TIMED, TIMED_HEAD, decode_entry
from ..broker.fifo.machine import apply, live_indexes, lowest_live_index
from ..broker.fifo.state import FifoState, fifo_config
from ..broker.raft.forwarded import HELD, SEEN, AppliedIds, load_snapshot, unwrap
from ..broker.raft.storage.errors import CorruptLogError
from ..broker.raft.storage.group_state import GroupState
from ..broker.raft.storage.layout import QUORUM_DIR, SNAPSHOT_FILE, SNAPSHOTS_DIR
from ..broker.raft.storage.recovery import recover
from ..broker.raft.storage.segments import SegmentReader, SegmentRef, parse_segment
from ..broker.raft.storage.snapshots import read_snapshot_file
from ..broker.raft.types import COMMAND, LogEntry
from ..broker.storage.metadata_store import decode_arguments, load_document
from .log_files import LogReadError, queue_of


@dataclass(frozen=True)
class GroupLiveness:
    group: str
    vhost: str | None
    queue: str | None
    snapshot_index: int
    release_cursor: int        # what the store has released (RELEASE records): below it, gone
    lowest_live: int | None    # the lowest index the queue still needs (None: none)
    last_index: int
    live: array                # live raft indexes, ascending ("Q"), held forwards too
    messages: int = 0          # in the queue: ready, returned, checked out or leased
    returned: int = 0          # of those, returned at least once (a delivery count kept)
    state_bytes: int = 0       # the machine's own figure for its per-message metadata
    memtable_bytes: int = 0    # the group's entries a node holds in memory (WAL not rolled)

    @property
    def frees_up_to(self) -> int:
        """Entries below this may go: the release cursor the machine would set now."""
        return self.lowest_live if self.lowest_live is not None else self.last_index + 1


def liveness(data_dir: str) -> dict[str, GroupLiveness]:
    """Every quorum-queue group of the node whose data directory this is."""
    root = os.path.join(data_dir, QUORUM_DIR)
    readers = _Readers()
    try:
        recovered = recover(root, fsync=False, segment_term=readers.term_at, readonly=True)
        arguments = _queue_arguments(data_dir)
        return {uid: _group(root, uid, state, arguments.get(uid, {}), readers)
                for uid, state in sorted(recovered.groups.items())
                if queue_of(uid) != (None, None)}
    except CorruptLogError as error:
        raise LogReadError(f"{error}. The broker would refuse to start on these files too"
                           ) from None
    finally:
        readers.close()


def _group(root: str, uid: str, state: GroupState, arguments: dict,
           readers: "_Readers") -> GroupLiveness:
    applied, fifo = _restored(root, state, arguments)
    replay = _Replay(state, readers, applied, fifo)
    for entry in _entries(state, state.snapshot_index + 1, readers):
        replay.entry(entry)
    replay.released()
    fifo = replay.fifo
    vhost, queue = queue_of(uid)
    live = live_indexes(fifo)
    messages = len(live)
    lowest = lowest_live_index(fifo)
    pending = replay.applied.pending_indexes()
    if pending:  # held forwards: the log keeps them as it keeps messages
        live = array("Q", sorted([*live, *pending]))
        lowest = pending[0] if lowest is None else min(lowest, pending[0])
    return GroupLiveness(uid, vhost, queue, state.snapshot_index, state.release_cursor,
                         lowest, state.last_index(), live,
                         messages=messages, returned=len(fifo.delivery_counts),
                         state_bytes=fifo.metadata_bytes(), memtable_bytes=state.mem.nbytes)


class _Replay:
    """The broker's apply loop over a group's log (queues/quorum/groups.py), machine
    effects aside: a forwarded command applied before is skipped, one that comes
    before a lower seq of its node is held and applied, read back from the log, when
    its turn comes (raft/forwarded.py `admit_in_order`, `take_released`)."""

    def __init__(self, state: GroupState, readers: "_Readers", applied: AppliedIds,
                 fifo: FifoState) -> None:
        self.state, self.readers = state, readers
        self.applied, self.fifo = applied, fifo
        self.time_ms = 0
        self.held: dict[int, bytes] = {}   # held entries' data met in this replay

    def entry(self, entry) -> None:
        applied = self.applied
        if entry.kind != COMMAND:
            stamp, identity, data = 0, None, b""
        else:
            identity, data = unwrap(entry.data)
            stamp = TIMED_HEAD.unpack_from(data)[1] if data and data[0] == TIMED else 0
        if entry.index >= applied.give_up_at or stamp >= applied.give_up_ms:
            applied.give_up(entry.index, stamp)  # a gap held too long
        self.released()
        if entry.kind != COMMAND:
            return
        if identity is not None:
            verdict = applied.admit_in_order(identity, entry.index, entry.term, stamp)
            if verdict == SEEN:
                return  # a forwarded command appended again after a leader crash
            if verdict == HELD:
                self.held[entry.index] = entry.data
                return
        stamp, command = decode_entry(data)
        if stamp is not None:
            self.time_ms = stamp
        self._apply(entry.index, entry.term, identity, command)

    def released(self) -> None:
        while (released := self.applied.take_released()) is not None:
            _identity, ((index, term, _ms), *_repeats) = released
            data = self.held.pop(index, None)
            if data is None:  # held before the snapshot: read back from the log
                data = next(iter(_entries(self.state, index, self.readers))).data
            identity, data = unwrap(data)
            stamp, command = decode_entry(data)
            if stamp is not None and stamp > self.time_ms:
                self.time_ms = stamp
            self._apply(index, term, identity, command)

    def _apply(self, index: int, term: int, identity, command) -> None:
        self.fifo, reply, _effects = apply(Meta(index, term, self.time_ms), command, self.fifo)
        if identity is not None and reply != "ok":
            self.applied.keep_reply(identity, reply)


def _restored(root: str, state: GroupState, arguments: dict) -> tuple[AppliedIds, FifoState]:
    if state.snapshot is None:
        return AppliedIds(), FifoState(config=fifo_config(arguments))
    path = os.path.join(root, SNAPSHOTS_DIR, state.dir_name, SNAPSHOT_FILE)
    _uid, _meta, data = read_snapshot_file(path)
    applied, machine = load_snapshot(data, decode_reply)
    return applied, fifo_snapshot.load(machine)


def _entries(state: GroupState, lo: int, readers: "_Readers"):
    """The group's log from `lo` on: segment entries not shadowed, then the memory
    table (the broker's LogStore.entries, over a read-only recovery)."""
    segment_hi = state.mem.first if state.mem else state.last_index() + 1
    if state.shadow_from is not None:
        segment_hi = min(segment_hi, state.shadow_from)
    for ref in state.segments:
        if ref.first >= segment_hi:
            break
        if ref.last >= lo:
            yield from readers.read(ref, max(lo, ref.first), min(segment_hi, ref.last + 1))
    yield from state.mem.slice(lo, state.last_index() + 1)


def _queue_arguments(data_dir: str) -> dict[str, dict]:
    """Queue arguments by group uid, from the node's metadata.json and its queue journal
    (a group without a snapshot restarts from them)."""
    metadata = load_document(data_dir) or {}
    return {queue["group"]: decode_arguments(queue.get("arguments", {}))
            for queue in metadata.get("queues", []) if queue.get("group")}


class _Readers:
    """Segment readers that, unlike the broker's cache, accept a torn newest segment
    (a live node may be appending to it): reads stop at the entries recovery saw."""

    def __init__(self) -> None:
        self._open: dict[str, SegmentReader] = {}

    def _get(self, ref: SegmentRef) -> SegmentReader:
        reader = self._open.get(ref.path)
        if reader is None:
            parsed = parse_segment(ref.path, ref.number, tolerate_torn=True)
            if parsed is None:
                raise CorruptLogError(ref.path, 0, "segment vanished or became unreadable")
            reader = self._open[ref.path] = SegmentReader(ref, parsed.slots)
        return reader

    def term_at(self, ref: SegmentRef, index: int) -> int | None:
        return self._get(ref).term_at(index)

    def read(self, ref: SegmentRef, lo: int, hi: int) -> list[LogEntry]:
        return self._get(ref).read(lo, hi)

    def close(self) -> None:
        for reader in self._open.values():
            reader.close()
        self._open.clear()


def frames(spark, data_dir: str, node: str | None = None):
    """(live, groups) DataFrames of a node, keyed like the log source's rows: live =
    (node, group, raft_index); groups = one row per queue: (node, group, vhost, queue,
    snapshot_index, release_cursor, frees_up_to, last_index, messages, returned,
    state_bytes, memtable_bytes) — the `cursors` input of segment_compaction."""
    import pyarrow as pa

    node = node or os.path.basename(os.path.abspath(data_dir))
    groups = liveness(data_dir)
    sizes = [len(g.live) for g in groups.values()]
    live = pa.table({
        "node": pa.array([node] * sum(sizes), pa.string()),
        "group": pa.array([uid for uid, size in zip(groups, sizes) for _ in range(size)],
                          pa.string()),
        "raft_index": pa.array([i for g in groups.values() for i in g.live], pa.int64())})
    rows = [(node, g.group, g.vhost, g.queue, g.snapshot_index, g.release_cursor,
             g.frees_up_to, g.last_index, g.messages, g.returned, g.state_bytes,
             g.memtable_bytes) for g in groups.values()]
    return (spark.createDataFrame(live), spark.createDataFrame(rows, GROUPS_DDL))


GROUPS_DDL = ("node string, group string, vhost string, queue string, snapshot_index long, "
              "release_cursor long, frees_up_to long, last_index long, messages long, "
              "returned long, state_bytes long, memtable_bytes long")
