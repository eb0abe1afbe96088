"""Idempotent publishing into quorum queues, through pika (docs/behaviour/idempotent-publishing.md).

A publish carrying `x-quorumqueue-publisher` (string) and `x-quorumqueue-seq` (integer)
is stored in a quorum queue at most once per (publisher, seq): a seq at or below the
last one the queue stored for that publisher is a duplicate, confirmed with basic.ack
and not enqueued. This is what lets the Spark sink replay a batch without adding its
messages twice. Plain publishes, classic queues and other brokers are unaffected.
"""

from __future__ import annotations

import pika
import pytest
from pika import exceptions as pe

from tests.support.broker import BrokerProcess

from .pika_support import channel_error, connect, get_bodies, unique

pytestmark = pytest.mark.timeout(60)

PUBLISHER = "x-quorumqueue-publisher"
SEQ = "x-quorumqueue-seq"


def keyed(publisher: str, seq: int, **headers) -> pika.BasicProperties:
    return pika.BasicProperties(delivery_mode=2,
                                headers={PUBLISHER: publisher, SEQ: seq, **headers})


def declare(channel, queue_type: str = "quorum", **arguments) -> str:
    name = unique(f"idem-{queue_type}")
    channel.queue_declare(name, durable=True,
                          arguments={"x-queue-type": queue_type, **arguments})
    return name


def ready(channel, queue: str) -> int:
    return channel.queue_declare(queue, passive=True).method.message_count


@pytest.fixture
def confirmed(connection):
    channel = connection.channel()
    channel.confirm_delivery()  # basic_publish raises NackError on a nack
    return channel


def test_a_duplicate_is_confirmed_and_not_enqueued_twice(confirmed):
    queue = declare(confirmed)
    for seq, body in ((1, b"a"), (2, b"b"), (1, b"a again"), (2, b"b again"), (3, b"c")):
        confirmed.basic_publish("", queue, body, keyed("job-1", seq))  # acked, or it raises
    assert ready(confirmed, queue) == 3
    assert get_bodies(confirmed, queue) == [b"a", b"b", b"c"]


def test_a_seq_below_the_last_stored_one_is_a_duplicate_too(confirmed):
    queue = declare(confirmed)
    confirmed.basic_publish("", queue, b"ten", keyed("job", 10))
    confirmed.basic_publish("", queue, b"five", keyed("job", 5))
    confirmed.basic_publish("", queue, b"eleven", keyed("job", 11))
    assert get_bodies(confirmed, queue) == [b"ten", b"eleven"]


def test_publishers_and_queues_keep_separate_sequences(confirmed):
    first, second = declare(confirmed), declare(confirmed)
    exchange = unique("idem-fanout")
    confirmed.exchange_declare(exchange, "fanout")
    for queue in (first, second):
        confirmed.queue_bind(queue, exchange)
    confirmed.basic_publish(exchange, "", b"both", keyed("p", 1))
    confirmed.basic_publish(exchange, "", b"both again", keyed("p", 1))
    confirmed.basic_publish("", first, b"other publisher", keyed("q", 1))
    confirmed.basic_publish("", second, b"plain")                      # no key: always stored
    confirmed.basic_publish("", second, b"plain", pika.BasicProperties(headers={"a": 1}))
    assert get_bodies(confirmed, first) == [b"both", b"other publisher"]
    assert get_bodies(confirmed, second) == [b"both", b"plain", b"plain"]


def test_the_message_keeps_its_headers_for_consumers(confirmed):
    queue = declare(confirmed)
    properties = pika.BasicProperties(content_type="text/plain", content_encoding="utf-8",
                                      headers={"tenant": "acme", PUBLISHER: "job", SEQ: 7})
    for _ in range(2):  # the properties before `headers` do not hide the key
        confirmed.basic_publish("", queue, b"x", properties)
    _method, received, body = confirmed.basic_get(queue, auto_ack=True)
    assert (body, received.content_type, received.content_encoding) == (
        b"x", "text/plain", "utf-8")
    assert received.headers == {PUBLISHER: "job", SEQ: 7, "tenant": "acme"}
    assert ready(confirmed, queue) == 0


def test_classic_queues_ignore_the_headers(confirmed):
    queue = declare(confirmed, "classic")
    for _ in range(2):
        confirmed.basic_publish("", queue, b"x", keyed("job", 1))
    assert ready(confirmed, queue) == 2


def test_a_rejected_publish_is_not_remembered_so_a_resend_is_stored(confirmed):
    # reject-publish lets the crossing message in, then nacks until there is room again
    queue = declare(confirmed, **{"x-max-length": 1, "x-overflow": "reject-publish"})
    confirmed.basic_publish("", queue, b"1", keyed("job", 1))
    confirmed.basic_publish("", queue, b"2", keyed("job", 2))
    with pytest.raises(pe.NackError):
        confirmed.basic_publish("", queue, b"3", keyed("job", 3))
    assert get_bodies(confirmed, queue) == [b"1", b"2"]
    confirmed.basic_publish("", queue, b"3", keyed("job", 3))
    confirmed.basic_publish("", queue, b"2", keyed("job", 2))         # still a duplicate
    assert get_bodies(confirmed, queue) == [b"3"]


@pytest.mark.parametrize("headers, wrong", [
    ({SEQ: 1}, PUBLISHER),
    ({PUBLISHER: "job"}, SEQ),
    ({PUBLISHER: "job", SEQ: "1"}, SEQ),
    ({PUBLISHER: "job", SEQ: 0}, SEQ),
    ({PUBLISHER: "", SEQ: 1}, PUBLISHER),
    ({PUBLISHER: 5, SEQ: 1}, PUBLISHER),
], ids=["no-publisher", "no-seq", "seq-string", "seq-zero", "empty-publisher",
        "publisher-number"])
def test_a_malformed_key_closes_the_channel_with_precondition_failed(connection, headers,
                                                                     wrong):
    channel = connection.channel()
    queue = declare(channel)
    channel.confirm_delivery()
    error = channel_error(lambda: channel.basic_publish(
        "", queue, b"x", pika.BasicProperties(headers=headers)))
    assert error.reply_code == 406
    assert error.reply_text.startswith(f"PRECONDITION_FAILED - header '{wrong}'")
    assert ready(connection.channel(), queue) == 0


def test_the_sequences_survive_a_restart(fresh_broker: BrokerProcess):
    connection = connect(fresh_broker)
    channel = connection.channel()
    channel.confirm_delivery()
    queue = declare(channel)
    for seq in (1, 2, 3):
        channel.basic_publish("", queue, b"%d" % seq, keyed("job", seq))
    connection.close()
    fresh_broker.restart()
    connection = connect(fresh_broker)
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        for seq in (1, 2, 3, 4):
            channel.basic_publish("", queue, b"%d" % seq, keyed("job", seq))
        assert get_bodies(channel, queue) == [b"1", b"2", b"3", b"4"]
    finally:
        connection.close()
