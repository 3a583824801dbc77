"""Open a model file or directory: config, tensors, tokenizer, chat template."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from .errors import ModelFormatError, TokenizerError
from .models import arch_module
from .models.config import TransformerConfig
from .weights import WeightTensor


@dataclass
class ModelSource:
    path: Path
    format: str                                   # "gguf" | "hf"
    config: TransformerConfig
    tensor: Callable[[str], Optional[WeightTensor]]
    metadata: dict = field(default_factory=dict)
    tokenizer: object | None = None
    tokenizer_error: str | None = None            # why there is no tokenizer
    chat_template: str | None = None
    name: str = ""
    closers: list = field(default_factory=list)

    def close(self) -> None:
        for c in self.closers:
            c()
        self.closers.clear()


def open_gguf(path: Path) -> ModelSource:
    from .formats.gguf import GGUFFile
    from .tokenizer import Tokenizer

    f = GGUFFile(path)
    try:
        meta = f.metadata
        arch = meta.get("general.architecture")
        if not isinstance(arch, str):
            raise ModelFormatError("GGUF metadata lacks 'general.architecture'")
        cfg = arch_module(arch).config_from_gguf(meta)
        infos = f.tensors

        def tensor(name: str) -> WeightTensor | None:
            t = infos.get(name)
            if t is None:
                return None
            return WeightTensor(name, t.qtype, tuple(int(s) for s in t.shape), t.data)

        tok, tok_err = None, None
        try:
            tok = Tokenizer.from_gguf_metadata(meta)
        except TokenizerError as e:
            tok_err = str(e)
        template = meta.get("tokenizer.chat_template")
        name = meta.get("general.name") or path.stem
        return ModelSource(path, "gguf", cfg, tensor, meta, tok, tok_err, template if isinstance(template, str) else None,
                           str(name), [f.close])
    except BaseException:
        f.close()
        raise


def open_model(path: Path) -> ModelSource:
    if path.is_dir():
        from .formats.hf_dir import open_hf_dir
        return open_hf_dir(path)
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic == b"GGUF":
        return open_gguf(path)
    raise ModelFormatError(f"{path}: not a GGUF file (magic {magic!r}) nor a Hugging Face model directory")
