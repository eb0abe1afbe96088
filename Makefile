# The two commands in the README: `make main` and `make test`. Both set up
# everything they need (idempotent, quick when already done).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# the PYSPARK_PYTHON .pth (below)
PTH_STAMP := $(VENV)/.pyspark-python-pth

# Delta Lake's JVM jars, for the main job, the restart tests and the source benchmark.
# Delta publishes one build per Spark minor version (delta-spark_<spark>_2.13); its
# newest release, 4.4.0, has builds for Spark 4.1 and 4.2 only. PySpark 4.3.0 cannot
# read a Delta table with any of them (Spark 4.3 changed the constructor of
# LogicalRDD, which Delta's snapshot cache calls: NoSuchMethodError on every read),
# so pyproject.toml holds PySpark at 4.2.x and this fetches the Spark 4.2 build.
# Keep DELTA_SPARK equal to PySpark's minor version (jobs/delta.py checks it).
# Only delta-spark and delta-storage go on spark.jars: their other dependencies
# (Hadoop, Parquet, Jackson, Scala, and delta-kernel for the Kernel-based paths we
# do not use) are either in PySpark's own jars or not needed.
DELTA_VERSION := 4.4.0
DELTA_SPARK := 4.2
# The PySpark of .venv: the one DELTA_SPARK is built for (pyproject.toml allows newer).
SPARK_FOR_DELTA := pyspark>=4.2.1,<4.3
JARS := jars
DELTA_STAMP := $(JARS)/.delta-$(DELTA_VERSION)-spark$(DELTA_SPARK)
DELTA_ARTIFACTS := io.delta:delta-spark_$(DELTA_SPARK)_2.13:$(DELTA_VERSION) \
                   io.delta:delta-storage:$(DELTA_VERSION)
MVN_COPY := org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy
# Delta's Python API (`from delta.tables import DeltaTable`), the release of the jars
# above: its Python code drives those JVM classes through py4j, so the two must be
# the same version. Installed without its dependencies: delta-spark 4.4.0 (and 4.4.1)
# declares pyspark<=4.2.0, which would take .venv's PySpark 4.2.1 back to 4.2.0 (a
# patch release of the same Spark 4.2 the jars are built for; DeltaTable runs on
# 4.2.1: tests/jobs/test_delta.py, tests/connector/test_delta_merge.py). Its only
# other dependency, importlib_metadata, serves configure_spark_with_delta_pip, which
# the project never calls (it puts `--packages` on the session: a download at run time).
DELTA_PY_STAMP := $(VENV)/.delta-spark-$(DELTA_VERSION)

.PHONY: setup main test oracle browser bench bench-setup bench-kafka-setup bench-kafka bench-memory bench-curves bench-profiles faults clean

setup: $(STAMP) $(PTH_STAMP) $(DELTA_STAMP) $(DELTA_PY_STAMP)

$(DELTA_PY_STAMP): $(STAMP)
	@$(PY) -m pip install --quiet --no-deps 'delta-spark==$(DELTA_VERSION)'
	@touch $@
	@echo "==> delta-spark $(DELTA_VERSION) (Delta's Python API) in $(VENV)"

$(STAMP): pyproject.toml
	@echo "==> setting up $(VENV) (python: $$($(PYTHON) --version))"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install --quiet -e '.[dev]' '$(SPARK_FOR_DELTA)'
	@# PySpark finds `pyspark_quorumqueue` with pkgutil.iter_modules(), which sees
	@# files on sys.path but not the import hook of an editable install: put its
	@# folder on the venv's path (a `pip install` puts it in site-packages).
	@echo "$(CURDIR)/connector/discovery" > "$$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/quorumqueue-spark-discovery.pth"
	@touch $(STAMP)
	@echo "==> $(VENV) ready"

# The connector on the newest PySpark too, which Delta Lake has no build for yet:
# `make test` runs there the tests of what the connector takes from PySpark (the
# Python data source API for batch and streaming reads and writes, Spark Connect,
# the listener, option errors through load(), the analytics jobs' log source), those
# needing Delta excepted (they run on .venv's Spark). What does not change with the
# PySpark version runs once, on .venv: the broker side of the connector (reconnects
# over a cluster, TLS, lease timeouts, the reader driven without Spark, consume mode
# against RabbitMQ and the Kafka-style limits and patterns, which read through the
# same reader API as the tests above).
SPARK_NEWEST := 4.3.0
VENV_NEWEST := .venv-spark$(SPARK_NEWEST)
STAMP_NEWEST := $(VENV_NEWEST)/.installed
NEWEST_TESTS := $(addprefix tests/connector/test_,source.py streaming.py batch_read.py \
                  sink.py schema.py options.py lag.py spark_connect.py) \
                tests/jobs/test_log_source.py tests/jobs/test_segment_compaction.py \
                tests/jobs/test_memory_footprint.py

$(STAMP_NEWEST): pyproject.toml
	@echo "==> setting up $(VENV_NEWEST) (PySpark $(SPARK_NEWEST), for the connector's tests)"
	@test -x $(VENV_NEWEST)/bin/python || $(PYTHON) -m venv $(VENV_NEWEST)
	@$(VENV_NEWEST)/bin/python -m pip install --quiet -e '.[dev]' 'pyspark==$(SPARK_NEWEST)'
	@echo "$(CURDIR)/connector/discovery" > "$$($(VENV_NEWEST)/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/quorumqueue-spark-discovery.pth"
	@touch $@
	@echo "==> $(VENV_NEWEST) ready"

# Spark's Python workers run PYSPARK_PYTHON, else the `python3` on PATH, which is not
# the venv's when a job runs as `.venv/bin/python job.py`: PySpark then cannot find the
# source (DATA_SOURCE_NOT_FOUND). A .pth line, run by the venv's Python at start,
# defaults PYSPARK_PYTHON to that interpreter (an explicit setting wins).
#
# A second line drops the zips Spark puts first on its Python workers' PYTHONPATH
# (pyspark.zip and py4j's, from this venv's own PySpark: SPARK_HOME is its package
# directory) so the workers import the same PySpark from site-packages, whose
# bytecode pip compiled. From the zip (zipimport keeps no bytecode) every worker
# compiled PySpark again: 1.8 s CPU against 0.5 s to import the streaming source's
# runner, and on a busy machine Spark gave up on it ("Python worker failed to connect
# back": a fixed 10 s wait). Only this venv's zips go, so a SPARK_HOME elsewhere keeps its own.
# The same line drops this venv's Spark core jar, which Spark puts there too (it holds
# no Python), and forgets the zip importers of what it drops: PySpark's
# setup_spark_files calls importlib.invalidate_caches() in every worker, and a zip
# importer left in sys.path_importer_cache re-reads its archive's directory then
# (pyspark.zip's 1,377 entries, the jar's 5,858): 67-143 ms of CPU in a fresh
# interpreter with a worker's PYTHONPATH, paid by each streaming source runner, which
# Spark starts afresh for every query (bench/README.md, 2026-12-07).
export PYSPARK_PYTHON_PTH := import os, sys; os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
PYSPARK_ZIPS_PTH = import sys; sys.path[:] = [p for p in sys.path if not p.startswith(("$(1)/pyspark/python/lib/", "$(1)/pyspark/jars/"))]; [sys.path_importer_cache.pop(p) for p in [*sys.path_importer_cache] if p.startswith(("$(1)/pyspark/python/lib/", "$(1)/pyspark/jars/"))]
PTH_STAMP_NEWEST := $(VENV_NEWEST)/.pyspark-python-pth

$(PTH_STAMP): Makefile $(STAMP)
	@purelib="$$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"; \
	  { echo "$$PYSPARK_PYTHON_PTH"; echo '$(call PYSPARK_ZIPS_PTH,'"$$purelib"')'; } \
	  > "$$purelib/quorumqueue-pyspark-python.pth"
	@touch $@

$(PTH_STAMP_NEWEST): Makefile $(STAMP_NEWEST)
	@purelib="$$($(VENV_NEWEST)/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"; \
	  { echo "$$PYSPARK_PYTHON_PTH"; echo '$(call PYSPARK_ZIPS_PTH,'"$$purelib"')'; } \
	  > "$$purelib/quorumqueue-pyspark-python.pth"
	@touch $@

# Maven puts the jars in ~/.m2 too, so a fresh jars/ after `make clean` is quick.
$(DELTA_STAMP):
	@command -v mvn >/dev/null || { echo "error: Maven (mvn) is needed to fetch Delta's" \
	  "jars; install it (Debian: apt-get install maven) and run make setup again"; exit 1; }
	@mkdir -p $(JARS) && rm -f $(JARS)/*.jar $(JARS)/.delta-*
	@for artifact in $(DELTA_ARTIFACTS); do \
	  echo "==> fetching $$artifact into $(JARS)/ (Maven)"; \
	  mvn -B -q -Dstyle.color=never $(MVN_COPY) -Dartifact=$$artifact -DoutputDirectory=$(JARS) \
	    || { echo "error: Maven could not fetch $$artifact. Check that Maven Central" \
	         "(or the mirror in ~/.m2/settings.xml) is reachable and run make setup" \
	         "again; mvn -X shows why."; exit 1; }; \
	done
	@touch $@
	@echo "==> Delta Lake $(DELTA_VERSION) jars ready: $$(ls $(JARS)/*.jar | xargs -n1 basename | tr '\n' ' ')"

# RabbitMQ 3.10.8 from Debian is the behavioural oracle of the differential
# tests and the benchmark baseline. Installed when this machine can (root + apt);
# otherwise the differential tests say they were skipped and why.
oracle:
	@bash .ci/install-rabbitmq

# Debian's chromium for the web UI's browser test (Playwright drives it; its own
# browser download is never used). Installed when this machine can (root + apt);
# otherwise that test says it was skipped and why.
browser:
	@bash .ci/install-chromium

# Orders from a quorum queue into a Delta table through the Spark source, with a
# driver killed mid-way and restarted from its checkpoint (jobs/orders_to_delta.py).
main: setup
	@$(PY) -m quorumqueue.jobs.orders_to_delta

# The suite runs in one pytest-xdist worker per CPU, a test file per worker at a time
# (pyproject.toml says why); `$(PY) -m pytest -q` alone runs it in one process. The 25
# slowest tests are listed at the end, to keep the whole run under 20 minutes on 2 cores;
# every test's time is in test-artifacts/junit*.xml.
# --no-loadscope-reorder: files go to the workers in the order tests/conftest.py sorts
# them (longest first); by default pytest-xdist sorts them by how many tests they hold,
# which handed the few-test, minutes-long Spark files out last.
XDIST := -n auto --dist loadfile --no-loadscope-reorder --durations=25
test: setup oracle browser $(STAMP_NEWEST) $(PTH_STAMP_NEWEST)
	@$(PY) -m pytest -q $(XDIST) --junitxml=test-artifacts/junit.xml
	@echo "==> the connector on PySpark $(SPARK_NEWEST) (no Delta Lake build for it yet)"
	@QUORUMQUEUE_TESTS_WITHOUT_DELTA="Delta Lake has no build for PySpark $(SPARK_NEWEST); this test runs on .venv's PySpark" \
	  $(VENV_NEWEST)/bin/python -m pytest -q $(XDIST) --junitxml=test-artifacts/junit-pyspark$(SPARK_NEWEST).xml $(NEWEST_TESTS)

# Throughput (classic, then quorum queues), quorum-queue bytes per message and RSS
# per idle connection and idle quorum queue, quorumqueue next to RabbitMQ 3.10.8 in each; then the Spark source into Delta
# against a plain AMQP consumer on the same broker, the sink against a plain confirmed
# publisher, the log data source against binaryFile, and RabbitMQ's PerfTest (quick
# set, both brokers; bench/perftest.py); about 20 minutes on 2 vCPUs.
bench: setup oracle bench-setup bench-kafka-setup
	@$(PY) bench/amqp_throughput.py --queue-type classic
	@$(PY) bench/amqp_throughput.py --queue-type quorum
	@$(PY) bench/quorum_memory.py
	@$(PY) bench/idle_memory.py
	@$(PY) bench/connector_source.py
	@$(PY) bench/connector_sink.py
	@$(PY) bench/log_scan.py
	@$(PY) bench/perftest.py
	@$(PY) bench/perftest_phases.py --nodes 1,3
	@$(PY) bench/connector_vs_kafka.py

# RabbitMQ's PerfTest (bench/perftest.py), the neutral loader: com.rabbitmq:perf-test
# is a plain jar (no Main-Class, not shaded), so Maven copies it and its runtime
# dependencies (amqp-client, commons-cli, metrics, micrometer, logback ...) into
# bench/jars/ (git-ignored); bench/perftest.py puts that folder on the classpath.
# Fetched here only, never at test time.
PERFTEST_VERSION := 2.22.1
BENCH_JARS := bench/jars
PERFTEST_STAMP := $(BENCH_JARS)/.perf-test-$(PERFTEST_VERSION)
PERFTEST_POM := $(HOME)/.m2/repository/com/rabbitmq/perf-test/$(PERFTEST_VERSION)/perf-test-$(PERFTEST_VERSION).pom
MVN_GET := org.apache.maven.plugins:maven-dependency-plugin:3.8.1:get
MVN_COPY_DEPS := org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies

bench-setup: $(PERFTEST_STAMP)

$(PERFTEST_STAMP):
	@command -v mvn >/dev/null || { echo "error: Maven (mvn) is needed to fetch PerfTest;" \
	  "install it (Debian: apt-get install maven) and run make bench-setup again"; exit 1; }
	@command -v java >/dev/null || { echo "error: PerfTest needs Java 11 or newer;" \
	  "install it (Debian: apt-get install openjdk-17-jre-headless)"; exit 1; }
	@mkdir -p $(BENCH_JARS) && rm -f $(BENCH_JARS)/*.jar $(BENCH_JARS)/.perf-test-*
	@echo "==> fetching com.rabbitmq:perf-test:$(PERFTEST_VERSION) and its dependencies into $(BENCH_JARS)/ (Maven)"
	@mvn -B -q -Dstyle.color=never $(MVN_GET) -Dartifact=com.rabbitmq:perf-test:$(PERFTEST_VERSION) \
	  && mvn -B -q -Dstyle.color=never $(MVN_COPY) -Dartifact=com.rabbitmq:perf-test:$(PERFTEST_VERSION) \
	       -DoutputDirectory=$(BENCH_JARS) \
	  && mvn -B -q -Dstyle.color=never -f $(PERFTEST_POM) $(MVN_COPY_DEPS) -DincludeScope=runtime \
	       -DoutputDirectory=$(CURDIR)/$(BENCH_JARS) \
	  || { echo "error: Maven could not fetch PerfTest. Check that Maven Central (or the" \
	       "mirror in ~/.m2/settings.xml) is reachable and run make bench-setup again;" \
	       "mvn -X shows why."; exit 1; }
	@touch $@
	@echo "==> PerfTest $(PERFTEST_VERSION) ready: $$(ls $(BENCH_JARS)/*.jar | wc -l) jars in $(BENCH_JARS)/"

# Apache Kafka, the baseline of bench/connector_vs_kafka.py (what a Spark user would
# pick instead of this connector): a KRaft broker's jars (org.apache.kafka:kafka_2.13
# and its runtime dependencies, plus log4j's SLF4J binding so the broker's log says
# why it stopped) into bench/jars/kafka/, and Spark's Kafka source and sink
# (spark-sql-kafka-0-10 with spark-token-provider-kafka-0-10, kafka-clients and
# commons-pool2; Spark's own jars have the rest) into bench/jars/spark-kafka/.
# Both git-ignored (under bench/jars/), fetched here only, never at test time.
# SPARK_KAFKA is the newest spark-sql-kafka build for .venv's Spark minor version
# that Maven Central has: 4.2.0 (there is no 4.2.1 build of it; PySpark 4.2.1 is a
# patch release of the same Spark 4.2, and the connector runs on it unchanged).
KAFKA_VERSION := 4.1.1
SPARK_KAFKA := 4.2.0
SPARK_KAFKA_CLIENTS := 3.9.2
KAFKA_JARS := $(BENCH_JARS)/kafka
SPARK_KAFKA_JARS := $(BENCH_JARS)/spark-kafka
KAFKA_STAMP := $(KAFKA_JARS)/.kafka-$(KAFKA_VERSION)-spark-kafka-$(SPARK_KAFKA)
SPARK_KAFKA_ARTIFACTS := org.apache.spark:spark-sql-kafka-0-10_2.13:$(SPARK_KAFKA) \
                         org.apache.spark:spark-token-provider-kafka-0-10_2.13:$(SPARK_KAFKA) \
                         org.apache.kafka:kafka-clients:$(SPARK_KAFKA_CLIENTS) \
                         org.apache.commons:commons-pool2:2.13.1
KAFKA_POM := bench/kafka-broker.pom.xml

bench-kafka-setup: $(KAFKA_STAMP)

$(KAFKA_STAMP): $(KAFKA_POM)
	@command -v mvn >/dev/null || { echo "error: Maven (mvn) is needed to fetch Kafka's" \
	  "jars; install it (Debian: apt-get install maven) and run make bench-kafka-setup again"; exit 1; }
	@rm -rf $(KAFKA_JARS) $(SPARK_KAFKA_JARS) && mkdir -p $(KAFKA_JARS) $(SPARK_KAFKA_JARS)
	@echo "==> fetching Apache Kafka $(KAFKA_VERSION) (broker) into $(KAFKA_JARS)/ (Maven)"
	@mvn -B -q -Dstyle.color=never -f $(KAFKA_POM) -Dkafka.version=$(KAFKA_VERSION) \
	    $(MVN_COPY_DEPS) -DincludeScope=runtime -DoutputDirectory=$(CURDIR)/$(KAFKA_JARS) \
	  || { echo "error: Maven could not fetch Kafka $(KAFKA_VERSION). Check that Maven" \
	       "Central (or the mirror in ~/.m2/settings.xml) is reachable and run make" \
	       "bench-kafka-setup again; mvn -X shows why."; exit 1; }
	@for artifact in $(SPARK_KAFKA_ARTIFACTS); do \
	  echo "==> fetching $$artifact into $(SPARK_KAFKA_JARS)/ (Maven)"; \
	  mvn -B -q -Dstyle.color=never $(MVN_COPY) -Dartifact=$$artifact \
	      -DoutputDirectory=$(SPARK_KAFKA_JARS) \
	    || { echo "error: Maven could not fetch $$artifact; run make bench-kafka-setup" \
	         "again once Maven Central is reachable (mvn -X shows why)."; exit 1; }; \
	done
	@touch $@
	@echo "==> Kafka $(KAFKA_VERSION) ($$(ls $(KAFKA_JARS)/*.jar | wc -l) jars) and Spark's Kafka connector $(SPARK_KAFKA) ready"

# bench/connector_vs_kafka.py: the quorumqueue source and sink against Kafka's, in one
# Spark session (bench/README.md). About 25 minutes on 2 vCPUs; `make bench` runs it too.
bench-kafka: setup bench-kafka-setup
	@$(PY) bench/connector_vs_kafka.py

bench-memory: setup oracle
	@$(PY) bench/quorum_memory.py
	@$(PY) bench/idle_memory.py

# Issue 18's curves (bench/perftest_curves.py): PerfTest 1 producer/1 consumer per queue,
# queue count 1/10/100 (1 KB), body 16 B/1 KB/64 KB/1 MiB (1 queue) and 1/10/50 producers
# and consumers (1 queue, 1 KB), 1 and 3 nodes, quorumqueue and RabbitMQ 3.10.8 up together,
# 3 A/B pairs of 10 s runs per point: JSON, CSV and PNGs in bench/results/. About 33
# minutes on 2 vCPUs, so not in `make bench`
# (which runs perftest.py's quick set).
bench-curves: setup oracle bench-setup
	@$(PY) bench/perftest_curves.py

# py-spy flame graphs of the broker (bench/profile_flames.py): the consume path on 1 node,
# the 3-node leader and a follower during publish, the Spark sink's broker side, all three
# nodes under PerfTest's 100 queues; SVGs and top-frame lists in bench/results/profiles/.
# About 5 minutes.
bench-profiles: setup oracle bench-setup
	@$(PY) bench/profile_flames.py

# The fault suite's long form (tests/faults/README.md): 100 runs of a confirmed
# workload on 3- and 5-node clusters under every nemesis (kills, pauses, partitions,
# slow links, a slow disk), with a single-active-consumer queue and at-least-once
# dead lettering beside it (tests/faults/extras.py), about an hour on 2 vCPUs; the table and a plot per run
# go to tests/faults/results/. Then SPARK_FAULT_RUNS runs of the Spark connector's
# lease-mode query into Delta under a leader killed, isolated or paused, checked for
# exactly-once (about 1-2 minutes each), in the same table. Then hostile input: the
# stateful protocol test with FUZZ_EXAMPLES programs and the socket-level mutation
# fuzzer for HOSTILE_SECONDS against a live node (known answers checked against
# RabbitMQ 3.10.8 too), on one node and on a 3-node cluster, about 15 more minutes.
# Last, the names corpus (tests/faults/names.py: NAMES_COUNT random UTF-8 names and the
# fixed ones through every HTTP endpoint and the CLI, and against RabbitMQ's API) and
# the CSRF check in headless Chromium (a page of another origin), a few minutes.
# Fewer: make faults FAULT_RUNS=12 SPARK_FAULT_RUNS=3 HOSTILE_SECONDS=60.
FAULT_RUNS ?= 100
SPARK_FAULT_RUNS ?= 6
FUZZ_EXAMPLES ?= 10000
HOSTILE_SECONDS ?= 300
NAMES_COUNT ?= 500
faults: setup oracle
	@$(PY) -m tests.faults.run --runs $(FAULT_RUNS) --spark-runs $(SPARK_FAULT_RUNS) \
	  --out tests/faults/results
	@QUORUMQUEUE_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PY) -m pytest -q -p no:cacheprovider \
	  tests/broker/node/test_stateful_protocol.py
	@$(PY) -m tests.faults.hostile --seconds $(HOSTILE_SECONDS) --attackers 6 --rabbitmq
	@$(PY) -m tests.faults.hostile --seconds $(HOSTILE_SECONDS) --attackers 6 --nodes 3
	@$(PY) -m tests.faults.names --count $(NAMES_COUNT) --rabbitmq
	@$(PY) -m pytest -q -p no:cacheprovider tests/broker/management/test_csrf_browser.py

clean:
	rm -rf $(VENV) $(VENV_NEWEST) .pytest_cache $(JARS) $(BENCH_JARS)
