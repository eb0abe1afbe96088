"""Reaching the broker: the first address that answers, and which kind of broker it is.

`uri` may list several addresses (the nodes of a cluster); they are tried in the
order given and the first that completes the AMQP handshake is used. Failures are
reported with every address tried and why, passwords redacted.

`detect_mode` reads the `product` server property every AMQP 0-9-1 broker sends in
connection.start: the bundled broker says "quorumqueue" (lease mode), RabbitMQ says
"RabbitMQ" (consume mode).

`open_connection` is the plain pika connection consume mode and batch reads use;
`open_lease_client` the lease-mode client.

A refused login (403 ACCESS_REFUSED in the handshake) is the broker's answer, not a
lost broker: `first_reachable` raises LoginRefused at once, naming the user and the
address, and nothing retries it (reconnect.py retries only what it counts as a
lost connection).
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Callable, Sequence
from typing import TypeVar

import pika
import pika.exceptions

from ..client.lease_client import LeaseClient
from ..client.management import ManagementError
from .first_line import message_alone
from .options import BatchReadOptions, BrokerAddress, Mode, OptionError, SourceOptions

BUNDLED_PRODUCT = "quorumqueue"

T = TypeVar("T")


class BrokerUnreachable(ConnectionError):
    """No address in `uri` completed an AMQP handshake."""


class LoginRefused(RuntimeError):
    """The broker refused the user of option `uri` (wrong user or password, or a user
    that may not log in from here): never retried."""


# what a refused AMQP login looks like: pika's exceptions, or their text inside a
# LeaseClient's ManagementError
_LOGIN_ERRORS = (pika.exceptions.ProbableAuthenticationError,
                 pika.exceptions.AuthenticationError)
_LOGIN_TEXTS = ("ProbableAuthenticationError", "AuthenticationError", "ACCESS_REFUSED - Login")


def login_refused(address: BrokerAddress, error: BaseException) -> LoginRefused | None:
    """LoginRefused naming the user and `address` if `error` is a refused login."""
    text = str(error)
    if not isinstance(error, _LOGIN_ERRORS) and not (
            isinstance(error, ManagementError) and any(t in text for t in _LOGIN_TEXTS)):
        return None
    user = urllib.parse.unquote(urllib.parse.urlsplit(address.uri).username or "guest")
    reason = re.search(r"ACCESS_REFUSED - [^'\".]*", text)  # up to the first sentence's end
    why = reason.group(0).rstrip(". ") if reason else type(error).__name__
    return LoginRefused(
        f"the broker at {address.redacted} refused the login of user '{user}' ({why}): "
        "check the user and password in option 'uri' (the broker's log says why: an "
        "unknown user, a wrong password, or guest from another host)")


def first_reachable(addresses: Sequence[BrokerAddress],
                    open_one: Callable[[BrokerAddress], T]) -> T:
    failures = []
    for address in addresses:
        try:
            return open_one(address)
        except (pika.exceptions.AMQPError, ManagementError, OSError) as error:
            refused = login_refused(address, error)
            if refused is not None:
                message_alone()  # in a PySpark worker: the message is what Spark shows
                raise refused from None
            failures.append(f"{address.redacted}: {_describe(error)}")
    raise BrokerUnreachable("cannot connect to the broker (option 'uri'): "
                            + "; ".join(failures))


def server_product(addresses: Sequence[BrokerAddress]) -> tuple[str, BrokerAddress]:
    """The `product` server property of the first reachable broker, and its address."""

    def probe(address: BrokerAddress) -> tuple[str, BrokerAddress]:
        connection = pika.BlockingConnection(address.parameters())
        try:
            # pika keeps connection.start's server properties on the underlying
            # connection only; BlockingConnection has no public accessor.
            properties = connection._impl.server_properties or {}
        finally:
            connection.close()
        product = properties.get("product", "")
        if isinstance(product, bytes):
            product = product.decode("utf-8", "replace")
        return str(product), address

    return first_reachable(addresses, probe)


def detect_mode(options: SourceOptions | BatchReadOptions) -> Mode:
    """The mode to run in: `options.mode` if given (checked against the broker), else
    what the broker's product name implies. A stream waits for an unreachable broker
    for its option reconnectTimeout (reconnect.py); a batch read fails at once."""
    if isinstance(options, SourceOptions):
        from .reconnect import Reconnect

        retry = Reconnect(options.reconnect_timeout_ms, "quorumqueue source (driver, start)")
        while True:
            try:
                product, address = server_product(options.addresses)
                break
            except BrokerUnreachable as error:
                retry.lost(error, "every node")
        retry.recovered()
    else:
        product, address = server_product(options.addresses)
    bundled = product == BUNDLED_PRODUCT
    if options.mode is Mode.LEASE and not bundled:
        raise OptionError(f"option 'mode' is 'lease', which needs the bundled quorumqueue "
                          f"broker, but {address.redacted} is {product or 'an unnamed broker'}"
                          "; use mode 'consume' (or leave 'mode' unset)")
    if options.mode is not None:
        return options.mode
    return Mode.LEASE if bundled else Mode.CONSUME


def open_connection(options: SourceOptions | BatchReadOptions) -> pika.BlockingConnection:
    """A BlockingConnection to the first reachable address of `uri`."""
    return first_reachable(options.addresses,
                           lambda address: pika.BlockingConnection(
                               address.parameters()))


def open_lease_client(options: SourceOptions | BatchReadOptions,
                      timeout: float = 30.0) -> LeaseClient:
    return first_reachable(
        options.addresses, lambda address: LeaseClient(address.uri, vhost=address.vhost,
                                                       tls=address.tls,
                                                       timeout=timeout))


def _describe(error: BaseException) -> str:
    if isinstance(error, ManagementError):
        # LeaseClient's message repeats the URI, password included: keep only the cause.
        text = str(error)
        return text.split(": ", 1)[1] if text.startswith("cannot connect to ") else text
    return repr(error)
