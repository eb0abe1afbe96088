"""Random schedules over 3 and 5 members: Raft's safety properties hold whatever the
network and crashes do, and liveness returns once the network heals (Raft paper §5,
Figure 3). See simulator.py for what is checked when.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quorumqueue.broker.raft.config import RaftConfig

from .simulator import Simulation

# Weights. Deliveries dominate (messages are fast next to ticks); faults are
# occasional and short-lived (heal and restart outweigh partition and crash).
ACTIONS = (["deliver"] * 14 + ["deliver_any"] * 4 + ["deliver_mid_ready"] * 2
           + ["deliver_all"] * 14 + ["tick"] * 6 + ["tick_all"] * 6 + ["propose"] * 8
           + ["drop"] * 2 + ["duplicate", "delay", "transfer", "partition", "crash"]
           + ["heal"] * 4 + ["restart"] * 4 + ["compact"] * 5 + ["suspect"])

# Long schedules: Hypothesis favours short lists, and a run needs a few election
# timeouts before anything is committed.
SCHEDULE_LENGTH = {"min_size": 150, "max_size": 400}
schedules = st.lists(st.tuples(st.sampled_from(ACTIONS), st.integers(0, 1 << 16)),
                     **SCHEDULE_LENGTH)

configs = st.builds(RaftConfig,
                    election_ticks=st.integers(3, 6), heartbeat_ticks=st.just(1),
                    max_entries_per_message=st.integers(1, 4),
                    max_inflight=st.integers(1, 4),
                    check_quorum=st.booleans(), pre_vote=st.booleans(),
                    quiesce=st.booleans())

# Election timeouts allowed, after healing, until a leader has been recognised by every
# member for two timeouts in a row. Measured over ~2,800 random runs: median 2,
# worst about 10.
ELECTION_BOUND = 20


def run(size: int, config: RaftConfig, seed: int, schedule, voters: int | None = None) -> None:
    ids = tuple("abcde"[:size])
    sim = Simulation(ids, config, seed, voters=ids[:voters] if voters else None)
    try:
        for action, arg in schedule:
            sim.do(action, arg)
        sim.check_logs()
        sim.settle(max_ticks=ELECTION_BOUND * config.election_ticks)
    except AssertionError as failure:
        failure.add_note("last actions: " + ", ".join(sim.trace[-25:]))
        raise


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=configs, seed=st.integers(0, 1 << 16), schedule=schedules)
def test_three_members_random_schedules(config, seed, schedule):
    run(3, config, seed, schedule)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=configs, seed=st.integers(0, 1 << 16), schedule=schedules)
def test_five_members_random_schedules(config, seed, schedule):
    run(5, config, seed, schedule)


MEMBERSHIP_ACTIONS = ACTIONS + ["add"] * 2 + ["remove"] * 2


# A removed member that never learns of its removal keeps campaigning; without pre-vote
# or check-quorum (leases) nothing stops it from deposing leaders (thesis §4.2.3).
membership_configs = configs.filter(lambda config: config.pre_vote or config.check_quorum)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=membership_configs, seed=st.integers(0, 1 << 16),
       schedule=st.lists(st.tuples(st.sampled_from(MEMBERSHIP_ACTIONS),
                                   st.integers(0, 1 << 16)), **SCHEDULE_LENGTH))
def test_membership_changes_random_schedules(config, seed, schedule):
    """Five running ids, three of them the initial group; members come and go."""
    run(5, config, seed, schedule, voters=3)
