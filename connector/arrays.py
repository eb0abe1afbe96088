"""Arrow arrays from numpy arrays and a few Python values, without `pa.array`.

Responsibilities
    What the lease reader's Arrow batches are built from (schema.py, `_entries_batch`):
    `numeric` (an int32/int64/bool/timestamp column from a numpy array), `small` (a
    short array of Python values of one of the source's types: the distinct property
    values of a read), `repeated` (one value for every row) and `taken` (an array at
    positions). Each is `pa.Array.from_buffers`, `pa.MapArray.from_arrays` or `take`.

Why not `pa.array`
    `pa.array` and `pa.scalar` first ask whether their argument is a pandas object,
    and pyarrow answers that by importing pandas when it is installed (PySpark's
    environment has it). Nothing else in a Spark Python worker that only reads this
    source imports pandas, and Spark starts fresh workers for each query: the import
    cost each of them 0.57 s of CPU (bench/README.md, "The reader's fixed cost per
    query"), more than reading 200,000 messages of 256 B.

Invariants
    - Every function returns exactly what `pa.array(values, type_)` (and
      `.take(positions)`) returns for the same values: tests/connector/test_arrays.py
      holds them equal on random values.
    - Importing this module, or calling it, never imports pandas (the same test file
      checks that in a fresh interpreter).

Not here
    Which column gets which values (schema.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

_FIXED = {pa.int32(): np.int32, pa.int64(): np.int64}


def numeric(values: np.ndarray, type_: pa.DataType, valid: np.ndarray | None = None) -> pa.Array:
    """`values` (numpy, one per row) as an Arrow array of `type_` (int32, int64, bool,
    or a timestamp, whose values are in its unit); `valid`, a bool array, marks the
    rows that are not null (None: all)."""
    count = len(values)
    bitmap = None if valid is None else _bits(valid)
    nulls = 0 if valid is None else int(count - np.count_nonzero(valid))
    if pa.types.is_boolean(type_):
        data = _bits(np.asarray(values, bool))
    else:
        dtype = np.int64 if pa.types.is_timestamp(type_) else _FIXED[type_]
        data = pa.py_buffer(np.ascontiguousarray(values, dtype))
    return pa.Array.from_buffers(type_, count, [bitmap, data], null_count=nulls)


def small(values: Sequence[Any], type_: pa.DataType) -> pa.Array:
    """`values` (Python objects, None for null) as an array of `type_`: string,
    int32, int64, bool, timestamp (in its unit, as `pa.array` takes an int), or
    map<string,string> (each value a list of (key, value) pairs)."""
    valid = np.array([value is not None for value in values], bool)
    if pa.types.is_string(type_):
        return _strings(values, valid)
    if pa.types.is_map(type_):
        return _maps(values, valid, type_)
    dtype = bool if pa.types.is_boolean(type_) else np.int64
    raw = np.array([0 if value is None else value for value in values], dtype)
    return numeric(raw, type_, None if valid.all() else valid)


def repeated(one: pa.Array, count: int) -> pa.Array:
    """The one-item array `one` repeated `count` times."""
    return one.take(numeric(np.zeros(count, np.int32), pa.int32()))


def taken(values: pa.Array, positions: np.ndarray) -> pa.Array:
    """`values` at each of `positions` (int32 numpy)."""
    return values.take(numeric(positions, pa.int32()))


def _bits(flags: np.ndarray) -> pa.Buffer:
    return pa.py_buffer(np.packbits(flags, bitorder="little"))


def _strings(values: Sequence[str | None], valid: np.ndarray) -> pa.Array:
    raw = [b"" if value is None else value.encode()
           for value in values]
    offsets = np.zeros(len(raw) + 1, np.int32)
    np.cumsum([len(item) for item in raw], out=offsets[1:])
    bitmap = None if valid.all() else _bits(valid)
    return pa.Array.from_buffers(pa.string(), len(raw),
                                 [bitmap, pa.py_buffer(offsets), pa.py_buffer(b"".join(raw))],
                                 null_count=int(len(raw) - np.count_nonzero(valid)))


def _maps(values: Sequence[list[tuple[str, str | None]] | None], valid: np.ndarray,
          type_: pa.MapType) -> pa.Array:
    pairs = [pair for value in values if value is not None for pair in value]
    offsets = np.zeros(len(values) + 1, np.int32)
    np.cumsum([0 if value is None else len(value) for value in values], out=offsets[1:])
    keys = _strings([key for key, _ in pairs], np.ones(len(pairs), bool))
    items = [item for _, item in pairs]
    mask = None if valid.all() else numeric(~valid, pa.bool_())
    return pa.MapArray.from_arrays(numeric(offsets, pa.int32()), keys,
                                   _strings(items, np.array([i is not None for i in items], bool)),
                                   type=type_, mask=mask)
