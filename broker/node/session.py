"""One client connection on the node: the AMQP connection's events, acted on.

Responsibilities: the glue between a sans-I/O `amqp.connection.Connection` and the
node. The connection is the protocol: handshake, heartbeats, channels, content,
protocol errors. The session does the rest:
- logging users in (PLAIN, AMQPLAIN) and opening vhosts;
- keeping a node `Channel` per open channel;
- calling `handlers` for methods and published messages;
- turning their AMQPErrors into the connection's `fail`;
- resource alarms (connection.blocked);
- long outputs (streams);
- on worker 0 of a node of workers, stopping at the first event that names another
  worker's queue, to be handed to it (`_place`, node/handover.py); on that worker,
  resuming open (`adopted`).

How it works: `receive_data` feeds the connection. Then it takes its events one at
a time (`_handle_events`). So a channel closed by one event's error is closed for
the next frame. A published message takes with it the whole messages that follow
it on its channel in what was received. (`Connection.next_content` reads nothing
it would fail on.) `handlers.publish` gets them as one run and checks each in
order. It hands the node those before the first that fails. That one fails the
channel, or waits for a metadata barrier with the rest held behind it. When it
fails the channel, the rest are discarded, as the connection discards what follows
an error.
Everything the node writes (deliveries, replies) goes to the connection's
`outbound` list. So protocol frames and node frames leave in one order. Time
enters as `now` arguments (monotonic seconds). The server shell owns sockets.

Long outputs (a lease range of thousands of messages) are streams. A stream is a
producer the session pulls from in `data_to_send`, about STREAM_CHUNK_BYTES a call.
It is pulled while the shell finds the client keeping up (`streaming` says more is
waiting). Everything written before a stream goes out before it. A stream's own
frames keep their order. A producer checks its channel is still open before each
step.

Invariants: a node Channel exists exactly while its channel is OPEN on the wire.
Once `closed` is True, the node no longer knows this session. The shell then sends
`data_to_send()` and drops the socket.

Not here: protocol states and framing (broker/amqp/connection.py), what each method
does (handlers.py).
"""

from __future__ import annotations

import logging
import platform
from collections import deque
from collections.abc import Iterator
from typing import assert_never

from .. import __version__
from ..amqp import spec
from ..amqp.channel import ChannelState
from ..amqp.connection import Connection, ConnectionState
from ..amqp.errors import AMQPError
from ..amqp.events import (ChannelClosed, ChannelCloseRequested, ChannelOpened,
                           ConnectionClosed, ConnectionCloseRequested, ContentReceived,
                           LoginRequested, MethodReceived, VhostRequested)
from ..auth.users import SaslError, parse_sasl_response
from . import handlers, handover, limits, ordering
from .channel import Channel

log = logging.getLogger("quorumqueue.broker")

CAPABILITIES = ("publisher_confirms", "exchange_exchange_bindings", "basic.nack",
                "consumer_cancel_notify", "connection.blocked", "consumer_priorities",
                "authentication_failure_close", "per_consumer_qos", "direct_reply_to")
# What one `data_to_send` pulls from streams at most (a little more: whole steps).
STREAM_CHUNK_BYTES = 256 * 1024


def server_properties(cluster_name: str) -> dict:
    return {
        "product": "quorumqueue",
        "version": __version__,
        "platform": f"Python {platform.python_version()}",
        "copyright": "quorumqueue authors",
        "information": "Licensed under Apache-2.0; speaks AMQP 0-9-1 like RabbitMQ",
        "cluster_name": cluster_name,
        "capabilities": {name: True for name in CAPABILITIES},
    }


class Session:
    def __init__(self, node, peer_host: str, now: float, peer: str = "",
                 adopted: tuple | None = None) -> None:
        """`adopted`: (state, user, vhost, unread bytes) of a connection another
        worker of this node accepted and handed here open (`adopted`)."""
        settings = node.settings
        self.node = node
        self.settings = settings
        self.peer_host = peer_host
        self.peer = peer or peer_host   # "host:port -> host:port", for the log
        # over the TLS listener: the negotiated version ("TLSv1.3") and cipher, set by
        # the server shell (RabbitMQ's connection info ssl_protocol, ssl_cipher); None
        # on the plain listener
        self.ssl_protocol: str | None = None
        self.ssl_cipher: str | None = None
        self.connection_id = node.next_connection_id()
        self.connection = Connection(server_properties(settings.cluster_name),
                                     frame_max=settings.frame_max,
                                     channel_max=settings.channel_max,
                                     heartbeat=settings.heartbeat,
                                     max_message_size=settings.max_message_size, now=now,
                                     handshake_timeout=settings.network.handshake_timeout_ms
                                     / 1000)
        self._out = self.connection.outbound
        self._streams: deque[Iterator[list[bytes]]] = deque()
        self.channels: dict[int, Channel] = {}  # the OPEN channels
        self.user = None
        self.vhost = None
        self.frame_max = settings.frame_max  # the negotiated one once open (tune-ok)
        self.closed = False
        self.close_reason = ""
        self.has_published = False
        self._handling = False  # in _handle_events: nested calls leave events queued
        # after the client's connection.close: the channels still doing methods they
        # held before it (close-ok waits for them); None otherwise
        self._close_waits: set[int] | None = None
        # the shell's budget for this round ran out before all input received was
        # handled (`take_input`): the rest waits in the connection, the shell reads no
        # more from this client until it hands the session a new budget, and other
        # paths (ticks, errors) handle no events meanwhile, so input keeps its order
        self.input_held = False
        # when the channels next check their consumer timeout (RabbitMQ's channel tick)
        self._next_channel_tick = now + settings.channel_tick_interval_ms / 1000
        # worker 0 of a node of workers: the connection is not placed yet; its first
        # event naming a queue may hand it to the queue's worker (node/handover.py)
        self._placing = handover.enabled(settings) and adopted is None
        # the worker's name this session waits to be handed to, its input held
        self.handing_over: str | None = None
        self._mark_used = True  # the connection's input mark is to be set again
        if adopted is not None:
            self._resume(*adopted)
        node.register(self)

    @classmethod
    def adopted(cls, node, state: dict, user, vhost, unread: bytes, now: float) -> "Session":
        """The session of a connection handed over open by another worker
        (node/handover.py `adopt`)."""
        return cls(node, state["peer_host"], now, state["peer"],
                   adopted=(state, user, vhost, unread))

    def _resume(self, state: dict, user, vhost, unread: bytes) -> None:
        self.user = user
        self.vhost = vhost
        self.has_published = state["has_published"]
        numbers = [modes["number"] for modes in state["channels"]]
        self.connection.resume_open(
            frame_max=state["frame_max"], channel_max=state["channel_max"],
            heartbeat=state["heartbeat"], client_properties=state["client_properties"],
            capabilities=state["capabilities"], mechanism=state["mechanism"],
            channels=numbers, quota=limits.channel_quota(self.node, user.name),
            unread=unread)
        self.frame_max = state["frame_max"]
        for modes in state["channels"]:
            self.channels[modes["number"]] = Channel(self, modes["number"], adopted=modes)

    # ------------------------------------------------------------ the connection's view

    @property
    def state(self) -> ConnectionState:
        return self.connection.state

    @property
    def identity(self) -> str:
        """This connection across the cluster (`<node>:<boot>.<connection>`).
        An exclusive queue records it as its owner, so every node can tell the
        owner."""
        return f"{self.node.boot_id}.{self.connection_id}"

    @property
    def capabilities(self) -> dict:
        return self.connection.capabilities

    @property
    def paused(self) -> bool:
        """The shell should stop reading from this client (resource alarm)."""
        return self.connection.blocked

    # ------------------------------------------------------------ I/O surface

    def write(self, data: bytes) -> None:
        self._out.append(data)
        self.node.dirty.add(self)

    def write_parts(self, parts: list[bytes]) -> None:
        self._out.extend(parts)
        self.node.dirty.add(self)

    def stream(self, producer: Iterator[list[bytes]]) -> None:
        """Send what `producer` yields (frames, a list per step). It follows
        everything written so far. `data_to_send` pulls it as the client takes it."""
        self._streams.append(producer)
        self.node.dirty.add(self)

    @property
    def streaming(self) -> bool:
        """A stream has more to send: call `data_to_send` again once the client has
        taken what was sent."""
        return bool(self._streams)

    def data_to_send(self, pull: bool = True) -> bytes:
        """The bytes to send now; with `pull`, up to about STREAM_CHUNK_BYTES more
        from the streams."""
        return b"".join(self.chunks_to_send(pull))

    def chunks_to_send(self, pull: bool = True) -> list:
        """`data_to_send` not joined (Connection.chunks_to_send)."""
        if pull and self._streams:
            self._pull(STREAM_CHUNK_BYTES)
        return self.connection.chunks_to_send()

    def _pull(self, budget: int) -> None:
        taken = 0
        while self._streams and taken < budget:
            parts = next(self._streams[0], None)
            if parts is None:
                self._streams.popleft()
                continue
            self._out.extend(parts)
            taken += sum(map(len, parts))

    def receive_data(self, data: bytes, now: float, budget: int | None = None) -> int:
        """Take `data` from the client and handle at most `budget` events of it.
        None: all. Returns how many were handled (`take_input`)."""
        if self.closed:
            return 0
        self.connection.receive_data(data, now)
        return self.take_input(budget)

    def take_input(self, budget: int | None = None) -> int:
        """Handle the input received so far, at most `budget` events. A method
        counts once, and so does a publish with its content. None: every one.
        Returns how many were handled. `input_held` says the budget ran out first.
        The next call handles what is left, in order."""
        if self.closed:
            self.input_held = False
            return 0
        if self.handing_over is not None:
            return 0  # the shell hands the connection over; its input waits for that
        self.input_held = False
        handled = self._handle_events(budget)
        if self.has_published and self.node.alarms:
            self.alarms_changed()
        return handled

    def tick(self, now: float) -> None:
        """Heartbeats and close-ok timeouts; every channel_tick_interval, the
        channels' consumer timeout."""
        if self.closed:
            return
        self.connection.tick(now)
        if self.connection.handshake_timed_out:  # rabbit_reader's line, on one line
            log.error("closing AMQP connection %s: {handshake_timeout,%s}", self.peer,
                      self.connection.handshake_timed_out)
        if now >= self._next_channel_tick:
            self._next_channel_tick = now + self.settings.channel_tick_interval_ms / 1000
            self._check_consumer_timeouts(now)
        self._handle_events()

    def _check_consumer_timeouts(self, now: float) -> None:
        """Close with 406 a channel whose oldest unacked delivery is older than its
        consumer timeout. Class and method are 0, as RabbitMQ's. Closing it returns
        its unacked deliveries to their queues."""
        for channel in list(self.channels.values()):
            error = channel.consumer_timed_out(now)
            if error is None:
                continue
            tag = next(iter(channel.unacked))
            consumer = channel.unacked[tag][2]
            queue = channel.unacked[tag][0]
            log.warning("Consumer '%s' on channel %d and queue '%s' in vhost '%s' has timed "
                        "out waiting for a consumer acknowledgement of a delivery with "
                        "delivery tag = %d. %s", consumer.tag if consumer else "",
                        channel.number, queue.name, queue.vhost, tag,
                        error.detail.split(". ", 1)[1])
            self.connection.fail(error, channel.number)

    def sent(self, now: float) -> None:
        self.connection.sent(now)

    def urgent_to_send(self) -> bytes:
        """Heartbeats and connection.blocked/unblocked alone (amqp
        Connection.urgent). The shell sends them while the rest of the output waits
        for an fsync."""
        return self.connection.urgent_to_send()

    def server_close(self, code: int, detail: str, now: float) -> None:
        """The broker closes the connection (e.g. shutdown): 320 CONNECTION_FORCED."""
        if self.closed:
            return
        self.connection.server_close(code, detail, now)
        self._handle_events()

    def connection_lost(self) -> None:
        """The socket is gone: clean up without sending anything."""
        self.handing_over = None  # what it received is handled here after all
        if not self.closed:
            if self.input_held:  # what was received before the socket went is acted on
                self.take_input()
        if not self.closed:
            self.connection.connection_lost()
            self._handle_events()
        self._out.clear()
        self._streams.clear()

    # ------------------------------------------------------------ events

    def _handle_events(self, budget: int | None = None) -> int:
        """Act on the connection's events, at most `budget` of them (None: all).
        Returns how many. While input is held (`input_held`), only `take_input`
        handles events."""
        if self._handling:
            return 0  # the loop running further up the stack takes them
        if budget is None:
            if self.input_held:
                return 0  # the shell's next take_input handles them, in order
            budget = -1
        self._handling = True
        connection = self.connection
        handled = 0
        try:
            next_event, next_content = connection.next_event, connection.next_content
            publish = handlers.publish
            while True:
                if handled == budget:
                    self.input_held = True
                    break
                if self._placing:
                    if self._mark_used:  # an event was handled since the mark: a new one
                        connection.mark()
                        self._mark_used = False
                    if (event := next_event()) is None:
                        break
                    if self._place(event):
                        break
                    self._mark_used = True
                elif (event := next_event()) is None:
                    break
                handled += 1
                if type(event) is ContentReceived:  # the per-message event first
                    channel = self.channels[event.channel]
                    if channel.held is not None:
                        self._content(event)
                        continue
                    self.has_published = True  # twin of Session._content (below): keep in step
                    # the messages on this channel that the read holds whole: one run
                    run = [event]
                    while handled != budget and (more := next_content(event.channel)) is not None:
                        run.append(more)
                        handled += 1
                    failed = publish(self, channel, run)
                    if failed is not None:
                        self._run_failed(channel, run, *failed)
                    continue
                match event:
                    case MethodReceived():
                        channel = self.channels[event.channel]
                        if channel.held is not None:  # after the metadata change it waits for
                            handlers.hold(self, channel, lambda channel=channel,
                                          method=event.method: handlers.dispatch(
                                              self, channel, method),
                                          (event.class_id, event.method_id))
                            continue
                        try:
                            handlers.dispatch(self, channel, event.method)
                        except AMQPError as error:
                            if ordering.may_be_unapplied(self, error):  # once, after a barrier
                                ordering.after_barrier(
                                    self, channel, lambda channel=channel, method=event.method:
                                    handlers.dispatch(self, channel, method),
                                    (event.class_id, event.method_id))
                                continue
                            connection.fail(error.at(event.class_id, event.method_id),
                                            event.channel)
                    case ContentReceived():
                        self._content(event)
                    case ChannelOpened(channel=number):
                        self.channels[number] = Channel(self, number)
                    case ChannelCloseRequested(channel=number):
                        channel = self.channels[number]
                        if not handlers.hold(self, channel, lambda number=number:
                                             self._close_requested(number), spec.CHANNEL_CLOSE):
                            self._close_requested(number)
                    case ChannelClosed(channel=number):
                        self._release(number)
                    case LoginRequested():
                        self._login(event)
                    case VhostRequested():
                        self._open(event)
                    case ConnectionCloseRequested():
                        self._connection_close_requested()
                    case ConnectionClosed(reason=reason):
                        self._closed(reason)
                    case _:
                        assert_never(event)
        finally:
            self._handling = False
            if self._out or self.connection.urgent:
                self.node.dirty.add(self)
        return handled

    def _place(self, event) -> bool:
        """At the connection's first event naming a queue: whether it goes to the
        queue's worker (node/handover.py). Then the event's frames are to be read
        again, there: the reader goes back to them (the connection's mark, set before
        each event while placing) and input is held until the shell has handed the
        connection over (`handing_over`)."""
        target = handover.placing(self, event)
        if target is handover.NOT_PLACING:
            return False
        self._placing = False
        connection = self.connection
        if (target is None or not handover.quiet(self)
                or not connection.rewind_to_mark()):
            connection.unmark()
            return False
        self.handing_over = target
        self.input_held = True
        return True

    def stay(self) -> None:
        """The handover did not happen: the connection stays here, placed; its held
        input is taken next (`take_input`)."""
        self.handing_over = None

    def handed_over(self, worker: str) -> None:
        """The shell gave the connection to `worker`: it ends here without a frame.
        Its channels hold nothing (handover.quiet), so they just go."""
        self.connection.handed_over()
        self.closed = True
        self.close_reason = f"handed over to {worker}"
        self.handing_over = None
        self.input_held = False
        for channel in self.channels.values():
            channel.state = ChannelState.CLOSING
            self.node.awaiting_sync.discard(channel)
        self.channels.clear()
        self._out.clear()
        self.node.unregister(self)

    def _content(self, event: ContentReceived) -> None:
        self.has_published = True
        channel = self.channels[event.channel]
        if channel.held is not None:  # after the metadata change the channel waits for
            handlers.hold(self, channel, lambda: self._publish_one(channel, event),
                          spec.BASIC_PUBLISH)
            return
        failed = handlers.publish(self, channel, [event])
        if failed is not None:
            self._run_failed(channel, [event], *failed)

    def _publish_one(self, channel: Channel, event: ContentReceived) -> None:
        """A held message, published once the channel's wait is over (its error
        raised: `ordering.resume` fails the channel)."""
        failed = handlers.publish(self, channel, [event])
        if failed is not None:
            raise failed[1]

    def _run_failed(self, channel: Channel, run: list[ContentReceived], position: int,
                    error: AMQPError) -> None:
        """The checks failed `run[position]`; those before it are published.
        It is retried once after a metadata barrier: an exchange this node may not
        have applied yet. The rest of the run is held behind it. Else it is the
        channel's (or the connection's) error. That discards the rest, as the
        connection discards what follows an error."""
        event = run[position]
        if ordering.may_be_unapplied(self, error):
            ordering.after_barrier(self, channel, lambda: self._publish_one(channel, event),
                                   spec.BASIC_PUBLISH)
            for later in run[position + 1:]:
                self._content(later)
            return
        self.connection.fail(error.at(*spec.BASIC_PUBLISH), event.channel)

    def _close_requested(self, number: int) -> None:
        """The client's channel.close, in its turn after the channel's earlier
        methods. Those held behind a metadata change are included. The channel ends;
        close-ok goes out."""
        self._release(number)
        self.connection.channel_closed(number)
        if self._out:
            self.node.dirty.add(self)

    def _connection_close_requested(self) -> None:
        """The client's connection.close. Close-ok waits until every channel has
        done the methods it holds behind a metadata change. RabbitMQ's reader too
        stops its channels after the methods it handed them. Then the channels and
        the connection end."""
        waiting = {number for number, channel in self.channels.items()
                   if channel.held is not None}
        if not waiting:
            self.connection.close_accepted()
            return
        self._close_waits = waiting
        for number in waiting:
            handlers.hold(self, self.channels[number],
                          lambda number=number: self._channel_done(number),
                          spec.CONNECTION_CLOSE)

    def _channel_done(self, number: int) -> None:
        """Channel `number` has done what it held before the client's
        connection.close, or failed doing it. The last one lets the close finish."""
        waits = self._close_waits
        if waits is None:
            return
        waits.discard(number)
        if not waits:
            self._close_waits = None
            self.connection.close_accepted()
            self._handle_events()

    def _release(self, number: int) -> None:
        channel = self.channels.pop(number, None)
        if channel is not None:
            channel.state = ChannelState.CLOSING
            channel.close()

    def _login(self, event: LoginRequested) -> None:
        """Log the user in, or refuse. A refusal is logged as rabbit_reader logs
        it, on one line, with the peer: "Error on AMQP connection ... PLAIN login
        refused: user 'NAME' - invalid credentials"."""
        try:
            username, password = parse_sasl_response(event.mechanism, event.response)
        except SaslError as error:
            log.error("Error on AMQP connection %s (state: starting): %s response invalid: "
                      "%s", self.peer, event.mechanism, error)
            self.connection.refuse_response(str(error))
            return
        user, why = self.node.users.login(username, password, self.peer_host)
        if user is None:
            log.error("Error on AMQP connection %s (state: starting): %s login refused: %s",
                      self.peer, event.mechanism, why)
            self.connection.refuse_login()
            return
        self.user = user
        # the user's channels on this node count against its max-channels limit
        self.connection.quota = limits.channel_quota(self.node, user.name)
        self.connection.accept_login()

    def _open(self, event: VhostRequested) -> None:
        name = event.vhost
        vhost = self.node.vhost(name)
        if vhost is None:
            self.connection.fail(AMQPError(spec.NOT_ALLOWED, f"vhost {name} not found", 10, 40))
            return
        try:  # as rabbit_reader: the connection limits come before the access check
            limits.check_connection(self.node, self, name)
        except AMQPError as error:
            self.connection.fail(error)
            return
        if name not in self.user.vhosts:
            self.connection.fail(AMQPError(spec.NOT_ALLOWED, f"access to vhost '{name}' "
                                           f"refused for user '{self.user.name}'", 10, 40))
        else:
            self.vhost = vhost
            self.frame_max = self.connection.frame_max  # fixed since tune-ok
            self.connection.accept_open()

    def _closed(self, reason: str) -> None:
        self.closed = True
        self.close_reason = reason
        self._streams.clear()
        self.node.unregister(self)

    # ------------------------------------------------------------ errors

    def close_channel(self, channel: Channel, error: AMQPError) -> None:
        """Close `channel` with a channel error found outside a method. An example
        is a lease range that can no longer be read."""
        self.connection.fail(error, channel.number)
        self._handle_events()

    def fail_later(self, error: AMQPError, channel: Channel) -> None:
        """A method's error known only once a log entry is applied (cluster
        metadata). It closes the channel (or the connection) as if the method had
        failed at once. After the client's connection.close the channel just stops.
        What it held after the failed method is dropped, as a channel error drops
        it."""
        if self._close_waits is not None:
            self._channel_done(channel.number)
            return
        self.connection.fail(error, channel.number)
        self._handle_events()

    # ------------------------------------------------------------ alarms

    def _block(self) -> None:
        self.connection.block(self.node.blocked_reason or "resource alarm")
        if self.connection.urgent:
            self.node.dirty.add(self)

    def alarms_changed(self) -> None:
        connection = self.connection
        if self.node.alarms:
            if (self.has_published and not connection.blocked
                    and connection.state is ConnectionState.OPEN):
                self._block()
        elif connection.blocked:
            connection.unblock()
            if connection.urgent:
                self.node.dirty.add(self)
