"""A GGUF file as a model: the architecture's config from metadata, tensors, tokenizer, chat template."""
from __future__ import annotations

from pathlib import Path

from ..errors import ModelFormatError, TokenizerError
from ..models import ENCODERS, arch_module, encoder_module
from ..tokenizer import Tokenizer
from .experts import ExpertStacks
from .gguf import GGUFFile
from .source import ModelSource
from .weights import WeightTensor


def open_gguf(path: Path) -> ModelSource:
    f = GGUFFile(path)
    try:
        meta = f.metadata
        arch = meta.get("general.architecture")
        if not isinstance(arch, str):
            raise ModelFormatError("GGUF metadata lacks 'general.architecture'")
        infos = f.tensors
        module = None if arch in ENCODERS else arch_module(arch, "config_from_gguf")
        # an architecture whose llama.cpp files name a tensor otherwise (canonical leaf or global name -> file's)
        renamed = getattr(module, "GGUF_NAMES", {})

        def tensor(name: str) -> WeightTensor | None:
            if name.startswith("blk."):
                _, i, leaf = name.split(".", 2)
                name = f"blk.{i}.{renamed.get(leaf, leaf)}"
            else:
                name = renamed.get(name, name)
            t = infos.get(name)
            if t is None and name.endswith(".weight"):
                t = infos.get(name[:-len(".weight")])    # a converter may write a parameter without the suffix
            if t is None:
                return per_expert(name)
            return WeightTensor(name, t.qtype, tuple(int(s) for s in t.shape), f.view(t.data))

        def per_expert(name: str) -> WeightTensor | None:
            """Older Mixtral GGUFs hold one tensor per expert (`blk.N.ffn_gate.E.weight`): stacked."""
            if not name.endswith("_exps.weight"):
                return None
            base = name[:-len("_exps.weight")]
            parts = []
            while f"{base}.{len(parts)}.weight" in infos:
                parts.append(tensor(f"{base}.{len(parts)}.weight"))
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

        tok, tok_err = None, None
        try:
            tok = Tokenizer.from_gguf_metadata(meta)
        except TokenizerError as e:
            tok_err = str(e)
        template = meta.get("tokenizer.chat_template")
        name = meta.get("general.name")
        name = name if isinstance(name, str) and name else path.stem
        return ModelSource(path, "gguf", cfg, tensor, meta, tok, tok_err, template if isinstance(template, str) else None,
                           str(name), [f.close], names, [f.release], [f])
    except BaseException:
        f.close()
        raise
