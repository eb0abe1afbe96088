"""Where the analytics jobs put their results: Delta tables appended with the run's
timestamp (so history accumulates and notebooks can plot it over time), and a short
text report per run.

    <out>/<job>/<table>/                 Delta (or, for tests, another format) tables,
                                         each row stamped with `run_at` (UTC)
    <out>/<job>/reports/<run_at>.txt     the run's report, plain words
"""

from __future__ import annotations

import datetime
import os

from pyspark.sql import functions as F


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)


def publish(job: str, out: str, tables: dict, lines: list[str], source: str,
            run_at: datetime.datetime, table_format: str = "delta") -> str:
    """Append every table and write the report; returns the report's path."""
    folder = os.path.join(out, job)
    for name, frame in tables.items():
        (frame.withColumn("run_at", F.lit(run_at).cast("timestamp"))
         .write.format(table_format).mode("append").option("mergeSchema", "true")
         .save(os.path.join(folder, name)))
    reports = os.path.join(folder, "reports")
    os.makedirs(reports, exist_ok=True)
    path = os.path.join(reports, run_at.strftime("%Y%m%dT%H%M%SZ") + ".txt")
    with open(path, "w") as handle:
        handle.write(f"{job.replace('_', ' ')}, {source}, {run_at.isoformat()}\n")
        handle.write("\n".join(lines) + "\n")
    return path


def human_bytes(count: int | None) -> str:
    value = float(count or 0)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"
