"""A small harness for readable interaction scripts against the pure core.

A test reads as a script: a few members, explicit ticks, explicit sends and
deliveries, and expectations written as short text lines:

    s = Script("a", "b", "c")
    s.campaign("a")
    assert s.send("a") == ["a->b PreVote term=1 last=0@0", "a->c PreVote term=1 last=0@0"]

`send(id)` runs one Ready cycle of a member (persist, queue its messages, apply,
advance) and shows what it sent; `deliver()` steps queued messages into their
recipients; `stabilize()` repeats both until nothing moves. Messages to a crashed
member or across a cut link are dropped when delivered.
"""

from __future__ import annotations

from quorumqueue.broker.raft.config import RaftConfig
from quorumqueue.broker.raft.messages import (AppendEntries, AppendEntriesResponse,
                                              InstallSnapshot, InstallSnapshotResponse,
                                              Message, RequestVote, RequestVoteResponse,
                                              TimeoutNow)
from quorumqueue.broker.raft.ready import Role

from .harness import MemoryStorage, Member, entry_text

CONFIG = RaftConfig(election_ticks=10, heartbeat_ticks=2, max_entries_per_message=64,
                    max_inflight=8, check_quorum=True, pre_vote=True)


def message_text(m: Message) -> str:
    head = f"{m.from_}->{m.to}"
    match m:
        case RequestVote():
            kind = "PreVote" if m.pre_vote else "Vote"
            tail = " transfer" if m.leadership_transfer else ""
            return f"{head} {kind} term={m.term} last={m.last_index}@{m.last_term}{tail}"
        case RequestVoteResponse():
            kind = "PreVoteResp" if m.pre_vote else "VoteResp"
            verdict = "granted" if m.granted else "rejected"
            return f"{head} {kind} term={m.term} {verdict}"
        case AppendEntries():
            entries = " ".join(entry_text(e) for e in m.entries)
            return (f"{head} App term={m.term} prev={m.prev_index}@{m.prev_term} "
                    f"commit={m.leader_commit} [{entries}]" + (" quiet" if m.quiet else ""))
        case AppendEntriesResponse():
            if m.success:
                return f"{head} AppResp term={m.term} match={m.match_index}"
            return (f"{head} AppResp term={m.term} reject={m.rejected_index} "
                    f"hint={m.hint_index}@{m.hint_term}")
        case InstallSnapshot():
            return (f"{head} Snapshot term={m.term} index={m.meta.index}@{m.meta.term} "
                    f"members={','.join(m.meta.members)}")
        case InstallSnapshotResponse():
            return f"{head} SnapshotResp term={m.term} match={m.match_index}"
        case TimeoutNow():
            return f"{head} TimeoutNow term={m.term}"
    raise AssertionError(m)


class Script:
    def __init__(self, *ids: str, config: RaftConfig = CONFIG,
                 members: tuple[str, ...] | None = None) -> None:
        self.config = config
        initial = members if members is not None else ids
        self.members = {id: Member(id, config, MemoryStorage(initial), seed=n)
                        for n, id in enumerate(ids)}
        self.mailbox: list[Message] = []
        self.down: set[str] = set()
        self.cut_links: set[frozenset[str]] = set()

    def node(self, id: str):
        return self.members[id].node

    # --- inputs ---

    def add_member(self, id: str) -> None:
        """A fresh, empty member that knows no configuration but the leader's messages."""
        self.members[id] = Member(id, self.config, MemoryStorage(()), seed=len(self.members))

    def campaign(self, id: str) -> None:
        self.node(id).campaign()

    def tick(self, id: str, times: int = 1) -> None:
        for _ in range(times):
            self.node(id).tick()

    def tick_all(self, times: int = 1) -> None:
        for _ in range(times):
            for id in self.members:
                if id not in self.down:
                    self.node(id).tick()

    def propose(self, id: str, *commands: str) -> list[int]:
        return [self.node(id).propose(c.encode()) for c in commands]

    def crash(self, id: str) -> None:
        self.down.add(id)

    def restart(self, id: str) -> None:
        self.down.discard(id)
        self.members[id].restart()

    def isolate(self, id: str) -> None:
        self.cut_links |= {frozenset((id, other)) for other in self.members if other != id}

    def cut(self, id: str, *others: str) -> None:
        """Cut the links between `id` and each of `others` (both directions)."""
        self.cut_links |= {frozenset((id, other)) for other in others}

    def heal(self) -> None:
        self.cut_links.clear()

    # --- outputs ---

    def send(self, id: str) -> list[str]:
        """One Ready cycle of `id`; the messages it sent."""
        result = self.members[id].handle_ready()
        if result is None:
            return []
        _, outgoing = result
        self.mailbox.extend(outgoing)
        return [message_text(m) for m in outgoing]

    def deliver(self, to: str | None = None) -> list[str]:
        """Step queued messages (for `to`, or all) into their recipients."""
        delivered, kept = [], []
        for m in self.mailbox:
            if to is not None and m.to != to:
                kept.append(m)
                continue
            if m.to in self.down or frozenset((m.from_, m.to)) in self.cut_links:
                continue                                  # lost
            delivered.append(m)
        self.mailbox = kept
        for m in delivered:
            self.node(m.to).step(m)
        return [message_text(m) for m in delivered]

    def stabilize(self) -> list[str]:
        """Send and deliver until quiet; everything delivered, in order."""
        log: list[str] = []
        for _ in range(10_000):
            for id in self.members:
                if id not in self.down:
                    self.send(id)
            if not self.mailbox:
                return log
            log.extend(self.deliver())
        raise AssertionError("stabilize: messages kept flowing (livelock?)")

    def elect(self, id: str) -> None:
        self.campaign(id)
        self.stabilize()
        assert self.node(id).role is Role.LEADER

    # --- views ---

    def log(self, id: str) -> str:
        """The member's log (storage and unstable suffix) as `index@term:data` words."""
        log = self.node(id).log
        return " ".join(entry_text(e)
                        for e in log.entries(log.first_index(), log.last_index() + 1))

    def applied(self, id: str) -> list[str]:
        return [data.decode() for _, data in self.members[id].machine.commands]

    def state(self, id: str) -> str:
        n = self.node(id)
        return (f"{id} {n.role.value} term={n.term} leader={n.leader_id} "
                f"commit={n.commit_index} applied={n.applied_index} last={n.log.last_index()}")
