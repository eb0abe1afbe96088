"""Definitions in RabbitMQ's JSON format on running nodes (`quorumqueue ctl
export_definitions` / `import_definitions`, node/definitions_json.py): an export
imported into a fresh node exports the same again and gives clients the same
objects; users imported with RabbitMQ's password hashes log in; a bad file is refused
with a message naming what is wrong, and nothing of it is applied."""

from __future__ import annotations

import base64
import hashlib
import json

import pika
import pytest
from click.testing import CliRunner

from quorumqueue.cli.main import main
from quorumqueue.client.management import call
from tests.support.broker import BrokerProcess

from .pika_support import get_bodies, publish_bodies
from .test_definitions import ctl, open_as

pytestmark = pytest.mark.timeout(180)


def build_world(broker) -> None:
    """A bit of everything the format holds."""
    ctl(broker, "add_user", "ann", "ann-pw")
    ctl(broker, "set_user_tags", "ann", "monitoring")
    ctl(broker, "set_user_limits", "ann", '{"max-connections": 4}')
    ctl(broker, "add_vhost", "shop")
    ctl(broker, "set_vhost_limits", "-p", "shop", '{"max-queues": 50}')
    ctl(broker, "set_permissions", "-p", "shop", "ann", "^ann-", ".*", "^(ann-|orders)")
    ctl(broker, "set_permissions", "-p", "shop", "guest", ".*", ".*", ".*")
    ctl(broker, "set_policy", "-p", "shop", "--priority", "2", "--apply-to", "quorum_queues",
        "qq", "^orders", '{"max-length": 100, "delivery-limit": 7}')
    ctl(broker, "set_operator_policy", "-p", "shop", "--apply-to", "queues", "cap", ".*",
        '{"max-length": 50}')
    connection = pika.BlockingConnection(pika.URLParameters(
        f"amqp://guest:guest@127.0.0.1:{broker.port}/shop"))
    channel = connection.channel()
    channel.exchange_declare("events", "topic", durable=True)
    channel.exchange_declare("audit", "fanout", durable=True, internal=True)
    channel.exchange_declare("by-header", "headers", durable=True,
                             arguments={"alternate-exchange": "audit"})
    channel.queue_declare("orders", durable=True, arguments={"x-queue-type": "quorum",
                                                             "x-max-length": 1000})
    channel.queue_declare("audit-log", durable=True)
    channel.queue_declare("scratch", durable=False, auto_delete=True)
    channel.queue_declare("mine", exclusive=True)  # not exported, as in RabbitMQ
    channel.queue_bind("orders", "events", "order.#")
    channel.queue_bind("audit-log", "audit")
    channel.exchange_bind("audit", "events", "#")
    channel.queue_bind("scratch", "by-header", "",
                       arguments={"x-match": "all", "kind": "test", "n": 3})
    connection.close()


def export(broker) -> dict:
    return json.loads(ctl(broker, "export_definitions", "-"))


def import_file(broker, path) -> str:
    return ctl(broker, "import_definitions", str(path))


def test_an_export_imported_into_a_fresh_node_exports_the_same(broker, tmp_path):
    build_world(broker)
    path = tmp_path / "defs.json"
    assert "Exporting definitions in JSON" in ctl(broker, "export_definitions", str(path))
    exported = json.loads(path.read_text())
    assert exported["product_name"] == "quorumqueue" and exported["rabbitmq_version"]
    assert [q["name"] for q in exported["queues"] if q["vhost"] == "shop"] == [
        "audit-log", "orders", "scratch"]
    assert {"vhost": "shop", "component": "operator_policy", "name": "cap",
            "value": {"pattern": ".*", "definition": {"max-length": 50}, "priority": 0,
                      "apply-to": "queues"}} in exported["parameters"]
    ann = next(u for u in exported["users"] if u["name"] == "ann")
    assert ann["hashing_algorithm"] == "rabbit_password_hashing_sha256"
    assert ann["limits"] == {"max-connections": 4} and ann["tags"] == ["monitoring"]
    with BrokerProcess() as fresh:
        out = import_file(fresh, path)
        assert "Imported" in out
        assert export(fresh) == exported
        # a client of the new node sees the same objects
        connection = open_as(fresh, "ann", "ann-pw", "shop")
        channel = connection.channel()
        channel.queue_declare("orders", passive=True)
        channel.exchange_declare("events", passive=True)
        channel.confirm_delivery()
        channel.basic_publish("events", "order.new", b"o1",
                              pika.BasicProperties(delivery_mode=2))
        assert get_bodies(channel, "orders") == [b"o1"]
        connection.close()
        guest = pika.BlockingConnection(pika.URLParameters(
            f"amqp://guest:guest@127.0.0.1:{fresh.port}/shop"))
        channel = guest.channel()
        channel.basic_publish("events", "anything", b"a1")  # events -> audit -> audit-log
        channel.basic_publish("by-header", "", b"h1",
                              pika.BasicProperties(headers={"kind": "test", "n": 3}))
        assert get_bodies(channel, "audit-log") == [b"o1", b"a1"]  # every events message
        assert get_bodies(channel, "scratch") == [b"h1"]
        guest.close()
        rows = {row["name"]: row for row in call(fresh.uri, "queues.list", vhost="shop")}
        assert rows["orders"]["type"] == "quorum"
        assert rows["orders"]["effective_policy_definition"] == {"max-length": 50,
                                                                 "delivery-limit": 7}
        # importing again changes nothing and says what it kept
        again = import_file(fresh, path)
        assert "note: queue 'orders' in vhost 'shop' exists: kept as it is" in again
        assert export(fresh) == exported


def rabbitmq_hash(password: str, algorithm: str, salt: bytes = b"\x01\x02\x03\x04") -> str:
    """rabbit_password:hash/2: base64(salt || H(salt || password))."""
    return base64.b64encode(salt + hashlib.new(algorithm, salt + password.encode()).digest()
                            ).decode()


def test_users_imported_with_rabbitmq_hashes_log_in(broker, tmp_path):
    """rabbit_password_hashing_sha256 (RabbitMQ's default), _sha512 and the pre-3.6
    _md5 (also what a file of RabbitMQ 3.5 or older names none for); a user with no
    hash cannot log in with any password."""
    users = [{"name": "h-sha256", "password_hash": rabbitmq_hash("p256", "sha256"),
              "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": []},
             {"name": "h-sha512", "password_hash": rabbitmq_hash("p512", "sha512"),
              "hashing_algorithm": "rabbit_password_hashing_sha512", "tags": ""},
             {"name": "h-md5", "password_hash": rabbitmq_hash("pmd5", "md5"),
              "hashing_algorithm": "rabbit_password_hashing_md5",
              "tags": "administrator,management"},
             {"name": "h-none", "password_hash": "", "tags": []},
             {"name": "h-plain", "password": "clear", "tags": []}]
    permissions = [{"user": u["name"], "vhost": "/", "configure": ".*", "write": ".*",
                    "read": ".*"} for u in users]
    path = tmp_path / "users.json"
    path.write_text(json.dumps({"rabbitmq_version": "3.10.8", "users": users,
                                "permissions": permissions}))
    import_file(broker, path)
    for name, password in (("h-sha256", "p256"), ("h-sha512", "p512"), ("h-md5", "pmd5"),
                           ("h-plain", "clear")):
        open_as(broker, name, password).close()
        with pytest.raises(pika.exceptions.ProbableAuthenticationError):
            open_as(broker, name, password + "x")
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        open_as(broker, "h-none", "")
    assert ["administrator", "management"] == next(
        u["tags"] for u in call(broker.uri, "users.list") if u["name"] == "h-md5")
    exported = {u["name"]: u for u in export(broker)["users"]}
    assert exported["h-sha512"]["hashing_algorithm"] == "rabbit_password_hashing_sha512"
    assert exported["h-sha512"]["password_hash"] == users[1]["password_hash"]
    # a file from RabbitMQ 3.5 or older names no algorithm: md5, as RabbitMQ reads it
    path.write_text(json.dumps({"rabbit_version": "3.5.7", "users": [
        {"name": "h-old", "password_hash": rabbitmq_hash("old", "md5"), "tags": ""}],
        "permissions": [{"user": "h-old", "vhost": "/", "configure": "", "write": "",
                         "read": ""}]}))
    import_file(broker, path)
    open_as(broker, "h-old", "old").close()


BAD = [
    ("[1, 2]", "the definitions must be a JSON object"),
    ('{"users": {}}', "'users' must be a list, got dict"),
    ('{"users": [{"name": "z"}]}', "users[0] ('z'): 'tags' is missing"),
    ('{"users": [{"name": "z", "tags": [], "password_hash": "***"}]}',
     "users[0] ('z'): 'password_hash' is not base64"),
    ('{"users": [{"name": "z", "tags": [], "password_hash": "AAAA",'
     ' "hashing_algorithm": "rabbit_password_hashing_sha256"}]}',
     "users[0] ('z'): 'password_hash' is 3 bytes, not a rabbit_password_hashing_sha256 hash"),
    ('{"users": [{"name": "z", "tags": [], "password_hash": "",'
     ' "hashing_algorithm": "rabbit_password_hashing_bcrypt"}]}',
     "hashing algorithm 'rabbit_password_hashing_bcrypt' is not supported"),
    ('{"permissions": [{"user": "nobody", "vhost": "/", "configure": "", "write": "",'
     ' "read": ""}]}', "permissions[0]: no user 'nobody'"),
    ('{"queues": [{"vhost": "nov", "name": "q", "durable": true, "auto_delete": false,'
     ' "arguments": {}}]}',
     "queues[0] ('q'): virtual host 'nov' does not exist and is not in the definitions"),
    ('{"queues": [{"vhost": "/", "name": "q", "type": "quorum", "durable": false,'
     ' "auto_delete": false, "arguments": {}}]}',
     "queues[0] ('q'): invalid property 'non-durable' for queue 'q' in vhost '/'"),
    ('{"policies": [{"vhost": "/", "name": "ha", "pattern": ".*",'
     ' "definition": {"ha-mode": "all"}}]}',
     "policies[0] ('ha'): policy 'ha' in vhost '/': key 'ha-mode' is classic queue mirroring"),
    ('{"parameters": [{"vhost": "/", "component": "federation-upstream", "name": "u",'
     ' "value": {"uri": "amqp://x"}}]}',
     "component 'federation-upstream' are not supported by quorumqueue"),
    ('{"parameters": [{"vhost": "/", "component": "operator_policy", "name": "o",'
     ' "value": {"pattern": ".*", "definition": {"dead-letter-exchange": "x"}}}]}',
     "'dead-letter-exchange' is not a recognised operator policy setting"),
    ('{"exchanges": [{"vhost": "/", "name": "x", "type": "x-delayed-message",'
     ' "durable": true, "auto_delete": false, "arguments": {}}]}',
     "exchanges[0] ('x'): exchange type 'x-delayed-message' is not supported"),
    ('{"bindings": [{"vhost": "/", "source": "nox", "destination": "q",'
     ' "destination_type": "queue", "routing_key": "", "arguments": {}}]}',
     "bindings[0]: no exchange 'nox' in vhost '/'"),
    ('{"topic_permissions": [{"user": "guest", "vhost": "/", "exchange": "amq.topic",'
     ' "write": ".*", "read": ".*"}]}', "topic permissions"),
    ('{"vhosts": [{"name": "dq", "metadata": {"default_queue_type": "quorum"}}]}',
     "vhosts[0] ('dq'): default queue type 'quorum' is not supported"),
    ('{"global_parameters": [{"name": "mqtt_port_to_vhost_mapping", "value": {}}]}',
     "global parameter 'mqtt_port_to_vhost_mapping' is not supported"),
]


@pytest.mark.parametrize("text, message", BAD, ids=[m[:40] for _t, m in BAD])
def test_a_bad_file_is_refused_naming_what_is_wrong_and_nothing_is_applied(
        broker, tmp_path, text, message):
    path = tmp_path / "bad.json"
    # a vhost first in the file: refused with the rest, it is not created
    document = json.loads(text)
    if isinstance(document, dict):
        document.setdefault("vhosts", []).append({"name": "should-not-exist"})
    path.write_text(json.dumps(document))
    result = CliRunner().invoke(main, ["ctl", "import_definitions", str(path),
                                       "--base-uri", broker.management_url])
    assert result.exit_code != 0
    assert "invalid definitions: " in result.output and message in result.output, \
        result.output
    assert "should-not-exist" not in ctl(broker, "list_vhosts")


def test_a_file_that_is_not_json_or_not_there_is_refused(broker, tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"users": [')
    result = CliRunner().invoke(main, ["ctl", "import_definitions", str(path),
                                       "--base-uri", broker.management_url])
    assert result.exit_code != 0 and f"{path} is not JSON: Expecting value: line 1" \
        in result.output
    result = CliRunner().invoke(main, ["ctl", "import_definitions", str(tmp_path / "none"),
                                       "--base-uri", broker.management_url])
    assert result.exit_code != 0 and "No such file or directory" in result.output


def test_import_reads_standard_input(broker):
    document = {"vhosts": [{"name": "from-stdin"}],
                "queues": [{"vhost": "from-stdin", "name": "q", "type": "classic",
                            "durable": True, "auto_delete": False, "arguments": {}}]}
    result = CliRunner().invoke(main, ["ctl", "import_definitions", "-", "--base-uri", broker.management_url],
                                input=json.dumps(document))
    assert result.exit_code == 0, result.output
    # stdout says what was done, as before; stderr (not a terminal here) the
    # progress, one line per section imported, in the import's order
    assert result.stdout.splitlines() == [
        'Importing definitions in JSON from a file at "-" ...', "Imported 2 definitions."]
    assert result.stderr.splitlines() == ["import_definitions: 1/2 vhosts (1)",
                                          "import_definitions: 2/2 queues (1)"]
    assert "from-stdin" in ctl(broker, "list_vhosts")
    ctl(broker, "set_permissions", "-p", "from-stdin", "guest", ".*", ".*", ".*")
    assert [row["name"] for row in call(broker.uri, "queues.list", vhost="from-stdin")] \
        == ["q"]
    publish = pika.BlockingConnection(pika.URLParameters(
        f"amqp://guest:guest@127.0.0.1:{broker.port}/from-stdin"))
    publish_bodies(publish.channel(), "q", [b"in"])
    publish.close()


def test_imported_users_and_operator_policies_survive_a_restart(fresh_broker, tmp_path):
    broker = fresh_broker
    path = tmp_path / "defs.json"
    path.write_text(json.dumps({
        "users": [{"name": "kept-512", "password_hash": rabbitmq_hash("s", "sha512"),
                   "hashing_algorithm": "rabbit_password_hashing_sha512", "tags": []}],
        "permissions": [{"user": "kept-512", "vhost": "/", "configure": ".*", "write": ".*",
                         "read": ".*"}],
        "parameters": [{"vhost": "/", "component": "operator_policy", "name": "op",
                        "value": {"pattern": "^x", "definition": [["max-length", 9]]}}]}))
    import_file(broker, path)
    before = export(broker)
    broker.restart()
    assert export(broker) == before
    open_as(broker, "kept-512", "s").close()


def test_one_vhosts_definitions_move_into_another_vhost(broker, tmp_path):
    """RabbitMQ's single_virtual_host format (/api/definitions/VHOST): items without a
    vhost, imported into the vhost named at import."""
    ctl(broker, "add_vhost", "src-v")
    ctl(broker, "add_vhost", "dst-v")
    ctl(broker, "set_vhost_limits", "-p", "src-v", '{"max-queues": 9}')
    ctl(broker, "set_policy", "-p", "src-v", "--apply-to", "queues", "p", "^q", '{"max-length": 3}')
    ctl(broker, "set_permissions", "-p", "src-v", "guest", ".*", ".*", ".*")
    connection = pika.BlockingConnection(pika.URLParameters(
        f"amqp://guest:guest@127.0.0.1:{broker.port}/src-v"))
    channel = connection.channel()
    channel.exchange_declare("vx", "direct", durable=True)
    channel.queue_declare("q1", durable=True)
    channel.queue_bind("q1", "vx", "k")
    connection.close()
    path = tmp_path / "vhost.json"
    ctl(broker, "export_definitions", "-p", "src-v", str(path))
    document = json.loads(path.read_text())
    assert document["rabbitmq_definition_format"] == "single_virtual_host"
    assert document["limits"] == {"max-queues": 9}
    assert "users" not in document and all("vhost" not in q for q in document["queues"])
    ctl(broker, "import_definitions", "-p", "dst-v", str(path))
    moved = json.loads(ctl(broker, "export_definitions", "-p", "dst-v", "-"))
    for key in ("limits", "parameters", "policies", "queues", "exchanges", "bindings"):
        assert moved[key] == document[key], key
    result = CliRunner().invoke(main, ["ctl", "import_definitions", "-p", "nowhere",
                                       str(path), "--base-uri", broker.management_url])
    assert result.exit_code != 0 and "no vhost 'nowhere'" in result.output


def test_what_is_not_kept_is_said(broker, tmp_path):
    """RabbitMQ's cluster_name global parameter and vhost metadata: noted, not applied
    (a node's cluster name is its configuration's; vhosts have no metadata here)."""
    path = tmp_path / "notes.json"
    path.write_text(json.dumps({
        "global_parameters": [{"name": "cluster_name", "value": "rabbit@elsewhere"},
                              {"name": "internal_cluster_id", "value": "rabbitmq-cluster-id-x"}],
        "vhosts": [{"name": "noted", "limits": [],
                    "metadata": {"description": "Orders", "tags": ["prod"]}}]}))
    out = import_file(broker, path)
    assert ("note: global parameter cluster_name 'rabbit@elsewhere' is not applied: this "
            "node's cluster name is 'quorumqueue', from its configuration") in out
    assert "note: vhost 'noted': its description and tags are not kept" in out
    assert "noted" in ctl(broker, "list_vhosts")
