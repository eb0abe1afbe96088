"""A member of a Raft group as the node sees it: proposing commands and waiting for them.

Responsibilities: the bookkeeping shared by every replicated thing on a node (a quorum
queue, the cluster's metadata): propose a command where it can be appended — this
member when it leads its group, else the leader through the node's router (the
cluster: broker/cluster/cluster.py) — and tie each proposal to whoever waits for its
reply.

How it works: a waiter is kept under the log index its command was appended at, with
the term of that append. When entry i is applied, a waiter whose term matches gets
the machine's reply; one whose term does not lost its entry to another leader's (the
append was never committed) and its command is proposed again. A router answers a
forwarded proposal with the (index, term) the leader appended it at, so the waiter
then sits here like a local one: replies always come from this member's own apply,
so everything this node shows afterwards (counts, bodies) already includes it. An
append of term T at index i is also known lost, before anything is applied at i,
once an entry of a later term is applied at or below i (`entry_committed`): the
leader that lost term T may have been cut off, and nothing may ever be appended
at i again.

A forwarded command's entry carries its identity (broker/raft/forwarded.py: the
forwarding node's run and a sequence number); `admit` skips an entry whose identity
this member applied before — a leader that appended a forwarded command and crashed
before acknowledging it leaves it in the log, and the resend is appended again by
the next leader — and answers that entry's waiters with the first application's
reply (`applied` is part of the replicated state and of every snapshot). A quorum
queue's loop uses `admit_in_order` instead: an entry that comes before a lower seq of
its node is held (its waiters wait) and applied when its turn comes. A forwarded
command proposed again by this module keeps its data, identity included, so it is
skipped as well if its first append did make it into the log. Every numbered command
is watched until applied, a command no one waits for too (an ack, a publish without
confirms: `UNANSWERED` stands in for its waiter): a seq lost with a leader's log tail
would otherwise be a gap its node never fills, and the queue would hold every later
command of that node behind it until the gap is given up (forwarded.HOLD_MS).

Invariants: every waiter is called exactly once — with the reply of its own command's
entry (for a skipped duplicate: the reply of the entry applied first, or None when
that one was not kept), or None when the group is deleted first; an entry with an
identity is applied at most once per member within the window
(forwarded.WINDOW later forwards of the same origin to the group), and at least
once: an identity below the window is applied again, never skipped.

Not here: consensus (broker/raft), the transport and forwarding (broker/cluster),
applying entries (broker/queues/quorum/groups.py).
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

from ..fifo.envelope import TIMED, TIMED_HEAD
from ..raft import RaftNode
from ..raft.errors import NotLeader, ProposalRejected
from ..raft.forwarded import (APPLY, FORWARDED, HEAD_SIZE, SEEN, AppliedIds, Identity,
                              identity_of)
from ..raft.ready import Role

Waiter = Callable[[Any], None]


def UNANSWERED(_reply: Any) -> None:
    """The waiter of a numbered command no one waits for: it keeps the command watched
    (proposed again if its append is lost), and its reply goes nowhere."""


_TIME = TIMED_HEAD  # a quorum queue's entry: leader time after the identity
_LEADER = Role.LEADER  # read per publish: an enum member off its class costs ~4x a global


class RunWaiter:
    """The one waiter of a run of commands proposed as one item (a batch publish's
    messages, queues/quorum/queue.py `publish_batch`). It is called once: with
    `refused` if any command of the run was refused, else with the last one's reply.

    Where this member leads, it waits at the run's last entry alone: the run is one
    append, so its commands are applied in order, the last one after every other.
    So its reply stands for the run's only where a refused command refuses the rest
    (the fifo machine's gap: tests/broker/fifo/test_machine.py). A run whose last
    append another leader's overwrote is proposed again whole: its commands are
    keyed, so those that did land are duplicates. Forwarded, each command gets a
    waiter of its own (`split`), counted down to the one answer."""

    __slots__ = ("waiter", "refused", "left", "answer")

    def __init__(self, waiter: Waiter, refused: Any) -> None:
        self.waiter, self.refused = waiter, refused
        self.left = 0
        self.answer: Any = None

    def __call__(self, reply: Any) -> None:
        self.waiter(reply)

    def split(self, count: int) -> list[Waiter]:
        """`count` waiters, one per command (in order), that answer this one once all
        of them are answered."""
        self.left, self.answer = count, None
        return [self._one] * count

    def _one(self, reply: Any) -> None:
        if self.answer != self.refused:  # the first refused reply stays
            self.answer = reply
        self.left -= 1
        if not self.left:
            self.waiter(self.answer)


class Router(Protocol):
    def forward(self, member: "ReplicatedGroup", data: bytes, waiter: Waiter | None) -> None:
        ...

    def forwarded_to(self, group: str) -> bool:
        """Whether this run of the node forwarded a command to `group`."""
        ...


class ReplicatedGroup:
    """Base of QuorumQueue and the metadata group: `raft`, `group`, the waiters."""

    def __init__(self, group: str, raft: RaftNode | None, router: Router) -> None:
        self.group = group            # the Raft group uid (log storage key)
        self.raft = raft
        # the node's cluster: forwards to the leader (a node alone is a cluster of one)
        self.router = router
        self.deleted = False
        # index -> [(term of the append or None for "any", command data, waiter)]; the
        # data of a run waited for at its last index is the run's list (RunWaiter)
        self.waiters: dict[int, list[tuple[int | None, bytes, Waiter]]] = {}
        self.on_leader: list[Callable[[], None]] = []  # waiting for a known leader
        self.applied_term = 0         # the term of the last entry applied here
        self.leader_hint: str | None = None  # no replica here: the leader, last we heard
        # identities of the forwarded commands applied here (replicated state: equal on
        # every member at the same index, saved in snapshots)
        self.applied = AppliedIds()
        # the commit-latency gauge (rabbitmq_raft_entry_commit_latency_seconds): one
        # entry at a time is timed, (its index, the clock when it was handed to
        # storage), until an applied Ready commits it (queues/quorum/groups.py)
        self.commit_probe: tuple[int, float] | None = None
        self.commit_latency_s = 0.0   # the last timed entry's, in seconds

    @property
    def is_leader(self) -> bool:
        return self.raft is not None and self.raft.role is _LEADER

    @property
    def leader_id(self) -> str | None:
        return self.leader_hint if self.raft is None else self.raft.leader_id

    def propose_data(self, data: bytes, waiter: Waiter | None = None) -> None:
        """Append `data` to the group's log, here or at the leader; `waiter` gets the
        machine's reply once this member applied it (a run of one)."""
        self.propose_run([(data, waiter)])

    def propose_run(self, run: list[tuple[bytes | list[bytes], Waiter | None]]) -> None:
        """Append the commands of `run` to the group's log in order: as one append
        when this member leads, else each forwarded to the leader. Each waiter gets
        its own command's reply once this member applied it. An item whose data is a
        list of commands has no waiter or a `RunWaiter`, which waits for them all.

        A leader that forwarded to its group before (another member led) sends its
        commands through the router too, which numbers them after those forwards:
        one still to be proposed again (lost with the old leader) then comes first
        (raft/forwarded.py keeps a node's order by its seqs; a bare command would
        be applied ahead of it)."""
        raft = self.raft
        router = self.router
        if (raft is not None and raft.role is _LEADER  # is_leader
                and not (router.forwarded_to(self.group)
                         and any(data[0] != FORWARDED for data, _ in run))):
            datas: list[bytes] = []
            for data, _waiter in run:
                if type(data) is list:  # a run of its own: one waiter for all
                    datas += data
                else:
                    datas.append(data)
            try:
                index = raft.propose_run(datas)
            except (NotLeader, ProposalRejected):  # mid transfer: the next leader takes it
                pass
            else:
                term, waiters = raft.term, self.waiters
                for data, waiter in run:
                    if type(data) is list:  # waits at its last entry (RunWaiter)
                        index += len(data)
                        if waiter is not None:
                            waiters.setdefault(index - 1, []).append((term, data, waiter))
                        continue
                    if waiter is None and data[0] == FORWARDED:
                        waiter = UNANSWERED  # its seq must land (module header)
                    if waiter is not None:
                        waiters.setdefault(index, []).append((term, data, waiter))
                    index += 1
                return
        for data, waiter in run:
            if type(data) is list:
                for command, one in zip(data, waiter.split(len(data)) if waiter is not None
                                        else [None] * len(data)):
                    router.forward(self, command, one)
            else:
                router.forward(self, data, waiter)

    def wait_at(self, index: int, term: int, data: bytes, waiter: Waiter) -> None:
        """A forwarded command was appended at (index, term) by the leader."""
        self.waiters.setdefault(index, []).append((term, data, waiter))

    def entry_committed(self, index: int, term: int) -> None:
        """Called for every entry this member applies, before its waiters. The first
        entry of a newer term dooms every append of an older term at this index or
        later (terms never decrease along a log): their commands are proposed again
        now, even if nothing is ever appended at their own index."""
        if term <= self.applied_term:
            return
        self.applied_term = term
        doomed = [i for i, waiting in self.waiters.items() if i > index
                  and any(expected is not None and expected < term
                          for expected, _data, _waiter in waiting)]
        for i in doomed:
            keep = []
            for expected, data, waiter in self.waiters.pop(i):
                if expected is not None and expected < term:
                    self.propose_data(data, waiter)
                else:
                    keep.append((expected, data, waiter))
            if keep:
                self.waiters.setdefault(i, []).extend(keep)

    def snapshot_installed(self, index: int, term: int) -> None:
        """The leader sent a snapshot up to `index` in place of entries: the waiters
        at or below it never see their entry applied here, and the snapshot does not
        say which commands it holds. Their commands are proposed again: a forwarded
        one that did make it in is recognised by its identity (the snapshot holds
        the identities applied) and answered with the reply kept for it; a command
        proposed on the leader itself that did make it in is applied twice (at
        least once, never lost). Barriers are released."""
        self.applied_term = max(self.applied_term, term)
        for i in sorted(i for i in self.waiters if i <= index):
            for expected, data, waiter in self.waiters.pop(i):
                if expected is None:
                    waiter(None)
                else:
                    self.propose_data(data, waiter)

    def admit(self, index: int, term: int, data: bytes) -> tuple[Identity | None, int | None]:
        """(identity, where the command starts in `data`: HEAD_SIZE) of a forwarded
        COMMAND entry about to be applied, (None, 0) for one that is not forwarded;
        (identity, None) if an entry with that identity was applied before: then the
        entry's waiters are answered here, with the first one's reply, and the
        machine must not see it. An admitted identity is recorded here
        (`AppliedIds.admit`); the caller hands its reply to `AppliedIds.keep_reply`.
        Nothing is copied: the command is read in place."""
        identity = identity_of(data)
        if identity is None:
            return None, 0
        if self.applied.admit(identity, index):  # recorded now
            return identity, HEAD_SIZE
        reply = self.applied.reply(identity)
        for waiter in self.take_waiters(index, term):
            waiter(reply)
        return identity, None

    def admit_in_order(self, index: int, term: int,
                       data: bytes) -> tuple[Identity | None, int | None]:
        """`admit`, keeping each origin's order (`AppliedIds.admit_in_order`): also
        (identity, None) for an entry held pending behind a lower seq of its origin.
        Its waiters stay, to be answered when it is applied (`take_released`); a
        waiter at its index whose append another leader's overwrote is proposed
        again now, as `take_waiters` does."""
        identity = identity_of(data)
        if identity is None:
            return None, 0
        time_ms = _TIME.unpack_from(data, HEAD_SIZE)[1] if data[HEAD_SIZE] == TIMED else 0
        verdict = self.applied.admit_in_order(identity, index, term, time_ms)
        if verdict == APPLY:
            return identity, HEAD_SIZE
        if verdict == SEEN:
            reply = self.applied.reply(identity)
            for waiter in self.take_waiters(index, term):
                waiter(reply)
        elif index in self.waiters:  # HELD: only its own append's waiters wait on
            keep = []
            for expected, command, waiter in self.waiters.pop(index):
                if expected is None or expected == term:
                    keep.append((expected, command, waiter))
                else:
                    self.propose_data(command, waiter)
            if keep:
                self.waiters.setdefault(index, []).extend(keep)
        return identity, None

    def take_waiters(self, index: int, term: int) -> list[Waiter]:
        """The waiters entry (index, term) answers; the others' commands are proposed
        again (their append was overwritten by another leader's)."""
        waiting = self.waiters.pop(index, None)
        if not waiting:
            return []
        answered = []
        for expected, data, waiter in waiting:
            if expected is None or expected == term:
                answered.append(waiter)
            else:
                self.propose_data(data, waiter)
        return answered

    def has_unapplied(self) -> bool:
        if self.raft is None:  # no replica here: nothing is applied here
            return False
        return self.raft.log.last_index() > self.raft.applied_index

    def after_applied(self, waiter: Waiter) -> None:
        """Call `waiter` once everything appended here so far is applied (a barrier);
        now if that is already so. A follower that has just forwarded what it held
        appended nothing: a wait at its last index, applied already, would never end."""
        last = self.raft.log.last_index()
        if last <= self.raft.applied_index:
            waiter(None)
            return
        self.waiters.setdefault(last, []).append((None, b"", waiter))

    def when_led(self, callback: Callable[[], None]) -> None:
        """Call `callback` once the group has a known leader (now if it has one)."""
        if self.raft is None or self.leader_id is not None:  # no replica here: no wait
            callback()
        else:
            self.on_leader.append(callback)

    def leader_known(self) -> None:
        callbacks, self.on_leader = self.on_leader, []
        for callback in callbacks:
            callback()

    def fail_waiters(self) -> None:
        waiters, self.waiters = self.waiters, {}
        for waiting in waiters.values():
            for _term, _data, waiter in waiting:
                waiter(None)
        callbacks, self.on_leader = self.on_leader, []
        for callback in callbacks:
            callback()
