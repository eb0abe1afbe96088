"""What storage refuses to recover from.

`CorruptLogError` means a file is damaged in a way a crash cannot explain (a torn
write is explained, and handled, only at the very end of the newest WAL file and of a
group's newest segment). It names the file and the byte offset, and is never caught
inside the package: the node must not start on a log it cannot trust.
"""

from __future__ import annotations


class CorruptLogError(RuntimeError):
    def __init__(self, path: str, offset: int | None, detail: str) -> None:
        where = path if offset is None else f"{path} at byte offset {offset}"
        super().__init__(f"{where}: {detail}; the Raft log cannot be recovered "
                         "automatically (move the file aside only if losing its entries "
                         "is acceptable)")
        self.path = path
        self.offset = offset
        self.detail = detail
