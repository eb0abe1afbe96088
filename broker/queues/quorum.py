"""Quorum queue: a Raft group whose log holds the messages, plus the fifo machine's
compact state. Pure: no I/O (broker/node/quorum.py drives it against the log store).

Responsibilities: what a queue object must answer for the node and the AMQP layer
(name, arguments, counts, the consumers attached on this node), the encoding of log
entries (a fifo command, optionally with the leader's clock), and the bookkeeping that
ties a log index to whoever waits for it to be applied (a publisher confirm, a
basic.get, a purge, a lease operation).

Log entry payload (a COMMAND entry of the queue's group; FORMAT.md "Quorum-queue
commands"): either a fifo command as `broker/fifo/commands.py` encodes it, or, for the
commands whose effect depends on time (lease grow/settle, tick), the envelope
`0xFF | u64 leader time in ms | fifo command`. The machine sees that time as
`Meta.system_time`; an entry without it reuses the last time seen in the log, so a
replay after a restart computes exactly what the first run did.

Invariants: every live message is in the log at its raft index (bodies are read
from there, never copied into the state); `waiters[i]` is called exactly once, with
the machine's reply, when entry i is applied (or with None if the queue is deleted
first); `by_key` maps the fifo consumer keys of this node's AMQP consumers.
"""

from __future__ import annotations

import struct
from typing import Any

from ..fifo import commands
from ..fifo.state import FifoConfig, FifoState
from ..raft import RaftNode
from .replicated import ReplicatedGroup, Waiter

TIMED = 0xFF
_timed_head = struct.Struct(">BQ")
TIMED_COMMANDS = (commands.LeaseGrow, commands.LeaseSettle, commands.LeaseRelease,
                  commands.Tick)
# a no-ack consumer gets this much credit in the machine: its deliveries are settled as
# soon as they are written, which gives the credit back (flow control without acks)
NO_ACK_CREDIT = 2000


def encode_command(command: commands.Command, now_ms: int) -> bytes:
    data = commands.encode(command)
    if isinstance(command, TIMED_COMMANDS):
        return _timed_head.pack(TIMED, now_ms) + data
    return data


def decode_entry(data: bytes) -> tuple[int | None, commands.Command]:
    """(leader time in ms or None, fifo command) of a COMMAND entry."""
    if data[0] == TIMED:
        _tag, now_ms = _timed_head.unpack_from(data)
        return now_ms, commands.decode(data[_timed_head.size:])
    return None, commands.decode(data)


def _text(value) -> str | None:
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value


def fifo_config(arguments: dict) -> FifoConfig:
    """The machine's settings from validated queue arguments (queues/types.py)."""
    limit = arguments.get("x-delivery-limit", 20)
    return FifoConfig(delivery_limit=-1 if limit < 0 else limit,
                      max_length=arguments.get("x-max-length"),
                      max_bytes=arguments.get("x-max-length-bytes"),
                      overflow=_text(arguments.get("x-overflow")) or "drop-head")



class QuorumQueue(ReplicatedGroup):
    type_name = "quorum"
    durable = True
    auto_delete = False
    exclusive_owner = None
    single_active_consumer = False

    def __init__(self, vhost: str, name: str, arguments: dict, group: str,
                 raft: RaftNode | None, state: FifoState,
                 members: tuple[str, ...] = ()) -> None:
        super().__init__(group, raft)
        self.vhost = vhost
        self.name = name
        self.arguments = arguments
        self.members = members        # the group's members when declared (cluster)
        self.state = state
        self.consumers: list = []     # AMQP consumers on this node (channel.Consumer)
        self.by_key: dict[str, Any] = {}
        self.exclusive_consumer = None
        self.had_consumers = False
        self.downed: set[str] = set()  # connections of silent nodes a Down was proposed for
        self.last_time_ms = 0         # the last leader time applied (see module doc)
        self.replay_until = 0         # entries up to here were applied before a restart
        self.pending_snapshot: tuple[int, int, bytes] | None = None  # cursor, index, data
        self.snapshot_candidates: list[tuple[int, bytes]] = []  # cluster: (index, data)
        self.last_tick_ms = 0
        self.compacted_dead = 0       # dead entries below the snapshot at the last compaction
        self.config_proposed = None   # settings proposed for the machine, not yet applied

    # ------------------------------------------------------------ counts

    @property
    def ready_count(self) -> int:
        return self.state.ready_count

    @property
    def ready_bytes(self) -> int:
        return self.state.ready_bytes

    @property
    def unacked_count(self) -> int:
        return self.state.checked_out_count + self.state.leased_count

    @property
    def consumer_count(self) -> int:
        """Consumers the machine knows, as RabbitMQ counts them: a cancelled consumer
        still holding unacked messages, or a channel holding an unacked basic.get,
        counts too."""
        return sum(1 for c in self.state.consumers.values() if not c.pull_only or c.checked)

    @property
    def message_bytes(self) -> int:
        """Body bytes of every message still in the queue (ready, unacked, leased)."""
        from ..fifo.state import size_of

        total = self.state.ready_bytes
        for consumer in self.state.consumers.values():
            total += sum(size_of(item[1]) for item in consumer.checked.values())
        for lease in self.state.leases.values():
            total += sum(size_of(packed) for packed in lease.sizes)
        return total

    # ------------------------------------------------------------ consumers

    def add_consumer(self, consumer, key: str) -> None:
        self.consumers.append(consumer)
        self.by_key[key] = consumer
        self.had_consumers = True
        if consumer.exclusive:
            self.exclusive_consumer = consumer

    def remove_consumer(self, consumer) -> None:
        if consumer in self.consumers:
            self.consumers.remove(consumer)
        for key in [k for k, c in self.by_key.items() if c is consumer]:
            del self.by_key[key]
        if self.exclusive_consumer is consumer:
            self.exclusive_consumer = None

    def is_unused_for_auto_delete(self) -> bool:
        return False  # quorum queues cannot be auto-delete

    # ------------------------------------------------------------ proposals

    def propose(self, command: commands.Command | bytes, now_ms: int,
                waiter: Waiter | None = None) -> None:
        """Append a command to the log (here, or at the group's leader); `waiter` gets
        the machine's reply once the entry is committed and applied here."""
        data = command if isinstance(command, bytes) else encode_command(command, now_ms)
        self.propose_data(data, waiter)

    def restore(self, data: bytes) -> None:
        """The state machine from a snapshot the leader sent (replaces the state)."""
        from ..fifo import snapshot

        self.state = snapshot.load(data)
