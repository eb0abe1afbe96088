"""RaftConfig: the knobs of one Raft group member, validated once.

Responsibilities: hold the timing and flow-control settings of the core and refuse
impossible combinations at construction, with a message naming the key.

Time is logical: the caller calls `RaftNode.tick()` at a fixed interval (the shell
decides how long a tick is). A follower starts an election after a timeout drawn
uniformly from [election_ticks, 2 * election_ticks); a leader sends heartbeats every
heartbeat_ticks and, with check_quorum, steps down if a majority has not answered
within election_ticks. With `quiesce`, a leader whose followers all hold its whole log,
committed, sends one last heartbeat marked quiet and then nothing, and followers that
got it stop their election timers: an idle group costs no tick and no message. Leaving
that state is the caller's failure detector's business (`RaftNode.leader_lost`, core.py).

Not here: anything about storage (WAL sizes, segment sizes) or transport.
"""

from __future__ import annotations

from dataclasses import dataclass


class RaftConfigError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class RaftConfig:
    election_ticks: int = 10           # > heartbeat_ticks; randomized up to 2x
    heartbeat_ticks: int = 1           # >= 1
    max_entries_per_message: int = 64  # >= 1; one AppendEntries carries at most this many
    max_inflight: int = 256            # >= 1; unacknowledged AppendEntries per follower
    check_quorum: bool = True          # leader steps down without a majority's answers
    pre_vote: bool = True              # probe electability before bumping the term
    quiesce: bool = False              # idle groups stop heartbeats (module docstring)

    def __post_init__(self) -> None:
        for key in ("election_ticks", "heartbeat_ticks", "max_entries_per_message",
                    "max_inflight"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int):
                raise RaftConfigError(f"{key}: expected an integer, got {value!r}")
            if value < 1:
                raise RaftConfigError(f"{key}: must be at least 1, got {value}")
        for key in ("check_quorum", "pre_vote", "quiesce"):
            value = getattr(self, key)
            if not isinstance(value, bool):
                raise RaftConfigError(f"{key}: expected true or false, got {value!r}")
        if self.election_ticks <= self.heartbeat_ticks:
            raise RaftConfigError(
                f"election_ticks: must be greater than heartbeat_ticks "
                f"({self.heartbeat_ticks}), got {self.election_ticks}")
