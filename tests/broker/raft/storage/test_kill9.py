"""A real kill -9: a writer process appends and flushes in a loop, printing each index
flush() reported durable; it is SIGKILLed at a random moment (rollovers, snapshots and
releases included), the store is reopened, and every printed index must be there with
its data. Three rounds on the same directory, so recovery also follows recovery."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from quorumqueue.broker.raft.storage import LogStore, StorageConfig

from .kill9_writer import GROUPS
from .support import payload

ROOT = Path(__file__).parents[4]


def test_sigkill_at_a_random_moment_loses_nothing_printed(tmp_path):
    directory = str(tmp_path)
    rng = random.Random()
    durable: dict[str, int] = {}
    for _round in range(3):
        child = subprocess.Popen(
            [sys.executable, "-m", "tests.broker.raft.storage.kill9_writer", directory],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            first = child.stdout.readline()          # running: at least one flush done
            assert first, child.stderr.read()
            time.sleep(rng.uniform(0.05, 0.6))
            os.kill(child.pid, signal.SIGKILL)
            rest, errors = child.communicate(timeout=30)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        assert child.returncode == -signal.SIGKILL, errors
        for line in (first + rest).splitlines():
            group, index = line.rsplit(" ", 1)
            durable[group] = max(durable.get(group, 0), int(index))
        store = LogStore(directory, StorageConfig(segment_max_entries=64))
        for group in GROUPS:
            last = store.last_index(group)
            assert last >= durable.get(group, 0), group
            first_index = store.first_index(group)
            for entry in store.entries(group, first_index, durable.get(group, 0) + 1):
                assert entry.data == payload(group, entry.index, 1, 1024)
            assert [e.index for e in store.entries(group, first_index, last + 1)] == \
                list(range(first_index, last + 1))
        store.close()
    assert sum(durable.values()) > 0
