"""Exchanges and routing through pika's BlockingConnection, as in RabbitMQ: declaring
each type, the reserved and protected names, equivalence on redeclare, if-unused
deletes, exchange-to-exchange bindings, alternate and internal exchanges, and the
direct, fanout, topic and headers routing rules.
"""

from __future__ import annotations

import pika
import pytest

from .pika_support import channel_error, get_bodies, unique

pytestmark = pytest.mark.timeout(60)


# ---------------------------------------------------------------- exchanges


@pytest.mark.parametrize("exchange_type", ["direct", "fanout", "topic", "headers"])
def test_exchange_declare_each_type_and_passive(channel, exchange_type):
    """exchange.declare of every standard type; a passive declare of it succeeds."""
    name = unique(f"ex-{exchange_type}")
    channel.exchange_declare(name, exchange_type)
    channel.exchange_declare(name, exchange_type, passive=True)
    channel.exchange_delete(name)


def test_exchange_passive_declare_of_missing_exchange_is_404(channel):
    """exchange.declare passive=true of an unknown exchange: channel closed 404."""
    name = unique("missing")
    error = channel_error(lambda: channel.exchange_declare(name, passive=True))
    assert error.reply_code == 404
    assert error.reply_text == f"NOT_FOUND - no exchange '{name}' in vhost '/'"


def test_exchange_redeclare_with_another_type_is_406(connection):
    """exchange.declare: redeclaring with different properties is 406 PRECONDITION_FAILED."""
    name = unique("ex")
    channel = connection.channel()
    channel.exchange_declare(name, "direct")
    error = channel_error(lambda: channel.exchange_declare(name, "fanout"))
    assert error.reply_code == 406
    assert error.reply_text == (f"PRECONDITION_FAILED - inequivalent arg 'type' for exchange "
                                f"'{name}' in vhost '/': received 'fanout' but current is "
                                "'direct'")
    connection.channel().exchange_delete(name)


def test_exchange_redeclare_compares_only_alternate_exchange(connection):
    """exchange.declare: of the arguments RabbitMQ compares only alternate-exchange."""
    channel = connection.channel()
    name = unique("ex-args")
    channel.exchange_declare(name, "direct", arguments={"alternate-exchange": "ae1", "x-a": 1})
    channel.exchange_declare(name, "direct", arguments={"alternate-exchange": "ae1", "x-a": 2})
    error = channel_error(lambda: channel.exchange_declare(
        name, "direct", arguments={"alternate-exchange": "ae2"}))
    assert error.reply_code == 406
    assert error.reply_text == (
        f"PRECONDITION_FAILED - inequivalent arg 'alternate-exchange' for exchange '{name}' in "
        "vhost '/': received 'ae2' but current is 'ae1'")
    connection.channel().exchange_delete(name)


def test_exchange_amq_prefix_is_reserved_403(channel):
    """exchange.declare: names starting with 'amq.' are reserved, 403 ACCESS_REFUSED."""
    error = channel_error(lambda: channel.exchange_declare("amq.custom-thing", "direct"))
    assert error.reply_code == 403
    assert error.reply_text == ("ACCESS_REFUSED - exchange name 'amq.custom-thing' contains "
                                "reserved prefix 'amq.*'")


def test_default_and_system_exchanges_are_protected_403(connection):
    """RabbitMQ: the default exchange cannot be declared, bound or deleted, and amq.*
    system exchanges cannot be deleted (403); redeclaring amq.direct as it is works."""
    channel = connection.channel()
    channel.exchange_declare("amq.direct", "direct", durable=True)
    queue = channel.queue_declare("", exclusive=True).method.queue
    for action in (lambda ch: ch.exchange_declare("", "direct"),
                   lambda ch: ch.queue_bind(queue, ""),
                   lambda ch: ch.exchange_delete("")):
        channel = connection.channel()
        error = channel_error(lambda: action(channel))
        assert (error.reply_code, error.reply_text) == (
            403, "ACCESS_REFUSED - operation not permitted on the default exchange")
    channel = connection.channel()
    error = channel_error(lambda: channel.exchange_delete("amq.direct"))
    assert (error.reply_code, error.reply_text) == (
        403, "ACCESS_REFUSED - deletion of system exchange 'amq.direct' in vhost '/' not allowed")


def test_exchange_delete_if_unused_refuses_bound_exchange_406(connection):
    """exchange.delete if-unused=true on an exchange with bindings from it: 406. Only
    bindings whose source it is count (RabbitMQ has_for_source): an exchange that is
    merely the destination of an exchange-to-exchange binding is unused."""
    channel = connection.channel()
    name = unique("ex")
    channel.exchange_declare(name, "fanout")
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_bind(queue, name)
    error = channel_error(lambda: channel.exchange_delete(name, if_unused=True))
    assert error.reply_code == 406
    assert error.reply_text == f"PRECONDITION_FAILED - exchange '{name}' in vhost '/' in use"
    channel = connection.channel()
    channel.queue_unbind(queue, name)
    upstream = unique("upstream")
    channel.exchange_declare(upstream, "fanout")
    channel.exchange_bind(name, upstream)
    channel.exchange_delete(name, if_unused=True)
    error = channel_error(lambda: channel.exchange_declare(name, passive=True))
    assert error.reply_code == 404
    channel = connection.channel()
    channel.exchange_delete(upstream, if_unused=True)   # its binding went with `name`


def test_exchange_to_exchange_binding_routes_through(channel):
    """exchange.bind (RabbitMQ extension): messages flow source -> destination -> queue,
    and stop after exchange.unbind."""
    source, destination = unique("e2e-src"), unique("e2e-dst")
    channel.exchange_declare(source, "topic", auto_delete=False)
    channel.exchange_declare(destination, "direct")
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_bind(queue, destination, "orders.new")
    channel.exchange_bind(destination, source, "orders.*")
    channel.basic_publish(source, "orders.new", b"via-e2e")
    channel.basic_publish(source, "orders.old", b"bound-but-no-queue-key")
    channel.basic_publish(source, "payments.new", b"unbound")
    assert get_bodies(channel, queue) == [b"via-e2e"]
    channel.exchange_unbind(destination, source, "orders.*")
    channel.basic_publish(source, "orders.new", b"after-unbind")
    assert get_bodies(channel, queue) == []
    channel.exchange_delete(source)
    channel.exchange_delete(destination)


def test_alternate_exchange_receives_unroutable_messages(channel):
    """RabbitMQ alternate-exchange argument: what the exchange cannot route goes to
    its alternate; what it can route does not."""
    main, alternate = unique("ae-main"), unique("ae-alt")
    channel.exchange_declare(alternate, "fanout")
    channel.exchange_declare(main, "direct", arguments={"alternate-exchange": alternate})
    routed = channel.queue_declare("", exclusive=True).method.queue
    unrouted = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_bind(routed, main, "known")
    channel.queue_bind(unrouted, alternate)
    channel.basic_publish(main, "known", b"routed")
    channel.basic_publish(main, "unknown", b"to-alternate")
    assert get_bodies(channel, routed) == [b"routed"]
    assert get_bodies(channel, unrouted) == [b"to-alternate"]
    channel.exchange_delete(main)
    channel.exchange_delete(alternate)


def test_publish_to_internal_exchange_is_403_but_it_routes_from_other_exchanges(connection):
    """exchange.declare internal=true (RabbitMQ): clients may not publish to it (403),
    but an exchange-to-exchange binding delivers through it."""
    channel = connection.channel()
    internal, front = unique("internal"), unique("front")
    channel.exchange_declare(internal, "fanout", internal=True)
    channel.exchange_declare(front, "fanout")
    channel.exchange_bind(internal, front)
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_bind(queue, internal)
    channel.basic_publish(front, "", b"through-internal")
    assert get_bodies(channel, queue) == [b"through-internal"]
    channel.basic_publish(internal, "", b"direct-to-internal")
    error = channel_error(lambda: channel.basic_get(queue))
    assert error.reply_code == 403
    assert error.reply_text == (f"ACCESS_REFUSED - cannot publish to internal exchange "
                                f"'{internal}' in vhost '/'")
    cleanup = connection.channel()
    cleanup.exchange_delete(front)
    cleanup.exchange_delete(internal)


def test_unbind_and_delete_of_missing_things_succeed(channel):
    """RabbitMQ makes queue.unbind, exchange.unbind, exchange.delete and queue.delete
    idempotent: a missing binding, queue or exchange still gets the -ok reply."""
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_unbind(queue, "amq.direct", "never-bound")
    channel.queue_unbind(unique("no-queue"), "amq.direct", "k")
    channel.queue_unbind(queue, unique("no-exchange"), "k")
    channel.exchange_unbind(unique("no-exchange"), "amq.direct", "k")
    channel.exchange_delete(unique("no-exchange"))
    assert channel.queue_delete(unique("no-queue")).method.message_count == 0


def test_bind_to_missing_queue_or_exchange_is_404(connection):
    """queue.bind / exchange.bind naming a missing queue or exchange: 404 NOT_FOUND."""
    queue = connection.channel().queue_declare("", exclusive=True).method.queue
    missing_queue, missing_exchange = unique("no-queue"), unique("no-exchange")
    cases = [(lambda ch: ch.queue_bind(missing_queue, "amq.direct"),
              f"NOT_FOUND - no queue '{missing_queue}' in vhost '/'"),
             (lambda ch: ch.queue_bind(queue, missing_exchange),
              f"NOT_FOUND - no exchange '{missing_exchange}' in vhost '/'"),
             (lambda ch: ch.exchange_bind(missing_exchange, "amq.direct"),
              f"NOT_FOUND - no exchange '{missing_exchange}' in vhost '/'")]
    for action, text in cases:
        channel = connection.channel()
        error = channel_error(lambda: action(channel))
        assert (error.reply_code, error.reply_text) == (404, text)


def test_publish_to_missing_exchange_is_404(channel):
    """basic.publish to an exchange that does not exist: channel closed 404."""
    missing = unique("no-exchange")
    channel.basic_publish(missing, "k", b"lost")
    error = channel_error(lambda: channel.queue_declare("", exclusive=True))
    assert (error.reply_code, error.reply_text) == (
        404, f"NOT_FOUND - no exchange '{missing}' in vhost '/'")


# ---------------------------------------------------------------- routing


def test_direct_routing_by_exact_key(channel):
    """Direct exchange: a message goes to queues bound with exactly its routing key."""
    exchange = unique("direct")
    channel.exchange_declare(exchange, "direct")
    black = channel.queue_declare("", exclusive=True).method.queue
    white = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_bind(black, exchange, "black")
    channel.queue_bind(white, exchange, "white")
    channel.queue_bind(white, exchange, "grey")
    for key in ("black", "white", "grey", "green"):
        channel.basic_publish(exchange, key, key.encode())
    assert get_bodies(channel, black) == [b"black"]
    assert get_bodies(channel, white) == [b"white", b"grey"]
    channel.exchange_delete(exchange)


def test_default_exchange_routes_by_queue_name(channel):
    """The default exchange: every queue is bound with its own name."""
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.basic_publish("", queue, b"by-name")
    assert get_bodies(channel, queue) == [b"by-name"]


def test_fanout_routing_ignores_the_key(channel):
    """Fanout exchange: every bound queue receives a copy, whatever the key."""
    exchange = unique("fanout")
    channel.exchange_declare(exchange, "fanout")
    queues = [channel.queue_declare("", exclusive=True).method.queue for _ in range(3)]
    for queue in queues:
        channel.queue_bind(queue, exchange, "ignored")
    channel.basic_publish(exchange, "anything", b"copy")
    assert [get_bodies(channel, queue) for queue in queues] == [[b"copy"]] * 3
    channel.exchange_delete(exchange)


TOPIC_BINDINGS = {"stars": "*.orange.*", "rabbit": "*.*.rabbit", "lazy": "lazy.#",
                  "all": "#", "exact": "quick.brown.fox", "hash_middle": "a.#.z"}


TOPIC_CASES = [
    ("quick.orange.rabbit", {"stars", "rabbit", "all"}),
    ("lazy.orange.elephant", {"stars", "lazy", "all"}),
    ("quick.orange.fox", {"stars", "all"}),
    ("lazy.brown.fox", {"lazy", "all"}),
    ("lazy", {"lazy", "all"}),
    ("lazy.pink.rabbit", {"rabbit", "lazy", "all"}),
    ("quick.brown.fox", {"exact", "all"}),
    ("quick.orange.male.rabbit", {"all"}),
    ("orange", {"all"}),
    ("", {"all"}),
    ("a.z", {"hash_middle", "all"}),
    ("a.b.c.z", {"hash_middle", "all"}),
]


def test_topic_routing_with_star_and_hash(channel):
    """Topic exchange: '*' matches exactly one word, '#' zero or more (RabbitMQ tutorial
    five's table, plus '#' alone, '#' in the middle and the empty key)."""
    exchange = unique("topic")
    channel.exchange_declare(exchange, "topic")
    queues = {}
    for label, pattern in TOPIC_BINDINGS.items():
        queues[label] = channel.queue_declare("", exclusive=True).method.queue
        channel.queue_bind(queues[label], exchange, pattern)
    for key, expected in TOPIC_CASES:
        channel.basic_publish(exchange, key, key.encode())
        reached = {label for label, queue in queues.items() if get_bodies(channel, queue)}
        assert reached == expected, key
    channel.exchange_delete(exchange)


def test_headers_routing_all_and_any(channel):
    """Headers exchange: x-match=all needs every bound header, x-match=any one of them;
    x- headers in the binding are not compared."""
    exchange = unique("headers")
    channel.exchange_declare(exchange, "headers")
    all_queue = channel.queue_declare("", exclusive=True).method.queue
    any_queue = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_bind(all_queue, exchange,
                       arguments={"x-match": "all", "format": "pdf", "type": "report"})
    channel.queue_bind(any_queue, exchange,
                       arguments={"x-match": "any", "format": "pdf", "type": "log"})
    cases = [
        ({"format": "pdf", "type": "report"}, (True, True)),
        ({"format": "pdf", "type": "report", "extra": 1}, (True, True)),
        ({"format": "pdf"}, (False, True)),
        ({"type": "log"}, (False, True)),
        ({"format": "zip", "type": "report"}, (False, False)),
        (None, (False, False)),
    ]
    for headers, expected in cases:
        channel.basic_publish(exchange, "", b"h", pika.BasicProperties(headers=headers))
        reached = (bool(get_bodies(channel, all_queue)), bool(get_bodies(channel, any_queue)))
        assert reached == expected, headers
    channel.exchange_delete(exchange)
