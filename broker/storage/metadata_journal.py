"""The queue journal beside metadata.json: queue records changed since the file was saved.

Why: a queue record must be durable before its declare-ok (a restart drops the
messages and Raft groups of queues metadata.json does not name, before the metadata
log is replayed), but rewriting the whole file for each declare cost time in
proportion to the queues there were (10 ms of JSON at 500 queues). A declare or a
delete appends one line here instead, fdatasynced in the same group commit; the file
is rewritten, and the journal started again, only once the journal outgrew it
(`MetadataStore.journal_full`), so a change costs the same at any number of queues.

Format: `metadata.journal`, lines of ASCII `CCCCCCCC JSON\\n`, where CCCCCCCC is the
CRC-32 (zlib.crc32, 8 lowercase hex digits) of the JSON's UTF-8 bytes and JSON an
object {"g": generation, "put": queue record} (a record as in metadata.json's
"queues") or {"g": generation, "drop": [vhost, name]}. `generation` is the
"generation" of the metadata.json the line applies to (absent in the file: 0).

Reading: lines in order, stopping at the first that is cut short, has no newline or
fails its CRC (the tail of an append a crash interrupted: never acknowledged); lines
of another generation are skipped (written before the file was rewritten: the file
already holds them, and a newer state). A put replaces the record of the same vhost
and name (or adds it at the end), a drop removes it; bindings to a dropped queue go
with it.

Invariants: a save of the file takes the next generation, and the journal is emptied
only after the new file is durable; a failed append (a full disk) cuts the journal
back to where it began, so a retried append never follows a torn line.

Not here: when the node journals and when it rewrites the file (node/group_commit.py).
"""

from __future__ import annotations

import json
import os
import zlib

JOURNAL_FILE = "metadata.journal"


def encode_line(generation: int, put: dict | None = None,
                drop: tuple[str, str] | None = None) -> bytes:
    body = {"g": generation}
    if put is not None:
        body["put"] = put
    else:
        body["drop"] = list(drop)
    data = json.dumps(body, separators=(",", ":"), sort_keys=True).encode("utf-8")
    return b"%08x %s\n" % (zlib.crc32(data), data)


def read_lines(path: str) -> tuple[list[dict], int]:
    """(the journal's valid lines in order, the bytes they take: where the next append
    goes); ([], 0) if there is no journal."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return [], 0
    lines, position = [], 0
    while position < len(data):
        end = data.find(b"\n", position)
        if end < 0 or end - position < 10 or data[position + 8:position + 9] != b" ":
            break
        body = data[position + 9:end]
        try:
            if int(data[position:position + 8], 16) != zlib.crc32(body):
                break
            lines.append(json.loads(body))
        except ValueError:
            break
        position = end + 1
    return lines, position


def apply_lines(document: dict, lines: list[dict]) -> dict:
    """`document` (metadata.json's contents) with the journal's lines of its
    generation applied."""
    generation = document.get("generation", 0)
    queues = {(q["vhost"], q["name"]): q for q in document["queues"]}
    changed = False
    for line in lines:
        if line.get("g") != generation:
            continue
        changed = True
        if "put" in line:
            record = line["put"]
            queues[(record["vhost"], record["name"])] = record
        else:
            queues.pop(tuple(line["drop"]), None)
    if not changed:
        return document
    bindings = [b for b in document["bindings"] if b["destination_kind"] != "queue"
                or (b["vhost"], b["destination"]) in queues]
    return {**document, "queues": list(queues.values()), "bindings": bindings}


def append(path: str, lines: list[bytes], size: int) -> int:
    """`lines` appended at `size` (the journal's valid length) and fdatasynced;
    returns the new size. On an error (a full disk) the journal is cut back to
    `size` and the error raised."""
    handle = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        data = b"".join(lines)
        try:
            os.lseek(handle, size, os.SEEK_SET)
            written = 0
            while written < len(data):
                written += os.write(handle, data[written:])
            os.fdatasync(handle)
        except OSError:
            os.ftruncate(handle, size)  # needs no space
            raise
        return size + len(data)
    finally:
        os.close(handle)


def empty(directory: str) -> None:
    """The journal emptied, durably (after a save of the file made it redundant)."""
    path = os.path.join(directory, JOURNAL_FILE)
    try:
        handle = os.open(path, os.O_WRONLY)
    except FileNotFoundError:
        return
    try:
        os.ftruncate(handle, 0)
        os.fdatasync(handle)
    finally:
        os.close(handle)
