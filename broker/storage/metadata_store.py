"""Durable metadata of one node: vhosts, users, durable exchanges, queues, bindings.

Format (version 1): `metadata.json`, a JSON object
  {"version": 1, "vhosts": [...], "users": [{name, password_hash, tags, vhosts,
   limits?, hashing_algorithm? (absent: rabbit_password_hashing_sha256)}],
   "vhost_limits": {vhost: {max-connections?, max-queues?}} (optional),
   "policies", "operator_policies" (optional: none): [{vhost, name, pattern,
   definition, priority, apply_to}],
   "parameters" (optional: none): [{vhost, component, name, value}] (runtime
   parameters: dynamic shovels, broker/shovel/),
   "exchanges": [{vhost, name, type, auto_delete, internal, arguments}],
   "queues": [{vhost, name, type, durable, auto_delete, arguments, group,
               members (quorum) | host, exclusive_owner (classic)}],
   "bindings": [{vhost, source, destination_kind, destination, routing_key, arguments}]}
Every queue recorded in the cluster's metadata is listed, non-durable ones too (a
record without `durable` is durable; a classic record without `host` is this
node's, as written before classic queues were in the metadata).
AMQP field values that JSON cannot hold (bytes, Decimal, datetime) are tagged
objects: {"$bytes": base64} (a long string that is not UTF-8), {"$bytearray":
base64} (field type 'x'), {"$decimal": "1.5"}, {"$timestamp": epoch seconds} (an
integer; files written before 2026-12 hold a float, read as its integer part),
{"$table": {...}} (a nested table); a declare's integer or float argument that keeps
its wire type (field_values.py) is {"$<RabbitMQ's type name>": value}, e.g. {"$byte":
10}, {"$unsignedint": 7}, {"$float": 1.5}.

Beside it, `metadata_group_applied` ({"index": i}) records that the file holds every
entry of the metadata group's log up to i: a restart whose file is older than the
group's snapshot restores the snapshot instead (groups/metadata.py).

`"generation"` (absent: 0) counts the file's saves; the queue journal beside it
(`metadata.journal`, storage/metadata_journal.py) holds the queue records changed since
the save of that generation, and `load` returns the file with them applied.

Writes go to a temporary file, are fsynced, then renamed over the old file (and the
directory fsynced), so a crash leaves either the old or the new file, never a mix.
The node rewrites the whole file when users, vhosts, policies, limits or parameters
change and at each metadata snapshot; a queue declared, deleted or changed is a line
of the journal instead, and the file is rewritten once the journal outgrew it
(`journal_full`). Exchanges and bindings are in the file only as of its last save:
the metadata log, applied on top at a restart, holds the rest (groups/metadata.py).
All of it in the node's group commit, off the event loop (node/group_commit.py).
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import os

from ..field_values import BY_NAME, KEPT, Timestamp, plain
from . import metadata_journal

VERSION = 1
FILE_NAME = "metadata.json"
APPLIED_FILE = "metadata_group_applied"
# the journal may grow to the file's size, at least this, before the file is rewritten:
# a rewrite costs the file's size, so per change the cost stays what one line costs
JOURNAL_MIN_BYTES = 256 * 1024


def replace_file(directory: str, name: str, data: bytes) -> None:
    """`directory/name` holds `data`, durably: a temporary file, fsynced, renamed over
    the old one, the directory fsynced. On an error (a full disk) the old file stays."""
    path = os.path.join(directory, name)
    temporary = path + ".tmp"
    try:
        with open(temporary, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError:
        if os.path.exists(temporary):
            os.remove(temporary)  # the space comes back
        raise
    os.replace(temporary, path)
    handle = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def _to_json(value):
    if isinstance(value, bytearray):
        return {"$bytearray": base64.b64encode(value).decode("ascii")}
    if isinstance(value, bytes):
        return {"$bytes": base64.b64encode(value).decode("ascii")}
    if isinstance(value, decimal.Decimal):
        return {"$decimal": str(value)}
    if isinstance(value, Timestamp):
        return {"$timestamp": int(value)}
    if isinstance(value, KEPT):
        return {f"${value.name}": plain(value)}
    if isinstance(value, datetime.datetime):
        return {"$timestamp": int(value.timestamp())}
    if isinstance(value, dict):
        return {"$table": {k: _to_json(v) for k, v in value.items()}}
    if isinstance(value, (list, tuple)):
        return [_to_json(v) for v in value]
    return value


def _from_json(value):
    if isinstance(value, dict):
        if "$bytes" in value:
            return base64.b64decode(value["$bytes"])
        if "$bytearray" in value:
            return bytearray(base64.b64decode(value["$bytearray"]))
        if "$decimal" in value:
            return decimal.Decimal(value["$decimal"])
        if "$timestamp" in value:
            return Timestamp(int(value["$timestamp"]))
        if "$table" in value:
            return {k: _from_json(v) for k, v in value["$table"].items()}
        if len(value) == 1:
            (tag, kept), = value.items()
            typed = BY_NAME.get(tag[1:]) if tag.startswith("$") else None
            if typed is not None:
                return typed(kept)
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    return value


def encode_arguments(arguments: dict) -> dict:
    return {k: _to_json(v) for k, v in arguments.items()}


def decode_arguments(arguments: dict) -> dict:
    return {k: _from_json(v) for k, v in arguments.items()}


def load_document(directory: str) -> dict | None:
    """metadata.json in `directory` with its journal applied (None: no file); reads
    only (the analytics jobs read a live node's directory with it)."""
    document = _read_file(os.path.join(directory, FILE_NAME))
    if document is None:
        return None
    lines, _size = metadata_journal.read_lines(
        os.path.join(directory, metadata_journal.JOURNAL_FILE))
    return metadata_journal.apply_lines(document, lines)


def _read_file(path: str) -> dict | None:
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as handle:
        try:
            document = json.load(handle)
        except json.JSONDecodeError as error:
            raise RuntimeError(f"{path}: not valid JSON ({error}); restore it "
                               "from a backup or move it aside") from None
    if document.get("version") != VERSION:
        raise RuntimeError(f"{path}: unknown metadata format version "
                           f"{document.get('version')!r}")
    return document


class MetadataStore:
    def __init__(self, directory: str) -> None:
        self.directory = directory
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(directory, FILE_NAME)
        self.journal_path = os.path.join(directory, metadata_journal.JOURNAL_FILE)
        self.generation = 0      # of the file as last loaded or saved
        self.file_bytes = 0      # its size (0: no file yet: changes are saved whole)
        self.journal_bytes = 0   # the journal's valid length: where the next line goes

    def load(self) -> dict | None:
        """The file with the journal's lines of its generation applied; a torn last
        append (a crash) is cut off the journal."""
        document = _read_file(self.path)
        if document is None:
            return None
        self.generation = document.get("generation", 0)
        self.file_bytes = os.path.getsize(self.path)
        lines, size = metadata_journal.read_lines(self.journal_path)
        if os.path.exists(self.journal_path) and os.path.getsize(self.journal_path) > size:
            os.truncate(self.journal_path, size)  # never acknowledged
        self.journal_bytes = size
        return metadata_journal.apply_lines(document, lines)

    def save(self, document: dict) -> None:
        """The whole file, as the next generation; then the journal is emptied (its
        lines are in the file, and of an older generation)."""
        generation = self.generation + 1
        data = json.dumps({**document, "version": VERSION, "generation": generation},
                          indent=1, sort_keys=True).encode("utf-8")
        replace_file(self.directory, FILE_NAME, data)
        self.generation, self.file_bytes = generation, len(data)
        if self.journal_bytes:
            metadata_journal.empty(self.directory)
            self.journal_bytes = 0

    @property
    def can_journal(self) -> bool:
        """Whether a queue change may be a journal line: there is a file it applies
        to, and the journal has not outgrown it (else the file is saved whole)."""
        return 0 < self.file_bytes and \
            self.journal_bytes <= max(JOURNAL_MIN_BYTES, self.file_bytes)

    def encode_changes(self, changes: list[tuple[tuple[str, str], dict | None]]) -> list[bytes]:
        """Journal lines of ((vhost, name), its record as the file holds it, or None:
        deleted) changes."""
        generation = self.generation
        return [metadata_journal.encode_line(generation, put=record)
                if record is not None else metadata_journal.encode_line(generation, drop=key)
                for key, record in changes]

    def append(self, lines: list[bytes]) -> None:
        """Journal lines (`encode_changes`) appended and fdatasynced; on a full disk
        the journal is as before and the error raised."""
        created = self.journal_bytes == 0 and not os.path.exists(self.journal_path)
        self.journal_bytes = metadata_journal.append(self.journal_path, lines,
                                                     self.journal_bytes)
        if created:  # the new file's name, durable
            handle = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(handle)
            finally:
                os.close(handle)

    def applied_index(self) -> int:
        """The metadata group's last entry the file is known to hold (0: none)."""
        try:
            with open(os.path.join(self.directory, APPLIED_FILE)) as handle:
                return int(json.load(handle)["index"])
        except FileNotFoundError:
            return 0

    def save_applied(self, index: int) -> None:
        """Record that the file (saved before this) holds the group's entries up to
        `index`."""
        replace_file(self.directory, APPLIED_FILE, json.dumps({"index": index}).encode())
