"""A batch publish (docs/behaviour/idempotent-publishing.md, "Batch publish"): one
basic.publish with immediate=true and the batch header carries many keyed messages;
the broker stores each as the same row published alone, with one confirm for the
batch. Bytes are built here with struct, not with the broker's or the connector's
encoders, so the checks do not compare a piece of code with itself."""

import struct

import pytest
from pamqp import commands

from quorumqueue.broker.config import Settings
from tests.broker.node.harness import Client, marshal, method, new_node, raw_frame

PUBLISHER = b"spark-query/3f2a/0"
HEADERS_FLAG, DELIVERY_MODE_FLAG = 1 << 13, 1 << 12


def _entry(key: bytes, kind: bytes, value: bytes) -> bytes:
    return bytes([len(key)]) + key + kind + value


def header(seq: int, body_size: int, batch: bytes | None = None,
           publisher: bytes = PUBLISHER, seq_kind: bytes = b"l") -> bytes:
    """A content header payload as the Spark sink sends it for one row (its two
    idempotency headers, persistent), with the batch entry `batch` after them."""
    seq_value = struct.pack(">q" if seq_kind == b"l" else ">i", seq)
    table = (_entry(b"x-quorumqueue-publisher", b"S", struct.pack(">I", len(publisher))
                    + publisher)
             + _entry(b"x-quorumqueue-seq", seq_kind, seq_value) + (batch or b""))
    return (struct.pack(">HHQH", 60, 0, body_size, HEADERS_FLAG | DELIVERY_MODE_FLAG)
            + struct.pack(">I", len(table)) + table + b"\x02")


def batch_entry(count: int, kind: bytes = b"l") -> bytes:
    return _entry(b"x-quorumqueue-batch", kind,
                  struct.pack({b"l": ">q", b"I": ">i", b"b": ">b"}[kind], count))


def records(*bodies: bytes) -> bytes:
    return b"".join(struct.pack(">I", len(body)) + body for body in bodies)


def publish_raw(client: Client, routing_key: str, payload: bytes, body: bytes,
                exchange: str = "", immediate: bool = True, mandatory: bool = False,
                channel: int = 1) -> None:
    chunk = client.frame_max - 8
    client.send_bytes(
        marshal(method(commands.Basic.Publish, exchange=exchange, routing_key=routing_key,
                       immediate=immediate, mandatory=mandatory), channel)
        + raw_frame(2, channel, payload)
        + b"".join(raw_frame(3, channel, body[at:at + chunk])
                   for at in range(0, len(body), chunk)))


def publish_batch(client: Client, queue: str, first: int, bodies: list[bytes], **kwargs):
    body = records(*bodies)
    publish_raw(client, queue, header(first, len(body), batch_entry(len(bodies))), body,
                **kwargs)


def frames(data: bytes) -> list[tuple[int, bytes]]:
    """(frame type, payload) of every frame in `data`."""
    out, at = [], 0
    while at < len(data):
        kind, _channel, size = struct.unpack_from(">BHI", data, at)
        out.append((kind, data[at + 7:at + 7 + size]))
        at += 8 + size
    return out


def get_raw(client: Client, queue: str) -> tuple[bytes, bytes] | None:
    """basic.get (no-ack): the message's content header payload and body, as sent."""
    client.send(1, method(commands.Basic.Get, queue=queue, no_ack=True))
    got = frames(client.read_raw())
    if got[0][1][:4] == b"\x00\x3c\x00\x48":  # basic.get-empty
        return None
    assert got[0][1][:4] == b"\x00\x3c\x00\x47", got  # basic.get-ok
    return got[1][1], b"".join(payload for kind, payload in got[2:] if kind == 3)


def drain(client: Client, queue: str) -> list[tuple[bytes, bytes]]:
    out = []
    while (message := get_raw(client, queue)) is not None:
        out.append(message)
    return out


def confirms(client: Client) -> list[tuple[str, int]]:
    """(Ack or Nack, delivery tag) of the confirms sent (the broker may set multiple)."""
    return [(type(value).__name__, value.delivery_tag)
            for _channel, value in client.read_methods()
            if type(value).__name__ in ("Ack", "Nack")]


def fresh(queue_arguments: dict | None = None, queue_type: str = "quorum",
          settings: Settings | None = None) -> Client:
    client = Client(new_node(settings))
    client.handshake()
    client.open_channel(1)
    arguments = {"x-queue-type": queue_type, **(queue_arguments or {})}
    client.declare_queue(1, "q", durable=True, arguments=arguments)
    client.call(1, commands.Confirm.Select(), "Confirm.SelectOk")
    return client


@pytest.mark.parametrize("queue_type", ["quorum", "classic"])
def test_each_message_of_a_batch_is_stored_as_the_row_published_alone(queue_type):
    client = fresh(queue_type=queue_type)
    bodies = [b"first row", b"", b"x" * 200_000, b"last"]  # the third spans body frames
    publish_batch(client, "q", 41, bodies)
    assert confirms(client) == [("Ack", 1)]  # one confirm for the batch
    assert drain(client, "q") == [(header(41 + k, len(body)), body)
                                  for k, body in enumerate(bodies)]


def test_the_nodes_message_counters_count_each_message_of_a_batch():
    """What /api/overview's message_stats and the Prometheus rabbitmq_global_messages_*
    counters read: messages, as RabbitMQ counts them, a batch publish's one by one."""
    client = fresh()
    counters = client.node.counters
    publish_batch(client, "q", 1, [b"a", b"b", b"c"])
    publish_batch(client, "nowhere", 4, [b"d", b"e"])
    confirms(client)
    assert (counters.received, counters.received_confirm, counters.routed,
            counters.unroutable_dropped) == (5, 5, 3, 2)


def test_a_batch_takes_one_confirm_number_between_single_publishes():
    client = fresh()
    publish_raw(client, "q", header(1, 3), b"one", immediate=False)
    publish_batch(client, "q", 2, [b"two", b"three"])
    publish_raw(client, "q", header(4, 4), b"four", immediate=False)
    acked = confirms(client)
    assert acked[-1][1] == 3 and all(kind == "Ack" for kind, _tag in acked)
    assert [body for _header, body in drain(client, "q")] == [b"one", b"two", b"three",
                                                              b"four"]


def test_a_batch_sent_again_is_stored_once_and_an_overlap_stores_only_the_new_seqs():
    client = fresh()
    publish_batch(client, "q", 1, [b"a", b"b", b"c"])
    publish_batch(client, "q", 1, [b"a", b"b", b"c"])   # a replayed Spark task
    publish_batch(client, "q", 2, [b"b", b"c", b"d", b"e"])
    assert [kind for kind, _tag in confirms(client)] in (["Ack"], ["Ack"] * 3)
    assert [body for _header, body in drain(client, "q")] == [b"a", b"b", b"c", b"d", b"e"]


def test_reject_publish_acts_per_message_inside_a_batch():
    """x-overflow reject-publish acts on each message (the quorum queues guide,
    "Overflow behaviour"): a batch stores what the same rows published one by one
    store, and its one confirm is a nack if any of them was refused. The first refused
    row opens the publisher's gap (every later seq refused), so the retry from it is
    exact."""
    limits = {"x-max-length": 2, "x-overflow": "reject-publish"}
    rows = [b"a", b"b", b"c", b"d"]
    alone = fresh(limits)
    for seq, row in enumerate(rows, 1):
        publish_raw(alone, "q", header(seq, len(row)), row, immediate=False)
    singly = [kind for kind, _tag in confirms(alone)]
    stored_alone = drain(alone, "q")
    assert "Nack" in singly and 0 < len(stored_alone) < len(rows)

    client = fresh(limits)
    publish_batch(client, "q", 1, rows)
    assert confirms(client) == [("Nack", 1)]
    assert drain(client, "q") == stored_alone
    rest = rows[len(stored_alone):]
    publish_batch(client, "q", len(stored_alone) + 1, rest)  # the retry from the nacked seq
    assert confirms(client) == [("Ack", 2)]
    assert [body for _header, body in drain(client, "q")] == rest


def test_an_unroutable_mandatory_batch_comes_back_once_as_published():
    client = fresh()
    body = records(b"a", b"b")
    payload = header(1, len(body), batch_entry(2))
    publish_raw(client, "nowhere", payload, body, mandatory=True)
    out = frames(client.read_raw())
    assert out[0][1][:4] == b"\x00\x3c\x00\x32"  # basic.return
    assert out[1][1] == payload and out[2][1] == body
    assert out[3][1][:4] == b"\x00\x3c\x00\x50"  # then its basic.ack


def test_immediate_without_the_batch_header_is_still_refused_as_rabbitmq_refuses_it():
    client = fresh()
    publish_raw(client, "q", header(1, 1), b"x")
    close = client.expect_one("Connection.Close")
    assert (close.reply_code, close.reply_text) == (540, "NOT_IMPLEMENTED - immediate=true")


def _closed_with(client: Client) -> str:
    close = client.expect_one("Channel.Close")
    assert close.reply_code == 406, close
    return close.reply_text


@pytest.mark.parametrize("seq, count, body, options, says", [
    (1, 3, records(b"a", b"b"), {}, "fewer than the 3 messages"),
    (1, 2, records(b"a", b"b", b"c"), {}, "more than the 2 messages"),
    (1, 2, records(b"a") + b"\x00\x00\x00\x09b", {},
     "message 2 of a batch publish runs past its body"),
    (1, 0, b"", {}, "'x-quorumqueue-batch' must be at least 1, got 0"),
    (1, 1, records(b"a"), {"seq_kind": b"I"}, "in that order"),
    (0, 1, records(b"a"), {}, "must be from 1 to 2^63-1"),
    ((1 << 63) - 1, 2, records(b"a", b"b"), {}, "2^63-2 for 2 messages"),
    (1, 1, records(b"a"), {"publisher": b""}, "a string of 1 to 255"),
])
def test_a_malformed_batch_closes_the_channel_naming_what_is_wrong(seq, count, body, options,
                                                                   says):
    client = fresh()
    publish_raw(client, "q", header(seq, len(body), batch_entry(count), **options), body)
    text = _closed_with(client)
    assert text.startswith("PRECONDITION_FAILED - ") and says in text, text


def test_a_node_with_a_small_message_limit_takes_a_batch_of_small_messages():
    """max_message_size holds each message of a batch, as it holds a publish of its
    own; the batch as a whole may be larger (up to 4 MiB, or the limit plus one
    record's length prefix): the Spark sink's batches of about 1 MiB reach a node
    configured with max_message_size 64 KiB."""
    client = fresh(settings=Settings(max_message_size=64 * 1024))
    bodies = [b"r%04d" % k + b"x" * 1000 for k in range(1000)]  # ~1 MiB in all
    publish_batch(client, "q", 1, bodies)
    assert confirms(client) == [("Ack", 1)]
    assert [body for _header, body in drain(client, "q")] == bodies


def test_a_batch_holding_a_message_over_the_limit_is_refused_as_that_publish_would_be():
    limit = 64 * 1024
    client = fresh(settings=Settings(max_message_size=limit))
    publish_raw(client, "q", header(1, limit + 1), b"y" * (limit + 1), immediate=False)
    alone = _closed_with(client)
    assert alone == f"PRECONDITION_FAILED - message size {limit + 1} is larger than " \
                    f"configured max size {limit}"
    client = fresh(settings=Settings(max_message_size=limit))
    publish_batch(client, "q", 1, [b"small", b"y" * (limit + 1), b"after"])
    assert _closed_with(client) == alone
    reader = Client(client.node)  # nothing of it was routed
    reader.handshake()
    reader.open_channel(1)
    assert drain(reader, "q") == []


def test_a_batch_of_one_message_of_the_largest_size_is_taken():
    limit = 5 * 1024 * 1024  # above the batch allowance: the prefix must still fit
    client = fresh(settings=Settings(max_message_size=limit))
    publish_batch(client, "q", 1, [b"z" * limit])
    assert confirms(client) == [("Ack", 1)]
    assert [len(body) for _header, body in drain(client, "q")] == [limit]


def test_a_batch_body_over_its_allowance_is_refused_before_it_is_read():
    client = fresh(settings=Settings(max_message_size=64 * 1024))
    size = 4 * 1024 * 1024 + 1
    client.send_bytes(marshal(method(commands.Basic.Publish, exchange="", routing_key="q",
                                     immediate=True), 1)
                      + raw_frame(2, 1, header(1, size, batch_entry(2))))
    assert _closed_with(client) == (f"PRECONDITION_FAILED - message size {size} is larger "
                                    f"than configured max size {4 * 1024 * 1024}")


def test_a_batch_of_other_headers_is_refused():
    client = fresh()
    table_extra = _entry(b"other", b"S", b"\x00\x00\x00\x01z")
    body = records(b"a")
    publish_raw(client, "q", header(1, len(body), table_extra + batch_entry(1)), body)
    assert "in that order" in _closed_with(client)


def test_batch_publishes_in_a_transaction_are_stored_at_commit():
    client = Client(new_node())
    client.handshake()
    client.open_channel(1)
    client.declare_queue(1, "q", durable=True, arguments={"x-queue-type": "quorum"})
    client.call(1, commands.Tx.Select(), "Tx.SelectOk")
    publish_batch(client, "q", 1, [b"a", b"b"])
    assert drain(client, "q") == []
    client.call(1, commands.Tx.Commit(), "Tx.CommitOk")
    assert [body for _header, body in drain(client, "q")] == [b"a", b"b"]
