"""A pure client for driving a `Session`: pamqp frames in, pamqp frames out.

`Client` plays the client side of one AMQP 0-9-1 connection against the sans-I/O
session core. It builds client frames with pamqp (`pamqp.frame.marshal`), feeds them
to `Session.receive_data` (optionally one byte at a time, as h11's tests do),
decodes whatever the session wants to send with `pamqp.frame.unmarshal`, and plays
the server shell's part: `node.flush()` before reading (group commit releases
confirms) and `session.sent(now)` after (heartbeat bookkeeping). Time only moves
when a test moves it (`client.now`).

`method()` builds method frames without pamqp's client-side name validation, so
tests can send what a real client library would refuse to (unicode names, `amq.`
prefixes, out-of-range values).

No sockets, no threads, no sleeping: every test that uses this is deterministic.
"""

from __future__ import annotations

import shutil
import struct
import tempfile
import weakref
from dataclasses import dataclass
from functools import cache

from pamqp import body as pamqp_body
from pamqp import commands
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header
from pamqp import heartbeat as pamqp_heartbeat

from quorumqueue.broker.amqp import spec
from quorumqueue.broker.auth.users import UserStore, amqplain_response
from quorumqueue.broker.config import Settings
from quorumqueue.broker.node.node import Node
from quorumqueue.broker.node.session import Session
from quorumqueue.broker.raft.storage import LogStore
from quorumqueue.broker.raft.storage.config import StorageConfig
from quorumqueue.broker.server.server import assemble_node

CLIENT_CAPABILITIES = {"authentication_failure_close": True, "basic.nack": True,
                       "connection.blocked": True, "consumer_cancel_notify": True,
                       "publisher_confirms": True, "exchange_exchange_bindings": True}

# reply codes AMQP 0-9-1 defines (spec section 1.9, "constants")
AMQP_REPLY_CODES = frozenset({200, *range(311, 321), *range(402, 407), *range(501, 507),
                              530, 540, 541})


@cache
def _unchecked(cls: type) -> type:
    """`cls` without pamqp's argument validation (which runs on init and marshal)."""
    return type(cls.__name__, (cls,), {"validate": lambda self: None})


def method(cls: type, **fields):
    """A pamqp method object that skips pamqp's client-side checks."""
    return _unchecked(cls)(**fields)


def marshal(value, channel: int = 0) -> bytes:
    return pamqp_frame.marshal(value, channel)


def properties(**values) -> commands.Basic.Properties:
    return commands.Basic.Properties(**values)


def content_frames(channel: int, body: bytes, props: commands.Basic.Properties | None = None,
                   frame_max: int = 131072) -> bytes:
    """A content header frame and the body frames (split like a client would)."""
    header = pamqp_header.ContentHeader(0, len(body), props or commands.Basic.Properties())
    parts = [marshal(header, channel)]
    chunk = frame_max - spec.FRAME_OVERHEAD
    for start in range(0, len(body), chunk):
        parts.append(marshal(pamqp_body.ContentBody(body[start:start + chunk]), channel))
    return b"".join(parts)


def raw_frame(frame_type: int, channel: int, payload: bytes, end: int = spec.FRAME_END) -> bytes:
    return struct.pack(">BHI", frame_type, channel, len(payload)) + payload + bytes([end])


def decode_stream(data: bytes) -> list[tuple[int, object]]:
    """All frames in `data` as (channel, pamqp frame); the stream must be whole."""
    frames = []
    position = 0
    while position < len(data):
        consumed, channel, value = pamqp_frame.unmarshal(data[position:])
        assert consumed, f"undecodable output at {position}: {data[position:position + 16]!r}"
        frames.append((channel, value))
        position += consumed
    return frames


def name(value) -> str:
    """'Basic.Ack', 'ContentHeader', 'ContentBody', 'Heartbeat', 'ProtocolHeader'."""
    return value.name if hasattr(value, "name") else type(value).__name__


@dataclass
class Delivery:
    """A method that carries content, with its reassembled header and body."""

    channel: int
    method: object
    header: pamqp_header.ContentHeader
    body: bytes


def new_node(settings: Settings | None = None, users: UserStore | None = None,
             message_store=None, metadata_store=None, log_store: LogStore | None = None) -> Node:
    """A node as the broker assembles it (its quorum groups and its one-member
    metadata group), over `log_store` or a fresh one in a temporary directory, without
    fsync; nothing else touches the disk unless the test passes stores.

    The temporary directory goes when the node does (a weakref finalizer on the
    node), so a run holds only the directories of the nodes its live tests use, and a
    killed run leaves only those; `remove_directories` (tests/conftest.py calls it at
    the end of the session) takes those of nodes still alive. Not atexit alone: a
    pytest-xdist worker ends without running it."""
    directory = None
    if log_store is None:
        directory = tempfile.mkdtemp(prefix="qq-node-")
        log_store = LogStore(directory, StorageConfig(fsync=False))
    node = assemble_node(settings or Settings(), users or UserStore.with_default_user(),
                         log_store, message_store, metadata_store)
    if directory is not None:
        if len(_REMOVALS) >= 1024:
            _REMOVALS[:] = [removal for removal in _REMOVALS if removal.alive]
        _REMOVALS.append(weakref.finalize(node, shutil.rmtree, directory, True))
    return node


# the finalizers of new_node's temporary directories (those already run pruned)
_REMOVALS: list[weakref.finalize] = []


def remove_directories() -> None:
    """Remove the temporary directories of every node new_node made that is still
    alive (their log stores are not used again)."""
    for removal in _REMOVALS:
        removal()
    _REMOVALS.clear()


class Client:
    def __init__(self, node: Node, peer_host: str = "127.0.0.1", now: float = 0.0,
                 byte_at_a_time: bool = False) -> None:
        self.node = node
        self.now = now
        self.byte_at_a_time = byte_at_a_time
        self.session = Session(node, peer_host, now)
        self.frame_max = node.settings.frame_max
        self.tune: commands.Connection.Tune | None = None
        self.start: commands.Connection.Start | None = None

    # ------------------------------------------------------------ bytes

    def send_bytes(self, data: bytes) -> None:
        if self.byte_at_a_time:
            for index in range(len(data)):
                self.session.receive_data(data[index:index + 1], self.now)
        else:
            self.session.receive_data(data, self.now)

    def send(self, channel: int, *values) -> None:
        """Marshal pamqp frames (methods, ContentHeader, ContentBody) and feed them."""
        self.send_bytes(b"".join(marshal(value, channel) for value in values))

    def read(self, flush: bool = True) -> list[tuple[int, object]]:
        """What the session sent since the last read, decoded. Plays the shell:
        flush the stores first (releases confirms), then mark the bytes as sent."""
        if flush:
            self.node.flush()
        data = self._everything_to_send()
        if data:
            self.session.sent(self.now)
        return decode_stream(data)

    def _everything_to_send(self) -> bytes:
        """What the session sends now, streams included (a client that keeps up)."""
        data = self.session.data_to_send()
        while self.session.streaming:
            data += self.session.data_to_send()
        return data

    def read_raw(self, flush: bool = True) -> bytes:
        if flush:
            self.node.flush()
        data = self._everything_to_send()
        if data:
            self.session.sent(self.now)
        return data

    def read_methods(self, flush: bool = True) -> list[tuple[int, object]]:
        return [(channel, value) for channel, value in self.read(flush)
                if isinstance(value, commands.base.Frame)]

    def read_names(self, flush: bool = True) -> list[str]:
        return [name(value) for _channel, value in self.read(flush)]

    def read_deliveries(self, flush: bool = True) -> list[Delivery | tuple[int, object]]:
        """Methods, with content-carrying ones folded together with their content."""
        out: list = []
        for channel, value in self.read(flush):
            if isinstance(value, pamqp_header.ContentHeader):
                last = out[-1]
                out[-1] = Delivery(last[0], last[1], value, b"")
            elif isinstance(value, pamqp_body.ContentBody):
                out[-1].body += value.value
            else:
                out.append((channel, value))
        return out

    def expect(self, *names: str, flush: bool = True) -> list[tuple[int, object]]:
        frames = self.read(flush)
        assert [name(value) for _channel, value in frames] == list(names), frames
        return frames

    def expect_one(self, expected_name: str, channel: int | None = None):
        frames = self.read()
        assert [name(value) for _c, value in frames] == [expected_name], \
            [(c, name(v), dict(v) if hasattr(v, "__iter__") else v) for c, v in frames]
        if channel is not None:
            assert frames[0][0] == channel
        return frames[0][1]

    # ------------------------------------------------------------ handshake

    def start_ok(self, username: str = "guest", password: str = "guest",
                 mechanism: str = "PLAIN", capabilities: dict | None = None,
                 response: str | None = None) -> None:
        if response is not None:   # a response made by the test itself
            pass
        elif mechanism == "PLAIN":
            response = f"\x00{username}\x00{password}"
        elif mechanism == "AMQPLAIN":
            # pamqp writes long strings from str; the table octets are ASCII here
            response = amqplain_response(username, password).decode("utf-8")
        else:
            response = f"\x00{username}\x00{password}"
        client_properties = {"product": "quorumqueue tests",
                             "capabilities": CLIENT_CAPABILITIES if capabilities is None
                             else capabilities}
        self.send(0, method(commands.Connection.StartOk, client_properties=client_properties,
                            mechanism=mechanism, response=response, locale="en_US"))

    def handshake(self, vhost: str = "/", heartbeat: int = 0, frame_max: int | None = None,
                  username: str = "guest", password: str = "guest",
                  mechanism: str = "PLAIN", capabilities: dict | None = None) -> None:
        """Protocol header, start-ok, tune-ok, open; asserts each server reply."""
        self.send_bytes(spec.PROTOCOL_HEADER)
        self.start = self.expect_one("Connection.Start", channel=0)
        self.start_ok(username, password, mechanism, capabilities)
        self.tune = self.expect_one("Connection.Tune", channel=0)
        self.frame_max = frame_max or self.tune.frame_max
        self.send(0, commands.Connection.TuneOk(channel_max=self.tune.channel_max,
                                                frame_max=self.frame_max,
                                                heartbeat=heartbeat))
        self.send(0, commands.Connection.Open(virtual_host=vhost))
        self.expect_one("Connection.OpenOk", channel=0)

    # ------------------------------------------------------------ conveniences

    def open_channel(self, channel: int = 1) -> None:
        self.send(channel, commands.Channel.Open())
        self.expect_one("Channel.OpenOk", channel=channel)

    def call(self, channel: int, value, reply: str):
        """Send one synchronous method and return its single reply."""
        self.send(channel, value)
        return self.expect_one(reply, channel=channel)

    def declare_queue(self, channel: int, queue: str, **fields):
        return self.call(channel, method(commands.Queue.Declare, queue=queue, **fields),
                         "Queue.DeclareOk")

    def publish(self, channel: int, exchange: str, routing_key: str, body: bytes = b"",
                props: commands.Basic.Properties | None = None,
                mandatory: bool = False) -> None:
        self.send_bytes(
            marshal(method(commands.Basic.Publish, exchange=exchange, routing_key=routing_key,
                           mandatory=mandatory), channel)
            + content_frames(channel, body, props, self.frame_max))

    def get(self, channel: int, queue: str, no_ack: bool = True):
        """basic.get: the Delivery, or None for get-empty."""
        self.send(channel, method(commands.Basic.Get, queue=queue, no_ack=no_ack))
        replies = self.read_deliveries()
        assert len(replies) == 1, replies
        reply = replies[0]
        if isinstance(reply, Delivery):
            assert name(reply.method) == "Basic.GetOk"
            return reply
        assert name(reply[1]) == "Basic.GetEmpty", reply
        return None

    def heartbeat(self) -> None:
        self.send_bytes(marshal(pamqp_heartbeat.Heartbeat(), 0))
