"""Names with any UTF-8 character through every HTTP API endpoint that takes a name
and through the command line (issue 30: a queue named `café`, `q(1)` or `it's`
answered 500 on get, purge, bind and delete, from a client-side name check in
broker/management/direct.py; RabbitMQ 3.10.8 answers 200/204). The corpus and its
steps are tests/faults/names.py (its long form, and the same steps against RabbitMQ
3.10.8, run with `make faults`); here the fixed names and a seeded handful of random
ones."""

from __future__ import annotations

import pytest

from tests.faults.names import FIXED, Target, random_names, run_corpus
from tests.support.broker import BrokerProcess

from .support import call, wait_until_serving

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def broker():
    with BrokerProcess() as process:
        wait_until_serving(process.management_url)
        yield process


def test_every_endpoint_and_command_takes_any_utf8_name(broker):
    names = list(FIXED) + random_names(seed=30, count=12)
    report = run_corpus(Target(broker.management_url, cli_port=broker.management_port),
                        names)
    assert report.steps > 40 * len(names)
    assert report.failures == []


def test_a_name_over_255_bytes_is_a_400_naming_the_limit(broker):
    name = "é" * 128  # 256 bytes of UTF-8
    status, body, _ = call(broker.management_url, "PUT", "/api/queues/%2F/" + "%C3%A9" * 128,
                           {"durable": True})
    assert status == 400, body
    assert "at most 255" in body["reason"]
    assert "256 bytes" in body["reason"]
    assert name not in str(call(broker.management_url, "GET", "/api/queues")[1])
