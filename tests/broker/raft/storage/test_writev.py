"""WAL records go to the file by writev (layout.writev_all, WalFile.write): the kernel
copies them on the writer thread without the GIL, and no joined copy is made. A short
write (a file system nearly full) is continued where it stopped, as write_all does."""

from __future__ import annotations

import os
import random

from quorumqueue.broker.raft.storage import layout


def test_short_writes_are_continued_and_the_file_holds_every_buffer_in_order(
        tmp_path, monkeypatch):
    real = os.writev
    rng = random.Random(7)

    def short(fd, buffers):
        data = b"".join(bytes(b) for b in buffers)
        return real(fd, [data[:rng.randint(1, len(data))]]) if data else 0

    monkeypatch.setattr(os, "writev", short)
    for trial in range(100):
        buffers = [rng.randbytes(rng.randint(0, 40)) for _ in range(rng.randint(0, 2500))]
        path = tmp_path / f"f{trial}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT)
        try:
            assert layout.writev_all(fd, buffers) == sum(map(len, buffers))
        finally:
            os.close(fd)
        assert path.read_bytes() == b"".join(buffers)
