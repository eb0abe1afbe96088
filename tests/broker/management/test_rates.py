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


@pytest.mark.parametrize("queue_type", ["quorum", "classic"])
def test_a_queue_has_its_own_message_stats(broker, queue_type):
    """/api/queues' per-queue message_stats (RabbitMQ's keys): publishes routed to
    this queue, deliveries to consumers, gets, redeliveries and acks of its messages
    only, and their rates once two samples exist."""
    import pika

    base = broker.management_url
    name = f"stats-{queue_type}"
    assert call(base, "PUT", f"/api/queues/%2F/{name}",
                {"durable": True, "arguments": {"x-queue-type": queue_type}})[0] == 201
    assert call(base, "PUT", "/api/queues/%2F/stats-other", {"durable": True})[0] in (201, 204)
    connection = pika.BlockingConnection(pika.URLParameters(broker.uri))
    channel = connection.channel()
    channel.confirm_delivery()
    for n in range(6):
        channel.basic_publish("", name, b"%d" % n)
    channel.basic_publish("", "stats-other", b"elsewhere")
    # a consumer takes 3: acks 2 and rejects 1 back (redelivered to the next get)
    channel.basic_qos(prefetch_count=3)
    taken = []
    channel.basic_consume(name, lambda ch, method, properties, body: taken.append(method))
    while len(taken) < 3:
        connection.process_data_events(time_limit=1)
    channel.basic_cancel(channel.consumer_tags[0])
    channel.basic_ack(taken[0].delivery_tag)
    channel.basic_ack(taken[1].delivery_tag)
    channel.basic_reject(taken[2].delivery_tag, requeue=True)
    method, _properties, _body = channel.basic_get(name, auto_ack=False)
    assert method.redelivered
    channel.basic_ack(method.delivery_tag)
    assert channel.basic_get(name, auto_ack=True)[0] is not None
    connection.close()

    def stats():
        return call(base, "GET", f"/api/queues/%2F/{name}")[1]["message_stats"]

    counts = {key: value for key, value in stats().items() if not key.endswith("_details")}
    assert counts == {"publish": 6, "deliver": 3, "deliver_no_ack": 0, "get": 1,
                      "get_no_ack": 1, "deliver_get": 5, "redeliver": 1, "ack": 3}
    other = call(base, "GET", "/api/queues/%2F/stats-other")[1]["message_stats"]
    assert other["publish"] >= 1 and other["deliver_get"] == 0
    rated = wait_for(lambda: (lambda s: s if "publish_details" in s else None)(stats()),
                     "the queue's message rates")
    assert {f"{key}_details" for key in counts} <= set(rated)
    assert all(rated[f"{key}_details"]["rate"] >= 0 for key in counts)
    listed = {row["name"]: row for row in call(base, "GET", "/api/queues")[1]}
    assert listed[name]["message_stats"]["publish"] == 6


def test_interval_is_checked(tmp_path):
    from quorumqueue.broker.config import ConfigError, load_settings

    path = tmp_path / "broker.toml"
    path.write_text("collect_statistics_interval = 0\n")
    with pytest.raises(ConfigError, match="collect_statistics_interval"):
        load_settings(str(path))
