"""A GGUF file as a model: the architecture's config from metadata, tensors, tokenizer, chat template."""
from __future__ import annotations

from pathlib import Path

from ..errors import ModelFormatError, TokenizerError
from ..models import ARCHITECTURES, ENCODERS, arch_module, encoder_module
from ..tokenizer import Tokenizer
from .experts import ExpertStacks
from .gguf import GGUFFile
from .source import ModelSource
from .weights import WeightTensor


def biases_from_tensors(cfg, names) -> None:
    """q/k/v biases wherever the file holds them (no metadata key says so): llama.cpp reads them so, in its
    llama architecture too, and a file's biases left out would be another model. Likewise what a family's
    `gguf_flags(cfg, names)` reads from the tensors (glm4moe's q/k norms)."""
    if any(n.endswith("attn_q.bias") for n in names):
        cfg.attn_bias = True
    flags = getattr(arch_module(cfg.arch), "gguf_flags", None) if cfg.arch in ARCHITECTURES else None
    if flags is not None:
        flags(cfg, names)


# A multimodal file's vision tower and projector (Ollama's gemma3 files hold them beside the decoder): never a
# decoder's tensors in llama.cpp's names; llambda.vision reads them (not the decoder's loader, nor its checks).
TOWER_PREFIXES = ("v.", "mm.")


def _decoder_tensors(module, meta: dict, n_layers: int, names: list) -> list:
    """The file's tensors less the blocks a family's `gguf_extra_layers(meta)` says follow the decoder's
    n_layers (glm4moe's NextN layers, not run here)."""
    extra = getattr(module, "gguf_extra_layers", None)
    if extra is None or not extra(meta):
        return names
    def past(name: str) -> bool:
        block = name.split(".", 2)[1] if name.startswith("blk.") and name.count(".") >= 2 else ""
        return block.isdigit() and (len(block) > 9 or int(block) >= n_layers)
    return [n for n in names if not past(n)]


def open_gguf(path: Path) -> ModelSource:
    f = GGUFFile(path)
    try:
        meta = f.metadata
        arch = meta.get("general.architecture")
        if not isinstance(arch, str):
            raise ModelFormatError("GGUF metadata lacks 'general.architecture'")
        infos = f.tensors
        if f"{arch}.pooling_type" in meta and arch not in ENCODERS:
            # Ollama's embedding files (its embeddinggemma: a `gemma3` file with a pooling type and `dense.N`
            # tensors) would otherwise run as the decoder they are not
            raise ModelFormatError(f"GGUF {arch!r} with '{arch}.pooling_type' is an embedding model in a layout not "
                                   f"supported here (llama.cpp's converter writes EmbeddingGemma as "
                                   f"'gemma-embedding', which loads)")
        module = None if arch in ENCODERS else arch_module(arch, "config_from_gguf")
        # an architecture whose llama.cpp files name a tensor otherwise (canonical leaf or global name -> file's)
        renamed = getattr(module, "GGUF_NAMES", {})
        # names the file uses for other canonical tensors: not these canonical tensors too (a qwen3next
        # file's post_attention_norm is the canonical ffn_norm, no post-attention norm of Gemma's kind)
        taken = set(renamed.values()) - set(renamed)

        def file_name(name: str) -> str:
            """The name the file gives canonical tensor `name` (it may hold none by that name; "": none)."""
            if name.startswith("blk."):
                _, i, leaf = name.split(".", 2)
                if leaf in taken:
                    return ""
                name = f"blk.{i}.{renamed.get(leaf, leaf)}"
            elif name in taken:
                return ""
            else:
                name = renamed.get(name, name)
            if name not in infos and name.endswith(".weight") and name[:-len(".weight")] in infos:
                name = name[:-len(".weight")]    # a converter may write a parameter without the suffix
            return name

        def expert_names(name: str) -> list[str]:
            """Older Mixtral GGUFs hold one tensor per expert (`blk.N.ffn_gate.E.weight`) for `*_exps.weight`."""
            if not name.endswith("_exps.weight"):
                return []
            base, parts = name[:-len("_exps.weight")], []
            while f"{base}.{len(parts)}.weight" in infos:
                parts.append(f"{base}.{len(parts)}.weight")
            return parts

        def holders(name: str) -> list[str]:
            """The file's tensors canonical `name` is read from."""
            own = file_name(name)
            return [own] if own in infos else expert_names(own)

        def tensor(name: str) -> WeightTensor | None:
            name = file_name(name)
            t = infos.get(name)
            if t is None:
                return per_expert(name)
            return WeightTensor(name, t.qtype, tuple(int(s) for s in t.shape), f.view(t.data))

        def per_expert(name: str) -> WeightTensor | None:
            """The per-expert tensors of `name` (expert_names), stacked."""
            parts = [tensor(n) for n in expert_names(name)]
            if not parts:
                return None
            stacks = ExpertStacks()
            for e, p in enumerate(parts):
                stacks.add(name, e, p.name, p)
            return stacks.stacked()[name]

        names = list(infos)
        if arch in ENCODERS:        # an encoder reads its tensors by their HF names
            enc = encoder_module(arch)
            cfg = enc.config_from_gguf(meta)
            tensor, names = enc.gguf_tensors(tensor, names)
        else:
            cfg = module.config_from_gguf(meta)
            names = _decoder_tensors(module, meta, cfg.n_layers, [n for n in names if not n.startswith(TOWER_PREFIXES)])
            biases_from_tensors(cfg, names)
            if hasattr(module, "gguf_lookup"):      # canonical tensors a family's newer files split (DeepSeek's kv_b)
                tensor, split_holders = module.gguf_lookup(tensor, cfg)
                plain_holders = holders
                holders = lambda name: [h for part in split_holders(name) for h in plain_holders(part)]  # noqa: E731

        tok, tok_err = None, None
        try:
            tok = Tokenizer.from_gguf_metadata(meta)
        except TokenizerError as e:
            tok_err = str(e)
        template = meta.get("tokenizer.chat_template")
        name = meta.get("general.name")
        name = name if isinstance(name, str) and name else path.stem
        return ModelSource(path, "gguf", cfg, tensor, meta, tok, tok_err, template if isinstance(template, str) else None,
                           str(name), [f.close], names, [f.release], [f], None if arch in ENCODERS else holders)
    except BaseException:
        f.close()
        raise
