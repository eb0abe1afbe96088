"""What a client connection tells the broker: the events `Connection.next_event` returns.

Responsibilities: a closed vocabulary of small frozen dataclasses, one per thing the
node must act on. Protocol housekeeping (the handshake's frames, heartbeats,
channel.open-ok, close-ok answers, discarding frames on closing channels) never
becomes an event: the connection does it itself.

Two events wait for an answer before the connection reads on: `LoginRequested`
(answer `accept_login()` or `refuse_login()`) and `VhostRequested` (`accept_open()`
or `fail(error)`).

Events are never changed once made. They are not `frozen` dataclasses only because
those cost four times as much to build (object.__setattr__ per field), and a
published message or an ack makes one.

Not here: what the node does with them (broker/node/session.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .codec import Properties, Publish


@dataclass(slots=True)
class LoginRequested:
    """connection.start-ok: the client's SASL response for an offered mechanism."""

    mechanism: str
    response: bytes


@dataclass(slots=True)
class VhostRequested:
    """connection.open: the client asks for a virtual host."""

    vhost: str


@dataclass(slots=True)
class ChannelOpened:
    """channel.open was answered with open-ok."""

    channel: int


@dataclass(slots=True)
class MethodReceived:
    """A channel method for the node (anything but channel.open/close/close-ok and
    content-carrying methods). `method` is the decoded method object (a pamqp method,
    or codec.Ack/Nack/Reject on the hot path); the ids name it in errors."""

    channel: int
    method: Any
    class_id: int
    method_id: int


@dataclass(slots=True)
class ContentReceived:
    """A whole message: basic.publish, its content header and every body frame."""

    channel: int
    method: Publish
    properties: Properties
    body: bytes


@dataclass(slots=True)
class ChannelCloseRequested:
    """The client sent channel.close: the node ends the channel once the methods it
    received on it before are done (a channel's methods act in order), then calls
    `Connection.channel_closed`, which sends close-ok. Until then the channel's
    frames are discarded."""

    channel: int


@dataclass(slots=True)
class ChannelClosed:
    """The channel is gone for the node: the server closed it (channel.close was
    sent), or the connection is closing."""

    channel: int


@dataclass(slots=True)
class ConnectionCloseRequested:
    """The client sent connection.close: the node lets its channels finish the methods
    they received before it, then calls `Connection.close_accepted`, which sends
    close-ok and ends the connection (ChannelClosed for each channel, then
    ConnectionClosed). Until then what the client sends is discarded."""


@dataclass(slots=True)
class ConnectionClosed:
    """The connection is over (client close, close-ok, timeout, framing error, lost
    socket): send what is left in `data_to_send()`, then drop the socket."""

    reason: str


Event = (LoginRequested | VhostRequested | ChannelOpened | MethodReceived | ContentReceived
         | ChannelCloseRequested | ChannelClosed | ConnectionCloseRequested | ConnectionClosed)
