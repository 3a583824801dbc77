"""A HF checkpoint's tensor of the wrong shape is named as the checkpoint names it, the canonical (GGUF) name
in parentheses, as a missing one is (formats/hf_dir.hf_names); a GGUF's tensors keep their one name."""
import shutil
from pathlib import Path

import numpy as np
import pytest

import llambda
from llambda.backends import available_backends
from llambda.errors import ModelFormatError
from llambda.formats.safetensors import SafetensorsFile, write_safetensors

TINY = Path(__file__).parent / "fixtures" / "reference" / "tiny"


def _folder_with(tmp_path: Path, folder: str, name: str) -> Path:
    """The tiny HF folder with tensor `name` one row short."""
    d = tmp_path / folder
    shutil.copytree(TINY / folder, d)
    with SafetensorsFile(TINY / folder / "model.safetensors") as f:
        arrays = {n: np.array(t.to_float32()).reshape(t.shape).astype(np.float32) for n, t in f.tensors.items()}
    arrays[name] = arrays[name][:-1]
    write_safetensors(d / "model.safetensors", arrays)
    return d


@pytest.mark.parametrize("backend", available_backends())
@pytest.mark.parametrize("folder, name, canonical, shape, expected", [
    ("llama", "model.layers.0.self_attn.k_proj.weight", "blk.0.attn_k.weight", "(31, 64)", "(32, 64)"),
    ("llama", "model.layers.1.post_attention_layernorm.weight", "blk.1.ffn_norm.weight", "(63,)", "(64,)"),
    ("llama", "model.embed_tokens.weight", "token_embd.weight", None, None),
])
def test_a_wrong_shape_names_the_checkpoints_tensor(tmp_path, backend, folder, name, canonical, shape, expected):
    path = _folder_with(tmp_path, folder, name)
    with pytest.raises(ModelFormatError) as e:
        llambda.load(path, backend=backend, n_ctx=32)
    said = str(e.value)
    assert f"tensor {name!r} ({canonical}) has shape " in said, said
    if shape is not None:
        assert said.endswith(f"has shape {shape}, expected {expected}"), said
