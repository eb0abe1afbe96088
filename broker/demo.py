"""The README's main job until the Spark connector lands: start the bundled broker and
show a publish / confirm / consume / ack round trip with a real client (pika).

    make main        # or: .venv/bin/python -m quorumqueue.broker.demo

Steps, each printed as it happens: start a broker node on a free loopback port,
declare a topic exchange and a durable queue bound to it, publish persistent orders
with publisher confirms, show a mandatory message coming back unroutable, consume
with manual acks and a prefetch window, restart the broker to show that durable,
confirmed, unacked messages survive, then drain and stop.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pika

ORDERS = 2000
EXCHANGE = "events"
QUEUE = "orders"


def say(text: str) -> None:
    print(f"[demo] {text}", flush=True)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Broker:
    """`quorumqueue broker start` as a child process."""

    def __init__(self, data_dir: str, port: int) -> None:
        self.data_dir, self.port = data_dir, port
        self.process: subprocess.Popen | None = None
        self.log_path = os.path.join(data_dir, "broker.log")

    def start(self) -> None:
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "quorumqueue.broker.cli", "broker", "start",
             "--port", str(self.port), "--data-dir", self.data_dir],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"the broker exited early; see {self.log_path}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        raise SystemExit(f"the broker did not start within 20 s; see {self.log_path}")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(10)


def order(number: int) -> tuple[bytes, pika.BasicProperties, str]:
    region = ("eu", "us", "apac")[number % 3]
    body = json.dumps({"order_id": number, "region": region, "sku": f"SKU-{number % 97:03d}",
                       "quantity": 1 + number % 5, "amount": round(9.99 * (1 + number % 7), 2)})
    properties = pika.BasicProperties(
        content_type="application/json", delivery_mode=2, message_id=f"order-{number}",
        timestamp=int(time.time()), app_id="quorumqueue-demo",
        headers={"region": region, "attempt": 1})
    return body.encode(), properties, f"order.created.{region}"


def main() -> None:
    data_dir = tempfile.mkdtemp(prefix="quorumqueue-demo-")
    port = free_port()
    broker = Broker(data_dir, port)
    say(f"starting the bundled broker on 127.0.0.1:{port} (data: {data_dir})")
    broker.start()
    parameters = pika.ConnectionParameters("127.0.0.1", port)
    try:
        connection = pika.BlockingConnection(parameters)
        server = connection._impl.server_properties
        say(f"connected with pika {pika.__version__}; server advertises capabilities: "
            + ", ".join(sorted(k for k, v in server["capabilities"].items() if v)))
        channel = connection.channel()
        channel.exchange_declare(EXCHANGE, "topic", durable=True)
        channel.queue_declare(QUEUE, durable=True)
        channel.queue_bind(QUEUE, EXCHANGE, "order.created.*")
        say(f"declared topic exchange '{EXCHANGE}' and durable queue '{QUEUE}' "
            "bound with 'order.created.*'")

        channel.confirm_delivery()
        started = time.perf_counter()
        for number in range(ORDERS):
            body, properties, routing_key = order(number)
            channel.basic_publish(EXCHANGE, routing_key, body, properties, mandatory=True)
            if (number + 1) % 500 == 0:
                say(f"published and confirmed {number + 1}/{ORDERS} orders")
        elapsed = time.perf_counter() - started
        say(f"{ORDERS} persistent orders confirmed (fsynced) in {elapsed:.2f}s "
            f"({ORDERS / elapsed:,.0f} msg/s, one confirm round trip each)")
        try:
            channel.basic_publish(EXCHANGE, "invoice.created", b"{}", mandatory=True)
        except pika.exceptions.UnroutableError as error:
            say(f"a mandatory message with no matching binding came back: "
                f"{len(error.messages)} basic.return (312 NO_ROUTE)")

        consumed = []
        channel.basic_qos(prefetch_count=100)
        for method, properties, body in channel.consume(QUEUE, inactivity_timeout=2):
            if method is None:
                break
            consumed.append(json.loads(body))
            if len(consumed) <= ORDERS // 2:
                channel.basic_ack(method.delivery_tag)
            if len(consumed) == ORDERS // 2 + 100:
                break
        say(f"consumed {len(consumed)} orders; acked {ORDERS // 2}, left 100 unacked "
            f"(prefetch 100): first={consumed[0]['order_id']}, "
            f"last={consumed[-1]['order_id']}")
        declared = channel.queue_declare(QUEUE, passive=True).method
        say(f"queue '{QUEUE}': {declared.message_count} ready, "
            f"{declared.consumer_count} consumer(s)")
        connection.close()

        say("restarting the broker (SIGTERM, then start on the same data directory)")
        broker.stop()
        broker.start()
        connection = pika.BlockingConnection(parameters)
        channel = connection.channel()
        declared = channel.queue_declare(QUEUE, durable=True).method
        say(f"after restart: queue '{QUEUE}' holds {declared.message_count} messages "
            f"(the {ORDERS // 2} never acked, including the 100 that were unacked)")
        drained, redelivered = 0, 0
        channel.basic_qos(prefetch_count=500)
        for method, properties, body in channel.consume(QUEUE, inactivity_timeout=1):
            if method is None:
                break
            drained += 1
            redelivered += method.redelivered
            if drained % 500 == 0:
                channel.basic_ack(method.delivery_tag, multiple=True)
        channel.basic_ack(0, multiple=True) if drained % 500 else None
        channel.cancel()
        remaining = channel.queue_declare(QUEUE, passive=True).method.message_count
        say(f"drained {drained} messages with manual multiple acks; {remaining} left")
        connection.close()
        ok = declared.message_count == ORDERS // 2 and drained == ORDERS // 2 and remaining == 0
        say("RESULT: " + ("every confirmed order was delivered, and acked ones only once"
                          if ok else "MISMATCH, see the lines above"))
        if not ok:
            raise SystemExit(1)
    finally:
        broker.stop()
        say(f"broker stopped; its log is {broker.log_path}")


if __name__ == "__main__":
    main()
