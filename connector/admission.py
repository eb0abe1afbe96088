"""Options minMessagesPerTrigger and maxTriggerDelay: wait for a worthwhile batch (pure).

Kafka's source has the same pair (minOffsetsPerTrigger, maxTriggerDelay): a trigger
that finds fewer new messages than the minimum plans no batch, unless the delay has
passed since the last batch, so a slow trickle still arrives, only later.

Responsibilities
    `MinimumGate.admit` decides, given the messages available beyond the batch's start
    and the time, whether a trigger may plan a batch; the readers (lease_reader.py,
    consume_reader.py) count what is available and return the start offset (no new
    data, as Spark understands it) when the gate says no.

How it works
    The delay runs from the last batch this reader planned, or from the reader's first
    question if it has planned none (Spark then waits up to maxTriggerDelay for the
    first batch of a run, too, unless the minimum is there). Time comes in as an
    argument (milliseconds of a monotonic clock), so the rule is tested without a clock.

Invariants
    - A trigger with nothing available never plans a batch, delay or not.
    - Trigger.AvailableNow and Trigger.Once do not consult the gate: their runs stop at
      what there is, and waiting would only delay the end (the readers check this).

Not here
    Counting what is available (the readers), the options (options.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class MinimumGate:
    min_messages: int
    max_delay_ms: int
    since_ms: float | None = None   # the last batch planned, or the first question

    def admit(self, available: int, now_ms: float) -> bool:
        """Whether a batch of the `available` messages may be planned now; when it may,
        the delay starts again from `now_ms` (the batch is planned)."""
        if self.since_ms is None:
            self.since_ms = now_ms
        if available <= 0:
            return False
        if available < self.min_messages and now_ms - self.since_ms < self.max_delay_ms:
            return False
        self.since_ms = now_ms
        return True
