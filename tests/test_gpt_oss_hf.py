"""GPT-OSS from a Hugging Face directory whose experts are MXFP4 blocks and scales (the Hub's layout).

The checkpoint is built here from the tiny float reference: its expert matrices quantized to MXFP4
by our quantizer, then written as the Hub stores them (`*_blocks` (E, rows, n_blocks, 16) with value
2j in byte j's low nibble, 2j+1 in its high nibble; `*_scales` (E, rows, n_blocks) E8M0 bytes).
The tiny model's hidden size (64) and expert size (32) are multiples of the 32-value block, so both
gate_up_proj (rows 2I, 2 blocks a row) and down_proj (rows d, 1 block a row) fit.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import llambda
from llambda.errors import ModelFormatError
from llambda.formats.open import open_model
from llambda.formats.quants import QType, dequantize, quantize
from llambda.formats.safetensors import SafetensorsFile, write_safetensors
from llambda.formats.weights import WeightTensor

TINY = Path(__file__).parent / "fixtures" / "reference" / "tiny" / "gpt_oss"
FUSED = ("gate_up_proj", "down_proj")
# The e2m1 values of the 16 codes (as transformers' FP4 table), for decoding the Hub's layout here
E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def _float_tensors() -> dict[str, np.ndarray]:
    with SafetensorsFile(TINY / "model.safetensors") as f:
        return {n: t.to_float32().reshape(t.shape).copy() for n, t in f.tensors.items()}


def _ggml_to_hub(q: np.ndarray):
    """(E, rows, n_blocks, 17) ggml MXFP4 blocks -> the Hub's (blocks, scales)."""
    qs = q[..., 1:]
    values = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)          # ggml: value j, then value j + 16
    return (values[..., 0::2] | (values[..., 1::2] << 4)).astype(np.uint8), np.ascontiguousarray(q[..., 0])


def _hub_to_float(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """transformers' decode: low nibble -> even value, high -> odd, times 2^(scale - 127); (E, rows, cols)."""
    v = np.empty((*blocks.shape[:3], 32), np.float32)
    v[..., 0::2], v[..., 1::2] = E2M1[blocks & 0x0F], E2M1[blocks >> 4]
    v = v * np.ldexp(np.float32(1), scales.astype(np.int32) - 127)[..., None]
    return v.reshape(*blocks.shape[:2], -1)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """The MXFP4 Hub directory, the float directory of its dequantized weights, and the ggml expert blocks."""
    tmp = tmp_path_factory.mktemp("gpt_oss_mxfp4")
    floats = _float_tensors()
    cfg = json.loads((TINY / "config.json").read_text())
    mx, deq, ggml = {}, {}, {}
    for i in range(cfg["num_hidden_layers"]):
        for name in FUSED:
            key = f"model.layers.{i}.mlp.experts.{name}"
            w = floats.pop(key).transpose(0, 2, 1)                       # (E, in, out) -> (E, out rows, in)
            q = quantize(np.ascontiguousarray(w), QType.MXFP4)           # (E, rows, n_blocks * 17)
            q = q.reshape(*w.shape[:2], -1, 17)
            blocks, scales = _ggml_to_hub(q)
            mx[f"{key}_blocks"], mx[f"{key}_scales"] = blocks, scales
            hub_float = _hub_to_float(blocks, scales)
            # the test's own conversion agrees with our dequantizer of the ggml blocks
            np.testing.assert_array_equal(hub_float, dequantize(q.reshape(-1), QType.MXFP4, w.shape))
            deq[key] = np.ascontiguousarray(hub_float.transpose(0, 2, 1))
            ggml[(i, name)] = q
    out = {}
    for kind, extra, qcfg in (("mxfp4", mx, {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}),
                              ("float", deq, None)):
        d = tmp / kind
        d.mkdir()
        write_safetensors(d / "model.safetensors", {**floats, **extra})
        c = dict(cfg, quantization_config=qcfg) if qcfg else cfg
        (d / "config.json").write_text(json.dumps(c))
        shutil.copy(TINY / "generation_config.json", d)
        out[kind] = d
    return out, ggml


def _gguf_of_the_same_blocks(tmp: Path, ggml) -> Path:
    """The float reference exported as GGUF with its experts replaced by the same ggml MXFP4 blocks."""
    from llambda.tools.export import export
    src = open_model(TINY)
    plain = src.tensor

    def tensor(name: str):
        for (i, fused), q in ggml.items():
            parts = ({"ffn_down_exps.weight": q} if fused == "down_proj" else
                     {"ffn_gate_exps.weight": q[:, 0::2], "ffn_up_exps.weight": q[:, 1::2]})
            for leaf, p in parts.items():
                if name == f"blk.{i}.{leaf}":
                    p = np.ascontiguousarray(p)
                    return WeightTensor(name, QType.MXFP4, (p.shape[0], p.shape[1], p.shape[2] * 32), p.reshape(-1))
        return plain(name)

    src.tensor = tensor
    try:
        return export(src, tmp / "mx.gguf", fmt="gguf")
    finally:
        src.close()


def _run(path, backend, ids):
    act = "f32" if backend == "native" else None
    with llambda.load(path, backend=backend, activations=act, n_ctx=128) as m:
        return m.logits(ids), list(m.generate(ids, max_tokens=12, temperature=0, ignore_eos=True)), m


@pytest.mark.parametrize("backend", ["numpy", "native"])
def test_hub_mxfp4_experts_load_as_mxfp4_and_match(checkpoints, backend, tmp_path):
    dirs, ggml = checkpoints
    ref = json.loads((TINY / "reference.json").read_text())
    ids = ref["inputs"][2]["input_ids"]
    src = open_model(dirs["mxfp4"])
    try:       # not dequantized: the experts are MXFP4 tensors of GGUF's shapes, biases stay float
        assert src.tensor("blk.1.ffn_gate_exps.weight").qtype == QType.MXFP4
        assert src.tensor("blk.1.ffn_up_exps.weight").shape == (4, 32, 64)
        assert src.tensor("blk.1.ffn_down_exps.weight").shape == (4, 64, 32)
        assert src.tensor("blk.1.ffn_gate_exps.bias").qtype == QType.F32
        np.testing.assert_array_equal(src.tensor("blk.0.ffn_down_exps.weight").data, ggml[(0, "down_proj")].reshape(-1))
    finally:
        src.close()
    got, greedy, _ = _run(dirs["mxfp4"], backend, ids)
    via_gguf, greedy_gguf, _ = _run(_gguf_of_the_same_blocks(tmp_path, ggml), backend, ids)
    oracle, greedy_oracle, _ = _run(dirs["float"], "numpy", ids)
    reference, _, _ = _run(TINY, "numpy", ids)
    assert float(np.abs(got - via_gguf).max()) <= 1e-5
    assert float(np.abs(got - oracle).max()) <= 1e-3
    assert greedy == greedy_gguf == greedy_oracle
    # the comparisons can fail: MXFP4 moves the logits well past the tolerance from the float model's
    assert float(np.abs(got - reference).max()) > 1e-2


def _edited(tmp_path, checkpoints, edit):
    dirs, _ = checkpoints
    d = tmp_path / "bad"
    shutil.copytree(dirs["mxfp4"], d)
    with SafetensorsFile(d / "model.safetensors") as f:
        tensors = {n: (t.data.reshape(t.shape).copy() if t.qtype == QType.I8 else t.to_float32().reshape(t.shape).copy())
                   for n, t in f.tensors.items()}
    edit(tensors)
    write_safetensors(d / "model.safetensors", tensors)
    return d


BLOCKS = "model.layers.1.mlp.experts.down_proj_blocks"
SCALES = "model.layers.1.mlp.experts.down_proj_scales"


@pytest.mark.parametrize("edit, named", [
    (lambda t: t.update({BLOCKS: t[BLOCKS][..., :8].copy()}), BLOCKS),                 # 8 bytes a block
    (lambda t: t.update({BLOCKS: t[BLOCKS].astype(np.float32)}), BLOCKS),              # not U8
    (lambda t: t.update({BLOCKS: t[BLOCKS].reshape(4, 64, 16)}), BLOCKS),              # 3-D
    (lambda t: t.update({SCALES: t[SCALES][:, :32].copy()}), BLOCKS),                   # a scale per block
    (lambda t: t.pop(SCALES), BLOCKS),                                                  # no partner
    (lambda t: t.update({"model.layers.0.self_attn.sinks": np.zeros(4, np.uint8)}), "self_attn.sinks"),
])
def test_malformed_mxfp4_blocks_are_model_format_errors(tmp_path, checkpoints, edit, named):
    with pytest.raises(ModelFormatError, match=named.replace(".", r"\.")):
        llambda.load(_edited(tmp_path, checkpoints, edit), backend="numpy", n_ctx=64)


def test_other_quantization_methods_are_refused(tmp_path, checkpoints):
    dirs, _ = checkpoints
    d = tmp_path / "awq"
    shutil.copytree(dirs["mxfp4"], d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "awq"}
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelFormatError, match="awq"):
        llambda.load(d, backend="numpy", n_ctx=64)
