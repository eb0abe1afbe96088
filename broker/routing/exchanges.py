"""Exchanges, bindings and the four routing algorithms. Pure, no I/O.

An `Exchange` owns its outgoing bindings and a type-specific index over them:
- direct: routing key -> destinations;
- fanout: every destination;
- topic: a trie over dot-separated words, `*` = exactly one word, `#` = zero or more;
- headers: bindings checked against the message headers, `x-match` all|any (and
  RabbitMQ's all-with-x / any-with-x, which also compare `x-` keys).

`route()` returns the destinations one exchange selects. Following exchange-to-
exchange bindings and alternate exchanges is the caller's job (routing.table),
because it needs the other exchanges.

Invariants: a binding is identified by (destination, routing key, arguments);
adding an existing binding is a no-op; indexes always reflect `bindings` exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable

EXCHANGE_TYPES = ("direct", "fanout", "topic", "headers")

QUEUE = "queue"
EXCHANGE = "exchange"


@dataclass(frozen=True, slots=True)
class Destination:
    kind: str  # QUEUE or EXCHANGE
    name: str


class FrozenTable(tuple):
    """A field table as sorted (key, frozen value) pairs."""

    __slots__ = ()


class FrozenArray(tuple):
    """A field array as a tuple of frozen values."""

    __slots__ = ()


class FrozenByteArray(bytes):
    """A byte array (field type 'x'), kept apart from a long string's bytes."""

    __slots__ = ()


def freeze(value):
    """Hashable, order-independent form of AMQP field values (for binding identity);
    `thaw` gives the values back as they were, types included."""
    if isinstance(value, dict):
        return FrozenTable(sorted((k, freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)) and not isinstance(value, (FrozenTable, FrozenArray)):
        return FrozenArray(freeze(v) for v in value)
    if isinstance(value, bytearray):
        return FrozenByteArray(value)
    return value


def thaw(value):
    """The field value `freeze` was given."""
    if isinstance(value, FrozenTable):
        return {k: thaw(v) for k, v in value}
    if isinstance(value, FrozenArray):
        return [thaw(v) for v in value]
    if isinstance(value, FrozenByteArray):
        return bytearray(value)
    return value


@dataclass(frozen=True, slots=True)
class Binding:
    source: str
    destination: Destination
    routing_key: str
    arguments: tuple  # freeze(arguments dict)

    @property
    def arguments_dict(self) -> dict:
        return {k: thaw(v) for k, v in self.arguments}


class _TopicTrie:
    """Binding patterns as a trie of words. Matching walks words with `*` and `#`."""

    __slots__ = ("children", "destinations")

    def __init__(self) -> None:
        self.children: dict[str, _TopicTrie] = {}
        self.destinations: dict[Destination, int] = {}  # destination -> binding count

    def add(self, words: list[str], destination: Destination) -> None:
        node = self
        for word in words:
            node = node.children.setdefault(word, _TopicTrie())
        node.destinations[destination] = node.destinations.get(destination, 0) + 1

    def remove(self, words: list[str], destination: Destination) -> None:
        path = [self]
        for word in words:
            path.append(path[-1].children[word])
        leaf = path[-1]
        leaf.destinations[destination] -= 1
        if not leaf.destinations[destination]:
            del leaf.destinations[destination]
        for depth in range(len(words), 0, -1):  # prune empty branches
            node = path[depth]
            if node.children or node.destinations:
                break
            del path[depth - 1].children[words[depth - 1]]

    def match(self, words: list[str], position: int, out: set[Destination]) -> None:
        if position == len(words):
            out.update(self.destinations)
            hash_node = self.children.get("#")
            if hash_node is not None:  # '#' matches zero words
                hash_node.match(words, position, out)
            return
        word_node = self.children.get(words[position])
        if word_node is not None:
            word_node.match(words, position + 1, out)
        star = self.children.get("*")
        if star is not None:
            star.match(words, position + 1, out)
        hash_node = self.children.get("#")
        if hash_node is not None:
            for skip in range(position, len(words) + 1):
                hash_node.match(words, skip, out)


def _topic_words(key: str) -> list[str]:
    return key.split(".") if key else []


def headers_match(binding_arguments: dict, headers: dict | None) -> bool:
    """RabbitMQ's headers-exchange rule for one binding."""
    headers = headers or {}
    x_match = binding_arguments.get("x-match", "all")
    if isinstance(x_match, bytes):
        x_match = x_match.decode("utf-8", "replace")
    with_x = x_match.endswith("-with-x")
    want_all = x_match.startswith("all")
    matched_any = False
    for key, expected in binding_arguments.items():
        if key == "x-match" or (key.startswith("x-") and not with_x):
            continue
        present = key in headers
        ok = present and (expected is None or _field_equal(headers[key], expected))
        if want_all and not ok:
            return False
        if ok:
            matched_any = True
    return True if want_all else matched_any


X_MATCH_VALUES = ("all", "any", "all-with-x", "any-with-x")


def x_match_refusal(exchange_type: str, arguments: dict) -> str | None:
    """What is wrong with a new binding's x-match (rabbit_exchange_type_headers:
    validate_binding): "value" (a long string not in X_MATCH_VALUES), "type" (not a
    long string), or None (another exchange type, no x-match, or a valid one)."""
    if exchange_type != "headers" or "x-match" not in arguments:
        return None
    x_match = arguments["x-match"]
    if isinstance(x_match, bytearray) or not isinstance(x_match, (str, bytes)):
        return "type"
    if isinstance(x_match, bytes):
        x_match = x_match.decode("utf-8", "surrogateescape")
    return None if x_match in X_MATCH_VALUES else "value"


def _field_equal(a, b) -> bool:
    if isinstance(a, bytes) and isinstance(b, str):
        return a == b.encode()
    if isinstance(a, str) and isinstance(b, bytes):
        return a.encode() == b
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (list, tuple, dict)) or isinstance(b, (list, tuple, dict)):
        return freeze(a) == freeze(b)  # binding arguments are kept frozen (tuples)
    return a == b


@dataclass(slots=True)
class Exchange:
    vhost: str
    name: str
    type: str
    durable: bool = True
    auto_delete: bool = False
    internal: bool = False
    arguments: dict = field(default_factory=dict)
    policy_alternate: str | None = None  # a policy's alternate-exchange (node.apply_policies)
    bindings: dict[Binding, None] = field(default_factory=dict)  # insertion-ordered set
    _direct: dict[str, dict[Destination, int]] = field(default_factory=dict)
    _topic: _TopicTrie = field(default_factory=_TopicTrie)

    @property
    def alternate_exchange(self) -> str | None:
        """The argument's, else the policy's (the argument overrules, as RabbitMQ's)."""
        value = self.arguments.get("alternate-exchange")
        if isinstance(value, bytes):
            value = value.decode("utf-8", "surrogateescape")
        return value or self.policy_alternate

    def add_binding(self, binding: Binding) -> bool:
        if binding in self.bindings:
            return False
        self.bindings[binding] = None
        if self.type == "direct":
            bucket = self._direct.setdefault(binding.routing_key, {})
            bucket[binding.destination] = bucket.get(binding.destination, 0) + 1
        elif self.type == "topic":
            self._topic.add(_topic_words(binding.routing_key), binding.destination)
        return True

    def remove_binding(self, binding: Binding) -> bool:
        if binding not in self.bindings:
            return False
        del self.bindings[binding]
        if self.type == "direct":
            bucket = self._direct[binding.routing_key]
            bucket[binding.destination] -= 1
            if not bucket[binding.destination]:
                del bucket[binding.destination]
            if not bucket:
                del self._direct[binding.routing_key]
        elif self.type == "topic":
            self._topic.remove(_topic_words(binding.routing_key), binding.destination)
        return True

    def bindings_to(self, destination: Destination) -> list[Binding]:
        return [b for b in self.bindings if b.destination == destination]

    def route(self, routing_key: str, headers: Callable[[], dict | None]) -> Iterable[Destination]:
        """Destinations selected by this exchange's own bindings. `headers` is called
        only by headers exchanges (decoding headers is the rare path)."""
        if self.type == "direct":
            bucket = self._direct.get(routing_key)
            return bucket.keys() if bucket else ()
        if self.type == "fanout":
            return {b.destination for b in self.bindings}
        if self.type == "topic":
            out: set[Destination] = set()
            self._topic.match(_topic_words(routing_key), 0, out)
            return out
        message_headers = headers()
        return {b.destination for b in self.bindings
                if headers_match(b.arguments_dict, message_headers)}
