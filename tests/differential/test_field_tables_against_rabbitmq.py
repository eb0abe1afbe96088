"""Every AMQP field-table type, wherever RabbitMQ 3.10.8 takes a table: exchange and
queue declare arguments, binding arguments (queue and exchange bindings), message
headers, and definitions export and import (AMQP 0-9-1 §4.2.5.5 and RabbitMQ's
errata: byte array 'x', decimal 'D', timestamp 'T', nested table 'F', array 'A',
void 'V', with the strings, integers, floats and booleans).

`test_every_field_type_as_rabbitmq_takes_it` runs the same client code against
both brokers: one table holding every type, declared twice (equivalent), bound,
published as headers and fetched back; then each broker's definitions export of
those objects. `RABBITMQ_JSON` below is how RabbitMQ writes a field value into
definitions JSON, and the test checks it against RabbitMQ's own export, so the
Hypothesis property (`test_random_tables_survive_declare_bind_publish_export_import`,
quorumqueue alone: random tables through declare, bind, publish, export, import
and export again) compares with RabbitMQ's rule, not with quorumqueue's code.

One deliberate difference (docs/behaviour/differences.md): RabbitMQ 3.10.8 writes
a decimal as "scale.value" (3.14, scale 2 and value 314, as 2.314); quorumqueue
writes its number (3.14).
"""

from __future__ import annotations

import base64
import datetime
import decimal
import itertools
import json
import urllib.request

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands as amqp

from tests.differential.probe import AMQPTimestamp, Probe, normalize
from tests.differential.test_definitions_against_rabbitmq import rabbitmqctl

UTC = datetime.timezone.utc
# every call here expects its answer: wait for it generously (the probe's default 2 s
# is for "nothing more comes"; a declare waits for an fsync, slow on a busy CI disk)
ANSWER_TIMEOUT = 30.0

EVERY_TYPE = {
    "longstr": "text é",
    "bytes-utf8": bytearray(b"plain"),
    "bytes": bytearray(b"\x00\xff\x80ab"),
    "decimal": decimal.Decimal("3.14"),
    "timestamp": AMQPTimestamp(int(datetime.datetime(2020, 1, 2, 3, 4, 5,
                                                     tzinfo=UTC).timestamp())),
    "table": {"inner": [1, "x", {"deep": True}], "empty": {}},
    "array": [bytearray(b"z"), None, [], 2 ** 40, -7],
    "void": None,
    "float": 1.5,
    "bool": False,
    "int": 7,
    "long": -(2 ** 40),
}


def rabbitmq_json(value):
    """A field value as RabbitMQ 3.10.8's rabbit_mgmt_format writes it into JSON
    (checked against RabbitMQ itself by the first test), decimals excepted."""
    if isinstance(value, bytearray):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return "Not UTF-8, base64 is: " + base64.b64encode(value).decode()
    if value is None:
        return "undefined"
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, dict):
        return {key: rabbitmq_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [rabbitmq_json(item) for item in value]
    return value


def declare_bind_publish(c: Probe, prefix: str, table: dict) -> None:
    """The table everywhere a client may put one; the message comes back by get."""
    c.call(1, amqp.Exchange.Declare(exchange=f"{prefix}-x", exchange_type="direct",
                                    arguments=table))
    c.call(1, amqp.Exchange.Declare(exchange=f"{prefix}-x", exchange_type="direct",
                                    arguments=table))
    c.call(1, amqp.Exchange.Declare(exchange=f"{prefix}-x2", exchange_type="fanout"))
    c.call(1, amqp.Queue.Declare(queue=f"{prefix}-q", arguments=table))
    c.call(1, amqp.Queue.Declare(queue=f"{prefix}-q", arguments=table))
    c.call(1, amqp.Queue.Bind(queue=f"{prefix}-q", exchange=f"{prefix}-x", routing_key="k",
                              arguments=table))
    c.call(1, amqp.Queue.Bind(queue=f"{prefix}-q", exchange=f"{prefix}-x", routing_key="k",
                              arguments=table))
    c.call(1, amqp.Exchange.Bind(destination=f"{prefix}-x2", source=f"{prefix}-x",
                                 routing_key="k", arguments=table))
    c.publish(1, f"{prefix}-x", "k", "body", properties=amqp.Basic.Properties(headers=table))
    c.call(1, amqp.Basic.Get(queue=f"{prefix}-q", no_ack=True))


def exported(document: dict, prefix: str) -> dict:
    """The arguments of the prefix's objects in a definitions document."""
    found = {}
    for item in document["exchanges"]:
        if item["name"].startswith(prefix):
            found[f"exchange {item['name']}"] = item["arguments"]
    for item in document["queues"]:
        if item["name"].startswith(prefix):
            found[f"queue {item['name']}"] = item["arguments"]
    for item in document["bindings"]:
        if item["source"].startswith(prefix):
            found[f"binding {item['source']} -> {item['destination']}"] = item["arguments"]
    return found


def http(broker, method: str, path: str, body: dict | None = None):
    request = urllib.request.Request(
        broker.management_url + path, method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode(),
                 "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        data = answer.read()
    return json.loads(data) if data else None


def test_every_field_type_as_rabbitmq_takes_it(rabbitmq, broker) -> None:
    transcripts = []
    for uri in (rabbitmq.uri, broker.uri):
        with Probe.open(uri, timeout=ANSWER_TIMEOUT) as c:
            c.call(1, amqp.Channel.Open())
            declare_bind_publish(c, "ft-every", EVERY_TYPE)
            transcripts.append(c.transcript)
    theirs, ours = transcripts
    assert ours == theirs
    assert theirs[-1]["reply"]["method"] == "Basic.GetOk"

    their_export = exported(json.loads(rabbitmqctl(rabbitmq, "export_definitions", "-")),
                            "ft-every")
    our_export = exported(http(broker, "GET", "/api/definitions"), "ft-every")
    assert len(their_export) == 5  # two exchanges (x2 with none), a queue, two bindings
    for arguments in their_export.values():
        if arguments:
            assert arguments.pop("decimal") == 2.314  # the deliberate difference
            arguments["decimal"] = 3.14
    assert our_export == their_export
    assert their_export["queue ft-every-q"] == rabbitmq_json(EVERY_TYPE)


# ------------------------------------------------------------------ the property

KEYS = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=8)
# values pamqp puts on the wire as they are: floats exact in single precision ('f'),
# timestamps of any 64-bit count of seconds, integers of 32 and 64 bits
SCALARS = st.one_of(
    st.booleans(),
    st.integers(-(2 ** 63), 2 ** 63 - 1),
    st.decimals(allow_nan=False, allow_infinity=False, places=3, min_value=-10 ** 6,
                max_value=10 ** 6),
    st.floats(width=32, allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
    st.integers(0, 2 ** 64 - 1).map(AMQPTimestamp),
    st.binary(max_size=12).map(bytearray),
    st.none(),
)
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(KEYS, inner, max_size=4)), max_leaves=12)
# keys RabbitMQ gives no meaning to: an x- argument is checked by its own rule, and
# a message's CC and BCC headers are sender-selected distribution (BCC removed, a CC
# or BCC that is not an array closes the channel: test_sender_selected_against_rabbitmq.py)
TABLES = st.dictionaries(KEYS.filter(lambda key: not key.startswith("x-")
                                     and key not in ("CC", "BCC")), VALUES, max_size=6)
NAMES = itertools.count()


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(table=TABLES)
def test_random_tables_survive_declare_bind_publish_export_import(table, broker) -> None:
    prefix = f"ft-random-{next(NAMES)}"
    # a connection per example: one closed by the broker fails its own example, not
    # every later one (shrunk to a table that has nothing to do with it)
    with Probe.open(broker.uri, timeout=ANSWER_TIMEOUT) as probe:
        probe.call(1, amqp.Channel.Open())
        probe.transcript.clear()
        declare_bind_publish(probe, prefix, table)
    replies = [entry["reply"]["method"] for entry in probe.transcript]
    assert replies == ["Exchange.DeclareOk"] * 3 + ["Queue.DeclareOk"] * 2 + [
        "Queue.BindOk"] * 2 + ["Exchange.BindOk", "Basic.GetOk"], probe.transcript
    delivered = probe.transcript[-1]["reply"].get("properties", {}).get("headers", {})
    assert delivered == normalize(table)
    document = http(broker, "GET", "/api/definitions")
    arguments = exported(document, prefix)
    expected = rabbitmq_json(table)
    assert arguments[f"queue {prefix}-q"] == expected
    assert arguments[f"exchange {prefix}-x"] == expected
    assert arguments[f"binding {prefix}-x -> {prefix}-q"] == expected
    assert arguments[f"binding {prefix}-x -> {prefix}-x2"] == expected

    # the export, renamed, imported again: the same arguments come back
    renamed = f"{prefix}-again"
    again = json.loads(json.dumps({
        key: [item for item in document.get(key, [])
              if prefix in json.dumps(item)] for key in ("exchanges", "queues", "bindings")
    }).replace(f'"{prefix}-', f'"{renamed}-'))
    http(broker, "POST", "/api/definitions", again)
    reimported = exported(http(broker, "GET", "/api/definitions"), renamed)
    assert reimported == {key.replace(f"{prefix}-", f"{renamed}-"): value
                          for key, value in arguments.items()}
