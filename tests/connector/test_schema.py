"""The source schema and Arrow conversion (connector/schema.py).

PySpark accepts a data source's Arrow batch only if its schema equals the declared
one exactly (nullability and timestamp unit included), so every batch is checked
against ARROW_SCHEMA; values are checked column by column.
"""

from __future__ import annotations

import datetime as dt
import decimal

import pika
import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from quorumqueue.broker.amqp import codec
from quorumqueue.broker.amqp.lease_records import pack_entries, pack_records
from quorumqueue.broker.fifo import commands, envelope
from quorumqueue.client.lease_entries import MAX_TIMESTAMP_SECONDS, EntriesDecoder
from quorumqueue.client.delivery import Delivery
from quorumqueue.client.lease_records import PackedDecoder, PackedRecords
from quorumqueue.connector.schema import (ARROW_SCHEMA, COLUMNS, SCHEMA, EntryBatches,
                                          header_text,
                                          headers_map, to_record_batch)

UTC = dt.timezone.utc


def leased(seq: int, body: bytes = b"x", redelivered: bool = False, **properties) -> Delivery:
    return Delivery(seq, body, "events", f"key.{seq}", redelivered,
                    pika.BasicProperties(**properties))


def test_the_columns_named_by_the_issue_in_order():
    assert COLUMNS == (
        "body", "queue", "routing_key", "exchange", "offset", "delivery_count", "redelivered",
        "content_type", "content_encoding", "headers", "delivery_mode", "priority",
        "correlation_id", "reply_to", "expiration", "message_id", "timestamp", "type",
        "user_id", "app_id")
    assert SCHEMA.simpleString().startswith(
        "struct<body:binary,queue:string,routing_key:string,exchange:string,offset:bigint,"
        "delivery_count:int,redelivered:boolean,")
    assert "headers:map<string,string>" in SCHEMA.simpleString()
    assert ARROW_SCHEMA.field("timestamp").type == pa.timestamp("us", tz="UTC")
    assert [f.name for f in SCHEMA.fields if not f.nullable] == [
        "body", "queue", "routing_key", "exchange", "offset", "delivery_count", "redelivered"]


def test_every_property_lands_in_its_column():
    message = leased(
        7, b"\x00payload", redelivered=True, content_type="application/json",
        content_encoding="gzip", headers={"tenant": "acme", "x-delivery-count": 2,
                                          "x-lease-seq": 7},
        delivery_mode=2, priority=5, correlation_id="c-1", reply_to="replies",
        expiration="60000", message_id="m-7", timestamp=1_700_000_000, type="order.created",
        user_id="guest", app_id="shop")
    batch = to_record_batch("orders", [message])
    assert batch.schema.equals(ARROW_SCHEMA)
    assert batch.to_pylist() == [{
        "body": b"\x00payload", "queue": "orders", "routing_key": "key.7",
        "exchange": "events", "offset": 7, "delivery_count": 2, "redelivered": True,
        "content_type": "application/json", "content_encoding": "gzip",
        # x-lease-seq is the offset column, not a header; x-delivery-count stays
        "headers": [("tenant", "acme"), ("x-delivery-count", "2")],
        "delivery_mode": 2, "priority": 5, "correlation_id": "c-1", "reply_to": "replies",
        "expiration": "60000", "message_id": "m-7",
        "timestamp": dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC),
        "type": "order.created", "user_id": "guest", "app_id": "shop"}]


def test_absent_properties_are_null_and_order_is_kept():
    batch = to_record_batch("q", [leased(1), leased(2, b""), leased(3)])
    assert batch.schema.equals(ARROW_SCHEMA)
    rows = batch.to_pylist()
    assert [row["offset"] for row in rows] == [1, 2, 3]
    assert [row["body"] for row in rows] == [b"x", b"", b"x"]
    assert all(row["delivery_count"] == 0 and row["redelivered"] is False for row in rows)
    for name in COLUMNS[7:]:
        assert [row[name] for row in rows] == [None] * 3, name


def test_include_headers_false_leaves_the_column_null():
    batch = to_record_batch("q", [leased(1, headers={"a": "b"})], include_headers=False)
    assert batch.column("headers").to_pylist() == [None]


def test_an_empty_read_is_an_empty_batch_of_the_schema():
    batch = to_record_batch("q", [])
    assert batch.num_rows == 0 and batch.schema.equals(ARROW_SCHEMA)


def test_packed_columns_give_the_batch_their_messages_give():
    """A packed lease read's columns (shared properties, some redelivered) and the same
    messages one object each make the same rows."""
    blocks = [codec.encode_properties(0, properties) for properties in (
        {"delivery_mode": 2}, {"message_id": "m", "headers": {"k": "v"}}, {})]
    records = PackedDecoder().decode(b"".join(pack_records(
        (seq, seq % 4 == 0, "ex" if seq % 5 else "", f"key.{seq % 2}", blocks[seq % 3],
         bytes([seq]) * seq) for seq in range(1, 40))))
    batch = to_record_batch("q", records)
    assert batch.equals(to_record_batch("q", list(records)))
    assert batch.column("delivery_count").to_pylist() == [
        int(seq % 4 == 0) for seq in range(1, 40)]
    assert batch.column("headers").to_pylist()[:4] == [
        [("k", "v")], [], [], [("k", "v"), ("x-delivery-count", "1")]]
    assert to_record_batch("q", records, include_headers=False).column(
        "headers").null_count == 39


def test_the_same_messages_give_the_same_batch():
    messages = [leased(n, bytes([n]) * n, headers={"n": n}, timestamp=n) for n in range(1, 50)]
    assert to_record_batch("q", messages).equals(to_record_batch("q", list(messages)))


@pytest.mark.parametrize("value, text", [
    (None, None),
    ("plain", "plain"),
    ("ünïcode", "ünïcode"),
    (b"bytes", "bytes"),
    (b"\xff\xfe", "\ufffd\ufffd"),
    (True, "true"),
    (False, "false"),
    (0, "0"),
    (-42, "-42"),
    (2 ** 63 - 1, "9223372036854775807"),
    (1.5, "1.5"),
    (decimal.Decimal("12.340"), "12.340"),
    (dt.datetime(2024, 1, 2, 3, 4, 5), "2024-01-02T03:04:05+00:00"),
    ({"nested": {"k": 1}, "b": b"x"}, '{"nested":{"k":1},"b":"x"}'),
    ([1, "two", None, True], '[1,"two",null,true]'),
])
def test_header_values_become_text(value, text):
    assert header_text(value) == text


def test_headers_map_keeps_order_and_drops_only_bookkeeping():
    assert headers_map(None) is None
    assert headers_map({}) == []
    assert headers_map({"b": 1, "x-lease-seq": 9, "a": None}) == [("b", "1"), ("a", None)]


def test_bodies_of_several_packed_deliveries_make_one_column():
    """Records of several delivery bodies joined (PackedRecords.extend) make one batch;
    the body column is cut from each body where the records left them."""
    same = codec.encode_properties(0, {})
    decoder, joined = PackedDecoder(), PackedRecords()
    for first in (1, 4, 7):
        joined.extend(decoder.decode(b"".join(pack_records(
            (seq, 0, "", "q", same, bytes([seq]) * seq) for seq in range(first, first + 3)))))
    batch = to_record_batch("q", joined)
    assert batch.column("body").to_pylist() == [bytes([seq]) * seq for seq in range(1, 10)]
    assert batch.equals(to_record_batch("q", list(joined)))


def _entry(seq: int, exchange: str, routing_key: str, header: bytes, body: bytes) -> bytes:
    return envelope.stamp(commands.encode_enqueue("", seq, 0, exchange, routing_key, header,
                                                  body), 1_700_000_000_000)


@pytest.mark.parametrize("uniform", [True, False])
def test_entries_columns_give_the_batch_their_messages_give(uniform):
    """An "entries" read's columns, built into Arrow column by column, and the same
    messages one object each make the same rows: one publisher's uniform messages,
    and mixed names and properties (some redelivered)."""
    blocks = [codec.encode_properties(0, properties) for properties in (
        {"delivery_mode": 2, "timestamp": dt.datetime(2026, 1, 2, 3, 4, 5)},
        {"message_id": "m", "headers": {"k": "v"}, "priority": 3}, {})]
    entries = [_entry(seq, "" if uniform or seq % 5 else "ex", "orders" if uniform
                      else f"key.{seq % 2}", blocks[0 if uniform else seq % 3],
                      bytes([seq]) * seq) for seq in range(1, 40)]
    counts = {} if uniform else {position: 1 for position in range(0, 39, 4)}
    columns = EntriesDecoder().decode(pack_entries(1, entries, counts))
    batch = to_record_batch("q", columns)
    assert batch.schema.equals(ARROW_SCHEMA)
    assert batch.equals(to_record_batch("q", list(columns)))
    assert batch.column("body").to_pylist() == [bytes([seq]) * seq for seq in range(1, 40)]
    assert batch.column("offset").to_pylist() == list(range(1, 40))
    assert to_record_batch("q", columns, include_headers=False).column(
        "headers").null_count == 39


def _grouped(bodies: list[bytes], group_bytes: int) -> list[tuple[object, list[tuple[int, int]]]]:
    """`bodies` placed back to back into buffers of `group_bytes`, as
    RangeReader.read_groups receives them: (buffer, spans) per buffer."""
    import numpy as np

    groups, buffer, spans, used = [], None, [], 0
    for body in bodies:
        if buffer is None or used + len(body) > len(buffer):
            if spans:
                groups.append((buffer, spans))
            buffer, spans, used = np.empty(max(group_bytes, len(body)), np.uint8), [], 0
        buffer[used:used + len(body)] = np.frombuffer(body, np.uint8)
        spans.append((used, len(body)))
        used += len(body)
    if spans:
        groups.append((buffer, spans))
    return groups


@pytest.mark.parametrize("group_bytes", [1, 3_000, 1 << 20])
def test_deliveries_received_together_make_the_rows_of_their_messages(group_bytes):
    """Several "entries" deliveries decoded as one group and built by one EntryBatches
    (which keeps the columns a run of messages shares between batches) give, batch
    after batch, the rows their messages give one object each: every column, nulls,
    headers (and none with includeHeaders false), a redelivered message's count,
    empty and large bodies, a property set that changes between groups."""
    plain = codec.encode_properties(0, {})
    rich = codec.encode_properties(0, {
        "content_type": "application/json", "headers": {"tenant": "acme", "n": 7,
                                                        "nested": {"k": [1, "x"]}},
        "delivery_mode": 2, "priority": 1, "message_id": "m-1", "timestamp":
        dt.datetime(2026, 12, 4, 21, 0, 0), "app_id": "shop"})
    bodies, seq = [], 1
    for shape in ("rich", "rich", "mixed", "plain", "big", "rich"):
        entries = []
        for number in range(5):
            block = {"rich": rich, "plain": plain, "big": rich,
                     "mixed": (rich, plain)[number % 2]}[shape]
            body = (bytes([seq % 256]) * 70_000 if shape == "big"
                    else b"" if number == 3 else b"%d" % seq)
            entries.append(_entry(seq + number, "ex" if number == 4 else "", "orders",
                                  block, body))
        counts = {1: 2} if shape == "mixed" else {}
        bodies.append(pack_entries(seq, entries, counts))
        seq += 5
    for include_headers in (True, False):
        builder = EntryBatches("q", include_headers)
        batches, decoder = [], EntriesDecoder()
        for buffer, spans in _grouped(bodies, group_bytes):
            columns = decoder.decode_group(buffer, spans)
            batch = builder.batch(columns)
            assert batch.schema.equals(ARROW_SCHEMA)
            assert batch.equals(to_record_batch("q", list(columns), include_headers))
            batches.append(batch)
        rows = pa.Table.from_batches(batches)
        assert rows.column("offset").to_pylist() == list(range(1, 31))
        assert rows.column("body").to_pylist()[20] == bytes([21]) * 70_000
        assert rows.column("redelivered").to_pylist()[11] is True
        assert rows.column("delivery_count").to_pylist()[11] == 2
        assert rows.column("message_id").to_pylist()[:2] == ["m-1", "m-1"]
        assert rows.column("message_id").to_pylist()[15:17] == [None, None]
        headers = rows.column("headers").to_pylist()
        if include_headers:
            assert dict(headers[0]) == {"tenant": "acme", "n": "7",
                                        "nested": '{"k":[1,"x"]}'}
            assert headers[15] == []
        else:
            assert headers == [None] * 30


def test_a_group_whose_deliveries_do_not_follow_each_other_is_refused():
    same = codec.encode_properties(0, {})
    bodies = [pack_entries(first, [_entry(first, "", "q", same, b"x")], {})
              for first in (1, 3)]
    ((buffer, spans),) = _grouped(bodies, 1 << 20)
    with pytest.raises(ValueError, match="starting at sequence 3 follows one ending at 1"):
        EntriesDecoder().decode_group(buffer, spans)


_TEXTS = ("content_type", "content_encoding", "correlation_id", "reply_to", "expiration",
          "message_id", "type", "user_id", "app_id", "cluster_id")
_short = st.one_of(st.text(max_size=6).filter(lambda s: len(s.encode()) < 256),
                   st.binary(max_size=6))   # bytes: not always UTF-8
_values = {**{name: _short for name in _TEXTS},
           "delivery_mode": st.integers(0, 255), "priority": st.integers(0, 255),
           "timestamp": st.one_of(st.integers(0, 2**34), st.integers(0, MAX_TIMESTAMP_SECONDS)),
           "headers": st.tuples(
               st.dictionaries(st.sampled_from(["a", "x-lease-seq", "tenant"]),
                               st.one_of(st.integers(-3, 3), st.text(max_size=3),
                                         st.binary(max_size=3)), max_size=3),
               st.dictionaries(st.just("x-delivery-count"), st.integers(0, 9))).map(
                   lambda parts: parts[0] | parts[1])}


def _block(properties: dict) -> bytes:
    """A content header (class basic, weight 0, body size 0) with `properties`, as
    pika encodes them (short strings may be any octets)."""
    return (b"\x00\x3c\x00\x00" + bytes(8)
            + b"".join(pika.BasicProperties(**properties).encode()))


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_properties_decoded_field_by_field_give_the_rows_decoded_one_by_one(data):
    """Messages whose properties differ but share one layout (the same properties
    present) are decoded column by column (EntryColumns.property_columns); their rows
    equal those of the same messages decoded one properties object each (pika), for any
    values: short strings of any octets (invalid UTF-8 replaced), octets, any timestamp
    an int64 of microseconds holds, headers with the broker's delivery counts; and a
    message of another layout among them."""
    present = data.draw(st.sets(st.sampled_from(sorted(_values)), min_size=1), "present")
    count = data.draw(st.integers(2, 12), "count")
    messages = [{name: data.draw(_values[name], name) for name in sorted(present)}
                for _ in range(count)]
    odd = data.draw(st.booleans(), "another layout")
    if odd:
        messages[-1] = {"priority": 1}
    counts = data.draw(st.dictionaries(st.integers(0, count - 1), st.integers(1, 3)),
                       "delivery counts")
    entries = [_entry(seq, "", "q", _block(properties), b"%d" % seq)
               for seq, properties in enumerate(messages, start=1)]
    columns = EntriesDecoder().decode(pack_entries(1, entries, counts))
    if not odd and len({_block(p) for p in messages}) > 1:
        assert columns.property_columns is not None   # the path under test
    for include_headers in (True, False):
        batch = EntryBatches("q", include_headers).batch(columns)
        assert batch.schema.equals(ARROW_SCHEMA)
        one_by_one = to_record_batch("q", list(columns), include_headers)
        assert batch.equals(one_by_one)
