"""The dead-letter worker of at-least-once dead lettering (RabbitMQ's rabbit_fifo_dlx_worker).

Responsibilities: for one quorum queue this node leads, publish the dead letters the
machine checks out to the worker (DlxDeliver effects, broker/fifo/dlx.py) through the
queue's dead-letter exchange, with x-death headers (queues/dead_letter.py) and
publisher-confirm semantics, and settle each one in the source queue (a DlxSettle
command through its log) only once every target queue confirmed it.

How it works, as the quorum queues guide ("Dead Lettering") describes it:
- one worker per queue, "co-located on the quorum queue leader node"; its identity is
  the leader's node, run (boot id) and term, so a new leader (or the same node after a
  restart or in a new term) registers a new worker (DlxCheckout), and the machine
  hands it what the previous one had not settled: "the new leader's worker resends
  what is unsettled" — duplicates at the target are possible, loss is not;
- it takes at most `dead_letter_worker_consumer_prefetch` messages (default 32) at a
  time: the machine checks out no more until some are settled, which bounds the
  bodies this worker reads and holds;
- each message is routed through the dead-letter exchange (its dead-letter routing
  key, else its own keys), dead-letter cycles are skipped per target queue as the
  at-most-once path does, and each target queue is published to with a confirm
  (`_Confirm`: a quorum queue answers once its log applied the message, a classic
  queue once its message-store batch is fsynced, a refusal — reject-publish overflow,
  a queue that is gone — is a nack);
- what is not confirmed is retried: a dead-letter exchange that does not exist, no
  route to any queue (the guide's "equivalent to the mandatory message property"), a
  nack, or no answer within CONFIRM_TIMEOUT_MS (a target whose leader is down): the
  message is sent again, to the targets that did not confirm, RETRY_MS later, on the
  node's tick; so messages wait in the source queue (counted as messages_dlx) while a
  target is missing or refuses, as the guide's caveats say;
- a message whose every route is a dead-letter cycle is settled without a copy (the
  at-most-once path drops it too).

Invariants: a DlxSettle names only messages every target of the current attempt
confirmed; answers from an earlier attempt or a stopped worker are ignored; the
worker publishes nothing while its node replays its log or follows.

Not here: which messages die and holding them (broker/fifo), the headers
(queues/dead_letter.py), when a worker starts and stops (node/quorum.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..amqp import codec
from ..amqp.errors import AMQPError
from ..fifo.commands import DlxDelivery, DlxSettle
from ..queues import dead_letter
from ..queues.base import Confirm
from ..queues.classic import Message
from ..queues.quorum import MessageGone
from ..queues.settings import dead_letter_target

if TYPE_CHECKING:  # pragma: no cover
    from ..queues.quorum import QuorumQueue
    from .quorum import QuorumGroups

log = logging.getLogger("quorumqueue.broker")

RETRY_MS = 1_000              # a failed attempt is retried this much later (on a tick)
CONFIRM_TIMEOUT_MS = 30_000   # an attempt with no answer from a target is sent again


@dataclass(slots=True)
class _Letter:
    """One dead letter checked out to this worker."""
    msg_id: int
    index: int                # raft index of the message in the source queue
    reason: str
    # target queues that have not confirmed (None: not routed yet)
    unconfirmed: set[str] | None = None
    attempt: int = 0
    waiting: int = 0          # answers outstanding in the current attempt
    failed: bool = False      # a target refused in the current attempt
    due_ms: int = 0           # retry at or after this time (0: not scheduled)
    sent_ms: int = 0
    warned: set[str] = field(default_factory=set)


class _Confirm(Confirm):
    """A publisher confirm with no channel: `answer(target, ok)` of the worker."""

    __slots__ = ("worker", "letter", "attempt", "target")

    def __init__(self, worker: "DeadLetterWorker", letter: _Letter, target: str) -> None:
        super().__init__(None, 0)
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
        node = self.worker.node
        if self.ok and self.batch_id > node.synced_batch_id:
            node.awaiting_sync.add(_AfterSync(self))
            return
        self.worker.answer(self.letter, self.attempt, self.target, self.ok)


class _AfterSync:
    """In Node.awaiting_sync: a classic target's confirm once its batch is fsynced."""

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
                 prefetch: int) -> None:
        self.groups = groups
        self.queue = queue
        self.identity = identity
        self.prefetch = prefetch
        self.letters: dict[int, _Letter] = {}
        self.checkout_proposed = False
        self.stopped = False

    @property
    def node(self):
        return self.groups.cluster.node

    def stop(self) -> None:
        """No longer the leader's worker: forget everything (the next one resends)."""
        self.stopped = True
        self.letters.clear()

    # ------------------------------------------------------------ messages

    def take(self, deliveries: tuple[DlxDelivery, ...]) -> None:
        """Dead letters the machine checked out to this worker: publish each."""
        now = self.node.clock_ms
        for delivery in deliveries:
            letter = _Letter(delivery.msg_id, delivery.raft_index, delivery.reason)
            self.letters[delivery.msg_id] = letter
            self._send(letter, now)

    def _send(self, letter: _Letter, now: int) -> None:
        queue, node = self.queue, self.node
        letter.attempt += 1
        letter.failed, letter.waiting, letter.due_ms, letter.sent_ms = False, 0, 0, now
        target = dead_letter_target(queue.arguments,
                                    node.policy_for(queue.vhost, queue.type_name, queue.name))
        vhost = node.vhosts.get(queue.vhost)
        exchange = vhost.exchanges.get(target[0]) if target and vhost is not None else None
        if exchange is None:
            self._warn(letter, "exchange", "dead-letter exchange '%s' does not exist",
                       target[0] if target else None)
            self._retry(letter, now)
            return
        exchange_name, dead_letter_key = target
        try:
            source, routing_key, header, body = self.groups.read_message(queue, letter.index)
            keys = dead_letter.routing_keys(routing_key, header, dead_letter_key)
            header, deaths = dead_letter.dead_lettered(header, source, routing_key, queue.name,
                                                       letter.reason, queue.last_time_ms)
        except (MessageGone, AMQPError, ValueError) as error:
            # cannot happen for a held message (its entry is live); settle rather than
            # retry forever, and say so
            log.error("quorum queue '%s' in vhost '%s': dead letter %s (%s) unreadable, "
                      "settled without a copy: %s", queue.name, queue.vhost, letter.index,
                      letter.reason, error)
            self._settle([letter.msg_id])
            return
        properties = codec.decode_properties(header)[1]
        routed: dict[str, object] = {}
        for key in keys:
            for found in vhost.route(exchange, key, lambda: properties.decoded().get("headers")):
                routed.setdefault(found.name, found)
        cycles = {name for name in routed if dead_letter.is_cycle(name, letter.reason, deaths)}
        if routed and cycles == set(routed):
            log.warning("quorum queue '%s' in vhost '%s': dead-letter cycle to %s (%s): "
                        "message settled without a copy", queue.name, queue.vhost,
                        ", ".join(sorted(cycles)), letter.reason)
            self._settle([letter.msg_id])
            return
        targets = {name: found for name, found in routed.items() if name not in cycles}
        if letter.unconfirmed is None or not letter.unconfirmed & set(targets):
            letter.unconfirmed = set(targets)  # first attempt, or the old targets are gone
        sending = [(name, targets[name]) for name in sorted(letter.unconfirmed & set(targets))]
        if not sending:
            self._warn(letter, "route", "no queue bound to dead-letter exchange '%s' for "
                       "routing keys %s", exchange_name, keys)
            self._retry(letter, now)
            return
        letter.waiting = len(sending)
        message = Message(exchange_name, keys[0], properties, body)
        for name, found in sending:
            confirm = _Confirm(self, letter, name)
            found.publish(message, None, confirm)
            if not confirm.outstanding:  # answered at once (a classic queue, a refusal)
                confirm.settled()

    def answer(self, letter: _Letter, attempt: int, target: str, ok: bool) -> None:
        """A target queue answered the publish of `letter` in `attempt`."""
        if self.stopped or attempt != letter.attempt or self.letters.get(letter.msg_id) is not letter:
            return  # an earlier attempt's, or a stopped worker's: the current one decides
        letter.waiting -= 1
        if ok:
            letter.unconfirmed.discard(target)
        else:
            letter.failed = True
            self._warn(letter, "refused", "target queue '%s' refused the dead letter", target)
        if letter.waiting:
            return
        if not letter.unconfirmed:
            self._settle([letter.msg_id])
        else:  # a refusal, or a target of an earlier attempt that no longer routes
            self._retry(letter, self.node.clock_ms)

    def _settle(self, msg_ids: list[int]) -> None:
        for msg_id in msg_ids:
            self.letters.pop(msg_id, None)
        self.queue.propose(DlxSettle(self.identity, tuple(msg_ids)), 0)

    def _retry(self, letter: _Letter, now: int) -> None:
        letter.due_ms = now + RETRY_MS

    def _warn(self, letter: _Letter, kind: str, text: str, *args) -> None:
        """Log a failure once per message and kind (retries repeat it silently)."""
        if kind in letter.warned:
            return
        letter.warned.add(kind)
        log.warning("quorum queue '%s' in vhost '%s': dead letter %s (%s) kept for a retry: "
                    + text, self.queue.name, self.queue.vhost, letter.index, letter.reason,
                    *args)

    # ------------------------------------------------------------ time

    def tick(self, now: int) -> None:
        """Retry what is due: failed attempts after RETRY_MS, unanswered ones after
        CONFIRM_TIMEOUT_MS."""
        for letter in list(self.letters.values()):
            if letter.due_ms and letter.due_ms <= now:
                self._send(letter, now)
            elif letter.waiting and now - letter.sent_ms >= CONFIRM_TIMEOUT_MS:
                self._send(letter, now)
