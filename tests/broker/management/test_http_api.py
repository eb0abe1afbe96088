"""The management HTTP API of a running broker, endpoint group by endpoint group, with
RabbitMQ 3.10's paths, status codes, JSON field names and refusal bodies (checked
against RabbitMQ 3.10.8's management plugin: tests/differential/
test_management_against_rabbitmq.py compares the key sets)."""

from __future__ import annotations

import base64
import urllib.error
import urllib.request
import uuid
from urllib.parse import quote

import pika
import pytest

from tests.support.broker import BrokerProcess

from .support import call, wait_for, wait_until_serving


@pytest.fixture(scope="module")
def broker():
    with BrokerProcess() as process:
        wait_until_serving(process.management_url)
        yield process


def api(broker, method, path, body=None, **login):
    return call(broker.management_url, method, path, body, **login)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def add_user(broker, name: str, tags: str, vhost: str = "/", configure=".*") -> None:
    assert api(broker, "PUT", f"/api/users/{name}", {"password": name, "tags": tags})[0] == 201
    assert api(broker, "PUT", f"/api/permissions/%2F/{name}",
               {"configure": configure, "write": ".*", "read": ".*"})[0] == 201


# ---------------------------------------------------------------- authentication


def test_login_failures_are_401_with_rabbitmqs_bodies(broker):
    status, body, headers = api(broker, "GET", "/api/overview", password="wrong")
    assert (status, body) == (401, {"error": "not_authorized", "reason": "Login failed"})
    assert headers["WWW-Authenticate"].startswith("Basic")
    # the web UI's requests (X-Requested-With) get the 401 without the challenge, so a
    # browser shows the UI's login form rather than a dialog of its own
    request = urllib.request.Request(broker.management_url + "/api/overview", headers={
        "Authorization": "Basic " + base64.b64encode(b"guest:wrong").decode(),
        "X-Requested-With": "XMLHttpRequest"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=60)
    assert refused.value.code == 401 and "WWW-Authenticate" not in refused.value.headers
    name = unique("notags")
    assert api(broker, "PUT", f"/api/users/{name}", {"password": "p", "tags": ""})[0] == 201
    status, body, _ = api(broker, "GET", "/api/overview", user=name, password="p")
    assert (status, body) == (401, {"error": "not_authorised",
                                    "reason": "Not management user"})


def test_tags_decide_what_a_user_may_see(broker):
    """monitoring: nodes yes, users no; management: only its own vhosts' queues."""
    monitor, manager = unique("mon"), unique("man")
    add_user(broker, monitor, "monitoring")
    assert api(broker, "PUT", f"/api/users/{manager}",
               {"password": manager, "tags": "management"})[0] == 201
    status, body, _ = api(broker, "GET", "/api/users", user=monitor, password=monitor)
    assert (status, body) == (401, {"error": "not_authorised",
                                    "reason": "Not administrator user"})
    assert api(broker, "GET", "/api/nodes", user=monitor, password=monitor)[0] == 200
    assert api(broker, "GET", "/api/nodes", user=manager, password=manager)[0] == 401
    queue = unique("seen")
    assert api(broker, "PUT", f"/api/queues/%2F/{queue}", {"durable": True})[0] == 201
    names = [row["name"] for row in api(broker, "GET", "/api/queues", user=monitor,
                                        password=monitor)[1]]
    assert queue in names
    # no permissions in any vhost: no queues, and a vhost URL is refused
    assert api(broker, "GET", "/api/queues", user=manager, password=manager)[1] == []
    status, body, _ = api(broker, "GET", "/api/queues/%2F", user=manager, password=manager)
    assert (status, body["reason"]) == (401, "User not authorised to access virtual host")
    assert api(broker, "GET", "/api/whoami", user=manager, password=manager)[1] == {
        "name": manager, "tags": ["management"]}


def test_vhost_permissions_apply_to_changes(broker):
    """A declare outside the user's configure pattern is the AMQP refusal, as 401."""
    name = unique("narrow")
    add_user(broker, name, "management", configure=f"^{name}-")
    assert api(broker, "PUT", f"/api/queues/%2F/{name}-mine", {"durable": True},
               user=name, password=name)[0] == 201
    status, body, _ = api(broker, "PUT", "/api/queues/%2F/theirs", {"durable": True},
                          user=name, password=name)
    assert (status, body) == (401, {"error": "not_authorised", "reason":
                                    f"access to queue 'theirs' in vhost '/' refused for "
                                    f"user '{name}'"})


# ---------------------------------------------------------------- queues


def test_quorum_queue_lifecycle_with_rabbitmq_fields_and_codes(broker):
    name = unique("qq")
    path = f"/api/queues/%2F/{name}"
    declare = {"durable": True, "auto_delete": False, "arguments": {"x-queue-type": "quorum"}}
    assert api(broker, "PUT", path, declare)[0] == 201
    assert api(broker, "PUT", path, declare)[0] == 204
    status, body, _ = api(broker, "PUT", path, {"durable": False, "arguments": {}})
    assert (status, body) == (400, {"error": "bad_request", "reason":
                                    f"inequivalent arg 'durable' for queue '{name}' in vhost "
                                    "'/': received 'false' but current is 'true'"})
    for _ in range(3):
        status, body, _ = api(broker, "POST", "/api/exchanges/%2F/amq.default/publish",
                              {"properties": {"delivery_mode": 2, "headers": {"k": 1}},
                               "routing_key": name, "payload": "hello",
                               "payload_encoding": "string"})
        assert (status, body) == (200, {"routed": True})
    row = api(broker, "GET", path)[1]
    node = api(broker, "GET", "/api/overview")[1]["node"]
    assert {key: row[key] for key in ("name", "vhost", "type", "durable", "auto_delete",
                                      "exclusive", "arguments", "leader", "members", "online",
                                      "messages", "messages_ready", "messages_unacknowledged",
                                      "consumers", "policy")} == {
        "name": name, "vhost": "/", "type": "quorum", "durable": True, "auto_delete": False,
        "exclusive": False, "arguments": {"x-queue-type": "quorum"}, "leader": node,
        "members": [node], "online": [node], "messages": 3, "messages_ready": 3,
        "messages_unacknowledged": 0, "consumers": 0, "policy": None}

    status, got, _ = api(broker, "POST", f"{path}/get",
                         {"count": 2, "ackmode": "ack_requeue_true", "encoding": "auto",
                          "truncate": 3})
    assert status == 200 and len(got) == 2
    assert {key: got[0][key] for key in ("payload", "payload_bytes", "payload_encoding",
                                         "exchange", "routing_key", "redelivered")} == {
        "payload": "hel", "payload_bytes": 5, "payload_encoding": "string", "exchange": "",
        "routing_key": name, "redelivered": False}
    assert got[0]["properties"]["delivery_mode"] == 2
    assert got[0]["properties"]["headers"]["k"] == 1
    assert api(broker, "GET", path)[1]["messages_ready"] == 3  # requeued
    got = api(broker, "POST", f"{path}/get", {"count": 1, "ackmode": "ack_requeue_false",
                                              "encoding": "base64"})[1]
    assert got[0]["payload_encoding"] == "base64" and got[0]["payload"] == "aGVsbG8="
    assert api(broker, "GET", path)[1]["messages"] == 2
    assert api(broker, "DELETE", f"{path}/contents")[0] == 204
    assert api(broker, "GET", path)[1]["messages"] == 0
    assert api(broker, "DELETE", path)[0] == 204
    status, body, _ = api(broker, "DELETE", path)
    assert (status, body) == (404, {"error": "Object Not Found", "reason": "Not Found"})
    assert api(broker, "GET", path)[0] == 404


def test_a_quorum_queues_raft_status_on_a_single_node(broker):
    queue, classic = unique("rq"), unique("rc")
    assert api(broker, "PUT", f"/api/queues/%2F/{queue}",
               {"durable": True, "arguments": {"x-queue-type": "quorum"}})[0] == 201
    assert api(broker, "PUT", f"/api/queues/%2F/{classic}", {"durable": True})[0] == 201
    status, body, _ = api(broker, "GET", f"/api/queues/%2F/{queue}/raft")
    assert status == 200 and body["leader"] == body["reporting_node"]
    [member] = body["members"]
    assert (member["node"], member["raft_state"], member["online"]) == (
        body["leader"], "leader", True)
    assert member["term"] >= 1 and member["commit_index"] >= 1
    status, body, _ = api(broker, "GET", f"/api/queues/%2F/{classic}/raft")
    assert (status, body["error"]) == (400, "bad_request")
    assert "not a quorum queue" in body["reason"]
    assert api(broker, "GET", "/api/queues/%2F/no-such-queue/raft")[0] == 404
    assert api(broker, "GET", f"/api/queues/no-such-vhost/{queue}/raft")[0] == 404


def test_queue_delete_if_empty_refuses_a_queue_with_messages(broker):
    name = unique("full")
    assert api(broker, "PUT", f"/api/queues/%2F/{name}", {"durable": True})[0] == 201
    api(broker, "POST", "/api/exchanges/%2F/amq.default/publish",
        {"properties": {}, "routing_key": name, "payload": "x", "payload_encoding": "string"})
    status, body, _ = api(broker, "DELETE", f"/api/queues/%2F/{name}?if-empty=true")
    assert (status, body) == (400, {"error": "bad_request",
                                    "reason": f"queue '{name}' in vhost '/' not empty"})


def test_bad_queue_argument_is_rabbitmqs_400(broker):
    name = unique("bad")
    status, body, _ = api(broker, "PUT", f"/api/queues/%2F/{name}",
                          {"durable": True, "arguments": {"x-max-length": "x"}})
    assert (status, body) == (400, {"error": "bad_request", "reason":
                                    f"invalid arg 'x-max-length' for queue '{name}' in vhost "
                                    "'/': \"expected integer, got longstr\""})


# ---------------------------------------------------------------- exchanges, bindings


def test_exchange_binding_publish_and_unbind(broker):
    exchange, queue = unique("ex"), unique("bq")
    assert api(broker, "PUT", f"/api/exchanges/%2F/{exchange}", {"type": "topic"})[0] == 201
    status, body, _ = api(broker, "PUT", f"/api/exchanges/%2F/{unique('x')}", {"type": "nope"})
    assert (status, body) == (400, {"error": "bad_request",
                                    "reason": "unknown exchange type 'nope'"})
    row = api(broker, "GET", f"/api/exchanges/%2F/{exchange}")[1]
    assert {key: row[key] for key in ("name", "vhost", "type", "durable", "auto_delete",
                                      "internal", "arguments")} == {
        "name": exchange, "vhost": "/", "type": "topic", "durable": True,
        "auto_delete": False, "internal": False, "arguments": {}}
    assert api(broker, "PUT", f"/api/queues/%2F/{queue}", {"durable": True})[0] == 201
    status, _body, headers = api(broker, "POST", f"/api/bindings/%2F/e/{exchange}/q/{queue}",
                                 {"routing_key": "a.#", "arguments": {}})
    assert status == 201
    assert headers["Location"] == f"/api/bindings/%2F/e/{exchange}/q/{queue}/a.%2523"
    listed = api(broker, "GET", f"/api/bindings/%2F/e/{exchange}/q/{queue}")[1]
    assert listed == [{"source": exchange, "vhost": "/", "destination": queue,
                       "destination_type": "queue", "routing_key": "a.#", "arguments": {},
                       "properties_key": "a.%23"}]
    default = {"source": "", "vhost": "/", "destination": queue, "destination_type": "queue",
               "routing_key": queue, "arguments": {}, "properties_key": queue}
    assert api(broker, "GET", f"/api/queues/%2F/{queue}/bindings")[1] == [default, listed[0]]
    assert api(broker, "POST", f"/api/exchanges/%2F/{exchange}/publish",
               {"properties": {}, "routing_key": "a.b", "payload": "p",
                "payload_encoding": "string"})[1] == {"routed": True}
    assert api(broker, "POST", f"/api/exchanges/%2F/{exchange}/publish",
               {"properties": {}, "routing_key": "z", "payload": "p",
                "payload_encoding": "string"})[1] == {"routed": False}
    assert api(broker, "DELETE",
               f"/api/bindings/%2F/e/{exchange}/q/{queue}/a.%2523")[0] == 204
    assert api(broker, "GET", f"/api/bindings/%2F/e/{exchange}/q/{queue}")[1] == []
    assert api(broker, "DELETE", f"/api/exchanges/%2F/{exchange}")[0] == 204
    assert api(broker, "GET", f"/api/exchanges/%2F/{exchange}")[0] == 404


# ---------------------------------------------------------------- definitions


def test_vhosts_users_permissions_and_policies(broker):
    vhost, user, policy, queue = unique("vh"), unique("u"), unique("pol"), unique("pq")
    assert api(broker, "PUT", f"/api/vhosts/{vhost}", {})[0] == 201
    assert api(broker, "PUT", f"/api/vhosts/{vhost}", {})[0] == 204
    assert vhost in [row["name"] for row in api(broker, "GET", "/api/vhosts")[1]]
    assert api(broker, "PUT", f"/api/users/{user}",
               {"password": "pw", "tags": "administrator"})[0] == 201
    assert api(broker, "GET", f"/api/users/{user}")[1]["tags"] == ["administrator"]
    assert api(broker, "PUT", f"/api/permissions/{vhost}/{user}",
               {"configure": ".*", "write": ".*", "read": "^r"})[0] == 201
    assert api(broker, "GET", f"/api/permissions/{vhost}/{user}")[1] == {
        "user": user, "vhost": vhost, "configure": ".*", "write": ".*", "read": "^r"}
    assert api(broker, "PUT", f"/api/policies/{vhost}/{policy}",
               {"pattern": "^pq", "definition": {"max-length": 10}, "priority": 1,
                "apply-to": "queues"})[0] == 201
    assert api(broker, "GET", f"/api/policies/{vhost}")[1] == [
        {"vhost": vhost, "name": policy, "pattern": "^pq", "apply-to": "queues",
         "definition": {"max-length": 10}, "priority": 1}]
    assert api(broker, "PUT", f"/api/queues/{vhost}/{queue}", {"durable": True},
               user=user, password="pw")[0] == 201
    row = api(broker, "GET", f"/api/queues/{vhost}/{queue}", user=user, password="pw")[1]
    assert (row["policy"], row["effective_policy_definition"]) == (policy, {"max-length": 10})
    assert api(broker, "DELETE", f"/api/policies/{vhost}/{policy}")[0] == 204
    assert api(broker, "DELETE", f"/api/permissions/{vhost}/{user}")[0] == 204
    assert api(broker, "DELETE", f"/api/users/{user}")[0] == 204
    assert api(broker, "DELETE", f"/api/vhosts/{vhost}")[0] == 204
    assert api(broker, "GET", f"/api/vhosts/{vhost}")[0] == 404


def test_operator_policies_are_set_listed_applied_and_cleared(broker):
    """RabbitMQ's /api/operator-policies: the shape of /api/policies; a queue it
    matches names it in `operator_policy` and takes the lower of the two limits."""
    policy, operator, queue = unique("pol"), unique("op"), unique("opq")
    assert api(broker, "PUT", f"/api/policies/%2F/{policy}",
               {"pattern": f"^{queue}$", "definition": {"max-length": 10},
                "apply-to": "queues"})[0] == 201
    assert api(broker, "PUT", f"/api/operator-policies/%2F/{operator}",
               {"pattern": f"^{queue}$", "definition": {"max-length": 3},
                "priority": 2, "apply-to": "queues"})[0] == 201
    row = {"vhost": "/", "name": operator, "pattern": f"^{queue}$", "apply-to": "queues",
           "definition": {"max-length": 3}, "priority": 2}
    assert row in api(broker, "GET", "/api/operator-policies")[1]
    assert row in api(broker, "GET", "/api/operator-policies/%2F")[1]
    assert api(broker, "GET", f"/api/operator-policies/%2F/{operator}")[:2] == (200, row)
    assert api(broker, "PUT", f"/api/queues/%2F/{queue}", {"durable": True})[0] == 201
    listed = api(broker, "GET", f"/api/queues/%2F/{queue}")[1]
    assert (listed["policy"], listed["operator_policy"],
            listed["effective_policy_definition"]) == (policy, operator, {"max-length": 3})
    # PUT again: 204; a key an operator policy may not set: 400 naming it
    assert api(broker, "PUT", f"/api/operator-policies/%2F/{operator}",
               {"pattern": f"^{queue}$", "definition": {"max-length": 2}})[0] == 204
    status, body, _ = api(broker, "PUT", "/api/operator-policies/%2F/bad",
                          {"pattern": ".*", "definition": {"alternate-exchange": "x"}})
    assert status == 400 and body["error"] == "bad_request"
    assert "alternate-exchange" in body["reason"]
    # administrators only, as in RabbitMQ
    monitor = unique("mon")
    add_user(broker, monitor, "monitoring policymaker")
    assert api(broker, "GET", "/api/operator-policies", user=monitor,
               password=monitor)[0] == 401
    assert api(broker, "DELETE", f"/api/operator-policies/%2F/{operator}")[0] == 204
    assert api(broker, "DELETE", f"/api/operator-policies/%2F/{operator}")[0] == 404
    assert api(broker, "GET", f"/api/operator-policies/%2F/{operator}")[0] == 404
    assert api(broker, "GET", f"/api/queues/%2F/{queue}")[1]["operator_policy"] is None
    assert api(broker, "DELETE", f"/api/policies/%2F/{policy}")[0] == 204
    assert api(broker, "DELETE", f"/api/queues/%2F/{queue}")[0] == 204


def test_definitions_export_has_rabbitmqs_sections(broker):
    queue = unique("dq")
    api(broker, "PUT", f"/api/queues/%2F/{queue}", {"durable": True,
                                                    "arguments": {"x-queue-type": "quorum"}})
    document = api(broker, "GET", "/api/definitions")[1]
    assert {"rabbit_version", "users", "vhosts", "permissions", "topic_permissions",
            "parameters", "global_parameters", "policies", "queues", "exchanges",
            "bindings"} <= set(document)
    [row] = [row for row in document["queues"] if row["name"] == queue]
    assert row | {"type": "quorum", "vhost": "/", "durable": True, "auto_delete": False,
                  "arguments": {"x-queue-type": "quorum"}} == row


# ---------------------------------------------------------------- node, health


def test_overview_and_nodes(broker):
    overview = api(broker, "GET", "/api/overview")[1]
    for key in ("management_version", "cluster_name", "node", "listeners", "queue_totals",
                "object_totals", "exchange_types", "product_name", "rabbitmq_version"):
        assert key in overview
    ports = {(row["protocol"], row["port"]) for row in overview["listeners"]}
    assert {("amqp", broker.port), ("http", broker.management_port)} <= ports
    nodes = api(broker, "GET", "/api/nodes")[1]
    assert [row["name"] for row in nodes] == [overview["node"]]
    assert nodes[0]["running"] is True and nodes[0]["mem_used"] > 0
    assert nodes[0]["mem_alarm"] is False and nodes[0]["disk_free_alarm"] is False


def test_health_checks(broker):
    ok = {"status": "ok"}
    assert api(broker, "GET", "/api/health/checks/alarms")[:2] == (200, ok)
    assert api(broker, "GET", "/api/health/checks/local-alarms")[:2] == (200, ok)
    assert api(broker, "GET", "/api/health/checks/virtual-hosts")[:2] == (200, ok)
    assert api(broker, "GET", "/api/health/checks/node-is-quorum-critical")[:2] == (
        200, {"status": "ok", "reason": "single node cluster"})
    assert api(broker, "GET", f"/api/health/checks/port-listener/{broker.port}")[:2] == (
        200, {"status": "ok", "port": broker.port})
    status, body, _ = api(broker, "GET", "/api/health/checks/port-listener/1")
    assert status == 503
    assert (body["status"], body["reason"], body["missing"]) == ("failed",
                                                                 "No active listener", 1)
    assert broker.port in body["ports"]


# ---------------------------------------------------------------- connections


def test_connections_channels_and_consumers(broker):
    queue = unique("cq")
    api(broker, "PUT", f"/api/queues/%2F/{queue}", {"durable": True})
    connection = pika.BlockingConnection(pika.URLParameters(broker.uri))
    try:
        channel = connection.channel()
        tag = channel.basic_consume(queue, lambda *args: None)
        mine = wait_for(lambda: [row for row in api(broker, "GET", "/api/consumers")[1]
                                 if row["consumer_tag"] == tag], "the consumer listed")
        assert mine[0]["queue"] == {"name": queue, "vhost": "/"}
        assert mine[0]["ack_required"] is True
        connections = api(broker, "GET", "/api/connections")[1]
        row = next(row for row in connections
                   if row["client_properties"].get("product") == "Pika Python Client Library")
        assert (row["user"], row["vhost"], row["protocol"], row["port"]) == (
            "guest", "/", "AMQP 0-9-1", broker.port)
        assert row["name"] == f"{row['peer_host']}:{row['peer_port']} -> 127.0.0.1:{broker.port}"
        channels = api(broker, "GET", "/api/channels")[1]
        assert any(item["connection_details"]["name"] == row["name"]
                   and item["consumer_count"] == 1 for item in channels)
        queue_row = api(broker, "GET", f"/api/queues/%2F/{queue}")[1]
        assert queue_row["consumers"] == 1
        assert [item["consumer_tag"] for item in queue_row["consumer_details"]] == [tag]
    finally:
        connection.close()


def test_unknown_paths_and_methods(broker):
    assert api(broker, "GET", "/api/nope")[:2] == (404, {"error": "Object Not Found",
                                                         "reason": "Not Found"})
    assert api(broker, "POST", "/api/overview", {})[0] == 405


def test_columns_and_sort_as_rabbitmqadmin_asks(broker):
    for name in ("col-b", "col-a"):
        api(broker, "PUT", f"/api/queues/%2F/{name}", {"durable": True})
    rows = api(broker, "GET", "/api/queues?columns=name,messages&sort=name")[1]
    names = [row["name"] for row in rows]
    assert names == sorted(names)
    assert all(set(row) == {"name", "messages"} for row in rows)


# ---------------------------------------------------------------- operator endpoints


def test_vhost_limits(broker):
    vhost = unique("lim")
    assert api(broker, "PUT", f"/api/vhosts/{vhost}", {})[0] == 201
    assert api(broker, "PUT", f"/api/vhost-limits/{vhost}/max-queues", {"value": 5})[0] == 204
    assert api(broker, "PUT", f"/api/vhost-limits/{vhost}/max-connections",
               {"value": 9})[0] == 204
    assert api(broker, "GET", f"/api/vhost-limits/{vhost}")[1] == [
        {"vhost": vhost, "value": {"max-queues": 5, "max-connections": 9}}]
    status, body, _ = api(broker, "PUT", f"/api/vhost-limits/{vhost}/max-conections",
                          {"value": 1})
    assert status == 400 and "Unrecognised terms" in body["reason"]
    assert api(broker, "DELETE", f"/api/vhost-limits/{vhost}/max-queues")[0] == 204
    assert api(broker, "GET", f"/api/vhost-limits/{vhost}")[1] == [
        {"vhost": vhost, "value": {"max-connections": 9}}]
    assert api(broker, "DELETE", f"/api/vhost-limits/{vhost}/max-connections")[0] == 204
    assert api(broker, "GET", f"/api/vhost-limits/{vhost}")[1] == []


def test_closing_a_connection_through_the_api(broker):
    connection = pika.BlockingConnection(pika.URLParameters(broker.uri))
    try:
        local = connection._impl._transport._sock.getsockname()
        name = quote(f"{local[0]}:{local[1]} -> 127.0.0.1:{broker.port}", safe="")
        wait_for(lambda: api(broker, "GET", f"/api/connections/{name}")[0] == 200,
                 "the connection listed")
        call_status = api(broker, "DELETE", f"/api/connections/{name}")[0]
        assert call_status == 204
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
            for _ in range(600):
                connection.process_data_events(time_limit=0.1)
        assert closed.value.reply_code == 320
        assert closed.value.reply_text == "CONNECTION_FORCED - Closed via management plugin"
    finally:
        if connection.is_open:
            connection.close()


def test_aliveness_test_and_parameters(broker):
    assert api(broker, "GET", "/api/aliveness-test/%2F")[:2] == (200, {"status": "ok"})
    assert api(broker, "GET", "/api/parameters")[:2] == (200, [])
    assert api(broker, "GET", "/api/global-parameters")[:2] == (200, [])


def test_definition_refusals_are_400_with_the_nodes_text(broker):
    status, body, _ = api(broker, "PUT", "/api/permissions/%2F/guest",
                          {"configure": "(", "write": ".*", "read": ".*"})
    assert status == 400 and body["error"] == "bad_request"
    assert "not a regular expression" in body["reason"]
    status, body, _ = api(broker, "PUT", "/api/policies/%2F/modes",
                          {"pattern": ".*", "definition": {"queue-mode": "lazy"}})
    assert status == 400 and "queue-mode" in body["reason"]
    assert api(broker, "GET", "/api/policies/%2F/modes")[0] == 404


def test_user_limits_and_topic_permissions(broker):
    name = unique("limited")
    assert api(broker, "PUT", f"/api/users/{name}", {"password": "p", "tags": ""})[0] == 201
    assert api(broker, "PUT", f"/api/user-limits/{name}/max-channels", {"value": 3})[0] == 204
    assert api(broker, "PUT", f"/api/user-limits/{name}/max-connections",
               {"value": 2})[0] == 204
    assert api(broker, "GET", f"/api/user-limits/{name}")[1] == [
        {"user": name, "value": {"max-channels": 3, "max-connections": 2}}]
    assert api(broker, "DELETE", f"/api/user-limits/{name}/max-channels")[0] == 204
    assert api(broker, "GET", f"/api/user-limits/{name}")[1] == [
        {"user": name, "value": {"max-connections": 2}}]
    assert api(broker, "DELETE", f"/api/user-limits/{name}/max-channels")[0] == 404
    assert api(broker, "GET", "/api/topic-permissions")[:2] == (200, [])


def test_queue_actions_and_the_mirror_sync_check_as_rabbitmq_3_answers_them(broker):
    """POST /api/queues/V/NAME/actions and the mirror-sync health check as RabbitMQ
    3.x's plugin answers them (mirrored queues themselves: tests/broker/cluster/
    test_mirrored_queues.py)."""
    assert api(broker, "GET", "/api/health/checks/node-is-mirror-sync-critical")[:2] == (
        200, {"status": "ok", "reason": "single node cluster"})
    name = unique("actions")
    assert api(broker, "PUT", f"/api/queues/%2F/{name}", {"durable": True})[0] == 201
    path = f"/api/queues/%2F/{name}/actions"
    # a queue no policy mirrors: RabbitMQ's plugin answers 204 (its sync is a no-op)
    assert api(broker, "POST", path, {"action": "sync"})[0] == 204
    assert api(broker, "POST", path, {"action": "cancel_sync"})[0] == 204
    assert api(broker, "POST", path, {"action": "shuffle"})[:2] == (
        400, {"error": "bad_request", "reason": '{unknown,<<"shuffle">>}'})
    assert api(broker, "POST", path, {})[:2] == (
        400, {"error": "bad_request", "reason": "[{key_missing,action}]"})
    assert api(broker, "POST", "/api/queues/%2F/no-such-queue/actions",
               {"action": "sync"})[:2] == (
        404, {"error": "Object Not Found", "reason": "Not Found"})
    monitor = unique("monitor")
    add_user(broker, monitor, "monitoring")
    assert api(broker, "POST", path, {"action": "sync"}, user=monitor,
               password=monitor)[0] == 401
