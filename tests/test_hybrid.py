"""Hybrid models (layers that are not all attention): LFM2's gated short convolutions and
Qwen3-Next's gated delta nets.

The tiny references (fixtures/reference/tiny/lfm2 and qwen3_next, made by tools/make_tiny_hybrid.py)
are also run by test_tiny_models.py with every other folder; here: LFM2's GGUF path under llama.cpp's
names and keys, the recurrent ops on every ISA against float64 oracles, the recurrent state beside
the KV cache (prefill fills it, decode rolls it, position 0 resets it, nothing else may move it),
batch invariance, the server's scheduler and the refusals (speculative decoding, prefix reuse).
"""
import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

import llambda
from llambda.backends import available_backends
from llambda.errors import InvalidInputError, ModelFormatError
from llambda.formats.gguf_writer import write_gguf
from llambda.formats.quants import QType
from llambda.formats.safetensors import SafetensorsFile

TINY = Path(__file__).parent / "fixtures" / "reference" / "tiny"
LFM2 = TINY / "lfm2"
HYBRIDS = ["lfm2", "qwen3_next"]
# every recurrent kind, for the state's tests (Granite 4's Mamba2, dense and MoE: tests/test_granite.py has the rest)
STATEFUL = HYBRIDS + ["granitemoehybrid", "granitemoehybrid_dense"]
MODES = {"numpy": ("numpy", None, 1e-3), "native-exact": ("native", "f32", 1e-3), "native-fast": ("native", "q8", 1e-2)}

# HF name -> llama.cpp's GGUF name (its gguf-py tensor_mapping for lfm2)
LFM2_GGUF = {
    "operator_norm": "attn_norm", "ffn_norm": "ffn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.out_proj": "attn_output", "self_attn.q_layernorm": "attn_q_norm",
    "self_attn.k_layernorm": "attn_k_norm", "feed_forward.w1": "ffn_gate", "feed_forward.w3": "ffn_up",
    "feed_forward.w2": "ffn_down", "conv.in_proj": "shortconv.in_proj", "conv.conv": "shortconv.conv",
    "conv.out_proj": "shortconv.out_proj",
}


def reference(folder="lfm2") -> dict:
    return json.loads((TINY / folder / "reference.json").read_text(encoding="utf-8"))


def need(backend):
    if backend not in available_backends():
        pytest.skip(f"the {backend} backend is not available here (C core not built)")


def load(path, mode, **kw):
    backend, act, _ = MODES[mode]
    need(backend)
    return llambda.load(path, backend=backend, activations=act, **kw)


def lfm2_gguf(out: Path) -> Path:
    """The tiny LFM2 as llama.cpp's converter writes it: conv kernels squeezed to (d, L), the final
    norm as token_embd_norm, head_count_kv per layer (0 for a conv layer), shortconv.l_cache, the
    MLP's derived width as feed_forward_length; float32 tensors, no tokenizer."""
    cfg = json.loads((LFM2 / "config.json").read_text())
    tensors = {}
    with SafetensorsFile(LFM2 / "model.safetensors") as f:
        for name, t in f.tensors.items():
            w = np.array(t.to_float32()).reshape(t.shape)
            if name == "model.embed_tokens.weight":
                g = "token_embd.weight"
            elif name == "model.embedding_norm.weight":
                g = "token_embd_norm.weight"
            else:
                _, _, i, rest = name.split(".", 3)
                g = f"blk.{i}.{LFM2_GGUF[rest.rsplit('.', 1)[0]]}.weight"
            tensors[g] = (QType.F32, np.ascontiguousarray(w.reshape(w.shape[0], -1) if w.ndim == 3 else w))
    a = "lfm2"
    meta = {"general.architecture": a, "general.name": "tiny-lfm2", f"{a}.block_count": cfg["num_hidden_layers"],
            f"{a}.context_length": cfg["max_position_embeddings"], f"{a}.embedding_length": cfg["hidden_size"],
            f"{a}.feed_forward_length": 128, f"{a}.attention.head_count": cfg["num_attention_heads"],
            f"{a}.attention.head_count_kv": [cfg["num_key_value_heads"] if t != "conv" else 0
                                              for t in cfg["layer_types"]],
            f"{a}.rope.freq_base": cfg["rope_parameters"]["rope_theta"],
            f"{a}.attention.layer_norm_rms_epsilon": cfg["norm_eps"], f"{a}.vocab_size": cfg["vocab_size"],
            f"{a}.shortconv.l_cache": cfg["conv_L_cache"]}
    write_gguf(out, meta, tensors)
    return out


# HF name (after model.layers.N.) -> llama.cpp's qwen3next GGUF name (its converter and tensor_mapping)
QWEN3NEXT_GGUF = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "post_attention_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "linear_attn.in_proj_ba": "ssm_ba", "linear_attn.out_proj": "ssm_out", "linear_attn.norm": "ssm_norm",
    "linear_attn.conv1d": "ssm_conv1d", "linear_attn.A_log": "ssm_a", "linear_attn.dt_bias": "ssm_dt",
    "mlp.gate": "ffn_gate_inp", "mlp.shared_expert.gate_proj": "ffn_gate_shexp",
    "mlp.shared_expert.up_proj": "ffn_up_shexp", "mlp.shared_expert.down_proj": "ffn_down_shexp",
    "mlp.shared_expert_gate": "ffn_gate_inp_shexp",
}


def qwen3next_gguf(out: Path) -> Path:
    """The tiny Qwen3-Next as llama.cpp's converter writes it: norms (but the delta net's) + 1, ssm_a =
    -exp(A_log), dt_bias as ssm_dt.bias, conv kernels squeezed, in_proj_qkvz regrouped into attn_qkv
    (all q heads, all k heads, all v heads) and attn_gate (z), experts stacked; float32, no tokenizer."""
    cfg = json.loads((TINY / "qwen3_next" / "config.json").read_text())
    hk, hv, dk, dv = (cfg[k] for k in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                                       "linear_value_head_dim"))
    r = hv // hk
    tensors, experts = {}, {}
    with SafetensorsFile(TINY / "qwen3_next" / "model.safetensors") as f:
        for name, t in f.tensors.items():
            w = np.array(t.to_float32()).reshape(t.shape).astype(np.float32)
            if name in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"):
                g = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                     "lm_head.weight": "output.weight"}[name]
                tensors[g] = w + 1 if name == "model.norm.weight" else w
                continue
            _, _, i, rest = name.split(".", 3)
            leaf, _, kind = rest.rpartition(".")
            if rest.startswith("mlp.experts."):
                _, _, e, proj, _ = rest.split(".")
                experts.setdefault((i, proj), {})[int(e)] = w
                continue
            if rest == "linear_attn.in_proj_qkvz.weight":
                g3 = w.reshape(hk, 2 * dk + 2 * r * dv, -1)
                parts = np.split(g3, [dk, 2 * dk, 2 * dk + r * dv], axis=1)
                tensors[f"blk.{i}.attn_qkv.weight"] = np.concatenate([p.reshape(-1, w.shape[1]) for p in parts[:3]])
                tensors[f"blk.{i}.attn_gate.weight"] = parts[3].reshape(-1, w.shape[1])
                continue
            if rest in ("linear_attn.A_log", "linear_attn.dt_bias"):
                leaf, kind = rest, "bias" if rest.endswith("dt_bias") else "weight"
                w = -np.exp(w) if rest.endswith("A_log") else w
            if leaf.endswith("norm") and leaf != "linear_attn.norm":
                w = w + 1
            if w.ndim == 3:
                w = w.reshape(w.shape[0], -1)
            if leaf == "mlp.shared_expert_gate":
                w = w.reshape(-1)                     # llama.cpp's shape: one vector of d_model
            if rest == "linear_attn.A_log":       # llama.cpp's name has no `.weight`
                tensors[f"blk.{i}.ssm_a"] = w
                continue
            tensors[f"blk.{i}.{QWEN3NEXT_GGUF[leaf]}.{kind}"] = w
    for (i, proj), per in experts.items():
        tensors[f"blk.{i}.ffn_{proj.split('_')[0]}_exps.weight"] = np.stack([per[e] for e in sorted(per)])
    a = "qwen3next"
    meta = {"general.architecture": a, f"{a}.block_count": cfg["num_hidden_layers"],
            f"{a}.context_length": cfg["max_position_embeddings"], f"{a}.embedding_length": cfg["hidden_size"],
            f"{a}.feed_forward_length": cfg["intermediate_size"], f"{a}.attention.head_count": cfg["num_attention_heads"],
            f"{a}.attention.head_count_kv": cfg["num_key_value_heads"], f"{a}.attention.key_length": cfg["head_dim"],
            f"{a}.attention.value_length": cfg["head_dim"], f"{a}.rope.freq_base": cfg["rope_parameters"]["rope_theta"],
            f"{a}.rope.dimension_count": 4, f"{a}.attention.layer_norm_rms_epsilon": cfg["rms_norm_eps"],
            f"{a}.expert_count": cfg["num_experts"], f"{a}.expert_used_count": cfg["num_experts_per_tok"],
            f"{a}.expert_feed_forward_length": cfg["moe_intermediate_size"],
            f"{a}.expert_shared_feed_forward_length": cfg["shared_expert_intermediate_size"],
            f"{a}.ssm.conv_kernel": cfg["linear_conv_kernel_dim"], f"{a}.ssm.state_size": dk,
            f"{a}.ssm.group_count": hk, f"{a}.ssm.time_step_rank": hv, f"{a}.ssm.inner_size": hv * dv,
            f"{a}.full_attention_interval": 4, f"{a}.vocab_size": cfg["vocab_size"]}
    write_gguf(out, meta, {n: (QType.F32, np.ascontiguousarray(w)) for n, w in tensors.items()})
    return out


def last_rows(model, inp) -> np.ndarray:
    ids = inp["input_ids"]
    return np.stack([model.logits(ids[:p + 1]) for p in inp["last_positions"]])


# ---------------------------------------------------------------- the model, both formats

@pytest.mark.parametrize("folder", HYBRIDS)
@pytest.mark.parametrize("mode", list(MODES))
def test_gguf_matches_transformers(tmp_path, folder, mode):
    gg = (lfm2_gguf if folder == "lfm2" else qwen3next_gguf)(tmp_path / f"{folder}.gguf")
    ref = reference(folder)
    with load(gg, mode, n_ctx=128) as m:
        assert m.config.arch == folder.replace("_", "")
        assert_matches(m, ref, mode)


def assert_matches(m, ref: dict, mode: str) -> None:
    """The model's last-3 logits of every input within the mode's budget of the reference's, and the
    second input's greedy tokens equal."""
    for inp in ref["inputs"]:
        err = float(np.abs(last_rows(m, inp) - np.array(inp["logits_last3"], np.float32)).max())
        assert err <= MODES[mode][2], f"GGUF {mode} length {inp['length']}: {err}"
    inp = ref["inputs"][1]
    assert list(m.generate(inp["input_ids"], max_tokens=16, temperature=0, ignore_eos=True)) == \
        inp["greedy_new_tokens"]


@pytest.mark.parametrize("folder", HYBRIDS)
def test_export_writes_what_llama_cpp_writes(folder, tmp_path):
    """`llambda export` / `quantize` of a hybrid model: the tensors and keys of the GGUF written here as
    llama.cpp's converter does, the same logits; q8_0 stays close; an HF export is refused."""
    from llambda.formats.gguf import GGUFFile
    from llambda.tools.export import export
    ours = export(TINY / folder, tmp_path / "ours.gguf", fmt="gguf")
    theirs = (lfm2_gguf if folder == "lfm2" else qwen3next_gguf)(tmp_path / "theirs.gguf")
    with GGUFFile(ours) as a, GGUFFile(theirs) as b:
        assert set(a.tensors) == set(b.tensors)
        for name, t in b.tensors.items():
            assert tuple(a.tensors[name].shape) == tuple(t.shape), name
        for key, v in b.metadata.items():
            if key != "general.name":
                assert a.metadata.get(key) == pytest.approx(v), key
    inp = reference(folder)["inputs"][1]
    with llambda.load(ours, backend="numpy", n_ctx=64) as m:
        got = last_rows(m, inp)
    np.testing.assert_allclose(got, np.array(inp["logits_last3"], np.float32), atol=1e-3, rtol=0)
    # quantized: close to the same weights quantized at load (which keeps a few tensors, the tied
    # embedding among them, in float); against the float model these sensitive models move by up to 2.5
    q8_export_is_close(folder, tmp_path, inp, [f"blk.{3 if folder == 'lfm2' else 0}.ffn_down"
                                               f"{'_exps' if folder != 'lfm2' else ''}.weight"], 0.05)


def q8_export_is_close(folder: str, tmp_path, inp: dict, q8_tensors: list, atol: float) -> None:
    """`llambda quantize`'s q8_0 GGUF of a tiny folder (those tensors Q8_0) within atol of the same weights
    quantized at load; an HF export of the folder refused (GGUF only)."""
    from llambda.formats.gguf import GGUFFile
    from llambda.tools.export import export
    q8 = export(TINY / folder, tmp_path / "q8.gguf", fmt="gguf", qtype="q8_0")
    with GGUFFile(q8) as f:
        assert all(f.tensors[name].qtype == QType.Q8_0 for name in q8_tensors)
    with llambda.load(q8, backend="numpy", n_ctx=128) as m, \
            llambda.load(TINY / folder, backend="numpy", n_ctx=128, quantize="q8_0") as at_load:
        np.testing.assert_allclose(last_rows(m, inp), last_rows(at_load, inp), atol=atol, rtol=0)
    with pytest.raises(llambda.LlambdaError, match="GGUF only"):
        export(TINY / folder, tmp_path / "hf", fmt="hf")


def test_lfm2_config_from_each_format(tmp_path):
    gg = lfm2_gguf(tmp_path / "lfm2.gguf")
    cfgs = []
    for path in (LFM2, gg):
        with llambda.load(path, backend="numpy", n_ctx=32) as m:
            c = m.config
            cfgs.append((c.layer_kinds, c.conv_kernel, c.ffn_dim, c.n_kv_heads, c.qk_norm, c.rope_neox, np.float32(c.norm_eps),
                         c.tie_embeddings, c.recurrent))
            # keys and values only for the attention layer; the conv layers' state per slot
            assert m.transformer.cache.n_layers == 1 and sorted(m.transformer.conv_state) == [0, 1, 3]
    assert cfgs[0] == cfgs[1] == (["shortconv", "shortconv", "attention", "shortconv"], 3, 128, 2, True, True,
                                  np.float32(1e-5), True, True)


def _edit(tmp_path, edit, folder="lfm2") -> Path:
    import shutil
    d = tmp_path / "m"
    shutil.copytree(TINY / folder, d)
    cfg = json.loads((d / "config.json").read_text())
    edit(cfg)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.mark.parametrize("edit, message", [
    (lambda c: c.update(layer_types=["conv", "mamba", "full_attention", "conv"]), "layer_types"),
    (lambda c: c.update(layer_types=["conv"]), "layer_types"),
    (lambda c: c.update(conv_L_cache=1), "kernel"),
    (lambda c: c.update(conv_L_cache=1000), "conv_L_cache"),
    (lambda c: c.update(conv_bias=True), "conv_bias"),
    (lambda c: c.update(full_attn_idxs="2", layer_types=None), "full_attn_idxs"),
])
def test_lfm2_bad_configs_are_model_format_errors(tmp_path, edit, message):
    with pytest.raises(ModelFormatError, match=message):
        llambda.load(_edit(tmp_path, edit), backend="numpy", n_ctx=32)


def test_lfm2_first_checkpoints_spelling(tmp_path):
    """The Hub's first LFM2 configs: full_attn_idxs, block_ff_dim, tie_embedding, rope_theta."""
    def old(c):
        for k in ("layer_types", "intermediate_size", "tie_word_embeddings", "rope_parameters"):
            c.pop(k)
        c.update(full_attn_idxs=[2], block_ff_dim=192, tie_embedding=True, rope_theta=1000000.0)
    inp = reference()["inputs"][1]
    with llambda.load(_edit(tmp_path, old), backend="numpy", n_ctx=64) as m:
        assert m.config.layer_kinds == ["shortconv", "shortconv", "attention", "shortconv"]
        assert m.config.ffn_dim == 128 and m.config.tie_embeddings
        err = float(np.abs(last_rows(m, inp) - np.array(inp["logits_last3"], np.float32)).max())
    assert err <= 1e-3


def test_lfm2_gguf_bad_head_counts(tmp_path):
    from llambda.formats.gguf import GGUFFile
    gg = lfm2_gguf(tmp_path / "a.gguf")
    with GGUFFile(gg) as f:
        meta = dict(f.metadata)
    from llambda.models import lfm2
    for bad in ([0, 0, 2, 1], [0, 0, 2], [0, -1, 2, 0]):
        with pytest.raises(ModelFormatError, match="head_count_kv"):
            lfm2.config_from_gguf(dict(meta, **{"lfm2.attention.head_count_kv": bad}))


# ---------------------------------------------------------------- the short-conv op

def conv_oracle(bcx, state, kernel, slots, pos):
    """float64, from the whole history of each slot: what the op's outputs and final state must be."""
    d, width = kernel.shape
    state = state.astype(np.float64).copy()
    out = np.zeros((len(slots), d))
    for t, (s, p) in enumerate(zip(slots, pos)):
        if p == 0:
            state[s] = 0
        b, c, x = (bcx[t, k * d:(k + 1) * d].astype(np.float64) for k in range(3))
        window = np.concatenate([state[s], (b * x)[None]])            # (width, d)
        out[t] = c * np.einsum("jc,cj->c", window, kernel.astype(np.float64))
        state[s] = window[1:]
    return out, state


@pytest.mark.parametrize("d, width, n_slots", [(37, 3, 3), (64, 4, 2), (1, 2, 1), (515, 3, 4)])
def test_short_conv_native_matches_oracle(isa, d, width, n_slots):
    need("native")
    from llambda.backends.native import NativeBackend
    from llambda.backends.numpy_ref import NumpyBackend
    rng = np.random.default_rng(d)
    kernel = rng.standard_normal((d, width)).astype(np.float32)
    state0 = rng.standard_normal((n_slots, width - 1, d)).astype(np.float32)
    taken0 = np.full(n_slots, 5, np.int32)
    slots, pos = interleaved_batch(rng, n_slots)
    bcx = rng.standard_normal((len(slots), 3 * d)).astype(np.float32)
    want, want_state = conv_oracle(bcx, state0, kernel, slots, pos)
    for backend in (NumpyBackend(), NativeBackend(activations="f32")):
        state, taken = state0.copy(), taken0.copy()
        out = np.full((len(slots), d), np.nan, np.float32)
        backend.short_conv(bcx, state, taken, kernel, slots, pos, out)
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5, err_msg=backend.name)
        np.testing.assert_allclose(state, want_state, rtol=1e-6, atol=1e-6, err_msg=backend.name)
        for s in range(n_slots):
            assert taken[s] == pos[slots == s].max() + 1


def test_short_conv_native_refuses_bad_arguments():
    need("native")
    from llambda import _native as C
    d, w, n = 8, 3, 2
    bcx, out = np.zeros((n, 3 * d), np.float32), np.zeros((n, d), np.float32)
    state, taken, kernel = np.zeros((1, w - 1, d), np.float32), np.zeros(1, np.int32), np.zeros((d, w), np.float32)
    slots, pos = np.zeros(n, np.int32), np.arange(n, dtype=np.int32)
    C.short_conv(bcx, state, taken, kernel, slots, pos, out, n, d, w, 1, 1)
    assert taken[0] == 2
    with pytest.raises(ValueError, match="does not continue"):
        C.short_conv(bcx, state, taken, kernel, slots, np.array([5, 6], np.int32), out, n, d, w, 1, 1)
    with pytest.raises(ValueError, match="slots"):
        C.short_conv(bcx, state, taken, kernel, np.array([0, 1], np.int32), pos, out, n, d, w, 1, 1)
    with pytest.raises(ValueError):
        C.short_conv(bcx, state[:, :1], taken, kernel, slots, pos, out, n, d, w, 1, 1)     # state too small
    with pytest.raises(ValueError, match="overlap"):
        C.short_conv(bcx, state, taken, kernel, slots, pos, bcx, n, d, w, 1, 1)           # out over its own input
    with pytest.raises(ValueError, match="state_pos and pos must not overlap"):   # counts written over positions
        C.short_conv(bcx, state, pos[:1], kernel, slots, pos, out, n, d, w, 1, 1)
    over = np.zeros((n, d), np.float32)
    with pytest.raises(ValueError, match="out and slots must not overlap"):     # the state's index under out
        C.short_conv(bcx, state, taken, kernel, over.reshape(-1)[:n].view(np.int32), pos, over, n, d, w, 1, 1)
    with pytest.raises(ValueError):
        C.short_conv(bcx, state, taken, kernel, slots, pos, out, n, d, 1, 1, 1)             # width < 2


def delta_oracle(qkv, ba, z, state, a_neg, dt_bias, norm_w, eps, slots, pos, hk):
    """float64, token by token: Qwen3-Next's gated delta rule and gated norm (transformers' recurrent form)."""
    n_slots, hv, dk, dv = state.shape
    S, r, kd = state.astype(np.float64).copy(), hv // hk, hk * dk
    out = np.zeros((len(slots), hv * dv))
    for t, (s, p) in enumerate(zip(slots, pos)):
        if p == 0:
            S[s] = 0
        row = qkv[t].astype(np.float64)
        for h in range(hv):
            g = h // r
            q, k, v = row[g * dk:(g + 1) * dk], row[kd + g * dk:kd + (g + 1) * dk], row[2 * kd + h * dv:2 * kd + (h + 1) * dv]
            q = q / np.sqrt((q * q).sum() + 1e-6) / np.sqrt(dk)
            k = k / np.sqrt((k * k).sum() + 1e-6)
            beta = 1 / (1 + np.exp(-float(ba[t, h])))
            decay = np.exp(float(a_neg[h]) * np.log1p(np.exp(float(ba[t, hv + h]) + float(dt_bias[h]))))
            S[s, h] *= decay
            delta = beta * (v - S[s, h].T @ k)
            S[s, h] += np.outer(k, delta)
            o = S[s, h].T @ q
            zz = z[t, h * dv:(h + 1) * dv].astype(np.float64)
            out[t, h * dv:(h + 1) * dv] = o / np.sqrt((o * o).mean() + eps) * norm_w * zz / (1 + np.exp(-zz))
    return out, S


def interleaved_batch(rng, n_slots, start=5):
    """Slots and positions: the last slot restarts at 0 (a prefill of 7), the others continue at
    `start` with 1, 2, ... tokens; slots interleaved, each slot's tokens in order."""
    slots, pos = [], []
    for s in range(n_slots):
        k, p0 = (7, 0) if s == n_slots - 1 else (1 + s, start)
        slots += [s] * k
        pos += range(p0, p0 + k)
    order = sorted(range(len(pos)), key=lambda i: (pos[i] - (0 if slots[i] == n_slots - 1 else start), rng.random()))
    return np.array(slots, np.int32)[order], np.array(pos, np.int32)[order]


@pytest.mark.parametrize("hk, hv, dk, dv, n_slots", [(2, 4, 16, 16, 3), (1, 3, 5, 7, 2), (3, 3, 8, 33, 1)])
def test_gated_delta_native_matches_oracle(isa, hk, hv, dk, dv, n_slots):
    need("native")
    from llambda.backends.native import NativeBackend
    from llambda.backends.numpy_ref import NumpyBackend
    rng = np.random.default_rng(hv * 100 + dv)
    slots, pos = interleaved_batch(rng, n_slots)
    n = len(slots)
    qkv = rng.standard_normal((n, 2 * hk * dk + hv * dv)).astype(np.float32)
    ba = rng.standard_normal((n, 2 * hv)).astype(np.float32)
    z = rng.standard_normal((n, hv * dv)).astype(np.float32)
    state0 = (0.3 * rng.standard_normal((n_slots, hv, dk, dv))).astype(np.float32)
    a_neg = (-rng.uniform(0.1, 1.5, hv)).astype(np.float32)
    dt_bias = rng.standard_normal(hv).astype(np.float32)
    norm_w = (1 + 0.1 * rng.standard_normal(dv)).astype(np.float32)
    want, want_state = delta_oracle(qkv, ba, z, state0, a_neg, dt_bias, norm_w, 1e-6, slots, pos, hk)
    for backend in (NumpyBackend(), NativeBackend(activations="f32")):
        state, taken = state0.copy(), np.full(n_slots, 5, np.int32)
        out = np.full((n, hv * dv), np.nan, np.float32)
        backend.gated_delta(qkv, ba, z, state, taken, a_neg, dt_bias, norm_w, 1e-6, slots, pos, out, hk)
        np.testing.assert_allclose(out, want, rtol=2e-4, atol=2e-5, err_msg=backend.name)
        np.testing.assert_allclose(state, want_state, rtol=1e-4, atol=1e-5, err_msg=backend.name)
        assert [taken[s] for s in range(n_slots)] == [pos[slots == s].max() + 1 for s in range(n_slots)]


@pytest.mark.parametrize("c, width", [(131, 4), (7, 2)])
def test_conv_silu_native_matches_oracle(isa, c, width):
    need("native")
    from llambda.backends.native import NativeBackend
    from llambda.backends.numpy_ref import NumpyBackend
    rng = np.random.default_rng(c)
    slots, pos = interleaved_batch(rng, 3)
    x = rng.standard_normal((len(slots), c)).astype(np.float32)
    kernel = rng.standard_normal((c, width)).astype(np.float32)
    state0 = rng.standard_normal((3, width - 1, c)).astype(np.float32)
    # the plain convolution is the gated one with B = 1 and C = 1
    ones = np.ones_like(x)
    y, want_state = conv_oracle(np.concatenate([ones, ones, x], axis=1), state0, kernel, slots, pos)
    want = y / (1 + np.exp(-y))
    for backend in (NumpyBackend(), NativeBackend(activations="f32")):
        state, taken = state0.copy(), np.full(3, 5, np.int32)
        out = np.full_like(x, np.nan)
        backend.conv_silu(x, state, taken, kernel, slots, pos, out)
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5, err_msg=backend.name)
        np.testing.assert_allclose(state, want_state, rtol=1e-6, atol=1e-6, err_msg=backend.name)


@pytest.mark.parametrize("count", [1, 37, 5000])
def test_sigmoid_mul_native(isa, count):
    need("native")
    from llambda import _native as C
    rng = np.random.default_rng(count)
    x, g = rng.standard_normal(count).astype(np.float32), (4 * rng.standard_normal(count)).astype(np.float32)
    out = np.empty_like(x)
    C.sigmoid_mul(x, g, out, count)
    np.testing.assert_allclose(out, x / (1 + np.exp(-g.astype(np.float64))), rtol=1e-6, atol=1e-7)


def test_gated_delta_native_refuses_bad_arguments():
    need("native")
    from llambda import _native as C
    hk, hv, dk, dv, n = 1, 2, 4, 4, 2
    f = lambda *shape: np.zeros(shape, np.float32)     # noqa: E731
    qkv, ba, z, out = f(n, 2 * dk + hv * dv), f(n, 2 * hv), f(n, hv * dv), f(n, hv * dv)
    state, taken, slots, pos = f(1, hv, dk, dv), np.zeros(1, np.int32), np.zeros(n, np.int32), np.arange(n, dtype=np.int32)
    args = lambda **kw: [kw.get(k, v) for k, v in (("qkv", qkv), ("ba", ba), ("z", z), ("state", state),  # noqa: E731
                         ("taken", taken), ("a", f(hv)), ("dt", f(hv)), ("w", f(dv)), ("slots", slots), ("pos", pos),
                         ("out", out))] + [n, hk, hv, dk, dv, 1, 1e-6]
    C.gated_delta(*args())
    assert taken[0] == 2
    with pytest.raises(ValueError, match="does not continue"):
        C.gated_delta(*args(pos=np.array([4, 5], np.int32)))
    with pytest.raises(ValueError, match="overlaps"):
        C.gated_delta(*args(out=z))
    with pytest.raises(ValueError, match="state_pos overlaps slots"):    # counts written over the state's index
        C.gated_delta(*args(taken=slots[:1]))
    with pytest.raises(ValueError):
        C.gated_delta(*args(state=f(1, hv, dk, dv - 1)))
    bad = args()
    bad[12] = 3                                          # hv not a multiple of hk... (hk 3 > hv 2)
    with pytest.raises(ValueError):
        C.gated_delta(*bad)


@pytest.mark.parametrize("edit, message", [
    (lambda c: c.update(layer_types=["linear_attention", "mamba", "full_attention", "full_attention"]), "layer_types"),
    (lambda c: c.update(linear_num_value_heads=3), "multiple"),
    (lambda c: c.update(linear_key_head_dim=4096), "linear_key_head_dim"),
    (lambda c: c.update(rope_parameters={"rope_theta": 1e7, "partial_rotary_factor": 0}), "partial_rotary_factor"),
])
def test_qwen3next_bad_configs_are_model_format_errors(tmp_path, edit, message):
    with pytest.raises(ModelFormatError, match=message):
        llambda.load(_edit(tmp_path, edit, "qwen3_next"), backend="numpy", n_ctx=32)


def test_qwen3next_config_from_each_format(tmp_path):
    for path in (TINY / "qwen3_next", qwen3next_gguf(tmp_path / "q.gguf")):
        with llambda.load(path, backend="numpy", n_ctx=32) as m:
            c, t = m.config, m.transformer
            assert c.layer_kinds == ["deltanet"] * 3 + ["attention"] and c.rope_dim == 4 and c.attn_out_gate
            assert (c.ssm_k_heads, c.ssm_v_heads, c.ssm_k_dim, c.ssm_v_dim, c.conv_kernel) == (2, 4, 16, 16, 4)
            assert (c.n_experts, c.n_experts_used, c.expert_ffn_dim, c.shared_ffn_dim, c.moe_norm_topk) == \
                (4, 2, 32, 32, True)
            assert c.norm_offset == (1.0 if path.is_dir() else 0.0)      # GGUF norms hold 1 + w already
            assert t.cache.n_layers == 1 and sorted(t.delta_state) == [0, 1, 2]
            assert t.delta_state[0].shape == (1, 4, 16, 16) and t.conv_state[0].shape == (1, 3, 128)


# ---------------------------------------------------------------- the recurrent state

@pytest.mark.parametrize("folder", STATEFUL)
@pytest.mark.parametrize("mode", list(MODES))
def test_generate_equals_prefill_then_decode_steps(folder, mode):
    """generate() against the model driven by hand: prefill the prompt, then one forward per token."""
    from llambda import engine
    inp = reference(folder)["inputs"][1]
    with load(TINY / folder, mode, n_ctx=128) as m:
        got = list(m.generate(inp["input_ids"], max_tokens=12, temperature=0, ignore_eos=True))
        t = m.transformer
        ids = list(inp["input_ids"])
        logits = engine.prefill(t, 0, ids, 0)
        by_hand = []
        for _ in range(12):
            tok = int(np.argmax(logits))
            by_hand.append(tok)
            assert t.state_position(0) == len(ids)
            logits = engine.decode(t, np.array([0], np.int32), np.array([tok], np.int32),
                                   np.array([len(ids)], np.int32))[0].copy()
            ids.append(tok)
    assert got == by_hand
    if mode != "native-fast":
        assert got == inp["greedy_new_tokens"][:12]


@pytest.mark.parametrize("folder", STATEFUL)
def test_state_cannot_be_rewound_or_skipped(folder):
    with llambda.load(TINY / folder, backend="numpy", n_ctx=64) as m:
        t = m.transformer
        t.forward([1, 2, 3, 4], [0] * 4, [0, 1, 2, 3], [3])
        assert t.state_position(0) == 4 and t.resume_point(0, 4) == 4 and t.resume_point(0, 3) == 0
        for bad in ([2], [5]):
            with pytest.raises(InvalidInputError, match="recurrent state"):
                t.forward([7], [0], bad, [0])
        with pytest.raises(InvalidInputError, match="recurrent state"):
            t.forward([7, 8], [0, 0], [4, 6], [1])
        assert t.state_position(0) == 4          # a refused batch moved nothing
        t.forward([9], [0], [0], [0])             # position 0: a new sequence
        assert t.state_position(0) == 1
        # a pass stopped part-way (here: the last recurrent layer's count moved alone) leaves the state unknown
        t._state_rows[-1, 0] += 1
        assert t.state_position(0) == -1 and t.resume_point(0, 5) == 0
        with pytest.raises(InvalidInputError, match="recurrent state"):
            t.forward([7], [0], [1], [0])
        t.forward([7], [0], [0], [0])
        assert t.state_position(0) == 1
        t.cache.commit()                          # a server's start: every slot's state back at 0 tokens
        assert t.state_position(0) == 0 and not any(a.any() for a in t.cache.state)


@pytest.mark.parametrize("folder", STATEFUL)
@pytest.mark.parametrize("mode", ["numpy", "native-fast"])
def test_reused_prefix_resumes_only_where_the_state_is(folder, mode):
    """The library reuses slot 0's prefix; a hybrid model only where its state stands, else from 0:
    every answer equals the same prompt's answer in a fresh model."""
    ids = reference(folder)["inputs"][2]["input_ids"]
    prompts = [ids[:30], ids[:50], ids[:20], ids[:20] + [5, 6], ids[:50]]
    outs = []
    with load(TINY / folder, mode, n_ctx=128) as m:
        for p in prompts:
            outs.append(list(m.generate(p, max_tokens=6, temperature=0, ignore_eos=True)))
    for p, got in zip(prompts, outs):
        with load(TINY / folder, mode, n_ctx=128) as fresh:
            assert got == list(fresh.generate(p, max_tokens=6, temperature=0, ignore_eos=True))


@pytest.mark.parametrize("folder", STATEFUL)
def test_batch_invariance_with_other_sequences(folder):
    """Native, batch-invariant (the server's mode): a sequence's decode logits are the same bits
    whether it runs alone or beside other slots' prefill and decode tokens."""
    need("native")
    from llambda.backends.native import NativeBackend
    from llambda.formats.hf_dir import open_hf_dir
    from llambda.models.base import Transformer
    src = open_hf_dir(TINY / folder)
    backend = NativeBackend(activations="q8")
    backend.set_batch_invariant(True)
    try:
        t = Transformer(src.config, src.tensor, backend, n_ctx=128, n_slots=3, max_tokens=64)
        ids = reference(folder)["inputs"][1]["input_ids"]
        t.forward(np.array(ids[:20], np.int32), np.zeros(20, np.int32), np.arange(20, dtype=np.int32), [])
        alone = t.forward(np.array([ids[20]], np.int32), np.zeros(1, np.int32), np.array([20], np.int32),
                          [0])[0].copy()
        t.forward(np.array(ids[:20], np.int32), np.zeros(20, np.int32), np.arange(20, dtype=np.int32), [])
        t.forward(np.array(ids[5:15], np.int32), np.full(10, 1, np.int32), np.arange(10, dtype=np.int32), [])
        toks = np.array([ids[20], ids[15]] + ids[30:37], np.int32)
        slots = np.array([0, 1] + [2] * 7, np.int32)
        pos = np.array([20, 10] + list(range(7)), np.int32)
        mixed = t.forward(toks, slots, pos, [0, 1, 8])
        assert np.array_equal(mixed[0], alone)
    finally:
        backend.close()
        src.close()


# ---------------------------------------------------------------- refusals

def test_speculative_decoding_is_refused():
    with llambda.load(LFM2, backend="numpy", n_ctx=64) as m:
        for mode in ("lookup", "draft"):
            with pytest.raises(InvalidInputError, match="speculative decoding is not supported"):
                m.stream([1, 2, 3], max_tokens=4, speculative=mode)
        assert list(m.generate([1, 2, 3], max_tokens=2, temperature=0, speculative="off"))  # plain decoding runs
        with llambda.load(LFM2, backend="numpy", n_ctx=64) as d:
            with pytest.raises(InvalidInputError, match="speculative"):
                m.set_draft(d)


@pytest.mark.parametrize("folder", STATEFUL)
def test_server_scheduler_runs_hybrid_sequences_without_prefix_reuse(folder):
    """Concurrent requests sharing a prefix: each answer equals the library's, nothing was reused."""
    need("native")
    from llambda.engine import GenerationParams, Sequence
    from llambda.sampling import SamplingParams
    from llambda.server.metrics import Metrics
    from llambda.server.scheduler import Channel, Job, Scheduler
    ids = reference(folder)["inputs"][2]["input_ids"]
    prompts = [ids[:40], ids[:40] + [7, 8], ids[:25], ids[:40]]
    with load(TINY / folder, "native-fast", n_ctx=128) as m:
        want = [list(m.generate(p, max_tokens=8, temperature=0, ignore_eos=True)) for p in prompts]
    with load(TINY / folder, "native-fast", n_ctx=128, n_slots=3) as m:
        sched = Scheduler(m.transformer, Metrics(), prefill_chunk=16)
        sched.start()
        try:
            async def main():
                ch = Channel()
                sp = SamplingParams(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0)
                jobs = [Job(Sequence(None, p, GenerationParams(max_tokens=8, sampling=sp, ignore_eos=True), slot=-1,
                                     n_ctx=128), ch, i) for i, p in enumerate(prompts)]
                sched.submit(jobs)
                got, done = {}, set()
                while len(done) < len(jobs):
                    for idx, ev in await asyncio.wait_for(ch.get(), 60):
                        if ev.token >= 0:
                            got.setdefault(idx, []).append(ev.token)
                        if ev.finish_reason:
                            done.add(idx)
                return jobs, got
            jobs, got = asyncio.run(main())
        finally:
            sched.stop()
    assert [got.get(i, []) for i in range(len(prompts))] == want
    assert all(j.n_cached == 0 for j in jobs)



def test_http_server_refuses_speculation_and_serves_plain_decoding():
    """A hybrid model served over HTTP: speculative requests are a 400, a server default of speculation
    refuses to start (a typed error), plain requests are served."""
    from serverkit import LiveServer, assert_error, post
    from llambda.server import ServerConfig
    from llambda.server.app import create_app
    with llambda.load(LFM2, n_ctx=64, n_slots=2) as model:
        with pytest.raises(InvalidInputError, match="speculative"):
            create_app(model, ServerConfig(model_id="tiny", parallel=1, speculative="lookup"))
        with LiveServer(create_app(model, ServerConfig(model_id="tiny", parallel=1))) as srv:
            for mode in ("lookup", "draft"):
                r = post(srv, "/v1/completions", dict(model="tiny", prompt=[1, 2, 3], max_tokens=2, speculative=mode))
                assert_error(r, 400, "speculative")
            for _ in range(2):      # the second from the same slot: no prefix reused, the state restarted
                r = post(srv, "/v1/completions", dict(model="tiny", prompt=[1, 2, 3], max_tokens=4, temperature=0,
                                                      ignore_eos=True))
                assert r.status_code == 200, r.text
                assert r.json()["usage"]["completion_tokens"] == 4
                assert r.json()["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0) == 0
