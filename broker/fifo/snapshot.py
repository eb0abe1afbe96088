"""Machine snapshots: a FifoState as bytes and back (writes format version 7).

Layout: b"QQFS" | u16 version | u32 json length | JSON (everything but the message
arrays, with the byte length of each array) | the arrays' raw bytes (little-endian
machine order is recorded in the JSON as "byteorder" and converted on load).
Restoring a snapshot taken after entry i and applying entries i+1.. gives the same
state as applying every entry from the start (tested as a property).

Versions: 2 added the length limits to "config" ("max_length", "max_bytes",
"overflow") and "publishers_blocked" to the state; the layout is unchanged. `load`
reads 1 to 3 (a version-1 snapshot is a queue without limits, nothing blocked).
3 added "enqueuer_gaps" (each publisher's first rejected seq not yet stored; older
versions: none). A build that only knows an older version refuses a newer one
("unknown fifo snapshot version 3") rather than silently dropping what it adds.
4 added message and queue TTL: "msg_ttl" and "expires" in "config",
"last_active" (the leader time the queue was last used), "expiries_out" (raft index -> expiry
of checked-out and leased messages), and after the lease arrays one u64 expiry
array per ready queue (high, normal, returns: length 0 for a queue that keeps no
expiries); "array_lengths" lists them too. Older versions: no TTL anywhere.
5 added single active consumer and at-least-once dead lettering: "single_active"
in "config" (x-single-active-consumer) and "active" (the active consumer's key, or
null); "dead_letter_at_least_once" in "config" and "dlx" (the held dead letters:
"discards", waiting, as [raft index, size, reason]; "consumer", the worker, as
{"worker", "prefetch", "checked": [[msg id, raft index, size, reason], ...]} or null;
"next_msg_id"; "bytes"). Older versions: none of these (no active consumer, none
held).
6 added suspected consumers (fifo/nodes.py): "suspected" in each consumer (true while
its node is suspected down; older versions: none suspected), and "delivery_counts"
may hold a count of 0 (a message returned uncounted by a suspected consumer, still
redelivered; a version-5 reader would take it for never delivered, and would lose
"suspected" without a word: hence the version).
7 added lease fences (fifo/leases.py): "fence" in each lease, [first seq, end seq,
reason, at ms, timeout ms] or null (older versions: none fenced).
"config" is the machine's current one (the queue's arguments, then any UpdateConfig
applied since), so a restore keeps a policy's limits: a log compacted below an
UpdateConfig does not lose it.
"""

from __future__ import annotations

import json
import struct
import sys
from array import array
from collections import deque

from .state import (ConsumerState, DlxConsumer, DlxState, FifoConfig, FifoState, IndexQueue,
                    LeaseFence, LeaseState)

MAGIC = b"QQFS"
VERSION = 7
READABLE_VERSIONS = (1, 2, 3, 4, 5, 6, 7)
_head = struct.Struct(">4sHI")


def _queue_arrays(queue: IndexQueue) -> list[array]:
    return [queue.indexes[queue.head:], queue.sizes[queue.head:]]


def _dump_fence(fence: LeaseFence | None) -> list | None:
    if fence is None:
        return None
    return [fence.first_seq, fence.end_seq, fence.reason, fence.at_ms, fence.timeout_ms]


def _dump_dlx(dlx: DlxState) -> dict:
    consumer = dlx.consumer
    return {"discards": [list(item) for item in dlx.discards],
            "consumer": None if consumer is None else {
                "worker": consumer.worker, "prefetch": consumer.prefetch,
                "checked": [[m, *v] for m, v in sorted(consumer.checked.items())]},
            "next_msg_id": dlx.next_msg_id, "bytes": dlx.bytes}


def _load_dlx(document: dict) -> DlxState:
    consumer = document["consumer"]
    return DlxState(
        deque(tuple(item) for item in document["discards"]),
        None if consumer is None else DlxConsumer(
            consumer["worker"], consumer["prefetch"],
            {m: (i, size, reason) for m, i, size, reason in consumer["checked"]}),
        document["next_msg_id"], document["bytes"])


def dump(state: FifoState) -> bytes:
    arrays: list[array] = []
    for queue in (state.high, state.normal, state.returns):
        arrays += _queue_arrays(queue)
    lease_names = sorted(state.leases)
    for name in lease_names:
        arrays += [state.leases[name].indexes, state.leases[name].sizes]
    for queue in (state.high, state.normal, state.returns):
        arrays.append(queue.expiries[queue.head:] if queue.expiries is not None
                      else array("Q"))
    document = {
        "byteorder": sys.byteorder,
        "config": {"delivery_limit": state.config.delivery_limit,
                   "release_cursor_interval": state.config.release_cursor_interval,
                   "max_length": state.config.max_length,
                   "max_bytes": state.config.max_bytes,
                   "overflow": state.config.overflow,
                   "msg_ttl": state.config.msg_ttl,
                   "expires": state.config.expires,
                   "single_active": state.config.single_active,
                   "dead_letter_at_least_once": state.config.dead_letter_at_least_once},
        "dlx": _dump_dlx(state.dlx),
        "delivery_counts": sorted(state.delivery_counts.items()),
        "expiries_out": sorted(state.expiries_out.items()),
        "last_active": state.last_active,
        "high_run": state.high_run,
        "consumers": {key: {"prefetch": c.prefetch, "priority": c.priority,
                            "connection": c.connection, "order": c.order,
                            "pull_only": c.pull_only, "cancelled": c.cancelled,
                            "suspected": c.suspected, "next_msg_id": c.next_msg_id,
                            "checked": [[m, *v] for m, v in sorted(c.checked.items())]}
                      for key, c in state.consumers.items()},
        "active": state.active,
        "next_consumer_order": state.next_consumer_order,
        "rotation": state.rotation,
        "enqueuers": state.enqueuers,
        "publishers_blocked": state.publishers_blocked,
        "enqueuer_gaps": state.enqueuer_gaps,
        "leases": [{"name": name, "counts": sorted(state.leases[name].counts.items()),
                    "first_seq": state.leases[name].first_seq,
                    "next_seq": state.leases[name].next_seq,
                    "timeout_ms": state.leases[name].timeout_ms,
                    "last_active": state.leases[name].last_active,
                    "fence": _dump_fence(state.leases[name].fence)} for name in lease_names],
        "enqueue_count": state.enqueue_count,
        "applied_since_cursor": state.applied_since_cursor,
        "release_cursor": state.release_cursor,
        "last_index": state.last_index,
        "array_lengths": [len(a) for a in arrays],
    }
    header = json.dumps(document, separators=(",", ":")).encode()
    return b"".join([_head.pack(MAGIC, VERSION, len(header)), header]
                    + [a.tobytes() for a in arrays])


def load(data: bytes) -> FifoState:
    magic, version, length = _head.unpack_from(data)
    if magic != MAGIC:
        raise ValueError("not a quorumqueue fifo snapshot")
    if version not in READABLE_VERSIONS:
        raise ValueError(f"unknown fifo snapshot version {version}")
    document = json.loads(data[_head.size:_head.size + length])
    offset = _head.size + length
    arrays = []
    lengths = document["array_lengths"]
    expiry_arrays = 3 if version >= 4 else 0
    for position, count in enumerate(lengths):
        expiry = position >= len(lengths) - expiry_arrays
        typecode = "Q" if expiry or position % 2 == 0 else "I"
        values = array(typecode)
        size = count * values.itemsize
        values.frombytes(data[offset:offset + size])
        if document["byteorder"] != sys.byteorder:
            values.byteswap()
        arrays.append(values)
        offset += size
    state = FifoState(config=FifoConfig(**document["config"]))
    for position, queue in enumerate((state.high, state.normal, state.returns)):
        queue.indexes, queue.sizes = arrays[2 * position], arrays[2 * position + 1]
        queue.bytes = sum(s & 0x7FFFFFFF for s in queue.sizes)
        queue.ascending = all(a < b for a, b in zip(queue.indexes, queue.indexes[1:]))
        if expiry_arrays:
            expiries = arrays[len(arrays) - 3 + position]
            queue.expiries = expiries if len(expiries) else None
    if version >= 5:
        state.dlx = _load_dlx(document["dlx"])
    state.expiries_out = ({int(k): v for k, v in document["expiries_out"]}
                          if version >= 4 else {})
    state.last_active = document["last_active"] if version >= 4 else 0
    state.delivery_counts = {int(k): v for k, v in document["delivery_counts"]}
    state.high_run = document["high_run"]
    for key, c in document["consumers"].items():
        state.consumers[key] = ConsumerState(
            c["prefetch"], c["priority"], c["connection"], c["order"], c["pull_only"],
            c["cancelled"], c.get("suspected", False), c["next_msg_id"],
            {m: (i, p, n) for m, i, p, n in c["checked"]})
    state.active = document["active"] if version >= 5 else None
    state.next_consumer_order = document["next_consumer_order"]
    state.rotation = document["rotation"]
    state.enqueuers = dict(document["enqueuers"])
    state.publishers_blocked = document["publishers_blocked"] if version >= 2 else False
    state.enqueuer_gaps = dict(document["enqueuer_gaps"]) if version >= 3 else {}
    for position, item in enumerate(document["leases"]):
        state.leases[item["name"]] = LeaseState(
            arrays[6 + 2 * position], arrays[7 + 2 * position],
            {int(k): v for k, v in item["counts"]}, item["first_seq"], item["next_seq"],
            item["timeout_ms"], item["last_active"],
            LeaseFence(*item["fence"]) if item.get("fence") else None)
    state.enqueue_count = document["enqueue_count"]
    state.applied_since_cursor = document["applied_since_cursor"]
    state.release_cursor = document["release_cursor"]
    state.last_index = document["last_index"]
    return state
