"""Hostile connections for the fault suite's exposure nemeses (issue 30, item 8).

What an attacker who can reach a node's ports does without credentials, held against
one node while the confirmed workload runs on the cluster:

- `Attack.silent(port, n)`: n connections that send nothing;
- `Attack.slow(port, prefix, n)`: n connections that send `prefix` (the start of what
  the listener expects) one byte every SLOW_EVERY seconds, then filler the same way:
  a handshake or a request's headers that never end;
- `Attack.flood(port, n)`: n connections to the inter-node port, each announcing a
  256 MB frame and sending its first MiB, before any cookie was proved;
- `descriptor_exhaustion`: the node's RLIMIT_NOFILE lowered (prlimit) and more
  silent connections than it allows.

Each node must close them itself (handshake_timeout, request_timeout, the cluster's
handshake timeout, the pre-auth frame bound, the descriptor reserve) while the
workload carries on: `Attack.still_open(bound)` names the ones still open after
`bound` seconds, and the nemesis's heal fails the run if any is, or if the node's
resident memory grew past MAX_RSS_GROWTH.

Not here: the nemeses themselves (nemesis.py), the checkers (run.py).
"""

from __future__ import annotations

import os
import resource
import socket
import threading
import time

SLOW_EVERY = 0.3            # seconds between two bytes of a slow connection
CLOSE_BOUND = 40.0          # seconds a node has to close them all (busy machine)
MAX_RSS_GROWTH = 300 << 20  # bytes a flood may add to a node's resident memory
# the node settings the exposure runs use: timeouts of 2 s, so a run's faults see
# them act (RabbitMQ's defaults are 10 s and 5 s)
EXPOSURE_CONFIG = ("handshake_timeout = 2000\n"
                   "management.tcp.request_timeout = 2000\n"
                   "prometheus.tcp.request_timeout = 2000\n")
AMQP_PREFIX = b"AMQP\x00\x00\x09\x01\x01\x00\x00\x00\x00\x01\x00"   # a start-ok, cut
HTTP_PREFIX = b"GET /api/overview HTTP/1.1\r\nHost: x\r\nX-Slow: "
CLUSTER_PREFIX = b"\x00\x00\x01\x00"                  # a 256-byte frame, never sent


def raise_own_descriptor_limit(wanted: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))


def resident_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class Attack:
    """Connections against one node, held until `stop`."""

    def __init__(self) -> None:
        self._sockets: list[tuple[str, socket.socket]] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self.refused = 0    # connections the node refused or reset before we held them

    def _connect(self, port: int) -> socket.socket | None:
        sock = socket.socket()
        sock.settimeout(10)
        try:
            sock.connect(("127.0.0.1", port))
        except OSError:
            sock.close()
            self.refused += 1
            return None
        return sock

    def _hold(self, what: str, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append((what, sock))

    def silent(self, port: int, count: int, what: str = "") -> None:
        for _ in range(count):
            sock = self._connect(port)
            if sock is not None:
                sock.setblocking(False)
                self._hold(what or f"silent on {port}", sock)

    def slow(self, port: int, prefix: bytes, count: int, what: str = "") -> None:
        for _ in range(count):
            sock = self._connect(port)
            if sock is None:
                continue
            self._hold(what or f"slow on {port}", sock)
            thread = threading.Thread(target=self._trickle, args=(sock, prefix), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _trickle(self, sock: socket.socket, prefix: bytes) -> None:
        position = 0
        while not self._stopping.wait(SLOW_EVERY):
            byte = prefix[position:position + 1] or b"a"
            position += 1
            try:
                sock.send(byte)
            except OSError:   # closed by the node
                return

    def flood(self, port: int, count: int) -> None:
        """Strangers on the inter-node port announcing 256 MB frames."""
        header = (256 * 1024 * 1024).to_bytes(4, "big")
        chunk = os.urandom(1 << 20)
        for _ in range(count):
            sock = self._connect(port)
            if sock is None:
                continue
            try:
                sock.sendall(header + chunk)
            except OSError:
                pass   # closed before all of it went: what the node should do
            sock.setblocking(False)
            self._hold(f"pre-auth flood on {port}", sock)

    def still_open(self, bound: float = CLOSE_BOUND) -> list[str]:
        """The held connections the node has not closed within `bound` seconds."""
        deadline = time.monotonic() + bound
        with self._lock:
            pending = list(self._sockets)
        while pending and time.monotonic() < deadline:
            pending = [(what, sock) for what, sock in pending if not _closed(sock)]
            if pending:
                time.sleep(0.2)
        counts: dict[str, int] = {}
        for what, _sock in pending:
            counts[what] = counts.get(what, 0) + 1
        return [f"{count} {what} still open after {bound:g} s"
                for what, count in counts.items()]

    def stop(self) -> None:
        self._stopping.set()
        with self._lock:
            for _what, sock in self._sockets:
                sock.close()
            self._sockets.clear()
        for thread in self._threads:
            thread.join(5)


def _closed(sock: socket.socket) -> bool:
    try:
        sock.setblocking(False)
        while True:
            data = sock.recv(65536)
            if not data:
                return True
    except BlockingIOError:
        return False
    except OSError:   # a reset, or closed by us
        return True
