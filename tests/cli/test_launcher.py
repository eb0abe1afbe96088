"""`quorumqueue cluster start|status` (cli/launcher.py, cli/cluster.py) and the
tests' LocalCluster built on the same planning (tests/support/cluster.py).

First the plan as tables (names, ports, data directories, the node list, the
command line, the shared config file), then `cluster status` rendering, then real
processes: the launcher started as a user would, its three nodes answering pika,
SIGTERM stopping them all, a node killed with SIGKILL named while the others keep
running and started again by SIGHUP, a node that cannot start; and LocalCluster's faults. Every test
checks that no process it started is left (psutil).
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import tomllib
from contextlib import contextmanager

import pika
import psutil
import pytest
from click.testing import CliRunner

from quorumqueue.cli.main import main
from quorumqueue.cli import cluster as cluster_cli
from quorumqueue.cli import launcher
from quorumqueue.broker.config import load_settings
from quorumqueue.client.management import ManagementError
from tests.support.cluster import CONVERGE_TIMEOUT, ROOT, LocalCluster

pytestmark = pytest.mark.timeout(300)  # the waits inside have their own bounds


# -- the plan -------------------------------------------------------------------------


def test_plan_names_ports_and_data_dirs(tmp_path):
    plans = launcher.plan_local_cluster(3, 5672, str(tmp_path / "c"))
    assert [(p.name, p.amqp_port, p.cluster_port, p.data_dir) for p in plans] == [
        ("qq1@localhost", 5672, 25672, str(tmp_path / "c" / "qq1")),
        ("qq2@localhost", 5673, 25673, str(tmp_path / "c" / "qq2")),
        ("qq3@localhost", 5674, 25674, str(tmp_path / "c" / "qq3")),
    ]
    # rabbitmq_prometheus's 15692 for the node on 5672, then one port per node
    assert [p.prometheus_port for p in plans] == [15692, 15693, 15694]
    assert [p.management_port for p in plans] == [15672, 15673, 15674]
    assert plans[1].uri == "amqp://guest:guest@127.0.0.1:5673/%2F"
    assert launcher.cluster_nodes_option(plans) == (
        "qq1@localhost:25672,qq2@localhost:25673,qq3@localhost:25674")
    # a proxy in front of qq2 and qq3, as LocalCluster does for qq1's view
    assert launcher.cluster_nodes_option(plans, {"qq2@localhost": 40001,
                                                 "qq3@localhost": 40002}) == (
        "qq1@localhost:25672,qq2@localhost:40001,qq3@localhost:40002")


def test_plan_with_base_port_zero_picks_distinct_free_ports(tmp_path):
    plans = launcher.plan_local_cluster(3, 0, str(tmp_path))
    ports = ([p.amqp_port for p in plans] + [p.cluster_port for p in plans]
             + [p.management_port for p in plans] + [p.prometheus_port for p in plans])
    assert len(set(ports)) == 12 and all(ports)


def test_free_ports_are_picked_where_no_client_socket_can_take_them_before_a_restart():
    # ports the kernel hands out (bind to 0, a client's local port) come from its
    # ephemeral range; a node restarted on a port picked there could find it taken
    with open("/proc/sys/net/ipv4/ip_local_port_range") as ranges:
        low = int(ranges.read().split()[0])
    ports = launcher.pick_free_ports(40)
    assert len(set(ports)) == 40
    assert all(launcher.PICK_LOW <= port < low for port in ports)
    clients = []
    try:
        with socket.create_server(("127.0.0.1", 0), backlog=128) as server:
            for _ in range(100):  # client sockets take ephemeral local ports
                clients.append(socket.create_connection(server.getsockname()))
            for port in ports:  # every picked port is still free to bind
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", port))
    finally:
        for client in clients:
            client.close()


@pytest.mark.parametrize("count, base, message", [
    (0, 5672, "--nodes: expected 1..99 nodes, got 0"),
    (3, 45535, "--base-port: 45535 leaves no room for 3 AMQP ports"),
    (1, -1, "--base-port: -1 leaves no room"),
])
def test_impossible_plans_name_the_option(tmp_path, count, base, message):
    with pytest.raises(ValueError, match=message):
        launcher.plan_local_cluster(count, base, str(tmp_path))


def test_listening_on_every_address_is_reached_on_loopback(tmp_path):
    [plan] = launcher.plan_local_cluster(1, 5672, str(tmp_path), host="0.0.0.0")
    assert plan.connect_host == "127.0.0.1" and "@127.0.0.1:5672/" in plan.uri


def test_node_command_runs_this_interpreter_with_the_cluster_flags(tmp_path):
    plans = launcher.plan_local_cluster(2, 5672, str(tmp_path))
    command = launcher.node_command(plans[1], launcher.cluster_nodes_option(plans),
                                    "/c.toml")
    assert command == [
        sys.executable, "-m", "quorumqueue.broker", "start",
        "--host", "127.0.0.1", "--port", "5673", "--data-dir", str(tmp_path / "qq2"),
        "--node-name", "qq2@localhost", "--cluster-port", "25673",
        "--cluster-nodes", "qq1@localhost:25672,qq2@localhost:25673",
        "--management-port", "15673", "--prometheus-port", "15693", "--config", "/c.toml"]


def test_the_shared_config_holds_the_cookie_privately_and_loads(tmp_path):
    path = str(tmp_path / "cluster.toml")
    launcher.write_cluster_config(path, "SECRET1", 'heartbeat = 30\n')
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert tomllib.loads(open(path).read()) == {"heartbeat": 30,
                                                 "cluster": {"cookie": "SECRET1"}}
    settings = load_settings(path, node_name="qq1@localhost",
                             cluster_nodes=("qq1@localhost:25672",))
    assert (settings.cluster_cookie, settings.heartbeat) == ("SECRET1", 30)


def test_a_cookie_in_the_given_config_is_kept_and_a_different_one_refused(tmp_path):
    path = str(tmp_path / "cluster.toml")
    given = '[cluster]\ncookie = "FROMFILE"\n'
    assert launcher.cookie_in_config(given) == "FROMFILE"
    launcher.write_cluster_config(path, "FROMFILE", given)
    assert tomllib.loads(open(path).read()) == {"cluster": {"cookie": "FROMFILE"}}
    with pytest.raises(ValueError, match="--cookie: differs"):
        launcher.write_cluster_config(path, "OTHER", given)
    with pytest.raises(ValueError, match="--cookie: expected 1 to 255 printable"):
        launcher.write_cluster_config(path, "has space")
    with pytest.raises(ValueError, match="--config: not TOML"):
        launcher.cookie_in_config("heartbeat = ")


def test_the_cookie_goes_beside_a_cluster_tls_table(tmp_path):
    """cluster.tls.* (inter-node TLS) makes [cluster] a table of the file already."""
    path = str(tmp_path / "cluster.toml")
    for given in ('[cluster.tls]\ncacertfile = "ca.pem"\n',
                  'cluster.tls.cacertfile = "ca.pem"\n[other]\nx = 1\n'):
        assert launcher.cookie_in_config(given) is None
        launcher.write_cluster_config(path, "SECRET2", given)
        document = tomllib.loads(open(path).read())
        assert document["cluster"] == {"cookie": "SECRET2", "tls": {"cacertfile": "ca.pem"}}
    with pytest.raises(ValueError, match="a \\[cluster\\] table must set cookie"):
        launcher.write_cluster_config(path, "SECRET2", '[cluster]\n[cluster.tls]\nx = 1\n')


def test_generated_cookies_differ_and_are_valid():
    first, second = launcher.new_cookie(), launcher.new_cookie()
    assert first != second and launcher.check_cookie(first) == first


@pytest.mark.parametrize("code, said", [(0, "exited with status 0"),
                                        (1, "exited with status 1"),
                                        (-9, "was killed by SIGKILL"),
                                        (-15, "was killed by SIGTERM")])
def test_exits_are_described(code, said):
    assert launcher.describe_exit(code) == said


# -- a child that ends with its parent (die_with_parent) --------------------------------

# The child prints the signal its parent's death sends it (prctl PR_GET_PDEATHSIG)
# and its open-files limit (which `then` below lowers).
_REPORT_CHILD = [sys.executable, "-c",
                 "import ctypes, resource\n"
                 "signal = ctypes.c_int()\n"
                 "ctypes.CDLL(None).prctl(2, ctypes.byref(signal), 0, 0, 0)\n"
                 "print(signal.value, resource.getrlimit(resource.RLIMIT_NOFILE)[0])\n"]


def _lower_open_files() -> None:
    import resource
    resource.setrlimit(resource.RLIMIT_NOFILE, (99, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))


def _spawned_report(*, then=None, tie_to_parent=True) -> tuple[int, int]:
    if then is None:
        process = launcher.spawn(_REPORT_CHILD, stdout=subprocess.PIPE, tie_to_parent=tie_to_parent)
    else:
        process = subprocess.Popen(_REPORT_CHILD, stdout=subprocess.PIPE,
                                   preexec_fn=launcher.die_with_parent(then))
    out, _ = process.communicate(timeout=60)
    signal_number, open_files = out.split()
    return int(signal_number), int(open_files)


def _from_a_thread(function):
    box = []
    thread = threading.Thread(target=lambda: box.append(function()))
    thread.start()
    thread.join(60)
    assert not thread.is_alive()
    return box[0]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_spawn_from_the_main_thread_arms_sigterm_on_the_parents_death():
    assert _spawned_report()[0] == signal.SIGTERM
    assert _spawned_report(tie_to_parent=False)[0] == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_spawn_from_another_thread_does_not_tie_the_child_to_that_thread():
    # the kernel would send the signal when that thread ends, not the process
    assert _from_a_thread(_spawned_report)[0] == 0
    assert launcher.die_with_parent() is not None
    assert _from_a_thread(launcher.die_with_parent) is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_die_with_parent_runs_then_in_the_child_on_any_thread():
    assert _spawned_report(then=_lower_open_files) == (signal.SIGTERM, 99)
    assert _from_a_thread(lambda: _spawned_report(then=_lower_open_files)) == (0, 99)
    assert _from_a_thread(lambda: launcher.die_with_parent(_lower_open_files)) is _lower_open_files


def test_cluster_start_refuses_bad_options_before_starting_anything(tmp_path):
    result = CliRunner().invoke(main, ["cluster", "start", "--nodes", "2", "--base-port",
                                       "65000", "--data-dir", str(tmp_path)])
    assert result.exit_code == 2 and "--base-port: 65000 leaves no room" in result.output
    assert not (tmp_path / "qq1").exists()


# -- cluster status ---------------------------------------------------------------------

STATUS = {
    "cluster_name": "qq", "node": "qq1@localhost", "metadata_leader": "qq2@localhost",
    "nodes": [
        {"name": "qq1@localhost", "address": "localhost:25672", "reachable": True,
         "amqp_uri": "amqp://127.0.0.1:5672"},
        {"name": "qq2@localhost", "address": "localhost:25673", "reachable": True,
         "amqp_uri": "amqp://127.0.0.1:5673"},
        {"name": "qq3@localhost", "address": "localhost:25674", "reachable": False,
         "amqp_uri": None},
    ],
    "queues": [{"vhost": "/", "name": "orders", "leader": "qq2@localhost",
                "members": ["qq1@localhost", "qq2@localhost", "qq3@localhost"],
                "online": ["qq1@localhost", "qq2@localhost"]}],
}


def test_status_is_printed_as_aligned_tables():
    assert cluster_cli.render_status(STATUS) == [
        "Cluster qq, as seen by qq1@localhost",
        "Metadata leader: qq2@localhost",
        "",
        "node           address          reachable  amqp",
        "qq1@localhost  localhost:25672  yes        amqp://127.0.0.1:5672",
        "qq2@localhost  localhost:25673  yes        amqp://127.0.0.1:5673",
        "qq3@localhost  localhost:25674  no",
        "",
        "vhost  queue   leader         members                                    online",
        "/      orders  qq2@localhost  qq1@localhost,qq2@localhost,qq3@localhost  "
        "qq1@localhost,qq2@localhost",
    ]


def test_status_without_a_leader_or_queues_says_so():
    lines = cluster_cli.render_status({**STATUS, "metadata_leader": None, "queues": []})
    assert lines[1] == "Metadata leader: (none: no quorum)"
    assert lines[-1] == "No quorum queues."


def test_status_refused_by_the_node_prints_its_reason(monkeypatch):
    """A node's refusal (the cluster status needs an administrator) is printed as the
    node gave it (the AMQP text of its X-Quorumqueue-Error header), as one error line
    with exit status 1."""
    def refuse(self, method, segments, **kw):
        assert (method, tuple(segments)) == ("GET", ("quorumqueue", "cluster-status"))
        raise ManagementError("ACCESS_REFUSED - user 'bob' is not an administrator")

    monkeypatch.setattr("quorumqueue.client.http_management.HttpManagement.request", refuse)
    result = CliRunner().invoke(main, ["cluster", "status", "--port", "1",
                                       "--username", "bob", "--password", "secret"])
    assert result.exit_code == 1
    assert result.output == "Error: ACCESS_REFUSED - user 'bob' is not an administrator\n"


def test_status_from_a_stopped_node_names_the_url():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = CliRunner().invoke(main, ["cluster", "status", "--base-uri",
                                       f"http://guest:guest@127.0.0.1:{port}"])
    assert result.exit_code == 1 and f"cannot connect to http://127.0.0.1:{port}" \
        in result.output


# -- the launcher as a process ----------------------------------------------------------


@contextmanager
def launched(*arguments: str, log_path):
    """`quorumqueue cluster start ...` as a process; on the way out, whatever happened,
    it and every node it started are gone."""
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "quorumqueue.cli", "cluster", "start", *arguments],
            stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, cwd=ROOT)
    seen: dict[int, psutil.Process] = {}
    try:
        yield process, seen
    finally:
        seen.update({c.pid: c for c in _children(process.pid)})
        if process.poll() is None:
            process.kill()
        process.wait(10)
        process.stdout.close()
        for child in seen.values():
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass


def _children(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children()
    except psutil.NoSuchProcess:
        return []


def read_uris(process: subprocess.Popen, count: int, log_path,
              timeout: float = CONVERGE_TIMEOUT):
    """The URIs the launcher prints once every node accepts AMQP."""
    uris, buffered = [], b""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while len(uris) < count:
            left = deadline - time.monotonic()
            assert left > 0 and process.poll() is None, (
                f"the launcher printed {uris} (exit {process.poll()}); its stderr ends:\n"
                f"{log_path.read_text(errors='replace')[-3000:]}")
            if selector.select(min(left, 0.2)):
                chunk = os.read(process.stdout.fileno(), 65536)
                buffered += chunk
                *lines, buffered = buffered.split(b"\n")
                uris += [word for line in lines for word in line.decode().split()
                         if word.startswith("amqp://")]
    return uris


def node_processes(process: subprocess.Popen) -> dict[str, psutil.Process]:
    """The launcher's children by --node-name."""
    found = {}
    for child in _children(process.pid):
        command = child.cmdline()
        found[command[command.index("--node-name") + 1]] = child
    return found


def gone(processes) -> bool:
    deadline = time.monotonic() + 30
    while any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in processes):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_three_nodes_answer_pika_and_sigterm_stops_them_all(tmp_path):
    log = tmp_path / "launcher.err"
    with launched("--nodes", "3", "--base-port", "0", "--data-dir", str(tmp_path / "c"),
                  log_path=log) as (process, seen):
        uris = read_uris(process, 3, log)
        nodes = node_processes(process)
        seen.update({p.pid: p for p in nodes.values()})
        assert sorted(nodes) == ["qq1@localhost", "qq2@localhost", "qq3@localhost"]
        for uri in uris:
            connection = pika.BlockingConnection(pika.URLParameters(uri))
            assert connection.is_open
            connection.close()
        cookie = tomllib.loads((tmp_path / "c" / "cluster.toml").read_text())
        assert launcher.check_cookie(cookie["cluster"]["cookie"])
        process.send_signal(signal.SIGTERM)
        assert process.wait(20) == 0
        assert gone(nodes.values())
    err = log.read_text()
    for name in nodes:  # each child's log lines come prefixed with its name
        assert f"{name} | " in err and "Server startup complete" in err


def read_line(process: subprocess.Popen, start: str, log_path,
              timeout: float = CONVERGE_TIMEOUT) -> str:
    """The next line of the launcher's stdout that starts with `start`."""
    buffered = b""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            assert left > 0 and process.poll() is None, (
                f"no line {start!r} on stdout (exit {process.poll()}); its stderr ends:\n"
                f"{log_path.read_text(errors='replace')[-3000:]}")
            if selector.select(min(left, 0.2)):
                buffered += os.read(process.stdout.fileno(), 65536)
                *lines, buffered = buffered.split(b"\n")
                for line in lines:
                    if line.decode().startswith(start):
                        return line.decode()


def answers_pika(uri: str) -> bool:
    connection = pika.BlockingConnection(pika.URLParameters(uri))
    connection.close()
    return True


def test_a_node_killed_with_sigkill_is_named_and_the_others_keep_running(tmp_path):
    """The README's failover walk-through: kill one node of `cluster start`'s three;
    the launcher says which node died, how, and how to start it again, the other two
    keep serving clients, SIGHUP starts it again on its port, SIGTERM stops all."""
    log = tmp_path / "launcher.err"
    with launched("--nodes", "3", "--base-port", "0", "--data-dir", str(tmp_path / "c"),
                  log_path=log) as (process, seen):
        uris = read_uris(process, 3, log)
        nodes = node_processes(process)
        seen.update({p.pid: p for p in nodes.values()})
        victim = nodes["qq2@localhost"]
        victim.send_signal(signal.SIGKILL)
        said = read_line(process, "quorumqueue cluster: node qq2@localhost", log)
        assert said == (f"quorumqueue cluster: node qq2@localhost (pid {victim.pid}) was "
                        "killed by SIGKILL; 2 of 3 nodes still running. Start it again "
                        f"with: kill -HUP {process.pid}")
        assert process.poll() is None
        assert all(nodes[name].is_running() for name in ("qq1@localhost", "qq3@localhost"))
        assert answers_pika(uris[0]) and answers_pika(uris[2])
        process.send_signal(signal.SIGHUP)
        said = read_line(process, "quorumqueue cluster: starting node qq2@localhost", log)
        restarted = node_processes(process)["qq2@localhost"]
        seen[restarted.pid] = restarted
        assert said == (f"quorumqueue cluster: starting node qq2@localhost again (pid "
                        f"{restarted.pid}), {uris[1]}")
        host, port = uris[1].split("@")[1].split("/")[0].split(":")
        deadline = time.monotonic() + CONVERGE_TIMEOUT
        while not launcher.accepts_amqp(host, int(port)):
            assert time.monotonic() < deadline and restarted.is_running()
            time.sleep(0.1)
        assert answers_pika(uris[1])
        process.send_signal(signal.SIGTERM)
        assert process.wait(20) == 0
        assert gone([*nodes.values(), restarted])
    assert "qq2@localhost | " in log.read_text()


def test_a_node_that_cannot_start_makes_the_launcher_exit_naming_it(tmp_path):
    log = tmp_path / "launcher.err"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        while taken.getsockname()[1] > 45000:  # leave room for the inter-node port
            taken.close()
            taken = socket.socket()
            taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with launched("--nodes", "1", "--base-port", str(port), "--data-dir",
                      str(tmp_path / "c"), log_path=log) as (process, seen):
            assert process.wait(30) == 1
    err = log.read_text()
    assert "quorumqueue cluster: node qq1@localhost" in err
    assert "exited with status 1 before accepting AMQP" in err
    assert "qq1@localhost | quorumqueue: cannot start the broker" in err


# -- LocalCluster -----------------------------------------------------------------------


def test_local_cluster_routes_peers_through_proxies_and_runs_faults():
    before = set(threading.enumerate())
    with LocalCluster(3) as cluster:
        pids = {name: cluster.pid(name) for name in cluster.names}
        processes = [psutil.Process(pid) for pid in pids.values()]
        for plan in cluster.plans:  # own real port, the proxies' ports for peers
            command = psutil.Process(pids[plan.name]).cmdline()
            listed = command[command.index("--cluster-nodes") + 1].split(",")
            assert f"{plan.name}:{plan.cluster_port}" in listed
            for peer in cluster.plans:
                if peer is not plan:
                    proxy = cluster.proxy(plan.name, peer.name)
                    assert f"{peer.name}:{proxy.port}" in listed
                    assert proxy.target_port == peer.cluster_port
        cluster.cut("qq1", "qq2")
        assert (cluster.proxy(0, 1).state, cluster.proxy(1, 0).state) == ("dropping",) * 2
        cluster.heal()
        cluster.cut("qq1", "qq3", one_way=True)
        assert cluster.proxy(0, 2).state == "stalled forward"
        assert cluster.proxy(2, 0).state == "stalled backward"
        cluster.heal("qq3")
        assert {p.state for p in cluster.proxies.values()} == {"open"}
        cluster.pause("qq2")
        assert psutil.Process(pids["qq2@localhost"]).status() == psutil.STATUS_STOPPED
        assert cluster.live_nodes() == ["qq1@localhost", "qq3@localhost"]
        cluster.resume("qq2")
        assert cluster.kill("qq3") == -signal.SIGKILL
        assert cluster.live_uris() == cluster.uris([0, 1])
        cluster.restart("qq3")
        assert cluster.pid("qq3") != pids["qq3@localhost"]
        connection = pika.BlockingConnection(pika.URLParameters(cluster.uri("qq3")))
        connection.close()
        processes.append(psutil.Process(cluster.pid("qq3")))
        cluster.pause("qq1")  # stop() must end a paused node too
        root = cluster.root
    assert gone(processes)
    assert not os.path.exists(root)
    assert set(threading.enumerate()) <= before


def test_local_cluster_names_a_node_that_exits_while_starting():
    with pytest.raises(RuntimeError, match=r"node qq1@localhost exited with status \d+ "
                                           r"before accepting AMQP on port \d+; its log "
                                           r"ends:\n(.|\n)*raft\.tick_interval_ms"):
        LocalCluster(1, proxied=False, extra_config="[raft]\ntick_interval_ms = 1\n").start()


def test_cluster_status_of_a_local_cluster_lists_its_nodes():
    with LocalCluster(3) as cluster:
        result = CliRunner().invoke(main, ["cluster", "status", "--base-uri", cluster.management_url(1)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].endswith("as seen by qq2@localhost")
    assert lines[3].split() == ["node", "address", "reachable", "amqp"]
    assert [line.split()[0] for line in lines[4:7]] == cluster.names


def test_a_process_never_picks_a_port_it_picked_before(monkeypatch):
    # a node killed by this process is restarted on its ports: no other node of the
    # same process may be planned on them meanwhile
    monkeypatch.setenv(launcher.PICK_RANGE_ENV, "20000-20011")
    monkeypatch.setattr(launcher, "_picked", set())
    first = launcher.pick_free_ports(6)
    second = launcher.pick_free_ports(6)
    assert not set(first) & set(second)
    assert set(first) | set(second) == set(range(20000, 20012))


def test_the_pick_range_is_narrowed_by_its_variable_and_a_bad_one_is_named(monkeypatch):
    monkeypatch.setenv(launcher.PICK_RANGE_ENV, "21000-21099")
    monkeypatch.setattr(launcher, "_picked", set())
    assert all(21000 <= port <= 21099 for port in launcher.pick_free_ports(20))
    monkeypatch.setenv(launcher.PICK_RANGE_ENV, "21000")
    with pytest.raises(ValueError, match="QUORUMQUEUE_PICK_PORTS='21000': expected two "
                                         "ports low-high"):
        launcher.pick_free_ports(1)
