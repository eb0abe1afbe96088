"""The data directory's file system as the disk alarm sees it, full disks included.

Responsibilities: say whether the disk alarm should hold (free bytes below
`disk_free_limit`, a write that found the disk full and has not succeeded since, or
the disk reserve given back and not yet taken again), and keep the reserve
(storage/reserve.py): held from the start, given back at the first write that finds
the disk full, taken again once the file system has room for it and the limit. It
logs each of these changes once.

How it works: the server shell calls `failed(error)` when a Sync found the disk full
(it holds that Sync and runs it again after the delay returned), `succeeded()` when
a Sync ran, and `low(limit)` from its alarm check.

Not here: the alarm itself and the publishers it blocks (server.py `_alarm`, the
node), undoing the failed writes (the stores), when to run the Sync again (server.py).
"""

from __future__ import annotations

import logging
import shutil

from ..storage.reserve import DiskReserve

log = logging.getLogger("quorumqueue.broker")

# how often a Sync that found the disk full is run again, unless the reserve just
# freed space (then at once)
RETRY_SECONDS = 0.5


class DiskWatch:
    def __init__(self, data_dir: str, reserve_bytes: int) -> None:
        self.data_dir = data_dir
        self.reserve = DiskReserve(data_dir, reserve_bytes)
        self.full: OSError | None = None   # the last Sync's error while the disk is full

    def start(self) -> None:
        if not self.reserve.hold():
            log.warning("no room for the disk reserve (%d bytes, storage.disk_reserve) in "
                        "%s: the disk alarm holds until there is", self.reserve.size,
                        self.data_dir)

    def failed(self, error: OSError) -> float:
        """A Sync found the disk full (and undid its writes): give the reserve back;
        the seconds to wait before running it again."""
        if self.full is None:
            log.warning("the file system of %s is full (%s): disk alarm set, publishers "
                        "are blocked; the write is tried again until it succeeds",
                        self.data_dir, error)
        self.full = error
        freed = self.reserve.release()
        if freed:
            log.warning("gave back the disk reserve (%d bytes, storage.disk_reserve) so "
                        "that consumers, acks and replication go on", freed)
        return 0.0 if freed else RETRY_SECONDS

    def succeeded(self) -> None:
        if self.full is not None:
            log.warning("writes to %s succeed again after a full disk", self.data_dir)
            self.full = None

    def low(self, limit: int) -> tuple[bool, int]:
        """(whether the disk alarm holds, the free bytes): the reserve is taken again
        first if the file system has room for it and `limit`."""
        free = shutil.disk_usage(self.data_dir).free
        reserve = self.reserve
        if (reserve.missing and self.full is None and free >= limit + reserve.size
                and reserve.hold()):
            log.info("took the disk reserve again (%d bytes)", reserve.size)
            free = shutil.disk_usage(self.data_dir).free
        return free < limit or self.full is not None or reserve.missing, free
