"""Raft: a pure consensus core (core.py) and the node's log storage (storage/)."""
