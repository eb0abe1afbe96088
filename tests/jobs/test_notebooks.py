"""The notebooks execute (nbclient) over tables the jobs wrote from a small generated
data directory, and draw their plots."""

from __future__ import annotations

import os

import nbformat
import pika
import pytest
from nbclient import NotebookClient

from quorumqueue.jobs import memory_footprint, segment_compaction
from tests.support.broker import BrokerProcess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = "[raft]\nwal_max_size_bytes = 65536\nsegment_max_entries = 64\n"


@pytest.fixture(scope="module")
def analytics(spark, tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("analytics"))
    with BrokerProcess(extra_config=CONFIG) as broker:
        connection = pika.BlockingConnection(pika.URLParameters(broker.uri))
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("nb", durable=True, arguments={"x-queue-type": "quorum"})
        for number in range(600):
            channel.basic_publish("", "nb", b"n" * 100, pika.BasicProperties(delivery_mode=2))
        for number in range(500):
            method, _properties, _body = channel.basic_get("nb")
            if number != 100:                  # one old message stays: it pins segments
                channel.basic_ack(method.delivery_tag)
        connection.close()
        broker.stop()
        for _run in range(2):                  # two runs: history to plot over time
            segment_compaction.run(spark, broker.data_dir, out, 64, table_format="parquet")
            memory_footprint.run(spark, broker.data_dir, out, 65536, table_format="parquet")
    return out


@pytest.mark.parametrize("name", ["segment_compaction", "memory_footprint"])
def test_the_notebook_runs_and_plots(name, analytics, monkeypatch):
    monkeypatch.setenv("QUORUMQUEUE_ANALYTICS", analytics)
    monkeypatch.setenv("QUORUMQUEUE_TABLE_FORMAT", "parquet")
    notebook = nbformat.read(os.path.join(ROOT, "notebooks", f"{name}.ipynb"), as_version=4)
    NotebookClient(notebook, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": ROOT}}).execute()
    outputs = [output for cell in notebook.cells if cell.cell_type == "code"
               for output in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) == 2, [o.output_type for o in outputs]
