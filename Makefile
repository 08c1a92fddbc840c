# llm-headroom: `make demo` shows the idea on the built-in simulator; `make test` runs everything.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install demo test test-fast tools engine generate check-generated bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)  ## virtual environment with the package and test dependencies

demo: $(STAMP)  ## simulator + sidecar + load past the knee + capacity summary
	$(BIN)/headroom demo

tools:  ## Debian's prometheus (promtool) and alertmanager (amtool) when missing
	@bash scripts/install-tools.sh

engine:  ## a real llama.cpp llama-server + Gemma 3 270M, built once into ~/.cache/llm-headroom
	@bash scripts/build-llama-server.sh >/dev/null

test: install tools engine  ## the whole suite: unit, integration (real Prometheus/Alertmanager), real engine
	$(BIN)/pytest -q -p no:cacheprovider

test-fast: install  ## unit tests only
	$(BIN)/pytest -q -m "not integration and not slow"

generate: install  ## regenerate dashboards/ and alerts/
	$(BIN)/headroom dashboards generate
	$(BIN)/headroom alerts generate

bench: install  ## performance measurements reported in BENCHMARKS.md
	$(BIN)/python benchmarks/proxy_overhead.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
