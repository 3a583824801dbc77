"""GLM-4-0414 / GLM-Z1 (`glm4`) and GLM-4.5 / 4.6 (`glm4moe`).

The tiny references (fixtures/reference/tiny/glm4 and glm4_moe, made by tools/make_tiny_glm.py;
README_glm.md there) are run from their HF directories by test_tiny_models.py with every other folder,
exported and run in llama.cpp by test_export.py, and glm4_moe's MoE by test_moe.py. Here: our GGUF export
on every backend against transformers; the settings each format yields; the NextN (multi-token-prediction)
layers skipped in either format, as llama.cpp's converter writes them; refusals of what is not supported.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import llambda
from llambda.errors import LlambdaError, ModelFormatError
from llambda.formats.gguf import GGUFFile, GGUFValueType
from llambda.formats.gguf_writer import GGUFValue, write_gguf
from llambda.formats.safetensors import SafetensorsFile, write_safetensors
from llambda.tools.export import export

from archkit import MODES, TINY, exported, load, reference  # noqa: F401 (exported: a fixture)

FOLDERS = ["glm4", "glm4_moe"]


def last_rows(m, inp) -> np.ndarray:
    return np.stack([m.logits(inp["input_ids"][:p + 1]) for p in inp["last_positions"]])


def max_err(m, folder: str) -> float:
    return max(float(np.abs(last_rows(m, inp) - np.array(inp["logits_last3"], np.float32)).max())
               for inp in reference(folder)["inputs"])


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("folder", FOLDERS)
def test_our_gguf_matches_transformers(exported, folder, mode):
    ref = reference(folder)
    with load(exported(folder), mode) as m:
        assert m.config.arch == {"glm4": "glm4", "glm4_moe": "glm4moe"}[folder]
        assert max_err(m, folder) <= MODES[mode][2]
        inp = ref["inputs"][2]
        assert list(m.generate(inp["input_ids"], max_tokens=16, temperature=0, ignore_eos=True)) == \
            inp["greedy_new_tokens"]


@pytest.mark.parametrize("folder", FOLDERS)
def test_settings_from_each_format(exported, folder):
    """The same model from config.json and from llama.cpp's GGUF keys (and, for q/k norms and biases, the
    tensors a GGUF holds): GLM-4's rope in adjacent pairs in both, GLM-4.5's half-split."""
    with GGUFFile(exported(folder)) as f:
        meta = f.metadata
        names = set(f.tensors)
    if folder == "glm4":
        assert meta["glm4.rope.dimension_count"] == 8
        assert {"blk.0.ffn_up.weight", "blk.0.post_attention_norm.weight", "blk.0.post_ffw_norm.weight"} <= names
        assert "blk.0.ffn_gate.weight" not in names and meta["glm4.feed_forward_length"] == 128
    else:
        assert (meta["glm4moe.expert_shared_count"], meta["glm4moe.expert_gating_func"],
                meta["glm4moe.leading_dense_block_count"]) == (1, 2, 1)
        assert meta["glm4moe.expert_weights_scale"] == 2.5 and meta["glm4moe.expert_weights_norm"] is True
        assert "blk.1.post_attention_norm.weight" in names and "blk.1.ffn_norm.weight" not in names
    for path in (TINY / folder, exported(folder)):
        with llambda.load(path, backend="numpy", n_ctx=32) as m:
            c = m.config
        assert (c.rope_dim, c.head_dim, c.attn_bias) == (8, 16, True), path
        if folder == "glm4":
            assert (c.rope_neox, c.post_norms, c.qk_norm, c.n_experts) == (False, True, False, 0), path
        else:
            assert (c.rope_neox, c.post_norms, c.qk_norm, c.n_heads, c.n_layers) == (True, False, True, 6, 3), path
            assert (c.n_experts, c.n_experts_used, c.expert_ffn_dim, c.shared_ffn_dim) == (8, 2, 16, 16), path
            assert (c.moe_routing, c.moe_choice_bias, c.moe_norm_topk, c.moe_scale) == ("sigmoid_topk", True, True, 2.5)
            assert c.moe_layers == [False, True, True] and c.moe_groups == 1, path


def test_glm4s_rope_pairs_are_the_adjacent_ones(monkeypatch):
    """The control: the same checkpoint run with half-split pairs is another model."""
    from llambda.models import glm4
    with llambda.load(TINY / "glm4", backend="numpy", n_ctx=128) as m:
        assert max_err(m, "glm4") <= 1e-3
    monkeypatch.setattr(glm4, "HF_ROPE_NEOX", True)
    with llambda.load(TINY / "glm4", backend="numpy", n_ctx=128) as m:
        assert m.config.rope_neox and max_err(m, "glm4") > 0.05


# ---------------------------------------------------------------- NextN (multi-token prediction) layers

def _nextn_arrays(d: int, prefix: str, names: dict) -> dict:
    """A NextN layer's own tensors (`names`: kind -> the name after `prefix`): eh_proj (d, 2d) and norms."""
    rng = np.random.default_rng(5)
    return {prefix + name: (rng.standard_normal((d, 2 * d)) if kind == "eh_proj" else
                            1.0 + 0.1 * rng.standard_normal(d)).astype(np.float32) for kind, name in names.items()}


def test_nextn_layers_of_a_hf_checkpoint_are_skipped(tmp_path):
    """GLM-4.5's checkpoints hold num_nextn_predict_layers layers past num_hidden_layers (model.layers.N:
    a decoder layer plus eh_proj, enorm, hnorm, shared_head.norm): not run, skipped; the same layer in a
    config that names no NextN layer is refused."""
    d = tmp_path / "m"
    shutil.copytree(TINY / "glm4_moe", d)
    with SafetensorsFile(d / "model.safetensors") as st:
        arrays = {n: t.to_float32().reshape(t.shape).copy() for n, t in st.tensors.items()}
    extra = {n.replace("model.layers.2.", "model.layers.3."): a + 1.0 for n, a in arrays.items()
             if n.startswith("model.layers.2.")}
    extra.update(_nextn_arrays(64, "model.layers.3.", {"eh_proj": "eh_proj.weight", "enorm": "enorm.weight",
                                                      "hnorm": "hnorm.weight", "norm": "shared_head.norm.weight"}))
    write_safetensors(d / "model.safetensors", {**arrays, **extra})
    with llambda.load(d, backend="numpy", n_ctx=128) as m:
        assert m.config.n_layers == 3 and max_err(m, "glm4_moe") <= 1e-3
    cfg = json.loads((d / "config.json").read_text())
    cfg["num_nextn_predict_layers"] = 0
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelFormatError, match="model.layers.3"):
        llambda.load(d, backend="numpy", n_ctx=32)


def gguf_with_nextn(src: Path, out: Path, nextn_key: bool = True) -> Path:
    """Our export of glm4_moe as llama.cpp's converter writes GLM-4.5: block_count counts the NextN block,
    `nextn_predict_layers` says how many, and the block holds a decoder layer's tensors plus its nextn.*."""
    with GGUFFile(src) as f:
        meta = {k: GGUFValue(f.metadata_types[k], v) for k, v in f.metadata.items()}
        items = [(t.name, t.qtype, np.array(t.data), t.shape) for t in f.tensors.values()]
        n = f.metadata["glm4moe.block_count"]
        for t in list(f.tensors.values()):
            if t.name.startswith(f"blk.{n - 1}."):
                items.append((t.name.replace(f"blk.{n - 1}.", f"blk.{n}."), t.qtype, np.array(t.data), t.shape))
    rng = np.random.default_rng(3)
    d = meta["glm4moe.embedding_length"].value
    from llambda.formats.quants import QType
    for name, shape in (("eh_proj", (d, 2 * d)), ("enorm", (d,)), ("hnorm", (d,)), ("shared_head_norm", (d,))):
        arr = rng.standard_normal(shape).astype(np.float32)
        items.append((f"blk.{n}.nextn.{name}.weight", QType.F32, arr.view(np.uint8).reshape(-1), shape))
    meta["glm4moe.block_count"] = GGUFValue(GGUFValueType.UINT32, n + 1)
    if nextn_key:
        meta["glm4moe.nextn_predict_layers"] = GGUFValue(GGUFValueType.UINT32, 1)
    write_gguf(out, meta, items)
    return out


def test_nextn_blocks_of_a_gguf_are_skipped(exported, tmp_path):
    path = gguf_with_nextn(exported("glm4_moe"), tmp_path / "nextn.gguf")
    with GGUFFile(path) as f:
        assert f.metadata["glm4moe.block_count"] == 4 and "blk.3.nextn.eh_proj.weight" in f.tensors
    with llambda.load(path, backend="numpy", n_ctx=128) as m:
        assert m.config.n_layers == 3 and max_err(m, "glm4_moe") <= 1e-3
    # without the key, block 3 is a decoder layer and its nextn tensors belong to no model
    bare = gguf_with_nextn(exported("glm4_moe"), tmp_path / "bare.gguf", nextn_key=False)
    with pytest.raises(ModelFormatError, match="not part of the model.*nextn"):
        llambda.load(bare, backend="numpy", n_ctx=32)


def test_llama_cpp_runs_the_nextn_gguf_as_we_do(exported, tmp_path):
    """llama.cpp (an independent reader) on the file with its NextN block: it skips the block too."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the bench extra)")
    from llamacpp_ref import llama_cpp_logits
    path = gguf_with_nextn(exported("glm4_moe"), tmp_path / "nextn.gguf")
    ids = reference("glm4_moe")["inputs"][0]["input_ids"]
    theirs = llama_cpp_logits(path, ids)
    with llambda.load(path, backend="numpy", n_ctx=64) as m:
        ours = m.logits(ids)
    assert float(np.abs(ours - theirs).max()) <= 0.05


# ---------------------------------------------------------------- refusals

def _gguf_edit(src: Path, out: Path, arch: str, **keys) -> Path:
    with GGUFFile(src) as f:
        meta = {k: GGUFValue(f.metadata_types[k], v) for k, v in f.metadata.items()}
        items = [(t.name, t.qtype, np.array(t.data), t.shape) for t in f.tensors.values()]
    for k, v in keys.items():
        meta[f"{arch}.{k.replace('__', '.')}"] = GGUFValue((GGUFValueType.ARRAY, GGUFValueType.INT32), v) \
            if isinstance(v, list) else GGUFValue(GGUFValueType.UINT32, v)
    write_gguf(out, meta, items)
    return out


@pytest.mark.parametrize("folder, keys, message", [
    ("glm4_moe", {"expert_gating_func": 1}, "expert_gating_func"),
    ("glm4_moe", {"nextn_predict_layers": 3}, "nextn_predict_layers"),
    ("glm4_moe", {"rope__dimension_sections": [4, 2, 2, 0]}, "M-RoPE"),
    # a glm4 file with sections is GLM-4.1V's text model (models/glm4v.py): these do not fit its rotary
    ("glm4", {"rope__dimension_sections": [4, 2, 2, 0]}, "rope sections .* sum to"),
])
def test_bad_gguf_settings_are_model_format_errors(exported, tmp_path, folder, keys, message):
    arch = {"glm4": "glm4", "glm4_moe": "glm4moe"}[folder]
    with pytest.raises(ModelFormatError, match=message):
        llambda.load(_gguf_edit(exported(folder), tmp_path / "bad.gguf", arch, **keys), backend="numpy", n_ctx=32)


@pytest.mark.parametrize("folder, edit, message", [
    ("glm4", lambda c: c["rope_parameters"].update(partial_rotary_factor=0), "partial_rotary_factor"),
    ("glm4", lambda c: c.update(hidden_act="gelu"), "hidden_act"),
    ("glm4_moe", lambda c: c.update(n_group=3), "groups"),
    ("glm4_moe", lambda c: c.update(num_nextn_predict_layers=-1), "num_nextn_predict_layers"),
    ("glm4_moe", lambda c: c.update(use_qk_norm="yes"), "use_qk_norm"),
    ("glm4_moe", lambda c: c.update(quantization_config={"quant_method": "fp8"}), "fp8"),    # GLM-4.5-FP8
])
def test_bad_configs_are_model_format_errors(tmp_path, folder, edit, message):
    d = tmp_path / "m"
    shutil.copytree(TINY / folder, d)
    cfg = json.loads((d / "config.json").read_text())
    edit(cfg)
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelFormatError, match=message):
        llambda.load(d, backend="numpy", n_ctx=32)


def test_export_refuses_what_it_cannot_write(tmp_path):
    with pytest.raises(LlambdaError, match="GGUF only"):
        export(TINY / "glm4", tmp_path / "hf", fmt="hf")
    with pytest.raises(LlambdaError, match="GGUF only"):
        export(TINY / "glm4_moe", tmp_path / "hf2", fmt="hf")
    d = tmp_path / "grouped"       # llama.cpp's glm4moe has no expert groups
    shutil.copytree(TINY / "glm4_moe", d)
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(n_group=2, topk_group=1)
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelFormatError, match="groups"):
        export(d, tmp_path / "g.gguf", fmt="gguf")


# ---------------------------------------------------------------- chat: GLM-4.5's thinking

# A template of GLM-4.5's shape, written here (not GLM's text): roles as <|user|> / <|assistant|> markers,
# an earlier turn's thought as "\n<think>...</think>", and `enable_thinking` false closing an empty thought
# after the generation prompt (and "/nothink" after the user's text).
GLM_LIKE_TEMPLATE = (
    "[gMASK]<sop>{% for m in messages %}{% if m.role == 'user' %}<|user|>{{ m.content }}"
    "{% if enable_thinking is defined and not enable_thinking %}/nothink{% endif %}"
    "{% elif m.role == 'assistant' %}<|assistant|>\n<think>{{ m.reasoning_content or '' }}</think>\n{{ m.content }}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|assistant|>"
    "{{ '\n<think></think>' if enable_thinking is defined and not enable_thinking else '' }}{% endif %}")


def test_a_glm45_style_template_gets_its_thought_split():
    """The server's reasoning split is chosen by the template (it writes <think>), not by the family: a
    GLM-4.5 reply, "\\n<think>...</think>\\nanswer" after "<|assistant|>", splits as Qwen3's does, and
    enable_thinking false closes the thought in the prompt."""
    from llambda.chat import ChatTemplate
    from llambda.server.think import ThinkParser
    from llambda.thinking import prompt_thought, template_thinks
    t = ChatTemplate(GLM_LIKE_TEMPLATE)
    assert template_thinks(GLM_LIKE_TEMPLATE)
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello.", "reasoning_content": "greet"},
            {"role": "user", "content": "Capital of France?"}]
    thinking = t.render(msgs)
    assert thinking.endswith("<|user|>Capital of France?<|assistant|>")
    assert prompt_thought(True, thinking).may_come and not prompt_thought(True, thinking).opened
    quiet = t.render(msgs, enable_thinking=False)
    assert quiet.endswith("/nothink<|assistant|>\n<think></think>") and not prompt_thought(True, quiet).may_come
    p = ThinkParser()
    content = p.feed("\n<think>Paris is the capital.</think>\nParis.")[0] + p.finish()[0]
    assert (content.strip(), p.take_reasoning()) == ("Paris.", "Paris is the capital.")


@pytest.mark.parametrize("pre", ["glm4", "chatglm-bpe"])
def test_a_glm_vocabulary_adds_no_bos(pre):
    """llama.cpp drops the BOS of a `glm4` / `chatglm-bpe` vocabulary, whatever add_bos_token says: GLM's
    templates start the prompt with [gMASK]<sop> themselves. The same vocabulary under another
    pre-tokenizer name adds the BOS it is told to."""
    from llambda.tokenizer import Tokenizer
    from test_tokenizer import _tiny_bpe_meta
    glm = Tokenizer.from_gguf_metadata(_tiny_bpe_meta(**{"tokenizer.ggml.pre": pre, "tokenizer.ggml.add_bos_token": True}))
    other = Tokenizer.from_gguf_metadata(_tiny_bpe_meta(**{"tokenizer.ggml.pre": "llama-bpe",
                                                            "tokenizer.ggml.add_bos_token": True}))
    assert glm.encode("hello", add_bos=True) == glm.encode("hello") == [259]
    assert other.encode("hello", add_bos=True) == [262, 259]


@pytest.mark.parametrize("folder", FOLDERS)
def test_quantized_native_matches_numpy(folder):
    """Q8_0 weights (quantized at load), so the quantized kernels run the GLM branches (adjacent-pair partial
    RoPE under sandwich norms; biased, q/k-normed attention and sigmoid routing) against the NumPy oracle on
    the same weights: exact mode within the float budget, fast mode's 8-bit activations within 1 (measured:
    0.32 on glm4, 0.80 on glm4_moe, where they flip close expert choices)."""
    from test_tiny_models import native_vs_numpy
    errs = native_vs_numpy(folder, "q8_0")
    assert errs["f32"] <= 1e-3 and errs["q8"] <= 1.0, (folder, errs)


def test_quantize_of_a_gguf_with_nextn_writes_the_decoder_only(exported, tmp_path):
    """`llambda quantize` of a GLM-4.5 GGUF as llama.cpp's converter writes it: the output holds the decoder's
    blocks (block_count 3, no nextn key, no block 3), runs as the source does, and llama.cpp reads it."""
    from llambda.cli import main
    src = gguf_with_nextn(exported("glm4_moe"), tmp_path / "nextn.gguf")
    out = tmp_path / "q8.gguf"
    assert main(["quantize", str(src), str(out), "q8_0"]) == 0
    with GGUFFile(out) as f:
        assert f.metadata["glm4moe.block_count"] == 3 and "glm4moe.nextn_predict_layers" not in f.metadata
        assert not [n for n in f.tensors if n.startswith("blk.3.")]
    ids = reference("glm4_moe")["inputs"][0]["input_ids"]
    with llambda.load(src, backend="numpy", n_ctx=64) as a, llambda.load(out, backend="numpy", n_ctx=64) as b:
        assert float(np.abs(a.logits(ids) - b.logits(ids)).max()) <= 0.5     # Q8_0 weights on a sensitive model
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return                  # the llama.cpp half needs llama-cpp-python (the bench extra)
    from llamacpp_ref import llama_cpp_logits
    with llambda.load(out, backend="numpy", n_ctx=64) as b:
        assert float(np.abs(b.logits(ids) - llama_cpp_logits(out, ids)).max()) <= 0.75
