"""Leases nobody loses (docs/behaviour/leases.md, connector/README.md "Lease mode"):
real queries on a broker whose lease_timeout is short (15 s: a batch must fit in it),
with no leaseTimeout option, so the broker's default is what gives a lease back.

- A lease-mode query with a memory sink and no checkpoint of its own ends holding its
  last batch (Spark commits a batch to the source only when it plans the next); the
  timeout gives those messages back to the queue.
- A query that comes back to its checkpoint after its lease timed out fails at start,
  the first line of its error saying which messages went back and what to do, and
  nothing is lost: a query with a new checkpoint reads them all. (A query that comes
  back inside the timeout lands every message once: test_streaming.py's restart
  tests, under the default 30 minutes.)
"""

from __future__ import annotations

import json
import time

import pytest
from pyspark.errors import StreamingQueryException

from tests.support.broker import BrokerProcess

from .queues import publish_orders, ready, unique

pytestmark = pytest.mark.timeout(300)
WAIT = 120.0  # seconds: generous, the machine is shared


@pytest.fixture(scope="module")
def short_leases():
    with BrokerProcess(extra_config="lease_timeout = 15000\n") as process:
        yield process



def wait_for(condition, what: str):
    deadline = time.monotonic() + WAIT
    while not (value := condition()):
        assert time.monotonic() < deadline, f"{what} within {WAIT}s"
        time.sleep(0.2)
    return value


def run(spark, uri: str, queue: str, name: str | None = None, table: str | None = None):
    """An AvailableNow query of `queue` into the memory sink `name` (no checkpoint of
    its own), or into the parquet table at `table` (its checkpoint beside it)."""
    writer = (spark.readStream.format("quorumqueue").option("uri", uri).option("queue", queue)
              .load().writeStream.trigger(availableNow=True))
    if table is None:
        writer = writer.format("memory").queryName(name)
    else:
        writer = (writer.format("parquet").option("path", table)
                  .option("checkpointLocation", table + "-checkpoint"))
    query = writer.start()
    try:
        query.awaitTermination(WAIT)
    except StreamingQueryException:
        pass  # the caller reads query.exception()
    return query


def test_leases_left_by_ended_queries_go_back_and_a_late_query_fails_saying_so(
        spark, short_leases, tmp_path):
    """Two queries end: one into a memory sink (no checkpoint of its own), one into a
    parquet table with its checkpoint. Both leave their last batch in their lease. After
    the timeout both batches are ready in their queues again; the checkpointed query,
    started again, fails at start with the fencing message on the first line of its
    error; nothing is lost: started over, it reads every message."""
    notebook, orders = unique("notebook"), unique("orders")
    publish_orders(short_leases.uri, notebook, range(30))
    publish_orders(short_leases.uri, orders, range(20))
    query = run(spark, short_leases.uri, notebook, name="notebook")
    assert query.exception() is None, query.exception()
    assert spark.table("notebook").count() == 30
    table = str(tmp_path / "orders")
    first = run(spark, short_leases.uri, orders, table=table)
    assert first.exception() is None, first.exception()
    lease = json.loads(first.lastProgress["sources"][0]["endOffset"])["lease"]
    assert ready(short_leases.uri, notebook) == ready(short_leases.uri, orders) == 0

    # away for longer than the timeout: the broker gives both batches back
    wait_for(lambda: ready(short_leases.uri, notebook) == 30, "the 30 messages ready again")
    wait_for(lambda: ready(short_leases.uri, orders) == 20, "the 20 messages ready again")

    second = run(spark, short_leases.uri, orders, table=table)
    error = second.exception()
    assert isinstance(error, StreamingQueryException)
    first_line = str(error).splitlines()[0]
    assert (f"quorumqueue source: lease '{lease}' on queue '{orders}' was given back to the "
            "queue after 15s idle") in first_line
    assert "its messages with offsets 1..20" in first_line
    assert "Start the query with a new checkpoint location" in first_line
    assert ready(short_leases.uri, orders) == 20  # nothing lost, nothing settled
    again = run(spark, short_leases.uri, orders, table=str(tmp_path / "started-over"))
    assert again.exception() is None, again.exception()
    ids = sorted(r.message_id for r in spark.read.parquet(str(tmp_path / "started-over"))
                 .select("message_id").collect())
    assert ids == sorted(f"order-{n}" for n in range(20))
