"""Durable leases over AMQP 0-9-1: the wire side of broker/fifo/leases.py.

A lease is a named consumer of one quorum queue that survives disconnects; the Spark
connector uses one per query to get replayable, exactly-once offsets. The wire form
(docs/behaviour/leases.md):

- control, through the management RPC (node/management.py), answered once the
  command is committed and applied:
    lease.grow    {vhost, queue, lease, max_messages, max_bytes?, timeout_ms?}
                  -> {"first": first new sequence, "end": the lease's end sequence}
                  (no timeout_ms: the node's lease_timeout; 0: never)
    lease.settle  {vhost, queue, lease, up_to}  -> {"settled": n}
    lease.release {vhost, queue, lease, fence?} -> {"released": n}
                  (fence, true unless false: an operator's release, which fences
                  a lease that held messages; the holder's own release passes false)
    lease.info    {vhost, queue, lease}         -> {"first": f, "end": e, "timeout_ms": t,
                                                    "fence": null or {...},
                                                    "ready": r, "unacked": u}
                  (a local read: sequences first..end are assigned and unsettled; ready
                  and unacked are the queue's counts as queues.list gives them, absent
                  on a node without a replica of the queue; unacked only for a user
                  tagged administrator, as queues.list)
    lease.list    {vhost?, queue?}              -> one row per lease (lease_row), for
                  operators (administrator tag), as this node's replicas hold them
  A fenced lease (fifo/leases.py: released by an operator or by its idle timeout
  while it held messages) refuses grow and settle with 406 naming what went back
  to the queue (fence_text), so its holder fails instead of losing or repeating them.
- reading a range (start, end], any number of times, settling nothing: basic.consume
  on the queue with no-ack and the arguments `x-lease` (name), `x-lease-start` and
  `x-lease-end` (integers). The broker sends consume-ok, the messages with sequences
  start+1..end in order — original exchange, routing key, properties and body, with
  the header `x-lease-seq` and, when redelivered, `x-delivery-count` — and then a
  server-side basic.cancel for the tag (clients see the consumer cancelled).
  With the further argument `x-lease-format` = "packed" the same messages come
  many to a delivery instead (amqp/lease_records.py): a reader then decodes a few
  frames per thousand messages instead of three per message. With "entries" a
  delivery carries thousands of the messages' log entries as they are stored, behind
  a table of their lengths: the broker neither decodes nor re-encodes a message, and
  the reader finds each field of every entry with column operations.
  A range is streamed (Session.stream): its messages are read from the log as the
  client takes them, so the first arrive while the broker reads the rest, and a long
  range never sits whole in memory. Reading a range counts as the lease's activity
  (its idle timeout starts again, `_Touch`), as a grow or a settle does.

Permissions: a lease is its reader's state in the queue, so reading a range (a
basic.consume, checked in handlers.py) and every control operation need the user's
read permission on the queue, checked before the queue is looked up; a refusal is
403 ACCESS_REFUSED naming the queue, as RabbitMQ words it.

Errors: an unknown queue is 404; a classic queue, an unknown lease, a settled or
unassigned range, or an acking consumer is 406 PRECONDITION_FAILED naming it, before
any message is sent. A replica still applying the log it had when its node started
(every node of a cluster restarted at once: none applies its log before a new
leader commits) cannot tell an unknown lease or range from one not applied yet: it
refuses with 406 "... this replica is still applying its log after a restart, ask
again" (REPLAYING), which a reader retries rather than taking the range as gone.
A message that can no longer be read once the range has begun (the lease released
by its timeout and the message settled by another consumer, the queue deleted)
closes the channel with 406 naming it and the last sequence sent.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from itertools import islice
from typing import TYPE_CHECKING

from ..amqp import codec, spec
from ..amqp.channel import ChannelState
from ..amqp.errors import AMQPError, not_found, precondition
from ..amqp.lease_records import (ENTRIES_BYTES, ENTRIES_CONTENT_TYPE, ENTRIES_FORMAT,
                                  ENTRIES_MESSAGES, PACK_MESSAGES, PACKED_CONTENT_TYPE,
                                  PACKED_FORMAT, pack_entries, pack_raw_records)
from ..auth.users import check_access
from ..fifo import commands as fifo
from ..fifo.state import LeaseFence, size_of
from ..queues.quorum.queue import with_delivery_count

if TYPE_CHECKING:  # pragma: no cover
    from ..queues.quorum.queue import QuorumQueue

# the refusal of a range by a replica that cannot tell yet (the connector retries it,
# connector/lease_reader.py, instead of believing the range gone)
REPLAYING = "this replica is still applying its log after a restart, ask again"
_PACK_HEADER = struct.Struct(">HHQHB")  # class, weight, body size, flags, type length
_FLAG_CONTENT_TYPE = 0x8000


def _int_argument(arguments: dict, key: str, where: str, minimum: int = 0) -> int:
    value = arguments.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise precondition(f"invalid arg '{key}' for {where}: expected an integer >= "
                           f"{minimum}, got {value!r}")
    return value


def _text(value) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return value if isinstance(value, str) else None


def consume_lease_range(session, channel, queue, args, tag: str, arguments: dict) -> None:
    where = f"queue '{queue.name}' in vhost '{queue.vhost}'"
    queue.check_leases(f"invalid arg 'x-lease' for {where}: leases need a quorum queue")
    name = _text(arguments.get("x-lease"))
    if not name:
        raise precondition(f"invalid arg 'x-lease' for {where}: expected a lease name")
    if not args.no_ack:
        raise precondition(f"lease '{name}' on {where}: reading a lease range settles "
                           "nothing, consume it with no-ack (settle with lease.settle)")
    start = _int_argument(arguments, "x-lease-start", where)
    end = _int_argument(arguments, "x-lease-end", where)
    form = _format(arguments, where)
    if end < start:
        raise precondition(f"lease '{name}' on {where}: x-lease-end {end} is below "
                           f"x-lease-start {start}")
    try:
        items = (queue.lease_slice(name, start, end) if form == ENTRIES_FORMAT
                 else queue.lease_entries(name, start, end))
    except (KeyError, ValueError) as error:
        if queue.replaying():  # the lease or its range may be in the log not yet applied
            raise precondition(f"lease '{name}' on {where}: {REPLAYING}") from None
        if isinstance(error, KeyError):
            raise precondition(f"no lease '{name}' on {where}") from None
        raise precondition(f"{error} ({where})") from None
    channel.send(codec.basic_consume_ok(channel.number, tag))
    channel.lease_ranges.add(tag)
    touch = _Touch(session, queue, name)
    touch()
    if form == ENTRIES_FORMAT:
        steps = _entries_steps(session, channel, queue, tag, start + 1, *items)
    else:
        steps = (_packed_steps if form else _each_steps)(session, channel, queue, tag, items)
    session.stream(_while_open(session, channel, queue, name, tag, steps, touch))


class _Touch:
    """A range read is its lease's activity: a settle of nothing (fifo/leases.py `settle`
    up to 0) restarts the lease's idle timeout on every member, as a grow or a settle
    does, when the read starts and again each quarter of the timeout while it streams.
    So a batch whose reads outlast the timeout keeps its lease (before, only the
    driver's grows and settles counted, and such a batch was fenced mid-batch)."""

    def __init__(self, session, queue, lease: str) -> None:
        self.session, self.queue, self.lease = session, queue, lease
        self.at_ms: int | None = None  # node clock of the last touch

    def __call__(self) -> None:
        state = self.queue.lease_info(self.lease)
        timeout = state.timeout_ms if state is not None else 0
        now = self.session.node.clock_ms
        if not timeout or (self.at_ms is not None and now - self.at_ms < timeout // 4):
            return  # a lease that never times out needs no touch
        self.at_ms = now
        self.queue.propose(fifo.LeaseSettle(self.lease, 0), now)


def _format(arguments: dict, where: str) -> str | None:
    """The argument x-lease-format: None (a delivery per message), "packed" or
    "entries"."""
    value = arguments.get("x-lease-format")
    if value is None:
        return None
    if _text(value) not in (PACKED_FORMAT, ENTRIES_FORMAT):
        raise precondition(f"invalid arg 'x-lease-format' for {where}: expected "
                           f"'{PACKED_FORMAT}', '{ENTRIES_FORMAT}' or no argument, got "
                           f"{value!r}")
    return _text(value)


class _Unreadable(Exception):
    """A message of a range being streamed can no longer be read from the log."""

    def __init__(self, seq: int) -> None:
        super().__init__(seq)
        self.seq = seq


def _while_open(session, channel, queue, lease: str, tag: str,
                steps: Iterator[tuple[int, list[bytes]]],
                touch: Callable[[], None]) -> Iterator[list[bytes]]:
    """The frames of `steps` while `channel` stays open and the client has not
    cancelled `tag`, then the server's basic.cancel; a message that cannot be read any
    more closes the channel instead. `touch` keeps the lease active meanwhile."""
    sent = None
    while True:
        if (channel.state != ChannelState.OPEN or session.channels.get(channel.number) is not channel
                or tag not in channel.lease_ranges):
            return  # the client cancelled or closed the channel, or the connection closes
        try:
            step = next(steps, None)
        except _Unreadable as error:
            after = "" if sent is None else f" after sequence {sent}"
            channel.lease_ranges.discard(tag)
            session.close_channel(channel, precondition(
                f"lease '{lease}' on queue '{queue.name}' in vhost '{queue.vhost}': the "
                f"range stops{after}: sequence {error.seq} can no longer be read (settled "
                "or released, or the queue was deleted)"))
            return
        if step is None:
            break
        sent, parts = step
        touch()
        yield parts
    channel.lease_ranges.discard(tag)
    if session.capabilities.get("consumer_cancel_notify"):
        yield [codec.basic_cancel(channel.number, tag)]


def _reader(session, queue) -> Callable[[int, int], tuple[str, str, bytes, bytes]]:
    """read(seq, raft index) -> the message's exchange, routing key, header, body."""
    def read(seq: int, index: int):
        try:
            return queue.read_message(index)
        except (LookupError, RuntimeError):
            raise _Unreadable(seq) from None

    return read


def _each_steps(session, channel, queue, tag: str,
                items) -> Iterator[tuple[int, list[bytes]]]:
    """One delivery per message, x-lease-seq (and x-delivery-count) in its headers:
    (the message's sequence, its frames)."""
    read = _reader(session, queue)
    frame_max = session.frame_max
    for seq, index, count in items:
        exchange, routing_key, header, body = read(seq, index)
        header = with_delivery_count(header, count, {"x-lease-seq": seq})
        delivery_tag = channel.next_delivery_tag
        channel.next_delivery_tag += 1
        yield seq, [codec.basic_deliver(channel.number, tag, delivery_tag, count > 0,
                                        exchange, routing_key),
                    *codec.content(channel.number, header, body, frame_max)]


def _packed_steps(session, channel, queue, tag: str,
                  items) -> Iterator[tuple[int, list[bytes]]]:
    """Deliveries of many messages each (amqp/lease_records.py): (the last sequence in the
    delivery, its frames). Records are cut from the log entries' bytes, read
    PACK_MESSAGES at a time (queue.read_message_spans), nothing decoded."""
    last = 0

    def messages():
        nonlocal last
        items_iterator = iter(items)
        while True:
            chunk = list(islice(items_iterator, PACK_MESSAGES))
            if not chunk:
                return
            try:
                spans = queue.read_message_spans([index for _seq, index, _count in chunk])
            except (LookupError, RuntimeError):
                spans = None  # one is gone: read one by one to name the first of them
            for position, (seq, index, count) in enumerate(chunk):
                if spans is None:
                    try:
                        span = queue.read_message_spans([index])[0]
                    except (LookupError, RuntimeError):
                        raise _Unreadable(seq) from None
                else:
                    span = spans[position]
                last = seq   # before the yield: pack_raw_records may close a pack with it
                yield (seq, count, *span)

    for body in pack_raw_records(messages()):
        delivery_tag = channel.next_delivery_tag
        channel.next_delivery_tag += 1
        yield last, [codec.basic_deliver(channel.number, tag, delivery_tag, False, "",
                                         queue.name),
                     *codec.content(channel.number, _pack_header(len(body)), body,
                                    session.frame_max)]


# The first delivery of an "entries" range is small, so that its first messages reach
# the reader while the broker reads the rest; the next are sized from it.
FIRST_ENTRIES = 256


def _entries_steps(session, channel, queue, tag: str, first_seq: int, indexes,
                   counts: dict[int, int]) -> Iterator[tuple[int, list[bytes]]]:
    """Deliveries of thousands of whole log entries each (amqp/lease_records.py,
    "entries"): (the last sequence in the delivery, its frames). A chunk of the range
    is read from the log in one call (queue.read_entries) and sent as it is stored."""
    position, total, chunk = 0, len(indexes), FIRST_ENTRIES
    while position < total:
        part = indexes[position:position + chunk]
        try:
            entries = queue.read_entries(part)
        except (LookupError, RuntimeError):
            raise _Unreadable(first_seq + position + _first_unreadable(queue, part)) from None
        in_part = {at - position: count for at, count in counts.items()
                   if position <= at < position + len(part)} if counts else {}
        body = pack_entries(first_seq + position, entries, in_part)
        position += len(part)
        delivery_tag = channel.next_delivery_tag
        channel.next_delivery_tag += 1
        yield first_seq + position - 1, [
            codec.basic_deliver(channel.number, tag, delivery_tag, False, "", queue.name),
            *codec.content(channel.number, _pack_header(len(body), ENTRIES_CONTENT_TYPE),
                           body, session.frame_max)]
        chunk = max(FIRST_ENTRIES, min(ENTRIES_MESSAGES,
                                       ENTRIES_BYTES * len(part) // max(len(body), 1)))


def _first_unreadable(queue, indexes) -> int:
    """The position of the first of `indexes` whose entry cannot be read."""
    for position, index in enumerate(indexes):
        try:
            queue.read_entries([index])
        except (LookupError, RuntimeError):
            return position
    return 0


def _pack_header(body_size: int, content_type: str = PACKED_CONTENT_TYPE) -> bytes:
    raw = content_type.encode()
    return _PACK_HEADER.pack(60, 0, body_size, _FLAG_CONTENT_TYPE, len(raw)) + raw


# ------------------------------------------------------------------ management ops


def _queue(node, session, request) -> "QuorumQueue":
    from .management import _vhost

    vhost = _vhost(node, session, request.get("vhost", "/"))
    name = request["queue"]
    check_access(session.user, vhost.name, "read", "queue", name)
    queue = vhost.queues.get(name)
    if queue is None:
        raise not_found("queue", name, vhost.name)
    queue.check_leases(f"queue '{name}' in vhost '{vhost.name}' is not a quorum queue; "
                       "leases need one")
    return queue


def _lease_name(request) -> str:
    name = request["lease"]
    if not isinstance(name, str) or not name:
        raise ValueError("'lease' must be a non-empty string")
    return name


def _count(request, key: str, default: int | None = None) -> int:
    value = request.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"'{key}' must be an integer >= 0, got {value!r}")
    return value


def grow(node, session, request):
    from .management import Later

    queue = _queue(node, session, request)
    default = node.settings.lease_timeout_ms or 0
    name = _lease_name(request)
    command = fifo.LeaseGrow(name, _count(request, "max_messages"),
                             _count(request, "max_bytes", 0),
                             _count(request, "timeout_ms", default))
    if command.max_messages > 0xFFFFFFFF:
        raise ValueError("'max_messages' must fit in 32 bits")
    return Later(lambda done: queue.propose(
        command, node.clock_ms, lambda reply: done(_grown(queue, name, reply))))


def _grown(queue, name: str, reply):
    if reply is None:
        return not_found("queue", queue.name, queue.vhost)
    if isinstance(reply, LeaseFence):
        return precondition(fence_text(name, queue, reply))
    first, end = reply
    return {"first": first, "end": end}


def settle(node, session, request):
    from .management import Later

    queue = _queue(node, session, request)
    name = _lease_name(request)
    command = fifo.LeaseSettle(name, _count(request, "up_to"))
    return Later(lambda done: queue.propose(
        command, node.clock_ms, lambda reply: done(
            precondition(fence_text(name, queue, reply)) if isinstance(reply, LeaseFence)
            else {"settled": reply or 0})))


def release(node, session, request):
    from .management import Later

    queue = _queue(node, session, request)
    fence = request.get("fence", True)
    if not isinstance(fence, bool):
        raise ValueError(f"'fence' must be true or false, got {fence!r}")
    command = fifo.LeaseRelease(_lease_name(request), fence)
    return Later(lambda done: queue.propose(
        command, node.clock_ms, lambda reply: done({"released": reply or 0})))


def info(node, session, request) -> dict:
    queue = _queue(node, session, request)
    name = _lease_name(request)
    lease = queue.lease_info(name)
    if lease is None:
        raise AMQPError(spec.NOT_FOUND, f"no lease '{name}' on queue '{queue.name}' in "
                        f"vhost '{queue.vhost}'")
    row = {"first": lease.first_seq, "end": lease.end_seq, "timeout_ms": lease.timeout_ms,
           "fence": _fence_fields(lease.fence)}
    if queue.raft is not None:  # this node's replica: its counts, read here too
        row["ready"] = queue.ready_count
        if "administrator" in session.user.tags:  # as queues.list shows it
            row["unacked"] = queue.unacked_count
    return row


def fence_text(name: str, queue, fence: LeaseFence) -> str:
    """The refusal of a fenced lease's grow or settle (without the reply code)."""
    when = _utc(fence.at_ms)
    how = ("released by an operator" if fence.reason == "released" else
           f"released after {fence.timeout_ms} ms idle (its lease timeout)")
    return (f"lease '{name}' on queue '{queue.name}' in vhost '{queue.vhost}' is fenced: "
            f"it was {how} at {when}, and its messages with sequences "
            f"{fence.first_seq}..{fence.end_seq} went back to the queue, where other "
            "consumers may read them; its holder can no longer settle or grow it")


def _utc(ms: int) -> str:
    """Leader time `ms` (since the epoch) as a UTC timestamp; nothing reads the clock."""
    stamp = datetime.fromtimestamp(ms / 1000, timezone.utc)
    return stamp.strftime("%Y-%m-%d %H:%M:%S UTC")


def _fence_fields(fence: LeaseFence | None) -> dict | None:
    if fence is None:
        return None
    return {"first": fence.first_seq, "end": fence.end_seq, "reason": fence.reason,
            "at_ms": fence.at_ms, "timeout_ms": fence.timeout_ms}


def lease_row(queue, name: str, lease, now_ms: int) -> dict:
    """One lease as operators see it (lease.list, /api/leases, `queues list_leases`).
    state: "holding" (messages first..end are the holder's), "empty" (it holds none:
    everything settled or released by its holder) or "fenced"; idle_ms: since its
    last grow, settle or range read; expires_in_ms: until its timeout gives its messages back
    (null: it holds none, or never times out)."""
    held = len(lease.indexes)
    idle = max(0, now_ms - lease.last_active)
    expires = (max(0, lease.timeout_ms - idle) if held and lease.timeout_ms else None)
    state = "fenced" if lease.fence is not None else "holding" if held else "empty"
    return {"vhost": queue.vhost, "queue": queue.name, "lease": name, "state": state,
            "messages": held, "message_bytes": sum(size_of(p) for p in lease.sizes),
            "first": lease.first_seq, "end": lease.end_seq,
            "timeout_ms": lease.timeout_ms, "idle_ms": idle, "expires_in_ms": expires,
            "fence": _fence_fields(lease.fence)}


def list_leases(node, session, request) -> list[dict]:
    from .management import _require_administrator, _vhost

    _require_administrator(session)
    names = ([request["vhost"]] if request.get("vhost") is not None
             else sorted(session.user.vhosts))
    wanted = request.get("queue")
    rows = []
    for vhost_name in names:
        vhost = _vhost(node, session, vhost_name) if request.get("vhost") is not None \
            else node.vhost(vhost_name)
        if vhost is None:
            continue
        if wanted is not None and wanted not in vhost.queues:
            raise not_found("queue", wanted, vhost.name)
        for queue_name in sorted(vhost.queues):
            if wanted is not None and queue_name != wanted:
                continue
            queue = vhost.queues[queue_name]
            for name, lease in sorted(queue.leases().items()):
                rows.append(lease_row(queue, name, lease, node.clock_ms))
    return rows


OPERATIONS = {"lease.grow": grow, "lease.settle": settle, "lease.release": release,
              "lease.info": info, "lease.list": list_leases}
