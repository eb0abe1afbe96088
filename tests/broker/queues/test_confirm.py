"""The publisher confirm a publish owes (queues/base.py `Confirm`): each hold is
answered once, a refusal makes it a nack, and a subclass that answers differently
(the dead-letter worker's: broker/queues/quorum/dead_letter_worker.py) is answered through its
own `_answer` whichever kind of hold a queue took."""

from __future__ import annotations

from quorumqueue.broker.queues.base import Confirm


class Channel:
    def __init__(self) -> None:
        self.answered = 0  # how often a Confirm put it in `ANSWERED`


class Answered:
    """The node's set of channels with answered confirms, counting: a Confirm's
    answer is `add(channel)`, nothing called on the channel."""

    def add(self, channel: Channel) -> None:
        channel.answered += 1


ANSWERED = Answered()


def test_a_reply_hold_confirms_unless_the_reply_is_the_refusal():
    channel = Channel()
    confirm = Confirm(channel, 1, ANSWERED)
    accepted, refused = confirm.hold_reply("rejected"), confirm.hold_reply("rejected")
    assert confirm.outstanding == 2
    accepted("ok")
    assert (confirm.outstanding, confirm.ok, channel.answered) == (1, True, 1)
    refused("rejected")
    assert (confirm.outstanding, confirm.ok, channel.answered) == (0, False, 2)


def test_a_duplicate_is_confirmed_like_a_stored_message():
    confirm = Confirm(Channel(), 1, ANSWERED)
    confirm.hold_reply("rejected")("duplicate")
    assert (confirm.outstanding, confirm.ok) == (0, True)


def test_a_subclass_answering_itself_gets_every_hold_through_its_answer():
    class Counting(Confirm):
        __slots__ = ("answers",)

        def __init__(self) -> None:
            super().__init__(None, 0, None)
            self.answers = []

        def _answer(self, accepted: bool) -> None:  # no channel: its own bookkeeping
            self.outstanding -= 1
            self.answers.append(accepted)

    confirm = Counting()
    confirm.hold_reply("rejected")("ok")
    confirm.hold_reply("rejected")("rejected")
    confirm.hold()(True)
    assert confirm.answers == [True, False, True]
    assert confirm.outstanding == 0
