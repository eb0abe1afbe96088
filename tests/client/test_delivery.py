"""The delivery count a client reads from a message's x-delivery-count header."""

import pika
import pytest

from quorumqueue.client.delivery import Delivery


def delivery(headers) -> Delivery:
    return Delivery(seq=1, body=b"x", exchange="", routing_key="q", redelivered=False,
                    properties=pika.BasicProperties(headers=headers))


@pytest.mark.parametrize("headers,count", [
    (None, 0), ({}, 0), ({"x-delivery-count": 0}, 0), ({"x-delivery-count": 3}, 3),
    ({"x-delivery-count": pika.compat.long(2)}, 2)])  # how pika decodes the broker's long
def test_the_brokers_count_is_read_from_the_header(headers, count):
    assert delivery(headers).delivery_count == count


@pytest.mark.parametrize("value", ["", "3", b"2", 2.5, True, None, [1]])
def test_a_publishers_header_that_is_no_integer_counts_no_delivery(value):
    """A publisher may set x-delivery-count to anything before the broker counts a
    delivery; the message must still read (the connector's source read failed with
    ValueError on `x-delivery-count: ""`), as not yet delivered."""
    assert delivery({"x-delivery-count": value}).delivery_count == 0
