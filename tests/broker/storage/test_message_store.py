"""The segmented message store: what is flushed is recovered, and nothing else.

Checks the invariants written in broker/storage/message_store.py: records are durable
once `flush()` returned; recovery replays enqueue/ack/purge/delete in order; a torn
record is tolerated only at the tail of the newest segment (a crash mid-write) and is
cut off so appending can continue; any other damage stops recovery with an error
naming the file and offset; dead segments are deleted oldest first; a mostly dead
oldest segment has its live messages copied forward (compaction), delivered flag and
all; a DELIVERED record marks a recovered message delivered; version-1 segments are
still read. A Hypothesis model test runs random operation sequences, with crashes,
against a dictionary.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quorumqueue.broker.storage.message_store import (CorruptStoreError, MessageStore,
                                                      queue_key)

Q1 = queue_key("/", "orders")
Q2 = queue_key("vhost-ü", "очередь")


def opened(directory, segment_bytes: int = 1 << 20) -> MessageStore:
    store = MessageStore(str(directory), segment_bytes=segment_bytes, fsync=False)
    assert store.recover() == {} or True
    return store


def recovered(directory, segment_bytes: int = 1 << 20) -> dict:
    """Recover into a fresh MessageStore:
    {key: [(seq, exchange, key, header, body, delivered)]}."""
    store = MessageStore(str(directory), segment_bytes=segment_bytes, fsync=False)
    result = {key: [(m.seq, m.exchange, m.routing_key, m.header, m.body, m.delivered)
                    for m in messages]
              for key, messages in store.recover().items() if messages}
    store.close()
    return result


def segments(directory) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name.endswith(".seg"))


def enqueue(store: MessageStore, key: bytes, seq: int, body: bytes = b"body") -> int:
    return store.append_enqueue(key, seq, "amq.direct", f"rk-{seq}", b"\x00\x3c-header", body)


def record(seq: int, body: bytes = b"body", delivered: bool = False) -> tuple:
    return (seq, "amq.direct", f"rk-{seq}", b"\x00\x3c-header", body, delivered)


def crash(store: MessageStore) -> None:
    """The process dies: the pending batch is lost, nothing more is written."""
    store._batch.clear()
    store._file.close()
    store._file = None


# ---------------------------------------------------------------- round trip


def test_append_flush_recover_round_trip(tmp_path):
    """Enqueue/ack records replay to the live set, per queue, in seq order."""
    store = opened(tmp_path)
    assert enqueue(store, Q1, 1, b"one") == 1
    enqueue(store, Q1, 2, b"two")
    enqueue(store, Q2, 1, b"\x00binary\xff")
    store.append_ack(Q1, 1)
    assert store.has_pending
    assert store.flush() == 1
    assert not store.has_pending
    enqueue(store, Q1, 3, b"three")
    assert store.flush() == 2
    store.close()
    assert recovered(tmp_path) == {Q1: [record(2, b"two"), record(3, b"three")],
                                   Q2: [record(1, b"\x00binary\xff")]}


def test_unflushed_appends_are_not_recovered(tmp_path):
    """Only a flush makes records durable; a crash loses the pending batch (and the
    broker never confirmed those messages)."""
    store = opened(tmp_path)
    enqueue(store, Q1, 1)
    store.flush()
    enqueue(store, Q1, 2)
    store.append_ack(Q1, 1)
    crash(store)
    assert recovered(tmp_path) == {Q1: [record(1)]}


def test_purge_and_delete_records(tmp_path):
    """PURGE drops seqs up to its bound; DELETE drops a queue; later enqueues survive."""
    store = opened(tmp_path)
    for seq in range(1, 6):
        enqueue(store, Q1, seq)
        enqueue(store, Q2, seq)
    store.append_purge(Q1, 3)
    store.append_delete(Q2)
    enqueue(store, Q2, 1, b"recreated queue")  # a new queue of that name starts again
    store.flush()
    store.close()
    assert recovered(tmp_path) == {Q1: [record(4), record(5)],
                                   Q2: [record(1, b"recreated queue")]}


def test_recovery_can_continue_appending_to_the_newest_segment(tmp_path):
    """Recovery reopens the newest segment for appends without a new file."""
    store = opened(tmp_path)
    enqueue(store, Q1, 1)
    store.flush()
    store.close()
    store = MessageStore(str(tmp_path), fsync=False)
    store.recover()
    store.append_ack(Q1, 1)
    enqueue(store, Q1, 2)
    store.flush()
    store.close()
    assert segments(tmp_path) == ["00000001.seg"]
    assert recovered(tmp_path) == {Q1: [record(2)]}


# ---------------------------------------------------------------- deliveries


def test_a_delivered_record_marks_the_recovered_message_delivered(tmp_path):
    """DELIVERED marks a live message as handed out before the restart; a repeat is
    not written twice, an acked message forgets it, and other messages stay undelivered."""
    store = opened(tmp_path)
    for seq in (1, 2, 3):
        enqueue(store, Q1, seq)
    store.flush()
    store.append_delivered(Q1, 1)
    store.append_delivered(Q1, 1)
    store.append_delivered(Q1, 3)
    assert len(store._batch) == 2
    store.append_ack(Q1, 3)
    store.append_delivered(Q1, 9)  # not live: nothing to record
    store.flush()
    store.close()
    assert recovered(tmp_path) == {Q1: [record(1, delivered=True), record(2)]}


def test_a_batch_of_only_delivered_records_is_written_without_fdatasync(tmp_path,
                                                                       monkeypatch):
    """A DELIVERED record never costs an fdatasync of its own: it is written (so it
    survives the broker process dying) and rides with the next fsync."""
    synced = []
    monkeypatch.setattr(os, "fdatasync", lambda fd: synced.append(fd))
    store = MessageStore(str(tmp_path), segment_bytes=1 << 20, fsync=True)
    store.recover()
    enqueue(store, Q1, 1)
    store.flush()
    assert len(synced) == 1
    store.append_delivered(Q1, 1)
    store.flush()
    assert len(synced) == 1
    crash(store)  # the process dies after the write: the record is in the file
    assert recovered(tmp_path) == {Q1: [record(1, delivered=True)]}


def test_compaction_carries_the_delivered_flag_forward(tmp_path):
    """A delivered long-lived message copied forward out of a mostly dead segment is
    still delivered after recovery, though the segment with its DELIVERED is gone."""
    store = opened(tmp_path, segment_bytes=2000)
    enqueue(store, Q2, 1, b"long-lived")
    store.append_delivered(Q2, 1)
    for seq in range(1, 30):
        enqueue(store, Q1, seq, b"w" * 40)
    store.flush()  # rotates to segment 2
    for seq in range(1, 30):
        store.append_ack(Q1, seq)
    for seq in range(30, 60):
        enqueue(store, Q1, seq, b"w" * 40)
        store.append_ack(Q1, seq)
    store.flush()
    assert "00000001.seg" not in segments(tmp_path)
    store.close()
    assert recovered(tmp_path, 2000) == {Q2: [record(1, b"long-lived", delivered=True)]}


def compacted_out_of_segment_1(store: MessageStore, directory) -> dict:
    """Fill `store` (segment_bytes 2000) with Q1 messages acked at once, until its
    first segment is compacted away, close it and recover: what Q2 had in segment 1
    was copied forward."""
    for seq in range(1, 30):
        enqueue(store, Q1, seq, b"w" * 40)
    store.flush()  # rotates to segment 2
    for seq in range(1, 30):
        store.append_ack(Q1, seq)
    for seq in range(30, 60):
        enqueue(store, Q1, seq, b"w" * 40)
        store.append_ack(Q1, seq)
    store.flush()
    assert "00000001.seg" not in segments(directory)
    store.close()
    again = MessageStore(str(directory), segment_bytes=2000, fsync=False)
    messages = again.recover()
    again.close()
    return messages


def test_a_message_expiry_is_recovered_and_carried_forward_by_compaction(tmp_path):
    """A message with a TTL is written with its expiry (ENQUEUE_EXPIRING, version 3):
    recovery gives it back, also after compaction copied it out of a dead segment, so
    a durable classic queue's TTL keeps counting across a restart; a message
    without one recovers with none."""
    store = opened(tmp_path, segment_bytes=2000)
    store.append_enqueue(Q2, 1, "ex", "rk", b"\x00\x3c-header", b"ttl", expires=1_234_567)
    enqueue(store, Q2, 2, b"plain")
    messages = compacted_out_of_segment_1(store, tmp_path)[Q2]
    assert [(m.seq, m.exchange, m.routing_key, m.body, m.expires) for m in messages] == [
        (1, "ex", "rk", b"ttl", 1_234_567), (2, "amq.direct", "rk-2", b"plain", 0)]


def test_a_version_1_store_is_read_and_left_as_it_is(tmp_path):
    """A store written before DELIVERED existed (format version 1, the same records
    without type 5) recovers; new records go to a new version-4 segment, so the old
    file's header stays true. An unknown version stops recovery, naming it."""
    store = opened(tmp_path)
    enqueue(store, Q1, 1)
    enqueue(store, Q1, 2)
    store.flush()
    store.close()
    path = tmp_path / "00000001.seg"
    data = bytearray(path.read_bytes())
    data[4:6] = (1).to_bytes(2, "big")
    path.write_bytes(bytes(data))
    store = MessageStore(str(tmp_path), fsync=False)
    assert [m.seq for m in store.recover()[Q1]] == [1, 2]
    store.append_delivered(Q1, 1)
    store.append_ack(Q1, 2)
    store.flush()
    store.close()
    assert path.read_bytes() == bytes(data)
    assert segments(tmp_path) == ["00000001.seg", "00000002.seg"]
    assert (tmp_path / "00000002.seg").read_bytes()[:6] == b"QQMS\x00\x04"
    assert recovered(tmp_path) == {Q1: [record(1, delivered=True)]}
    data[4:6] = (5).to_bytes(2, "big")
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptStoreError, match="unknown format version 5"):
        MessageStore(str(tmp_path), fsync=False).recover()


def test_a_version_3_store_is_read_and_a_new_segment_takes_the_bcc_records(tmp_path):
    """A store written before ENQUEUE_BCC existed (version 3: ENQUEUE, ENQUEUE_EXPIRING
    and the rest, byte for byte as this build writes them for a message without BCC
    keys) recovers unchanged; new records go to a new version-4 segment."""
    store = opened(tmp_path)
    enqueue(store, Q1, 1)
    store.append_enqueue(Q1, 2, "ex", "rk", b"\x00\x3c-header", b"ttl", expires=99)
    store.flush()
    store.close()
    path = tmp_path / "00000001.seg"
    data = bytearray(path.read_bytes())
    data[4:6] = (3).to_bytes(2, "big")
    path.write_bytes(bytes(data))
    store = MessageStore(str(tmp_path), fsync=False)
    assert [(m.seq, m.expires, m.blind_keys) for m in store.recover()[Q1]] == [
        (1, 0, ()), (2, 99, ())]
    store.append_enqueue(Q1, 3, "ex", "rk", b"\x00\x3c-header", b"bcc", blind_keys=("k",))
    store.flush()
    store.close()
    assert path.read_bytes() == bytes(data)
    assert (tmp_path / "00000002.seg").read_bytes()[:6] == b"QQMS\x00\x04"
    store = MessageStore(str(tmp_path), fsync=False)
    assert [m.blind_keys for m in store.recover()[Q1]] == [(), (), ("k",)]
    store.close()


def test_a_message_bcc_keys_are_recovered_and_carried_forward_by_compaction(tmp_path):
    """A message published with BCC keys is written with them (ENQUEUE_BCC, with its
    expiry or 0): recovery gives them back, also after compaction copied the message
    out of a dead segment, so its dead-lettered copy is routed by them after a
    restart (queues/dead_letter.py)."""
    keys = ("", "k\u00e9", "\udcff", "x" * 70000)
    store = opened(tmp_path, segment_bytes=2000)
    store.append_enqueue(Q2, 1, "ex", "rk", b"\x00\x3c-header", b"bcc", blind_keys=keys)
    store.append_enqueue(Q2, 2, "ex", "rk", b"\x00\x3c-header", b"both", expires=77,
                         blind_keys=("one",))
    enqueue(store, Q2, 3, b"plain")
    messages = compacted_out_of_segment_1(store, tmp_path)[Q2]
    assert [(m.seq, m.body, m.header, m.expires, m.blind_keys) for m in messages] == [
        (1, b"bcc", b"\x00\x3c-header", 0, keys), (2, b"both", b"\x00\x3c-header", 77, ("one",)),
        (3, b"plain", messages[2].header, 0, ())]


# ---------------------------------------------------------------- torn tails and corruption


def three_records(directory) -> tuple[str, list[int]]:
    """A segment with three enqueues; returns its path and the record offsets."""
    store = opened(directory)
    offsets = []
    for seq in (1, 2, 3):
        offsets.append(store._file_size + sum(len(r) for r in store._batch))
        enqueue(store, Q1, seq, b"x" * 20)
    store.flush()
    store.close()
    path = os.path.join(directory, "00000001.seg")
    return path, offsets


def test_torn_tail_of_the_newest_segment_is_cut_off_at_every_cut_point(tmp_path):
    """A crash mid-write leaves part of the last record: recovery keeps everything
    before it, truncates the file there, and later appends recover normally."""
    path, offsets = three_records(tmp_path / "template")
    with open(path, "rb") as handle:
        data = handle.read()
    for cut in range(offsets[2] + 1, len(data)):
        directory = tmp_path / f"cut{cut}"
        directory.mkdir()
        with open(directory / "00000001.seg", "wb") as handle:
            handle.write(data[:cut])
        assert recovered(directory) == {Q1: [record(1, b"x" * 20), record(2, b"x" * 20)]}
        assert os.path.getsize(directory / "00000001.seg") == offsets[2]
        store = opened(directory)
        enqueue(store, Q1, 4)
        store.flush()
        store.close()
        assert [m[0] for m in recovered(directory)[Q1]] == [1, 2, 4]


def test_a_torn_file_header_of_a_new_segment_is_tolerated(tmp_path):
    """A crash right after a rotation can leave a newest segment with only part of its
    6-byte file header; it holds no records, and the store must go on with it."""
    store = opened(tmp_path)
    enqueue(store, Q1, 1)
    store.flush()
    store.close()
    with open(tmp_path / "00000002.seg", "wb") as handle:
        handle.write(b"QQM")
    assert recovered(tmp_path) == {Q1: [record(1)]}
    store = opened(tmp_path)
    enqueue(store, Q1, 2)
    store.flush()
    store.close()
    assert recovered(tmp_path) == {Q1: [record(1), record(2)]}


def test_a_flipped_byte_in_the_middle_is_corruption_naming_file_and_offset(tmp_path):
    """A record that fails its checksum but is followed by more data is not a torn
    write: recovery refuses to guess and names the file and the record's offset."""
    path, offsets = three_records(tmp_path)
    with open(path, "r+b") as handle:
        handle.seek(offsets[1] + 20)  # inside the second record's payload
        byte = handle.read(1)
        handle.seek(offsets[1] + 20)
        handle.write(bytes([byte[0] ^ 0x01]))
    with pytest.raises(CorruptStoreError) as raised:
        MessageStore(str(tmp_path), fsync=False).recover()
    assert path in str(raised.value)
    assert f"offset {offsets[1]}" in str(raised.value)
    assert "checksum mismatch" in str(raised.value)


def test_a_torn_record_in_an_older_segment_is_corruption(tmp_path):
    """Only the newest segment can have been mid-write at a crash."""
    store = opened(tmp_path, segment_bytes=200)
    seq = 0
    while len(segments(tmp_path)) < 2:
        seq += 1
        enqueue(store, Q1, seq, b"y" * 40)
        store.flush()
    store.close()
    older = os.path.join(tmp_path, segments(tmp_path)[0])
    size = os.path.getsize(older)
    with open(older, "r+b") as handle:
        handle.truncate(size - 5)
    with pytest.raises(CorruptStoreError) as raised:
        MessageStore(str(tmp_path), fsync=False).recover()
    assert older in str(raised.value) and "offset" in str(raised.value)


def test_a_foreign_file_is_refused(tmp_path):
    """A .seg file without the QQMS magic stops recovery."""
    with open(tmp_path / "00000001.seg", "wb") as handle:
        handle.write(b"NOT A SEGMENT AT ALL")
    with pytest.raises(CorruptStoreError, match="not a quorumqueue message store segment"):
        MessageStore(str(tmp_path), fsync=False).recover()


# ---------------------------------------------------------------- rotation and compaction


def test_segments_rotate_and_dead_ones_are_deleted_oldest_first(tmp_path):
    """Segments rotate at segment_bytes; dead ones are deleted oldest first."""
    store = opened(tmp_path, segment_bytes=300)
    for seq in range(1, 21):
        enqueue(store, Q1, seq, b"z" * 50)
        store.flush()
    assert store.segment_count() == len(segments(tmp_path)) > 3
    first_segments = segments(tmp_path)
    # ack everything but the newest message: older segments die and go at rotation
    for seq in range(1, 20):
        store.append_ack(Q1, seq)
    store.flush()
    for seq in range(21, 24):
        enqueue(store, Q1, seq, b"z" * 50)
        store.append_ack(Q1, seq)
        store.flush()
    remaining = segments(tmp_path)
    assert remaining[0] > first_segments[0]
    assert len(remaining) < len(first_segments)
    store.close()
    assert recovered(tmp_path, 300) == {Q1: [record(20, b"z" * 50)]}


def test_a_mostly_dead_oldest_segment_is_compacted(tmp_path):
    """One long-lived message must not pin its segment and every later one: when at
    most a tenth of the oldest segment is live, its live messages are copied forward
    and the segment is deleted."""
    store = opened(tmp_path, segment_bytes=2000)
    enqueue(store, Q2, 1, b"long-lived")
    for seq in range(1, 30):
        enqueue(store, Q1, seq, b"w" * 40)
    store.flush()  # about 2.4 kB: rotates to segment 2
    assert segments(tmp_path) == ["00000001.seg", "00000002.seg"]
    for seq in range(1, 30):
        store.append_ack(Q1, seq)
    for seq in range(30, 60):  # fill segment 2 with short-lived messages to rotate again
        enqueue(store, Q1, seq, b"w" * 40)
        store.append_ack(Q1, seq)
    store.flush()
    assert "00000001.seg" not in segments(tmp_path)
    assert store._live[(Q2, 1)] != 1
    store.close()
    assert recovered(tmp_path, 2000) == {Q2: [record(1, b"long-lived")]}


def test_appends_while_a_sealed_batch_is_written_land_in_the_segment_that_counts_them(tmp_path):
    """flush() in three steps, as the server runs it with the fsync on its writer
    thread: appends made between seal() and synced() go to the next batch; when that
    synced() rotates, they are written to the segment they were counted live in
    (written first, then the rotation), so acking them later frees that segment and
    recovery sees every message exactly once."""
    store = opened(tmp_path, segment_bytes=300)
    enqueue(store, Q1, 1, b"a" * 300)       # past segment_bytes once written
    batch = store.seal()
    enqueue(store, Q1, 2, b"b" * 200)       # while batch 1 is being written
    batch.write()
    assert store.synced(batch) == batch.batch_id
    assert segments(tmp_path) == ["00000001.seg", "00000002.seg"]  # rotated
    assert store._live[(Q1, 2)] == 1 and not store.has_pending  # 2 went to segment 1
    enqueue(store, Q1, 3, b"c" * 10)
    store.append_ack(Q1, 1)
    store.append_ack(Q1, 2)
    store.flush()
    for seq in range(4, 8):                 # rotate again: segment 1 is dead, deleted
        enqueue(store, Q1, seq, b"d" * 100)
        store.append_ack(Q1, seq)
        store.flush()
    assert "00000001.seg" not in segments(tmp_path)
    store.close()
    assert recovered(tmp_path, 300) == {Q1: [record(3, b"c" * 10)]}


def test_compaction_copies_the_live_message_when_a_recreated_queue_reused_its_seq(tmp_path):
    """A queue deleted and declared again numbers its messages from 1 again, so one
    segment can hold a dead and a live enqueue of the same (queue, seq); compaction
    must carry the later, live one forward (found by the model test below)."""
    store = opened(tmp_path, segment_bytes=600)
    enqueue(store, Q1, 1, b"message of the deleted queue")
    store.append_delete(Q1)
    enqueue(store, Q1, 1, b"message of the new queue")
    for seq in range(1, 12):  # short-lived traffic: segment 1 ends up 1/13 live
        enqueue(store, Q2, seq, b"v" * 30)
        store.append_ack(Q2, seq)
    store.flush()  # rotates; segment 1 is compacted and deleted
    assert segments(tmp_path) == ["00000002.seg"]
    store.close()
    assert recovered(tmp_path, 600) == {Q1: [record(1, b"message of the new queue")]}


# ---------------------------------------------------------------- model-based property

keys = st.sampled_from([Q1, Q2, queue_key("/", "q3")])
enqueues = st.tuples(st.just("enqueue"), keys, st.binary(max_size=24))
acks = st.tuples(st.just("ack"), keys, st.integers(min_value=0, max_value=3))
deliveries = st.tuples(st.just("deliver"), keys, st.integers(min_value=0, max_value=3))
flushes = st.tuples(st.just("flush"))
# weighted towards enqueue, ack (mostly of the oldest) and flush, so that segments
# fill, rotate, die and get compacted within one example
operations = st.lists(st.one_of(
    enqueues, enqueues, enqueues, acks, acks, acks, deliveries, flushes, flushes,
    st.tuples(st.just("purge"), keys, st.integers(min_value=0, max_value=30)),
    st.tuples(st.just("delete"), keys),
    st.tuples(st.just("crash")),
), min_size=40, max_size=150)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow])
@given(ops=operations, segment_bytes=st.sampled_from([150, 500, 900]))
def test_recovery_yields_exactly_the_flushed_live_set(tmp_path_factory, ops, segment_bytes):
    """Random enqueue/deliver/ack/purge/delete/flush sequences with small segments (so rotation,
    deletion and compaction all happen), interrupted by crashes that lose the pending
    batch: recovering into a fresh MessageStore always yields exactly the messages a
    model says are live after the last flush (with the delivered flag of each), and
    the recovered store keeps going."""
    directory = tmp_path_factory.mktemp("store")
    store = MessageStore(str(directory), segment_bytes=segment_bytes, fsync=False)
    store.recover()
    durable: dict[bytes, dict[int, tuple[bytes, bool]]] = {}  # seq -> (body, delivered)
    pending: dict[bytes, dict[int, tuple[bytes, bool]]] = {}
    next_seq: dict[bytes, int] = {}

    def model_after_flush():
        return {key: dict(messages) for key, messages in pending.items()}

    for op in ops:
        kind = op[0]
        if kind == "enqueue":
            _, key, body = op
            seq = next_seq.get(key, 1)
            next_seq[key] = seq + 1
            enqueue(store, key, seq, body)
            pending.setdefault(key, {})[seq] = (body, False)
        elif kind == "deliver":
            _, key, pick = op
            live = sorted(pending.get(key, {}))
            if live:
                seq = live[pick % len(live)]
                store.append_delivered(key, seq)
                pending[key][seq] = (pending[key][seq][0], True)
        elif kind == "ack":
            _, key, pick = op
            live = sorted(pending.get(key, {}))
            if live:  # the broker only acks messages it holds
                seq = live[pick % len(live)]
                store.append_ack(key, seq)
                del pending[key][seq]
        elif kind == "purge":
            _, key, up_to = op
            store.append_purge(key, up_to)
            for seq in [s for s in pending.get(key, {}) if s <= up_to]:
                del pending[key][seq]
        elif kind == "delete":
            _, key = op
            store.append_delete(key)
            pending.pop(key, None)
            next_seq.pop(key, None)  # a queue declared again starts at seq 1
        elif kind == "flush":
            store.flush()
            durable = model_after_flush()
        elif kind == "crash":
            crash(store)
            expected = {key: [record(seq, *messages[seq]) for seq in sorted(messages)]
                        for key, messages in durable.items() if messages}
            assert recovered(directory, segment_bytes) == expected
            store = MessageStore(str(directory), segment_bytes=segment_bytes, fsync=False)
            store.recover()
            pending = {key: dict(messages) for key, messages in durable.items()}
            next_seq = {key: max(messages, default=0) + 1 for key, messages in durable.items()}
    store.close()  # flushes what is pending
    expected = {key: [record(seq, *messages[seq]) for seq in sorted(messages)]
                for key, messages in pending.items() if messages}
    assert recovered(directory, segment_bytes) == expected



# ---------------------------------------------------------------- a full disk


@pytest.fixture
def small_disk(tmp_path):
    from tests.support.small_fs import small_disk as mounted

    with mounted(str(tmp_path / "disk"), 1024 * 1024) as disk:
        yield disk


def test_a_batch_the_disk_has_no_room_for_is_cut_back_and_written_whole_later(small_disk):
    """On a full disk flush() raises ENOSPC with the segment as it was and the records
    pending; with room again they are written, and recovered, once."""
    directory = os.path.join(small_disk.path, "msgstore")
    store = opened(directory)
    enqueue(store, Q1, 1)
    store.flush()
    size = os.path.getsize(os.path.join(directory, "00000001.seg"))
    for seq in range(2, 200):
        enqueue(store, Q1, seq, b"x" * 1000)
    small_disk.fill()
    with pytest.raises(OSError) as raised:
        store.flush()
    assert raised.value.errno == 28
    assert os.path.getsize(os.path.join(directory, "00000001.seg")) == size
    assert store.has_pending
    small_disk.free()
    store.flush()
    store.close()
    assert recovered(directory) == {Q1: [record(1)] + [record(seq, b"x" * 1000)
                                                      for seq in range(2, 200)]}


def test_a_sealed_batch_that_found_the_disk_full_is_rewound_and_written_again(small_disk):
    """The server's steps: write_data() fails part way, rewind() cuts the segment back
    (a short write left part of the batch there), the same batch is written again."""
    directory = os.path.join(small_disk.path, "msgstore")
    store = opened(directory)
    for seq in range(1, 300):
        enqueue(store, Q1, seq, b"y" * 1000)
    batch = store.seal()
    small_disk.fill()
    with pytest.raises(OSError):
        batch.write()
    batch.rewind()
    small_disk.free()
    batch.write()
    store.synced(batch)
    store.close()
    assert recovered(directory) == {Q1: [record(seq, b"y" * 1000) for seq in range(1, 300)]}


def test_a_rotation_the_disk_has_no_room_for_waits_for_the_next_batch(small_disk):
    """The batch fits in the segment's last page but the next segment does not: the
    rotation is postponed, nothing is lost, and a later batch rotates."""
    directory = os.path.join(small_disk.path, "msgstore")
    store = opened(directory, segment_bytes=300)
    enqueue(store, Q1, 1, b"a" * 200)
    store.flush()
    assert segments(directory) == ["00000001.seg"]
    small_disk.fill()
    enqueue(store, Q1, 2, b"b" * 100)       # into the page the segment already has
    store.flush()
    assert segments(directory) == ["00000001.seg"]
    small_disk.free()
    enqueue(store, Q1, 3, b"c" * 10)
    store.flush()
    assert segments(directory) == ["00000001.seg", "00000002.seg"]
    store.close()
    assert recovered(directory, 300) == {Q1: [record(1, b"a" * 200), record(2, b"b" * 100),
                                              record(3, b"c" * 10)]}


def test_a_batch_with_nothing_to_fsync_that_found_the_disk_full_is_written_whole_later(
        small_disk, tmp_path):
    """A group-commit step whose only writes need no fdatasync (DELIVERED records)
    writes them on the event loop (node/group_commit.py Sync.write). If the disk is
    full there, the step is not over: it goes to the writer like any other, which
    cuts the segment back and fails until there is room (the server stalls and runs
    it again), and then writes it whole. It used to end at once, as if written: the
    half-written record stayed in the segment, the next batch went after it, and
    recovery refused the store as corrupt."""
    from quorumqueue.broker.groups import driver
    from quorumqueue.broker.node import group_commit
    from quorumqueue.broker.raft.storage import LogStore, StorageConfig

    directory = os.path.join(small_disk.path, "msgstore")
    store = MessageStore(directory, segment_bytes=1 << 20, fsync=True)
    store.recover()
    for seq in range(1, 301):
        enqueue(store, Q1, seq, b"z" * 1000)
    store.flush()
    for seq in range(1, 301):
        store.append_delivered(Q1, seq)
    log_store = LogStore(str(tmp_path / "log"), StorageConfig(fsync=False))
    sync = group_commit.Sync(None, None, None, None, None, store.seal(),
                             driver.Round([], log_store.seal()))
    assert not sync.writes        # nothing to fsync: written on the loop
    small_disk.fill()
    sync.write()
    if sync.writes:               # the server's steps: the writer's, stalled while full
        with pytest.raises(OSError) as raised:
            sync.run()
        assert raised.value.errno == 28
        small_disk.free()
        sync.run()
    else:                         # over at once
        small_disk.free()
    store.synced(sync.messages)
    log_store.synced(sync.round.log)
    enqueue(store, Q1, 301)
    store.close()
    log_store.close()
    assert recovered(directory) == {Q1: [record(seq, b"z" * 1000, delivered=True)
                                         for seq in range(1, 301)] + [record(301)]}
