"""The storage tests simulate process crashes (kill -9, crash images, cut files), whose
outcome depends on the page cache, not the medium: they run on tmpfs when the
machine has one, so a disk busy with other work does not slow them down."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

SCRATCH = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def scratch_dir() -> str:
    return tempfile.mkdtemp(prefix="qq-raft-storage-", dir=SCRATCH)


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    path = scratch_dir()
    try:
        yield Path(path)
    finally:
        shutil.rmtree(path, ignore_errors=True)
