"""Operator policies (broker/node/operator_policies.py): which keys they may hold, and
how a policy and an operator policy that apply to the same queue merge, key by key,
as RabbitMQ 4.2's merge_policy_value does (rabbit_policies, rabbit_quorum_queue); then
how the merged definition combines with the queue's own arguments (queues/settings.py):
the lowest of argument, policy and operator policy wins."""

from __future__ import annotations

import pytest

from quorumqueue.broker.fifo.state import fifo_config
from quorumqueue.broker.node.operator_policies import (Effective, effective,
                                                       merged_definition,
                                                       parse_operator_policy)
from quorumqueue.broker.node.policies import PolicyError, parse_policy, quorum_config


def operator(definition, apply_to="all", name="op"):
    return parse_operator_policy("/", name, ".*", definition, 0, apply_to)


def policy(definition, apply_to="all"):
    return parse_policy("/", "p", ".*", definition, 0, apply_to)


@pytest.mark.parametrize("mine, theirs, merged", [
    ({"max-length": 10}, {"max-length": 4}, {"max-length": 4}),
    ({"max-length": 3}, {"max-length": 4}, {"max-length": 3}),
    ({"max-length-bytes": 100}, {"max-length": 4}, {"max-length-bytes": 100, "max-length": 4}),
    ({"delivery-limit": 5}, {"delivery-limit": 8}, {"delivery-limit": 5}),
    # a negative delivery limit is unlimited: the more conservative is the higher
    ({"delivery-limit": -1}, {"delivery-limit": 8}, {"delivery-limit": 8}),
    ({"delivery-limit": 3}, {"delivery-limit": -1}, {"delivery-limit": 3}),
    ({"overflow": "reject-publish"}, {"overflow": "drop-head"}, {"overflow": "drop-head"}),
    ({"target-group-size": 5}, {"target-group-size": 3}, {"target-group-size": 5}),
    ({"queue-leader-locator": "balanced"}, {"max-length": 1},
     {"queue-leader-locator": "balanced", "max-length": 1}),
])
def test_a_policy_and_an_operator_policy_merge_as_rabbitmq_merges_them(mine, theirs, merged):
    apply_to = "quorum_queues"
    assert merged_definition(policy(mine, apply_to), operator(theirs, apply_to)) == merged


def test_the_merged_definition_is_what_a_quorum_queue_gets_and_its_argument_still_counts():
    arguments = {"x-queue-type": "quorum", "x-max-length": 2, "x-delivery-limit": 9}
    applied = effective(policy({"max-length": 10, "delivery-limit": 6}),
                        operator({"max-length": 5, "delivery-limit": 7}))
    assert isinstance(applied, Effective) and applied.definition == {
        "max-length": 5, "delivery-limit": 6}
    config = quorum_config(arguments, applied, fifo_config(arguments))
    assert (config.max_length, config.delivery_limit) == (2, 6)  # argument 2, policy 6
    assert effective(None, None) is None
    alone = policy({"max-length": 1})
    assert effective(alone, None) is alone


@pytest.mark.parametrize("definition, apply_to, message", [
    ({"alternate-exchange": "ae"}, "all",
     "'alternate-exchange' is not a recognised operator policy setting (operator policies "
     "may set: expires, message-ttl, max-length, max-length-bytes, delivery-limit, overflow, "
     "target-group-size, queue-master-locator)"),
    ({"dead-letter-exchange": "dlx"}, "quorum_queues", "'dead-letter-exchange' is not a "
                                                       "recognised operator policy setting"),
    ({"queue-leader-locator": "balanced"}, "quorum_queues", "'queue-leader-locator' is not"),
    # RabbitMQ's operator keys that quorumqueue refuses in any policy
    ({"max-in-memory-bytes": 1}, "all", "key 'max-in-memory-bytes' is not supported"),
    ({"queue-master-locator": "somewhere"}, "all", "is not a valid queue leader locator"),
    ({"max-length": 1}, "exchanges", "operator policies act on queues only"),
    ({"overflow": "reject-publish-dlx"}, "queues",
     "overflow 'reject-publish-dlx' applies to classic queues only"),
    ({}, "all", "operator policy 'op' in vhost '/': the definition must be a non-empty"),
])
def test_an_operator_policy_holds_only_what_rabbitmq_lets_it(definition, apply_to, message):
    with pytest.raises(PolicyError) as refused:
        operator(definition, apply_to)
    assert message in str(refused.value)
