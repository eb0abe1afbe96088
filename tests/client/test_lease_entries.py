"""The "entries" form of lease reads (docs/behaviour/leases.md, "Leases (wire form)"): the
broker sends the messages' log entries as stored (broker/amqp/lease_records.pack_entries),
the client finds their fields column by column (client/lease_entries.py) and must get
what the broker's own decoder of the log format gets (broker/fifo/commands)."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from quorumqueue.broker.amqp import codec, lease_records
from quorumqueue.broker.amqp.lease_records import pack_entries
from quorumqueue.broker.fifo import commands, envelope
from quorumqueue.broker.raft import forwarded
from quorumqueue.client.lease_entries import EntriesDecoder
from quorumqueue.client.lease_records import PackedDecoder


def entry(seq: int, exchange: str = "", routing_key: str = "q", properties: dict | None = None,
          body: bytes = b"x", timed: bool = True, forwarded_from: int | None = None,
          priority: int = 0, publisher: str = "", bcc: tuple = ()) -> bytes:
    header = codec.encode_properties(len(body), properties or {})
    data = commands.encode_enqueue(publisher, seq, priority, exchange, routing_key, header, body,
                                   blind_keys=bcc)
    if timed:
        data = envelope.stamp(data, 1_700_000_000_000 + seq)
    if forwarded_from is not None:
        data = forwarded.wrap(forwarded.Identity(forwarded_from, seq, True), data)
    return data


def expected(data: bytes) -> tuple[str, str, bytes, bytes]:
    """What the broker's decoder of the log format reads in an entry."""
    _identity, command = forwarded.unwrap(data)
    start = envelope.TIMED_HEAD.size if command[0] == envelope.TIMED else 0
    return commands.decode_message(command, start)


def properties_of(header: bytes, count: int):
    return PackedDecoder()._remembered(header[lease_records.PROPERTIES_AT:], count)


def test_the_readers_constants_are_the_log_formats():
    assert lease_records.ENTRY_FORWARDED == forwarded.FORWARDED
    assert lease_records.ENTRY_FORWARDED_SIZE == forwarded.HEAD_SIZE
    assert lease_records.ENTRY_TIMED == envelope.TIMED
    assert lease_records.ENTRY_TIMED_SIZE == envelope.TIMED_HEAD.size
    assert lease_records.ENQUEUE_HEAD.size == commands._enqueue_head.size
    assert commands.encode_enqueue("", 0, 0, "", "", b"", b"")[0] == lease_records.ENQUEUE_TAG
    assert commands.BLIND_ENQUEUE == lease_records.ENQUEUE_BCC_TAG


def test_an_enqueue_with_bcc_keys_decodes_to_its_message_without_them():
    """Tag 21 (FORMAT.md): the message's BCC keys follow its body in the entry, which
    an "entries" read sends as stored; the body ends at its size, the keys are never
    read, and the message is the one the broker's decoder reads."""
    entries = [entry(1, body=b"one", bcc=("secret",)), entry(2, body=b"two"),
               entry(3, body=b"", bcc=("", "x" * 300), forwarded_from=7),
               entry(4, body=b"four", bcc=("k",), timed=False)]
    decoded = list(EntriesDecoder().decode(pack_entries(1, entries, {})))
    assert [m.body for m in decoded] == [b"one", b"two", b"", b"four"]
    for message, data in zip(decoded, entries):
        exchange, routing_key, _header, body = expected(data)
        assert (message.exchange, message.routing_key, message.body) == (exchange, routing_key,
                                                                         body)
    plain = entry(1, body=b"one")  # as tag 21, with less than the keys' count after it
    cut = plain[:envelope.TIMED_HEAD.size] + b"\x15" + plain[envelope.TIMED_HEAD.size + 1:] \
        + b"\x00\x00"
    with pytest.raises(ValueError, match="sequence 1 does not parse"):
        EntriesDecoder().decode(pack_entries(1, [cut], {}))


def test_entries_decode_to_the_messages_the_log_holds_in_sequence_order():
    entries = [entry(1, "amq.direct", "orders", {"message_id": "a"}, b"one"),
               entry(2, "", "q", {"headers": {"n": 2}}, b"", timed=False),
               entry(3, "ex-é", "k" * 255, {"delivery_mode": 2}, b"3" * 300,
                     forwarded_from=0xABCD, priority=9, publisher="spark-query/x/0")]
    columns = EntriesDecoder().decode(pack_entries(41, entries, {1: 4}))
    assert len(columns) == 3 and columns.first_seq == 41 and columns.last_seq == 43
    decoded = list(columns)
    for message, data in zip(decoded, entries):
        exchange, routing_key, header, body = expected(data)
        assert (message.exchange, message.routing_key, message.body) == (exchange, routing_key,
                                                                         body)
    assert [m.seq for m in decoded] == [41, 42, 43]
    assert [m.redelivered for m in decoded] == [False, True, False]
    assert decoded[0].properties.message_id == "a"
    assert decoded[1].properties.headers == {"n": 2, "x-delivery-count": 4}
    assert decoded[2].properties.delivery_mode == 2 and decoded[2].properties.headers == {}


def test_one_publishers_messages_share_one_name_and_one_properties_object():
    entries = [entry(seq, "", "q", {"delivery_mode": 2}, bytes([seq]) * seq) for seq in range(50)]
    columns = EntriesDecoder().decode(pack_entries(1, entries, {}))
    assert (columns.exchange, columns.routing_key) == ("", "q")
    assert columns.property_positions is None and len(columns.properties) == 1
    assert [m.body for m in columns] == [bytes([seq]) * seq for seq in range(50)]


def test_names_that_only_look_alike_are_told_apart():
    # the same octets once the length octets are left out: "ab"+"c" and "a"+"bc"
    columns = EntriesDecoder().decode(pack_entries(1, [entry(1, "ab", "c"), entry(2, "a", "bc")],
                                                   {}))
    assert columns.exchange is None
    assert [(m.exchange, m.routing_key) for m in columns] == [("ab", "c"), ("a", "bc")]


@pytest.mark.parametrize("length", [3, 8, 13, 40])
def test_property_blocks_that_differ_in_any_one_octet_are_told_apart(length):
    """The same-for-all check compares the property blocks eight octets at a time (the
    last word overlapping): a block that differs from the first in any one octet,
    wherever it lies, gives the messages their own properties."""
    for position in range(length):
        ids = ["a" * length] * 5
        ids[3] = "a" * position + "b" + "a" * (length - position - 1)
        entries = [entry(seq, properties={"message_id": ids[seq]}) for seq in range(5)]
        columns = EntriesDecoder().decode(pack_entries(1, entries, {}))
        assert [m.properties.message_id for m in columns] == ids
        # not the shared block: distinct blocks, or (one layout) field by field
        assert columns.property_positions is not None or columns.property_columns is not None
    same = EntriesDecoder().decode(pack_entries(1, [entry(seq, properties={
        "message_id": "a" * length}) for seq in range(5)], {}))
    assert same.property_positions is None and same.property_columns is None


def test_the_publishers_x_delivery_count_stays_unless_the_broker_counted():
    entries = [entry(1, properties={"headers": {"x-delivery-count": 7}}),
               entry(2, properties={"headers": {"x-delivery-count": 7}})]
    columns = EntriesDecoder().decode(pack_entries(1, entries, {1: 2}))
    assert [m.delivery_count for m in columns] == [7, 2]
    assert [m.properties.headers for m in columns] == [{"x-delivery-count": 7},
                                                       {"x-delivery-count": 2}]


@pytest.mark.parametrize("damage, says", [
    (lambda body: body[:-1], "entries of"),
    (lambda body: body[:21], "table"),
    (lambda body: bytes([2]) + body[1:], "version 2"),
])
def test_a_damaged_body_is_an_error_not_fewer_messages(damage, says):
    body = pack_entries(1, [entry(1), entry(2)], {})
    with pytest.raises(ValueError, match=says):
        EntriesDecoder().decode(damage(body))


def test_an_entry_that_is_not_an_enqueue_is_named():
    settle = commands.encode(commands.Settle("c", (1,)))
    with pytest.raises(ValueError, match="sequence 8 is not an Enqueue"):
        EntriesDecoder().decode(pack_entries(7, [entry(7), settle], {}))


def test_an_empty_body_has_no_messages():
    assert len(EntriesDecoder().decode(pack_entries(5, [], {}))) == 0


names = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20).filter(
    lambda s: len(s.encode()) < 256)
properties = st.fixed_dictionaries({}, optional={
    "message_id": names, "content_type": names, "delivery_mode": st.sampled_from([1, 2]),
    "priority": st.integers(0, 9),
    "timestamp": st.integers(0, 2**33).map(
        lambda s: dt.datetime.fromtimestamp(s, dt.timezone.utc).replace(tzinfo=None)),
    "headers": st.dictionaries(names, st.one_of(st.integers(-5, 5), names), max_size=3)})


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(names, names, properties, st.binary(max_size=64), st.booleans(),
                          st.booleans(), st.lists(names, max_size=2).map(tuple),
                          st.integers(0, 3)), min_size=1, max_size=30))
def test_any_entries_decode_as_the_log_format_says(messages):
    entries = [entry(seq, exchange, key, props, body, timed, 5 if forwarded_ else None,
                     bcc=bcc)
               for seq, (exchange, key, props, body, timed, forwarded_, bcc, _count)
               in enumerate(messages)]
    counts = {position: count for position, (*_, count) in enumerate(messages) if count}
    columns = EntriesDecoder().decode(pack_entries(100, entries, counts))
    assert len(columns) == len(entries)
    for position, (message, data) in enumerate(zip(columns, entries)):
        exchange, routing_key, header, body = expected(data)
        count = counts.get(position, 0)
        assert message.seq == 100 + position
        assert (message.exchange, message.routing_key, message.body) == (exchange, routing_key,
                                                                         body)
        assert message.redelivered == (count > 0)
        assert vars(message.properties) == vars(properties_of(header, count))
    assert np.array_equal(columns.seqs, np.arange(100, 100 + len(entries)))
