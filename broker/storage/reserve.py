"""The disk reserve: space held back in the data directory for a full disk.

Responsibilities: hold a file of `size` allocated bytes (`disk-reserve` in the data
directory) while the disk has room, give its space back the moment a write finds the
disk full, and take it again once the disk has room for it and the disk alarm's limit.

Why: a node whose file system is full can write nothing, so not even the acks that
would let it delete messages, nor the Raft entries its queues' other members send. The
disk alarm blocks publishers; the reserve lets the rest go on meanwhile (consumers,
acks, replication), about `size` bytes of it, and a file system filled from outside
the node (another program, a log) finds the node still able to write what it has
accepted. A database's "ballast file" (CockroachDB's, Pebble's) is the same idea.

How it works: `hold()` allocates the file with posix_fallocate (real blocks, not a
sparse hole) and fsyncs it; `release()` deletes it. The server shell calls them
(broker/server/server.py); nothing else here touches the disk.

Not here: when to release or hold (the shell's disk alarm), what the space is used for.
"""

from __future__ import annotations

import os

FILE_NAME = "disk-reserve"


class DiskReserve:
    def __init__(self, data_dir: str, size: int) -> None:
        self.path = os.path.join(data_dir, FILE_NAME)
        self.size = size
        # whether the file holds its space now (one left by an earlier run counts if
        # it has the size asked for; another size is given back, to be held anew)
        self.held = False
        try:
            if os.stat(self.path).st_size == size > 0:
                self.held = True
            else:
                os.remove(self.path)
        except FileNotFoundError:
            pass

    @property
    def missing(self) -> bool:
        """The reserve should be held and is not (released, or no room for it)."""
        return self.size > 0 and not self.held

    def hold(self) -> bool:
        """Allocate the reserve (again); False, with no file left, if the disk has no
        room for it now. Nothing to do (True) when it is held or has size 0."""
        if self.held or self.size <= 0:
            return True
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.posix_fallocate(fd, 0, self.size)
            os.fsync(fd)
        except OSError:
            os.close(fd)
            os.remove(self.path)
            return False
        os.close(fd)
        self.held = True
        return True

    def release(self) -> int:
        """Give the reserve's space back to the file system; the bytes freed (0 if it
        was not held)."""
        if not self.held:
            return 0
        self.held = False
        try:
            freed = os.stat(self.path).st_blocks * 512
            os.remove(self.path)
        except FileNotFoundError:
            return 0
        return freed
