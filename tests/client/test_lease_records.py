"""The packed form of lease reads (docs/behaviour/leases.md): what the
broker packs (broker/amqp/lease_records.py), the client decodes
(client/lease_records.py) to the same messages, however the records fall into bodies."""

from __future__ import annotations

import pika
import pytest

from quorumqueue.broker.amqp import codec
from quorumqueue.broker.amqp import lease_records as codec_records
from quorumqueue.broker.amqp.lease_records import pack_records
from quorumqueue.client.lease_records import PackedDecoder, PackedRecords


def header(properties: dict, body_size: int) -> bytes:
    return codec.encode_properties(body_size, properties)


def test_records_decode_to_the_packed_messages_in_order(monkeypatch):
    monkeypatch.setattr(codec_records, "PACK_MESSAGES", 3)
    messages = [(seq, seq % 2, "ex-é" if seq % 3 else "", f"key.{seq}",
                 header({"message_id": f"m{seq}", "headers": {"n": seq}}, seq), b"b" * seq)
                for seq in range(1, 9)]
    bodies = list(pack_records(messages))
    assert len(bodies) == 3  # at most PACK_MESSAGES records a body
    decoder = PackedDecoder()
    decoded = [m for body in bodies for m in decoder.decode(body)]
    assert [(m.seq, m.body, m.exchange, m.routing_key, m.redelivered) for m in decoded] == [
        (seq, b"b" * seq, "ex-é" if seq % 3 else "", f"key.{seq}", seq % 2 == 1)
        for seq in range(1, 9)]
    assert [m.properties.message_id for m in decoded] == [f"m{seq}" for seq in range(1, 9)]
    assert [m.delivery_count for m in decoded] == [seq % 2 for seq in range(1, 9)]
    assert decoded[0].properties.headers == {"n": 1, "x-delivery-count": 1}
    assert decoded[1].properties.headers == {"n": 2}


def test_messages_with_the_same_properties_share_one_decoded_object():
    same = header({"delivery_mode": 2}, 0)
    bodies = pack_records([(1, 0, "", "q", same, b"a"), (2, 0, "", "q", same, b"bb"),
                           (3, 2, "", "q", same, b"c")])
    first, second, counted = PackedDecoder().decode(b"".join(bodies))
    assert first.properties is second.properties
    assert first.properties.delivery_mode == 2 and first.properties.headers == {}
    assert counted.properties is not first.properties
    assert counted.properties.headers == {"x-delivery-count": 2}
    assert first.properties.headers == {}  # the shared one is left as it was


def test_a_cut_body_is_an_error_not_fewer_messages():
    body = b"".join(pack_records([(1, 0, "", "q", header({}, 3), b"abc")]))
    with pytest.raises(ValueError, match="sequence 1 runs past the body"):
        PackedDecoder().decode(body[:-1])
    with pytest.raises(ValueError, match="record header is cut"):
        PackedDecoder().decode(body + body[:5])


def test_the_publishers_lease_bookkeeping_headers_are_replaced():
    raw = header({"headers": {"x-lease-seq": 5, "x-delivery-count": 9, "k": "v"}}, 1)
    plain, counted = PackedDecoder().decode(b"".join(pack_records(
        [(1, 0, "", "q", raw, b"x"), (2, 1, "", "q", raw, b"y")])))
    assert plain.properties.headers == {"x-delivery-count": 9, "k": "v"}
    assert list(counted.properties.headers.items()) == [("k", "v"),
                                                       ("x-delivery-count", 1)]
    assert isinstance(plain.properties, pika.BasicProperties)


def test_a_body_decodes_column_by_column_with_equal_values_shared():
    plain, redelivered = header({"delivery_mode": 2}, 0), header({"priority": 3}, 0)
    records = PackedDecoder().decode(b"".join(pack_records(
        [(1, 0, "", "orders", plain, b"a"), (2, 1, "", "orders", redelivered, b"bb"),
         (3, 0, "ex", "orders", plain, b"")])))
    assert (records.seqs, records.bodies, records.exchanges, records.routing_keys,
            records.redelivered) == ([1, 2, 3], [b"a", b"bb", b""], ["", "", "ex"],
                                     ["orders"] * 3, [False, True, False])
    assert records.routing_keys[0] is records.routing_keys[1]
    assert records.properties[0] is records.properties[2]
    assert records.properties[1].headers == {"x-delivery-count": 1}
    assert [m.seq for m in records] == [1, 2, 3] and records[1].delivery_count == 1
    assert [m.body for m in records[1:]] == [b"bb", b""]


def test_exchange_and_routing_key_are_told_apart_where_they_meet():
    same = header({}, 0)
    records = PackedDecoder().decode(b"".join(pack_records(
        [(1, 0, "ab", "c", same, b""), (2, 0, "a", "bc", same, b"")])))
    assert list(zip(records.exchanges, records.routing_keys)) == [("ab", "c"), ("a", "bc")]


def test_records_of_several_bodies_join_in_order(monkeypatch):
    monkeypatch.setattr(codec_records, "PACK_MESSAGES", 2)
    same = header({}, 0)
    decoder = PackedDecoder()
    joined = PackedRecords()
    for body in pack_records([(seq, 0, "", "q", same, bytes([seq])) for seq in range(1, 6)]):
        joined.extend(decoder.decode(body))
    assert joined.seqs == [1, 2, 3, 4, 5] and len(joined) == 5
    assert joined.bodies == [bytes([seq]) for seq in range(1, 6)]


def test_records_cut_from_views_pack_as_the_decoded_messages_do():
    """The broker packs records from views into its log entries (pack_raw_records):
    the same delivery bodies as from the decoded messages."""
    same = header({"delivery_mode": 2}, 2)
    messages = [(seq, seq % 2, "ex", f"key.{seq}", same, b"b" * seq) for seq in range(1, 6)]
    entry = memoryview(b"".join(h + b for *_n, h, b in messages))
    raw, at = [], 0
    for seq, count, exchange, key, head, body in messages:
        raw.append((seq, count, memoryview(exchange.encode()), memoryview(key.encode()),
                    len(head), entry[at:at + len(head) + len(body)]))
        at += len(head) + len(body)
    assert list(codec_records.pack_raw_records(raw)) == list(pack_records(messages))


def test_a_body_of_uniform_records_shares_one_name_and_one_properties_object():
    same = header({"message_id": "m"}, 3)
    records = PackedDecoder().decode(b"".join(pack_records(
        [(seq, 0, "ex", "key", same, b"%03d" % seq) for seq in range(1, 200)])))
    assert len({id(p) for p in records.properties}) == 1
    assert len({id(e) for e in records.exchanges}) == 1
    assert records.exchanges[0] == "ex" and records.routing_keys[-1] == "key"
    assert records.bodies == [b"%03d" % seq for seq in range(1, 200)]
    assert records[-1].body == b"199" and records[-1].properties.message_id == "m"
