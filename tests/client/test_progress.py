"""client/progress.py: plain lines when stderr is not a terminal, a rich bar when it is."""

import io

from quorumqueue.client.progress import Progress


def test_not_a_terminal_gets_one_plain_line_per_step():
    stream = io.StringIO()
    with Progress("grow", total=2, stream=stream) as progress:
        progress.advance("/ /q1")
        progress.advance()
    assert stream.getvalue() == "grow: 1/2 / /q1\ngrow: 2/2\n"


def test_a_terminal_gets_a_bar_with_counts_and_no_plain_lines():
    stream = io.StringIO()
    with Progress("grow", total=3, stream=stream, force_terminal=True) as progress:
        for name in ("q1", "q2", "q3"):
            progress.advance(name)
    drawn = stream.getvalue()
    assert "\x1b[" in drawn  # terminal control sequences: a bar, not lines
    assert "3/3" in drawn and "grow: " not in drawn
