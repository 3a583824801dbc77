"""Open a model file or directory by what it is: a GGUF file or a Hugging Face directory; or by its name."""
from __future__ import annotations

from pathlib import Path

from ..errors import ModelFormatError
from .files import open_regular
from .gguf_model import open_gguf
from .hf_dir import open_hf_dir
from .source import ModelSource


def open_model(path: Path) -> ModelSource:
    try:
        if path.is_dir():
            ggufs = sorted(p.name for p in path.glob("*.gguf")) if not (path / "config.json").exists() else []
            if ggufs:      # a folder of downloads: "a Hugging Face model directory needs config.json"
                raise ModelFormatError(f"{path} is a directory without config.json: give the path of the GGUF "
                                       f"file in it ({', '.join(ggufs[:3])}{', ...' if len(ggufs) > 3 else ''})")
            src = open_hf_dir(path)
        else:
            with open_regular(path) as fh:
                try:
                    magic = fh.read(4)
                except OSError as e:    # a regular file that cannot be read (/proc/self/mem: EIO)
                    raise ModelFormatError(f"{path}: cannot read the model file ({e.strerror or e})") from None
            if magic != b"GGUF":
                raise ModelFormatError(f"{path}: not a GGUF file (magic {magic!r}) nor a Hugging Face model directory")
            src = open_gguf(path)
    except ModelFormatError as e:
        if str(path) in str(e):
            raise
        raise ModelFormatError(f"{path}: {e}") from None    # every error names the file
    src.config.source = str(path)
    return src


def open_named(name_or_path) -> tuple[Path, ModelSource]:
    """(path, source) of a catalogued model name (fetched and prepared as needed) or a path."""
    from .. import hub
    path = Path(hub.resolve(name_or_path))
    with hub.opening(name_or_path, path):
        return path, open_model(path)
