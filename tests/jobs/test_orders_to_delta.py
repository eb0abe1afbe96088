"""The main job (`make main`) end to end, on a small workload.

It runs as the README runs it (`python -m quorumqueue.jobs.orders_to_delta`), with
30 orders in batches of 10 and the first driver killed after batch 1's Delta commit,
the analytics reading the broker's log at that point;
the job itself checks Delta against what it published, and exits 1 on any mismatch.
The test reads what the job reports and checks it leaves no process behind.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(900)


def processes_naming(path) -> list[str]:
    """Processes whose command line names `path` (the broker's data directory and the
    driver's table are under it)."""
    listing = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True)
    return [line for line in listing.stdout.splitlines() if str(path) in line]


def test_the_main_job_lands_every_order_in_delta_exactly_once(tmp_path):
    job = subprocess.run(
        [sys.executable, "-m", "quorumqueue.jobs.orders_to_delta", "--orders", "30",
         "--per-batch", "10", "--kill-at", "after-sink-commit:1", "--workdir", str(tmp_path)],
        capture_output=True, text=True, timeout=840)
    out = job.stdout
    assert job.returncode == 0, out + job.stderr[-3000:]
    assert "published 30 | rows in Delta 30 | distinct message_id 30 | duplicates 0 | " \
           "missing 0" in out
    killed = re.search(r"SIGKILLed the driver at after-sink-commit:1: offset log \[0, 1\], "
                       r"commit log \[0\], 2 Delta commit\(s\)", out)
    assert killed, out
    assert "queue 'orders': 0 ready, 0 unacked" in out
    # the exactly-once moment, said where it happens: batch 1 runs again, Delta skips it
    assert re.search(r"batch 1: \d+ orders, .* <- batch 1 again: the killed driver's last "
                     r"batch, replayed with the same offsets; Delta already had it", out), out
    assert re.search(r"Delta history: v0 WRITE \(\+10\), v1 WRITE \(\+10\), v2 WRITE \(\+10\)$",
                     out, re.MULTILINE), out
    # both analytics jobs ran once over the broker's log, into Delta, after the kill:
    # the job's broker rolls its WAL over past 8 KiB, so 30 orders of ~500 bytes have
    # reached segment files, and 20 are live (10 ready, 10 in the dead driver's lease)
    assert "mid-way: queue 10 ready, 10 unacked" in out, out
    assert re.search(r"queue 'orders' \(vhost '/'\): [1-9]\d* segment files, [\d.]+ KiB, of "
                     r"which [\d.]+ (B|KiB) \([1-9]\d*%\) is settled messages", out), out
    assert "1 quorum queues, 20 messages" in out, out
    assert (tmp_path / "analytics" / "memory_footprint" / "queues" / "_delta_log").is_dir()
    assert processes_naming(tmp_path) == []


def test_a_temporary_working_directory_keeps_the_delta_tables_for_the_user(tmp_path):
    """make main without --workdir: the broker's data and the checkpoint go, the Delta
    tables stay where the job says (before, the whole directory was removed)."""
    from quorumqueue.jobs.orders_to_delta import clean_up

    for name in ("broker/wal", "checkpoint/offsets", "orders_delta/_delta_log",
                 "analytics/memory_footprint/queues/_delta_log", "driver"):
        (tmp_path / name).mkdir(parents=True)
    (tmp_path / "driver.log").write_text("x")
    assert clean_up(tmp_path) == tmp_path / "orders_delta"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["analytics", "orders_delta"]
    assert (tmp_path / "orders_delta" / "_delta_log").is_dir()


def test_the_replayed_batch_is_named_with_what_delta_does_with_it():
    from quorumqueue.jobs.orders_to_delta import replayed_batches

    # killed after batch 1's Delta commit (versions 0 and 1), before its commit log
    assert replayed_batches([0, 1], [0], delta_versions=2) == {1: True}
    # killed before batch 1's Delta commit: the restart writes it
    assert replayed_batches([0, 1], [0], delta_versions=1) == {1: False}
    assert replayed_batches([0, 1], [0, 1], delta_versions=2) == {}
