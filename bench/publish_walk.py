"""The walk of one confirmed publish through the broker's code, counted.

    python bench/publish_walk.py [--size 1024] [--calls] [--json PATH]

One node in-process (`tests/broker/node/harness.py`, the node as the broker
assembles it, over a log store that fsyncs), one durable quorum queue, a channel in
confirm mode, one message published and confirmed first (warm caches, lazy imports).
Then the second message is followed from its bytes to its confirm, as the server
shell drives it for one burst of input: its publish frames handed to
`Session.receive_data`, one group commit (`group_commit.begin_sync`: the Raft round
persisted, the WAL written; `Sync.run`: the fdatasync; `group_commit.end_sync`: sent,
applied, confirms released) and `Session.data_to_send()` with the `basic.ack` in it.
The round the shell runs after that (nothing to persist) is not part of the walk: the
confirm has left by then. `sys.setprofile` sees every Python call meanwhile.

How it counts (issue 29's figures):
- calls: "call" events of functions defined under broker/ (C functions, the
  standard library and other packages are not counted; their callees under broker/
  are);
- modules: the distinct broker/ files those functions are in;
- package switches: calls whose function is in another broker package than the
  nearest broker/ frame that called it (a package: a folder under broker/, raft's
  storage/ counted as raft; files directly in broker/ as "broker");
- transitions: in the flat list of those calls, in the order made, how often one
  call's package differs from the one before it (counts the way back too: a
  return to a package after a call into another shows as a transition);
- upward calls: package switches against the layer order of `.importlinter`
  (a lower package calling into a higher one: a callback), listed by pair;
  "node<->raft back-and-forth" is the number of raft -> node calls.

Prints the totals, the switches by (caller, callee) package pair and, with
`--calls`, the walk itself, one call per line, indented by depth.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from pamqp import commands  # noqa: E402

from tests.broker.node.harness import Client, content_frames, marshal, method, new_node  # noqa: E402

import quorumqueue.broker  # noqa: E402

BROKER = os.path.dirname(os.path.realpath(quorumqueue.broker.__file__)) + "/"
CONFIRM_MARK = b"\x00\x3c\x00\x50"  # basic.ack's class and method ids
# highest first, as in .importlinter's layers (a package missing here is unranked)
LAYERS = [("server",), ("management", "metrics"), ("node",), ("cluster",), ("queues",),
          ("groups",), ("routing", "fifo", "raft", "storage", "auth", "shovel"), ("amqp",)]


def package_of(filename: str) -> str | None:
    """The broker package a code object's file belongs to, or None outside broker/."""
    if not filename.startswith(BROKER):
        return None
    parts = filename[len(BROKER):].split("/")
    return parts[0] if len(parts) > 1 else "broker"


def rank(package: str) -> int | None:
    for index, layer in enumerate(LAYERS):
        if package in layer:
            return index
    return None


def walk(size: int) -> list[tuple[int, str, str, str | None]]:
    """(depth, package, 'file:function', caller's package) of every broker call made
    while one confirmed publish goes from bytes to confirm."""
    from quorumqueue.broker.raft.storage import LogStore
    from quorumqueue.broker.raft.storage.config import StorageConfig

    directory = tempfile.mkdtemp(prefix="qq-walk-")
    client = Client(new_node(log_store=LogStore(directory, StorageConfig(fsync=True))))
    client.handshake()
    client.open_channel(1)
    client.declare_queue(1, "walk", durable=True, arguments={"x-queue-type": "quorum"})
    client.call(1, commands.Confirm.Select(), "Confirm.SelectOk")
    one = (marshal(method(commands.Basic.Publish, exchange="", routing_key="walk"), 1)
           + content_frames(1, b"x" * size, commands.Basic.Properties(delivery_mode=2),
                            client.frame_max))
    client.send_bytes(one)
    assert CONFIRM_MARK in client.read_raw(), "the warm-up publish was not confirmed"

    calls: list[tuple[int, str, str, str | None]] = []
    stack: list[str | None] = []  # the broker package of each open Python frame, or None

    def profile(frame, event, _arg):
        if event == "call":
            package = package_of(os.path.realpath(frame.f_code.co_filename))
            if package is not None:
                caller = next((p for p in reversed(stack) if p is not None), None)
                name = (os.path.realpath(frame.f_code.co_filename)[len(BROKER):] + ":"
                        + frame.f_code.co_qualname)
                calls.append((len(stack), package, name, caller))
            stack.append(package)
        elif event == "return" and stack:
            stack.pop()

    from quorumqueue.broker.node import group_commit

    session, node = client.session, client.node
    sys.setprofile(profile)
    try:
        session.receive_data(one, client.now)
        sync = group_commit.begin_sync(node)
        sync.run()
        group_commit.end_sync(node, sync)
        out = session.data_to_send()
    finally:
        sys.setprofile(None)
    assert CONFIRM_MARK in out, "the traced publish was not confirmed"
    return calls


def summary(calls) -> dict:
    modules = {name.split(":")[0] for _d, _p, name, _c in calls}
    switches = collections.Counter((caller, package) for _d, package, _n, caller in calls
                                   if caller is not None and caller != package)
    upward = {pair: count for pair, count in switches.items()
              if rank(pair[0]) is not None and rank(pair[1]) is not None
              and rank(pair[1]) < rank(pair[0])}
    order = [package for _d, package, _n, _c in calls]
    transitions = sum(1 for before, after in zip(order, order[1:]) if before != after)
    return {"calls": len(calls), "modules": len(modules), "transitions": transitions,
            "package_switches": sum(switches.values()),
            "raft_to_node": switches.get(("raft", "node"), 0),
            "node_raft_pairs": switches.get(("node", "raft"), 0) + switches.get(("raft", "node"), 0),
            "upward_calls": sum(upward.values()),
            "switches": {f"{a} -> {b}": n for (a, b), n in sorted(switches.items())},
            "upward": {f"{a} -> {b}": n for (a, b), n in sorted(upward.items())},
            "module_list": sorted(modules)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--calls", action="store_true", help="print the walk, one call a line")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    calls = walk(args.size)
    if args.calls:
        for depth, package, name, caller in calls:
            mark = "  <- switch" if caller is not None and caller != package else ""
            print(f"{'  ' * min(depth, 30)}{name}{mark}")
    result = summary(calls)
    print(f"command: .venv/bin/python bench/publish_walk.py --size {args.size}")
    print(f"calls {result['calls']}, modules {result['modules']}, package switches "
          f"{result['package_switches']}, transitions {result['transitions']}, upward calls {result['upward_calls']}, "
          f"raft -> node {result['raft_to_node']}, node <-> raft {result['node_raft_pairs']}")
    for pair, count in result["switches"].items():
        print(f"  {pair:30} {count}")
    if result["upward"]:
        print("upward (a lower package calling a higher one):")
        for pair, count in result["upward"].items():
            print(f"  {pair:30} {count}")
    print("modules:", " ".join(result["module_list"]))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
