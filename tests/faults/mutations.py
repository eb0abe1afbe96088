"""The hostile-input fuzzer's material: a recorded AMQP session and seeded damage to it.

`record_session` runs a pika session (exchange and queue declares, a bind, confirms,
a 300 KB message in three body frames, an empty one, qos, get, consume, ack, nack,
reject, cancel, a transaction on a second channel, purge, close) through a recording
proxy and returns the octets the client sent, cut into frames (`split_frames`).
`Mutator.mutate` damages a copy with seeded random operations (bit flips,
truncation, frames duplicated, dropped, swapped or repeated, length fields and
channel numbers changed, random octets inserted, payloads replaced, the stream cut,
sometimes a hold without reading), or `Mutator.known` applies one damage whose
RabbitMQ answer is known (KNOWN_ANSWERS) and states that answer. `cluster_port_attack`
makes octets for a node's inter-node port from a peer without the cookie.

Not here: sending, checking answers and runs (hostile.py).
"""

from __future__ import annotations

import random
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

import pika

from quorumqueue.broker.cluster import wire as cluster_wire

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_END = 0xCE
CONNECTION_CLOSE = (10, 50)

# mutation kind -> the differential scenario that shows RabbitMQ's answer to it
KNOWN_ANSWERS = {
    "not-amqp": "wrong_protocol_header (RabbitMQ sends its protocol header and closes)",
    "bad-frame-end": "frame_with_bad_end_octet, body_frame_with_bad_end_octet (501)",
    "oversize-frame": "frame_larger_than_frame_max (501 frame_too_large)",
    "heartbeat-on-channel": "heartbeat_on_channel_1 (505)",
    "unknown-frame-type": "unknown_frame_type (501 unknown_frame)",
}


# ---------------------------------------------------------------- the recorded session


def split_frames(data: bytes) -> list[bytes]:
    """A client's octets as [protocol header, frame, frame, ...] (whole frames)."""
    assert data.startswith(PROTOCOL_HEADER), data[:8]
    frames, position = [PROTOCOL_HEADER], 8
    while position < len(data):
        size = struct.unpack_from(">I", data, position + 3)[0]
        frames.append(data[position:position + 8 + size])
        position += 8 + size
    assert b"".join(frames) == data
    return frames


def method_ids(frame: bytes) -> tuple[int, int] | None:
    if len(frame) >= 11 and frame[0] == 1:
        return struct.unpack_from(">HH", frame, 7)
    return None


def _pump(source: socket.socket, target: socket.socket, sink: bytearray | None) -> None:
    try:
        while data := source.recv(65536):
            if sink is not None:
                sink += data
            target.sendall(data)
    except OSError:
        pass
    try:
        target.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def record_session(port: int) -> list[bytes]:
    """What pika sends in a publish/consume session against the broker at `port`,
    recorded by a proxy in between, as frames."""
    listener = socket.create_server(("127.0.0.1", 0))
    recorded = bytearray()

    def proxy() -> None:
        client, _ = listener.accept()
        upstream = socket.create_connection(("127.0.0.1", port))
        back = threading.Thread(target=_pump, args=(upstream, client, None), daemon=True)
        back.start()
        _pump(client, upstream, recorded)
        back.join(10)
        client.close()
        upstream.close()

    thread = threading.Thread(target=proxy, daemon=True)
    thread.start()
    parameters = pika.ConnectionParameters("127.0.0.1", listener.getsockname()[1],
                                           heartbeat=0, blocked_connection_timeout=30)
    connection = pika.BlockingConnection(parameters)
    channel = connection.channel()
    channel.exchange_declare("hostile-x", "topic")
    channel.queue_declare("hostile-replay", arguments={"x-max-length": 20})
    channel.queue_bind("hostile-replay", "hostile-x", "a.#")
    channel.confirm_delivery()
    channel.basic_publish("hostile-x", "a.b", b"small",
                          pika.BasicProperties(headers={"h": 1, "nested": {"t": [1, "x"]}},
                                               priority=3, message_id="one"))
    channel.basic_publish("", "hostile-replay", b"L" * 300_000,
                          pika.BasicProperties(delivery_mode=2))
    channel.basic_publish("", "hostile-replay", b"")
    channel.basic_qos(prefetch_count=5)
    method, _properties, _body = channel.basic_get("hostile-replay")
    channel.basic_ack(method.delivery_tag)
    tags = []
    consumer = channel.basic_consume("hostile-replay",
                                     lambda ch, m, p, b: tags.append(m.delivery_tag))
    deadline = time.monotonic() + 30
    while len(tags) < 2 and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.1)
    channel.basic_nack(tags[0], requeue=True)
    channel.basic_reject(tags[1], requeue=False)
    channel.basic_cancel(consumer)
    other = connection.channel()
    other.tx_select()
    other.basic_publish("", "hostile-replay", b"in a transaction")
    other.tx_commit()
    other.close()
    channel.queue_purge("hostile-replay")
    channel.close()
    connection.close()
    thread.join(10)
    listener.close()
    return split_frames(bytes(recorded))


# ---------------------------------------------------------------- mutations


@dataclass
class Mutation:
    kind: str            # a KNOWN_ANSWERS key, "random" or "cluster-port"
    detail: str          # what was done, to reproduce it
    data: bytes
    expect: dict = field(default_factory=dict)  # for known answers
    hold: float = 0.0    # seconds the attacker then keeps the socket without reading


def _frame(frame_type: int, channel: int, payload: bytes) -> bytes:
    return struct.pack(">BHI", frame_type, channel, len(payload)) + payload + bytes([FRAME_END])


class Mutator:
    """Seeded mutations of one recorded session."""

    def __init__(self, frames: list[bytes]) -> None:
        self.frames = frames
        ids = [method_ids(frame) for frame in frames]
        # frames strictly after connection.open and before the client's close: the
        # connection is open there, so RabbitMQ's answers to framing errors are known
        self.first_open = ids.index((10, 40)) + 1
        self.client_close = ids.index(CONNECTION_CLOSE)
        tune_ok = frames[ids.index((10, 31))]
        self.frame_max = struct.unpack_from(">I", tune_ok, 13)[0] or 131072

    def mutate(self, rng: random.Random) -> Mutation:
        if rng.random() < 0.3:
            return self.known(rng)
        frames = list(self.frames)
        done = []
        for _ in range(rng.randint(1, 4)):
            if not frames:
                break
            index = rng.randrange(len(frames))
            frame = bytearray(frames[index])
            op = rng.choice(["flip", "flip", "truncate", "duplicate", "drop", "swap",
                             "size", "channel", "insert", "payload", "cut-stream",
                             "repeat"])
            if not frame:
                continue
            if op == "flip":
                position = rng.randrange(len(frame))
                frame[position] ^= 1 << rng.randrange(8)
                frames[index] = bytes(frame)
                done.append(f"flip frame {index} octet {position}")
            elif op == "truncate":
                cut = rng.randrange(len(frame))
                frames[index] = bytes(frame[:cut])
                done.append(f"truncate frame {index} to {cut}")
            elif op == "duplicate":
                frames.insert(index, bytes(frame))
                done.append(f"duplicate frame {index}")
            elif op == "drop":
                del frames[index]
                done.append(f"drop frame {index}")
            elif op == "swap":
                other = rng.randrange(len(frames))
                frames[index], frames[other] = frames[other], frames[index]
                done.append(f"swap frames {index} {other}")
            elif op == "size" and len(frame) >= 7:
                size = struct.unpack_from(">I", frame, 3)[0]
                new = rng.choice([0, size - 1, size + 1, size * 2, 2 ** 31, 2 ** 32 - 1,
                                  size + rng.randint(-16, 16)]) % 2 ** 32
                frame[3:7] = struct.pack(">I", new)
                frames[index] = bytes(frame)
                done.append(f"size of frame {index} {size} -> {new}")
            elif op == "channel" and len(frame) >= 3:
                channel = rng.choice([0, 1, 2, 3, 2047, 2048, 65535])
                frame[1:3] = struct.pack(">H", channel)
                frames[index] = bytes(frame)
                done.append(f"channel of frame {index} -> {channel}")
            elif op == "insert":
                junk = rng.randbytes(rng.randint(1, 40))
                frames.insert(index, junk)
                done.append(f"insert {junk.hex()} before frame {index}")
            elif op == "payload" and len(frame) > 8:
                payload = rng.randbytes(len(frame) - 8)
                frames[index] = bytes(frame[:7]) + payload + bytes([FRAME_END])
                done.append(f"random payload in frame {index}")
            elif op == "cut-stream":
                frames = frames[:index]
                done.append(f"stream cut before frame {index}")
            elif op == "repeat":  # volume: a run of frames (say a 300 KB publish) again
                end = min(len(frames), index + rng.randint(1, 6))
                times = rng.randint(2, 40)
                frames[index:end] = frames[index:end] * times
                done.append(f"frames {index}-{end - 1} {times} times")
        # sometimes the attacker then sits on the socket without reading (the broker's
        # writes to it back up: deliveries, confirms) before it reads the answer
        hold = rng.choice([0.0] * 9 + [rng.uniform(0.5, 3.0)])
        if hold:
            done.append(f"hold {hold:.1f} s unread")
        return Mutation("random", "; ".join(done), b"".join(frames), hold=hold)

    def known(self, rng: random.Random) -> Mutation:
        """One mutation whose RabbitMQ answer the differential probes recorded; what
        comes after the damaged frame is not sent (RabbitMQ stops reading there)."""
        kind = rng.choice(sorted(KNOWN_ANSWERS))
        frames = self.frames
        index = rng.randrange(self.first_open, self.client_close)
        before = b"".join(frames[:index])
        if kind == "not-amqp":
            header = bytearray(PROTOCOL_HEADER)
            header[rng.randrange(4)] ^= 1 << rng.randrange(8)
            return Mutation(kind, f"header {bytes(header)!r}", bytes(header) + b"".join(
                frames[1:]), {"answer": PROTOCOL_HEADER})
        frame = bytearray(frames[index])
        if kind == "bad-frame-end":
            end = rng.choice([value for value in range(256) if value != FRAME_END])
            frame[-1] = end
            return Mutation(kind, f"frame {index} ends with {end}", before + bytes(frame), {
                "code": 501, "starts": f"FRAME_ERROR - type {frame[0]}, ",
                "contains": "invalid_frame_end_marker", "closes": True})
        if kind == "oversize-frame":
            size = rng.randint(self.frame_max - 7, 2 ** 32 - 1)
            frame[3:7] = struct.pack(">I", size)
            return Mutation(kind, f"frame {index} announces {size} octets",
                            before + bytes(frame[:7]), {
                                "code": 501, "text": f"FRAME_ERROR - type {frame[0]}, all "
                                f"octets = <<>>: {{frame_too_large,{size},"
                                f"{self.frame_max - 8}}}", "closes": True})
        channel = rng.choice([1, 2, 7, 65535])
        if kind == "heartbeat-on-channel":
            return Mutation(kind, f"heartbeat on channel {channel} before frame {index}",
                            before + _frame(8, channel, b""), {
                                "code": 505, "text": "UNEXPECTED_FRAME - type 8, all octets "
                                "= <<>>"})
        frame_type = rng.choice([0, 4, 5, 6, 7, 9, 65, 206, 255])
        return Mutation(kind, f"frame of type {frame_type} on channel {channel} before "
                        f"frame {index}", before + _frame(frame_type, channel, b"\x00"), {
                            "code": 501, "text": f"FRAME_ERROR - type {frame_type}, all "
                            "octets = <<0>>: unknown_frame"})


def cluster_port_attack(rng: random.Random, node_names: list[str], cookie: str) -> Mutation:
    """Octets for a node's inter-node port from a peer that does not know the cookie:
    a handshake (right or wrong cluster and node names) and a proof made with a wrong
    cookie (a near miss of it, or none) over a challenge it could not know yet, then
    envelopes; random octets; an oversize length; HTTP. The node must answer at most
    a Challenge (its random nonce, to a handshake naming its cluster and itself),
    never a Resume, and deliver nothing."""
    to_node = rng.choice(node_names)
    guess = rng.choice(["", "guest", cookie[:-1], cookie + "x", cookie.upper(),
                        rng.randbytes(8).hex()])
    if guess == cookie:
        guess += "!"
    handshake = cluster_wire.Handshake(
        rng.choice(["quorumqueue", "other"]), rng.choice(node_names + ["intruder"]),
        to_node, rng.randrange(2 ** 32), rng.randbytes(cluster_wire.NONCE_SIZE))
    proof = cluster_wire.handshake_proof(guess, cluster_wire.INITIATOR, handshake,
                                         rng.randbytes(cluster_wire.NONCE_SIZE))
    hello = (cluster_wire.frame(cluster_wire.encode_handshake(handshake))
             + cluster_wire.frame(cluster_wire.encode_proof(cluster_wire.Proof(proof))))
    rpc = cluster_wire.frame(cluster_wire.encode(cluster_wire.Rpc("declare", {"q": "x"})))
    kind = rng.choice(["wrong-cookie", "wrong-cookie", "random", "oversize", "http"])
    data = {"wrong-cookie": hello + rpc * rng.randint(0, 3),
            "random": rng.randbytes(rng.randint(1, 200)),
            "oversize": struct.pack(">I", 2 ** 32 - 1) + rng.randbytes(10),
            "http": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"}[kind]
    return Mutation("cluster-port", f"{kind} (cookie guess {guess!r})", data,
                    {"answer": b""})
