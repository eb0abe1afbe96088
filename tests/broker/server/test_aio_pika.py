"""aio-pika (over aiormq) against the bundled broker, as an asyncio RabbitMQ user
writes it: connect_robust, publisher confirms, queue iterators, direct reply-to RPC,
and channel errors that leave the connection usable.

Tests are plain functions that run one coroutine with asyncio.run (no plugin needed).
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


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, timeout=20))


def test_robust_connection_confirms_persistent_messages_and_iterates(broker):
    """connect_robust + channel(publisher_confirms=True): each publish of a persistent
    message to a durable queue returns basic.ack; queue.iterator() with
    message.process() consumes and acks them all, in order (AMQP basic.consume/ack)."""

    async def scenario():
        connection = await aio_pika.connect_robust(broker.uri)
        async with connection:
            channel = await connection.channel(publisher_confirms=True)
            queue = await channel.declare_queue(unique("aio-durable"), durable=True)
            assert queue.declaration_result.message_count == 0
            for index in range(20):
                confirmation = await channel.default_exchange.publish(
                    aio_pika.Message(f"m{index}".encode(), delivery_mode=DeliveryMode.PERSISTENT,
                                     content_type="text/plain", headers={"index": index}),
                    routing_key=queue.name)
                assert isinstance(confirmation, commands.Basic.Ack)
            declared = await channel.declare_queue(queue.name, durable=True)
            assert declared.declaration_result.message_count == 20

            await channel.set_qos(prefetch_count=5)
            received = []
            async with queue.iterator() as messages:
                async for message in messages:
                    async with message.process():
                        received.append((message.body, message.delivery_mode,
                                         message.headers["index"], message.redelivered))
                    if len(received) == 20:
                        break
            assert received == [(f"m{i}".encode(), DeliveryMode.PERSISTENT, i, False)
                                for i in range(20)]
            deleted = await queue.delete(if_unused=False, if_empty=True)
            assert deleted.message_count == 0

    run(scenario())


def test_unroutable_mandatory_publish_is_returned(broker):
    """basic.publish mandatory=true without a route: RabbitMQ sends basic.return before
    the confirm; aio-pika raises DeliveryError carrying the returned message."""

    async def scenario():
        async with await aio_pika.connect_robust(broker.uri) as connection:
            channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
            with pytest.raises(aio_pika.exceptions.DeliveryError) as info:
                await channel.default_exchange.publish(
                    aio_pika.Message(b"nobody"), routing_key=unique("no-queue"), mandatory=True)
            assert info.value.message.body == b"nobody"

    run(scenario())


def test_rpc_over_direct_reply_to(broker):
    """Direct reply-to (RabbitMQ): the client consumes amq.rabbitmq.reply-to with
    no-ack and publishes requests with reply_to=amq.rabbitmq.reply-to; the service
    answers to the generated name it received, and the reply carries the
    correlation id back."""

    async def scenario():
        async with await aio_pika.connect_robust(broker.uri) as connection:
            service_channel = await connection.channel()
            service_queue = await service_channel.declare_queue(unique("rpc"), auto_delete=True)

            async def serve(request: aio_pika.abc.AbstractIncomingMessage) -> None:
                async with request.process():
                    assert request.reply_to.startswith("amq.rabbitmq.reply-to.")
                    await service_channel.default_exchange.publish(
                        aio_pika.Message(request.body.upper(),
                                         correlation_id=request.correlation_id),
                        routing_key=request.reply_to)

            await service_queue.consume(serve)

            client_channel = await connection.channel()
            reply_queue = await client_channel.get_queue("amq.rabbitmq.reply-to")
            replies: dict[str, asyncio.Future] = {}

            async def on_reply(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                replies[message.correlation_id].set_result(message.body)

            await reply_queue.consume(on_reply, no_ack=True)
            loop = asyncio.get_running_loop()
            for word in ("ping", "pong", "quorum"):
                correlation_id = unique("call")
                replies[correlation_id] = loop.create_future()
                await client_channel.default_exchange.publish(
                    aio_pika.Message(word.encode(), correlation_id=correlation_id,
                                     reply_to="amq.rabbitmq.reply-to"),
                    routing_key=service_queue.name)
                assert await replies[correlation_id] == word.upper().encode()

    run(scenario())


def test_channel_error_leaves_connection_usable(broker):
    """A soft error (404 NOT_FOUND on a passive queue.declare) closes only that
    channel: aiormq raises ChannelNotFoundEntity, and the connection keeps working."""

    async def scenario():
        async with await aio_pika.connect_robust(broker.uri) as connection:
            channel = await connection.channel()
            missing = unique("missing")
            with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity) as info:
                await channel.declare_queue(missing, passive=True)
            assert info.value.args == (f"NOT_FOUND - no queue '{missing}' in vhost '/'",)
            assert not connection.is_closed
            other = await connection.channel()
            queue = await other.declare_queue(exclusive=True)
            await other.default_exchange.publish(aio_pika.Message(b"alive"),
                                                 routing_key=queue.name)
            message = await queue.get(timeout=5)
            await message.ack()
            assert message.body == b"alive"
            await channel.reopen()   # the failed channel can be opened again too
            assert (await channel.declare_queue(queue.name, passive=True)).name == queue.name

    run(scenario())


def test_precondition_failed_on_redeclare(broker):
    """Redeclaring a queue with other properties: 406 PRECONDITION_FAILED, raised by
    aiormq as ChannelPreconditionFailed."""

    async def scenario():
        async with await aio_pika.connect_robust(broker.uri) as connection:
            name = unique("aio-redeclare")
            channel = await connection.channel()
            await channel.declare_queue(name, durable=True)
            with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed) as info:
                await (await connection.channel()).declare_queue(name, durable=False)
            assert info.value.args == (
                f"PRECONDITION_FAILED - inequivalent arg 'durable' for queue '{name}' in vhost "
                "'/': received 'false' but current is 'true'",)
            await (await connection.channel()).queue_delete(name)

    run(scenario())
