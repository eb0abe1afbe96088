"""Sockets facing the network: listeners that survive hostile clients and exhausted
descriptors, and what the broker's HTTP servers share (README.md)."""
