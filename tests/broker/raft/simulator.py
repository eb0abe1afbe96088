"""A deterministic in-memory cluster for random schedules, checking Raft's safety
properties (Raft paper Figure 3) after every step.

The network is a list of messages in flight: a schedule delivers any of them (reorder,
delay), drops or duplicates them, cuts the cluster in two, crashes members (optionally
after persisting a Ready but before sending it) and restarts them as new RaftNodes over
what they persisted, compacts logs into snapshots, and steps messages into a member
between its `ready()` and `advance()`. Everything is a function of the schedule and
the seed.

Checked continuously:
- election safety: at most one leader per term, ever;
- leader completeness: a new leader's log holds every entry any member had seen
  committed before it was elected;
- state machine safety: every member applies the same entry at each index (also
  compared against the contents of installed snapshots);
- log matching (every `LOG_CHECK_EVERY` actions and at the end): two logs with an
  entry of the same index and term are identical up to it.
With `quiesce`, every tick runs a failure detector that is right about what it sees
(a member is told `member_lost` of each member down or on the other side of a
partition), and `suspect` tells a member at random `leader_lost`, right or wrong.
Liveness (`settle`): with the network healed and everyone up, a leader is recognised by
every member of its configuration within a bounded number of ticks, and everything
proposed to it is applied by all of them. Membership changes (`act_add`,
`act_remove`) draw from the running ids; removed members keep running.
"""

from __future__ import annotations

import itertools
import random

from quorumqueue.broker.raft.config import RaftConfig
from quorumqueue.broker.raft.errors import NotLeader, ProposalRejected
from quorumqueue.broker.raft.messages import Message
from quorumqueue.broker.raft.ready import Role
from quorumqueue.broker.raft.types import LogEntry

from .harness import Machine, MemoryStorage, Member

LOG_CHECK_EVERY = 16


class SafetyViolation(AssertionError):
    pass


class Simulation:
    def __init__(self, ids: tuple[str, ...], config: RaftConfig, seed: int,
                 voters: tuple[str, ...] | None = None) -> None:
        """`ids` run; `voters` (default: all) form the initial group, the others start
        empty and knowing no members, waiting to be added."""
        self.ids = ids
        self.config = config
        voters = ids if voters is None else voters
        self.members = {id: Member(id, config, MemoryStorage(voters if id in voters else ()),
                                   seed * 100 + n)
                        for n, id in enumerate(ids)}
        self.network: list[Message] = []
        self.sides: dict[str, int] | None = None      # a partition: member -> side
        self.down: set[str] = set()
        self.leaders: dict[int, str] = {}             # term -> its leader
        self.committed: dict[int, LogEntry] = {}      # seen committed by anyone
        self.applied: dict[int, LogEntry] = {}        # applied by anyone
        self._seen_commit = {id: 0 for id in ids}     # per member: commits recorded
        self._leaderships: set[tuple[str, int]] = set()
        self._proposals = itertools.count()
        self.actions = 0
        self.trace: list[str] = []

    # --- plumbing ---

    def up(self) -> list[str]:
        return [id for id in self.ids if id not in self.down]

    def connected(self, a: str, b: str) -> bool:
        return self.sides is None or self.sides[a] == self.sides[b]

    def flush(self, id: str) -> None:
        member = self.members[id]
        for _ in range(1000):
            if id in self.down or not (result := member.handle_ready(self._on_apply)):
                return
            self.network.extend(result[1])
        raise AssertionError(f"{id}: Readys kept coming")

    def _on_apply(self, member: Member, entry: LogEntry | None, snapshot) -> None:
        if entry is not None:
            first = self.applied.setdefault(entry.index, entry)
            if first != entry:
                raise SafetyViolation(f"{member.id} applied {entry} at {entry.index}, "
                                      f"another member applied {first}")
        else:
            for index, data in Machine.restored(snapshot).commands:
                known = self.applied.get(index)
                if known is not None and known.data != data:
                    raise SafetyViolation(f"{member.id} restored {data!r} at {index}, "
                                          f"another member applied {known}")

    def leader(self) -> str | None:
        leaders = [id for id in self.up() if self.members[id].node.role is Role.LEADER]
        return max(leaders, key=lambda id: self.members[id].node.term, default=None)

    # --- actions (each argument is an arbitrary integer from the schedule) ---

    def do(self, action: str, arg: int) -> None:
        self.trace.append(f"{action} {arg}")
        getattr(self, f"act_{action}")(arg)
        self.actions += 1
        self.check()
        if self.actions % LOG_CHECK_EVERY == 0:
            self.check_logs()

    def _pick_member(self, arg: int) -> str:
        return self.ids[arg % len(self.ids)]

    def _take(self, arg: int) -> Message | None:
        if not self.network:
            return None
        return self.network.pop(arg % len(self.network))

    def _deliver(self, m: Message, mid_ready: bool = False) -> None:
        if m.to in self.down or not self.connected(m.from_, m.to):
            return                                            # lost
        member = self.members[m.to]
        if mid_ready and (ready := member.node.ready()) is not None:
            member.node.step(m)                               # between ready and advance
            self.network.extend(member.finish_ready(ready, self._on_apply))
        else:
            member.node.step(m)
        self.flush(m.to)

    def act_deliver(self, arg: int) -> None:
        if (m := self._take(0)) is not None:
            self._deliver(m)

    def act_deliver_any(self, arg: int) -> None:
        if (m := self._take(arg)) is not None:
            self._deliver(m)

    def act_deliver_mid_ready(self, arg: int) -> None:
        if (m := self._take(arg)) is not None:
            self._deliver(m, mid_ready=True)

    def act_deliver_all(self, arg: int) -> None:
        """A burst of normal network: everything in flight now, in order."""
        batch, self.network = self.network, []
        for m in batch:
            self._deliver(m)

    def act_drop(self, arg: int) -> None:
        self._take(arg)

    def act_duplicate(self, arg: int) -> None:
        if self.network:
            self.network.append(self.network[arg % len(self.network)])

    def act_delay(self, arg: int) -> None:
        if (m := self._take(arg)) is not None:
            self.network.append(m)

    def _tick(self, id: str) -> None:
        node = self.members[id].node
        for other in node.members:                            # the node's failure detector
            if other != id and (other in self.down or not self.connected(id, other)):
                node.member_lost(other)
        node.tick()
        self.flush(id)

    def act_tick(self, arg: int) -> None:
        id = self._pick_member(arg)
        if id not in self.down:
            self._tick(id)

    def act_tick_all(self, arg: int) -> None:
        for id in self.up():
            self._tick(id)

    def act_suspect(self, arg: int) -> None:
        """A failure detector's finding, right or wrong, at one member."""
        id = self._pick_member(arg)
        if id not in self.down:
            self.members[id].node.leader_lost()
            self.flush(id)

    def act_propose(self, arg: int) -> None:
        id = self.leader() if arg % 4 else self._pick_member(arg)
        if id is None or id in self.down:
            return
        try:
            self.members[id].node.propose(f"c{next(self._proposals)}".encode())
        except (NotLeader, ProposalRejected):
            return
        self.flush(id)

    def act_transfer(self, arg: int) -> None:
        leader = self.leader()
        if leader is not None:
            try:
                self.members[leader].node.transfer_leadership(self._pick_member(arg))
            except ProposalRejected:
                return
            self.flush(leader)

    def act_add(self, arg: int) -> None:
        self._change_membership(arg, add=True)

    def act_remove(self, arg: int) -> None:
        self._change_membership(arg, add=False)

    def _change_membership(self, arg: int, add: bool) -> None:
        leader = self.leader()
        if leader is None:
            return
        node = self.members[leader].node
        pool = [id for id in self.ids if (id in node.members) != add]
        if not pool:
            return
        target = pool[arg % len(pool)]
        try:
            if add:
                node.propose_membership(add=target)
            else:
                node.propose_membership(remove=target)
        except ProposalRejected:
            return
        self.flush(leader)

    def act_partition(self, arg: int) -> None:
        rng = random.Random(arg)
        self.sides = {id: rng.randrange(2) for id in self.ids}

    def act_heal(self, arg: int) -> None:
        self.sides = None

    def act_crash(self, arg: int) -> None:
        id = self._pick_member(arg)
        if id in self.down:
            return
        member = self.members[id]
        if arg % 2 and (ready := member.node.ready()) is not None:
            member.storage.persist(ready)                     # persisted, never sent
        self.down.add(id)

    def act_restart(self, arg: int) -> None:
        """Bring a crashed member back as a new RaftNode over its storage."""
        down = sorted(self.down)
        if not down:
            return
        id = down[arg % len(down)]
        self.down.discard(id)
        self.members[id].restart()
        self._seen_commit[id] = self.members[id].node.commit_index
        self.flush(id)

    def act_compact(self, arg: int) -> None:
        id = self._pick_member(arg)
        if id not in self.down:
            self.members[id].compact(keep=arg % 2)

    # --- safety ---

    def check(self) -> None:
        for id in self.up():
            node = self.members[id].node
            if node.role is Role.LEADER:
                first = self.leaders.setdefault(node.term, id)
                if first != id:
                    raise SafetyViolation(f"two leaders in term {node.term}: {first}, {id}")
                if (id, node.term) not in self._leaderships:
                    self._leaderships.add((id, node.term))
                    self._check_leader_completeness(id)
            self._record_commits(id)

    def _check_leader_completeness(self, id: str) -> None:
        log = self.members[id].node.log
        for index, entry in self.committed.items():
            if index >= log.first_index() and log.term_at(index) != entry.term:
                raise SafetyViolation(f"leader {id} (term {self.members[id].node.term}) "
                                      f"lacks committed {entry}")

    def _record_commits(self, id: str) -> None:
        node = self.members[id].node
        log = node.log
        lo = max(self._seen_commit[id] + 1, log.first_index())
        if lo <= node.commit_index:
            for entry in log.entries(lo, node.commit_index + 1):
                first = self.committed.setdefault(entry.index, entry)
                if first != entry:
                    raise SafetyViolation(f"{id} committed {entry}, another committed {first}")
        self._seen_commit[id] = max(self._seen_commit[id], node.commit_index)

    def check_logs(self) -> None:
        logs = {}
        for id in self.ids:
            member = self.members[id]
            if id in self.down:
                entries = member.storage.log()
            else:
                log = member.node.log
                entries = log.entries(log.first_index(), log.last_index() + 1)
            for previous, entry in zip(entries, entries[1:]):
                assert entry.index == previous.index + 1 and entry.term >= previous.term
            logs[id] = {e.index: e for e in entries}
        for a, b in itertools.combinations(self.ids, 2):
            matched = False
            for index in sorted(logs[a].keys() & logs[b].keys(), reverse=True):
                x, y = logs[a][index], logs[b][index]
                if matched or x.term == y.term:
                    matched = True
                    if x != y:
                        raise SafetyViolation(f"log matching: {a} has {x}, {b} has {y}")

    # --- liveness ---

    def deliver_all(self, limit: int = 10_000) -> None:
        for id in self.up():
            self.flush(id)
        for _ in range(limit):
            if not self.network:
                return
            self._deliver(self.network.pop(0))
            self.check()
        raise AssertionError("the network never went quiet")

    def stable_leader(self) -> str | None:
        """The leader every member of its configuration follows, with no transfer on."""
        leader = self.leader()
        if leader is None:
            return None
        node = self.members[leader].node
        if leader not in node.members or node.transfer_target is not None:
            return None
        if all(self.members[id].node.leader_id == leader
               and self.members[id].node.term == node.term for id in node.members):
            return leader
        return None

    def settle(self, max_ticks: int, proposals: int = 5) -> tuple[int, str]:
        """Heal everything, then run healthy rounds (tick everyone, deliver everything).

        A leader counts as elected once all members have recognised it for two election
        timeouts in a row (a member may still time out on the first round after a heal,
        having heard nothing for a while). Returns (rounds until then, the leader), after
        checking that proposals made to it are applied everywhere.
        """
        self.sides = None
        while self.down:
            self.act_restart(0)
        self.deliver_all()
        leader, since = None, 0
        for ticks in range(max_ticks + 1):
            current = self.stable_leader()
            leader, since = current, (since + 1 if current == leader else 0)
            if leader is not None and since >= 2 * self.config.election_ticks:
                break
            self.act_tick_all(0)
            self.deliver_all()
        else:
            raise AssertionError(f"no stable leader within {max_ticks} ticks of healing")
        node = self.members[leader].node
        proposed = {node.propose(f"live{i}".encode()): f"live{i}".encode()
                    for i in range(proposals)}
        self.flush(leader)
        last = max(proposed)
        group = node.members
        for _ in range(max_ticks):
            self.deliver_all()
            if all(self.members[id].machine.applied_index >= last for id in group):
                break
            self.act_tick_all(0)
        for id in group:
            commands = dict(self.members[id].machine.commands)
            for index, data in proposed.items():
                assert commands.get(index) == data, \
                    f"{id}: proposal {data!r} at {index} not applied (leader {leader})"
        self.check_logs()
        return ticks, leader
