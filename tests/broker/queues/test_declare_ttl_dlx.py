"""queue.declare validation of the TTL and dead-letter arguments (broker/queues/types.py):
quorum queues take x-message-ttl, x-expires, x-dead-letter-exchange, x-dead-letter-routing-key
and x-dead-letter-strategy (at-most-once, at-least-once), classic queues the same but
the strategy, and x-overflow reject-publish-dlx (classic queues only); RabbitMQ's
refusals for bad values."""

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


def test_classic_queues_accept_ttls_dead_lettering_and_reject_publish_dlx():
    spec = declare(**{"x-message-ttl": 0, "x-expires": 1, "x-dead-letter-exchange": "dlx",
                      "x-dead-letter-routing-key": "k", "x-overflow": "reject-publish-dlx",
                      "x-max-length": 1})
    assert spec.type == "classic" and spec.overflow == "reject-publish-dlx"


@pytest.mark.parametrize("arguments, text", [
    ({"x-message-ttl": -1}, f"invalid arg 'x-message-ttl' for {WHERE}: {{value_negative,-1}}"),
    ({"x-expires": 0}, f"invalid arg 'x-expires' for {WHERE}: {{value_zero,0}}"),
    # rabbit_amqqueue's check_dlxrk_arg, on every queue type
    ({"x-dead-letter-routing-key": "k"},
     f"invalid arg 'x-dead-letter-routing-key' for {WHERE}: routing_key_but_no_dlx_defined"),
    ({"x-dead-letter-strategy": "at-most-once"},
     f"invalid arg 'x-dead-letter-strategy' for {WHERE} of queue type rabbit_classic_queue"),
])
def test_classic_queue_refusals(arguments, text):
    assert refusal(**arguments) == f"PRECONDITION_FAILED - {text}"


def test_quorum_queues_refuse_reject_publish_dlx_as_their_guide_says():
    """The quorum queues guide ("Feature Comparison", "Length Limit"): quorum queues do
    not support reject-publish-dlx; refused rather than silently made drop-head."""
    assert refusal(**QUORUM, **{"x-overflow": "reject-publish-dlx"}) == (
        f"PRECONDITION_FAILED - invalid arg 'x-overflow' for {WHERE}: reject-publish-dlx "
        "is not supported by quorum queues (classic queues only)")
    assert refusal(**QUORUM, **{"x-dead-letter-routing-key": "k"}).endswith(
        "routing_key_but_no_dlx_defined")


def test_a_recorded_declaration_an_earlier_build_accepted_is_still_recovered():
    """Quorum queues took x-dead-letter-routing-key without an exchange before the
    check came: replaying the metadata (recorded=True) keeps such a queue."""
    spec = validate_declaration("q", "/", True, False, False,
                                {**QUORUM, "x-dead-letter-routing-key": "k"}, recorded=True)
    assert spec.type == "quorum"


def test_x_queue_master_locator_is_the_leader_locator_rabbitmq_4_still_reads():
    """RabbitMQ 4's deprecated feature queue_master_locator (permitted by default):
    x-queue-master-locator (and the policy key queue-master-locator) are read where
    queue-leader-locator is not set, their values mapped as the leader locator's
    (rabbit_queue_location:leader_locator); an unknown value is refused."""
    from quorumqueue.broker.queues.settings import leader_locator

    spec = validate_declaration("q", "/", True, False, False,
                                {"x-queue-master-locator": "min-masters"})
    assert spec.type == "classic"
    assert leader_locator({"x-queue-master-locator": "min-masters"}, None,
                          "client-local") == "balanced"
    assert leader_locator({"x-queue-master-locator": "min-masters",
                           "x-queue-leader-locator": "client-local"}, None,
                          "balanced") == "client-local"
    text = refusal(**{"x-queue-master-locator": "somewhere"})
    assert text == (f"PRECONDITION_FAILED - invalid arg 'x-queue-master-locator' for "
                    f"{WHERE}: invalid_queue_locator_arg")
