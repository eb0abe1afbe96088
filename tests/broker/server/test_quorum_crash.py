"""Quorum queues survive kill -9 at any instant: nothing confirmed is lost, nothing
settled comes back.

A publisher (confirms, one message at a time so every confirm names one id) and a
consumer (manual acks, each batch followed by a synchronous method, whose reply the
broker sends only after the flush that made the acks durable) run against a quorum
queue while a third thread SIGKILLs the broker after a random delay. After the
restart the queue is drained and checked against what the clients were told (a
batch whose ack was sent but not answered may be either gone or back). Three
rounds on one data directory, so recovery also runs over a log that was itself
recovered (and rolled over: the WAL is kept small).
"""

from __future__ import annotations

import random
import threading
import time

import pika
import pytest
from pika import exceptions as pe

from tests.support.broker import BrokerProcess

from .pika_support import connect

pytestmark = pytest.mark.timeout(120)

QUEUE = "crash-qq"
PERSISTENT = pika.BasicProperties(delivery_mode=2)
# a small WAL and small segments: rollovers and segment files happen during the test
CONFIG = """
[raft]
wal_max_size_bytes = 65536
segment_max_entries = 64
"""


def publish_until_killed(broker, start: int, confirmed: list[int], stop: threading.Event) -> None:
    try:
        connection = connect(broker)
        channel = connection.channel()
        channel.confirm_delivery()
        number = start
        while not stop.is_set():
            channel.basic_publish("", QUEUE, str(number).encode() + b"." * 200, PERSISTENT)
            confirmed.append(number)  # basic_publish returned: the broker confirmed it
            number += 1
    except (pe.AMQPError, OSError):
        return


def consume_until_killed(broker, settled: set[int], in_doubt: set[int],
                         stop: threading.Event) -> None:
    try:
        connection = connect(broker)
        channel = connection.channel()
        channel.basic_qos(prefetch_count=20)
        pending: list[int] = []
        for method, _properties, body in channel.consume(QUEUE, inactivity_timeout=0.05):
            if stop.is_set():
                return
            if method is None:
                continue
            pending.append(int(body.split(b".")[0]))
            if len(pending) >= 10:
                # acked but not yet answered: a kill now may or may not keep the ack
                in_doubt.update(pending)
                channel.basic_ack(method.delivery_tag, multiple=True)
                # a synchronous round trip: its reply leaves after the acks are durable
                channel.queue_declare(QUEUE, passive=True)
                settled.update(pending)
                in_doubt.difference_update(pending)
                pending.clear()
    except (pe.AMQPError, OSError):
        return


def drain(broker) -> list[int]:
    connection = connect(broker)
    channel = connection.channel()
    seen = []
    while True:
        method, _properties, body = channel.basic_get(QUEUE, auto_ack=False)
        if method is None:
            break
        seen.append(int(body.split(b".")[0]))
    connection.close()  # not acked: everything stays for the next round
    return seen


def test_kill_9_during_confirmed_publishing_and_consuming_loses_nothing_confirmed():
    rng = random.Random()
    confirmed: list[int] = []
    settled: set[int] = set()
    in_doubt: set[int] = set()  # acks sent whose answer the kill cut off
    with BrokerProcess(extra_config=CONFIG) as broker:
        setup = connect(broker)
        setup.channel().queue_declare(QUEUE, durable=True,
                                      arguments={"x-queue-type": "quorum"})
        setup.close()
        next_number = 0
        for _round in range(3):
            stop = threading.Event()
            before = len(confirmed)
            threads = [
                threading.Thread(target=publish_until_killed,
                                 args=(broker, next_number, confirmed, stop)),
                threading.Thread(target=consume_until_killed,
                                 args=(broker, settled, in_doubt, stop)),
            ]
            for thread in threads:
                thread.start()
            deadline = time.monotonic() + 10
            while len(confirmed) - before < 200 and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(rng.uniform(0.0, 0.3))
            broker.stop(kill=True)
            stop.set()
            for thread in threads:
                thread.join(10)
            assert len(confirmed) - before >= 200, "the publisher did not get going"
            next_number = (confirmed[-1] + 1) if confirmed else next_number
            next_number += 1_000_000  # unconfirmed numbers of this round never reappear
            broker.start()
            present = drain(broker)
            missing = set(confirmed) - settled - in_doubt - set(present)
            assert not missing, f"confirmed and never acked, but lost: {sorted(missing)[:10]}"
            back = settled & set(present)
            assert not back, f"acked (and the ack answered), but back: {sorted(back)[:10]}"
            assert len(present) == len(set(present)), "a message is in the queue twice"
            in_doubt -= set(present)  # their acks were lost with the kill: now plain unacked
            print(f"round {_round}: confirmed {len(confirmed)}, settled {len(settled)}, "
                  f"present {len(present)}")
