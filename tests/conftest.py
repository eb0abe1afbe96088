"""Fixtures shared by the whole suite.

``rabbitmq``: one private RabbitMQ 3.10.8 node per session (the oracle of the
differential tests), skipped with a reason naming .ci/install-rabbitmq when
RabbitMQ is not installed. Started lazily: only tests that ask for it pay its
~4 s boot.
"""

import os
import sys
from collections.abc import Iterator

import pytest

from quorumqueue.cli import launcher
from tests.support.rabbitmq import RabbitMQNode


def pytest_configure(config: pytest.Config) -> None:
    """Each pytest-xdist worker picks free ports from a range of its own
    (launcher.PICK_RANGE_ENV, inherited by the brokers and clusters its tests start):
    a fault test restarts a killed node on its ports, and another worker picking them
    while the node was down took them first (CI, 2026-12-03: a node of
    test_reconciliation.py failed to bind, "address already in use", while
    test_fault_suite.py's kill-majority run restarted nodes)."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), \
        os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not worker or not count or launcher.PICK_RANGE_ENV in os.environ:
        return
    ports = launcher.pick_range()
    share = len(ports) // int(count)
    low = ports.start + int(worker.removeprefix("gw")) * share
    os.environ[launcher.PICK_RANGE_ENV] = f"{low}-{low + share - 1}"


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The temporary directories of the in-process nodes still alive go (a
    pytest-xdist worker ends without running atexit; see harness.new_node)."""
    harness = sys.modules.get("tests.broker.node.harness")
    if harness is not None:
        harness.remove_directories()


@pytest.fixture(scope="session")
def rabbitmq() -> Iterator[RabbitMQNode]:
    if not RabbitMQNode.available():
        pytest.skip(RabbitMQNode.skip_reason)
    with RabbitMQNode() as node:
        yield node


from tests.support.broker import BrokerProcess  # noqa: E402


@pytest.fixture(scope="module")
def broker() -> Iterator[BrokerProcess]:
    """One bundled broker per test module (use unique queue names per test)."""
    with BrokerProcess() as process:
        yield process


@pytest.fixture
def fresh_broker() -> Iterator[BrokerProcess]:
    """A broker of the test's own, with its own data directory (restart tests)."""
    with BrokerProcess() as process:
        yield process


# The test files that take longest (Spark jobs, clusters of node processes, RabbitMQ
# nodes of their own, fault runs) are handed out first. pytest-xdist gives a worker a
# whole file at a time (--dist loadfile), so a long file started last kept the suite
# running while the other worker sat idle; the thousands of quick unit tests that come
# after them fill the gaps. Stable: a file's tests keep their order. The Makefile passes
# --no-loadscope-reorder: without it pytest-xdist (>= 3.8 has the option) reorders the
# files by how many tests they hold, and this order is lost.
#
# LONGEST_FILES first, in this order (slowest first: each file's test times summed,
# setup included, from the junit file of a fresh-clone `make test` beside two CPU hogs
# at d25f438, 2026-12-07), then the folders of LONGEST_FIRST. Add a file here when it
# is measured among the slowest.
LONGEST_FILES = (
    "tests/connector/test_delta_restart.py",                    # 219 s
    "tests/faults/test_fault_suite.py",                         # 194 s
    "tests/broker/cluster/test_mirrored_queues.py",             # 191 s
    "tests/broker/shovel/test_shovel.py",                       # 161 s
    "tests/broker/server/test_restart.py",                      # 121 s
    "tests/jobs/test_orders_to_delta.py",                       # 118 s
    "tests/differential/test_migration_against_rabbitmq.py",    # 110 s
    "tests/differential/test_rabbitmqctl_against_rabbitmq.py",  # 110 s
    "tests/broker/cluster/test_mirrored_queues_on_disk.py",     # 94 s
    "tests/connector/test_sink.py",                             # 91 s
    "tests/broker/cluster/test_metadata_snapshots.py",          # 80 s
    "tests/jobs/test_notebooks.py",                             # 80 s
    "tests/broker/cluster/test_cluster.py",                     # 74 s
    "tests/broker/cluster/test_faults.py",                      # 70 s
    "tests/broker/cluster/test_reconciliation.py",              # 65 s
    "tests/connector/test_reconnect.py",                        # 62 s
    "tests/differential/test_dead_letter_against_rabbitmq.py",  # 60 s
    "tests/connector/test_kafka_options.py",                    # 55 s
    "tests/connector/test_consume_mode.py",                     # 48 s
    "tests/connector/test_spark_connect.py",                    # 43 s
    "tests/connector/test_delta_merge.py",                      # 34 s
)
LONGEST_FIRST = ("tests/jobs/", "tests/connector/", "tests/broker/cluster/",
                 "tests/differential/", "tests/faults/")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::", 1)[0]
        if path in LONGEST_FILES:
            return LONGEST_FILES.index(path)
        return len(LONGEST_FILES) + next(
            (n for n, prefix in enumerate(LONGEST_FIRST) if path.startswith(prefix)),
            len(LONGEST_FIRST))
    items.sort(key=rank)
