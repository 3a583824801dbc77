"""Open a model file or directory by what it is: a GGUF file or a Hugging Face directory."""
from __future__ import annotations

from pathlib import Path

from ..errors import ModelFormatError
from .gguf_model import open_gguf
from .hf_dir import open_hf_dir
from .source import ModelSource


def open_model(path: Path) -> ModelSource:
    if path.is_dir():
        return open_hf_dir(path)
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic == b"GGUF":
        return open_gguf(path)
    raise ModelFormatError(f"{path}: not a GGUF file (magic {magic!r}) nor a Hugging Face model directory")
