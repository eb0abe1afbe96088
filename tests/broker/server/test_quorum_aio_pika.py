"""Quorum queues with aio-pika (over aiormq), the essentials as an asyncio user of
RabbitMQ 4.x writes them: declare with x-arguments, publish with confirms, iterate and
ack, nack with requeue (x-delivery-count), basic.get with its message count, and the
declaration errors (RabbitMQ 4.2's quorum queues guide, "Declaring").

Tests are plain functions that run one coroutine with asyncio.run (no plugin needed),
as in test_aio_pika.py.
"""

from __future__ import annotations

import asyncio
import uuid

import aio_pika
import aiormq
import pytest
from aio_pika.abc import DeliveryMode
from pamqp import commands

pytestmark = pytest.mark.timeout(60)

QUORUM = {"x-queue-type": "quorum"}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, timeout=20))


def test_declare_publish_with_confirms_and_iterate_with_ack(broker):
    """declare_queue(durable, x-queue-type quorum, x-delivery-limit); each confirmed
    publish returns basic.ack; declare-ok counts them; queue.iterator() with
    message.process() gets them in order, first deliveries (redelivered false, no
    x-delivery-count), and acks them all."""

    async def scenario():
        async with await aio_pika.connect_robust(broker.uri) as connection:
            channel = await connection.channel(publisher_confirms=True)
            arguments = {**QUORUM, "x-delivery-limit": 5}
            queue = await channel.declare_queue(unique("aio-qq"), durable=True,
                                                arguments=arguments)
            assert queue.declaration_result.message_count == 0
            for index in range(20):
                confirmation = await channel.default_exchange.publish(
                    aio_pika.Message(f"m{index}".encode(), delivery_mode=DeliveryMode.PERSISTENT,
                                     content_type="text/plain", headers={"index": index}),
                    routing_key=queue.name)
                assert isinstance(confirmation, commands.Basic.Ack)
            declared = await channel.declare_queue(queue.name, durable=True, arguments=arguments)
            assert declared.declaration_result.message_count == 20

            await channel.set_qos(prefetch_count=5)
            received = []
            async with queue.iterator() as messages:
                async for message in messages:
                    async with message.process():
                        received.append((message.body, message.redelivered,
                                         message.headers.get("index"),
                                         message.headers.get("x-delivery-count"),
                                         message.content_type))
                    if len(received) == 20:
                        break
            assert received == [(f"m{i}".encode(), False, i, None, "text/plain")
                                for i in range(20)]
            assert await queue.get(fail=False) is None

    run(scenario())


def test_nack_with_requeue_redelivers_with_a_delivery_count(broker):
    """message.nack(requeue=True), then reject(requeue=True): the message comes back
    first, redelivered, with x-delivery-count 1 then 2; get() reports the ready
    messages left; ack removes it."""

    async def scenario():
        async with await aio_pika.connect_robust(broker.uri) as connection:
            channel = await connection.channel(publisher_confirms=True)
            queue = await channel.declare_queue(unique("aio-qq-nack"), durable=True,
                                                arguments=QUORUM)
            for body in (b"poison", b"next"):
                await channel.default_exchange.publish(aio_pika.Message(body),
                                                       routing_key=queue.name)
            seen = []
            for settle in ("nack", "reject", "ack"):
                message = await queue.get(timeout=5)
                seen.append((message.body, message.redelivered,
                             (message.headers or {}).get("x-delivery-count"),
                             message.message_count))
                if settle == "nack":
                    await message.nack(requeue=True)
                elif settle == "reject":
                    await message.reject(requeue=True)
                else:
                    await message.ack()
            assert seen == [(b"poison", False, None, 1), (b"poison", True, 1, 1),
                            (b"poison", True, 2, 1)]
            last = await queue.get(timeout=5, no_ack=True)
            assert (last.body, last.message_count) == (b"next", 0)
            assert await queue.get(fail=False) is None

    run(scenario())


def test_get_counts_and_get_empty(broker):
    """queue.get(): each get-ok carries the number of ready messages left; an empty
    quorum queue gives get-empty (aio-pika: QueueEmpty, or None with fail=False)."""

    async def scenario():
        async with await aio_pika.connect_robust(broker.uri) as connection:
            channel = await connection.channel(publisher_confirms=True)
            queue = await channel.declare_queue(unique("aio-qq-get"), durable=True,
                                                arguments=QUORUM)
            with pytest.raises(aio_pika.exceptions.QueueEmpty):
                await queue.get(timeout=5)
            for index in range(3):
                await channel.default_exchange.publish(aio_pika.Message(f"g{index}".encode()),
                                                       routing_key=queue.name)
            got = []
            for _ in range(3):
                message = await queue.get(timeout=5, no_ack=True)
                got.append((message.body, message.message_count))
            assert got == [(b"g0", 2), (b"g1", 1), (b"g2", 0)]
            assert await queue.get(fail=False) is None

    run(scenario())


def test_non_durable_quorum_queue_is_refused(broker):
    """declare_queue(durable=False) of a quorum queue: 406, aiormq raises
    ChannelPreconditionFailed with RabbitMQ's text; the connection stays usable."""

    async def scenario():
        async with await aio_pika.connect_robust(broker.uri) as connection:
            name = unique("aio-qq-transient")
            channel = await connection.channel()
            with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed) as info:
                await channel.declare_queue(name, durable=False, arguments=QUORUM)
            assert info.value.args == (f"PRECONDITION_FAILED - invalid property 'non-durable' "
                                       f"for queue '{name}' in vhost '/'",)
            assert not connection.is_closed
            other = await connection.channel()
            queue = await other.declare_queue(name, durable=True, arguments=QUORUM)
            assert queue.declaration_result.message_count == 0

    run(scenario())
