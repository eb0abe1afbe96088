# The two commands in the README: `make main` and `make test`. Both set up
# everything they need (idempotent, quick when already done).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup main test oracle bench bench-memory clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@echo "==> setting up $(VENV) (python: $$($(PYTHON) --version))"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install --quiet -e '.[dev]'
	@# PySpark finds `pyspark_quorumqueue` with pkgutil.iter_modules(), which sees
	@# files on sys.path but not the import hook of an editable install: put its
	@# folder on the venv's path (a `pip install` puts it in site-packages).
	@echo "$(CURDIR)/connector/discovery" > "$$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/quorumqueue-spark-discovery.pth"
	@touch $(STAMP)
	@echo "==> $(VENV) ready"

# RabbitMQ 3.10.8 from Debian is the behavioural oracle of the differential
# tests and the benchmark baseline. Installed when this machine can (root + apt);
# otherwise the differential tests say they were skipped and why.
oracle:
	@bash .ci/install-rabbitmq

main: setup
	@$(PY) -m quorumqueue.broker.demo

test: setup oracle
	@$(PY) -m pytest -q

# Throughput (classic, then quorum queues) and quorum-queue bytes per message,
# quorumqueue next to RabbitMQ 3.10.8 in each; about 2 minutes on 2 vCPUs.
bench: setup oracle
	@$(PY) bench/amqp_throughput.py --queue-type classic
	@$(PY) bench/amqp_throughput.py --queue-type quorum
	@$(PY) bench/quorum_memory.py

bench-memory: setup oracle
	@$(PY) bench/quorum_memory.py

clean:
	rm -rf $(VENV) .pytest_cache
