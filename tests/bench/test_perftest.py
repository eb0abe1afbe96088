"""PerfTest's output parser and command line (bench/perftest.py); pure, no broker, no Java.

The sample output is PerfTest 2.22.1's, as printed by a run against the bundled broker.
"""

import pytest

from bench import perftest

SAMPLE = """\
id: test-183602-686, starting consumer #0
id: test-183602-686, starting producer #0
id: test-183602-686, time 1.023 s, sent: 8761 msg/s, confirmed: 7783 msg/s, nacked: 0 msg/s, received: 7779 msg/s, min/median/75th/95th/99th consumer latency: 16459/69324/89220/129450/178342 µs, confirm latency: 6974/58065/73406/109905/115064 µs
id: test-183602-686, time 2.007 s, sent: 8997 msg/s, confirmed: 9098 msg/s, nacked: 0 msg/s, received: 9103 msg/s, min/median/75th/95th/99th consumer latency: 10794/75788/94752/123115/151456 µs, confirm latency: 12241/64938/82337/106069/118193 µs
test stopped (Reached time limit)
id: test-183602-686, sending rate avg: 11273 msg/s
id: test-183602-686, receiving rate avg: 11270 msg/s
id: test-183602-686, consumer latency min/median/75th/95th/99th 13420/57657/78161/114255/135515 µs
id: test-183602-686, confirm latency min/median/75th/95th/99th 7167/50453/67565/109301/130798 µs
"""


def test_summary_gives_whole_run_rates_and_consumer_latency_not_the_per_second_lines() -> None:
    summary = perftest.parse_summary(SAMPLE)
    assert summary.sending == 11273
    assert summary.receiving == 11270
    assert summary.latency_us == {"min": 13420, "median": 57657, "75th": 78161,
                                  "95th": 114255, "99th": 135515}


def test_latency_in_milliseconds_is_converted_to_microseconds() -> None:
    output = SAMPLE.replace("13420/57657/78161/114255/135515 µs", "13/57/78/114/135 ms")
    assert perftest.parse_summary(output).latency_us["99th"] == 135_000


@pytest.mark.parametrize("dropped, named", [
    ("sending rate avg", "sending"),
    ("receiving rate avg", "receiving"),
    ("consumer latency min/median", "consumer latency"),
])
def test_missing_summary_line_is_named(dropped: str, named: str) -> None:
    output = "\n".join(line for line in SAMPLE.splitlines() if dropped not in line)
    with pytest.raises(ValueError, match=named):
        perftest.parse_summary(output)


def test_failed_run_without_summary_is_an_error() -> None:
    with pytest.raises(ValueError, match="sending, receiving, consumer latency"):
        perftest.parse_summary("Main thread caught exception: java.net.ConnectException: Connection refused\n")


def test_many_queues_use_the_queue_pattern_with_one_producer_and_consumer_each() -> None:
    command = perftest.perftest_command("amqp://h", perftest.SCENARIOS["10q-1kb"], 7, "run")
    assert command[command.index("--queue-pattern") + 1] == "run-%d"
    assert command[command.index("--queue-pattern-to") + 1] == "10"
    assert command[command.index("--producers") + 1] == "10"
    assert command[command.index("--consumers") + 1] == "10"
    assert command[command.index("--queue-args") + 1] == "x-queue-type=quorum"
    assert "--queue" not in command


def test_one_queue_is_named_and_flags_match_the_quorum_workload() -> None:
    command = perftest.perftest_command("amqp://h", perftest.SCENARIOS["1q-64kb"], 7, "run")
    assert command[command.index("--queue") + 1] == "run-1"
    assert command[command.index("--size") + 1] == "65536"
    assert command[command.index("--time") + 1] == "7"
    assert command[command.index("--flag") + 1] == "persistent"
    assert command[command.index("--confirm") + 1] == "1000"
    assert command[command.index("--qos") + 1] == "1000"


def test_arguments_select_scenarios_and_refuse_unknown_ones() -> None:
    assert [s.name for s in perftest.parse_arguments([]).scenario_list] == list(perftest.QUICK)
    assert len(perftest.parse_arguments(["--scenarios", "all"]).scenario_list) == len(perftest.SCENARIOS)
    assert perftest.parse_arguments(["--nodes", "1,3"]).node_list == [1, 3]
    with pytest.raises(SystemExit):
        perftest.parse_arguments(["--scenarios", "2q-1kb"])
    with pytest.raises(SystemExit):
        perftest.parse_arguments(["--nodes", "0"])
