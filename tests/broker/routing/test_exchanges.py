"""The four exchange types as RabbitMQ routes them (AMQP 0-9-1 spec 3.1.3).

Tables of (bindings, routing key or headers, expected destinations) for direct,
fanout, topic (rabbit_exchange_type_topic: words split on '.', '*' is exactly one
word, '#' zero or more) and headers (rabbit_exchange_type_headers: x-match all/any,
and any-with-x/all-with-x which also compare 'x-' keys; a void binding value only
requires the header to be present). Then binding identity, and a Hypothesis property
that the topic trie agrees with a regex reference matcher.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quorumqueue.broker.routing.exchanges import (EXCHANGE, QUEUE, Binding, Destination,
                                                   Exchange, freeze, headers_match,
                                                   x_match_refusal)


def queue(name: str) -> Destination:
    return Destination(QUEUE, name)


def exchange_with(exchange_type: str, bindings: list[tuple[str, str] | tuple[str, str, dict]]
                  ) -> Exchange:
    exchange = Exchange("/", "x", exchange_type)
    for item in bindings:
        destination, routing_key = item[0], item[1]
        arguments = item[2] if len(item) > 2 else {}
        exchange.add_binding(Binding("x", queue(destination), routing_key, freeze(arguments)))
    return exchange


def routed(exchange: Exchange, routing_key: str, headers: dict | None = None) -> set[str]:
    return {d.name for d in exchange.route(routing_key, lambda: headers)}


# ---------------------------------------------------------------- direct and fanout


@pytest.mark.parametrize("key, expected", [
    ("a", {"q1", "q2"}),
    ("b", {"q1"}),
    ("", {"q3"}),
    ("A", set()),
    ("a.b", set()),
    ("ä", {"q4"}),
])
def test_direct_routes_on_exact_routing_key(key, expected):
    """spec 3.1.3.1: a direct exchange routes to bindings whose key equals the routing
    key, byte for byte; one queue bound twice gets the message once."""
    exchange = exchange_with("direct", [("q1", "a"), ("q1", "b"), ("q2", "a"), ("q3", ""),
                                        ("q4", "ä")])
    assert routed(exchange, key) == expected
    assert len(list(exchange.route(key, lambda: None))) == len(expected)


@pytest.mark.parametrize("key", ["", "anything", "a.b.c", "#"])
def test_fanout_ignores_the_routing_key(key):
    """spec 3.1.3.2: a fanout exchange routes to every bound queue."""
    exchange = exchange_with("fanout", [("q1", "x"), ("q2", ""), ("q1", "y")])
    assert routed(exchange, key) == {"q1", "q2"}


# ---------------------------------------------------------------- topic


TOPIC_TABLE = [
    # pattern, routing key, matches
    ("a.b.c", "a.b.c", True),
    ("a.b.c", "a.b", False),
    ("a.*.c", "a.b.c", True),
    ("a.*.c", "a.c", False),
    ("a.*.c", "a.b.b.c", False),
    ("*", "a", True),
    ("*", "", False),
    ("*", "a.b", False),
    ("*.*", "a.b", True),
    ("#", "", True),            # '#' matches zero words
    ("#", "a", True),
    ("#", "a.b.c", True),
    ("a.#", "a", True),         # ... including zero words after 'a'
    ("a.#", "a.b.c", True),
    ("a.#", "b.a", False),
    ("#.a", "a", True),
    ("#.a", "x.y.a", True),
    ("#.a", "a.x", False),
    ("a.#.b", "a.b", True),     # zero words between
    ("a.#.b", "a.x.b", True),
    ("a.#.b", "a.x.y.z.b", True),
    ("a.#.b", "a.b.c", False),
    ("a.#.b", "a.b.b", True),
    ("#.#", "", True),
    ("#.*", "", False),
    ("#.*", "a", True),
    ("*.#.*", "a", False),
    ("*.#.*", "a.b", True),
    ("", "", True),             # empty pattern matches only the empty key
    ("", "a", False),
    ("a", "", False),
    ("a..b", "a..b", True),     # empty words are words
    ("a.*.b", "a..b", True),
    ("a.b", "a..b", False),
    ("*", ".", False),
    ("*.*", ".", True),
    ("#", ".", True),
    ("stock.*.nyse", "stock.usd.nyse", True),
    ("stock.#", "stock", True),
    ("ä.*", "ä.ö", True),
]


@pytest.mark.parametrize("pattern, key, matches", TOPIC_TABLE)
def test_topic_patterns(pattern, key, matches):
    """RabbitMQ topic routing (spec 3.1.3.3): '*' is exactly one word, '#' is zero or
    more words, words are split on '.', and empty words count."""
    exchange = exchange_with("topic", [("q", pattern)])
    assert routed(exchange, key) == ({"q"} if matches else set())


def test_topic_destinations_are_reported_once():
    """RabbitMQ: a queue matched by several bindings gets one copy."""
    exchange = exchange_with("topic", [("q", "#"), ("q", "a.*"), ("q", "a.#"), ("r", "*.b")])
    assert sorted(d.name for d in exchange.route("a.b", lambda: None)) == ["q", "r"]


# ---------------------------------------------------------------- headers


HEADERS_TABLE = [
    # binding arguments, message headers, matches
    ({"x-match": "all", "a": 1, "b": "x"}, {"a": 1, "b": "x"}, True),
    ({"x-match": "all", "a": 1, "b": "x"}, {"a": 1, "b": "x", "c": 3}, True),
    ({"x-match": "all", "a": 1, "b": "x"}, {"a": 1}, False),
    ({"x-match": "all", "a": 1, "b": "x"}, {"a": 2, "b": "x"}, False),
    ({"a": 1}, {"a": 1}, True),                               # x-match defaults to all
    ({"a": 1}, {"a": 2}, False),
    ({"x-match": "all"}, {}, True),                           # nothing to require
    ({"x-match": "all"}, None, True),
    ({"x-match": "any", "a": 1, "b": 2}, {"b": 2}, True),
    ({"x-match": "any", "a": 1, "b": 2}, {"a": 9, "b": 9}, False),
    ({"x-match": "any", "a": 1, "b": 2}, {}, False),
    ({"x-match": "any"}, {"a": 1}, False),                    # any of nothing: no match
    ({"x-match": "any", "a": 1}, None, False),
    # void binding values require presence only
    ({"x-match": "all", "a": None}, {"a": "whatever"}, True),
    ({"x-match": "all", "a": None}, {"a": None}, True),
    ({"x-match": "all", "a": None}, {"b": 1}, False),
    ({"x-match": "any", "a": None, "b": 2}, {"a": 0}, True),
    # x- binding keys are ignored by all/any ...
    ({"x-match": "all", "x-tag": "t", "a": 1}, {"a": 1}, True),
    ({"x-match": "any", "x-tag": "t"}, {"x-tag": "t"}, False),
    # ... and compared by all-with-x / any-with-x
    ({"x-match": "all-with-x", "x-tag": "t", "a": 1}, {"a": 1}, False),
    ({"x-match": "all-with-x", "x-tag": "t", "a": 1}, {"a": 1, "x-tag": "t"}, True),
    ({"x-match": "any-with-x", "x-tag": "t"}, {"x-tag": "t"}, True),
    ({"x-match": "any-with-x", "x-tag": "t", "a": 1}, {"x-tag": "u", "a": 2}, False),
    ({"x-match": "any-with-x", "x-tag": None}, {"x-tag": 1}, True),
    # values compare by type class: a bool is not an int, bytes equal their text
    ({"a": 1}, {"a": True}, False),
    ({"a": True}, {"a": 1}, False),
    ({"a": True}, {"a": True}, True),
    ({"a": "v"}, {"a": b"v"}, True),
    ({"x-match": b"any", "a": 1, "b": 2}, {"b": 2}, True),   # x-match as longstr bytes
    # arrays and tables compare by value
    ({"a": [1, 2]}, {"a": [1, 2]}, True),
    ({"a": [1, 2]}, {"a": [2, 1]}, False),
    ({"t": {"k": 1, "j": "v"}}, {"t": {"j": "v", "k": 1}}, True),
    ({"t": {}}, {"t": {}}, True),
    ({"t": {"k": 1}}, {"t": {"k": 2}}, False),
]


@pytest.mark.parametrize("arguments, headers, matches", HEADERS_TABLE)
def test_headers_matching(arguments, headers, matches):
    """rabbit_exchange_type_headers semantics, one binding at a time."""
    assert headers_match(arguments, headers) is matches
    exchange = exchange_with("headers", [("q", "ignored", arguments)])
    assert routed(exchange, "any key", headers) == ({"q"} if matches else set())


def test_headers_exchange_reads_headers_only_when_it_routes():
    """Only headers exchanges decode message headers (the hot path stays lazy)."""
    calls = []
    exchange = exchange_with("direct", [("q", "k")])
    exchange.route("k", lambda: calls.append(1))
    assert calls == []


# ---------------------------------------------------------------- binding identity


@pytest.mark.parametrize("exchange_type, key", [("direct", "k"), ("fanout", "k"),
                                                 ("topic", "a.*.#"), ("headers", "k")])
def test_adding_and_removing_bindings_is_idempotent(exchange_type, key):
    """RabbitMQ: a binding is (source, destination, key, arguments); binding again is
    a no-op and unbinding what is not bound succeeds without effect."""
    exchange = Exchange("/", "x", exchange_type)
    binding = Binding("x", queue("q"), key, freeze({"x-match": "any", "h": 1}))
    assert exchange.add_binding(binding) is True
    assert exchange.add_binding(binding) is False
    assert list(exchange.bindings) == [binding]
    message_key = "a.b" if exchange_type == "topic" else "k"
    assert routed(exchange, message_key, {"h": 1}) == {"q"}
    assert exchange.remove_binding(binding) is True
    assert exchange.remove_binding(binding) is False
    assert routed(exchange, message_key, {"h": 1}) == set()
    assert exchange._direct == {} and exchange._topic.children == {}


@pytest.mark.parametrize("exchange_type, keys, message_key, routed_after_first", [
    ("direct", ("k", "k"), "k", {"q"}),
    ("direct", ("k", "j"), "k", set()),
    ("direct", ("k", "j"), "j", {"q"}),
    ("topic", ("a.*", "a.*"), "a.b", {"q"}),
    ("topic", ("a.*", "#"), "a.b", {"q"}),
    ("topic", ("a.*", "b.#"), "a.b", set()),
])
def test_removing_one_of_two_bindings_to_a_queue_keeps_the_other(exchange_type, keys,
                                                                  message_key,
                                                                  routed_after_first):
    """Two bindings to the same queue (different keys, or the same key with different
    arguments) are distinct: removing one leaves the other routing."""
    exchange = Exchange("/", "x", exchange_type)
    first = Binding("x", queue("q"), keys[0], freeze({}))
    second = Binding("x", queue("q"), keys[1], freeze({"n": 2}))
    exchange.add_binding(first)
    exchange.add_binding(second)
    exchange.remove_binding(first)
    assert routed(exchange, message_key) == routed_after_first
    exchange.remove_binding(second)
    assert routed(exchange, message_key) == set()


def test_binding_arguments_are_compared_order_independently():
    """RabbitMQ binding identity: argument tables compare by content, not order."""
    exchange = Exchange("/", "x", "headers")
    exchange.add_binding(Binding("x", queue("q"), "", freeze({"a": 1, "b": {"c": [1, 2]}})))
    again = Binding("x", queue("q"), "", freeze({"b": {"c": [1, 2]}, "a": 1}))
    assert exchange.add_binding(again) is False
    assert routed(exchange, "", {"b": {"c": [1, 2]}, "a": 1}) == {"q"}


def test_bindings_to_selects_one_destination():
    """Bindings to a queue and to an exchange of the same name are distinct."""
    exchange = exchange_with("direct", [("q1", "a"), ("q2", "a"), ("q1", "b")])
    exchange.add_binding(Binding("x", Destination(EXCHANGE, "q1"), "a", freeze({})))
    assert {b.routing_key for b in exchange.bindings_to(queue("q1"))} == {"a", "b"}
    assert len(exchange.bindings_to(Destination(EXCHANGE, "q1"))) == 1


# ---------------------------------------------------------------- topic property


def reference_topic_match(pattern: str, key: str) -> bool:
    """A regex rendering of RabbitMQ's topic rule: every word of the key is followed
    by '.', '*' is one word, '#' any number of words."""
    def words(text: str) -> list[str]:
        return text.split(".") if text else []

    parts = []
    for word in words(pattern):
        if word == "*":
            parts.append(r"[^.]*\.")
        elif word == "#":
            parts.append(r"(?:[^.]*\.)*")
        else:
            parts.append(re.escape(word) + r"\.")
    subject = "".join(word + "." for word in words(key))
    return re.fullmatch("".join(parts), subject) is not None


pattern_words = st.sampled_from(["a", "b", "c", "", "*", "#", "ab"])
key_words = st.sampled_from(["a", "b", "c", "", "ab", "*", "#"])
patterns = st.lists(pattern_words, max_size=6).map(".".join)
keys = st.lists(key_words, max_size=7).map(".".join)


@pytest.mark.parametrize("pattern, key, matches", TOPIC_TABLE)
def test_reference_matcher_agrees_with_the_table(pattern, key, matches):
    """The regex reference itself encodes RabbitMQ's topic table."""
    assert reference_topic_match(pattern, key) is matches


@settings(max_examples=300, deadline=None)
@given(bound=st.lists(patterns, min_size=1, max_size=6), messages=st.lists(keys, max_size=8),
       removed=st.sets(st.integers(min_value=0, max_value=5)))
def test_topic_trie_agrees_with_the_regex_reference(bound, messages, removed):
    """For random patterns bound to one queue each, every routing key reaches exactly
    the queues whose pattern the reference matcher accepts, before and after some of
    the bindings are removed again (the trie prunes without losing other routes)."""
    exchange = Exchange("/", "t", "topic")
    for index, pattern in enumerate(bound):
        exchange.add_binding(Binding("t", queue(f"q{index}"), pattern, ()))
    for key in messages:
        assert routed(exchange, key) == {f"q{i}" for i, pattern in enumerate(bound)
                                         if reference_topic_match(pattern, key)}
    for index in removed:
        if index < len(bound):
            exchange.remove_binding(Binding("t", queue(f"q{index}"), bound[index], ()))
    for key in messages:
        assert routed(exchange, key) == {f"q{i}" for i, pattern in enumerate(bound)
                                         if i not in removed
                                         and reference_topic_match(pattern, key)}


@pytest.mark.parametrize("exchange_type, arguments, refusal", [
    ("headers", {}, None),
    ("headers", {"x-match": "all"}, None),
    ("headers", {"x-match": "any-with-x"}, None),
    ("headers", {"x-match": b"any"}, None),       # a long string pamqp left undecoded
    ("headers", {"x-match": "ALL"}, "value"),
    ("headers", {"x-match": ""}, "value"),
    ("headers", {"x-match": 1}, "type"),
    ("headers", {"x-match": bytearray(b"all")}, "type"),  # 'x', not a long string
    ("headers", {"x-match": ["all"]}, "type"),
    ("direct", {"x-match": "none"}, None),         # only the headers type checks
])
def test_x_match_is_validated_on_headers_bindings(exchange_type, arguments, refusal):
    """rabbit_exchange_type_headers:validate_binding: x-match is absent or the long
    string all, any, all-with-x or any-with-x."""
    assert x_match_refusal(exchange_type, arguments) == refusal
