"""The bundled broker as a child process: the main job's embedded default.

Responsibilities
    Start `quorumqueue broker start` on a free 127.0.0.1 port with a data directory
    (its management API and Prometheus endpoint on free ports too, never RabbitMQ's
    15672 and 15692, which a local RabbitMQ may hold: FREE_PORTS) and, optionally,
    configuration keys of `conf/broker.toml`, wait until it completes
    an AMQP handshake, and stop it (SIGTERM, then SIGKILL if it does not exit), so the
    job leaves no process behind.

How it works
    The broker runs as `python -m quorumqueue.cli` with this interpreter,
    logging to `broker.log` in its data directory; configuration keys given are
    written to `broker.toml` there and passed with `--config` (the broker refuses an
    unknown key or an impossible value, naming it). Readiness is the 8-byte AMQP
    protocol header answered by connection.start, as a client would see it.

Not here
    Anything the job does with the broker (orders.py, orders_to_delta.py). The test
    suite has its own launcher (tests/support/broker.py) with restart and crash helpers.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

AMQP_HEADER = b"AMQP\x00\x00\x09\x01"
# the broker's HTTP listeners, each on a port the system picks (0); a caller's config wins
FREE_PORTS = {"management.tcp.port": 0, "prometheus.tcp.port": 0}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def toml_lines(config: Mapping[str, str | int | bool]) -> list[str]:
    """`key = value` lines of a broker configuration file (dotted keys as written in
    conf/broker.toml; strings quoted, as TOML wants them)."""
    def value(item: str | int | bool) -> str:
        if isinstance(item, bool):
            return "true" if item else "false"
        if isinstance(item, int):
            return str(item)
        return '"' + item.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return [f"{key} = {value(item)}" for key, item in config.items()]


class EmbeddedBroker:
    def __init__(self, data_dir: Path, port: int | None = None,
                 config: Mapping[str, str | int | bool] | None = None) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.config = {**FREE_PORTS, **(config or {})}
        self.log_path = data_dir / "broker.log"
        self._process: subprocess.Popen | None = None

    @property
    def uri(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    def start(self, timeout: float = 30.0) -> "EmbeddedBroker":
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "quorumqueue.cli", "broker", "start",
                   "--port", str(self.port), "--data-dir", str(self.data_dir)]
        if self.config:  # always: FREE_PORTS
            config_path = self.data_dir / "broker.toml"
            config_path.write_text("\n".join(toml_lines(self.config)) + "\n", encoding="utf-8")
            command += ["--config", str(config_path)]
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"the broker exited with {self._process.returncode}; "
                                   f"see {self.log_path}")
            if self._answers():
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"the broker did not accept AMQP connections within {timeout:.0f} s; "
                           f"see {self.log_path}")

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(AMQP_HEADER)
                return bool(sock.recv(8))
        except OSError:
            return False

    def stop(self, timeout: float = 10.0) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def __enter__(self) -> "EmbeddedBroker":
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stop()
