# gfcr — set-up, demo and tests. Everything a fresh machine needs is installed from here.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch is pinned to the CPU build that pip finds locally; an unpinned torch pulls a multi-GB CUDA build.
TORCH ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: venv demo test test-fast lint bench system-deps clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e '.[all,dev]'
	touch $(STAMP)

venv: $(STAMP)

system-deps:
	bash scripts/install_system_deps.sh

demo: $(STAMP)
	$(BIN)/gfcr demo

test: $(STAMP) system-deps
	$(BIN)/python -m pytest -q tests

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow and not browser" tests

lint: $(STAMP)
	$(BIN)/ruff check src tests bench

bench: $(STAMP)
	$(BIN)/python bench/store_bench.py

clean:
	rm -rf $(VENV) build *.egg-info
