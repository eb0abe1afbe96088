"""The node's Raft log storage: one WAL shared by every group, per-group segment files
and snapshots. Start with log_store.py; the byte formats are in FORMAT.md."""

from .config import StorageConfig
from .errors import CorruptLogError
from .group_log import GroupLog
from .log_store import CompactionResult, LogStore

__all__ = ["CompactionResult", "CorruptLogError", "GroupLog", "LogStore", "StorageConfig"]
