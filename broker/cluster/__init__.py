"""Multi-node clusters: what nodes say to each other and how it travels.

Kept import-free: import the modules themselves (`cluster`, `wire`, `outbox`, ...).
"""
