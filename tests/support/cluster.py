"""A local cluster of real broker processes, with every inter-node link behind a proxy.

`LocalCluster(n)` runs n nodes (qq1@localhost.., free loopback ports, a temporary
data directory, one cookie) planned by cli/launcher.py, the module behind
`quorumqueue cluster start`, so tests run nodes exactly as the launcher does. With
`proxied=True` (the default) node A reaches node B only through `TcpProxy` A->B:
A's --cluster-nodes lists A's own inter-node port and, for each peer B, the port of
the proxy A->B. A link between two nodes is therefore two proxies (A->B carries the
connections A opens, B->A those B opens), and a test can cut and heal it.

Faults: `kill(node, sig)`, `pause` (SIGSTOP) / `resume` (SIGCONT), `restart` (same
data directory and ports), `cut(a, b)` / `cut(a, b, one_way=True)` / `isolate(node)` /
`partition(group, group, ...)`, `slow(a, b, delay)` (a slow link), `slow_disk(node,
delay)` (each fsync batch waits), `fill_disk(node)` / `free_disk(node)` (with
`small_disks=bytes`: each data directory on a tmpfs of its own, small_fs.py) and
`heal(...)`.
A cut comes in two modes:
- "drop": both proxies reset their connections (RST) and reset every new one at
  once, until healed: each side sees the link fail fast, like a refused peer;
- "stall": bytes stop moving (the proxy reads a chunk and holds it, so the sender's
  buffers fill) and new connections wait before reaching the target; on heal,
  everything held flows on. One-way cuts are stalls of one direction: cut(a, b,
  one_way=True) stops what a sends to b on both proxies between them.

Readiness is an AMQP protocol header answered on each node's AMQP port; a timeout
or an early exit raises naming the node, with the tail of its log (logs are
ROOT/qqN.log). `stop()` (and leaving the `with` block, also on failure) resumes
paused nodes, stops every node (SIGTERM, then SIGKILL), stops every proxy thread and
removes the temporary directory; an atexit hook does the same for a cluster a test
forgot.

`wait_for(what, predicate)` polls a condition (a leader elected, a replica caught
up; ask `cluster.status` through quorumqueue.client.management) until it holds, for
up to CONVERGE_TIMEOUT: a bound generous enough for a loaded machine (the suite must
pass with CPU-heavy work beside it), never a fixed time a test relies on.

Not here: workloads (history.py).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import os
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Iterable
from pathlib import Path

import pika

from quorumqueue.cli import launcher
from quorumqueue.cli.launcher import NodePlan
from quorumqueue.broker.server.server import FAULT_FSYNC_DELAY_FILE
from quorumqueue.client.management import call

from .small_fs import SmallFileSystem
from .waiting import slow_stop, wait_until

ROOT = Path(__file__).resolve().parents[2]
# how long a test waits for a cluster to agree on something (an election, a failover,
# a replica catching up) before failing: an election takes a second or two on an idle
# machine, far longer with two CPU-bound processes sharing its two cores
CONVERGE_TIMEOUT = 90.0
DIRECTIONS = ("forward", "backward")  # forward: client -> target; backward: target -> client


class TcpProxy:
    """Forwards each connection made to 127.0.0.1:port to target_host:target_port,
    from a thread of its own running an asyncio loop; `cut` and `heal` take effect
    before they return."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1", *,
                 listen_port: int = 0, name: str = "proxy") -> None:
        self.target_host = target_host
        self.target_port = target_port  # read at each new connection: may be set late
        self.name = name
        self.port = listen_port  # the real port once started
        self.bytes_forwarded = {"forward": 0, "backward": 0}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.AbstractServer | None = None
        self._links: set[asyncio.Task] = set()
        self._dropping = False
        self._open: dict[str, asyncio.Event] = {}  # per direction; cleared = stalled
        self.delay = 0.0  # seconds each chunk waits before it is forwarded (slow())

    # -- control, from any thread ------------------------------------------------

    def start(self) -> "TcpProxy":
        assert self._thread is None, "already started"
        self._loop = asyncio.new_event_loop()
        started: concurrent.futures.Future = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._run, args=(started,),
                                        name=f"tcp-proxy {self.name}", daemon=True)
        self._thread.start()
        try:
            self.port = started.result(timeout=10)
        except BaseException:
            self._thread.join(10)
            self._thread = None
            raise
        return self

    def cut(self, mode: str = "drop", direction: str = "both") -> None:
        """Stop traffic. "drop": reset every connection now and every new one (both
        directions only); "stall": hold the bytes of `direction` ("forward",
        "backward" or "both") and keep new connections from reaching the target.
        Cuts add up until `heal`."""
        if mode not in ("drop", "stall"):
            raise ValueError(f"mode: expected 'drop' or 'stall', got {mode!r}")
        directions = DIRECTIONS if direction == "both" else (direction,)
        if not set(directions) <= set(DIRECTIONS):
            raise ValueError(f"direction: expected 'forward', 'backward' or 'both', got "
                             f"{direction!r}")
        if mode == "drop" and direction != "both":
            raise ValueError("a drop cut resets connections, so it is always both ways; "
                             "use mode='stall' for one direction")
        self._call(self._cut(mode, directions))

    def heal(self) -> None:
        """Let traffic flow again (what a stall held is delivered; no delay)."""
        self._call(self._heal())

    def slow(self, delay: float) -> None:
        """A slow link: every chunk, both ways, reaches the other side `delay` seconds
        after it arrived here (order kept; until `heal`)."""
        if delay < 0:
            raise ValueError(f"delay: expected seconds >= 0, got {delay!r}")
        self.delay = delay

    @property
    def state(self) -> str:
        if self._dropping:
            return "dropping"
        stalled = [d for d in DIRECTIONS if d in self._open and not self._open[d].is_set()]
        return "stalled " + "+".join(stalled) if stalled else "open"

    @property
    def connections(self) -> int:
        return len(self._links)

    def stop(self) -> None:
        """Close the listener and every connection, end the thread. Idempotent."""
        if self._thread is None:
            return
        try:
            self._call(self._shutdown())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._thread = None

    def __enter__(self) -> "TcpProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return (f"TcpProxy({self.name}: 127.0.0.1:{self.port} -> "
                f"{self.target_host}:{self.target_port}, {self.state})")

    def _call(self, coroutine, timeout: float = 10.0):
        if self._thread is None:
            coroutine.close()
            raise RuntimeError(f"{self!r} is not running")
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    # -- the loop thread -----------------------------------------------------------

    def _run(self, started: concurrent.futures.Future) -> None:
        loop = self._loop
        asyncio.set_event_loop(loop)
        try:
            self._open = {d: asyncio.Event() for d in DIRECTIONS}
            for event in self._open.values():
                event.set()
            self._server = loop.run_until_complete(
                asyncio.start_server(self._accept, "127.0.0.1", self.port))
            started.set_result(self._server.sockets[0].getsockname()[1])
        except BaseException as error:  # noqa: BLE001 - handed to start()
            started.set_exception(error)
            loop.close()
            return
        try:
            loop.run_forever()
        finally:
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.close()

    async def _cut(self, mode: str, directions: tuple[str, ...]) -> None:
        if mode == "drop":
            self._dropping = True
            links = list(self._links)
            for task in links:
                task.cancel()
            await asyncio.gather(*links, return_exceptions=True)
        else:
            for direction in directions:
                self._open[direction].clear()

    async def _heal(self) -> None:
        self._dropping = False
        self.delay = 0.0
        for event in self._open.values():
            event.set()

    async def _shutdown(self) -> None:
        self._server.close()
        links = list(self._links)
        for task in links:
            task.cancel()
        await asyncio.gather(*links, return_exceptions=True)
        await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        if self._dropping:
            _reset(writer)
            return
        # a task of our own per link: cancelling the server's handler task would log
        self._links.add(asyncio.ensure_future(self._link(reader, writer)))

    async def _link(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        task = asyncio.current_task()
        upstream = None
        clean = False
        try:
            while not all(event.is_set() for event in self._open.values()):
                await asyncio.gather(*(event.wait() for event in self._open.values()))
            try:
                up_reader, upstream = await asyncio.open_connection(self.target_host,
                                                                    self.target_port)
            except OSError:
                return
            pumps = [asyncio.ensure_future(self._pump(reader, upstream, "forward")),
                     asyncio.ensure_future(self._pump(up_reader, writer, "backward"))]
            try:
                done, pending = await asyncio.wait(pumps,
                                                   return_when=asyncio.FIRST_EXCEPTION)
                clean = not pending and not any(p.exception() for p in done)
            finally:
                for pump in pumps:
                    pump.cancel()
                await asyncio.gather(*pumps, return_exceptions=True)
        finally:
            self._links.discard(task)
            for side in (writer, upstream):
                if side is not None:
                    side.close() if clean else _reset(side)

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter,
                    direction: str) -> None:
        gate = self._open[direction]
        while True:
            data = await source.read(65536)
            if not data:
                if sink.can_write_eof():
                    sink.write_eof()
                return
            await gate.wait()  # a stall holds this chunk; the sender's buffers fill
            if self.delay:  # a slow link: this pump holds the chunk, order is kept
                await asyncio.sleep(self.delay)
            self.bytes_forwarded[direction] += len(data)
            sink.write(data)
            await sink.drain()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with an RST rather than a FIN: the peer sees the link fail."""
    sock = writer.get_extra_info("socket")
    try:
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    writer.transport.abort()


def wait_for(what: str, predicate, timeout: float = CONVERGE_TIMEOUT,
             interval: float = 0.05):
    """predicate()'s first true value, polled until `timeout`; an exception counts as
    not yet (a node may be starting or stopping). Raises naming `what` and the last
    value or error (waiting.wait_until)."""
    return wait_until(predicate, what, timeout, interval, retry_errors=True)


def quorum_queue_with_followers(cluster: "LocalCluster", queue: str) -> tuple[str, list[str]]:
    """Declare the durable quorum queue `queue` on the cluster's first node, once every
    node has a metadata leader. Then wait for its leader, and for every other node to
    follow it with all replicas online (cluster.status). Returns (leader, followers)."""
    def replica(uri: str) -> dict | None:
        return next((found for found in call(uri, "cluster.status")["queues"]
                     if found["name"] == queue), None)

    uris = cluster.uris()
    wait_for("a metadata leader on every node", lambda: all(
        call(uri, "cluster.status")["metadata_leader"] for uri in uris))
    with pika.BlockingConnection(pika.URLParameters(uris[0])) as connection:
        connection.channel().queue_declare(queue, durable=True,
                                           arguments={"x-queue-type": "quorum"})
    leader = wait_for("a leader", lambda: (replica(uris[0]) or {}).get("leader"))
    followers = [name for name in cluster.names if name != leader]
    for name in followers:
        uri = cluster.uri(name)
        wait_for(f"{name} to follow {leader}", lambda uri=uri: (
            (found := replica(uri)) is not None and found["leader"] == leader
            and sorted(found["online"]) == sorted(cluster.names)))
    return leader, followers


def _listens(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=0.5).close()
        return True
    except OSError:
        return False


def _wait_for_state(pid: int, stopped: bool, timeout: float = 30.0) -> None:
    """Until /proc says the process is (not) stopped: signals land asynchronously."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as handle:
                state = handle.read().rpartition(")")[2].split()[0]
        except (OSError, IndexError):
            return  # no /proc (or the process is gone): nothing to wait for
        if (state in ("T", "t")) == stopped:
            return
        time.sleep(0.01)
    raise RuntimeError(f"process {pid} did not {'stop' if stopped else 'continue'} "
                       f"within {timeout:g}s")


NodeRef = int | str  # a 0-based index, a node name "qq1@localhost", or its short "qq1"

_live_clusters: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _stop_forgotten_clusters() -> None:  # pragma: no cover - a safety net
    for cluster in list(_live_clusters):
        cluster.stop()


class LocalCluster:
    """n real nodes on loopback; see the module header."""

    def __init__(self, nodes: int = 3, *, proxied: bool = True, data_dir: str | None = None,
                 extra_config: str = "", cookie: str | None = None,
                 start_timeout: float = CONVERGE_TIMEOUT, stop_timeout: float = 30.0,
                 small_disks: int = 0) -> None:
        self._tmp = None
        if data_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="qq-cluster-")
            data_dir = self._tmp.name
        self.root = os.path.abspath(data_dir)
        self.count = nodes
        self.proxied = proxied
        self.cookie = cookie or launcher.new_cookie()
        self.extra_config = extra_config
        self.start_timeout, self.stop_timeout = start_timeout, stop_timeout
        self.plans: tuple[NodePlan, ...] = ()
        self.proxies: dict[tuple[str, str], TcpProxy] = {}  # (from, to) -> proxy
        self._processes: dict[str, subprocess.Popen] = {}
        self._logs: dict[str, object] = {}
        self._paused: set[str] = set()
        self.config_path = os.path.join(self.root, launcher.CONFIG_NAME)
        self.small_disks = small_disks       # bytes of each node's tmpfs (0: none)
        self.disks: dict[str, SmallFileSystem] = {}

    # -- lifecycle -----------------------------------------------------------------

    def start(self) -> "LocalCluster":
        _live_clusters.add(self)
        try:
            if self.proxied:  # bound before the nodes' ports are picked: no collisions
                names = launcher.node_names(self.count)
                for a in names:
                    for b in names:
                        if a != b:
                            self.proxies[(a, b)] = TcpProxy(
                                0, name=f"{a.partition('@')[0]}->{b.partition('@')[0]}"
                            ).start()
            self.plans = launcher.plan_local_cluster(self.count, 0, self.root)
            for (a, b), proxy in self.proxies.items():
                proxy.target_port = self._plan(b).cluster_port
            launcher.write_cluster_config(self.config_path, self.cookie, self.extra_config)
            if self.small_disks:
                for plan in self.plans:
                    self.disks[plan.name] = SmallFileSystem(plan.data_dir,
                                                            self.small_disks).mount()
            for plan in self.plans:
                self._spawn(plan)
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every node and proxy and remove the temporary directory. Idempotent."""
        try:
            for name in list(self._processes):
                self._signal(name, signal.SIGTERM)
            deadline = time.monotonic() + self.stop_timeout
            for name in list(self._processes):
                self._reap(name, max(0.0, deadline - time.monotonic()), signal.SIGTERM)
        finally:
            for proxy in self.proxies.values():
                proxy.stop()
            for disk in self.disks.values():
                disk.unmount()
            self.disks.clear()
            for log in self._logs.values():
                log.close()
            self._logs.clear()
            _live_clusters.discard(self)
            if self._tmp is not None:
                self._tmp.cleanup()
                self._tmp = None

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- addresses -----------------------------------------------------------------

    @property
    def names(self) -> list[str]:
        return [plan.name for plan in self.plans]

    def uri(self, node: NodeRef) -> str:
        return self._plan(node).uri

    def management_url(self, node: NodeRef) -> str:
        """The node's management HTTP API (a free port of its own, from the plan)."""
        return f"http://{self._plan(node).connect_host}:{self._plan(node).management_port}"

    def management_urls(self) -> list[str]:
        return [self.management_url(node) for node in self.names]

    def uris(self, nodes: Iterable[NodeRef] | None = None) -> list[str]:
        return [self.uri(node) for node in (self.names if nodes is None else nodes)]

    def running(self, node: NodeRef) -> bool:
        """The node's process exists and is not paused."""
        name = self._plan(node).name
        process = self._processes.get(name)
        return process is not None and process.poll() is None and name not in self._paused

    def live_nodes(self) -> list[str]:
        return [name for name in self.names if self.running(name)]

    def live_uris(self) -> list[str]:
        return self.uris(self.live_nodes())

    def exited(self) -> dict[str, str]:
        """Nodes whose process ended on its own (not stopped or killed through this
        object), with how: a crash a nemesis did not cause."""
        return {name: launcher.describe_exit(process.returncode)
                for name, process in self._processes.items() if process.poll() is not None}

    def pid(self, node: NodeRef) -> int | None:
        process = self._processes.get(self._plan(node).name)
        return process.pid if process is not None and process.poll() is None else None

    def proxy(self, source: NodeRef, target: NodeRef) -> TcpProxy:
        """The proxy carrying the connections `source` opens to `target`."""
        key = (self._plan(source).name, self._plan(target).name)
        if key not in self.proxies:
            raise ValueError(f"no proxy {key[0]} -> {key[1]} (proxied={self.proxied})")
        return self.proxies[key]

    def log(self, node: NodeRef, tail: int = 4000) -> str:
        try:
            return Path(self._log_path(self._plan(node))).read_text(errors="replace")[-tail:]
        except OSError:
            return ""

    # -- processes -----------------------------------------------------------------

    def kill(self, node: NodeRef, sig: int = signal.SIGKILL,
             timeout: float | None = None) -> int | None:
        """Send `sig` and wait for the process to end (SIGTERM escalates to SIGKILL
        after `timeout`, default stop_timeout); returns its exit status."""
        name = self._plan(node).name
        if sig in (signal.SIGSTOP, signal.SIGCONT):
            raise ValueError("use pause() and resume() for SIGSTOP and SIGCONT")
        self._signal(name, sig)
        return self._reap(name, self.stop_timeout if timeout is None else timeout, sig)

    def pause(self, node: NodeRef) -> None:
        """SIGSTOP; returns once the process is stopped."""
        name = self._plan(node).name
        process = self._require_live(name)
        process.send_signal(signal.SIGSTOP)
        self._paused.add(name)
        _wait_for_state(process.pid, stopped=True)

    def resume(self, node: NodeRef) -> None:
        """SIGCONT; returns once the process runs again."""
        name = self._plan(node).name
        process = self._require_live(name)
        process.send_signal(signal.SIGCONT)
        self._paused.discard(name)
        _wait_for_state(process.pid, stopped=False)

    def restart(self, node: NodeRef, sig: int = signal.SIGTERM) -> None:
        """Stop the node if it runs (with `sig`), start it again with the same data
        directory and ports, and wait until it accepts AMQP."""
        plan = self._plan(node)
        if plan.name in self._processes:
            self.kill(plan.name, sig)
        self._spawn(plan)
        self.wait_ready([plan.name])

    def wait_ready(self, nodes: Iterable[NodeRef] | None = None,
                   timeout: float | None = None) -> None:
        """Until every node given (default: all) answers on its AMQP port."""
        waiting = [self._plan(node) for node in (self.names if nodes is None else nodes)]
        deadline = time.monotonic() + (self.start_timeout if timeout is None else timeout)
        while waiting:
            for plan in waiting:
                process = self._processes.get(plan.name)
                if process is None or process.poll() is not None:
                    how = "is not running" if process is None else \
                        launcher.describe_exit(process.returncode)
                    raise RuntimeError(f"node {plan.name} {how} before accepting AMQP on "
                                       f"port {plan.amqp_port}; its log ends:\n"
                                       f"{self.log(plan)}")
            waiting = [plan for plan in waiting
                       if not launcher.accepts_amqp(plan.connect_host, plan.amqp_port)]
            if waiting and time.monotonic() > deadline:
                plan = waiting[0]
                raise RuntimeError(
                    f"node {plan.name} did not accept AMQP on port {plan.amqp_port} within "
                    f"{self.start_timeout if timeout is None else timeout:g}s (also waiting: "
                    f"{', '.join(p.name for p in waiting[1:]) or 'none'}); its log ends:\n"
                    f"{self.log(plan)}")
            if waiting:
                time.sleep(0.05)
        # the management API starts after the AMQP listener; the command line talks
        # to a node through it
        waiting = [self._plan(node) for node in (self.names if nodes is None else nodes)]
        while waiting:
            waiting = [plan for plan in waiting if not _listens(plan.connect_host,
                                                                plan.management_port)]
            if waiting and time.monotonic() > deadline:
                raise RuntimeError(f"node {waiting[0].name}'s management API did not listen "
                                   f"on port {waiting[0].management_port} in time; its log "
                                   f"ends:\n{self.log(waiting[0])}")
            if waiting:
                time.sleep(0.05)

    # -- links ---------------------------------------------------------------------

    def cut(self, a: NodeRef, b: NodeRef, *, one_way: bool = False,
            mode: str = "drop") -> None:
        """Cut the link between a and b (both proxies); one_way=True stops only what a
        sends to b (always a stall)."""
        there, back = self.proxy(a, b), self.proxy(b, a)
        if one_way:
            there.cut("stall", "forward")  # what a writes on the connections a opened
            back.cut("stall", "backward")  # what a writes on the connections b opened
        else:
            there.cut(mode)
            back.cut(mode)

    def slow(self, a: NodeRef, b: NodeRef, delay: float) -> None:
        """Delay everything between a and b by `delay` seconds each way (heal ends it)."""
        self.proxy(a, b).slow(delay)
        self.proxy(b, a).slow(delay)

    def partition(self, *groups: Iterable[NodeRef], mode: str = "drop") -> None:
        """Cut every link between nodes of different groups (a node in no group keeps
        all its links: with groups (a,) and (b,) of three nodes, c bridges them)."""
        names = [[self._plan(node).name for node in group] for group in groups]
        for index, group in enumerate(names):
            for other in names[index + 1:]:
                for a in group:
                    for b in other:
                        self.cut(a, b, mode=mode)

    def slow_disk(self, node: NodeRef, delay: float) -> None:
        """Every fsync batch of `node` waits `delay` seconds first (0: a normal disk
        again), through the broker's fault hook (server.FAULT_FSYNC_DELAY_FILE)."""
        path = self._slow_disk_file(self._plan(node))
        with open(path + ".tmp", "w") as handle:
            handle.write(f"{delay}\n")
        os.replace(path + ".tmp", path)

    def fill_disk(self, node: NodeRef, keep_full: bool = False) -> None:
        """Fill `node`'s data directory's file system to its last byte (small_disks)."""
        self.disks[self._plan(node).name].fill(keep_full=keep_full)

    def free_disk(self, node: NodeRef) -> None:
        """Give `node`'s file system its space back (what `fill_disk` took)."""
        self.disks[self._plan(node).name].free()

    def isolate(self, node: NodeRef, mode: str = "drop") -> None:
        """Cut `node` off from every other node."""
        for other in self.names:
            if other != self._plan(node).name:
                self.cut(node, other, mode=mode)

    def heal(self, a: NodeRef | None = None, b: NodeRef | None = None) -> None:
        """Heal the link between a and b, every link of a, or (no arguments) all."""
        for (source, target), proxy in self.proxies.items():
            ends = {source, target}
            if ((a is None or self._plan(a).name in ends)
                    and (b is None or self._plan(b).name in ends)):
                proxy.heal()

    # -- internals -----------------------------------------------------------------

    def _plan(self, node: NodeRef | NodePlan) -> NodePlan:
        if isinstance(node, NodePlan):
            return node
        for index, plan in enumerate(self.plans):
            if node in (index, plan.name, plan.short_name):
                return plan
        raise ValueError(f"no node {node!r} in this cluster ({', '.join(self.names)})")

    def _slow_disk_file(self, plan: NodePlan) -> str:
        return os.path.join(self.root, f"{plan.short_name}.fsync-delay")

    def _log_path(self, plan: NodePlan) -> str:
        return os.path.join(self.root, f"{plan.short_name}.log")

    def _cluster_nodes(self, plan: NodePlan) -> str:
        ports = {peer: proxy.port for (source, peer), proxy in self.proxies.items()
                 if source == plan.name}
        return launcher.cluster_nodes_option(self.plans, ports)

    def _spawn(self, plan: NodePlan) -> None:
        os.makedirs(plan.data_dir, exist_ok=True)
        if plan.name in self._logs:
            self._logs.pop(plan.name).close()
        log = self._logs[plan.name] = open(self._log_path(plan), "ab")
        command = launcher.node_command(plan, self._cluster_nodes(plan), self.config_path)
        # tied to the test process (PR_SET_PDEATHSIG), so a worker killed by a timeout
        # leaves no node behind; spawn arms it only on the main thread (the kernel
        # fires it when the starting *thread* ends, and fault tests restart nodes
        # from threads of their own: those rely on stop())
        self._processes[plan.name] = launcher.spawn(
            command, stdout=log, tie_to_parent=True, cwd=str(ROOT),
            env={FAULT_FSYNC_DELAY_FILE: self._slow_disk_file(plan)})
        self._paused.discard(plan.name)

    def _require_live(self, name: str) -> subprocess.Popen:
        process = self._processes.get(name)
        if process is None or process.poll() is not None:
            raise RuntimeError(f"node {name} is not running")
        return process

    def _signal(self, name: str, sig: int) -> None:
        process = self._processes.get(name)
        if process is None or process.poll() is not None:
            return
        process.send_signal(sig)
        if name in self._paused:  # a stopped process acts on SIGTERM only once continued
            process.send_signal(signal.SIGCONT)
            self._paused.discard(name)

    def _reap(self, name: str, timeout: float, sig: int) -> int | None:
        """Wait `timeout` for the process `sig` was sent to, then SIGKILL it (a warning
        when a SIGTERM was not enough: waiting.SlowStop)."""
        process = self._processes.pop(name, None)
        if process is None:
            return None
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            if sig == signal.SIGTERM:
                slow_stop(f"node {name}", self.stop_timeout)
            process.kill()
            process.wait()
        return process.returncode
