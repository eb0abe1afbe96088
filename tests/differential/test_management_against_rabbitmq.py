"""The management API's JSON shape against RabbitMQ 3.10.8's management plugin.

The same state is made on both (a quorum queue and a classic queue holding a message
each, a topic exchange bound to the quorum queue), then the key sets of /api/queues'
rows (per queue type), /api/queues/vhost/name, /api/exchanges' rows and
/api/overview are compared. Two rules, per object:
- quorumqueue invents no field: every key it answers with, RabbitMQ has too;
- a RabbitMQ key quorumqueue leaves out is in OMITTED below, with the reason (the
  README's endpoint table says the same). Anything else missing fails.
The values compared too are those both sides must agree on for this state (type,
durable, arguments, counts, members). RabbitMQ emits queue statistics every 5 s:
its rows are read once they carry `messages`.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request

import pika
import pytest

from tests.support.broker import BrokerProcess
from tests.support.rabbitmq import RabbitMQNode, management_node
from tests.support.waiting import wait_until

WAIT = 90.0

# Erlang VM figures of a queue's process; message rates and their samples; figures
# of RabbitMQ's storage (paging, RAM, files) quorumqueue has no equivalent of yet
VM = {"garbage_collection", "reductions", "reductions_details", "memory"}
RATES = {"message_stats", "messages_details", "messages_ready_details",
         "messages_unacknowledged_details", "consumer_capacity", "consumer_utilisation",
         "idle_since"}
QUEUE_STORAGE = {"message_bytes_ram", "messages_ram", "message_bytes_ready",
                 "message_bytes_unacknowledged"}
OMITTED = {
    "quorum": VM | RATES | QUEUE_STORAGE | {"open_files"},
    "classic": VM | RATES | QUEUE_STORAGE | {
        "backing_queue_status", "head_message_timestamp", "message_bytes_paged_out",
        "message_bytes_persistent", "messages_paged_out", "messages_persistent",
        "messages_ready_ram", "messages_unacknowledged_ram"},
    "exchange": {"user_who_performed_action", "message_stats"},
    "overview": {"churn_rates", "sample_retention_policies",
                 "release_series_support_status"},
}


@pytest.fixture(scope="module")
def rabbitmq_management():
    if not RabbitMQNode.available():
        pytest.skip(RabbitMQNode.skip_reason)
    with management_node() as node:
        yield node


@pytest.fixture(scope="module")
def quorumqueue():
    with BrokerProcess() as process:
        wait_for(lambda: _get(process.management_url, "/api/overview"), "quorumqueue's API")
        yield process


def _get(base: str, path: str):
    request = urllib.request.Request(base + path, headers={
        "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())
    except OSError:
        return None


def wait_for(condition, what: str):
    return wait_until(condition, what, WAIT, interval=0.5)


def make_state(uri: str) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(uri))
    try:
        channel = connection.channel()
        channel.queue_declare("mgmt-qq", durable=True, arguments={"x-queue-type": "quorum"})
        channel.queue_declare("mgmt-cq", durable=True)
        channel.exchange_declare("mgmt-x", "topic", durable=True)
        channel.queue_bind("mgmt-qq", "mgmt-x", "a.#")
        channel.confirm_delivery()
        channel.basic_publish("mgmt-x", "a.b", b"hello")
        channel.basic_publish("", "mgmt-cq", b"hello")
    finally:
        connection.close()


@pytest.fixture(scope="module")
def both(rabbitmq_management, quorumqueue):
    make_state(rabbitmq_management.uri)
    make_state(quorumqueue.uri)

    def with_stats(base):
        rows = _get(base, "/api/queues")
        return rows if rows and all("messages" in row and "message_stats" in row
                                    for row in rows) else None

    return {"rabbitmq": (rabbitmq_management.management_url,
                         wait_for(lambda: with_stats(rabbitmq_management.management_url),
                                  "RabbitMQ's queue statistics")),
            "quorumqueue": (quorumqueue.management_url,
                            _get(quorumqueue.management_url, "/api/queues"))}


def compare(kind: str, theirs: dict, ours: dict) -> None:
    invented = set(ours) - set(theirs)
    assert not invented, f"{kind}: keys RabbitMQ does not have: {sorted(invented)}"
    missing = set(theirs) - set(ours) - OMITTED[kind]
    assert not missing, f"{kind}: RabbitMQ keys left out without a reason: {sorted(missing)}"


def by_name(rows: list) -> dict:
    return {row["name"]: row for row in rows}


@pytest.mark.parametrize("name,kind", [("mgmt-qq", "quorum"), ("mgmt-cq", "classic")])
def test_queue_rows_have_rabbitmqs_keys(both, name, kind):
    theirs = by_name(both["rabbitmq"][1])[name]
    ours = by_name(both["quorumqueue"][1])[name]
    compare(kind, theirs, ours)
    same = ("type", "durable", "auto_delete", "exclusive", "arguments", "messages",
            "messages_ready", "messages_unacknowledged", "consumers", "policy", "vhost")
    assert {key: ours[key] for key in same} == {key: theirs[key] for key in same}
    # per-queue message_stats: RabbitMQ's names (it lists a counter once it moved;
    # ours are all there from 0), the same publish count for the same publish
    mine, rabbits = ours["message_stats"], theirs["message_stats"]
    assert {key for key in mine if not key.endswith("_details")} <= set(rabbits) | {
        "deliver", "deliver_no_ack", "get", "get_no_ack", "deliver_get", "redeliver", "ack"}
    assert mine["publish"] == rabbits["publish"] == 1
    if kind == "quorum":
        assert len(ours["members"]) == len(theirs["members"]) == 1
        assert ours["leader"] == ours["members"][0] == ours["online"][0]


def test_one_queue_has_rabbitmqs_keys(both):
    theirs = _get(both["rabbitmq"][0], "/api/queues/%2F/mgmt-qq")
    ours = _get(both["quorumqueue"][0], "/api/queues/%2F/mgmt-qq")
    compare("quorum", theirs, ours)
    assert {"consumer_details", "incoming", "deliveries"} <= set(ours)


def test_exchange_rows_have_rabbitmqs_keys(both):
    theirs = by_name(_get(both["rabbitmq"][0], "/api/exchanges"))
    ours = by_name(_get(both["quorumqueue"][0], "/api/exchanges"))
    # the same exchanges, but for RabbitMQ's tracing exchange (quorumqueue has no tracer)
    assert set(theirs) - {"amq.rabbitmq.trace"} == set(ours)
    for name in ours:
        compare("exchange", theirs[name], ours[name])
        assert {k: v for k, v in ours[name].items() if k != "policy"} == {
            k: v for k, v in theirs[name].items() if k in ours[name]}


def test_bindings_are_rabbitmqs(both):
    def comparable(base):
        return sorted(json.dumps(row, sort_keys=True) for row in _get(base, "/api/bindings")
                      if row["destination"].startswith("mgmt-"))

    assert comparable(both["quorumqueue"][0]) == comparable(both["rabbitmq"][0])


def test_overview_has_rabbitmqs_keys(both):
    theirs = _get(both["rabbitmq"][0], "/api/overview")
    ours = _get(both["quorumqueue"][0], "/api/overview")
    compare("overview", theirs, ours)
    for key in ("object_totals", "queue_totals"):
        assert set(ours[key]) <= set(theirs[key])
    assert set(theirs["queue_totals"]) - set(ours["queue_totals"]) <= RATES | {
        key for key in theirs["queue_totals"] if key.endswith("_details")}
    assert ours["queue_totals"]["messages"] == theirs["queue_totals"]["messages"] == 2
    assert ours["object_totals"]["queues"] == theirs["object_totals"]["queues"] == 2
    # message_stats (the web UI's rate chart): RabbitMQ's names (it lists a counter once
    # it moved, ours are all there from 0: the delivery names are RabbitMQ's for the
    # same events), the same counts for the same two confirmed publishes; disk figures
    # and get_empty left out (no equivalent)
    mine, rabbits = ours["message_stats"], theirs["message_stats"]
    assert {key for key in mine if not key.endswith("_details")} <= set(rabbits) | {
        "return_unroutable", "drop_unroutable", "deliver", "deliver_no_ack", "get",
        "get_no_ack", "redeliver", "ack", "deliver_get"}
    for key in ("publish", "confirm"):
        assert mine[key] == rabbits[key] == 2, key


def test_rabbitmqs_export_imports_into_quorumqueue(rabbitmq_management, quorumqueue):
    """RabbitMQ's own definitions (its password hashes included: the same salted
    SHA-256) load into quorumqueue through POST /api/definitions."""
    import subprocess
    from pathlib import Path

    ctl = Path("/usr/lib/rabbitmq/bin/rabbitmqctl")
    base = rabbitmq_management.base_dir
    environment = {"HOME": str(base / "home"), "PATH": "/usr/bin:/bin",
                   "ERL_EPMD_PORT": str(rabbitmq_management.epmd_port),
                   "RABBITMQ_CONF_ENV_FILE": str(base / "rabbitmq-env.conf")}
    for arguments in (("add_user", "dora", "dora-secret"),
                      ("set_user_tags", "dora", "management"),
                      ("set_permissions", "-p", "/", "dora", ".*", ".*", ".*")):
        subprocess.run([str(ctl), "-n", rabbitmq_management.node_name, *arguments],
                       env=environment, check=True, capture_output=True, timeout=120)
    document = _get(rabbitmq_management.management_url, "/api/definitions")
    request = urllib.request.Request(
        quorumqueue.management_url + "/api/definitions", data=json.dumps(document).encode(),
        method="POST", headers={"Content-Type": "application/json", "Authorization":
                                "Basic " + base64.b64encode(b"guest:guest").decode()})
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.status == 204
    login = urllib.request.Request(quorumqueue.management_url + "/api/whoami", headers={
        "Authorization": "Basic " + base64.b64encode(b"dora:dora-secret").decode()})
    with urllib.request.urlopen(login, timeout=30) as response:
        assert json.loads(response.read()) == {"name": "dora", "tags": ["management"]}


def _call(base: str, method: str, path: str, body=None, user: str = "guest",
          password: str = "guest"):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(base + path, data=data, method=method, headers={
        "Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode(),
        "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            raw, status = response.read(), response.status
    except urllib.error.HTTPError as error:
        raw, status = error.read(), error.code
    return status, json.loads(raw) if raw else None


REFUSALS = [
    ("GET", "/api/queues/%2F/mgmt-none", None, "guest"),
    ("GET", "/api/no-such-thing", None, "guest"),
    ("DELETE", "/api/queues/%2F/mgmt-none", None, "guest"),
    ("PUT", "/api/queues/%2F/mgmt-qq", {"durable": False, "arguments": {}}, "guest"),
    ("PUT", "/api/queues/%2F/mgmt-bad", {"durable": True,
                                         "arguments": {"x-max-length": "x"}}, "guest"),
    ("PUT", "/api/exchanges/%2F/mgmt-badx", {"type": "nope", "durable": True}, "guest"),
    ("DELETE", "/api/queues/%2F/mgmt-cq?if-empty=true", None, "guest"),
    ("POST", "/api/exchanges/%2F/mgmt-x/publish", {"properties": {}, "routing_key": "zz",
                                                   "payload": "p",
                                                   "payload_encoding": "string"}, "guest"),
    ("GET", "/api/overview", None, "wrong-password"),
    ("GET", "/api/users", None, "mgmt-monitor"),
    ("GET", "/api/definitions", None, "mgmt-monitor"),
    ("GET", "/api/overview", None, "mgmt-none-tag"),
    ("GET", "/api/health/checks/alarms", None, "guest"),
    ("GET", "/api/health/checks/local-alarms", None, "guest"),
    ("GET", "/api/health/checks/virtual-hosts", None, "guest"),
    ("GET", "/api/health/checks/node-is-quorum-critical", None, "guest"),
    ("GET", "/api/whoami", None, "mgmt-monitor"),
    ("GET", "/api/operator-policies", None, "guest"),
    ("GET", "/api/parameters", None, "guest"),
]


@pytest.fixture(scope="module")
def users_on_both(both):
    for base, _rows in both.values():
        for name, tags in (("mgmt-monitor", "monitoring"), ("mgmt-none-tag", "")):
            assert _call(base, "PUT", f"/api/users/{name}",
                         {"password": name, "tags": tags})[0] in (201, 204)
    return both


@pytest.mark.parametrize("method,path,body,user", REFUSALS,
                         ids=[f"{m} {p} as {u}" for m, p, _b, u in REFUSALS])
def test_answers_and_refusals_are_rabbitmqs(users_on_both, method, path, body, user):
    """Status and JSON body equal, for refusals and the small fixed answers."""
    password = "nope" if user == "wrong-password" else user
    user = "guest" if user == "wrong-password" else user
    answers = {name: _call(base, method, path, body, user, password)
               for name, (base, _rows) in users_on_both.items()}
    assert answers["quorumqueue"] == answers["rabbitmq"]


PAGES = ["/api/queues?page=1&page_size=1&columns=name,vhost,type&name=mgmt",
         "/api/queues?page=2&page_size=1&columns=name&name=MGMT-",
         "/api/queues?page=1&name=%5Emgmt-q&use_regex=true&columns=name",
         "/api/queues?page=9&page_size=1&name=mgmt",
         "/api/queues?page=0", "/api/queues?page=1&page_size=600", "/api/queues?page=x",
         "/api/bindings?columns=source,destination&sort=destination&sort_reverse=true"]


@pytest.mark.parametrize("path", PAGES)
def test_filters_sorting_and_pages_are_rabbitmqs(both, path):
    answers = {name: _call(base, "GET", path) for name, (base, _rows) in both.items()}
    theirs, ours = answers["rabbitmq"], answers["quorumqueue"]
    if isinstance(theirs[1], dict) and "total_count" in theirs[1]:
        # other tests' queues may exist on one side only: compare what this state fixes
        assert set(ours[1]) == set(theirs[1])
        assert ours[1]["items"] == theirs[1]["items"]
        assert (ours[1]["filtered_count"], ours[1]["page"], ours[1]["page_size"]) == (
            theirs[1]["filtered_count"], theirs[1]["page"], theirs[1]["page_size"])
    elif path.startswith("/api/bindings"):
        assert [row for row in ours[1] if row["destination"].startswith("mgmt-")] == [
            row for row in theirs[1] if row["destination"].startswith("mgmt-")]
    else:
        assert ours == theirs


def test_operator_policies_are_rabbitmqs(both):
    """/api/operator-policies: the same codes and rows, and a queue both a policy and
    an operator policy match shows the same policy, operator_policy and merged
    effective_policy_definition (the lower max-length) as on RabbitMQ."""
    policy = {"pattern": "^mgmt-op$", "definition": {"max-length": 10},
              "apply-to": "queues", "priority": 0}
    operator = {"pattern": "^mgmt-op$", "definition": {"max-length": 3},
                "apply-to": "queues", "priority": 1}
    answers = {}
    for name, (base, _rows) in both.items():
        steps = [_call(base, "PUT", "/api/policies/%2F/mgmt-pol", policy)[0],
                 _call(base, "PUT", "/api/operator-policies/%2F/mgmt-op", operator)[0],
                 _call(base, "PUT", "/api/operator-policies/%2F/mgmt-op", operator)[0],
                 _call(base, "PUT", "/api/queues/%2F/mgmt-op", {"durable": True})[0],
                 _call(base, "GET", "/api/operator-policies/%2F"),
                 _call(base, "GET", "/api/operator-policies/%2F/mgmt-op")]
        row = wait_for(lambda base=base: (lambda r: r if r[1].get("operator_policy") else None)(
            _call(base, "GET", "/api/queues/%2F/mgmt-op")), f"{name}'s queue row")[1]
        steps.append({key: row[key] for key in ("policy", "operator_policy",
                                                 "effective_policy_definition")})
        steps += [_call(base, "DELETE", "/api/operator-policies/%2F/mgmt-op"),
                  _call(base, "DELETE", "/api/operator-policies/%2F/mgmt-op"),
                  _call(base, "GET", "/api/operator-policies/%2F/mgmt-op"),
                  _call(base, "DELETE", "/api/policies/%2F/mgmt-pol")[0],
                  _call(base, "DELETE", "/api/queues/%2F/mgmt-op")[0]]
        answers[name] = steps
    assert answers["quorumqueue"] == answers["rabbitmq"]
