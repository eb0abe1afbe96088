"""The dead-letter worker of at-least-once dead lettering (RabbitMQ's rabbit_fifo_dlx_worker).

Responsibilities: for one quorum queue this node leads, publish the dead letters the
machine checks out to the worker (DlxDeliver effects, broker/fifo/dlx.py) through the
queue's dead-letter exchange, with x-death headers (queues/dead_letter.py) and
publisher-confirm semantics, and settle each one in the source queue (a DlxSettle
command through its log) only once every target queue confirmed it; the settles of
one round of the node's groups go in one command (`flush`).

How it works, as the quorum queues guide ("Dead Lettering") describes it:
- one worker per queue, "co-located on the quorum queue leader node"; its identity is
  the leader's node, run (boot id) and term, so a new leader (or the same node after a
  restart or in a new term) registers a new worker (DlxCheckout), and the machine
  hands it what the previous one had not settled, which it sends again: duplicates
  at the target are possible, loss is not;
- it takes at most `dead_letter_worker_consumer_prefetch` messages (default 32) at a
  time: the machine checks out no more until some are settled, which bounds the
  bodies this worker reads and holds;
- each message is routed through the dead-letter exchange by the node
  (QuorumHost.route_dead_letter, node/dead_letters.py `route`: its dead-letter routing
  key, else its own keys), dead-letter cycles are skipped per target queue as the
  at-most-once path does, and each target queue is published to with a confirm
  (`_Confirm`: a quorum queue answers once its log applied the message, a classic
  queue once its message-store batch is fsynced, a refusal — reject-publish overflow,
  a queue that is gone — is a nack);
- what is not confirmed is retried, as rabbit_fifo_dlx_worker does, every
  `dead_letter_worker_publisher_confirm_timeout` (RabbitMQ's setting and default,
  180 s): a dead-letter exchange that does not exist, no route to any queue (the
  guide's "equivalent to the mandatory message property"), routes that are all
  dead-letter cycles, a nack (reject-publish overflow) or no answer (a target whose
  leader is down). A retry routes the message again and publishes it to the routed
  queues that have not confirmed it; if every queue it still routes to confirmed,
  it is settled. So messages wait in the source queue (counted as messages_dlx)
  while a target is missing or refuses, as the guide's caveats say, and a target may
  get a duplicate ("a possibility of duplicates appearing at the DLX target queue(s)");
- "under no circumstances" is a message dropped (rabbit_fifo_dlx_worker's words):
  a cycle is skipped per target, and a message whose every route is a cycle waits.

Invariants: a DlxSettle names only messages that at least one target queue confirmed
and that no queue they still route to left unconfirmed; a confirm from an earlier
attempt counts (the target has the message), a refusal only waits for the retry; a
stopped worker's answers are ignored; nothing is published while the node replays
its log or follows.

Not here: which messages die and holding them (broker/fifo), the headers
(queues/dead_letter.py), when a worker starts and stops (queues/quorum/groups.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ...fifo.commands import DlxDelivery, DlxSettle
from .. import dead_letter
from ..actions import carry_out
from ..base import Confirm
from ..dead_letter import Unrouted
from .queue import MessageGone

if TYPE_CHECKING:  # pragma: no cover
    from .queue import QuorumQueue
    from .groups import QuorumGroups
    from .host import QuorumHost

log = logging.getLogger("quorumqueue.broker")



@dataclass(slots=True)
class _Letter:
    """One dead letter checked out to this worker; its message is read from the log
    once and kept (bounded by the prefetch, as RabbitMQ keeps the bodies in memory)."""
    msg_id: int
    index: int                # raft index of the message in the source queue
    reason: str
    died_ms: int              # x-death's time
    # exchange, key, header, body, BCC keys
    message: tuple[str, str, bytes, bytes, tuple[str, ...]] | None = None
    unconfirmed: set[str] = field(default_factory=set)  # targets of the current attempt
    confirmed: set[str] = field(default_factory=set)    # targets that confirmed it
    attempt: int = 0
    sent_ms: int = 0          # time of the last attempt (retried a timeout after it)
    warned: set[str] = field(default_factory=set)


class _Confirm(Confirm):
    """A publisher confirm with no channel: `answer(target, ok)` of the worker."""

    __slots__ = ("worker", "letter", "attempt", "target")

    def __init__(self, worker: "DeadLetterWorker", letter: _Letter, target: str) -> None:
        super().__init__(None, 0, None)
        self.worker, self.letter, self.attempt, self.target = worker, letter, letter.attempt, target

    def _answer(self, accepted: bool) -> None:
        self.outstanding -= 1
        if not accepted:
            self.ok = False
        if not self.outstanding:
            self.settled()

    def settled(self) -> None:
        """Every queue answered (or none had to): wait for the message-store fsync of a
        classic target, then tell the worker."""
        if self.ok and self.worker.host.after_sync(self.batch_id, _AfterSync(self)):
            return
        self.worker.answer(self.letter, self.attempt, self.target, self.ok)


class _AfterSync:
    """Waits with the node (QuorumHost.after_sync): a classic target's confirm once
    its batch is fsynced."""

    __slots__ = ("confirm",)

    def __init__(self, confirm: _Confirm) -> None:
        self.confirm = confirm

    def release_confirms(self, synced_batch_id: int) -> bool:
        if self.confirm.batch_id > synced_batch_id:
            return False
        confirm = self.confirm
        confirm.worker.answer(confirm.letter, confirm.attempt, confirm.target, True)
        return True


class DeadLetterWorker:
    def __init__(self, groups: "QuorumGroups", queue: "QuorumQueue", identity: str,
                 prefetch: int, timeout_ms: int) -> None:
        self.groups = groups
        self.queue = queue
        self.identity = identity
        self.prefetch = prefetch        # dead_letter_worker_consumer_prefetch
        self.timeout_ms = timeout_ms    # dead_letter_worker_publisher_confirm_timeout
        self.letters: dict[int, _Letter] = {}
        self.settled: list[int] = []    # confirmed by every target, to settle (`flush`)
        self.checkout_proposed = False
        self.stopped = False

    @property
    def host(self) -> "QuorumHost":
        return self.groups.host

    def stop(self) -> None:
        """No longer the leader's worker: forget everything (the next one resends)."""
        self.stopped = True
        self.letters.clear()
        self.settled = []

    # ------------------------------------------------------------ messages

    def take(self, deliveries: tuple[DlxDelivery, ...]) -> None:
        """Dead letters the machine checked out to this worker: publish each."""
        now = self.groups.clock_ms
        for delivery in deliveries:
            letter = _Letter(delivery.msg_id, delivery.raft_index, delivery.reason,
                             self.queue.last_time_ms or now)
            self.letters[delivery.msg_id] = letter
            self._send(letter, now)

    def _send(self, letter: _Letter, now: int) -> None:
        """One attempt: route the message again and publish it to the routed queues
        that have not confirmed it (see the module header)."""
        queue = self.queue
        letter.attempt += 1
        letter.unconfirmed = set()
        letter.sent_ms = now
        try:
            if letter.message is None:
                letter.message = self.groups.read_dead_letter(queue, letter.index)
        except MessageGone as error:
            # a held message's entry is live: this is a bug; keep the message (never
            # drop) and say so once
            self._warn(letter, "read", "it cannot be read: %s", error)
            return
        source, routing_key, header, body, blind_keys = letter.message
        routed = self.host.route_dead_letter(queue, source, routing_key, header, body,
                                             letter.reason, letter.died_ms, blind_keys)
        if isinstance(routed, Unrouted):
            if routed.why == "exchange":
                self._warn(letter, "exchange", "its dead-letter exchange '%s' does not exist",
                           routed.exchange)
            else:  # its header was accepted at publish: a bug, kept as above
                self._warn(letter, "read", "it cannot be read: %s", routed.error)
            return
        cycles = {name for name in routed.queues
                  if dead_letter.is_cycle(name, letter.reason, routed.deaths)}
        if cycles:
            self._warn(letter, "cycle", "dead-letter cycle to %s: not delivered there",
                       ", ".join(sorted(cycles)))
        sending = sorted(name for name in routed.queues
                         if name not in cycles and name not in letter.confirmed)
        if not sending:
            if letter.confirmed:  # every queue it still routes to confirmed it
                self._settle(letter)
            else:
                self._warn(letter, "route", "no queue is bound to dead-letter exchange '%s' "
                           "with routing keys %s", routed.exchange, routed.keys)
            return
        letter.unconfirmed = set(sending)
        for name in sending:
            confirm = _Confirm(self, letter, name)
            # what a classic target returns (a quorum one answers through its log)
            carry_out(routed.queues[name].publish(routed.message, None, confirm))
            if not confirm.outstanding:  # answered at once (a classic queue, a refusal)
                confirm.settled()

    def answer(self, letter: _Letter, attempt: int, target: str, ok: bool) -> None:
        """A target queue answered the publish of `letter` in `attempt`. A refusal is
        left for the retry (rabbit_fifo_dlx_worker ignores rejections too)."""
        if self.stopped or self.letters.get(letter.msg_id) is not letter:
            return  # settled already, or a stopped worker's: the current one decides
        if not ok:
            self._warn(letter, "refused", "target queue '%s' refused it", target)
            return
        letter.confirmed.add(target)
        if attempt == letter.attempt:
            letter.unconfirmed.discard(target)
            if not letter.unconfirmed:
                self._settle(letter)

    def _settle(self, letter: _Letter) -> None:
        """Settled once the current burst of answers is in (`flush`): one DlxSettle
        for all of them."""
        self.letters.pop(letter.msg_id, None)
        self.settled.append(letter.msg_id)

    def flush(self) -> None:
        """Propose the DlxSettle of what was confirmed since the last flush (the node
        calls this after each round of its groups, and on every tick)."""
        if self.settled and not self.stopped:
            msg_ids, self.settled = tuple(self.settled), []
            self.queue.propose(DlxSettle(self.identity, msg_ids), 0)

    def _warn(self, letter: _Letter, kind: str, text: str, *args) -> None:
        """Log a failure once per message and kind (retries repeat it silently)."""
        if kind in letter.warned:
            return
        letter.warned.add(kind)
        log.warning("quorum queue '%s' in vhost '%s': dead letter %s (%s) kept, to be sent "
                    "again in %d ms: " + text, self.queue.name, self.queue.vhost, letter.index,
                    letter.reason, self.timeout_ms, *args)

    # ------------------------------------------------------------ time

    def tick(self, now: int) -> None:
        """Retry every message whose last attempt is a timeout old and not settled."""
        for letter in list(self.letters.values()):
            if now - letter.sent_ms >= self.timeout_ms and not self.stopped:
                self._send(letter, now)
        self.flush()
