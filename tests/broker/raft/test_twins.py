"""broker/raft's hand-inlined copies ("twins") agree with their originals on random
inputs: the state they leave is the same."""
from __future__ import annotations

import random
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from quorumqueue.broker.raft.config import RaftConfig
from quorumqueue.broker.raft.core import RaftNode
from quorumqueue.broker.raft.messages import (AppendEntries, AppendEntriesResponse,
                                              RequestVote, RequestVoteResponse, TimeoutNow)
from quorumqueue.broker.raft.ready import Role
from quorumqueue.broker.raft.types import NOOP

from .harness import MemoryStorage


# AppliedIds.admit, the twin of `seen` then `record`: its test is
# tests/broker/raft/test_forwarded.py test_admit_and_keep_reply_are_seen_and_record_in_one_call.


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["run", "noop", "other"]),
                          st.lists(st.binary(max_size=4), min_size=1, max_size=3)),
                min_size=1, max_size=12))
def test_propose_run_marks_the_group_awake_as_woken_does(steps):
    """RaftNode.propose_run marks its group awake in the shared dict (twin of
    `_woken`): after each proposal the dict is what `_woken` makes of it, other
    groups' marks and their order kept."""
    awake: dict[str, None] = {}
    storage = MemoryStorage(("a",))
    node = RaftNode("a", RaftConfig(election_ticks=10, heartbeat_ticks=2), storage,
                    random.Random(1), awake, "g")
    node.campaign()
    while (ready := node.ready()) is not None:
        storage.persist(ready)
        node.advance(ready)
    for kind, datas in steps:
        awake.clear()
        awake["before"] = None
        if kind == "other":
            awake["g"] = None
            awake["after"] = None
        expected = dict(awake)
        RaftNode._woken(SimpleNamespace(_awake=expected, _group="g"))
        if kind == "noop":
            node.propose(b"", NOOP)   # calls `_woken` itself
        else:
            node.propose_run(datas)
        assert list(awake.items()) == list(expected.items())


def _message(kind: str, term: int, sender: str):
    match kind:
        case "vote":
            return RequestVote(term, sender, "a", 0, 0)
        case "pre-vote":
            return RequestVote(term, sender, "a", 0, 0, pre_vote=True)
        case "vote-response":
            return RequestVoteResponse(term, sender, "a", True)
        case "heartbeat":
            return AppendEntries(term, sender, "a", 0, 0, (), 0)
        case "append-response":
            return AppendEntriesResponse(term, sender, "a", True, 0)
        case _:
            return TimeoutNow(term, sender, "a")


@settings(max_examples=200, deadline=None)
@given(st.booleans(), st.booleans(),
       st.lists(st.tuples(st.sampled_from(["vote", "pre-vote", "vote-response", "heartbeat",
                                           "append-response", "timeout-now"]),
                          st.integers(0, 4), st.sampled_from(["b", "c"]),
                          st.sampled_from(["none", "other", "this"])),
                min_size=1, max_size=12))
def test_step_marks_the_group_awake_as_woken_does(leads, shared, steps):
    """RaftNode.step marks its group awake in the shared dict before it reads the
    message (twin of `_woken`, once per message): after each message, of any kind
    and term, to a leader or a follower, the dict is what `_woken` makes of it,
    other groups' marks and their order kept. A core with no dict steps as well."""
    awake: dict[str, None] | None = {} if shared else None
    storage = MemoryStorage(("a", "b", "c"))
    node = RaftNode("a", RaftConfig(election_ticks=10, heartbeat_ticks=2), storage,
                    random.Random(1), awake, "g")
    if leads:
        node.campaign()
        node.step(RequestVoteResponse(1, "b", "a", True))
    for kind, term, sender, marks in steps:
        message = _message(kind, term, sender)
        if type(message) is AppendEntries and node.role is Role.LEADER and term == node.term:
            continue  # a second leader in our term: impossible (the core raises on it)
        if awake is not None:
            awake.clear()
            awake.update({"before": None, "g": None, "after": None} if marks == "this"
                         else {"before": None} if marks == "other" else {})
        expected = None if awake is None else dict(awake)
        RaftNode._woken(SimpleNamespace(_awake=expected, _group="g"))
        node.step(message)
        assert awake == expected and list((awake or {}).items()) == list((expected or {}).items())
        while (ready := node.ready()) is not None:
            storage.persist(ready)
            node.advance(ready)
