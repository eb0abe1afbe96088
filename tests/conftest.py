"""Fixtures shared by the whole suite.

``rabbitmq``: one private RabbitMQ 3.10.8 node per session (the oracle of the
differential tests), skipped with a reason naming .ci/install-rabbitmq when
RabbitMQ is not installed. Started lazily: only tests that ask for it pay its
~4 s boot.
"""

from collections.abc import Iterator

import pytest

from tests.support.rabbitmq import RabbitMQNode


@pytest.fixture(scope="session")
def rabbitmq() -> Iterator[RabbitMQNode]:
    if not RabbitMQNode.available():
        pytest.skip(RabbitMQNode.skip_reason)
    with RabbitMQNode() as node:
        yield node
