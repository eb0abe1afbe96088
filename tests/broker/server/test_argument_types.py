"""A declare's arguments keep the field types they arrived as, across a restart.

aio-pika (pamqp) sends a small integer as the smallest type that holds it: 10 as a
byte, 1000 as a short. RabbitMQ keeps every argument as {Type, Value} and names the
type when a redeclare leaves the argument out ("received none but current is the
value '10' of type 'byte'"); the live rule is compared with RabbitMQ 3.10.8 in
tests/differential/test_against_rabbitmq.py (queue_inequivalent_small_integer_types).
Here: the type is still the one that came after the broker restarts, so it is kept
in the metadata file and log, not only in memory.
"""

from __future__ import annotations

import asyncio

import aio_pika
import pika
import pytest

from quorumqueue.client.management import call

from .pika_support import connect, unique

pytestmark = pytest.mark.timeout(180)


def _declare_with_aio_pika(uri: str, name: str, kind: str) -> None:
    async def declare() -> None:
        async with await aio_pika.connect(uri) as connection:
            channel = await connection.channel()
            await channel.declare_queue(name, durable=True, arguments={
                "x-queue-type": kind, "x-max-length": 10, "x-message-ttl": 1000})

    asyncio.run(asyncio.wait_for(declare(), timeout=60))


def _redeclare_refusal(broker, name: str, arguments: dict) -> str:
    with connect(broker) as connection:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            connection.channel().queue_declare(name, durable=True, arguments=arguments)
    assert refused.value.reply_code == 406
    return refused.value.reply_text


@pytest.mark.parametrize("kind", ["classic", "quorum"])
def test_a_small_integer_argument_is_named_by_its_wire_type_after_a_restart(
        fresh_broker, kind):
    name = unique(f"arg-types-{kind}")
    _declare_with_aio_pika(fresh_broker.uri, name, kind)
    fresh_broker.restart(kill=True)
    where = f"for queue '{name}' in vhost '/'"
    assert _redeclare_refusal(fresh_broker, name, {"x-queue-type": kind,
                                                   "x-message-ttl": 1000}) == (
        f"PRECONDITION_FAILED - inequivalent arg 'x-max-length' {where}: received none "
        "but current is the value '10' of type 'byte'")
    assert _redeclare_refusal(fresh_broker, name, {"x-queue-type": kind,
                                                   "x-max-length": 10}) == (
        f"PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' {where}: received none "
        "but current is the value '1000' of type 'short'")
    # the same integers in another type are the same arguments (RabbitMQ compares terms)
    with connect(fresh_broker) as connection:
        connection.channel().queue_declare(name, durable=True, arguments={
            "x-queue-type": kind, "x-max-length": 10, "x-message-ttl": 1000})
    # listed as numbers (rabbitmqctl list_queues arguments), not as the file keeps them
    row, = [row for row in call(fresh_broker.uri, "queues.list") if row["name"] == name]
    assert row["arguments"] == {"x-queue-type": kind, "x-max-length": 10,
                                "x-message-ttl": 1000}
