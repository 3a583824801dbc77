"""Mixture-of-experts layers: the C routing and expert kernels against the NumPy oracle on random
data (every ISA, odd shapes, experts no token chose), batch invariance, the tiny MoE references on
every ISA, GGUF round trips, and bad input.

The tiny transformers references themselves (numpy, native exact and fast) run in
test_tiny_models.py with the other folders.
"""
import json
from pathlib import Path

import numpy as np
import pytest

import llambda
from llambda.backends.numpy_ref import NumpyBackend, route
from llambda.errors import LlambdaError, ModelFormatError
from llambda.formats.quants import QType, quantize
from llambda.formats.weights import WeightTensor

native = pytest.importorskip("llambda._native", reason="C core not built (python setup.py build_ext --inplace)")
from llambda.backends.native import NativeBackend  # noqa: E402

TINY = Path(__file__).parent / "fixtures" / "reference" / "tiny"
MOE_FOLDERS = ["qwen3_moe", "mixtral", "qwen2_moe", "gpt_oss", "glm4_moe"]
ROUTINGS = {"softmax_topk": 0, "topk_softmax": 1, "sigmoid_topk": 2}


@pytest.fixture
def batch_invariant():
    before = native.batch_invariant()
    native.set_batch_invariant(True)
    yield
    native.set_batch_invariant(before)


def reference(folder):
    with open(TINY / folder / "reference.json", encoding="utf-8") as f:
        return json.load(f)


# ---------------------------------------------------------------- routing


@pytest.mark.parametrize("routing", list(ROUTINGS))
@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("n, E, k", [(1, 1, 1), (3, 4, 2), (17, 8, 2), (5, 60, 4), (9, 128, 8), (2, 7, 7)])
def test_route_matches_numpy(routing, norm, n, E, k):
    logits = np.random.default_rng(n * E + k).normal(0, 2, (n, E)).astype(np.float32)
    ids, w = np.empty((n, k), np.int32), np.empty((n, k), np.float32)
    native.moe_route(logits, n, E, k, ROUTINGS[routing], int(norm), ids, w)
    want_ids, want_w = route(logits, k, routing, norm)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_allclose(w, want_w, rtol=2e-6, atol=1e-7)
    if routing == "topk_softmax" or norm:
        np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("routing", ["softmax_topk", "sigmoid_topk"])
@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("n, E, k, groups, biased", [(5, 8, 2, (4, 2, 1), False), (9, 64, 6, (8, 3, 2), True),
                                                     (3, 16, 4, (1, 1, 1), True), (7, 12, 3, (3, 1, 2), False),
                                                     (4, 256, 8, (8, 4, 2), True)])
def test_grouped_biased_scaled_route_matches_numpy(routing, norm, n, E, k, groups, biased):
    """DeepSeek's routings: scores (softmax or sigmoid), the choice (+ bias) within the best groups (ranked by
    the sum of their `top` best choices), the weights from the scores, renormalised or not, scaled."""
    r = np.random.default_rng(n * E + k)
    logits = r.normal(0, 2, (n, E)).astype(np.float32)
    bias = r.normal(0, 0.3, E).astype(np.float32) if biased else None
    ids, w = np.empty((n, k), np.int32), np.empty((n, k), np.float32)
    native.moe_route(logits, n, E, k, ROUTINGS[routing], int(norm), ids, w, *groups, 2.5, bias)
    want_ids, want_w = route(logits, k, routing, norm, groups, 2.5, bias)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_allclose(w, want_w, rtol=2e-6, atol=1e-7)
    G, used, _ = groups
    if G > 1:       # every choice from `used` groups
        assert all(len(set(row // (E // G))) <= used for row in ids)
    if norm:
        np.testing.assert_allclose(w.sum(-1), 2.5, rtol=1e-5)


def test_route_refuses_bad_groups():
    logits, ids, w = np.zeros((1, 8), np.float32), np.empty((1, 4), np.int32), np.empty((1, 4), np.float32)
    for groups, bias, routing in (((3, 1, 1), None, 0), ((4, 1, 1), None, 0), ((4, 2, 3), None, 0), ((4, 5, 1), None, 0),
                                  ((2, 2, 1), None, 1), ((1, 1, 1), np.zeros(8, np.float32), 1),
                                  ((1, 1, 1), np.zeros(7, np.float32), 2)):
        with pytest.raises(ValueError):
            native.moe_route(logits, 1, 8, 4, routing, 1, ids, w, *groups, 1.0, bias)


def test_route_is_linear_in_k_times_experts_and_caps_k():
    """The C core trusts nothing: a hostile k is refused, a large legal one does not hang."""
    E = 1 << 16
    logits = np.random.default_rng(0).normal(0, 1, (1, E)).astype(np.float32)
    ids, w = np.empty((1, 1024), np.int32), np.empty((1, 1024), np.float32)
    native.moe_route(logits, 1, E, 1024, 0, 1, ids, w)          # 67M comparisons: well under a second
    np.testing.assert_array_equal(ids[0], np.argsort(-logits[0], kind="stable")[:1024])
    with pytest.raises(ValueError):
        native.moe_route(logits, 1, E, 1025, 0, 1, np.empty((1, 1025), np.int32), np.empty((1, 1025), np.float32))


def test_route_ties_go_to_the_lower_expert_and_nan_never_breaks_it():
    logits = np.array([[1, 3, 3, 0, 3], [np.nan, 2, np.nan, 1, 0]], np.float32)
    ids, w = np.empty((2, 3), np.int32), np.empty((2, 3), np.float32)
    native.moe_route(logits, 2, 5, 3, 1, 1, ids, w)
    assert ids[0].tolist() == [1, 2, 4] == route(logits[:1], 3, "topk_softmax", True)[0][0].tolist()
    assert ids[1].tolist() == [1, 3, 4]       # finite logits win over NaN; every id distinct and in range


# ---------------------------------------------------------------- the expert kernel


def random_experts(rng, E, ff, d, qtype):
    """(WeightTensor gate, up, down) of E experts in qtype, and their dequantized float32 values."""
    out = []
    for name, rows, cols in (("gate", ff, d), ("up", ff, d), ("down", d, ff)):
        vals = rng.normal(0, cols ** -0.5, (E, rows, cols)).astype(np.float32)
        t = WeightTensor(name, qtype, (E, rows, cols), quantize(vals, qtype).reshape(-1))
        out.append(t)
    return out


class Scratch:
    def __init__(self, n, d, k, ff, E):
        self.moe_f = np.zeros(n * k * (2 * d + 2 * ff + 1), np.float32)
        self.moe_i = np.zeros(3 * n * k + E + 1, np.int32)


def run_moe(backend, experts, x, logits, k, routing="softmax_topk", norm=True, shared=None, shared_logit=None,
            biases=None, act=("silu",)):
    n, d = x.shape
    out = np.full((n, d), np.nan, np.float32)
    E, ff = logits.shape[1], experts[0].shape[1]
    handle = backend.prepare_experts(*experts, biases=biases)
    backend.moe(x, logits, handle, k, routing, norm, out, shared=shared, shared_logit=shared_logit,
                scratch=Scratch(n, d, k, ff, E), act=act)
    return out


# (qtype, d, ff): float types with odd sizes (row groups cut short), block types at their block sizes
SHAPES = [(QType.F32, 50, 37), (QType.F16, 33, 20), (QType.Q8_0, 96, 64), (QType.Q4_0, 64, 96),
          (QType.Q4_K, 256, 256), (QType.Q6_K, 256, 512)]


@pytest.mark.parametrize("qtype, d, ff", SHAPES, ids=[s[0].name for s in SHAPES])
@pytest.mark.parametrize("exact", [True, False])
def test_moe_matches_numpy(isa, qtype, d, ff, exact):
    rng = np.random.default_rng(int(qtype) * 7 + d)
    E, k = 16, 3
    experts = random_experts(rng, E, ff, d, qtype)
    ref = NumpyBackend()
    nat = NativeBackend(activations="f32" if exact else "q8")
    try:
        for n in (1, 2, 7, 70):       # 1 and 2 tokens leave most experts empty
            x = rng.normal(0, 1, (n, d)).astype(np.float32)
            logits = rng.normal(0, 2, (n, E)).astype(np.float32)
            for routing, norm in (("softmax_topk", True), ("softmax_topk", False), ("topk_softmax", True)):
                want = run_moe(ref, experts, x, logits, k, routing, norm)
                got = run_moe(nat, experts, x, logits, k, routing, norm)
                scale = float(np.abs(want).max())
                err = float(np.abs(got - want).max())
                budget = (1e-5 if exact else 2e-2) * scale
                assert err <= budget, f"{qtype.name} isa={isa} n={n} {routing} norm={norm}: {err:.3g} > {budget:.3g}"
    finally:
        nat.close()


@pytest.mark.parametrize("n, k", [(1, 1), (1, 4), (37, 3)])
def test_moe_is_the_same_on_any_thread_count(isa, n, k):
    """Whole experts per pool thread (as many experts as threads), or each matmul split over the
    pool (fewer): the same bits either way, and on one thread."""
    rng = np.random.default_rng(n + k)
    d, ff, E = 256, 256, 8
    experts = random_experts(rng, E, ff, d, QType.Q4_K)
    x = rng.normal(0, 1, (n, d)).astype(np.float32)
    logits = rng.normal(0, 1, (n, E)).astype(np.float32)
    nat = NativeBackend(activations="q8")
    before = native.threads()
    try:
        outs = []
        for t in (1, 2, 3):
            native.set_threads(t)
            outs.append(run_moe(nat, experts, x, logits, k))
        assert all(np.array_equal(outs[0], o) for o in outs[1:])
    finally:
        native.set_threads(before)
        nat.close()


@pytest.mark.parametrize("qtype, d, ff", [(QType.F32, 40, 24), (QType.Q8_0, 64, 96)])
@pytest.mark.parametrize("exact", [True, False])
def test_moe_gpt_oss_activation_and_biases(isa, qtype, d, ff, exact):
    """GPT-OSS's experts: biases on every projection, the clamped SwiGLU with (up + 1); top-k then softmax."""
    rng = np.random.default_rng(3)
    n, E, k = 23, 8, 2
    experts = [WeightTensor(t.name, t.qtype, t.shape, t.data) for t in random_experts(rng, E, ff, d, qtype)]
    # large values, so that the clamp at the limit matters
    x = rng.normal(0, 4, (n, d)).astype(np.float32)
    logits = rng.normal(0, 2, (n, E)).astype(np.float32)
    biases = [WeightTensor.from_float(name, rng.normal(0, 0.5, (E, rows)).astype(np.float32))
              for name, rows in (("gb", ff), ("ub", ff), ("db", d))]
    act = ("swiglu_oai", 1.702, 2.0)
    nat = NativeBackend(activations="f32" if exact else "q8")
    try:
        want = run_moe(NumpyBackend(), experts, x, logits, k, "topk_softmax", True, biases=biases, act=act)
        got = run_moe(nat, experts, x, logits, k, "topk_softmax", True, biases=biases, act=act)
        plain = run_moe(NumpyBackend(), experts, x, logits, k, "topk_softmax", True, biases=biases,
                        act=("swiglu_oai", 1.702, 1e9))
        scale = float(np.abs(want).max())
        assert float(np.abs(got - want).max()) <= (1e-5 if exact else 2e-2) * scale
        assert float(np.abs(plain - want).max()) > 0.1 * scale       # the clamp changed the result
    finally:
        nat.close()


@pytest.mark.parametrize("cache_type", ["f32", "f16"])
@pytest.mark.parametrize("window", [0, 5])
def test_attention_sinks_match_numpy(isa, cache_type, window):
    from llambda.backends.base import KVCache
    rng = np.random.default_rng(7)
    n_heads, n_kv, hd, n_ctx = 6, 2, 24, 32
    nat = NativeBackend(activations="f32", kv_type=cache_type)
    try:
        dt = nat.kv_dtype
        k = [rng.normal(0, 1, (2, n_ctx, n_kv, hd)).astype(dt)]
        v = [rng.normal(0, 1, (2, n_ctx, n_kv, hd)).astype(dt)]

        def cache_for(be):      # the same values in the backend's own layout (its axis of positions)
            lay = [np.ascontiguousarray(np.moveaxis(a[0], 1, be.kv_pos_axis)) for a in (k, v)]
            return KVCache(1, 2, n_ctx, n_kv, hd, dt, lay[:1], lay[1:], {}, be.kv_pos_axis)

        slots = np.array([0, 0, 1, 1, 1], np.int32)
        pos = np.array([0, 9, 3, 17, 31], np.int32)
        q = rng.normal(0, 1, (5, n_heads, hd)).astype(np.float32)
        sinks = rng.normal(0.5, 1, n_heads).astype(np.float32)
        outs = {}
        for name, be in (("numpy", NumpyBackend()), ("native", nat)):
            cache = cache_for(be)
            o = np.zeros_like(q)
            be.attention(q, cache, 0, slots, pos, o, 0.3, window, 0.0)
            plain = o.copy()
            be.attention_sinks(q, cache, 0, slots, pos, o, 0.3, window, 0.0, sinks)
            outs[name] = o
            assert np.all(np.abs(o) <= np.abs(plain) + 1e-6)     # a sink only takes weight away
        np.testing.assert_allclose(outs["native"], outs["numpy"], rtol=2e-5, atol=2e-6)
        with pytest.raises(ValueError, match="overlaps"):
            native.attention_sinks(q, k[0], v[0], q, slots, pos, 5, n_heads, n_kv, hd, 2, n_ctx, nat.kv_code, 0.3,
                                   window, 0.0, sinks)
    finally:
        nat.close()


def test_attention_sinks_read_a_q8_0_cache(isa):
    """With a q8_0 cache (keys possibly stored against their slot's position 0) the sink's log Z
    is recomputed from the decoded keys: the rescale matches one computed from the float keys
    within the cache's rounding."""
    rng = np.random.default_rng(11)
    n_heads, n_kv, hd, n_ctx = 4, 2, 32, 24
    k = rng.normal(0, 1, (2, n_ctx, n_kv, hd)).astype(np.float32)
    k[..., 3] += 40.0                      # a huge channel: blocks stored against the base
    v = rng.normal(0, 1, (2, n_ctx, n_kv, hd)).astype(np.float32)
    slots = np.array([0, 0, 1, 1], np.int32)
    pos = np.array([5, 23, 0, 17], np.int32)
    q = rng.normal(0, 0.2, (4, n_heads, hd)).astype(np.float32)
    sinks = rng.normal(0.5, 1, n_heads).astype(np.float32)
    keep = {}
    for name, be in (("numpy", NumpyBackend()), ("native", NativeBackend(activations="f32", kv_type="q8_0"))):
        cache = be.create_kv_cache(1, 2, n_ctx, n_kv, hd)
        for s in (0, 1):                   # position 0 first: it is the slot's key base
            be.kv_store(cache, 0, k[s], v[s], np.full(n_ctx, s, np.int32), np.arange(n_ctx, dtype=np.int32))
        o = np.zeros_like(q)
        be.attention(q, cache, 0, slots, pos, o, 0.3, 0, 0.0)
        plain = o.copy()
        be.attention_sinks(q, cache, 0, slots, pos, o, 0.3, 0, 0.0, sinks)
        keep[name] = np.linalg.norm(o, axis=-1) / np.linalg.norm(plain, axis=-1)
        if name == "native":
            be.close()
    np.testing.assert_allclose(keep["native"], keep["numpy"], rtol=2e-2)


def test_moe_shared_expert_and_its_gate(isa):
    rng = np.random.default_rng(5)
    n, d, ff, E, k = 9, 64, 32, 6, 2
    experts = random_experts(rng, E, ff, d, QType.F32)
    x = rng.normal(0, 1, (n, d)).astype(np.float32)
    logits = rng.normal(0, 1, (n, E)).astype(np.float32)
    shared = rng.normal(0, 1, (n, d)).astype(np.float32)
    gate = rng.normal(0, 2, (n, 1)).astype(np.float32)
    nat = NativeBackend(activations="f32")
    try:
        for sl in (gate, None):
            want = run_moe(NumpyBackend(), experts, x, logits, k, shared=shared, shared_logit=sl)
            got = run_moe(nat, experts, x, logits, k, shared=shared, shared_logit=sl)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        alone = run_moe(nat, experts, x, logits, k)
        assert not np.allclose(alone, got, atol=1e-3)       # the shared expert did contribute
    finally:
        nat.close()


@pytest.mark.parametrize("qtype", [QType.Q8_0, QType.Q4_K])
def test_a_token_alone_equals_the_token_in_a_batch(isa, batch_invariant, qtype):
    """Batch invariance: a token's output is bit-identical whichever tokens share its experts."""
    rng = np.random.default_rng(11)
    n, d, ff, E, k = 40, 256, 256, 8, 2
    experts = random_experts(rng, E, ff, d, qtype)
    x = rng.normal(0, 1, (n, d)).astype(np.float32)
    logits = rng.normal(0, 1, (n, E)).astype(np.float32)
    nat = NativeBackend(activations="q8")
    try:
        batch = run_moe(nat, experts, x, logits, k)
        for t in (0, 13, n - 1):
            alone = run_moe(nat, experts, x[t:t + 1], logits[t:t + 1], k)
            assert np.array_equal(alone[0], batch[t]), f"token {t} isa={isa}"
        half = run_moe(nat, experts, x[5:25], logits[5:25], k)
        assert np.array_equal(half, batch[5:25])
    finally:
        nat.close()


def test_decode_sized_batches_of_mixed_types_and_biases(isa, batch_invariant):
    """A few rows per expert run as units shared out over the pool (csrc/moe: units_path), with gate and up
    of different types (each quantizes the activations on its own) and biases on every projection: the
    NumPy oracle's values, and a token alone, in a few tokens or in a batch of whole experts per thread
    gives the same bits, on any thread count."""
    rng = np.random.default_rng(5)
    d, ff, E, k = 256, 512, 8, 3
    gate, _, _ = random_experts(rng, E, ff, d, QType.Q4_K)
    _, up, down = random_experts(rng, E, ff, d, QType.Q6_K)
    down = random_experts(rng, E, ff, d, QType.Q8_0)[2]
    experts = [gate, up, down]
    biases = [WeightTensor.from_float(name, rng.normal(0, 0.5, (E, rows)).astype(np.float32))
              for name, rows in (("gb", ff), ("ub", ff), ("db", d))]
    x = rng.normal(0, 1, (30, d)).astype(np.float32)
    logits = rng.normal(0, 1, (30, E)).astype(np.float32)
    nat = NativeBackend(activations="q8")
    before = native.threads()
    try:
        batch = run_moe(nat, experts, x, logits, k, biases=biases)
        want = run_moe(NumpyBackend(), experts, x, logits, k, biases=biases)
        assert float(np.abs(batch - want).max()) <= 2e-2 * float(np.abs(want).max())
        for t in (1, 2, 3):
            native.set_threads(t)
            for lo, hi in ((0, 1), (7, 8), (10, 12), (20, 23)):
                got = run_moe(nat, experts, x[lo:hi], logits[lo:hi], k, biases=biases)
                assert np.array_equal(got, batch[lo:hi]), f"tokens {lo}:{hi} threads={t} isa={isa}"
    finally:
        native.set_threads(before)
        nat.close()


@pytest.mark.parametrize("folder", ["qwen3_moe", "glm4_moe"])
def test_model_decode_is_batch_invariant(batch_invariant, folder):
    """A tiny MoE model quantized at load (GLM-4.5's: sigmoid routing with a choice bias, a shared expert):
    one sequence's decode step alone or beside another."""
    from llambda.formats.hf_dir import open_hf_dir
    from llambda.models.base import Transformer
    from llambda.tools.quantize import quantizing_lookup
    src = open_hf_dir(TINY / folder)
    nat = NativeBackend(activations="q8")
    nat.set_batch_invariant(True)
    try:
        tr = Transformer(src.config, quantizing_lookup(src.tensor, "q8_0"), nat, n_ctx=64, n_slots=2, max_tokens=64)
        ids = np.array(reference(folder)["inputs"][1]["input_ids"][:20], np.int32)
        for s in (0, 1):
            tr.forward(ids, np.full(20, s, np.int32), np.arange(20, dtype=np.int32), [19])
        alone = tr.forward(ids[:1], [0], [20], [0]).copy()
        both = tr.forward(np.array([ids[0], ids[5]], np.int32), [0, 1], [20, 20], [0, 1]).copy()
        assert np.array_equal(alone[0], both[0])
    finally:
        nat.close()
        src.close()


# ---------------------------------------------------------------- whole tiny models


@pytest.mark.parametrize("folder", MOE_FOLDERS)
def test_tiny_moe_on_every_isa(isa, folder):
    inp = reference(folder)["inputs"][1]
    with llambda.load(TINY / folder, backend="native", activations="f32", n_ctx=64) as m:
        got = np.stack([m.logits(inp["input_ids"][:p + 1]) for p in inp["last_positions"]])
        greedy = list(m.generate(inp["input_ids"], max_tokens=16, temperature=0, ignore_eos=True))
    assert float(np.abs(got - np.array(inp["logits_last3"], np.float32)).max()) <= 1e-3
    assert greedy == inp["greedy_new_tokens"]


def test_dense_and_moe_layers_follow_the_config():
    with llambda.load(TINY / "qwen3_moe", backend="numpy", n_ctx=32) as m:
        cfg, layers = m.config, m.transformer.layers
        assert cfg.moe_layers == [False, True, True]
        assert [L.moe is not None for L in layers] == [False, True, True]
        assert (cfg.n_experts, cfg.n_experts_used, cfg.expert_ffn_dim, cfg.moe_norm_topk) == (8, 2, 16, True)
    with llambda.load(TINY / "qwen2_moe", backend="numpy", n_ctx=32) as m:
        assert m.config.shared_ffn_dim == 64 and not m.config.moe_norm_topk
        assert m.transformer.layers[0].moe.shared_gate_inp is not None


# ---------------------------------------------------------------- GGUF


@pytest.mark.parametrize("folder, arch", [("qwen3_moe", "qwen3moe"), ("mixtral", "llama"), ("qwen2_moe", "qwen2moe"),
                                          ("gpt_oss", "gpt-oss"), ("glm4_moe", "glm4moe")])
def test_gguf_round_trip(folder, arch, tmp_path):
    """Exported as GGUF (f32: the reference exactly; q8_0: native equals the oracle on the same weights)."""
    from llambda.formats.gguf import GGUFFile
    from llambda.tools.export import export
    ref = reference(folder)
    inp = ref["inputs"][2]
    ids = inp["input_ids"]
    f32 = export(str(TINY / folder), tmp_path / "f32.gguf", fmt="gguf", qtype="f32")
    with GGUFFile(f32) as f:
        assert f.metadata["general.architecture"] == arch
        assert f.metadata[f"{arch}.expert_count"] == (ref["config"].get("num_experts") or
                                                      ref["config"].get("num_local_experts") or
                                                      ref["config"].get("n_routed_experts"))
        assert len(f.tensors["blk.1.ffn_down_exps.weight"].shape) == 3
    for backend, act in (("numpy", None), ("native", "f32")):
        with llambda.load(f32, backend=backend, activations=act, n_ctx=128) as m:
            got = np.stack([m.logits(ids[:p + 1]) for p in inp["last_positions"]])
            assert float(np.abs(got - np.array(inp["logits_last3"], np.float32)).max()) <= 1e-3
            assert list(m.generate(ids, max_tokens=16, temperature=0, ignore_eos=True)) == inp["greedy_new_tokens"]
    q8 = export(str(TINY / folder), tmp_path / "q8.gguf", fmt="gguf", qtype="mxfp4" if arch == "gpt-oss" else "q8_0")
    with GGUFFile(q8) as f:
        assert f.tensors["blk.1.ffn_up_exps.weight"].qtype == (QType.MXFP4 if arch == "gpt-oss" else QType.Q8_0)
        assert f.tensors["blk.1.ffn_gate_inp.weight"].qtype == QType.F32     # the router stays float
        if arch == "gpt-oss":       # biases too (the experts' are 2-D: llama.cpp adds them as floats)
            assert f.tensors["blk.1.ffn_gate_exps.bias"].qtype == QType.F32
    rows = {}
    for backend, act in (("numpy", None), ("native", "f32")):
        with llambda.load(q8, backend=backend, activations=act, n_ctx=128) as m:
            rows[backend] = m.logits(ids)
    assert float(np.abs(rows["native"] - rows["numpy"]).max()) <= 1e-3


def test_gguf_with_llama_cpp_names_and_a_shared_gate_vector(tmp_path):
    """qwen2moe's ffn_gate_inp_shexp is a vector of d_model in llama.cpp's files; ours writes it so."""
    from llambda.formats.gguf import GGUFFile
    from llambda.tools.export import export
    path = export(str(TINY / "qwen2_moe"), tmp_path / "m.gguf", fmt="gguf", qtype="f32")
    with GGUFFile(path) as f:
        assert f.tensors["blk.0.ffn_gate_inp_shexp.weight"].shape == (64,)
        assert f.metadata["qwen2moe.expert_shared_feed_forward_length"] == 64
        assert f.metadata["qwen2moe.expert_weights_norm"] is False


# ---------------------------------------------------------------- bad input


def _edit_copy(tmp_path, folder, edit_cfg=None, drop=None):
    import shutil
    from safetensors.numpy import load_file, save_file
    d = tmp_path / folder
    shutil.copytree(TINY / folder, d)
    if edit_cfg:
        cfg = json.loads((d / "config.json").read_text())
        edit_cfg(cfg)
        (d / "config.json").write_text(json.dumps(cfg))
    if drop:
        t = load_file(d / "model.safetensors")
        for k in [k for k in t if drop in k]:
            del t[k]
        save_file(t, d / "model.safetensors")
    return d


@pytest.mark.parametrize("edit, drop, message", [
    (lambda c: c.update(num_experts_per_tok=9), None, "experts used per token"),
    (lambda c: c.update(num_experts_per_tok=0), None, "experts used per token"),
    (lambda c: c.update(num_local_experts=4), None, "ffn_gate_inp"),
    (lambda c: c.update(moe_intermediate_size=8), None, "ffn_gate_exps"),
    (lambda c: c.update(mlp_only_layers="0"), None, "mlp_only_layers"),
    (None, "layers.1.mlp.experts.3.up_proj", "experts \\[3\\] are missing"),
    (None, "layers.2.mlp.gate.weight", "ffn_gate"),
])
def test_bad_moe_files_are_model_format_errors(tmp_path, edit, drop, message):
    d = _edit_copy(tmp_path, "qwen3_moe", edit, drop)
    with pytest.raises(ModelFormatError, match=message):
        llambda.load(d, backend="numpy", n_ctx=32)


def test_an_expert_numbered_in_the_billions_is_refused_fast(tmp_path):
    """An expert id of 3e9 in a tensor name: the missing-expert message once built set(range(3e9 + 1))."""
    from safetensors.numpy import load_file, save_file
    d = _edit_copy(tmp_path, "qwen3_moe")
    t = load_file(d / "model.safetensors")
    k = next(k for k in t if "layers.1.mlp.experts.3.up_proj" in k)
    t[k.replace("experts.3.", "experts.3000000000.")] = t.pop(k)
    save_file(t, d / "model.safetensors")
    with pytest.raises(ModelFormatError, match=r"experts \[3\] are missing \(ids go up to 3000000000\)"):
        llambda.load(d, backend="numpy", n_ctx=32)


def test_moe_binding_refuses_bad_arguments():
    n, d, ff, E, k = 2, 32, 32, 4, 2
    W = [(0, 0, np.zeros(E * ff * d * 4, np.uint8))] * 3
    x, logits, out = np.zeros((n, d), np.float32), np.zeros((n, E), np.float32), np.zeros((n, d), np.float32)
    fs, is_ = np.zeros(n * k * (2 * d + 2 * ff + 1), np.float32), np.zeros(3 * n * k + E + 1, np.int32)
    args = [x, logits, out, n, d, E, k, ff, 0, 1, 1, *W, fs, is_, None, None, 0, 1.0, 1.0, None, None, None]
    native.moe(*args)                                   # well-formed: runs
    for i, bad, err in ((6, E + 1, ValueError), (6, 0, ValueError), (8, 3, ValueError),
                        (14, fs[:-1], ValueError), (15, is_[:-1], ValueError),
                        (11, (0, 0, np.zeros(10, np.uint8)), ValueError), (11, (99, 0, W[0][2]), ValueError),
                        (11, (0, 0), TypeError), (2, x, ValueError), (0, x[:1], ValueError),
                        (18, 2, ValueError), (20, -1.0, ValueError), (21, np.zeros(E * ff - 1, np.float32), ValueError),
                        (23, np.zeros((E, d), np.float64), TypeError)):
        a = list(args)
        a[i] = bad
        with pytest.raises(err):
            native.moe(*a)
    with pytest.raises(ValueError, match="shared_logit without shared"):
        native.moe(*args[:16], None, np.zeros(n, np.float32), *args[18:])


def test_hf_export_of_moe_is_refused_with_a_reason():
    with pytest.raises(LlambdaError, match="GGUF only"):
        from llambda.tools.export import export
        export(str(TINY / "mixtral"), "/nonexistent/x", fmt="hf")


def test_bench_counts_the_active_experts_bytes():
    """Bytes per decode token: k of the E experts of each MoE layer, everything else as for a dense model."""
    from llambda.formats.hf_dir import open_hf_dir
    from llambda.formats.quants import tensor_nbytes
    from llambda.tools.model_info import decode_weight_bytes
    src = open_hf_dir(TINY / "qwen3_moe")
    try:
        cfg = src.config
        total = experts = 0
        for name in src.tensor_names:
            t = src.tensor(name)
            n = tensor_nbytes(t.qtype, t.shape)
            total += n
            experts += n if "_exps." in name else 0
        embd = src.tensor("token_embd.weight")
        row = tensor_nbytes(embd.qtype, embd.shape) // cfg.vocab_size
        want = total - experts + experts * cfg.n_experts_used // cfg.n_experts \
            - tensor_nbytes(embd.qtype, embd.shape) + row
        assert experts and decode_weight_bytes(src) == want
        from llambda.tools.model_info import describe
        d = describe(src)
        assert d["active_parameters"] < d["parameters"]
    finally:
        src.close()


def test_an_output_projection_bias_is_used_not_ignored(tmp_path):
    """A Llama checkpoint with o_proj biases (transformers: attention_bias covers o_proj) runs them."""
    from llambda.formats.safetensors import SafetensorsFile, write_safetensors
    import shutil
    d = tmp_path / "m"
    shutil.copytree(TINY / "llama", d)
    with SafetensorsFile(TINY / "llama" / "model.safetensors") as f:
        tensors = dict(f.tensors)
    tensors = {k: v.to_float32().reshape(v.shape) for k, v in tensors.items()}
    inp = reference("llama")["inputs"][0]
    with llambda.load(TINY / "llama", backend="numpy", n_ctx=32) as m:
        plain = m.logits(inp["input_ids"])
    tensors["model.layers.0.self_attn.o_proj.bias"] = np.full(64, 0.5, np.float32)
    write_safetensors(d / "model.safetensors", tensors)
    with llambda.load(d, backend="numpy", n_ctx=32) as m:
        assert m.transformer.layers[0].bo is not None and m.transformer.layers[1].bo is None
        assert float(np.abs(m.logits(inp["input_ids"]) - plain).max()) > 1e-2


@pytest.mark.parametrize("folder", ["qwen3_moe", "gpt_oss"])
def test_moe_decode_steps_allocate_nothing_in_c(folder):
    from llambda import engine
    with llambda.load(TINY / folder, backend="native", threads=2, n_ctx=128) as m:
        tr = m.transformer
        engine.prefill(tr, 0, list(range(5, 25)), 0)
        tok = 1
        for pos in range(20, 25):      # warm up: records the decode plan, sizes the scratch
            tok = int(np.argmax(engine.decode(tr, [0], [tok], [pos])[0]))
        before = native.alloc_stats()
        for pos in range(25, 75):
            tok = int(np.argmax(engine.decode(tr, [0], [tok], [pos])[0]))
        assert native.alloc_stats() == before


@pytest.mark.parametrize("folder", ["mixtral", "qwen2_moe", "gpt_oss", "glm4_moe"])
def test_llama_cpp_reads_our_moe_gguf_as_we_do(folder, tmp_path, monkeypatch):
    """An independent reader of the same file: llama.cpp's logits on our exported GGUF against ours.
    (Qwen3-MoE's tiny model has a dense layer, which llama.cpp cannot hold.) GPT-OSS: llama.cpp rounds
    the ends of the YaRN ramp, the model's config says not to; ours is compared with that rounding."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the bench extra)")
    llama_cpp_agrees(folder, tmp_path, (lambda: round_yarn_as_llama_cpp(monkeypatch)) if folder == "gpt_oss" else None)


def round_yarn_as_llama_cpp(monkeypatch) -> None:
    """GPT-OSS GGUFs read with the ends of the YaRN ramp rounded, as llama.cpp runs them."""
    from llambda.models import gpt_oss
    plain = gpt_oss.config_from_gguf

    def rounded(meta):
        c = plain(meta)
        c.rope_scaling["truncate"] = True
        return c
    monkeypatch.setattr(gpt_oss, "config_from_gguf", rounded)


def llama_cpp_agrees(folder: str, tmp_path, before_load=None) -> None:
    """Our f32 GGUF export of a tiny folder (no tokenizer: tokenizer.ggml.model "none"): llama.cpp's logits on it within 0.05 of
    ours on the same file (read after `before_load()`), at the second input's last positions."""
    import llama_cpp as L
    from llambda.tools.export import export
    from llambda.tools.bench import _silence_llama_cpp
    _silence_llama_cpp(L)               # a callback that outlives the test: llama.cpp keeps its address
    path = export(str(TINY / folder), tmp_path / "a.gguf", fmt="gguf", qtype="f32")     # loadable as written
    if before_load is not None:
        before_load()
    L.llama_backend_init()
    model = L.llama_model_load_from_file(str(path).encode(), L.llama_model_default_params())
    assert model, "llama.cpp could not load the file"
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_threads, cp.n_threads_batch = 128, 1, 1
    ctx = L.llama_init_from_model(model, cp)
    try:
        inp = reference(folder)["inputs"][1]
        with llambda.load(path, backend="numpy", n_ctx=128) as m:
            for p in inp["last_positions"]:
                ids = inp["input_ids"][:p + 1]
                L.llama_memory_clear(L.llama_get_memory(ctx), True)
                arr = (L.llama_token * len(ids))(*ids)       # kept alive while llama_decode reads it
                assert L.llama_decode(ctx, L.llama_batch_get_one(arr, len(ids))) == 0
                theirs = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), shape=(512,))
                # llama.cpp computes parts of attention in half precision: ~1e-2 on these sensitive models
                assert float(np.abs(m.logits(ids) - theirs).max()) <= 0.05
    finally:
        L.llama_free(ctx)
        L.llama_model_free(model)


def test_gguf_with_one_tensor_per_expert(tmp_path):
    """Older llama.cpp Mixtral files: `blk.N.ffn_gate.E.weight` per expert, stacked at load."""
    from llambda.formats.gguf import GGUFFile
    from llambda.formats.gguf_writer import write_gguf
    from llambda.tools.export import export
    stacked = export(str(TINY / "mixtral"), tmp_path / "a.gguf", fmt="gguf", qtype="q8_0")
    items = []
    with GGUFFile(stacked) as f:
        meta = dict(f.metadata)
        for name, t in f.tensors.items():
            data = np.array(t.data)
            if name.endswith("_exps.weight"):
                per = data.reshape(t.shape[0], -1)
                for e in range(t.shape[0]):
                    items.append((name.replace("_exps.weight", f".{e}.weight"), t.qtype, per[e], t.shape[1:]))
            else:
                items.append((name, t.qtype, data, t.shape))
    split = write_gguf(tmp_path / "b.gguf", meta, items) or tmp_path / "b.gguf"
    ids = reference("mixtral")["inputs"][1]["input_ids"]
    with llambda.load(stacked, backend="native", n_ctx=64) as a, llambda.load(split, backend="native", n_ctx=64) as b:
        assert np.array_equal(a.logits(ids), b.logits(ids))
