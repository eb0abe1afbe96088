"""Big message bodies through a real node, as its clients see them: split over many
frames on the way out (frame_max), whole in the quorum queue's log through WAL
rollovers and a kill -9 restart. The node no longer copies a body into a joined
WAL record (wal.OWN_BUFFER_BYTES), into its delivery frames (codec.deliveries) or
into one joined send buffer (Session.chunks_to_send, the transport's writelines):
issue 31, Builds 3 and 4. These are the bytes a consumer must still get."""

from __future__ import annotations

import random

import pytest

import pika

from tests.support.broker import BrokerProcess

from .pika_support import connect, consume_bodies

pytestmark = pytest.mark.timeout(180)

CONFIG = """
[raft]
wal_max_size_bytes = 1048576
"""
SIZES = (300_000, 16_384, 70_000, 1, 131_072, 262_144)


def body(number: int) -> bytes:
    return random.Random(number).randbytes(SIZES[number % len(SIZES)])


def test_big_bodies_reach_consumers_whole_across_rollovers_and_a_restart():
    with BrokerProcess(extra_config=CONFIG) as broker:
        connection = connect(broker)
        channel = connection.channel()
        channel.queue_declare("big", durable=True, arguments={"x-queue-type": "quorum"})
        channel.confirm_delivery()
        for number in range(36):      # ~6 MB: several 1 MiB WAL files rolled over
            channel.basic_publish("", "big", body(number),
                                  pika.BasicProperties(delivery_mode=2))
        small_frames = connect(broker, frame_max=8192)   # a body in up to 33 frames
        assert consume_bodies(small_frames.channel(), "big", 12) == [body(n) for n in range(12)]
        small_frames.close()
        assert consume_bodies(channel, "big", 12) == [body(n) for n in range(12, 24)]
        connection.close()
        broker.restart(kill=True)
        connection = connect(broker)
        assert consume_bodies(connection.channel(), "big", 12) == [body(n) for n in range(24, 36)]
        connection.close()
