"""`quorumqueue jobs`: run the analytics jobs once, or on a schedule.

    quorumqueue jobs run segment_compaction --data-dir DIR --out DIR
    quorumqueue jobs run memory_footprint --config conf/jobs/memory_footprint.toml
    quorumqueue jobs schedule --every 15m [segment_compaction memory_footprint]

Settings come from conf/jobs/<job>.toml (keys below), and options override them:
    data_dir       the broker's --data-dir (required)
    out            where the Delta tables and reports go (required)
    node           the node name in the tables (default: the data directory's name)
    broker_config  the node's broker.toml: `raft.segment_max_entries` and
                   `raft.wal_max_size_bytes` are read from it (default: the broker's
                   defaults, 4096 and 512 MiB)
    format         the tables' format (default "delta")
    every          the schedule's interval (`jobs schedule`), e.g. "15m", "1h"

The schedule keeps running until SIGTERM/SIGINT; a failed run is logged with its error
and the next runs go on. Every run logs one line per job to stderr. `jobs run` also
shows its progress on stderr, one step per stage (each table computed, then the
tables and report written): a bar on a terminal, `JOB: n/total STAGE` lines
otherwise; stdout is the report alone.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import tomllib
from dataclasses import dataclass

import click

JOBS = ("segment_compaction", "memory_footprint")
KEYS = ("data_dir", "out", "node", "broker_config", "format", "every")
CONF_DIR = "conf/jobs"
log = logging.getLogger("quorumqueue.jobs")


class JobConfigError(click.UsageError):
    pass


@dataclass(frozen=True)
class JobSettings:
    job: str
    data_dir: str
    out: str
    node: str | None
    segment_max_entries: int
    wal_max_size_bytes: int
    table_format: str
    every_s: float


def load_job_settings(job: str, config_path: str | None, **overrides) -> JobSettings:
    """The job's settings: its TOML file (given, or conf/jobs/<job>.toml when that
    exists), then the non-empty overrides. Unknown keys and missing ones are named."""
    if job not in JOBS:
        raise JobConfigError(f"unknown job '{job}'; the jobs are {', '.join(JOBS)}")
    values: dict = {}
    path = config_path or os.path.join(CONF_DIR, f"{job}.toml")
    if config_path or os.path.exists(path):
        try:
            with open(path, "rb") as handle:
                values = tomllib.load(handle)
        except (OSError, tomllib.TOMLDecodeError) as error:
            raise JobConfigError(f"cannot read job settings {path}: {error}") from None
        unknown = sorted(set(values) - set(KEYS))
        if unknown:
            raise JobConfigError(f"{path}: unknown key(s) {', '.join(unknown)}; "
                                 f"the keys are {', '.join(KEYS)}")
    values |= {key: value for key, value in overrides.items() if value is not None}
    for key in ("data_dir", "out"):
        if not values.get(key):
            raise JobConfigError(f"job '{job}' needs {key.replace('_', '-')}: pass "
                                 f"--{key.replace('_', '-')} or set {key} in {path}")
    if not os.path.isdir(os.path.join(str(values["data_dir"]), "quorum", "wal")):
        raise JobConfigError(f"data_dir {values['data_dir']} holds no quorum-queue log "
                             "(no quorum/wal/): pass the broker's --data-dir")
    segment_max_entries, wal_max = _broker_storage(values.get("broker_config"))
    return JobSettings(job, str(values["data_dir"]), str(values["out"]), values.get("node"),
                       segment_max_entries, wal_max, str(values.get("format", "delta")),
                       parse_interval(str(values.get("every", "15m")), "every"))


def _broker_storage(broker_config: str | None) -> tuple[int, int]:
    from ..broker.config import ConfigError, load_settings

    try:
        storage = load_settings(broker_config).storage_config()
    except ConfigError as error:
        raise JobConfigError(f"broker_config: {error}") from None
    return storage.segment_max_entries, storage.wal_max_size_bytes


def parse_interval(text: str, name: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    number, unit = text[:-1], text[-1:]
    if unit not in units or not number.replace(".", "", 1).isdigit() or float(number) <= 0:
        raise JobConfigError(f"{name} '{text}' is not an interval: write e.g. 30s, 15m, 1h, 1d")
    return float(number) * units[unit]


def _log_errors() -> tuple[type, ...]:
    from .log_files import LogReadError
    from .log_source import LogSourceError

    return LogReadError, LogSourceError


def run_job(spark, settings: JobSettings, progress=None) -> list[str]:
    """Run one job; `progress` (client/progress.py) advances once per stage."""
    if settings.job == "segment_compaction":
        from .segment_compaction import run

        return run(spark, settings.data_dir, settings.out, settings.segment_max_entries,
                   node=settings.node, table_format=settings.table_format,
                   progress=progress)
    from .memory_footprint import run

    return run(spark, settings.data_dir, settings.out, settings.wal_max_size_bytes,
               node_name=settings.node, table_format=settings.table_format,
               progress=progress)


def job_stages(job: str) -> int:
    """How many progress steps `run_job` takes for `job`."""
    if job == "segment_compaction":
        from .segment_compaction import STAGES
    else:
        from .memory_footprint import STAGES
    return STAGES


def spark_session(table_format: str, app_name: str = "quorumqueue-jobs"):
    """A local session for the jobs (with Delta when the tables are Delta)."""
    from .delta import local_spark, use_this_interpreter

    if table_format == "delta":
        return local_spark(app_name)
    from pyspark.sql import SparkSession

    use_this_interpreter()
    return (SparkSession.builder.master("local[2]").appName(app_name)
            .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
            .config("spark.sql.shuffle.partitions", "2").getOrCreate())


job_options = [
    click.option("--config", "config_path", type=click.Path(dir_okay=False),
                 help="Job settings (TOML); default conf/jobs/<job>.toml when it exists."),
    click.option("--data-dir", help="The broker's --data-dir."),
    click.option("--out", help="Where the tables and reports go."),
    click.option("--node", help="Node name in the tables (default: the data dir's name)."),
    click.option("--broker-config", type=click.Path(dir_okay=False),
                 help="The node's broker.toml (segment_max_entries, wal_max_size_bytes)."),
    click.option("--format", "table_format", help="Table format (default delta)."),
]


def with_job_options(function):
    for option in reversed(job_options):
        function = option(function)
    return function


@click.group()
def jobs() -> None:
    """Analytics over a broker's own log: segment compaction, memory footprint."""


@jobs.command("run")
@click.argument("job", type=click.Choice(JOBS))
@with_job_options
def jobs_run(job, config_path, data_dir, out, node, broker_config, table_format) -> None:
    """Run one job once and print its report."""
    settings = load_job_settings(job, config_path, data_dir=data_dir, out=out, node=node,
                                 broker_config=broker_config, format=table_format)
    click.echo(f"==> {job}: reading {settings.data_dir}", err=True)
    try:
        spark = spark_session(settings.table_format)
    except RuntimeError as error:         # e.g. the Delta jars are missing: `make setup`
        raise click.ClickException(str(error)) from None
    from ..client.progress import Progress

    try:
        with Progress(job, total=job_stages(job)) as progress:
            lines = run_job(spark, settings, progress)
    except _log_errors() as error:   # corrupt files, bad paths: named, no traceback
        raise click.ClickException(str(error)) from None
    finally:
        spark.stop()
    click.echo("\n".join(lines))
    click.echo(f"==> tables appended under {os.path.join(settings.out, job)}", err=True)


@jobs.command("schedule")
@click.argument("names", nargs=-1, type=click.Choice(JOBS))
@click.option("--every", help="Interval between runs, e.g. 15m (default: the job's "
                              "`every`, else 15m).")
@click.option("--runs", type=click.IntRange(min=1), help="Stop after this many rounds.")
@with_job_options
def jobs_schedule(names, every, runs, config_path, data_dir, out, node, broker_config,
                  table_format) -> None:
    """Run jobs every interval until stopped (SIGTERM/SIGINT); a failed run is logged
    and the schedule goes on."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    names = names or JOBS
    settings = [load_job_settings(name, config_path if len(names) == 1 else None,
                                  data_dir=data_dir, out=out, node=node,
                                  broker_config=broker_config, format=table_format)
                for name in names]
    interval = parse_interval(every, "--every") if every else min(s.every_s for s in settings)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    spark = spark_session(settings[0].table_format)
    try:
        schedule(spark, settings, interval, stop, runs)
    finally:
        spark.stop()


def schedule(spark, settings: list[JobSettings], interval: float, stop: threading.Event,
             runs: int | None = None) -> int:
    """Run every job, then wait for the next tick; returns the number of failed runs."""
    failures, round_number = 0, 0
    next_at = time.monotonic()
    while not stop.is_set() and (runs is None or round_number < runs):
        round_number += 1
        for job in settings:
            started = time.monotonic()
            try:
                lines = run_job(spark, job)
                log.info("run %d %s: ok in %.1fs; %s", round_number, job.job,
                         time.monotonic() - started, lines[0] if lines else "")
            except Exception as error:  # noqa: BLE001 - a schedule survives a failed run
                failures += 1
                log.error("run %d %s: failed after %.1fs: %s", round_number, job.job,
                          time.monotonic() - started, error)
        next_at += interval
        if runs is not None and round_number >= runs:
            break
        stop.wait(max(0.0, next_at - time.monotonic()))
    return failures
