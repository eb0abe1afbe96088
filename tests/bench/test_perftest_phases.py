"""bench/perftest_phases.py: PerfTest's summary read per phase, without Java."""

import pytest

from bench.perftest_phases import phase_command, phase_rate, table

PUBLISHED = """id: test-114527-067, starting producer #0
id: test-114527-067, time 1.000 s, sent: 17700 msg/s, confirmed: 17360 msg/s, nacked: 0 msg/s
test stopped (Producer reached message limit)
id: test-114527-067, sending rate avg: 14970 msg/s
id: test-114527-067, receiving rate avg: 0 msg/s
id: test-114527-067, confirm latency min/median/75th/95th/99th 2898/16064/21609/46332/63153 µs
"""
CONSUMED = """id: test-114529-322, starting consumer #0
test stopped (Consumer reached message limit)
id: test-114529-322, sending rate avg: 0 msg/s
id: test-114529-322, receiving rate avg: 33277 msg/s
id: test-114529-322, consumer latency min/median/75th/95th/99th 0/0/0/0/0 µs
"""


def test_each_phase_reads_its_own_direction():
    assert phase_rate(PUBLISHED, "publish") == 14970
    assert phase_rate(CONSUMED, "consume") == 33277


def test_a_run_that_did_not_finish_or_moved_nothing_is_an_error():
    with pytest.raises(ValueError, match="receiving"):
        phase_rate(PUBLISHED, "consume")
    with pytest.raises(ValueError, match="sending"):
        phase_rate(PUBLISHED.replace("test stopped (Producer reached message limit)\n", ""),
                   "publish")


def test_the_consume_phase_drains_the_queue_the_publish_phase_filled():
    publish = phase_command("amqp://x", "q1", "publish", 500, 1024)
    consume = phase_command("amqp://x", "q1", "consume", 500, 1024)
    assert publish[publish.index("--pmessages") + 1] == "500"
    assert publish[publish.index("--consumers") + 1] == "0"
    assert consume[consume.index("--cmessages") + 1] == "500"
    assert consume[consume.index("--producers") + 1] == "0"
    assert "--predeclared" in consume and consume[consume.index("--queue") + 1] == "q1"


def test_the_table_gives_the_ratio_of_each_pair():
    rows = [{"nodes": 1, "target": "quorumqueue", "phase": "publish", "median": 30.0,
             "runs": [30.0, 20.0, 40.0]},
            {"nodes": 1, "target": "rabbitmq", "phase": "publish", "median": 20.0,
             "runs": [20.0, 20.0, 20.0]}]
    line = table(rows).splitlines()[1]
    assert "1.50x (1.00-2.00x)" in line
