"""Definitions transformations for a blue-green migration from mirrored classic queues
to quorum queues, as rabbitmqadmin v2 (`rabbitmqadmin definitions export
--transformations ...`) defines them.

A definitions document (RabbitMQ's JSON format, as `export_definitions` writes it, from
quorumqueue or from RabbitMQ 3.x) goes in, a changed copy comes out; the input is not
modified. Names, applied left to right in the order given:

- `prepare_for_quorum_queue_migration`: every policy loses its classic-mirroring keys
  (`ha-*`, `queue-master-locator`) and the other keys quorum queues refuse
  (`queue-mode`, `queue-version`); each queue matched by a policy that had a mirroring
  key (same vhost, apply-to all/queues/classic_queues, pattern found in the name)
  becomes a quorum queue (`x-queue-type: quorum`) when it can be one (durable, not
  auto-delete: a quorum queue is always both), losing the arguments quorum queues
  refuse (`x-queue-mode`, `x-queue-version`, `x-max-priority`,
  `x-queue-master-locator`); `overflow`/`x-overflow` `reject-publish-dlx` becomes
  `reject-publish` in every policy and queue; the `x-ha-*` arguments are removed from
  every queue.
- `strip_cmq_keys_from_policies`: only the mirroring keys leave the policies, and the
  queues those policies matched become quorum queues as above.
- `drop_empty_policies`: policies whose definition is now empty are dropped (an empty
  definition is refused by import).

A queue matched by a mirroring policy that cannot be a quorum queue (not durable, or
auto-delete) stays classic: it is reported in the returned notes, never silently
changed. Exclusive queues are never in an export.
"""

from __future__ import annotations

import copy
import re

CMQ_POLICY_KEYS = ("ha-mode", "ha-params", "ha-sync-mode", "ha-sync-batch-size",
                   "ha-promote-on-shutdown", "ha-promote-on-failure",
                   "queue-master-locator")
QUORUM_INCOMPATIBLE_POLICY_KEYS = ("queue-mode", "queue-version")
CMQ_ARGUMENTS = ("x-ha-mode", "x-ha-params", "x-ha-sync-mode", "x-ha-sync-batch-size",
                 "x-ha-promote-on-shutdown", "x-ha-promote-on-failure",
                 "x-queue-master-locator")
QUORUM_INCOMPATIBLE_ARGUMENTS = ("x-queue-mode", "x-queue-version", "x-max-priority",
                                 "x-queue-master-locator")
TRANSFORMATIONS = ("prepare_for_quorum_queue_migration", "strip_cmq_keys_from_policies",
                   "drop_empty_policies")


class TransformationError(ValueError):
    """An unknown transformation name or a document that is not a definitions object."""


def parse_names(text: str) -> list[str]:
    """The comma-separated names of `--transformations`, each checked."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in TRANSFORMATIONS]
    if unknown or not names:
        raise TransformationError(
            f"unknown transformation(s) {', '.join(unknown) or '(none given)'}; known: "
            f"{', '.join(TRANSFORMATIONS)}")
    return names


def transform(document: dict, names: list[str]) -> tuple[dict, list[str]]:
    """A transformed copy of `document` and notes on queues left as they were."""
    if not isinstance(document, dict):
        raise TransformationError("a definitions document is a JSON object")
    result = copy.deepcopy(document)
    notes: list[str] = []
    for name in names:
        match name:
            case "prepare_for_quorum_queue_migration":
                _convert(result, _strip_policies(result, CMQ_POLICY_KEYS), notes)
                _strip_policies(result, QUORUM_INCOMPATIBLE_POLICY_KEYS)
                for policy in result.get("policies") or []:
                    definition = policy.get("definition") or {}
                    if definition.get("overflow") == "reject-publish-dlx":
                        definition["overflow"] = "reject-publish"
                for queue in result.get("queues") or []:
                    arguments = queue.get("arguments") or {}
                    if arguments.get("x-overflow") == "reject-publish-dlx":
                        arguments["x-overflow"] = "reject-publish"
                    for key in CMQ_ARGUMENTS:
                        arguments.pop(key, None)
            case "strip_cmq_keys_from_policies":
                _convert(result, _strip_policies(result, CMQ_POLICY_KEYS), notes)
            case "drop_empty_policies":
                if "policies" in result:
                    result["policies"] = [p for p in result["policies"] if p.get("definition")]
            case other:
                raise TransformationError(f"unknown transformation {other}")
    return result, notes


def _strip_policies(document: dict, keys: tuple[str, ...]) -> list[dict]:
    """Remove `keys` from every policy; the policies that had one (before removal)."""
    matched = []
    for policy in document.get("policies") or []:
        definition = policy.get("definition") or {}
        if any(key in definition for key in keys):
            matched.append(copy.deepcopy(policy))
            for key in keys:
                definition.pop(key, None)
    return matched


def _applies(policy: dict, queue: dict, vhost_default: str | None) -> bool:
    vhost = policy.get("vhost", vhost_default)
    if vhost != queue.get("vhost", vhost_default):
        return False
    if policy.get("apply-to", "all") not in ("all", "queues", "classic_queues"):
        return False
    try:
        return re.search(policy.get("pattern", ""), queue.get("name", "")) is not None
    except re.error:
        return False


def _convert(document: dict, policies: list[dict], notes: list[str]) -> None:
    for queue in document.get("queues") or []:
        arguments = queue.setdefault("arguments", {})
        if queue.get("type", arguments.get("x-queue-type", "classic")) != "classic":
            continue
        if not any(_applies(policy, queue, None) for policy in policies):
            continue
        if not queue.get("durable", True) or queue.get("auto_delete", False):
            notes.append(f"queue '{queue.get('name')}' in vhost '{queue.get('vhost', '')}' "
                         "matched a mirroring policy but stays classic: a quorum queue "
                         "must be durable and not auto-delete")
            continue
        arguments["x-queue-type"] = "quorum"
        if "type" in queue:  # RabbitMQ 3.9+ exports say the type beside the arguments
            queue["type"] = "quorum"
        for key in QUORUM_INCOMPATIBLE_ARGUMENTS:
            arguments.pop(key, None)
