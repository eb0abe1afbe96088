"""`quorumqueue jobs run|schedule`: settings from conf/jobs/*.toml and options, errors
that name what to fix, a schedule that survives a failed run, and one real run of the
command line in its own process."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pika
import pytest
from click.testing import CliRunner

from quorumqueue.cli.main import main
from quorumqueue.jobs.cli import JobSettings, load_job_settings, schedule
from tests.support.broker import BrokerProcess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> str:
    with BrokerProcess() as broker:
        connection = pika.BlockingConnection(pika.URLParameters(broker.uri))
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("jobs-q", durable=True, arguments={"x-queue-type": "quorum"})
        for number in range(50):
            channel.basic_publish("", "jobs-q", b"%d" % number,
                                  pika.BasicProperties(delivery_mode=2))
        connection.close()
        broker.stop()
        yield broker.data_dir


def test_settings_come_from_the_toml_then_the_options(tmp_path, data_dir):
    config = tmp_path / "job.toml"
    broker_toml = tmp_path / "broker.toml"
    broker_toml.write_text("[raft]\nsegment_max_entries = 128\nwal_max_size_bytes = 1048576\n")
    config.write_text(f'data_dir = "{data_dir}"\nout = "a"\nbroker_config = "{broker_toml}"\n'
                      'every = "30s"\n')
    settings = load_job_settings("segment_compaction", str(config), out="b")
    assert (settings.out, settings.segment_max_entries, settings.wal_max_size_bytes,
            settings.every_s, settings.table_format) == ("b", 128, 1048576, 30.0, "delta")


@pytest.mark.parametrize("arguments, message", [
    (["run", "nope"], "'nope' is not one of 'segment_compaction', 'memory_footprint'"),
    (["run", "memory_footprint", "--out", "x"], "needs data-dir: pass --data-dir"),
    (["run", "memory_footprint", "--data-dir", "/nowhere", "--out", "x"],
     "data_dir /nowhere holds no quorum-queue log"),
    (["schedule", "--every", "soon", "--data-dir", "{data}", "--out", "x"],
     "--every 'soon' is not an interval: write e.g. 30s, 15m"),
])
def test_bad_arguments_are_named_before_spark_starts(arguments, message, data_dir, tmp_path):
    arguments = [a.replace("{data}", data_dir) for a in arguments]
    runner = CliRunner()
    with runner.isolated_filesystem(temp_dir=tmp_path):   # no conf/jobs/*.toml here
        result = runner.invoke(main, ["jobs", *arguments])
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_an_unknown_key_in_the_toml_is_named(tmp_path, data_dir):
    config = tmp_path / "job.toml"
    config.write_text(f'data_dir = "{data_dir}"\nout = "x"\nevry = "1m"\n')
    result = CliRunner().invoke(main, ["jobs", "run", "memory_footprint", "--config",
                                       str(config)])
    assert result.exit_code == 2 and "unknown key(s) evry" in result.output


def test_a_schedule_survives_a_failed_run_and_appends_each_round(spark, data_dir, tmp_path):
    good = JobSettings("memory_footprint", data_dir, str(tmp_path), "n1", 4096, 1 << 29,
                       "parquet", 0.01)
    broken = JobSettings("segment_compaction", str(tmp_path / "gone"), str(tmp_path), None,
                         4096, 1 << 29, "parquet", 0.01)
    failures = schedule(spark, [broken, good], 0.01, threading.Event(), runs=2)
    assert failures == 2
    table = spark.read.parquet(str(tmp_path / "memory_footprint" / "queues"))
    assert table.count() == 2 and {r["messages"] for r in table.collect()} == {50}


def test_the_command_line_runs_a_job_in_its_own_process(data_dir, tmp_path):
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    result = subprocess.run(
        [sys.executable, "-m", "quorumqueue.cli", "jobs", "run", "memory_footprint",
         "--data-dir", data_dir, "--out", str(tmp_path), "--node", "n1", "--format",
         "parquet"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "queue 'jobs-q' (vhost '/'): 50 messages" in result.stdout
    # progress: stderr is a pipe, so one plain line per stage (among Spark's own
    # lines); stdout is the report alone
    steps = [line for line in result.stderr.splitlines()
             if line.startswith("memory_footprint: ")]
    assert steps == ["memory_footprint: 1/3 queues computed",
                     "memory_footprint: 2/3 node computed",
                     "memory_footprint: 3/3 tables and report written"], result.stderr[-3000:]
    assert "memory_footprint: " not in result.stdout and "\x1b[" not in result.stdout
    assert os.listdir(tmp_path / "memory_footprint" / "reports")
