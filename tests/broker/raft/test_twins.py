"""broker/raft's hand-inlined copies ("twins") agree with their originals on random
inputs: the state they leave is the same."""
from __future__ import annotations

import random
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from quorumqueue.broker.raft.config import RaftConfig
from quorumqueue.broker.raft.core import RaftNode
from quorumqueue.broker.raft.forwarded import MAX_ORIGINS, WINDOW, AppliedIds, Identity
from quorumqueue.broker.raft.types import NOOP

from .harness import MemoryStorage


def _window_state(applied: AppliedIds) -> list:
    return [(origin, w.floor, w.high, w.last_index, sorted(w.missing),
             sorted(w.replies.items())) for origin, w in applied.origins.items()]


# mostly the next seq of a few origins, with jumps past WINDOW, repeats and reorderings
steps = st.lists(st.tuples(st.integers(0, MAX_ORIGINS + 2),
                           st.sampled_from([1, 1, 1, 1, 0, -1, -3, 2, 5, WINDOW, WINDOW + 7]),
                           st.booleans(), st.sampled_from([None, "ok", "rejected", 3])),
                 min_size=1, max_size=120)


@settings(max_examples=300, deadline=None)
@given(steps)
def test_admit_then_keep_reply_records_what_seen_then_record_records(steps):
    """AppliedIds.admit (`seen` and `record` in one call, the usual next seq's
    `_Origin.record` inlined) then keep_reply: the same answer to "applied before?"
    and the same windows (floor, high, missing seqs, kept replies, last index and
    the eviction order) as `seen`, then `record`, after every entry."""
    fast, slow, highs = AppliedIds(), AppliedIds(), {}
    for index, (origin, delta, awaited, reply) in enumerate(steps, start=1):
        seq = max(1, highs.get(origin, 0) + delta)
        highs[origin] = max(highs.get(origin, 0), seq)
        identity = Identity(origin, seq, awaited)
        seen = slow.seen(identity)
        if not seen:
            slow.record(identity, index, reply)
        admitted = fast.admit(identity, index)
        if admitted:
            fast.keep_reply(identity, reply)
        assert admitted == (not seen)
        assert _window_state(fast) == _window_state(slow)


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
