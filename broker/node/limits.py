"""Virtual host and user limits, as rabbitmqctl's set_vhost_limits and set_user_limits.

Responsibilities
    Checking a limits definition (`check_vhost_limits`, `check_user_limits`), applying
    one (`apply_vhost_limits`, `apply_user_limits`, the metadata commands
    `vhost.limits` and `user.limits` of node/definitions.py), and enforcing them where
    RabbitMQ does, with its reply codes and texts:

    - connection.open: a vhost's `max-connections` (rabbit_reader's
      is_over_vhost_connection_limit), then the user's `max-connections`, both
      530 NOT_ALLOWED closing the connection, before the vhost access check;
    - channel.open: the user's `max-channels`, 530 NOT_ALLOWED "number of channels
      opened for user 'U' has reached the maximum allowed user limit of (N)" (as
      3.10 to 4.2 word it), like channel_max (amqp/connection.py ChannelQuota counts
      the user's open channels);
    - queue.declare of a new queue: a vhost's `max-queues`, 406 PRECONDITION_FAILED
      "cannot declare queue 'q': queue limit in vhost '/' (N) is reached"
      (rabbit_queue_type:check_vhost_queue_limit).

How it works
    Limits are definitions: set through the management RPC (node/definition_ops.py,
    the CLI's `ctl set_vhost_limits`...), proposed to the metadata group and applied on
    every node, kept in the metadata file and the group's snapshots. A vhost's limits
    are replaced as a whole (rabbit_vhost_limit:set); a user's are merged with those it
    has (internal_user:update_limits(add, ...)), and cleared one by one or all.
    A limit of 0 allows nothing; a negative one is no limit (as RabbitMQ's).

Connections and channels are counted cluster-wide, as RabbitMQ counts them: this
node's own, plus those every reachable node last reported (broker/cluster/tracking.py,
eventually consistent: during a partition each side counts what it can reach).
Queues are counted as this node knows them: every queue record of the cluster
(quorum and classic: the metadata group has them all).

Not here: the wire of the operations (definition_ops.py), persistence (node.py's
metadata document, metadata_snapshot.py).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from ..amqp import spec
from ..amqp.connection import ChannelQuota
from ..amqp.errors import AMQPError, precondition

if TYPE_CHECKING:  # pragma: no cover
    from .node import Node
    from .session import Session

VHOST_LIMITS = ("max-connections", "max-queues")
USER_LIMITS = ("max-connections", "max-channels")


# ------------------------------------------------------------------ checks


def _erlang(value) -> str:
    """A JSON value as RabbitMQ's ~p shows the decoded term in its messages."""
    if isinstance(value, str):
        return f'<<"{value}">>'
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return str(value)


def _check(kind: str, known: tuple[str, ...], limits) -> dict[str, int]:
    """rabbit_parameter_validation:proplist over the limits' JSON object."""
    if not isinstance(limits, dict):
        raise precondition(f"{kind} not a list {_erlang(limits)}")
    unknown = [(key, value) for key, value in limits.items() if key not in known]
    if unknown:
        terms = ",".join(f"{{{_erlang(k)},{_erlang(v)}}}" for k, v in unknown)
        raise precondition(f"Unrecognised terms [{terms}] in {kind}")
    for key, value in limits.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise precondition(f"{key} should be a number, actually was {_erlang(value)}")
    return dict(limits)


def check_vhost_limits(limits) -> dict[str, int]:
    return _check("limits", VHOST_LIMITS, limits)


def check_user_limits(limits) -> dict[str, int]:
    return _check("user-limits", USER_LIMITS, limits)


def check_user_limit_name(name) -> str:
    if name != "all" and name not in USER_LIMITS:
        raise precondition(f"no user limit '{name}' (known: {', '.join(USER_LIMITS)}, all)")
    return name


# ------------------------------------------------------------------ applying


def apply_vhost_limits(node: "Node", vhost: str, limits: dict[str, int]) -> None:
    """The vhost's limits become `limits` (empty: cleared)."""
    target = node.vhosts.get(vhost)
    if target is None or target.limits == limits:
        return
    target.limits = dict(limits)
    node.metadata_dirty = True


def apply_user_limits(node: "Node", name: str, limits: dict[str, int]) -> None:
    """The user's limits become `limits` (the proposing node merged or removed)."""
    user = node.users.users.get(name)
    if user is None:
        return
    if user.limits != limits:
        user.limits = dict(limits)
        node.metadata_dirty = True
    refresh_quota(node, name)


def refresh_quota(node: "Node", name: str) -> None:
    """The user's open channels' quota takes its current max-channels limit."""
    quota = channel_quotas(node).get(name)
    user = node.users.users.get(name)
    if quota is not None:
        quota.limit = _limit(user.limits if user is not None else {}, "max-channels")


# ------------------------------------------------------------------ enforcing


def _limit(limits: dict[str, int], key: str) -> int:
    """The limit, or -1 for none (unset or negative)."""
    value = limits.get(key, -1)
    return value if value >= 0 else -1


def channel_quotas(node: "Node") -> dict[str, ChannelQuota]:
    """user name -> the quota all its connections to this node share."""
    return node.channel_quotas


def channel_quota(node: "Node", name: str) -> ChannelQuota:
    quotas = channel_quotas(node)
    quota = quotas.get(name)
    if quota is None:
        quota = quotas[name] = ChannelQuota(name)
        quota.elsewhere = _elsewhere(node, channels_of=name)
    refresh_quota(node, name)
    return quota


def _elsewhere(node: "Node", **which: str) -> int:
    """Connections (or channels) open on the other nodes of the cluster that this node
    can reach (cluster/tracking.py); 0 for a node of its own."""
    return node.cluster.tracking.elsewhere(**which)


def connection_counts(node: "Node") -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    """This node's open connections (those past connection.open) per vhost and per
    user, and its users' open channels: what cluster/tracking.py tells the others."""
    vhosts: Counter[str] = Counter()
    users: Counter[str] = Counter()
    for session in node.sessions:
        if session.vhost is not None and not session.closed:
            vhosts[session.vhost.name] += 1
            users[session.user.name] += 1
    channels = {user: quota.open for user, quota in node.channel_quotas.items()
                if quota.open > 0}
    return dict(vhosts), dict(users), channels


def refresh_elsewhere(node: "Node") -> None:
    """Every channel quota of this node takes its user's channels open on the other
    nodes this node can reach (the cluster calls this when their counts may have
    changed)."""
    for user, quota in node.channel_quotas.items():
        quota.elsewhere = _elsewhere(node, channels_of=user)


def check_connection(node: "Node", session: "Session", vhost_name: str) -> None:
    """connection.open of `vhost_name` by the session's user: refused with 530 when
    the vhost's or the user's max-connections is reached (counting the open
    connections of every node this node can reach, as RabbitMQ does)."""
    vhost = node.vhosts[vhost_name]
    user = node.users.users.get(session.user.name, session.user)
    opened = [s for s in node.sessions if s.vhost is not None and not s.closed]
    limit = _limit(vhost.limits, "max-connections")
    if limit >= 0 and (sum(1 for s in opened if s.vhost is vhost)
                       + _elsewhere(node, vhost=vhost_name)) >= limit:
        raise AMQPError(spec.NOT_ALLOWED, f"access to vhost '{vhost_name}' refused for user "
                        f"'{user.name}': connection limit ({limit}) is reached", 10, 40)
    limit = _limit(user.limits, "max-connections")
    if limit >= 0 and (sum(1 for s in opened if s.user.name == user.name)
                       + _elsewhere(node, user=user.name)) >= limit:
        raise AMQPError(spec.NOT_ALLOWED, f"connection refused for user '{user.name}': "
                        f"user connection limit ({limit}) is reached", 10, 40)


def check_queue(vhost, name: str) -> None:
    """The declaration of new queue `name` in `vhost`: refused with 406 when the
    vhost's max-queues is reached."""
    limit = _limit(vhost.limits, "max-queues")
    if limit >= 0 and len(vhost.queues) + 1 > limit:
        raise precondition(f"cannot declare queue '{name}': queue limit in vhost "
                           f"'{vhost.name}' ({limit}) is reached")


# ------------------------------------------------------------------ listing


def vhost_limit_rows(node: "Node", vhost: str | None = None) -> list[dict]:
    return [{"vhost": name, "limits": dict(node.vhosts[name].limits)}
            for name in sorted(node.vhosts)
            if (vhost is None or name == vhost) and (vhost is not None
                                                     or node.vhosts[name].limits)]


def user_limit_rows(node: "Node", user: str | None = None) -> list[dict]:
    return [{"user": account.name, "limits": dict(account.limits)}
            for account in sorted(node.users.users.values(), key=lambda u: u.name)
            if (user is None or account.name == user) and (user is not None
                                                           or account.limits)]


def document(node: "Node") -> dict:
    """What the metadata file and the group's snapshot keep: {vhost: limits}."""
    return {name: dict(vhost.limits) for name, vhost in sorted(node.vhosts.items())
            if vhost.limits}


def restore(node: "Node", vhost_limits: dict) -> None:
    """Every vhost's limits as `vhost_limits` says (absent: none)."""
    for name, vhost in node.vhosts.items():
        wanted = dict(vhost_limits.get(name, {}))
        if vhost.limits != wanted:
            vhost.limits = wanted
            node.metadata_dirty = True
