"""The source and the sink from a Spark Connect session (PySpark >= 4.2's local Connect
server, `SparkSession.builder.remote("local[2]")`): Python data sources run on the
server, which finds `pyspark_quorumqueue` as a classic session does, so a Connect
client reads and writes with `format("quorumqueue")` unchanged.

The client runs in a process of its own (connect_app.py): the local Connect server is
a classic session inside the client's process, which cannot start beside the suite's
session-scoped `spark`. Needs the Connect client's packages (grpcio, grpcio-status,
googleapis-common-protos, zstandard: pyproject's dev extra, as PySpark's `connect`
extra lists them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pika
import pytest

from tests.support.broker import ROOT

from .queues import publish_orders, unique

pytestmark = pytest.mark.timeout(300)


def test_a_connect_session_streams_from_a_queue_and_writes_with_the_sink(broker, tmp_path):
    source, other, target = unique("orders"), unique("other"), unique("copy")
    publish_orders(broker.uri, source, range(25))
    publish_orders(broker.uri, other, range(100, 130))
    with pika.BlockingConnection(pika.URLParameters(broker.uri)) as connection:
        connection.channel().queue_declare(target, durable=True,
                                           arguments={"x-queue-type": "quorum"})
    # SPARK_TESTING: the local Connect server on a free port (connect_app.py's header)
    environment = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1",
                   "SPARK_TESTING": "1"}
    environment.pop("SPARK_REMOTE", None)
    run = subprocess.run([sys.executable, "-m", "tests.connector.connect_app", broker.uri,
                          source, other, target, str(tmp_path)], cwd=ROOT, env=environment,
                         capture_output=True, text=True, timeout=280)
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    assert run.returncode == 0 and lines, f"{run.stdout[-3000:]}\n{run.stderr[-6000:]}"
    result = json.loads(lines[-1].removeprefix("RESULT "))
    assert result["session"] == "pyspark.sql.connect.session"   # a Connect client
    assert result["read_error"] is None and result["write_error"] is None
    assert result["message_ids"] == sorted(f"order-{n}" for n in range(25))
    assert result["offsets"] == list(range(1, 26)) and result["batches"] == [10, 10, 5]
    assert result["lag"]["maxMessagesBehindLatest"] == 0     # the lag, through Connect
    copied = []
    with pika.BlockingConnection(pika.URLParameters(broker.uri)) as connection:
        channel = connection.channel()
        while (got := channel.basic_get(target, auto_ack=True))[0] is not None:
            copied.append(got[1].message_id)
    assert sorted(copied) == sorted([f"order-{n}" for n in range(100, 130)] + ["batch-1"])
