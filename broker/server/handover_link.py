"""The links a node's workers hand client sockets over (broker.workers, SCM_RIGHTS).

Responsibilities: carry one connection at a time from worker 0, which accepts every
client, to the worker that owns its queues: the socket's descriptor, the session's
state (node/handover.py `capture`) and the bytes received and not handled.

How it works: the supervisor (workers.py) makes one SOCK_SEQPACKET socket pair
between worker 0 and each other worker and names their descriptors in each worker's
environment (ENV: "NAME=FD,..." by the peer worker's node name). A handover is one
message with the descriptor (socket.send_fds) and a pickle of (state, the unread
byte count), then the unread bytes in messages of at most CHUNK bytes: a seqpacket
socket keeps the messages whole and in order. The sender blocks (SEND_TIMEOUT_S at
most, a sibling process reading at once); the receiver reads on its event loop.

Invariants:
- Only the node's own processes hold these sockets (made by its supervisor, passed
  at exec, in no file system), so the pickle comes from a sibling worker.
- A receiver hands on a connection only once all its bytes arrived.

Not here: deciding what to hand over and rebuilding the session (node/handover.py);
the shell's part (server.py `_hand_over`, `_adopt`).
"""

from __future__ import annotations

import logging
import os
import pickle
import socket

log = logging.getLogger("quorumqueue.broker")

ENV = "QUORUMQUEUE_HANDOVER_LINKS"
CHUNK = 32 * 1024
RECEIVE_BYTES = 256 * 1024  # a message's largest size (a state's pickle, a chunk)
SEND_TIMEOUT_S = 10.0


def pair() -> tuple[socket.socket, socket.socket]:
    """One link: (worker 0's end, the other worker's end), inheritable."""
    ends = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for end in ends:
        end.set_inheritable(True)
    return ends


def links_from_env(environ) -> dict[str, socket.socket]:
    """{peer worker's name: its link} as the supervisor named them (none: {}). The
    name leaves `environ`, as the descriptors are not inherited further."""
    links = {}
    for item in filter(None, environ.pop(ENV, "").split(",")):
        name, _, fd = item.rpartition("=")
        link = socket.socket(fileno=int(fd))
        link.set_inheritable(False)
        links[name] = link
    return links


def send(link: socket.socket, state: dict, unread: bytes, fd: int) -> None:
    """Hand the socket `fd` over with `state` and `unread` (OSError if the peer is gone
    or slower than SEND_TIMEOUT_S)."""
    link.settimeout(SEND_TIMEOUT_S)
    socket.send_fds(link, [pickle.dumps((state, len(unread)))], [fd])
    view = memoryview(unread)
    for start in range(0, len(view), CHUNK):
        link.sendall(view[start:start + CHUNK])


class Receiver:
    """The reading end of one link: `readable` on the loop's reader callback calls
    `on_connection(state, unread, sock)` for each connection handed over whole."""

    def __init__(self, link: socket.socket, on_connection) -> None:
        link.setblocking(False)
        self.link = link
        self._on_connection = on_connection
        self._current: tuple[dict, socket.socket, int, list] | None = None

    def readable(self) -> bool:
        """Read what arrived; False once the sender's end is closed."""
        while True:
            try:
                data, fds, flags, _address = socket.recv_fds(self.link, RECEIVE_BYTES, 1)
            except (BlockingIOError, InterruptedError):
                return True
            if not data and not fds:
                return False
            if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
                for fd in fds:
                    os.close(fd)
                raise OSError(f"handover message truncated (flags {flags:#x})")
            if self._current is None:
                state, length = pickle.loads(data)
                self._current = (state, socket.socket(fileno=fds[0]), length, [])
            else:
                self._current[3].append(data)
            state, sock, length, parts = self._current
            if sum(map(len, parts)) >= length:
                self._current = None
                self._on_connection(state, b"".join(parts), sock)
