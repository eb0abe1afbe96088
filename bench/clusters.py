"""The clusters under test: N quorumqueue nodes or N RabbitMQ 3.10.8 nodes on loopback.

Responsibilities
    Start a cluster, wait until it can take work, tell which node leads a quorum
    queue and when every node knows the queue, and stop everything without leaving
    a process behind. Both kinds answer the same few questions (``uris``,
    ``leader_index``, ``wait_queue_known``), so the benchmarks treat them alike.

How it works
    quorumqueue: ``tests.support.cluster.LocalCluster(n, proxied=False)`` (real
    node processes on free ports, as ``quorumqueue cluster start`` runs them);
    ready once every node reports the same metadata leader through the management
    RPC ``cluster.status``, which also names each quorum queue's leader as the
    asked node sees it.

    RabbitMQ: each node is a ``tests.support.rabbitmq.RabbitMQNode`` (own base
    directory, AMQP and distribution ports, marker variable) with three changes,
    made by ``_RabbitMQMember``: no epmd of its own -- all nodes register with one
    shared epmd (``epmd -port P -address 127.0.0.1``, with a marker of its own),
    since Erlang distribution finds a peer through the epmd at ``ERL_EPMD_PORT``;
    one shared cookie, written to each node's ``$HOME/.erlang.cookie`` (mode 0400)
    before boot; and peer discovery by ``classic_config`` listing every node
    (``rabbitN-<random>@localhost``). The first node boots alone and forms the
    cluster; the others boot after it and join it during their boot (peer
    discovery: a fresh node that reaches a listed peer joins it). Start fails
    unless ``rabbitmqctl cluster_status`` on the first node lists every node as
    running. A queue's leader comes from ``rabbitmqctl list_queues name leader``.

Invariants
    - Everything binds 127.0.0.1; nothing touches a system epmd or /etc/rabbitmq.
    - ``stop()`` (and leaving the ``with`` block, also on a failed start) stops
      every node and, for RabbitMQ, then the shared epmd; it is idempotent.
    - RabbitMQ nodes are spawned from the thread that calls ``start()``. From the
      main thread, RabbitMQNode's children get SIGTERM when this process dies
      (PR_SET_PDEATHSIG); from any other thread that guard is not armed, since the
      kernel would fire it when that thread ends.

Not here
    The load (``bench.amqp_loadgen``), the reports (``bench/cluster_throughput.py``,
    ``bench/cluster_failover.py``).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import secrets
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from bench.broker_memory import RABBITMQCTL, rabbitmqctl_environment
from quorumqueue.cli.launcher import pick_free_ports
from quorumqueue.client.management import call
from tests.support.cluster import LocalCluster
from tests.support.rabbitmq import (EPMD, MARKER_VARIABLE, SERVER_SCRIPT, RabbitMQNode,
                                    RabbitMQNodeError, processes_with_marker)

CTL_TIMEOUT_S = 60.0
READY_TIMEOUT_S = 60.0
T = TypeVar("T")


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = READY_TIMEOUT_S,
             interval: float = 0.05) -> T:
    """``probe()``'s first truthy result; exceptions count as "not yet" (a node may be
    starting or stopping). Raises TimeoutError naming ``what`` and the last answer."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            last = probe()
        except Exception as error:  # noqa: BLE001 - reported if it lasts
            last = error
        else:
            if last:
                return last  # type: ignore[return-value]
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}; last: {last!r}")
        time.sleep(interval)


# -- quorumqueue ----------------------------------------------------------------------------


def queue_status(uri: str, queue: str) -> dict | None:
    """The queue's row of ``cluster.status`` on the node at ``uri`` (None: not known)."""
    for row in call(uri, "cluster.status")["queues"]:
        if row["name"] == queue:
            return row
    return None


class QuorumQueueCluster:
    """``with QuorumQueueCluster(3) as cluster: ...``; ``cluster.local`` is the LocalCluster."""

    kind = "quorumqueue"

    def __init__(self, nodes: int) -> None:
        self.local = LocalCluster(nodes, proxied=False)
        self.startup_s: float | None = None

    def __enter__(self) -> QuorumQueueCluster:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> QuorumQueueCluster:
        began = time.monotonic()
        try:
            self.local.start()
            wait_for("one metadata leader known to every node", self._one_metadata_leader)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - began
        return self

    def stop(self) -> None:
        self.local.stop()

    @property
    def names(self) -> list[str]:
        return self.local.names

    def uris(self) -> list[str]:
        return self.local.uris()

    def leader_index(self, queue: str) -> int:
        """The index of the node leading ``queue``, as node 1 sees it (waits for one)."""
        first = self.uris()[0]
        leader = wait_for(f"a leader for {queue}",
                          lambda: (queue_status(first, queue) or {}).get("leader"))
        return self.names.index(leader)

    def wait_queue_known(self, queue: str) -> None:
        """Until every node knows ``queue`` and its leader (a publish to a node that
        has not applied the declaration yet would be unroutable, i.e. dropped)."""
        for uri in self.uris():
            wait_for(f"{queue} and its leader on {uri}",
                     lambda: (queue_status(uri, queue) or {}).get("leader"))

    def _one_metadata_leader(self) -> bool:
        leaders = [call(uri, "cluster.status")["metadata_leader"] for uri in self.uris()]
        return None not in leaders and len(set(leaders)) == 1


# -- RabbitMQ -------------------------------------------------------------------------------


class _RabbitMQMember(RabbitMQNode):
    """A RabbitMQNode with a given name that uses a shared epmd and cookie."""

    def __init__(self, node_name: str, epmd_port: int, cookie: str, extra_config: str,
                 scheduler_busy_wait: str) -> None:
        super().__init__(extra_config=extra_config, scheduler_busy_wait=scheduler_busy_wait)
        self.node_name = node_name
        self.epmd_port = epmd_port
        self.cookie = cookie
        self._began = 0.0

    def spawn(self) -> None:
        """Start the node's processes (see the module's invariants on threads)."""
        if self._process is not None:
            raise RabbitMQNodeError(f"{self.node_name} already started")
        self.base_dir = Path(tempfile.mkdtemp(prefix="qqbench-rabbit-"))
        self.port, self.dist_port = pick_free_ports(2)
        environment = self._environment() | {"ERL_EPMD_PORT": str(self.epmd_port)}
        cookie = self.base_dir / "home" / ".erlang.cookie"
        cookie.write_text(self.cookie)
        cookie.chmod(0o400)
        self._began = time.monotonic()
        with open(self.console_path, "wb") as console:
            self._process = self._spawn([str(SERVER_SCRIPT)], environment, console)

    def wait_ready(self) -> None:
        """Until the node completes an AMQP handshake."""
        self._wait_until_ready(self._began)
        self.startup_seconds = time.monotonic() - self._began


class RabbitMQCluster:
    """``with RabbitMQCluster(3) as cluster: ...``; see the module header."""

    kind = "rabbitmq"

    def __init__(self, nodes: int = 3, *, scheduler_busy_wait: str = "none",
                 startup_timeout: float = 120.0) -> None:
        if nodes < 1:
            raise ValueError("a cluster needs at least one node")
        tag = secrets.token_hex(3)
        self.names = [f"rabbit{i + 1}-{tag}@localhost" for i in range(nodes)]
        self.cookie = secrets.token_hex(20).upper()
        self.scheduler_busy_wait = scheduler_busy_wait
        self.startup_timeout = startup_timeout
        self.epmd_port = 0
        self.members: list[_RabbitMQMember] = []
        self._epmd: subprocess.Popen[bytes] | None = None
        self._epmd_marker = f"qqbench-epmd-{tag}"
        self.startup_s: float | None = None

    @staticmethod
    def available() -> bool:
        return RabbitMQNode.available() and RABBITMQCTL.is_file()

    def __enter__(self) -> RabbitMQCluster:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> RabbitMQCluster:
        began = time.monotonic()
        try:
            (self.epmd_port,) = pick_free_ports(1)
            self._start_epmd()
            peers = "".join(f"cluster_formation.classic_config.nodes.{i + 1} = {name}\n"
                            for i, name in enumerate(self.names))
            config = "cluster_formation.peer_discovery_backend = classic_config\n" + peers
            self.members = [_RabbitMQMember(name, self.epmd_port, self.cookie, config,
                                            self.scheduler_busy_wait) for name in self.names]
            first, *others = self.members
            first.spawn()
            first.wait_ready()
            for member in others:
                member.spawn()
            for member in others:
                member.wait_ready()
            self._check_formed()
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - began
        return self

    def stop(self) -> None:
        """Stop every node (in parallel), then the shared epmd. Idempotent."""
        try:
            if self.members:
                with concurrent.futures.ThreadPoolExecutor(len(self.members)) as pool:
                    for stopped in [pool.submit(member.stop) for member in self.members]:
                        stopped.result()
        finally:
            epmd, self._epmd = self._epmd, None
            if epmd is not None:
                epmd.kill()
                epmd.wait(5)
            for pid in processes_with_marker(self._epmd_marker):
                os.kill(pid, signal.SIGKILL)

    def uris(self) -> list[str]:
        return [member.uri for member in self.members]

    def rabbitmqctl(self, index: int, *arguments: str) -> str:
        """``rabbitmqctl -n <node> ARGS`` against member ``index``; its stdout."""
        member = self.members[index]
        completed = subprocess.run(
            [str(RABBITMQCTL), "-n", member.node_name, *arguments],
            env=rabbitmqctl_environment(member), capture_output=True, text=True,
            timeout=CTL_TIMEOUT_S, stdin=subprocess.DEVNULL)
        if completed.returncode != 0:
            raise RabbitMQNodeError(f"rabbitmqctl {' '.join(arguments)} on {member.node_name} "
                                    f"failed ({completed.returncode}):\n{completed.stdout}"
                                    f"{completed.stderr}")
        return completed.stdout

    def leader_index(self, queue: str) -> int:
        """The index of the node leading quorum queue ``queue`` (waits for one)."""
        leader = wait_for(f"a leader for {queue}", lambda: self._leader(queue), interval=0.5)
        return self.names.index(leader)

    def wait_queue_known(self, queue: str) -> None:
        """RabbitMQ's metadata (Mnesia) is written on every node before declare-ok."""

    def _leader(self, queue: str) -> str | None:
        output = self.rabbitmqctl(0, "list_queues", "--quiet", "--no-table-headers",
                                  "name", "leader")
        for line in output.splitlines():
            fields = line.split("\t")
            if len(fields) == 2 and fields[0] == queue:
                return fields[1].strip() or None
        return None

    def _start_epmd(self) -> None:
        kept = {name: os.environ[name] for name in ("PATH", "LANG", "LC_ALL") if name in os.environ}
        self._epmd = subprocess.Popen(
            [str(EPMD), "-port", str(self.epmd_port), "-address", "127.0.0.1"],
            env=kept | {MARKER_VARIABLE: self._epmd_marker}, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        epmd = self._epmd

        def listening() -> bool:
            if epmd.poll() is not None:
                raise RabbitMQNodeError(f"epmd on port {self.epmd_port} exited ({epmd.returncode})")
            with socket.create_connection(("127.0.0.1", self.epmd_port), timeout=1.0):
                return True

        try:
            wait_for(f"epmd on port {self.epmd_port}", listening, timeout=10.0, interval=0.01)
        except TimeoutError as error:
            raise RabbitMQNodeError(str(error)) from None

    def _check_formed(self) -> None:
        """Every node running in one cluster, as the first node reports it."""
        expected = set(self.names)

        def formed() -> bool:
            status = json.loads(self.rabbitmqctl(0, "cluster_status", "--formatter", "json"))
            return set(status.get("running_nodes", [])) >= expected

        try:
            wait_for("the RabbitMQ nodes to form one cluster", formed,
                     timeout=self.startup_timeout, interval=0.5)
        except TimeoutError as error:
            raise RabbitMQNodeError(str(error)) from None
