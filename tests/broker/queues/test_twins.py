"""broker/queues' hand-inlined copies ("twins") agree with their originals."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

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
