"""The queue journal beside metadata.json (broker/storage/metadata_journal.py): what a
load makes of the file and its lines, a torn append, a stale generation, a full disk."""

from __future__ import annotations

import errno
import os

import pytest

from quorumqueue.broker.storage import metadata_journal
from quorumqueue.broker.storage.metadata_store import (JOURNAL_MIN_BYTES, MetadataStore,
                                                       load_document)


def record(name: str, vhost: str = "/", **extra) -> dict:
    return {"vhost": vhost, "name": name, "type": "quorum", "durable": True,
            "auto_delete": False, "arguments": {"x-queue-type": "quorum"},
            "group": f"{vhost}/{name}", "members": ["n1"], **extra}


def document(*queues: dict, bindings=()) -> dict:
    return {"vhosts": ["/"], "users": [], "policies": [], "exchanges": [],
            "queues": list(queues), "bindings": list(bindings)}


def binding(queue: str) -> dict:
    return {"vhost": "/", "source": "x", "destination_kind": "queue",
            "destination": queue, "routing_key": "k", "arguments": {}}


def journal(store: MetadataStore, *changes) -> None:
    store.append(store.encode_changes(list(changes)))


def test_lines_apply_on_top_of_the_file_in_order(tmp_path):
    store = MetadataStore(str(tmp_path))
    store.save(document(record("a"), record("b"), bindings=[binding("a"), binding("b")]))
    journal(store, (("/", "c"), record("c")), (("/", "a"), None))
    journal(store, (("/", "b"), record("b", members=["n1", "n2"])))
    loaded = MetadataStore(str(tmp_path)).load()
    assert [(q["name"], q["members"]) for q in loaded["queues"]] == [
        ("b", ["n1", "n2"]), ("c", ["n1"])]
    assert [b["destination"] for b in loaded["bindings"]] == ["b"]  # a's went with it
    assert load_document(str(tmp_path)) == loaded  # the analytics jobs' read


def test_a_torn_last_append_is_cut_off_and_the_next_append_follows_the_good_lines(tmp_path):
    """A crash in the middle of an append leaves a line without its newline, or bytes
    that fail the CRC: never acknowledged, so dropped, and cut off the file."""
    store = MetadataStore(str(tmp_path))
    store.save(document(record("a")))
    journal(store, (("/", "b"), record("b")))
    good = os.path.getsize(store.journal_path)
    for torn in (b"0badc0de {\"g\":1,\"put\"", b"00000000 {}\n", b"\0" * 64):
        with open(store.journal_path, "ab") as handle:
            handle.write(torn)
        reloaded = MetadataStore(str(tmp_path))
        assert [q["name"] for q in reloaded.load()["queues"]] == ["a", "b"]
        assert os.path.getsize(store.journal_path) == good
    journal(reloaded, (("/", "c"), record("c")))
    assert [q["name"] for q in MetadataStore(str(tmp_path)).load()["queues"]] == [
        "a", "b", "c"]


def test_lines_of_an_older_generation_are_skipped(tmp_path):
    """A save of the file starts a generation and empties the journal afterwards; a
    crash between the two leaves lines the new file already holds, in an older state
    (here: b's old members), which must not be applied over it."""
    store = MetadataStore(str(tmp_path))
    store.save(document(record("a")))
    stale = store.encode_changes([(("/", "b"), record("b"))])
    store.save(document(record("a"), record("b", members=["n1", "n2"])))
    with open(store.journal_path, "wb") as handle:  # the emptying did not happen
        handle.write(b"".join(stale))
    loaded = MetadataStore(str(tmp_path)).load()
    assert [(q["name"], q["members"]) for q in loaded["queues"]] == [
        ("a", ["n1"]), ("b", ["n1", "n2"])]


def test_a_full_disk_leaves_the_journal_as_it_was(tmp_path, monkeypatch):
    store = MetadataStore(str(tmp_path))
    store.save(document(record("a")))
    journal(store, (("/", "b"), record("b")))
    before = os.path.getsize(store.journal_path)
    real_write = os.write

    def half_then_full(handle, data):
        real_write(handle, bytes(data[:len(data) // 2]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(OSError):
        journal(store, (("/", "c"), record("c")))
    monkeypatch.setattr(os, "write", real_write)
    assert os.path.getsize(store.journal_path) == before
    journal(store, (("/", "c"), record("c")))  # the retry
    assert [q["name"] for q in MetadataStore(str(tmp_path)).load()["queues"]] == [
        "a", "b", "c"]


def test_the_journal_may_grow_to_the_files_size_then_the_file_is_saved_whole(tmp_path):
    store = MetadataStore(str(tmp_path))
    assert not store.can_journal  # no file yet: nothing for lines to apply to
    store.save(document(*(record(f"q{n}") for n in range(10))))
    assert store.can_journal
    number = 0
    while store.can_journal:
        journal(store, (("/", f"n{number}"), record(f"n{number}")))
        number += 1
    assert store.journal_bytes > max(JOURNAL_MIN_BYTES, store.file_bytes)
    store.save(MetadataStore(str(tmp_path)).load())
    assert store.journal_bytes == 0 and os.path.getsize(store.journal_path) == 0
    assert len(MetadataStore(str(tmp_path)).load()["queues"]) == 10 + number
    assert metadata_journal.read_lines(store.journal_path) == ([], 0)
