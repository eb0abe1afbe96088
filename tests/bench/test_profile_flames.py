"""The top-frame summary of py-spy's collapsed stacks (bench/profile_flames.py); pure,
no broker, no py-spy."""

from bench import profile_flames

COLLAPSED = """\
thread (0x7F01);run (server/main.py);flush (node/quorum.py);encode (amqp/codec.py) 6
thread (0x7F01);run (server/main.py);flush (node/quorum.py) 2
thread (0x7F01);run (server/main.py);apply (fifo/machine.py) 1
thread (0x7F02);write_loop (server/writer.py);fsync (server/writer.py) 1
"""


def test_self_total_and_thread_shares_come_from_the_collapsed_stacks(tmp_path) -> None:
    path = tmp_path / "p.txt"
    path.write_text(COLLAPSED)
    top = profile_flames.top_frames(profile_flames.read_collapsed(path))
    assert top["total"] == 10
    assert top["threads"] == [("thread (0x7F01)", 9), ("thread (0x7F02)", 1)]
    assert top["self"][0] == ("encode (codec.py)", 6)
    assert dict(top["self"])["flush (quorum.py)"] == 2
    inclusive = dict(top["inclusive"])
    assert inclusive["flush (quorum.py)"] == 8 and inclusive["fsync (writer.py)"] == 1
    # the root every stack of a thread starts with says nothing: left out of the totals
    assert "run (main.py)" not in inclusive and "write_loop (writer.py)" not in inclusive


def test_a_recursive_frame_counts_once_per_stack_in_the_total(tmp_path) -> None:
    path = tmp_path / "p.txt"
    path.write_text("thread (1);main (a.py);f (a.py);f (a.py);g (a.py) 4\nthread (1);main (a.py);h (a.py) 4\n")
    top = profile_flames.top_frames(profile_flames.read_collapsed(path))
    assert dict(top["inclusive"])["f (a.py)"] == 4
