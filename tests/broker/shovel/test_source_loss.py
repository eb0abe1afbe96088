"""The shovel's acks to a source connection that goes during a burst of them: each
one returns (with an error) instead of waiting for ever, so an attempt that lost its
source settles what it had on its way and the shovel starts again after its
reconnect-delay (broker/shovel/worker.py `_ack`)."""

from __future__ import annotations

import asyncio

import aiormq
import pytest

from quorumqueue.broker.shovel.worker import _ack
from tests.support.broker import BrokerProcess
from tests.support.cluster import TcpProxy

pytestmark = pytest.mark.timeout(120)


def test_a_burst_of_acks_to_a_source_that_goes_all_return():
    """200 acks queued in one go (as when the destination confirms a prefetch at
    once), then the source connection is reset before the client wrote them: aiormq
    holds at most 10 frames in its write queue and a connection gone no longer
    empties it, so plain basic_ack calls past those 10 would wait for ever. Every
    ack returns, each either sent or failed, within a generous bound."""

    async def burst(proxy) -> tuple[int, int]:
        connection = await aiormq.connect(f"amqp://guest:guest@127.0.0.1:{proxy.port}/%2F")
        channel = await connection.channel()
        proxy.cut("stall", "forward")
        loop = asyncio.get_running_loop()
        acks = [loop.create_task(_ack(connection, channel, tag)) for tag in range(1, 201)]
        proxy.cut("drop")  # holds this loop until the proxy reset the connection
        done, pending = await asyncio.wait(acks, timeout=30)
        for ack in pending:
            ack.cancel()
        await asyncio.wait([connection.closing], timeout=30)  # the reset was seen
        failed = sum(1 for ack in done if ack.exception() is not None)
        return len(pending), failed

    with BrokerProcess() as broker, TcpProxy(broker.port, name="shovel->source") as proxy:
        pending, failed = asyncio.run(burst(proxy))
    assert pending == 0, f"{pending} of 200 acks still waiting on a connection gone"
    assert failed > 0  # the connection went before the client wrote them all
