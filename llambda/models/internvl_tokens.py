"""InternVL's image tokens on the language model's side (transformers' InternVLProcessor): the template writes
`<IMG_CONTEXT>` for an image; the processor makes it `<img>` + `<IMG_CONTEXT>` x (tokens_per_tile x tiles) +
`</img>`, the tiles of the image's grid row-major then its thumbnail (one tile alone: no thumbnail). One run of
soft tokens an image, cut into one block per tile (each tile's rows; a prefix then matches up to the first tile
that differs), causal attention everywhere (the text model's own: transformers' masked_scatter over Qwen2 / Qwen3).
The ids: the config's image_token_id (a HF directory), else the vocabulary's `<IMG_CONTEXT>` (a GGUF file); the
frame's `<img>` and `</img>` from the vocabulary."""
from __future__ import annotations

from dataclasses import dataclass

from .images import INTERNVL, QwenTokens, _expand_each, named_tokens

START_TEXT, SOFT_TEXT, END_TEXT = "<img>", "<IMG_CONTEXT>", "</img>"


@dataclass(frozen=True)
class InternVLTokens(QwenTokens):
    """Qwen2-VL's frame (start, a run of soft tokens, end: its place() checks it) with InternVL's texts, the
    template's marker the soft token alone and a run of per x tiles an image, cut into a block a tile."""
    family: str = INTERNVL      # (its texts are given: internvl_tokens)

    @property
    def marker(self) -> str:
        return self.soft_text

    @staticmethod
    def tiles(rows: int, cols: int) -> int:
        """An image's tiles from its grid (rows, cols): the grid and the thumbnail, or one tile alone ((0, 0))."""
        return rows * cols + 1 if rows else 1

    def expand(self, text: str, grids: list, per: int = 0) -> str:
        return _expand_each(text, self.marker, grids, lambda rows, cols: (
            self.start_text + self.soft_text * (per * self.tiles(rows, cols)) + self.end_text))

    def place(self, ids: list[int], per: int, grids: list) -> tuple[list[int], list[tuple]]:
        """(the ids, each image's tile starts): one run of per x tiles soft ids an image between start and end."""
        counts = [self.tiles(*g) for g in grids]
        ids, runs = super().place(ids, per, [(per * n, 1) for n in counts])
        return ids, [tuple(run[0] + per * k for k in range(n)) for run, n in zip(runs, counts)]


def internvl_tokens(config, tokenizer, vocab_size: int) -> InternVLTokens | None:
    """The layout's ids (image_token_id, else <IMG_CONTEXT>; <img>, </img> from the vocabulary), None where they
    are not all found."""
    found = named_tokens(config, tokenizer, vocab_size, {"soft": ("image_token_id",)},
                         {"start": START_TEXT, "soft": SOFT_TEXT, "end": END_TEXT})
    if found is None:
        return None
    ids, shown = found
    return InternVLTokens(ids["start"], ids["soft"], ids["end"], shown["start"], shown["soft"], shown["end"])
