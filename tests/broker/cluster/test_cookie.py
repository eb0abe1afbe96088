"""The shared cluster cookie (server.cluster_cookie): nodes of one user started at
the same moment with no cookie file agree on one secret, and a damaged file gets an
error that says what to do (no endless "the cookie does not match")."""

from __future__ import annotations

import multiprocessing
import os

import pytest

from quorumqueue.broker.config import ConfigError, Settings
from quorumqueue.broker.server.server import cluster_cookie


def _read_cookie(home: str, start, results) -> None:
    os.environ["HOME"] = home
    start.wait()
    results.put(cluster_cookie(Settings()))


def test_nodes_started_at_once_agree_on_one_cookie(tmp_path):
    context = multiprocessing.get_context("fork")
    start, results = context.Event(), context.Queue()
    processes = [context.Process(target=_read_cookie, args=(str(tmp_path), start, results))
                 for _ in range(8)]
    for process in processes:
        process.start()
    start.set()
    cookies = [results.get(timeout=60) for _ in processes]
    for process in processes:
        process.join(60)
    assert len(set(cookies)) == 1 and cookies[0]
    assert (tmp_path / ".quorumqueue.cookie").read_text().strip() == cookies[0]
    assert os.listdir(tmp_path) == [".quorumqueue.cookie"]  # no secrets left behind
    assert (tmp_path / ".quorumqueue.cookie").stat().st_mode & 0o777 == 0o600


def test_an_empty_cookie_file_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".quorumqueue.cookie").write_text("\n")
    with pytest.raises(ConfigError, match="is empty: delete it"):
        cluster_cookie(Settings())


def test_a_configured_cookie_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cluster_cookie(Settings(cluster_cookie="SECRET")) == "SECRET"
    assert not (tmp_path / ".quorumqueue.cookie").exists()
