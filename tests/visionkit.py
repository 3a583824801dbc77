"""Helpers the vision tower tests share: a fixture directory copied with its configs or tensors edited, an
mmproj GGUF rewritten with its metadata edited or tensors dropped, llama.cpp's rows of an image."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from llambda.formats import gguf, gguf_writer, quants, safetensors


def copy_fixture(src: Path, dest: Path, pre_edit=None, config_edit=None, tensors_edit=None) -> Path:
    """The fixture directory `src` copied to `dest`, its processor settings, config or tensors edited in place by
    the given callables."""
    shutil.copytree(src, dest)
    for name, edit in (("preprocessor_config.json", pre_edit), ("config.json", config_edit)):
        if edit is not None:
            d = json.loads((dest / name).read_text())
            edit(d)
            (dest / name).write_text(json.dumps(d))
    if tensors_edit is not None:
        with safetensors.SafetensorsFile(dest / "model.safetensors") as st:
            tensors = {n: t.to_float32() for n, t in st.tensors.items()}
        tensors_edit(tensors)
        safetensors.write_safetensors(dest / "model.safetensors", tensors)
    return dest


def rewrite_gguf(src: Path, dest: Path, meta_edit=None, drop=()) -> Path:
    """A copy of the F32 GGUF `src`, its metadata edited in place by `meta_edit`, the tensors `drop` left out."""
    with gguf.GGUFFile(src) as f:
        meta = dict(f.metadata)
        if meta_edit is not None:
            meta_edit(meta)
        tensors = [(n, quants.QType.F32, np.ascontiguousarray(t.as_float32()))
                   for n, t in f.tensors.items() if n not in drop]
        gguf_writer.write_gguf(dest, meta, tensors)
    return dest


def llama_cpp_rows(mmproj, rgb: np.ndarray, tmp: Path, control_tokens=()) -> list:
    """llama.cpp's rows (llama-cpp-python's libmtmd, tests/llamacpp_ref.py) of an RGB image [h, w, 3] uint8 with
    `mmproj` beside a tiny 64-wide llama text model holding `control_tokens`; a skip where libmtmd is absent."""
    pytest.importorskip("llama_cpp")
    try:
        from llama_cpp import mtmd_cpp  # noqa: F401
    except Exception as e:      # an older build without the multimodal library
        pytest.skip(f"llama-cpp-python has no mtmd library here ({e})")
    sys.path.insert(0, str(Path(__file__).parent))
    from llamacpp_ref import mtmd_image_rows
    from test_export import tiny_llama_gguf
    text = tiny_llama_gguf(tmp / "text.gguf", control_tokens=control_tokens)     # mtmd looks these tokens up
    return mtmd_image_rows(text, mmproj, rgb, tmp)


EXACT = 1e-4        # transformers in float32 (eager attention) against our float32 paths


def fixture(folder: str) -> tuple[Path, dict]:
    """(the directory, its reference.json) of a tiny vision fixture under tests/fixtures/reference/tiny."""
    tiny = Path(__file__).parent / "fixtures/reference/tiny" / folder
    return tiny, json.loads((tiny / "reference.json").read_text(encoding="utf-8"))


def within(hidden: list, rows: list, budget_hidden: float, budget_rows: float) -> dict:
    """The worst of each list of errors, asserted within its budget."""
    worst = {"hidden": float(max(hidden)), "rows": float(max(rows))}
    assert worst["hidden"] <= budget_hidden and worst["rows"] <= budget_rows, worst
    return worst
