"""The quorum queue type: a Raft group whose log holds the messages, and the fifo machine.

queue.py (the queue as the node sees it), groups.py (this node's quorum groups, the
Ready round's handler, the machine's effects), deliveries.py (messages read back
from the log to consumers), dead_letter_worker.py (at-least-once dead lettering),
peeked.py (a peeked message's rows).
"""
