"""bench/publish_cpu.py's shapes, without a broker."""

import pytest

from bench.publish_cpu import parse_arguments


def test_shapes_are_plain_or_keyed_with_a_publisher_count():
    arguments = parse_arguments(["--shapes", "plain-1, keyed-2"])
    assert arguments.shape_list == [("plain-1", False, 1), ("keyed-2", True, 2)]


@pytest.mark.parametrize("shape", ["keyed", "keyed-0", "fancy-2", "plain-x"])
def test_a_shape_that_is_not_plain_n_or_keyed_n_is_refused(shape):
    with pytest.raises(SystemExit):
        parse_arguments(["--shapes", shape])
