"""The in-process benchmark's run: every message published is confirmed into the
queue, delivered once and acked (it raises otherwise), and a phase's figure is CPU per
message. No sockets; the figures themselves are not checked (no timing assertions)."""

import pytest

from bench import inprocess_node


def test_one_run_delivers_and_acks_every_message_published():
    publish, consume = inprocess_node.one_run(messages=1200, size=64)
    assert publish > 0 and consume > 0


def test_a_consume_that_misses_messages_stops_the_run(monkeypatch):
    # a mark that never occurs in the session's output: nothing seems delivered
    monkeypatch.setattr(inprocess_node, "DELIVER_MARK", b"\xff" * 16)
    with pytest.raises(SystemExit):
        inprocess_node.one_run(messages=10, size=16)
