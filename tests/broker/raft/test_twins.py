"""broker/raft's hand-inlined copies ("twins") agree with their originals on random
inputs: the state they leave is the same."""
from __future__ import annotations

import random
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from quorumqueue.broker.raft.config import RaftConfig
from quorumqueue.broker.raft.core import RaftNode
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
