"""What the tests of a tiny reference folder share (test_olmoe.py, test_morearch.py): its reference, loading it on
a mode, its logits against transformers', decode steps through the KV cache against full forwards, and config.json
edited into a copy of the folder."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

import llambda
from llambda.backends import available_backends

TINY = Path(__file__).parent / "fixtures" / "reference" / "tiny"
# (backend, activations, max |logit diff| budget against transformers)
MODES = {"numpy": ("numpy", None, 1e-3), "native-exact": ("native", "f32", 1e-3), "native-fast": ("native", "q8", 1e-2)}


def reference(folder: str) -> dict:
    return json.loads((TINY / folder / "reference.json").read_text(encoding="utf-8"))


def load(path, mode: str = "numpy", **kw):
    backend, act, _ = MODES[mode]
    if backend not in available_backends():
        pytest.skip(f"the {backend} backend is not available here (C core not built)")
    return llambda.load(path, backend=backend, activations=act, n_ctx=kw.pop("n_ctx", 128), **kw)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A fixture: folder -> its f32 GGUF export, written once a test module."""
    from llambda.tools.export import export
    done = {}

    def get(folder: str) -> Path:
        if folder not in done:
            done[folder] = export(TINY / folder, tmp_path_factory.mktemp(folder) / "f32.gguf", fmt="gguf", qtype="f32")
        return done[folder]
    return get


def each_format(folder: str, exported):
    """(path, ModelSource) of the folder and of its GGUF export (`exported`, the fixture), each closed after its turn."""
    from llambda.formats.open import open_model
    for path in (TINY / folder, exported(folder)):
        src = open_model(path)
        try:
            yield path, src
        finally:
            src.close()


def max_err(m, folder: str) -> float:
    """Max |logit diff| against transformers over the folder's three inputs' last three positions."""
    errs = []
    for inp in reference(folder)["inputs"]:
        got = np.stack([m.logits(inp["input_ids"][:p + 1]) for p in inp["last_positions"]])
        errs.append(float(np.abs(got - np.array(inp["logits_last3"], np.float32)).max()))
    return max(errs)


def greedy_matches(m, folder: str) -> bool:
    inp = reference(folder)["inputs"][2]
    return list(m.generate(inp["input_ids"], max_tokens=16, temperature=0, ignore_eos=True)) == \
        inp["greedy_new_tokens"]


def decode_vs_full(m, ids: list[int], prefill: int) -> float:
    """Max |logit diff| between decode steps (a prefill of `prefill` tokens, then one token a step through the
    KV cache) and one full forward of every row."""
    t = m.transformer
    n = len(ids)
    full = t.forward(np.array(ids, np.int32), np.zeros(n, np.int32), np.arange(n, dtype=np.int32), list(range(n))).copy()
    steps = [t.forward(np.array(ids[:prefill], np.int32), np.zeros(prefill, np.int32),
                       np.arange(prefill, dtype=np.int32), [prefill - 1]).copy()]
    for p in range(prefill, n):
        steps.append(t.forward(np.array([ids[p]], np.int32), np.zeros(1, np.int32), np.array([p], np.int32),
                               [0]).copy())
    return float(np.abs(np.concatenate(steps) - full[prefill - 1:]).max())


def edited_copy(folder: str, dest: Path, **changes) -> Path:
    """The folder with config.json changed (a value None deletes the key), its weights linked."""
    cfg = json.loads((TINY / folder / "config.json").read_text(encoding="utf-8"))
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    if not (dest / "model.safetensors").exists():
        os.symlink(TINY / folder / "model.safetensors", dest / "model.safetensors")
    return dest
