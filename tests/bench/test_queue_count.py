"""bench/queue_count.py's table, without a broker: per-operation figures from a
loader's result, the idle CPU as a share of a core, and a side whose broker refused
a declare (its later rows are missing, the failure is said)."""

from __future__ import annotations

from bench.queue_count import TARGETS, report, rows


def result(blocks: int, failed: dict | None = None) -> dict:
    found = {"declare": [{"first": 1 + 10 * n, "last": 10 * (n + 1), "operations": 10,
                          "seconds": 0.2, "cpu": 0.05} for n in range(blocks)],
             "idle": {"seconds": 30.0, "cpu": 0.6}, "publish": [0.004, 0.002, 0.009],
             "get": [0.001], "delete": [{"first": 1, "last": 10, "operations": 10,
                                         "seconds": 0.1, "cpu": 0.02}]}
    if failed:
        found["failed"] = failed
    return found


def test_rows_are_per_operation_and_idle_is_a_share_of_a_core():
    found = rows(result(2))
    assert found["declare 11-20"] == (20.0, 5.0)
    assert found["idle CPU %"] == (30.0, 2.0)
    assert found["publish+confirm"] == (4.0, 0.0)
    assert found["delete 1-10"] == (10.0, 2.0)


def test_a_refused_declare_leaves_its_rows_out_and_is_reported():
    table = report([{"quorumqueue": result(2),
                     "rabbitmq": result(1, {"declared": 13, "error": "541 cluster_not_formed"})}],
                   [3.0, 4.0], TARGETS)
    line = next(line for line in table.splitlines() if line.startswith("declare 11-20"))
    assert line.rstrip().endswith("-")
    assert ("pair 1 rabbitmq: declare 14 failed (541 cluster_not_formed); the later "
            "phases ran with 13 queues") in table


def test_a_cluster_s_idle_phase_gives_each_node_s_share_besides_the_sum():
    found = result(1)
    found["idle"]["per_node"] = [0.3, 0.15, 0.15]
    assert rows(found)["idle CPU %"] == (30.0, 2.0)
    assert [rows(found)[f"idle node {n} %"] for n in (1, 2, 3)] == [
        (30.0, 1.0), (30.0, 0.5), (30.0, 0.5)]
    assert "idle node 1 %" not in rows(result(1))       # one node: the sum alone
