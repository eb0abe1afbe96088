"""The brokers under test: start one on loopback, hand out host/port, stop it.

Responsibilities
    ``quorumqueue``: the bundled broker, run as a subprocess with
    ``quorumqueue broker start --port PORT --data-dir TMPDIR``, ready once its
    port accepts a TCP connection, stopped with SIGTERM (SIGKILL after 30 s).
    ``rabbitmq``: a private RabbitMQ node from ``tests.support.rabbitmq``.
    ``uri``: a broker someone else runs; nothing is started or stopped.

Invariants
    - Each started broker gets a fresh data directory, removed on stop.
    - A broker that dies or never opens its port fails with the tail of its
      own log in the message.

Not here
    The load (``bench.amqp_loadgen``).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator
from urllib.parse import unquote, urlsplit

from tests.support.rabbitmq import RabbitMQNode


@dataclass(frozen=True, slots=True)
class BrokerAddress:
    host: str
    port: int
    user: str = "guest"
    password: str = "guest"
    vhost: str = "/"
    startup_s: float | None = None  # None when we did not start it

    @classmethod
    def from_uri(cls, uri: str) -> BrokerAddress:
        parts = urlsplit(uri)
        if parts.scheme != "amqp":
            raise ValueError(f"--uri must be amqp://user:password@host:port/vhost, not {uri!r}")
        path = parts.path[1:] if parts.path.startswith("/") else parts.path
        return cls(
            host=parts.hostname or "127.0.0.1",
            port=parts.port or 5672,
            user=unquote(parts.username or "guest"),
            password=unquote(parts.password or "guest"),
            vhost=unquote(path) if path else "/",
        )


@contextmanager
def rabbitmq_broker() -> Iterator[BrokerAddress]:
    with RabbitMQNode() as node:
        yield BrokerAddress("127.0.0.1", node.port, startup_s=node.startup_seconds)


def quorumqueue_command() -> Path:
    beside_python = Path(sys.executable).parent / "quorumqueue"
    if beside_python.exists():
        return beside_python
    found = shutil.which("quorumqueue")
    if found is None:
        raise RuntimeError("quorumqueue CLI not found; run `make setup` (pip install -e .)")
    return Path(found)


@contextmanager
def quorumqueue_broker(startup_timeout: float = 60.0) -> Iterator[BrokerAddress]:
    data_dir = Path(tempfile.mkdtemp(prefix="qqbench-"))
    log_path = data_dir.parent / f"{data_dir.name}.log"
    port = _free_loopback_port()
    command = [str(quorumqueue_command()), "broker", "start", "--port", str(port), "--data-dir", str(data_dir)]
    began = time.monotonic()
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        while not _accepts_tcp(port):
            if process.poll() is not None:
                raise RuntimeError(
                    f"{' '.join(command)} exited with status {process.returncode}:\n{_tail(log_path)}"
                )
            if time.monotonic() - began > startup_timeout:
                raise RuntimeError(f"quorumqueue did not open port {port} within {startup_timeout:.0f} s:\n{_tail(log_path)}")
            time.sleep(0.05)
        yield BrokerAddress("127.0.0.1", port, startup_s=time.monotonic() - began)
    finally:
        _stop(process)
        shutil.rmtree(data_dir, ignore_errors=True)
        log_path.unlink(missing_ok=True)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            print("quorumqueue ignored SIGTERM for 30 s; killing it", file=sys.stderr)
            process.kill()
            process.wait(5)
    try:  # anything it spawned in its session
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _free_loopback_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _accepts_tcp(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as error:
        return f"(no log: {error})"
