"""LFM2-VL's images on the language side (transformers' Lfm2VlProcessor): the tokens that frame an image, and its
crops encoded into blocks.

The template's `<image>` becomes, for an image split into rows x cols tiles: `<|image_start|>`, per tile
(row-major) `<|img_row_R_col_C|>` + `<image>` x tile_tokens, then (use_thumbnail) `<|img_thumbnail|>` +
`<image>` x th * tw, then `<|image_end|>`; an unsplit image is `<|image_start|>` + `<image>` x th * tw +
`<|image_end|>` (th x tw: the tower's token grid of the single image or thumbnail, `tower.grid`). One causal block
a crop (its run of `<image>` tokens): attention is the text model's causal one (a hybrid of short convolutions and
attention, LFM2), the rows replace the `<image>` embeddings unscaled, positions are ordinary."""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..errors import InvalidInputError, ModelFormatError
from ..sampling import _is_int
from .images import IMAGE_TEXT, LFM2VL, _expand_each, _idefics_tokens, _soft_runs, image_block, tower_rows

START, END, THUMBNAIL = "<|image_start|>", "<|image_end|>", "<|img_thumbnail|>"


@dataclass(frozen=True)
class Lfm2VlTokens:
    soft: int
    marker: str = IMAGE_TEXT        # the soft token's text: what a template writes for an image
    tile_tokens: int = 0            # the attached tower's (for_tower)
    thumbnail: bool = True
    family = LFM2VL

    def runs(self, rows: int, cols: int, th: int, tw: int) -> list[int]:
        """The soft tokens of each crop of an image of that grid, in prompt order."""
        if rows * cols == 1:
            return [th * tw]
        return [self.tile_tokens] * (rows * cols) + ([th * tw] if self.thumbnail else [])

    def image_text(self, rows: int, cols: int, th: int, tw: int) -> str:
        if rows * cols == 1:
            return START + self.marker * (th * tw) + END
        tiles = "".join(f"<|img_row_{r + 1}_col_{c + 1}|>" + self.marker * self.tile_tokens
                        for r in range(rows) for c in range(cols))
        thumb = THUMBNAIL + self.marker * (th * tw) if self.thumbnail else ""
        return START + tiles + thumb + END

    def expand(self, text: str, grids: list, per: int = 0) -> str:
        return _expand_each(text, self.marker, grids, self.image_text)

    def place(self, ids: list[int], per: int, grids: list) -> tuple[list[int], list[tuple]]:
        """(the ids, each image's runs' starts), the runs checked to be the images' crops."""
        _, lo, hi = _soft_runs(ids, self.soft)
        want = [self.runs(*g) for g in grids]
        flat = [n for w in want for n in w]
        if len(lo) != len(flat) or np.any(hi - lo != np.asarray(flat, dtype=np.int64)):
            raise InvalidInputError(f"the prompt's image tokens ({self.marker}) do not make the runs {flat} of the "
                                    "images' crops: the text writes the token itself, or the tokenizer does not read "
                                    "it as one token")
        starts, k = [], 0
        for w in want:
            starts.append(tuple(int(s) for s in lo[k:k + len(w)]))
            k += len(w)
        return list(ids), starts

    def block_tokens(self, per: int) -> int:
        return 0        # causal: a chunk may end anywhere


def lfm2vl_tokens(config, tokenizer, vocab_size: int, family: str = LFM2VL) -> Lfm2VlTokens | None:
    """Idefics3's rule: the config's image_token_id, else the vocabulary's `<image>`, read back as itself."""
    found = _idefics_tokens(config, tokenizer, vocab_size)
    return None if found is None else Lfm2VlTokens(found.soft, found.marker)


def for_tower(tokens: Lfm2VlTokens, tower) -> Lfm2VlTokens:
    tile = getattr(tower, "tile_tokens", None)
    cfg = getattr(tower, "cfg", None)
    if not _is_int(tile) or tile < 1:
        raise InvalidInputError(f"an {LFM2VL} tower needs integer tile_tokens, got {tile!r}")
    return replace(tokens, tile_tokens=int(tile), thumbnail=bool(getattr(cfg, "use_thumbnail", True)))


def checked_grid(grid) -> tuple[int, int, int, int]:
    """An LFM2-VL tower's grid() answer (rows, cols, th, tw), checked."""
    if not (isinstance(grid, tuple) and len(grid) == 4 and all(_is_int(v) and v >= 1 for v in grid)):
        raise ModelFormatError(f"the vision tower gave the grid {str(grid)[:60]}")
    return tuple(int(v) for v in grid)


def encode_tiles(inp, files: dict, grids: list) -> list[tuple]:
    """The blocks (a tuple of crops an image, each at 0, causal) of `files` (EncodedRows keys -> bytes) with their
    grids, kept in inp.encoded; one image at a time decoded, cut into crops and encoded (ImageInput's lock held
    while its tower runs)."""
    load_image, tower = inp._decoder(), inp._tower_now()
    width = inp.model.config.d_model
    out = []
    for (key, data), grid in zip(files.items(), grids):
        image = load_image(data)
        with inp._holding(tower):
            crops = tower.pixels(image)
            del image
            runs = inp.layout.runs(*grid)
            if not isinstance(crops, list) or len(crops) != len(runs):
                raise ModelFormatError(f"the vision tower gave {len(crops) if isinstance(crops, list) else '?'} "
                                       f"crops for an image of {len(runs)}")
            blocks = []
            for (px, g), n in zip(crops, runs):
                rows = tower_rows([tower.encode_one(px, g)], 1, n, width)[0]
                blocks.append(image_block(0, rows, causal=True))
            blocks = tuple(blocks)
            inp.encoded.put(key, blocks)
        out.append(blocks)
    return out
