"""The publish walk (bench/publish_walk.py) follows one confirmed publish from its
bytes through the fifo machine and the WAL's fsync to its confirm, and counts what
it passed through."""

from bench import publish_walk


def test_the_walk_goes_from_bytes_through_the_fsync_to_the_confirm():
    calls = publish_walk.walk(64)
    names = [name for _depth, _package, name, _caller in calls]
    assert names[0] == "node/session.py:Session.receive_data"
    # into a queue with nobody to deliver to, the apply loop stores the publish with
    # the fifo machine's in-place twin (fifo/in_place.py), not machine.apply
    assert "fifo/in_place.py:enqueue_in_place" in names
    assert "raft/storage/wal.py:WalFile.sync" in names
    assert "amqp/codec.py:basic_ack" in names
    summary = publish_walk.summary(calls)
    assert summary["calls"] == len(calls)
    assert summary["package_switches"] == sum(summary["switches"].values())


def test_a_call_into_another_package_is_a_switch_and_a_lower_calling_a_higher_is_upward():
    calls = [(0, "node", "node/a.py:f", None), (1, "raft", "raft/b.py:g", "node"),
             (2, "node", "node/a.py:h", "raft"), (1, "node", "node/a.py:i", "node")]
    summary = publish_walk.summary(calls)
    assert summary["package_switches"] == 2
    assert summary["upward"] == {"raft -> node": 1}
    assert summary["transitions"] == 2
    assert summary["modules"] == 2
