"""Raft: a pure consensus core (core.py) and the node's log storage (storage/)."""

from .config import RaftConfig, RaftConfigError
from .core import RaftNode
from .errors import NotLeader, ProposalRejected, RaftInvariantError
from .log import LogReader, Snapshot
from .membership import decode_members, encode_members
from .messages import (AppendEntries, AppendEntriesResponse, InstallSnapshot,
                       InstallSnapshotResponse, Message, RequestVote, RequestVoteResponse,
                       TimeoutNow)
from .ready import Ready, Role
from .types import COMMAND, MEMBERSHIP, NOOP, HardState, LogEntry, SnapshotMeta

__all__ = [
    "COMMAND", "MEMBERSHIP", "NOOP", "AppendEntries", "AppendEntriesResponse", "HardState",
    "InstallSnapshot", "InstallSnapshotResponse", "LogEntry", "LogReader", "Message",
    "NotLeader", "ProposalRejected", "RaftConfig", "RaftConfigError", "RaftInvariantError",
    "RaftNode", "Ready", "RequestVote", "RequestVoteResponse", "Role", "Snapshot",
    "SnapshotMeta", "TimeoutNow", "decode_members", "encode_members",
]
