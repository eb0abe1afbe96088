"""Where a run of bench/connector_vs_kafka.py spends its time, in every process at once.

Responsibilities
    `Profile(out, name, pids)` samples, for the length of one run: each Python process
    with py-spy (the bundled broker; Spark's Python daemon and the workers it forks,
    `--subprocesses`, which also covers the source's driver-side runner), and each JVM
    with Java Flight Recorder (Spark's; Kafka's broker), then writes one text file per
    run, `NAME.txt`: per process, the CPU it used (from /proc) and its top frames by
    own samples and by samples anywhere on the stack, as a share of the process's
    samples; for a JVM, the samples per thread group too.

How it works
    py-spy record --nonblocking --idle (so a thread waiting in a socket read shows as
    such: waits are part of the split) in raw (collapsed-stack) form; JFR through
    `jcmd PID JFR.start` with the `profile` settings (execution samples every 10 ms of
    running Java threads) and `jfr print --events jdk.ExecutionSample` afterwards. Both
    sample without stopping the process for long, so the run's figures stay close to
    an unprofiled one (they are still not used as throughput figures).

Not here
    Starting the processes (bench/connector_vs_kafka.py), CPU per message
    (bench/process_cpu.py).
"""

from __future__ import annotations

import collections
import re
import signal
import subprocess
import time
from pathlib import Path

from bench.process_cpu import ProcessCpu, descendants, process_cpu

_FRAME = re.compile(r"^\s+(?:at )?([\w$.<>/]+)\(", re.M)


def _py_spy() -> str:
    from bench.profile_flames import py_spy

    return py_spy()


class Profile:
    def __init__(self, out: Path, name: str, python: dict[str, int], jvms: dict[str, int],
                 rate: int = 100) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.out, self.name = out, name
        self.python, self.jvms = python, jvms
        self.cpu_before = {what: self._cpu(pid) for what, pid in {**python, **jvms}.items()}
        self.began = time.monotonic()
        self.spies = {
            what: subprocess.Popen(
                [_py_spy(), "record", "--pid", str(pid), "--rate", str(rate), "--nolineno",
                 "--nonblocking", "--idle", "--subprocesses", "--format", "raw",
                 "-o", str(out / f"{name}-{what}.collapsed")],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            for what, pid in python.items()}
        for what, pid in jvms.items():
            subprocess.run(["jcmd", str(pid), "JFR.start", f"name={name}-{what}",
                            "settings=profile",
                            f"filename={out / f'{name}-{what}.jfr'}"],
                           capture_output=True, text=True, timeout=60)

    @staticmethod
    def _cpu(pid: int) -> float:
        return process_cpu(pid) + sum(process_cpu(child) for child in descendants(pid))

    def stop(self) -> Path:
        seconds = time.monotonic() - self.began
        cpu = {what: self._cpu(pid) - self.cpu_before[what]
               for what, pid in {**self.python, **self.jvms}.items()}
        for process in self.spies.values():
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
        for process in self.spies.values():
            try:
                process.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                process.kill()
                process.communicate()
        for what, pid in self.jvms.items():
            subprocess.run(["jcmd", str(pid), "JFR.stop", f"name={self.name}-{what}"],
                           capture_output=True, text=True, timeout=120)
        lines = [f"{self.name}: {seconds:.1f} s sampled"]
        for what in self.python:
            lines += _python_summary(self.out / f"{self.name}-{what}.collapsed", what, cpu[what])
        for what in self.jvms:
            lines += _jvm_summary(self.out / f"{self.name}-{what}.jfr", what, cpu[what])
        path = self.out / f"{self.name}.txt"
        path.write_text("\n".join(lines) + "\n")
        return path


def _top(counter: collections.Counter, total: int, count: int = 15) -> list[str]:
    return [f"    {100 * n / total:5.1f}%  {frame}" for frame, n in counter.most_common(count)]


def _python_summary(path: Path, what: str, cpu_s: float) -> list[str]:
    own, anywhere = collections.Counter(), collections.Counter()
    per_process = collections.Counter()
    total = 0
    try:
        text = path.read_text()
    except OSError:
        return [f"\n{what}: no samples ({path.name} missing)"]
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        total += n
        per_process[frames[0].split(" ")[0]] += n
        own[frames[-1]] += n
        for frame in set(frames[1:]):
            anywhere[frame] += n
    if not total:
        return [f"\n{what}: no samples"]
    return [f"\n{what}: {cpu_s:.2f} CPU-s, {total} samples (idle threads included)",
            "  by process:", *_top(per_process, total, 8),
            "  own:", *_top(own, total), "  anywhere on the stack:", *_top(anywhere, total)]


def _jvm_summary(path: Path, what: str, cpu_s: float) -> list[str]:
    try:
        text = subprocess.run(["jfr", "print", "--stack-depth", "64", "--events",
                               "jdk.ExecutionSample", str(path)],
                              capture_output=True, text=True, timeout=600).stdout
    except (OSError, subprocess.TimeoutExpired):
        return [f"\n{what}: no JFR recording"]
    own, anywhere, threads = collections.Counter(), collections.Counter(), collections.Counter()
    total = 0
    for event in text.split("jdk.ExecutionSample")[1:]:
        thread = re.search(r'sampledThread = "([^"]*)"', event)
        frames = _FRAME.findall(event)
        if not frames:
            continue
        total += 1
        threads[re.sub(r"[\d-]+", "N", thread.group(1)) if thread else "?"] += 1
        own[frames[0]] += 1
        for frame in set(frames):
            anywhere[frame] += 1
    if not total:
        return [f"\n{what}: {cpu_s:.2f} CPU-s, no execution samples"]
    return [f"\n{what}: {cpu_s:.2f} CPU-s, {total} JFR execution samples (running Java only)",
            "  by thread:", *_top(threads, total, 10),
            "  own (top frame):", *_top(own, total), "  anywhere on the stack:",
            *_top(anywhere, total, 25)]


__all__ = ["Profile", "ProcessCpu"]
