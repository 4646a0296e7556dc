# gfcr — set-up, demo and tests. Everything a fresh machine needs is installed from here.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch is pinned to the CPU build that pip finds locally; an unpinned torch pulls a multi-GB CUDA build.
TORCH ?= torch==2.13.0
STAMP := $(VENV)/.installed
# The suite on pytest-xdist workers, one per core of the 2-core machine it is sized for (the longest
# tests first, some modules kept on one worker: see tests/conftest.py). TEST_WORKERS=1 runs it serially.
TEST_WORKERS ?= 2
PARALLEL := $(if $(filter 1,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder)

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
	$(BIN)/python -m pytest -q $(PARALLEL) tests

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q $(PARALLEL) -m "not slow and not browser" tests

lint: $(STAMP)
	$(BIN)/ruff check src tests bench

bench: $(STAMP)
	$(BIN)/python bench/store_bench.py

clean:
	rm -rf $(VENV) build *.egg-info
