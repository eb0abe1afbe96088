"""RaftNode: one member of one Raft group, as a deterministic state machine.

Responsibilities: elections (pre-vote, votes, terms), the follower's side of
replication (log matching, conflict truncation, snapshot install), the inputs a
caller may give (propose, membership change, leadership transfer, compaction) and
the Ready/advance cycle that hands outputs back.

How it works: no I/O, no clock, no threads. Inputs are method calls — `tick()`,
`step(message)`, `propose(...)` — that only change memory and queue outputs; the
caller collects them with `ready()`, persists, sends, applies, then calls
`advance(ready)` (see ready.py for the obligations). Randomness (the election
timeout) comes from the injected `random.Random`, so a run is a pure function of its
inputs. Each role has a step function (`_step_follower`, `_step_candidate`, and the
leader's in leader.py); term rules common to all roles run first in `step`.
Restart is construction: a new RaftNode over the recovered storage. A caller that
drives many groups gives each core the same `awake` dict (an ordered set of group
keys): every input that may leave something to hand out — a step, a proposal, a
campaign, a tick that sent heartbeats or started an election, an advance — adds the
core's `group` to it, so the caller asks those groups for a Ready and not every group
it has (etcd-io/raft's HasReady without the scan; an idle group costs nothing).

Invariants (Raft paper §5, thesis §3, §4, §9.6):
- the term only grows, and only on seeing a higher term — never on a pre-vote;
- at most one vote per term, persisted (Ready.hard_state) before the answer is sent,
  and only for a candidate whose log is at least as up to date as ours;
- a node that heard from a leader within election_ticks refuses pre-votes, and with
  check_quorum ignores real votes too, unless a leadership transfer asks;
- committed entries are never truncated; every committed index is handed out for
  applying exactly once, in order, and never before the Ready persisting it;
- a node campaigns only while it is a member of its latest configuration, or was
  removed by a change it does not know to be committed (it may hold the only log
  that can finish that change); votes are counted in the latest configuration only;
- a stale vote request is refused with our term, so a lagging candidate catches up;
- quiescing (config.quiesce; leader.py): a follower that took a leader's quiet
  heartbeat stops its election timer and stays in the leader's lease until a message
  of another kind or term arrives, the leader itself asks for votes (it no longer
  leads: restarted), or the caller's failure detector calls `leader_lost` (its node
  is down; `member_lost` also wakes a quiet leader that counts a lost member, so its
  check-quorum runs). Safety does not rest on it: terms and votes are unchanged; it
  only decides when a follower starts to campaign.

Not here: leader-side replication and commit (leader.py), the log's storage view
(log.py), flow control (progress.py), configurations by index (membership.py).
"""

from __future__ import annotations

import random as _random
from collections.abc import Sequence
from typing import assert_never

from .config import RaftConfig
from .errors import NotLeader, ProposalRejected, RaftInvariantError
from .leader import Leader
from .log import LogReader, RaftLog, Snapshot
from .membership import MembershipHistory, decode_members, encode_members, quorum
from .messages import (AppendEntries, AppendEntriesResponse, InstallSnapshot,
                       InstallSnapshotResponse, Message, RequestVote, RequestVoteResponse,
                       TimeoutNow)
from .ready import Ready, Role
from .types import COMMAND, MEMBERSHIP, NOOP, HardState, LogEntry, SnapshotMeta

_SCAN_CHUNK = 256   # entries read at a time when looking for membership entries


class RaftNode:
    def __init__(self, id: str, config: RaftConfig, storage: LogReader,
                 random: _random.Random, awake: dict[str, None] | None = None,
                 group: str = "") -> None:
        self.id = id
        # the caller's groups that had input since it last asked them for a Ready, an
        # ordered set (a dict) shared by every group it drives: each input adds `group`,
        # so the caller asks those, not every group (None: nobody keeps count)
        self._awake = awake
        self._group = group
        self.config = config
        self._random = random
        self._log = RaftLog(storage)
        hard_state = storage.hard_state()
        self._term = hard_state.term
        self._voted_for = hard_state.voted_for
        self._membership = self._recover_membership(storage)
        self._role = Role.FOLLOWER
        self._leader_id: str | None = None
        self._leader: Leader | None = None         # exists exactly while leading
        self._votes: dict[str, bool] = {}          # campaigning: voter -> granted
        self._transfer_campaign = False            # the election a TimeoutNow started
        self._election_elapsed = 0
        self._election_timeout = 0
        self._reset_election_timer()
        self._quiet = False                        # took a quiet heartbeat: no timer
        self._outbox: list[Message] = []
        self._outstanding: Ready | None = None     # handed out, not yet advanced
        self._persisted_hard_state = hard_state
        self._reported = (self._term, self._role, self._leader_id)
        self._woken()  # a recovered log may have something to apply or to say

    # --- what the node is ------------------------------------------------------------

    @property
    def term(self) -> int:
        return self._term

    @property
    def role(self) -> Role:
        return self._role

    @property
    def leader_id(self) -> str | None:
        return self._leader_id

    @property
    def voted_for(self) -> str | None:
        return self._voted_for

    @property
    def members(self) -> tuple[str, ...]:
        return self._membership.current

    @property
    def commit_index(self) -> int:
        return self._log.committed

    @property
    def applied_index(self) -> int:
        return self._log.applied

    @property
    def transfer_target(self) -> str | None:
        """The member a leadership transfer in progress hands over to (proposals wait)."""
        return self._leader.transferee if self._leader is not None else None

    def follower_progress(self) -> dict[str, tuple[int, int, str]]:
        """While leading: each follower's (match index, next index, flow-control
        state: probe, replicate or snapshot; progress.py); {} otherwise. A read for
        status displays (the management API's queue page)."""
        if self._leader is None:
            return {}
        return {peer: (pr.match, pr.next, pr.state.value)
                for peer, pr in sorted(self._leader.progress.items())}

    @property
    def log(self) -> RaftLog:
        """The log view (storage + unstable suffix); read it, do not write it."""
        return self._log

    # --- inputs ----------------------------------------------------------------------

    def tick(self) -> None:
        """One logical tick of the election timer, or of the leader's clocks. Wakes
        the group only if the tick did something (a heartbeat, an election): an idle
        follower's or a single member's tick leaves nothing to ask for."""
        leader = self._leader
        if leader is not None:
            if not leader.tick():                    # check-quorum failed
                self._become_follower(self._term, None)
                self._woken()
            elif self._outbox:                       # heartbeats (to peers, if any)
                self._woken()
            return
        if self._quiet:
            return
        self._election_elapsed += 1
        if self._election_elapsed >= self._election_timeout and self._promotable():
            self._campaign(pre=self.config.pre_vote, transfer=False)
            self._woken()
        elif self._role in (Role.PRE_CANDIDATE, Role.CANDIDATE) \
                and self._election_elapsed % self.config.heartbeat_ticks == 0:
            self._ask_for_votes(again=True)
            self._woken()

    @property
    def needs_tick(self) -> bool:
        """Whether `tick()` can do anything: False for a leader with no peers and no
        leadership transfer (its tick only counts; its check-quorum of one always
        passes; it has nobody to send heartbeats to). A caller driving many groups
        may leave such a group unticked until its next input (every input that can
        change role or members wakes the group: `awake`), so an idle group of one
        costs no tick. Nor for a quiet leader or follower (config.quiesce)."""
        leader = self._leader
        if leader is None:
            return not self._quiet
        return not leader.quiet and (leader.transferee is not None or bool(leader.peers()))

    def listen(self) -> None:
        """Run a quiet follower's election timer again, from zero: its lease lasts one
        more election timeout, unless its leader speaks. For a caller that must know
        whether the leader still replicates to it (a quiet follower hears nothing
        either way). Nothing for a member that is not a quiet follower."""
        if self._quiet and self._role is Role.FOLLOWER:
            self._quiet = False
            self._election_elapsed = 0
            self._woken()

    def member_lost(self, member: str) -> None:
        """The caller's failure detector says `member`'s node is down. A quiet follower
        of it campaigns (`leader_lost`); a quiet leader counting it wakes, so its
        heartbeats and check-quorum run again (it steps down within an election
        timeout if no majority answers, and falls silent again if one does)."""
        leader = self._leader
        if leader is not None:
            if leader.quiet and member in leader.progress:
                leader.wake()
                self._woken()
        elif member == self._leader_id:
            self.leader_lost()

    def leader_lost(self) -> None:
        """The caller's failure detector says the leader this quiet follower follows
        is down (its node unreachable): the lease ends and the election timer runs
        from its end, so the member campaigns within election_ticks (randomised).
        Nothing for a member that is not a quiet follower (its timer runs)."""
        if self._quiet and self._role is Role.FOLLOWER:
            self._quiet = False
            self._election_elapsed = self.config.election_ticks
            self._woken()

    def campaign(self) -> None:
        """Start an election now (e.g. on the member that created the group)."""
        if self._role is Role.LEADER:
            return
        if not self._promotable():
            raise ProposalRejected(f"campaign - {self.id} is not a member")
        self._campaign(pre=self.config.pre_vote, transfer=False)
        self._woken()

    def propose(self, data: bytes, kind: int = COMMAND) -> int:
        """Append a command to the leader's log; returns its index."""
        if kind == COMMAND:
            return self.propose_run((data,))
        if kind == MEMBERSHIP:
            raise ValueError("kind - use propose_membership for membership changes")
        if kind not in (COMMAND, NOOP):
            raise ValueError(f"kind - unknown entry kind {kind}")
        leader = self._require_leader()
        if leader.transferee is not None:
            raise ProposalRejected(f"proposal - leadership transfer to {leader.transferee} "
                                   "in progress")
        self._woken()
        return self._append(kind, data)

    def propose_run(self, datas: Sequence[bytes]) -> int:
        """Append commands to the leader's log, in order, as one append (a queue's
        publishes of one read: `_append` inlined, never a membership); returns the
        index of the first."""
        leader = self._leader
        if leader is None:
            raise NotLeader(self._leader_id)
        if leader.transferee is not None:
            raise ProposalRejected(f"proposal - leadership transfer to "
                                   f"{leader.transferee} in progress")
        index = self._log.append_run(self._term, COMMAND, datas)
        leader.mark_all_due(False)
        awake = self._awake  # twin of `_woken`: once per publish run
        if awake is not None:
            awake[self._group] = None
        return index

    def propose_membership(self, *, add: str | None = None, remove: str | None = None) -> int:
        """Propose adding or removing one member (thesis §4.1); returns the entry's index."""
        if (add is None) == (remove is None):
            raise ValueError("propose_membership - give exactly one of add= or remove=")
        leader = self._require_leader()
        members = self._membership.current
        if self._log.term_at(self._log.committed) != self._term:
            raise ProposalRejected("membership change - the leader has not committed an "
                                   "entry of its term yet")
        if self._membership.last_change_index > self._log.committed:
            raise ProposalRejected(f"membership change - the change at index "
                                   f"{self._membership.last_change_index} is not committed")
        if leader.transferee is not None:
            raise ProposalRejected("membership change - leadership transfer in progress")
        if add is not None:
            if add in members:
                raise ProposalRejected(f"membership change - {add} is already a member")
            new = (*members, add)
        else:
            if remove not in members:
                raise ProposalRejected(f"membership change - {remove} is not a member")
            new = tuple(m for m in members if m != remove)
            if not new:
                raise ProposalRejected("membership change - cannot remove the last member")
        self._woken()
        return self._append(MEMBERSHIP, encode_members(new))

    def transfer_leadership(self, to: str) -> None:
        """Hand leadership to `to` once it has the whole log (thesis §3.10)."""
        leader = self._require_leader()
        if to == self.id:
            return
        if to not in self._membership.current:
            raise ProposalRejected(f"leadership transfer - {to} is not a member")
        leader.transfer(to)
        self._woken()

    def report_snapshot(self, peer: str, success: bool) -> None:
        """The shell could (not) deliver the InstallSnapshot the core asked for."""
        if self._leader is not None:
            self._leader.report_snapshot(peer, success)
            self._woken()

    def compact(self, index: int) -> SnapshotMeta:
        """The state machine took a snapshot after applying `index`.

        Returns the meta to store with the snapshot bytes; once stored, storage may drop
        entries up to `index` (and the core will send this snapshot to followers that
        need them).
        """
        if index > self._log.applied:
            raise ValueError(f"compact - index {index} is not applied yet "
                             f"(applied {self._log.applied})")
        current = self._log.snapshot_meta()
        if index <= (current.index if current else 0):
            raise ValueError(f"compact - index {index} is already covered by a snapshot")
        term = self._log.term_at(index)
        if term is None:
            raise RaftInvariantError(f"compact - no term for applied index {index}")
        members = self._members_at(index)
        self._membership.compacted_to(index, members)
        return SnapshotMeta(index, term, members)

    def step(self, m: Message) -> None:
        """Digest one message from a peer."""
        if m.to != self.id:
            raise ValueError(f"step - message for {m.to} given to {self.id}")
        awake = self._awake  # twin of `_woken`: once per message
        if awake is not None:
            awake[self._group] = None
        if type(m) is RequestVote:
            if self._leader is not None:
                self._leader.wake()               # a member that does not hear us
            elif self._quiet and m.from_ == self._leader_id:
                self.leader_lost()                # our leader campaigns: it restarted
        if m.term > self._term:
            match m:
                case RequestVote(pre_vote=True):
                    pass                                  # pre-votes never move terms
                case RequestVote():
                    if (self.config.check_quorum and self._in_lease()
                            and not m.leadership_transfer):
                        return                            # a leader is alive: ignore
                    self._become_follower(m.term, None)
                case RequestVoteResponse(pre_vote=True, granted=True):
                    pass                                  # carries the term we would take
                case AppendEntries() | InstallSnapshot():
                    self._become_follower(m.term, m.from_)
                case _:
                    self._become_follower(m.term, None)
        elif m.term < self._term:
            match m:
                case AppendEntries() | InstallSnapshot() if (self.config.check_quorum
                                                            or self.config.pre_vote):
                    # tell a stale leader about our term, or it never learns of it
                    self._send(AppendEntriesResponse(self._term, self.id, m.from_, False, 0))
                case RequestVote():
                    # our term in the refusal lets a lagging candidate catch up (§5.1);
                    # it may never hear from us otherwise (e.g. not in our configuration)
                    self._send(RequestVoteResponse(self._term, self.id, m.from_, False,
                                                   m.pre_vote))
            return
        if isinstance(m, RequestVote):
            self._on_request_vote(m)
        elif self._leader is not None:
            self._step_leader(self._leader, m)
        elif self._role is Role.FOLLOWER:
            self._step_follower(m)
        else:
            self._step_candidate(m)

    # --- outputs ---------------------------------------------------------------------

    def ready(self) -> Ready | None:
        """What to persist, send and apply now; None if there is nothing."""
        if self._outstanding is not None:
            raise RuntimeError("ready - the previous Ready was not advanced")
        if self._leader is not None:
            self._leader.flush()
        hard_state = HardState(self._term, self._voted_for)
        if hard_state == self._persisted_hard_state:
            hard_state = None
        snapshot = self._log.unstable_snapshot()
        entries = self._log.unstable_entries()
        truncate_from = None
        if snapshot is None and entries and entries[0].index <= self._log.stored_last_index():
            truncate_from = entries[0].index
        committed = tuple(self._log.committed_to_apply(snapshot.meta.index if snapshot else 0))
        messages, self._outbox[:] = tuple(self._outbox), []
        soft = (self._term, self._role, self._leader_id)
        if (hard_state is None and snapshot is None and not entries and not messages
                and not committed and soft == self._reported):
            return None
        self._outstanding = Ready(
            hard_state=hard_state, snapshot=snapshot, truncate_from=truncate_from,
            entries=entries, messages=messages, committed=committed, term=self._term,
            role=self._role, leader_id=self._leader_id,
            leader_changed=self._leader_id != self._reported[2],
            commit_index=self._log.committed, members=self._membership.current)
        return self._outstanding

    def ready_to_apply(self) -> Ready | None:
        """The committed entries that are already durable here, alone: a Ready with
        nothing to persist or send, which the caller may apply and advance at once,
        before the next `ready()` (whose entries it need not wait for). None if there
        are none (or a received snapshot waits to be persisted)."""
        if self._outstanding is not None:
            raise RuntimeError("ready_to_apply - the previous Ready was not advanced")
        log = self._log
        if log.unstable_snapshot() is not None:
            return None
        durable = min(log.committed, log.persisted_index())
        if durable <= log.applied:
            return None
        term, role, leader_id = self._reported
        self._outstanding = Ready(
            hard_state=None, snapshot=None, truncate_from=None, entries=(), messages=(),
            committed=tuple(log.entries(log.applied + 1, durable + 1)), term=term,
            role=role, leader_id=leader_id, leader_changed=False, commit_index=durable,
            members=self._membership.current)
        return self._outstanding

    def advance(self, ready: Ready) -> None:
        """The caller persisted, sent and applied everything in `ready`."""
        if ready is not self._outstanding:
            raise RuntimeError("advance - not the outstanding Ready")
        self._outstanding = None
        if ready.hard_state is not None:
            self._persisted_hard_state = ready.hard_state
        if ready.snapshot is not None:
            self._log.stable_snapshot_to(ready.snapshot.meta.index)
        if ready.entries:
            last = ready.entries[-1]
            self._log.stable_to(last.index, last.term)
        if ready.committed:
            self._log.applied_to(ready.committed[-1].index)
        self._reported = (ready.term, ready.role, ready.leader_id)
        if self._leader is not None and self._leader.maybe_commit():
            self._on_leader_commit(self._leader)   # our own persistence completed a quorum
        # what became durable may be applied now, a commit may have followed: asked
        # once more (nothing to hand out then costs one `ready()`)
        self._woken()

    def _woken(self) -> None:
        """Input arrived: the caller is to ask this group for a Ready (`awake`)."""
        if self._awake is not None:
            self._awake[self._group] = None

    # --- elections -------------------------------------------------------------------

    def _promotable(self) -> bool:
        """May this node campaign? Members may; so may a member removed by a change not
        yet known to be committed: it may hold the only log that can finish that change
        (it counts votes from the new configuration only, so quorums are unaffected)."""
        if self.id in self._membership.current:
            return True
        change = self._membership.last_change_index
        if change > self._log.committed:
            previous = self._membership.at(change - 1)
            return previous is not None and self.id in previous
        return False

    @property
    def hears_leader(self) -> bool:
        """A leader, or a follower that heard from a live leader within the minimum
        election timeout (the leader still replicates to it)."""
        return self._in_lease()

    def _in_lease(self) -> bool:
        """Heard from a live leader within the minimum election timeout."""
        return self._role is Role.LEADER or (
            self._leader_id is not None
            and self._election_elapsed < self.config.election_ticks)

    def _reset_election_timer(self) -> None:
        self._election_elapsed = 0
        election = self.config.election_ticks
        self._election_timeout = self._random.randrange(election, 2 * election)

    def _become_follower(self, term: int, leader: str | None) -> None:
        if term > self._term:
            self._term = term
            self._voted_for = None
        self._role = Role.FOLLOWER
        self._leader_id = leader
        self._leader = None
        self._votes = {}
        self._quiet = False
        self._reset_election_timer()

    def _campaign(self, pre: bool, transfer: bool) -> None:
        self._leader = None
        self._leader_id = None
        self._votes = {}
        self._quiet = False
        self._reset_election_timer()
        if pre:
            self._role = Role.PRE_CANDIDATE           # asks for term + 1, keeps its term
        else:
            self._role = Role.CANDIDATE
            self._term += 1
            self._voted_for = self.id
        self._transfer_campaign = transfer
        if self._poll(self.id, True):                 # a group of one wins at once
            return
        self._ask_for_votes(again=False)

    def _ask_for_votes(self, again: bool) -> None:
        """RequestVote to every member that has not answered. Asked `again` every
        heartbeat while the election runs: a request lost on its way (a member whose
        group did not exist yet when it arrived: a new queue's first election) would
        otherwise wait for an election timeout, and another member's timer may fire
        first. A repeated request of the same term gets the same answer."""
        pre = self._role is Role.PRE_CANDIDATE
        term = self._term + 1 if pre else self._term
        last_index, last_term = self._log.last_index(), self._log.last_term()
        for peer in self._membership.current:
            if peer != self.id and not (again and peer in self._votes):
                self._send(RequestVote(term, self.id, peer, last_index, last_term,
                                       pre_vote=pre,
                                       leadership_transfer=self._transfer_campaign))

    def _poll(self, voter: str, granted: bool) -> bool:
        """Count an answer; act on a decided election. True if it was decided."""
        self._votes.setdefault(voter, granted)
        members = self._membership.current
        yes = sum(1 for m in members if self._votes.get(m) is True)
        no = sum(1 for m in members if self._votes.get(m) is False)
        needed = quorum(len(members))
        if yes >= needed:
            if self._role is Role.PRE_CANDIDATE:
                self._campaign(pre=False, transfer=False)
            else:
                self._become_leader()
            return True
        if no > len(members) - needed:
            self._become_follower(self._term, None)
            return True
        return False

    def _on_request_vote(self, m: RequestVote) -> None:
        if m.pre_vote:
            can_vote = m.term > self._term and not self._in_lease()
        else:
            can_vote = self._voted_for == m.from_ or (
                self._voted_for is None and self._leader_id is None)
        granted = can_vote and self._log.is_up_to_date(m.last_index, m.last_term)
        if granted and not m.pre_vote:
            self._voted_for = m.from_
            self._election_elapsed = 0
        term = m.term if (m.pre_vote and granted) else self._term
        self._send(RequestVoteResponse(term, self.id, m.from_, granted, m.pre_vote))

    def _become_leader(self) -> None:
        self._role = Role.LEADER
        self._leader_id = self.id
        self._votes = {}
        self._leader = Leader(self.id, self._term, self.config, self._log,
                              self._membership.current, self._outbox)
        self._append(NOOP, b"")                       # commits earlier terms' entries

    # --- role step functions ---------------------------------------------------------

    def _step_follower(self, m: Message) -> None:
        match m:
            case AppendEntries():
                self._election_elapsed = 0
                self._leader_id = m.from_
                self._quiet = self._on_append(m) and m.quiet
            case InstallSnapshot():
                self._election_elapsed = 0
                self._leader_id = m.from_
                self._quiet = False
                self._on_install_snapshot(m)
            case TimeoutNow():
                if self._promotable():
                    self._campaign(pre=False, transfer=True)
            case RequestVote() | RequestVoteResponse() | AppendEntriesResponse() \
                    | InstallSnapshotResponse():
                pass                                  # stale answers
            case _:
                assert_never(m)

    def _step_candidate(self, m: Message) -> None:
        match m:
            case AppendEntries() | InstallSnapshot():
                self._become_follower(self._term, m.from_)   # someone won this term
                self._step_follower(m)
            case RequestVoteResponse():
                if m.pre_vote == (self._role is Role.PRE_CANDIDATE):
                    self._poll(m.from_, m.granted)
            case RequestVote() | AppendEntriesResponse() | InstallSnapshotResponse() \
                    | TimeoutNow():
                pass
            case _:
                assert_never(m)

    def _step_leader(self, leader: Leader, m: Message) -> None:
        match m:
            case AppendEntriesResponse():
                if leader.on_append_response(m):
                    self._on_leader_commit(leader)
            case InstallSnapshotResponse():
                if leader.on_snapshot_response(m):
                    self._on_leader_commit(leader)
            case AppendEntries() | InstallSnapshot():
                raise RaftInvariantError(f"{m.from_} acts as leader in term {m.term}, "
                                         f"which {self.id} leads")
            case RequestVote() | RequestVoteResponse() | TimeoutNow():
                pass
            case _:
                assert_never(m)

    def _on_leader_commit(self, leader: Leader) -> None:
        leader.mark_all_due(True)
        removed = self.id not in self._membership.current
        if removed and self._membership.last_change_index <= self._log.committed:
            successor = leader.most_caught_up_peer()
            if successor is not None:
                leader.send_timeout_now(successor)
            self._become_follower(self._term, None)   # our removal is committed

    # --- follower side of replication ------------------------------------------------

    def _on_append(self, m: AppendEntries) -> bool:
        """Match and append; True if our log matches the leader's up to m's last."""
        log = self._log
        if m.prev_index < log.committed:              # we already have that prefix
            self._send(AppendEntriesResponse(self._term, self.id, m.from_, True,
                                             log.committed))
            return True
        result = log.maybe_append(m.prev_index, m.prev_term, m.entries)
        if result is None:
            hint_index, hint_term = log.find_conflict_by_term(
                min(m.prev_index, log.last_index()), m.prev_term)
            self._send(AppendEntriesResponse(self._term, self.id, m.from_, False, 0,
                                             rejected_index=m.prev_index,
                                             hint_index=hint_index, hint_term=hint_term))
            return False
        last_new, appended, truncated_from = result
        if truncated_from is not None:
            self._membership.truncated_from(truncated_from)
        self._membership.appended(appended)
        log.commit_to(min(m.leader_commit, last_new))
        self._send(AppendEntriesResponse(self._term, self.id, m.from_, True, last_new))
        return True

    def _on_install_snapshot(self, m: InstallSnapshot) -> None:
        if m.data is None:
            raise ValueError("step - InstallSnapshot without data: the sender's shell must "
                             "attach the snapshot bytes")
        meta, log = m.meta, self._log
        if meta.index <= log.committed:
            match = log.committed
        elif log.match_term(meta.index, meta.term):  # we hold that prefix: fast-forward
            log.commit_to(meta.index)
            match = meta.index
        else:
            log.restore(Snapshot(meta, m.data))
            self._membership.reset(meta.index, meta.members)
            match = meta.index
        self._send(InstallSnapshotResponse(self._term, self.id, m.from_, match))

    # --- helpers ---------------------------------------------------------------------

    def _send(self, m: Message) -> None:
        self._outbox.append(m)

    def _require_leader(self) -> Leader:
        if self._leader is None:
            raise NotLeader(self._leader_id)
        return self._leader

    def _append(self, kind: int, data: bytes) -> int:
        leader = self._require_leader()
        entry = LogEntry(self._log.last_index() + 1, self._term, kind, data)
        self._log.append([entry])
        if self._membership.appended([entry]):        # takes effect when appended
            leader.set_members(self._membership.current)
            if leader.maybe_commit():
                self._on_leader_commit(leader)
        leader.mark_all_due(False)
        return entry.index

    def _recover_membership(self, storage: LogReader) -> MembershipHistory:
        snapshot = storage.snapshot_meta()
        base_index = snapshot.index if snapshot else 0
        base_members = snapshot.members if snapshot else tuple(storage.members())
        found = self._scan_membership(self._log.last_index(), base_index, want=2)
        return MembershipHistory.recovered(base_index, base_members, found,
                                           complete=len(found) < 2)

    def _scan_membership(self, index: int, floor: int,
                         want: int) -> list[tuple[int, tuple[str, ...]]]:
        """Up to `want` membership entries at indexes (floor, index], oldest first."""
        found: list[tuple[int, tuple[str, ...]]] = []
        hi, lo_bound = index + 1, max(self._log.first_index(), floor + 1)
        while hi > lo_bound and len(found) < want:
            lo = max(lo_bound, hi - _SCAN_CHUNK)
            for entry in reversed(self._log.entries(lo, hi)):
                if entry.kind == MEMBERSHIP:
                    found.append((entry.index, decode_members(entry.data)))
                    if len(found) == want:
                        break
            hi = lo
        found.reverse()
        return found

    def _members_at(self, index: int) -> tuple[str, ...]:
        members = self._membership.at(index)
        if members is not None:
            return members
        snapshot = self._log.snapshot_meta()
        found = self._scan_membership(index, snapshot.index if snapshot else 0, want=1)
        if found:
            return found[0][1]
        return snapshot.members if snapshot else tuple(self._log.storage.members())
