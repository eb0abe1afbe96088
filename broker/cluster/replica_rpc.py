"""Asking a quorum queue's members on other nodes: status, peek, reclaim (and a node
for its shovels' status, its message counters or its AMQP clients).

Responsibilities: what `queues quorum_status`, `peek` and `reclaim_quorum_memory`
need from a member wherever it runs (rabbitmq-queues asks the members' nodes over
Erlang distribution; here an Rpc "replica" to the member's node, answered by
"replica_reply"), and what the member computes for each:

- status: its row (queues/quorum/queue.py `member_status`), at once (no apply awaited:
  it reports where the member stands, as ra's key metrics do);
- peek: the ready message at a position (fifo/peek.py, queues/quorum/peeked.py), from the
  leader only (as RabbitMQ's aux command: a follower or a minority's member may be
  behind), once it applied everything it had appended;
- shovels: the status rows of the dynamic shovels the node runs (`ctl
  shovel_status` asked on another node than the one running them; broker/shovel/);
- message_stats: the node's message counters, for the management API's
  `message_stats`, which RabbitMQ sums over the cluster (management/rates.py): the
  node's (node/counters.py, RabbitMQ's names) and, for every queue whose counters
  moved, what the node's clients did with it (queues/base.py MessageCounts, as a
  list in its `__slots__` order), keyed by the queue's record uid (a queue deleted
  and declared again is another queue); at once, from memory;
- clients: the management rows of the node's AMQP clients (`connections`,
  `channels`, `consumers`: management/rows.py `client_rows`), for the management
  API's lists, which RabbitMQ's plugin gives for the whole cluster
  (management/clients.py); at once, from memory;
- close_client: the node's client connection named `name` closed with 320
  CONNECTION_FORCED and `reason` (`DELETE /api/connections/NAME` asked on another
  node); `{"closed": bool}`;
- reclaim: the node's write-ahead log rolled over (storage: every memory table
  written to segment files, the memory released), the queue's in-memory log bytes
  before and after.

A member whose node is unreachable, that has no replica of the queue there, or that
does not answer within REPLY_TIMEOUT is "noproc" (RabbitMQ's Raft State for a member
whose ra server is not running), with the other columns empty, as RabbitMQ shows it.
A request for this node's own member is answered without the network, within the
same time bound (a peek waits for the member's apply, which a group without a
majority never finishes). When the transport loses its link to a node (`link_lost`:
a killed node's sockets close at once), what was asked of it is answered None then,
and so is what is asked of it until it is heard from again: no answer can come over
a link that is gone, and an operator's API call should not wait REPLY_TIMEOUT for it
(the cluster's `reachable` still decides everything else).

Not here: choosing the rows and texts of the commands (node/management.py), the
queue's state (queues/quorum/queue.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from .wire import Rpc

if TYPE_CHECKING:  # pragma: no cover
    from .cluster import Cluster

REPLY_TIMEOUT = 5.0  # seconds a member's node has to answer

STATUS_COLUMNS = ("Node Name", "Raft State", "Membership", "Last Log Index", "Last Written",
                  "Last Applied", "Commit Index", "Snapshot Index", "Term")


def noproc(node: str) -> dict[str, Any]:
    """The row of a member that is not running (node down, no replica, no answer)."""
    return {column: "" for column in STATUS_COLUMNS} | {"Node Name": node,
                                                       "Raft State": "noproc"}


def ask(cluster: "Cluster", node: str, group: str, op: str, args: dict,
        done: Callable[[dict | None], None]) -> None:
    """Ask `node`'s member of `group` for `op`; `done(answer)`, or `done(None)` if the
    node is unreachable, holds no replica, or does not answer in time."""
    if not cluster.reachable(node) or node in cluster.links_lost:
        done(None)
        return
    cluster._next_request += 1
    request = cluster._next_request
    cluster.replica_requests[request] = (done, cluster.now + REPLY_TIMEOUT, node)
    if node == cluster.name:  # this node's member: no network, the same time bound
        answer_here(cluster, group, op, args,
                    lambda answer: on_replica_reply(cluster, node, {"r": request,
                                                                    "v": answer}))
    else:
        cluster._post(node, Rpc("replica", {"r": request, "g": group, "op": op, "a": args}))


def answer_here(cluster: "Cluster", group: str, op: str, args: dict,
                done: Callable[[dict | None], None]) -> None:
    if op == "shovels":  # the dynamic shovels this node runs (not a group's: any group)
        done({"rows": cluster.node.shovel_rows()})
        return
    if op == "message_stats":  # the node's counters (not a group's: any group)
        done(cluster.node.message_stats())
        return
    if op == "clients":  # the node's AMQP clients' management rows (not a group's)
        done(cluster.node.clients())
        return
    if op == "close_client":  # one of the node's AMQP client connections
        done({"closed": cluster.node.close_connection(str(args["name"]),
                                                      str(args["reason"]))})
        return
    member = cluster.groups.queues.get(group)
    if member is None or member.raft is None or member.deleted:
        done(None)
        return
    if op == "status":
        done(member.member_status(cluster.name))
    elif op == "peek":
        if not member.is_leader:  # RabbitMQ asks the leader; a deposed one declines
            done(None)
            return

        def peeked(_reply=None) -> None:
            done({"message": member.peek(int(args["position"]))})

        if member.has_unapplied():
            member.after_applied(peeked)
        else:
            peeked()
    elif op == "reclaim":
        store = cluster.groups.store
        before = store.memtable_bytes(group)
        store.roll_over_soon(lambda: done({"node": cluster.name, "before": before,
                                           "after": store.memtable_bytes(group)}))
    else:
        done(None)


def on_replica(cluster: "Cluster", sender: str, body: dict) -> None:
    def reply(answer: dict | None) -> None:
        cluster._post(sender, Rpc("replica_reply", {"r": body["r"], "v": answer}))

    answer_here(cluster, body["g"], body["op"], body.get("a") or {}, reply)


def on_replica_reply(cluster: "Cluster", sender: str, body: dict) -> None:
    waiting = cluster.replica_requests.pop(body["r"], None)
    if waiting is not None:
        waiting[0](body.get("v"))


def expire(cluster: "Cluster") -> None:
    now = cluster.now
    for request, (done, deadline, _node) in list(cluster.replica_requests.items()):
        if now >= deadline:
            del cluster.replica_requests[request]
            done(None)


def link_lost(cluster: "Cluster", node: str) -> None:
    """The link to `node` is gone: what was asked of it gets None now."""
    for request, (done, _deadline, asked) in list(cluster.replica_requests.items()):
        if asked == node:
            del cluster.replica_requests[request]
            done(None)


def handlers() -> dict:
    return {"replica": on_replica, "replica_reply": on_replica_reply}
