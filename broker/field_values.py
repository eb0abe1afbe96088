"""AMQP field values that Python has no type of its own for.

`Timestamp` is field type 'T' and the `timestamp` property: seconds since the epoch,
a 64-bit unsigned integer on the wire. RabbitMQ keeps the integer as it came, so a
timestamp past the year 9999 (which `datetime` cannot hold) is stored and delivered
unchanged. It is an `int`, so it compares equal to the integer of the same value, as
RabbitMQ's headers exchange and argument equivalence compare them (Erlang's ==), and
keeps its own type where RabbitMQ names it ("timestamp" in errors, the type class of
argument equivalence, the metadata file's {"$timestamp": seconds}).

Beside config_values.py below every layer: the codec (amqp) reads and writes it, the
metadata file (storage) keeps it, and neither may import the other.
"""

from __future__ import annotations


class Timestamp(int):
    """Seconds since 1970-01-01 UTC, 0 <= value < 2**64."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Timestamp({int(self)})"
