"""Sender-selected distribution against RabbitMQ 3.10.8: the CC and BCC headers
(arrays of routing keys) of a published message route it by each of their keys
besides its routing key (the sender-selected distribution extension, rabbit_basic's
header_routes): on direct, topic and default exchanges and through exchange-to-
exchange bindings, once per queue however many keys select it; entries that are not
strings are ignored ("" is a key like any other); BCC is removed before delivery;
a CC or BCC that is not an array is 406 PRECONDITION_FAILED - invalid message:
{unacceptable_type_in_header,"CC",longstr}. Lower-case cc and bcc mean nothing.

Dead lettering (rabbit_dead_letter): a dead-lettered copy keeps CC and is routed by
the message's routing key and CC keys, which x-death's routing-keys lists; a queue's
x-dead-letter-routing-key replaces them all and removes CC from the copy.

The same raw-frame client (tests/differential/probe.py) runs each scenario on both
brokers and the transcripts are compared, as in test_against_rabbitmq.py. Headers
only 4.x writes (x-last-death-*) and 3.10.8's x-delivery-count: 0 on a quorum
queue's first delivery are left out, as in test_dead_letter_against_rabbitmq.py.
"""

from __future__ import annotations

import time

from pamqp import commands as amqp

from tests.differential.probe import Probe

Properties = amqp.Basic.Properties
QUEUES = ("ssd-1", "ssd-2", "ssd-3", "ssd-empty", "ssd-t1", "ssd-t2", "ssd-f")
CASES = [  # (exchange, routing key, headers)
    ("ssd-d", "k1", {"CC": ["k2"], "BCC": ["k3"]}),
    ("ssd-d", "k1", {"CC": ["k1", "k2", "k2"], "BCC": ["k2", "k1"]}),
    ("ssd-d", "none", {"CC": ["", 5, None, "k3", ["k2"]]}),
    ("ssd-d", "none", {"CC": "k2"}),
    ("ssd-d", "none", {"BCC": "k3"}),
    ("ssd-d", "none", {"CC": 5}),
    ("ssd-d", "none", {"CC": None}),
    ("ssd-d", "none", {"cc": ["k2"], "bcc": ["k3"]}),
    ("ssd-d", "none", {"BCC": [bytearray(b"k2")]}),
    ("ssd-t", "x", {"CC": ["a.b", "b.c.d", "a.z"]}),
    ("ssd-d", "k1", {"CC": ["to-topic", "a.q"], "BCC": ["b.x"]}),
    ("ssd-f", "z", {"CC": ["k1"], "BCC": ["k2"]}),
    ("", "nothing", {"CC": ["ssd-1"], "BCC": ["ssd-2"]}),
    ("ssd-d", "k1", {"BCC": []}),
    ("ssd-d", "k1", {"CC": [], "other": 1.5}),
]

UNROUTABLE = {7, 8}  # returned (mandatory): no key of theirs is bound


def drain(c: Probe, queues, channel: int = 1) -> None:
    for queue in queues:
        for _ in range(20):
            if c.call(channel, amqp.Basic.Get(queue=queue, no_ack=True))["method"] != \
                    "Basic.GetOk":
                break


def sender_selected_routing(c: Probe) -> None:
    c.call(1, amqp.Channel.Open())
    c.call(1, amqp.Exchange.Declare(exchange="ssd-d", exchange_type="direct"))
    c.call(1, amqp.Exchange.Declare(exchange="ssd-t", exchange_type="topic"))
    c.call(1, amqp.Exchange.Declare(exchange="ssd-f", exchange_type="fanout"))
    for queue in QUEUES:
        c.call(1, amqp.Queue.Declare(queue=queue))
    for queue, exchange, key in (("ssd-1", "ssd-d", "k1"), ("ssd-2", "ssd-d", "k2"),
                                 ("ssd-3", "ssd-d", "k3"), ("ssd-empty", "ssd-d", ""),
                                 ("ssd-t1", "ssd-t", "a.*"), ("ssd-t2", "ssd-t", "b.#"),
                                 ("ssd-f", "ssd-f", "")):
        c.call(1, amqp.Queue.Bind(queue=queue, exchange=exchange, routing_key=key))
    c.call(1, amqp.Exchange.Bind(destination="ssd-t", source="ssd-d", routing_key="to-topic"))
    c.call(2, amqp.Channel.Open())
    c.call(2, amqp.Confirm.Select())
    for number, (exchange, key, headers) in enumerate(CASES):
        if isinstance(headers.get("CC", []), list) and isinstance(headers.get("BCC", []), list):
            c.publish(2, exchange, key, f"m{number}", mandatory=True,
                      properties=Properties(headers=headers))
            c.barrier(2)
            c.collect(2 if number in UNROUTABLE else 1)  # its return, its confirm
        else:  # refused: the channel is closed
            c.call(10 + number, amqp.Channel.Open())
            c.publish(10 + number, exchange, key, f"m{number}", mandatory=True,
                      properties=Properties(headers=headers))
            c.barrier(10 + number)
    drain(c, QUEUES)


DEAD_LETTER_TARGETS = ("ssd-dl-1", "ssd-dl-2", "ssd-dl-3")


def sender_selected_dead_lettering(c: Probe) -> None:
    c.call(1, amqp.Channel.Open())
    c.call(1, amqp.Exchange.Declare(exchange="ssd-dlx", exchange_type="direct"))
    for number, queue in enumerate(DEAD_LETTER_TARGETS, start=1):
        c.call(1, amqp.Queue.Declare(queue=queue))
        c.call(1, amqp.Queue.Bind(queue=queue, exchange="ssd-dlx", routing_key=f"k{number}"))
    c.call(2, amqp.Channel.Open())
    c.call(2, amqp.Confirm.Select())
    for queue_type in ("classic", "quorum"):
        for source, extra in ((f"ssd-dl-src-{queue_type}", {}),
                              (f"ssd-dl-key-{queue_type}", {"x-dead-letter-routing-key": "k3"})):
            c.call(1, amqp.Queue.Declare(queue=source, durable=True, arguments={
                "x-queue-type": queue_type, "x-dead-letter-exchange": "ssd-dlx", **extra}))
            c.publish(2, "", source, f"from {source}", properties=Properties(
                headers={"CC": ["k1", "k2"], "keep": "me"}))
            c.collect(1)
            got = c.call(1, amqp.Basic.Get(queue=source))
            c.send(1, amqp.Basic.Reject(delivery_tag=got["delivery_tag"], requeue=False))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # until the last copy arrived (dead lettering is async)
        answer = c.call(1, amqp.Queue.Declare(queue="ssd-dl-3", passive=True), record=False)
        if answer.get("message_count") == 2:
            break
        time.sleep(0.05)
    drain(c, DEAD_LETTER_TARGETS)


def _comparable(transcript: list) -> list:
    """Left out: headers only one of the two versions writes, and x-death's time."""
    for entry in transcript:
        headers = entry.get("reply", {}).get("properties", {}).get("headers")
        if not headers:
            continue
        for name in ("x-delivery-count", "x-last-death-reason", "x-last-death-queue",
                     "x-last-death-exchange"):
            headers.pop(name, None)
        for death in headers.get("x-death", []):
            death["time"] = "<a time>"
    return transcript


def observe(uri: str, scenario) -> list:
    with Probe.open(uri) as c:
        scenario(c)
        return _comparable(c.transcript)


def test_cc_and_bcc_route_as_in_rabbitmq(rabbitmq, broker) -> None:
    expected = observe(rabbitmq.uri, sender_selected_routing)
    assert observe(broker.uri, sender_selected_routing) == expected
    bodies = [entry["reply"]["body"] for entry in expected
              if entry.get("reply", {}).get("method") == "Basic.GetOk"]
    assert bodies.count("m1") == 2  # ssd-1 and ssd-2 once each, however many keys


def test_dead_lettered_cc_messages_as_in_rabbitmq(rabbitmq, broker) -> None:
    expected = observe(rabbitmq.uri, sender_selected_dead_lettering)
    assert observe(broker.uri, sender_selected_dead_lettering) == expected
