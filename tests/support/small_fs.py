"""A small file system for a broker's data directory, filled and freed on demand.

`SmallFileSystem(path, size)` mounts a tmpfs of `size` bytes at `path` (root only:
`mount_refusal()` says why it cannot be, for a skip message). `fill()` writes a filler
file until the file system has no byte left, as a log or another program filling the
disk would; with `keep_full=True` a thread also tops the filler up whenever space
appears (the broker deleting a segment, giving its reserve back), until `free()`
removes the filler. `unmount()` (and leaving the `with` block) frees and unmounts;
the mount point stays.

Not here: what fills the disk inside the broker (its own data), the checks.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import threading

import pytest

FILLER = "filler"
_CHUNKS = (1 << 20, 64 << 10, 4 << 10, 512, 1)   # big writes first, then what is left


def mount_refusal() -> str | None:
    """Why a tmpfs cannot be mounted here (not root, no mount), or None."""
    if os.geteuid() != 0:
        return "mounting a small tmpfs for the data directory needs root"
    if shutil.which("mount") is None or shutil.which("umount") is None:
        return "mount/umount are not installed"
    return None


@contextlib.contextmanager
def small_disk(path: str, size: int):
    """A mounted SmallFileSystem for one test, unmounted after it; the test is skipped,
    naming why, where none can be mounted."""
    refusal = mount_refusal()
    if refusal:
        pytest.skip(refusal)
    with SmallFileSystem(path, size) as disk:
        yield disk


class SmallFileSystem:
    def __init__(self, path: str, size: int) -> None:
        self.path = path
        self.size = size
        self.mounted = False
        self._filling = threading.Event()   # set while the filler is kept topped up
        self._stopped = threading.Event()   # set by free(): the topper's wait ends
        self._topper: threading.Thread | None = None
        self._lock = threading.Lock()

    def mount(self) -> "SmallFileSystem":
        os.makedirs(self.path, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.size},mode=0755",
                        "tmpfs", self.path], check=True, capture_output=True)
        self.mounted = True
        return self

    def free_bytes(self) -> int:
        return shutil.disk_usage(self.path).free

    def fill(self, keep_full: bool = False) -> int:
        """Fill the file system to its last byte; the bytes written. `keep_full`: and
        keep it so, taking whatever the broker frees, until `free()`."""
        written = self._top_up()
        if keep_full and self._topper is None:
            self._filling.set()
            self._stopped.clear()
            self._topper = threading.Thread(target=self._keep_full, daemon=True,
                                            name=f"filler {self.path}")
            self._topper.start()
        return written

    def free(self) -> None:
        """Stop filling and remove the filler: the space is the broker's again."""
        self._filling.clear()
        self._stopped.set()
        if self._topper is not None:
            self._topper.join(10)
            self._topper = None
        with self._lock:
            try:
                os.remove(os.path.join(self.path, FILLER))
            except FileNotFoundError:
                pass

    def unmount(self) -> None:
        if not self.mounted:
            return
        self.free()
        result = subprocess.run(["umount", self.path], capture_output=True)
        if result.returncode != 0:  # still busy (a process not yet reaped): lazily
            subprocess.run(["umount", "-l", self.path], check=True, capture_output=True)
        self.mounted = False

    def __enter__(self) -> "SmallFileSystem":
        return self.mount()

    def __exit__(self, *exc) -> None:
        self.unmount()

    def _keep_full(self) -> None:
        while self._filling.is_set():
            self._top_up()
            self._stopped.wait(0.05)

    def _top_up(self) -> int:
        written = 0
        with self._lock:
            with open(os.path.join(self.path, FILLER), "ab", buffering=0) as handle:
                for chunk in _CHUNKS:
                    block = b"\0" * chunk
                    while True:
                        try:
                            written += handle.write(block)
                        except OSError as error:
                            if error.errno != errno.ENOSPC:
                                raise
                            break
        return written
