"""AMQP field values that Python has no type of its own for.

`Timestamp` is field type 'T' and the `timestamp` property: seconds since the epoch,
a 64-bit unsigned integer on the wire. RabbitMQ keeps the integer as it came, so a
timestamp past the year 9999 (which `datetime` cannot hold) is stored and delivered
unchanged. It is an `int`, so it compares equal to the integer of the same value, as
RabbitMQ's headers exchange and argument equivalence compare them (Erlang's ==), and
keeps its own type where RabbitMQ names it ("timestamp" in errors, the type class of
argument equivalence, the metadata file's {"$timestamp": seconds}).

The other classes keep the wire type of a declare's argument where Python's int and
float lose it: RabbitMQ holds every field as {Type, Value} and names the type in its
errors ("received none but current is the value '10' of type 'byte'"), and aio-pika
(pamqp) sends 10 as a byte where pika and the Java client send a signedint. A
queue.declare's or exchange.declare's arguments decoded from the wire carry them
(amqp/codec.py), the metadata file keeps them ({"$byte": 10}), and `field_type`
(queues/types.py) names them. Type 'I' (signedint) and 'd' (double) stay plain: a
plain int or float is named from its value, as pika and the Java client encode it.

Beside config_values.py below every layer: the codec (amqp) reads and writes them,
the metadata file (storage) keeps them, and neither may import the other.
"""

from __future__ import annotations


class Timestamp(int):
    """Seconds since 1970-01-01 UTC, 0 <= value < 2**64."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Timestamp({int(self)})"


class FieldInt(int):
    """An integer that keeps the AMQP field type it arrived as."""

    __slots__ = ()
    code = b""   # the field type octet
    name = ""    # RabbitMQ's name for the type
    form = ""    # its struct format

    __str__ = int.__repr__  # f"{value}" is the number, as for a plain int

    def __repr__(self) -> str:
        return f"{type(self).__name__}({int(self)})"


class Byte(FieldInt):
    __slots__ = ()
    code, name, form = b"b", "byte", "b"


class UnsignedByte(FieldInt):
    __slots__ = ()
    code, name, form = b"B", "unsignedbyte", "B"


class Short(FieldInt):
    __slots__ = ()
    code, name, form = b"s", "short", "h"


class UnsignedShort(FieldInt):
    __slots__ = ()
    code, name, form = b"u", "unsignedshort", "H"


class UnsignedInt(FieldInt):
    __slots__ = ()
    code, name, form = b"i", "unsignedint", "I"


class Long(FieldInt):
    __slots__ = ()
    code, name, form = b"l", "long", "q"


class Float(float):
    """A 32-bit float field ('f'), which RabbitMQ names 'float' (a 'd' is 'double')."""

    __slots__ = ()
    code, name, form = b"f", "float", "f"

    __str__ = float.__repr__

    def __repr__(self) -> str:
        return f"Float({float(self)!r})"


# the field types kept, by their code octet
TYPED = {ord(kind.code): kind for kind in (Byte, UnsignedByte, Short, UnsignedShort,
                                           UnsignedInt, Long, Float)}
# by RabbitMQ's name, for the metadata file's {"$name": value}
BY_NAME = {kind.name: kind for kind in TYPED.values()}
# what keeps a wire type
KEPT = (FieldInt, Float)


def plain(value):
    """`value` as the plain int or float it equals when it kept a wire type (what a
    JSON view shows: 10, not {"$byte": 10}); anything else unchanged."""
    if isinstance(value, FieldInt):
        return int(value)
    return float(value) if isinstance(value, Float) else value
