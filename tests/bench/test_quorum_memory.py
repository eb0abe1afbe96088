"""The memory benchmark's pure parts: arguments, parsers of /proc and rabbitmqctl output,
the bytes-per-message arithmetic and the report. No broker, no node, no timing.

The /proc/<pid>/status format is proc(5)'s; the rabbitmqctl output is that of
`list_queues --quiet --no-table-headers` (tab-separated) and `eval` (the term printed).
"""

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench import quorum_memory
from bench.broker_memory import (
    LogMemory,
    ProbeError,
    parse_eval_integer,
    parse_list_queues,
    parse_vm_rss,
    quorumqueue_log_memory,
    rabbitmqctl_environment,
)
from bench.quorum_memory import MemoryResult, SettleRule

MiB = 1 << 20

STATUS = """\
Name:\tbeam.smp
State:\tS (sleeping)
VmPeak:\t 4101224 kB
VmRSS:\t  162512 kB
RssAnon:\t  120000 kB
Threads:\t30
"""


def result(target: str, rss_growth: int, memtable_growth: int, messages: int = 1_000_000) -> MemoryResult:
    return MemoryResult(
        target=target,
        messages=messages,
        size=16,
        rss_before=100 * MiB,
        rss_after=100 * MiB + rss_growth,
        log_before=LogMemory(memtable_bytes=1000, queue_bytes=0),
        log_after=LogMemory(memtable_bytes=1000 + memtable_growth, queue_bytes=12 * messages),
        publish_s=25.0,
    )


def test_defaults_are_the_issue_s_shape() -> None:
    arguments = quorum_memory.parse_arguments([])
    assert (arguments.messages, arguments.size, arguments.inflight, arguments.target) == (1_000_000, 16, 1000, "both")


@pytest.mark.parametrize(
    "argv",
    [["--messages", "0"], ["--size", "4"], ["--inflight", "0"], ["--wal-max-size", "0"], ["--settle-timeout", "-1"]],
)
def test_impossible_settings_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        quorum_memory.parse_arguments(argv)


def test_vm_rss_is_read_in_bytes() -> None:
    assert parse_vm_rss(STATUS) == 162512 * 1024


def test_a_status_without_vm_rss_is_an_error() -> None:
    with pytest.raises(ProbeError, match="VmRSS"):
        parse_vm_rss("Name:\tkthreadd\nState:\tS (sleeping)\n")


def test_list_queues_row_of_the_queue() -> None:
    output = "other\t9999\nbench-memory-1a2b\t176500\n"
    assert parse_list_queues(output, "bench-memory-1a2b") == 176500
    with pytest.raises(ProbeError, match="does not list"):
        parse_list_queues(output, "missing")


def test_eval_prints_one_integer() -> None:
    assert parse_eval_integer("1118584\n") == 1118584
    with pytest.raises(ProbeError, match="integer"):
        parse_eval_integer("{badrpc,nodedown}\n")


def test_queues_list_row_gives_memtables_and_state() -> None:
    rows = [
        {"name": "classic-one", "type": "classic", "ready": 3, "unacked": 0},
        {"name": "q", "type": "quorum", "ready": 990, "unacked": 10, "memtable_bytes": 123456, "state_bytes": 12000},
    ]
    assert quorumqueue_log_memory(rows, "q") == LogMemory(memtable_bytes=123456, queue_bytes=12000)
    with pytest.raises(ProbeError, match="not a quorum queue"):
        quorumqueue_log_memory(rows, "classic-one")
    with pytest.raises(ProbeError, match="0 rows"):
        quorumqueue_log_memory(rows, "gone")


def test_rabbitmqctl_reaches_the_private_node_only() -> None:
    node = SimpleNamespace(node_name="qqoracle-1234@localhost", base_dir=Path("/tmp/qqoracle-x"), epmd_port=4370)
    environment = rabbitmqctl_environment(node)  # type: ignore[arg-type]
    assert environment["HOME"] == "/tmp/qqoracle-x/home"  # the node's .erlang.cookie
    assert environment["ERL_EPMD_PORT"] == "4370"
    assert environment["RABBITMQ_NODENAME"] == "qqoracle-1234@localhost"
    assert environment["RABBITMQ_CONF_ENV_FILE"] == "/tmp/qqoracle-x/rabbitmq-env.conf"  # not /etc/rabbitmq's
    assert environment["QQ_ORACLE_NODE"] == "qqoracle-1234@localhost"  # stop() finds a hung CLI


@pytest.mark.parametrize(
    ("readings", "settled"),
    [
        ([100 * MiB], False),
        ([100 * MiB, 101 * MiB, 101 * MiB, 101 * MiB], False),  # 4 readings, but spread > 1 MiB
        ([90 * MiB, 101 * MiB, 101 * MiB, 101 * MiB + 5, 101 * MiB + 9], True),
    ],
)
def test_rss_settles_when_the_last_readings_agree(readings: list[int], settled: bool) -> None:
    assert SettleRule(window=4, tolerance=MiB - 1).settled(readings) is settled


def test_bytes_per_message_subtracts_the_memtables() -> None:
    measured = result("quorumqueue", rss_growth=300_000_000, memtable_growth=280_000_000)
    assert measured.rss_growth == 300_000_000
    assert measured.memtable_growth == 280_000_000
    assert measured.bytes_per_message == 20.0
    assert measured.queue_bytes_per_message == 12.0
    assert measured.as_json()["bytes_per_message"] == 20.0


def test_table_has_one_line_per_target() -> None:
    table = quorum_memory.render_table(
        [result("quorumqueue", 300_000_000, 280_000_000), result("rabbitmq", 900_000_000, 700_000_000)]
    )
    lines = table.splitlines()
    assert len(lines) == 4
    assert lines[2].split() == ["quorumqueue", "1,000,000", "100.0", "386.1", "286.1", "267.0", "300.0", "20.0", "12.0"]
    assert lines[3].split()[0] == "rabbitmq" and lines[3].split()[-2] == "200.0"


@pytest.mark.parametrize(
    ("rss_growth", "verdict"),
    [
        (20_000_000, "meets the <= 32 B goal"),
        (50_000_000, "meets the <= 64 B target, not the <= 32 B goal"),
        (65_000_000, "MISSES the <= 64 B target"),
    ],
)
def test_verdict_judges_quorumqueue_against_target_and_goal(rss_growth: int, verdict: str) -> None:
    lines = quorum_memory.render_verdict(
        [result("quorumqueue", rss_growth, 0), result("rabbitmq", 200_000_000, 100_000_000)]
    )
    assert lines[0] == f"quorumqueue / rabbitmq bytes per message: {rss_growth / 100_000_000:.2f}x"
    assert lines[1].endswith(f"({verdict})")


def test_no_ratio_without_rabbitmq() -> None:
    lines = quorum_memory.render_verdict([result("quorumqueue", 20_000_000, 0)])
    assert lines == ["quorumqueue: 20.0 B per queued message (meets the <= 32 B goal)"]


def test_a_negative_figure_is_reported_as_no_figure_not_as_meeting_the_goal() -> None:
    lines = quorum_memory.render_verdict(
        [result("quorumqueue", 219_000_000, 232_000_000), result("rabbitmq", 612_000_000, 541_000_000)]
    )
    assert len(lines) == 1
    assert lines[0].startswith("quorumqueue: NO FIGURE - its memtables grew by more than its RSS (by 13.0 B")


def test_bodies_are_judged_only_once_they_outgrow_the_wal() -> None:
    """RSS growth against the bytes of 1 KB bodies: well below them is 'read from the
    log'; at or above them 'held'; no judgement while the WAL's memory tables may hold
    them all."""
    def of(target: str, rss_growth: int) -> MemoryResult:
        return replace(result(target, rss_growth, 0), size=1024)

    read = of("quorumqueue", 100 * MiB)  # 1,000,000 x 1 KB = 976.6 MiB of bodies
    held = of("rabbitmq", 1200 * MiB)
    assert quorum_memory.render_bodies([read, held], wal_max_size=64 * MiB) == [
        "quorumqueue: RSS grew 100.0 MiB for 976.6 MiB of bodies (0.10 of them); bodies are "
        "read from the log, not held",
        "rabbitmq: RSS grew 1,200.0 MiB for 976.6 MiB of bodies (1.23 of them); BODIES HELD in "
        "memory"]
    assert quorum_memory.render_bodies([read], wal_max_size=None) == [
        "quorumqueue: RSS grew 100.0 MiB for 976.6 MiB of bodies (0.10 of them)"]
