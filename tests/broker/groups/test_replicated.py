"""groups/replicated.py: a run of commands proposed with one waiter (RunWaiter)."""
from __future__ import annotations

from types import SimpleNamespace

from quorumqueue.broker.groups.replicated import ReplicatedGroup, RunWaiter
from quorumqueue.broker.raft.ready import Role


class Raft:
    """A leader's core as propose_run sees it: appends from `last` + 1 on."""

    def __init__(self, last: int = 0, term: int = 1) -> None:
        self.role, self.term, self.last, self.appended = Role.LEADER, term, last, []

    def propose_run(self, datas) -> int:
        self.appended.append(list(datas))
        first, self.last = self.last + 1, self.last + len(datas)
        return first


class Router:
    def __init__(self) -> None:
        self.forwards: list = []

    def forward(self, member, data, waiter) -> None:
        self.forwards.append((data, waiter))

    def forwarded_to(self, group: str) -> bool:
        return False


def test_a_run_waits_at_its_last_entry_and_is_appended_with_the_commands_around_it():
    group = ReplicatedGroup("g", Raft(last=4), Router())
    answered: list = []
    run = RunWaiter(answered.append, "rejected")
    single: list = []
    group.propose_run([(b"a", single.append), ([b"b1", b"b2", b"b3"], run), (b"c", None)])
    assert group.raft.appended == [[b"a", b"b1", b"b2", b"b3", b"c"]]
    assert sorted(group.waiters) == [5, 8]
    assert group.waiters[8] == [(1, [b"b1", b"b2", b"b3"], run)]
    for waiter in group.take_waiters(8, 1):
        waiter("ok")
    assert answered == ["ok"]


def test_a_run_whose_last_append_is_lost_is_proposed_again_whole():
    """Another leader's entry of a newer term at or below the run's last index dooms
    it: every command of the run is appended again (keyed: those that did land are
    duplicates) and the same waiter waits at the new last index."""
    group = ReplicatedGroup("g", Raft(), Router())
    answered: list = []
    run = RunWaiter(answered.append, "rejected")
    group.propose_run([([b"b1", b"b2"], run)])
    group.raft.term = 2
    group.entry_committed(1, 2)  # b1's place taken by term 2: b2's append is lost
    assert group.raft.appended == [[b"b1", b"b2"], [b"b1", b"b2"]]
    assert group.waiters == {4: [(2, [b"b1", b"b2"], run)]}


def test_a_forwarded_run_gives_each_command_a_waiter_and_answers_once():
    group = ReplicatedGroup("g", None, Router())
    answered: list = []
    group.propose_run([([b"b1", b"b2", b"b3"], RunWaiter(answered.append, "rejected")),
                       ([b"d1", b"d2"], None)])
    datas = [data for data, _ in group.router.forwards]
    assert datas == [b"b1", b"b2", b"b3", b"d1", b"d2"]
    waiters = [waiter for _, waiter in group.router.forwards]
    assert waiters[3:] == [None, None]
    for waiter, reply in zip(waiters[:3], ["ok", "rejected", "rejected"]):
        assert answered == []
        waiter(reply)
    assert answered == ["rejected"]
