"""Objects are built whole (issue 29, Build 4: "objects receive what they need when
constructed; no attribute wiring after construction").

Read from the source: nothing under broker/ assigns what a quorum queue or the
metadata group member is given when built (its router, its quorum groups), nor the
node's shell (what it asks of the server running it: shovel rows, client rows,
closing a client), nor the cluster's member of the metadata group, nor the channel
a publisher confirm answers, nor a remote classic queue's message store, nor the
server's `on_fatal`, nor the user store's loopback users, except the object's own
`__init__` as `self.<name> = ...`.
Then the objects as the broker assembles them hold what they were built with.
"""

from __future__ import annotations

import ast
from pathlib import Path

from quorumqueue.broker.groups.metadata import META_GROUP
from quorumqueue.broker.node.shell import NO_SHELL
from tests.broker.node.harness import Client, new_node

BROKER = Path(__file__).resolve().parents[2] / "broker"
# given at construction: QuorumQueue and MetaGroup (router, groups), Node (its shell and
# the names the shell's three callables had when assigned to it later), Cluster (its
# metadata group member, `meta`), Confirm (the channel it answers, `channel`), a
# remote classic queue (the node's message store, `store`), BrokerServer (what it
# calls when a flush fails, `on_fatal`), UserStore (who logs in from loopback only)
GIVEN = {"router", "groups", "shell", "shovel_status", "client_rows", "close_client",
         "meta", "channel", "store", "on_fatal", "loopback_users"}


def wiring() -> list[str]:
    """Where broker/ assigns one of GIVEN other than `self.<name> =` in an `__init__`."""
    found = []
    for path in sorted(BROKER.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        inits = {id(node) for function in ast.walk(tree)
                 if isinstance(function, ast.FunctionDef) and function.name == "__init__"
                 for node in ast.walk(function)}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            else:
                continue
            for target in targets:
                # the assigned names themselves (a tuple's too), not what they index
                parts = target.elts if isinstance(target, ast.Tuple) else [target]
                for part in parts:
                    if not (isinstance(part, ast.Attribute) and part.attr in GIVEN):
                        continue
                    own = (isinstance(part.value, ast.Name) and part.value.id == "self"
                           and id(node) in inits)
                    if not own:
                        found.append(f"{path.relative_to(BROKER)}:{node.lineno}: "
                                     f"{ast.unparse(part)} = ...")
    return found


def test_nothing_assigns_what_an_object_is_built_with_after_construction():
    assert wiring() == []


def test_the_assembled_node_hands_its_queues_and_metadata_member_the_cluster():
    client = Client(new_node())
    client.handshake()
    client.open_channel(1)
    client.declare_queue(1, "whole", durable=True, arguments={"x-queue-type": "quorum"})
    node = client.node
    (queue,) = [q for q in node.quorum.queues.values() if getattr(q, "name", None) == "whole"]
    assert queue.router is node.cluster and queue.groups is node.quorum
    assert node.cluster.meta.router is node.cluster
    assert node.quorum.queues[META_GROUP] is node.cluster.meta  # driven with the queues
    # a node no server runs: no shovels, no client connections over a socket
    assert node.shovel_rows() == []
    assert node.clients() == {"connections": [], "channels": [], "consumers": []}
    assert node.close_connection("127.0.0.1:1 -> 127.0.0.1:2", "bye") is False


def test_the_built_node_logs_in_the_configured_loopback_users_from_loopback_only(tmp_path):
    """build_node gives its user store `loopback_users` when it makes it (RabbitMQ's
    loopback_users: those users only from a loopback address), with the default
    guest user or a configured one."""
    from quorumqueue.broker.config import Settings
    from quorumqueue.broker.server.server import build_node

    for default_user, data in (("guest", "a"), ("alice", "b")):
        settings = Settings(data_dir=str(tmp_path / data), default_user=default_user,
                            default_pass="pw" if default_user == "alice" else "guest",
                            loopback_users=("alice",), fsync=False)
        node = build_node(settings, NO_SHELL)
        try:
            password = "pw" if default_user == "alice" else "guest"
            assert node.users.loopback_users == {"alice"}
            assert node.authenticate(default_user, password, "127.0.0.1") is not None
            remote = node.authenticate(default_user, password, "10.0.0.7")
            assert (remote is None) == (default_user == "alice")
        finally:
            node.quorum.store.close()


def is_member(expr, path: Path) -> bool:
    """`<...>cluster.meta`, or `self.meta` in cluster/cluster.py: the cluster's
    metadata member (not a snapshot's `meta`, say)."""
    if not (isinstance(expr, ast.Attribute) and expr.attr == "meta"):
        return False
    owner = ast.unparse(expr.value)
    return owner.endswith("cluster") or (owner == "self"
                                         and path == BROKER / "cluster" / "cluster.py")


def meta_guards() -> list[str]:
    """Where broker/ asks whether the cluster's metadata member (`<x>.meta`, or a
    local name taken from one) is None, or tests it for truth: it is there from the
    cluster's construction on, so such a branch cannot be taken."""
    found = []
    for path in sorted(BROKER.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for function in ast.walk(tree):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            local = {target.id for node in ast.walk(function) if isinstance(node, ast.Assign)
                     and is_member(node.value, path)
                     for target in node.targets if isinstance(target, ast.Name)}

            def is_meta(expr) -> bool:
                return (is_member(expr, path)
                        or (isinstance(expr, ast.Name) and expr.id in local))

            for node in ast.walk(function):
                tested = []
                if isinstance(node, ast.Compare) and is_meta(node.left) and all(
                        isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops) and all(
                        isinstance(c, ast.Constant) and c.value is None
                        for c in node.comparators):
                    tested.append(node)
                elif isinstance(node, (ast.If, ast.IfExp)) and is_meta(node.test):
                    tested.append(node.test)
                found += [f"{path.relative_to(BROKER)}:{one.lineno}: {ast.unparse(one)}"
                          for one in tested]
    return found


def test_nothing_asks_whether_the_cluster_has_its_metadata_member():
    assert meta_guards() == []
