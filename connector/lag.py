"""How far behind its queues a query is: the source's latest-offset report, and a
StreamingQueryListener that logs it.

Spark shows, for each source of a query's progress (`query.lastProgress["sources"]`),
the batch's `startOffset` and `endOffset` and the source's `latestOffset`, which it
asks for with `reportLatestOffset()` (PySpark >= 4.2) after every `latestOffset`. A
source's `metrics` map, where Kafka puts `avgOffsetsBehindLatest` and friends, is not
open to Python data sources: PySpark's stream wrapper (PythonMicroBatchStream, 4.2
and 4.3) does not implement ReportsSourceMetrics and DataSourceStreamReader has no
metrics method. So the figures travel inside the reported latest offset:

    "latestOffset": {"lease": "spark-…", "queues": {"orders": 1200},
                     "metrics": {"minMessagesBehindLatest": 200, ...}}

`queues` (`delivered` in consume mode) is the tail in the offset's own form: what the
query's `endOffset` would be if one batch took everything there is now. Subtract the
`endOffset` for the messages behind, per queue; `metrics` has them summed up already.

Responsibilities
    - `QueueFigures` and `latest_report`: the report, from figures a reader gathered
      (pure).
    - `lag_metrics`: the metrics of one source's progress, for a user's own code.
    - `QueueLagListener`: logs them for every progress of every query.

Invariants
    - Messages behind are never negative (a tail observed before a batch end can lag it).
    - A figure the broker cannot give (`unackedMessages` without the administrator
      tag, or from RabbitMQ) is left out, never reported as 0.

Not here
    Gathering the figures from the broker (lease_reader.py, consume_reader.py).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass

from pyspark.sql.streaming import StreamingQueryListener

log = logging.getLogger(__name__)

MIN_BEHIND = "minMessagesBehindLatest"
AVG_BEHIND = "avgMessagesBehindLatest"
MAX_BEHIND = "maxMessagesBehindLatest"
READY = "readyMessages"
UNACKED = "unackedMessages"
HELD = "heldMessages"


@dataclass(frozen=True, slots=True)
class QueueFigures:
    tail: int             # the offset position of the last message there is
    ready: int            # the queue's ready messages, as the broker counts them
    held: int             # given to this query and not settled (lease) or acked (consume)
    unacked: int | None   # the queue's unacked messages, every consumer and lease; None: unknown


def latest_report(offset: dict, positions_key: str, figures: Mapping[str, QueueFigures],
                  batch_end: Mapping[str, int]) -> dict:
    """`offset` (an offset of the reader's mode, {"lease": ...} or {}) with the tails under
    `positions_key` and the query's metrics; `batch_end`: per queue, the end of the
    batch the reader last planned."""
    behind = [max(0, figure.tail - batch_end.get(queue, 0))
              for queue, figure in figures.items()]
    metrics: dict[str, int | float] = {}
    if behind:
        metrics |= {MIN_BEHIND: min(behind), AVG_BEHIND: round(sum(behind) / len(behind), 1),
                    MAX_BEHIND: max(behind)}
    metrics |= {READY: sum(f.ready for f in figures.values()),
                HELD: sum(f.held for f in figures.values())}
    if figures and all(f.unacked is not None for f in figures.values()):
        metrics[UNACKED] = sum(f.unacked for f in figures.values())  # type: ignore[misc]
    return {**offset, positions_key: {queue: figures[queue].tail for queue in sorted(figures)},
            "metrics": metrics}


def lag_metrics(source_progress) -> dict | None:
    """The quorumqueue metrics of one source of a progress (an item of
    `query.lastProgress["sources"]`, a SourceProgress, or its `latestOffset`), None if it
    has none (another source, or a Spark that never asked for the latest offset)."""
    latest = source_progress
    if isinstance(source_progress, Mapping) and "latestOffset" in source_progress:
        latest = source_progress["latestOffset"]
    if isinstance(latest, str):
        try:
            latest = json.loads(latest)
        except ValueError:  # PySpark shows a missing latest offset as "None"
            return None
    if not isinstance(latest, Mapping) or not isinstance(latest.get("metrics"), Mapping):
        return None
    if not ({"queues", "delivered"} & set(latest)):
        return None
    return dict(latest["metrics"])


class QueueLagListener(StreamingQueryListener):
    """Logs each progress's quorumqueue metrics (logger `quorumqueue.connector.lag`, INFO)
    and keeps the last ones per query id in `latest`:

        spark.streams.addListener(QueueLagListener())
    """

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.log = logger or log
        self.latest: dict[str, dict] = {}   # query id -> {"batchId": n, "sources": [...]}

    def onQueryStarted(self, event) -> None:
        pass

    def onQueryProgress(self, event) -> None:
        progress = event.progress
        found = [(index, metrics) for index, source in enumerate(progress.sources)
                 if (metrics := lag_metrics(source)) is not None]
        if not found:
            return
        self.latest[str(progress.id)] = {"batchId": progress.batchId,
                                         "sources": [metrics for _index, metrics in found]}
        for index, metrics in found:
            self.log.info("query %s (%s), batch %d, source %d: %s", progress.name or "",
                          progress.id, progress.batchId, index,
                          ", ".join(f"{key}={value}" for key, value in metrics.items()))

    def onQueryIdle(self, event) -> None:
        pass

    def onQueryTerminated(self, event) -> None:
        pass
