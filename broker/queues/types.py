"""The queue-type plug point: which queue types exist, what each accepts at declare.

`validate_declaration` checks a queue.declare against the type named by
`x-queue-type` the way RabbitMQ's queue types do (durable/exclusive/auto-delete
constraints, the arguments each type supports, argument value types and ranges)
and returns the `QueueSpec` the node builds the queue from. Errors are AMQPErrors
with RabbitMQ's reply codes and wording.

Types: `classic` (broker.queues.classic) and `quorum` (broker.queues.quorum, a Raft
group and the fifo machine); `stream` is refused with 540. Not here: equivalence
checks against an existing queue (node).
"""

from __future__ import annotations

import decimal
from dataclasses import dataclass

from ..amqp import spec
from ..amqp.errors import AMQPError, precondition
from ..field_values import KEPT, Timestamp

QUEUE_TYPES = ("classic", "quorum", "stream")

# arguments each type understands, with the AMQP value kind RabbitMQ requires
_INT = "int"
_STR = "str"
_BOOL = "bool"
_COMMON_ARGS = {
    "x-queue-type": _STR,
    "x-max-length": _INT,
    "x-max-length-bytes": _INT,
    "x-overflow": _STR,
    "x-message-ttl": _INT,
    "x-expires": _INT,
    "x-dead-letter-exchange": _STR,
    "x-dead-letter-routing-key": _STR,
    "x-single-active-consumer": _BOOL,
    "x-queue-leader-locator": _STR,
    # the delivery acknowledgement timeout in ms (node/channel.py); 3.12+ on both types
    "x-consumer-timeout": _INT,
}
ARGUMENTS_BY_TYPE = {
    "classic": {**_COMMON_ARGS, "x-max-priority": _INT, "x-queue-mode": _STR,
                "x-queue-master-locator": _STR, "x-queue-version": _INT},
    # x-max-in-memory-length/-bytes: accepted with no effect, as RabbitMQ since 3.10 (the
    # quorum queues guide, "Lazy Mode": bodies are always on disk; here in the log)
    "quorum": {**_COMMON_ARGS, "x-delivery-limit": _INT, "x-quorum-initial-group-size": _INT,
               "x-quorum-target-group-size": _INT, "x-dead-letter-strategy": _STR,
               "x-max-in-memory-length": _INT, "x-max-in-memory-bytes": _INT},
}
# RabbitMQ's stream queues' arguments: known to RabbitMQ, so refused by the other types
_STREAM_ARGS = ("x-max-age", "x-stream-max-segment-size-bytes", "x-initial-cluster-size",
                "x-stream-filter-size-bytes")
# rabbit_queue_type_util:check_invalid_arguments: an argument some queue type knows but
# the declared one does not is refused "of queue type rabbit_<type>_queue" (classic
# queues refuse x-delivery-limit, x-max-in-memory-length...; quorum queues
# x-max-priority, x-queue-mode, x-queue-version...); one no type knows is accepted
_KNOWN_ARGUMENTS = frozenset(k for kinds in ARGUMENTS_BY_TYPE.values() for k in kinds) \
    - {"x-quorum-target-group-size"} | frozenset(_STREAM_ARGS)
_OVERFLOW = ("drop-head", "reject-publish", "reject-publish-dlx")
# rabbit_queue_location:queue_leader_locators() in RabbitMQ 4.x: the last three are
# deprecated and mean balanced (queues/settings.py leader_locator)
LEADER_LOCATORS = ("client-local", "balanced", "random", "least-leaders", "min-masters")
DEAD_LETTER_STRATEGIES = ("at-most-once", "at-least-once")
_QUEUE_MODES = ("default", "lazy")
# the arguments a redeclare must match (RabbitMQ: rabbit_amqqueue:declare_args/0, in
# its order); any other argument may differ between declarations
EQUIVALENCE_KEYS = ("x-expires", "x-message-ttl", "x-dead-letter-exchange",
                    "x-dead-letter-routing-key", "x-max-length", "x-max-length-bytes",
                    "x-max-in-memory-length", "x-max-in-memory-bytes", "x-max-priority",
                    "x-overflow", "x-queue-mode", "x-single-active-consumer", "x-queue-type",
                    "x-quorum-initial-group-size", "x-max-age",
                    "x-stream-max-segment-size-bytes", "x-initial-cluster-size",
                    "x-queue-leader-locator")
# quorum queues compare every argument their type knows (rabbit_quorum_queue)
EQUIVALENCE_KEYS_BY_TYPE = {
    "classic": EQUIVALENCE_KEYS,
    "quorum": EQUIVALENCE_KEYS + ("x-delivery-limit", "x-dead-letter-strategy",
                                  "x-quorum-target-group-size"),
}


@dataclass(frozen=True, slots=True)
class QueueSpec:
    type: str
    durable: bool
    exclusive: bool
    auto_delete: bool
    arguments: dict
    max_priority: int = 0
    max_length: int | None = None
    max_length_bytes: int | None = None
    overflow: str = "drop-head"
    single_active_consumer: bool = False


def _describe(name: str, vhost: str) -> str:
    return f"queue '{name}' in vhost '{vhost}'"


def _text(value) -> str | None:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return value if isinstance(value, str) else None


def field_type(value) -> str:
    """The AMQP field type RabbitMQ names in errors for a decoded table value."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, Timestamp):
        return "timestamp"
    if isinstance(value, KEPT):  # a declare's argument keeps its wire type
        return value.name
    if isinstance(value, int):
        return "signedint" if -2 ** 31 <= value < 2 ** 31 else "long"
    for kinds, name in ((bytearray, "binary"), ((str, bytes), "longstr"), (float, "double"), (dict, "table"),
                        (list, "array"),
                        (decimal.Decimal, "decimal")):
        if isinstance(value, kinds):
            return name
    return "void" if value is None else type(value).__name__


def check_int_argument(key: str, value, where: str) -> None:
    """RabbitMQ's check_int_arg (queue and consumer arguments)."""
    if not isinstance(value, int) or isinstance(value, (bool, Timestamp)):
        raise precondition(f"invalid arg '{key}' for {where}: "
                           f"\"expected integer, got {field_type(value)}\"")


def _check_kind(key: str, value, kind: str, where: str) -> None:
    if kind == _INT:
        check_int_argument(key, value, where)
        return
    ok = _text(value) is not None if kind == _STR else isinstance(value, bool)
    if not ok:
        raise precondition(f"invalid arg '{key}' for {where}: "
                           f"{{unacceptable_type,{field_type(value)}}}")


def queue_type_of(arguments: dict, default: str = "classic") -> str:
    value = arguments.get("x-queue-type")
    return _text(value) or default if value is not None else default


def check_server_named(arguments: dict) -> None:
    """queue.declare with an empty name: the server names it (amq.gen-...), which
    quorum queues refuse, as RabbitMQ does."""
    if queue_type_of(arguments) == "quorum":
        raise precondition("Cannot declare a server-named queue for type "
                           "rabbit_quorum_queue")


def validate_declaration(name: str, vhost: str, durable: bool, exclusive: bool,
                         auto_delete: bool, arguments: dict,
                         recorded: bool = False) -> QueueSpec:
    """The QueueSpec of a declaration, or its refusal. `recorded`: a declaration the
    metadata already holds (its log replayed, a snapshot, the metadata file): the
    refusals added since an earlier build may have recorded it are skipped, so a
    queue it declared is never lost on an upgrade."""
    where = _describe(name, vhost)
    queue_type = queue_type_of(arguments)
    if queue_type not in QUEUE_TYPES:
        raise precondition(f"invalid arg 'x-queue-type' for {where}: "
                           f"\"unsupported queue type '{queue_type}'\"")
    if queue_type == "stream":
        raise AMQPError(spec.NOT_IMPLEMENTED,
                        f"queue type 'stream' is not supported by quorumqueue ({where})",
                        connection_level=False)
    if queue_type == "quorum":
        # RabbitMQ's order: auto-delete, exclusive, then durability
        if auto_delete:
            raise precondition(f"invalid property 'auto-delete' for {where}")
        if exclusive:
            raise precondition(f"invalid property 'exclusive-owner' for {where}")
        if not durable:
            raise precondition(f"invalid property 'non-durable' for {where}")
    known = ARGUMENTS_BY_TYPE[queue_type]
    for key in arguments:
        if key in _KNOWN_ARGUMENTS and key not in known:
            raise precondition(
                f"invalid arg '{key}' for {where} of queue type rabbit_{queue_type}_queue")
    for key, value in arguments.items():
        kind = known.get(key)
        if kind is not None:
            _check_kind(key, value, kind, where)
    max_priority = arguments.get("x-max-priority", 0)
    if isinstance(max_priority, int) and not 0 <= max_priority <= 255:
        raise precondition(f"invalid arg 'x-max-priority' for {where}: "
                           + (f"{{max_value_exceeded,{max_priority}}}" if max_priority > 255
                              else f"{{value_negative,{max_priority}}}"))
    for key in ("x-max-length", "x-max-length-bytes", "x-max-in-memory-length",
                "x-max-in-memory-bytes"):
        value = arguments.get(key)
        if isinstance(value, int) and value < 0:
            raise precondition(f"invalid arg '{key}' for {where}: {{value_negative,{value}}}")
    overflow = _text(arguments.get("x-overflow")) or "drop-head"
    if overflow not in _OVERFLOW:
        raise precondition(f"invalid arg 'x-overflow' for {where}: invalid_overflow")
    # rabbit_amqqueue's check_queue_leader_locator_arg and check_dlxstrategy_arg
    locator = arguments.get("x-queue-leader-locator")
    if locator is not None and _text(locator) not in LEADER_LOCATORS:
        raise precondition(f"invalid arg 'x-queue-leader-locator' for {where}: "
                           "invalid_queue_locator_arg")
    strategy = arguments.get("x-dead-letter-strategy")
    if strategy is not None and _text(strategy) not in DEAD_LETTER_STRATEGIES:
        raise precondition(f"invalid arg 'x-dead-letter-strategy' for {where}: "
                           "invalid_dlx_strategy")
    # x-queue-master-locator: RabbitMQ 4's deprecated feature queue_master_locator
    # (permitted by default) reads it where x-queue-leader-locator is absent, its
    # values mapped as the leader locator's (queues/settings.py leader_locator)
    master = arguments.get("x-queue-master-locator")
    if master is not None and _text(master) not in LEADER_LOCATORS:
        raise precondition(f"invalid arg 'x-queue-master-locator' for {where}: "
                           "invalid_queue_locator_arg")
    mode = _text(arguments.get("x-queue-mode")) or "default"
    if queue_type == "classic" and mode not in _QUEUE_MODES:
        raise precondition(f"invalid arg 'x-queue-mode' for {where}: "
                           f"\"unsupported queue mode '{mode}'\"")
    version = arguments.get("x-queue-version")
    if isinstance(version, int) and version not in (1, 2):
        raise precondition(f"invalid arg 'x-queue-version' for {where}: "
                           + (f"{{value_negative,{version}}}" if version < 0
                              else f"\"unsupported queue version '{version}'\""))
    ttl = arguments.get("x-message-ttl")
    if isinstance(ttl, int) and ttl < 0:  # rabbit_amqqueue's check_message_ttl_arg
        raise precondition(f"invalid arg 'x-message-ttl' for {where}: "
                           f"{{value_negative,{ttl}}}")
    timeout = arguments.get("x-consumer-timeout")
    if isinstance(timeout, int) and timeout < 0:  # a non-negative integer, as RabbitMQ's
        raise precondition(f"invalid arg 'x-consumer-timeout' for {where}: "
                           f"{{value_negative,{timeout}}}")
    expires = arguments.get("x-expires")
    if isinstance(expires, int) and expires <= 0:  # rabbit_amqqueue's check_expires_arg
        raise precondition(f"invalid arg 'x-expires' for {where}: "
                           + (f"{{value_zero,{expires}}}" if expires == 0
                              else f"{{value_negative,{expires}}}"))
    # rabbit_amqqueue's check_dlxrk_arg (new here: quorum queues took it before)
    if (not recorded and "x-dead-letter-routing-key" in arguments
            and "x-dead-letter-exchange" not in arguments):
        raise precondition(f"invalid arg 'x-dead-letter-routing-key' for {where}: "
                           "routing_key_but_no_dlx_defined")
    if queue_type == "quorum":
        # the quorum queues guide, "Feature Comparison" and "Length Limit": quorum
        # queues do not support reject-publish-dlx (RabbitMQ logs a warning and treats
        # it as drop-head; refused here rather than silently changed)
        if overflow == "reject-publish-dlx":
            raise precondition(f"invalid arg 'x-overflow' for {where}: reject-publish-dlx "
                               "is not supported by quorum queues (classic queues only)")
        for key in ("x-quorum-initial-group-size", "x-quorum-target-group-size"):
            value = arguments.get(key)
            if isinstance(value, int) and value < 1:
                raise precondition(f"invalid arg '{key}' for {where}: "
                                   f"{{value_zero_or_less,{value}}}")
    return QueueSpec(
        type=queue_type, durable=durable, exclusive=exclusive, auto_delete=auto_delete,
        arguments=arguments, max_priority=max_priority or 0,
        max_length=arguments.get("x-max-length"),
        max_length_bytes=arguments.get("x-max-length-bytes"),
        overflow=overflow,
        single_active_consumer=bool(arguments.get("x-single-active-consumer", False)),
    )
