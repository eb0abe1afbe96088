"""The management API's JSON objects, with RabbitMQ's field names: pure functions of
the node's state.

Responsibilities: one function per kind of object (queue, exchange, binding, vhost,
user, permission, policy, connection, channel, consumer, node, overview) turning what
the node holds into the object RabbitMQ 3.10's management plugin answers with, and
AMQP field values into JSON (`json_value`). Field names were checked against RabbitMQ
3.10.8 (tests/differential/test_management_against_rabbitmq.py compares the key sets).

How it works: reads only. A queue's counts come from the queue-type interface's
`stats` (queues/base.py): a quorum queue's row is the same on every node of a cluster
(its leader, members and the counts of the node that serves it); `online` is the
members the cluster can reach.

What is left out, on purpose: fields about the Erlang VM (garbage_collection,
reductions, memory of a queue process, backing_queue_status), per-exchange
publish/deliver counters (an exchange's `message_stats`: not counted), and
`user_who_performed_action` (nobody records who declared what). The README's
endpoint table lists them. Queue length rates (`messages_details` and kin) and the
message_stats of queues and the overview (the cluster's counters summed) are added
by views.py from rates.py.

Not here: HTTP, authorisation (views.py, access.py), changes (direct.py).
"""

from __future__ import annotations

import base64
import datetime
import decimal
import os
import platform
import time
from typing import Any
from urllib.parse import quote

from .. import __version__
from ..node.operator_policies import merged_definition
from ..routing.exchanges import EXCHANGE_TYPES, QUEUE

MANAGEMENT_VERSION = "3.10.8"  # the RabbitMQ release whose API this one follows
EXCHANGE_TYPE_DESCRIPTIONS = {
    "direct": "AMQP direct exchange, as per the AMQP specification",
    "fanout": "AMQP fanout exchange, as per the AMQP specification",
    "headers": "AMQP headers exchange, as per the AMQP specification",
    "topic": "AMQP topic exchange, as per the AMQP specification",
}
STARTED = time.monotonic()


def json_value(value: Any) -> Any:
    """An AMQP field value as JSON: bytes as text (UTF-8, else base64), decimals as
    numbers, timestamps as seconds, tables and arrays recursively."""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return base64.b64encode(value).decode("ascii")
    if isinstance(value, dict):
        return {str(key): json_value(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_value(item) for item in value]
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, datetime.datetime):
        return int(value.timestamp())
    return value


def exchange_types() -> list[dict]:
    return [{"name": name, "description": EXCHANGE_TYPE_DESCRIPTIONS.get(name, ""),
             "enabled": True} for name in sorted(EXCHANGE_TYPES)]


# ---------------------------------------------------------------- queues


def queue_row(node, queue, stats: dict, online: list[str]) -> dict:
    """A queue as /api/queues lists it; `stats` from queue.stats/stats_later."""
    # the policy and the operator policy that apply, and their merged definition
    # (node/operator_policies.py), as rabbitmqctl list_queues shows them
    policy, operator = node.policies_for(queue.vhost, queue.type_name, queue.name)
    ready, unacked = stats["ready"], stats["unacked"]
    row = {
        "name": queue.name, "vhost": queue.vhost, "type": queue.type_name,
        "durable": queue.durable, "auto_delete": queue.auto_delete,
        "exclusive": queue.exclusive_owner is not None,
        "arguments": json_value(queue.arguments),
        "node": stats["leader"] or "",
        "state": "running" if stats["leader"] else "down",
        "policy": policy.name if policy is not None else None,
        "operator_policy": operator.name if operator is not None else None,
        "effective_policy_definition": merged_definition(policy, operator) or {},
        "consumers": stats["consumers"],
        "messages": ready + unacked, "messages_ready": ready,
        "messages_unacknowledged": unacked,
        "message_bytes": stats["bytes"],
    }
    if "mirrors" in stats:  # a mirrored classic queue: RabbitMQ 3.x's fields
        row.update(slave_nodes=list(stats["mirrors"]),
                   synchronised_slave_nodes=list(stats["synchronised_mirrors"]))
        if stats.get("syncing") is not None:  # 3.x's {syncing, N}: state and progress
            row.update(state="syncing", sync_messages=stats["syncing"])
    if queue.REPLICATED:
        held = stats.get("messages_dlx", 0)
        row["messages"] += held   # RabbitMQ counts the dead letters held in `messages`
        row.update(leader=stats["leader"], members=list(stats["members"]),
                   online=[member for member in stats["members"] if member in online],
                   # every message of a quorum queue is in its log: persistent
                   messages_persistent=ready + unacked + held,
                   message_bytes_persistent=stats["bytes"],
                   # the dead letters at-least-once dead lettering holds until their
                   # targets confirm them (counted in messages and message_bytes too)
                   messages_dlx=held,
                   message_bytes_dlx=stats.get("message_bytes_dlx", 0),
                   # RabbitMQ's name for this type's single active consumer tag
                   single_active_consumer_ctag=stats.get("single_active_consumer_tag"))
    else:
        row.update(exclusive_consumer_tag=(queue.exclusive_consumer.tag
                                           if queue.exclusive_consumer is not None else None),
                   single_active_consumer_tag=_active_tag(queue), recoverable_slaves=None)
    return row


def _active_tag(queue) -> str | None:
    """x-single-active-consumer (classic queues): the consumer receiving."""
    if not getattr(queue, "single_active_consumer", False):
        return None
    active = getattr(queue, "active_consumer", None)
    return getattr(active, "tag", None)


# ---------------------------------------------------------------- exchanges, bindings


def exchange_row(node, vhost: str, exchange) -> dict:
    row = {"name": exchange.name, "vhost": vhost, "type": exchange.type,
           "durable": exchange.durable, "auto_delete": exchange.auto_delete,
           "internal": exchange.internal, "arguments": json_value(exchange.arguments)}
    policy = node.policy_for(vhost, "exchange", exchange.name)
    if policy is not None:
        row["policy"] = policy.name
    return row


def properties_key(routing_key: str, arguments: dict) -> str:
    """How a binding is named in URLs (RabbitMQ's pack_binding_props): the quoted
    routing key, plus `~` and a digest of the arguments when there are some."""
    key = quote(routing_key, safe="")
    if not arguments:
        return key
    import hashlib
    import json

    digest = hashlib.sha256(json.dumps(json_value(arguments), sort_keys=True)
                            .encode()).digest()[:6]
    return f"{key}~{base64.urlsafe_b64encode(digest).decode('ascii').rstrip('=')}"


def binding_row(vhost: str, source: str, kind: str, destination: str, routing_key: str,
                arguments: dict) -> dict:
    return {"source": source, "vhost": vhost, "destination": destination,
            "destination_type": kind, "routing_key": routing_key,
            "arguments": json_value(arguments),
            "properties_key": properties_key(routing_key, arguments)}


def binding_rows(vhost) -> list[dict]:
    """Every binding of a vhost, the default exchange's implicit ones first (as
    RabbitMQ lists them: one per queue, routing key = queue name)."""
    rows = [binding_row(vhost.name, "", QUEUE, name, name, {})
            for name in sorted(vhost.queues)]
    for binding in vhost.bindings():
        rows.append(binding_row(vhost.name, binding.source, binding.destination.kind,
                                binding.destination.name, binding.routing_key,
                                binding.arguments_dict))
    return rows


# ---------------------------------------------------------------- definitions


def vhost_row(node, name: str, counts: dict | None = None) -> dict:
    row = {"name": name, "description": "Default virtual host" if name == "/" else "",
           "tags": [], "metadata": {"description": "", "tags": []},
           "default_queue_type": "undefined", "tracing": False,
           "cluster_state": {member: "running" for member in node.cluster.nodes}}
    row["metadata"]["description"] = row["description"]
    if counts is not None:
        row.update(counts)
    return row


def user_row(user) -> dict:
    return {"name": user.name, "password_hash": user.password_hash,
            "hashing_algorithm": "rabbit_password_hashing_sha256",
            "tags": list(user.tags), "limits": dict(user.limits)}


def permission_row(user: str, vhost: str, rights) -> dict:
    return {"user": user, "vhost": vhost, "configure": rights.configure,
            "write": rights.write, "read": rights.read}


def policy_row(policy) -> dict:
    return {"vhost": policy.vhost, "name": policy.name, "pattern": policy.pattern,
            "apply-to": policy.apply_to, "definition": json_value(policy.definition),
            "priority": policy.priority}


# ---------------------------------------------------------------- connections


def connection_name(session) -> str:
    return getattr(session, "display_name", None) or f"{session.peer_host} ({session.connection_id})"


def connection_row(node, session, peer: tuple[str, int], local: tuple[str, int]) -> dict:
    connection = session.connection
    name = f"{peer[0]}:{peer[1]} -> {local[0]}:{local[1]}"
    return {
        "name": name, "node": node.name, "type": "network", "protocol": "AMQP 0-9-1",
        # RabbitMQ's states: "blocked" by an alarm, "flow" while its input waits for
        # the next group-commit round (server/server.py), else "running"
        "state": ("blocked" if connection.blocked
                  else "flow" if session.input_held else "running"),
        "user": session.user.name if session.user else None,
        "user_who_performed_action": session.user.name if session.user else None,
        "vhost": session.vhost.name if session.vhost else None,
        "host": local[0], "port": local[1], "peer_host": peer[0], "peer_port": peer[1],
        # over the TLS listener: RabbitMQ's ssl, ssl_protocol and ssl_cipher fields
        "ssl": session.ssl_protocol is not None, "ssl_protocol": session.ssl_protocol,
        "ssl_cipher": session.ssl_cipher, "auth_mechanism": connection.mechanism,
        "channels": len(session.channels), "channel_max": connection.channel_max,
        "frame_max": connection.frame_max, "timeout": connection.heartbeat,
        "client_properties": json_value(connection.client_properties),
    }


def channel_row(node, session, channel, connection_name_: str, peer: tuple[str, int]) -> dict:
    return {
        "name": f"{connection_name_} ({channel.number})", "node": node.name,
        "number": channel.number,
        "user": session.user.name if session.user else None,
        "user_who_performed_action": session.user.name if session.user else None,
        "vhost": session.vhost.name if session.vhost else None,
        "state": "running", "confirm": channel.confirm_mode,
        "transactional": channel.tx_mode,
        "consumer_count": len(channel.consumers),
        "messages_unacknowledged": len(channel.unacked),
        "messages_unconfirmed": len(channel.pending_confirms),
        "messages_uncommitted": len(channel.tx_publishes),
        "acks_uncommitted": len(channel.tx_settlements),
        "prefetch_count": channel.consumer_prefetch,
        "global_prefetch_count": channel.global_prefetch,
        "connection_details": {"name": connection_name_, "peer_host": peer[0],
                               "peer_port": peer[1]},
    }


def consumer_row(node, consumer, channel_name: str, connection_name_: str,
                 peer: tuple[str, int]) -> dict:
    channel = consumer.channel
    queue = consumer.queue
    return {
        "consumer_tag": consumer.tag, "exclusive": consumer.exclusive,
        "ack_required": not consumer.no_ack, "prefetch_count": consumer.prefetch,
        "active": True, "activity_status": "up",
        "arguments": json_value(consumer.arguments),
        "queue": {"name": queue.name, "vhost": queue.vhost},
        "channel_details": {"name": channel_name, "number": channel.number,
                            "connection_name": connection_name_, "node": node.name,
                            "peer_host": peer[0], "peer_port": peer[1],
                            "user": channel.session.user.name},
    }


def client_rows(node, connections) -> dict:
    """This node's AMQP clients as the management API lists them: `connections`,
    `channels` and `consumers` rows of every connection that opened a vhost, every
    user's (the node answering a request keeps those its user may see, views.py).
    `connections` as the server's client_connections gives them: (session, peer, local).
    What a node answers when another one lists the cluster's clients (replica_rpc
    "clients", management/clients.py), and what it lists of its own."""
    result: dict[str, list] = {"connections": [], "channels": [], "consumers": []}
    for session, peer, local in connections:
        if session.user is None or session.vhost is None:
            continue
        name = f"{peer[0]}:{peer[1]} -> {local[0]}:{local[1]}"
        result["connections"].append(connection_row(node, session, peer, local))
        for number in sorted(session.channels):
            channel = session.channels[number]
            result["channels"].append(channel_row(node, session, channel, name, peer))
            for consumer in channel.consumers.values():
                if consumer.queue is None:
                    continue  # direct reply-to's pseudo consumer
                result["consumers"].append(consumer_row(node, consumer, f"{name} ({number})",
                                                        name, peer))
    return result


# ---------------------------------------------------------------- node, overview


def node_row(node, memory_used: int, memory_limit: int, disk_free: int,
             disk_free_limit: int, name: str | None = None, running: bool = True) -> dict:
    """/api/nodes: this node's figures; other members of the cluster are listed with
    `running` only (their figures live on them)."""
    name = name or node.name
    if name != node.name:
        return {"name": name, "type": "disc", "running": running}
    return {
        "name": name, "type": "disc", "running": True,
        "os_pid": str(os.getpid()), "processors": os.cpu_count() or 1,
        "uptime": int((time.monotonic() - STARTED) * 1000),
        "mem_used": memory_used, "mem_limit": memory_limit,
        "mem_alarm": "memory" in node.alarms, "mem_calculation_strategy": "rss",
        "disk_free": disk_free, "disk_free_limit": disk_free_limit,
        "disk_free_alarm": "disk" in node.alarms,
        "rates_mode": "none", "partitions": [],
        "exchange_types": exchange_types(),
        "auth_mechanisms": [{"name": "PLAIN", "description": "SASL PLAIN authentication "
                             "mechanism", "enabled": True},
                            {"name": "AMQPLAIN", "description": "QPid AMQPLAIN mechanism",
                             "enabled": True}],
        "applications": [{"name": "quorumqueue", "description": "quorumqueue broker",
                          "version": __version__}],
        "db_dir": node.settings.data_dir,
    }


def overview(node, user, listeners: list[dict], totals: dict, object_totals: dict) -> dict:
    return {
        "management_version": MANAGEMENT_VERSION, "rates_mode": "none",
        "exchange_types": exchange_types(),
        "product_version": __version__, "product_name": "quorumqueue",
        "rabbitmq_version": MANAGEMENT_VERSION,
        "cluster_name": node.settings.cluster_name,
        "erlang_version": f"Python {platform.python_version()}",
        "erlang_full_version": f"Python {platform.python_version()} "
                               f"({platform.python_implementation()})",
        "disable_stats": False, "enable_queue_totals": False,
        "node": node.name, "listeners": listeners, "contexts": [],
        "queue_totals": totals, "object_totals": object_totals,
        "statistics_db_event_queue": 0,
    }
