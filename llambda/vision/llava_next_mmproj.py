"""LLaVA-NeXT (1.6) in llama.cpp's mlp mmproj: what it adds to LLaVA 1.5's file (llava_layouts.py, llava_mmproj.py),
read and written.

- `clip.vision.image_grid_pinpoints`: the resolutions flattened, each pair (width, height) as llama.cpp reads them
  (clip_image_size) and as the original LLaVA's config (and so the legacy converter's files: Ollama's llava)
  holds them; transformers' image_grid_pinpoints are (height, width), so a directory's are swapped on writing,
  in their order. Each a positive multiple of the tower's image_size, at most 8 of it, 1..64 pairs.
- `clip.vision.mm_patch_merge_type`: "spatial_unpad" (the only one taken: LLaVA-NeXT's unpadded grid with a
  newline a row); llama.cpp reads it but lays every crop out flat whatever it says (docs/VISION.md).
- the newline vector [text width]: `v.image_newline` (llama.cpp's name now, which we write) or
  `model.image_newline` (the legacy converter's, in Ollama's files).
- `clip.vision.image_crop_resolution`, `image_split_resolution`, `image_aspect_ratio` (the legacy converter's
  copies of the original config) are not read, as llama.cpp does not.
"""
from __future__ import annotations

from ..errors import ModelFormatError
from ..formats.gguf import GGUFValueType as VT
from ..formats.gguf_writer import GGUFValue
from .layouts import gguf_lookup
from .llava_config import MAX_PINPOINTS, MAX_TILES_A_SIDE

PINPOINTS_KEY = "clip.vision.image_grid_pinpoints"
MERGE_KEY = "clip.vision.mm_patch_merge_type"
NEWLINE_NAMES = ("v.image_newline", "model.image_newline")
MERGE = "spatial_unpad"


def next_fields(meta: dict, tensors: dict, image_size, source: str) -> dict:
    """{} for a LLaVA 1.5 file (no pinpoints key); else grid_pinpoints as ((height, width), ...) and llama.cpp's
    preprocessing, each key checked and named where it is wrong."""
    if PINPOINTS_KEY not in meta:
        return {}
    v = meta[PINPOINTS_KEY]
    v = v.tolist() if hasattr(v, "tolist") else v
    S = image_size if isinstance(image_size, int) and not isinstance(image_size, bool) and image_size > 0 else None
    ok = (S is not None and isinstance(v, list) and 2 <= len(v) <= 2 * MAX_PINPOINTS and len(v) % 2 == 0
          and all(isinstance(x, int) and not isinstance(x, bool) and 0 < x <= MAX_TILES_A_SIDE * S and x % S == 0
                  for x in v))
    if not ok:
        raise ModelFormatError(f"{source}: {PINPOINTS_KEY} must be 1..{MAX_PINPOINTS} (width, height) pairs, "
                               f"flattened, of multiples of clip.vision.image_size ({image_size}), at most "
                               f"{MAX_TILES_A_SIDE} of it, got {str(v)[:80]}")
    merge = meta.get(MERGE_KEY)
    if merge != MERGE:
        raise ModelFormatError(f"{source}: an mmproj with {PINPOINTS_KEY} needs {MERGE_KEY} {MERGE!r} (LLaVA-NeXT's "
                               f"unpadded grid with a newline a row), got {str(merge)[:40]!r}")
    if not any(n in tensors for n in NEWLINE_NAMES):
        raise ModelFormatError(f"{source}: an mmproj with {PINPOINTS_KEY} ({MERGE}) needs the image_newline tensor "
                               f"({' or '.join(NEWLINE_NAMES)})")
    return {"grid_pinpoints": [[v[i + 1], v[i]] for i in range(0, len(v), 2)], "preprocess": "anyres_cpp"}


def newline_lookup(gguf_file, lookup):
    """`lookup` with the canonical `image_newline` found under either of its GGUF names (v. first)."""
    name = next((n for n in NEWLINE_NAMES if n in gguf_file.tensors), None)
    newline = gguf_lookup(gguf_file, None, lambda canon, which: name)
    return lambda canon: newline(canon) if canon == "image_newline" else lookup(canon)


def next_metadata(c) -> dict:
    """The keys a LLaVA-NeXT tower adds to its mlp mmproj (pinpoints as (width, height), in the config's order)."""
    flat = [int(x) for h, w in c.grid_pinpoints for x in (w, h)]
    return {PINPOINTS_KEY: GGUFValue((VT.ARRAY, VT.INT32), flat), MERGE_KEY: MERGE}


NEWLINE_NAME = NEWLINE_NAMES[0]
