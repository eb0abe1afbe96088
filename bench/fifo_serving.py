"""The quorum-queue machine's cost per message as consumers are added, in process.

    PYTHONPATH=<dir holding quorumqueue -> a checkout> python bench/fifo_serving.py
        [--consumers 1,10,50] [--messages 60000] [--repeats 3]

Issue 31 (Build 5): bench/many_clients.py measures the whole node from outside, where
the load of a shared machine hides a few microseconds a message. This applies the
fifo machine alone (broker/fifo/machine.py `apply`), as a queue's leader does, to
one publisher's Enqueues (1 KB) and the Settles of N consumers (prefetch 1000 each):
a message is settled once 1,700 are out, about what many_clients.py's 10 + 10 held
unacked (so the consumers have room, and every Enqueue is served at once). Prints,
per N, the wall time of each repeat divided by the messages (Enqueue + Settle).

The tree measured is the ``quorumqueue`` package on PYTHONPATH (as many_clients.py
``--tree`` links it); for an A/B, alternate two such directories (A B B A ...).
"""

from __future__ import annotations

import argparse
import collections
import time

from quorumqueue.broker.fifo.commands import Checkout, Deliver, Enqueue, Meta, Settle
from quorumqueue.broker.fifo.machine import apply
from quorumqueue.broker.fifo.state import FifoConfig, FifoState

UNACKED = 1700


def per_message_us(consumers: int, messages: int) -> float:
    """Microseconds of `apply` (and this loop) per message with `consumers` consumers."""
    state, index = FifoState(config=FifoConfig()), 0
    out: collections.deque[tuple[str, int]] = collections.deque()

    def step(command) -> None:
        nonlocal state, index
        index += 1
        state, _reply, effects = apply(Meta(index, 1, index), command, state)
        for effect in effects:
            if isinstance(effect, Deliver):
                out.extend((effect.consumer, d.msg_id) for d in effect.deliveries)

    for n in range(consumers):
        step(Checkout(f"c{n}", 1000, 0, f"n1:r1.conn{n}"))
    start = time.perf_counter()
    for seq in range(1, messages + 1):
        step(Enqueue("p1", seq, 1000, 0))
        while len(out) > UNACKED:
            key, msg_id = out.popleft()
            step(Settle(key, (msg_id,)))
    return (time.perf_counter() - start) / messages * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--consumers", default="1,10,50")
    parser.add_argument("--messages", type=int, default=60_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    for consumers in (int(n) for n in args.consumers.split(",")):
        runs = [per_message_us(consumers, args.messages) for _ in range(args.repeats)]
        print(f"{consumers} consumers: " + " ".join(f"{us:.2f}" for us in runs) + " us/msg")


if __name__ == "__main__":
    main()
