"""A Hugging Face model directory: config.json + *.safetensors (+ tokenizer files).

Tensors are renamed to the engine's canonical (GGUF) names. HF checkpoints keep
q/k rows in the half-split RoPE layout, so every config built here has
rope_neox=True and no rows are permuted. Fused Phi-3 tensors keep GGUF's fused
names (`attn_qkv`, a double-height `ffn_up`); the model loader splits them.
"""
from __future__ import annotations

import re
from pathlib import Path

from ..errors import ModelFormatError, TokenizerError
from .source import ModelSource
from ..models import arch_module
from .files import read_json, read_small
from .experts import GPT_OSS_FUSED, GPT_OSS_LEAVES, GPT_OSS_MXFP4, ExpertStacks, split_gpt_oss, split_gpt_oss_mxfp4
from .weights import ByteTensor
from .safetensors import open_safetensors_dir

# top-level HF name -> canonical name
GLOBAL_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}

# per-layer HF suffix -> canonical suffix, shared by every family
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "self_attn.qkv_proj.weight": "attn_qkv.weight",      # Phi-3: q, k, v rows
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.gate_up_proj.weight": "ffn_up.weight",          # Phi-3: gate rows then up rows, as GGUF stores it
    "mlp.down_proj.weight": "ffn_down.weight",
    # mixture of experts: the router, the shared expert and its gate (experts: EXPERT_RE)
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "block_sparse_moe.gate.weight": "ffn_gate_inp.weight",       # Mixtral
    "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
    "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
    # GPT-OSS: the output bias, the sinks, the router with its bias (its experts: experts.split_gpt_oss)
    "self_attn.o_proj.bias": "attn_output.bias",
    "self_attn.sinks": "attn_sinks.weight",
    "mlp.router.weight": "ffn_gate_inp.weight",
    "mlp.router.bias": "ffn_gate_inp.bias",
}

# One expert's matrix (the Hub layout: a tensor per expert), stacked at load into GGUF's
# 3-D `ffn_{gate,up,down}_exps` (formats/experts.py). Mixtral: w1 gate, w3 up, w2 down.
EXPERT_RE = re.compile(r"(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj|w1|w2|w3)\.weight")
EXPERT_PART = {"gate_proj": "gate", "w1": "gate", "up_proj": "up", "w3": "up", "down_proj": "down", "w2": "down"}

# The norm after attention means different things: in the Llama family it is the
# norm *before* the MLP; in Gemma (post_norms) a real post-attention norm.
PRE_FFN_ONLY = {"post_attention_layernorm.weight": "ffn_norm.weight"}
SANDWICH = {
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
}

# Prefixes of multimodal checkpoints whose text decoder we run (transformers 5 and 4 layouts).
_TEXT_PREFIXES = (("model.language_model.", "model."), ("language_model.model.", "model."),
                  ("language_model.lm_head.", "lm_head."), ("model.text_model.", "model."))    # the last: Idefics3's
_LAYER_RE = re.compile(r"model\.layers\.(\d+)\.(.+)")
_CLASS_SUFFIXES = ("ForCausalLM", "ForConditionalGeneration", "Model")


def layer_names(post_norms: bool) -> dict[str, str]:
    """HF per-layer suffix -> canonical suffix for a model with or without Gemma's sandwich norms."""
    return {**LAYER_NAMES, **(SANDWICH if post_norms else PRE_FFN_ONLY)}


def arch_name(cfg: dict) -> str:
    """The registry key of a config.json: `model_type`, else the class in `architectures`."""
    from ..models import ARCHITECTURES
    mt = cfg.get("model_type")
    if isinstance(mt, str) and mt in ARCHITECTURES:
        return mt
    classes = cfg.get("architectures")
    for cls in classes if isinstance(classes, list) else []:
        if isinstance(cls, str):
            base = cls
            for suf in _CLASS_SUFFIXES:
                if base.endswith(suf):
                    base = base[:-len(suf)]
                    break
            if base.lower() in ARCHITECTURES:
                return base.lower()
    if isinstance(mt, str):
        return mt          # arch_module names the unsupported type
    raise ModelFormatError("config.json has neither 'model_type' nor a known class in 'architectures'")


def text_config(cfg: dict) -> dict:
    """The decoder's config: multimodal checkpoints nest it under `text_config` (their vision_config put beside
    it: Qwen3-VL's DeepStack levels are the text model's too)."""
    inner = cfg.get("text_config", cfg.get("llm_config"))      # llm_config: OpenGVLab's InternVLChatModel
    if isinstance(inner, dict) and "hidden_size" in inner:
        merged = dict(inner)
        for key in ("tie_word_embeddings", "torch_dtype", "dtype", "vision_config"):
            if key not in merged and key in cfg:
                merged[key] = cfg[key]
        return merged
    return cfg


def _prefixes(arch: str) -> tuple:
    """A family's (its HF prefix, the shared one) pairs: GPT-NeoX's `gpt_neox.layers.` for `model.layers.`."""
    from ..models import ARCHITECTURES
    return getattr(arch_module(arch), "HF_PREFIXES", ()) if arch in ARCHITECTURES else ()


def _shared_prefix(name: str, prefixes: tuple) -> str:
    for own, shared in prefixes:
        if name.startswith(own):
            return shared + name[len(own):]
    return name


def name_tables(post_norms: bool, arch: str = "") -> tuple[dict[str, str], dict[str, str]]:
    """(per-layer HF suffix -> canonical suffix, top-level HF name -> canonical name) of a family: its own
    names (LFM2's) over the shared ones."""
    per_layer = layer_names(post_norms)
    from ..models import ARCHITECTURES
    module = arch_module(arch) if arch in ARCHITECTURES else None
    per_layer.update(getattr(module, "HF_LAYER_NAMES", {}))
    return per_layer, {**GLOBAL_NAMES, **getattr(module, "HF_GLOBAL_NAMES", {})}


def text_name(name: str) -> str:
    """A multimodal checkpoint's text-decoder name as a plain decoder's (`model.language_model.` -> `model.`)."""
    for old, new in _TEXT_PREFIXES:
        if name.startswith(old):
            return new + name[len(old):]
    return name


def _layer_number(digits: str) -> int | None:
    """The number of a `model.layers.N.` name; None for one of more than 9 digits past its zeros, which
    no model has (int() of thousands of digits was a raw ValueError: Python's digit limit)."""
    digits = digits.lstrip("0") or "0"
    return int(digits) if len(digits) <= 9 else None


def canonical_name(name: str, n_layers: int, post_norms: bool, arch: str = "") -> str | None:
    """The canonical name of one plain HF tensor name (a layer's or a top-level one), None where it has
    none here (an expert's, an unknown or out-of-range layer tensor, a vision tower's)."""
    per_layer, global_names = name_tables(post_norms, arch)
    name = _shared_prefix(text_name(name), _prefixes(arch))
    if name in global_names:
        return global_names[name]
    m = _LAYER_RE.fullmatch(name)
    i = _layer_number(m.group(1)) if m else None
    if i is None or i >= n_layers or m.group(2) not in per_layer:
        return None
    return f"blk.{i}.{per_layer[m.group(2)]}"


def hf_names(canon: str, post_norms: bool, arch: str = "") -> list[str]:
    """The HF names that would have provided canonical name `canon` (errors name these: a HF user knows
    them, not GGUF's), an expert's with N for its number; [] where none would."""
    per_layer, global_names = name_tables(post_norms, arch)
    names = [hf for hf, c in global_names.items() if c == canon]
    m = re.fullmatch(r"blk\.(\d+)\.(.+)", canon)
    if m:
        layer, leaf = f"model.layers.{m.group(1)}.", m.group(2)
        names += [layer + hf for hf, c in per_layer.items() if c == leaf]
        part = re.fullmatch(r"attn_[qkv]\.(weight|bias)", leaf)
        if part:        # q, k and v are read from a fused qkv where a family's checkpoint has one (GPT-2's c_attn)
            names += [layer + hf for hf, c in per_layer.items() if c == f"attn_qkv.{part.group(1)}"]
        if arch == "gpt_oss":
            names += [layer + hf for hf, leaves in GPT_OSS_LEAVES.items() if leaf in leaves]
        # the per-expert layouts checkpoints use: Mixtral's w1/w2/w3 under block_sparse_moe
        names += [f"{layer}{'block_sparse_moe' if k[0] == 'w' else 'mlp'}.experts.N.{k}.weight"
                  for k, part in EXPERT_PART.items() if leaf == f"ffn_{part}_exps.weight"]
    back = [(shared, own) for own, shared in _prefixes(arch)]
    return [_shared_prefix(n, back) for n in names]


def canonical_tensors(hf_tensors: dict, n_layers: int, post_norms: bool, arch: str = "", extra_layers: int = 0,
                      split=None) -> dict:
    """HF name -> WeightTensor  =>  canonical name -> WeightTensor.

    `split(suffix, t, name)`, a family's `hf_splitter(config)`, turns a fused layer tensor into
    [(canonical leaf, expert or None, part)] (Granite's experts), None for a tensor it leaves alone.

    Decoder-layer tensors we do not know are an error (running without them would be
    silently wrong); other unknown top-level tensors (vision towers, rotary caches) are skipped, and so are
    the `extra_layers` layers past the decoder's (DeepSeek-V3's multi-token-prediction layers).
    """
    per_layer, global_names = name_tables(post_norms, arch)
    prefixes = _prefixes(arch)
    out, experts, mxfp4 = {}, ExpertStacks(), {}

    def put(canon: str, t, name: str) -> None:
        # two of the file's tensors under one name (a multimodal prefix and the plain one, a fused
        # and a split layout): whichever came last won
        if canon in out:
            raise ModelFormatError(f"tensor {name!r}: a second tensor maps to {canon!r}")
        out[canon] = t

    for name, t in hf_tensors.items():
        name = text_name(name)
        if name in global_names:
            put(global_names[name], t, name)
            continue
        m = _LAYER_RE.fullmatch(_shared_prefix(name, prefixes))
        if not m:
            continue
        i, suffix = _layer_number(m.group(1)), m.group(2)
        if i is None:
            raise ModelFormatError(f"tensor {name[:120]!r}: a layer number of {len(m.group(1))} digits, past any model's")
        if n_layers <= i < n_layers + extra_layers:
            continue
        if suffix.endswith("rotary_emb.inv_freq"):
            continue      # a cache some old checkpoints saved; we compute our own
        part = suffix.rsplit("_", 1)
        if arch == "gpt_oss" and part[0] in GPT_OSS_MXFP4 and part[-1] in ("blocks", "scales") and i < n_layers:
            mxfp4.setdefault((i, part[0]), {})[part[1]] = (name, t)
            continue
        if isinstance(t, ByteTensor):
            raise ModelFormatError(f"tensor {name!r}: U8 data is read only as GPT-OSS MXFP4 expert blocks/scales")
        if arch == "gpt_oss" and suffix in GPT_OSS_FUSED and i < n_layers:
            for leaf, part in split_gpt_oss(suffix, t, name).items():
                put(f"blk.{i}.{leaf}", part, name)
            continue
        parts = split(suffix, t, name) if split is not None and i < n_layers else None
        if parts is not None:
            for leaf, e, part in parts:
                if e is None:
                    put(f"blk.{i}.{leaf}", part, name)
                else:
                    experts.add(f"blk.{i}.{leaf}", e, name, part)
            continue
        em = EXPERT_RE.fullmatch(suffix)
        if em and i < n_layers:
            experts.add(f"blk.{i}.ffn_{EXPERT_PART[em.group(2)]}_exps.weight", int(em.group(1)), name, t)
            continue
        if suffix not in per_layer:
            raise ModelFormatError(f"tensor {name!r} is not supported (unknown layer tensor)")
        if i >= n_layers:
            raise ModelFormatError(f"tensor {name!r}: layer {i} but the config has {n_layers} layers")
        put(f"blk.{i}.{per_layer[suffix]}", t, name)
    for (i, base), got in mxfp4.items():
        if set(got) != {"blocks", "scales"}:
            have = next(iter(got.values()))[0]
            raise ModelFormatError(f"tensor {have!r} has no {'scales' if 'blocks' in got else 'blocks'} partner")
        names = (got["blocks"][0], got["scales"][0])
        for leaf, t in split_gpt_oss_mxfp4(base, got["blocks"][1], got["scales"][1], names).items():
            if f"blk.{i}.{leaf}" in out:
                raise ModelFormatError(f"tensor {names[0]!r}: layer {i} also has float {base!r} weights")
            out[f"blk.{i}.{leaf}"] = t
    for canon, t in experts.stacked().items():
        put(canon, t, t.parts[0].name)     # the first expert's own name
    return out


def _chat_template(path: Path, tok_cfg: dict | None) -> str | None:
    tmpl = tok_cfg.get("chat_template") if isinstance(tok_cfg, dict) else None
    if isinstance(tmpl, list):      # [{"name": "default", "template": ...}, ...]
        named = {d.get("name"): d.get("template") for d in tmpl if isinstance(d, dict)}
        tmpl = named.get("default") or next((t for t in named.values() if isinstance(t, str)), None)
    if isinstance(tmpl, str) and tmpl:
        return tmpl
    jinja = path / "chat_template.jinja"
    if jinja.is_file():
        raw = read_small(jinja, "chat template")
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:     # was a raw UnicodeDecodeError out of load()
            raise ModelFormatError(f"{jinja}: chat template is not valid UTF-8 ({e.reason} at byte {e.start})") from None
    cj = path / "chat_template.json"
    if cj.is_file():
        t = read_json(cj, "chat_template.json")
        if isinstance(t, dict) and isinstance(t.get("chat_template"), str):
            return t["chat_template"]
    return None


def _tokenizer(path: Path):
    if not (path / "tokenizer.json").is_file():
        return None, f"{path} has no tokenizer.json"
    try:
        from ..tokenizer import Tokenizer
        return Tokenizer.from_hf_dir(path), None
    except ImportError as e:
        return None, f"the tokenizer module is unavailable ({e})"
    except TokenizerError as e:
        return None, str(e)


def open_hf_dir(path: Path) -> ModelSource:
    path = Path(path)
    cfg_path = path / "config.json"
    if not cfg_path.exists():
        raise ModelFormatError(f"{path}: a Hugging Face model directory needs config.json")
    raw_cfg = read_json(cfg_path, "config.json")
    if not isinstance(raw_cfg, dict):
        raise ModelFormatError(f"{cfg_path}: must hold a JSON object")
    cfg_dict = text_config(raw_cfg)
    if _is_encoder(raw_cfg):
        return _open_encoder_dir(path, raw_cfg)
    arch = arch_name(cfg_dict if "model_type" in cfg_dict else raw_cfg)
    module = arch_module(arch, "config_from_hf")
    config = module.config_from_hf(cfg_dict)
    if getattr(module, "HF_ROPE_NEOX", True):
        config.rope_neox = True       # HF q/k rows are in the half-split layout (DeepSeek's are its own)

    st = open_safetensors_dir(path)
    try:
        extra = getattr(module, "hf_extra_layers", lambda c: 0)(cfg_dict)
        splitter = getattr(module, "hf_splitter", None)
        tensors = canonical_tensors(st.tensors, config.n_layers, config.post_norms, config.arch, extra,
                                    split=splitter(config) if splitter else None)
        if "token_embd.weight" not in tensors:
            raise ModelFormatError(f"{path}: no embedding tensor (model.embed_tokens.weight)")
        if config.tie_embeddings:
            tensors.pop("output.weight", None)   # transformers ties: the embedding is the head
        elif "output.weight" not in tensors:
            if cfg_dict.get("tie_word_embeddings") is False:
                # an untied head the config names and the checkpoint lacks: the embedding is another model
                raise ModelFormatError(f"{path}: config.json says tie_word_embeddings false, but the checkpoint "
                                       "holds no lm_head.weight")
            config.tie_embeddings = True         # no lm_head stored and no word against tying: tied
        if any(n.endswith("attn_q.bias") for n in tensors):
            config.attn_bias = True
        if all(f"blk.{i}.attn_output.bias" in tensors for i in range(config.n_layers)):
            config.attn_out_bias = True          # transformers' Llama family: o_proj has attention_bias too
        if any(n.endswith("attn_sinks.weight") for n in tensors):
            config.attn_sinks = True
        fold = getattr(module, "hf_tensors", None)     # a family's tensors as its GGUF holds them (Falcon-H1's
        if fold is not None:                            # multipliers folded in)
            tensors = fold(cfg_dict, config, tensors)
        tok, tok_err = _tokenizer(path)
        tok_cfg_path = path / "tokenizer_config.json"
        tok_cfg = read_json(tok_cfg_path, "tokenizer_config.json") if tok_cfg_path.is_file() else None
        gen_path = path / "generation_config.json"
        gen_cfg = read_json(gen_path, "generation_config.json") if gen_path.is_file() else {}
        name = raw_cfg.get("_name_or_path") or path.name
        meta = {"hf.config": raw_cfg, "hf.generation_config": gen_cfg, "hf.tokenizer_config": tok_cfg}
        return ModelSource(path, "hf", config, tensors.get, meta, tok, tok_err, _chat_template(path, tok_cfg),
                           str(name), [st.close], list(tensors), [st.release], [st], lambda name: [name],
                           lambda canon: hf_names(canon, config.post_norms, config.arch))
    except BaseException:
        st.close()
        raise


def _is_encoder(cfg: dict) -> bool:
    from ..models import ENCODERS
    classes = cfg.get("architectures") if isinstance(cfg.get("architectures"), list) else []
    mt = cfg.get("model_type")
    return (isinstance(mt, str) and mt in ENCODERS) or _embedding_gemma(cfg) or any(
        isinstance(c, str) and c.startswith("Bert") for c in classes)


def _embedding_gemma(cfg: dict) -> bool:
    """EmbeddingGemma: a Gemma 3 text model made bidirectional (models/embeddinggemma.py)."""
    return cfg.get("model_type") == "gemma3_text" and cfg.get("use_bidirectional_attention") is True


def _st_dense(path: Path) -> list[tuple[dict, Path]]:
    """sentence-transformers' Dense modules after the transformer, in modules.json's order: (config, folder).
    A module's folder lies inside the model's, a symlinked one too (its files may be links, as a hub cache's are);
    a modules.json that is not a list of modules is refused (sentence-transformers cannot read it either, and
    skipping it would embed without the Dense layers)."""
    f = path / "modules.json"
    mods = read_json(f, "modules.json") if f.is_file() else []
    if not isinstance(mods, list) or not all(isinstance(m, dict) and isinstance(m.get("type"), str) for m in mods):
        raise ModelFormatError(f"{f}: not a list of modules, each with its 'type' string")
    out = []
    for m in mods:
        if m["type"].endswith(".Dense"):
            rel = m.get("path")
            inside = isinstance(rel, str) and rel and not Path(rel).is_absolute() and ".." not in Path(rel).parts
            folder = path / rel if inside else None       # (a module's folder is inside the model's)
            try:
                if folder is not None and not folder.resolve().is_relative_to(path.resolve()):
                    folder = None                          # a symlink out of the model's folder
            except (OSError, RuntimeError, ValueError):    # a link loop, a name the file system refuses
                folder = None
            if folder is None or not (folder / "config.json").is_file():
                raise ModelFormatError(f"modules.json: Dense module {m.get('path')!r} has no config.json inside "
                                       f"the model's folder")
            cfg = read_json(folder / "config.json", f"{rel}/config.json")
            out.append((cfg if isinstance(cfg, dict) else {}, folder))
    return out


def _open_encoder_dir(path: Path, raw_cfg: dict) -> ModelSource:
    """A BERT-family encoder: its own config (models/bert.py), tensors under their HF names, and
    sentence-transformers' pooling and max_seq_length where the directory has them."""
    from ..models import ENCODERS, encoder_module
    extra = {}
    for key, rel in (("pooling", "1_Pooling/config.json"), ("st_config", "sentence_bert_config.json")):
        f = path / rel
        data = read_json(f, rel) if f.is_file() else None
        extra[key] = data if isinstance(data, dict) else None
    mt = raw_cfg.get("model_type")
    arch = mt if isinstance(mt, str) and mt in ENCODERS else "gemma-embedding" if _embedding_gemma(raw_cfg) else "bert"
    module = encoder_module(arch)
    dense = _st_dense(path) if getattr(module, "ST_DENSE", False) else []
    if dense:
        extra["dense"] = [c for c, _ in dense]
    config = module.config_from_hf(raw_cfg, **extra)
    st = open_safetensors_dir(path)
    parts = []
    try:
        for k, (_, folder) in enumerate(dense):     # each module's `linear.weight` as `st_dense.K.weight`
            parts.append(open_safetensors_dir(folder))
            t = parts[-1].tensors.get("linear.weight")
            if t is None:
                raise ModelFormatError(f"{folder.name}/model.safetensors lacks 'linear.weight'")
            st.tensors[f"st_dense.{k}.weight"] = t
        tok, tok_err = _tokenizer(path)
        name = raw_cfg.get("_name_or_path") or path.name
        meta = {"hf.config": raw_cfg, **{f"st.{k}": v for k, v in extra.items()}}
        return ModelSource(path, "hf", config, st.get, meta, tok, tok_err, None, str(name),
                           [st.close, *(p.close for p in parts)], list(st.tensors),
                           [st.release, *(p.release for p in parts)])
    except BaseException:
        st.close()
        for p in parts:
            p.close()
        raise
