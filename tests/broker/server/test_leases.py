"""Durable leases over AMQP (docs/behaviour/leases.md), as the Spark connector uses them.

A lease is grown by a logged command, so its ranges are fixed; reading a range any
number of times, from any connection, before or after a crash, gives the same bytes
in the same order; settling removes messages for good; releasing (or idling past the
timeout) returns them to the queue for ordinary consumers, delivery count + 1. A
release its holder did not ask for (an operator's, the timeout) fences the lease:
its holder's later grows and settles are refused, naming what went back.
"""

from __future__ import annotations

import time

import pika
import pytest

from quorumqueue.client.lease_client import LeaseClient
from quorumqueue.client.lease_records import PackedDecoder
from quorumqueue.client.management import ManagementError, call
from quorumqueue.client.range_reader import RangeReader

from tests.support.broker import BrokerProcess
from .pika_support import channel_error, connect, unique

pytestmark = pytest.mark.timeout(60)


def quorum_queue_with(broker, count: int, prefix: str = "lease") -> str:
    name = unique(prefix)
    connection = connect(broker)
    channel = connection.channel()
    channel.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
    channel.confirm_delivery()
    for number in range(count):
        channel.basic_publish(
            "", name, f"message {number} ".encode() + bytes([number % 256]) * number,
            pika.BasicProperties(delivery_mode=2, content_type="application/octet-stream",
                                 message_id=f"id-{number}", headers={"n": number}))
    connection.close()
    return name


def snapshot(messages) -> list[tuple]:
    return [(m.seq, m.body, m.exchange, m.routing_key, m.properties.message_id,
             m.properties.content_type, m.properties.headers.get("n")) for m in messages]


def test_a_grown_range_reads_back_identically_any_number_of_times(broker):
    queue = quorum_queue_with(broker, 30)
    with LeaseClient(broker.uri) as client:
        assert client.grow(queue, "q1", max_messages=10) == (1, 10)
        assert client.grow(queue, "q1", max_messages=10) == (11, 20)
        first = client.read(queue, "q1", 0, 20)
        assert [m.seq for m in first] == list(range(1, 21))
        assert [m.properties.message_id for m in first] == [f"id-{n}" for n in range(20)]
        assert snapshot(client.read(queue, "q1", 0, 20)) == snapshot(first)
        assert snapshot(client.read(queue, "q1", 5, 12)) == snapshot(first[5:12])
    with LeaseClient(broker.uri) as other:  # the lease outlives the connection
        assert snapshot(other.read(queue, "q1", 10, 20)) == snapshot(first[10:20])
        assert other.info(queue, "q1") == {"first": 1, "end": 20, "timeout_ms": 1_800_000,
                                           "fence": None,  # the broker's lease_timeout
                                           "ready": 10, "unacked": 20}


def test_leased_messages_are_not_delivered_to_consumers_and_settle_removes_them(broker):
    queue = quorum_queue_with(broker, 6)
    with LeaseClient(broker.uri) as client:
        assert client.grow(queue, "q", max_messages=4) == (1, 4)
        connection = connect(broker)
        channel = connection.channel()
        declared = channel.queue_declare(queue, passive=True).method
        assert declared.message_count == 2  # only the unleased ones are ready
        method, _properties, body = channel.basic_get(queue, auto_ack=True)
        assert body.startswith(b"message 4 ")
        assert client.settle(queue, "q", 3) == 3
        assert client.info(queue, "q")["first"] == 4
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            client.read(queue, "q", 0, 4)
        assert info.value.reply_code == 406 and "settled" in info.value.reply_text
        connection.close()


def test_lease_info_gives_the_queues_counts_with_the_lease(broker):
    """The connector's lag report asks one lease.info per queue and trigger: the
    queue's ready count comes with it, and its unacked count for an administrator
    (queues.list shows that only to administrators too)."""
    queue = quorum_queue_with(broker, 6)
    with LeaseClient(broker.uri) as client:
        client.grow(queue, "q", max_messages=4)
        info = client.info(queue, "q")
        assert (info["first"], info["end"], info["ready"], info["unacked"]) == (1, 4, 2, 4)
        client.settle(queue, "q", 1)
        assert (client.info(queue, "q")["ready"], client.info(queue, "q")["unacked"]) == (2, 3)
    name = unique("lease-reader")
    call(broker.uri, "users.add", name=name, password="pw", tags=[])
    call(broker.uri, "permissions.set", user=name, vhost="/", configure=".*", write=".*",
         read=".*")
    with LeaseClient(f"amqp://{name}:pw@127.0.0.1:{broker.port}/%2F") as client:
        info = client.info(queue, "q")
    assert info["ready"] == 2 and "unacked" not in info


def test_release_returns_unsettled_messages_to_consumers_with_a_delivery_count(broker):
    queue = quorum_queue_with(broker, 5)
    with LeaseClient(broker.uri) as client:
        client.grow(queue, "q", max_messages=5)
        client.settle(queue, "q", 2)
        assert client.release(queue, "q", fence=False) == 3  # as its holder releases it
        # offsets never go backwards: the next grow continues after the old end
        connection = connect(broker)
        channel = connection.channel()
        seen = []
        for _ in range(3):
            method, properties, body = channel.basic_get(queue, auto_ack=True)
            seen.append((body.split(b" ")[1], method.redelivered,
                         properties.headers.get("x-delivery-count")))
        assert seen == [(b"2", True, 1), (b"3", True, 1), (b"4", True, 1)]
        connection.close()
        assert client.grow(queue, "q", max_messages=5) == (6, 5)  # nothing ready


def test_max_bytes_limits_a_grow(broker):
    queue = quorum_queue_with(broker, 10)
    with LeaseClient(broker.uri) as client:
        first, end = client.grow(queue, "q", max_messages=100, max_bytes=30)
        sizes = [len(m.body) for m in client.read(queue, "q", 0, end)]
        assert first == 1 and 1 <= end < 10
        assert sum(sizes[:-1]) < 30  # it stops once the byte budget is used up


def test_an_idle_lease_is_released_after_its_timeout(broker):
    queue = quorum_queue_with(broker, 3)
    with LeaseClient(broker.uri) as client:
        client.grow(queue, "idle", max_messages=3, timeout_ms=300)
        connection = connect(broker)
        channel = connection.channel()
        deadline = time.monotonic() + 10
        while channel.queue_declare(queue, passive=True).method.message_count < 3:
            assert time.monotonic() < deadline, "the idle lease was never released"
            time.sleep(0.1)
        connection.close()
        # fenced: its holder is told what went back instead of growing past it
        with pytest.raises(ManagementError, match=(
                f"PRECONDITION_FAILED - lease 'idle' on queue '{queue}' in vhost '/' is "
                r"fenced: it was released after 300 ms idle \(its lease timeout\) at .* "
                "UTC, and its messages with sequences 1..3 went back to the queue")):
            client.grow(queue, "idle", max_messages=3, timeout_ms=0)
        with pytest.raises(ManagementError, match="is fenced"):
            client.settle(queue, "idle", 3)
        assert client.info(queue, "idle")["fence"] == {
            "first": 1, "end": 3, "reason": "timeout",
            "at_ms": client.info(queue, "idle")["fence"]["at_ms"], "timeout_ms": 300}
        assert client.grow(queue, "another", max_messages=3) == (1, 3)


def test_reading_a_range_keeps_its_lease_from_timing_out(broker):
    # A batch's lease is grown once, then read by the batch's tasks for as long as
    # they take: each range read counts as the lease's activity, as a grow or a
    # settle does, so a batch read for longer than the timeout is not given back
    # mid-batch (before, only grows and settles counted: the read after 3 s was
    # refused, the lease fenced).
    queue = quorum_queue_with(broker, 3)
    with LeaseClient(broker.uri) as client, RangeReader(broker.uri) as reader:
        client.grow(queue, "batch", max_messages=3, timeout_ms=3000)
        deadline = time.monotonic() + 7.5      # 2.5 timeouts of nothing but reads
        reads = 0
        while time.monotonic() < deadline:
            assert len(list(reader.read(queue, "batch", 0, 3))) == 1  # one "entries" body
            reads += 1
            time.sleep(0.2)
        assert client.info(queue, "batch") == {"first": 1, "end": 3, "timeout_ms": 3000,
                                               "fence": None, "ready": 0, "unacked": 3}
        assert client.settle(queue, "batch", 3) == 3
    assert reads > 10


def test_an_operator_release_fences_a_lease_that_held_messages(broker):
    queue = quorum_queue_with(broker, 4)
    with LeaseClient(broker.uri) as client:
        client.grow(queue, "query", max_messages=3)
        client.settle(queue, "query", 1)
        assert client.release(queue, "query") == 2  # fence=True: an operator's release
        with pytest.raises(ManagementError, match=(
                "is fenced: it was released by an operator at .* UTC, and its messages "
                "with sequences 2..3 went back to the queue")):
            client.settle(queue, "query", 3)
        with pytest.raises(ManagementError, match="is fenced"):
            client.grow(queue, "query", max_messages=1)
        # a lease that held nothing is not fenced by a release
        client.grow(queue, "empty", max_messages=0)
        assert client.release(queue, "empty") == 0
        assert client.grow(queue, "empty", max_messages=1) == (1, 1)
        rows = client.call("lease.list", vhost="/", queue=queue)
        assert [(r["lease"], r["state"], r["messages"], r["first"], r["end"])
                for r in rows] == [("empty", "holding", 1, 1, 1), ("query", "fenced", 0, 4, 3)]
        assert rows[1]["fence"]["reason"] == "released"
        assert rows[0]["timeout_ms"] == 1_800_000 and 0 < rows[0]["expires_in_ms"] <= 1_800_000


def test_a_lease_grown_without_a_timeout_gets_the_brokers_lease_timeout(tmp_path):
    with BrokerProcess(data_dir=str(tmp_path), extra_config="lease_timeout = 400\n") as node:
        queue = quorum_queue_with(node, 2)
        with LeaseClient(node.uri) as client:
            client.grow(queue, "q", max_messages=2)
            assert client.info(queue, "q")["timeout_ms"] == 400
            deadline = time.monotonic() + 20
            while client.info(queue, "q")["fence"] is None:
                assert time.monotonic() < deadline, "the lease never timed out"
                time.sleep(0.1)
            assert client.grow(queue, "kept", max_messages=2, timeout_ms=0) == (1, 2)


@pytest.mark.parametrize("kill", [False, True], ids=["sigterm", "sigkill"])
def test_leases_and_their_ranges_survive_a_restart(fresh_broker, kill):
    queue = quorum_queue_with(fresh_broker, 12)
    with LeaseClient(fresh_broker.uri) as client:
        client.grow(queue, "q", max_messages=8)
        client.settle(queue, "q", 3)
        before = snapshot(client.read(queue, "q", 3, 8))
    fresh_broker.restart(kill=kill)
    with LeaseClient(fresh_broker.uri) as client:
        assert client.info(queue, "q") == {"first": 4, "end": 8, "timeout_ms": 1_800_000,
                                           "fence": None, "ready": 4, "unacked": 5}
        assert snapshot(client.read(queue, "q", 3, 8)) == before
        assert client.grow(queue, "q", max_messages=100) == (9, 12)


def test_lease_errors_name_what_is_wrong(broker):
    queue = quorum_queue_with(broker, 1)
    connection = connect(broker)
    channel = connection.channel()
    channel.queue_declare(classic := unique("classic"))
    with LeaseClient(broker.uri) as client:
        with pytest.raises(ManagementError, match="NOT_FOUND - no queue 'nope'"):
            client.grow("nope", "q", max_messages=1)
        with pytest.raises(ManagementError, match="is not a quorum queue"):
            client.grow(classic, "q", max_messages=1)
        with pytest.raises(ManagementError, match="no lease 'ghost'"):
            client.info(queue, "ghost")
        with pytest.raises(ManagementError, match="max_messages"):
            client.call("lease.grow", queue=queue, lease="q", max_messages=-1)
    error = channel_error(lambda: channel.basic_consume(
        queue, lambda *a: None, auto_ack=True,
        arguments={"x-lease": "ghost", "x-lease-start": 0, "x-lease-end": 1}))
    assert (error.reply_code, error.reply_text) == (
        406, f"PRECONDITION_FAILED - no lease 'ghost' on queue '{queue}' in vhost '/'")
    channel = connection.channel()
    error = channel_error(lambda: channel.basic_consume(
        queue, lambda *a: None, auto_ack=False,
        arguments={"x-lease": "q", "x-lease-start": 0, "x-lease-end": 1}))
    assert error.reply_code == 406 and "no-ack" in error.reply_text
    connection.close()


def comparable(messages) -> list[tuple]:
    """Everything a lease read gives, with the packed form's documented differences
    (no x-lease-seq in the headers, {} for no headers) taken out."""
    out = []
    for m in messages:
        properties = dict(vars(m.properties))
        headers = {k: v for k, v in (properties.pop("headers") or {}).items()
                   if k != "x-lease-seq"}
        out.append((m.seq, m.body, m.exchange, m.routing_key, m.redelivered,
                    m.delivery_count, sorted(properties.items()), list(headers.items())))
    return out


def test_a_packed_read_gives_what_a_per_message_read_gives(broker):
    queue = unique("packed")
    connection = connect(broker)
    channel = connection.channel()
    channel.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
    channel.confirm_delivery()
    variants = [pika.BasicProperties(),
                pika.BasicProperties(delivery_mode=2, priority=3, timestamp=1_700_000_000,
                                     correlation_id="c", reply_to="r", expiration="60000",
                                     type="t", user_id="guest", app_id="a",
                                     content_encoding="gzip"),
                pika.BasicProperties(headers={"x-delivery-count": 7, "x-lease-seq": 99,
                                              "nested": {"a": [1, "b"]}, "bytes": b"\xff"})]
    channel.queue_bind(queue, "amq.direct", queue)
    for number in range(12):
        channel.basic_publish("amq.direct" if number % 4 == 0 else "", queue,
                              bytes([number]) * number, variants[number % 3])
    with LeaseClient(broker.uri) as client:
        client.grow(queue, "first", max_messages=5)
        client.release(queue, "first")  # messages 0..4 come back redelivered
        assert client.grow(queue, "q", max_messages=100) == (1, 12)
        packed = [m for chunk in client.read_packed(queue, "q", 0, 12) for m in chunk]
        assert comparable(packed) == comparable(client.read(queue, "q", 0, 12))
        assert comparable(packed[2:]) == comparable(client.read(queue, "q", 2, 12))
    assert sorted(m.delivery_count for m in packed) == [0] * 4 + [1] * 5 + [7] * 3
    assert {m.exchange for m in packed} == {"", "amq.direct"}
    with_headers = {m.body: list(m.properties.headers.items())
                    for m in packed if m.body[:1] in (b"\x02", b"\x05")}
    assert with_headers == {  # the broker's count replaces the publisher's, at the end
        bytes([2]) * 2: [("nested", {"a": [1, "b"]}), ("bytes", b"\xff"),
                         ("x-delivery-count", 1)],
        bytes([5]) * 5: [("x-delivery-count", 7), ("nested", {"a": [1, "b"]}),
                         ("bytes", b"\xff")]}
    connection.close()


def test_a_packed_read_of_many_messages_comes_in_order_in_several_chunks(broker):
    queue = quorum_queue_with(broker, 2500)
    with LeaseClient(broker.uri) as client:
        client.grow(queue, "q", max_messages=2500)
        chunks = list(client.read_packed(queue, "q", 100, 2500))
        assert len(chunks) >= 3
        assert [m.seq for chunk in chunks for m in chunk] == list(range(101, 2501))
        assert snapshot(m for chunk in chunks for m in chunk) == snapshot(
            client.read(queue, "q", 100, 2500))
        assert list(client.read_packed(queue, "q", 7, 7)) == []


def test_a_packed_read_is_refused_like_a_per_message_read(broker):
    queue = quorum_queue_with(broker, 3)
    with LeaseClient(broker.uri) as client:
        client.grow(queue, "q", max_messages=3)
        client.settle(queue, "q", 1)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            list(client.read_packed(queue, "q", 0, 3))
        assert info.value.reply_code == 406 and "settled" in info.value.reply_text
    connection = connect(broker)
    channel = connection.channel()
    error = channel_error(lambda: channel.basic_consume(
        queue, lambda *a: None, auto_ack=True,
        arguments={"x-lease": "q", "x-lease-start": 1, "x-lease-end": 3,
                   "x-lease-format": "zipped"}))
    assert error.reply_code == 406 and "invalid arg 'x-lease-format'" in error.reply_text
    assert "'packed'" in error.reply_text
    connection.close()


# ------------------------------------------------------------------ streamed ranges
# A range is read from the log as the reader takes it (broker/node/leases.py), so what
# happens to the queue while it streams reaches the reader part-way.


def fill_fast(broker, count: int, size: int) -> str:
    """A quorum queue of `count` messages of `size` bytes, published in one go
    (basic.publish pipelined: pika's blocking channel in confirm mode waits for each
    confirm, which a busy machine's fsyncs make minutes for 10,000), then waited for
    until the queue holds them all."""
    name = unique("stream")
    connection = connect(broker)
    channel = connection.channel()
    channel.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
    body = b"x" * size
    for _ in range(count):
        channel.basic_publish("", name, body, pika.BasicProperties(delivery_mode=2),
                              mandatory=False)
    deadline = time.monotonic() + 45
    while channel.queue_declare(name, passive=True).method.message_count < count:
        assert time.monotonic() < deadline, f"{name} does not hold {count} messages"
        time.sleep(0.1)
    connection.close()
    return name


def test_a_queue_deleted_while_its_range_streams_closes_the_readers_channel(broker):
    # 40 MiB of messages: more than loopback's socket buffers hold, so most of the range
    # is still in the log when the queue goes
    queue = fill_fast(broker, 10_000, 4096)
    with LeaseClient(broker.uri) as client:
        client.grow(queue, "q", max_messages=10_000)
        chunks = client.read_packed(queue, "q", 0, 10_000)
        received = list(next(chunks))  # the range has begun
        connection = connect(broker)
        connection.channel().queue_delete(queue)
        connection.close()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            for chunk in chunks:
                received += chunk
    error = closed.value
    assert error.reply_code == 406
    assert f"lease 'q' on queue '{queue}'" in error.reply_text
    assert "can no longer be read" in error.reply_text
    # what came, came in order from the start, and no further than the broker says it
    # sent (pika drops deliveries still queued in its consumer when the channel closes)
    last_sent = int(error.reply_text.split("the range stops after sequence ")[1].split(":")[0])
    assert 1 <= last_sent < 10_000
    assert [m.seq for m in received] == list(range(1, len(received) + 1))
    assert len(received) <= last_sent


def test_a_reader_that_leaves_a_range_part_way_can_read_it_again(broker):
    queue = fill_fast(broker, 5_000, 4096)
    with LeaseClient(broker.uri) as client:
        client.grow(queue, "q", max_messages=5_000)
        chunks = client.read_packed(queue, "q", 0, 5_000)
        next(chunks)
        chunks.close()  # cancels the consumer; the broker stops the range
        again = [m.seq for chunk in client.read_packed(queue, "q", 0, 5_000) for m in chunk]
        assert again == list(range(1, 5_001))


# ------------------------------------------------------------------ "entries" reads
# The messages' log entries as stored, thousands to a delivery, read on a connection of
# their own without pika on the path of the bytes (client/range_reader.py).


def test_an_entries_read_gives_what_a_per_message_read_gives(broker):
    queue = unique("entries")
    connection = connect(broker)
    channel = connection.channel()
    channel.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
    channel.confirm_delivery()
    variants = [pika.BasicProperties(),
                pika.BasicProperties(delivery_mode=2, priority=3, timestamp=1_700_000_000,
                                     correlation_id="c", reply_to="r", expiration="60000",
                                     type="t", user_id="guest", app_id="a",
                                     content_encoding="gzip"),
                pika.BasicProperties(headers={"x-delivery-count": 7, "x-lease-seq": 99,
                                              "nested": {"a": [1, "b"]}, "bytes": b"\xff"})]
    channel.queue_bind(queue, "amq.direct", queue)
    for number in range(12):
        channel.basic_publish("amq.direct" if number % 4 == 0 else "", queue,
                              bytes([number]) * number, variants[number % 3])
    with LeaseClient(broker.uri) as client, RangeReader(broker.uri) as reader:
        client.grow(queue, "first", max_messages=5)
        client.release(queue, "first")  # messages 0..4 come back redelivered
        assert client.grow(queue, "q", max_messages=100) == (1, 12)
        entries = [m for chunk in reader.read_columns(queue, "q", 0, 12) for m in chunk]
        packed = [m for chunk in client.read_packed(queue, "q", 0, 12) for m in chunk]
        assert comparable(entries) == comparable(client.read(queue, "q", 0, 12))
        assert comparable(entries) == comparable(packed)
        again = [m for chunk in reader.read_columns(queue, "q", 2, 12) for m in chunk]
        assert comparable(again) == comparable(client.read(queue, "q", 2, 12))
    connection.close()


def test_every_read_of_a_message_published_with_bcc_gives_its_body_and_no_bcc(broker):
    """A message's BCC keys are kept in its log entry after the body (tag 21, for its
    dead-lettered copy: FORMAT.md, "Quorum-queue entries"); no read hands them out:
    per message, packed, "entries" (the entry as the tag 1 Enqueue of the same
    message: tests/broker/node/test_blind_keys_reads.py) and a consumer's delivery
    give the body alone and headers without BCC,
    as for a message published without one."""
    queue = unique("bcc-reads")
    connection = connect(broker)
    channel = connection.channel()
    channel.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
    channel.confirm_delivery()
    for number in range(6):
        headers = {"n": number, **({"BCC": ["elsewhere", "x" * 300]} if number % 2 else {})}
        channel.basic_publish("", queue, b"body %d" % number,
                              pika.BasicProperties(headers=headers))
    with LeaseClient(broker.uri) as client, RangeReader(broker.uri) as reader:
        assert client.grow(queue, "q", max_messages=100) == (1, 6)
        each = client.read(queue, "q", 0, 6)
        packed = [m for chunk in client.read_packed(queue, "q", 0, 6) for m in chunk]
        entries = [m for chunk in reader.read_columns(queue, "q", 0, 6) for m in chunk]
        assert comparable(entries) == comparable(each) == comparable(packed)
        assert [(m.body, m.properties.headers) for m in packed] == [
            (b"body %d" % number, {"n": number}) for number in range(6)]
        client.release(queue, "q")
    delivered = []
    for method, properties, body in channel.consume(queue, auto_ack=True,
                                                    inactivity_timeout=30):
        assert method is not None, "the released messages were not delivered"
        delivered.append((body, properties.headers))
        if len(delivered) == 6:
            break
    assert delivered == [(b"body %d" % number, {"n": number, "x-delivery-count": 1})
                         for number in range(6)]
    connection.close()


def test_an_entries_read_of_many_messages_comes_in_order_in_a_few_deliveries(broker):
    queue = fill_fast(broker, 3_000, 16)
    with LeaseClient(broker.uri) as client, RangeReader(broker.uri) as reader:
        client.grow(queue, "q", max_messages=3_000)
        chunks = list(reader.read_columns(queue, "q", 100, 3_000))
        assert len(chunks) == 2   # a small first delivery, then thousands each
        assert len(chunks[0]) == 256
        assert [m.seq for chunk in chunks for m in chunk] == list(range(101, 3_001))
        assert list(reader.read_columns(queue, "q", 7, 7)) == []
        assert reader.idle()  # a completed range leaves the connection for the next


def test_an_entries_read_is_refused_like_a_per_message_read(broker):
    queue = quorum_queue_with(broker, 3)
    with LeaseClient(broker.uri) as client, RangeReader(broker.uri) as reader:
        client.grow(queue, "q", max_messages=3)
        client.settle(queue, "q", 1)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            list(reader.read_columns(queue, "q", 0, 3))
        assert info.value.reply_code == 406 and "settled" in info.value.reply_text
        assert not reader.idle()
    with RangeReader(broker.uri) as reader:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            list(reader.read(queue, "q", 0, 3, form="zipped"))
        assert "invalid arg 'x-lease-format'" in info.value.reply_text
        assert "'packed', 'entries'" in info.value.reply_text


def test_a_queue_deleted_while_an_entries_range_streams_closes_the_readers_channel(broker):
    queue = fill_fast(broker, 10_000, 4096)
    with LeaseClient(broker.uri) as client, RangeReader(broker.uri) as reader:
        client.grow(queue, "q", max_messages=10_000)
        chunks = reader.read_columns(queue, "q", 0, 10_000)
        received = list(next(chunks))  # the range has begun
        connection = connect(broker)
        connection.channel().queue_delete(queue)
        connection.close()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            for chunk in chunks:
                received += chunk
    error = closed.value
    assert error.reply_code == 406 and "can no longer be read" in error.reply_text
    last_sent = int(error.reply_text.split("the range stops after sequence ")[1].split(":")[0])
    assert [m.seq for m in received] == list(range(1, len(received) + 1))
    assert len(received) <= last_sent < 10_000


def test_a_reader_that_leaves_an_entries_range_part_way_can_read_it_again(broker):
    queue = fill_fast(broker, 5_000, 4096)
    with LeaseClient(broker.uri) as client:
        client.grow(queue, "q", max_messages=5_000)
        reader = RangeReader(broker.uri)
        chunks = reader.read_columns(queue, "q", 0, 5_000)
        next(chunks)
        chunks.close()  # its deliveries are still coming: the connection is closed
        assert not reader.idle()
        with RangeReader(broker.uri) as again:
            seqs = [m.seq for chunk in again.read_columns(queue, "q", 0, 5_000) for m in chunk]
        assert seqs == list(range(1, 5_001))


def test_a_refused_login_is_named_at_once(broker):
    with pytest.raises(ManagementError, match="refused the login of user 'guest'") as info:
        RangeReader(broker.uri.replace("guest:guest", "guest:wrong"))
    assert "wrong" not in str(info.value)
