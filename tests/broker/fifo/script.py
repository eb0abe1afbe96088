"""Data-driven scripts for the fifo machine (etcd-io/raft's `datadriven` layout).

A script file is a sequence of blocks; `#` lines and blank lines between blocks are
comments. A block is one command line, a `----` line, then the expected output up to
the next blank line:

    config max_length=2
    ----
    delivery_limit=20 max_length=2 max_bytes=none overflow=drop-head

    enqueue n=3
    ----
    @1 ok
    @2 ok
    @3 ok
      dropped @1 maxlen
    ready=2 bytes=20 checked=0

Each command applied to the machine prints `@<raft index> <reply>`, then its effects
indented (release cursors are left out: they are not what these scripts are about),
and the block ends with the state's counts. Commands:

    config [delivery_limit=N] [interval=N] [max_length=N] [max_bytes=N] [overflow=MODE]
           [single_active=1]       a fresh machine with that FifoConfig, from index 1
                                   (single_active: the counts line ends with the
                                   active consumer and the waiting ones, in order)
    enqueue [n=1] [size=10] [priority=0] [publisher=P] [seq=S]
                                   seq defaults to the publisher's next one
    checkout C [prefetch=0] [priority=0] [connection=conn-C]
    cancel C | settle C ID.. | return C ID.. | discard C ID..
    dequeue C [settled] [connection=conn-C]
    purge | down CONNECTION | tick [time=MS]
    lease-grow L [n=1] [bytes=0] [timeout=0] | lease-settle L UP_TO
    lease-release L [fence]         fence: an operator's release
    update-config [delivery_limit=N] [max_length=N|none] [max_bytes=N|none] [overflow=MODE]
                                   an UpdateConfig (a policy change); a key left out
                                   keeps its current value; prints the new config
    snapshot                       dump and load the state (prints the format version)
    state                          the counts only

`QQ_REWRITE=1 pytest tests/broker/fifo/test_scripts.py` rewrites the expected output
of every block with what the machine does now; review the diff before committing.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quorumqueue.broker.fifo import single_active, snapshot
from quorumqueue.broker.fifo.commands import (ActiveConsumerChanged, Cancel, Checkout,
                                              Command, Deliver, Delivery, Dequeue,
                                              Discard, Down, Dropped, Effect,
                                              Enqueue, LeaseGrow, LeaseRelease,
                                              LeaseReleased, LeaseSettle, Meta, Purge,
                                              ReleaseCursor, Return, Settle, Tick,
                                              UpdateConfig)
from quorumqueue.broker.fifo.machine import apply
from quorumqueue.broker.fifo.state import FifoConfig, FifoState, LeaseFence

REWRITE = os.environ.get("QQ_REWRITE") == "1"


@dataclass
class Block:
    line: int            # 1-based line of the command
    comments: list[str]  # comment and blank lines before the command
    command: str
    expected: list[str]


def parse(text: str, name: str) -> tuple[list[Block], list[str]]:
    """The blocks of a script and the comment lines after the last one."""
    lines = text.splitlines()
    blocks: list[Block] = []
    comments: list[str] = []
    position = 0
    while position < len(lines):
        line = lines[position]
        if not line.strip() or line.startswith("#"):
            comments.append(line)
            position += 1
            continue
        if position + 1 >= len(lines) or lines[position + 1] != "----":
            raise ValueError(f"{name}:{position + 1}: expected '----' after {line!r}")
        end = position + 2
        while end < len(lines) and lines[end].strip():
            end += 1
        blocks.append(Block(position + 1, comments, line, lines[position + 2:end]))
        comments = []
        position = end
    return blocks, comments


def render(blocks: list[Block], outputs: list[list[str]], trailing: list[str]) -> str:
    lines: list[str] = []
    for block, output in zip(blocks, outputs):
        lines += block.comments + [block.command, "----"] + output
    return "\n".join(lines + trailing) + "\n"


class Machine:
    """Applies script commands at increasing raft indexes."""

    def __init__(self) -> None:
        self.state = FifoState()
        self.index = 0
        self.time = 1_000
        self.seqs: dict[str, int] = {}

    def run(self, line: str) -> list[str]:
        words = line.split()
        verb, positional, options = words[0], [], {}
        for word in words[1:]:
            if "=" in word:
                key, value = word.split("=", 1)
                options[key] = value
            else:
                positional.append(word)
        handler = getattr(self, "do_" + verb.replace("-", "_"), None)
        if handler is None:
            raise ValueError(f"unknown script command {verb!r}")
        return handler(positional, options)

    # --- commands

    def do_config(self, _args, options) -> list[str]:
        def limit(key: str) -> int | None:
            value = options.get(key, "none")
            return None if value == "none" else int(value)

        config = FifoConfig(int(options.get("delivery_limit", 20)),
                            int(options.get("interval", 2048)), limit("max_length"),
                            limit("max_bytes"), options.get("overflow", "drop-head"),
                            single_active=options.get("single_active") == "1")
        self.state, self.index, self.seqs = FifoState(config=config), 0, {}
        return [_config_text(config)]

    def do_enqueue(self, _args, options) -> list[str]:
        publisher = options.get("publisher", "")
        out: list[str] = []
        for _ in range(int(options.get("n", 1))):
            seq = int(options["seq"]) if "seq" in options else self.seqs.get(publisher, 0) + 1
            self.seqs[publisher] = max(self.seqs.get(publisher, 0), seq)
            options.pop("seq", None)  # n > 1: the rest follow on
            out += self._apply(Enqueue(publisher, seq, int(options.get("size", 10)),
                                       int(options.get("priority", 0))))
        return out + [self._counts()]

    def do_checkout(self, args, options) -> list[str]:
        [consumer] = args
        return self._step(Checkout(consumer, int(options.get("prefetch", 0)),
                                   int(options.get("priority", 0)),
                                   options.get("connection", "conn-" + consumer)))

    def do_cancel(self, args, _options) -> list[str]:
        return self._step(Cancel(args[0]))

    def do_settle(self, args, _options) -> list[str]:
        return self._step(Settle(args[0], tuple(int(a) for a in args[1:])))

    def do_return(self, args, _options) -> list[str]:
        return self._step(Return(args[0], tuple(int(a) for a in args[1:])))

    def do_discard(self, args, _options) -> list[str]:
        return self._step(Discard(args[0], tuple(int(a) for a in args[1:])))

    def do_dequeue(self, args, options) -> list[str]:
        consumer = args[0]
        return self._step(Dequeue(consumer, "settled" in args[1:],
                                  options.get("connection", "conn-" + consumer)))

    def do_purge(self, _args, _options) -> list[str]:
        return self._step(Purge())

    def do_down(self, args, _options) -> list[str]:
        return self._step(Down(args[0]))

    def do_tick(self, _args, options) -> list[str]:
        if "time" in options:
            self.time = int(options["time"])
        return self._step(Tick())

    def do_lease_grow(self, args, options) -> list[str]:
        return self._step(LeaseGrow(args[0], int(options.get("n", 1)),
                                    int(options.get("bytes", 0)),
                                    int(options.get("timeout", 0))))

    def do_lease_settle(self, args, _options) -> list[str]:
        return self._step(LeaseSettle(args[0], int(args[1])))

    def do_lease_release(self, args, _options) -> list[str]:
        return self._step(LeaseRelease(args[0], "fence" in args[1:]))

    def do_update_config(self, _args, options) -> list[str]:
        config = self.state.config

        def limit(key: str, current: int | None) -> int | None:
            value = options.get(key, "none" if current is None else str(current))
            return None if value == "none" else int(value)

        command = UpdateConfig(int(options.get("delivery_limit", config.delivery_limit)),
                               limit("max_length", config.max_length),
                               limit("max_bytes", config.max_bytes),
                               options.get("overflow", config.overflow))
        out = self._apply(command)
        return out + [_config_text(self.state.config), self._counts()]

    def do_snapshot(self, _args, _options) -> list[str]:
        data = snapshot.dump(self.state)
        self.state = snapshot.load(data)
        (version,) = struct.unpack_from(">H", data, 4)
        return [f"restored from a version-{version} snapshot", self._counts()]

    def do_state(self, _args, _options) -> list[str]:
        return [self._counts()]

    # --- helpers

    def _step(self, command: Command) -> list[str]:
        return self._apply(command) + [self._counts()]

    def _apply(self, command: Command) -> list[str]:
        self.index += 1
        self.state, reply, effects = apply(Meta(self.index, 1, self.time), command,
                                           self.state)
        return [f"@{self.index} {_reply_text(reply)}"] + [
            "  " + _effect_text(e) for e in effects if not isinstance(e, ReleaseCursor)]

    def _counts(self) -> str:
        state = self.state
        text = f"ready={state.ready_count} bytes={state.ready_bytes} " \
               f"checked={state.checked_out_count}"
        if state.leased_count:
            text += f" leased={state.leased_count}"
        if state.publishers_blocked:
            text += " publishers-blocked"
        if state.config.single_active:
            text += f" active={state.active or '-'}"
            waiting = single_active.waiting_order(state)
            if waiting:
                text += f" waiting={','.join(waiting)}"
            if single_active.quiescing(state):
                text += " quiescing"
        return text


def _config_text(config: FifoConfig) -> str:
    def limit(value: int | None) -> str:
        return "none" if value is None else str(value)

    return (f"delivery_limit={config.delivery_limit} max_length={limit(config.max_length)} "
            f"max_bytes={limit(config.max_bytes)} overflow={config.overflow}"
            + (" single_active" if config.single_active else ""))


def _delivery_text(delivery: Delivery) -> str:
    text = f"#{delivery.msg_id} @{delivery.raft_index}"
    return text + (f" count={delivery.delivery_count}" if delivery.delivery_count else "")


def _reply_text(reply: Any) -> str:
    if reply is None:
        return "-"
    if isinstance(reply, LeaseFence):
        return (f"fenced {reply.first_seq}..{reply.end_seq} ({reply.reason} at "
                f"{reply.at_ms}, timeout {reply.timeout_ms})")
    if isinstance(reply, tuple) and reply and isinstance(reply[0], Delivery):
        return f"{_delivery_text(reply[0])}, {reply[1]} left"
    if isinstance(reply, tuple):
        return " ".join(str(part) for part in reply)
    return str(reply)


def _effect_text(effect: Effect) -> str:
    match effect:
        case Deliver(consumer, deliveries):
            return f"deliver {consumer}: " + ", ".join(_delivery_text(d) for d in deliveries)
        case Dropped(raft_index, reason):
            return f"dropped @{raft_index} {reason}"
        case LeaseReleased(lease, reason):
            return f"lease {lease} released ({reason})"
        case ActiveConsumerChanged(consumer):
            return f"active consumer: {consumer or '-'}"
    raise AssertionError(f"no text for {effect!r}")


def run_script(path: Path) -> tuple[list[tuple[Block, list[str]]], str]:
    """Run every block of a script file: (block, actual output) pairs, and the file
    as it would read with the actual outputs."""
    blocks, trailing = parse(path.read_text(), path.name)
    machine = Machine()
    outputs = [machine.run(block.command) for block in blocks]
    return list(zip(blocks, outputs)), render(blocks, outputs, trailing)
