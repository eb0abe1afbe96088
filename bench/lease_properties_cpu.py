"""CPU per message of turning "entries" lease reads into the source's Arrow batches when
the messages' properties differ (issue 28, Build 3): in-process, no broker, no socket.

    python bench/lease_properties_cpu.py [--kind same|timestamp|ids|headers] [--messages 2048]
        [--repeats 10] [--rounds 5]

Builds one "entries" delivery body (broker/amqp/lease_records.pack_entries) of
`--messages` messages of 256 B, as one publisher sends them: content type
application/json, delivery mode 2, and a timestamp. `--kind` says what differs
between messages: nothing (`same`), the timestamp (`timestamp`, one a second), the
timestamp and a message_id and correlation_id (`ids`), the timestamp, a message_id and
a header (`headers`). Then decodes it (client/lease_entries.EntriesDecoder.decode_group)
and builds its batch (connector/schema.EntryBatches.batch) `--repeats` times per round,
a fresh decoder and builder each round. Prints the process CPU per message of every
round and their median (the first round pays first calls and caches).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))


def _properties(kind: str, number: int) -> dict:
    moment = dt.datetime(2026, 12, 7) + dt.timedelta(seconds=0 if kind == "same" else number)
    properties = {"content_type": "application/json", "delivery_mode": 2, "timestamp": moment}
    if kind == "ids":
        properties |= {"message_id": f"msg-{number:08d}", "correlation_id": f"c{number}"}
    elif kind == "headers":
        properties |= {"message_id": f"msg-{number:08d}", "headers": {"tenant": "acme",
                                                                      "n": number}}
    return properties


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kind", choices=("same", "timestamp", "ids", "headers"),
                        default="ids")
    parser.add_argument("--messages", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    arguments = parser.parse_args(argv)
    import numpy as np

    from quorumqueue.broker.amqp import codec
    from quorumqueue.broker.amqp.lease_records import pack_entries
    from quorumqueue.broker.fifo import commands, envelope
    from quorumqueue.client.lease_entries import EntriesDecoder
    from quorumqueue.connector.schema import EntryBatches

    entries = [envelope.stamp(commands.encode_enqueue(
                   "", seq, 0, "", "orders",
                   codec.encode_properties(256, _properties(arguments.kind, seq)), b"x" * 256),
                   1_700_000_000_000) for seq in range(1, arguments.messages + 1)]
    body = pack_entries(1, entries, {})
    buffer = np.frombuffer(body, np.uint8).copy()
    per_message = []
    for _ in range(arguments.rounds):
        decoder, builder = EntriesDecoder(), EntryBatches("q", True)
        began = time.process_time()
        for _ in range(arguments.repeats):
            batch = builder.batch(decoder.decode_group(buffer, [(0, len(body))]))
            assert batch.num_rows == arguments.messages
        per_message.append((time.process_time() - began)
                           / (arguments.repeats * arguments.messages) * 1e6)
    print(f"{arguments.kind}: {arguments.messages:,} x 256 B, us/message per round "
          f"{', '.join(f'{value:.2f}' for value in per_message)}; median "
          f"{statistics.median(per_message):.2f}; load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
