"""The collection PySpark runs after every task of a reused Python worker visits only
what the tasks allocated, not every imported module's objects (connector/worker_gc.py).

Checked in a fresh interpreter holding what an executor's Python worker holds after
its first task: PySpark's worker and the connector's source and sink imported.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap


def test_a_workers_first_task_takes_its_imports_out_of_later_collections_once():
    script = textwrap.dedent("""
        import gc, json
        import pyspark.worker
        import quorumqueue.connector.source, quorumqueue.connector.sink
        from quorumqueue.connector import worker_gc

        before = len(gc.get_objects())   # what a collection visits
        worker_gc.freeze_once()          # the first task's read or write
        after_first = len(gc.get_objects())
        frozen = gc.get_freeze_count()
        kept = [[n] for n in range(5_000)]   # a later task's objects
        worker_gc.freeze_once()          # the next task's
        print(json.dumps({"before": before, "after_first": after_first, "frozen": frozen,
                          "frozen_later": gc.get_freeze_count(),
                          "visited_later": len(gc.get_objects())}))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["before"] > 20_000      # the imports: what every collection visited
    assert seen["after_first"] < 1_000
    assert seen["frozen"] >= seen["before"] - seen["after_first"]
    # the later task's objects stay collectable: no second freeze took them
    assert seen["frozen_later"] == seen["frozen"]
    assert seen["visited_later"] >= 5_000
