"""RaftConfig refuses impossible settings at construction, naming the key."""

from __future__ import annotations

import pytest

from quorumqueue.broker.raft.config import RaftConfig, RaftConfigError


def test_defaults_are_valid():
    config = RaftConfig()
    assert config.election_ticks > config.heartbeat_ticks >= 1


@pytest.mark.parametrize("settings, message", [
    ({"election_ticks": 0}, "election_ticks: must be at least 1, got 0"),
    ({"heartbeat_ticks": 0}, "heartbeat_ticks: must be at least 1, got 0"),
    ({"election_ticks": 3, "heartbeat_ticks": 3},
     "election_ticks: must be greater than heartbeat_ticks (3), got 3"),
    ({"max_entries_per_message": 0}, "max_entries_per_message: must be at least 1, got 0"),
    ({"max_inflight": -1}, "max_inflight: must be at least 1, got -1"),
    ({"max_inflight": 2.5}, "max_inflight: expected an integer, got 2.5"),
    ({"election_ticks": True}, "election_ticks: expected an integer, got True"),
    ({"check_quorum": 1}, "check_quorum: expected true or false, got 1"),
    ({"pre_vote": "yes"}, "pre_vote: expected true or false, got 'yes'"),
])
def test_impossible_settings_name_the_key(settings, message):
    with pytest.raises(RaftConfigError) as raised:
        RaftConfig(**settings)
    assert str(raised.value) == message
