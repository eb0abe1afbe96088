"""Hostile input against a live node: a socket-level mutation fuzzer.

A real broker process (tests/support/broker.py) is attacked for a fixed time while a
healthy client uses it, and the run is judged:

- the broker never crashes: its process is alive at the end and its log shows no
  traceback and no fatal error;
- the healthy connection never hangs: a confirmed publisher (persistent messages,
  one at a time, each waiting for its confirm) and a manual-ack consumer on a quorum
  queue each keep one connection for the whole run (none is lost or replaced) and
  every publish is confirmed within HANG_BOUND seconds;
- nothing confirmed is lost: after the attack every confirmed id is delivered
  (tests/support/history.py's total-queue checker);
- the broker answers like RabbitMQ: every answer decodes as AMQP frames, every
  connection.close and channel.close carries an AMQP reply code with RabbitMQ's
  `NAME - detail` text, only close-ok follows a connection.close; and for the
  mutations whose RabbitMQ answer tests/differential/test_against_rabbitmq.py
  records (its scenarios named in KNOWN_ANSWERS), that answer.

How it works (the session and its damage are mutations.py's): `record_session` runs
a pika session (exchange and queue declares, a bind, confirms, a message of 300 KB
split into body frames, an empty one, qos, get, consume, ack, nack, reject, cancel,
a transaction on a second channel, purge, close) through a recording proxy and
keeps the octets the client sent, cut into frames. Attacker threads then each loop: take the recording, apply 1-4 seeded mutations
(`mutate`: bit flips, truncation, a frame duplicated, dropped or swapped, a run of
frames repeated up to 40 times, a length field or channel number changed, random
octets inserted, a payload replaced, the stream cut; or one mutation with a known
answer), connect, send it in random chunks, sometimes sit on the socket for up to
3 s without reading (the broker's writes back up), read the answer until the broker
closes or stays silent for a second, and check it (`check_answer`).
The seed fixes every mutation and chunking, not the machine's timing.

`--nodes 3` attacks a 3-node cluster instead (tests/support/cluster.py): attacker
connections go to random nodes, the healthy publisher to the first and its consumer
to the last, and every node must stay up with a clean log. A tenth of the attacker
connections then go to a node's inter-node port as a peer that does not know the
cookie (`cluster_port_attack`): the node must answer at most its Challenge (a
random nonce), never a Resume.

`python -m tests.faults.hostile --seconds 300` is the long form (`make faults`);
test_hostile.py runs a short seeded one in CI.

Not here: the sans-I/O fuzzers (tests/broker/node/test_fuzz.py,
test_stateful_protocol.py), the cluster nemeses (nemesis.py, run.py).
"""

from __future__ import annotations

import argparse
import contextlib
import random
import re
import socket
import struct
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pika

from quorumqueue.broker.cluster import wire as cluster_wire
from tests.faults.mutations import (CONNECTION_CLOSE, FRAME_END, KNOWN_ANSWERS,
                                    PROTOCOL_HEADER, Mutation, Mutator, cluster_port_attack,
                                    record_session)
from tests.support.broker import BrokerProcess
from tests.support.cluster import LocalCluster
from tests.support.history import (ID_HEADER, Delivery, History, declare_quorum_queue,
                                   violations)
from tests.support.rabbitmq import RabbitMQNode

HANG_BOUND = 30.0        # seconds a healthy publish may take to be confirmed, at most
SILENCE = 1.0            # an attacker stops reading after this long without an answer
ANSWER_BOUND = 10.0      # ... and after this long in all
HEALTHY_QUEUE = "hostile-healthy"
REPLY_TEXT = re.compile(r"^([A-Z_]+) - .")
REPLY_NAMES = {200: "REPLY_SUCCESS", 311: "CONTENT_TOO_LARGE", 312: "NO_ROUTE",
               313: "NO_CONSUMERS", 320: "CONNECTION_FORCED", 402: "INVALID_PATH",
               403: "ACCESS_REFUSED", 404: "NOT_FOUND", 405: "RESOURCE_LOCKED",
               406: "PRECONDITION_FAILED", 501: "FRAME_ERROR", 502: "SYNTAX_ERROR",
               503: "COMMAND_INVALID", 504: "CHANNEL_ERROR", 505: "UNEXPECTED_FRAME",
               506: "RESOURCE_ERROR", 530: "NOT_ALLOWED", 540: "NOT_IMPLEMENTED",
               541: "INTERNAL_ERROR"}  # AMQP 0-9-1 section 1.9, as RabbitMQ names them
CONNECTION_CLOSE_OK, CHANNEL_CLOSE = (10, 51), (20, 40)


# ---------------------------------------------------------------- attacking and checking


def attack(port: int, mutation: Mutation, rng: random.Random,
           until_close: bool = False) -> tuple[bytes, bool]:
    """Send the mutated session in random chunks; (the answer, whether the broker
    closed the connection). With `until_close`, reading stops at the first
    connection.close."""
    answer = bytearray()
    with socket.create_connection(("127.0.0.1", port), timeout=SILENCE) as sock:
        data, position = mutation.data, 0
        try:
            while position < len(data):
                size = rng.choice([1, 7, 64, 1500, 65536, len(data)])
                sock.sendall(data[position:position + size])
                position += size
                if rng.random() < 0.05:
                    time.sleep(0.005)
        except OSError:
            pass  # the broker closed while we wrote: read what it said
        if mutation.hold:
            time.sleep(mutation.hold)
        started = time.monotonic()
        while time.monotonic() - started < ANSWER_BOUND:
            try:
                received = sock.recv(65536)
            except socket.timeout:
                return bytes(answer), False
            except OSError:
                return bytes(answer), True
            if not received:
                return bytes(answer), True
            answer += received
            if until_close and len(first_close(bytes(answer), False)) == 2:
                return bytes(answer), False
    return bytes(answer), False


def parse_answer(answer: bytes, closed: bool) -> tuple[list[tuple[int, int, bytes]], list[str]]:
    """The broker's answer as (type, channel, payload) frames, and what is malformed."""
    problems, frames, position = [], [], 0
    if answer.startswith(b"AMQP"):
        if answer != PROTOCOL_HEADER or not closed:
            problems.append(f"protocol header answer {answer[:16]!r}, then more or no close")
        return frames, problems
    while position < len(answer):
        if len(answer) - position < 8:
            break
        frame_type, channel, size = struct.unpack_from(">BHI", answer, position)
        end = position + 7 + size
        if end >= len(answer):
            break
        if answer[end] != FRAME_END or frame_type not in (1, 2, 3, 8):
            problems.append(f"malformed frame at {position}: {answer[position:position + 16]!r}")
            return frames, problems
        frames.append((frame_type, channel, answer[position + 7:end]))
        position = end + 1
    if position < len(answer) and closed:
        problems.append(f"the answer ends in a partial frame: {answer[position:][:32]!r}")
    return frames, problems


def close_of(payload: bytes) -> tuple[int, str]:
    code, length = struct.unpack_from(">HB", payload, 4)
    return code, payload[7:7 + length].decode("utf-8", "replace")


def check_answer(mutation: Mutation, answer: bytes, closed: bool) -> list[str]:
    """What in the broker's answer is not as RabbitMQ would answer."""
    expect = mutation.expect
    if mutation.kind == "cluster-port":  # at most the node's Challenge, nothing after
        try:
            payloads = cluster_wire.FrameReader().feed(answer)
            said = sum(len(p) + cluster_wire.HEADER_SIZE for p in payloads)
            if len(payloads) > 1 or said != len(answer):
                raise cluster_wire.WireError("more than one whole frame")
            for payload in payloads:
                cluster_wire.decode_challenge(payload)
        except cluster_wire.WireError:
            return [f"the inter-node port answered a peer without the cookie more than "
                    f"a Challenge: {answer[:64]!r}"]
        return []
    if "answer" in expect:  # not AMQP at all
        if answer != expect["answer"] or not closed:
            return [f"answered {answer[:32]!r} (closed: {closed}), RabbitMQ sends "
                    f"{expect['answer']!r} and closes"]
        return []
    frames, problems = parse_answer(answer, closed)
    first_close, after_close = None, False
    for frame_type, channel, payload in frames:
        if frame_type != 1:
            continue
        ids = struct.unpack_from(">HH", payload)
        if after_close and ids != CONNECTION_CLOSE_OK:
            problems.append(f"method {ids} after connection.close")
        if ids in (CONNECTION_CLOSE, CHANNEL_CLOSE):
            code, text = close_of(payload)
            match = REPLY_TEXT.match(text)
            if code not in REPLY_NAMES or not match or match.group(1) != REPLY_NAMES[code]:
                problems.append(f"close {ids} with code {code} text {text!r}")
            if ids == CONNECTION_CLOSE:
                if channel != 0:
                    problems.append(f"connection.close on channel {channel}")
                first_close = first_close or (code, text)
                after_close = True
    if expect:
        if first_close is None:
            problems.append(f"no connection.close; RabbitMQ closes with {expect['code']}")
        else:
            code, text = first_close
            wanted = (code == expect["code"]
                      and text.startswith(expect.get("starts", ""))
                      and expect.get("contains", "") in text
                      and ("text" not in expect or text == expect["text"]))
            if not wanted:
                problems.append(f"closed with {code} {text!r}; RabbitMQ: {expect}")
        if expect.get("closes") and not closed:
            problems.append("the socket stayed open after a framing error")
    return problems


def first_close(answer: bytes, closed: bool) -> tuple:
    """What decides a known answer: the protocol header (and whether the socket was
    closed), or the first connection.close's code and text."""
    if answer.startswith(b"AMQP"):
        return ("header", answer, closed)
    frames, _problems = parse_answer(answer, closed)
    for frame_type, _channel, payload in frames:
        if frame_type == 1 and struct.unpack_from(">HH", payload) == CONNECTION_CLOSE:
            return close_of(payload)
    return ("no connection.close",)


# ---------------------------------------------------------------- the healthy client


class Healthy:
    """A confirmed publisher and a manual-ack consumer on a quorum queue, each on one
    connection it must keep for the whole run."""

    def __init__(self, ports: list[int]) -> None:
        self.ports = ports  # the publisher uses the first, the consumer the last
        self.history = History()
        self.stopping = threading.Event()
        self.errors: list[str] = []
        self.latencies: list[float] = []
        self.publishing_since: float | None = None  # a publish waiting for its confirm
        self._threads = [threading.Thread(target=self._guard, args=(work,), daemon=True)
                         for work in (self._publish, self._consume)]

    def _connect(self, port: int) -> pika.BlockingConnection:
        return pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", port, heartbeat=30, blocked_connection_timeout=HANG_BOUND,
            socket_timeout=HANG_BOUND, stack_timeout=HANG_BOUND))

    def start(self) -> "Healthy":
        declare_quorum_queue([f"amqp://guest:guest@127.0.0.1:{port}/%2F"
                              for port in self.ports], HEALTHY_QUEUE, timeout=60)
        for thread in self._threads:
            thread.start()
        return self

    def _guard(self, work) -> None:
        try:
            work()
        except BaseException as error:  # noqa: BLE001 - the run reports it
            self.errors.append(f"{work.__name__}: {error!r}")

    def _publish(self) -> None:
        connection = self._connect(self.ports[0])
        channel = connection.channel()
        channel.confirm_delivery()
        sent = 0
        while not self.stopping.is_set():
            sent += 1
            message_id = f"h-{sent:06d}"
            self.history.record("published", message_id)
            self.publishing_since = time.monotonic()
            channel.basic_publish("", HEALTHY_QUEUE, message_id.encode(),
                                  pika.BasicProperties(delivery_mode=2, message_id=message_id,
                                                       headers={ID_HEADER: message_id}),
                                  mandatory=True)
            self.latencies.append(time.monotonic() - self.publishing_since)
            self.publishing_since = None
            self.history.record("confirmed", message_id)
            self.stopping.wait(0.01)
        connection.close()

    def _consume(self) -> None:
        connection = self._connect(self.ports[-1])
        channel = connection.channel()
        channel.basic_qos(prefetch_count=50)

        def on_message(channel, method, properties, body) -> None:
            message_id = (properties.headers or {}).get(ID_HEADER, f"<none: {body[:20]!r}>")
            self.history.record("deliveries", Delivery(message_id, bool(method.redelivered),
                                                       "node"))
            channel.basic_ack(method.delivery_tag)

        channel.basic_consume(HEALTHY_QUEUE, on_message)
        while not self.stopping.is_set() or self.missing():
            connection.process_data_events(time_limit=0.2)
            if self.stopping.is_set() and time.monotonic() > self.drain_deadline:
                break
        connection.close()

    def missing(self) -> set[str]:
        with self.history.lock:
            confirmed = set(self.history.confirmed)
        return confirmed - self.history.delivered_ids()

    def hung(self) -> str:
        since = self.publishing_since
        if since is not None and time.monotonic() - since > HANG_BOUND:
            return f"a publish waits for its confirm since {time.monotonic() - since:.0f} s"
        return ""

    def finish(self, drain: float = 60.0) -> None:
        self.drain_deadline = time.monotonic() + drain
        self.stopping.set()
        for thread in self._threads:
            thread.join(drain + HANG_BOUND)
            if thread.is_alive():
                self.errors.append(f"{thread.name} did not finish within "
                                   f"{drain + HANG_BOUND:.0f} s")


# ---------------------------------------------------------------- a run


@dataclass
class HostileResult:
    seconds: float
    seed: int
    nodes: int = 1
    connections: int = 0
    kinds: Counter = field(default_factory=Counter)
    closed_by_broker: int = 0
    problems: list[str] = field(default_factory=list)   # answers unlike RabbitMQ's
    healthy: list[str] = field(default_factory=list)    # hangs, lost connections, losses
    broker: list[str] = field(default_factory=list)     # crashes, tracebacks
    confirmed: int = 0
    delivered: int = 0
    slowest_confirm: float = 0.0
    rabbitmq: bool = False  # known answers were also asked of RabbitMQ
    compared: int = 0       # ... this many

    @property
    def ok(self) -> bool:
        return not (self.problems or self.healthy or self.broker)

    def summary(self) -> str:
        kinds = ", ".join(f"{kind} {count}" for kind, count in sorted(self.kinds.items()))
        lines = [f"{self.seconds:g} s, seed {self.seed}, {self.nodes} node"
                 f"{'s' if self.nodes > 1 else ''}: {self.connections} hostile "
                 f"connections ({kinds}), {self.closed_by_broker} closed by the broker; "
                 f"healthy client: {self.confirmed} confirmed, {self.delivered} delivered, "
                 f"slowest confirm {self.slowest_confirm:.2f} s"
                 + (f"; {self.compared} known answers compared with RabbitMQ 3.10.8"
                    if self.rabbitmq else "")]
        for title, items in (("answers unlike RabbitMQ's", self.problems),
                             ("healthy client", self.healthy), ("broker", self.broker)):
            if items:
                lines.append(f"{title}: {len(items)}")
                lines += [f"  {item}" for item in items[:20]]
        return "\n".join(lines)


BROKER_FAILURES = ("Traceback", "CRITICAL", "Fatal error", "Exception in callback")


def differs_from_rabbitmq(mutation: Mutation, ours: tuple, rabbitmq_port: int,
                          chunking: str) -> str:
    """RabbitMQ's answer to a known-answer mutation, compared with ours (`first_close`
    of both): empty when they agree."""
    theirs = first_close(*attack(rabbitmq_port, mutation, random.Random(chunking),
                                 until_close=True))
    if theirs != ours:
        return f"RabbitMQ answers {theirs!r}, quorumqueue {ours!r}"
    return ""


class _Target:
    """The broker under attack: one process, or a cluster of `nodes` processes."""

    def __init__(self, stack: contextlib.ExitStack, nodes: int) -> None:
        if nodes == 1:
            self.broker = stack.enter_context(BrokerProcess())
            self.ports = [self.broker.port]
        else:
            self.cluster = stack.enter_context(LocalCluster(nodes, proxied=False))
            self.ports = [plan.amqp_port for plan in self.cluster.plans]
            self.cluster_ports = [plan.cluster_port for plan in self.cluster.plans]
        self.nodes = nodes

    def failures(self) -> list[str]:
        """Nodes that exited, and tracebacks or fatal errors in the logs."""
        found = []
        if self.nodes == 1:
            logs = {"node": Path(self.broker.log_path).read_text(errors="replace")}
            if self.broker.process is None or self.broker.process.poll() is not None:
                found.append(f"the broker exited: {self.broker.log()[-2000:]}")
        else:
            logs = {name: self.cluster.log(name, tail=10 ** 9) for name in self.cluster.names}
            found += [f"{name} exited: {logs[name][-2000:]}" for name in self.cluster.names
                      if not self.cluster.running(name)]
        for name, log in logs.items():
            for marker in BROKER_FAILURES:
                if marker in log:
                    at = log.index(marker)
                    found.append(f"{marker} in the log of {name}: {log[at - 200:at + 1500]}")
        return found


def run(seconds: float, seed: int, attackers: int = 4, rabbitmq: bool = False,
        nodes: int = 1) -> HostileResult:
    """One attack of `seconds` on one node or a cluster of `nodes` (each attacker
    connection to a node picked at random; the healthy publisher on the first node,
    its consumer on the last). With `rabbitmq` (and RabbitMQ 3.10.8 installed), every
    known-answer mutation is also sent to a private RabbitMQ node, and its answer is
    the one expected."""
    result = HostileResult(seconds, seed, nodes=nodes)
    with contextlib.ExitStack() as stack:
        oracle = (stack.enter_context(RabbitMQNode()) if rabbitmq and RabbitMQNode.available()
                  else None)
        target = _Target(stack, nodes)
        result.rabbitmq = oracle is not None
        healthy = Healthy(target.ports).start()  # (a cluster: once it has a leader)
        frames = record_session(target.ports[0])
        mutator = Mutator(frames)
        lock = threading.Lock()
        deadline = time.monotonic() + seconds

        def attacker(number: int) -> None:
            rng = random.Random(f"{seed}-{number}")
            count = 0
            while time.monotonic() < deadline:
                count += 1
                mutation = mutator.mutate(rng)
                port = rng.choice(target.ports)
                if nodes > 1 and rng.random() < 0.1:  # a node's inter-node port
                    mutation = cluster_port_attack(rng, target.cluster.names,
                                                   target.cluster.cookie)
                    port = rng.choice(target.cluster_ports)
                try:
                    chunking = f"{seed}-{number}-{count}"  # the same for RabbitMQ
                    answer, closed = attack(port, mutation, random.Random(chunking))
                except OSError as error:  # could not even connect
                    problems = [f"connect failed: {error!r}"]
                    answer, closed = b"", False
                else:
                    problems = check_answer(mutation, answer, closed)
                    if oracle is not None and mutation.kind in KNOWN_ANSWERS:
                        difference = differs_from_rabbitmq(
                            mutation, first_close(answer, closed), oracle.port, chunking)
                        problems += [difference] if difference else []
                        with lock:
                            result.compared += 1
                with lock:
                    result.connections += 1
                    result.kinds[mutation.kind] += 1
                    result.closed_by_broker += closed
                    result.problems += [f"[{number}.{count} {mutation.kind}: "
                                        f"{mutation.detail}] {problem}"
                                        for problem in problems]

        threads = [threading.Thread(target=attacker, args=(number,), daemon=True)
                   for number in range(attackers)]
        for thread in threads:
            thread.start()
        while time.monotonic() < deadline:
            if hang := healthy.hung():
                result.healthy.append(hang)
                break
            time.sleep(0.5)
        for thread in threads:
            thread.join(ANSWER_BOUND + 30)
        healthy.finish()
        history = healthy.history
        result.healthy += healthy.errors + violations(history)
        result.confirmed = len(history.confirmed)
        result.delivered = len(history.delivered_ids())
        result.slowest_confirm = max(healthy.latencies, default=0.0)
        if result.slowest_confirm > HANG_BOUND:
            result.healthy.append(f"a confirm took {result.slowest_confirm:.1f} s")
        result.broker += target.failures()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--attackers", type=int, default=4)
    parser.add_argument("--rabbitmq", action="store_true",
                        help="also send every known-answer mutation to RabbitMQ 3.10.8 "
                        "(when installed) and expect its answer")
    parser.add_argument("--nodes", type=int, default=1,
                        help="attack a cluster of this many nodes (default: one node)")
    args = parser.parse_args(argv)
    result = run(args.seconds, args.seed, args.attackers, args.rabbitmq, args.nodes)
    print(result.summary())
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
