"""Operator policies, as RabbitMQ's (`rabbitmqctl set_operator_policy`): policies an
operator sets over the users' ones, that may only lower a limit, never raise it. Pure.

Responsibilities: validating an operator policy (`parse_operator_policy`) and
combining the policy and the operator policy that apply to a queue into the one
definition the queue's type reads (`effective`).

How it works
    An operator policy is a policy (node/policies.py: pattern, priority, apply-to,
    definition; the same matching: the highest priority wins, ties to the first
    name) restricted to the keys RabbitMQ 4.2 registers as
    `operator_policy_validator`s (rabbit_policies, rabbit_quorum_queue,
    rabbit_classic_queue): OPERATOR_KEYS. Of those, quorumqueue refuses by name the
    ones it refuses in any policy (policies.NOT_SUPPORTED), with the same message.
    Its apply-to covers queues only (no operator-policy key acts on an exchange).
    A queue matched by both a policy and an operator policy gets, per key,
    RabbitMQ 4.2's `merge_policy_value`: the lower of the two for expires,
    message-ttl, max-length, max-length-bytes and delivery-limit (delivery-limit:
    the higher when either is negative, i.e. unlimited); the operator's for
    overflow; the higher for target-group-size. A key only one of them has is
    taken as is. The queue's own x- arguments then combine with that definition
    as with any policy (queues/settings.py: the lower of argument and policy for
    the numeric limits), so the lowest of argument, policy and operator policy wins.

Invariants: an `Effective` carries the merged `definition` the queue types read
(the same attribute a Policy has), and the names of both policies for listings.

Not here: storing and replicating operator policies (definitions.py,
groups/metadata.py), applying them to running queues (node.py `apply_policies`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .policies import NOT_SUPPORTED, Policy, PolicyError, parse_policy

# RabbitMQ 4.2's operator_policy_validator registrations, in its order
OPERATOR_KEYS = ("expires", "message-ttl", "max-length", "max-length-bytes",
                 "max-in-memory-length", "max-in-memory-bytes", "delivery-limit",
                 "queue-version", "overflow", "target-group-size", "queue-master-locator")
OPERATOR_APPLY_TO = ("all", "queues", "classic_queues", "quorum_queues")
_LOWER = ("expires", "message-ttl", "max-length", "max-length-bytes",
          "max-in-memory-length", "max-in-memory-bytes")


def parse_operator_policy(vhost: str, name: str, pattern: str, definition: Any,
                          priority: Any = 0, apply_to: str = "all") -> Policy:
    """A valid operator policy, or PolicyError naming what is wrong."""
    what = f"operator policy '{name}' in vhost '{vhost}'"
    if apply_to not in OPERATOR_APPLY_TO:
        raise PolicyError(f"{what}: apply-to must be one of {', '.join(OPERATOR_APPLY_TO)} "
                          f"(operator policies act on queues only), got {apply_to!r}")
    if isinstance(definition, Mapping):
        usable = [k for k in OPERATOR_KEYS if k not in NOT_SUPPORTED]
        for key in definition:
            if key not in OPERATOR_KEYS:
                raise PolicyError(f"{what}: '{key}' is not a recognised operator policy "
                                  f"setting (operator policies may set: "
                                  f"{', '.join(usable)})")
    return parse_policy(vhost, name, pattern, definition, priority, apply_to,
                        label="operator policy")


def merge_value(key: str, value: Any, operator_value: Any) -> Any:
    """RabbitMQ 4.2's merge_policy_value for a key both policies set."""
    if key in _LOWER:
        return min(value, operator_value)
    if key == "delivery-limit":
        if value < 0 or operator_value < 0:  # one is unlimited: the more conservative
            return max(value, operator_value)
        return min(value, operator_value)
    if key == "target-group-size":
        return max(value, operator_value)
    return operator_value  # overflow (and the rest RabbitMQ lets the operator decide)


def merged_definition(policy: Policy | None, operator: Policy | None) -> dict | None:
    """The effective policy definition (RabbitMQ's effective_policy_definition)."""
    if policy is None and operator is None:
        return None
    mine = dict(policy.definition) if policy is not None else {}
    theirs = dict(operator.definition) if operator is not None else {}
    merged = {}
    for key in sorted(set(mine) | set(theirs)):
        if key in mine and key in theirs:
            merged[key] = merge_value(key, mine[key], theirs[key])
        else:
            merged[key] = mine[key] if key in mine else theirs[key]
    return merged


@dataclass(frozen=True, slots=True)
class Effective:
    """What applies to a queue matched by a policy and an operator policy."""
    policy: Policy | None
    operator_policy: Policy | None
    definition: Mapping[str, Any]


def effective(policy: Policy | None, operator: Policy | None):
    """What a queue's type is given: the policy alone when no operator policy
    applies (and None when neither does), else an Effective."""
    if operator is None:
        return policy
    return Effective(policy, operator, merged_definition(policy, operator) or {})


__all__ = ["OPERATOR_KEYS", "OPERATOR_APPLY_TO", "parse_operator_policy", "merge_value",
           "merged_definition", "Effective", "effective", "PolicyError"]
