"""RabbitMQ 3.13's deprecated-feature switch for classic queue mirroring: off by
default (ha-* policy keys refused naming it), and refused when set to true, since
quorumqueue does not implement mirroring (never accepted and ignored)."""

import subprocess
import sys

import pytest

from quorumqueue.broker.config import ConfigError, load_settings
from quorumqueue.broker.node.policies import PolicyError, parse_policy

CLI = [sys.executable, "-m", "quorumqueue.broker.cli"]
KEY = "deprecated_features.permit.classic_queue_mirroring"


def write(tmp_path, text):
    path = tmp_path / "broker.toml"
    path.write_text(text)
    return str(path)


def test_the_switch_defaults_to_false_and_false_is_accepted(tmp_path):
    assert load_settings().permit_classic_queue_mirroring is False
    settings = load_settings(write(tmp_path, f"{KEY} = false\n"))
    assert settings.permit_classic_queue_mirroring is False


def test_the_switch_set_to_true_is_refused_saying_mirroring_is_not_implemented(tmp_path):
    with pytest.raises(ConfigError) as error:
        load_settings(write(tmp_path, f"{KEY} = true\n"))
    message = str(error.value)
    assert message.startswith(KEY)
    assert "does not implement" in message and "quorum queues" in message


def test_the_switch_must_be_a_boolean(tmp_path):
    with pytest.raises(ConfigError, match=KEY.replace(".", r"\.")):
        load_settings(write(tmp_path, f'{KEY} = "yes"\n'))


def test_a_node_started_with_the_switch_on_fails_at_start(tmp_path):
    config = write(tmp_path, f"{KEY} = true\n")
    result = subprocess.run(CLI + ["broker", "start", "--config", config, "--port", "0",
                                   "--data-dir", str(tmp_path / "data")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "classic queue mirroring" in result.stderr
    assert "does not implement" in result.stderr
    assert "Server startup complete" not in result.stdout + result.stderr


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
