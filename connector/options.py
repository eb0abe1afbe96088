"""The source's options, parsed once into a frozen `SourceOptions`.

Responsibilities
    Turn the string map Spark hands a data source (`.option(key, value)`) into typed
    values, refusing an unknown key or an impossible value with an `OptionError`
    whose message names the option, so a query fails at start rather than
    misbehaving later.

How it works
    Spark treats option keys case-insensitively (PySpark passes a
    `CaseInsensitiveDict` whose keys are lower-cased), so keys are matched by their
    lower-case form and messages use the documented spelling (`maxMessagesPerTrigger`).
    Each option has one parser; `parse_source_options` runs them all and then the
    rules that involve several options.

Invariants
    - A `SourceOptions` only holds values that passed validation; nothing downstream
      re-checks them.
    - Messages never contain a password: broker addresses are shown redacted.
    - Pure: no I/O, no Spark. (Detecting `mode` when it is unset needs the network and
      lives in `connection.py`.)

Not here
    The sink's options (a later step) and the consume-mode rules that tie `prefetch`
    to the batch size.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from urllib.parse import unquote, urlsplit

import pika

from ..broker.management_client import redact_uri as _redact


class OptionError(ValueError):
    """An unknown or invalid option; the message names it."""


class Mode(StrEnum):
    LEASE = "lease"      # the bundled broker: durable leases, exactly-once replay
    CONSUME = "consume"  # any AMQP 0-9-1 broker: manual acks, at-least-once


@dataclass(frozen=True, slots=True)
class BrokerAddress:
    uri: str        # as given; carries the password, so never put it in a message
    host: str
    port: int
    vhost: str      # decoded ("%2F" -> "/"); an empty path means "/"

    @property
    def redacted(self) -> str:
        """The URI with its password replaced by `***`, for messages and logs."""
        return _redact(self.uri)


@dataclass(frozen=True, slots=True)
class SourceOptions:
    addresses: tuple[BrokerAddress, ...]   # >= 1, all of one vhost; tried in order
    queues: tuple[str, ...]                # >= 1, distinct, in the order given
    mode: Mode | None                      # None: detect from the broker at start
    max_messages_per_trigger: int | None   # None: no limit; else 1..MAX_GROW
    max_bytes_per_trigger: int | None      # None: no limit; else >= 1 (soft, see README)
    prefetch: int | None                   # consume mode; None: derived; else 1..65535
    lease_timeout_ms: int                  # lease mode; 0: the lease never expires
    include_headers: bool                  # False: the headers column is null
    fail_on_data_loss: bool                # False: skip ranges that can no longer be read

    @property
    def vhost(self) -> str:
        return self.addresses[0].vhost


# The broker's lease.grow takes max_messages as a 32-bit count.
MAX_GROW = 0xFFFFFFFF

# documented spelling, for messages
URI = "uri"
QUEUE = "queue"
MODE = "mode"
MAX_MESSAGES_PER_TRIGGER = "maxMessagesPerTrigger"
MAX_BYTES_PER_TRIGGER = "maxBytesPerTrigger"
PREFETCH = "prefetch"
LEASE_TIMEOUT = "leaseTimeout"
INCLUDE_HEADERS = "includeHeaders"
FAIL_ON_DATA_LOSS = "failOnDataLoss"

SOURCE_OPTIONS = (URI, QUEUE, MODE, MAX_MESSAGES_PER_TRIGGER, MAX_BYTES_PER_TRIGGER,
                  PREFETCH, LEASE_TIMEOUT, INCLUDE_HEADERS, FAIL_ON_DATA_LOSS)


def parse_source_options(options: Mapping[str, str]) -> SourceOptions:
    given = _case_insensitive(options, SOURCE_OPTIONS, "source")
    addresses = _addresses(_required(given, URI))
    max_messages = _optional(given, MAX_MESSAGES_PER_TRIGGER, _count)
    if max_messages is not None and max_messages > MAX_GROW:
        raise OptionError(f"option '{MAX_MESSAGES_PER_TRIGGER}' must be at most {MAX_GROW}, "
                          f"got {max_messages}")
    prefetch = _optional(given, PREFETCH, _count)
    if prefetch is not None and prefetch > 65535:
        raise OptionError(f"option '{PREFETCH}' must be at most 65535 (AMQP's basic.qos "
                          f"prefetch-count is 16 bits), got {prefetch}")
    return SourceOptions(
        addresses=addresses,
        queues=_queues(_required(given, QUEUE)),
        mode=_optional(given, MODE, _mode),
        max_messages_per_trigger=max_messages,
        max_bytes_per_trigger=_optional(given, MAX_BYTES_PER_TRIGGER, _size),
        prefetch=prefetch,
        lease_timeout_ms=_optional(given, LEASE_TIMEOUT, _duration_ms) or 0,
        include_headers=_optional(given, INCLUDE_HEADERS, _boolean, default=True),
        fail_on_data_loss=_optional(given, FAIL_ON_DATA_LOSS, _boolean, default=True),
    )


# ------------------------------------------------------------------ keys


def _case_insensitive(options: Mapping[str, str], known: tuple[str, ...],
                      role: str) -> dict[str, tuple[str, str]]:
    """lower-case key -> (key as given, value); refuses unknown keys and keys that
    differ only in case but carry different values."""
    by_lower = {name.lower(): name for name in known}
    given: dict[str, tuple[str, str]] = {}
    for key, value in options.items():
        lower = key.lower()
        if lower not in by_lower:
            close = difflib.get_close_matches(lower, list(by_lower), n=1, cutoff=0.6)
            hint = f" (did you mean '{by_lower[close[0]]}'?)" if close else ""
            raise OptionError(f"unknown option '{key}' for the quorumqueue {role}{hint}; "
                              f"known options: {', '.join(known)}")
        if lower in given and given[lower][1] != value:
            raise OptionError(f"option '{by_lower[lower]}' is given twice with different "
                              f"values ('{given[lower][0]}' and '{key}'; option names "
                              "are case-insensitive)")
        given[lower] = (by_lower[lower], value)
    return given


def _required(given: dict[str, tuple[str, str]], name: str) -> tuple[str, str]:
    entry = given.get(name.lower())
    if entry is None or not entry[1].strip():
        raise OptionError(f"option '{name}' is required")
    return entry


def _optional(given, name: str, parse, default=None):
    entry = given.get(name.lower())
    if entry is None:
        return default
    return parse(entry)


# ------------------------------------------------------------------ values


def _addresses(entry: tuple[str, str]) -> tuple[BrokerAddress, ...]:
    name, value = entry
    parts = [part.strip() for part in value.split(",")]
    if any(not part for part in parts):
        raise OptionError(f"option '{name}' has an empty entry in its comma-separated "
                          f"list: {_redact_list(value)!r}")
    addresses = tuple(_address(name, part) for part in parts)
    vhosts = {address.vhost for address in addresses}
    if len(vhosts) > 1:
        raise OptionError(f"option '{name}': every URI must name the same virtual host, "
                          f"got {', '.join(sorted(repr(v) for v in vhosts))}")
    return addresses


def _address(name: str, uri: str) -> BrokerAddress:
    shown = _redact(uri)
    parts = urlsplit(uri)
    if parts.scheme not in ("amqp", "amqps"):
        raise OptionError(f"option '{name}': {shown!r} is not an amqp:// or amqps:// URI")
    if not parts.hostname:
        raise OptionError(f"option '{name}': {shown!r} has no host")
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port is None:
        port = 5671 if parts.scheme == "amqps" else 5672
    if not 0 < port < 65536:
        raise OptionError(f"option '{name}': {shown!r} has an invalid port")
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    if "/" in path:
        raise OptionError(f"option '{name}': {shown!r}: the virtual host is the whole path "
                          "and a '/' inside it must be written %2F (amqp://host/%2F is '/')")
    try:
        pika.URLParameters(uri)  # what will connect: refuses unknown ?query parameters
    except ValueError as error:
        raise OptionError(f"option '{name}': {shown!r}: {error}") from None
    return BrokerAddress(uri=uri, host=parts.hostname, port=port,
                         vhost=unquote(path) if path else "/")


def _queues(entry: tuple[str, str]) -> tuple[str, ...]:
    name, value = entry
    queues = tuple(part.strip() for part in value.split(","))
    for queue in queues:
        if not queue:
            raise OptionError(f"option '{name}' has an empty queue name in {value!r}")
        if len(queue.encode()) > 255:
            raise OptionError(f"option '{name}': queue name {queue[:40]!r}... is longer "
                              "than 255 bytes (AMQP's limit)")
    duplicates = sorted({queue for queue in queues if queues.count(queue) > 1})
    if duplicates:
        raise OptionError(f"option '{name}' names {', '.join(map(repr, duplicates))} "
                          "more than once")
    return queues


def _mode(entry: tuple[str, str]) -> Mode:
    name, value = entry
    try:
        return Mode(value.strip().lower())
    except ValueError:
        raise OptionError(f"option '{name}' must be 'lease' (the bundled broker) or "
                          f"'consume' (any AMQP 0-9-1 broker), got {value!r}; leave it "
                          "unset to detect it from the broker") from None


_INTEGER = re.compile(r"\d+")


def _count(entry: tuple[str, str]) -> int:
    name, value = entry
    text = value.strip()
    if not _INTEGER.fullmatch(text) or int(text) < 1:
        raise OptionError(f"option '{name}' must be a positive integer, got {value!r}")
    return int(text)


# Spark's byte strings (JavaUtils.byteStringAs): binary units, optional trailing "b".
_SIZE = re.compile(r"(\d+)\s*(b|kb?|mb?|gb?|tb?|pb?)?", re.IGNORECASE)
_SIZE_FACTORS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40,
                 "p": 1 << 50}


def _size(entry: tuple[str, str]) -> int:
    name, value = entry
    match = _SIZE.fullmatch(value.strip())
    size = match and int(match.group(1)) * _SIZE_FACTORS[(match.group(2) or "")[:1].lower()]
    if not size:
        raise OptionError(f"option '{name}' must be a positive number of bytes, optionally "
                          f"with a unit as in Spark (512k, 64m, 1g), got {value!r}")
    return size


# Spark's time strings (JavaUtils.timeStringAs): a bare number is milliseconds.
_DURATION = re.compile(r"(\d+)\s*(ms|s|m|min|h|d)?", re.IGNORECASE)
_DURATION_FACTORS = {"": 1, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000,
                     "h": 3_600_000, "d": 86_400_000}


def _duration_ms(entry: tuple[str, str]) -> int:
    name, value = entry
    text = value.strip().lower()
    if text in ("none", "never"):
        return 0
    match = _DURATION.fullmatch(text)
    if not match:
        raise OptionError(f"option '{name}' must be a duration such as 30s, 10m, 2h or 1d "
                          f"(a bare number is milliseconds; 0 or 'never': no timeout), "
                          f"got {value!r}")
    return int(match.group(1)) * _DURATION_FACTORS[match.group(2) or ""]


def _boolean(entry: tuple[str, str]) -> bool:
    name, value = entry
    text = value.strip().lower()
    if text not in ("true", "false"):
        raise OptionError(f"option '{name}' must be true or false, got {value!r}")
    return text == "true"


# ------------------------------------------------------------------ redaction


def _redact_list(value: str) -> str:
    return ",".join(_redact(part.strip()) for part in value.split(","))
