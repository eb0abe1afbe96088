"""The faults the fault suite injects (Jepsen's nemeses), one function each.

A nemesis strikes a running LocalCluster (tests/support/cluster.py) and returns
what ends the fault (`heal`); the runner (run.py) holds the fault for the time the
nemesis names, heals, lets the cluster work, and strikes again. `leader` is the
node leading the workload's queue when the fault strikes (faults aimed at it test
failover; the others test that a follower's fault costs nothing).

The nemeses, by the guide's promises they test (the quorum queues guide, "Fault
Tolerance", "Data Safety" and "Availability"):
- processes: kill -9 the leader, a random node, a majority, every node (restarted
  on heal); SIGSTOP of the leader shorter than an election and longer than one;
- network partitions through the proxies on every inter-node link (Jepsen's four
  patterns): the leader isolated, a minority holding the leader cut from the
  majority, a bridge (two halves that each still reach one middle node), random
  halves; each as a "drop" (connections reset) or a "stall" (bytes held);
- slow links (every byte between the leader and the others delayed) and a slow
  disk (each fsync batch of the leader waits, through the broker's fault hook);
- a full disk (issue 30: an alarm, not an exit) on the leader or on a follower: the
  node's data directory is a small tmpfs of its own (`SMALL_DISK`, run.py mounts it)
  filled to its last byte, once (the node's disk reserve then carries its acks and
  replication) or kept full (whatever the node frees is taken at once: it can
  write nothing until the heal frees the disk).

Not here: the workload and its checker (tests/support/history.py), running and
reporting (run.py).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from tests.support.cluster import LocalCluster

Heal = Callable[[], None]


@dataclass(frozen=True)
class Nemesis:
    name: str
    strike: Callable[[LocalCluster, str, random.Random], Heal]
    hold: tuple[float, float]  # seconds the fault lasts (uniform)
    what: str                  # one line for the table


def _restart(cluster: LocalCluster, names: list[str]) -> Heal:
    def heal() -> None:
        for name in names:
            cluster.restart(name)
    return heal


def kill_leader(cluster, leader, rng):
    cluster.kill(leader)
    return _restart(cluster, [leader])


def kill_random(cluster, leader, rng):
    victim = rng.choice(cluster.names)
    cluster.kill(victim)
    return _restart(cluster, [victim])


def kill_majority(cluster, leader, rng):
    victims = rng.sample(cluster.names, len(cluster.names) // 2 + 1)
    for victim in victims:
        cluster.kill(victim)
    return _restart(cluster, victims)


def kill_all(cluster, leader, rng):
    for name in cluster.names:
        cluster.kill(name)
    return _restart(cluster, rng.sample(cluster.names, len(cluster.names)))


def pause_leader(cluster, leader, rng):
    cluster.pause(leader)
    return lambda: cluster.resume(leader)


def _heal_links(cluster: LocalCluster) -> Heal:
    return cluster.heal


def isolate_leader(cluster, leader, rng):
    cluster.isolate(leader, mode=rng.choice(["drop", "stall"]))
    return _heal_links(cluster)


def minority_with_leader(cluster, leader, rng):
    others = [name for name in cluster.names if name != leader]
    minority = [leader] + rng.sample(others, len(cluster.names) // 2 - 1)
    majority = [name for name in cluster.names if name not in minority]
    cluster.partition(minority, majority, mode=rng.choice(["drop", "stall"]))
    return _heal_links(cluster)


def bridge(cluster, leader, rng):
    """Two halves that cannot reach each other, and one node both reach."""
    names = rng.sample(cluster.names, len(cluster.names))
    middle = names.pop(len(names) // 2)
    half = len(names) // 2
    cluster.partition(names[:half], names[half:], mode=rng.choice(["drop", "stall"]))
    del middle  # keeps every link: the bridge
    return _heal_links(cluster)


def random_halves(cluster, leader, rng):
    names = rng.sample(cluster.names, len(cluster.names))
    cut = rng.randint(1, len(names) - 1)
    cluster.partition(names[:cut], names[cut:], mode=rng.choice(["drop", "stall"]))
    return _heal_links(cluster)


def slow_links(cluster, leader, rng):
    delay = rng.uniform(0.02, 0.2)
    for name in cluster.names:
        if name != leader:
            cluster.slow(leader, name, delay)
    return _heal_links(cluster)


def slow_disk(cluster, leader, rng):
    cluster.slow_disk(leader, rng.uniform(0.05, 0.3))
    return lambda: cluster.slow_disk(leader, 0)


def _fill_disk(victim: str, cluster: LocalCluster, rng: random.Random) -> Heal:
    cluster.fill_disk(victim, keep_full=rng.random() < 0.5)
    return lambda: cluster.free_disk(victim)


def disk_full_leader(cluster, leader, rng):
    return _fill_disk(leader, cluster, rng)


def disk_full_follower(cluster, leader, rng):
    return _fill_disk(rng.choice([name for name in cluster.names if name != leader]),
                      cluster, rng)


# the data directory's file system of each node in a disk-full run (a tmpfs), and
# the node configuration those runs add: the writes meet the full disk (not the
# free-space check first), with a reserve of 8 MiB
SMALL_DISK = 128 * 1024 * 1024
DISK_FULL_CONFIG = ('disk_free_limit.absolute = 1\n'
                    'storage.disk_reserve = "8MiB"\n')

NEMESES = {nemesis.name: nemesis for nemesis in (
    Nemesis("kill-leader", kill_leader, (0.5, 3.0), "kill -9 the leader, restart it"),
    Nemesis("kill-random", kill_random, (0.5, 3.0), "kill -9 a random node, restart it"),
    Nemesis("kill-majority", kill_majority, (1.0, 4.0), "kill -9 a majority, restart them"),
    Nemesis("kill-all", kill_all, (0.5, 2.0), "kill -9 every node, restart them"),
    Nemesis("pause-short", pause_leader, (0.2, 0.6), "SIGSTOP the leader, shorter than "
            "an election"),
    Nemesis("pause-long", pause_leader, (4.0, 8.0), "SIGSTOP the leader, longer than an "
            "election"),
    Nemesis("isolate-leader", isolate_leader, (2.0, 6.0), "partition: the leader alone"),
    Nemesis("minority-leader", minority_with_leader, (2.0, 6.0), "partition: the leader "
            "in a minority"),
    Nemesis("bridge", bridge, (2.0, 6.0), "partition: two halves and a bridge node"),
    Nemesis("random-halves", random_halves, (2.0, 6.0), "partition: random halves"),
    Nemesis("slow-links", slow_links, (2.0, 5.0), "the leader's links delayed 20-200 ms"),
    Nemesis("slow-disk", slow_disk, (2.0, 5.0), "the leader's fsyncs delayed 50-300 ms"),
    Nemesis("disk-full-leader", disk_full_leader, (3.0, 8.0), "the leader's file system "
            "filled to its last byte (once, or kept full)"),
    Nemesis("disk-full-follower", disk_full_follower, (3.0, 8.0), "a follower's file "
            "system filled to its last byte (once, or kept full)"),
)}


def needs_small_disks(nemesis: Nemesis) -> bool:
    return nemesis.strike in (disk_full_leader, disk_full_follower)
