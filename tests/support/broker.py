"""The bundled broker as a real process, for tests and benchmarks.

`BrokerProcess` runs `quorumqueue broker start` on a free loopback port with its own
data directory, waits until it completes an AMQP handshake, and stops it with
SIGTERM (or SIGKILL for crash tests), leaving no process behind. Restarting keeps
the data directory and the port, so durable state can be checked across restarts.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from quorumqueue.cli.launcher import die_with_parent, pick_free_ports

from .waiting import slow_stop

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "quorumqueue.cli"]


def free_port() -> int:
    """A free loopback port below the kernel's ephemeral range (launcher.pick_free_ports:
    a restarted broker keeps its ports, which no client socket can have taken)."""
    return pick_free_ports(1)[0]


class BrokerProcess:
    def __init__(self, data_dir: str | None = None, port: int | None = None,
                 config: str | None = None, extra_config: str = "",
                 management_port: int | None = None, new_session: bool = False,
                 log_path: str | None = None, nofile: int | None = None) -> None:
        self._tmp = None
        # the node's RLIMIT_NOFILE (soft and hard), set in the child before it runs
        self.nofile = nofile
        # a benchmark's broker runs in a process session of its own (setsid): Linux
        # shares the CPU between sessions, so an A/B beside another session's process
        # is fair only if both are in their own
        self.new_session = new_session
        if data_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="qq-broker-")
            data_dir = self._tmp.name
        self.data_dir = data_dir
        os.makedirs(data_dir, exist_ok=True)
        self.port = port or free_port()
        # the management HTTP API's port: a free one of its own, never the default
        # 15672 (brokers of parallel tests would race for it)
        self.management_port = management_port or free_port()
        # ports picked here may be taken by another process (another pytest-xdist
        # worker's broker) before the broker binds them: its first start then picks
        # new ones (a restart keeps its ports: clients come back to them)
        self._ports_chosen_here = port is None and management_port is None
        self._started_once = False
        self.config = config
        if extra_config:
            self.config = os.path.join(data_dir, "test-broker.toml")
            with open(self.config, "w") as handle:
                handle.write(extra_config)
        self.process: subprocess.Popen | None = None
        # the log (stdout and stderr) is in the data directory unless `log_path` says
        # (a data directory on a file system a test fills)
        self.log_path = log_path or os.path.join(data_dir, "broker.log")

    @property
    def uri(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    def start(self, timeout: float = 60.0) -> "BrokerProcess":
        for attempt in range(3):
            try:
                self._start_once(timeout)
                break
            except RuntimeError as error:
                taken = "address already in use" in str(error).lower()
                if not (taken and self._ports_chosen_here and not self._started_once
                        and attempt < 2):
                    raise
                self.stop()  # the exited process's log handle
                self.port, self.management_port = free_port(), free_port()
        self._started_once = True
        return self

    def _start_once(self, timeout: float) -> None:
        command = CLI + ["broker", "start", "--port", str(self.port), "--data-dir", self.data_dir,
                         "--management-port", str(self.management_port)]
        if self.config:
            command += ["--config", self.config]
        self._log = open(self.log_path, "ab")
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, cwd=ROOT,
                                        start_new_session=self.new_session,
                                        preexec_fn=die_with_parent(self._limits if self.nofile else None))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"broker exited with {self.process.returncode}:\n{self.log()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                    sock.sendall(b"AMQP\x00\x00\x09\x01")
                    if sock.recv(8):
                        break
            except OSError:
                time.sleep(0.05)
        else:
            self.stop()
            raise RuntimeError(f"broker did not accept AMQP within {timeout}s:\n{self.log()}")
        # the management API starts after the AMQP listener; the command line talks
        # to the node through it
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.management_port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"broker's management API did not listen on "
                           f"{self.management_port} within {timeout}s:\n{self.log()}")

    def _limits(self) -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_NOFILE, (self.nofile, self.nofile))

    @property
    def management_url(self) -> str:
        return f"http://127.0.0.1:{self.management_port}"

    def log(self) -> str:
        try:
            return Path(self.log_path).read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def stop(self, kill: bool = False, timeout: float = 10.0) -> int | None:
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                if not kill:
                    slow_stop(f"broker on port {self.port}", timeout)
                self.process.kill()
                self.process.wait()
        code = self.process.returncode
        self.process = None
        self._log.close()
        return code

    def restart(self, kill: bool = False) -> "BrokerProcess":
        self.stop(kill=kill)
        return self.start()

    def cleanup(self) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> "BrokerProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.cleanup()
