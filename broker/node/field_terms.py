"""Decoded field values as RabbitMQ holds them: Erlang terms.

Responsibilities: how RabbitMQ's messages print a field value (`erlang_term`, Erlang's
~p of the term; `shown`, rabbit_misc:val's ~s for binaries and ~p for the rest), and
when two argument values are the same (`same_argument`, rabbit_misc's
assert_args_equivalence).

How it works: RabbitMQ decodes a field into {Type, Value}: every integer type and the
timestamp into an Erlang integer, float and double into a float, long strings and
byte arrays into binaries, a decimal into {Scale, Unscaled}, a table or an array into
a list that keeps each inner value's type. Two arguments are equivalent when their
type classes and values are equal, or, failing that, when their values are
identical (=:=); since every class but int's holds one term kind, that is: the two
values are the same Erlang term. So 1000 as an int and as a timestamp are
equivalent, and 1000.0 (a double), "1000", true or [1000] are not 1000.

Not here: which arguments are compared (vhost.py, queues/types.py), the type names
(queues/types.py field_type: a declare's arguments keep their wire types,
field_values.py; a nested table's integers are named by their size).
"""

from __future__ import annotations

import decimal

from ..queues.types import field_type


def erlang_term(value) -> str:
    """A decoded field value as Erlang's ~p prints RabbitMQ's term for it, for short
    values on one line: strings as binaries, arrays as [{type,value}], tables as
    [{<<"key">>,type,value}]."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, bytes, bytearray)):
        data = value.encode("utf-8", "surrogateescape") if isinstance(value, str) else value
        if data and all(32 <= octet <= 126 for octet in data):
            escaped = bytes(data).decode("ascii").replace("\\", "\\\\").replace('"', '\\"')
            return f'<<"{escaped}">>'
        return "<<" + ",".join(str(octet) for octet in data) + ">>"
    if isinstance(value, float):
        return erlang_float(value)
    if isinstance(value, decimal.Decimal):
        sign, digits, exponent = value.as_tuple()
        unscaled = int("".join(map(str, digits)) or "0") * (-1 if sign else 1)
        return f"{{{-exponent},{unscaled}}}"
    if isinstance(value, dict):
        return "[" + ",".join(f"{{{erlang_term(key)},{field_type(item)},{erlang_term(item)}}}"
                              for key, item in value.items()) + "]"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(f"{{{field_type(item)},{erlang_term(item)}}}"
                              for item in value) + "]"
    return "undefined" if value is None else str(int(value)) if isinstance(value, int) \
        else str(value)


def erlang_float(value: float) -> str:
    """Erlang's ~p of a float (io_lib_format:fwrite_g): the shortest digits that read
    back as the same float, in fixed notation unless scientific is shorter
    (1000.0 is 1.0e3, 100.0 stays 100.0)."""
    if value != value or value in (float("inf"), float("-inf")):
        return repr(value)
    sign = "-" if value < 0 or str(value).startswith("-") else ""
    digits, exponent = _shortest_digits(abs(value))
    # value = 0.d1d2... * 10**exponent
    mantissa = digits[0] + "." + (digits[1:] or "0")
    scientific = f"{sign}{mantissa}e{exponent - 1}"
    if exponent <= 0:
        fixed = f"{sign}0.{'0' * -exponent}{digits}"
    elif exponent >= len(digits):
        fixed = f"{sign}{digits}{'0' * (exponent - len(digits))}.0"
    else:
        fixed = f"{sign}{digits[:exponent]}.{digits[exponent:]}"
    return fixed if len(fixed) <= len(scientific) else scientific


def _shortest_digits(value: float) -> tuple[str, int]:
    """(digits, exponent) with value == 0.digits * 10**exponent, digits the shortest
    that round-trip (Python's repr finds the same ones as Erlang's)."""
    if value == 0:
        return "0", 1
    text = repr(value)
    mantissa, _, power = text.partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = (whole + fraction).lstrip("0")
    leading_zeros = len(whole + fraction) - len((whole + fraction).lstrip("0"))
    exponent = len(whole) - leading_zeros + (int(power) if power else 0)
    digits = digits.rstrip("0") or "0"
    return digits, exponent


def shown(value) -> str:
    """A value as rabbit_misc's inequivalence texts show it: a binary as its text
    (~s), anything else as its term (~p)."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "surrogateescape")
    if isinstance(value, str):
        return value
    return erlang_term(value)


def same_argument(a, b) -> bool:
    """Whether RabbitMQ takes the two decoded values for the same argument."""
    return _term(a) == _term(b)


def _term(value):
    """A comparable stand-in for the Erlang term of `value` (tagged by term kind:
    Python's 1 == 1.0 == True must not hold here)."""
    if isinstance(value, bool):
        return ("atom", value)
    if isinstance(value, int):  # every integer type, Timestamp included
        return ("integer", int(value))
    if isinstance(value, float):
        return ("float", value)
    if isinstance(value, (str, bytes, bytearray)):
        return ("binary", value.encode("utf-8", "surrogateescape") if isinstance(value, str)
                else bytes(value))
    if isinstance(value, decimal.Decimal):
        return ("decimal", value.as_tuple())
    if isinstance(value, dict):
        return ("table", tuple((key, field_type(item), _term(item))
                               for key, item in value.items()))
    if isinstance(value, (list, tuple)):
        return ("array", tuple((field_type(item), _term(item)) for item in value))
    return ("other", value)

