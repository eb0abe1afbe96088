"""queue.declare validation of the TTL and dead-letter arguments (broker/queues/types.py):
quorum queues take x-message-ttl, x-expires, x-dead-letter-exchange, x-dead-letter-routing-key
and x-dead-letter-strategy (at-most-once, at-least-once); RabbitMQ's refusals for bad
values; what is not built yet (classic queues' TTLs and dead lettering) is refused
rather than silently ignored."""

from __future__ import annotations

import pytest

from quorumqueue.broker.amqp.errors import AMQPError
from quorumqueue.broker.queues.types import validate_declaration

QUORUM = {"x-queue-type": "quorum"}
WHERE = "queue 'q' in vhost '/'"


def declare(**arguments):
    return validate_declaration("q", "/", True, False, False, arguments)


def refusal(**arguments) -> str:
    with pytest.raises(AMQPError) as info:
        declare(**arguments)
    assert info.value.code == 406
    return info.value.reply_text


def test_at_least_once_with_drop_head_falls_back_to_at_most_once_as_rabbitmq():
    """The quorum queues guide, "Dead Lettering", Limitations: at-least-once does not
    work with drop-head, RabbitMQ falls back to at-most-once: accepted."""
    declare(**QUORUM, **{"x-dead-letter-strategy": "at-least-once",
                         "x-dead-letter-exchange": "dlx"})


def test_at_least_once_with_reject_publish_is_accepted():
    """The guide's "Activating at-least-once dead-lettering": strategy at-least-once,
    overflow reject-publish and a dead-letter exchange."""
    spec = declare(**QUORUM, **{"x-dead-letter-strategy": "at-least-once",
                                "x-overflow": "reject-publish",
                                "x-dead-letter-exchange": "dlx"})
    assert spec.overflow == "reject-publish"


def test_quorum_queues_accept_message_ttl_and_at_most_once_dead_lettering():
    spec = declare(**QUORUM, **{"x-message-ttl": 0, "x-expires": 1,
                                "x-dead-letter-exchange": "dlx",
                                "x-dead-letter-routing-key": "k",
                                "x-dead-letter-strategy": "at-most-once"})
    assert spec.type == "quorum" and spec.arguments["x-message-ttl"] == 0


@pytest.mark.parametrize("arguments, text", [
    ({"x-message-ttl": -1}, f"invalid arg 'x-message-ttl' for {WHERE}: {{value_negative,-1}}"),
    ({"x-message-ttl": "soon"}, f"invalid arg 'x-message-ttl' for {WHERE}: "
                                "\"expected integer, got longstr\""),
    ({"x-dead-letter-strategy": "sometimes"},
     f"invalid arg 'x-dead-letter-strategy' for {WHERE}: invalid_dlx_strategy"),
    ({"x-expires": 0}, f"invalid arg 'x-expires' for {WHERE}: {{value_zero,0}}"),
    ({"x-expires": -5}, f"invalid arg 'x-expires' for {WHERE}: {{value_negative,-5}}"),
])
def test_quorum_queue_refusals(arguments, text):
    assert refusal(**QUORUM, **arguments) == f"PRECONDITION_FAILED - {text}"


@pytest.mark.parametrize("key", ["x-message-ttl", "x-expires", "x-dead-letter-exchange",
                                 "x-dead-letter-routing-key"])
def test_classic_queues_still_refuse_ttl_and_dead_lettering(key):
    value = 1000 if key in ("x-message-ttl", "x-expires") else "x"
    assert refusal(**{key: value}) == (
        f"PRECONDITION_FAILED - invalid arg '{key}' for {WHERE}: quorumqueue does not "
        "support it yet (it would be silently ignored)")
