"""Mistral 3's (Pixtral's) image tokens on the language model's side, as transformers' PixtralProcessor lays them:
the template's `[IMG]` becomes, for an image whose merged grid is rows x cols (the tower's `grid`), rows runs of
cols `[IMG]` tokens, each run followed by `[IMG_BREAK]` but the last, which `[IMG_END]` follows. The `[IMG]`
tokens' embeddings are the tower's rows, row-major (masked_scatter, unscaled); attention is causal over
everything and positions are plain 1D ones (transformers' Mistral3: its text model over the merged embeddings).
One block a run (an image's row of tokens): the breaks between them are text tokens."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InvalidInputError
from .images import PIXTRAL, _expand_each, _soft_runs, named_tokens

IMG, IMG_BREAK, IMG_END = "[IMG]", "[IMG_BREAK]", "[IMG_END]"


@dataclass(frozen=True)
class PixtralTokens:
    """The ids of [IMG], [IMG_BREAK], [IMG_END] and their texts; `marker`, what a chat template writes for an
    image part, is [IMG]'s."""
    soft: int
    brk: int
    end: int
    texts: tuple = (IMG, IMG_BREAK, IMG_END)
    family = PIXTRAL

    soft_text = marker = property(lambda self: self.texts[0])
    brk_text = property(lambda self: self.texts[1])
    end_text = property(lambda self: self.texts[2])

    def image_text(self, rows: int, cols: int) -> str:
        run = self.soft_text * cols
        return (run + self.brk_text) * (rows - 1) + run + self.end_text

    def expand(self, text: str, grids: list, per: int = 0) -> str:
        return _expand_each(text, self.marker, grids, self.image_text)

    def place(self, ids: list[int], per: int, grids: list) -> tuple[list[int], list[tuple]]:
        """(the ids, each image's run starts: one a row), the runs checked to be the images' rows of cols [IMG]
        each, every run followed by [IMG_BREAK], an image's last by [IMG_END]."""
        a, lo, hi = _soft_runs(ids, self.soft)
        want = [(rows, cols) for rows, cols in grids]
        ok = len(lo) == sum(r for r, _ in want)
        starts, k = [], 0
        for rows, cols in want if ok else ():
            run_lo, run_hi = lo[k:k + rows], hi[k:k + rows]
            after = a[np.minimum(run_hi, len(a) - 1)]
            follow = np.full(rows, self.brk)
            follow[-1] = self.end
            if np.any(run_hi - run_lo != cols) or np.any(run_hi >= len(a)) or np.any(after != follow) or \
                    np.any(run_lo[1:] != run_hi[:-1] + 1):
                ok = False
                break
            starts.append(tuple(int(s) for s in run_lo))
            k += rows
        if not ok:
            raise InvalidInputError(f"the prompt's image tokens ({self.soft_text}) do not make the images' rows "
                                    f"{want} ({self.brk_text} between, {self.end_text} after): the text writes the "
                                    "tokens itself, or the tokenizer does not read them as single tokens")
        return list(ids), starts

    def block_tokens(self, per: int) -> int:
        return 0        # causal: a chunk may end anywhere


def pixtral_tokens(config, tokenizer, vocab_size: int) -> PixtralTokens | None:
    """The config's image_token_index (or image_token_id), else the vocabulary's [IMG]; [IMG_BREAK] and [IMG_END]
    from the vocabulary (no config names them); each read back by the tokenizer as itself."""
    found = named_tokens(config, tokenizer, vocab_size, {"soft": ("image_token_index", "image_token_id")},
                         {"soft": IMG, "brk": IMG_BREAK, "end": IMG_END})
    if found is None:
        return None
    ids, shown = found
    if len(set(ids.values())) != 3:
        raise InvalidInputError(f"the image tokens {IMG}, {IMG_BREAK}, {IMG_END} must be three tokens, got {ids}")
    return PixtralTokens(ids["soft"], ids["brk"], ids["end"], (shown["soft"], shown["brk"], shown["end"]))
