# llm-headroom: `make demo` shows the idea on the built-in simulator; `make test` runs everything.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install demo test test-clock-ahead test-fast lint tools engine generate check-generated bench measure clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)  ## virtual environment with the package and test dependencies

demo: $(STAMP)  ## simulator + sidecar + load past the knee + capacity summary
	$(BIN)/headroom demo

tools:  ## Debian's prometheus, alertmanager (promtool, amtool), victoria-metrics (vmalert), cmake and g++, when missing
	@bash scripts/install-tools.sh

engine:  ## a real llama.cpp llama-server + Gemma 3 270M, built once into ~/.cache/llm-headroom
	@bash scripts/build-llama-server.sh >/dev/null

# Two parts: everything that does not measure this machine's time in $(WORKERS) pytest-xdist workers
# (most of it waits on processes and sockets), then the tests that do (marker `serial`: latency
# limits, real-time knees) and the real engine alone. Both run; either failing fails the target.
WORKERS ?= 4
PARALLEL := -m "not serial and not real_engine" -n $(WORKERS)
ALONE    := -m "(serial or real_engine) and not measurement"

test: install tools engine lint  ## lint and types, then the whole suite: unit, integration, real engine
	@status=0; \
	$(BIN)/pytest -q -p no:cacheprovider $(PARALLEL) || status=1; \
	$(BIN)/pytest -q -p no:cacheprovider $(ALONE) || status=1; \
	exit $$status

test-clock-ahead:  ## the whole suite with the wall clock 30 days ahead (faketime; scripts/clock-ahead.sh)
	@bash scripts/clock-ahead.sh 30 $(MAKE) test

lint: install  ## ruff (lint + format check) and mypy (strict on collector/); any finding fails
	$(BIN)/ruff check collector tests benchmarks
	$(BIN)/ruff format --check collector tests benchmarks
	$(BIN)/mypy

test-fast: install lint  ## lint, then only the tests that start no process (marker `subprocess`)
	$(BIN)/pytest -q -p no:cacheprovider -m "not subprocess and not slow"

generate: install  ## regenerate dashboards/, alerts/ and deploy/kubernetes/prometheusrule.yaml
	$(BIN)/headroom dashboards generate
	$(BIN)/headroom alerts generate
	$(BIN)/headroom integrations prometheusrule --out deploy/kubernetes/prometheusrule.yaml

measure: install tools engine  ## comparisons too noisy to gate make test on (the real engine's μ_slo vs a plain client)
	$(BIN)/pytest -q -p no:cacheprovider -m measurement

bench: install  ## performance measurements reported in BENCHMARKS.md
	$(BIN)/python benchmarks/proxy_overhead.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
