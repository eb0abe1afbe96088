"""Queue length rates (`messages_details` and kin, RabbitMQ's names): sampled every
`collect_statistics_interval` while the API is in use, the change per second
between the last two samples; summed in the overview's queue totals."""

from __future__ import annotations

import pytest

from tests.support.broker import BrokerProcess

from .support import call, wait_for, wait_until_serving


@pytest.fixture(scope="module")
def broker():
    with BrokerProcess(extra_config="collect_statistics_interval = 200\n") as process:
        wait_until_serving(process.management_url)
        yield process


def test_rates_follow_the_queue_length(broker):
    base = broker.management_url
    assert call(base, "PUT", "/api/queues/%2F/rated",
                {"durable": True, "arguments": {"x-queue-type": "quorum"}})[0] == 201

    def row():
        return call(base, "GET", "/api/queues/%2F/rated")[1]

    # sampling starts with the first request; two samples give a rate
    first = wait_for(lambda: (lambda r: r if "messages_details" in r else None)(row()),
                     "the first rates")
    assert first["messages_details"] == {"rate": 0.0}
    for _ in range(20):
        call(base, "POST", "/api/exchanges/%2F/amq.default/publish",
             {"properties": {}, "routing_key": "rated", "payload": "m",
              "payload_encoding": "string"})
    rising = wait_for(lambda: (lambda r: r if r["messages_details"]["rate"] > 0 else None)(
        row()), "a positive rate while messages arrive")
    assert rising["messages_ready_details"]["rate"] > 0
    assert rising["messages_unacknowledged_details"] == {"rate": 0.0}
    wait_for(lambda: row()["messages_details"]["rate"] == 0.0 and row()["messages"] == 20,
             "the rate back at 0 once nothing changes")
    totals = call(base, "GET", "/api/overview")[1]["queue_totals"]
    assert totals["messages"] == 20 and totals["messages_details"] == {"rate": 0.0}


def test_overview_message_stats_count_publishes_and_gets(broker):
    """The overview's message_stats: this node's publish/deliver/ack counts (RabbitMQ's
    keys) and, once two samples exist, their rates: the web UI's rate chart."""
    base = broker.management_url
    assert call(base, "PUT", "/api/queues/%2F/counted", {"durable": True})[0] == 201
    before = call(base, "GET", "/api/overview")[1]["message_stats"]
    for _ in range(5):
        assert call(base, "POST", "/api/exchanges/%2F/amq.default/publish",
                    {"properties": {}, "routing_key": "counted", "payload": "m",
                     "payload_encoding": "string"})[1] == {"routed": True}
    got = call(base, "POST", "/api/queues/%2F/counted/get",
               {"count": 2, "ackmode": "ack_requeue_false", "encoding": "auto"})[1]
    assert len(got) == 2
    after = call(base, "GET", "/api/overview")[1]["message_stats"]
    assert after["publish"] - before["publish"] == 5
    assert after["get"] - before["get"] == 2
    assert after["deliver_get"] - before["deliver_get"] == 2
    assert after["ack"] - before["ack"] == 2
    rated = wait_for(lambda: (lambda s: s if "publish_details" in s else None)(
        call(base, "GET", "/api/overview")[1]["message_stats"]), "message rates")
    assert rated["publish_details"]["rate"] >= 0 and "deliver_get_details" in rated


def test_interval_is_checked(tmp_path):
    from quorumqueue.broker.config import ConfigError, load_settings

    path = tmp_path / "broker.toml"
    path.write_text("collect_statistics_interval = 0\n")
    with pytest.raises(ConfigError, match="collect_statistics_interval"):
        load_settings(str(path))
