"""The lease-mode reader against the bundled broker, driven as Spark drives it.

No Spark here: each test calls the reader's methods in Spark's order for a batch
(connector/lease_reader.py's header: latestOffset -> [offset log] -> commit(previous
end) -> partitions -> read on executors), with `read` run on a pickled copy, as on
an executor. The Spark tests (test_streaming.py) then check the same through real
queries.
"""

from __future__ import annotations

import json
import pickle
import time

import pika
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxBytes, ReadMaxRows

from quorumqueue.client.http_management import HttpManagement
from quorumqueue.client.lease_client import LeaseClient
from quorumqueue.client.management import ManagementError
from quorumqueue.connector.connection import LoginRefused, detect_mode
from quorumqueue.connector.reconnect import BrokerLost, is_connection_loss
from quorumqueue.connector.consume_reader import ConsumeStreamReader
from quorumqueue.connector.lease_reader import (PROVISIONAL_LEASE_TIMEOUT_MS, DataLossError,
                                                LeaseFencedError, LeaseLostError,
                                                LeaseStreamReader, MissingQueue)
from quorumqueue.connector.offsets import LeaseRange
from quorumqueue.connector.options import Mode, OptionError, parse_source_options
from quorumqueue.connector.schema import ARROW_SCHEMA, SCHEMA
from quorumqueue.connector.source import QuorumQueueDataSource

from .queues import order_numbers, publish_orders, quorum_queue, ready, unique

pytestmark = pytest.mark.timeout(60)


def make_reader(uri: str, queue: str, **options) -> LeaseStreamReader:
    return LeaseStreamReader(parse_source_options({"uri": uri, "queue": queue, **options}))


def run_batch(reader: LeaseStreamReader, start: dict, limit=None, previous: dict | None = None):
    """One micro-batch: (end offset, order numbers read)."""
    end = reader.latestOffset(start, limit or reader.getDefaultReadLimit())
    if previous is not None:
        reader.commit(previous)
    executor = pickle.loads(pickle.dumps(reader))
    batches = [b for part in reader.partitions(start, end) for b in executor.read(part)]
    assert all(batch.schema.equals(ARROW_SCHEMA) for batch in batches)
    return end, order_numbers(batches)


def positions(offset: dict) -> dict:
    return offset["queues"]


def lease_info(uri: str, queue: str, lease: str) -> dict:
    with LeaseClient(uri) as client:
        return client.info(queue, lease)


def test_batches_follow_the_lease_and_commit_settles_the_previous_ones(broker):
    queue = quorum_queue(broker.uri, 25)
    reader = make_reader(broker.uri, queue, maxMessagesPerTrigger="10")
    start = reader.initialOffset()
    assert reader.initialOffset() == start  # asked again before the first batch: same lease
    assert positions(start) == {queue: 0}
    lease = start["lease"]

    end1, read1 = run_batch(reader, start)
    assert positions(end1) == {queue: 10} and read1 == list(range(10))
    end2, read2 = run_batch(reader, end1, previous=start)
    end3, read3 = run_batch(reader, end2, previous=end1)
    assert read2 == list(range(10, 20)) and read3 == list(range(20, 25))
    assert lease_info(broker.uri, queue, lease)["first"] == 11  # settled up to end1 only
    reader.commit(end2)
    assert lease_info(broker.uri, queue, lease)["first"] == 21
    # nothing more: the offset comes back unchanged, byte for byte
    assert json.dumps(reader.latestOffset(end3, ReadMaxRows(10))) == json.dumps(end3)
    reader.stop()


def test_a_logged_batch_reads_back_identically(broker):
    queue = quorum_queue(broker.uri, 12)
    reader = make_reader(broker.uri, queue)
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    parts = reader.partitions(start, end)
    first = [b for p in parts for b in pickle.loads(pickle.dumps(reader)).read(p)]
    # a restarted query: another process, the offsets from the checkpoint
    replay = make_reader(broker.uri, queue)
    again = [b for p in replay.partitions(start, end) for b in replay.read(p)]
    assert [b.to_pylist() for b in again] == [b.to_pylist() for b in first]
    assert order_numbers(first) == list(range(12))


def test_read_all_available_ignores_the_configured_limits(broker):
    queue = quorum_queue(broker.uri, 30)
    reader = make_reader(broker.uri, queue, maxMessagesPerTrigger="5", maxBytesPerTrigger="10")
    assert reader.getDefaultReadLimit() == ReadMaxRows(5)
    end, numbers = run_batch(reader, reader.initialOffset(), ReadAllAvailable())
    assert numbers == list(range(30))


def test_max_bytes_per_trigger_stops_a_batch_once_the_bytes_are_reached(broker):
    queue = quorum_queue(broker.uri, 10, padding=90)  # ~100-byte bodies
    reader = make_reader(broker.uri, queue, maxBytesPerTrigger="250")
    assert reader.getDefaultReadLimit() == ReadMaxBytes(250)
    end, numbers = run_batch(reader, reader.initialOffset())
    assert numbers == [0, 1, 2]  # the broker stops once 250 bytes are taken
    both = make_reader(broker.uri, queue, maxBytesPerTrigger="250", maxMessagesPerTrigger="2")
    _, numbers = run_batch(both, end)
    assert len(numbers) == 2


def test_messages_assigned_before_a_crash_are_batched_first_without_growing(broker):
    queue = quorum_queue(broker.uri, 20)
    crashed = make_reader(broker.uri, queue, maxMessagesPerTrigger="10")
    start = crashed.initialOffset()
    crashed.latestOffset(start, ReadMaxRows(10))  # grown, but the offset was never logged
    lease = start["lease"]
    assert lease_info(broker.uri, queue, lease)["end"] == 10

    restarted = make_reader(broker.uri, queue)  # same checkpoint: same start offset
    end, numbers = run_batch(restarted, start, ReadMaxRows(4))
    assert numbers == [0, 1, 2, 3] and lease_info(broker.uri, queue, lease)["end"] == 10
    end, numbers = run_batch(restarted, end, ReadMaxRows(10))
    assert numbers == list(range(4, 14)) and lease_info(broker.uri, queue, lease)["end"] == 14


def test_several_queues_share_the_limit_and_take_turns(broker):
    first, second = quorum_queue(broker.uri, 10, "a"), quorum_queue(broker.uri, 10, "b")
    reader = make_reader(broker.uri, f"{first},{second}", maxMessagesPerTrigger="6")
    offset, taken = reader.initialOffset(), []
    for _ in range(4):
        end, numbers = run_batch(reader, offset)
        taken.append((positions(end)[first] - positions(offset)[first],
                      positions(end)[second] - positions(offset)[second]))
        offset = end
    assert taken == [(6, 0), (0, 6), (4, 2), (0, 2)]
    assert positions(offset) == {first: 10, second: 10}


def test_available_now_reads_what_was_ready_when_it_started(broker):
    queue = quorum_queue(broker.uri, 5)
    reader = make_reader(broker.uri, queue, maxMessagesPerTrigger="2")
    reader.prepareForTriggerAvailableNow()
    publish_orders(broker.uri, queue, range(5, 9), declare=False)  # arrive afterwards
    offset, numbers = reader.initialOffset(), []
    while True:
        end, more = run_batch(reader, offset)
        if end == offset:
            break
        numbers += more
        offset = end
    assert numbers == [0, 1, 2, 3, 4]
    later = make_reader(broker.uri, queue)
    assert run_batch(later, offset)[1] == [5, 6, 7, 8]


def test_a_batch_is_cut_into_partitions_that_depend_only_on_its_offsets():
    reader = make_reader("amqp://127.0.0.1:1", "a,b")
    start = {"lease": "spark-x", "queues": {"a": 100, "b": 0}}
    cuts = {size: [(p.queue, p.start, p.end) for p in reader.partitions(
        start, {"lease": "spark-x", "queues": {"a": 100 + size, "b": 10}})]
        for size in (40_000, 3_000, 200_000)}
    assert cuts[40_000] == [("a", 100, 10_100), ("a", 10_100, 20_100), ("a", 20_100, 30_100),
                            ("a", 30_100, 40_100), ("b", 0, 10)]
    assert cuts[3_000] == [("a", 100, 2_100), ("a", 2_100, 3_100), ("b", 0, 10)]
    assert len(cuts[200_000]) == 9 and cuts[200_000][1] == ("a", 25_100, 50_100)  # 8 + 1
    again = make_reader("amqp://127.0.0.1:1", "a,b").partitions(
        start, {"lease": "spark-x", "queues": {"a": 40_100, "b": 10}})
    assert [(p.queue, p.start, p.end) for p in again] == cuts[40_000]


def test_a_partition_is_read_in_record_batches_of_exactly_its_range(broker):
    queue = quorum_queue(broker.uri, 4_600)
    reader = make_reader(broker.uri, queue)
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    parts = reader.partitions(start, end)
    assert [(p.start, p.end) for p in parts] == [(0, 2_000), (2_000, 4_000), (4_000, 4_600)]
    part = LeaseRange(queue, start["lease"], 150, 4_321)  # any range of the lease
    batches = list(pickle.loads(pickle.dumps(reader)).read(part))
    # the "entries" read's two deliveries (a small first one, then the rest) make one
    # batch: 256 messages are fewer than a batch's least (range_reader.GROUP_MESSAGES)
    assert [b.num_rows for b in batches] == [4_171]
    assert [row for b in batches for row in b.column("offset").to_pylist()] == list(
        range(151, 4_322))
    assert order_numbers(batches) == list(range(150, 4_321))


def test_big_bodies_headers_and_missing_properties_come_through_a_read(broker):
    """What a user sees in the rows of a lease-mode read whose deliveries are received
    together (a body larger than the read's 4 MiB buffers, empty bodies, messages with
    and without headers and properties): every body whole, headers as text, nulls
    where nothing was set, with includeHeaders false no headers at all."""
    bodies = [b"small", b"\x00" * (5 << 20), b"", bytes(range(256)) * 1200, b"last"]
    properties = [pika.BasicProperties(headers={"tenant": "acme", "n": 1, "ok": True}),
                  pika.BasicProperties(),
                  pika.BasicProperties(message_id="m-3", delivery_mode=2),
                  pika.BasicProperties(headers={"nested": {"k": [1, "x"]}}),
                  pika.BasicProperties(content_type="text/plain", timestamp=1_700_000_000)]
    connection = pika.BlockingConnection(pika.URLParameters(broker.uri))
    queues = {"true": unique("mixed"), "false": unique("mixed")}
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        for queue in queues.values():
            channel.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
            for body, props in zip(bodies, properties):
                channel.basic_publish("", queue, body, props)
    finally:
        connection.close()
    for include_headers, queue in queues.items():
        reader = make_reader(broker.uri, queue, includeHeaders=include_headers)
        start = reader.initialOffset()
        end = reader.latestOffset(start, ReadAllAvailable())
        executor = pickle.loads(pickle.dumps(reader))
        rows = [row for part in reader.partitions(start, end) for batch in executor.read(part)
                for row in batch.to_pylist()]
        reader.stop()
        assert [row["body"] for row in rows] == bodies
        assert [row["offset"] for row in rows] == [1, 2, 3, 4, 5]
        assert [row["message_id"] for row in rows] == [None, None, "m-3", None, None]
        assert [row["delivery_mode"] for row in rows] == [None, None, 2, None, None]
        assert rows[4]["content_type"] == "text/plain"
        assert rows[4]["timestamp"].timestamp() == 1_700_000_000
        assert rows[1]["timestamp"] is None
        headers = [row["headers"] for row in rows]
        if include_headers == "true":
            assert dict(headers[0]) == {"tenant": "acme", "n": "1", "ok": "true"}
            assert dict(headers[3]) == {"nested": '{"k":[1,"x"]}'}
            assert headers[1] == []
        else:
            assert headers == [None] * 5


def test_a_range_that_can_no_longer_be_read_fails_or_is_skipped(broker):
    queue = quorum_queue(broker.uri, 10)
    reader = make_reader(broker.uri, queue)
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    with LeaseClient(broker.uri) as client:
        client.settle(queue, start["lease"], 4)  # settled behind the checkpoint's back
    (part,) = reader.partitions(start, end)
    with pytest.raises(DataLossError, match=r"messages 1\.\.10 of lease .*'failOnDataLoss'"):
        list(reader.read(part))
    lenient = make_reader(broker.uri, queue, failOnDataLoss="false")
    assert order_numbers(lenient.read(part)) == [4, 5, 6, 7, 8, 9]


def test_a_lease_given_back_by_its_timeout_fails_the_query_at_start_losing_nothing(broker):
    """The lease times out while the query is away (grown, never logged, then idle):
    the broker gives its messages back and fences it; the query's next start fails
    with LeaseFencedError saying which messages went back and what to do, whatever
    failOnDataLoss says; a query with a new checkpoint reads every message."""
    queue = quorum_queue(broker.uri, 5)
    crashed = make_reader(broker.uri, queue, leaseTimeout="300ms")
    start = crashed.initialOffset()
    crashed.latestOffset(start, ReadAllAvailable())  # grown, never logged, then idle
    connection = pika.BlockingConnection(pika.URLParameters(broker.uri))
    deadline = time.monotonic() + 10
    while connection.channel().queue_declare(queue, passive=True).method.message_count < 5:
        assert time.monotonic() < deadline, "the idle lease was never released"
        time.sleep(0.1)
    connection.close()
    for options in ({}, {"failOnDataLoss": "false"}):
        with pytest.raises(LeaseFencedError) as fenced:
            make_reader(broker.uri, queue, **options).latestOffset(start, ReadAllAvailable())
        text = str(fenced.value)
        assert text.startswith(f"quorumqueue source: lease '{start['lease']}' on queue "
                               f"'{queue}' was given back to the queue after 0.3s idle "
                               "(option 'leaseTimeout'")
        assert "its messages with offsets 1..5 went back to the queue" in text
        assert "Start the query with a new checkpoint location" in text and "\n" not in text
    fresh = make_reader(broker.uri, queue)
    _end, numbers = run_batch(fresh, fresh.initialOffset(), ReadAllAvailable())
    assert numbers == list(range(5))  # nothing lost


def test_a_lease_released_by_an_operator_fails_the_running_query_naming_its_batch(broker):
    queue = quorum_queue(broker.uri, 6)
    reader = make_reader(broker.uri, queue, maxMessagesPerTrigger="4")
    start = reader.initialOffset()
    end1, _ = run_batch(reader, start)
    with LeaseClient(broker.uri) as client:  # `quorumqueue queues release_lease`
        assert client.release(queue, start["lease"]) == 4
    with pytest.raises(LeaseFencedError, match=(
            r"was released by an operator .* offsets 1\.\.4 \(offsets 1\.\.4 in this "
            "checkpoint's last batch")):
        reader.latestOffset(end1, reader.getDefaultReadLimit())
    assert ready(broker.uri, queue) == 6


def test_an_idle_query_keeps_its_lease_alive(broker):
    """No new message for longer than the lease timeout: latestOffset, which Spark calls
    at every trigger, touches the lease, so the batch it holds is not given back."""
    queue = quorum_queue(broker.uri, 3)
    reader = make_reader(broker.uri, queue, leaseTimeout="3s")
    start = reader.initialOffset()
    end, numbers = run_batch(reader, start)
    assert numbers == [0, 1, 2]
    deadline = time.monotonic() + 6  # twice the timeout, triggering every 0.1 s
    while time.monotonic() < deadline:
        assert reader.latestOffset(end, reader.getDefaultReadLimit()) == end
        time.sleep(0.1)
    info = lease_info(broker.uri, queue, start["lease"])
    assert (info["first"], info["end"], info["fence"]) == (1, 3, None)


def test_a_lease_behind_the_checkpoint_is_refused(broker):
    queue = quorum_queue(broker.uri, 3)
    reader = make_reader(broker.uri, queue)
    checkpoint = {"lease": unique("spark"), "queues": {queue: 50}}
    with pytest.raises(LeaseLostError, match="already read up to 50"):
        reader.latestOffset(checkpoint, ReadAllAvailable())


@pytest.mark.parametrize("configured, ms", [({}, 1_800_000),  # the broker's lease_timeout
                                            ({"leaseTimeout": "never"}, 0),
                                            ({"leaseTimeout": "2h"}, 7_200_000),
                                            ({"leaseTimeout": "1s"}, 1000)])
def test_a_new_lease_stays_short_lived_until_a_checkpoint_names_it(broker, configured, ms):
    queue = quorum_queue(broker.uri, 3)
    reader = make_reader(broker.uri, queue, **configured)
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    provisional = min(ms or PROVISIONAL_LEASE_TIMEOUT_MS, PROVISIONAL_LEASE_TIMEOUT_MS)
    assert lease_info(broker.uri, queue, start["lease"])["timeout_ms"] == provisional
    reader.partitions(start, end)  # Spark has logged an offset naming the lease
    assert lease_info(broker.uri, queue, start["lease"])["timeout_ms"] == ms
    # a restarted query's lease comes from the checkpoint: configured from the start
    restarted = make_reader(broker.uri, queue, **configured)
    restarted.latestOffset(end, ReadAllAvailable())
    assert lease_info(broker.uri, queue, start["lease"])["timeout_ms"] == ms


def test_queue_errors_name_the_queue(broker):
    missing = make_reader(broker.uri, "no-such-queue")
    named = (f"option 'queue': no queue 'no-such-queue' in vhost '/' at "
             f"{broker.uri.replace('guest:guest', 'guest:***')}: declare it first")
    with pytest.raises(MissingQueue) as refused:  # not the broker's bare 404
        missing.latestOffset(missing.initialOffset(), ReadAllAvailable())
    assert str(refused.value).startswith(named)
    with pytest.raises(MissingQueue) as refused:
        missing.prepareForTriggerAvailableNow()
    assert str(refused.value).startswith(named)
    classic = unique("classic")
    connection = pika.BlockingConnection(pika.URLParameters(broker.uri))
    connection.channel().queue_declare(classic, durable=True)
    connection.close()
    reader = make_reader(broker.uri, classic)
    with pytest.raises(ManagementError, match="not a quorum queue"):
        reader.latestOffset(reader.initialOffset(), ReadAllAvailable())


def test_the_driver_reconnects_after_losing_its_connection(fresh_broker):
    queue = quorum_queue(fresh_broker.uri, 6)
    reader = make_reader(fresh_broker.uri, queue, maxMessagesPerTrigger="3")
    end1, numbers1 = run_batch(reader, reader.initialOffset())
    fresh_broker.restart()
    end2, numbers2 = run_batch(reader, end1, previous=reader.initialOffset())
    assert numbers1 + numbers2 == list(range(6))


def range_reader_connections(broker) -> int:
    """The broker's connections from executors' range reads (/api/connections)."""
    rows = HttpManagement(broker.management_url).get("connections")
    return sum(1 for row in rows if (row.get("client_properties") or {}).get("product")
               == "quorumqueue range reader")


def test_an_executor_keeps_one_connection_across_tasks_and_replaces_one_a_restart_killed(
        fresh_broker):
    # this process plays one Python worker running the batches' tasks one after another
    queue = quorum_queue(fresh_broker.uri, 9)
    reader = make_reader(fresh_broker.uri, queue, maxMessagesPerTrigger="3")
    end1, numbers1 = run_batch(reader, reader.initialOffset())
    end2, numbers2 = run_batch(reader, end1, previous=reader.initialOffset())
    assert range_reader_connections(fresh_broker) == 1   # the second task reused it
    fresh_broker.restart(kill=True)   # the kept connection dies with the broker
    end3, numbers3 = run_batch(reader, end2, previous=end1)
    assert numbers1 + numbers2 + numbers3 == list(range(9))   # no error, nothing twice
    assert range_reader_connections(fresh_broker) == 1   # its replacement, kept in turn
    reader.stop()


def test_a_count_the_broker_never_answers_ends_as_a_lost_broker_not_a_hang(broker,
                                                                         monkeypatch):
    # The driver counts a queue's ready messages with a passive queue.declare (lag
    # figures every second, AvailableNow's targets, minMessagesPerTrigger). pika's
    # blocking queue_declare waits for ever: a declare-ok that never came (a follower's
    # stranded barrier, groups/replicated.py) held the driver and its query for good.
    # It ends like every other request: after the client's timeout, as a lost broker
    # that reconnect.py retries across the nodes of `uri`.
    queue = quorum_queue(broker.uri, 3)
    with LeaseClient(broker.uri, timeout=1.0) as client:
        assert client.ready(queue) == 3
        # a declare the broker never answers: here, one never sent
        monkeypatch.setattr(client.channel._impl, "queue_declare", lambda *a, **k: None)
        with pytest.raises(ManagementError,
                           match=r"no reply to 'queue.declare' within 1.0s") as silent:
            client.ready(queue)
    assert is_connection_loss(silent.value)


# ------------------------------------------------------------------ mode and source


def test_a_refused_login_fails_at_once_naming_the_user_and_the_uri(broker):
    """A 403 in the handshake is the broker's answer, not a lost broker: no retrying
    for reconnectTimeout (60 s by default; before, 86 s and then 'start the broker')."""
    uri = broker.uri.replace("guest:guest", "guest:not-its-password")
    options = parse_source_options({"uri": uri, "queue": "orders"})
    redacted = uri.replace("guest:not-its-password", "guest:***")
    expected = (f"the broker at {redacted} refused the login of user 'guest' "
                "(ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN)")
    with pytest.raises(LoginRefused) as refused:
        detect_mode(options)
    assert str(refused.value).startswith(expected)
    assert "not-its-password" not in str(refused.value)
    reader = make_reader(uri, "orders", mode="lease")
    with pytest.raises(LoginRefused, match="refused the login of user 'guest'"):
        reader.latestOffset(reader.initialOffset(), ReadAllAvailable())


def test_mode_is_detected_from_the_broker_product(broker):
    options = parse_source_options({"uri": broker.uri, "queue": "q"})
    assert detect_mode(options) is Mode.LEASE


def test_the_first_reachable_address_is_used_and_failures_are_listed(broker):
    dead = "amqp://guest:hunter2@127.0.0.1:1/%2F"
    options = parse_source_options({"uri": f"{dead},{broker.uri}", "queue": "q"})
    assert detect_mode(options) is Mode.LEASE
    # a stream waits for its broker (option reconnectTimeout; 0: one immediate retry),
    # then says what every address answered
    with pytest.raises(BrokerLost, match=r"option 'uri'.*guest:\*\*\*@127.0.0.1:1") as error:
        detect_mode(parse_source_options({"uri": f"{dead},{dead}", "queue": "q",
                                          "reconnectTimeout": "0"}))
    assert "hunter2" not in str(error.value)


def test_the_data_source_hands_out_a_lease_reader(broker):
    source = QuorumQueueDataSource({"uri": broker.uri, "queue": "q"})
    assert QuorumQueueDataSource.name() == "quorumqueue" and source.schema() == SCHEMA
    assert isinstance(source.streamReader(SCHEMA), LeaseStreamReader)
    with pytest.raises(OptionError, match="fixed schema"):
        source.streamReader(SCHEMA[:3])
    with pytest.raises(OptionError, match="unknown option 'quue'"):
        QuorumQueueDataSource({"uri": broker.uri, "quue": "q"}).streamReader(SCHEMA)


def test_rabbitmq_means_consume_mode(rabbitmq):
    options = {"uri": rabbitmq.uri, "queue": "q"}
    assert detect_mode(parse_source_options(options)) is Mode.CONSUME
    with pytest.raises(OptionError, match="'lease', which needs the bundled quorumqueue broker"):
        detect_mode(parse_source_options({**options, "mode": "lease"}))
    assert isinstance(QuorumQueueDataSource(options).streamReader(SCHEMA), ConsumeStreamReader)


# ------------------------------------------------------------------ stop()



def test_stop_keeps_the_lease_by_default(broker):
    queue = quorum_queue(broker.uri, 25)
    reader = make_reader(broker.uri, queue, maxMessagesPerTrigger="10")
    start = reader.initialOffset()
    end1, _ = run_batch(reader, start)
    end2, _ = run_batch(reader, end1, previous=start)
    reader.stop()
    # a restart replays from the checkpoint: the lease still holds batches 1 and 2
    assert lease_info(broker.uri, queue, start["lease"]) == {
        "first": 1, "end": 20, "timeout_ms": 1_800_000, "fence": None, "ready": 5,
        "unacked": 20}
    assert ready(broker.uri, queue) == 5


def test_release_lease_on_stop_never_gives_back_a_batch_spark_may_have_committed(broker):
    """The last batch of a run (an AvailableNow run's, a query stopped after its
    batch) may be in Spark's commit log without the reader knowing: it stays in the
    lease, and the next run settles it instead of reading it again. (Before, it went
    back to the queue and the next run read it twice.)"""
    queue = quorum_queue(broker.uri, 25)
    options = {"maxMessagesPerTrigger": "10", "releaseLeaseOnStop": "true"}
    reader = make_reader(broker.uri, queue, **options)
    start = reader.initialOffset()
    end1, _ = run_batch(reader, start)
    end2, _ = run_batch(reader, end1, previous=start)  # Spark asked after batch 1: committed
    reader.stop()                                      # batch 2 committed too, unknown here
    info = lease_info(broker.uri, queue, start["lease"])
    assert (info["first"], info["end"], info["fence"]) == (11, 20, None)  # batch 2 kept
    assert ready(broker.uri, queue) == 5
    restarted = make_reader(broker.uri, queue, **options)   # batch 2 is in the commit log
    end3, numbers = run_batch(restarted, end2, previous=end2)
    assert numbers == list(range(20, 25))  # never batch 2 again
    restarted.latestOffset(end3, restarted.getDefaultReadLimit())  # the run's end
    restarted.stop()  # every logged batch known committed: settled, nothing left
    info = lease_info(broker.uri, queue, start["lease"])
    assert info["first"] > info["end"] == 25 and ready(broker.uri, queue) == 0


def test_release_lease_on_stop_gives_back_what_no_batch_took(broker):
    """What the lease holds beyond every logged batch (grown for a batch that was never
    logged) goes back to the queue, delivery count + 1, without fencing the lease."""
    queue = quorum_queue(broker.uri, 12)
    reader = make_reader(broker.uri, queue, maxMessagesPerTrigger="10",
                         releaseLeaseOnStop="true")
    start = reader.initialOffset()
    end1, _ = run_batch(reader, start)
    reader.latestOffset(end1, reader.getDefaultReadLimit())  # batch 1 committed; 2 planned
    reader._batch_end = dict(end1["queues"])  # as if batch 2 were never logged (a failure)
    reader.stop()
    assert ready(broker.uri, queue) == 2  # the grown, never logged ones
    info = lease_info(broker.uri, queue, start["lease"])
    assert info["first"] > info["end"] == 12 and info["fence"] is None  # not fenced


def test_the_lag_after_a_batch_comes_from_one_lease_info_per_queue(broker, monkeypatch):
    """reportLatestOffset, which Spark calls after every trigger, asks the broker once
    per queue: lease.info carries the queue's ready and unacked counts (before, a
    passive declare and a queues.list came with it, three requests per trigger)."""
    queue = quorum_queue(broker.uri, 25)
    reader = make_reader(broker.uri, queue, maxMessagesPerTrigger="10")
    end = reader.latestOffset(reader.initialOffset(), ReadMaxRows(10))
    asked: list[str] = []
    call, ready = LeaseClient.call, LeaseClient.ready
    monkeypatch.setattr(LeaseClient, "call",
                        lambda self, op, **arguments: asked.append(op) or call(self, op,
                                                                             **arguments))
    monkeypatch.setattr(LeaseClient, "ready",
                        lambda self, name: asked.append("queue.declare") or ready(self, name))
    report = reader.reportLatestOffset()
    assert asked == ["lease.info"]
    assert positions(end) == {queue: 10}
    assert report["queues"] == {queue: 25}
    assert report["metrics"] == {"minMessagesBehindLatest": 15, "avgMessagesBehindLatest": 15.0,
                                 "maxMessagesBehindLatest": 15, "readyMessages": 15,
                                 "heldMessages": 10, "unackedMessages": 10}
    reader.stop()


def test_the_drivers_stream_reader_imports_no_range_reader(broker):
    """Spark starts the streaming source's runner afresh for every query (bench/README.md,
    2026-12-07): it creates the reader, grows, plans, settles and reports the lag, and
    never reads a range, so the executors' range reader and pamqp, which only it uses,
    are not imported there (a fresh interpreter, as the runner is)."""
    import subprocess
    import sys
    import textwrap

    queue = quorum_queue(broker.uri, 30)
    script = textwrap.dedent(f"""
        import sys
        import pyspark.sql.streaming.python_streaming_source_runner
        from pyspark.sql.streaming.datasource import ReadMaxRows
        from quorumqueue.connector.source import SCHEMA, QuorumQueueDataSource
        source = QuorumQueueDataSource({{"uri": {broker.uri!r}, "queue": {queue!r}}})
        reader = source.streamReader(SCHEMA)
        start = reader.initialOffset()
        end = reader.latestOffset(start, ReadMaxRows(10))
        reader.reportLatestOffset()
        assert len(reader.partitions(start, end)) >= 1
        reader.commit(start)
        reader.stop()
        print(sorted(name for name in sys.modules
                     if name.split(".")[0] == "pamqp" or name.endswith(".range_reader")))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]", f"imported on the driver: {done.stdout}"
