"""What a user sees first when an option is wrong (connector/source.py's header).

Spark wraps a Python data source's error in an AnalysisException whose text is
`[PYTHON_DATA_SOURCE_ERROR] Failed to ...: ` and what the Python worker sent; the
first line of that text is the first line a user reads (of the exception printed by
Python or a notebook). It must name the option, not open a traceback. No broker is
needed: options are refused before any connection (port 1 on 127.0.0.1 is closed).
"""

from __future__ import annotations

import os

import pytest

NO_BROKER = "amqp://guest:guest@127.0.0.1:1/%2F"


def first_line(error: pytest.ExceptionInfo) -> str:
    return str(error.value).splitlines()[0]


def test_a_bad_stream_option_is_the_first_line_of_the_error(spark):
    with pytest.raises(Exception) as error:
        (spark.readStream.format("quorumqueue").option("uri", NO_BROKER)
         .option("queue", "orders").option("maxMessagesPerTrigger", "x").load())
    assert first_line(error) == (
        "[PYTHON_DATA_SOURCE_ERROR] Failed to create Python data source instance: "
        "quorumqueue.connector.options.OptionError: option 'maxMessagesPerTrigger' must "
        "be a positive integer, got 'x'")


def test_a_bad_batch_read_option_is_the_first_line_of_the_error(spark):
    with pytest.raises(Exception) as error:
        (spark.read.format("quorumqueue").option("uri", NO_BROKER)
         .option("queue", "orders").option("maxMessages", "0").load())
    assert first_line(error).endswith(
        "OptionError: option 'maxMessages' must be a positive integer, got '0'")


def test_a_bad_sink_option_is_the_first_line_of_the_error(spark):
    rows = spark.createDataFrame([(b"x",)], "body binary")
    with pytest.raises(Exception) as error:
        (rows.write.format("quorumqueue").option("uri", NO_BROKER).option("exchange", "e")
         .option("confirmTimout", "5s").mode("append").save())
    assert "Failed to initialize Python data source writer" in first_line(error)
    assert "unknown option 'confirmtimout' for the quorumqueue sink" in first_line(error)


def test_other_errors_keep_their_traceback(spark):
    """Only an OptionError loses its traceback: an unreachable broker, raised when the
    read is planned after the same kind of failure above, still shows where it came
    from."""
    with pytest.raises(Exception, match="option 'maxMessages'"):
        (spark.read.format("quorumqueue").option("uri", NO_BROKER)
         .option("queue", "orders").option("maxMessages", "-1").load())
    with pytest.raises(Exception) as error:
        (spark.read.format("quorumqueue").option("uri", NO_BROKER)
         .option("queue", "orders").option("maxMessages", "10").load().collect())
    assert first_line(error).endswith("Traceback (most recent call last):")
    assert "127.0.0.1:1" in str(error.value)


def test_outside_a_spark_worker_the_environment_is_left_alone(monkeypatch):
    """A driver or a test calling the source directly gets the OptionError and keeps
    its environment (a Spark session started later would inherit the setting)."""
    from quorumqueue.connector.options import OptionError
    from quorumqueue.connector.source import QuorumQueueDataSource

    monkeypatch.delenv("SPARK_HIDE_TRACEBACK", raising=False)
    source = QuorumQueueDataSource({"uri": NO_BROKER, "queue": "orders",
                                    "maxmessagespertrigger": "x"})
    with pytest.raises(OptionError, match="option 'maxMessagesPerTrigger'"):
        source.schema()
    assert "SPARK_HIDE_TRACEBACK" not in os.environ


JOB = """
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
         .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
         .getOrCreate())
frame = (spark.read.format("quorumqueue").option("uri", "%s").option("queue", "orders")
         .option("maxMessages", "1").load())
print("columns:", ",".join(frame.columns[:3]))
spark.stop()
""" % NO_BROKER


def test_a_job_run_by_the_venvs_python_without_pyspark_python_finds_the_source(tmp_path):
    """`.venv/bin/python job.py` with no PYSPARK_PYTHON and a PATH whose python3 is not
    the venv's: Spark's workers would run that python3, which has no quorumqueue
    (DATA_SOURCE_NOT_FOUND). The venv's .pth (Makefile, PYSPARK_PYTHON_PTH) defaults
    PYSPARK_PYTHON to the venv's interpreter, so the job finds the source."""
    import subprocess
    import sys

    job = tmp_path / "job.py"
    job.write_text(JOB)
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV")}
    env["PATH"] = "/usr/bin:/bin"
    result = subprocess.run([sys.executable, str(job)], capture_output=True, text=True,
                            env=env, cwd=tmp_path, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "columns: body,queue,routing_key" in result.stdout


def test_spark_workers_import_pyspark_with_its_bytecode_not_from_pyspark_zip():
    """Spark puts its pyspark.zip and py4j's zip first on a Python worker's PYTHONPATH;
    zipimport keeps no bytecode, so each worker compiled PySpark again (1.8 s CPU
    against 0.5 s to import the streaming source's runner here) and on a busy machine
    Spark stopped waiting for it ("Python worker failed to connect back"). The venv's
    .pth (Makefile, PYSPARK_ZIPS_PTH) drops this venv's own zips, so the same PySpark
    comes from site-packages; a zip elsewhere stays."""
    import subprocess
    import sys

    import pyspark

    lib = os.path.join(os.path.dirname(pyspark.__file__), "python", "lib")
    zips = sorted(os.path.join(lib, name) for name in os.listdir(lib) if name.endswith(".zip"))
    assert any(name.endswith("pyspark.zip") for name in zips), zips
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*zips, "/elsewhere/pyspark.zip"]))
    probe = ("import sys, pyspark.sql.streaming.python_streaming_source_runner as m, py4j;"
             "print(m.__file__); print(py4j.__file__);"
             "print([p for p in sys.path if p.endswith(('pyspark.zip', '-src.zip'))])")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            env=env, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    runner, py4j, left = result.stdout.splitlines()
    assert runner == os.path.join(os.path.dirname(pyspark.__file__), "sql", "streaming",
                                  "python_streaming_source_runner.py")
    assert ".zip" not in py4j
    assert left == "['/elsewhere/pyspark.zip']"


def test_spark_workers_keep_no_importer_for_spark_s_own_zips_and_core_jar():
    """Spark also puts its core jar on a Python worker's PYTHONPATH (it holds no Python),
    and PySpark's setup_spark_files calls importlib.invalidate_caches() in every
    worker: a zip importer left in sys.path_importer_cache then reads its archive's
    directory again (pyspark.zip's 1,377 entries, the jar's 5,858), 67-143 ms of CPU in
    each streaming source runner, which Spark starts for every query. The venv's .pth
    (Makefile, PYSPARK_ZIPS_PTH) drops this venv's jar too and forgets the importers
    of what it drops; an archive elsewhere stays."""
    import subprocess
    import sys

    import pyspark

    home = os.path.dirname(pyspark.__file__)
    lib, jars = os.path.join(home, "python", "lib"), os.path.join(home, "jars")
    archives = sorted(os.path.join(lib, name) for name in os.listdir(lib) if name.endswith(".zip"))
    archives += sorted(os.path.join(jars, name) for name in os.listdir(jars)
                       if name.startswith("spark-core_"))
    assert any(name.endswith(".jar") for name in archives), archives
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*archives, "/elsewhere/pyspark.zip"]))
    probe = ("import sys, importlib; importlib.invalidate_caches();"
             f"print([p for p in sys.path if p.startswith({home!r})]);"
             f"print(sorted(p for p in sys.path_importer_cache if p.startswith({home!r})));"
             "print('/elsewhere/pyspark.zip' in sys.path)")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            env=env, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    on_path, importers, elsewhere_kept = result.stdout.splitlines()
    assert on_path == "[]"
    assert importers == "[]"
    assert elsewhere_kept == "True"


@pytest.mark.parametrize("kafka, hint", [
    ("maxOffsetsPerTrigger", "(Kafka's 'maxOffsetsPerTrigger'; here: 'maxMessagesPerTrigger')"),
    ("subscribe", "(Kafka's 'subscribe'; here: 'queue')"),
    ("startingOffsets", "(Kafka's 'startingOffsets' has no counterpart")])
def test_a_kafka_option_is_named_as_typed_with_its_quorumqueue_counterpart(spark, kafka, hint):
    """Spark hands the source its option names lower-cased; a Kafka option's refusal
    names it as Kafka spells it and the option doing its job here (difflib alone
    offered maxBytesPerTrigger for maxOffsetsPerTrigger)."""
    with pytest.raises(Exception) as error:
        (spark.readStream.format("quorumqueue").option("uri", NO_BROKER)
         .option("queue", "orders").option(kafka, "10").load())
    assert first_line(error).startswith(
        "[PYTHON_DATA_SOURCE_ERROR] Failed to create Python data source instance: "
        f"quorumqueue.connector.options.OptionError: unknown option '{kafka}' for the "
        f"quorumqueue source {hint}")


def test_the_suites_spark_jvms_run_with_the_options_for_short_runs(spark):
    # tests/connector/conftest.py, TEST_JVM_OPTIONS: a JVM without them takes about
    # twice the CPU, which is what made the suite miss its budget on a busy machine
    from tests.connector.conftest import TEST_JVM_OPTIONS

    runtime = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    arguments = list(runtime.getInputArguments())
    assert set(TEST_JVM_OPTIONS.split()) <= set(arguments), arguments
