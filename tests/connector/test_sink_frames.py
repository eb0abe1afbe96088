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

from types import SimpleNamespace

import pika
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql.types import BinaryType, StringType, StructField, StructType

from quorumqueue.connector.options import parse_sink_options
from quorumqueue.connector.publisher import MAX_IN_FLIGHT, ConfirmedPublisher, Outgoing
from quorumqueue.connector.sink_rows import (BodyRun, IdempotencyKey, input_plan, returned_row,
                                             to_messages, to_outgoing)


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
