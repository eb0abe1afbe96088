"""Policies (broker/node/policies.py): which policy applies, and how its definition
combines with a queue's arguments. The rules are RabbitMQ's (the quorum-queue guide's
"Policy Support" and queue-leader-locator order, the max-length guide's "the minimum
of the two", rabbit_quorum_queue's overflow and delivery-limit resolution)."""

from __future__ import annotations

import pytest

from quorumqueue.broker.fifo.state import FifoConfig, fifo_config
from quorumqueue.broker.queues.settings import dead_letter_target
from quorumqueue.broker.node.policies import (Policy, PolicyError, alternate_exchange,
                                              classic_limits, leader_locator, matching,
                                              parse_policy, quorum_config, target_group_size)


def policy(name="p", pattern=".*", definition=None, priority=0, apply_to="all") -> Policy:
    return parse_policy("/", name, pattern,
                        {"max-length": 10} if definition is None else definition, priority,
                        apply_to)


@pytest.mark.parametrize("arguments, message", [
    (dict(pattern="("), "pattern '(' is not a regular expression"),
    (dict(definition={}), "the definition must be a non-empty JSON object"),
    (dict(definition=[1]), "the definition must be a non-empty JSON object"),
    (dict(definition={"max-length": -1}), "key 'max-length' must be a non-negative integer"),
    (dict(definition={"max-length": "10"}), "key 'max-length' must be a non-negative integer"),
    (dict(definition={"max-length": True}), "key 'max-length' must be a non-negative integer"),
    (dict(definition={"max-length-bytes": 2 ** 63}),
     "key 'max-length-bytes' must be a non-negative integer"),
    (dict(definition={"overflow": "drop-tail"}),
     "key 'overflow' must be 'drop-head', 'reject-publish' or 'reject-publish-dlx'"),
    # quorum queues do not support reject-publish-dlx (their guide): classic_queues only
    (dict(definition={"overflow": "reject-publish-dlx"}),
     "overflow 'reject-publish-dlx' applies to classic queues only"),
    (dict(apply_to="queues", definition={"overflow": "reject-publish-dlx"}),
     "overflow 'reject-publish-dlx' applies to classic queues only"),
    (dict(definition={"delivery-limit": -2}), "key 'delivery-limit' must be an integer"),
    (dict(definition={"queue-leader-locator": "bogus"}),  # RabbitMQ's rabbit_policies text
     'Validation failed: <<"bogus">> is not a valid queue leader locator value'),
    (dict(definition={"queue-leader-locator": 3}),
     "Validation failed: 3 is not a valid queue leader locator value"),
    (dict(definition={"target-group-size": 0}), "key 'target-group-size' must be a positive"),
    (dict(definition={"queue-mode": "lazy"}),
     "key 'queue-mode' is not supported by quorumqueue"),
    (dict(apply_to="quorum_queues", definition={"expires": 0}),
     "key 'expires' must be a positive integer"),
    # classic queues ignore the strategy (RabbitMQ's too): the policy must say quorum_queues
    (dict(definition={"dead-letter-strategy": "at-most-once"}),
     "key 'dead-letter-strategy' applies to quorum queues only"),
    (dict(apply_to="quorum_queues", definition={"message-ttl": -1}),
     "key 'message-ttl' must be a non-negative integer"),
    (dict(apply_to="quorum_queues", definition={"dead-letter-strategy": "sometimes"}),
     "key 'dead-letter-strategy' must be 'at-most-once' or 'at-least-once'"),
    (dict(definition={"ha-mode": "all"}), "key 'ha-mode' is classic queue mirroring, a deprecated feature not permitted"),
    # rabbit_policies' text (a string is refused, as RabbitMQ does: a JSON number only)
    (dict(definition={"consumer-timeout": "86400000"}),
     'Validation failed: <<"86400000">> is not a valid consumer timeout'),
    (dict(definition={"consumer-timeout": -1}),
     "Validation failed: -1 is not a valid consumer timeout"),
    (dict(definition={"max-lenght": 5}), "'max-lenght' is not a recognised policy setting"),
    # an argument only in RabbitMQ (consumers guide, "Single Active Consumer"): RabbitMQ
    # refuses it as an unknown policy key, not as a key it does not support
    (dict(apply_to="quorum_queues", definition={"single-active-consumer": True}),
     "'single-active-consumer' is not a recognised policy setting"),
    (dict(priority="high"), "priority must be an integer"),
    (dict(apply_to="streams"), "apply-to must be one of all, queues, classic_queues"),
    (dict(apply_to="exchanges"), "key 'max-length' does not act on exchanges"),
])
def test_an_invalid_policy_is_refused_naming_the_problem(arguments, message):
    with pytest.raises(PolicyError, match=message.replace("(", r"\(")):
        policy(**arguments)


def test_consumer_timeout_takes_the_lower_of_argument_and_policy():
    # RabbitMQ 4.2's rabbit_channel: args_policy_lookup(<<"consumer-timeout">>, min)
    from quorumqueue.broker.queues.settings import consumer_timeout

    both = policy(definition={"consumer-timeout": 2000}, apply_to="queues")
    assert consumer_timeout({"x-consumer-timeout": 3000}, both) == 2000
    assert consumer_timeout({"x-consumer-timeout": 1000}, both) == 1000
    assert consumer_timeout({}, both) == 2000
    assert consumer_timeout({"x-consumer-timeout": 0}, None) == 0
    assert consumer_timeout({}, None) is None  # the node's consumer_timeout applies


def test_the_highest_priority_matching_policy_applies_and_ties_go_to_the_first_name():
    low = policy("a-low", "^orders", priority=1)
    high = policy("z-high", "^orders", priority=5)
    tie = policy("b-tie", "^orders", priority=5)
    other = policy("other", "^audit", priority=9)
    classic_only = policy("classic", ".*", priority=99, apply_to="classic_queues")
    policies = [low, high, tie, other, classic_only]
    assert matching(policies, "quorum", "orders.eu") is tie
    assert matching(policies, "classic", "orders.eu") is classic_only
    assert matching([low, other], "quorum", "audit-orders") is other  # unanchored
    assert matching([low, other], "quorum", "payments") is None
    assert matching([low], "exchange", "orders") is low  # apply-to all
    assert matching([policy("q", apply_to="queues")], "exchange", "orders") is None


ARGS = {"x-max-length": 100, "x-max-length-bytes": 5000, "x-overflow": "drop-head",
        "x-delivery-limit": 10}


@pytest.mark.parametrize("arguments, definition, expected", [
    # nothing from a policy: the arguments (delivery limit 20 by default, the 4.2 guide)
    ({}, None, FifoConfig(delivery_limit=20)),
    (ARGS, None, FifoConfig(10, max_length=100, max_bytes=5000)),
    # max-length(-bytes): the lower of the two; overflow: the policy's
    (ARGS, {"max-length": 50, "max-length-bytes": 9000, "overflow": "reject-publish"},
     FifoConfig(10, max_length=50, max_bytes=5000, overflow="reject-publish")),
    ({}, {"max-length": 7}, FifoConfig(20, max_length=7)),
    # delivery-limit: the lower; -1 (unlimited) on either side: the higher
    (ARGS, {"delivery-limit": 5}, FifoConfig(5, max_length=100, max_bytes=5000)),
    (ARGS, {"delivery-limit": 50}, FifoConfig(10, max_length=100, max_bytes=5000)),
    (ARGS, {"delivery-limit": -1}, FifoConfig(10, max_length=100, max_bytes=5000)),
    ({"x-delivery-limit": -1}, {"delivery-limit": 3}, FifoConfig(3)),
    ({"x-delivery-limit": -1}, None, FifoConfig(-1)),
    ({}, {"delivery-limit": -1}, FifoConfig(-1)),
    # message-ttl: the lower of argument and policy (the TTL guide)
    ({"x-message-ttl": 5000}, None, FifoConfig(msg_ttl=5000)),
    ({"x-message-ttl": 5000}, {"message-ttl": 900}, FifoConfig(msg_ttl=900)),
    ({"x-message-ttl": 0}, {"message-ttl": 900}, FifoConfig(msg_ttl=0)),
    ({}, {"message-ttl": 900}, FifoConfig(msg_ttl=900)),
    # expires: the lower of argument and policy
    ({"x-expires": 5000}, {"expires": 60000}, FifoConfig(expires=5000)),
    ({}, {"expires": 60000}, FifoConfig(expires=60000)),
    # at-least-once dead lettering (the guide: the strategy, reject-publish and an
    # exchange, "policies (or the equivalent queue arguments)"): the strategy
    # argument wins, overflow is the policy's, and with drop-head it falls back
    ({"x-dead-letter-strategy": "at-least-once", "x-dead-letter-exchange": "dlx"},
     {"overflow": "reject-publish"},
     FifoConfig(overflow="reject-publish", dead_letter_at_least_once=True)),
    ({"x-dead-letter-strategy": "at-most-once", "x-overflow": "reject-publish"},
     {"dead-letter-strategy": "at-least-once", "dead-letter-exchange": "dlx"},
     FifoConfig(overflow="reject-publish")),
    ({}, {"dead-letter-strategy": "at-least-once", "dead-letter-exchange": "",
          "overflow": "reject-publish"},
     FifoConfig(overflow="reject-publish", dead_letter_at_least_once=True)),
    ({}, {"dead-letter-strategy": "at-least-once", "dead-letter-exchange": "dlx"},
     FifoConfig()),
    ({"x-overflow": "reject-publish"}, {"dead-letter-strategy": "at-least-once"},
     FifoConfig(overflow="reject-publish")),  # no dead-letter exchange: no dead lettering
])
def test_a_quorum_queues_settings_combine_its_arguments_and_its_policy(arguments, definition,
                                                                     expected):
    applied = policy(definition=definition, apply_to="quorum_queues") if definition else None
    assert quorum_config(arguments, applied, fifo_config(arguments)) == expected


def test_a_dead_letter_argument_wins_over_the_policy_key_by_key():
    """rabbit_amqqueue's args_policy_lookup for dead-letter-exchange/-routing-key:
    the queue's argument first, then the policy."""
    both = policy(definition={"dead-letter-exchange": "p-dlx",
                              "dead-letter-routing-key": "p-key"}, apply_to="quorum_queues")
    assert dead_letter_target({}, None) is None
    assert dead_letter_target({}, both) == ("p-dlx", "p-key")
    assert dead_letter_target({"x-dead-letter-exchange": "a-dlx"}, both) == ("a-dlx", "p-key")
    assert dead_letter_target({"x-dead-letter-exchange": b"", "x-dead-letter-routing-key":
                               b"a-key"}, both) == ("", "a-key")
    assert dead_letter_target({"x-dead-letter-exchange": "a-dlx"}, None) == ("a-dlx", None)


def test_a_classic_queues_limits_combine_the_same_way_but_its_overflow_is_the_arguments():
    """rabbit_amqqueue_process:process_args_policy: res_min for the limits, res_arg
    for overflow (a quorum queue takes the policy's overflow)."""
    assert classic_limits(ARGS, None) == (100, 5000, "drop-head")
    assert classic_limits(ARGS, policy(definition={"max-length": 3, "overflow":
                                                   "reject-publish"})) == (
        3, 5000, "drop-head")
    assert classic_limits({}, policy(definition={"overflow": "reject-publish"})) == (
        None, None, "reject-publish")
    assert classic_limits({}, None) == (None, None, "drop-head")


def test_leader_locator_target_size_and_alternate_exchange_follow_the_documented_order():
    locating = policy(definition={"queue-leader-locator": "balanced",
                                  "target-group-size": 5})
    argument = {"x-queue-leader-locator": "client-local", "x-quorum-target-group-size": 3}
    # leader locator: policy, then argument, then the configuration (the 4.2 guide)
    assert leader_locator(argument, locating, "client-local") == "balanced"
    # RabbitMQ 4's deprecated locators are accepted and mean balanced
    for deprecated in ("random", "least-leaders", "min-masters"):
        assert leader_locator({}, policy(definition={"queue-leader-locator": deprecated}),
                              "client-local") == "balanced"
        assert leader_locator({"x-queue-leader-locator": deprecated}, None,
                              "client-local") == "balanced"
    assert leader_locator(argument, None, "balanced") == "client-local"
    assert leader_locator({}, None, "balanced") == "balanced"
    # target group size: the highest of argument, policy and configuration (RabbitMQ
    # 4's reconciliation; the 4.2 guide: an operator policy overrides the argument)
    assert target_group_size(argument, locating, 7) == 7
    assert target_group_size(argument, locating, None) == 5
    assert target_group_size({"x-quorum-target-group-size": 6}, locating, None) == 6
    assert target_group_size({}, locating, 2) == 5
    assert target_group_size({}, None, 7) == 7
    assert target_group_size({}, None, None) is None
    # alternate exchange: the argument overrules the policy (RabbitMQ's AE guide)
    routing = policy(definition={"alternate-exchange": "unrouted"}, apply_to="exchanges")
    assert alternate_exchange({"alternate-exchange": "mine"}, routing) == "mine"
    assert alternate_exchange({}, routing) == "unrouted"
    # in a policy for queues only it is accepted, as RabbitMQ accepts it, and no
    # exchange takes it
    for queues in ("queues", "classic_queues", "quorum_queues"):
        for_queues = policy(definition={"alternate-exchange": "unrouted"}, apply_to=queues)
        assert matching([for_queues], "exchange", "any") is None


def test_a_single_active_consumer_queue_keeps_it_whatever_the_policy():
    """x-single-active-consumer is an argument only: the settings a policy gives a
    quorum queue keep it (the leader proposes an UpdateConfig only when these differ
    from the machine's, so a lost flag would be proposed again on every tick)."""
    arguments = {"x-queue-type": "quorum", "x-single-active-consumer": True}
    base = fifo_config(arguments)
    assert base.single_active
    assert quorum_config(arguments, None, base) == base
    limited = quorum_config(arguments, policy(definition={"max-length": 3}), base)
    assert limited.single_active and limited.max_length == 3
    assert not fifo_config({"x-queue-type": "quorum"}).single_active


def test_the_tick_matches_a_quorum_queues_policy_once_per_term_it_leads_not_every_tick():
    """Issue 31, "an idle queue costs nothing per tick": the tick's catch-up for
    settings applied through a log (a new leader, a restart) compares them once per
    term a node leads; before, every idle quorum queue matched every policy on every
    tick. A policy change still reaches each queue at once."""
    from tests.broker.node.harness import Client, new_node

    client = Client(new_node())
    client.handshake()
    client.open_channel(1)
    for number in range(20):
        client.declare_queue(1, f"q{number}", durable=True,
                             arguments={"x-queue-type": "quorum"})
    node = client.node
    matched = []
    original = node.policy_for
    node.policy_for = lambda vhost, kind, name: matched.append(name) or original(vhost, kind,
                                                                                 name)
    node.tick_policies()
    first = len(matched)
    for _ in range(5):
        node.tick_policies()
    assert first <= 20 and len(matched) == first
    queue = node.vhosts["/"].queues["q3"]
    queue.policy_term = queue.raft.term - 1  # as if it had been elected since
    client.publish(1, "", "q3", b"a Ready of q3")  # (an election comes with a Ready)
    node.flush()
    node.tick_policies()
    assert matched[first:] == ["q3"]
