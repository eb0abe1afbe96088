"""A virtual host: its exchanges, queues and bindings, and message routing. Pure.

Responsibilities: declare/delete exchanges and queues with RabbitMQ's checks (reserved
`amq.` names, the default exchange, property equivalence), bindings between exchanges
and queues, auto-delete of exchanges that lose their last binding, and `route()`,
which follows exchange-to-exchange bindings and alternate exchanges.

Invariants: every binding is held by its source exchange; the default exchange ""
routes to the queue named by the routing key and holds no explicit bindings;
`amq.*` exchanges exist for the vhost's whole life.
Not here: messages and consumers (queues, channels), persistence (node).
"""

from __future__ import annotations

from typing import Callable

from ..amqp import spec
from ..amqp.errors import AMQPError, access_refused, not_found, precondition
from ..queues.base import Queue
from ..queues.types import field_type
from ..routing.exchanges import (EXCHANGE, EXCHANGE_TYPES, QUEUE, Binding, Destination,
                                 Exchange, freeze, x_match_refusal)
from .field_terms import erlang_term, same_argument, shown

PREDECLARED = (("", "direct"), ("amq.direct", "direct"), ("amq.fanout", "fanout"),
               ("amq.topic", "topic"), ("amq.headers", "headers"), ("amq.match", "headers"))
DEFAULT_EXCHANGE_REFUSED = "operation not permitted on the default exchange"
# the only exchange argument RabbitMQ compares on redeclare
EXCHANGE_EQUIVALENCE_KEYS = ("alternate-exchange",)


class VHost:
    def __init__(self, name: str) -> None:
        self.name = name
        self.exchanges: dict[str, Exchange] = {}
        self.queues: dict[str, Queue] = {}
        # rabbitmqctl set_vhost_limits: "max-connections", "max-queues" -> a count (a
        # negative one is no limit); enforced by the node (node/limits.py)
        self.limits: dict[str, int] = {}
        for exchange_name, exchange_type in PREDECLARED:
            self.exchanges[exchange_name] = Exchange(name, exchange_name, exchange_type)

    # ------------------------------------------------------------ lookups

    def exchange(self, name: str) -> Exchange:
        exchange = self.exchanges.get(name)
        if exchange is None:
            raise not_found("exchange", name, self.name)
        return exchange

    def queue(self, name: str) -> Queue:
        queue = self.queues.get(name)
        if queue is None:
            raise not_found("queue", name, self.name)
        return queue

    # ------------------------------------------------------------ exchanges

    def declare_exchange(self, name: str, exchange_type: str, passive: bool, durable: bool,
                         auto_delete: bool, internal: bool, arguments: dict) -> tuple[Exchange, bool]:
        """Returns (exchange, created)."""
        if name == "":
            raise access_refused(DEFAULT_EXCHANGE_REFUSED)
        existing = self.exchanges.get(name)
        if passive:
            if existing is None:
                raise not_found("exchange", name, self.name)
            return existing, False
        if existing is None and name.startswith("amq."):
            raise access_refused(f"exchange name '{name}' contains reserved prefix 'amq.*'")
        if exchange_type not in EXCHANGE_TYPES:
            raise AMQPError(spec.COMMAND_INVALID, f"unknown exchange type '{exchange_type}'")
        if existing is not None:
            where = f"exchange '{name}' in vhost '{self.name}'"
            for field_name, received, current in (
                    ("type", exchange_type, existing.type),
                    ("durable", durable, existing.durable),
                    ("auto_delete", auto_delete, existing.auto_delete),
                    ("internal", internal, existing.internal)):
                if received != current:
                    raise precondition(f"inequivalent arg '{field_name}' for {where}: "
                                       f"received '{shown(received)}' but current is "
                                       f"'{shown(current)}'")
            _check_arguments_equivalent(arguments, existing.arguments, where,
                                        EXCHANGE_EQUIVALENCE_KEYS)
            return existing, False
        exchange = Exchange(self.name, name, exchange_type, durable, auto_delete, internal,
                            dict(arguments))
        self.exchanges[name] = exchange
        return exchange, True

    def check_new_exchange(self, name: str, exchange_type: str) -> None:
        """What declare_exchange refuses for an exchange that does not exist yet."""
        if name == "":
            raise access_refused(DEFAULT_EXCHANGE_REFUSED)
        if name.startswith("amq."):
            raise access_refused(f"exchange name '{name}' contains reserved prefix 'amq.*'")
        if exchange_type not in EXCHANGE_TYPES:
            raise AMQPError(spec.COMMAND_INVALID, f"unknown exchange type '{exchange_type}'")

    def check_delete_exchange(self, name: str, if_unused: bool) -> None:
        """What delete_exchange refuses, without deleting."""
        if name == "":
            raise access_refused(DEFAULT_EXCHANGE_REFUSED)
        if name.startswith("amq."):
            raise access_refused(f"deletion of system exchange '{name}' in vhost "
                                 f"'{self.name}' not allowed")
        exchange = self.exchanges.get(name)
        if exchange is not None and if_unused and exchange.bindings:
            raise precondition(f"exchange '{name}' in vhost '{self.name}' in use")

    def check_binding(self, source: str, destination: Destination, unbind: bool,
                      arguments: dict | None = None) -> None:
        """What bind refuses (unknown source or destination, the default exchange,
        arguments the source's type refuses: a headers exchange's x-match); unbinding
        what is missing is fine, as in RabbitMQ."""
        if source == "" or (destination.kind == EXCHANGE and destination.name == ""):
            raise access_refused(DEFAULT_EXCHANGE_REFUSED)
        if unbind:
            return
        if destination.kind == QUEUE:
            self.queue(destination.name)
        else:
            self.exchange(destination.name)
        arguments = arguments or {}
        refusal = x_match_refusal(self.exchange(source).type, arguments)
        if refusal == "value":  # rabbit_exchange_type_headers:validate_binding's texts
            raise precondition(f"Invalid x-match field value {erlang_term(arguments['x-match'])}"
                               "; expected all, any, all-with-x, or any-with-x")
        if refusal == "type":
            x_match = arguments["x-match"]
            raise precondition(f"Invalid x-match field type {field_type(x_match)} (value "
                               f"{erlang_term(x_match)}); expected longstr")

    def delete_exchange(self, name: str, if_unused: bool) -> Exchange | None:
        if name == "":
            raise access_refused(DEFAULT_EXCHANGE_REFUSED)
        if name.startswith("amq."):  # RabbitMQ refuses the name, declared or not
            raise access_refused(f"deletion of system exchange '{name}' in vhost "
                                 f"'{self.name}' not allowed")
        exchange = self.exchanges.get(name)
        if exchange is None:
            return None  # deleting what does not exist succeeds, as in RabbitMQ
        if if_unused and exchange.bindings:  # RabbitMQ: only bindings *from* it count
            raise precondition(f"exchange '{name}' in vhost '{self.name}' in use")
        self._remove_exchange(exchange)
        return exchange

    def _remove_exchange(self, exchange: Exchange) -> None:
        del self.exchanges[exchange.name]
        self.remove_bindings_to(Destination(EXCHANGE, exchange.name))

    # ------------------------------------------------------------ bindings

    def bind(self, source: str, destination: Destination, routing_key: str,
             arguments: dict) -> Binding | None:
        """Returns the new binding, or None when it already existed."""
        if source == "" or (destination.kind == EXCHANGE and destination.name == ""):
            raise access_refused(DEFAULT_EXCHANGE_REFUSED)
        if destination.kind == QUEUE:
            self.queue(destination.name)
        else:
            self.exchange(destination.name)
        exchange = self.exchange(source)
        binding = Binding(source, destination, routing_key, freeze(arguments))
        return binding if exchange.add_binding(binding) else None

    def unbind(self, source: str, destination: Destination, routing_key: str,
               arguments: dict) -> list[Exchange]:
        """Removes a binding (a missing binding, source or destination is fine, as in
        RabbitMQ: unbind-ok). Returns the auto-delete exchanges this removed."""
        if source == "" or (destination.kind == EXCHANGE and destination.name == ""):
            raise access_refused(DEFAULT_EXCHANGE_REFUSED)
        targets = self.queues if destination.kind == QUEUE else self.exchanges
        exchange = self.exchanges.get(source)
        if exchange is None or destination.name not in targets:
            return []
        exchange.remove_binding(Binding(source, destination, routing_key, freeze(arguments)))
        return self._auto_delete([exchange])

    def has_binding(self, source: str, destination: Destination, routing_key: str,
                    arguments: dict) -> bool:
        exchange = self.exchanges.get(source)
        return exchange is not None and (
            Binding(source, destination, routing_key, freeze(arguments)) in exchange.bindings)

    def remove_bindings_to(self, destination: Destination) -> list[Exchange]:
        """Drop every binding to a deleted queue or exchange; returns auto-deleted
        exchanges (which may cascade)."""
        touched = []
        for exchange in list(self.exchanges.values()):
            for binding in exchange.bindings_to(destination):
                exchange.remove_binding(binding)
                touched.append(exchange)
        return self._auto_delete(touched)

    def _auto_delete(self, exchanges: list[Exchange]) -> list[Exchange]:
        deleted = []
        for exchange in exchanges:
            if (exchange.auto_delete and not exchange.bindings
                    and self.exchanges.get(exchange.name) is exchange):
                self._remove_exchange(exchange)
                deleted.append(exchange)
                deleted += self.remove_bindings_to(Destination(EXCHANGE, exchange.name))
        return deleted

    def bindings(self):
        for exchange in self.exchanges.values():
            yield from exchange.bindings

    # ------------------------------------------------------------ routing

    def route(self, exchange: Exchange, routing_key: str,
              headers: Callable[[], dict | None], selected_keys: tuple = ()) -> list[Queue]:
        """Queues a message published to `exchange` reaches, each once. With
        `selected_keys` (CC and BCC), every exchange on the way routes by the routing
        key and each of them, as RabbitMQ routes a message's routing keys."""
        keys = (routing_key, *selected_keys) if selected_keys else (routing_key,)
        if exchange.name == "":
            found = {key: self.queues[key] for key in keys if key in self.queues}
            return list(found.values())
        queues: dict[str, Queue] = {}
        self._route_into(exchange, keys, headers, queues, {exchange.name})
        return list(queues.values())

    def _route_into(self, exchange: Exchange, keys: tuple, headers, queues: dict,
                    visited: set[str]) -> None:
        found_before = len(queues)
        destinations = []
        for key in keys:
            destinations.extend(exchange.route(key, headers))
        for destination in dict.fromkeys(destinations):
            if destination.kind == QUEUE:
                queue = self.queues.get(destination.name)
                if queue is not None:
                    queues[destination.name] = queue
            elif destination.name not in visited:
                visited.add(destination.name)
                target = self.exchanges.get(destination.name)
                if target is not None:
                    self._route_into(target, keys, headers, queues, visited)
        alternate = exchange.alternate_exchange
        if len(queues) == found_before and alternate and alternate not in visited:
            visited.add(alternate)
            target = self.exchanges.get(alternate)
            if target is not None:
                self._route_into(target, keys, headers, queues, visited)


def _check_arguments_equivalent(received: dict, current: dict, where: str,
                                keys: tuple[str, ...]) -> None:
    """RabbitMQ's rabbit_misc:assert_args_equivalent: only `keys` are compared (other
    arguments may differ freely); two present values must be the same term
    (field_terms.same_argument), and are then shown bare, while a missing side shows
    value and type."""
    for key in keys:
        if key in received and key in current:
            if not same_argument(received[key], current[key]):
                raise precondition(
                    f"inequivalent arg '{key}' for {where}: received "
                    f"'{shown(received[key])}' but current is '{shown(current[key])}'")
        elif key in received:
            raise precondition(f"inequivalent arg '{key}' for {where}: received the value "
                               f"'{shown(received[key])}' of type "
                               f"'{field_type(received[key])}' but current is none")
        elif key in current:
            raise precondition(f"inequivalent arg '{key}' for {where}: received none but "
                               f"current is the value '{shown(current[key])}' of type "
                               f"'{field_type(current[key])}'")


check_arguments_equivalent = _check_arguments_equivalent
