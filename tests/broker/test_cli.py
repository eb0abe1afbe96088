"""`quorumqueue broker start`: one node in the foreground, logs to stderr, stops
cleanly on SIGTERM and SIGINT, and refuses bad configuration naming the key."""

import signal
import subprocess
import sys

import pika
import pytest

from tests.support.broker import BrokerProcess

CLI = [sys.executable, "-m", "quorumqueue.broker.cli"]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_stops_cleanly_on_signal_and_closes_clients_with_320(signum, tmp_path):
    broker = BrokerProcess(data_dir=str(tmp_path)).start()
    try:
        connection = pika.BlockingConnection(pika.URLParameters(broker.uri))
        broker.process.send_signal(signum)
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
            connection.process_data_events(time_limit=5)
            connection.channel()
        assert closed.value.reply_code == 320
        assert "CONNECTION_FORCED" in closed.value.reply_text
        assert broker.process.wait(10) == 0
    finally:
        broker.stop()
    log = broker.log()
    assert "Server startup complete" in log
    assert "stopped" in log


def test_unknown_config_key_is_refused_at_start(tmp_path):
    config = tmp_path / "broker.toml"
    config.write_text("heartbeet = 10\n")
    result = subprocess.run(CLI + ["broker", "start", "--config", str(config)],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert "unknown key 'heartbeet'" in result.stderr


def test_port_in_use_is_explained(tmp_path):
    with BrokerProcess(data_dir=str(tmp_path / "a")) as first:
        result = subprocess.run(CLI + ["broker", "start", "--port", str(first.port),
                                       "--data-dir", str(tmp_path / "b")],
                                capture_output=True, text=True, timeout=30)
    assert result.returncode == 1
    assert "--port" in result.stderr
