"""wait_until: the first true value, errors propagated unless retried, and a timeout
naming what was awaited with the last value and the log."""

import pytest

from tests.support.waiting import wait_until


def test_the_first_true_value_is_returned():
    answers = iter([0, None, [], "ready", "later"])
    assert wait_until(lambda: next(answers), "an answer", timeout=60, interval=0) == "ready"


def test_a_timeout_names_what_was_awaited_the_last_value_and_the_log():
    with pytest.raises(AssertionError) as raised:
        wait_until(lambda: [], "the queue", timeout=0, log=lambda: "log tail")
    assert str(raised.value) == ("timed out after 0s waiting for the queue; last: []\n"
                                 "log tail")


def test_an_error_propagates_unless_errors_are_retried():
    def flaky():
        answers.append(len(answers))
        if len(answers) < 3:
            raise ConnectionRefusedError("starting")
        return "up"

    answers: list[int] = []
    with pytest.raises(ConnectionRefusedError):
        wait_until(flaky, "the node", timeout=60, interval=0)
    answers.clear()
    assert wait_until(flaky, "the node", timeout=60, interval=0, retry_errors=True) == "up"
    with pytest.raises(AssertionError, match=r"last: ConnectionRefusedError\('starting'\)"):
        answers.clear()
        wait_until(flaky, "the node", timeout=0, retry_errors=True)
