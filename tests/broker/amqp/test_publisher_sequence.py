"""The idempotent-publishing headers (docs/behaviour/idempotent-publishing.md):
`publisher_sequence` finds x-quorumqueue-publisher and x-quorumqueue-seq by walking
the header table; whatever the table holds, it must answer exactly what decoding the
whole table with pamqp answers, errors included."""

from __future__ import annotations

import datetime as dt
import struct
import decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header

from quorumqueue.broker.amqp import codec
from quorumqueue.broker.amqp.errors import AMQPError
from quorumqueue.broker.amqp import properties as properties_module
from quorumqueue.broker.amqp.properties import (PUBLISHER_HEADER, SEQ_HEADER,
                                                publisher_sequence)


def content_header(**properties) -> codec.Properties:
    frame = pamqp_frame.marshal(pamqp_header.ContentHeader(
        0, 10, commands.Basic.Properties(**properties)), 1)
    return codec.decode_properties(frame[7:-1])[1]


def by_pamqp(properties: codec.Properties):
    """publisher_sequence as it was: the whole table decoded by pamqp."""
    scan, sink_key = properties_module._scan_sequence_headers, properties_module._sink_key
    properties_module._scan_sequence_headers = lambda _properties: None
    properties_module._sink_key = lambda _raw, _at: None
    try:
        return publisher_sequence(properties)
    except AMQPError as error:
        return error.code, error.reply_text
    finally:
        properties_module._scan_sequence_headers = scan
        properties_module._sink_key = sink_key


def answer(properties: codec.Properties):
    try:
        return publisher_sequence(properties)
    except AMQPError as error:
        return error.code, error.reply_text


def test_the_sinks_headers_are_found_among_others():
    properties = content_header(content_type="application/json", headers={
        "tenant": "acme", "n": 7, "nested": {"a": [1, "x"]}, PUBLISHER_HEADER: "spark-q/1",
        SEQ_HEADER: (5 << 32) + 3, "after": bytearray(b"\x00\xff")})
    assert answer(properties) == ("spark-q/1", (5 << 32) + 3)
    assert properties_module._scan_sequence_headers(properties) == ("spark-q/1", (5 << 32) + 3)


@pytest.mark.parametrize("headers, text", [
    ({PUBLISHER_HEADER: "p"}, f"header '{SEQ_HEADER}' must be an integer"),
    ({SEQ_HEADER: 4}, f"header '{PUBLISHER_HEADER}' must be a string of 1 to 255 bytes"),
    ({PUBLISHER_HEADER: "p", SEQ_HEADER: "4"}, f"header '{SEQ_HEADER}' must be an integer"),
    ({PUBLISHER_HEADER: "p", SEQ_HEADER: 0}, f"header '{SEQ_HEADER}' must be an integer"),
    ({PUBLISHER_HEADER: 5, SEQ_HEADER: 1}, f"header '{PUBLISHER_HEADER}' must be a string"),
    ({PUBLISHER_HEADER: "", SEQ_HEADER: 1}, f"header '{PUBLISHER_HEADER}' must be a string"),
])
def test_a_wrong_pair_is_refused_naming_the_header(headers, text):
    code, reply = answer(content_header(headers=headers))
    assert code == 406 and text in reply


values = st.recursive(
    st.one_of(st.booleans(), st.integers(-2**63, 2**63 - 1), st.text(max_size=8),
              st.binary(max_size=8).map(bytearray), st.floats(allow_nan=False), st.none(),
              st.decimals(places=2, min_value=-1000, max_value=1000, allow_nan=False,
                          allow_infinity=False),
              st.datetimes(min_value=dt.datetime(1971, 1, 1), max_value=dt.datetime(2100, 1, 1),
                           timezones=st.just(dt.timezone.utc)).map(
                  lambda stamp: stamp.replace(microsecond=0))),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                  max_size=3),
    max_leaves=6)
ours = st.fixed_dictionaries({}, optional={
    PUBLISHER_HEADER: st.one_of(st.text(max_size=300), st.integers(0, 9), st.binary(max_size=4).map(bytearray)),
    SEQ_HEADER: st.one_of(st.integers(-5, 2**64 + 5), st.text(max_size=3), st.booleans())})


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.text(max_size=12), values, max_size=5), ours,
       st.sampled_from([None, "text/plain"]), st.booleans())
def test_the_scan_answers_what_decoding_the_whole_table_answers(others, pair, content_type,
                                                                 ours_first):
    headers = {**pair, **others} if ours_first else {**others, **pair}
    try:
        properties = content_header(content_type=content_type, headers=headers)
    except (TypeError, ValueError, OverflowError):
        return  # a table pamqp cannot encode (e.g. an integer beyond 64 bits)
    assert answer(properties) == by_pamqp(properties)


# The Spark sink's table, byte for byte (connector/sink_rows.py, `_Stamped`): the
# publisher as a long string, then the seq as a signed 64-bit 'l', nothing else. The
# broker reads it in place (`_sink_key`); near misses must be answered as before.
def entry(name: bytes, kind: bytes, value: bytes) -> bytes:
    return bytes([len(name)]) + name + kind + value


def publisher_entry(value: bytes, length: int | None = None) -> bytes:
    size = len(value) if length is None else length
    return entry(PUBLISHER_HEADER.encode(), b"S", size.to_bytes(4, "big") + value)


def seq_entry(seq: int, kind: bytes = b"l") -> bytes:
    return entry(SEQ_HEADER.encode(), kind, seq.to_bytes(8, "big", signed=True))


def with_table(*entries: bytes) -> codec.Properties:
    """A content header with this header table and delivery mode 2."""
    table = b"".join(entries)
    payload = (struct.pack(">HHQH", 60, 0, 10, (1 << 13) | (1 << 12))
               + len(table).to_bytes(4, "big") + table + b"\x02")
    return codec.decode_properties(payload)[1]


def test_the_sinks_own_table_is_read_in_place():
    properties = with_table(publisher_entry(b"spark-query/ab12/3"), seq_entry((7 << 32) + 9))
    assert properties_module._sink_key(properties.raw, properties.headers_at) == (
        "spark-query/ab12/3", (7 << 32) + 9)
    assert answer(properties) == ("spark-query/ab12/3", (7 << 32) + 9) == by_pamqp(properties)
    assert properties.persistent


@pytest.mark.parametrize("entries", [
    (publisher_entry(b"p"), seq_entry(5), entry(b"other", b"t", b"\x01")),   # one more entry
    (publisher_entry(b"p"), seq_entry(5), seq_entry(6)),                    # the seq twice
    (publisher_entry(b"p"), seq_entry(5), publisher_entry(b"q")),           # the publisher twice
    (publisher_entry(b""), seq_entry(5)),                                   # empty publisher
    (publisher_entry(b"x" * 256), seq_entry(5)),                            # 256 bytes
    (publisher_entry(b"x" * 255), seq_entry(5)),                            # 255 bytes: fine
    (publisher_entry(b"\xff\xfe"), seq_entry(5)),                           # not UTF-8
    (publisher_entry(b"p"), seq_entry(0)),
    (publisher_entry(b"p"), seq_entry(-3)),
    (publisher_entry(b"p"), seq_entry(5, b"L")),                            # another integer type
    (publisher_entry(b"p", length=40), seq_entry(5)),                       # length past the table
    (publisher_entry(b"p", length=0), b"p" + seq_entry(5)),                 # length too short
    (publisher_entry(b"p"),),                                               # no seq
], ids=["extra", "seq-twice", "publisher-twice", "empty", "256-bytes", "255-bytes",
        "not-utf8", "seq-0", "seq-negative", "type-L", "long-length", "short-length", "no-seq"])
def test_a_table_like_the_sinks_is_answered_as_decoding_it_whole_answers(entries):
    try:
        properties = with_table(*entries)
    except AMQPError:
        return  # not even a well-formed content header: never reaches a queue
    assert answer(properties) == by_pamqp(properties)
