"""Snapshot format versions (snapshot.py header): version 2 adds the length limits
and the reject-publish block, version 3 the publishers' rejected-seq gaps; older
snapshots still load (no limits, no gaps). (Restore-and-replay equality is the
property in test_machine.py.)"""

from __future__ import annotations

import json
import struct

import pytest

from quorumqueue.broker.fifo import snapshot
from quorumqueue.broker.fifo.commands import Checkout, Enqueue, Meta
from quorumqueue.broker.fifo.machine import apply
from quorumqueue.broker.fifo.state import FifoConfig, FifoState

_head = struct.Struct(">4sHI")


def _filled(config: FifoConfig) -> FifoState:
    state = FifoState(config=config)
    for index, command in enumerate([Enqueue("p", 1, 10, 0), Enqueue("", 0, 20, 9),
                                     Checkout("c", 1, 0, "conn"), Enqueue("p", 2, 5, 0),
                                     Enqueue("q", 7, 5, 0)],
                                    start=1):
        state, _, _ = apply(Meta(index, 1, 0), command, state)
    return state


def _as_version_1(data: bytes) -> bytes:
    """The bytes a version-1 build wrote for the same state: no limits, no block."""
    _magic, _version, length = _head.unpack_from(data)
    document = json.loads(data[_head.size:_head.size + length])
    for key in ("max_length", "max_bytes", "overflow"):
        del document["config"][key]
    del document["publishers_blocked"]
    del document["enqueuer_gaps"]
    header = json.dumps(document, separators=(",", ":")).encode()
    return _head.pack(b"QQFS", 1, len(header)) + header + data[_head.size + length:]


def test_dump_writes_version_3_with_the_limits_and_gaps():
    state = _filled(FifoConfig(max_length=1, max_bytes=100, overflow="reject-publish"))
    data = snapshot.dump(state)
    assert _head.unpack_from(data)[1] == 3
    restored = snapshot.load(data)
    assert restored.config == FifoConfig(max_length=1, max_bytes=100,
                                         overflow="reject-publish")
    assert restored.publishers_blocked and snapshot.dump(restored) == data
    assert restored.enqueuer_gaps == {"p": 2, "q": 7}     # rejected while blocked


def test_version_1_snapshot_loads_as_a_queue_without_limits():
    state = _filled(FifoConfig())
    current = snapshot.dump(state)
    restored = snapshot.load(_as_version_1(current))
    assert restored.config == FifoConfig()
    assert not restored.publishers_blocked and restored.enqueuer_gaps == {}
    assert snapshot.dump(restored) == current


def test_unknown_version_is_refused():
    data = bytearray(snapshot.dump(FifoState()))
    struct.pack_into(">H", data, 4, 4)
    with pytest.raises(ValueError, match="unknown fifo snapshot version 4"):
        snapshot.load(bytes(data))
