"""A node on several cores: the supervisor of its worker processes (broker.workers).

Responsibilities
    With `broker.workers = N` (N > 1), `broker start` runs this supervisor instead of
    a node: it starts N worker processes, each a node of its own (`python -m
    quorumqueue.broker start --worker K`) and a member of a cluster on loopback that
    only they form, and stops the node as a whole when any of them ends.

How it works
    Worker 0 has the node's name, its AMQP, management and Prometheus ports and its
    inter-node port: clients see it. Workers 1..N-1 are named NAME-wK@HOST, listen on
    127.0.0.1 at free ports, and take their share of the queues: each worker places a
    new quorum queue's one member on the worker with the fewest (cluster/cluster.py
    `place`), and worker 0 reaches those queues through the cluster's forwarding. Each
    worker keeps its data in DATA_DIR/worker-K (its own log, message store and fsync:
    a confirm leaves after the fsync of the queue's worker); DATA_DIR/workers holds N,
    and a start with another N, or over a one-process node's data (its quorum/ and
    msgstore/ in DATA_DIR), is refused. The
    workers share a cookie drawn at each start (in their environment, not on their
    command lines). Their output is the supervisor's (one log).
    Worker 0 hands a client connection to the worker of the first queue it names
    (node/handover.py) over a socket pair this supervisor makes for each other worker
    (handover_link.py), passed at exec.

Invariants
    - A worker's exit, whatever its cause, stops the node as a whole: the supervisor
      kills every other worker (SIGKILL: nothing confirmed is lost, each worker's log
      holds what it confirmed) and exits 70, logging which worker ended and how.
    - A supervisor that is killed takes its workers with it (PR_SET_PDEATHSIG); a
      supervisor asked to stop (SIGTERM, SIGINT) stops them with SIGTERM, waits up to
      STOP_TIMEOUT_S each, then kills what is left, and exits 0.

Not here
    The design and what is not built yet (docs/design/workers.md): the workers' names
    are visible (cluster.status, queue members, a connection's node), every worker is a
    voting member of the metadata group, and a node with workers cannot be a member
    of a bigger cluster.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

from ..config import WORKER_COOKIE_ENV, ConfigError, Settings
from . import handover_link
from .run import configure_logging

log = logging.getLogger("quorumqueue.broker")

COUNT_FILE = "workers"
ONE_PROCESS_STORES = ("quorum", "msgstore")  # what every node creates in its data dir
STOP_TIMEOUT_S = 30.0
POLL_S = 0.1
NODE_FAILED = 70  # EX_SOFTWARE, as a node whose apply failed (run.py)
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True, slots=True)
class WorkerPlan:
    index: int
    name: str
    host: str
    port: int             # AMQP (0: a free one)
    cluster_port: int
    management_port: int  # 0: a free one
    prometheus_port: int  # 0: a free one
    data_dir: str


def _free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def plan_workers(settings: Settings) -> list[WorkerPlan]:
    """Worker 0 as the node, the others on 127.0.0.1; refused (ConfigError) when the
    node's name's host does not reach 127.0.0.1: workers dial each other by their
    names' host, as the nodes of a cluster do (config.py parse_cluster_node)."""
    base, _, host = settings.node_name.partition("@")
    try:
        address = socket.gethostbyname(host)
    except OSError as error:
        address = f"nothing ({error})"
    if address != "127.0.0.1":
        raise ConfigError(f"node_name {settings.node_name}: its host {host} resolves to "
                          f"{address}, not 127.0.0.1, where a node's workers reach each "
                          f"other; name the node NAME@localhost")
    plans = []
    for index in range(settings.workers):
        data_dir = os.path.join(settings.data_dir, f"worker-{index}")
        if index == 0:
            plans.append(WorkerPlan(0, settings.node_name, settings.host, settings.port,
                                    settings.cluster_port or _free_port("127.0.0.1"),
                                    settings.management_port, settings.prometheus_port,
                                    data_dir))
        else:
            plans.append(WorkerPlan(index, f"{base}-w{index}@{host}", "127.0.0.1", 0,
                                    _free_port("127.0.0.1"), 0, 0, data_dir))
    return plans


def worker_command(plan: WorkerPlan, plans: list[WorkerPlan], config_path: str | None) -> list[str]:
    package = __name__.rsplit(".", 2)[0]  # quorumqueue.broker
    command = [sys.executable, "-m", package, "start", "--worker", str(plan.index),
               "--node-name", plan.name, "--host", plan.host, "--port", str(plan.port),
               "--cluster-port", str(plan.cluster_port),
               "--cluster-nodes", ",".join(f"{p.name}:{p.cluster_port}" for p in plans),
               "--data-dir", plan.data_dir, "--management-port", str(plan.management_port),
               "--prometheus-port", str(plan.prometheus_port)]
    if config_path:
        command += ["--config", config_path]
    return command


def check_data_dir(settings: Settings) -> None:
    """Refuse a data directory of a one-process node or of another worker count."""
    os.makedirs(settings.data_dir, exist_ok=True)
    marker = os.path.join(settings.data_dir, COUNT_FILE)
    if os.path.exists(marker):
        with open(marker) as handle:
            recorded = handle.read().strip()
        if recorded != str(settings.workers):
            raise ConfigError(f"broker.workers = {settings.workers}, but {settings.data_dir} "
                              f"holds the data of a node of {recorded} workers: the worker "
                              f"count of a node's data cannot change yet")
        return
    if any(os.path.exists(os.path.join(settings.data_dir, name)) for name in ONE_PROCESS_STORES):
        raise ConfigError(f"broker.workers = {settings.workers}, but {settings.data_dir} holds "
                          f"the data of a node of one process: a node with workers needs a "
                          f"data directory of its own")
    with open(marker, "w") as handle:
        handle.write(f"{settings.workers}\n")
        handle.flush()
        os.fsync(handle.fileno())


def _killed_with_parent() -> None:
    """preexec_fn: the kernel kills this child when the supervisor dies (Linux)."""
    if sys.platform.startswith("linux"):
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _how(returncode: int) -> str:
    if returncode < 0:
        return f"was killed by {signal.Signals(-returncode).name}"
    return f"exited with status {returncode}"


def supervise(settings: Settings, config_path: str | None) -> int:
    """Run the node's workers until one ends (70) or a stop is asked for (0)."""
    configure_logging(settings.log_level)
    plans = plan_workers(settings)
    check_data_dir(settings)
    environment = dict(os.environ, PYTHONUNBUFFERED="1",
                       **{WORKER_COOKIE_ENV: secrets.token_hex(20)})
    stopping: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda number, _frame: stopping.append(number))
    workers: dict[int, subprocess.Popen] = {}
    links = {plan.index: handover_link.pair() for plan in plans[1:]}
    try:
        for plan in plans:
            if plan.index == 0:
                ends = {plans[k].name: pair[0] for k, pair in links.items()}
            else:
                ends = {plans[0].name: links[plan.index][1]}
            own = dict(environment, **{handover_link.ENV: ",".join(
                f"{name}={end.fileno()}" for name, end in ends.items())})
            workers[plan.index] = subprocess.Popen(
                worker_command(plan, plans, config_path), stdin=subprocess.DEVNULL,
                env=own, preexec_fn=_killed_with_parent,
                pass_fds=[end.fileno() for end in ends.values()])
        for pair in links.values():  # the workers hold them now
            for end in pair:
                end.close()
        log.info("node %s: %d workers (pids %s)", settings.node_name, len(workers),
                 ", ".join(str(process.pid) for process in workers.values()))
        while not stopping:
            for index, process in workers.items():
                if process.poll() is not None:
                    log.error("worker %d (%s, pid %d) %s: the node stops as a whole",
                              index, plans[index].name, process.pid, _how(process.returncode))
                    _kill_all(workers)
                    return NODE_FAILED
            time.sleep(POLL_S)
    except BaseException:
        _kill_all(workers)
        raise
    log.info("node %s: stopping its workers", settings.node_name)
    for process in workers.values():
        if process.poll() is None:
            process.terminate()
    for process in workers.values():
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return 0


def _kill_all(workers: dict[int, subprocess.Popen]) -> None:
    for process in workers.values():
        if process.poll() is None:
            process.kill()
    for process in workers.values():
        process.wait()
