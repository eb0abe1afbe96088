"""The node's Raft groups: the metadata group and every quorum queue's, their Ready driver.

README.md in this folder; read driver.py, replicated.py, metadata.py.
"""
