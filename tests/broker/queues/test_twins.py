"""broker/queues' hand-inlined copies ("twins") agree with their originals."""
from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from quorumqueue.broker.groups.replicated import ReplicatedGroup
from quorumqueue.broker.queues.base import Confirm


class Channel:
    def __init__(self) -> None:
        self.answered = 0

    def confirm_answered(self) -> None:
        self.answered += 1


def _seen(confirm: Confirm) -> tuple:
    return confirm.ok, confirm.outstanding, confirm.channel.answered


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["rejected", None, 0]),
       st.lists(st.sampled_from(["ok", "rejected", "duplicate", None, 0, 1]), max_size=8))
def test_a_held_reply_answers_as_answer_of_reply_not_refused_does(refused, replies):
    """Confirm._reply (`_answer(reply != refused)` with the body inlined): the same
    ack or nack, queues outstanding and confirm_answered calls as `_answer`, for
    every run of machine replies."""
    fast, slow = Confirm(Channel(), 1), Confirm(Channel(), 1)
    replying = [fast.hold_reply(refused) for _ in replies]
    answering = [slow.hold() for _ in replies]
    for reply, one, other in zip(replies, replying, answering):
        one(reply)
        other(reply != refused)
        assert _seen(fast) == _seen(slow)
    assert fast.ok == all(reply != refused for reply in replies)


waiting_lists = st.lists(st.tuples(st.sampled_from([None, 1, 2, 3]), st.binary(max_size=3)),
                         min_size=1, max_size=3)


@settings(max_examples=300, deadline=None)
@given(waiting_lists, st.integers(1, 3))
def test_the_apply_loops_lone_waiter_case_is_take_waiters_answer(waiting, term):
    """queues/quorum/groups.py's apply loop answers a lone waiter of this term (or a
    barrier) itself (twin of ReplicatedGroup.take_waiters' usual case). Where it
    does, take_waiters answers that waiter alone and proposes nothing again; in
    every other case the loop calls take_waiters."""
    proposed = []
    waiters = [(expected, data, object()) for expected, data in waiting]
    group = SimpleNamespace(waiters={7: list(waiters)},
                            propose_data=lambda data, waiter: proposed.append(waiter))
    answered = ReplicatedGroup.take_waiters(group, 7, term)
    if len(waiters) == 1 and waiters[0][0] in (term, None):  # the loop's own case
        assert answered == [waiters[0][2]] and proposed == [] and group.waiters == {}
    assert sorted(map(id, answered + proposed)) == sorted(id(w[2]) for w in waiters)
