"""The source's options, parsed once into a frozen `SourceOptions` (streams) or
`BatchReadOptions` (batch reads); `consume_limits` ties consume mode's prefetch to
the batch size.

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
    - A stream names its queues (`queue`) or matches them (`queuePattern`, lease
      mode only), never both.
    - Streaming and batch reads share `uri`, `queue`, `mode` and `includeHeaders`;
      an option of the other kind of read is refused with a message saying which
      read it belongs to.

The sink's options (`SinkOptions`, `parse_sink_options`) are the last section;
sink.py reads them.

Not here
    Which columns the sink accepts (sink_rows.py).
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from urllib.parse import unquote, urlsplit

import pika

from ..client.management import redact_uri as _redact
from ..client.tls import ClientTls, connection_parameters


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
    # the tls.* options (amqps:// only); None: the URI's own (pika's defaults, or
    # RabbitMQ's query parameters cacertfile, certfile...)
    tls: ClientTls | None = None

    @property
    def redacted(self) -> str:
        """The URI with its password replaced by `***`, for messages and logs."""
        return _redact(self.uri)

    def parameters(self) -> pika.URLParameters:
        """What a connection to this address is opened with (TLS set up for amqps://)."""
        return connection_parameters(self.uri, self.tls)


@dataclass(frozen=True, slots=True)
class SourceOptions:
    addresses: tuple[BrokerAddress, ...]   # >= 1, all of one vhost; tried in order
    queues: tuple[str, ...]                # >= 1, distinct, in the order given
    mode: Mode | None                      # None: detect from the broker at start
    max_messages_per_trigger: int | None   # None: no limit; else 1..MAX_GROW
    max_bytes_per_trigger: int | None      # None: no limit; else >= 1 (soft, see README)
    prefetch: int | None                   # consume mode; None: derived; else 1..65535
    # lease mode: 0: the lease never expires; None: not given, the broker's
    # lease_timeout applies (30 minutes unless configured otherwise)
    lease_timeout_ms: int | None
    include_headers: bool                  # False: the headers column is null
    fail_on_data_loss: bool                # False: skip ranges that can no longer be read
    release_lease_on_stop: bool = False    # lease mode: release the lease in stop()
    # queuePattern: every queue of the vhost whose whole name matches; then `queues`
    # is empty (the reader lists the vhost's queues), else None
    queue_pattern: re.Pattern[str] | None = None
    min_messages_per_trigger: int | None = None   # None: no minimum; else 1..
    max_trigger_delay_ms: int = 0          # > 0 when min_messages_per_trigger is set
    min_partitions: int | None = None      # None: the mode's default cut
    max_messages_per_partition: int | None = None  # None: the mode's default cap
    # how long a lost broker is retried (every address, with backoff) before the
    # query fails; 0: fail at the first loss
    reconnect_timeout_ms: int = 60_000

    @property
    def vhost(self) -> str:
        return self.addresses[0].vhost


@dataclass(frozen=True, slots=True)
class BatchReadOptions:
    """`spark.read.format("quorumqueue")`: drain (or peek at) up to `max_messages`."""

    addresses: tuple[BrokerAddress, ...]   # as in SourceOptions
    queues: tuple[str, ...]
    mode: Mode | None
    max_messages: int                      # per queue, 1..MAX_GROW
    peek: bool                             # True: settle nothing, return what was read
    include_headers: bool

    @property
    def vhost(self) -> str:
        return self.addresses[0].vhost


@dataclass(frozen=True, slots=True)
class ConsumeLimits:
    """Consume mode's flow control: basic.qos prefetch, and the largest batch it allows."""

    prefetch: int            # per queue (one channel each), 3..65535
    max_batch_messages: int  # <= (prefetch - 1) // 2: prefetch exceeds two batches


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
RELEASE_LEASE_ON_STOP = "releaseLeaseOnStop"
QUEUE_PATTERN = "queuePattern"
MIN_MESSAGES_PER_TRIGGER = "minMessagesPerTrigger"
MAX_TRIGGER_DELAY = "maxTriggerDelay"
MIN_PARTITIONS = "minPartitions"
MAX_MESSAGES_PER_PARTITION = "maxMessagesPerPartition"
MAX_MESSAGES = "maxMessages"
PEEK = "peek"
RECONNECT_TIMEOUT = "reconnectTimeout"
# amqps:// (client/tls.py), named as Spark's own TLS settings are (spark.ssl.trustStore...)
TLS_CA_FILE = "tls.caFile"
TLS_CERT_FILE = "tls.certFile"
TLS_KEY_FILE = "tls.keyFile"
TLS_KEY_PASSWORD = "tls.keyPassword"
TLS_VERIFY = "tls.verify"
TLS_OPTIONS = (TLS_CA_FILE, TLS_CERT_FILE, TLS_KEY_FILE, TLS_KEY_PASSWORD, TLS_VERIFY)

SOURCE_OPTIONS = (URI, QUEUE, MODE, QUEUE_PATTERN, MAX_MESSAGES_PER_TRIGGER,
                  MAX_BYTES_PER_TRIGGER, MIN_MESSAGES_PER_TRIGGER, MAX_TRIGGER_DELAY,
                  MIN_PARTITIONS, MAX_MESSAGES_PER_PARTITION, PREFETCH, LEASE_TIMEOUT,
                  INCLUDE_HEADERS, FAIL_ON_DATA_LOSS, RELEASE_LEASE_ON_STOP,
                  RECONNECT_TIMEOUT) + TLS_OPTIONS
BATCH_READ_OPTIONS = (URI, QUEUE, MODE, MAX_MESSAGES, PEEK, INCLUDE_HEADERS) + TLS_OPTIONS

# How long the source and the sink retry a lost broker by default (Spark-style duration).
DEFAULT_RECONNECT_TIMEOUT_MS = 60_000

# Kafka's default maxTriggerDelay, for minMessagesPerTrigger without one.
DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60 * 1000

# Consume mode: AMQP's prefetch-count is 16 bits; without `prefetch` nor
# `maxMessagesPerTrigger`, this prefetch (and batches of at most 4,999 messages).
MAX_PREFETCH = 65535
DEFAULT_PREFETCH = 10_000

_FOR_BATCH_READS = ("is an option of batch reads (spark.read); a stream sizes its batches "
                    f"with '{MAX_MESSAGES_PER_TRIGGER}' and '{MAX_BYTES_PER_TRIGGER}'")
_FOR_STREAMS = ("is an option of streaming reads (spark.readStream); a batch read takes "
                f"'{MAX_MESSAGES}' (required) and '{PEEK}'")


def parse_source_options(options: Mapping[str, str]) -> SourceOptions:
    """The options of `spark.readStream.format("quorumqueue")`."""
    _refuse_other_kind(options, (MAX_MESSAGES, PEEK), _FOR_BATCH_READS)
    given = _case_insensitive(options, SOURCE_OPTIONS, "source")
    addresses = _with_tls(given, _addresses(_required(given, URI)))
    max_messages = _optional(given, MAX_MESSAGES_PER_TRIGGER, _count)
    if max_messages is not None and max_messages > MAX_GROW:
        raise OptionError(f"option '{MAX_MESSAGES_PER_TRIGGER}' must be at most {MAX_GROW}, "
                          f"got {max_messages}")
    prefetch = _optional(given, PREFETCH, _count)
    if prefetch is not None and prefetch > 65535:
        raise OptionError(f"option '{PREFETCH}' must be at most 65535 (AMQP's basic.qos "
                          f"prefetch-count is 16 bits), got {prefetch}")
    mode = _optional(given, MODE, _mode)
    queues, pattern = _queues_or_pattern(given, mode)
    min_messages, max_delay_ms = _trigger_minimum(given, max_messages)
    return SourceOptions(
        addresses=addresses,
        queues=queues,
        queue_pattern=pattern,
        mode=mode,
        max_messages_per_trigger=max_messages,
        min_messages_per_trigger=min_messages,
        max_trigger_delay_ms=max_delay_ms,
        min_partitions=_optional(given, MIN_PARTITIONS, _count),
        max_messages_per_partition=_optional(given, MAX_MESSAGES_PER_PARTITION, _count),
        max_bytes_per_trigger=_optional(given, MAX_BYTES_PER_TRIGGER, _size),
        prefetch=prefetch,
        lease_timeout_ms=_optional(given, LEASE_TIMEOUT, _duration_ms),
        include_headers=_optional(given, INCLUDE_HEADERS, _boolean, default=True),
        fail_on_data_loss=_optional(given, FAIL_ON_DATA_LOSS, _boolean, default=True),
        release_lease_on_stop=_optional(given, RELEASE_LEASE_ON_STOP, _boolean,
                                        default=False),
        reconnect_timeout_ms=_reconnect_timeout(given),
    )


def _reconnect_timeout(given) -> int:
    """Option reconnectTimeout: a duration, 0 for no retrying; 'never' is refused (a
    query that waits forever for a broker that is gone looks alive and does nothing)."""
    entry = given.get(RECONNECT_TIMEOUT.lower())
    if entry is None:
        return DEFAULT_RECONNECT_TIMEOUT_MS
    if entry[1].strip().lower() in ("none", "never"):
        raise OptionError(f"option '{RECONNECT_TIMEOUT}' must be a duration such as 60s, 5m "
                          f"or 1h (how long a lost broker is retried before the query "
                          f"fails; 0: fail at once), got {entry[1]!r}")
    return _duration_ms(entry)


def _queues_or_pattern(given, mode: Mode | None
                       ) -> tuple[tuple[str, ...], re.Pattern[str] | None]:
    """Option `queue` (names) or option `queuePattern` (a regular expression), one of them."""
    named, pattern = given.get(QUEUE.lower()), given.get(QUEUE_PATTERN.lower())
    if named is not None and pattern is not None:
        raise OptionError(f"options '{QUEUE}' and '{QUEUE_PATTERN}' cannot be used together: "
                          f"name the queues with '{QUEUE}', or match them with "
                          f"'{QUEUE_PATTERN}', not both")
    if pattern is None:
        return _queues(_required(given, QUEUE, f"(or '{QUEUE_PATTERN}', a regular expression "
                                               "matching the queues to read)")), None
    if mode is Mode.CONSUME:
        raise OptionError(consume_mode_pattern_error())
    return (), _pattern(pattern)


def consume_mode_pattern_error() -> str:
    return (f"option '{QUEUE_PATTERN}' needs lease mode: the bundled broker lists a "
            "vhost's queues through its management RPC, which AMQP 0-9-1 itself (and so "
            f"RabbitMQ, read in consume mode) does not offer; name the queues with option "
            f"'{QUEUE}' instead")


def _pattern(entry: tuple[str, str]) -> re.Pattern[str]:
    name, value = entry
    if not value.strip():
        raise OptionError(f"option '{name}' is required to be a non-empty regular expression")
    try:
        return re.compile(value)
    except re.error as error:
        raise OptionError(f"option '{name}' is not a valid regular expression ({error}): "
                          f"{value!r}; it must match whole queue names, as in "
                          "'orders\\..*'") from None


def _trigger_minimum(given, max_messages: int | None) -> tuple[int | None, int]:
    """minMessagesPerTrigger and maxTriggerDelay (which only means something with it)."""
    minimum = _optional(given, MIN_MESSAGES_PER_TRIGGER, _count)
    delay = given.get(MAX_TRIGGER_DELAY.lower())
    if minimum is None:
        if delay is not None:
            raise OptionError(f"option '{MAX_TRIGGER_DELAY}' only applies with option "
                              f"'{MIN_MESSAGES_PER_TRIGGER}' (how long to wait for that many "
                              f"messages); set '{MIN_MESSAGES_PER_TRIGGER}' or remove "
                              f"'{MAX_TRIGGER_DELAY}'")
        return None, 0
    if max_messages is not None and minimum > max_messages:
        raise OptionError(f"option '{MIN_MESSAGES_PER_TRIGGER}' ({minimum}) is above option "
                          f"'{MAX_MESSAGES_PER_TRIGGER}' ({max_messages}): no batch could "
                          f"satisfy both; lower '{MIN_MESSAGES_PER_TRIGGER}' or raise "
                          f"'{MAX_MESSAGES_PER_TRIGGER}'")
    if delay is None:
        return minimum, DEFAULT_MAX_TRIGGER_DELAY_MS
    delay_ms = _duration_ms(delay)
    if delay_ms <= 0:
        raise OptionError(f"option '{MAX_TRIGGER_DELAY}' must be a positive duration such as "
                          f"30s or 15m (the longest a batch waits for "
                          f"'{MIN_MESSAGES_PER_TRIGGER}' messages), got {delay[1]!r}")
    return minimum, delay_ms


def parse_batch_read_options(options: Mapping[str, str]) -> BatchReadOptions:
    """The options of `spark.read.format("quorumqueue")`."""
    streaming_only = tuple(name for name in SOURCE_OPTIONS if name not in BATCH_READ_OPTIONS)
    _refuse_other_kind(options, streaming_only, _FOR_STREAMS)
    given = _case_insensitive(options, BATCH_READ_OPTIONS, "batch read")
    max_messages = _count(_required(given, MAX_MESSAGES, "for a batch read: how many messages "
                                    "to read from each queue"))
    if max_messages > MAX_GROW:
        raise OptionError(f"option '{MAX_MESSAGES}' must be at most {MAX_GROW}, "
                          f"got {max_messages}")
    return BatchReadOptions(
        addresses=_with_tls(given, _addresses(_required(given, URI))),
        queues=_queues(_required(given, QUEUE)),
        mode=_optional(given, MODE, _mode),
        max_messages=max_messages,
        peek=_optional(given, PEEK, _boolean, default=False),
        include_headers=_optional(given, INCLUDE_HEADERS, _boolean, default=True),
    )


def parse_read_options(options: Mapping[str, str]) -> SourceOptions | BatchReadOptions:
    """What `load()` can check before it knows whether the read is a stream or a batch:
    the batch options if one of its own options is given, else the stream's."""
    batch_only = {name.lower() for name in (MAX_MESSAGES, PEEK)}
    if any(key.lower() in batch_only for key in options):
        return parse_batch_read_options(options)
    return parse_source_options(options)


def consume_limits(options: SourceOptions) -> ConsumeLimits:
    """Consume mode's prefetch, and the largest batch it leaves room for.

    A batch's deliveries stay unacked until Spark has committed it, so while batch N+1
    is collected batch N may still be unacked: prefetch must exceed two batches, or the
    broker stops delivering and the query stalls (connector/README.md, "Consume mode").
    """
    per_trigger, prefetch = options.max_messages_per_trigger, options.prefetch
    if per_trigger is None:
        prefetch = prefetch or DEFAULT_PREFETCH
        if prefetch < 3:
            raise OptionError(f"option '{PREFETCH}' must be at least 3 in consume mode (a "
                              f"batch takes at most (prefetch - 1) / 2 messages so that "
                              f"prefetch exceeds two batches), got {prefetch}")
        return ConsumeLimits(prefetch, (prefetch - 1) // 2)
    if prefetch is None:
        if 2 * per_trigger >= MAX_PREFETCH:
            raise OptionError(
                f"option '{MAX_MESSAGES_PER_TRIGGER}' must be at most {MAX_PREFETCH // 2} in "
                f"consume mode, got {per_trigger}: option '{PREFETCH}' must exceed two "
                f"batches and AMQP caps it at {MAX_PREFETCH}")
        return ConsumeLimits(min(MAX_PREFETCH, 3 * per_trigger), per_trigger)
    if prefetch <= 2 * per_trigger:
        raise OptionError(
            f"option '{PREFETCH}' ({prefetch}) must exceed two batches of option "
            f"'{MAX_MESSAGES_PER_TRIGGER}' ({per_trigger}), or the query stalls waiting for "
            f"acks that come one batch later; set '{PREFETCH}' to at least "
            f"{2 * per_trigger + 1}, lower '{MAX_MESSAGES_PER_TRIGGER}', or leave "
            f"'{PREFETCH}' unset to derive it")
    return ConsumeLimits(prefetch, per_trigger)


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
            raise OptionError(_unknown_option(key, known, by_lower, role))
        if lower in given and given[lower][1] != value:
            raise OptionError(f"option '{by_lower[lower]}' is given twice with different "
                              f"values ('{given[lower][0]}' and '{key}'; option names "
                              "are case-insensitive)")
        given[lower] = (by_lower[lower], value)
    return given


# Options of Spark's Kafka source and sink (the Structured Streaming + Kafka
# Integration Guide) by lower-cased name: their name as Kafka spells it, and the
# quorumqueue option that does that job (None: none, a queue is not a log). Spark hands
# a data source its option names lower-cased, so these are how a user typed them.
KAFKA_OPTIONS: dict[str, tuple[str, str | None]] = {
    name.lower(): (name, ours) for name, ours in (
    ("kafka.bootstrap.servers", "uri"), ("subscribe", "queue"), ("assign", "queue"),
    ("subscribePattern", "queuePattern"), ("maxOffsetsPerTrigger", "maxMessagesPerTrigger"),
    ("minOffsetsPerTrigger", "minMessagesPerTrigger"), ("topic", "routingKey"),
    ("startingOffsets", None), ("endingOffsets", None), ("startingTimestamp", None),
    ("endingTimestamp", None), ("startingOffsetsByTimestamp", None),
    ("endingOffsetsByTimestamp", None), ("kafkaConsumer.pollTimeoutMs", None),
    ("fetchOffset.numRetries", None))}


def _unknown_option(key: str, known: tuple[str, ...], by_lower: dict[str, str],
                    role: str) -> str:
    """The refusal of option `key`: a Kafka option's quorumqueue counterpart, else the
    closest known name."""
    lower = key.lower()
    kafka = KAFKA_OPTIONS.get(lower)
    if kafka is not None:
        name, ours = kafka
        if ours is not None and ours.lower() in by_lower:
            hint = f" (Kafka's '{name}'; here: '{by_lower[ours.lower()]}')"
        else:
            hint = (f" (Kafka's '{name}' has no counterpart: connector/README.md, \"Coming "
                    "from Kafka\")")
        key = name
    else:
        close = difflib.get_close_matches(lower, list(by_lower), n=1, cutoff=0.6)
        hint = f" (did you mean '{by_lower[close[0]]}'?)" if close else ""
    return (f"unknown option '{key}' for the quorumqueue {role}{hint}; known options: "
            f"{', '.join(known)}")


def _refuse_other_kind(options: Mapping[str, str], names: tuple[str, ...], why: str) -> None:
    by_lower = {name.lower(): name for name in names}
    for key in options:
        if key.lower() in by_lower:
            raise OptionError(f"option '{by_lower[key.lower()]}' {why}")


def _required(given: dict[str, tuple[str, str]], name: str,
              what: str = "") -> tuple[str, str]:
    entry = given.get(name.lower())
    if entry is None or not entry[1].strip():
        raise OptionError(f"option '{name}' is required" + (f" {what}" if what else ""))
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
        # what will connect: refuses unknown ?query parameters, reads TLS files
        connection_parameters(uri)
    except ValueError as error:
        raise OptionError(f"option '{name}': {shown!r}: {error}") from None
    return BrokerAddress(uri=uri, host=parts.hostname, port=port,
                         vhost=unquote(path) if path else "/")


def _with_tls(given, addresses: tuple[BrokerAddress, ...]) -> tuple[BrokerAddress, ...]:
    """The tls.* options onto every address: amqps:// URIs only; the files are read
    now (on the driver), so a missing or unusable one fails the query at start. The
    same paths must be readable on every executor."""
    entries = {name: given.get(name.lower()) for name in TLS_OPTIONS}
    if not any(entries.values()):
        return addresses
    first = next(entry for entry in entries.values() if entry)[0]
    plain = [a.redacted for a in addresses if not a.uri.lower().startswith("amqps:")]
    if plain:
        raise OptionError(f"option '{first}' needs amqps:// URIs (TLS), but option 'uri' "
                          f"has {', '.join(plain)}")
    files = {}
    for name, field_name in ((TLS_CA_FILE, "ca_file"), (TLS_CERT_FILE, "cert_file"),
                             (TLS_KEY_FILE, "key_file")):
        entry = entries[name]
        if entry is not None:
            path = entry[1].strip()
            if not os.path.isfile(path):
                raise OptionError(f"option '{name}': {path!r} does not exist or is not a "
                                  "file (it must be readable at this path on the driver and "
                                  "on every executor)")
            files[field_name] = path
    if files.get("key_file") and not files.get("cert_file"):
        raise OptionError(f"option '{TLS_KEY_FILE}' needs option '{TLS_CERT_FILE}'")
    verify = entries[TLS_VERIFY]
    tls = ClientTls(**files, key_password=entries[TLS_KEY_PASSWORD][1]
                    if entries[TLS_KEY_PASSWORD] else "",
                    verify=_boolean(verify) if verify else True)
    try:
        tls.context()
    except ValueError as error:
        raise OptionError(f"option '{TLS_CERT_FILE}': {error}") from None
    try:
        for address in addresses:
            replace(address, tls=tls).parameters()
    except ValueError as error:  # the URI's own query parameters disagree
        raise OptionError(f"option '{first}': {error}") from None
    return tuple(replace(address, tls=tls) for address in addresses)


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


# ================================================================== the sink
# df.writeStream / df.write .format("quorumqueue"): sink.py reads these.


@dataclass(frozen=True, slots=True)
class SinkOptions:
    addresses: tuple[BrokerAddress, ...]   # >= 1, all of one vhost; tried in order
    exchange: str                          # "" is the default exchange (routes by queue name)
    routing_key: str | None                # for rows without a routing_key; None: not given
    mandatory: bool                        # unroutable messages come back and fail the task
    confirm_timeout_ms: int                # > 0: the longest wait without any confirm
    # a lost broker is retried this long (every address, with backoff); 0: the task fails
    reconnect_timeout_ms: int = DEFAULT_RECONNECT_TIMEOUT_MS

    @property
    def vhost(self) -> str:
        return self.addresses[0].vhost


EXCHANGE = "exchange"
ROUTING_KEY = "routingKey"
MANDATORY = "mandatory"
CONFIRM_TIMEOUT = "confirmTimeout"
# Spark passes these writeStream options to the sink too.
CHECKPOINT_LOCATION = "checkpointLocation"
ASYNC_PROGRESS_TRACKING = "asyncProgressTrackingEnabled"
ASYNC_PROGRESS_INTERVAL = "asyncProgressTrackingCheckpointIntervalMs"

SINK_OPTIONS = (URI, EXCHANGE, ROUTING_KEY, MANDATORY, CONFIRM_TIMEOUT, RECONNECT_TIMEOUT,
                CHECKPOINT_LOCATION, ASYNC_PROGRESS_TRACKING, ASYNC_PROGRESS_INTERVAL
                ) + TLS_OPTIONS
DEFAULT_CONFIRM_TIMEOUT_MS = 30_000


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    given = _case_insensitive(options, SINK_OPTIONS, "sink")
    if _optional(given, ASYNC_PROGRESS_TRACKING, _boolean, default=False):
        raise OptionError(f"option '{ASYNC_PROGRESS_TRACKING}' is not supported by the "
                          "quorumqueue sink: after a restart it can run a batch id again "
                          "with other rows, and the sink's de-duplication by (batch, row) "
                          "would then drop messages; remove the option or set it to false")
    timeout = _optional(given, CONFIRM_TIMEOUT, _duration_ms,
                        default=DEFAULT_CONFIRM_TIMEOUT_MS)
    if timeout <= 0:
        raise OptionError(f"option '{CONFIRM_TIMEOUT}' must be a positive duration such as "
                          f"30s or 2m (the sink never waits for confirms forever), got "
                          f"{given[CONFIRM_TIMEOUT.lower()][1]!r}")
    return SinkOptions(
        addresses=_with_tls(given, _addresses(_required(given, URI))),
        exchange=_optional(given, EXCHANGE, _short_name, default=""),
        routing_key=_optional(given, ROUTING_KEY, _short_name),
        mandatory=_optional(given, MANDATORY, _boolean, default=False),
        confirm_timeout_ms=timeout,
        reconnect_timeout_ms=_reconnect_timeout(given),
    )


def _short_name(entry: tuple[str, str]) -> str:
    """An exchange name or routing key: AMQP short strings, at most 255 bytes."""
    name, value = entry
    if len(value.encode("utf-8")) > 255:
        raise OptionError(f"option '{name}' is longer than 255 bytes (AMQP's limit): "
                          f"{value[:40]!r}...")
    return value
