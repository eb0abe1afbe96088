"""`quorumqueue broker start`: one node in the foreground, logs to stderr, stops
cleanly on SIGTERM and SIGINT, and refuses bad configuration naming the key."""

import signal
import subprocess
import sys

import pika
import pytest

from tests.support.broker import BrokerProcess

CLI = [sys.executable, "-m", "quorumqueue.cli"]
# the bound on a command-line run that must end by itself (a `broker start` refused
# for an option or a taken port, a `queues`, `ctl` or `cluster` command): a Python
# program's start took over 30 s on the test machine at a load average of 25, and
# the answer, not its speed, is what these tests check
STARTS = 120


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
                            capture_output=True, text=True, timeout=STARTS)
    assert result.returncode == 2
    assert "unknown key 'heartbeet'" in result.stderr


def test_broker_start_is_the_brokers_own_program_with_its_options():
    """`quorumqueue broker start` runs `python -m quorumqueue.broker start` in its place
    (the command line imports no broker module): its options and help are the
    broker's."""
    result = subprocess.run(CLI + ["broker", "start", "--help"], capture_output=True,
                            text=True, timeout=STARTS)
    assert result.returncode == 0, result.stderr
    assert "Usage: quorumqueue broker start [OPTIONS]" in result.stdout
    assert "--cluster-nodes" in result.stdout and "--data-dir" in result.stdout
    result = subprocess.run(CLI + ["broker", "start", "--no-such-option"],
                            capture_output=True, text=True, timeout=STARTS)
    assert result.returncode == 2
    assert "No such option" in result.stderr and "--no-such-option" in result.stderr


def test_port_in_use_is_explained(tmp_path):
    with BrokerProcess(data_dir=str(tmp_path / "a")) as first:
        result = subprocess.run(CLI + ["broker", "start", "--port", str(first.port),
                                       "--data-dir", str(tmp_path / "b")],
                                capture_output=True, text=True, timeout=STARTS)
    assert result.returncode == 1
    assert "--port" in result.stderr


def run_cli(*arguments):
    return subprocess.run(CLI + list(arguments), capture_output=True, text=True,
                          timeout=STARTS)


def test_queues_list_purge_delete_against_a_running_node(broker):
    """`quorumqueue queues list|purge|delete`, like rabbitmq-queues/rabbitmqctl."""
    connection = pika.BlockingConnection(pika.URLParameters(broker.uri))
    channel = connection.channel()
    channel.queue_declare("cli-orders", durable=True)
    for _ in range(3):
        channel.basic_publish("", "cli-orders", b"12345")
    connection.close()
    listed = run_cli("queues", "list", "--base-uri", broker.management_url)
    assert listed.returncode == 0, listed.stderr
    header, *rows = listed.stdout.splitlines()
    assert header.split() == ["vhost", "name", "type", "ready", "unacked", "consumers",
                              "leader", "members", "bytes"]
    row = next(r.split() for r in rows if r.split()[1] == "cli-orders")
    assert row[2:6] == ["classic", "3", "0", "0"] and row[-1] == "15"
    purged = run_cli("queues", "purge", "--base-uri", broker.management_url, "cli-orders")
    assert "purged 3 messages" in purged.stdout
    refused = run_cli("queues", "delete", "--base-uri", broker.management_url, "no-such-queue")
    assert refused.returncode == 1
    assert "NOT_FOUND - no queue 'no-such-queue' in vhost '/'" in refused.stderr
    deleted = run_cli("queues", "delete", "--base-uri", broker.management_url, "cli-orders")
    assert deleted.returncode == 0 and "deleted 'cli-orders'" in deleted.stdout


def test_queues_list_explains_an_unreachable_node():
    from tests.support.broker import free_port

    port = free_port()
    result = run_cli("queues", "list", "--port", str(port))
    assert result.returncode == 1
    assert f"cannot connect to http://127.0.0.1:{port}" in result.stderr
    assert "Is the broker running" in result.stderr


def test_a_wrong_password_gets_rabbitmqs_401_text(broker):
    result = run_cli("queues", "list", "--base-uri", broker.management_url,
                     "--password", "wrong")
    assert result.returncode == 1
    assert result.stderr == (f"Error: Login failed (HTTP 401 from {broker.management_url} "
                             "for user 'guest')\n")
    # in the URL too; the password is never printed
    url = broker.management_url.replace("http://", "http://guest:s3cret@")
    result = run_cli("ctl", "list_users", "--base-uri", url)
    assert result.returncode == 1
    assert "Login failed (HTTP 401" in result.stderr and "s3cret" not in result.stderr


def connections_opened(port: int) -> float:
    """rabbitmq_connections_opened_total from the node's Prometheus endpoint."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as answer:
        text = answer.read().decode()
    (family,) = [f for f in text_string_to_metric_families(text)
                 if f.name == "rabbitmq_connections_opened"]
    return family.samples[0].value


def test_the_command_line_opens_no_amqp_connection(tmp_path):
    """`queues`, `ctl` and `cluster status` go over the management HTTP API only: the
    node counts no AMQP connection opened while they run (the queue is declared over
    the API too)."""
    import json
    import urllib.request

    from tests.support.broker import free_port

    prometheus = free_port()
    with BrokerProcess(data_dir=str(tmp_path),
                       extra_config=f"prometheus.tcp.port = {prometheus}\n") as node:
        before = connections_opened(prometheus)
        request = urllib.request.Request(
            f"{node.management_url}/api/queues/%2F/no-amqp", method="PUT",
            data=json.dumps({"durable": True, "arguments": {"x-queue-type": "quorum"}}
                            ).encode(),
            headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q=",
                     "Content-Type": "application/json"})
        urllib.request.urlopen(request, timeout=30).close()
        target = ["--port", str(node.management_port)]
        for command in (["queues", "list"], ["queues", "quorum_status", "no-amqp"],
                        ["queues", "purge", "no-amqp"], ["ctl", "list_users"],
                        ["ctl", "add_vhost", "no-amqp-vhost"], ["ctl", "list_vhosts"],
                        ["ctl", "list_queues"], ["ctl", "export_definitions", "-"],
                        ["cluster", "status"], ["queues", "delete", "no-amqp"]):
            result = run_cli(*command, *target)
            assert result.returncode == 0, (command, result.stderr)
        assert connections_opened(prometheus) == before
        # and it loads no AMQP client at all
        probe = subprocess.run([sys.executable, "-c", (
            "import sys\nfrom quorumqueue.cli.main import main\n"
            f"main(['queues', 'list', '--port', '{node.management_port}'], "
            "standalone_mode=False)\nprint('pika' in sys.modules)")],
            capture_output=True, text=True, timeout=60)
        assert probe.returncode == 0, probe.stderr
        assert probe.stdout.splitlines()[-1] == "False"


def test_queues_list_shows_a_quorum_queue_with_its_raft_group(broker):
    connection = pika.BlockingConnection(pika.URLParameters(broker.uri))
    channel = connection.channel()
    channel.queue_declare("cli-quorum", durable=True, arguments={"x-queue-type": "quorum"})
    channel.confirm_delivery()
    for _ in range(4):
        channel.basic_publish("", "cli-quorum", b"1234567890",
                              pika.BasicProperties(delivery_mode=2))
    channel.basic_qos(prefetch_count=1)
    channel.basic_consume("cli-quorum", lambda *args: None)  # holds one unacked
    connection.process_data_events(time_limit=0.2)
    listed = run_cli("queues", "list", "--base-uri", broker.management_url)
    assert listed.returncode == 0, listed.stderr
    row = next(r.split() for r in listed.stdout.splitlines()[1:] if r.split()[1] == "cli-quorum")
    leader = row[6]
    assert row[2:6] == ["quorum", "3", "1", "1"]
    assert leader.startswith("quorumqueue@") and row[7] == leader  # one member: itself
    assert row[-1] == "40"  # bodies of ready and unacked messages
    purged = run_cli("queues", "purge", "--base-uri", broker.management_url, "cli-quorum")
    assert "purged 3 messages" in purged.stdout, purged.stderr
    connection.close()
    deleted = run_cli("queues", "delete", "--base-uri", broker.management_url, "cli-quorum")
    assert deleted.returncode == 0 and "deleted 'cli-quorum' in vhost '/' (1 messages)" \
        in deleted.stdout, deleted.stderr


def test_quorum_status_peek_reclaim_and_health_checks_like_rabbitmq_queues(broker):
    """`quorumqueue queues quorum_status | peek | reclaim_quorum_memory |
    check_if_node_is_quorum_critical | check_if_node_is_mirror_sync_critical` on a
    node of its own: RabbitMQ's banners, columns, rows, texts and exit codes
    (rabbitmq-queues 3.10.8 answers the same for peek, the health checks and the
    errors; quorum_status has 4.x's columns)."""
    connection = pika.BlockingConnection(pika.URLParameters(broker.uri))
    channel = connection.channel()
    channel.queue_declare("cli-peek", durable=True, arguments={"x-queue-type": "quorum"})
    channel.queue_declare("cli-peek-classic", durable=True)
    channel.queue_bind("cli-peek", "amq.direct", "to-peek")
    channel.confirm_delivery()
    channel.basic_publish("", "cli-peek", b"hello", pika.BasicProperties(
        content_type="text/plain", delivery_mode=2, headers={"h": "v"}, message_id="m1",
        priority=3, timestamp=1700000000, app_id="a"))
    channel.basic_publish("amq.direct", "to-peek", b"x" * 100)
    connection.close()

    status = run_cli("queues", "quorum_status", "--base-uri", broker.management_url, "cli-peek")
    assert status.returncode == 0, status.stderr
    banner, header, row = status.stdout.splitlines()
    assert banner.startswith("Status of queue cli-peek on node quorumqueue@")
    assert [c.strip() for c in header.split("  ") if c.strip()] == [
        "Node Name", "Raft State", "Membership", "Last Log Index", "Last Written",
        "Last Applied", "Commit Index", "Snapshot Index", "Term"]
    cells = row.split()
    assert cells[1:3] == ["leader", "voter"]
    last, written, applied, commit = map(int, cells[3:7])
    assert last == written == applied == commit >= 3  # declare's config, 2 publishes

    first = run_cli("queues", "peek", "--base-uri", broker.management_url, "cli-peek", "1")
    assert first.returncode == 0, first.stderr
    lines = first.stdout.splitlines()
    assert lines[0].startswith("Peeking at quorum queue cli-peek at position 1 on node ")
    rows = [line.split(None, 1) if not line.startswith("payload") else
            ["payload (max 64 bytes)", line[len("payload (max 64 bytes)"):].strip()]
            for line in lines[2:]]
    assert rows == [["app_id", "a"], ["timestamp", "1700000000"], ["message_id", "m1"],
                    ["priority", "3"], ["delivery_mode", "2"],
                    ["content_type", "text/plain"], ["routing_keys", "cli-peek"],
                    ["exchange"], ["payload (max 64 bytes)", "hello"], ["header.h", "v"],
                    ["header.x-delivery-count", "0"]]
    second = run_cli("queues", "peek", "--base-uri", broker.management_url, "cli-peek", "2")
    assert "exchange                 amq.direct" in second.stdout
    assert "payload (max 64 bytes)   " + "x" * 64 + "\n" in second.stdout  # 64 bytes shown
    for position in ("3", "99"):
        beyond = run_cli("queues", "peek", "--base-uri", broker.management_url, "cli-peek", position)
        assert (beyond.returncode, beyond.stderr) == (
            69, "Error:\nTarget queue does not have a message at that position\n")
    zero = run_cli("queues", "peek", "--base-uri", broker.management_url, "cli-peek", "0")
    assert zero.returncode == 64
    assert '"position value must be a positive integer"' in zero.stderr
    classic = run_cli("queues", "peek", "--base-uri", broker.management_url, "cli-peek-classic", "1")
    assert (classic.returncode, classic.stderr) == (
        69, "Error:\nCannot peek into a classic queue\n")
    missing = run_cli("queues", "peek", "--base-uri", broker.management_url, "no-such-queue", "1")
    assert missing.stderr == "Error:\nTarget queue was not found in virtual host '/'\n"
    # peeking consumed nothing
    listed = run_cli("queues", "list", "--base-uri", broker.management_url)
    row = next(r.split() for r in listed.stdout.splitlines()[1:] if r.split()[1] == "cli-peek")
    assert row[3:5] == ["2", "0"]

    reclaimed = run_cli("queues", "reclaim_quorum_memory", "--base-uri", broker.management_url, "cli-peek")
    assert reclaimed.returncode == 0, reclaimed.stderr
    banner, line = reclaimed.stdout.splitlines()
    assert banner == "Will flush Raft WAL of quorum queue cli-peek ..."
    assert "write-ahead log rolled over" in line and line.endswith(", 0 after")
    assert int(line.split("in memory: ")[1].split()[0]) > 0  # it held the entries before
    assert run_cli("queues", "peek", "--base-uri", broker.management_url, "cli-peek", "1").returncode == 0
    classic = run_cli("queues", "reclaim_quorum_memory", "--base-uri", broker.management_url,
                      "cli-peek-classic")
    assert classic.stderr == "Error:\nThis operation is not applicable to classic queues\n"

    for check in ("check_if_node_is_quorum_critical", "check_if_node_is_mirror_sync_critical"):
        result = run_cli("queues", check, "--base-uri", broker.management_url)
        assert result.returncode == 0
        assert result.stdout.splitlines()[1].endswith(
            "seems to be the only one in a single node cluster, the check does not apply")


@pytest.mark.parametrize("options,text", [
    (["--base-uri", "amqp://guest:guest@127.0.0.1:5672/"],
     "expected http://HOST:PORT or https://HOST:PORT (the management API)"),
    (["--base-uri", "http://127.0.0.1:15672", "--port", "15673"],
     "give either --base-uri or --host/--port, not both"),
    (["--base-uri", "http://127.0.0.1:15672", "--ssl"], "give https:// instead"),
    (["--ssl-ca-cert-file", "/etc/hostname"], "--ssl-ca-cert-file need https"),
    (["--ssl", "--ssl-ca-cert-file", "/no/such/ca.pem"], "no such file: /no/such/ca.pem"),
    (["--ssl", "--ssl-key-file", "/etc/hostname"], "--ssl-key-file is the key of"),
])
def test_node_options_refuse_what_they_would_ignore(options, text):
    """The options naming the node are refused (usage error, exit 2) rather than
    ignored when they cannot apply; no request is made."""
    from click.testing import CliRunner

    from quorumqueue.cli.main import main

    result = CliRunner().invoke(main, ["queues", "list", *options])
    assert result.exit_code == 2 and text in result.output, result.output
