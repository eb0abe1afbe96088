"""bench/connector_vs_kafka.py: same bytes on both sides, and the report's ratios, without
Kafka, Spark or a broker."""

import pytest

from bench import amqp_wire as wire
from bench.connector_vs_kafka import parse_arguments, report
from bench.vs_kafka_loader import STAMP, body
from bench.vs_kafka_workloads import ExactlyOnceRun, LatencyRun, Run


@pytest.mark.parametrize("size", [16, 256, 4096])
def test_the_kafka_loader_sends_the_bytes_the_amqp_generator_publishes(size):
    block = wire.PublishBlock.build(1, "q", size, 131072, 3)
    frames = block.stamp(41, 3)
    for index, at in enumerate(block.sequence_offsets):
        published = frames[at:at + size]
        assert published == body(41 + index, size)


def test_a_steady_body_carries_its_sequence_then_its_send_time():
    stamped = bytearray(body(0, 64))
    STAMP.pack_into(stamped, 0, 7, 123456789)
    assert STAMP.unpack_from(stamped) == (7, 123456789)
    assert stamped[16:] == body(0, 64)[16:]


def test_an_unknown_workload_is_named():
    with pytest.raises(SystemExit):
        parse_arguments(["--workloads", "source-noop,sauce"])
    assert parse_arguments(["--workloads", "sink, latency"]).chosen == ("sink", "latency")


def test_a_ratio_is_the_median_of_the_rounds_ratios_and_latency_is_lower_is_better():
    cpu = {"broker": 1.0, "JVM tasks": 1.0, "Python workers": 0.5, "driver": 0.1}
    results = {
        "throughput": {"sink": {
            "kafka": [Run(10.0, 100, cpu), Run(10.0, 100, cpu), Run(10.0, 100, cpu)],
            "quorumqueue": [Run(5.0, 100, cpu), Run(20.0, 100, cpu), Run(8.0, 100, cpu)]}},
        "latency": {500: {
            "kafka": [LatencyRun((100.0, 200.0), (300.0, 400.0), 10, 2, cpu)],
            "quorumqueue": [LatencyRun((90.0, 400.0), (250.0, 800.0), 10, 2, cpu)]}},
        "exactly_once": {"kafka": ExactlyOnceRun(10, 10, 10, 2),
                         "quorumqueue": ExactlyOnceRun(10, 11, 10, 2)},
        "load": [],
    }
    lines = "\n".join(report(results, parse_arguments([])))
    assert results["summary"]["sink"]["ratio"] == 1.25          # of 2.0, 0.5, 1.25
    assert "| sink |" in lines and "**1.25x** (0.50-2.00) | >= 1.0x: held" in lines
    assert results["summary"]["latency-500-p50-arrival_ms"]["ratio"] == 0.9
    assert "latency p50 -> foreachBatch, trigger 500 ms (ms)" in lines
    assert "**2.00x** (2.00-2.00) | <= 1.5x: NOT held" in lines  # p99 400 against 200
    assert "exactly-once, quorumqueue, 2 driver SIGKILLs | | | 11 rows" in lines
    assert "100%: NOT held" in lines


def test_a_run_of_the_quorumqueue_side_alone_is_reported_without_ratios():
    arguments = parse_arguments(["--sides", "quorumqueue", "--workloads", "sink,latency"])
    assert arguments.side_list == ("quorumqueue",)
    cpu = {"broker": 3.0, "JVM tasks": 1.0, "Python workers": 0.5, "driver": 0.1}
    results = {
        "throughput": {"sink": {"quorumqueue": [Run(5.0, 100, cpu), Run(4.0, 100, cpu)]}},
        "latency": {0: {"quorumqueue": [LatencyRun((90.0, 400.0), (250.0, 800.0), 10, 2, cpu)]}},
        "exactly_once": {"quorumqueue": ExactlyOnceRun(10, 10, 10, 2)},
        "load": [],
    }
    lines = "\n".join(report(results, arguments))
    assert "| sink | not run | 22.50 (20.00-25.00) | no ratio: one side run |" in lines
    assert "| latency p99 -> Delta commit, trigger 0 ms (ms) | not run | 800.00" in lines
    assert "| sink | quorumqueue | 30000.00 |" in lines          # 3 s of broker CPU / 100
    assert "| sink | kafka |" not in lines
    assert results["summary"] == {}


def test_sides_are_checked_and_kept_in_one_order():
    with pytest.raises(SystemExit):
        parse_arguments(["--sides", "quorumqueue,pulsar"])
    assert parse_arguments(["--sides", "quorumqueue, kafka"]).side_list == ("kafka",
                                                                           "quorumqueue")


def test_the_phases_of_a_latency_run_are_medians_over_the_batches_that_read_rows():
    from types import SimpleNamespace

    from bench.vs_kafka_workloads import _phase_medians

    reports = [SimpleNamespace(numInputRows=rows, durationMs=phases) for rows, phases in [
        (0, {"latestOffset": 900, "triggerExecution": 900}),  # found nothing: left out
        (10, {"latestOffset": 30, "triggerExecution": 400}),
        (20, {"latestOffset": 50, "triggerExecution": 600}),
        (30, {"latestOffset": 40, "triggerExecution": 500, "addBatch": 300})]]
    assert _phase_medians(reports) == {"addBatch": 300.0, "latestOffset": 40.0,
                                       "triggerExecution": 500.0}


def test_the_latency_workload_appends_the_same_columns_on_both_sides_by_default():
    from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, TimestampType

    from bench.vs_kafka_spark import COMMON_COLUMNS, Side
    from quorumqueue.connector.schema import SCHEMA

    # Spark's Kafka source schema (without includeHeaders), as its documentation gives it
    kafka = {"key": BinaryType(), "value": BinaryType(), "topic": StringType(),
             "partition": IntegerType(), "offset": LongType(), "timestamp": TimestampType(),
             "timestampType": IntegerType()}
    quorumqueue = {field.name: field.dataType for field in SCHEMA.fields}
    written = {}
    for kind, schema in (("kafka", kafka), ("quorumqueue", quorumqueue)):
        pairs = Side(kind, "address", "name").common_columns()
        assert [name for _column, name in pairs] == list(COMMON_COLUMNS)
        written[kind] = [(name, schema[column]) for column, name in pairs]
    assert written["kafka"] == written["quorumqueue"]
    assert [kind for _name, kind in written["kafka"]] == [BinaryType(), StringType(), LongType()]
    assert parse_arguments([]).latency_write == "common"
    assert parse_arguments(["--latency-write", "all"]).latency_write == "all"
    with pytest.raises(SystemExit):
        parse_arguments(["--latency-write", "some"])


def test_a_quorumqueue_source_option_is_passed_as_key_and_value():
    arguments = parse_arguments(["--qq-option", "maxMessagesPerPartition=50000",
                                 "--qq-option", "minPartitions=2"])
    assert arguments.qq_options == {"maxMessagesPerPartition": "50000", "minPartitions": "2"}
    assert parse_arguments([]).qq_options == {}
    with pytest.raises(SystemExit):
        parse_arguments(["--qq-option", "maxMessagesPerPartition"])
