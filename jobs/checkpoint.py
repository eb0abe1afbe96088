"""What a streaming query's checkpoint says, and settling its last committed batch.

Responsibilities
    - `logged_batches`, `committed_batches`: the batch ids in Spark's offset log
      (`offsets/N`: batch N was planned) and commit log (`commits/N`: its sink
      commit finished).
    - `source_offset`: the quorumqueue offset a logged batch ends at.
    - `settle_committed`: settle the lease up to the end of the last committed batch.

How it works
    Spark settles batch N-1 (`source.commit`) only when it plans batch N, so when a
    query stops, its last committed batch is still held by the query's lease (neither
    ready nor gone: a restart would settle it). A job that stops for good calls
    `settle_committed`, which does what the next batch would have done: read the end
    offset of the last batch in the commit log and settle the lease up to it.

    Log files are `v1`, a JSON metadata line, then (offset log) one line per source.

Invariants
    - Only a batch in the commit log is settled: its rows are in the sink.
    - Settling is idempotent (the broker ignores a settle at or below the lease's
      first unsettled sequence), so running it twice, or before a restart, is safe.

Not here
    Reading the sink (the job does that with Spark).
"""

from __future__ import annotations

import json
from pathlib import Path

from ..client.lease_client import LeaseClient
from ..connector.offsets import LeaseOffset


class CheckpointError(RuntimeError):
    """The checkpoint is not what a quorumqueue query writes."""


def _batch_ids(folder: Path) -> list[int]:
    if not folder.is_dir():
        return []
    return sorted(int(path.name) for path in folder.iterdir() if path.name.isdigit())


def logged_batches(checkpoint: Path) -> list[int]:
    return _batch_ids(checkpoint / "offsets")


def committed_batches(checkpoint: Path) -> list[int]:
    return _batch_ids(checkpoint / "commits")


def source_offset(checkpoint: Path, batch_id: int, source: int = 0) -> LeaseOffset:
    """The end offset of `batch_id` for the query's `source`-th source."""
    path = checkpoint / "offsets" / str(batch_id)
    lines = path.read_text().splitlines()
    if len(lines) < 3 + source or lines[0] != "v1":
        raise CheckpointError(f"{path} is not a Spark offset log entry with {source + 1} "
                              "source(s)")
    return LeaseOffset.from_json(json.loads(lines[2 + source]))


def settle_committed(checkpoint: Path, uri: str) -> LeaseOffset | None:
    """Settle the query's lease up to the end of its last committed batch; returns that
    offset (None: nothing committed yet)."""
    committed = committed_batches(checkpoint)
    if not committed:
        return None
    end = source_offset(checkpoint, committed[-1])
    with LeaseClient(uri) as client:
        for queue, seq in end.positions:
            if seq > 0:
                client.settle(queue, end.lease, seq)
    return end
