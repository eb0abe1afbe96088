"""Reading a running broker's memory: its process RSS and its quorum log's memory tables.

Responsibilities
    Give ``bench/quorum_memory.py`` one probe per broker, each started fresh:
    the broker's address, the pid whose RSS counts, and ``log_memory(queue)``,
    i.e. how many bytes the Raft log holds in memory tables (to subtract) plus
    the queue's own estimate of its memory (a cross-check).

How it works
    RSS is ``VmRSS`` from ``/proc/<pid>/status``.

    quorumqueue: the pid is ``tests.support.broker.BrokerProcess``'s (one
    process); the figures are the management RPC's ``queues.list`` row of the
    queue: ``memtable_bytes`` (the group's entries held in memory until the WAL
    rolls over into segments) and ``state_bytes`` (the fifo machine's estimate
    of its per-message state).

    RabbitMQ: the pid is the ``beam.smp`` among the processes carrying the
    oracle node's marker variable (``tests.support.rabbitmq``). ra keeps a
    group's entries in ETS tables until the WAL rolls over; they are listed in
    ``ra_log_open_mem_tables`` and ``ra_log_closed_mem_tables`` (the table id
    is the last element of each row), and ``ets:info(Tid, memory)`` is in
    words. ``rabbitmqctl eval`` sums them (every quorum queue of the node; the
    benchmark declares exactly one). The cross-check is ``rabbitmqctl
    list_queues name memory``: the queue's ra server process memory. (Its
    ``messages`` column comes from metrics refreshed every few seconds, so the
    message count is checked by the load generator's passive declare instead.)
    rabbitmqctl reaches the private node with the node's own name, cookie
    (``$HOME/.erlang.cookie`` under its base directory) and epmd port, the same
    values ``RabbitMQNode._environment`` gives the node.

Invariants
    - A probe reads; it never changes the broker (the management RPC and
      rabbitmqctl open a connection of their own, which is why the benchmark
      reads them before the RSS baseline and after the final RSS).

Not here
    The load (``bench.amqp_loadgen``), the report (``bench/quorum_memory.py``).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench.brokers import BrokerAddress
from quorumqueue.client.management import call as management_call
from tests.support.broker import BrokerProcess
from tests.support.rabbitmq import MARKER_VARIABLE, RabbitMQNode, processes_with_marker

RABBITMQCTL = Path("/usr/lib/rabbitmq/bin/rabbitmqctl")  # not /usr/sbin's, which switches user
RABBITMQCTL_TIMEOUT_S = 120.0

# Bytes of every ra memory table on the node (ets:info/2 memory is in words; a
# table deleted between the listing and the info call answers `undefined`).
RA_MEMTABLE_BYTES = (
    "W = erlang:system_info(wordsize), "
    "Tids = [element(tuple_size(Row), Row) || Listing <- [ra_log_open_mem_tables, ra_log_closed_mem_tables], "
    "Row <- ets:tab2list(Listing)], "
    "W * lists:sum([M || Tid <- Tids, M <- [ets:info(Tid, memory)], is_integer(M)])."
)


class ProbeError(RuntimeError):
    """A memory figure could not be read, or contradicts the load."""


@dataclass(frozen=True, slots=True)
class LogMemory:
    memtable_bytes: int  # the Raft log's in-memory tables: subtracted from RSS growth
    queue_bytes: int  # the queue's own estimate: fifo state (quorumqueue), ra server process (RabbitMQ)


def parse_vm_rss(status: str) -> int:
    """Bytes of ``VmRSS`` in the text of ``/proc/<pid>/status``."""
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            value, unit = line.split()[1:3]
            if unit != "kB":
                raise ProbeError(f"VmRSS in unexpected unit {unit!r}")
            return int(value) * 1024
    raise ProbeError("no VmRSS line (a kernel thread, or the process is a zombie)")


def rss_bytes(pid: int) -> int:
    try:
        return parse_vm_rss(Path(f"/proc/{pid}/status").read_text())
    except FileNotFoundError:
        raise ProbeError(f"broker process {pid} is gone") from None


# -- quorumqueue -------------------------------------------------------------------------


class QuorumqueueProbe:
    label = "quorumqueue"

    def __init__(self, broker: BrokerProcess, startup_s: float) -> None:
        assert broker.process is not None, "broker not started"
        self.pid = broker.process.pid
        self.uri = broker.uri
        self.address = BrokerAddress("127.0.0.1", broker.port, startup_s=startup_s)

    def log_memory(self, queue: str) -> LogMemory:
        rows = management_call(self.uri, "queues.list", vhost="/")
        return quorumqueue_log_memory(rows, queue)


def quorumqueue_log_memory(rows: object, queue: str) -> LogMemory:
    """The figures from a ``queues.list`` result (a list of row dicts)."""
    assert isinstance(rows, list)
    matching = [row for row in rows if row.get("name") == queue]
    if len(matching) != 1:
        raise ProbeError(f"queues.list has {len(matching)} rows named {queue!r}")
    row = matching[0]
    if row.get("type") != "quorum" or "memtable_bytes" not in row:
        raise ProbeError(f"{queue!r} is not a quorum queue with memory figures: {row}")
    return LogMemory(memtable_bytes=int(row["memtable_bytes"]), queue_bytes=int(row["state_bytes"]))


@contextmanager
def quorumqueue_probe(wal_max_size: int | None = None, startup_timeout: float = 60.0) -> Iterator[QuorumqueueProbe]:
    """A fresh broker; ``wal_max_size`` sets ``raft.wal_max_size_bytes`` (default: the broker's)."""
    began = time.monotonic()
    broker = BrokerProcess(extra_config=f"[raft]\nwal_max_size_bytes = {wal_max_size}\n" if wal_max_size else "")
    try:
        broker.start(timeout=startup_timeout)
        yield QuorumqueueProbe(broker, time.monotonic() - began)
    finally:
        broker.cleanup()


# -- RabbitMQ ----------------------------------------------------------------------------------


def rabbitmqctl_environment(node: RabbitMQNode) -> dict[str, str]:
    """What rabbitmqctl needs to reach the private node: its name, its cookie (under
    its HOME), its epmd; and an empty env file so /etc/rabbitmq's is not read. The
    marker variable lets the node's stop() find a CLI process that hung."""
    assert node.base_dir is not None, "node not started"
    base = node.base_dir
    kept = {name: os.environ[name] for name in ("PATH", "LANG", "LC_ALL", "TMPDIR") if name in os.environ}
    return kept | {
        MARKER_VARIABLE: node.node_name,
        "HOME": str(base / "home"),
        "RABBITMQ_NODENAME": node.node_name,
        "RABBITMQ_USE_LONGNAME": "false",
        "ERL_EPMD_PORT": str(node.epmd_port),
        "RABBITMQ_CONF_ENV_FILE": str(base / "rabbitmq-env.conf"),
        "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq.conf"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
        "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
        "RABBITMQ_LOG_BASE": str(base / "log"),
    }


def parse_list_queues(output: str, queue: str) -> int:
    """The memory of ``queue`` from ``list_queues name memory`` printed with
    ``--quiet --no-table-headers`` (tab-separated lines)."""
    for line in output.splitlines():
        fields = line.split("\t")
        if len(fields) == 2 and fields[0] == queue:
            return int(fields[1])
    raise ProbeError(f"rabbitmqctl list_queues does not list {queue!r}:\n{output}")


def parse_eval_integer(output: str) -> int:
    text = output.strip()
    if not text.isdigit():
        raise ProbeError(f"rabbitmqctl eval did not print an integer: {output!r}")
    return int(text)


class RabbitMQProbe:
    label = "rabbitmq"

    def __init__(self, node: RabbitMQNode) -> None:
        self.node = node
        self.pid = beam_pid(node)
        self.address = BrokerAddress("127.0.0.1", node.port, startup_s=node.startup_seconds)
        self._environment = rabbitmqctl_environment(node)

    def log_memory(self, queue: str) -> LogMemory:
        memtable_bytes = parse_eval_integer(self.rabbitmqctl("eval", RA_MEMTABLE_BYTES))
        listing = self.rabbitmqctl("list_queues", "-p", "/", "name", "memory", "--quiet", "--no-table-headers")
        return LogMemory(memtable_bytes=memtable_bytes, queue_bytes=parse_list_queues(listing, queue))

    def rabbitmqctl(self, *arguments: str) -> str:
        command = [str(RABBITMQCTL), "-n", self.node.node_name, *arguments]
        try:
            done = subprocess.run(
                command,
                env=self._environment,
                capture_output=True,
                text=True,
                timeout=RABBITMQCTL_TIMEOUT_S,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            raise ProbeError(f"rabbitmqctl {arguments[0]} took over {RABBITMQCTL_TIMEOUT_S:.0f} s") from None
        if done.returncode != 0:
            raise ProbeError(f"rabbitmqctl {arguments[0]} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
        return done.stdout


def beam_pid(node: RabbitMQNode) -> int:
    """The node's Erlang VM: the ``beam.smp`` among the processes with its marker."""
    found = []
    for pid in processes_with_marker(node.node_name):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "beam.smp":
                found.append(pid)
        except OSError:
            continue
    if len(found) != 1:
        raise ProbeError(f"expected one beam.smp for {node.node_name}, found {found}")
    return found[0]


@contextmanager
def rabbitmq_probe(wal_max_size: int | None = None) -> Iterator[RabbitMQProbe]:
    """A fresh node; ``wal_max_size`` sets ``raft.wal_max_size_bytes`` (default: RabbitMQ's)."""
    with RabbitMQNode(extra_config=f"raft.wal_max_size_bytes = {wal_max_size}" if wal_max_size else "") as node:
        if not RABBITMQCTL.is_file():
            raise ProbeError(f"{RABBITMQCTL} missing: cannot read ra's memory tables")
        yield RabbitMQProbe(node)
