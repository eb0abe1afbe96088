"""The remote classic queue type returns actions; its link carries out the host's.

Issue 29, Build 1: a classic queue hosted on another node is, on this node, a
RemoteClassicQueue whose operations go to the host through a ClassicLink
(cluster/classic_link.py). Its commands return no actions now. What the host
answers later, the link carries out: a declare's `DeclareOk` with the caller's
`send`, here with a link that answers at once. The type itself calls no channel.
Across nodes the frames are pinned by tests/broker/cluster/test_classic_queues.py.
"""

from __future__ import annotations

import ast
import pathlib

from quorumqueue.broker.queues import remote
from quorumqueue.broker.queues.remote import NO_COUNTS, RemoteClassicQueue

ASKER = object()  # a channel as the remote type sees it: passed on, never called


class Link:
    """A ClassicLink whose host answers at once; it records what it was asked."""

    node_name = "here"

    def __init__(self, counts: dict) -> None:
        self.asked: list = []
        self.host_counts = counts

    def reachable(self, host: str) -> bool:
        return True

    def counts(self, queue, done, use: bool = False) -> None:
        self.asked.append(("counts", use))
        done(self.host_counts)

    def get(self, queue, channel, no_ack: bool) -> None:
        self.asked.append(("get", channel, no_ack))

    def purge(self, queue, to) -> None:
        self.asked.append(("purge", to))

    def settle(self, queue, channel, seqs, requeue) -> None:
        self.asked.append(("settle", channel, seqs, requeue))

    def channel_closed(self, queue, channel) -> None:
        self.asked.append(("closed", channel))


def new_queue(link: Link) -> RemoteClassicQueue:
    return RemoteClassicQueue("/", "q", True, None, False, {}, "uid", "there", link)


def test_commands_return_no_actions_and_go_to_the_host():
    link = Link(dict(NO_COUNTS))
    queue = new_queue(link)
    assert queue.basic_get(ASKER, True) == []
    assert queue.settle(ASKER, [7], None) == []
    assert queue.channel_closed(ASKER, []) == []
    assert queue.purge(ASKER) == []
    assert link.asked == [("get", ASKER, True), ("settle", ASKER, [7], None),
                          ("closed", ASKER), ("purge", ASKER)]


class Caller:
    """Who asked for declare-ok's counts (queues/base.py Asker)."""

    def __init__(self) -> None:
        self.sent: list = []

    def declare_ok(self, ready: int, consumers: int) -> None:
        self.sent.append((ready, consumers))


def test_declare_ok_carries_out_the_hosts_counts_to_who_asked():
    link = Link({**NO_COUNTS, "ready": 3, "consumers": 2})
    queue = new_queue(link)
    caller = Caller()
    assert queue.declare_ok(caller) == []
    assert caller.sent == [(3, 2)] and link.asked == [("counts", True)]


def test_the_remote_queue_type_calls_no_channel():
    """No attribute of anything named `channel` is called in queues/remote.py, and it
    imports nothing of node/ or cluster/ (also a contract in .importlinter)."""
    tree = ast.parse(pathlib.Path(remote.__file__).read_text())
    called = [node.func for node in ast.walk(tree) if isinstance(node, ast.Call)]
    on_channel = [ast.unparse(func) for func in called if isinstance(func, ast.Attribute)
                  and "channel" in ast.unparse(func.value).split(".")]
    assert on_channel == []
    imported = [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    assert not [m for m in imported if {"node", "cluster"} & set(m.split("."))]
