"""The log-entry envelope: what a quorum queue's COMMAND entry holds around a fifo command.

Responsibilities: encode a fifo command into the data of a COMMAND log entry, and
decode one back into (leader time, command). This is the documented format the
broker writes and the analytics jobs read (broker/raft/storage/FORMAT.md,
"Quorum-queue entries").

How it works: the data is one of two forms.
- A fifo command exactly as `commands.encode` writes it.
- The envelope `u8 0xFF | u64 leader time in ms since the Unix epoch | command`,
  for the commands whose effect depends on time (`TIMED_COMMANDS`, `stamp`).
  Those are lease grow, settle and release, and tick. Also every command that may
  hand a message out: checkout, cancel, settle, return, discard, down, get, node
  down and up. A message whose TTL ran out must not be handed out. (rabbit_fifo
  gives every command the leader's time.) And every Enqueue: its message TTL
  counts from it.
The leader stamps its clock when it proposes. Every replica applies the entry with
that time (`Meta.system_time`). An entry without one reuses the latest time seen
in the log. So a replay after a restart computes exactly what the first run did.

A command forwarded by a node that does not lead the queue is wrapped once more,
outermost, with its identity (u8 0xFE ...: broker/raft/forwarded.py). Whoever reads
an entry takes that off (`forwarded.unwrap`) before `decode_entry`.

Invariants: 0xFF (`TIMED`) and 0xFE (the identity) are never command tags. Tags
are 1..21 and only grow by one at a time. So the first octet tells the forms
apart. The envelope's layout is version 1 of the format, and never changes in
place.

Not here: the commands' own encodings (commands.py), applying them (machine.py),
proposing them (broker/queues/quorum/queue.py).
"""

from __future__ import annotations

import struct

from . import commands

TIMED = 0xFF                        # first octet of an entry with a leader time
TIMED_HEAD = struct.Struct(">BQ")   # TIMED, leader time in ms
TIMED_COMMANDS = (commands.LeaseGrow, commands.LeaseSettle, commands.LeaseRelease,
                  commands.Tick, commands.Checkout, commands.Cancel, commands.Settle,
                  commands.Return, commands.Discard, commands.Down, commands.Dequeue,
                  commands.NodeDown, commands.NodeUp)


def encode_command(command: commands.Command, now_ms: int) -> bytes:
    """The data of a COMMAND entry for `command`, stamped with `now_ms` if its effect
    depends on time."""
    data = commands.encode(command)
    if isinstance(command, TIMED_COMMANDS):
        return TIMED_HEAD.pack(TIMED, now_ms) + data
    return data


def stamp(data: bytes, now_ms: int) -> bytes:
    """Already encoded command data (an Enqueue) in the time envelope."""
    return TIMED_HEAD.pack(TIMED, now_ms) + data


def stamped_enqueue(now_ms: int, publisher: str, seq: int, priority: int, exchange: str,
                    routing_key: str, header: bytes, body: bytes,
                    blind_keys: tuple[str, ...] = ()) -> bytes:
    """`stamp(commands.encode_enqueue(...), now_ms)` built in one piece."""
    return commands.encode_enqueue(publisher, seq, priority, exchange, routing_key, header,
                                   body, TIMED_HEAD.pack(TIMED, now_ms), blind_keys)


_u32_unpack = commands._u32.unpack_from


def stamped_enqueues(now_ms: int, publisher: str, first: int, priority: int, exchange: str,
                     routing_key: str, head: bytes, middle: bytes, tail: bytes,
                     records: bytes, offsets: list[int]) -> list[bytes]:
    """The entries of a batch publish's messages (amqp/batch_publish.py `Batch`),
    each in one join: twin of `stamped_enqueue(now_ms, publisher, first + k,
    priority, exchange, routing_key, header_k, body_k)` for message k. Its body is
    the record at `offsets[k]` in `records` (u32 length, bytes). Its header is
    `head + u64 body size + middle + i64 (first + k) + tail`."""
    publisher_bytes = publisher.encode("utf-8", "surrogateescape")  # twin of encode_enqueue
    exchange_bytes = exchange.encode("utf-8", "surrogateescape")
    key_bytes = routing_key.encode("utf-8", "surrogateescape")
    header_size = len(head) + 8 + len(middle) + 8 + len(tail)
    prefix = b"".join((commands._u16.pack(len(publisher_bytes)), publisher_bytes,
                       commands._u8.pack(len(exchange_bytes)), exchange_bytes,
                       commands._u8.pack(len(key_bytes)), key_bytes,
                       commands._u32.pack(header_size), head))
    # everything before the body in one pack: TIMED_HEAD, _enqueue_head (tag 1), the
    # prefix, the header's u64 body size, middle, its i64 seq, tail
    pack = struct.Struct(f">BQBBIQ{len(prefix)}sQ{len(middle)}sq{len(tail)}s").pack
    view = memoryview(records)
    join = b"".join
    entries = []
    seq = first
    for offset in offsets:
        length = _u32_unpack(records, offset)[0]
        entries.append(join((pack(TIMED, now_ms, 1, priority, length, seq, prefix, length,
                                  middle, seq, tail), view[offset + 4:offset + 4 + length])))
        seq += 1
    return entries


def decode_entry(data: bytes) -> tuple[int | None, commands.Command]:
    """(leader time in ms or None, fifo command) of a COMMAND entry."""
    if data[0] == TIMED:
        _tag, now_ms = TIMED_HEAD.unpack_from(data)
        return now_ms, commands.decode(data, TIMED_HEAD.size)
    return None, commands.decode(data)
