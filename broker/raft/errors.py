"""What a Raft member refuses, and why. Raised by RaftNode's input methods.

Not here: invariant violations inside the core, which are bugs and raise
`RaftInvariantError` (never caught, never retried).
"""

from __future__ import annotations


class NotLeader(Exception):
    """The request must go to the leader; `leader_hint` is who that is, if known."""

    def __init__(self, leader_hint: str | None) -> None:
        super().__init__(f"not the leader (leader: {leader_hint or 'unknown'})")
        self.leader_hint = leader_hint


class ProposalRejected(Exception):
    """The leader cannot take this proposal now; the reason says why."""


class RaftInvariantError(AssertionError):
    """The core found its own state or a peer's message impossible: a bug."""
