"""bench/many_clients.py without Java or a broker: the PerfTest flags of a shape, the
command line (checkouts and RabbitMQ as trees), and the table of medians and ranges
per tree and shape."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from bench.many_clients import RABBITMQ, parse_arguments, perftest_arguments, python_path, summary


def test_a_shape_is_perftest_on_one_quorum_queue_with_confirms_and_prefetch():
    assert perftest_arguments(10, 10, 30) == [
        "--quorum-queue", "--queue", "q", "-s", "1000", "-z", "30", "-x", "10", "-y", "10",
        "-c", "1000", "-q", "1000"]


def test_shapes_and_trees_are_parsed_and_bad_ones_refused(tmp_path):
    arguments = parse_arguments(["--shapes", "1x1,10x10", "--tree", f"A={tmp_path}",
                                 "--tree", "B=/x"])
    assert arguments.shape_list == [(1, 1), (10, 10)]
    assert arguments.trees == [("A", tmp_path), ("B", Path("/x"))]
    assert parse_arguments(["--tree", "R=rabbitmq"]).trees == [("R", RABBITMQ)]
    with pytest.raises(SystemExit):
        parse_arguments(["--shapes", "ten"])


def test_a_tree_is_imported_as_quorumqueue_from_a_directory_of_its_own(tmp_path, monkeypatch):
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # nothing left in /tmp
    holder = Path(python_path(tmp_path))
    assert holder.parent == tmp_path / "tmp"
    assert (holder / "quorumqueue").resolve() == tmp_path.resolve()
    assert python_path(tmp_path) == str(holder)  # the same link again


def test_the_table_gives_medians_and_ranges_per_tree_and_shape():
    rows = [{"tree": tree, "producers": shape, "consumers": shape, "receiving": rate,
             "cpu_us_per_message": cpu}
            for tree, shape, rate, cpu in (("A", 10, 100.0, 60.0), ("A", 10, 300.0, 70.0),
                                           ("A", 10, 200.0, 50.0), ("B", 1, 50.0, 40.0))]
    lines = summary(rows).splitlines()
    assert len(lines) == 3
    assert lines[1].split()[:3] == ["A", "10x10", "3"]
    assert "200 (100-300)" in lines[1] and "60.0 (50.0-70.0)" in lines[1]
    assert "50 (50-50)" in lines[2] and "40.0 (40.0-40.0)" in lines[2]
