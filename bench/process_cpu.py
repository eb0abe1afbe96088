"""CPU seconds per process, and per thread group of Spark's JVM, from /proc.

Responsibilities
    `ProcessCpu(spark_jvm=..., named={"broker": pid, ...}).snapshot()` reads, at one
    moment, the CPU each part of a benchmark has used so far: Spark's JVM split by
    thread (the JIT compiler, the executors' task threads, garbage collection, the
    rest: the driver's planning, the offset and commit logs, the Kafka consumers'
    fetcher threads...), Spark's Python processes (every live descendant of the JVM
    and the ones it reaped: the executors' workers and a Python source's driver-side
    runner), this process (the PySpark driver: py4j calls, foreachBatch functions), and
    any process named by pid (a broker, a loader). `delta(before, after)` subtracts two.

How it works
    user + system ticks of /proc/PID/stat (and /proc/PID/task/TID/stat per JVM thread);
    a live process counts its own ticks plus those of the children it reaped, so
    nothing is counted twice. Thread groups go by the thread's name (comm, 15 chars).

Not here
    What the figures mean for a workload (the benchmarks that print them).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

# JVM threads by name, in the order tried; the rest is "other"
JVM_THREADS = (("JIT", re.compile(r"C\d CompilerThre|Sweeper")),
               ("tasks", re.compile(r"Executor task")),
               ("GC", re.compile(r"GC Thread|G1 |VM Thread")))
GROUPS = ("JVM JIT", "JVM tasks", "JVM GC", "JVM other", "Python workers", "driver")
_TICK = os.sysconf("SC_CLK_TCK")


def stat_cpu(path: str, children: bool = False) -> float:
    """user + system CPU seconds from a /proc stat file (with reaped children's)."""
    fields = Path(path).read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / _TICK


def process_cpu(pid: int) -> float:
    """CPU seconds of `pid` so far, with the children it reaped; 0 if it is gone."""
    try:
        return stat_cpu(f"/proc/{pid}/stat", children=True)
    except OSError:
        return 0.0


def _parents() -> dict[int, int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parents[int(entry)] = int(Path(f"/proc/{entry}/stat").read_text()
                                          .rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    return parents


def descendants(root: int, parents: dict[int, int] | None = None) -> set[int]:
    """The live processes below `root` (`parents`: pid -> parent pid, read now if None)."""
    parents = _parents() if parents is None else parents
    found, grown = {root}, True
    while grown:
        new = {pid for pid, parent in parents.items() if parent in found} - found
        found |= new
        grown = bool(new)
    return found - {root}


class ProcessCpu:
    def __init__(self, spark_jvm: int | None = None, named: dict[str, int] | None = None) -> None:
        self.spark_jvm = spark_jvm
        self.named = dict(named or {})

    def snapshot(self) -> dict[str, float]:
        totals = dict.fromkeys(GROUPS, 0.0)
        # this process's own CPU: the loaders and drivers it started and reaped are not it
        totals["driver"] = stat_cpu(f"/proc/{os.getpid()}/stat")
        if self.spark_jvm is not None:
            jvm = self.spark_jvm
            try:
                totals["Python workers"] += (stat_cpu(f"/proc/{jvm}/stat", children=True)
                                             - stat_cpu(f"/proc/{jvm}/stat"))
                for tid in os.listdir(f"/proc/{jvm}/task"):
                    try:
                        name = Path(f"/proc/{jvm}/task/{tid}/comm").read_text()
                        group = next((g for g, pattern in JVM_THREADS if pattern.match(name)),
                                     "other")
                        totals[f"JVM {group}"] += stat_cpu(f"/proc/{jvm}/task/{tid}/stat")
                    except OSError:  # the thread ended meanwhile
                        continue
            except OSError:
                pass
            for pid in descendants(jvm):
                totals["Python workers"] += process_cpu(pid)
        if self.named:
            tree = _parents()
            for name, pid in self.named.items():  # with its workers, if it has any
                totals[name] = sum(process_cpu(p) for p in {pid} | descendants(pid, tree))
        return totals


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {group: after.get(group, 0.0) - before.get(group, 0.0) for group in after}


def jvm_total(cpu: dict[str, float]) -> float:
    return sum(value for group, value in cpu.items() if group.startswith("JVM"))
