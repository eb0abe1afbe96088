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

from tests.faults import exposure
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


def _listeners(cluster: LocalCluster, name: str) -> dict[str, tuple[int, bytes]]:
    """A node's listeners: name -> (port, what a slow client trickles)."""
    plan = cluster._plan(name)
    ports = {"AMQP": (plan.amqp_port, exposure.AMQP_PREFIX),
             "management": (plan.management_port, exposure.HTTP_PREFIX),
             "Prometheus": (plan.prometheus_port, exposure.HTTP_PREFIX),
             "inter-node": (plan.cluster_port, exposure.CLUSTER_PREFIX)}
    return {what: entry for what, entry in ports.items() if entry[0]}


def _checked_heal(cluster: LocalCluster, victim: str, attack: exposure.Attack,
                  rss_before: int, restore=None) -> Heal:
    """Heal: every hostile connection closed by the node itself, its memory bounded;
    else the run fails naming them."""
    def heal() -> None:
        try:
            problems = attack.still_open()
            pid = cluster.pid(victim)
            grown = exposure.resident_bytes(pid) - rss_before if pid else 0
            if grown > exposure.MAX_RSS_GROWTH:
                problems.append(f"{victim}'s resident memory grew {grown >> 20} MiB")
        finally:
            attack.stop()
            if restore is not None:
                restore()
        if problems:
            raise AssertionError(f"{victim}: " + "; ".join(problems))
    return heal


def silent_connections(cluster, leader, rng):
    """On every listener of one node: connections that send nothing, and slow ones
    that never finish their handshake or their request's headers."""
    victim = rng.choice(cluster.names)
    attack = exposure.Attack()
    rss = exposure.resident_bytes(cluster.pid(victim))
    for what, (port, prefix) in _listeners(cluster, victim).items():
        attack.silent(port, rng.randint(10, 40), f"silent {what}")
        attack.slow(port, prefix, rng.randint(2, 5), f"slow {what}")
    return _checked_heal(cluster, victim, attack, rss)


def preauth_flood(cluster, leader, rng):
    """Strangers on a node's inter-node port, each announcing a 256 MB frame."""
    victim = rng.choice(cluster.names)
    attack = exposure.Attack()
    rss = exposure.resident_bytes(cluster.pid(victim))
    attack.flood(_listeners(cluster, victim)["inter-node"][0], rng.randint(8, 16))
    return _checked_heal(cluster, victim, attack, rss)


def descriptor_exhaustion(cluster, leader, rng):
    """The leader allowed 2,048 descriptors (prlimit), and 2,100 silent connections to
    its AMQP port: its reserve keeps its own files and clients going, the silent ones
    are refused or closed after handshake_timeout."""
    import resource

    pid = cluster.pid(leader)
    before = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (2048, max(2048, before[1])))
    exposure.raise_own_descriptor_limit(2600)
    attack = exposure.Attack()
    rss = exposure.resident_bytes(pid)
    attack.silent(_listeners(cluster, leader)["AMQP"][0], 2100, "silent AMQP")

    def restore() -> None:
        if cluster.pid(leader) == pid:
            resource.prlimit(pid, resource.RLIMIT_NOFILE, before)
    return _checked_heal(cluster, leader, attack, rss, restore)


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
    Nemesis("silent-connections", silent_connections, (3.0, 6.0), "silent and slow "
            "connections on every listener of a node (AMQP, management, Prometheus, "
            "inter-node), closed by it"),
    Nemesis("preauth-flood", preauth_flood, (1.0, 3.0), "strangers announcing 256 MB "
            "frames on a node's inter-node port"),
    Nemesis("fd-exhaustion", descriptor_exhaustion, (3.0, 6.0), "the leader allowed "
            "2,048 descriptors, 2,100 silent connections to it"),
)}

# the nemeses whose runs need the lower connection timeouts (exposure.EXPOSURE_CONFIG)
EXPOSURE = ("silent-connections", "preauth-flood", "fd-exhaustion")


def needs_small_disks(nemesis: Nemesis) -> bool:
    return nemesis.strike in (disk_full_leader, disk_full_follower)
