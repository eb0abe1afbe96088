"""Policies, as RabbitMQ's: named rules that set queue and exchange settings by name
pattern, per vhost. Pure.

Responsibilities: validating a policy (`parse_policy`: its pattern, priority,
apply-to and definition keys and values, refused with a message naming what is
wrong); choosing the policy that applies to a queue or exchange (`matching`); and
combining an exchange's arguments with that policy (`alternate_exchange`). How a
queue's arguments combine with a policy is each queue type's (queues/settings.py;
re-exported here).

How it works
    A policy applies to a queue or exchange of its vhost whose name its pattern
    matches (`re.search`, unanchored, as RabbitMQ's) and whose kind its apply-to
    covers; of those, the one with the highest priority wins (equal priorities:
    the name first in sort order, so every node picks the same). Only that one
    policy's definition counts, as in RabbitMQ. Combining with queue arguments
    follows rabbit_quorum_queue's `gather_policy_config`: max-length and
    max-length-bytes take the lower of argument and policy; overflow takes the
    policy's; delivery-limit the lower, unless either is negative (unlimited), then
    the higher. consumer-timeout: the lower of it and x-consumer-timeout
    (rabbit_channel's args_policy_lookup with min). queue-leader-locator: policy, then argument, then the node's
    configuration (the 4.2 guide's order). target-group-size: the argument
    x-quorum-target-group-size, then the policy, then the configuration. An
    exchange's alternate-exchange argument overrules the policy's (RabbitMQ's AE
    guide).

Invariants: a `Policy` is valid once built (parse_policy is the only way in from
outside); definitions hold only the keys quorumqueue applies, so no policy is
accepted that would silently do nothing, but alternate-exchange in a policy for
queues only: RabbitMQ accepts it and it acts on no queue, so it is accepted here.

Not here: storing policies and applying them to running queues (node.py,
definitions.py), replicating them (groups/metadata.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..queues.mirroring import validate_ha
from ..queues.settings import (_definition, _text, classic_limits, leader_locator,  # noqa: F401
                               quorum_config, target_group_size)

APPLY_TO = ("all", "queues", "classic_queues", "quorum_queues", "exchanges")
LOCATORS = ("client-local", "balanced", "random", "least-leaders", "min-masters")
OVERFLOWS = ("drop-head", "reject-publish", "reject-publish-dlx")

# definition key -> (the kinds of object it acts on, what its value must be)
_QUEUES = ("classic", "quorum")
KEYS: dict[str, tuple[tuple[str, ...], str]] = {
    "max-length": (_QUEUES, "a non-negative integer"),
    "max-length-bytes": (_QUEUES, "a non-negative integer"),
    "overflow": (_QUEUES, "'drop-head', 'reject-publish' or 'reject-publish-dlx'"),
    "delivery-limit": (("quorum",), "an integer (-1: no limit)"),
    "queue-leader-locator": (("quorum",), "'client-local' or 'balanced'"),  # + deprecated
    # RabbitMQ 4's deprecated feature queue_master_locator (permitted by default): read
    # where queue-leader-locator is not set, its values mapped the same way
    "queue-master-locator": (_QUEUES, "'client-local' or 'balanced'"),  # + deprecated
    "target-group-size": (("quorum",), "a positive integer"),
    "alternate-exchange": (("exchange",), "an exchange name"),
    "message-ttl": (_QUEUES, "a non-negative integer (milliseconds)"),
    "expires": (_QUEUES, "a positive integer (milliseconds)"),
    "dead-letter-exchange": (_QUEUES, "an exchange name"),
    "dead-letter-routing-key": (_QUEUES, "a routing key"),
    "dead-letter-strategy": (("quorum",), "'at-most-once' or 'at-least-once'"),
    "consumer-timeout": (_QUEUES, "a non-negative integer (milliseconds)"),
}
# keys only quorum queues apply (RabbitMQ's classic queues ignore dead-letter-strategy):
# a policy holding one must apply to quorum_queues only, so that no classic queue
# silently ignores it
QUORUM_QUEUES_ONLY = ("dead-letter-strategy",)
# keys RabbitMQ knows that quorumqueue does not apply: refused by name rather than
# accepted and ignored. `single-active-consumer` is no policy key in RabbitMQ (the
# consumers guide, "Single Active Consumer": "it is not possible to enable single
# active consumer with a policy", only with the x-single-active-consumer argument);
# RabbitMQ 4.2 refuses it as it refuses any unknown key ("... are not recognised
# policy settings"), and so does quorumqueue, below.
NOT_SUPPORTED = ("max-in-memory-length", "max-in-memory-bytes",
                 "queue-mode", "queue-version", "ha-mode",
                 "ha-params", "ha-sync-mode", "ha-sync-batch-size", "ha-promote-on-shutdown",
                 "ha-promote-on-failure", "max-age", "stream-max-segment-size-bytes",
                 "initial-cluster-size", "federation-upstream", "federation-upstream-set")

# classic queue mirroring's keys (RabbitMQ's "Classic Queue Mirroring" guide): with
# RabbitMQ 3.13's deprecated-feature switch off (the default) refused with a message
# naming it; with it on, accepted and validated as 3.13 does (queues/mirroring.py)
CLASSIC_MIRRORING_KEYS = ("ha-mode", "ha-params", "ha-sync-mode", "ha-sync-batch-size",
                          "ha-promote-on-shutdown", "ha-promote-on-failure")


class PolicyError(ValueError):
    """A policy that cannot be set; the message names the offending part."""


@dataclass(frozen=True, slots=True)
class Policy:
    vhost: str
    name: str
    pattern: str
    definition: Mapping[str, Any]
    priority: int = 0
    apply_to: str = "all"

    def applies_to(self, kind: str, name: str) -> bool:
        """Does this policy cover a `kind` ("classic", "quorum", "exchange") named
        `name`?"""
        if kind == "exchange":
            covered = self.apply_to in ("all", "exchanges")
        else:
            covered = self.apply_to in ("all", "queues", f"{kind}_queues")
        return covered and re.search(self.pattern, name) is not None

    def as_dict(self) -> dict:
        return {"vhost": self.vhost, "name": self.name, "pattern": self.pattern,
                "definition": dict(self.definition), "priority": self.priority,
                "apply_to": self.apply_to}


def parse_policy(vhost: str, name: str, pattern: str, definition: Any, priority: Any = 0,
                 apply_to: str = "all", label: str = "policy",
                 permit_mirroring: bool = False) -> Policy:
    """A valid Policy, or PolicyError naming what is wrong (`label`: what the
    messages call it, "operator policy" for node/operator_policies.py;
    `permit_mirroring`: the node's deprecated_features.permit.classic_queue_mirroring,
    which lets the ha-* keys in, validated as RabbitMQ 3.13 does)."""
    if not isinstance(name, str) or not name:
        raise PolicyError(f"a {label} needs a name")
    what = f"{label} '{name}' in vhost '{vhost}'"
    if not isinstance(pattern, str):
        raise PolicyError(f"{what}: the pattern must be a string, got {pattern!r}")
    try:
        re.compile(pattern)
    except re.error as error:
        raise PolicyError(f"{what}: pattern {pattern!r} is not a regular expression: "
                          f"{error}") from None
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise PolicyError(f"{what}: priority must be an integer, got {priority!r}")
    if apply_to not in APPLY_TO:
        raise PolicyError(f"{what}: apply-to must be one of {', '.join(APPLY_TO)}, got "
                          f"{apply_to!r}")
    if not isinstance(definition, Mapping) or not definition:
        raise PolicyError(f"{what}: the definition must be a non-empty JSON object, e.g. "
                          "'{\"max-length\": 1000}'")
    for key, value in definition.items():
        if permit_mirroring and key in CLASSIC_MIRRORING_KEYS:
            if apply_to in ("exchanges", "quorum_queues"):
                raise PolicyError(f"{what}: key '{key}' applies to classic queues only "
                                  f"(classic queue mirroring), not to {apply_to}")
            continue
        _check_key(what, apply_to, key, value)
    if permit_mirroring:
        error = validate_ha(dict(definition))
        if error is not None:  # rabbit_mirror_queue_misc's text
            raise PolicyError(f"{what}: Validation failed: {error}")
    return Policy(vhost, name, pattern, dict(definition), priority, apply_to)


def _check_key(what: str, apply_to: str, key: str, value: Any) -> None:
    if key in CLASSIC_MIRRORING_KEYS:
        raise PolicyError(f"{what}: key '{key}' is classic queue mirroring, a deprecated "
                          "feature not permitted (RabbitMQ 3.13 refuses it unless "
                          "deprecated_features.permit.classic_queue_mirroring = true; "
                          "RabbitMQ 4.0 removed it; quorumqueue mirrors classic queues "
                          "only with that switch set). Use quorum queues instead (x-queue-type quorum, or "
                          "export_definitions --transformations "
                          "prepare_for_quorum_queue_migration for existing definitions)")
    if key in NOT_SUPPORTED:
        raise PolicyError(f"{what}: key '{key}' is not supported by quorumqueue (it "
                          f"applies: {', '.join(KEYS)})")
    if key not in KEYS:
        raise PolicyError(f"{what}: '{key}' is not a recognised policy setting (known: "
                          f"{', '.join(KEYS)})")
    kinds, shown = KEYS[key]
    # alternate-exchange in a policy for queues only is accepted and acts on nothing,
    # as RabbitMQ 3.10.8 accepts it (rabbit_policy validates keys, not apply-to):
    # definitions exported from RabbitMQ hold such policies
    if apply_to == "exchanges" and "exchange" not in kinds:
        raise PolicyError(f"{what}: key '{key}' does not act on {apply_to}")
    if key in QUORUM_QUEUES_ONLY and apply_to != "quorum_queues":
        raise PolicyError(f"{what}: key '{key}' applies to quorum queues only (classic "
                          "queues would ignore it): set apply-to to quorum_queues")
    if key == "overflow" and value == "reject-publish-dlx" and apply_to != "classic_queues":
        raise PolicyError(f"{what}: overflow 'reject-publish-dlx' applies to classic "
                          "queues only (quorum queues do not support it): set apply-to to "
                          "classic_queues")
    valid = {
        "max-length": _integer(value, 0),
        "max-length-bytes": _integer(value, 0),
        "overflow": value in OVERFLOWS,
        "delivery-limit": _integer(value, -1),
        "queue-leader-locator": value in LOCATORS,
        "queue-master-locator": value in LOCATORS,
        "target-group-size": _integer(value, 1),
        "alternate-exchange": isinstance(value, str) and 0 < len(value.encode()) <= 255,
        "message-ttl": _integer(value, 0),
        "expires": _integer(value, 1),
        "dead-letter-exchange": isinstance(value, str) and len(value.encode()) <= 255,
        "dead-letter-routing-key": isinstance(value, str) and len(value.encode()) <= 255,
        "dead-letter-strategy": value in ("at-most-once", "at-least-once"),
        "consumer-timeout": _integer(value, 0),
    }[key]
    if not valid and key in ("queue-leader-locator", "queue-master-locator"):  # its text
        raise PolicyError(f"{what}: Validation failed: {_erlang_term(value)} is not a "
                          f"valid queue leader locator value (it must be {shown})")
    if not valid and key == "consumer-timeout":  # rabbit_policies' text
        raise PolicyError(f"{what}: Validation failed: {_erlang_term(value)} is not a "
                          f"valid consumer timeout (it must be {shown})")
    if not valid:
        raise PolicyError(f"{what}: key '{key}' must be {shown}, got {value!r}")


def _erlang_term(value: Any) -> str:
    """How RabbitMQ's ~p shows a JSON value in a validation error."""
    return f'<<"{value}">>' if isinstance(value, str) else json.dumps(value)


def _integer(value: Any, minimum: int) -> bool:
    # below 2^63: what the quorum-queue log's settings command carries (fifo UpdateConfig)
    return (not isinstance(value, bool) and isinstance(value, int)
            and minimum <= value < 2 ** 63)


def matching(policies: Iterable[Policy], kind: str, name: str) -> Policy | None:
    """The policy that applies to the `kind` named `name`: the highest priority,
    ties to the first name."""
    best = None
    for policy in policies:
        if policy.applies_to(kind, name) and (
                best is None or (-policy.priority, policy.name) < (-best.priority, best.name)):
            best = policy
    return best


def alternate_exchange(arguments: Mapping[str, Any], policy: Policy | None) -> str | None:
    return _text(arguments.get("alternate-exchange")) or _definition(policy).get(
        "alternate-exchange")
