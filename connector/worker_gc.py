"""The collections a reused Spark Python worker runs between tasks, made cheap.

Why
    PySpark's daemon runs a full garbage collection after every task of a reused
    worker (pyspark/daemon.py: `gc.collect()` between two `worker(...)` calls). A full
    collection visits every object the collector tracks, and after its first task a
    worker holds the objects of everything imported: PySpark's, pyarrow's, numpy's and
    the connector's modules, about 56,000 of them. Each collection took 29 ms of CPU,
    about 1.4 us per message at the source's 20,000 messages a partition, and a third
    of the workers' samples under Spark (bench/README.md, "2026-12-03 (night): the
    collection between tasks").

How it works
    `freeze_once()`, called at the start of each executor-side read or write, moves
    the objects alive at a worker process's first task into the collector's permanent
    generation (`gc.freeze`, made for long-lived processes like this one), once per
    process. Later collections visit only what later tasks allocated, which the
    collector frees as before.

Invariants
    - At most one freeze per process (a forked child inherits the parent's state).
    - Only objects alive at that moment are frozen: the modules, and the first task's
      own few objects. A cycle among those is never collected; one task's worth, once
      per process.

Not here
    What the tasks do (lease_reader.py, consume_reader.py, batch_reader.py, sink.py).
"""

from __future__ import annotations

import gc

_frozen = False


def freeze_once() -> None:
    """Freeze what the collector tracks now, the first time in this process."""
    global _frozen
    if not _frozen:
        _frozen = True
        gc.freeze()
