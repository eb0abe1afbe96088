"""`quorumqueue cluster start`: a cluster of N broker nodes on this machine.

Responsibilities: plan a local cluster (node names `qq1@localhost`..`qqN@localhost`,
AMQP ports base..base+N-1, inter-node ports base+20000.., management HTTP API
ports base+10000.. (15672.. for 5672), Prometheus ports base+10020.. (5672 ->
15692, rabbitmq_prometheus's default), data directories
DATA_DIR/qq1.., one cookie for all), run every node as a child process of the same
interpreter (`python -m quorumqueue.broker start ...`, the broker's own program), wait until each
accepts AMQP, print the URIs, and stay in the foreground relaying each child's log
lines prefixed with its node name, until SIGTERM/SIGINT. A node that dies once the
cluster is up leaves the others running (a failover can be tried: kill a leader),
and SIGHUP starts every node that is down again, on its ports and data directory.

How it works: planning (`plan_local_cluster`, `cluster_nodes_option`, `node_command`,
`write_cluster_config`) is plain functions over a frozen `NodePlan`; the only side
effect there is picking free ports when the base port is 0. `Launcher.run` is one
thread: a selector loop reads every child's output, checks readiness (an AMQP
protocol header answered by `connection.start`) and polls for exits; the signal
handlers only set a flag the loop looks at. The shared cookie and any extra settings
go into one TOML file, DATA_DIR/cluster.toml (mode 0600), that every node loads with
`--config`; the per-node settings are flags, which take precedence over the file.
`tests/support/cluster.py` reuses the planning to run nodes behind TCP proxies.

Invariants:
- All children are started before the launcher opens anything else, and each runs in
  a session of its own: a terminal's Ctrl-C reaches only the launcher, which then
  stops the nodes itself. On Linux each child also gets SIGTERM if the launcher dies
  (PR_SET_PDEATHSIG, `die_with_parent`), so even a SIGKILLed launcher leaves no node
  behind when the launcher runs on its main thread, as `cluster start` does.
- `run` returns only once every child has been reaped: stopping sends SIGTERM to
  all, waits `stop_timeout` seconds (a second SIGINT/SIGTERM cuts the wait short),
  then sends SIGKILL to the rest.
- A child that exits before every node accepts AMQP is an error: the launcher names
  the node and how it ended, stops the others and returns 1. Once all accepted, a
  death is announced on stdout (the node, its pid, how it ended, how to start it
  again) and the others go on; the launcher returns 1 only when no node is left
  running. A requested stop returns 0.

Not here: cluster formation, the inter-node protocol and the cookie check (those are
the nodes' business, broker/server/cluster_transport.py and broker/node/); nodes on other
hosts (`quorumqueue broker start --cluster-nodes ...` on each host).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TextIO

_PR_SET_PDEATHSIG = 1  # prctl option: the signal sent when the parent thread ends

NODE_HOST = "localhost"  # the host part of every local node's name (qq1@localhost)
CLUSTER_PORT_OFFSET = 20000  # inter-node port = AMQP port + 20000, as RabbitMQ's distribution port
MANAGEMENT_PORT_OFFSET = 10000  # management HTTP API = AMQP port + 10000 (5672 -> 15672)
# Prometheus port = AMQP port + 10020: 5672 -> 15692, rabbitmq_prometheus's default
PROMETHEUS_PORT_OFFSET = 10020
AMQP_HEADER = b"AMQP\x00\x00\x09\x01"
CONFIG_NAME = "cluster.toml"
COOKIE_PATTERN = re.compile(r"[!-~]{1,255}")  # printable ASCII, no spaces


class LaunchError(RuntimeError):
    """A node could not be started or did not become ready; the message names it."""


@dataclass(frozen=True, slots=True)
class NodePlan:
    name: str  # node_name, "qqN@localhost"; also how every other node addresses it
    amqp_host: str  # the address AMQP listens on (--host)
    amqp_port: int  # > 0: a planned cluster never asks a node to pick its own port
    cluster_port: int  # > 0: this node's inter-node listener (--cluster-port)
    data_dir: str  # absolute, one per node
    # the management HTTP API's port (--management-port): AMQP port + 10000 (15672
    # for 5672, RabbitMQ's pair), or a free one; 0 leaves the node's default
    management_port: int = 0
    prometheus_port: int = 0  # > 0: this node's metrics listener (--prometheus-port)

    @property
    def short_name(self) -> str:
        return self.name.partition("@")[0]

    @property
    def connect_host(self) -> str:
        """Where a client on this machine reaches the AMQP listener."""
        return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(
            self.amqp_host, self.amqp_host)

    @property
    def uri(self) -> str:
        host = self.connect_host
        host = f"[{host}]" if ":" in host else host
        return f"amqp://guest:guest@{host}:{self.amqp_port}/%2F"

    def address(self, port: int | None = None) -> str:
        """`name@host:port` as --cluster-nodes lists it (port: a proxy's, if given)."""
        return f"{self.name}:{self.cluster_port if port is None else port}"


# Free ports are picked below the kernel's ephemeral range (Linux:
# /proc/sys/net/ipv4/ip_local_port_range, 32768-60999 by default): the kernel never
# gives those to an outgoing connection or a bind to port 0, so a node restarted on its
# ports (clients and peers come back to them) finds them free again, where a port the
# kernel picked may meanwhile be some client socket's local port. For the same reason a
# process never picks a port it picked before (a node it killed may be restarted there),
# and PICK_RANGE_ENV ("low-high", both included) narrows the range: processes that each
# restart nodes on their ports (the test suite's workers) are given ranges of their own,
# so one never picks a port another's node was killed on and is about to take again.
PICK_LOW = 10000
PICK_RANGE_ENV = "QUORUMQUEUE_PICK_PORTS"
_picked: set[int] = set()  # by this process, never handed out again


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as ranges:
            return int(ranges.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default, and the IANA dynamic range's start is higher


def pick_range() -> range:
    """The ports pick_free_ports draws from: PICK_RANGE_ENV's if set, else PICK_LOW up
    to the ephemeral range."""
    value = os.environ.get(PICK_RANGE_ENV, "").strip()
    if not value:
        return range(PICK_LOW, _ephemeral_low())
    low, dash, high = value.partition("-")
    try:
        chosen = range(int(low), int(high) + 1)
    except ValueError:
        chosen = range(0)
    if not dash or not chosen or chosen.start < 1 or chosen.stop > 65536:
        raise ValueError(f"{PICK_RANGE_ENV}={value!r}: expected two ports low-high, e.g. "
                         "10000-20999; unset it to pick below the kernel's ephemeral range")
    return chosen


def pick_free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports free now on `host` (all bound at once, then released;
    another process may still take one before a node binds it), drawn at random from
    pick_range() (above) and never picked before by this process, or from the kernel
    when that range leaves no room."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    probes: list[socket.socket] = []
    candidates = [port for port in pick_range() if port not in _picked]
    candidates = secrets.SystemRandom().sample(candidates, len(candidates))
    try:
        for port in candidates[:64 * count]:
            if len(probes) == count:
                break
            probe = socket.socket(family)
            try:
                probe.bind((host, port))
            except OSError:
                probe.close()
                continue
            probes.append(probe)
        while len(probes) < count:  # no room in the range: the kernel's choice
            probe = socket.socket(family)
            probes.append(probe)
            probe.bind((host, 0))
        ports = [probe.getsockname()[1] for probe in probes]
        _picked.update(ports)
        return ports
    finally:
        for probe in probes:
            probe.close()


def node_names(count: int) -> list[str]:
    return [f"qq{i + 1}@{NODE_HOST}" for i in range(count)]


def plan_local_cluster(count: int, base_port: int = 5672, data_dir: str = "data/cluster",
                       host: str = "127.0.0.1") -> tuple[NodePlan, ...]:
    """Names, ports and data directories of `count` local nodes; base_port 0 picks
    free ports for every AMQP and inter-node listener."""
    if not 1 <= count <= 99:
        raise ValueError(f"--nodes: expected 1..99 nodes, got {count}")
    if base_port == 0:
        bind_host = "127.0.0.1" if host in ("0.0.0.0", "") else host
        ports = pick_free_ports(4 * count, "::1" if host == "::" else bind_host)
        amqp_ports, cluster_ports = ports[:count], ports[count:2 * count]
        management_ports = ports[2 * count:3 * count]
        prometheus_ports = ports[3 * count:]
    else:
        if not 0 < base_port or base_port + count - 1 + CLUSTER_PORT_OFFSET > 65535:
            raise ValueError(f"--base-port: {base_port} leaves no room for {count} AMQP ports "
                             f"and their inter-node ports (+{CLUSTER_PORT_OFFSET}) below "
                             f"65536; use 1..{65535 - CLUSTER_PORT_OFFSET - count + 1}, or 0 "
                             "for free ports")
        amqp_ports = [base_port + i for i in range(count)]
        cluster_ports = [port + CLUSTER_PORT_OFFSET for port in amqp_ports]
        management_ports = [port + MANAGEMENT_PORT_OFFSET for port in amqp_ports]
        prometheus_ports = [port + PROMETHEUS_PORT_OFFSET for port in amqp_ports]
    root = os.path.abspath(data_dir)
    return tuple(NodePlan(name=name, amqp_host=host, amqp_port=amqp_ports[i],
                          cluster_port=cluster_ports[i],
                          data_dir=os.path.join(root, name.partition("@")[0]),
                          management_port=management_ports[i],
                          prometheus_port=prometheus_ports[i])
                 for i, name in enumerate(node_names(count)))


def cluster_nodes_option(plans: Sequence[NodePlan],
                         ports: dict[str, int] | None = None) -> str:
    """The --cluster-nodes value: every node as name@host:port, in plan order; `ports`
    replaces the inter-node port of the nodes it names (a proxy in front of them)."""
    ports = ports or {}
    return ",".join(plan.address(ports.get(plan.name)) for plan in plans)


def node_command(plan: NodePlan, cluster_nodes: str, config_path: str | None = None,
                 python: str = sys.executable) -> list[str]:
    """The command line that runs one node with this interpreter."""
    command = [python, "-m", "quorumqueue.broker", "start",
               "--host", plan.amqp_host, "--port", str(plan.amqp_port),
               "--data-dir", plan.data_dir, "--node-name", plan.name,
               "--cluster-port", str(plan.cluster_port), "--cluster-nodes", cluster_nodes]
    if plan.management_port:
        command += ["--management-port", str(plan.management_port)]
    if plan.prometheus_port:
        command += ["--prometheus-port", str(plan.prometheus_port)]
    if config_path is not None:
        command += ["--config", config_path]
    return command


def new_cookie() -> str:
    return secrets.token_hex(20).upper()


def check_cookie(cookie: str) -> str:
    if not COOKIE_PATTERN.fullmatch(cookie):
        raise ValueError("--cookie: expected 1 to 255 printable ASCII characters without "
                         "spaces")
    return cookie


def cookie_in_config(text: str) -> str | None:
    """The `cluster.cookie` a TOML document sets, if any (ValueError if not TOML)."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"--config: not TOML: {error}") from None
    section = document.get("cluster")
    if section is None:
        return None
    if isinstance(section, dict) and "cookie" not in section:
        return None  # a [cluster] table of other keys (cluster.tls...): no cookie yet
    if not isinstance(section, dict) or not isinstance(section.get("cookie"), str):
        raise ValueError("--config: a [cluster] table must set cookie (a string); it is "
                         "where the shared cookie goes")
    return section["cookie"]


def write_cluster_config(path: str, cookie: str, extra_config: str = "") -> str:
    """Write the file every node loads: `extra_config` (TOML, RabbitMQ key names) plus
    `[cluster] cookie` unless it sets one already. Mode 0600: it holds the secret."""
    existing = cookie_in_config(extra_config)
    if existing is not None and existing != cookie:
        raise ValueError("--cookie: differs from the cluster.cookie in --config; give one")
    text = extra_config.rstrip("\n") + "\n" if extra_config.strip() else ""
    if existing is None:
        line = f"cookie = {json.dumps(check_cookie(cookie))}\n"
        appended = text + ("\n" if text else "") + "[cluster]\n" + line
        # after the file as a [cluster] table, or, where [cluster] is already the
        # parent of [cluster.tls], as a dotted key before it
        for candidate in (appended, "cluster." + line + text):
            try:
                tomllib.loads(candidate)
            except tomllib.TOMLDecodeError:
                continue
            text = candidate
            break
        else:
            raise ValueError("--config: a [cluster] table must set cookie (a string); it "
                             "is where the shared cookie goes")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(text)
    os.chmod(path, 0o600)
    return path


def accepts_amqp(host: str, port: int, timeout: float = 0.5) -> bool:
    """True once the listener answers an AMQP 0-9-1 protocol header (connection.start)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(AMQP_HEADER)
            return bool(sock.recv(8))
    except OSError:
        return False


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


def die_with_parent(then: Callable[[], None] | None = None) -> Callable[[], None] | None:
    """A `preexec_fn`: Linux sends the child SIGTERM when its parent dies; then runs `then`.

    The kernel sends that signal when the *thread* that forked the child ends, not
    the process. A child forked from a short-lived thread would be stopped with
    that thread. So the signal is armed only when called on the main thread, which
    lives as long as the process. Elsewhere, and off Linux, it returns `then`
    unchanged (None when there is nothing to run): such children rely on their
    starter's own cleanup.
    """
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return then
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return then
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)
        if then is not None:
            then()

    return preexec


def spawn(command: list[str], *, stdout, tie_to_parent: bool = True,
          cwd: str | None = None, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start one node process in a session of its own, output to `stdout`; `env`
    adds to the environment it inherits. With `tie_to_parent` the node gets SIGTERM
    when this process dies (`die_with_parent`: only when spawned from the main thread)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=stdout,
                            stderr=subprocess.STDOUT, start_new_session=True, env=env,
                            cwd=cwd, preexec_fn=die_with_parent() if tie_to_parent else None)


class Launcher:
    """Runs planned nodes in the foreground; `run()` returns the exit status."""

    def __init__(self, plans: Sequence[NodePlan], commands: Sequence[list[str]], *,
                 out: TextIO, err: TextIO, start_timeout: float = 60.0,
                 stop_timeout: float = 10.0) -> None:
        assert len(plans) == len(commands)
        self.plans = list(plans)
        self.commands = list(commands)
        self.out, self.err = out, err
        self.start_timeout, self.stop_timeout = start_timeout, stop_timeout
        self.width = max(len(plan.name) for plan in self.plans)
        self.processes: dict[str, subprocess.Popen] = {}
        self.partial: dict[int, bytes] = {}  # fd -> the unfinished last line
        self.names: dict[int, str] = {}  # fd -> node name
        self.selector = selectors.DefaultSelector()
        self.signalled = 0  # SIGTERM/SIGINT received so far
        self.hangups = 0  # SIGHUPs received and not yet acted on (restart the dead)
        self.down: set[str] = set()  # nodes whose death was announced, not restarted

    def run(self) -> int:
        previous = {signum: signal.signal(signum, self._on_signal)
                    for signum in (signal.SIGTERM, signal.SIGINT)}
        previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, self._on_hangup)
        try:
            for plan, command in zip(self.plans, self.commands):
                os.makedirs(plan.data_dir, exist_ok=True)
                self.processes[plan.name] = spawn(command, stdout=subprocess.PIPE)
            for name, process in self.processes.items():
                self._watch(name, process)
            try:
                if not self._wait_ready():
                    return 0  # stopped by a signal while starting
                self._announce()
                return self._supervise()
            except LaunchError as error:
                self._say(str(error))
                return 1
        finally:
            self._stop_all()
            self.selector.close()
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _on_signal(self, signum, frame) -> None:
        self.signalled += 1

    def _on_hangup(self, signum, frame) -> None:
        self.hangups += 1

    def _watch(self, name: str, process: subprocess.Popen) -> None:
        fd = process.stdout.fileno()
        os.set_blocking(fd, False)
        self.names[fd] = name
        self.partial[fd] = b""
        self.selector.register(fd, selectors.EVENT_READ)

    def _wait_ready(self) -> bool:
        waiting = list(self.plans)
        deadline = time.monotonic() + self.start_timeout
        while waiting:
            self._relay(0.05)
            if self.signalled:
                return False
            self._check_exits("before accepting AMQP")
            waiting = [plan for plan in waiting
                       if not accepts_amqp(plan.connect_host, plan.amqp_port, timeout=0.5)]
            if waiting and time.monotonic() > deadline:
                names = ", ".join(f"{plan.name} (port {plan.amqp_port})" for plan in waiting)
                raise LaunchError(f"{names} did not accept AMQP within "
                                  f"{self.start_timeout:g}s; stopping all nodes")
        return True

    def _announce(self) -> None:
        print(f"quorumqueue cluster: {len(self.plans)} nodes accept AMQP "
              f"(SIGTERM or Ctrl-C stops them all; kill -HUP {os.getpid()} starts "
              "the ones that died again)", file=self.out)
        for plan in self.plans:
            print(f"  {plan.name.ljust(self.width)}  {plan.uri}  inter-node "
                  f"{plan.cluster_port}  data {plan.data_dir}", file=self.out)
        self.out.flush()

    def _supervise(self) -> int:
        while not self.signalled:
            self._relay(0.2)
            self._announce_deaths()
            if len(self.down) == len(self.plans):
                self._say("no node is left running; exiting")
                return 1
            if self.hangups:
                self.hangups = 0
                self._restart_down()
        return 0

    def _announce_deaths(self) -> None:
        """Say on stdout which node died, how, and how to start it again; the others
        go on (a node's death is a failover to watch, not the cluster's end)."""
        for name, process in self.processes.items():
            if name in self.down or process.poll() is None:
                continue
            self._relay(0)  # its last words first
            self.down.add(name)
            running = len(self.plans) - len(self.down)
            print(f"quorumqueue cluster: node {name} (pid {process.pid}) "
                  f"{describe_exit(process.returncode)}; {running} of {len(self.plans)} "
                  f"nodes still running. Start it again with: kill -HUP {os.getpid()}",
                  file=self.out)
            self.out.flush()

    def _restart_down(self) -> None:
        """Start every announced-dead node again with its command (same ports, same
        data directory: it rejoins as the node it was)."""
        for plan, command in zip(self.plans, self.commands):
            if plan.name not in self.down:
                continue
            old = self.processes[plan.name]
            old.wait()
            self._drain(old)
            process = spawn(command, stdout=subprocess.PIPE)
            self.processes[plan.name] = process
            self._watch(plan.name, process)
            self.down.discard(plan.name)
            print(f"quorumqueue cluster: starting node {plan.name} again (pid "
                  f"{process.pid}), {plan.uri}", file=self.out)
            self.out.flush()

    def _drain(self, process: subprocess.Popen) -> None:
        """Relay what a reaped child left in its pipe, then close it (its descriptor
        number may come back for the next child)."""
        fd = process.stdout.fileno()
        while fd in self.names:
            name = self.names[fd]
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                chunk = b""  # a grandchild holds the pipe open: stop listening
            lines = (self.partial.pop(fd) + chunk).split(b"\n")
            if chunk:
                self.partial[fd] = lines.pop()
            else:
                self.selector.unregister(fd)
                del self.names[fd]
            for line in lines:
                if line:
                    self._log_line(name, line)
        process.stdout.close()

    def _check_exits(self, when: str) -> None:
        for name, process in self.processes.items():
            if process.poll() is not None:
                self._relay(0)  # its last words first
                raise LaunchError(f"node {name} (pid {process.pid}) "
                                  f"{describe_exit(process.returncode)} {when}; stopping the "
                                  "other nodes")

    def _relay(self, timeout: float) -> None:
        """Copy whatever the children wrote, line by line, prefixed with their names."""
        if not self.names:
            time.sleep(timeout)
            return
        for key, _ in self.selector.select(timeout):
            fd, name = key.fd, self.names[key.fd]
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                continue
            lines = (self.partial[fd] + chunk).split(b"\n")
            self.partial[fd] = lines.pop() if chunk else b""
            if not chunk:  # end of output: the child is gone
                lines = [line for line in lines if line]
                self.selector.unregister(fd)
                del self.names[fd]
                del self.partial[fd]
            for line in lines:
                self._log_line(name, line)

    def _log_line(self, name: str, line: bytes) -> None:
        text = line.decode("utf-8", errors="replace").rstrip("\r")
        self.err.write(f"{name.ljust(self.width)} | {text}\n")
        self.err.flush()

    def _say(self, message: str) -> None:
        self.err.write(f"quorumqueue cluster: {message}\n")
        self.err.flush()

    def _stop_all(self) -> None:
        """SIGTERM every live child, wait, SIGKILL the rest; reap all of them."""
        live = [p for p in self.processes.values() if p.poll() is None]
        for process in live:
            process.send_signal(signal.SIGTERM)
        signalled = self.signalled
        deadline = time.monotonic() + self.stop_timeout
        while any(p.poll() is None for p in live):
            if time.monotonic() > deadline or self.signalled > signalled:
                for name, process in self.processes.items():
                    if process.poll() is None:
                        self._say(f"node {name} did not stop; sending SIGKILL")
                        process.kill()
                break
            self._relay(0.05)
        for process in self.processes.values():
            process.wait()
        deadline = time.monotonic() + 2.0
        while self.names and time.monotonic() < deadline:  # what they wrote while stopping
            self._relay(0.05)
        for process in self.processes.values():
            process.stdout.close()
