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
attempt: both connections are closed, the state is `terminated` with the reason,
and after reconnect-delay seconds the shovel starts again. What the source
delivered and did not get acknowledged is requeued by the source when the
connection goes, and redelivered to the next attempt: across a failure a message
may reach the destination twice (published, the confirm lost), never be lost
(on-confirm).

src-delete-after: "queue-length" moves the number of messages the source queue
held when this attempt started, an integer that many messages over all attempts of
this Shovel (a shovel started on another node counts from zero, as RabbitMQ's
worker does);
deliveries past the count are neither published nor acknowledged (the source
requeues them when the shovel closes). Then `finished` is set and the shovel
stops; its owner clears the parameter.

Invariant (on-confirm): a message is acknowledged at the source only after the
destination confirmed it.

Properties travel unchanged, as in RabbitMQ: aiormq gives a message published
without a message-id one of its own (it tracks returns by it), so a message that
had none is published with `NO_MESSAGE_ID`, which aiormq takes as set and pamqp
does not encode (it leaves out empty properties).
"""

from __future__ import annotations

import asyncio
import logging
import time
from urllib.parse import quote, urlsplit, urlunsplit

import aiormq
from pamqp import commands as spec

from .parameters import Definition

log = logging.getLogger("quorumqueue.shovel")

CONNECT_TIMEOUT = 30.0  # seconds for a connection and its channels to open
CLOSE_TIMEOUT = 5.0

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
        self.moved = 0  # messages published and acknowledged at the source
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
        taken = 0
        done = 0
        if d.dest_queue is not None:
            route = ("", d.dest_queue)
        elif d.dest_exchange is not None:
            route = (d.dest_exchange, d.dest_exchange_key)
        else:
            route = (None, None)

        async def forward(message) -> None:
            nonlocal taken, done
            if remaining is not None:
                if taken >= remaining:
                    return  # past the count: requeued by the source when we close
                taken += 1
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
                    properties=properties, wait=d.ack_mode != "on-confirm")
                if d.ack_mode == "on-confirm" and not isinstance(confirmation,
                                                                 spec.Basic.Ack):
                    raise RuntimeError(f"the destination did not confirm a message: "
                                       f"{type(confirmation).__name__}")
                if d.ack_mode != "no-ack":
                    await src.basic_ack(message.delivery.delivery_tag, wait=False)
                self.moved += 1
                done += 1
                if remaining is not None and done >= remaining and not outcome.done():
                    outcome.set_exception(_Finished())
            except Exception as error:  # noqa: BLE001 - ends the attempt
                if not outcome.done():
                    outcome.set_exception(error)

        await src.basic_qos(prefetch_count=d.prefetch)
        await src.basic_consume(queue, forward, no_ack=d.ack_mode == "no-ack")
        self._set(RUNNING)
        log.info("shovel '%s' in vhost '%s' running: %s/%s -> %s/%s", self.name, self.vhost,
                 redact(self.source_uri), d.source, redact(self.destination_uri),
                 d.destination)
        watched = [outcome, source.closing, destination.closing, src.closing, dest.closing]
        try:
            finished, _ = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not outcome.done():
                outcome.cancel()
        if outcome in finished and not outcome.cancelled():
            raise outcome.exception() or RuntimeError("ended")
        for future in finished:
            error = None if future.cancelled() else future.exception()
            raise RuntimeError(f"connection or channel closed: {error!r}"
                               if error is not None else "connection or channel closed")

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
