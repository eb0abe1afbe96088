"""How a queue's arguments combine with the policy that applies to it. Pure.

The rules are RabbitMQ's queue types' (rabbit_quorum_queue's `gather_policy_config`,
rabbit_amqqueue_process's for classic queues, and the max-length guide): max-length,
max-length-bytes, message-ttl and expires take the lower of argument and policy (a
quorum queue's expires as RabbitMQ 4.x takes it; 3.10.8's quorum queues take the
policy's); overflow takes the policy's on a quorum queue, the argument's on a classic
one; delivery-limit the lower, unless
either is negative (unlimited), then the higher. queue-leader-locator: policy, then
argument, then the node's configuration (the 4.2 quorum queues guide's order).
target-group-size: the highest of the argument x-quorum-target-group-size, the
policy's (the operator policy's merged in: the higher) and the configuration's, as
RabbitMQ 4's membership reconciliation takes it (the 4.2 guide: the argument "can be
overridden by an operator policy"). consumer-timeout: the lower of x-consumer-timeout and the policy's
(no queue setting: the node's consumer_timeout). A policy is anything with a `definition` mapping (None: no
policy applies).

Dead lettering (`dead_letter_target`, `dead_letter_strategy`): x-dead-letter-exchange,
x-dead-letter-routing-key and x-dead-letter-strategy win over the policy's
dead-letter-exchange, dead-letter-routing-key and dead-letter-strategy (RabbitMQ's
args_policy_lookup takes the argument). At-least-once is in force only with overflow
reject-publish (argument or policy) and a dead-letter exchange; otherwise a queue
dead-letters at most once, as RabbitMQ falls back.

Not here: validating and matching policies (node/policies.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..fifo.state import FifoConfig, at_least_once


def _definition(policy) -> Mapping[str, Any]:
    return policy.definition if policy is not None else {}


def _lower(argument, policy):
    if argument is None:
        return policy
    if policy is None:
        return argument
    return min(argument, policy)


def _text(value) -> str | None:
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value


def quorum_config(arguments: Mapping[str, Any], policy,
                  base: FifoConfig) -> FifoConfig:
    """A quorum queue's machine settings: its arguments (as `base`, built from them)
    combined with `policy` (rabbit_quorum_queue's rules, module header)."""
    definition = _definition(policy)
    overflow = definition.get("overflow") or _text(arguments.get("x-overflow")) or "drop-head"
    limit = arguments.get("x-delivery-limit")
    policy_limit = definition.get("delivery-limit")
    if limit is None and policy_limit is None:
        delivery_limit = base.delivery_limit
    elif limit is None or policy_limit is None:
        delivery_limit = policy_limit if limit is None else limit
    elif limit < 0 or policy_limit < 0:
        delivery_limit = max(limit, policy_limit)
    else:
        delivery_limit = min(limit, policy_limit)
    return FifoConfig(delivery_limit=-1 if delivery_limit < 0 else delivery_limit,
                      release_cursor_interval=base.release_cursor_interval,
                      max_length=_lower(arguments.get("x-max-length"),
                                        definition.get("max-length")),
                      max_bytes=_lower(arguments.get("x-max-length-bytes"),
                                       definition.get("max-length-bytes")),
                      overflow=overflow,
                      msg_ttl=_lower(arguments.get("x-message-ttl"),
                                     definition.get("message-ttl")),
                      expires=_lower(arguments.get("x-expires"), definition.get("expires")),
                      # an argument only: no policy key sets it (RabbitMQ's consumers guide)
                      single_active=base.single_active,
                      dead_letter_at_least_once=at_least_once(
                          (dead_letter_target(arguments, policy) or (None,))[0],
                          dead_letter_strategy(arguments, policy), overflow))


def classic_limits(arguments: Mapping[str, Any],
                   policy) -> tuple[int | None, int | None, str]:
    """(max length, max length bytes, overflow) of a classic queue: the lower limits;
    x-overflow wins over the policy's overflow (rabbit_amqqueue_process's res_arg),
    where a quorum queue takes the policy's."""
    definition = _definition(policy)
    return (_lower(arguments.get("x-max-length"), definition.get("max-length")),
            _lower(arguments.get("x-max-length-bytes"), definition.get("max-length-bytes")),
            _text(arguments.get("x-overflow")) or definition.get("overflow") or "drop-head")


def consumer_timeout(arguments: Mapping[str, Any], policy) -> int | None:
    """The delivery acknowledgement timeout (ms) a queue sets: the lower of
    x-consumer-timeout and the policy's consumer-timeout (RabbitMQ 4.2's
    rabbit_channel: args_policy_lookup with min); None: neither is set, the node's
    consumer_timeout applies."""
    return _lower(arguments.get("x-consumer-timeout"),
                  _definition(policy).get("consumer-timeout"))


def classic_ttls(arguments: Mapping[str, Any], policy) -> tuple[int | None, int | None]:
    """(message TTL, queue TTL) of a classic queue in ms: x-message-ttl and the
    policy's message-ttl, x-expires and the policy's expires, the lower of each pair
    (RabbitMQ's rabbit_amqqueue_process `init_ttl`/`init_exp` take the minimum)."""
    definition = _definition(policy)
    return (_lower(arguments.get("x-message-ttl"), definition.get("message-ttl")),
            _lower(arguments.get("x-expires"), definition.get("expires")))


def leader_locator(arguments: Mapping[str, Any], policy, configured: str,
                   classic_mirroring: bool = False) -> str:
    """'client-local' or 'balanced'; RabbitMQ 4's deprecated values (random,
    least-leaders, min-masters) are balanced, as there. As RabbitMQ 4's
    rabbit_queue_location: queue-leader-locator (policy, then argument), else the
    deprecated queue-master-locator (policy, then argument), else the node's setting.
    With `classic_mirroring` (a classic queue placed with RabbitMQ 3.13's
    deprecated-feature switch for classic queue mirroring on) the 3.13 values keep
    their meaning, as the mirroring guide's "Queue Leader Location" gives them:
    'random' (any running node) and 'min-masters' (the running node hosting the
    fewest leaders); 'least-leaders' is min-masters there too."""
    definition = _definition(policy)
    locator = (definition.get("queue-leader-locator")
               or _text(arguments.get("x-queue-leader-locator"))
               or definition.get("queue-master-locator")
               or _text(arguments.get("x-queue-master-locator")) or configured)
    if classic_mirroring and locator == "random":
        return "random"
    if classic_mirroring and locator in ("min-masters", "least-leaders"):
        return "min-masters"
    return "client-local" if locator == "client-local" else "balanced"


def target_group_size(arguments: Mapping[str, Any], policy,
                      configured: int | None) -> int | None:
    """The member count continuous membership reconciliation grows a quorum queue
    to: the highest of argument, policy and configuration (None: none set)."""
    values = [value for value in (arguments.get("x-quorum-target-group-size"),
                                  _definition(policy).get("target-group-size"), configured)
              if value]
    return max(values) if values else None


def dead_letter_strategy(arguments: Mapping[str, Any], policy) -> str:
    """'at-most-once' (the default) or 'at-least-once': the argument, else the
    policy's dead-letter-strategy (RabbitMQ's args_policy_lookup takes the argument).
    In force only with overflow reject-publish and a dead-letter exchange
    (fifo.state.at_least_once)."""
    strategy = _text(arguments.get("x-dead-letter-strategy"))
    if strategy is None:
        strategy = _definition(policy).get("dead-letter-strategy")
    return strategy or "at-most-once"


def dead_letter_target(arguments: Mapping[str, Any], policy) -> tuple[str, str | None] | None:
    """(dead-letter exchange, dead-letter routing key or None: the message's own) of a
    queue, or None when it has no dead-letter exchange (argument first, then the
    policy, for each key)."""
    definition = _definition(policy)
    exchange = _text(arguments.get("x-dead-letter-exchange"))
    if exchange is None:
        exchange = definition.get("dead-letter-exchange")
    if exchange is None:
        return None
    key = _text(arguments.get("x-dead-letter-routing-key"))
    if key is None:
        key = definition.get("dead-letter-routing-key")
    return exchange, key
