"""What storage refuses to recover from.

`CorruptLogError` means a file is damaged in a way a crash cannot explain (a torn
write is explained, and handled, only at the very end of the newest WAL file and of a
group's newest segment). It names the file and the byte offset, and is never caught
inside the package: the node must not start on a log it cannot trust.

`is_disk_full` tells the one write failure that is not damage: the file system has no
room (ENOSPC) or the user's quota is spent (EDQUOT). Every write that can fail so
undoes itself first (the store is as before the call), so the caller may retry it
once space returns.
"""

from __future__ import annotations

import errno

DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def is_disk_full(error: BaseException) -> bool:
    """No room on the file system (or in the quota): retry later, nothing is damaged."""
    return isinstance(error, OSError) and error.errno in DISK_FULL_ERRNOS


class CorruptLogError(RuntimeError):
    def __init__(self, path: str, offset: int | None, detail: str) -> None:
        where = path if offset is None else f"{path} at byte offset {offset}"
        super().__init__(f"{where}: {detail}; the Raft log cannot be recovered "
                         "automatically (move the file aside only if losing its entries "
                         "is acceptable)")
        self.path = path
        self.offset = offset
        self.detail = detail
