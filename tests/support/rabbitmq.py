"""A private RabbitMQ 3.10.8 node: the oracle of differential tests and benchmarks.

Responsibilities
    Start Debian's ``rabbitmq-server`` by hand (not the system service), as the
    current user, wait until it completes a real AMQP handshake, and stop it
    without leaving a single process behind.

How it works
    The node runs ``/usr/lib/rabbitmq/bin/rabbitmq-server`` (the script behind
    ``/usr/sbin/rabbitmq-server``, minus its switch to the ``rabbitmq`` user) in
    a new session. Every path the node reads or writes -- config, enabled
    plugins (none), env file, Mnesia, logs, ``$HOME/.erlang.cookie`` -- is
    under one temporary directory. Three free loopback ports are reserved:
    AMQP, Erlang distribution, and epmd. We start that epmd ourselves
    (``epmd -port P -address 127.0.0.1``, pointed to by ``ERL_EPMD_PORT``)
    before the node, so the node never talks to a system epmd or another node,
    and does not daemonize an epmd of its own that would outlive it as init's
    child. Boot takes ~3.5 s here; see ``scheduler_busy_wait`` for the one
    setting that matters.

Invariants
    - The node binds 127.0.0.1 only (AMQP, distribution, epmd).
    - The node name ``qqoracle-<random>@localhost`` is unique per instance and
      appears on beam's command line, so ``pgrep -f <node_name>`` finds it.
    - Every process of the node -- launcher script, beam, epmd, and the
      ``erl_child_setup`` / ``inet_gethost`` helpers that open sessions of
      their own -- carries ``QQ_ORACLE_NODE=<node_name>`` in its environment;
      ``stop()`` kills whatever still carries it and checks that none remains.
    - The default user is guest/guest and, as in any RabbitMQ, loopback-only.
    - If the process that started the node dies, the kernel sends the launcher
      script and epmd SIGTERM (PR_SET_PDEATHSIG, armed only when they were started
      from the main thread: quorumqueue.cli.launcher.die_with_parent); the launcher
      stops beam.

Not here
    Forming a cluster (rabbitmq_cluster.py joins nodes started here with a shared
    cookie and epmd: `cookie`, `epmd`), TLS. Plugins are off unless `plugins` names
    them (the management API's differential tests enable rabbitmq_management).
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import IO, ClassVar

from quorumqueue.cli.launcher import die_with_parent

SERVER_SCRIPT = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
TOOLS = Path("/usr/lib/rabbitmq/bin")  # rabbitmqctl, rabbitmq-diagnostics, rabbitmq-queues
EPMD = Path("/usr/bin/epmd")  # Debian's erlang-base; rabbitmq-server depends on it
MARKER_VARIABLE = "QQ_ORACLE_NODE"

# Kept minimal: every line costs boot time. The disk alarm is lowered so an
# almost-full CI disk cannot block publishers; everything else is RabbitMQ's
# default (notably guest stays loopback-only and the memory watermark is 0.4).
CONFIG_FILE_TEXT = """\
disk_free_limit.absolute = 1MB
log.console = false
log.file.level = info
"""

# Erlang's +sbwt values (rabbitmq-env passes one to +sbwt, +sbwtdcpu, +sbwtdio).
BUSY_WAIT_THRESHOLDS = ("none", "very_short", "short", "medium", "long", "very_long")

def _reserve_loopback_ports(count: int) -> list[int]:
    """Distinct free ports on 127.0.0.1 (held open together, then released)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def processes_with_marker(node_name: str) -> list[int]:
    """Pids whose environment carries ``QQ_ORACLE_NODE=<node_name>``."""
    needle = f"{MARKER_VARIABLE}={node_name}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as environ:
                variables = environ.read().split(b"\0")
            with open(f"/proc/{entry.name}/stat", "rb") as stat:
                state = stat.read().rsplit(b")", 1)[1].split()[0]
        except OSError:  # gone meanwhile, or not ours
            continue
        if needle in variables and state != b"Z":
            found.append(int(entry.name))
    return found


class RabbitMQNodeError(RuntimeError):
    """The oracle node failed to start or to stop cleanly."""


class RabbitMQNode:
    """One private RabbitMQ node; use as ``with RabbitMQNode() as node: ...``."""

    skip_reason: ClassVar[str] = (
        f"RabbitMQ 3.10.8 is not installed ({SERVER_SCRIPT} missing); "
        "run .ci/install-rabbitmq (or `make oracle`) to enable the tests "
        "that compare quorumqueue with RabbitMQ"
    )

    def __init__(
        self,
        *,
        startup_timeout: float = 60.0,
        stop_timeout: float = 15.0,
        scheduler_busy_wait: str = "medium",
        extra_config: str = "",
        advanced_config: str = "",
        plugins: tuple[str, ...] = (),
        cookie: str | None = None,
        epmd: "RabbitMQNode | None" = None,
    ) -> None:
        if scheduler_busy_wait not in BUSY_WAIT_THRESHOLDS:
            raise ValueError(
                f"scheduler_busy_wait must be one of {', '.join(BUSY_WAIT_THRESHOLDS)}, "
                f"not {scheduler_busy_wait!r}"
            )
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        # "medium" is Erlang's own default. Debian's launcher sets "none",
        # which on this VM makes boot ~3x slower (10 s instead of 3.5 s): each
        # scheduler sleep/wake-up is a costly futex round trip. Benchmarks may
        # pick either; the packaged "none" is accepted.
        self.scheduler_busy_wait = scheduler_busy_wait
        self.extra_config = extra_config  # appended to rabbitmq.conf (sysctl format)
        # advanced.config (Erlang terms), for settings rabbitmq.conf has no key for
        # (e.g. `[{rabbit, [{channel_tick_interval, 500}]}].`); empty: none
        self.advanced_config = advanced_config
        # enabled plugins (Debian's package ships them; e.g. rabbitmq_management, whose
        # HTTP port the caller sets with extra_config `management.tcp.port = N`)
        self.plugins = tuple(plugins)
        # the Erlang cookie (None: the node makes one), and a node whose epmd this one
        # registers with instead of starting its own: nodes that may form a cluster
        self.cookie = cookie
        self.epmd_of = epmd
        self.node_name = f"qqoracle-{secrets.token_hex(4)}@localhost"
        self.port = 0  # AMQP port; set by start()
        self.dist_port = 0
        self.epmd_port = 0
        self.startup_seconds: float | None = None  # spawn -> first AMQP handshake
        self.base_dir: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None  # the launcher script
        self._epmd: subprocess.Popen[bytes] | None = None  # ours, so we reap it

    # -- availability ---------------------------------------------------------

    @staticmethod
    def available() -> bool:
        return all(path.is_file() and os.access(path, os.X_OK) for path in (SERVER_SCRIPT, EPMD))

    # -- addresses --------------------------------------------------------------

    @property
    def uri(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    @property
    def log_path(self) -> Path:
        assert self.base_dir is not None, "node not started"
        return self.base_dir / "log" / f"{self.node_name}.log"

    @property
    def console_path(self) -> Path:
        assert self.base_dir is not None, "node not started"
        return self.base_dir / "console.log"

    # -- lifecycle ----------------------------------------------------------------

    def __enter__(self) -> RabbitMQNode:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # A port reserved free can be taken by another process (another pytest-xdist
    # worker's broker) between its release and the node's bind: the node then stops at
    # boot naming the port; it is started again on new ports.
    PORT_TAKEN = ("dist_port_already_used", "eaddrinuse", "could not bind")
    START_ATTEMPTS = 3

    def start(self) -> RabbitMQNode:
        if self._process is not None:
            raise RabbitMQNodeError(f"{self.node_name} already started")
        if not self.available():
            raise RabbitMQNodeError(self.skip_reason)
        for attempt in range(1, self.START_ATTEMPTS + 1):
            try:
                return self._start_once()
            except RabbitMQNodeError as error:
                text = str(error).lower()
                if attempt == self.START_ATTEMPTS or not any(
                        marker in text for marker in self.PORT_TAKEN):
                    raise
        raise AssertionError("unreachable")

    def _start_once(self) -> RabbitMQNode:
        self.base_dir = Path(tempfile.mkdtemp(prefix="qqoracle-"))
        self.port, self.dist_port, self.epmd_port = _reserve_loopback_ports(3)
        if self.epmd_of is not None:
            self.epmd_port = self.epmd_of.epmd_port
        environment = self._environment()
        began = time.monotonic()
        atexit.register(self.stop)
        try:
            with open(self.console_path, "wb") as console:
                # Our own epmd, listening before the node looks for one: the
                # node then does not daemonize its own (which would outlive it
                # as init's child). A node joining another's epmd finds it running.
                if self.epmd_of is None:
                    epmd_command = [str(EPMD), "-port", str(self.epmd_port), "-address",
                                    "127.0.0.1"]
                    self._epmd = self._spawn(epmd_command, environment, console)
                    self._wait_for_epmd(began)
                self._process = self._spawn([str(SERVER_SCRIPT)], environment, console)
            self._wait_until_ready(began)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - began
        return self

    def ctl(self, *arguments: str, tool: str = "rabbitmqctl",
            timeout: float = 120.0) -> subprocess.CompletedProcess:
        """rabbitmqctl (or `tool`: rabbitmq-diagnostics, rabbitmq-queues) against this
        node: its cookie under the node's HOME, its epmd. Output as text, not checked."""
        assert self.base_dir is not None, "node not started"
        environment = {name: os.environ[name] for name in ("PATH", "LANG", "LC_ALL", "TMPDIR")
                       if name in os.environ}
        environment.update(HOME=str(self.base_dir / "home"), ERL_EPMD_PORT=str(self.epmd_port),
                           ERL_EPMD_ADDRESS="127.0.0.1", RABBITMQ_USE_LONGNAME="false",
                           RABBITMQ_CONF_ENV_FILE=str(self.base_dir / "rabbitmq-env.conf"))
        environment[MARKER_VARIABLE] = self.node_name
        return subprocess.run([str(TOOLS / tool), "-n", self.node_name, *arguments],
                              env=environment, capture_output=True, text=True,
                              timeout=timeout)

    def erlang_cookie(self) -> str:
        return (self.base_dir / "home" / ".erlang.cookie").read_text().strip()

    def stop(self) -> None:
        """Stop the node, its epmd and helpers; remove its files. Idempotent."""
        process, self._process = self._process, None
        epmd, self._epmd = self._epmd, None
        if process is None and epmd is None:
            return
        atexit.unregister(self.stop)
        if process is not None and process.poll() is None:
            # The launcher script traps TERM and stops beam gracefully; beam
            # in the same group gets it too and shuts down on its own.
            self._signal_group(process.pid, signal.SIGTERM)
            try:
                process.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                self._signal_group(process.pid, signal.SIGKILL)
                process.wait(5)
        if epmd is not None:
            epmd.kill()  # nothing to save; the node is gone
            epmd.wait(5)
        self._kill_marked_processes()
        if self.base_dir is not None:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    # -- internals -------------------------------------------------------------------

    def _environment(self) -> dict[str, str]:
        assert self.base_dir is not None
        base = self.base_dir
        for folder in ("home", "mnesia", "log"):
            (base / folder).mkdir()
        if self.cookie is not None:
            cookie = base / "home" / ".erlang.cookie"
            cookie.write_text(self.cookie)
            cookie.chmod(0o400)
        (base / "rabbitmq.conf").write_text(CONFIG_FILE_TEXT + self.extra_config + "\n")
        (base / "enabled_plugins").write_text(f"[{','.join(self.plugins)}].\n")
        if self.advanced_config:
            (base / "advanced.config").write_text(self.advanced_config + "\n")
        (base / "rabbitmq-env.conf").write_text("")  # shadows /etc/rabbitmq's
        kept = {name: os.environ[name] for name in ("PATH", "LANG", "LC_ALL", "TMPDIR") if name in os.environ}
        return kept | {
            MARKER_VARIABLE: self.node_name,
            "HOME": str(base / "home"),  # fresh .erlang.cookie
            "RABBITMQ_NODENAME": self.node_name,
            "RABBITMQ_USE_LONGNAME": "false",
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "ERL_EPMD_PORT": str(self.epmd_port),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "RABBITMQ_CONF_ENV_FILE": str(base / "rabbitmq-env.conf"),
            "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(base / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
            "RABBITMQ_LOG_BASE": str(base / "log"),
            "RABBITMQ_PID_FILE": str(base / "node.pid"),
            "RABBITMQ_FEATURE_FLAGS_FILE": str(base / "feature_flags"),
            "RABBITMQ_PLUGINS_EXPAND_DIR": str(base / "plugins-expand"),
            "RABBITMQ_SCHEDULER_BUSY_WAIT_THRESHOLD": self.scheduler_busy_wait,
            # Distribution on loopback only; `-qqoracle_node` is an inert init
            # argument that puts the node name on beam's command line.
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": (
                f"-kernel inet_dist_use_interface {{127,0,0,1}} -qqoracle_node {self.node_name}"
            ),
        }

    def _spawn(self, command: list[str], environment: dict[str, str], output: IO[bytes]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            command,
            cwd=self.base_dir,
            env=environment,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent(),
        )

    def _wait_for_epmd(self, began: float) -> None:
        assert self._epmd is not None
        while not _accepts_tcp(self.epmd_port):
            if self._epmd.poll() is not None:
                self._fail(f"could not start epmd on port {self.epmd_port} (status {self._epmd.returncode})")
            if time.monotonic() > began + 10.0:
                self._fail(f"epmd did not listen on port {self.epmd_port} within 10 s")
            time.sleep(0.01)

    def _wait_until_ready(self, began: float) -> None:
        deadline = began + self.startup_timeout
        while True:
            if self._process is not None and self._process.poll() is not None:
                self._fail(f"exited with status {self._process.returncode} before accepting AMQP")
            if self._epmd is not None and self._epmd.poll() is not None:
                self._fail(f"lost its epmd (port {self.epmd_port}, status {self._epmd.returncode})")
            if _accepts_tcp(self.port) and _accepts_amqp_handshake(self.port):
                return
            if time.monotonic() > deadline:
                self._fail(f"did not accept an AMQP handshake within {self.startup_timeout:.0f} s")
            time.sleep(0.1)

    def _fail(self, what: str) -> None:
        raise RabbitMQNodeError(
            f"RabbitMQ node {self.node_name} on 127.0.0.1:{self.port} {what}.\n"
            f"--- tail of {self.log_path} ---\n{_log_excerpt(self.log_path)}\n"
            f"--- tail of {self.console_path} ---\n{_log_excerpt(self.console_path)}"
        )

    @staticmethod
    def _signal_group(pid: int, signum: int) -> None:
        try:
            os.killpg(pid, signum)
        except ProcessLookupError:
            pass

    def _kill_marked_processes(self) -> None:
        """SIGKILL whatever outlived beam (normally nothing), let init reap it."""
        deadline = time.monotonic() + 5.0
        killed: set[int] = set()
        while pids := processes_with_marker(self.node_name):
            if time.monotonic() > deadline:
                raise RabbitMQNodeError(f"processes of {self.node_name} survived SIGKILL: {pids}")
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.add(pid)
                except ProcessLookupError:
                    pass
            time.sleep(0.02)
        # Orphans are init's children; wait briefly so that their zombies do
        # not show up in `pgrep epmd` right after stop() (not an error if so).
        reap_deadline = time.monotonic() + 2.0
        while any(os.path.exists(f"/proc/{pid}") for pid in killed):
            if time.monotonic() > reap_deadline:
                break
            time.sleep(0.02)


@contextlib.contextmanager
def management_node(extra_config: str = "", ip: str = "127.0.0.1",
                    timeout: float = 90.0) -> Iterator[RabbitMQNode]:
    """A started RabbitMQ node with the management plugin on a free port of `ip`, its
    API answering guest's /api/overview; `management_url` and `management_port` are set
    on it. `extra_config` adds rabbitmq.conf lines. Stopped on exit."""
    port, = _reserve_loopback_ports(1)
    node = RabbitMQNode(plugins=("rabbitmq_management",),
                        extra_config=f"management.tcp.port = {port}\n"
                                     f"management.tcp.ip = {ip}\n" + extra_config)
    with node:
        node.management_url = f"http://{ip}:{port}"
        node.management_port = port
        deadline = time.monotonic() + timeout
        while not _api_answers(node.management_url):
            if time.monotonic() > deadline:
                raise RabbitMQNodeError(
                    f"RabbitMQ's management API did not answer on {node.management_url} "
                    f"within {timeout:.0f}s; its log: {node.log_path}")
            time.sleep(0.5)
        yield node


def _api_answers(url: str) -> bool:
    request = urllib.request.Request(url + "/api/overview", headers={
        "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return bool(json.loads(response.read()))
    except (OSError, ValueError):
        return False


def _accepts_tcp(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


def _accepts_amqp_handshake(port: int) -> bool:
    import pika  # only needed once the port is open
    import pika.exceptions

    parameters = pika.ConnectionParameters(
        host="127.0.0.1",
        port=port,
        credentials=pika.PlainCredentials("guest", "guest"),
        connection_attempts=1,
        socket_timeout=2.0,
        blocked_connection_timeout=2.0,
    )
    try:
        pika.BlockingConnection(parameters).close()
        return True
    except pika.exceptions.AMQPError:
        return False


def _log_excerpt(path: Path, tail_lines: int = 30, first_errors: int = 8) -> str:
    """The first error lines (they name the cause) followed by the tail."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as error:
        return f"(unreadable: {error})"
    tail = lines[-tail_lines:]
    early_errors = [line for line in lines[:-tail_lines] if "[error]" in line][:first_errors]
    if early_errors:
        return "\n".join(["(first errors)", *early_errors, "(last lines)", *tail])
    return "\n".join(tail)
