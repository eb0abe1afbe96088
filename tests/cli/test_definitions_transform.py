"""The blue-green migration transformations (cli/definitions_transform.py), as
rabbitmqadmin v2 names them, on definitions shaped like RabbitMQ 3.13's export, and
`quorumqueue ctl transform_definitions` on a file (no node needed)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from quorumqueue.cli.main import main
from quorumqueue.cli.definitions_transform import (TransformationError, parse_names,
                                                      transform)


def rabbitmq_313_export() -> dict:
    return {
        "rabbit_version": "3.13.7",
        "vhosts": [{"name": "/"}, {"name": "shop"}],
        "policies": [
            {"vhost": "/", "name": "ha-all", "pattern": "^orders", "apply-to": "queues",
             "priority": 0, "definition": {"ha-mode": "all", "ha-sync-mode": "automatic"}},
            {"vhost": "/", "name": "ha-and-limit", "pattern": "^audit",
             "apply-to": "all", "priority": 1,
             "definition": {"ha-mode": "exactly", "ha-params": 2, "max-length": 10,
                            "queue-mode": "lazy", "overflow": "reject-publish-dlx"}},
            {"vhost": "/", "name": "lazy", "pattern": "^lazy", "apply-to": "queues",
             "priority": 0, "definition": {"queue-mode": "lazy"}},
            {"vhost": "shop", "name": "ha-shop", "pattern": ".*", "apply-to": "queues",
             "priority": 0, "definition": {"ha-mode": "all",
                                           "queue-master-locator": "min-masters"}},
            {"vhost": "/", "name": "ttl", "pattern": ".*", "apply-to": "queues",
             "priority": 0, "definition": {"message-ttl": 1000}},
        ],
        "queues": [
            {"vhost": "/", "name": "orders", "type": "classic", "durable": True,
             "auto_delete": False,
             "arguments": {"x-queue-mode": "lazy", "x-max-priority": 5,
                           "x-queue-version": 2, "x-queue-master-locator": "random",
                           "x-max-length": 7}},
            {"vhost": "/", "name": "audit-log", "durable": True, "auto_delete": False,
             "arguments": {"x-overflow": "reject-publish-dlx"}},
            {"vhost": "/", "name": "orders-scratch", "type": "classic", "durable": False,
             "auto_delete": True, "arguments": {}},
            {"vhost": "/", "name": "plain", "type": "classic", "durable": True,
             "auto_delete": False, "arguments": {"x-queue-mode": "lazy"}},
            {"vhost": "/", "name": "lazy-one", "type": "classic", "durable": True,
             "auto_delete": False, "arguments": {}},
            {"vhost": "shop", "name": "carts", "type": "classic", "durable": True,
             "auto_delete": False, "arguments": {}},
            {"vhost": "/", "name": "orders-qq", "type": "quorum", "durable": True,
             "auto_delete": False, "arguments": {"x-queue-type": "quorum"}},
        ],
    }


def by_name(items):
    return {(item.get("vhost"), item["name"]): item for item in items}


FULL = ["prepare_for_quorum_queue_migration", "strip_cmq_keys_from_policies",
        "drop_empty_policies"]


def test_prepare_for_quorum_queue_migration():
    original = rabbitmq_313_export()
    result, notes = transform(original, ["prepare_for_quorum_queue_migration"])
    assert original == rabbitmq_313_export()  # the input is left alone
    queues = by_name(result["queues"])
    orders = queues[("/", "orders")]
    # matched by a mirroring policy, durable: a quorum queue without the refused args
    assert orders["type"] == "quorum"
    assert orders["arguments"] == {"x-queue-type": "quorum", "x-max-length": 7}
    audit = queues[("/", "audit-log")]
    assert audit["arguments"] == {"x-queue-type": "quorum", "x-overflow": "reject-publish"}
    assert queues[("shop", "carts")]["arguments"] == {"x-queue-type": "quorum"}
    # not durable: cannot be a quorum queue, stays classic, and a note says so
    assert queues[("/", "orders-scratch")]["type"] == "classic"
    assert "x-queue-type" not in queues[("/", "orders-scratch")]["arguments"]
    assert [n for n in notes if "'orders-scratch'" in n and "durable" in n]
    # matched by no mirroring policy: untouched (a plain classic queue stays one)
    assert queues[("/", "plain")] == by_name(original["queues"])[("/", "plain")]
    assert queues[("/", "lazy-one")]["type"] == "classic"
    assert queues[("/", "orders-qq")] == by_name(original["queues"])[("/", "orders-qq")]
    policies = by_name(result["policies"])
    assert policies[("/", "ha-all")]["definition"] == {}
    assert policies[("/", "ha-and-limit")]["definition"] == {
        "max-length": 10, "overflow": "reject-publish"}
    assert policies[("/", "lazy")]["definition"] == {}
    assert policies[("shop", "ha-shop")]["definition"] == {}
    assert policies[("/", "ttl")]["definition"] == {"message-ttl": 1000}


def test_strip_cmq_keys_from_policies_only_removes_mirroring_keys():
    result, _ = transform(rabbitmq_313_export(), ["strip_cmq_keys_from_policies"])
    policies = by_name(result["policies"])
    assert policies[("/", "ha-all")]["definition"] == {}
    assert policies[("/", "ha-and-limit")]["definition"] == {
        "max-length": 10, "queue-mode": "lazy", "overflow": "reject-publish-dlx"}
    assert policies[("/", "lazy")]["definition"] == {"queue-mode": "lazy"}
    # as rabbitmqadmin v2: the queues those policies matched become quorum queues
    assert by_name(result["queues"])[("/", "orders")]["type"] == "quorum"


def test_drop_empty_policies_keeps_the_others():
    stripped, _ = transform(rabbitmq_313_export(), ["strip_cmq_keys_from_policies"])
    result, _ = transform(stripped, ["drop_empty_policies"])
    assert sorted(p["name"] for p in result["policies"]) == ["ha-and-limit", "lazy", "ttl"]
    untouched, _ = transform(rabbitmq_313_export(), ["drop_empty_policies"])
    assert len(untouched["policies"]) == 5


def test_the_full_chain_leaves_no_mirroring_key_and_no_empty_policy():
    result, _ = transform(rabbitmq_313_export(), FULL)
    assert sorted(p["name"] for p in result["policies"]) == ["ha-and-limit", "ttl"]
    text = json.dumps(result)
    assert "ha-" not in text.replace("ha-and-limit", "") and "master-locator" not in text


def test_a_single_vhost_export_has_no_vhost_fields_and_still_converts():
    document = {"policies": [{"name": "ha", "pattern": ".*", "apply-to": "all",
                              "definition": {"ha-mode": "all"}}],
                "queues": [{"name": "q", "durable": True, "auto_delete": False,
                            "arguments": {}}]}
    result, _ = transform(document, FULL)
    assert result["policies"] == []
    assert result["queues"][0]["arguments"] == {"x-queue-type": "quorum"}


def test_a_policy_for_exchanges_or_quorum_queues_converts_nothing():
    document = rabbitmq_313_export()
    document["policies"][0]["apply-to"] = "exchanges"
    result, _ = transform(document, ["strip_cmq_keys_from_policies"])
    assert by_name(result["queues"])[("/", "orders")]["type"] == "classic"


def test_unknown_names_are_refused():
    assert parse_names(" prepare_for_quorum_queue_migration,drop_empty_policies ") == [
        "prepare_for_quorum_queue_migration", "drop_empty_policies"]
    with pytest.raises(TransformationError, match="obfuscate_usernames"):
        parse_names("drop_empty_policies,obfuscate_usernames")
    with pytest.raises(TransformationError, match="none given"):
        parse_names(",")


def test_ctl_transform_definitions_reads_and_writes_files(tmp_path):
    source = tmp_path / "rabbitmq.json"
    source.write_text(json.dumps(rabbitmq_313_export()))
    target = tmp_path / "out.json"
    result = CliRunner().invoke(main, ["ctl", "transform_definitions", "--transformations",
                                       ",".join(FULL), str(source), str(target)])
    assert result.exit_code == 0, result.output
    assert json.loads(target.read_text()) == transform(rabbitmq_313_export(), FULL)[0]
    assert "'orders-scratch'" in result.output  # the note on the queue left classic
    bad = CliRunner().invoke(main, ["ctl", "transform_definitions", "--transformations",
                                    "nope", str(source), "-"])
    assert bad.exit_code != 0 and "unknown transformation(s) nope" in bad.output
