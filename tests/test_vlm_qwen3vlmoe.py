"""Qwen3-VL-MoE's text model (qwen3vlmoe: Qwen3-MoE with Qwen3-VL's interleaved M-RoPE and DeepStack) against
transformers' tiny Qwen3VLMoeForConditionalGeneration (tests/fixtures/reference/tiny/qwen3_vl_moe_vision,
tools/make_tiny_qwen3vlmoe.py), with the model's own tower (llambda.vision's Qwen3-VL, found by llambda.load):
the two-image chat's ids, logits and greedy tokens, the text-only prompt; the experts as transformers 5 saves them
(output-major) and as the Hub's checkpoints hold them (input-major, each expert transposed when packed); our
qwen3vlmoe GGUF with our mmproj."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import llambda
from llambda.errors import ModelFormatError

import test_vlm_qwen25vl as q25  # noqa: E402  (the grid families' reference checks)

FOLDER = Path(__file__).parent / "fixtures" / "reference" / "tiny" / "qwen3_vl_moe_vision"
REF = json.loads((FOLDER / "reference.json").read_text(encoding="utf-8"))
FIX_PNG = {name: (FOLDER / name).read_bytes() for name in REF["images"]}
TWO, TEXT = REF["prompts"][0], REF["text_only"]
GRIDS = [(3, 4), (5, 3)]


def hub_layout(dest: Path) -> Path:
    """The fixture with its experts as the Hub's checkpoints store them: gate_up_proj (E, d, 2I), down_proj
    (E, I, d), input-major (transformers 4's bmm), every other file as it is."""
    import shutil
    from llambda.formats.safetensors import open_safetensors_dir, write_safetensors
    shutil.copytree(FOLDER, dest)
    st = open_safetensors_dir(FOLDER)
    try:
        out = {}
        for name, t in st.tensors.items():
            v = t.to_float32().reshape(t.shape)
            out[name] = np.ascontiguousarray(v.transpose(0, 2, 1)) if ".mlp.experts." in name else v
    finally:
        st.close()
    write_safetensors(dest / "model.safetensors", out)
    return dest


def test_the_fixture_loads_as_qwen3vlmoe():
    with llambda.load(FOLDER, backend="numpy", n_ctx=128) as m:
        c = m.config
        assert (c.arch, c.n_experts, c.n_experts_used, c.expert_ffn_dim, c.moe_norm_topk) == ("qwen3vlmoe", 4, 2, 24, True)
        assert (c.rope_sections, c.rope_interleaved, c.deepstack_levels, c.qk_norm) == ([2, 3, 3], True, 2, True)
        assert all(c.moe_layers) and m.vision.family == "qwen3_vl" and m.transformer.deepstack == 2


@pytest.mark.parametrize("mode", ["numpy", "native-exact"])
def test_whole_model_with_its_own_tower_matches_transformers(mode):
    with q25.own_tower_model(FOLDER, mode) as m:
        q25.own_tower_matches_reference(m, TWO, FIX_PNG, FOLDER, 1e-4, GRIDS)
        q25.text_matches_reference(m, TEXT, FOLDER, 1e-4)


def test_the_default_mode_gives_the_greedy_tokens():
    """The default (fast) mode: its bfloat16 tower and 8-bit activations move a few image rows' router choices
    in this random MoE (close expert scores: 0.6-0.9 logits at 2 of the 11 reference rows), so the image
    prompt's rows are held to test_vlm_qwen25vl's fast budget but for those; the greedy tokens and the text-only
    prompt (its budget 1e-2) are transformers'."""
    with q25.own_tower_model(FOLDER, "native-fast") as m:
        msgs = q25.fixture_messages(TWO, FIX_PNG)
        ids, blocks = m.image_prompt(m.render_chat(msgs), [FIX_PNG[n] for n in TWO["images"]])
        err = np.abs(q25.whole_logits(m, ids, blocks)[TWO["rows"]] - np.load(FOLDER / TWO["logits_rows"])).max(axis=1)
        assert (err > 0.1).sum() <= 2 and err.max() < 2, err
        want = TWO["greedy_new_tokens"]
        assert [e.token for e in m.chat_stream(msgs, max_tokens=len(want), temperature=0, ignore_eos=True)
                if e.token >= 0] == want
        q25.text_matches_reference(m, TEXT, FOLDER, 1e-2)


@pytest.mark.parametrize("mode", ["numpy", "native-exact"])
def test_the_hubs_input_major_experts_are_the_same_model(tmp_path, mode):
    """The Hub's layout (each expert transposed as the backend packs it) gives the logits of transformers 5's bit
    for bit, and the reference's."""
    hub = hub_layout(tmp_path / "hub")
    out = []
    for folder in (FOLDER, hub):
        with q25.own_tower_model(folder, mode) as m:
            ids, blocks = m.image_prompt(TWO["chat_text"], [FIX_PNG[n] for n in TWO["images"]])
            out.append(q25.whole_logits(m, ids, blocks).copy())
    assert np.array_equal(out[0], out[1])
    assert float(np.abs(out[1][TWO["rows"]] - np.load(FOLDER / TWO["logits_rows"])).max()) <= 1e-4


def test_experts_of_another_shape_are_refused(tmp_path):
    import shutil
    from llambda.formats.safetensors import open_safetensors_dir, write_safetensors
    dest = tmp_path / "bad"
    shutil.copytree(FOLDER, dest)
    st = open_safetensors_dir(FOLDER)
    try:
        t = {n: w.to_float32().reshape(w.shape) for n, w in st.tensors.items()}
    finally:
        st.close()
    name = "model.language_model.layers.1.mlp.experts.down_proj"
    t[name] = t[name][:, :, :20]
    write_safetensors(dest / "model.safetensors", t)
    with pytest.raises(ModelFormatError, match="not 4 experts"):
        llambda.load(dest, backend="numpy", vision=False)


def test_our_gguf_and_mmproj_are_the_checkpoint(tmp_path):
    """llama.cpp's layout: our qwen3vlmoe text GGUF (qwen3moe's expert keys, rope.dimension_sections,
    n_deepstack_layers) and our qwen3vl_merger mmproj give the checkpoint's ids and logits."""
    from llambda.formats.gguf import GGUFFile
    from llambda.tools.export import export
    from llambda.vision.mmproj import write_mmproj
    gg = export(FOLDER, tmp_path / "text.gguf", fmt="gguf", qtype="f32")
    with GGUFFile(gg) as f:
        meta = f.metadata
        assert meta["general.architecture"] == "qwen3vlmoe" and int(meta["qwen3vlmoe.expert_count"]) == 4
        assert np.asarray(meta["qwen3vlmoe.rope.dimension_sections"]).tolist() == [2, 3, 3, 0]
        assert int(meta["qwen3vlmoe.n_deepstack_layers"]) == 2
    proj = write_mmproj(FOLDER, tmp_path / "mmproj.gguf", "f32")
    with llambda.load(gg, backend="numpy", n_ctx=128, mmproj=proj) as m:
        assert m.config.arch == "qwen3vlmoe" and m.transformer.deepstack == 2
        q25.own_tower_matches_reference(m, TWO, FIX_PNG, FOLDER, 1e-4, GRIDS)
