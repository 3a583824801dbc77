"""LoRA adapters (formats/lora.py, formats/lora_merge.py): a random adapter written here in both formats,
PEFT's directory and llama.cpp's GGUF, merged at load into the tiny reference models, against a copy of
the base whose weights this file merged itself in NumPy."""
import json
import math
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest

import llambda
from llambda.backends import available_backends
from llambda.errors import AdapterError, InvalidInputError, LlambdaWarning
from llambda.formats.gguf_writer import write_gguf
from llambda.formats.quants import QType
from llambda.formats.safetensors import SafetensorsFile, write_safetensors

TINY = Path(__file__).parent / "fixtures" / "reference" / "tiny"
IDS = [1, 17, 93, 250, 4, 77, 300, 12, 5, 411]
ATTN, MLP = ("q_proj", "k_proj", "v_proj", "o_proj"), ("gate_proj", "up_proj", "down_proj")
# module -> GGUF leaf, as llama.cpp names them
LEAVES = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
          "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}
# backend, activations, max |logit difference| between two loads of the same float weights
MODES = {"numpy": ("numpy", None, 1e-4), "native-exact": ("native", "f32", 1e-3),
         "native-fast": ("native", "q8", 1e-2)}


def config(folder):
    return json.loads((TINY / folder / "config.json").read_text())


def base_tensors(folder) -> dict[str, np.ndarray]:
    with SafetensorsFile(TINY / folder / "model.safetensors") as f:
        return {n: t.to_float32().reshape(t.shape).copy() for n, t in f.tensors.items()}


def random_adapter(folder, rank=4, seed=0, modules=ATTN + MLP, layers=None) -> dict[str, tuple]:
    """HF module name -> (A (r, in), B (out, r)), random both (a trained B is not zero)."""
    rng, base = np.random.default_rng(seed), base_tensors(folder)
    layers = range(config(folder)["num_hidden_layers"]) if layers is None else layers
    out = {}
    for i in layers:
        for mod in modules:
            name = f"model.layers.{i}.{'self_attn' if mod in ATTN else 'mlp'}.{mod}"
            rows, cols = base[name + ".weight"].shape
            out[name] = ((rng.standard_normal((rank, cols)) * 0.3).astype(np.float32),
                         (rng.standard_normal((rows, rank)) * 0.3).astype(np.float32))
    return out


def write_peft(path: Path, pairs, alpha, **cfg) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    rank = next(iter(pairs.values()))[0].shape[0]
    conf = {"peft_type": "LORA", "r": rank, "lora_alpha": alpha, "target_modules": sorted({m.rsplit(".", 1)[-1]
            for m in pairs}), "use_rslora": False, "use_dora": False, "bias": "none", "fan_in_fan_out": False,
            "base_model_name_or_path": "tiny", "task_type": "CAUSAL_LM", **cfg}
    (path / "adapter_config.json").write_text(json.dumps(conf))
    tensors = {}
    for mod, (a, b) in pairs.items():
        tensors[f"base_model.model.{mod}.lora_A.weight"] = a
        tensors[f"base_model.model.{mod}.lora_B.weight"] = b
    write_safetensors(path / "adapter_model.safetensors", tensors)
    return path


def llama_cpp_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """q/k rows as llama.cpp's converter stores them for `llama`: each head's two halves interleaved
    (its permute: reshape (heads, 2, half, ...), swap the 2 and half axes)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf_adapter(path: Path, pairs, alpha, arch, folder, qtype=QType.F32, **meta) -> Path:
    """The adapter as llama.cpp's convert_lora_to_gguf.py writes it: `<base GGUF name>.lora_a` (r, in) and
    `.lora_b` (out, r), q/k B rows permuted for a `llama` file."""
    c = config(folder)
    tensors = []
    for mod, (a, b) in pairs.items():
        i, leaf = int(mod.split(".")[2]), LEAVES[mod.rsplit(".", 1)[1]]
        if arch == "llama" and leaf in ("attn_q", "attn_k"):
            b = llama_cpp_rows(b, c["num_attention_heads"] if leaf == "attn_q" else c["num_key_value_heads"])
        tensors += [(f"blk.{i}.{leaf}.weight.lora_a", qtype, a), (f"blk.{i}.{leaf}.weight.lora_b", qtype, b)]
    md = {"general.architecture": arch, "general.type": "adapter", "adapter.type": "lora", **meta}
    if alpha is not None:
        md["adapter.lora.alpha"] = float(alpha)
    write_gguf(path, md, tensors)
    return path


def merged_copy(folder, out: Path, adapters) -> Path:
    """The base directory with each (pairs, factor) merged in NumPy: W + factor B @ A."""
    shutil.copytree(TINY / folder, out)
    w = base_tensors(folder)
    for pairs, factor in adapters:
        for mod, (a, b) in pairs.items():
            w[mod + ".weight"] = w[mod + ".weight"] + np.float32(factor) * (b.astype(np.float64) @ a).astype(np.float32)
    write_safetensors(out / "model.safetensors", w)
    return out


def load(path, mode, **kw):
    backend, activations, _ = MODES[mode]
    if backend not in available_backends():
        pytest.skip(f"the {backend} backend is not available here")
    return llambda.load(path, backend=backend, activations=activations, n_ctx=64, **kw)


def logits(path, mode, **kw) -> np.ndarray:
    with load(path, mode, **kw) as m:
        return np.stack([m.logits(IDS[:n]) for n in (3, 7, len(IDS))])


def diff(a, b) -> float:
    return float(np.abs(a - b).max())


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("folder", ["llama", "qwen2"])
def test_peft_adapter_equals_numpy_merge(tmp_path, folder, mode):
    pairs = random_adapter(folder, rank=4)
    peft = write_peft(tmp_path / "peft", pairs, alpha=8)
    want = logits(merged_copy(folder, tmp_path / "ref", [(pairs, 8 / 4)]), mode)
    base = logits(TINY / folder, mode)
    got = logits(TINY / folder, mode, lora=str(peft))
    assert diff(base, want) > 0.1          # the adapter moves the logits: this test can fail
    assert diff(got, want) <= MODES[mode][2], diff(got, want)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("folder,arch", [("llama", "llama"), ("qwen2", "qwen2")])
def test_gguf_adapter_equals_peft(tmp_path, folder, arch, mode):
    """llama.cpp's form of the same adapter (llama's q/k rows permuted) gives the PEFT form's logits."""
    pairs = random_adapter(folder, rank=3, seed=1)
    peft = write_peft(tmp_path / "peft", pairs, alpha=6)
    gg = write_gguf_adapter(tmp_path / "a.gguf", pairs, 6, arch, folder)
    a, b = logits(TINY / folder, mode, lora=str(peft)), logits(TINY / folder, mode, lora=str(gg))
    assert diff(a, logits(TINY / folder, mode)) > 0.1
    assert diff(a, b) <= MODES[mode][2], diff(a, b)


def test_gguf_adapter_rows_unpermuted_matter(tmp_path):
    """The same GGUF adapter with llama's q/k B rows left in HF order is another model: the permutation
    is applied, not ignored."""
    pairs = {k: v for k, v in random_adapter("llama", rank=3, seed=1).items() if k.endswith(("q_proj", "k_proj"))}
    good = write_gguf_adapter(tmp_path / "a.gguf", pairs, 6, "llama", "llama")
    bad = write_gguf_adapter(tmp_path / "b.gguf", pairs, 6, "qwen2", "llama")   # no permutation written
    md = {"general.architecture": "llama", "general.type": "adapter", "adapter.type": "lora", "adapter.lora.alpha": 6.0}
    from llambda.formats.gguf import GGUFFile
    with GGUFFile(bad) as f:
        write_gguf(tmp_path / "c.gguf", md, [(n, t.qtype, np.array(t.data), t.shape) for n, t in f.tensors.items()])
    ref = logits(merged_copy("llama", tmp_path / "ref", [(pairs, 2.0)]), "numpy")
    assert diff(logits(TINY / "llama", "numpy", lora=str(good)), ref) <= 1e-4
    assert diff(logits(TINY / "llama", "numpy", lora=str(tmp_path / "c.gguf")), ref) > 1e-2


def test_gguf_base_with_peft_adapter(tmp_path):
    """A GGUF llama base (q/k rows permuted) takes a PEFT adapter (HF row order) right."""
    from llambda.tools.export import export
    gg = export(TINY / "llama", tmp_path / "base.gguf", fmt="gguf")
    pairs = random_adapter("llama", rank=2, seed=2)
    peft = write_peft(tmp_path / "peft", pairs, alpha=4)
    want = logits(merged_copy("llama", tmp_path / "ref", [(pairs, 2.0)]), "numpy")
    assert diff(logits(gg, "numpy", lora=str(peft)), want) <= 1e-4


@pytest.mark.parametrize("mode", list(MODES))
def test_two_adapters_their_own_scales_rslora_and_alpha_pattern(tmp_path, mode):
    p1 = random_adapter("qwen2", rank=4, seed=3)
    p2 = random_adapter("qwen2", rank=2, seed=4, modules=("v_proj", "down_proj"))
    peft = write_peft(tmp_path / "rs", p1, alpha=8, use_rslora=True, alpha_pattern={"down_proj": 2})
    gg = write_gguf_adapter(tmp_path / "b.gguf", p2, 4, "qwen2", "qwen2")
    down = {k: v for k, v in p1.items() if k.endswith("down_proj")}
    rest = {k: v for k, v in p1.items() if not k.endswith("down_proj")}
    want = logits(merged_copy("qwen2", tmp_path / "ref", [(rest, 0.5 * 8 / math.sqrt(4)),
                                                           (down, 0.5 * 2 / math.sqrt(4)), (p2, -1.5 * 4 / 2)]), mode)
    with load(TINY / "qwen2", mode, lora=[(str(peft), 0.5), (gg, -1.5)]) as m:
        got = np.stack([m.logits(IDS[:n]) for n in (3, 7, len(IDS))])
        assert [(a["format"], a["scale"], a["rank"]) for a in m.adapters] == [("peft", 0.5, 4), ("gguf", -1.5, 2)]
    assert diff(got, want) <= MODES[mode][2], diff(got, want)


def test_gguf_alpha_absent_means_scale_one_and_f16_factors(tmp_path):
    """llama.cpp's rule: no adapter.lora.alpha (or 0) applies B @ A times the user's scale alone; F16
    factors are read as such."""
    pairs = random_adapter("qwen2", rank=4, seed=5, modules=("o_proj",))
    gg = write_gguf_adapter(tmp_path / "a.gguf", pairs, None, "qwen2", "qwen2", qtype=QType.F16)
    half = {k: (a.astype(np.float16).astype(np.float32), b.astype(np.float16).astype(np.float32))
            for k, (a, b) in pairs.items()}
    want = logits(merged_copy("qwen2", tmp_path / "ref", [(half, 2.0)]), "numpy")
    assert diff(logits(TINY / "qwen2", "numpy", lora=[(gg, 2.0)]), want) <= 1e-4


def test_quantized_base_requantized_with_a_warning(tmp_path):
    """A Q8_0 base: each adapted weight dequantized, merged, quantized to Q8_0 again (two roundings). Its
    logits are within 1.25x (+ 0.05) of the float merge's quantized once (export of the NumPy-merged copy),
    against the float merge; the adapter moves them by far more than that."""
    from llambda.tools.export import export
    gg = export(TINY / "qwen2", tmp_path / "base.gguf", fmt="gguf", qtype="q8_0")
    pairs = {k: (a, b * 0.2) for k, (a, b) in random_adapter("qwen2", rank=4, seed=6).items()}  # |BA| ~ |W| / 5
    peft = write_peft(tmp_path / "peft", pairs, alpha=4)
    ref = merged_copy("qwen2", tmp_path / "ref", [(pairs, 1.0)])
    want = logits(ref, "numpy")
    once = diff(logits(export(ref, tmp_path / "ref.gguf", fmt="gguf", qtype="q8_0"), "numpy"), want)
    with pytest.warns(LlambdaWarning, match=r"LoRA: 14 Q8_0 weights were dequantized, merged and quantized again"):
        m = load(gg, "numpy", lora=str(peft))
    with m:
        got = np.stack([m.logits(IDS[:n]) for n in (3, 7, len(IDS))])
    assert diff(got, logits(gg, "numpy")) > 5 * once
    assert diff(got, want) <= 1.25 * once + 0.05, (diff(got, want), once)


def merge_one(qtype, w, a, b, scale=0.5, factor=2.0):
    """LoraMerge on one (64, 256) weight `w` stored as `qtype`: (the merge, the merged tensor)."""
    from types import SimpleNamespace
    from llambda.formats.lora import LoraAdapter, LoraPair
    from llambda.formats.lora_merge import LoraMerge
    from llambda.formats.quants import quantize
    from llambda.formats.weights import WeightTensor
    base = WeightTensor("blk.0.ffn_up.weight", qtype, w.shape, quantize(w, qtype).reshape(-1))
    pair = LoraPair(WeightTensor.from_float("a", a), WeightTensor.from_float("b", b), factor, "up")
    ad = LoraAdapter(Path("x"), "peft", scale, {base.name: pair})
    merge = LoraMerge(lambda n: base if n == base.name else None, [ad], SimpleNamespace(rope_neox=True))
    return merge, merge.lookup(base.name), base


def factors(seed=9):
    rng = np.random.default_rng(seed)
    w, a, b = (rng.standard_normal(shape) * g for shape, g in (((64, 256), 0.05), ((4, 256), 0.1), ((64, 4), 0.1)))
    return w.astype(np.float32), a.astype(np.float32), b.astype(np.float32)


@pytest.mark.parametrize("qtype", [QType.F32, QType.F16, QType.BF16])
def test_float_weight_merged_in_float_and_kept_in_its_type(qtype):
    from llambda.formats.quants import dequantize, quantize
    w, a, b = factors()
    merge, got, base = merge_one(qtype, w, a, b)
    exact = dequantize(base.data, qtype, w.shape) + b @ a        # scale 0.5 x factor 2
    assert got.qtype == qtype and np.array_equal(got.data, quantize(exact, qtype).reshape(-1))
    with warnings.catch_warnings():
        warnings.simplefilter("error", LlambdaWarning)
        merge.finish()


def test_non_finite_merge_is_refused():
    w, a, b = factors()
    a[0, 3] = np.inf
    with pytest.raises(AdapterError, match="non-finite weights"):
        merge_one(QType.F32, w, a, b)


@pytest.mark.parametrize("qtype", [QType.Q8_0, QType.Q4_0, QType.Q4_K, QType.Q6_K])
def test_requantized_weight_error(qtype):
    """One merge of a quantized matrix (256 columns: the K-quants' blocks): the result keeps the type, and
    its error against the exact W + s B @ A is at most twice a single rounding of that sum (RMS)."""
    from llambda.formats.quants import dequantize, quantize
    w, a, b = factors()
    merge, got, base = merge_one(qtype, w, a, b)
    exact = w + 1.0 * (b @ a)
    assert got.qtype == qtype and got.shape == w.shape
    err = np.sqrt(np.mean((dequantize(got.data, qtype, w.shape) - exact) ** 2))
    once = np.sqrt(np.mean((dequantize(quantize(exact, qtype), qtype, w.shape) - exact) ** 2))
    assert 0 < err <= 2 * once, (err, once)
    assert np.abs(dequantize(got.data, qtype, w.shape) - dequantize(base.data, qtype, w.shape)).max() > 10 * once
    with pytest.warns(LlambdaWarning, match=f"LoRA: 1 {qtype.name} weights were dequantized"):
        merge.finish()


def test_float_base_merges_without_warning(tmp_path):
    peft = write_peft(tmp_path / "peft", random_adapter("qwen2", rank=2, modules=("q_proj",)), alpha=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", LlambdaWarning)
        load(TINY / "qwen2", "numpy", lora=str(peft)).close()


# ---------------------------------------------------------------- refusals

def refuse(tmp_path, lora, match, folder="llama"):
    with pytest.raises(AdapterError, match=match):
        llambda.load(TINY / folder, backend="numpy", n_ctx=64, lora=lora)


def test_refuses_another_architecture(tmp_path):
    gg = write_gguf_adapter(tmp_path / "a.gguf", random_adapter("llama", modules=("v_proj",)), 8, "qwen3", "llama")
    refuse(tmp_path, str(gg), r"is for architecture 'qwen3', the model is 'llama'")


def test_refuses_a_weight_the_base_lacks(tmp_path):
    pairs = random_adapter("llama", modules=("v_proj",), layers=[0])
    a, b = pairs["model.layers.0.self_attn.v_proj"]
    gg = tmp_path / "a.gguf"
    write_gguf(gg, {"general.architecture": "llama", "general.type": "adapter", "adapter.type": "lora",
                    "adapter.lora.alpha": 8.0},
               [("blk.7.attn_v.weight.lora_a", QType.F32, a), ("blk.7.attn_v.weight.lora_b", QType.F32, b)])
    refuse(tmp_path, str(gg), r"'blk.7.attn_v.weight', which the model does not have")
    peft = write_peft(tmp_path / "p", {"model.layers.9.self_attn.v_proj": (a, b)}, 8)
    refuse(tmp_path, str(peft), r"'model.layers.9.self_attn.v_proj' is no weight of the base model")
    # qwen2 ties its head to the embedding: an lm_head adapter has nothing to merge into
    head = {"lm_head": (np.ones((2, 64), np.float32), np.ones((512, 2), np.float32))}
    refuse(tmp_path, str(write_peft(tmp_path / "h", head, 2)), r"'output.weight', which the model does not have",
           folder="qwen2")


def test_refuses_shape_and_rank_mismatches(tmp_path):
    pairs = random_adapter("llama", modules=("v_proj",), layers=[0])
    a, b = pairs["model.layers.0.self_attn.v_proj"]
    mod = "model.layers.0.self_attn.v_proj"
    refuse(tmp_path, str(write_peft(tmp_path / "s", {mod: (a, np.zeros((b.shape[0] + 1, 4), np.float32))}, 8)),
           r"is a 33x64 update but the model's 'blk.0.attn_v.weight' is 32x64")
    refuse(tmp_path, str(write_peft(tmp_path / "r", {mod: (a, b[:, :3].copy())}, 8)), r"rank mismatch")
    refuse(tmp_path, str(write_peft(tmp_path / "c", {mod: (a, b)}, 8, r=8)), r"has rank 4 but adapter_config.json "
                                                                            r"says r = 8")
    wide = (np.zeros((40, 64), np.float32), np.zeros((32, 40), np.float32))
    refuse(tmp_path, str(write_peft(tmp_path / "w", {mod: wide}, 8)), r"rank 40, more than its 32x64 weight")


def test_refuses_absurd_alpha_and_scale(tmp_path):
    pairs = random_adapter("llama", modules=("v_proj",), layers=[0])
    refuse(tmp_path, str(write_peft(tmp_path / "a", pairs, 1e6)), r"alpha 1e\+06 over r = 250000")
    refuse(tmp_path, str(write_peft(tmp_path / "n", pairs, -2)), r"lora alpha must be a finite number >= 0")
    refuse(tmp_path, str(write_gguf_adapter(tmp_path / "g.gguf", pairs, float("inf"), "llama", "llama")),
           r"lora alpha must be a finite number")
    for bad in (float("nan"), 1e9, "2"):
        with pytest.raises(InvalidInputError, match=r"must be a finite number of magnitude"):
            llambda.load(TINY / "llama", backend="numpy", lora=[(str(tmp_path / "a"), bad)])


@pytest.mark.parametrize("cfg,match", [
    ({"use_dora": True}, r"DoRA \(weight-decomposed LoRA\) is not supported"),
    ({"peft_type": "LOHA"}, r"PEFT type 'LOHA' is not supported \(only LORA\)"),
    ({"peft_type": "ADALORA"}, r"PEFT type 'ADALORA' is not supported"),
    ({"fan_in_fan_out": True}, r"fan_in_fan_out"),
    ({"bias": "lora_only"}, r"bias 'lora_only' is not supported"),
])
def test_refuses_unsupported_peft_kinds(tmp_path, cfg, match):
    refuse(tmp_path, str(write_peft(tmp_path / "p", random_adapter("llama", modules=("v_proj",)), 8, **cfg)), match)


def test_refuses_malformed_adapters(tmp_path):
    pairs = random_adapter("llama", modules=("v_proj",), layers=[0])
    refuse(tmp_path, str(tmp_path / "missing.gguf"), r"no such file or directory")
    gg = write_gguf_adapter(tmp_path / "m.gguf", pairs, 8, "llama", "llama", **{"general.type": "model"})
    refuse(tmp_path, str(gg), r"general.type is 'model', not 'adapter'")
    gg = write_gguf_adapter(tmp_path / "c.gguf", pairs, 8, "llama", "llama", **{"adapter.type": "control_vector"})
    refuse(tmp_path, str(gg), r"adapter.type 'control_vector' is not supported")
    a, _ = pairs["model.layers.0.self_attn.v_proj"]
    write_gguf(tmp_path / "h.gguf", {"general.architecture": "llama", "general.type": "adapter",
                                     "adapter.type": "lora"}, [("blk.0.attn_v.weight.lora_a", QType.F32, a)])
    refuse(tmp_path, str(tmp_path / "h.gguf"), r"has no lora_b partner")
    write_gguf(tmp_path / "n.gguf", {"general.architecture": "llama", "general.type": "adapter",
                                     "adapter.type": "lora"}, [("blk.0.attn_norm.weight", QType.F32, a[0])])
    refuse(tmp_path, str(tmp_path / "n.gguf"), r"is not a LoRA factor")
    half = write_peft(tmp_path / "half", pairs, 8)
    write_safetensors(half / "adapter_model.safetensors", {"base_model.model.model.layers.0.self_attn.v_proj."
                                                           "lora_A.weight": a})
    refuse(tmp_path, str(half), r"v_proj.lora_A.weight' has no lora_B partner")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "adapter_config.json").write_text('{"peft_type": "LORA", "r": 4, "lora_alpha": 8}')
    (tmp_path / "bin" / "adapter_model.bin").write_bytes(b"\x80\x02")
    refuse(tmp_path, str(tmp_path / "bin"), r"adapter_model.bin is a pickle")
    (tmp_path / "bad.gguf").write_bytes(b"GGUF" + b"\0" * 8)
    refuse(tmp_path, str(tmp_path / "bad.gguf"), r"LoRA adapter .*bad.gguf")


def test_lora_argument_types(tmp_path):
    with pytest.raises(InvalidInputError, match="lora= takes"):
        llambda.load(TINY / "llama", backend="numpy", lora=5)
    with pytest.raises(InvalidInputError, match="lora= items are paths"):
        llambda.load(TINY / "llama", backend="numpy", lora=[("a", 1.0, 2)])


def test_a_tuple_of_paths_is_several_adapters(tmp_path):
    """lora=("a", "b") is two adapters (it was read as (path, scale) and refused on the scale); a pair of paths
    inside a list is refused on its scale, saying to list them."""
    from llambda.formats.lora import adapter_specs
    assert adapter_specs(("a.gguf", Path("b"))) == [("a.gguf", 1.0), ("b", 1.0)]
    assert adapter_specs(("a.gguf", 0.5)) == [("a.gguf", 0.5)]
    with pytest.raises(InvalidInputError, match=r"b.gguf.*several adapters are a list: lora=\[path, path"):
        adapter_specs([("a.gguf", "b.gguf")])
    one, two = (str(write_peft(tmp_path / n, random_adapter("llama", rank=2, seed=s), 2)) for n, s in (("p", 0), ("q", 1)))
    with llambda.load(TINY / "llama", backend="numpy", n_ctx=64, lora=(one, two)) as m:
        assert [a["path"] for a in m.adapters] == [one, two]


def test_parse_lora_arg(tmp_path):
    from llambda.formats.lora import parse_lora_arg
    assert parse_lora_arg("a.gguf") == ("a.gguf", 1.0)
    assert parse_lora_arg("a.gguf:0.5") == ("a.gguf", 0.5)
    assert parse_lora_arg("dir/x:-1") == ("dir/x", -1.0)
    odd = tmp_path / "x:2"
    odd.mkdir()
    assert parse_lora_arg(str(odd)) == (str(odd), 1.0)      # an existing path is taken whole
    assert parse_lora_arg("c:/a:b") == ("c:/a:b", 1.0)
    from llambda.cli import build_parser
    for cmd in ("run", "chat", "serve"):
        a = build_parser().parse_args([cmd, "-m", "x", "--lora", "a.gguf", "--lora", "p:0.25"])
        assert a.lora == ["a.gguf", "p:0.25"]


def test_encoder_refuses_lora(tmp_path):
    from test_embeddings import _tiny_bert_dir
    with pytest.raises(InvalidInputError, match="not encoders"):
        llambda.load(_tiny_bert_dir(tmp_path)[0], backend="numpy", lora="x")


def test_served_model_lists_its_adapters(tmp_path):
    import asyncio
    import httpx
    from llambda.server import ServerConfig
    from llambda.server.app import create_app
    peft = write_peft(tmp_path / "peft", random_adapter("qwen2", rank=2, modules=("q_proj",)), alpha=2)
    with llambda.load(TINY / "qwen2", backend="numpy", n_ctx=64, n_slots=2, lora=[(str(peft), 0.75)]) as m:
        app = create_app(m, ServerConfig(model_id="tiny", parallel=1))

        async def get():
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as c:
                return ((await c.get("/v1/models")).json(), (await c.post("/api/show", json={"model": "tiny"})).json(),
                        (await c.get("/api/ps")).json())

        body, show, ps = asyncio.run(get())
        card = body["data"][0]
    listed = [{"name": peft.name, "format": "peft", "scale": 0.75, "tensors": 2, "rank": 2}]
    assert card["meta"]["adapters"] == listed
    # Ollama's listings said nothing of them (llambda's own key there: Ollama's shapes have no place)
    assert show["adapters"] == listed and ps["models"][0]["adapters"] == listed
    for answer in (body, show, ps):
        assert str(peft.parent) not in json.dumps(answer), "the server's directories are not the clients' business"


def test_cli_run_merges_adapters_with_their_scales(tmp_path, capsys):
    """`llambda run --lora PATH:SCALE` (repeatable) greedy text is the API's with the same adapters; a
    refused adapter is one clear line and exit code 1."""
    from test_export import tiny_llama_gguf
    from llambda.cli import main
    from llambda.formats.gguf import GGUFFile
    base = tiny_llama_gguf(tmp_path / "base.gguf", qtype=QType.F32)
    rng = np.random.default_rng(11)
    with GGUFFile(base) as f:
        shapes = {n: t.shape for n, t in f.tensors.items() if n.endswith(("attn_v.weight", "ffn_down.weight"))}
    md = {"general.architecture": "llama", "general.type": "adapter", "adapter.type": "lora", "adapter.lora.alpha": 4.0}
    write_gguf(tmp_path / "a.gguf", md, [(f"{n}.lora_{p}", QType.F32, (rng.standard_normal(
        (2, s[1]) if p == "a" else (s[0], 2)) * 0.5).astype(np.float32)) for n, s in shapes.items() for p in "ab"])
    argv = ["run", "-m", str(base), "--backend", "numpy", "-n", "8", "--temp", "0", "--ignore-eos", "the"]
    assert main(argv + ["--lora", f"{tmp_path / 'a.gguf'}:0.5", "--lora", str(tmp_path / "a.gguf")]) == 0
    text = capsys.readouterr().out
    with llambda.load(base, backend="numpy", lora=[(tmp_path / "a.gguf", 0.5), tmp_path / "a.gguf"]) as m:
        want = m.complete("the", max_tokens=8, temperature=0, ignore_eos=True)
        plain = llambda.load(base, backend="numpy")
        with plain:
            assert plain.complete("the", max_tokens=8, temperature=0, ignore_eos=True) != want
    assert text.startswith(want)
    with GGUFFile(tmp_path / "a.gguf") as f:
        write_gguf(tmp_path / "q.gguf", {**md, "general.architecture": "qwen2"},
                   [(n, t.qtype, np.array(t.data), t.shape) for n, t in f.tensors.items()])
    assert main(argv + ["--lora", str(tmp_path / "q.gguf")]) == 1
    err = capsys.readouterr().err
    assert "is for architecture 'qwen2', the model is 'llama'" in err and "Traceback" not in err


def test_serve_passes_adapters_to_load(monkeypatch):
    from test_cli import _serve_with_fake_load
    seen = _serve_with_fake_load(monkeypatch, ["-m", "some.gguf", "--lora", "a.gguf:0.5", "--lora", "b"])
    assert seen["load"][1]["lora"] == [("a.gguf", 0.5), ("b", 1.0)]


def test_same_logits_as_llama_cpp_applying_the_adapter(tmp_path):
    """llama.cpp (llama-cpp-python) applying the GGUF adapter at run time, and our merge of it and of its
    PEFT form (HF q/k row order) into the same GGUF llama base, agree within float rounding."""
    llama_cpp = pytest.importorskip("llama_cpp")
    from llambda.formats.gguf import GGUFFile
    from test_export import tiny_llama_gguf
    base = tiny_llama_gguf(tmp_path / "base.gguf", qtype=QType.F32)     # llama.cpp loads it as written
    rng, ids, heads = np.random.default_rng(3), [5, 70, 100, 33, 200, 9], {"attn_q": 4, "attn_k": 2}
    with GGUFFile(base) as f:
        shapes = {n: t.shape for n, t in f.tensors.items() if n.startswith("blk.") and len(t.shape) == 2}
    hf_leaf = {v: k for k, v in LEAVES.items()}
    gguf_t, peft_pairs = [], {}
    for n, (rows, cols) in shapes.items():
        _, i, leaf, _ = n.split(".")
        a, b = (rng.standard_normal(s).astype(np.float32) * 0.3 for s in ((4, cols), (rows, 4)))
        peft_pairs[f"model.layers.{i}.{'self_attn' if hf_leaf[leaf] in ATTN else 'mlp'}.{hf_leaf[leaf]}"] = (a, b)
        gguf_t += [(n + ".lora_a", QType.F32, a),
                   (n + ".lora_b", QType.F32, llama_cpp_rows(b, heads[leaf]) if leaf in heads else b)]
    write_gguf(tmp_path / "a.gguf", {"general.architecture": "llama", "general.type": "adapter",
                                     "adapter.type": "lora", "adapter.lora.alpha": 8.0}, gguf_t)
    peft = write_peft(tmp_path / "peft", peft_pairs, alpha=8)

    def cpp(**kw):
        llm = llama_cpp.Llama(model_path=str(base), n_ctx=64, n_threads=1, logits_all=True, verbose=False, **kw)
        llm.eval(ids)
        return np.array(llm.scores[len(ids) - 1], dtype=np.float32)

    want, plain = cpp(lora_path=str(tmp_path / "a.gguf"), lora_scale=0.7), cpp()
    for lora in (tmp_path / "a.gguf", peft):
        with llambda.load(base, backend="numpy", lora=[(lora, 0.7)]) as m:
            got = m.logits(ids)
        assert diff(got, want) <= 0.02 and diff(want, plain) > 1, (lora, diff(got, want), diff(want, plain))
