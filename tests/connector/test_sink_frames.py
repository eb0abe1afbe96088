"""A batch of bodies as one `BodyRun`: frames built column-wise, confirms as spans.

The sink publishes a batch whose only column is `body` as one run whose frames are
built for all its rows at once (connector/sink_rows.py, `BodyRun`); the publisher
writes slices of them and keeps its unconfirmed messages as spans of delivery tags
(connector/publisher.py). These tests pin the bulk bytes to the row-by-row path
(itself pinned to pika's `basic_publish` in test_sink.py), and drive the publisher's
window, acks and nacks without a broker. AMQP 0-9-1 section 4.2.6 (content framing),
RabbitMQ's publisher confirms (seeds: confirms.md, multiple acks).
"""

from __future__ import annotations

import dataclasses
import struct
from types import SimpleNamespace

import numpy as np
import pika
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql.types import BinaryType, StringType, StructField, StructType

from quorumqueue.broker.amqp.batch_publish import is_batch, split
from quorumqueue.broker.amqp.properties import decode_properties, publisher_sequence
from quorumqueue.connector.options import parse_sink_options
from quorumqueue.connector.publisher import (MAX_IN_FLIGHT, MAX_IN_FLIGHT_BATCHED,
                                             ConfirmedPublisher, Outgoing)
from quorumqueue.connector.sink_rows import (BATCH_BYTES, BATCH_ROWS, BodyRun, IdempotencyKey,
                                             input_plan, returned_row, to_messages, to_outgoing,
                                             unit_bounds)


def publisher_on(channel: int, body_max: int, mandatory: bool = False,
                 written: list | None = None) -> ConfirmedPublisher:
    """A publisher whose channel is open, writing into `written` (no broker)."""
    options = parse_sink_options({"uri": "amqp://h", "routingKey": "k"})
    publisher = ConfirmedPublisher(options.addresses, mandatory, 1.0, returned_row)
    publisher._channel = SimpleNamespace(channel_number=channel, is_open=True)
    publisher._body_max = body_max
    publisher._connection = SimpleNamespace(
        is_open=False, _output_marshaled_frames=(written if written is not None else []).extend)
    publisher._ioloop = SimpleNamespace(stop=lambda: None)
    return publisher


def plan_for(text: bool, routing_key: str = "k", exchange: str = ""):
    schema = StructType([StructField("body", StringType() if text else BinaryType())])
    options = parse_sink_options({"uri": "amqp://h", "routingKey": routing_key,
                                  **({"exchange": exchange} if exchange else {})})
    return input_plan(schema, options), options


def row_by_row(publisher: ConfirmedPublisher, messages) -> bytes:
    frames: list[bytes] = []
    for message in messages:
        publisher._encode(message, frames)
    return b"".join(frames)


@settings(max_examples=60, deadline=None)
@given(bodies=st.lists(st.binary(min_size=1, max_size=300), min_size=1, max_size=40),
       text=st.booleans(), body_max=st.integers(50, 400), channel=st.integers(1, 3),
       mandatory=st.booleans(), base=st.sampled_from([0, 7 << 32, (1 << 62)]),
       first_rows=st.integers(0, 5), exchange=st.sampled_from(["", "events"]))
def test_a_runs_frames_are_the_row_by_row_frames(bodies, text, body_max, channel, mandatory,
                                                  base, first_rows, exchange):
    if text:
        bodies = [body.decode("latin-1").encode() for body in bodies]
    plan, options = plan_for(text, exchange=exchange)
    key = IdempotencyKey("spark-query/q/4", base)
    column = pa.array([body.decode() for body in bodies]) if text else pa.array(bodies)
    batches = [pa.record_batch([pa.array(["x"] * first_rows, pa.string()) if text else
                                pa.array([b"x"] * first_rows)], names=["body"]),
               pa.record_batch([column], names=["body"])]
    outgoing = list(to_outgoing(batches, plan, options, key))
    runs = [item for item in outgoing if isinstance(item, BodyRun)]
    assert len(runs) == 1 + bool(first_rows)
    run = runs[-1]
    assert (run.first_row, run.count) == (first_rows, len(bodies))
    expected = list(to_messages(batches, plan, options, key))[first_rows:]
    publisher = publisher_on(channel, body_max, mandatory)
    frames = publisher._frames(run)
    if max(map(len, bodies)) > body_max:
        assert frames is None   # the publisher sends such a run's rows one by one
    else:
        buffer, offsets = frames
        assert len(offsets) == len(bodies) + 1
        assert bytes(buffer[offsets[0]:offsets[-1]]) == row_by_row(publisher, expected)
        for index, message in enumerate(expected):
            assert bytes(buffer[offsets[index]:offsets[index + 1]]) == row_by_row(
                publisher, [message])
    by_row = list(run.messages(0, run.count))
    assert row_by_row(publisher, by_row) == row_by_row(publisher, expected)
    assert [returned_row(message.properties) for message in by_row] == [
        message.row for message in expected]


def test_batches_with_other_columns_null_or_empty_bodies_go_row_by_row():
    plan, options = plan_for(text=False)
    key = IdempotencyKey("p", 0)
    for bodies in ([b"a", b""], [b"a", None]):
        batch = pa.record_batch([pa.array(bodies, pa.binary())], names=["body"])
        outgoing = to_outgoing([batch], plan, options, key)
        assert isinstance(next(outgoing), Outgoing)
    schema = StructType([StructField("body", BinaryType()),
                         StructField("routing_key", StringType())])
    batch = pa.record_batch([pa.array([b"a"]), pa.array(["r"])], names=["body", "routing_key"])
    [message] = to_outgoing([batch], input_plan(schema, options), options, key)
    assert (message.row, message.routing_key, message.body) == (0, "r", b"a")


def body_runs(*sizes: int):
    plan, options = plan_for(text=False)
    batches = [pa.record_batch([pa.array([b"%d" % n for n in range(size)])], names=["body"])
               for size in sizes]
    return list(to_outgoing(batches, plan, options, IdempotencyKey("p", 0)))


def confirm(publisher: ConfirmedPublisher, tag: int, multiple: bool, nack: bool = False):
    method = (pika.spec.Basic.Nack if nack else pika.spec.Basic.Ack)(delivery_tag=tag,
                                                                    multiple=multiple)
    publisher._on_confirm(SimpleNamespace(method=method))


def test_a_window_is_a_slice_of_a_runs_frames_and_multiple_acks_refill_it():
    # rows 0-2,499 and 2,500-2,999 in two runs: 1,000 in flight at most, written as
    # slices; multiple acks clear spans and trims of spans, a single ack splits one
    written: list[bytes] = []
    publisher = publisher_on(1, 1000, written=written)
    runs = body_runs(2500, 500)
    publisher._messages = iter(runs)
    publisher._fill()
    assert publisher._in_flight == MAX_IN_FLIGHT and publisher._published == 1000
    expected = b"".join(row_by_row(publisher, run.messages(0, run.count)) for run in runs)
    confirm(publisher, 600, multiple=True)
    assert publisher._in_flight == 1000 and publisher._tag == 1600
    confirm(publisher, 1200, multiple=False)    # out of order: one tag alone, one more sent
    assert publisher._in_flight == 1000 and publisher._tag == 1601
    confirm(publisher, 1599, multiple=True)     # the span past 1,200 is trimmed
    assert publisher._in_flight == 1000 and publisher._tag == 2599
    confirm(publisher, 2599, multiple=True)
    assert publisher._tag == 3000 and publisher._exhausted
    confirm(publisher, 3000, multiple=True)
    assert publisher._in_flight == 0 and not publisher._failed and publisher._done
    assert b"".join(written) == expected


def test_a_nack_inside_a_run_names_that_row_and_stops_publishing():
    publisher = publisher_on(1, 1000)
    publisher._messages = iter(body_runs(10, 2000))
    publisher._fill()
    confirm(publisher, 5, multiple=True)                 # tags 1,001-1,005 refill the window
    confirm(publisher, 700, multiple=False, nack=True)   # row 699 (the second run's 689th)
    confirm(publisher, 999, multiple=True, nack=True)    # tags 6-999 but 700
    assert [failed.row for failed in publisher._failed] == [699, *range(5, 699),
                                                            *range(700, 999)]
    assert publisher._published == 1005 and publisher._in_flight == 6   # nothing more sent
    assert "the broker nacked 994 message(s) (rows 5, 6, 7, 8, 9 and 989 more" in (
        publisher._describe_failure())


def test_a_lost_connection_sends_a_runs_unconfirmed_rows_again_in_row_order_first():
    # publisher.py's invariant: after a reconnect the unconfirmed messages go again in
    # row order before the rest; for runs, as slices of their frames on the new channel
    written: list[bytes] = []
    publisher = publisher_on(1, 1000, written=written)
    publisher._reconnect = SimpleNamespace(next_pause=lambda: 0.0, what="test", attempts=1)
    publisher._ioloop = SimpleNamespace(stop=lambda: None, call_later=lambda *_: None)
    runs = body_runs(300, 1200)
    publisher._messages = iter(runs)
    publisher._fill()                        # rows 0-999
    confirm(publisher, 100, multiple=True)   # rows 1,000-1,099 sent too
    confirm(publisher, 150, multiple=False)  # row 149 confirmed; row 1,100 sent
    publisher._on_close(None, ConnectionError("lost"))
    assert publisher._in_flight == 0 and publisher._published == 1101
    written.clear()
    publisher._channel = SimpleNamespace(channel_number=2, is_open=True)   # a new channel
    publisher._method_frames, publisher._tag = {}, 0
    publisher._fill()
    fresh = publisher_on(2, 1000)
    rows = [*range(100, 149), *range(150, 1101)]
    by_row = {n: m for run in runs for n, m in enumerate(run.messages(0, run.count),
                                                          run.first_row)}
    assert b"".join(written) == row_by_row(fresh, [by_row[row] for row in rows])
    assert publisher._in_flight == 1000 and publisher._published == 1101
    confirm(publisher, 1000, multiple=True)  # then rows 1,101-1,499
    assert publisher._tag == 1399 and publisher._exhausted
    confirm(publisher, 1399, multiple=True)
    assert publisher._done and not publisher._failed and publisher._published == 1500


# ------------------------------------------------------------ batch publishes

def frames_of(data: bytes) -> list[tuple[int, bytes]]:
    """(frame type, payload) of every frame in `data`."""
    out, at = [], 0
    while at < len(data):
        kind, _channel, size = struct.unpack_from(">BHI", data, at)
        assert data[at + 7 + size] == 0xCE
        out.append((kind, data[at + 7:at + 7 + size]))
        at += 8 + size
    return out


def published(data: bytes) -> list[tuple[bytes, bytes, bytes]]:
    """(basic.publish payload, content header payload, body) of each publish."""
    messages = []
    for kind, payload in frames_of(data):
        if kind == 1:
            messages.append([payload, b"", b""])
        elif kind == 2:
            messages[-1][1] = payload
        else:
            messages[-1][2] += payload
    return [tuple(message) for message in messages]


@settings(max_examples=60, deadline=None)
@given(bodies=st.lists(st.binary(min_size=1, max_size=300), min_size=1, max_size=40),
       body_max=st.integers(50, 400), channel=st.integers(1, 3), mandatory=st.booleans(),
       base=st.sampled_from([0, 7 << 32, (1 << 62)]), batch_rows=st.integers(1, 12),
       exchange=st.sampled_from(["", "events"]))
def test_a_batched_runs_publishes_carry_the_row_by_row_messages(bodies, body_max, channel,
                                                                mandatory, base, batch_rows,
                                                                exchange):
    """Each unit of a batched run is one basic.publish (immediate set, the batch form
    of docs/behaviour/idempotent-publishing.md) that the bundled broker's reader of
    that form (broker/amqp/batch_publish.py) cuts into exactly the header and body
    each row sends alone; bodies of any size (a batch's body spans frames)."""
    plan, options = plan_for(False, exchange=exchange)
    key = IdempotencyKey("spark-query/q/4", base)
    batches = [pa.record_batch([pa.array(bodies)], names=["body"])]
    [run] = to_outgoing(batches, plan, options, key)
    batched = run.batched(batch_rows)
    assert batched.count == -(-len(bodies) // batch_rows)
    publisher = publisher_on(channel, body_max, mandatory)
    buffer, offsets = publisher._frames(batched)
    alone = published(row_by_row(publisher, to_messages(batches, plan, options, key)))
    rows = []
    for unit in range(batched.count):
        [(method, header, body)] = published(bytes(buffer[offsets[unit]:offsets[unit + 1]]))
        alone_method = alone[batched.row_range(unit, unit + 1)[0]][0]
        assert method[:-1] == alone_method[:-1] and method[-1] == alone_method[-1] | 2
        assert method[-1] == (2 | mandatory)            # immediate, and mandatory if asked
        _class_id, properties = decode_properties(header)
        assert is_batch(properties)
        for record, record_body in split(properties, body, 16 * 1024 * 1024).records:
            # the key the broker keeps for it is the one its header table holds
            assert publisher_sequence(dataclasses.replace(record, key=None)) == record.key
            rows.append((record.raw, record_body))
    assert rows == [(header, body) for _method, header, body in alone]


def test_a_batch_too_large_for_its_row_count_is_cut_by_bytes():
    plan, options = plan_for(False)
    body = b"x" * 100_000
    [run] = to_outgoing([pa.record_batch([pa.array([body] * 30)], names=["body"])], plan,
                        options, IdempotencyKey("p", 0))
    batched = run.batched()
    units = [batched.row_range(unit, unit + 1) for unit in range(batched.count)]
    assert batched.count > 1 and units[-1][1] == 30
    assert all((last - first) * (len(body) + 4) <= BATCH_BYTES for first, last in units)


def test_one_large_row_among_small_ones_gets_a_batch_of_its_own():
    """Units are cut by bytes, not by a mean size: a 3 MB row among 999 rows of 10 B
    would have made a unit of 1,000 rows and 3 MB with a mean-sized cut (the broker
    takes a batch body up to 4 MiB, or the message limit plus 4 bytes)."""
    plan, options = plan_for(False)
    bodies = [b"s" * 10] * 500 + [b"L" * 3_000_000] + [b"s" * 10] * 499
    [run] = to_outgoing([pa.record_batch([pa.array(bodies)], names=["body"])], plan,
                        options, IdempotencyKey("p", 0))
    batched = run.batched()
    units = [batched.row_range(unit, unit + 1) for unit in range(batched.count)]
    assert units == [(0, 500), (500, 501), (501, 1000)]
    assert [batched.units_within(0, rows) for rows in (1, 499, 500, 501, 1000)] == \
        [1, 1, 1, 2, 3]


def test_unit_bounds_hold_rows_and_bytes():
    sizes = np.array([100] * 7 + [5000] + [1] * 3)
    bounds = unit_bounds(sizes, batch_rows=4, batch_bytes=420)
    assert bounds.tolist() == [0, 4, 7, 8, 11]
    # a unit is never empty, and every row is in exactly one
    assert unit_bounds(np.array([10_000]), 1000, 100).tolist() == [0, 1]
    assert unit_bounds(np.array([], dtype=np.int64), 1000, 100).tolist() == [0]


def test_batched_rows_take_one_tag_per_batch_and_a_nack_names_its_rows():
    written: list[bytes] = []
    publisher = publisher_on(1, 1000, written=written)
    publisher._batching = True
    plan, options = plan_for(False)
    batches = [pa.record_batch([pa.array([b"%d" % n for n in range(size)])], names=["body"])
               for size in (2500, 3000)]
    publisher._messages = iter(to_outgoing(batches, plan, options, IdempotencyKey("p", 0)))
    publisher._fill()
    # the window is in rows, filled a batch at a time: 1,000 + 1,000 + 500 (the first
    # run's end) + 1,000 + 1,000: one batch past 4,000 at most
    assert BATCH_ROWS == 1000 and MAX_IN_FLIGHT_BATCHED == 4000
    assert publisher._tag == 5
    assert publisher._in_flight == publisher._published == 4500
    assert all(method[-1] & 2 for method, _header, _body in published(b"".join(written)))
    confirm(publisher, 1, multiple=False)               # rows 0-999; one more batch goes
    assert (publisher._tag, publisher._in_flight, publisher._published) == (6, 4500, 5500)
    confirm(publisher, 3, multiple=False, nack=True)    # rows 2,000-2,499, the first run's end
    assert [failed.row for failed in publisher._failed] == list(range(2000, 2500))
    assert "rows 2000, 2001, 2002, 2003, 2004 and 495 more" in publisher._describe_failure()


def test_batches_unconfirmed_on_a_lost_connection_go_row_by_row_to_a_broker_without_them():
    written: list[bytes] = []
    publisher = publisher_on(1, 1000, written=written)
    publisher._batching = True
    publisher._reconnect = SimpleNamespace(next_pause=lambda: 0.0, what="test", attempts=1)
    publisher._ioloop = SimpleNamespace(stop=lambda: None, call_later=lambda *_: None)
    runs = body_runs(1500)
    publisher._messages = iter(runs)
    publisher._fill()
    confirm(publisher, 1, multiple=False)               # rows 0-999 confirmed
    publisher._on_close(None, ConnectionError("lost"))
    written.clear()
    publisher._batching = False                         # the new node is not the bundled broker
    publisher._channel = SimpleNamespace(channel_number=1, is_open=True)
    publisher._method_frames, publisher._tag = {}, 0
    publisher._fill()
    fresh = publisher_on(1, 1000)
    assert b"".join(written) == row_by_row(fresh, runs[0].messages(1000, 1500))
    confirm(publisher, 500, multiple=True)
    assert publisher._done and not publisher._failed and publisher._published == 1500
