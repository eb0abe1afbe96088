"""A broker or cluster node that does not end on SIGTERM within the fixture's bound is
SIGKILLed with a warning (waiting.SlowStop), so a graceful stop that hangs shows in
the run's warnings summary instead of passing as 30 s of suite time. A stopped
process (SIGSTOP) plays the hung node: SIGTERM stays pending, SIGKILL ends it."""

from __future__ import annotations

import os
import signal

import pytest

from tests.support.broker import BrokerProcess
from tests.support.cluster import LocalCluster
from tests.support.waiting import SlowStop


def test_a_broker_that_does_not_end_on_sigterm_is_killed_with_a_warning():
    broker = BrokerProcess().start()
    try:
        process = broker.process
        process.send_signal(signal.SIGSTOP)
        with pytest.warns(SlowStop, match="did not end within 1 s of SIGTERM"):
            broker.stop(timeout=1)
        assert process.returncode == -signal.SIGKILL
    finally:
        broker.cleanup()


def test_a_broker_that_ends_on_sigterm_gives_no_warning(recwarn):
    broker = BrokerProcess().start()
    try:
        assert broker.stop() == 0
    finally:
        broker.cleanup()
    assert not [w for w in recwarn if issubclass(w.category, SlowStop)]


def test_a_cluster_node_that_does_not_end_on_sigterm_is_killed_with_a_warning(recwarn):
    with LocalCluster(2, proxied=False, stop_timeout=1) as cluster:
        os.kill(cluster.pid(0), signal.SIGSTOP)
        with pytest.warns(SlowStop, match=f"node {cluster.names[0]} did not end within 1 s"):
            assert cluster.kill(0, signal.SIGTERM) == -signal.SIGKILL
        assert cluster.kill(1, signal.SIGTERM) == 0
    assert not [w for w in recwarn if issubclass(w.category, SlowStop)]
