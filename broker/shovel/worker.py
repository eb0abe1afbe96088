"""One dynamic shovel at work: consume from the source, publish to the destination,
acknowledge at the source (the AMQP 0-9-1 client is aiormq, on the broker's loop).

How it works: `Shovel.run` connects to a source URI and a destination URI (the next
of each list on every attempt), declares the source queue (or binds a server-named
exclusive queue to the source exchange) and the destination queue when named (a
passive declare first: an existing queue of any type and arguments is used as it
is; an absent one is declared durable, as RabbitMQ's shovel does), sets
src-prefetch-count and consumes. Each delivery is published to the destination
(dest-queue through the default exchange; dest-exchange with dest-exchange-key or
the message's routing key; else the message's own exchange and routing key) with
its properties, and acknowledged at the source:

- on-confirm: after the destination confirmed it (basic.ack on a confirm channel);
  a nack from the destination fails the attempt;
- on-publish: once it was written to the destination's socket;
- no-ack: consumed without acknowledgements (a failure loses what was in flight).

Any failure (a connection or channel closed, a refused declare, a nack) ends the
attempt: nothing new is published, what is on its way is settled while the
destination is up (up to SETTLE_TIMEOUT: its confirm, then the source ack, which a
source still there gets before our close; an ack to a source gone fails at once,
`_ack`, so a lost source costs no wait), both connections are closed, the state
is `terminated` with the reason, and after reconnect-delay seconds the shovel
starts again. What the source
delivered and did not get acknowledged is requeued by the source when the
connection goes, and redelivered to the next attempt.

Exactly once across a source loss (on-confirm): an ack has no reply in AMQP 0-9-1,
so when the source connection or channel goes, the acks sent since the last
basic.qos round trip on the source channel (one every SYNC_EVERY acks; its qos-ok
comes after every ack sent before it) may not have landed, and the source requeues
those messages although the destination holds them. Once the attempt has settled
what it had published (above), `remembered` takes the digest (sha256 of the
content header and body as the source sent them, less an x-delivery-count header)
of every message the destination confirmed whose ack
is not known to have landed: a multiset, identical messages counted one for one.
The next attempt acknowledges a redelivered message (redelivered flag set) that
matches an entry, without publishing it, and takes the entry out; the first
delivery without the flag clears what is left (the source requeues to the original
position, so requeued messages come back first; those not back had their ack
land). Bounded by the acks between two round trips plus the prefetch. Not covered,
so a message may still arrive twice: a publish the destination had not confirmed
when its connection went (or within SETTLE_TIMEOUT of the source's going); a
shovel stopped, restarted on a change or moved to another node (the memory lives
in this object) when its in-flight publishes are not confirmed within
STOP_SETTLE_TIMEOUT; another consumer of the source queue taking a requeued
message. A redelivery matching an entry whose ack had in fact landed (only an
identical copy of that message, same properties and body) is acknowledged without
being published: of identical copies the destination may get fewer.
A stop (cancel) publishes nothing new, waits up to STOP_SETTLE_TIMEOUT for the
confirms and acks of what is on its way, then closes: the source has every ack
before the close.

src-delete-after: "queue-length" moves the number of messages the source queue
held when this attempt started, an integer that many messages over all attempts of
this Shovel (a shovel started on another node counts from zero, as RabbitMQ's
worker does; a redelivery acknowledged without publishing it again, below, is not
counted again);
deliveries past the count are neither published nor acknowledged (the source
requeues them when the shovel closes). Then `finished` is set and the shovel
stops; its owner clears the parameter.

Invariant (on-confirm): a message is acknowledged at the source only after the
destination confirmed it (in this attempt, or, for a redelivery matched in
`remembered`, a message with the same properties and body in an earlier one).

Properties travel unchanged, as in RabbitMQ: aiormq gives a message published
without a message-id one of its own (it tracks returns by it), so a message that
had none is published with `NO_MESSAGE_ID`, which aiormq takes as set and pamqp
does not encode (it leaves out empty properties).
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import logging
import time
from collections import Counter
from urllib.parse import quote, urlsplit, urlunsplit

import aiormq
from pamqp import commands as spec

from .parameters import Definition

log = logging.getLogger("quorumqueue.shovel")

CONNECT_TIMEOUT = 30.0  # seconds for a connection and its channels to open
CLOSE_TIMEOUT = 5.0
SETTLE_TIMEOUT = 30.0  # seconds for the destination's confirms once an attempt fails
STOP_SETTLE_TIMEOUT = 10.0  # seconds a stopped shovel waits for what is on its way
SYNC_EVERY = 200  # source acks between two basic.qos round trips showing they landed

STARTING, RUNNING, TERMINATED = "starting", "running", "terminated"


def redact(uri: str) -> str:
    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


class _Finished(Exception):
    pass


class _Unset(str):
    """An empty message-id that counts as set: aiormq adds none, pamqp writes none."""

    __slots__ = ()

    def __bool__(self) -> bool:
        return True


NO_MESSAGE_ID = _Unset("")


class Shovel:
    """A dynamic shovel `name` of `vhost`; `run()` until cancelled or finished."""

    def __init__(self, vhost: str, name: str, definition: Definition, value: dict,
                 local_uri, on_finished, node_name: str) -> None:
        self.vhost = vhost
        self.name = name
        self.definition = definition
        self.value = value  # the parameter as set (a change restarts the shovel)
        self.local_uri = local_uri  # vhost -> "amqp://user:pass@host:port/vhost"
        self.on_finished = on_finished  # called once src-delete-after is reached
        self.node_name = node_name
        self.state = STARTING
        self.reason: str | None = None
        self.last_changed = time.time()
        self.moved = 0  # messages the destination took (confirmed, under on-confirm)
        # on-confirm, across a source loss: digests of messages at the destination
        # whose source ack may not have landed (a multiset; see _source_lost)
        self.remembered: Counter = Counter()
        self.recognised = 0  # redeliveries acknowledged without publishing them again
        self.attempt = 0
        self.finished = False
        self.task: asyncio.Task | None = None
        self.source_uri = ""
        self.destination_uri = ""

    # --------------------------------------------------------------- status

    def _set(self, state: str, reason: str | None = None) -> None:
        self.state, self.reason, self.last_changed = state, reason, time.time()

    def status(self) -> dict:
        d = self.definition
        return {"name": self.name, "vhost": self.vhost, "type": "dynamic",
                "node": self.node_name, "state": self.state,
                "source_protocol": "amqp091", "destination_protocol": "amqp091",
                "source": redact(self.source_uri or d.src_uris[0]),
                "destination": redact(self.destination_uri or d.dest_uris[0]),
                "src_queue": d.src_queue, "src_exchange": d.src_exchange,
                "dest_queue": d.dest_queue, "dest_exchange": d.dest_exchange,
                "termination_reason": self.reason or "",
                "messages_shovelled": self.moved,
                "last_changed": time.strftime("%Y-%m-%d %H:%M:%S",
                                              time.gmtime(self.last_changed))}

    # --------------------------------------------------------------- running

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self.run())

    async def stop(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()
            try:
                await self.task
            except (asyncio.CancelledError, Exception):
                pass

    async def run(self) -> None:
        while True:
            self._set(STARTING)
            try:
                await self._attempt()
            except asyncio.CancelledError:
                raise
            except _Finished:
                self.finished = True
                self._set(TERMINATED, "finished: src-delete-after reached")
                log.info("shovel '%s' in vhost '%s': moved %d messages, src-delete-after "
                         "reached", self.name, self.vhost, self.moved)
                self.on_finished(self.vhost, self.name)
                return
            except Exception as error:  # noqa: BLE001 - every failure restarts it
                reason = f"{type(error).__name__}: {error}" if str(error) else repr(error)
                self._set(TERMINATED, reason)
                log.warning("shovel '%s' in vhost '%s' terminated: %s; restarting in %gs",
                            self.name, self.vhost, reason, self.definition.reconnect_delay)
            await asyncio.sleep(self.definition.reconnect_delay)

    def _uri(self, uris: tuple[str, ...]) -> str:
        uri = uris[self.attempt % len(uris)]
        if not urlsplit(uri).netloc:  # "amqp://": this node, in the shovel's vhost
            return self.local_uri(self.vhost)
        return uri

    async def _connect(self, uri: str):
        return await asyncio.wait_for(aiormq.connect(uri), CONNECT_TIMEOUT)

    async def _attempt(self) -> None:
        d = self.definition
        self.attempt += 1
        self.source_uri = self._uri(d.src_uris)
        self.destination_uri = self._uri(d.dest_uris)
        connections = []
        try:
            source = await self._connect(self.source_uri)
            connections.append(source)
            destination = await self._connect(self.destination_uri)
            connections.append(destination)
            confirms = d.ack_mode == "on-confirm"
            dest = await destination.channel(publisher_confirms=confirms)
            if d.dest_queue is not None:
                dest = await _declare(destination, dest, d.dest_queue, confirms)
            src = await source.channel(publisher_confirms=False)
            if d.src_queue is not None:
                src, count = await _declare(source, src, d.src_queue, False, count=True)
                queue = d.src_queue
            else:
                declared = await src.queue_declare("", exclusive=True, auto_delete=True)
                queue = declared.queue
                await src.queue_bind(queue, d.src_exchange, routing_key=d.src_exchange_key)
                count = 0
            if d.delete_after == "queue-length":
                remaining = count
            elif isinstance(d.delete_after, int):
                remaining = d.delete_after - self.moved
            else:
                remaining = None
            if remaining is not None and remaining <= 0:
                raise _Finished()
            await self._transfer(src, dest, queue, remaining, source, destination)
        finally:
            for connection in reversed(connections):
                try:
                    await asyncio.wait_for(connection.close(), CLOSE_TIMEOUT)
                except (asyncio.CancelledError, Exception):  # noqa: BLE001
                    pass

    async def _transfer(self, src, dest, queue: str, remaining: int | None,
                        source, destination) -> None:
        d = self.definition
        loop = asyncio.get_running_loop()
        outcome: asyncio.Future = loop.create_future()
        confirms = d.ack_mode == "on-confirm"
        taken = 0
        done = 0
        if d.dest_queue is not None:
            route = ("", d.dest_queue)
        elif d.dest_exchange is not None:
            route = (d.dest_exchange, d.dest_exchange_key)
        else:
            route = (None, None)
        # on-confirm: digests of the messages the destination confirmed whose source
        # ack is not known to have landed, in batches; a basic.qos round trip on the
        # source channel (answered after every ack sent before it) covers the batches
        # before it, which are then forgotten
        unsure: list[_Batch] = [_Batch()]
        in_batch = 0
        syncing: asyncio.Task | None = None
        in_flight: set[asyncio.Task] = set()  # publishes not yet confirmed and acked
        stopping = False  # no new publish: what is delivered now goes back to the source

        def fail(error: BaseException) -> None:
            if not outcome.done():
                outcome.set_exception(error)

        def count_done(again: bool = False) -> None:
            """One message more done (acknowledged at the source; counted in `moved`
            when it reached the destination); `again`: a message the last attempt
            moved, whose redelivery was acknowledged without publishing it."""
            nonlocal done
            if again and isinstance(d.delete_after, int):
                return  # the count is over all attempts: counted once, when it moved
            done += 1
            if remaining is not None and done >= remaining and not outcome.done():
                outcome.set_exception(_Finished())

        async def sync() -> None:
            nonlocal syncing
            covered = len(unsure)
            unsure.append(_Batch())
            try:
                # the frames of acks under way may still be waiting for room in the
                # connection's write queue: the qos goes after every one of them
                while any(batch.sending for batch in unsure[:covered]):
                    await asyncio.sleep(0.01)
                await src.basic_qos(prefetch_count=d.prefetch)
            except Exception:  # noqa: BLE001 - the source went: the batches stay unsure
                return
            finally:
                syncing = None
            del unsure[:covered]

        async def acknowledge(message, digest: bytes | None) -> None:
            """Ack at the source; on-confirm: `digest`'s message is at the destination
            and its ack not known to have landed until a sync after it."""
            nonlocal in_batch, syncing
            if digest is None:
                await _ack(source, src, message.delivery.delivery_tag)
                return
            batch = unsure[-1]
            batch.digests[digest] += 1
            batch.sending += 1
            try:
                await _ack(source, src, message.delivery.delivery_tag)
            finally:
                batch.sending -= 1
            in_batch += 1
            if in_batch >= SYNC_EVERY and syncing is None:
                in_batch = 0
                syncing = loop.create_task(sync())

        async def deliver(message, digest: bytes | None) -> None:
            # a task of its own, not the source channel's: it outlives a source that
            # goes, so the destination's confirm still tells where the message is
            try:
                properties = message.header.properties
                if properties.message_id is None:
                    properties.message_id = NO_MESSAGE_ID
                if d.forward_headers:
                    properties.headers = self._forward_headers(properties.headers, queue)
                exchange = message.delivery.exchange if route[0] is None else route[0]
                routing_key = route[1] if route[1] is not None \
                    else message.delivery.routing_key
                # on-confirm waits for the confirm, not for the socket's drain
                confirmation = await dest.basic_publish(
                    message.body, exchange=exchange, routing_key=routing_key,
                    properties=properties, wait=not confirms)
                if confirms:
                    if not isinstance(confirmation, spec.Basic.Ack):
                        raise RuntimeError(f"the destination did not confirm a message: "
                                           f"{type(confirmation).__name__}")
                # moved once at the destination, whether or not its ack then reaches a
                # source still there (on-confirm: if not, it is remembered, and its
                # redelivery is acknowledged without counting it again)
                self.moved += 1
                if d.ack_mode != "no-ack":
                    await acknowledge(message, digest)
                count_done()
            except Exception as error:  # noqa: BLE001 - ends the attempt
                fail(error)

        async def forward(message) -> None:
            nonlocal taken
            if stopping:
                return  # requeued by the source when we close
            digest = _digest(message) if confirms else None
            redelivered = bool(getattr(message.delivery, "redelivered", False))
            if self.remembered and not redelivered:
                # the source requeued what it had delivered to the last attempt in its
                # place, at the head: past it, nothing of that attempt comes back
                log.info("shovel '%s' in vhost '%s': %d messages of the last attempt "
                         "did not come back (their acks had landed); forgotten",
                         self.name, self.vhost, sum(self.remembered.values()))
                self.remembered.clear()
            recognised = redelivered and self.remembered.get(digest, 0) > 0
            # an integer count is over all attempts: a recognised message was counted
            # when the last attempt moved it; queue-length counts what the queue held
            # at this start, the recognised messages among them
            counted = not (recognised and isinstance(d.delete_after, int))
            if remaining is not None and counted:
                if taken >= remaining:
                    return  # past the count: requeued by the source when we close
                taken += 1
            if recognised:
                # published and confirmed by the last attempt, its ack lost with the
                # source connection: acknowledged here, not published again
                self.remembered[digest] -= 1
                if not self.remembered[digest]:
                    del self.remembered[digest]
                self.recognised += 1
                try:
                    await acknowledge(message, digest)
                except Exception as error:  # noqa: BLE001 - ends the attempt
                    fail(error)
                    return
                count_done(again=True)
                return
            task = loop.create_task(deliver(message, digest))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)

        await src.basic_qos(prefetch_count=d.prefetch)
        await src.basic_consume(queue, forward, no_ack=d.ack_mode == "no-ack")
        self._set(RUNNING)
        log.info("shovel '%s' in vhost '%s' running: %s/%s -> %s/%s", self.name, self.vhost,
                 redact(self.source_uri), d.source, redact(self.destination_uri),
                 d.destination)
        watched = [outcome, source.closing, destination.closing, src.closing, dest.closing]
        try:
            try:
                finished, _ = await asyncio.wait(watched,
                                                 return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:
                # stopped (the parameter changed or went, the node stopped leading):
                # nothing new is published, what is on its way is confirmed and
                # acknowledged, then the connections close (the source has every ack
                # before the close); what it delivered past that goes back to it
                stopping = True
                if in_flight:
                    await asyncio.wait(set(in_flight), timeout=STOP_SETTLE_TIMEOUT)
                raise
            # the attempt fails: nothing new is published; what is on its way is
            # settled while the destination is up (its confirm, then the ack, which
            # the source gets before our close if it is still there)
            stopping = True
            if in_flight and not (destination.is_closed or dest.is_closed):
                await asyncio.wait(set(in_flight), timeout=SETTLE_TIMEOUT)
            if confirms and (source.is_closed or src.is_closed):
                self._source_lost(in_flight, unsure)
        finally:
            stopping = True
            if not outcome.done():
                outcome.cancel()
            for task in [*in_flight, *([syncing] if syncing is not None else [])]:
                task.cancel()
        if outcome in finished and not outcome.cancelled():
            raise outcome.exception() or RuntimeError("ended")
        for future in finished:
            error = None if future.cancelled() else future.exception()
            raise RuntimeError(f"connection or channel closed: {error!r}"
                               if error is not None else "connection or channel closed")

    def _source_lost(self, in_flight: set, unsure: list) -> None:
        """The source connection or channel went (on-confirm): its acks sent since the
        last basic.qos round trip may not have landed, and it requeues those messages
        too. Once what was on its way is settled (_transfer waited for the
        destination's confirms), remember every message the destination holds whose
        source ack is not known to have landed: the next attempt acknowledges their
        redeliveries without publishing them again."""
        if in_flight:  # the destination went too or did not answer: unknown
            log.warning("shovel '%s' in vhost '%s': %d messages published without the "
                        "destination's confirm when the source went; they may arrive "
                        "twice", self.name, self.vhost, len(in_flight))
        for batch in unsure:
            self.remembered.update(batch.digests)
        if self.remembered:
            log.warning("shovel '%s' in vhost '%s': the source went with %d messages at "
                        "the destination whose acks may not have landed; their "
                        "redeliveries will be acknowledged without publishing them again",
                        self.name, self.vhost, sum(self.remembered.values()))

    def _forward_headers(self, headers, queue: str) -> dict:
        d = self.definition
        record = {"shovelled-by": self.node_name, "shovel-type": "dynamic",
                  "shovel-name": self.name, "shovel-vhost": self.vhost,
                  "src-uri": redact(self.source_uri), "dest-uri": redact(self.destination_uri)}
        if d.src_queue is not None:
            record["src-queue"] = queue
        else:
            record["src-exchange"] = d.src_exchange
            record["src-exchange-key"] = d.src_exchange_key
        if d.dest_queue is not None:
            record["dest-queue"] = d.dest_queue
        elif d.dest_exchange is not None:
            record["dest-exchange"] = d.dest_exchange
            if d.dest_exchange_key is not None:
                record["dest-exchange-key"] = d.dest_exchange_key
        headers = dict(headers or {})
        previous = headers.get("x-shovelled")
        headers["x-shovelled"] = [record] + (list(previous) if isinstance(previous, list)
                                             else [])
        return headers


class _Batch:
    """Digests of messages acked at the source since a sync; `sending`: their ack
    frames not yet in the connection's write queue."""

    __slots__ = ("digests", "sending")

    def __init__(self) -> None:
        self.digests: Counter = Counter()
        self.sending = 0


def _digest(message) -> bytes:
    """What identifies a message across its redelivery: its properties and body as
    the source sent them (the content header, before any change of ours), less the
    `x-delivery-count` header a quorum queue adds or raises on a redelivery."""
    header = message.header
    headers = header.properties.headers
    if headers and "x-delivery-count" in headers:
        header = copy.copy(header)
        header.properties = copy.copy(header.properties)
        header.properties.headers = {k: v for k, v in headers.items()
                                     if k != "x-delivery-count"} or None
    return hashlib.sha256(header.marshal() + message.body).digest()


async def _ack(connection, channel, delivery_tag: int) -> None:
    """basic.ack `delivery_tag` on `channel` (no reply awaited), or raise when the
    connection or channel goes first: aiormq puts the frame into the connection's
    bounded write queue, which a connection gone no longer empties, so a put made
    while it was full (a burst of acks) would otherwise wait for ever."""
    if connection.is_closed or channel.is_closed:
        raise RuntimeError("the source went: the ack cannot be sent")
    if not channel.write_queue.full():  # the put does not wait
        await channel.basic_ack(delivery_tag, wait=False)
        return
    sending = asyncio.ensure_future(channel.basic_ack(delivery_tag, wait=False))
    gone = [connection.closing, channel.closing]  # observers of the close
    try:
        await asyncio.wait([sending, *gone], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for future in gone:
            future.cancel()  # the observer only, not the connection
        if not sending.done():
            sending.cancel()  # the put that would wait for ever
    if not sending.done() or sending.cancelled():
        raise RuntimeError("the source went: the ack cannot be sent")
    sending.result()


async def _declare(connection, channel, queue: str, confirms: bool, count: bool = False):
    """Declare `queue` passively; when it does not exist (404 closes the channel),
    durably on a new channel. Returns the channel (and the message count)."""
    try:
        declared = await channel.queue_declare(queue, passive=True)
    except aiormq.exceptions.ChannelNotFoundEntity:
        channel = await connection.channel(publisher_confirms=confirms)
        declared = await channel.queue_declare(queue, durable=True)
    return (channel, declared.message_count or 0) if count else channel


def local_uri(user: str, password: str, host: str, port: int):
    """The `local_uri` of a Shovel: this node's own listener, as `user`."""
    def uri(vhost: str) -> str:
        return (f"amqp://{quote(user, safe='')}:{quote(password, safe='')}@{host}:{port}/"
                f"{quote(vhost, safe='')}")
    return uri
