"""Persistent messages of durable classic queues: an append-only, segmented log.

Format (version 4), files `msgstore/NNNNNNNN.seg`:
  file header: b"QQMS" + u16 version
  record:      u32 crc32(type..payload) | u32 payload length | u8 type | payload
  ENQUEUE   1:  u16 qlen, queue key, u64 seq, u8 elen, exchange, u8 rlen, routing key,
                u32 hlen, content header payload, body (rest)
  ACK       2:  u16 qlen, queue key, u64 seq
  PURGE     3:  u16 qlen, queue key, u64 seq (everything at or below it is gone)
  DELETE    4:  u16 qlen, queue key
  DELIVERED 5:  u16 qlen, queue key, u64 seq (handed to a consumer that must ack it;
                version 2 and later)
  ENQUEUE_EXPIRING 6: u16 qlen, queue key, u64 seq, u64 expiry (wall-clock ms: the
                message expires once the clock reaches it), then as ENQUEUE from
                u8 elen on (a message with a TTL; version 3 and later)
  ENQUEUE_BCC 7: u16 qlen, queue key, u64 seq, u64 expiry (0: none), u32 n,
                n x (u32 length + UTF-8): the message's BCC keys, then as ENQUEUE
                from u8 elen on (a message published with BCC keys, which its
                dead-lettered copy is routed by: queues/dead_letter.py; version 4 only)
The queue key is `vhost \\x00 name`. A mirror of a mirrored classic queue writes
its copy with the same records under the same key. (A node holds a queue either as
its leader or as a mirror, never both.) So a promoted mirror's records are the
queue's. Version 1 is version 2 without DELIVERED. Version 2 is version 3 without
ENQUEUE_EXPIRING. Version 3 is version 4 without ENQUEUE_BCC. Their segments are
still read. Recovery starts a new version-4 segment rather than appending to an
older one. So a file's header always tells
which records it holds.

A message's expiry is absolute: publish time + the lower of its queue's message
TTL and its `expiration`. RabbitMQ's classic queues compute it so, on publish. So
it keeps counting while the broker is down. A message whose expiry passed during a
restart expires as soon as the queue is back.

How it works: records are appended to an in-memory batch (`append_*`, pure). The
server shell seals it (`seal()`) and writes it to the active segment
(`SealedBatch.write_data()`). It fdatasyncs once for all of them on its writer
thread (`SealedBatch.sync()`: group commit). Then it reports it (`synced()`), so
publisher confirms waiting on its batch id can be sent. Appends go on into the next
batch meanwhile. `flush()` is all of it in one. Segments rotate at
`segment_bytes`.

DELIVERED is how a recovered message knows it was delivered before the restart. It
then comes back with redelivered=true, as RabbitMQ's classic queues do. (They
record deliveries of persistent messages in their queue index.) The node writes one
for a stored message the first time it goes out to a consumer or basic.get that
must ack it. A batch holding only DELIVERED records is written but not
fdatasynced. It survives the broker process dying: the data is in the OS page
cache. Against a machine crash, it rides with the next fsync. A lost one only means
a redelivery is not flagged, never a lost or duplicated message.

A full disk (ENOSPC, EDQUOT: `is_disk_full`) loses nothing. A batch that finds no
room is cut back to where it began, and written again whole. (`SealedBatch.rewind`;
or `flush()` keeps its records pending.) A rotation or compaction that finds no
room waits for the next batch, the segments as they were.

Invariants:
- A record is acknowledged to publishers only after the fsync that covers it.
- A message's DELIVERED record follows its ENQUEUE record in log order. Compaction
  copies a delivered message forward with a DELIVERED record after the copy.
- Segments are deleted oldest-first, and only while they hold no live message. So
  an ACK record always outlives the ENQUEUE it cancels.
- When the oldest segment is mostly dead, its live messages are copied forward
  (compaction). So one old message does not pin the whole log.
- Recovery tolerates a torn record only at the tail of the newest segment. Any
  other bad record stops the node with an error naming the file and offset.
"""

from __future__ import annotations

import errno
import os
import struct
from dataclasses import dataclass

from zlib_ng.zlib_ng import crc32   # zlib's CRC-32, faster (pyproject.toml)

FILE_MAGIC = b"QQMS"
VERSION = 4
READABLE_VERSIONS = (1, 2, 3, 4)
_file_header = struct.Struct(">4sH")
_record_header = struct.Struct(">IIB")
_u8 = struct.Struct(">B")
_u16 = struct.Struct(">H")
_u32 = struct.Struct(">I")
_u64 = struct.Struct(">Q")

ENQUEUE, ACK, PURGE, DELETE, DELIVERED, ENQUEUE_EXPIRING, ENQUEUE_BCC = 1, 2, 3, 4, 5, 6, 7
_ENQUEUES = (ENQUEUE, ENQUEUE_EXPIRING, ENQUEUE_BCC)


class CorruptStoreError(RuntimeError):
    pass


def queue_key(vhost: str, name: str) -> bytes:
    return vhost.encode("utf-8", "surrogateescape") + b"\x00" + name.encode("utf-8", "surrogateescape")


@dataclass(slots=True)
class RecoveredMessage:
    seq: int
    exchange: str
    routing_key: str
    header: bytes
    body: bytes
    delivered: bool = False  # delivered before the restart and not acked since
    expires: int = 0         # wall-clock ms it expires at (0: no TTL)
    blind_keys: tuple = ()   # its BCC keys (ENQUEUE_BCC)


def _encode_key(key: bytes) -> bytes:
    return _u16.pack(len(key)) + key


def _encode_keys(keys: tuple) -> bytes:
    parts = [_u32.pack(len(keys))]
    for routing_key in keys:
        encoded = routing_key.encode("utf-8", "surrogateescape")
        parts += (_u32.pack(len(encoded)), encoded)
    return b"".join(parts)


def _read_keys(payload: bytes, offset: int) -> tuple[tuple, int]:
    (count,) = _u32.unpack_from(payload, offset)
    offset += 4
    keys = []
    for _ in range(count):
        (length,) = _u32.unpack_from(payload, offset)
        keys.append(payload[offset + 4:offset + 4 + length].decode("utf-8", "surrogateescape"))
        offset += 4 + length
    return tuple(keys), offset


def _record(record_type: int, payload: bytes) -> bytes:
    crc = crc32(payload, crc32(_u8.pack(record_type)))
    return _record_header.pack(crc, len(payload), record_type) + payload


DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def is_disk_full(error: BaseException) -> bool:
    """No room on the file system (or in the quota). The failed write is undone,
    and may be tried again once space returns."""
    return isinstance(error, OSError) and error.errno in DISK_FULL_ERRNOS


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


@dataclass(slots=True)
class SealedBatch:
    """Records taken by `MessageStore.seal()`. `write_data()` appends them to the
    segment file. `sync()` fdatasyncs it, on any thread: nothing else writes the file
    until `MessageStore.synced`. A batch that failed for want of space is written
    again whole. `rewind()` cuts the file back to `start`, where the batch began. (A
    failed fdatasync may have dropped the pages it could not write.)"""
    batch_id: int
    data: bytes
    file: object
    fsync: bool      # fdatasync it: storage.fsync is on and a record is not DELIVERED
    start: int = 0   # the segment's size before the batch

    def write(self) -> None:
        self.write_data()
        self.sync()

    def write_data(self) -> None:
        """Into the file (the page cache): quick, done on the event loop."""
        if self.data:
            _write_all(self.file.fileno(), self.data)

    def sync(self) -> None:
        """The fdatasync: slow, done on the writer thread."""
        if self.data and self.fsync:
            os.fdatasync(self.file.fileno())

    def rewind(self) -> None:
        """Undo a failed attempt (needs no free space). The segment ends where it did
        before the batch. The file appends, so the next write goes there."""
        if self.data:
            os.ftruncate(self.file.fileno(), self.start)


class MessageStore:
    def __init__(self, directory: str, segment_bytes: int = 64 * 1024 * 1024,
                 fsync: bool = True) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        os.makedirs(directory, exist_ok=True)
        self._batch: list[bytes] = []
        self.batch_id = 1          # id of the batch being filled
        self.synced_batch_id = 0   # every batch <= this is on disk
        self._segments: list[int] = []   # segment numbers, oldest first
        self._live: dict[tuple[bytes, int], int] = {}   # (queue, seq) -> segment
        self._live_per_segment: dict[int, int] = {}
        self._written_per_segment: dict[int, int] = {}  # ENQUEUE records ever written
        self._delivered: set[tuple[bytes, int]] = set()  # live messages with a DELIVERED
        self._needs_sync = False   # the batch holds a record other than DELIVERED
        self._versions: dict[int, int] = {}  # segment -> format version, read at recovery
        self._file = None
        self._file_size = 0

    # ------------------------------------------------------------ recovery

    def recover(self) -> dict[bytes, list[RecoveredMessage]]:
        """Replay all segments; returns live messages per queue key in seq order."""
        messages: dict[bytes, dict[int, RecoveredMessage]] = {}
        numbers = sorted(int(f[:-4]) for f in os.listdir(self.directory) if f.endswith(".seg"))
        for position, number in enumerate(numbers):
            last = position == len(numbers) - 1
            for record_type, payload in self._read_segment(number, tolerate_torn_tail=last):
                self._replay(number, record_type, payload, messages)
        self._segments = numbers
        if numbers and self._versions.get(numbers[-1], VERSION) == VERSION:
            self._open_segment(numbers[-1], append=True)
        elif numbers:  # an older format's segment stays as it is, read-only
            self._open_segment(numbers[-1] + 1, append=False)
            self._segments.append(numbers[-1] + 1)
        else:
            self._open_segment(1, append=False)
            self._segments = [1]
        return {key: [m for _, m in sorted(by_seq.items())] for key, by_seq in messages.items()}

    def _path(self, number: int) -> str:
        return os.path.join(self.directory, f"{number:08d}.seg")

    def _read_segment(self, number: int, tolerate_torn_tail: bool):
        path = self._path(number)
        with open(path, "rb") as handle:
            data = handle.read()
        if len(data) < _file_header.size:
            if tolerate_torn_tail:  # crashed while creating it: start the file afresh
                if data:
                    self._truncate(path, 0)
                return
            raise CorruptStoreError(f"{path}: truncated file header")
        magic, version = _file_header.unpack_from(data)
        if magic != FILE_MAGIC:
            raise CorruptStoreError(f"{path}: not a quorumqueue message store segment")
        if version not in READABLE_VERSIONS:
            raise CorruptStoreError(f"{path}: unknown format version {version}")
        self._versions[number] = version
        offset = _file_header.size
        while offset < len(data):
            bad = None
            if len(data) - offset < _record_header.size:
                bad = "truncated record header"
            else:
                crc, length, record_type = _record_header.unpack_from(data, offset)
                end = offset + _record_header.size + length
                if end > len(data):
                    bad = "truncated record"
                else:
                    payload = data[offset + _record_header.size:end]
                    if crc32(payload, crc32(_u8.pack(record_type))) != crc:
                        bad = "checksum mismatch"
            if bad is not None:
                if tolerate_torn_tail and self._is_tail(data, offset):
                    self._truncate(path, offset)
                    return
                raise CorruptStoreError(
                    f"{path}: corrupt record at offset {offset} ({bad}); the message "
                    "store cannot be recovered automatically. Move the file aside to "
                    "start without it (its messages are lost).")
            yield record_type, payload
            offset = end

    @staticmethod
    def _is_tail(data: bytes, offset: int) -> bool:
        """A torn write leaves one incomplete record at the end. A record that
        claims a length within the file but fails its checksum is corruption."""
        if len(data) - offset < _record_header.size:
            return True
        _crc, length, _type = _record_header.unpack_from(data, offset)
        return offset + _record_header.size + length >= len(data)

    @staticmethod
    def _truncate(path: str, offset: int) -> None:
        with open(path, "r+b") as handle:
            handle.truncate(offset)
            os.fsync(handle.fileno())

    def _replay(self, segment: int, record_type: int, payload: bytes,
                messages: dict[bytes, dict[int, RecoveredMessage]]) -> None:
        (key_length,) = _u16.unpack_from(payload)
        key = payload[2:2 + key_length]
        offset = 2 + key_length
        if record_type in _ENQUEUES:
            (seq,) = _u64.unpack_from(payload, offset)
            offset += 8
            expires = 0
            blind_keys: tuple = ()
            if record_type != ENQUEUE:
                (expires,) = _u64.unpack_from(payload, offset)
                offset += 8
            if record_type == ENQUEUE_BCC:
                blind_keys, offset = _read_keys(payload, offset)
            exchange_length = payload[offset]
            exchange = payload[offset + 1:offset + 1 + exchange_length]
            offset += 1 + exchange_length
            key_len = payload[offset]
            routing_key = payload[offset + 1:offset + 1 + key_len]
            offset += 1 + key_len
            (header_length,) = _u32.unpack_from(payload, offset)
            header = payload[offset + 4:offset + 4 + header_length]
            body = payload[offset + 4 + header_length:]
            messages.setdefault(key, {})[seq] = RecoveredMessage(
                seq, exchange.decode("utf-8", "surrogateescape"),
                routing_key.decode("utf-8", "surrogateescape"), header, body,
                expires=expires, blind_keys=blind_keys)
            self._delivered.discard((key, seq))  # a compaction copy: DELIVERED follows it
            self._mark_live(key, seq, segment)
        elif record_type == DELIVERED:
            (seq,) = _u64.unpack_from(payload, offset)
            message = messages.get(key, {}).get(seq)
            if message is not None:
                message.delivered = True
                self._delivered.add((key, seq))
        elif record_type == ACK:
            (seq,) = _u64.unpack_from(payload, offset)
            messages.get(key, {}).pop(seq, None)
            self._mark_dead(key, seq)
        elif record_type == PURGE:
            (seq,) = _u64.unpack_from(payload, offset)
            by_seq = messages.get(key, {})
            for dead in [s for s in by_seq if s <= seq]:
                del by_seq[dead]
                self._mark_dead(key, dead)
        elif record_type == DELETE:
            for dead in list(messages.pop(key, {})):
                self._mark_dead(key, dead)
        else:
            raise CorruptStoreError(f"unknown record type {record_type}")

    # ------------------------------------------------------------ appends (pure)

    def _mark_live(self, key: bytes, seq: int, segment: int) -> None:
        previous = self._live.get((key, seq))
        if previous is not None:  # a compaction copy supersedes the original
            self._live_per_segment[previous] -= 1
        self._live[(key, seq)] = segment
        self._live_per_segment[segment] = self._live_per_segment.get(segment, 0) + 1
        self._written_per_segment[segment] = self._written_per_segment.get(segment, 0) + 1

    def _mark_dead(self, key: bytes, seq: int) -> None:
        segment = self._live.pop((key, seq), None)
        if segment is not None:
            self._live_per_segment[segment] -= 1
            if self._delivered:
                self._delivered.discard((key, seq))

    def append_enqueue(self, key: bytes, seq: int, exchange: str, routing_key: str,
                       header: bytes, body: bytes, expires: int = 0,
                       blind_keys: tuple = ()) -> int:
        """A message (`expires`: the wall-clock ms it expires at, 0 for none;
        `blind_keys`: its BCC keys)."""
        exchange_bytes = exchange.encode("utf-8", "surrogateescape")
        routing_bytes = routing_key.encode("utf-8", "surrogateescape")
        payload = b"".join((_encode_key(key), _u64.pack(seq),
                            _u64.pack(expires) if expires or blind_keys else b"",
                            _encode_keys(blind_keys) if blind_keys else b"",
                            _u8.pack(len(exchange_bytes)),
                            exchange_bytes, _u8.pack(len(routing_bytes)), routing_bytes,
                            _u32.pack(len(header)), header, body))
        record_type = (ENQUEUE_BCC if blind_keys else ENQUEUE_EXPIRING if expires
                       else ENQUEUE)
        self._batch.append(_record(record_type, payload))
        self._needs_sync = True
        self._mark_live(key, seq, self._segments[-1])
        return self.batch_id

    def append_delivered(self, key: bytes, seq: int) -> None:
        """The live message (key, seq) went out to a consumer that must ack it.
        The caller writes this once per message: its first such delivery. A repeat,
        or a message that is not live, is ignored."""
        if (key, seq) in self._delivered or (key, seq) not in self._live:
            return
        self._batch.append(_record(DELIVERED, _encode_key(key) + _u64.pack(seq)))
        self._delivered.add((key, seq))

    def append_ack(self, key: bytes, seq: int) -> None:
        self._batch.append(_record(ACK, _encode_key(key) + _u64.pack(seq)))
        self._needs_sync = True
        self._mark_dead(key, seq)

    def append_purge(self, key: bytes, up_to_seq: int) -> None:
        self._batch.append(_record(PURGE, _encode_key(key) + _u64.pack(up_to_seq)))
        self._needs_sync = True
        for live_key, seq in [k for k in self._live if k[0] == key and k[1] <= up_to_seq]:
            self._mark_dead(live_key, seq)

    def append_delete(self, key: bytes) -> None:
        self._batch.append(_record(DELETE, _encode_key(key)))
        self._needs_sync = True
        for live_key, seq in [k for k in self._live if k[0] == key]:
            self._mark_dead(live_key, seq)

    @property
    def has_pending(self) -> bool:
        return bool(self._batch)

    @property
    def pending_records(self) -> int:
        return len(self._batch)

    # ------------------------------------------------------------ I/O

    def _open_segment(self, number: int, append: bool) -> None:
        """Make segment `number` the one appended to. It is unbuffered: what a write
        call returned is in the file. A new file that a full disk leaves without its
        header is removed again. The current segment stays the active one."""
        path = self._path(number)
        if not append and os.path.exists(path):
            os.truncate(path, 0)
        # O_APPEND: after a batch is cut back (`SealedBatch.rewind`) the next write
        # goes where the file now ends
        handle = open(path, "ab", buffering=0)
        try:
            if handle.tell() == 0:
                _write_all(handle.fileno(), _file_header.pack(FILE_MAGIC, VERSION))
        except OSError:
            handle.close()
            os.remove(path)
            raise
        if self._file is not None:
            self._file.close()
        self._file = handle
        self._file_size = handle.tell()

    def flush(self) -> int:
        """Write and fsync the pending batch; returns the synced batch id. A batch of
        nothing but DELIVERED records is only written. On a full disk it raises with
        nothing changed: the records wait, pending, for the next flush."""
        batch = self.seal()
        try:
            batch.write()
        except OSError as error:
            if is_disk_full(error):
                batch.rewind()
                self._batch.insert(0, batch.data)
                self._needs_sync = self._needs_sync or batch.fsync
                self.batch_id = batch.batch_id
            raise
        return self.synced(batch)

    def seal(self) -> "SealedBatch":
        """The pending batch, for `batch.write()` and then `synced(batch)` here.
        (Or `write_data()` here and `sync()` on any thread.) That is `flush()` in
        steps. Appends meanwhile go to the next batch. Until `synced`, nothing else
        writes the segment file."""
        data = b"".join(self._batch)
        self._batch.clear()
        batch = SealedBatch(self.batch_id, data, self._file, self.fsync and self._needs_sync,
                            self._file_size)
        self._needs_sync = False
        self.batch_id += 1
        return batch

    def synced(self, batch: "SealedBatch") -> int:
        """`batch.write()` returned: every batch up to its id is on disk. Returns
        its id. A full segment rotates here. Records appended since the seal were
        counted live in the active segment, so they are written to it first. On a
        full disk the rotation (or the compaction after it) waits for the next
        batch."""
        self._file_size += len(batch.data)
        self.synced_batch_id = batch.batch_id
        if self._file_size >= self.segment_bytes:
            try:
                if self._batch:
                    self._write_now(b"".join(self._batch))
                    self._batch.clear()
                    self._needs_sync = False
                self._rotate()
            except OSError as error:
                if not is_disk_full(error):
                    raise
        return self.synced_batch_id

    def _write_now(self, data: bytes) -> None:
        """Append and fdatasync `data` now. On a full disk the segment is cut back
        to where it ended, then it raises."""
        try:
            _write_all(self._file.fileno(), data)
            if self.fsync:
                os.fdatasync(self._file.fileno())
        except OSError:
            os.ftruncate(self._file.fileno(), self._file_size)
            raise
        self._file_size += len(data)

    def _rotate(self) -> None:
        number = self._segments[-1] + 1
        self._open_segment(number, append=False)
        self._segments.append(number)
        self._collect()

    def _collect(self) -> None:
        """Delete dead segments oldest-first; compact the oldest if mostly dead."""
        while len(self._segments) > 1:
            oldest = self._segments[0]
            live = self._live_per_segment.get(oldest, 0)
            if live == 0:
                os.remove(self._path(oldest))
                self._segments.pop(0)
                self._live_per_segment.pop(oldest, None)
                self._written_per_segment.pop(oldest, None)
                continue
            if live * 10 <= self._written_per_segment.get(oldest, 0):
                self._copy_forward(oldest)  # at most a tenth is still live
                continue
            break

    def _copy_forward(self, number: int) -> None:
        """Re-append the live messages of segment `number` to the active segment.
        Count them there once they are on disk. A full disk leaves them where they
        were, the segment kept."""
        live: dict[tuple[bytes, int], tuple[int, bytes]] = {}
        for record_type, payload in self._read_segment(number, tolerate_torn_tail=False):
            if record_type not in _ENQUEUES:
                continue
            (key_length,) = _u16.unpack_from(payload)
            key = payload[2:2 + key_length]
            (seq,) = _u64.unpack_from(payload, 2 + key_length)
            if self._live.get((key, seq)) == number:
                # a queue deleted and declared again reuses seqs: the last record wins
                live[(key, seq)] = (record_type, payload)
        copies = []
        for (key, seq), (record_type, payload) in live.items():
            copies.append(_record(record_type, payload))
            if (key, seq) in self._delivered:
                copies.append(_record(DELIVERED, _encode_key(key) + _u64.pack(seq)))
        self._write_now(b"".join(copies))
        for key, seq in live:
            self._mark_live(key, seq, self._segments[-1])

    def segment_count(self) -> int:
        return len(self._segments)

    def close(self) -> None:
        if self._batch:
            self.flush()
        if self._file is not None:
            self._file.close()
            self._file = None
