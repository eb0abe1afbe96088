"""The log-entry envelope (broker/fifo/envelope.py), byte for byte as FORMAT.md
"Quorum-queue entries" documents it: lease commands and ticks carry `0xFF | u64
leader time in ms`, every other command is its encoding alone."""

from __future__ import annotations

import pytest

from quorumqueue.broker.fifo import commands
from quorumqueue.broker.fifo.commands import (Cancel, Checkout, Dequeue, Discard, Down,
                                              LeaseGrow, LeaseRelease, LeaseSettle, NodeDown,
                                              NodeUp, Purge, Return, Settle, Tick,
                                              UpdateConfig)
from quorumqueue.broker.fifo.envelope import (TIMED, TIMED_HEAD, decode_entry, encode_command,
                                              stamp, stamped_enqueue)

NOW = 1_764_000_000_123  # ms since the epoch (2025-11-24)
NOW_BYTES = NOW.to_bytes(8, "big")


@pytest.mark.parametrize("command, expected", [
    (Tick(), b"\xff" + NOW_BYTES + b"\x0d"),
    (LeaseRelease("l"), b"\xff" + NOW_BYTES + b"\x0c\x00\x01l"),
    (LeaseRelease("l", fence=True), b"\xff" + NOW_BYTES + b"\x0c\x00\x01l\x01"),
    (LeaseSettle("l", 7), b"\xff" + NOW_BYTES + b"\x0b\x00\x01l" + (7).to_bytes(8, "big")),
    (LeaseGrow("l", 3, 0, 500), b"\xff" + NOW_BYTES + b"\x0a\x00\x01l"
     + (3).to_bytes(4, "big") + (0).to_bytes(8, "big") + (500).to_bytes(8, "big")),
    # what may hand a message out: a message whose TTL ran out is dropped at the head
    # at the command's time, never delivered (rabbit_fifo gives every command its time)
    (Down("c1"), b"\xff" + NOW_BYTES + b"\x08\x00\x02c1"),
    (Cancel("k"), b"\xff" + NOW_BYTES + b"\x03\x00\x01k"),
    (Settle("k", (1, 2)), b"\xff" + NOW_BYTES + b"\x04\x00\x01k" + (2).to_bytes(4, "big")
     + (1).to_bytes(8, "big") + (2).to_bytes(8, "big")),
    (Purge(), b"\x07"),
    (UpdateConfig(-1, None, 5, "reject-publish"),
     commands.encode(UpdateConfig(-1, None, 5, "reject-publish"))),
])
def test_time_dependent_commands_carry_the_leader_time_and_the_others_do_not(command, expected):
    data = encode_command(command, NOW)
    assert data == expected
    stamped = not isinstance(command, (Purge, UpdateConfig))
    assert decode_entry(data) == ((NOW if stamped else None), command)


@pytest.mark.parametrize("command", [
    Checkout("k", 10, -2, "conn"), Cancel("k"), Settle("k", (1,)), Return("k", (1,)),
    Discard("k", (1,)), Down("c"), Dequeue("k", True, "c"), NodeDown(("n",)),
    NodeUp("n", "boot")])
def test_every_command_that_may_hand_a_message_out_is_stamped(command):
    assert decode_entry(encode_command(command, NOW))[0] == NOW


@pytest.mark.parametrize("command", [
    Checkout("k", 10, -2, "conn"), UpdateConfig(-1, None, 5, "reject-publish"),
    Tick(), LeaseGrow("lease", 2**32 - 1, 2**64 - 1, 0),
])
def test_every_command_survives_the_round_trip(command):
    for now in (0, 1, 2**64 - 1):
        stamp, decoded = decode_entry(encode_command(command, now))
        assert decoded == command
        assert stamp in (None, now)


def test_an_enqueue_entry_is_the_message_without_an_envelope():
    data = commands.encode_enqueue("pub", 4, 9, "ex", "rk", b"header", b"body")
    assert data[0] == 1
    assert decode_entry(data) == (None, commands.Enqueue("pub", 4, 4, 9))


def test_a_stamped_enqueue_is_the_enqueue_in_the_time_envelope():
    """What a quorum queue proposes for a publish, built in one piece, is the stamp of
    the plain Enqueue; the command and the message decode from it in place."""
    now = 1_700_000_000_123
    data = stamped_enqueue(now, "pub", 4, 9, "ex", "rk", b"header", b"body")
    assert data == stamp(commands.encode_enqueue("pub", 4, 9, "ex", "rk", b"header", b"body"),
                         now)
    assert decode_entry(data) == (now, commands.Enqueue("pub", 4, 4, 9))
    assert commands.decode_message(data, TIMED_HEAD.size) == ("ex", "rk", b"header", b"body")


def test_message_spans_are_the_decoded_message_as_views_into_the_entry():
    """What a packed lease read cuts its records from (node/leases.py): the same
    exchange, routing key, header and body as decode_message, nothing decoded."""
    data = stamped_enqueue(1, "pub", 4, 9, "ex-\u00e9", "rk", b"header", b"body")
    exchange, routing_key, header_length, content = commands.message_spans(
        data, TIMED_HEAD.size)
    assert all(isinstance(view, memoryview) for view in (exchange, routing_key, content))
    assert (bytes(exchange), bytes(routing_key), header_length, bytes(content)) == (
        "ex-\u00e9".encode(), b"rk", len(b"header"), b"headerbody")


@pytest.mark.parametrize("exchange, routing_key, header, body", [
    ("ex-\u00e9", "rk", b"header", b"body"), ("", "", b"", b""),
    ("x" * 255, "\udcff" + "k" * 254, b"h" * 300, b"b" * 70000),
])
def test_delivery_spans_are_the_message_with_its_names_as_short_strings(
        exchange, routing_key, header, body):
    """What a delivery is written from (queues/quorum/deliveries.py): the exchange and the
    routing key as two AMQP short strings (a length octet, then UTF-8 with
    surrogateescape), the header and the body, as views into the entry."""
    data = stamped_enqueue(1, "pub", 4, 9, exchange, routing_key, header, body)
    names, got_header, got_body = commands.delivery_spans(data, TIMED_HEAD.size)
    assert all(isinstance(view, memoryview) for view in (names, got_header, got_body))
    exchange_bytes = exchange.encode("utf-8", "surrogateescape")
    key_bytes = routing_key.encode("utf-8", "surrogateescape")
    assert bytes(names) == (bytes([len(exchange_bytes)]) + exchange_bytes
                            + bytes([len(key_bytes)]) + key_bytes)
    assert (bytes(got_header), bytes(got_body)) == (header, body)


def test_the_envelope_marker_is_no_command_tag():
    assert TIMED == 0xFF
    with pytest.raises(ValueError, match="unknown fifo command tag 255"):
        commands.decode(bytes([TIMED]) + b"\x00\x00")
    # an envelope around an unknown tag is refused, not skipped (FORMAT.md)
    with pytest.raises(ValueError, match="unknown fifo command tag 99"):
        decode_entry(b"\xff" + NOW_BYTES + b"\x63\x00\x00")


# ------------------------------------------------------------------ BCC keys (tag 21)

VERSION_7_ENQUEUE = (  # an Enqueue as entry data version 7 wrote it, byte for byte
    b"\xff" + NOW_BYTES + b"\x01\x09" + (4).to_bytes(4, "big") + (7).to_bytes(8, "big")
    + b"\x00\x03pub" + b"\x02ex" + b"\x02rk" + (6).to_bytes(4, "big") + b"header" + b"body")


def test_an_enqueue_without_bcc_keys_is_the_version_7_entry_and_decodes_as_ever():
    """Only a message with BCC keys is written as tag 21: every other entry keeps the
    layout (and size) it had, and a log written before tag 21 existed replays as before."""
    assert stamped_enqueue(NOW, "pub", 7, 9, "ex", "rk", b"header", b"body") == VERSION_7_ENQUEUE
    assert decode_entry(VERSION_7_ENQUEUE) == (NOW, commands.Enqueue("pub", 7, 4, 9))
    start = TIMED_HEAD.size
    assert commands.decode_message(VERSION_7_ENQUEUE, start) == ("ex", "rk", b"header", b"body")
    assert commands.blind_keys(VERSION_7_ENQUEUE, start) == ()


@pytest.mark.parametrize("keys", [("bcc",), ("", "k\u00e9", "\udcff", "x" * 70000)])
def test_an_enqueue_with_bcc_keys_keeps_them_after_the_body_where_no_reader_of_it_looks(keys):
    """Tag 21 (FORMAT.md, "Quorum-queue entries"): the tag-1 layout, the body cut at its
    size, then the keys. The machine gets the same Enqueue; the message, its spans and
    delivery spans are those of the tag-1 entry; `blind_keys` reads the keys back."""
    data = stamped_enqueue(NOW, "pub", 7, 9, "ex", "rk", b"header", b"body", keys)
    start = TIMED_HEAD.size
    assert data[start] == commands.BLIND_ENQUEUE == 21
    assert data.startswith(VERSION_7_ENQUEUE[:start] + b"\x15" + VERSION_7_ENQUEUE[start + 1:])
    assert decode_entry(data) == decode_entry(VERSION_7_ENQUEUE)
    assert commands.decode_message(data, start) == ("ex", "rk", b"header", b"body")
    assert commands.blind_keys(data, start) == keys
    spans = commands.message_spans(data, start)
    plain = commands.message_spans(VERSION_7_ENQUEUE, start)
    assert [bytes(s) if isinstance(s, memoryview) else s for s in spans] == \
        [bytes(s) if isinstance(s, memoryview) else s for s in plain]
    assert [bytes(s) for s in commands.delivery_spans(data, start)] == \
        [bytes(s) for s in commands.delivery_spans(VERSION_7_ENQUEUE, start)]
    # the time envelope is optional around it, as around every Enqueue
    bare = commands.encode_enqueue("pub", 7, 9, "ex", "rk", b"header", b"body", blind_keys=keys)
    assert data == stamp(bare, NOW) and commands.blind_keys(bare) == keys
    assert commands.decode(bare) == commands.Enqueue("pub", 7, 4, 9)


def test_an_enqueue_with_bcc_keys_reads_its_ttl_from_its_header_as_tag_1_does():
    from quorumqueue.broker.amqp import codec

    header = codec.encode_properties(4, {"expiration": "1500"})
    data = stamped_enqueue(NOW, "", 0, 0, "", "q", header, b"body", ("k",))
    assert decode_entry(data) == (NOW, commands.Enqueue("", 0, 4, 0, 1500))
