"""The leader's side of replication: progress per follower, sending, committing.

Responsibilities: decide what to send to each follower (AppendEntries batches,
heartbeats, InstallSnapshot, TimeoutNow), digest their answers, advance the commit
index, run check-quorum and the leadership-transfer clock.

How it works: a `Leader` exists only while its node leads (created by
`RaftNode._become_leader`, dropped on stepping down), so progress can never be
consulted by a follower. Appends are not sent on the spot: proposals and answers
mark followers as due (`_due`) and `flush()`, called when the caller asks for a Ready,
sends one batch per due follower — so proposals made between two Readys share
messages (batching), up to `max_entries_per_message` each and `max_inflight`
outstanding per follower (pipelining). Heartbeats are empty AppendEntries anchored at
the follower's known match, carrying commit = min(commit, match).

Recovering from lost messages: a PROBE follower is unpaused by any answer (heartbeat
answers included); a REPLICATE follower whose oldest outstanding message is still
unacknowledged at two consecutive heartbeats is put back in PROBE (which resends from
its match); a SNAPSHOT follower unanswered for SNAPSHOT_TIMEOUT_ELECTIONS election
timeouts is probed again.

Quiescing (config.quiesce): at a heartbeat, a leader whose answering followers all
replicate with nothing in flight and match its last index, all of it committed,
marks that heartbeat `quiet` (to those holding everything) and stops ticking
(`quiet`): no heartbeats, no check-quorum. Any change wakes it (`wake`): a proposal
or a commit (`mark_all_due`), a membership change, a transfer, an answer showing a
follower without everything, a vote request or the caller's failure detector
(core.py `member_lost`). A woken leader starts a fresh check-quorum window and goes
quiet again only once a majority has answered in it, so a leader left alone steps
down as check-quorum makes it.

Invariants: the leader commits only entries of its own term by counting replicas
(§5.4.2); it counts itself only for what it has persisted and only while it is a
member; messages go only to current members other than itself.

Not here: elections and terms (core.py), flow-control bookkeeping (progress.py).
"""

from __future__ import annotations

from .config import RaftConfig
from .errors import RaftInvariantError
from .log import RaftLog
from .membership import quorum
from .messages import (AppendEntries, AppendEntriesResponse, InstallSnapshot,
                       InstallSnapshotResponse, Message, TimeoutNow)
from .progress import Inflights, Progress, ProgressState, quorum_index

SNAPSHOT_TIMEOUT_ELECTIONS = 4


class Leader:
    def __init__(self, node_id: str, term: int, config: RaftConfig, log: RaftLog,
                 members: tuple[str, ...], outbox: list[Message]) -> None:
        self.id = node_id
        self.term = term
        self.config = config
        self.log = log
        self.outbox = outbox                 # the node's outgoing messages (shared list)
        self.progress: dict[str, Progress] = {}
        self.members: tuple[str, ...] = ()
        self._peers: tuple[str, ...] = ()    # members other than this one (set_members)
        self.transferee: str | None = None   # leadership transfer target, if any
        self._transfer_elapsed = 0
        self._heartbeat_elapsed = 0
        self._quorum_elapsed = 0
        self._due: dict[str, bool] = {}      # follower -> send even if there is nothing new
        self.quiet = False                   # quiesced: sent its quiet heartbeat, ticks idle
        self.set_members(members)

    # --- membership ------------------------------------------------------------------

    def set_members(self, members: tuple[str, ...]) -> None:
        self.wake()
        self.members = members
        self._peers = tuple(p for p in members if p != self.id)
        last = self.log.last_index()
        for peer in members:
            if peer != self.id and peer not in self.progress:
                self.progress[peer] = Progress(match=0, next=last + 1,
                                               inflights=Inflights(self.config.max_inflight))
                self._due[peer] = True
        for peer in [p for p in self.progress if p not in members]:
            del self.progress[peer]
            self._due.pop(peer, None)
        if self.transferee is not None and self.transferee not in members:
            self.transferee = None

    def peers(self) -> list[str]:
        return list(self._peers)

    # --- time ------------------------------------------------------------------------

    def tick(self) -> bool:
        """One tick. False if check-quorum failed and the leader must step down."""
        if self.quiet:
            return True
        election = self.config.election_ticks
        if self.transferee is not None:
            self._transfer_elapsed += 1
            if self._transfer_elapsed >= election:
                self.transferee = None
        for pr in self.progress.values():
            if pr.state is ProgressState.SNAPSHOT:
                pr.snapshot_elapsed += 1
                if pr.snapshot_elapsed >= SNAPSHOT_TIMEOUT_ELECTIONS * election:
                    pr.become_probe()
        self._quorum_elapsed += 1
        if self._quorum_elapsed >= election:
            self._quorum_elapsed = 0
            if self.config.check_quorum and not self._quorum_active():
                return False
            for pr in self.progress.values():
                pr.recent_active = False
        self._heartbeat_elapsed += 1
        if self._heartbeat_elapsed >= self.config.heartbeat_ticks:
            self._heartbeat_elapsed = 0
            if self.config.quiesce and self._settled():
                self.quiet = True            # this heartbeat is the last, marked so
            self.broadcast_heartbeat()
        return True

    def _settled(self) -> bool:
        """A majority answered in this check-quorum window, every follower that
        answered holds the whole log, committed, and nothing is in flight or being
        handed over: what a quiet heartbeat may tell them. A follower silent in the
        window (down, cut off) does not hold the group awake: when it is back it
        campaigns, and its vote request wakes us."""
        last = self.log.last_index()
        if (self.transferee is not None or self.log.committed != last
                or not self._quorum_active()):
            return False
        for pr in self.progress.values():
            if pr.recent_active and (pr.state is not ProgressState.REPLICATE
                                     or pr.match != last or pr.inflights):
                return False
        return True

    def wake(self) -> None:
        """Leave the quiet state: tick, heartbeat and check the quorum again, in a
        fresh window (the followers heard nothing while it was quiet; they have a
        whole election timeout to answer, and it falls silent again only once a
        majority has)."""
        if self.quiet:
            self.quiet = False
            self._quorum_elapsed = 0
            for pr in self.progress.values():
                pr.recent_active = False

    def _quorum_active(self) -> bool:
        active = sum(1 for peer in self.members
                     if peer == self.id or self.progress[peer].recent_active)
        return active >= quorum(len(self.members))

    def broadcast_heartbeat(self) -> None:
        last = self.log.last_index()
        for peer in self.peers():
            pr = self.progress[peer]
            if pr.state is ProgressState.REPLICATE:
                oldest = pr.inflights.oldest()
                if oldest is not None and oldest == pr.stalled_candidate:
                    pr.become_probe()        # unanswered for a whole interval: resend
                    self._due[peer] = True
                else:
                    pr.stalled_candidate = oldest
            prev_term = self.log.term_at(pr.match)
            if prev_term is None:            # match is compacted: anchor at the empty prefix
                prev_index, prev_term, commit = 0, 0, 0
            else:
                prev_index, commit = pr.match, min(self.log.committed, pr.match)
            # quiet only to a follower holding everything: one that lags (silent, so
            # not holding the group awake) keeps its timer, and campaigns when back
            self.outbox.append(AppendEntries(self.term, self.id, peer, prev_index, prev_term,
                                             (), commit, self.quiet and pr.match == last))

    # --- sending ---------------------------------------------------------------------

    def mark_all_due(self, send_if_empty: bool) -> None:
        if self.quiet:   # a proposal or a commit
            self.wake()
        due = self._due  # once per proposal: the cached peers, no list built
        for peer in self._peers:
            due[peer] = due.get(peer, False) or send_if_empty

    def flush(self) -> None:
        """Send what is due: per follower, batches until paused or caught up."""
        due, self._due = self._due, {}
        for peer, send_if_empty in due.items():
            pr = self.progress.get(peer)
            if pr is None:
                continue
            sent = self._send_append(peer, pr, send_if_empty)
            while sent and pr.state is ProgressState.REPLICATE \
                    and pr.next <= self.log.last_index():
                sent = self._send_append(peer, pr, False)

    def _send_append(self, peer: str, pr: Progress, send_if_empty: bool) -> bool:
        if pr.is_paused():
            return False
        prev_index = pr.next - 1
        prev_term = self.log.term_at(prev_index)
        if prev_term is None or pr.next < self.log.first_index():
            return self._send_snapshot(peer, pr)
        last = min(self.log.last_index(), prev_index + self.config.max_entries_per_message)
        entries = tuple(self.log.entries(pr.next, last + 1))
        if not entries and not send_if_empty:
            return False
        self.outbox.append(AppendEntries(self.term, self.id, peer, prev_index, prev_term,
                                         entries, self.log.committed))
        pr.sent_entries(len(entries), prev_index + len(entries))
        return True

    def _send_snapshot(self, peer: str, pr: Progress) -> bool:
        if not pr.recent_active:
            return False                     # do not ship a snapshot to a silent follower
        meta = self.log.snapshot_meta()
        if meta is None:
            raise RaftInvariantError(f"{peer} needs index {pr.next}, compacted, but there "
                                     "is no snapshot")
        pr.become_snapshot(meta.index)
        self.outbox.append(InstallSnapshot(self.term, self.id, peer, meta))
        return True

    def report_snapshot(self, peer: str, success: bool) -> None:
        pr = self.progress.get(peer)
        if pr is None or pr.state is not ProgressState.SNAPSHOT:
            return
        if not success:
            pr.pending_snapshot = 0
        pr.become_probe()
        pr.probe_sent = True                 # wait for the answer or the next heartbeat

    # --- answers ---------------------------------------------------------------------

    def on_append_response(self, m: AppendEntriesResponse) -> bool:
        """Digest a follower's answer; True if the commit index advanced. A quiet
        leader wakes if the answer shows a follower that does not hold everything."""
        committed = self._on_append_response(m)
        if self.quiet and not self._settled():
            self._woken_by(m.from_)
        return committed

    def _on_append_response(self, m: AppendEntriesResponse) -> bool:
        pr = self.progress.get(m.from_)
        if pr is None:
            return False
        pr.recent_active = True
        if not m.success:
            hint = m.hint_index
            if m.hint_term > 0:
                hint, _ = self.log.find_conflict_by_term(m.hint_index, m.hint_term)
            if pr.maybe_decr_to(m.rejected_index, hint):
                if pr.state is ProgressState.REPLICATE:
                    pr.become_probe()
                self._due[m.from_] = True
            return False
        return self._on_match(m.from_, pr, m.match_index)

    def on_snapshot_response(self, m: InstallSnapshotResponse) -> bool:
        pr = self.progress.get(m.from_)
        if pr is None:
            return False
        pr.recent_active = True
        committed = self._on_match(m.from_, pr, m.match_index)
        if self.quiet and not self._settled():
            self._woken_by(m.from_)
        return committed

    def _woken_by(self, peer: str) -> None:
        """Wake for an answer: its sender counts in the fresh window (it answered;
        leaving it out would keep a snapshot from it: `_send_snapshot`)."""
        self.wake()
        pr = self.progress.get(peer)
        if pr is not None:
            pr.recent_active = True

    def _on_match(self, peer: str, pr: Progress, match_index: int) -> bool:
        last = self.log.last_index()
        if not pr.maybe_update(match_index):
            # stale, duplicated, or a heartbeat's answer: the follower is alive
            pr.probe_sent = False
            if pr.match < last:
                self._due[peer] = self._due.get(peer, False) or \
                    pr.state is ProgressState.PROBE
            return False
        if pr.state is ProgressState.PROBE:
            pr.become_replicate()
        elif pr.state is ProgressState.SNAPSHOT and pr.match + 1 >= self.log.first_index():
            pr.become_probe()
            pr.become_replicate()
        else:
            pr.inflights.free_le(pr.match)
        committed = self.maybe_commit()
        if committed:
            self.mark_all_due(True)          # tell everyone the new commit index
        elif pr.match < last:
            self._due.setdefault(peer, False)
        if peer == self.transferee and pr.match == last:
            self.send_timeout_now(peer)
        return committed

    # --- commit, transfer ------------------------------------------------------------

    def maybe_commit(self) -> bool:
        matches = [self.log.persisted_index() if peer == self.id
                   else self.progress[peer].match for peer in self.members]
        return self.log.maybe_commit(quorum_index(matches), self.term)

    def transfer(self, to: str) -> None:
        self.wake()
        if to == self.transferee:
            return
        self.transferee = to
        self._transfer_elapsed = 0
        if self.progress[to].match == self.log.last_index():
            self.send_timeout_now(to)
        else:
            self._due.setdefault(to, False)

    def send_timeout_now(self, peer: str) -> None:
        self.outbox.append(TimeoutNow(self.term, self.id, peer))

    def most_caught_up_peer(self) -> str | None:
        """A follower holding the whole log (for handing over after self-removal)."""
        last = self.log.last_index()
        ready = sorted(p for p, pr in self.progress.items() if pr.match == last)
        return ready[0] if ready else None
