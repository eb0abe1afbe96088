"""Group commit for the whole node: one step writes and fsyncs everything pending.

Responsibilities: what `Node.flush()` does, cut in halves a shell can run apart.
So the fsyncs happen off its event loop. `begin_sync` takes everything pending as a
`Sync`:
- the metadata document, or only its journal's lines when only queue records
  changed (storage/metadata_journal.py);
- the message store's batch;
- one Raft round: every group's Ready persisted into the log store's batch.
It writes the message store's batch into its file (the page cache: quick).
`Sync.run()`, on any thread, writes the Raft log's batch, replaces the metadata
file and fdatasyncs.
`end_sync` then releases what it made durable. That is the confirms waiting on the
message store, and the Raft round's sends, applies and advances. Their replies and
confirms follow.

How it works: a Sync makes three kinds of file durable.
1. The metadata file (tmp, fsync, rename), or its journal's lines (one fdatasync).
2. The message store's batch (one fdatasync).
3. The Raft log's batch (one fdatasync for every group).
When 1 comes with 2 or 3 (a queue declared or deleted: its record, and its
group's first entry or its deletion), 1 runs on a second thread while 2 and 3 run,
so the Sync waits for the longer, not for the sum; `run` returns once all are
durable, and nothing the Sync covers is released before. The order between them
does not matter: records on disk before the metadata naming their queue are
harmless (recovery drops messages and groups of queues the metadata does not
know), and metadata naming a queue whose records are not yet durable names what
no one was told of. A Sync without metadata (every publish) runs 2 and 3 as before. `end_sync` also
applies what the fsync made committed. A single-member group commits its entries
only once they are durable (`QuorumGroups.end_round`). Applying may propose (say,
settling a no-ack delivery). So `flush` repeats begin, run and end until a round
has no Ready.

A full disk (ENOSPC, EDQUOT) fails a Sync without harm. `write` keeps the error for
`run`. `run` cuts each batch's file back to where the batch began, then raises it.
Running the same Sync again writes everything again, then syncs. `Sync.attempts`
counts the runs. Nothing it covers was released. So the shell holds it, with its
output, and runs it again once there may be room (broker/server/server.py). No
other Sync begins meanwhile.

Invariants:
- Between `begin_sync` and `end_sync` of one Sync, no other Sync begins. The log
  store refuses a second sealed batch.
- What `end_sync` releases depends only on that Sync and earlier ones. That is
  confirms by batch id, replies to applied entries, Raft messages. The exception:
  applying wrote something itself (`pending_writes` moves).
- Output written to sessions before `begin_sync` may depend on anything that Sync
  writes. The shell sends it only once the Sync is durable (broker/server/server.py).

Not here: what is written (the stores' formats). When to flush, and where the I/O
runs (the server shell). The Ready order itself (broker/groups/driver.py).
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..groups import driver
from ..raft.storage.errors import is_disk_full
from ..storage.message_store import SealedBatch
from ..storage.metadata_store import MetadataStore
from ..storage.node_list import NodeListFile

if TYPE_CHECKING:  # pragma: no cover
    from .node import Node

log = logging.getLogger("quorumqueue.broker")


@dataclass(slots=True)
class Sync:
    """One group-commit step: begun by `begin_sync`, run, ended by `end_sync`."""
    metadata: MetadataStore | None
    document: dict | None              # the metadata file's new contents, if changed
    applied: int | None                # with it: the metadata group's entry it holds
    node_list: tuple | None            # the cluster's node list, if changed
    node_file: NodeListFile | None     # where it goes
    messages: SealedBatch | None       # the message store's batch (None: no store)
    round: driver.Round                # the Raft round, with the log store's batch
    journal: list[bytes] | None = None  # else the queue records changed: journal lines
    attempts: int = 0                  # runs that failed on a full disk
    unwritten: OSError | None = None   # `write` found the disk full: `run` writes again

    @property
    def writes(self) -> bool:
        """False: nothing for `run` to do (no metadata, nothing to fdatasync).
        Then `end_sync` may follow at once. True once `write` found the disk full:
        `run` cuts the files back and writes them again, or fails until there is
        room (the shell stalls the Sync), so nothing half written is taken as done."""
        return (self.unwritten is not None or self.document is not None or self.journal is not None
                or self.node_list is not None
                or (self.messages is not None and bool(self.messages.data)
                    and self.messages.fsync)
                or self.round.sync_due)  # records, or file work (rollover, snapshots,
                # segment deletions: raft/storage/rollover.py, deferred.py)

    def write(self) -> None:
        """The message store's batch into its file, unsynced (quick: the event loop
        does it; its reads may need it). The Raft log's batch is written by `run`,
        on the writer thread: at 256 KB a round's WAL records are tens of MB, whose
        copy into the page cache held the loop for 100 ms and more. (Nothing reads
        the WAL file but recovery.) Unless `run` will not run (nothing to sync).
        A full disk is kept for `run` to raise, once it tried again."""
        try:
            if self.messages is not None:
                self.messages.write_data()
            if not self.writes:
                self.round.write()
        except OSError as error:
            if not is_disk_full(error):
                raise
            self.unwritten = error

    def run(self) -> None:
        """The metadata files and the fdatasyncs (at once when both: see the module
        header). After `write`.
        Any thread may run it: it touches only the files. On a full disk it cuts
        the batches back and raises. A later `run` of this Sync writes them again
        first."""
        try:
            if self.unwritten is not None or self.attempts:
                self.unwritten = None
                self.rewind()     # what the failed attempt left half written
                if self.messages is not None:
                    self.messages.write_data()  # the log's: by make_durable, below
            beside = None
            if self._has_files() and self._has_batches():  # both: their fsyncs at once
                beside = _metadata_thread().submit(self._save_files)
            elif self._has_files():
                self._save_files()
            try:
                if self.messages is not None:
                    self.messages.sync()
                # the log's records into the page cache, here (not on the loop), and
                # its fdatasync: the Raft round does its own file's work
                self.round.make_durable()
            finally:
                if beside is not None:
                    beside.result()  # its error (a full disk) raised here, after both
        except OSError as error:
            if not is_disk_full(error):
                raise
            self.attempts += 1
            self.rewind()
            raise

    def _has_files(self) -> bool:
        return (self.document is not None or self.journal is not None
                or self.node_list is not None)

    def _has_batches(self) -> bool:
        return ((self.messages is not None and bool(self.messages.data)
                 and self.messages.fsync)
                or self.round.has_file_work)

    def _save_files(self) -> None:
        """The metadata file (or its journal's lines) and the node list."""
        if self.document is not None:
            self.metadata.save(self.document)
            if self.applied is not None:
                self.metadata.save_applied(self.applied)
        elif self.journal is not None:
            self.metadata.append(self.journal)  # cut back itself on a full disk
        if self.node_list is not None:
            self.node_file.save(*self.node_list)

    def rewind(self) -> None:
        """Both batches' files as they were before this Sync (no space needed)."""
        if self.messages is not None:
            self.messages.rewind()
        self.round.rewind()


_METADATA_THREAD: list = []


def _metadata_thread():
    """The thread that saves a Sync's metadata files while its runner fdatasyncs the
    batches (one, made when first needed; it lives as long as the process)."""
    if not _METADATA_THREAD:
        _METADATA_THREAD.append(ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="quorumqueue-metadata-sync"))
    return _METADATA_THREAD[0]


def take_metadata(node: "Node") -> tuple[dict | None, int | None]:
    """The metadata file's contents and the metadata group's entry it holds.
    They are (None, None) unless the file is to be saved whole. The node's flag is
    reset. The file is saved whole when more than queue records changed. It is also
    saved whole once the journal outgrew it (`MetadataStore.can_journal`). The
    queue changes are then in the document."""
    document = applied = None
    store = node.metadata
    if store is not None and (node.metadata_dirty or (
            node.metadata_queue_changes and not store.can_journal)):
        document = node.metadata_document()
        applied, node.metadata_applied_index = node.metadata_applied_index, None
        node.metadata_queue_changes.clear()
    node.metadata_dirty = False
    return document, applied


def take_journal(node: "Node") -> list[bytes] | None:
    """The journal lines of the queue records changed since the last take.
    None: none changed. Call it after `take_metadata`. That one takes them into a
    document it saves whole."""
    changes = node.metadata_queue_changes
    if not changes:
        return None
    keys = list(changes)
    changes.clear()
    if node.metadata is None:
        return None
    return node.metadata.encode_changes([(key, node.queue_document(*key)) for key in keys])


def begin_sync(node: "Node") -> Sync:
    document, applied = take_metadata(node)
    journal = take_journal(node)
    cluster = node.cluster
    node_list = cluster.take_node_list()
    messages = None
    if node.store is not None and (node.store.has_pending or node.awaiting_sync):
        messages = node.store.seal()
    sync = Sync(node.metadata, document, applied, node_list, cluster.node_file, messages,
                node.quorum.begin_round(), journal)
    sync.write()
    return sync


def end_sync(node: "Node", sync: Sync) -> None:
    if sync.messages is not None:
        node.synced(node.store.synced(sync.messages))
    elif node.store is None and node.awaiting_sync:
        node.synced(node.synced_batch_id + 1)
    node.quorum.end_round(sync.round)
    node.release_answered()  # the confirms the round's replies answered


def pending_writes(node: "Node") -> tuple[int, int] | None:
    """A mark of what waits for the next Sync. Two marks are equal only if
    nothing was written between them. It is None (equal to no mark) while metadata
    waits to be saved. That is a flag, which a second change would not move."""
    if node.metadata_dirty or node.metadata_queue_changes:
        return None
    return (node.store.pending_records if node.store is not None else 0,
            node.quorum.store.pending_records)


def flush(node: "Node") -> None:
    """All of it here and now (the fsyncs on this thread): rounds until no Ready."""
    for _round in range(driver.MAX_ROUNDS):
        sync = begin_sync(node)
        sync.run()
        end_sync(node, sync)
        if not sync.round.readies:
            return
    log.warning("node flush: still busy after %d rounds", driver.MAX_ROUNDS)  # pragma: no cover
