"""What Prometheus scrapes cost a busy broker: throughput while /metrics/per-object is
scraped, against the same load unscraped, in one run.

One bundled broker with its Prometheus endpoint on a free port and `--queues` idle
queues (half of them quorum queues, so each scrape has that many per-queue samples
to read and render). Then `--pairs` interleaved pairs of the throughput benchmark's
load (bench/amqp_loadgen.py: `--messages` confirmed persistent publishes to a fresh
quorum queue, then consumed with manual acks): one run with nobody scraping, one with
a thread scraping `/metrics/per-object` every `--interval` seconds (Prometheus scrapes
every 15-60 s; 1 s exaggerates on purpose). Prints each run's rates, the scrapes'
sizes and durations, and the median ratio scraped / unscraped per phase.

    .venv/bin/python bench/prometheus_scrape.py [--queues 1000] [--messages 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pika  # noqa: E402

from bench.amqp_loadgen import LoadSettings, run_load  # noqa: E402
from tests.support.prometheus import broker_with_metrics, fetch  # noqa: E402


class Scraper(threading.Thread):
    def __init__(self, port: int, interval: float) -> None:
        super().__init__(daemon=True)
        self.port, self.interval = port, interval
        self.stopping = threading.Event()
        self.durations: list[float] = []
        self.size = 0

    def run(self) -> None:
        while not self.stopping.is_set():
            began = time.perf_counter()
            body, _type = fetch(self.port, "/metrics/per-object")
            self.durations.append(time.perf_counter() - began)
            self.size = len(body)
            self.stopping.wait(max(0.0, self.interval - self.durations[-1]))


def declare_idle_queues(uri: str, count: int) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(uri))
    channel = connection.channel()
    for number in range(count):
        channel.queue_declare(f"idle-{number}", durable=True,
                              arguments={"x-queue-type": "quorum"} if number % 2 else {})
    connection.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queues", type=int, default=1000)
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--interval", type=float, default=1.0)
    arguments = parser.parse_args()
    broker, metrics_port = broker_with_metrics()
    ratios: dict[str, list[float]] = {"publish": [], "consume": []}
    with broker:
        declare_idle_queues(broker.uri, arguments.queues)
        settings = LoadSettings("127.0.0.1", broker.port, messages=arguments.messages,
                                queue_type="quorum")
        for pair in range(arguments.pairs):
            rates = {}
            for scraped in (False, True):
                scraper = Scraper(metrics_port, arguments.interval) if scraped else None
                if scraper:
                    scraper.start()
                result = asyncio.run(run_load(settings))
                if scraper:
                    scraper.stopping.set()
                    scraper.join()
                rates[scraped] = (result.publish.rate, result.consume.rate)
                line = (f"pair {pair + 1} {'scraped  ' if scraped else 'unscraped'}: "
                        f"publish {result.publish.rate:8.0f} msg/s, consume "
                        f"{result.consume.rate:8.0f} msg/s")
                if scraper and scraper.durations:
                    line += (f"; {len(scraper.durations)} scrapes of {scraper.size} bytes, "
                             f"median {statistics.median(scraper.durations) * 1000:.0f} ms")
                print(line, flush=True)
            ratios["publish"].append(rates[True][0] / rates[False][0])
            ratios["consume"].append(rates[True][1] / rates[False][1])
    for phase, values in ratios.items():
        print(f"{phase}: scraped / unscraped median {statistics.median(values):.2f} "
              f"({min(values):.2f}-{max(values):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
