"""AMQP timestamps read and written as the 64-bit integers they are.

pamqp decodes field type 'T' and the `timestamp` property into a `datetime`, which
ends at the year 9999 (a later one was a 501 FRAME_ERROR here), and takes a value
above 2**32 for milliseconds (it divides by 1000, so 2**40 seconds came back as the
year 2004). RabbitMQ keeps the integer. `install()` puts a decoder and an encoder of
`Timestamp` into pamqp's type tables, which pamqp's method, property and table codecs
look up by name on every call: decoded timestamps are `Timestamp`s, and a `Timestamp`
(or a `datetime`, or a plain int for the property) is written as 8 octets. A value
that kept its wire type (field_values.py: a declare's argument) is written as that type.

Installed once, when the codec is first imported (properties.py). The tables are
pamqp's own module state, so everything decoded by pamqp in this process agrees,
the shovel's AMQP client (aiormq, also pamqp) included.
"""

from __future__ import annotations

import struct

from pamqp import decode as pamqp_decode
from pamqp import encode as pamqp_encode

from ..field_values import TYPED, Timestamp

_u64 = struct.Struct(">Q")
_pamqp_table_value = pamqp_encode.encode_table_value
_pamqp_timestamp = pamqp_encode.timestamp


def decode_timestamp(data: bytes) -> tuple[int, Timestamp]:
    """(octets used, the timestamp) from 8 octets; ValueError when fewer arrive."""
    if len(data) < 8:
        raise ValueError("Could not unpack timestamp value")
    return 8, Timestamp(_u64.unpack_from(data)[0])


def encode_timestamp(value) -> bytes:
    if isinstance(value, int) and not isinstance(value, bool):
        return _u64.pack(value)
    return _pamqp_timestamp(value)  # a datetime or time.struct_time


_TYPED_FORMATS = {kind: struct.Struct(">" + kind.form) for kind in TYPED.values()}


def encode_table_value(value) -> bytes:
    if isinstance(value, Timestamp):
        return b"T" + _u64.pack(value)
    form = _TYPED_FORMATS.get(type(value))
    if form is not None:  # a value that kept its wire type goes out as it came
        return value.code + form.pack(value)
    return _pamqp_table_value(value)


def install() -> None:
    pamqp_decode.TABLE_MAPPING[b"T"] = decode_timestamp
    pamqp_decode.METHODS["timestamp"] = decode_timestamp
    pamqp_encode.METHODS["timestamp"] = encode_timestamp
    pamqp_encode.timestamp = encode_timestamp
    pamqp_encode.encode_table_value = encode_table_value
