"""Group commit off the event loop (broker/server/server.py `flush`, node/group_commit.py):
the broker's Ordering rules (broker/README.md) — a confirm leaves only after the fsync
that covers it — still hold while the fsyncs run on the writer thread, and while one
runs the event loop keeps reading and applying other clients' input.

The broker runs in this process (a thread with its own event loop) so that the test can
hold the writer thread inside a Sync and look at the node meanwhile."""

from __future__ import annotations

import asyncio
import threading
import time

import pika
import pytest

from quorumqueue.broker.config import Settings
from quorumqueue.broker.groups import driver
from quorumqueue.broker.node import group_commit
from quorumqueue.broker.server.server import BrokerServer
from quorumqueue.broker.storage.metadata_store import load_document

from tests.support import waiting

pytestmark = pytest.mark.timeout(120)

WAIT = 30.0  # generous: the suite runs beside other CPU-heavy work


class Gate:
    """Holds the writer thread at the start of each Sync that writes, until the test
    lets it through: `allow(n)` lets n more pass, `open()` all of them."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._permits: float = float("inf")
        self.entered = 0      # Syncs that reached the gate

    def close(self) -> None:
        """Hold every Sync from now on; `entered` counts from here."""
        with self._condition:
            self._permits = 0
            self.entered = 0

    def allow(self, count: int) -> None:
        with self._condition:
            self._permits += count
            self._condition.notify_all()

    def open(self) -> None:
        self.allow(float("inf"))

    def wait_entered(self, count: int) -> bool:
        with self._condition:
            return self._condition.wait_for(lambda: self.entered >= count, WAIT)

    def pass_(self) -> None:
        with self._condition:
            self.entered += 1
            self._condition.notify_all()
            assert self._condition.wait_for(lambda: self._permits > 0, WAIT), \
                "the test never let this Sync through"
            self._permits -= 1


@pytest.fixture
def gate(monkeypatch):
    gate = Gate()
    run = group_commit.Sync.run

    def held_run(sync):
        if threading.current_thread().name.startswith("quorumqueue-sync") and sync.writes:
            gate.pass_()
        run(sync)

    monkeypatch.setattr(group_commit.Sync, "run", held_run)
    return gate


@pytest.fixture
def server(tmp_path, gate):
    yield from running_server(Settings(host="127.0.0.1", port=0,
                                       data_dir=str(tmp_path / "node")), gate)


def running_server(settings: Settings, gate=None):
    """A BrokerServer on a loop of its own in a thread, yielded once started; stopped
    after the gate, if any, is opened (a held Sync would keep it from stopping)."""
    started = threading.Event()
    holder = {}

    def serve():
        loop = asyncio.new_event_loop()
        holder["loop"] = loop
        server = BrokerServer(settings)
        holder["server"] = server
        loop.run_until_complete(server.start())
        started.set()
        loop.run_forever()
        loop.run_until_complete(server.stop())
        loop.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert started.wait(WAIT)
    yield holder["server"]
    if gate is not None:
        gate.open()
    holder["loop"].call_soon_threadsafe(holder["loop"].stop)
    thread.join(WAIT)


def connect(server):
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", server.port))


def wait_until(condition, what: str) -> None:
    waiting.wait_until(condition, what, WAIT, interval=0.01)


class Publisher(threading.Thread):
    """One persistent message with publisher confirms, on a connection of its own."""

    def __init__(self, server, queue: str, body: bytes) -> None:
        super().__init__(daemon=True)
        self.connection = connect(server)
        self.channel = self.connection.channel()
        self.channel.confirm_delivery()
        self.queue, self.body = queue, body
        self.confirmed = threading.Event()

    def run(self) -> None:
        self.channel.basic_publish("", self.queue, self.body,
                                   pika.BasicProperties(delivery_mode=2), mandatory=True)
        self.confirmed.set()
        self.connection.close()


def second_applied_during_first_sync(server, gate, prefix: str, arguments: dict):
    """Two publishers to a new durable queue: the first publish's Sync is held at the
    gate, and the second publish, read meanwhile, is applied (in the queue's log, or
    the message store's batch for a classic queue). Returns (the declaring
    connection, first, second)."""
    setup = connect(server)
    queue = f"{prefix}-{len(arguments)}"
    setup.channel().queue_declare(queue, durable=True, arguments=arguments)
    node = server.node
    if arguments:
        group = node.vhosts["/"].queues[queue]
        # in the log, or held by the queue for its next round (one run per read)
        applied = lambda: group.raft.log.last_index() + len(group.publishing)  # noqa: E731
    else:
        applied = lambda: node.store.batch_id + len(node.store._batch)  # noqa: E731
    first = Publisher(server, queue, b"first")
    second = Publisher(server, queue, b"second")
    gate.close()
    first.start()
    assert gate.wait_entered(1), "no Sync began for the first publish"
    before = applied()
    second.start()
    wait_until(lambda: applied() > before, "the second publish to be applied")
    return setup, first, second


@pytest.mark.parametrize("arguments", [{"x-queue-type": "quorum"}, {}],
                         ids=["quorum", "classic"])
def test_a_confirm_waits_for_its_fsync_while_the_loop_reads_other_clients(server, gate,
                                                                          arguments):
    # the loop reads and applies the second publish while the first one's fsync runs
    setup, first, second = second_applied_during_first_sync(server, gate,
                                                            "group-commit", arguments)
    time.sleep(0.2)  # nothing may be confirmed while the writer thread is held
    assert not first.confirmed.is_set() and not second.confirmed.is_set()

    gate.open()
    assert first.confirmed.wait(WAIT) and second.confirmed.wait(WAIT)
    first.join(WAIT)
    second.join(WAIT)
    channel = setup.channel()
    bodies = []
    for _ in range(2):
        _method, _properties, body = channel.basic_get(first.queue, auto_ack=True)
        bodies.append(body)
    assert sorted(bodies) == [b"first", b"second"]
    setup.close()


def test_a_declare_ok_read_during_a_sync_waits_for_the_sync_that_saves_it(server, gate):
    """broker/README.md "Ordering rules": nothing is acknowledged before it is durable.
    A classic queue is declared through the metadata log and recorded in the node's
    metadata file (its journal: a line fdatasynced); its declare-ok, read while
    another client's fsync runs, leaves only after the later Syncs that made the log
    entry durable and saved the queue's record."""
    setup = connect(server)
    setup.channel().queue_declare("busy", durable=True, arguments={"x-queue-type": "quorum"})
    publisher = Publisher(server, "busy", b"m")
    declarer = connect(server)
    channel = declarer.channel()
    answered = {}

    def declare():
        channel.queue_declare("declared-meanwhile", durable=True)
        saved = load_document(server.node.metadata.directory)  # the file and its journal
        answered["saved"] = "declared-meanwhile" in {q["name"] for q in saved["queues"]}

    gate.close()
    publisher.start()
    assert gate.wait_entered(1), "no Sync began for the publish"
    thread = threading.Thread(target=declare, daemon=True)
    thread.start()
    meta = server.node.cluster.meta.raft
    wait_until(lambda: meta.log.last_index() > meta.applied_index,
               "the declare to be proposed while the first Sync is held")
    assert "declared-meanwhile" not in server.node.vhosts["/"].queues  # not durable yet
    gate.allow(1)           # the publish's Sync ends; the next one holds the declare
    assert gate.wait_entered(2), "no Sync began for the declared queue"
    thread.join(0.3)
    assert "saved" not in answered, "declare-ok left before the Sync that saves it"
    gate.open()
    thread.join(WAIT)
    assert answered == {"saved": True}
    assert publisher.confirmed.wait(WAIT)
    declarer.close()
    setup.close()


@pytest.mark.parametrize("arguments", [{"x-queue-type": "quorum"}, {}],
                         ids=["quorum", "classic"])
def test_a_confirm_does_not_wait_for_the_fsync_of_publishes_read_after_it(server, gate,
                                                                         arguments):
    """The first publish's Sync ends while the second publish, read meanwhile, waits
    for the next one: the first confirm leaves then. (A quorum queue of one commits an
    entry when its fsync completes; applying it must not wait for the fsync of the
    entries proposed meanwhile, which would add a whole Sync to every confirm of a
    busy publisher.)"""
    setup, first, second = second_applied_during_first_sync(server, gate, "own-fsync",
                                                            arguments)
    gate.allow(1)                           # the first publish's Sync ends
    assert gate.wait_entered(2), "no Sync began for the second publish"
    assert first.confirmed.wait(WAIT), "the first confirm waited for the second's fsync"
    assert not second.confirmed.is_set()    # its own Sync is still held
    gate.open()
    assert second.confirmed.wait(WAIT)
    first.join(WAIT)
    second.join(WAIT)
    setup.close()


class _Meeting:
    """Two fsyncs that each wait for the other to have begun: they finish only if
    they run at the same time (a Sync running them one after the other waits WAIT,
    then the first raises)."""

    def __init__(self) -> None:
        self.journal_began = threading.Event()
        self.log_began = threading.Event()
        self.journal_lines = []

    def append(self, lines) -> None:  # MetadataStore.append: the journal's fdatasync
        self.journal_began.set()
        assert self.log_began.wait(WAIT), "the journal's fsync ran alone, before the log's"
        self.journal_lines += lines


class _MeetingLog:
    def __init__(self, meeting: _Meeting) -> None:
        self.meeting = meeting
        self.records, self.after, self.fsync = [b"a record"], [], True

    def write_records(self) -> None:
        pass

    def write(self) -> None:  # WalBatch.write: the records, then the fdatasync
        self.sync()

    def rewind(self) -> None:
        pass

    def sync(self) -> None:  # WalBatch.sync: the log's fdatasync
        self.meeting.log_began.set()
        assert self.meeting.journal_began.wait(WAIT), "the log's fsync ran alone"


def test_a_queue_records_fsync_and_its_groups_fsync_run_at_once():
    """A queue declared or deleted makes one Sync hold both its journal line and its
    group's log record: the Sync waits for the longer of the two fsyncs, not their
    sum (each fake fsync here waits for the other to have begun; run in series, the
    first waits in vain)."""
    meeting = _Meeting()
    sync = group_commit.Sync(meeting, None, None, None, None, None,
                             driver.Round([], _MeetingLog(meeting)), [b"a journal line"])
    began = time.monotonic()
    sync.run()
    assert meeting.journal_lines == [b"a journal line"]
    assert time.monotonic() - began < WAIT
