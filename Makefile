# The two commands in the README: `make main` and `make test`. Both set up
# everything they need (idempotent, quick when already done).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup main test oracle bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@echo "==> setting up $(VENV) (python: $$($(PYTHON) --version))"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install --quiet -e '.[dev]'
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

bench: setup oracle
	@$(PY) bench/amqp_throughput.py

clean:
	rm -rf $(VENV) .pytest_cache
