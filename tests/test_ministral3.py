"""Ministral 3 (`ministral3`) and the text model of a Mistral 3 directory (`mistral3`); llama.cpp's `mistral3`.

The tiny references (fixtures/reference/tiny/ministral3 and mistral3, made by tools/make_tiny_ministral3.py;
README_ministral3.md there) set original_max_position_embeddings to 16, so the query temperature
1 + 0.1 ln(1 + floor(p / 16)) steps inside the prompts. Here: both folders and their GGUF exports on every
backend against transformers; decode steps through the KV cache (recorded plans included) against full
forwards, across the steps; plans replayed across the steps bit for bit as op by op, batched slots as each
alone; the control without the temperature; llama.cpp on our exports past the steps;
the settings each format yields; the Mistral 3 directory's decoder read alone; refusals.
"""
from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest

import llambda
from llambda.backends import available_backends
from llambda.errors import LlambdaError, ModelFormatError
from llambda.formats.gguf import GGUFFile
from llambda.formats.gguf_writer import write_gguf
from llambda.formats.quants import QType, dequantize
from llambda.models import ministral3
from llambda.tools.export import export
from archkit import TINY, edited_copy, exported, max_err, reference  # noqa: F401 (exported: a fixture)

FOLDERS = ["ministral3", "mistral3"]
# (backend, activations, max |logit diff| against transformers): float32 throughout in the first two; the
# native backend's fast mode rounds activations to 8 bits beside quantized weights (these are float32: the
# same kernels as exact mode here, the budget the other tiny folders' fast runs have)
MODES = {"numpy": ("numpy", None, 2e-4), "native-exact": ("native", "f32", 2e-4), "native-fast": ("native", "q8", 1e-2)}


def load(path, mode: str = "numpy", n_ctx: int = 128, **kw):
    """archkit's load, with our budgets and the composite's skipped-tower warning (test_tower_is_skipped_...)
    silenced."""
    if MODES[mode][0] not in available_backends():
        pytest.skip(f"the {MODES[mode][0]} backend is not available here (C core not built)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return llambda.load(path, backend=MODES[mode][0], activations=MODES[mode][1], n_ctx=n_ctx, **kw)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("source", ["hf", "gguf"])
@pytest.mark.parametrize("folder", FOLDERS)
def test_logits_and_greedy_match_transformers(exported, folder, source, mode):
    ref = reference(folder)
    with load(TINY / folder if source == "hf" else exported(folder), mode) as m:
        assert m.config.arch == "ministral3"
        assert max_err(m, folder) <= MODES[mode][2]
        inp = ref["inputs"][2]           # 100 tokens + 16: positions through the temperature's sixth step
        assert list(m.generate(inp["input_ids"], max_tokens=16, temperature=0, ignore_eos=True)) == \
            inp["greedy_new_tokens"]


@pytest.mark.parametrize("folder", FOLDERS)
def test_quantized_native_matches_numpy(folder):
    """Q8_0 weights (quantized at load): the quantized kernels against the NumPy oracle on the same weights, exact
    mode within the float budget. Fast mode's 8-bit activations move the last-3 logits by 0.48 (ministral3, std
    2.5) and 1.14 (mistral3, std 4; 0.70 with the temperature taken out: factors up to 1.19 sharpen attention
    and what the rounding moves with it), as they move llama's by 0.31 and smollm3's by 0.68 (test_tiny_models)."""
    from test_tiny_models import native_vs_numpy
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        errs = native_vs_numpy(folder, "q8_0")
    assert errs["f32"] <= 2e-4 and errs["q8"] <= 1.5, errs


def forward(m, ids, slots, pos):
    n = len(ids)
    return m.transformer.forward(np.array(ids, np.int32), np.array(slots, np.int32), list(pos), range(n)).copy()


@pytest.mark.parametrize("mode", ["numpy", "native-exact"])
def test_decode_steps_equal_full_forwards_across_the_steps(mode):
    """Each decode step through the KV cache (one token, logits rows range(1): the native backend's recorded
    plan, replayed on both sides of the steps) gives the full forward's row; and a batch of two slots, one
    below the first step and one past it, gives each its own factor."""
    ids = reference("ministral3")["inputs"][2]["input_ids"][:52]
    with load(TINY / "ministral3", mode, n_slots=2) as m:
        full = forward(m, ids, [0] * len(ids), range(len(ids)))
        forward(m, ids[:6], [1] * 6, range(6))
        for p in range(6, len(ids)):         # steps at 16, 32 and 48 on the way
            row = forward(m, [ids[p]], [1], [p])[0]
            np.testing.assert_allclose(row, full[p], atol=2e-4, rtol=0, err_msg=f"position {p}")
        forward(m, ids[:13], [0] * 13, range(13))
        both = forward(m, [ids[13], ids[40]], [0, 1], [13, 40])
        np.testing.assert_allclose(both, full[[13, 40]], atol=2e-4, rtol=0)
        again = forward(m, [ids[14]], [0], [14])      # below the step again: a plan recorded now is right
        np.testing.assert_allclose(again[0], full[14], atol=2e-4, rtol=0)


def scale_runs(B):
    """The temperature as the model applied it before the pos_scale op (then always op by op): the factors in
    NumPy, one backend scale a run of rows with one factor, rows of factor 1 untouched."""
    def pos_scale(x, pos, beta, length):
        f = (1.0 + beta * np.log1p((np.asarray(pos, np.int64) // length).astype(np.float64))).astype(np.float32)
        ends = np.concatenate((np.flatnonzero(f[1:] != f[:-1]) + 1, [len(f)]))
        for start, end in zip(np.concatenate(([0], ends[:-1])), ends):
            if f[start] != 1.0:
                B.scale(x[start:end], float(f[start]))
    return pos_scale


def stepped(m, ids, batched: bool):
    """Slots 0, 1, 2 prefilled to 10, 14 and 30 tokens; slot 0 decoded alone to 40 (past the steps at 16 and 32);
    then 12 steps of all three (slot 1 past 16, slot 2 past 32, slot 0 past 48), as one batch of three or each
    slot alone. Every step's logits, in order (a batched step's rows split as the lone steps' are)."""
    out = []
    for slot, n in enumerate((10, 14, 30)):
        forward(m, ids[:n], [slot] * n, range(n))
    for p in range(10, 40):
        out.append(forward(m, [ids[p]], [0], [p]))
    for t in range(12):
        pos = [40 + t, 14 + t, 30 + t]
        if batched:
            out.extend(forward(m, [ids[p] for p in pos], [0, 1, 2], pos)[:, None])
        else:
            out.extend(forward(m, [ids[p]], [slot], [p]) for slot, p in enumerate(pos))
    return out


@pytest.mark.parametrize("mode", list(MODES))
def test_plans_replay_the_temperature_bit_for_bit(mode):
    """Decode steps across the temperature's steps (one slot, then three slots stepping past them together):
    recorded plans replayed (each step's positions read from the arena by the pos_scale op) give the same logits,
    bit for bit, as op by op with the temperature applied as before pos_scale (scale_runs); and each of three
    batched slots gets the bits it gets stepping alone (the native backend is batch invariant)."""
    ids = reference("ministral3")["inputs"][2]["input_ids"]
    with load(TINY / "ministral3", mode, n_slots=3) as a, load(TINY / "ministral3", mode, n_slots=3) as b:
        Ba, Bb = a.transformer.backend, b.transformer.backend
        replays = []
        if getattr(Ba, "supports_plans", False):
            replay = Ba.replay
            Ba.replay = lambda plan: (replays.append(plan), replay(plan))
        Bb.supports_plans = False
        Bb.pos_scale = scale_runs(Bb)
        got, want = stepped(a, ids, batched=True), stepped(b, ids, batched=True)
        for i, (x, y) in enumerate(zip(got, want)):
            assert x.tobytes() == y.tobytes(), f"step {i}"
        if MODES[mode][0] == "native":
            assert {1, 3} <= set(a.transformer._plans) and len(replays) == 29 + 11   # all but each first step
            assert not b.transformer._plans
            with load(TINY / "ministral3", mode, n_slots=3) as c:
                alone = stepped(c, ids, batched=False)
            assert [x.tobytes() for x in got] == [x.tobytes() for x in alone]


def test_without_the_temperature_only_the_rows_past_16_change(tmp_path):
    """The control: llama_4_scaling_beta 0 leaves positions 0..15 as they were (the factor is 1 there) and moves
    the later ones: the temperature is what the reference needs past the first step."""
    rope = reference("ministral3")["config"]["rope_parameters"]
    d = edited_copy("ministral3", tmp_path / "m", rope_parameters=dict(rope, llama_4_scaling_beta=0.0))
    ids = reference("ministral3")["inputs"][2]["input_ids"][:40]
    with load(TINY / "ministral3", n_ctx=64) as a, load(d, n_ctx=64) as b:
        assert b.config.attn_temp_scale == 0
        la, lb = forward(a, ids, [0] * 40, range(40)), forward(b, ids, [0] * 40, range(40))
    assert float(np.abs(la[:16] - lb[:16]).max()) == 0.0
    assert float(np.abs(la[16:] - lb[16:]).max(axis=1).min()) > 1e-3
    assert float(np.abs(la[32:] - lb[32:]).max()) > 0.05


@pytest.mark.parametrize("folder", FOLDERS)
def test_llama_cpp_runs_our_gguf_past_the_steps(exported, folder):
    """llama.cpp (llama-cpp-python 0.3.36's mistral3) on our f32 export, 60 tokens in: its logits within 0.05 of
    ours (they are about 2.5 to 4 wide; it keeps an f16 KV cache)."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the bench extra)")
    from llamacpp_ref import llama_cpp_logits
    ids = reference(folder)["inputs"][2]["input_ids"][:60]
    theirs = llama_cpp_logits(exported(folder), ids)
    with load(exported(folder)) as m:
        ours = m.logits(ids)
    assert float(np.abs(ours - theirs).max()) <= 0.05


@pytest.mark.parametrize("folder", FOLDERS)
def test_settings_from_each_format(exported, folder):
    with GGUFFile(exported(folder)) as f:
        meta, names = f.metadata, set(f.tensors)
    assert meta["general.architecture"] == "mistral3"
    assert meta["mistral3.attention.temperature_scale"] == pytest.approx(0.1)
    assert meta["mistral3.rope.scaling.original_context_length"] == 16
    assert meta["mistral3.rope.scaling.yarn_log_multiplier"] == 1.0 and meta["mistral3.rope.scaling.type"] == "yarn"
    assert ("output.weight" in names) == (folder == "ministral3")       # the composite's head is tied
    for path in (TINY / folder, exported(folder)):
        with load(path, n_ctx=32) as m:
            c = m.config
        assert (c.attn_temp_scale, c.attn_temp_length) == (pytest.approx(0.1), 16), path
        assert (c.head_dim, c.n_heads, c.n_kv_heads, c.d_model) == (32, 4, 2, 64), path
        assert c.rope_scaling["attention_factor"] == 1.0 and c.scale() == pytest.approx(32 ** -0.5), path
        assert not any(c.layer_sliding), path
        if path.suffix != ".gguf":      # (a GGUF config ties where the file has no output.weight: checked above)
            assert c.tie_embeddings == (folder == "mistral3"), path
        assert c.rope_neox == (path.suffix != ".gguf"), path     # llama.cpp's rows permuted as `llama` files


def test_the_decoder_leaves_the_tower_to_llambda_vision():
    """The text model's loader reads the decoder alone, without a warning (the Pixtral tower is llambda.vision's:
    tests/test_vision_pixtral.py); this fixture's tower (patches of 8, the processor's default longest edge 1024:
    past the patch bound) cannot be used, which the load says in one warning and runs the text."""
    from llambda.formats.open import open_model
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        src = open_model(TINY / "mistral3")
    try:
        assert not [x for x in w if "Mistral 3" in str(x.message)]
        assert src.config.arch == "ministral3" and src.config.n_layers == 2
        assert not any("vision" in n or "projector" in n for n in src.tensor_names)
    finally:
        src.close()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        with llambda.load(TINY / "mistral3", backend="numpy", n_ctx=32) as m:
            assert m.vision is None
    said = [str(x.message) for x in w if "vision tower cannot be used" in str(x.message)]
    assert len(said) == 1 and "longest_edge" in said[0], said


def test_yarn_spelled_type_only_is_yarn():
    cfg = json.loads((TINY / "ministral3" / "config.json").read_text())
    cfg["rope_parameters"]["type"] = cfg["rope_parameters"].pop("rope_type")
    assert ministral3.config_from_hf(cfg).inv_freq().tolist() == \
        ministral3.config_from_hf(json.loads((TINY / "ministral3" / "config.json").read_text())).inv_freq().tolist()


def test_a_window_slides_every_layer_whatever_layer_types_say():
    cfg = json.loads((TINY / "ministral3" / "config.json").read_text())
    cfg.update(sliding_window=8, layer_types=["full_attention", "sliding_attention", "full_attention"])
    c = ministral3.config_from_hf(cfg)
    assert c.sliding_window == 8 and c.layer_sliding == [True] * 3


def test_mistral_small_3_shape_runs_as_mistral(tmp_path):
    """A Mistral 3 directory whose text model is `mistral` (Mistral Small 3.1 / 3.2: no YaRN, no temperature)
    runs as Mistral."""
    text = dict(reference("mistral3")["config"]["text_config"], model_type="mistral",
                rope_parameters={"rope_type": "default", "rope_theta": 100.0})
    d = edited_copy("mistral3", tmp_path / "small", text_config=text)
    with load(d, n_ctx=32) as m:
        assert (m.config.arch, m.config.attn_temp_scale, m.config.rope_scaling) == ("mistral", 0.0, None)
        assert np.isfinite(m.logits([1, 2, 3])).all()


def test_hf_export_is_refused(tmp_path):
    with pytest.raises(LlambdaError, match="GGUF only"):
        export(TINY / "ministral3", tmp_path / "hf", fmt="hf")


def test_yarn_attention_factor_as_transformers_computes_it():
    """mscale / mscale_all_dim, the released models' 1 / 1 (factor 1), others (their ratio), none (0.1 ln f + 1);
    and llama.cpp's yarn_log_multiplier carries the ratio both ways."""
    base = json.loads((TINY / "ministral3" / "config.json").read_text())
    for mscale, all_dim, want in ((1.0, 1.0, 1.0), (1.0, 0.5, (0.1 * math.log(16) + 1) / (0.05 * math.log(16) + 1)),
                                  (None, None, 0.1 * math.log(16) + 1)):
        cfg = json.loads(json.dumps(base))
        for k, v in (("mscale", mscale), ("mscale_all_dim", all_dim)):
            if v is None:
                cfg["rope_parameters"].pop(k)
            else:
                cfg["rope_parameters"][k] = v
        c = ministral3.config_from_hf(cfg)
        assert c.rope_scaling["attention_factor"] == pytest.approx(want)
        assert c.scale() == pytest.approx(32 ** -0.5 * want ** 2)
        meta = {**ministral3.gguf_metadata(c), "mistral3.embedding_length": 64, "mistral3.block_count": 3,
                "mistral3.feed_forward_length": 128, "mistral3.attention.head_count": 4,
                "mistral3.attention.head_count_kv": 2, "mistral3.attention.key_length": 32,
                "mistral3.vocab_size": 512, "mistral3.rope.freq_base": 100.0, "mistral3.rope.scaling.type": "yarn",
                "mistral3.rope.scaling.factor": 16.0, "mistral3.rope.scaling.original_context_length": 16}
        back = ministral3.config_from_gguf(meta)
        assert back.scale() == pytest.approx(c.scale(), rel=1e-6)
        assert (back.attn_temp_scale, back.attn_temp_length) == (pytest.approx(0.1), 16)


def _rope(cfg, **kv):
    for k, v in kv.items():
        if v is ...:
            cfg["rope_parameters"].pop(k, None)
        else:
            cfg["rope_parameters"][k] = v


BAD_HF = {
    "no beta": (lambda c: _rope(c, llama_4_scaling_beta=...), "llama_4_scaling_beta"),
    "negative beta": (lambda c: _rope(c, llama_4_scaling_beta=-0.1), "llama_4_scaling_beta"),
    "beta a string": (lambda c: _rope(c, llama_4_scaling_beta="0.1"), "llama_4_scaling_beta"),
    "beta NaN": (lambda c: _rope(c, llama_4_scaling_beta=float("nan")), "llama_4_scaling_beta"),
    "beta huge": (lambda c: _rope(c, llama_4_scaling_beta=1e9), "llama_4_scaling_beta"),
    "no original positions": (lambda c: _rope(c, original_max_position_embeddings=...),
                              "original_max_position_embeddings"),
    "zero original positions": (lambda c: _rope(c, original_max_position_embeddings=0),
                                "original_max_position_embeddings"),
    "original positions a float": (lambda c: _rope(c, original_max_position_embeddings=16.5),
                                   "original_max_position_embeddings"),
    "mscale a string": (lambda c: _rope(c, mscale="1"), "mscale"),
    "no rope_parameters": (lambda c: c.pop("rope_parameters"), "rope_parameters"),
    "no heads": (lambda c: c.pop("num_attention_heads"), "num_attention_heads"),
    "absurd head_dim": (lambda c: c.update(head_dim=1 << 20), "head_dim"),
    "gelu MLP": (lambda c: c.update(hidden_act="gelu"), "hidden_act"),
    "fp8 checkpoint": (lambda c: c.update(quantization_config={"quant_method": "fp8"}), "quantization_config"),
}


@pytest.mark.parametrize("case", list(BAD_HF))
def test_malformed_configs_are_refused_naming_the_field(case):
    cfg = json.loads((TINY / "ministral3" / "config.json").read_text())
    edit, field = BAD_HF[case]
    edit(cfg)
    with pytest.raises(ModelFormatError, match=field):
        ministral3.config_from_hf(cfg)


@pytest.mark.parametrize("edit, field", [
    ({"mistral3.attention.temperature_scale": -1.0}, "temperature_scale"),
    ({"mistral3.attention.temperature_scale": "x"}, "temperature_scale"),
    ({"mistral3.attention.temperature_length": 0}, "attn_temp_length|temperature"),
    ({"mistral3.attention.temperature_length": None, "mistral3.rope.scaling.original_context_length": None},
     "original_context_length"),
    ({"mistral3.rope.scaling.yarn_log_multiplier": float("inf")}, "yarn_log_multiplier"),
])
def test_malformed_gguf_metadata_is_refused(exported, tmp_path, edit, field):
    with pytest.raises(ModelFormatError, match=field):
        llambda.load(edited_gguf(exported("ministral3"), tmp_path / "bad.gguf", edit), backend="numpy", n_ctx=32)


def edited_gguf(src: Path, out: Path, edit: dict) -> Path:
    """The GGUF at src (F32) with metadata keys set, or removed where the value is None."""
    with GGUFFile(src) as f:
        meta, types = dict(f.metadata), f.metadata_types
        items = [(n, QType.F32, dequantize(np.array(t.data), t.qtype, t.shape).astype(np.float32))
                 for n, t in f.tensors.items()]
    for k, v in edit.items():
        if v is None:
            meta.pop(k)
        else:
            meta[k] = v
    write_gguf(out, meta, items, metadata_types={k: t for k, t in types.items() if k in meta and k not in edit})
    return out


def test_gguf_as_llama_cpps_converter_writes_it(exported, tmp_path):
    """llama.cpp's converter writes no attention.temperature_length: the temperature steps by YaRN's original
    context, the same model."""
    plain = edited_gguf(exported("ministral3"), tmp_path / "conv.gguf", {"mistral3.attention.temperature_length": None})
    ids = reference("ministral3")["inputs"][1]["input_ids"]
    with load(plain) as a, load(exported("ministral3")) as b:
        assert (a.config.attn_temp_scale, a.config.attn_temp_length) == (pytest.approx(0.1), 16)
        np.testing.assert_array_equal(a.logits(ids), b.logits(ids))
