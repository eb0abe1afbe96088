"""RabbitMQ 3.13's deprecated-feature switch for classic queue mirroring: off by
default (ha-* policy keys refused naming it); set to true, the node starts and the
ha-* keys are accepted, validated as RabbitMQ 3.13's rabbit_mirror_queue_misc does
(mirroring itself: tests/broker/cluster/test_mirrored_queues.py)."""

import subprocess
import sys

import pytest

from quorumqueue.broker.config import ConfigError, load_settings
from quorumqueue.broker.node.policies import PolicyError, parse_policy

CLI = [sys.executable, "-m", "quorumqueue.cli"]
KEY = "deprecated_features.permit.classic_queue_mirroring"


def write(tmp_path, text):
    path = tmp_path / "broker.toml"
    path.write_text(text)
    return str(path)


def test_the_switch_defaults_to_false_and_false_is_accepted(tmp_path):
    assert load_settings().permit_classic_queue_mirroring is False
    settings = load_settings(write(tmp_path, f"{KEY} = false\n"))
    assert settings.permit_classic_queue_mirroring is False


def test_the_switch_set_to_true_is_accepted(tmp_path):
    assert load_settings(write(tmp_path, f"{KEY} = true\n")).permit_classic_queue_mirroring


def test_the_switch_must_be_a_boolean(tmp_path):
    with pytest.raises(ConfigError, match=KEY.replace(".", r"\.")):
        load_settings(write(tmp_path, f'{KEY} = "yes"\n'))


def test_a_node_started_with_the_switch_on_starts(tmp_path):
    config = write(tmp_path, f"{KEY} = true\n")
    process = subprocess.Popen(CLI + ["broker", "start", "--config", config, "--port", "0",
                                      "--data-dir", str(tmp_path / "data")],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        seen = ""
        for line in process.stdout:  # ends if the process exits
            seen += line
            if "Server startup complete" in line:
                break
        assert "Server startup complete" in seen, seen
    finally:
        process.terminate()
        process.wait(timeout=60)


@pytest.mark.parametrize("key, value", [
    ("ha-mode", "all"), ("ha-params", 2), ("ha-sync-mode", "automatic"),
    ("ha-sync-batch-size", 10), ("ha-promote-on-shutdown", "always"),
    ("ha-promote-on-failure", "when-synced")])
def test_every_mirroring_policy_key_is_refused_naming_the_switch(key, value):
    with pytest.raises(PolicyError) as error:
        parse_policy("/", "ha", ".*", {key: value})
    message = str(error.value)
    assert f"key '{key}'" in message
    assert KEY in message
    assert "deprecated" in message and "4.0" in message and "quorum queues" in message


VALID = [
    {"ha-mode": "all"},
    {"ha-mode": "exactly", "ha-params": 2, "ha-sync-mode": "automatic"},
    {"ha-mode": "nodes", "ha-params": ["rabbit@nodeA", "rabbit@nodeB"]},
    {"ha-mode": "exactly", "ha-params": 3, "ha-sync-mode": "manual",
     "ha-sync-batch-size": 50000, "ha-promote-on-shutdown": "always",
     "ha-promote-on-failure": "when-synced"},
]


@pytest.mark.parametrize("definition", VALID)
def test_with_the_switch_on_the_guides_policies_are_accepted(definition):
    policy = parse_policy("/", "ha", "^ha\\.", definition, permit_mirroring=True)
    assert dict(policy.definition) == definition


# RabbitMQ 3.13's rabbit_mirror_queue_misc:validate_policy and its mode modules' texts
INVALID = [
    ({"ha-params": 2}, "ha-mode must be specified to specify ha-params, ha-sync-mode or "
                       "ha-promote-on-shutdown"),
    ({"ha-mode": "some"}, '<<"some">> is not a valid ha-mode value'),
    ({"ha-mode": "all", "ha-params": 2}, 'ha-mode="all" does not take parameters'),
    ({"ha-mode": "exactly"}, 'ha-mode="exactly" takes an integer, none given'),
    ({"ha-mode": "exactly", "ha-params": 0}, 'ha-mode="exactly" takes an integer, 0 given'),
    ({"ha-mode": "exactly", "ha-params": "2"},
     'ha-mode="exactly" takes an integer, <<"2">> given'),
    ({"ha-mode": "nodes", "ha-params": []}, 'ha-mode="nodes" list must be non-empty'),
    ({"ha-mode": "nodes", "ha-params": "rabbit@a"},
     'ha-mode="nodes" takes a list, <<"rabbit@a">> given'),
    ({"ha-mode": "nodes", "ha-params": ["rabbit@a", 1]},
     'ha-mode="nodes" takes a list of strings, [1] given'),
    ({"ha-mode": "all", "ha-sync-mode": "auto"},
     'ha-sync-mode must be "manual" or "automatic", got <<"auto">>'),
    ({"ha-mode": "all", "ha-sync-batch-size": 0},
     "ha-sync-batch-size takes an integer greater than 0, 0 given"),
    ({"ha-mode": "all", "ha-promote-on-shutdown": "never"},
     'ha-promote-on-shutdown must be "always" or "when-synced", got <<"never">>'),
    ({"ha-mode": "all", "ha-promote-on-failure": True},
     'ha-promote-on-failure must be "always" or "when-synced", got true'),
]


@pytest.mark.parametrize("definition, message", INVALID)
def test_with_the_switch_on_invalid_mirroring_keys_are_refused_as_rabbitmq_does(
        definition, message):
    with pytest.raises(PolicyError) as error:
        parse_policy("/", "ha", ".*", definition, permit_mirroring=True)
    assert str(error.value) == f"policy 'ha' in vhost '/': Validation failed: {message}"


@pytest.mark.parametrize("apply_to", ["exchanges", "quorum_queues"])
def test_with_the_switch_on_mirroring_keys_apply_to_classic_queues_only(apply_to):
    with pytest.raises(PolicyError, match="applies to classic queues only"):
        parse_policy("/", "ha", ".*", {"ha-mode": "all"}, apply_to=apply_to,
                     permit_mirroring=True)


def test_mirroring_sync_batch_size_is_the_default_batch_and_bounded_as_rabbitmq_does(
        tmp_path):
    """The mirroring guide's "Batch Synchronization": "If no value is set
    mirroring_sync_batch_size is used as the default value" (RabbitMQ's default
    4096; its schema's bounds: above 0, at most 1M)."""
    assert load_settings().mirroring_sync_batch_size == 4096
    assert load_settings(write(tmp_path, "mirroring_sync_batch_size = 50000\n")
                         ).mirroring_sync_batch_size == 50000
    for bad in ("0", "1000001", '"big"'):
        with pytest.raises(ConfigError, match="mirroring_sync_batch_size: batch size "
                                              "should be greater than 0 and less than 1M"):
            load_settings(write(tmp_path, f"mirroring_sync_batch_size = {bad}\n"))


def test_a_running_node_without_the_switch_refuses_the_guides_policies(fresh_broker):
    """With the switch off (the default), the guide's own example, through `ctl
    set_policy` and the HTTP API, is refused with a message naming the switch; no
    policy is stored."""
    from click.testing import CliRunner

    from quorumqueue.cli.main import main
    from tests.broker.management.support import call

    url = fresh_broker.management_url
    result = CliRunner().invoke(main, [
        "ctl", "set_policy", "--base-uri", url, "ha-two", r"^two\.",
        '{"ha-mode":"exactly","ha-params":2,"ha-sync-mode":"automatic"}'])
    assert result.exit_code != 0
    assert "key 'ha-mode'" in result.output and KEY in result.output, result.output
    status, body, _ = call(url, "PUT", "/api/policies/%2f/ha-all",
                           {"pattern": r"^ha\.", "definition": {"ha-mode": "all"}})
    assert status == 400 and KEY in body["reason"], body
    status, body, _ = call(url, "GET", "/api/policies/%2f")
    assert status == 200 and body == [], body
