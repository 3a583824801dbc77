"""A GGUF file as a model: the architecture's config from metadata, tensors, tokenizer, chat template."""
from __future__ import annotations

from pathlib import Path

from ..errors import ModelFormatError, TokenizerError
from ..models import ENCODERS, arch_module, encoder_module
from ..tokenizer import Tokenizer
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

        def tensor(name: str) -> WeightTensor | None:
            t = infos.get(name)
            if t is None:
                return None
            return WeightTensor(name, t.qtype, tuple(int(s) for s in t.shape), t.data)

        names = list(infos)
        if arch in ENCODERS:        # an encoder reads its tensors by their HF names
            enc = encoder_module(arch)
            cfg = enc.config_from_gguf(meta)
            tensor, names = enc.gguf_tensors(tensor, names)
        else:
            cfg = arch_module(arch, "config_from_gguf").config_from_gguf(meta)

        tok, tok_err = None, None
        try:
            tok = Tokenizer.from_gguf_metadata(meta)
        except TokenizerError as e:
            tok_err = str(e)
        template = meta.get("tokenizer.chat_template")
        name = meta.get("general.name")
        name = name if isinstance(name, str) and name else path.stem
        return ModelSource(path, "gguf", cfg, tensor, meta, tok, tok_err, template if isinstance(template, str) else None,
                           str(name), [f.close], names)
    except BaseException:
        f.close()
        raise
