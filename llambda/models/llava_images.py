"""LLaVA's image tokens on the language side (`LlavaTokens`): the template's `<image>` becomes N `<image>`
tokens (LLaVA 1.5: N the tower's tokens_per_image, its patches, plus the class token under the "full" strategy;
transformers' LlavaProcessor. LLaVA-NeXT: the base crop's tokens_per_image and r (c + 1) for its unpadded r x c
grid of the tiles' rows with a newline each row, r x c the tower's grid() of the image; LlavaNextProcessor), whose embeddings the tower's rows replace in order, unscaled; one causal block an image
(transformers' LLaVA runs its text model's causal mask over the merged embeddings). The token is the config's
image_token_index (image_token_id), else the vocabulary's `<image>` (a GGUF file converted from llava-hf), else
its `<unk>` (a GGUF of the original LLaVA checkpoints: Ollama's llava files)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InvalidInputError
from .images import IMAGE_TEXT, LLAVA, LLAVA_NEXT, _expand_each, _idefics_tokens, _index, _soft_runs



@dataclass(frozen=True)
class LlavaTokens:
    soft: int
    marker: str = IMAGE_TEXT
    family: str = LLAVA

    def count(self, rows: int, cols: int, per: int) -> int:
        """An image's tokens: LLaVA 1.5's `per`; LLaVA-NeXT's base `per` and its unpadded grid with a newline a row."""
        return per + rows * (cols + 1) if self.family == LLAVA_NEXT else per

    def expand(self, text: str, grids: list, per: int = 0) -> str:
        """Each image marker becomes its run of soft tokens. Where the soft token is a stand-in (`<unk>`: a vocabulary
        without <image>), the `<image>` a LLaVA chat template writes for an image part is its marker too; a user's
        own `<image>` in such a model's text then counts as one (a 400 on the count, never a silent image)."""
        if self.marker != IMAGE_TEXT:
            text = text.replace(IMAGE_TEXT, self.marker)
        return _expand_each(text, self.marker, grids, lambda rows, cols: self.marker * self.count(rows, cols, per))

    def place(self, ids: list[int], per: int, grids: list) -> tuple[list[int], list[tuple]]:
        """(the ids, each image's run start): a run of soft ids an image, of its count (images with nothing between
        them make one run, cut in their counts)."""
        _, lo, hi = _soft_runs(ids, self.soft)
        want = [self.count(r, c, per) for r, c in grids]
        starts, k = [], 0
        for a, b in zip(lo.tolist(), hi.tolist()):
            while a < b and k < len(want) and want[k] > 0 and a + want[k] <= b:
                starts.append(a)
                a, k = a + want[k], k + 1
            if a != b:
                break
        if k != len(want) or len(starts) != len(want) or sum(want) != int(np.sum(hi - lo)):
            raise InvalidInputError(f"the prompt's image tokens ({self.marker}) do not make runs of {want}: the text "
                                    "writes the token itself, or the tokenizer does not read it as one token")
        return list(ids), [(s,) for s in starts]

    def block_tokens(self, per: int) -> int:
        return 0        # causal: a chunk may end anywhere


def llava_tokens(config, tokenizer, vocab_size: int, family: str = LLAVA) -> LlavaTokens | None:
    """The config's image_token_index (or image_token_id), else the vocabulary's <image>, else its unknown token
    (`<unk>`: a GGUF converted from the original LLaVA checkpoints, Ollama's llava files, has no <image>; the
    unknown token never stands in a prompt otherwise, and its embedding is replaced all the same), each read back
    by the tokenizer as itself; None where none is."""
    soft = None
    if isinstance(config, dict):
        soft = next((config[k] for k in ("image_token_index", "image_token_id") if _index(config.get(k))), None)
    ids = _idefics_tokens({"image_token_id": soft}, tokenizer, vocab_size)     # the same lookup and checks
    if ids is None and tokenizer is not None and _index(getattr(tokenizer, "unk_id", None)):
        ids = _idefics_tokens({"image_token_id": tokenizer.unk_id}, tokenizer, vocab_size)
    return None if ids is None else LlavaTokens(ids.soft, ids.marker, family)
