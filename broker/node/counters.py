"""The node's message and connection counters: plain ints the hot path adds to.

Responsibilities: count what RabbitMQ's `rabbit_global_counters` count (messages
received, routed, confirmed, delivered, acknowledged; connections and channels opened
and closed), so the Prometheus endpoint (broker/metrics/) can report them as
rabbitmq_prometheus does.

How it works: the publish, delivery, settlement and confirm paths add to fields of one
`Counters` per node (a slotted object: an attribute add, no lock, no call into a
metrics library); deliveries, redeliveries and acks are counted per queue type, as
RabbitMQ labels them `queue_type`. Whatever is a gauge (connections, channels,
consumers, queue depths) is not counted here: the collector reads it from the node at
scrape time.

Invariants: counters only grow, from 0 at the node's start (Prometheus counters
restart with the process).

Not here: the exposition format and the HTTP listener (broker/metrics/).
"""

from __future__ import annotations


class TypeCounters:
    """Deliveries and acks of one queue type (RabbitMQ's `queue_type` label)."""

    __slots__ = ("consume_manual_ack", "consume_auto_ack", "get_manual_ack", "get_auto_ack",
                 "redelivered", "acknowledged")

    def __init__(self) -> None:
        self.consume_manual_ack = 0   # basic.deliver to a consumer that acks
        self.consume_auto_ack = 0     # basic.deliver to a no-ack consumer
        self.get_manual_ack = 0       # basic.get-ok, no_ack=false
        self.get_auto_ack = 0         # basic.get-ok, no_ack=true
        self.redelivered = 0          # deliveries and get-oks with redelivered set
        self.acknowledged = 0         # deliveries settled by basic.ack

    @property
    def delivered(self) -> int:
        return (self.consume_manual_ack + self.consume_auto_ack + self.get_manual_ack
                + self.get_auto_ack)


class ByType(dict):
    """queue type name -> its TypeCounters, made on first use (a plain dict lookup on
    the delivery path, no method call)."""

    def __missing__(self, queue_type: str) -> TypeCounters:
        counters = self[queue_type] = TypeCounters()
        return counters


class Counters:
    __slots__ = ("received", "received_confirm", "routed", "unroutable_dropped",
                 "unroutable_returned", "confirmed", "by_type", "connections_opened",
                 "connections_closed", "channels_opened", "channels_closed")

    def __init__(self) -> None:
        self.received = 0             # basic.publish bodies complete (any exchange)
        self.received_confirm = 0     # of those, on a channel in confirm mode
        self.routed = 0               # published and routed to at least one queue
        self.unroutable_dropped = 0   # routed nowhere, not mandatory
        self.unroutable_returned = 0  # routed nowhere, mandatory: basic.return
        self.confirmed = 0            # basic.ack publisher confirms sent (per message)
        # queue type name ("classic", "quorum") -> its deliveries and acks
        self.by_type: dict[str, TypeCounters] = ByType()
        self.connections_opened = 0   # TCP connections accepted
        self.connections_closed = 0
        self.channels_opened = 0
        self.channels_closed = 0

    def of(self, queue_type: str) -> TypeCounters:
        return self.by_type[queue_type]

    def message_stats(self) -> dict[str, int]:
        """RabbitMQ's overview `message_stats` counts (all queue types): what the
        management API reports for this node, and what a node tells the one answering
        an API request (cluster/replica_rpc.py "message_stats")."""
        types = list(self.by_type.values())
        deliver = sum(t.consume_manual_ack for t in types)
        deliver_no_ack = sum(t.consume_auto_ack for t in types)
        get = sum(t.get_manual_ack for t in types)
        get_no_ack = sum(t.get_auto_ack for t in types)
        return {"publish": self.received, "confirm": self.confirmed,
                "return_unroutable": self.unroutable_returned,
                "drop_unroutable": self.unroutable_dropped,
                "deliver": deliver, "deliver_no_ack": deliver_no_ack, "get": get,
                "get_no_ack": get_no_ack,
                "deliver_get": deliver + deliver_no_ack + get + get_no_ack,
                "redeliver": sum(t.redelivered for t in types),
                "ack": sum(t.acknowledged for t in types)}
