"""bench/loop_lag.py's reading of the node's lag histogram, without a broker: the
samples of a phase from two scrapes, how many lay above 10, 50 and 100 ms, and the
highest bucket a sample reached."""

from __future__ import annotations

import pytest

from bench.loop_lag import lag_between, parse_arguments

BOUNDS = ("0.001", "0.01", "0.05", "0.1", "1.0", "+Inf")


def scrape(counts: list[int], largest: float) -> dict:
    """A scrape whose buckets hold `counts` (per bucket, not cumulative)."""
    running, buckets = 0, {}
    for bound, count in zip(BOUNDS, counts):
        running += count
        buckets[bound] = running
    return {"buckets": buckets, "count": running, "max": largest}


def test_a_phase_is_what_two_scrapes_differ_by():
    before = scrape([100, 5, 0, 0, 1, 0], 0.4)      # a stall before the phase...
    after = scrape([300, 9, 2, 1, 1, 0], 0.4)       # ...is not the phase's
    phase = lag_between(before, after)
    assert phase == {"samples": 207, "over_10ms": 3, "over_50ms": 1, "over_100ms": 0,
                     "worst_le_s": "0.1", "max_so_far_s": 0.4}


def test_a_phase_without_samples_reached_no_bucket():
    same = scrape([10, 0, 0, 0, 0, 0], 0.0)
    assert lag_between(same, same)["worst_le_s"] == "0.001"


def test_unknown_runs_are_refused():
    with pytest.raises(SystemExit):
        parse_arguments(["--runs", "backlog,nope"])
    assert parse_arguments(["--runs", "big"]).run_list == ["big"]
