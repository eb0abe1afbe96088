"""The idle-memory benchmark's pure parts: arguments, the per-object arithmetic and the
report (medians, spread, ratios pair by pair). No broker, no node, no timing."""

import pytest

from bench import idle_memory
from bench.idle_memory import IdleResult

KiB = 1024


def result(target: str, pair: int, per_connection_kib: float, per_queue_kib: float) -> IdleResult:
    start = 50 << 20
    connections = start + int(per_connection_kib * KiB * 1000)
    return IdleResult(target=target, pair=pair, connections=1000, queues=500, rss_start=start,
                      rss_connections=connections,
                      rss_queues=connections + int(per_queue_kib * KiB * 500), declare_s=1.0)


def test_growth_is_divided_by_the_objects_opened():
    measured = result("quorumqueue", 1, 6.0, 9.0)
    assert measured.per_connection == 6.0 * KiB
    assert measured.per_queue == 9.0 * KiB
    assert measured.as_json()["per_queue"] == 9.0 * KiB


def test_the_report_gives_medians_spread_and_ratios_pair_by_pair():
    results = [result("quorumqueue", 1, 6, 9), result("rabbitmq", 1, 100, 120),
               result("rabbitmq", 2, 90, 130), result("quorumqueue", 2, 7, 8),
               result("quorumqueue", 3, 5, 10), result("rabbitmq", 3, 110, 125)]
    lines = idle_memory.render(results)
    assert lines[2].split() == ["quorumqueue", "3", "6.0", "(5.0-7.0)", "9.0", "(8.0-10.0)"]
    assert lines[3].split() == ["rabbitmq", "3", "100.0", "(90.0-110.0)", "125.0", "(120.0-130.0)"]
    assert lines[5] == ("quorumqueue / rabbitmq: per connection 0.06x, per quorum queue 0.07x "
                        "(lower is less memory)")
    assert lines[6] == ("pair by pair: per connection 0.06x, 0.08x, 0.05x; "
                        "per queue 0.07x, 0.06x, 0.08x")


def test_one_broker_alone_has_no_ratio():
    lines = idle_memory.render([result("quorumqueue", 1, 6, 9)])
    assert len(lines) == 3 and "rabbitmq" not in "".join(lines)


@pytest.mark.parametrize("flag", ["--connections", "--queues", "--pairs"])
def test_counts_below_one_are_refused(flag, capsys):
    with pytest.raises(SystemExit):
        idle_memory.parse_arguments([flag, "0"])
    assert f"{flag} must be at least 1" in capsys.readouterr().err
