"""Group commit for the whole node: one step writes and fsyncs everything pending.

Responsibilities: what `Node.flush()` does, in halves a shell can run apart, so that
the fsyncs happen off its event loop: `begin_sync` takes everything pending — the
metadata document (or, when only queue records changed, their lines of the file's
journal: storage/metadata_journal.py), the message store's batch, one Raft round (every group's Ready
persisted into the log store's batch) — as a `Sync` and writes the two batches into
their files (the page cache: quick); `Sync.run()`, on any thread, replaces the
metadata file and fdatasyncs; `end_sync` then releases what it made durable —
confirms waiting on the message store, the Raft round's sends, applies and
advances (and the replies and confirms they produce).

How it works: a Sync makes things durable in the order of the synchronous flush it
replaces: the metadata file (tmp, fsync, rename) or its journal's lines (one
fdatasync), then the message store's batch
(one fdatasync), then the Raft log's batch (one fdatasync for every group). Records
that reach the disk before the metadata naming their queue are harmless: recovery
drops messages and groups of queues the metadata does not know. `end_sync` also
applies what the fsync made committed (a single-member group commits its entries only
once they are durable: `QuorumGroups.end_round`). Applying may propose (settling a
no-ack delivery...), so `flush` repeats begin/run/end until a round has no Ready.

A full disk (ENOSPC, EDQUOT) fails a Sync without harm: `write` keeps the error for
`run`, and `run` raises it after cutting each batch's file back to where the batch
began; running the same Sync again writes everything again, then syncs
(`Sync.attempts` counts the runs). Nothing it covers was released, so the shell
holds it, with its output, and runs it again once there may be room
(broker/server/server.py); no other Sync begins meanwhile.

Invariants: between `begin_sync` and `end_sync` of one Sync, no other Sync begins
(the log store refuses a second sealed batch); what `end_sync` releases — confirms
by batch id, replies to applied entries, Raft messages — depends only on that Sync
and earlier ones, unless applying wrote something itself (`pending_writes` moves).
Output written to sessions before `begin_sync` may depend on anything that Sync
writes: the shell sends it only once the Sync is durable (broker/server/server.py).

Not here: what is written (the stores' formats), when to flush and where the I/O
runs (the server shell), the Ready order itself (broker/groups/driver.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..groups import driver
from ..raft.storage.errors import is_disk_full
from ..raft.storage.wal import WalBatch
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
    readies: driver.Batch              # the Raft round waiting for `log`
    log: WalBatch | None               # the log store's batch (None: no quorum queues)
    journal: list[bytes] | None = None  # else the queue records changed: journal lines
    attempts: int = 0                  # runs that failed on a full disk
    unwritten: OSError | None = None   # `write` found the disk full: `run` writes again

    @property
    def writes(self) -> bool:
        """False: nothing for `run` to do (no metadata, nothing to fdatasync) —
        `end_sync` may follow at once."""
        return (self.document is not None or self.journal is not None
                or self.node_list is not None
                or (self.messages is not None and bool(self.messages.data)
                    and self.messages.fsync)
                or (self.log is not None and bool(self.log.records) and self.log.fsync)
                or (self.log is not None and bool(self.log.after)))  # a rollover's steps

    def write(self) -> None:
        """The batches into their files, unsynced (quick: the event loop does it). A
        full disk is kept for `run` to raise, once it tried again."""
        try:
            self._write_batches()
        except OSError as error:
            if not is_disk_full(error):
                raise
            self.unwritten = error

    def _write_batches(self) -> None:
        if self.messages is not None:
            self.messages.write_data()
        if self.log is not None:
            self.log.write_records()

    def run(self) -> None:
        """The metadata file, then the fdatasyncs, in order; on any thread (touches
        only the files). After `write`. On a full disk it cuts the batches back and
        raises; a later `run` of the same Sync writes them again first."""
        try:
            if self.unwritten is not None or self.attempts:
                self.unwritten = None
                self.rewind()     # what the failed attempt left half written
                self._write_batches()
            if self.document is not None:
                self.metadata.save(self.document)
                if self.applied is not None:
                    self.metadata.save_applied(self.applied)
            elif self.journal is not None:
                self.metadata.append(self.journal)  # cut back itself on a full disk
            if self.node_list is not None:
                self.node_file.save(*self.node_list)
            if self.messages is not None:
                self.messages.sync()
            if self.log is not None:
                self.log.sync()
        except OSError as error:
            if not is_disk_full(error):
                raise
            self.attempts += 1
            self.rewind()
            raise

    def rewind(self) -> None:
        """Both batches' files as they were before this Sync (no space needed)."""
        if self.messages is not None:
            self.messages.rewind()
        if self.log is not None:
            self.log.rewind()


def take_metadata(node: "Node") -> tuple[dict | None, int | None]:
    """(the metadata file's contents, the metadata group's entry it holds) when the
    file is to be saved whole, else (None, None); the node's flag is reset. Saved
    whole: when what changed is not only queue records, or the journal outgrew the
    file (`MetadataStore.can_journal`); the queue changes are then in the document."""
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
    """The journal lines of the queue records changed since the last take (None:
    none); after `take_metadata`, which takes them into a document it saves whole."""
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
    readies, batch = node.quorum.begin_round() if node.quorum is not None else ([], None)
    sync = Sync(node.metadata, document, applied, node_list, cluster.node_file, messages,
                readies, batch, journal)
    sync.write()
    return sync


def end_sync(node: "Node", sync: Sync) -> None:
    if sync.messages is not None:
        node.synced(node.store.synced(sync.messages))
    elif node.store is None and node.awaiting_sync:
        node.synced(node.synced_batch_id + 1)
    if sync.log is not None:
        node.quorum.end_round(sync.readies, sync.log)


def pending_writes(node: "Node") -> tuple[int, int] | None:
    """A mark of what waits for the next Sync: two marks are equal only if nothing was
    written between them. None (equal to no mark) while metadata waits to be saved:
    that is a flag, which a second change would not move."""
    if node.metadata_dirty or node.metadata_queue_changes:
        return None
    return (node.store.pending_records if node.store is not None else 0,
            node.quorum.store.pending_records if node.quorum is not None else 0)


def flush(node: "Node") -> None:
    """All of it here and now (the fsyncs on this thread): rounds until no Ready."""
    for _round in range(driver.MAX_ROUNDS):
        sync = begin_sync(node)
        sync.run()
        end_sync(node, sync)
        if not sync.readies:
            return
    log.warning("node flush: still busy after %d rounds", driver.MAX_ROUNDS)  # pragma: no cover
