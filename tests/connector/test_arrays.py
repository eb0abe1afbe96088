"""Arrow arrays built without pa.array (connector/arrays.py).

The lease reader's batches are built from numpy and a few Python values with
`pa.Array.from_buffers` and `take`, because `pa.array` imports pandas, which cost
each fresh Spark Python worker 0.57 s of CPU. Two things are held here: each builder
gives what `pa.array` gives for the same values (Hypothesis), and reading an
"entries" delivery into the batch PySpark sends to the JVM imports no pandas (a fresh
interpreter, as a Spark worker is).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from quorumqueue.connector import arrays
from quorumqueue.connector.schema import ARROW_SCHEMA

MAP = ARROW_SCHEMA.field("headers").type
TIMESTAMP = ARROW_SCHEMA.field("timestamp").type
text = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)

VALUES = {
    pa.string(): st.none() | text,
    pa.int32(): st.none() | st.integers(-2**31, 2**31 - 1),
    pa.int64(): st.none() | st.integers(-2**63, 2**63 - 1),
    pa.bool_(): st.none() | st.booleans(),
    TIMESTAMP: st.none() | st.integers(0, 2**62),
    MAP: st.none() | st.lists(st.tuples(text, st.none() | text), max_size=4),
}


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(VALUES, key=str)).flatmap(
    lambda type_: st.tuples(st.just(type_), st.lists(VALUES[type_], max_size=9))))
def test_small_gives_what_pa_array_gives(case):
    type_, values = case
    built = arrays.small(values, type_)
    assert built.type == type_
    assert built.equals(pa.array(values, type_))
    assert built.null_count == sum(value is None for value in values)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(VALUES, key=str)).flatmap(
    lambda type_: st.tuples(st.just(type_), st.lists(VALUES[type_], min_size=1, max_size=5),
                            st.lists(st.integers(0, 4), max_size=30))))
def test_taken_and_repeated_give_what_take_gives(case):
    type_, values, picks = case
    positions = np.array([pick % len(values) for pick in picks], np.int32)
    expected = pa.array(values, type_).take(pa.array(positions))
    assert arrays.taken(arrays.small(values, type_), positions).equals(expected)
    assert arrays.repeated(arrays.small(values[:1], type_), len(picks)).equals(
        pa.array(values[:1] * len(picks), type_))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(-2**31, 2**31 - 1), st.booleans()), max_size=40))
def test_numeric_with_nulls_gives_what_pa_array_gives(rows):
    values = np.array([value for value, _ in rows], np.int32)
    valid = np.array([present for _, present in rows], bool)
    expected = pa.array([int(v) if ok else None for v, ok in zip(values, valid)], pa.int32())
    assert arrays.numeric(values, pa.int32(), valid).equals(expected)
    assert arrays.numeric(valid, pa.bool_()).equals(pa.array(valid.tolist(), pa.bool_()))


def test_reading_an_entries_delivery_into_spark_s_stream_imports_no_pandas():
    """What a Spark Python worker runs for a lease read, after PySpark's own imports:
    decode an "entries" delivery, build its batch (uniform and mixed properties),
    wrap it as PySpark's mapInArrow does and write it as an Arrow stream."""
    script = textwrap.dedent("""
        import sys
        import pyspark.worker
        import pyspark.sql.worker.plan_data_source_read
        from pyspark.sql.conversion import ArrowBatchTransformer
        import pyarrow as pa
        from quorumqueue.broker.amqp import codec
        from quorumqueue.broker.amqp.lease_records import pack_entries
        from quorumqueue.broker.fifo import commands, envelope
        from quorumqueue.client.lease_entries import EntriesDecoder
        from quorumqueue.connector.schema import to_record_batch
        assert "pandas" not in sys.modules, "imported before the read"
        blocks = [codec.encode_properties(0, p) for p in (
            {"delivery_mode": 2, "headers": {"k": "v"}}, {"message_id": "m", "priority": 3})]
        for mixed in (False, True):
            entries = [envelope.stamp(commands.encode_enqueue(
                "", seq, 0, "", f"key.{seq % 2 if mixed else 0}",
                blocks[seq % 2 if mixed else 0], b"x" * seq), 1) for seq in range(1, 30)]
            batch = to_record_batch("q", EntriesDecoder().decode(
                pack_entries(1, entries, {3: 1} if mixed else {})))
            wrapped = ArrowBatchTransformer.wrap_struct(batch)
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, wrapped.schema) as writer:
                writer.write_batch(wrapped)
        print(sorted(name for name in sys.modules if name.split(".")[0] == "pandas")[:3])
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", f"pandas was imported: {done.stdout}"
