"""Replica management on a real 3-node cluster, as `rabbitmq-queues` does it:
add_member / delete_member, grow / shrink, rebalance, continuous membership
reconciliation, and the refusals that would lose a queue's quorum."""

from __future__ import annotations

import pika
import pytest
from click.testing import CliRunner

from quorumqueue.cli.main import main
from quorumqueue.client.management import ManagementError, call
from tests.broker.cluster.test_cluster import connect, drain, leader_of, queue_status, status
from tests.support.cluster import LocalCluster, wait_for

pytestmark = pytest.mark.timeout(300)  # the waits inside have their own bounds


def declare(uri: str, name: str, size: int | None = None, **arguments) -> None:
    if size is not None:
        arguments["x-quorum-initial-group-size"] = size
    with connect(uri) as connection:
        channel = connection.channel()
        channel.queue_declare(name, durable=True,
                              arguments={"x-queue-type": "quorum", **arguments})
        channel.confirm_delivery()
        for n in range(5):
            channel.basic_publish("", name, b"%d" % n, pika.BasicProperties(delivery_mode=2))


def raft_members(uri: str, name: str) -> list[str]:
    for row in call(uri, "queues.list", vhost="/"):
        if row["name"] == name:
            return sorted(row["members"])
    return []


def cli(*args: str) -> str:
    """The command's stdout (its table); progress lines go to stderr."""
    return cli_result(*args).stdout


def cli_result(*args: str):
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(3, proxied=False, extra_config="") as running:
        wait_for("a metadata leader", lambda: all(status(u)["metadata_leader"]
                                                  for u in running.uris()))
        yield running


def test_a_node_without_a_replica_counts_like_the_queues_members(cluster):
    one, two, three = cluster.names
    declare(cluster.uri(one), "counted-elsewhere", size=1)  # five messages, on one only
    assert queue_status(cluster.uri(one), "counted-elsewhere")["members"] == [one]
    with connect(cluster.uri(one)) as consuming:
        channel = consuming.channel()
        channel.basic_qos(prefetch_count=1)
        channel.basic_consume("counted-elsewhere", lambda *_: None)
        consuming.process_data_events(time_limit=0.5)
        with connect(cluster.uri(two)) as elsewhere:
            other = elsewhere.channel()
            declared = other.queue_declare("counted-elsewhere", passive=True).method
            # one message is out to the consumer (prefetch 1), four are ready
            assert (declared.message_count, declared.consumer_count) == (4, 1)
            other.confirm_delivery()
            for n in range(3):  # through node two, then counted at once
                other.basic_publish("", "counted-elsewhere", b"more",
                                    pika.BasicProperties(delivery_mode=2))
            assert other.queue_declare("counted-elsewhere",
                                       passive=True).method.message_count == 7


def test_add_and_delete_a_member(cluster):
    one, two, three = cluster.names
    uri = cluster.uri(one)
    declare(uri, "single", size=1)
    assert queue_status(uri, "single")["members"] == [one]
    output = cli("queues", "add_member", "--base-uri", cluster.management_url(one), "single", two)
    assert f"added {two}" in output
    # the new replica joins the Raft group and holds the messages
    wait_for("two Raft members", lambda: raft_members(uri, "single") == sorted([one, two]))
    wait_for("the new replica filled", lambda: [
        r for r in call(cluster.uri(two), "queues.list", vhost="/")
        if r["name"] == "single"][0].get("ready") == 5)
    assert drain(cluster.uri(two), "single", 5) == [b"%d" % n for n in range(5)]
    cli("queues", "delete_member", "--base-uri", cluster.management_url(one), "single", one)
    wait_for("one Raft member", lambda: raft_members(cluster.uri(two), "single") == [two])
    assert queue_status(uri, "single")["members"] == [two]


def test_refusals_name_the_problem(cluster):
    one, two, three = cluster.names
    uri = cluster.uri(one)
    declare(uri, "refusing", size=1)
    with pytest.raises(ManagementError, match="last member"):
        call(uri, "queues.delete_member", vhost="/", name="refusing", node=one)
    with pytest.raises(ManagementError, match="already a member"):
        call(uri, "queues.add_member", vhost="/", name="refusing", node=one)
    with pytest.raises(ManagementError, match="not a member of this cluster"):
        call(uri, "queues.add_member", vhost="/", name="refusing", node="qq9@localhost")
    with pytest.raises(ManagementError, match="no queue 'nope'"):
        call(uri, "queues.add_member", vhost="/", name="nope", node=two)


def test_grow_even_and_all_then_shrink(cluster):
    one, two, three = cluster.names
    uri = cluster.uri(one)
    declare(uri, "g-one", size=1)
    declare(uri, "g-two", size=2)
    # even: only queues with an even number of members grow
    if three in queue_status(uri, "g-two")["members"]:
        target = two if two not in queue_status(uri, "g-two")["members"] else one
    else:
        target = three
    result = cli_result("queues", "grow", "--base-uri", cluster.management_url(one), target, "even",
                        "--queue-pattern", "^g-")
    output = result.stdout
    assert "g-two" in output and "g-one" not in output
    # stdout is the table alone; stderr (not a terminal here) says, one plain line
    # per queue looked at, how far the command got: both g- queues were candidates
    assert output.splitlines()[0].split() == ["vhost", "name", "size", "result"]
    assert len(output.splitlines()) == 2
    assert result.stderr.splitlines() == ["grow: 1/2 //g-one", "grow: 2/2 //g-two"]
    wait_for("g-two has 3 members", lambda: len(raft_members(uri, "g-two")) == 3)
    grown = [m for m in cluster.names if m not in queue_status(uri, "g-one")["members"]][0]
    cli("queues", "grow", "--base-uri", cluster.management_url(one), grown, "all", "--queue-pattern", "^g-one$")
    wait_for("g-one has 2 members", lambda: len(raft_members(uri, "g-one")) == 2)
    result = cli_result("queues", "shrink", "--base-uri", cluster.management_url(one), grown)
    assert "g-one" in result.stdout and "shrink:" not in result.stdout
    assert any(line.startswith("shrink: ") and line.endswith("//g-one")
               for line in result.stderr.splitlines())
    wait_for("g-one back to 1", lambda: grown not in queue_status(uri, "g-one")["members"])


def api_members(cluster, node: str, name: str) -> list[str]:
    """The queue's members as `node`'s management API lists them."""
    from tests.broker.management.support import call as http
    status, row, _ = http(cluster.management_url(node), "GET", f"/api/queues/%2F/{name}")
    assert status == 200, row
    return sorted(row["members"])


def test_membership_commands_return_once_the_change_shows(cluster):
    """As rabbitmq-queues returns once the member is added or removed: right after
    add_member, delete_member, grow and shrink answer, the node that answered lists
    the queue's members changed (before, 'ok' came up to ~4 s ahead of the member)."""
    one, two, three = cluster.names
    declare(cluster.uri(one), "shows", size=1)
    [member] = queue_status(cluster.uri(one), "shows")["members"]
    other, third = [name for name in cluster.names if name != member][:2]
    # asked of the node that will hold the new follower: its own Raft member must
    # have the new configuration before the command returns
    url = cluster.management_url(other)
    output = cli("queues", "add_member", "--base-uri", url, "shows", other)
    assert output == (f"added {other} to quorum queue 'shows' in vhost '/' (members: "
                      f"{', '.join(sorted([member, other]))})\n")
    assert api_members(cluster, other, "shows") == sorted([member, other])
    table = cli("queues", "grow", "--base-uri", url, third, "all", "--queue-pattern",
                "^shows$")
    assert table.splitlines()[1].split() == ["/", "shows", "3", "ok"]
    assert api_members(cluster, other, "shows") == sorted(cluster.names)
    table = cli("queues", "shrink", "--base-uri", url, third)
    assert ["/", "shows", "2", "ok"] in [line.split() for line in table.splitlines()]
    assert api_members(cluster, other, "shows") == sorted([member, other])
    output = cli("queues", "delete_member", "--base-uri", url, "shows", member)
    assert output == (f"removed {member} from quorum queue 'shows' in vhost '/' (members: "
                      f"{other})\n")
    assert api_members(cluster, other, "shows") == [other]


def _late_candidate(cluster, name: str):
    """A two-member queue `name`: (its members, a follower, the node not a member)."""
    declare(cluster.uri(cluster.names[0]), name, size=2)
    members = queue_status(cluster.uri(cluster.names[0]), name)["members"]
    leader = wait_for("a leader", lambda: leader_of(cluster.uri(cluster.names[0]), name))
    follower = next(member for member in members if member != leader)
    added = next(node for node in cluster.names if node not in members)
    return members, follower, added


ATTEMPTS = 6  # a loaded node may show the change by the time the commit's reply comes


def test_a_membership_change_that_does_not_show_in_time_is_an_error(cluster):
    """A bounded wait: with --timeout 0 the change (committed, not yet in the
    follower's configuration) has not shown; the command fails naming the queue, the
    node and the members shown, and says the change may still come. (The follower may
    already show it when the commit's reply arrives: then a new queue is tried.)"""
    for attempt in range(ATTEMPTS):
        name = f"late-{attempt}"
        members, follower, added = _late_candidate(cluster, name)
        result = CliRunner().invoke(main, ["queues", "add_member", "--base-uri",
                                           cluster.management_url(follower), "--timeout",
                                           "0", name, added])
        if result.exit_code == 0:
            continue   # shown already: no timeout to see with this queue
        assert result.exit_code == 1
        assert result.output == (
            f"Error: TIMEOUT - {added} was not added to quorum queue '{name}' in vhost '/' "
            f"within 0s (members: {', '.join(sorted(members))}); the change is committed "
            "and may still come: see quorumqueue cluster status\n")
        wait_for("the change shows later", lambda: api_members(cluster, follower, name)
                 == sorted([*members, added]))
        break
    else:
        pytest.fail(f"the change showed at its commit {ATTEMPTS} times of {ATTEMPTS}")
    result = CliRunner().invoke(main, ["queues", "add_member", "--base-uri",
                                       cluster.management_url(follower), "--timeout", "-1",
                                       name, added])
    assert result.exit_code == 1 and "timeout: expected a number of seconds >= 0" in \
        result.output


def test_the_management_rpc_answers_membership_commands_once_the_change_shows(cluster):
    """The AMQP management RPC (client/management.py call) waits as the HTTP API and
    the command line wait: right after queues.add_member, grow, shrink and
    delete_member answer, the node that answered lists the members changed (before,
    the RPC answered at the metadata commit, ahead of the member)."""
    one, two, three = cluster.names
    declare(cluster.uri(one), "rpc-shows", size=1)
    [member] = queue_status(cluster.uri(one), "rpc-shows")["members"]
    other, third = [name for name in cluster.names if name != member][:2]
    uri = cluster.uri(other)
    result = call(uri, "queues.add_member", timeout=120, vhost="/", name="rpc-shows",
                  node=other)
    assert result["members"] == sorted([member, other])
    assert api_members(cluster, other, "rpc-shows") == sorted([member, other])
    rows = call(uri, "queues.grow", timeout=120, node=third, strategy="all",
                queue_pattern="^rpc-shows$")
    assert [(r["name"], r["result"]) for r in rows] == [("rpc-shows", "ok")]
    assert api_members(cluster, other, "rpc-shows") == sorted(cluster.names)
    rows = call(uri, "queues.shrink", timeout=120, node=third, queue_pattern="^rpc-shows$")
    assert [(r["name"], r["result"]) for r in rows] == [("rpc-shows", "ok")]
    assert api_members(cluster, other, "rpc-shows") == sorted([member, other])
    result = call(uri, "queues.delete_member", timeout=120, vhost="/", name="rpc-shows",
                  node=member)
    assert result["members"] == [other]
    assert api_members(cluster, other, "rpc-shows") == [other]


def test_a_membership_rpc_whose_change_does_not_show_in_time_is_an_error(cluster):
    """The RPC's `timeout` as the API's: 0 s, and the change not yet in the follower's
    configuration, is 'TIMEOUT - ...' naming queue, node and members (a queue whose
    follower showed it at once already is replaced by a new one)."""
    for attempt in range(ATTEMPTS):
        name = f"rpc-late-{attempt}"
        members, follower, added = _late_candidate(cluster, name)
        try:
            call(cluster.uri(follower), "queues.add_member", timeout=120, vhost="/",
                 name=name, node=added, fields={"timeout": 0})
            continue   # shown already
        except ManagementError as refused:
            assert str(refused) == (
                f"TIMEOUT - {added} was not added to quorum queue '{name}' in vhost '/' "
                f"within 0s (members: {', '.join(sorted(members))}); the change is "
                "committed and may still come: see quorumqueue cluster status")
        wait_for("the change shows later", lambda: api_members(cluster, follower, name)
                 == sorted([*members, added]))
        return
    pytest.fail(f"the change showed at its commit {ATTEMPTS} times of {ATTEMPTS}")


def test_a_member_deleted_right_after_it_was_added_leaves_the_queue_working(cluster):
    """add_member, then delete_member of the same node before that node started its
    replica (as grow then shrink under load): the member goes, and the queue still
    confirms publishes. The added node is paused meanwhile, so that it applies the
    addition and the removal together, before its next reconciliation would start a
    replica. Before, the leader's Raft change 'add X' then waited for X for ever: X
    started no replica (the record no longer named it) and dropped the leader's
    messages; the removal was refused ('a change in flight') and the one-member queue
    needed X for every commit (issue 30, 7c: 'qq2 was not removed from g-one')."""
    one = cluster.names[0]
    declare(cluster.uri(one), "added-removed", size=1)
    [member] = queue_status(cluster.uri(one), "added-removed")["members"]
    added = next(node for node in cluster.names if node != member)
    uri = cluster.uri(member)
    cluster.pause(added)   # reachable for REACHABLE_WITHIN still: the add is allowed
    try:
        # answered once the leader's configuration names `added` (appended)
        call(uri, "queues.add_member", timeout=120, vhost="/", name="added-removed",
             node=added)
        try:
            call(uri, "queues.delete_member", timeout=120, vhost="/",
                 name="added-removed", node=added, fields={"timeout": 0})
        except ManagementError as late:
            assert str(late).startswith("TIMEOUT - "), late   # committed, not shown yet
    finally:
        cluster.resume(added)
    wait_for(f"{added} removed from the queue's Raft members",
             lambda: raft_members(uri, "added-removed") == [member], timeout=60)
    with connect(cluster.uri(added)) as connection:
        channel = connection.channel()
        channel.confirm_delivery()   # an unconfirmed publish raises
        channel.basic_publish("", "added-removed", b"after",
                              pika.BasicProperties(delivery_mode=2))
    assert drain(uri, "added-removed", 6)[-1] == b"after"


def test_rebalance_moves_leaders_not_members(cluster):
    uri = cluster.uri(0)
    for n in range(6):
        declare(uri, f"r-{n}")
    names = [f"r-{n}" for n in range(6)]
    wait_for("leaders", lambda: all(leader_of(uri, n) for n in names))
    before = {n: sorted(queue_status(uri, n)["members"]) for n in names}
    # every queue was declared through node 1 (client-local), so it leads them all,
    # unless an election moved some meanwhile (a slow heartbeat on a loaded machine)
    led = [sum(1 for n in names if leader_of(uri, n) == node) for node in cluster.names]
    result = call(uri, "queues.rebalance", queue_pattern="^r-")
    assert bool(result["moves"]) == (max(led) > 2), (led, result)
    wait_for("balanced leaders", lambda: max(
        sum(1 for n in names if leader_of(uri, n) == node) for node in cluster.names) <= 2)
    assert {n: sorted(queue_status(uri, n)["members"]) for n in names} == before


def node_uri(cluster, name: str, user: str, password: str, vhost: str = "%2F") -> str:
    port = cluster.uri(name).rsplit(":", 1)[1].split("/")[0]
    return f"amqp://{user}:{password}@127.0.0.1:{port}/{vhost}"


def test_users_vhosts_and_permissions_are_the_same_on_every_node(cluster):
    one, two, three = cluster.names
    cli("ctl", "add_user", "--base-uri", cluster.management_url(one), "erin", "pw")
    cli("ctl", "add_vhost", "--base-uri", cluster.management_url(two), "shared")
    cli("ctl", "set_permissions", "--base-uri", cluster.management_url(three), "-p", "shared", "erin",
        ".*", ".*", ".*")
    # added through three different nodes, usable through any
    wait_for("erin on every node", lambda: all(
        ["erin", "shared"] == [row["user"], row["vhost"]]
        for uri in cluster.uris()
        for row in call(uri, "permissions.list", user="erin")) and all(
        call(uri, "permissions.list", user="erin") for uri in cluster.uris()))
    with connect(node_uri(cluster, three, "erin", "pw", "shared")) as connection:
        channel = connection.channel()
        channel.queue_declare("in-shared", durable=True, arguments={"x-queue-type": "quorum"})
        channel.confirm_delivery()
        channel.basic_publish("", "in-shared", b"hello", pika.BasicProperties(delivery_mode=2))
    assert drain(node_uri(cluster, one, "erin", "pw", "shared"), "in-shared", 1) == [b"hello"]
    cli("ctl", "delete_user", "--base-uri", cluster.management_url(two), "erin")
    wait_for("erin gone everywhere", lambda: not any(
        row["name"] == "erin" for uri in cluster.uris() for row in call(uri, "users.list")))
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        connect(node_uri(cluster, one, "erin", "pw", "shared"))
    cli("ctl", "delete_vhost", "--base-uri", cluster.management_url(three), "shared")
    wait_for("the vhost gone everywhere", lambda: not any(
        row["name"] == "shared" for uri in cluster.uris() for row in call(uri, "vhosts.list")))


def test_a_policy_set_through_one_node_limits_a_queue_led_by_another(cluster):
    one, two, three = cluster.names
    declare(cluster.uri(one), "limited-by-policy")  # five messages
    # node one's client-local leader, unless an election under load moved it: the
    # policy goes through a node that does not lead
    leader = wait_for("a leader", lambda: leader_of(cluster.uri(one), "limited-by-policy"))
    setter = next(name for name in (three, two, one) if name != leader)
    cli("ctl", "set_policy", "--base-uri", cluster.management_url(setter), "--apply-to", "quorum_queues",
        "three-only", "^limited-by-policy$", '{"max-length": 3, "delivery-limit": 4}')
    # the leader proposes the new settings to the queue's log: every replica drops the
    # two oldest at the same index
    wait_for("three messages on every replica", lambda: all(
        row["ready"] == 3 for uri in cluster.uris()
        for row in call(uri, "queues.list", vhost="/") if row["name"] == "limited-by-policy"))
    assert drain(cluster.uri(two), "limited-by-policy", 3) == [b"2", b"3", b"4"]
    cli("ctl", "clear_policy", "--base-uri", cluster.management_url(two), "three-only")
    assert all(not call(uri, "policies.list") for uri in cluster.uris())


def test_deleting_a_member_that_would_lose_quorum_is_refused():
    with LocalCluster(3, proxied=False) as cluster:
        one, two, three = cluster.names
        uri = cluster.uri(one)
        wait_for("a metadata leader", lambda: status(uri)["metadata_leader"])
        declare(uri, "fragile", size=2)
        members = queue_status(uri, "fragile")["members"]
        other = next(m for m in members if m != one)
        # with `one` down, deleting `other` would leave a single member that is down
        cluster.kill(one)
        survivor = cluster.uri(other)
        wait_for(f"{one} seen down", lambda: not next(
            n for n in status(survivor)["nodes"] if n["name"] == one)["reachable"])
        with pytest.raises(ManagementError, match="less than a majority"):
            call(survivor, "queues.delete_member", vhost="/", name="fragile", node=other)


def test_continuous_membership_reconciliation_grows_to_the_target():
    config = ("[quorum_queue.continuous_membership_reconciliation]\n"
              "enabled = true\ntarget_group_size = 3\ninterval = 1000\n"
              "trigger_interval = 500\n")
    with LocalCluster(3, proxied=False, extra_config=config) as cluster:
        uri = cluster.uri(0)
        wait_for("a metadata leader", lambda: status(uri)["metadata_leader"])
        declare(uri, "small", size=1)
        wait_for("grown to 3 members", lambda: len(raft_members(uri, "small")) == 3)


def test_a_node_joins_a_running_cluster_and_grows_a_queue_onto_it(tmp_path):
    import subprocess
    import sys

    from quorumqueue.cli import launcher

    with LocalCluster(3, proxied=False) as cluster:
        seed = cluster.plans[0]
        uri = seed.uri
        wait_for("a metadata leader", lambda: status(uri)["metadata_leader"])
        declare(uri, "widening")
        amqp_port, cluster_port = launcher.pick_free_ports(2)
        joiner = "qq4@localhost"
        log = open(tmp_path / "qq4.log", "w")
        process = subprocess.Popen(
            [sys.executable, "-m", "quorumqueue.cli", "broker", "start",
             "--port", str(amqp_port), "--data-dir", str(tmp_path / "qq4"),
             "--node-name", joiner, "--cluster-port", str(cluster_port),
             "--config", cluster.config_path,
             "--join", f"{seed.name}:{seed.cluster_port}"],
            stdout=log, stderr=subprocess.STDOUT)
        try:
            joined_uri = f"amqp://guest:guest@127.0.0.1:{amqp_port}/%2F"
            wait_for("four reachable nodes", lambda: sorted(
                n["name"] for n in status(uri)["nodes"] if n["reachable"])
                == sorted([*cluster.names, joiner]))
            # the new node learned the metadata: it knows the queue, holds no replica
            record = wait_for("the queue on the new node",
                              lambda: queue_status(joined_uri, "widening"))
            assert joiner not in record["members"]
            output = cli("queues", "grow", "--base-uri", cluster.management_url(seed.name), joiner, "all")
            assert "widening" in output
            wait_for("the new replica filled", lambda: [
                r for r in call(joined_uri, "queues.list", vhost="/")
                if r["name"] == "widening"][0].get("ready") == 5)
            assert drain(joined_uri, "widening", 5) == [b"%d" % n for n in range(5)]
        finally:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            log.close()
