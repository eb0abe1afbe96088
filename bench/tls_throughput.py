"""AMQP over TLS against plain AMQP, on one quorumqueue node, in the same run.

One broker with both listeners (docs/behaviour/tls.md; certificates made by
`openssl` as the tests make them, EC P-256, TLS 1.3), and the load generator of
amqp_throughput.py (confirmed persistent publishes, then a manual-ack consume) run
alternately over the plain and the TLS port, `--pairs` times each, each run on a
fresh quorum queue. Prints each run and the median TLS / plain ratio of both phases.

    .venv/bin/python bench/tls_throughput.py --messages 20000 --pairs 3
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import ssl
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.amqp_loadgen import LoadSettings, run_load  # noqa: E402
from tests.broker.server.test_tls import tls_broker  # noqa: E402
from tests.support.certs import make_pki  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--pairs", type=int, default=3)
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="qq-tls-bench-") as directory:
        pki = make_pki(directory)
        broker = tls_broker(pki)
        try:
            context = ssl.create_default_context(cafile=pki.ca)
            ratios = {"publish": [], "consume": []}
            for pair in range(arguments.pairs):
                rates = {}
                for label, port, tls in (("plain", broker.port, None),
                                         ("tls", broker.ssl_port, context)):
                    settings = LoadSettings(host="127.0.0.1", port=port,
                                            messages=arguments.messages, size=arguments.size,
                                            queue_type="quorum", ssl=tls)
                    result = asyncio.run(run_load(settings))
                    rates[label] = (result.publish.rate, result.consume.rate)
                    print(f"pair {pair + 1} {label:5}: publish {result.publish.rate:9.0f} "
                          f"msg/s, consume {result.consume.rate:9.0f} msg/s", flush=True)
                ratios["publish"].append(rates["tls"][0] / rates["plain"][0])
                ratios["consume"].append(rates["tls"][1] / rates["plain"][1])
            print(f"TLS / plain, median of {arguments.pairs}: publish "
                  f"{statistics.median(ratios['publish']):.2f}x, consume "
                  f"{statistics.median(ratios['consume']):.2f}x")
        finally:
            broker.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
