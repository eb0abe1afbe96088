"""cluster/ reaches its node only through the names cluster/host.py's ClusterHost
declares, and the node has each of them (issue 29: "it talks to the node through a
narrow, named interface, not through Node's attributes").

Read from the source: every use of the node in cluster/ (`self.node`, `cluster.node`,
`self.cluster.node`, a parameter annotated ClusterHost) is an attribute of it that
ClusterHost declares, or the node handed on whole to what the cluster builds (its
quorum groups, its metadata group member), never kept under another name.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.broker.node.harness import new_node

CLUSTER = Path(__file__).resolve().parents[3] / "broker" / "cluster"


def declared() -> set[str]:
    """The names ClusterHost's own body declares (attributes and methods)."""
    tree = ast.parse((CLUSTER / "host.py").read_text(encoding="utf-8"))
    (host,) = [node for node in tree.body
               if isinstance(node, ast.ClassDef) and node.name == "ClusterHost"]
    names = set()
    for item in host.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            names.add(item.target.id)
        elif isinstance(item, ast.FunctionDef):
            names.add(item.name)
    return names


def _is_node(expr: ast.AST, params: set[str]) -> bool:
    if isinstance(expr, ast.Name):
        return expr.id in params
    if isinstance(expr, ast.Attribute) and expr.attr == "node":
        base = expr.value
        return (isinstance(base, ast.Name) and base.id in ("self", "cluster")) or (
            isinstance(base, ast.Attribute) and base.attr == "cluster")
    return False


def uses() -> tuple[dict[str, list[str]], list[str]]:
    """(attribute -> where cluster/ reads it on the node, other uses of the node)."""
    read: dict[str, list[str]] = {}
    other: list[str] = []
    for path in sorted(CLUSTER.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        parents = {child: parent for parent in ast.walk(tree)
                   for child in ast.iter_child_nodes(parent)}
        functions = [f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)]
        for function in functions:
            params = {arg.arg for arg in function.args.args
                      if arg.annotation is not None
                      and "ClusterHost" in ast.unparse(arg.annotation)}
            for found in ast.walk(function):
                if not _is_node(found, params):
                    continue
                where = f"{path.name}:{found.lineno}"
                parent = parents[found]
                if isinstance(parent, ast.Attribute) and parent.value is found:
                    read.setdefault(parent.attr, []).append(where)
                elif getattr(found, "ctx", None).__class__ is ast.Store:
                    continue  # self.node = node
                elif isinstance(parent, ast.Call) and found in parent.args:
                    continue  # handed on whole (QuorumGroups, MetaGroup)
                elif isinstance(parent, ast.Assign) and isinstance(found, ast.Name) \
                        and all(ast.unparse(t) == "self.node" for t in parent.targets):
                    continue  # self.node = node
                elif isinstance(parent, ast.Return) and function.name == "node":
                    continue  # the links' `node` property: self.cluster.node
                else:
                    other.append(f"{where} {ast.unparse(parent)}")
    return read, other


def test_cluster_reads_only_the_names_cluster_host_declares_and_each_of_them():
    read, other = uses()
    names = declared()
    undeclared = {name: where for name, where in read.items() if name not in names}
    assert not undeclared, f"cluster/ reads these of the node, not in ClusterHost: {undeclared}"
    assert not other, f"the node kept or used other than through ClusterHost: {other}"
    assert names == set(read), f"declared and never used: {sorted(names - set(read))}"


def test_the_node_has_every_name_cluster_host_declares():
    node = new_node()
    missing = [name for name in sorted(declared()) if not hasattr(node, name)]
    assert not missing, missing
    assert node.queue("/", "nothing") is None
    assert node.shovel_rows() == [] and node.close_connection("nobody", "why") is False
    assert node.clients() == {"connections": [], "channels": [], "consumers": []}
    assert node.after_sync(node.synced_batch_id, object()) is False  # durable already
