"""The fault suite's runner: runs of a workload under a nemesis, checked, tabled, plotted.

One run: a fresh LocalCluster of 3 or 5 real nodes (tests/support/cluster.py, every
inter-node link behind a proxy), a confirmed publisher and a manual-ack consumer that
reconnect to other nodes (tests/support/history.py), and a nemesis (nemesis.py) that
strikes, holds, heals, and strikes again for the run's duration, a few seconds of
calm between faults. After the last heal the workload must get confirms again; then
publishing stops, the consumer drains, and the checkers judge:

- total queue (history.violations): every confirmed message was delivered, nothing
  was delivered that was never published, nothing unconfirmed twice as new;
  duplicates (ids delivered as new more than once) are counted;
- no split brain: no two nodes led one group in one term (the "is the leader in
  term" lines every node logs when it becomes a leader).
- with `extras` (extras.py, beside the main workload): single active consumer
  never two active, and at-least-once dead lettering lossless; their findings join
  the run's violations, prefixed "sac:" and "dlx:".

A failed run explains itself: the main queue's rows as every live node lists them
and the nodes' last warnings, the clients' last reconnections; with the SAC workload
its queue as every node's replica holds it (`diagnose_sac`: role, ready and unacked,
the active consumer, every consumer with its unacked count and flags, the nodes it
hears), read when its drain gave up and again after its consumers stopped, and its
sessions that failed; and the nodes' whole logs are kept (`run-NNN-logs` in --out).

It also measures, from a sampler of the client's counts every 0.2 s: the windows
with no confirm for a second or more (unavailability) and the time from each heal
to the next confirm (recovery). `python -m tests.faults.run` runs many and writes
the table (markdown) and a plot per run (confirms and publishes per second, faults
shaded) into --out; `make faults` is its long form. Seeds make runs repeatable in
what they choose (which node, when, how long), not in the machine's timing.

Not here: the nemeses (nemesis.py), the extra workloads and their checkers
(extras.py), the short seeded subset CI runs (test_fault_suite.py).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import random
import re
import sys
import threading
import time
from dataclasses import dataclass, field

from quorumqueue.client.management import call
from tests.faults import extras as extra_workloads
from tests.faults import spark_workload
from tests.faults.exposure import EXPOSURE_CONFIG
from tests.faults.nemesis import (DISK_FULL_CONFIG, EXPOSURE, NEMESES, SMALL_DISK, Nemesis,
                                  needs_small_disks)
from tests.support.cluster import CONVERGE_TIMEOUT, LocalCluster, wait_for
from tests.support.history import History, Workload, report, violations

QUEUE = "fault-suite"
SAMPLE_EVERY = 0.2
UNAVAILABLE_AFTER = 1.0     # seconds without a confirm that count as a window
LEADER_LINE = re.compile(r"group (\S+): (\S+) is the leader in term (\d+)")


@dataclass
class RunResult:
    nodes: int
    nemesis: str
    seed: int
    workload: str = "amqp"     # "amqp" (history.Workload) or "spark" (spark_workload.py)
    faults: list[tuple[float, float]] = field(default_factory=list)  # (start, end)
    samples: list[tuple[float, int, int, int]] = field(default_factory=list)
    recoveries: list[float] = field(default_factory=list)  # heal -> next confirm, s
    violations: list[str] = field(default_factory=list)
    split_brain: list[str] = field(default_factory=list)
    elections: int = 0         # leaderships the logs show (all groups, all terms)
    counts: object = None      # history.Report
    diagnosis: list[str] = field(default_factory=list)  # the queue as nodes saw it, on failure
    events: list[str] = field(default_factory=list)     # the clients' reconnections, on failure
    seconds: float = 0.0
    error: str = ""
    commit: str = ""           # the code the nodes ran (the work tree's HEAD at the start)
    extras: tuple[str, ...] = ()  # "sac", "dlx": extras.py's workloads beside the main one
    sac: dict | None = None    # extras.sac_violations' counts (and "confirmed", "lost")
    dlx: dict | None = None    # extras.dlx_violations' counts (and "confirmed")

    @property
    def ok(self) -> bool:
        return not (self.violations or self.split_brain or self.error)

    def unavailable(self) -> list[tuple[float, float]]:
        """Windows of UNAVAILABLE_AFTER seconds or more in which nothing was confirmed
        (while publishing: from the first confirm to the last sample)."""
        windows, last_t, last_count = [], None, None
        for t, _published, confirmed, _delivered in self.samples:
            if last_count is None or confirmed > last_count:
                if last_t is not None and t - last_t >= UNAVAILABLE_AFTER and last_count:
                    windows.append((last_t, t))
                last_t, last_count = t, confirmed
        return windows


class Sampler:
    """Samples (time, published, confirmed, delivered) of a History in a thread;
    `delivered` counts what the workload's reader got (default: the History's
    deliveries)."""

    def __init__(self, history: History, into: list, delivered=None) -> None:
        self.history, self.into = history, into
        self.delivered = delivered or (lambda: len(history.deliveries))
        self.stopping = threading.Event()
        self.started = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="fault sampler", daemon=True)

    def start(self) -> "Sampler":
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self.stopping.wait(SAMPLE_EVERY):
            with self.history.lock:
                published, confirmed = len(self.history.published), len(self.history.confirmed)
            self.into.append((time.monotonic() - self.started, published, confirmed,
                              self.delivered()))


def confirmed(history: History) -> int:
    with history.lock:
        return len(history.confirmed)


def leader(cluster: LocalCluster, queue_name: str = QUEUE) -> str:
    """The queue's leader as a live node sees it (waited for: a fault may have just
    ended)."""
    def find():
        for uri in cluster.live_uris():
            for queue in call(uri, "cluster.status", timeout=5)["queues"]:
                if queue["name"] == queue_name and queue["leader"] in cluster.names:
                    return queue["leader"]
        return None
    return wait_for("the queue's leader", find)


def leaderships(logs: list[str]) -> dict[tuple[str, int], set[str]]:
    """(group, term) -> the nodes that logged leading it, from the nodes' logs."""
    leaders: dict[tuple[str, int], set[str]] = {}
    for text in logs:
        for group, node, term in LEADER_LINE.findall(text):
            leaders.setdefault((group, int(term)), set()).add(node)
    return leaders


def split_brain(leaders: dict[tuple[str, int], set[str]]) -> list[str]:
    """Groups with two leaders in one term."""
    return [f"group {group} term {term}: {', '.join(sorted(nodes))}"
            for (group, term), nodes in sorted(leaders.items()) if len(nodes) > 1]


def diagnose(cluster: LocalCluster, queue_names: tuple[str, ...] = (QUEUE,)) -> list[str]:
    """What each live node says of the queues and the cluster (for a failed run)."""
    lines = []
    for name in cluster.live_nodes():
        uri = cluster.uri(name)
        try:
            queues = [q for q in call(uri, "queues.list", timeout=10)
                      if q["name"] in queue_names]
            status = call(uri, "cluster.status", timeout=10)
            lines.append(f"{name}: {queues} forwarding={status.get('forwarding')}")
        except Exception as error:  # noqa: BLE001 - a diagnosis, not a verdict
            lines.append(f"{name}: {error!r}")
        warnings = [line for line in cluster.log(name, tail=1 << 30).splitlines()
                    if "[WARNING]" in line or "[ERROR]" in line]
        lines += [f"{name} log: {line}" for line in warnings[-8:]]
    return lines


def diagnose_sac(cluster: LocalCluster) -> list[str]:
    """The single-active-consumer queue as each live node's replica holds it (for a
    failed run): role and term, ready and unacked, the active consumer, every
    consumer (its connection, unacked count, suspected, cancelled) and the nodes
    this node hears pings from (node/queue_commands.py `queues.consumer_state`)."""
    lines = []
    for name in cluster.live_nodes():
        try:
            state = call(cluster.uri(name), "queues.consumer_state", timeout=10,
                         vhost="/", name=extra_workloads.SAC_QUEUE)
        except Exception as error:  # noqa: BLE001 - a diagnosis, not a verdict
            lines.append(f"sac queue on {name}: {error!r}")
            continue
        if not state.get("replica"):
            lines.append(f"sac queue on {name}: no replica")
            continue
        lines.append(
            f"sac queue on {name}: {state['role']} term {state['term']} (leader "
            f"{state['leader']}), applied {state['applied_index']}/commit "
            f"{state['commit_index']}, ready {state['ready']}, unacked {state['unacked']}, "
            f"active {state['active']}, hears {sorted(state['live'].items())}")
        for consumer in state["consumers"]:
            flags = [flag for flag in ("suspected", "cancelled", "pull_only") if consumer[flag]]
            lines.append(f"  consumer {consumer['key']} (order {consumer['order']}, "
                         f"unacked {consumer['unacked']}/{consumer['prefetch']}"
                         f"{', ' + ', '.join(flags) if flags else ''})")
    return lines


def keep_logs(cluster: LocalCluster, into: str) -> None:
    """Copy every node's log into `into` (a failed run's evidence: the cluster's
    directory is removed when it stops)."""
    os.makedirs(into, exist_ok=True)
    for name in cluster.names:
        with open(os.path.join(into, f"{name.partition('@')[0]}.log"), "w") as handle:
            handle.write(cluster.log(name, tail=1 << 34))


@contextlib.contextmanager
def started_cluster(nodes: int, config: str, attempts: int = 3, small_disks: int = 0):
    """A started LocalCluster, stopped at the end; a start that lost a port to another
    process of the shared machine (ports are picked free, then bound by the node) is
    tried again on other ports: a harness failure, not the run's. `small_disks`: each
    node's data directory on a tmpfs of that many bytes (the disk-full nemeses)."""
    for attempt in range(attempts):
        cluster = LocalCluster(nodes, extra_config=config, small_disks=small_disks)
        try:
            cluster.start()
            break
        except RuntimeError as error:
            if "address already in use" not in str(error) or attempt == attempts - 1:
                raise
    try:
        yield cluster
    finally:
        cluster.stop()


def run_one(nodes: int, nemesis: Nemesis, seed: int, duration: float,
            say=lambda text: None, workload: str = "amqp",
            extras: tuple[str, ...] = (), logs_to: str | None = None) -> RunResult:
    """One run (module header); `workload` "spark" runs spark_workload.py's query
    into Delta instead of the AMQP consumer, checked for exactly-once. `extras`
    ("sac", "dlx"; AMQP runs only) adds extras.py's single-active-consumer and
    at-least-once dead-lettering workloads beside the main one, checked too.
    `logs_to`: a directory the nodes' logs are copied into if the run fails."""
    rng = random.Random(seed)
    spark_run = workload == "spark"
    extras = () if spark_run else tuple(extras)
    result = RunResult(nodes, nemesis.name, seed, workload=workload, commit=_commit(),
                       extras=extras)
    began = time.monotonic()
    queue = spark_workload.QUEUE if spark_run else QUEUE
    config = extra_workloads.DLX_CONFIG if "dlx" in extras else ""
    small_disks = 0
    if needs_small_disks(nemesis):
        config += DISK_FULL_CONFIG
        small_disks = SMALL_DISK
    if nemesis.name in EXPOSURE:
        config += EXPOSURE_CONFIG
    others: dict[str, object] = {}   # the extra workloads, by name
    struck: list[tuple[float, float]] = []  # faults in time.monotonic(), for the SAC check
    sac_state: list[str] = []  # the SAC queue if its drain gave up, its consumers still on
    with started_cluster(nodes, config, small_disks=small_disks) as cluster:
        wait_for("a metadata leader", lambda: all(
            call(uri, "cluster.status", timeout=5)["metadata_leader"]
            for uri in cluster.uris()))
        if spark_run:
            clients = spark_workload.SparkWorkload(cluster, queue, interval=0.002)
        else:
            clients = Workload(cluster.live_uris, queue, interval=0.002)
        sampler = None
        try:
            clients.start()
            history = clients.history
            if "sac" in extras:
                others["sac"] = extra_workloads.SacWorkload(cluster.live_uris).start()
            if "dlx" in extras:
                others["dlx"] = extra_workloads.DlxWorkload(cluster.live_uris).start()
            sampler = Sampler(history, result.samples,
                              clients.delivered if spark_run else None).start()
            wait_for("25 confirms before the first fault", lambda: confirmed(history) >= 25)
            if spark_run:
                wait_for("the query's first batch", clients.started,
                         timeout=spark_workload.CATCH_UP_TIMEOUT)
            end = time.monotonic() + duration
            while time.monotonic() < end:
                time.sleep(rng.uniform(1.0, 3.0))
                target = leader(cluster, queue)
                strike = time.monotonic()
                start = strike - sampler.started
                heal = nemesis.strike(cluster, target, rng)
                time.sleep(rng.uniform(*nemesis.hold))
                heal()
                healed = time.monotonic()
                struck.append((strike, healed))
                result.faults.append((start, healed - sampler.started))
                before = confirmed(history)
                wait_for(f"a confirm after healing {nemesis.name}",
                         lambda: confirmed(history) > before)
                result.recoveries.append(time.monotonic() - healed)
                say(f"  {nemesis.name} on {target}: healed, confirms again after "
                    f"{result.recoveries[-1]:.1f}s (struck at {strike:.3f}, healed at "
                    f"{healed:.3f}, monotonic; {time.strftime('%H:%M:%S', time.gmtime())} "
                    "UTC)")
            if spark_run:
                history = clients.finish(drain_timeout=spark_workload.CATCH_UP_TIMEOUT)
            else:
                history = clients.finish(drain_timeout=CONVERGE_TIMEOUT)
            with history.lock:
                # exactly-once for the query: no id in two rows of the table
                result.violations = violations(history, strict_duplicates=spark_run)
                result.counts = report(history)
            if "sac" in others:
                sac = others["sac"].finish(
                    struck, drain_timeout=CONVERGE_TIMEOUT,
                    missing=lambda: sac_state.extend(diagnose_sac(cluster)))
                found, result.sac = extra_workloads.sac_violations(sac)
                lost = extra_workloads.sac_lost(sac)
                result.sac.update(confirmed=len(sac.confirmed), lost=len(lost))
                if lost:
                    found.insert(0, f"confirmed but never delivered (lost): "
                                    f"{extra_workloads.ids(lost)}")
                result.violations += [f"sac: {line}" for line in found]
            if "dlx" in others:
                dlx = others["dlx"].finish(drain_timeout=CONVERGE_TIMEOUT)
                found, result.dlx = extra_workloads.dlx_violations(dlx)
                result.dlx["confirmed"] = len(dlx.confirmed)
                result.violations += [f"dlx: {line}" for line in found]
            crashed = cluster.exited()  # every fault was healed: all should run
            if crashed:
                result.error = "; ".join(f"node {name} {how} during the run"
                                         for name, how in sorted(crashed.items()))
            if spark_run and clients.query_failure:
                result.error = "; ".join(filter(None, [result.error, clients.query_failure]))
        except Exception as error:  # noqa: BLE001 - a run that could not finish is a result
            result.error = f"{type(error).__name__}: {error}"  # whole: a node's log tail
        finally:
            if sampler is not None:
                sampler.stop()
            for each in [clients, *others.values()]:
                try:
                    each.stop()
                except Exception as error:  # noqa: BLE001
                    result.error = result.error or f"workload: {error}"
        if not result.ok:
            result.diagnosis = diagnose(cluster, (queue, extra_workloads.SAC_QUEUE,
                                                  extra_workloads.DLX_SOURCE,
                                                  extra_workloads.DLX_TARGET))
            if "sac" in others:
                if sac_state:
                    result.diagnosis.append("the SAC queue when the drain gave up, its "
                                            "consumers still connected:")
                    result.diagnosis += sac_state
                    result.diagnosis.append("the SAC queue after its consumers stopped:")
                result.diagnosis += diagnose_sac(cluster)
                sac_clients = others["sac"]
                with sac_clients.history.lock:
                    result.diagnosis += [f"sac session {session} failed at {at:.3f}"
                                         for session, at in sorted(sac_clients.ends.items())]
                    result.diagnosis += [f"sac client: {event}"
                                         for event in sac_clients.history.events[-40:]]
                    last = sac_clients.deliveries[-1:]
                    result.diagnosis += [f"sac last delivery: {d}" for d in last]
            if logs_to is not None:
                keep_logs(cluster, logs_to)
                result.diagnosis.append(f"node logs kept in {logs_to}")
            if spark_run:
                result.diagnosis += spark_workload.diagnose_rows(clients.rows)
                result.diagnosis.append(f"table and checkpoint kept in {clients.workdir}")
        if spark_run:
            with clients.history.lock:  # the query's catch-up, in every run's output
                result.events = [e for e in clients.history.events if " spark: " in e]
        if not result.ok:
            with clients.history.lock:
                result.events += list(clients.history.events[-40:])
        elif spark_run:
            clients.cleanup()
        leaders = leaderships([cluster.log(name, tail=1 << 30) for name in cluster.names])
        result.split_brain = split_brain(leaders)
        result.elections = len(leaders)
    result.seconds = time.monotonic() - began
    return result


# ---------------------------------------------------------------- reporting


def table(results: list[RunResult]) -> str:
    head = ("| run | commit | workload | nodes | nemesis | seed | faults | confirmed | lost | "
            "duplicates | unknown | unavailable (windows, longest s) | recovery max s | "
            "leaderships | split brain | SAC handovers (sessions; confirmed, lost) | "
            "DLX rejected in target / rejected (target duplicates; confirmed) | result |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    rows = []
    for number, r in enumerate(results, 1):
        counts = r.counts
        windows = r.unavailable()
        longest = max((b - a for a, b in windows), default=0.0)
        rows.append(
            f"| {number} | {r.commit} | {r.workload} | {r.nodes} | {r.nemesis} | {r.seed} | "
            f"{len(r.faults)} | "
            f"{counts.confirmed if counts else '-'} | "
            f"{_lost(r) if counts else '-'} | "
            f"{counts.duplicated_new if counts else '-'} | "
            f"{counts.unknown if counts else '-'} | {len(windows)}, {longest:.1f} | "
            f"{max(r.recoveries, default=0.0):.1f} | {r.elections} | "
            f"{'yes' if r.split_brain else 'no'} | {_sac_cell(r)} | {_dlx_cell(r)} | "
            f"{'ok' if r.ok else 'FAILED'} |")
    return head + "\n".join(rows) + "\n"


def _sac_cell(result: RunResult) -> str:
    sac = result.sac
    if not sac:
        return "-"
    return (f"{sac['handovers']} ({sac['sessions']}; {sac['confirmed']}, {sac['lost']})")


def _dlx_cell(result: RunResult) -> str:
    dlx = result.dlx
    if not dlx:
        return "-"
    return (f"{dlx['in_target']} / {dlx['rejected']} ({dlx['target_duplicates']}; "
            f"{dlx['confirmed']})")


def _lost(result: RunResult) -> int:
    for violation in result.violations:
        if violation.startswith("confirmed but never delivered"):
            return int(violation.split(": ", 1)[1].split()[0])
    return 0


def plot(result: RunResult, path: str) -> None:
    """Publishes and confirms per second over time, faults shaded (a PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    times = [s[0] for s in result.samples]
    fig, axis = plt.subplots(figsize=(9, 3))
    for column, label in ((1, "published/s"), (2, "confirmed/s"), (3, "delivered/s")):
        rates = [0.0] + [(b[column] - a[column]) / (b[0] - a[0])
                         for a, b in zip(result.samples, result.samples[1:])]
        axis.plot(times, rates, label=label, linewidth=0.8)
    for start, end in result.faults:
        axis.axvspan(start, end, color="red", alpha=0.15)
    axis.set_xlabel("seconds (shaded: fault)")
    axis.set_ylabel("messages/s")
    axis.set_title(f"{result.workload}: {result.nemesis}, {result.nodes} nodes, seed {result.seed}"
                   f" - {'ok' if result.ok else 'FAILED'}")
    axis.legend(loc="upper right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _commit() -> str:
    import subprocess

    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.faults.run",
        description="Run the fault suite: a confirmed-publish + manual-ack workload on "
                    "real node processes under nemeses; check, table and plot the runs.")
    parser.add_argument("--runs", type=int, default=100, help="how many runs (default 100)")
    parser.add_argument("--nodes", type=int, nargs="+", default=[3, 5],
                        help="cluster sizes to cycle through (default 3 5)")
    parser.add_argument("--nemesis", nargs="+", default=sorted(NEMESES),
                        choices=sorted(NEMESES), help="nemeses to cycle through (default all)")
    parser.add_argument("--duration", type=float, default=20.0,
                        help="seconds of faults per run (default 20)")
    parser.add_argument("--seed", type=int, default=1, help="first seed (default 1)")
    parser.add_argument("--spark-runs", type=int, default=0,
                        help="runs of the Spark workload after the others: a lease-mode "
                             "query into Delta checked for exactly-once, 3 nodes "
                             "(default 0)")
    parser.add_argument("--spark-nemesis", nargs="+", default=list(spark_workload.NEMESES),
                        choices=sorted(NEMESES),
                        help="nemeses the Spark runs cycle through (default: "
                             f"{' '.join(spark_workload.NEMESES)})")
    parser.add_argument("--extras", nargs="*", default=["sac", "dlx"], choices=["sac", "dlx"],
                        help="workloads beside the main one in AMQP runs (extras.py): a "
                             "single-active-consumer queue, at-least-once dead lettering "
                             "(default both; none with a bare --extras)")
    parser.add_argument("--out", default="tests/faults/results",
                        help="where the table and plots go (default tests/faults/results)")
    options = parser.parse_args(argv)
    os.makedirs(options.out, exist_ok=True)
    combos = itertools.cycle(itertools.product(options.nemesis, options.nodes))
    context = (f"Runs of `python -m tests.faults.run {' '.join(argv or sys.argv[1:])}`, "
               f"{time.strftime('%Y-%m-%d', time.gmtime())}, "
               f"{os.cpu_count()} CPUs; {options.duration:g} s of faults per run.")
    spark_combos = itertools.cycle(options.spark_nemesis)
    plan = ([(next(combos), "amqp") for _ in range(options.runs)]
            + [((next(spark_combos), 3), "spark") for _ in range(options.spark_runs)])
    results = []
    for number, ((name, nodes), workload) in enumerate(plan, 1):
        seed = options.seed + number - 1
        print(f"run {number}/{len(plan)}: {workload}, {name} on {nodes} nodes, seed {seed}",
              flush=True)
        result = run_one(nodes, NEMESES[name], seed, options.duration,
                         say=lambda text: print(text, flush=True), workload=workload,
                         extras=tuple(options.extras),
                         logs_to=os.path.join(options.out, f"run-{number:03d}-logs"))
        results.append(result)
        plot(result, os.path.join(options.out, f"run-{number:03d}.png"))
        verdict = "ok" if result.ok else "FAILED: " + "; ".join(
            result.violations + result.split_brain + [result.error]) + "".join(
            "\n    " + line for line in result.diagnosis + result.events)
        if result.ok and result.events:  # the Spark query's catch-up
            verdict += "".join("\n    " + line for line in result.events)
        print(f"  {result.counts or ''} - {verdict} ({result.seconds:.0f}s)", flush=True)
        with open(os.path.join(options.out, "table.md"), "w") as handle:
            handle.write(f"{context}\n\n{table(results)}")
    if options.spark_runs:
        spark_workload.spark_session().stop()
    failed = [r for r in results if not r.ok]
    print(f"{len(results)} runs, {len(failed)} failed; table: "
          f"{os.path.join(options.out, 'table.md')}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
