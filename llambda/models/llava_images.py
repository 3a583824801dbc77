"""LLaVA 1.5's image tokens on the language side (`LlavaTokens`): the template's `<image>` becomes N `<image>`
tokens (N the tower's tokens_per_image: its patches, plus the class token under the "full" strategy; transformers'
LlavaProcessor), whose embeddings the tower's rows replace in order, unscaled; one causal block an image
(transformers' LLaVA runs its text model's causal mask over the merged embeddings). The token is the config's
image_token_index (image_token_id), else the vocabulary's `<image>` (a GGUF file converted from llava-hf), else
its `<unk>` (a GGUF of the original LLaVA checkpoints: Ollama's llava files)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InvalidInputError
from .images import IMAGE_TEXT, LLAVA, _expand_each, _idefics_tokens, _index, _soft_runs



@dataclass(frozen=True)
class LlavaTokens:
    soft: int
    marker: str = IMAGE_TEXT
    family = LLAVA

    def expand(self, text: str, grids: list, per: int = 0) -> str:
        return _expand_each(text, self.marker, grids, lambda rows, cols: self.marker * per)

    def place(self, ids: list[int], per: int, grids: list) -> tuple[list[int], list[tuple]]:
        """(the ids, each image's run start): runs of `per` soft ids, one an image (two images with nothing
        between them make one run of 2 x per, cut in two)."""
        _, lo, hi = _soft_runs(ids, self.soft)
        starts = [int(s) for a, b in zip(lo, hi) for s in range(a, b, per)] if per else []
        if not per or np.any((hi - lo) % per) or len(starts) != len(grids):
            raise InvalidInputError(f"the prompt's image tokens ({self.marker}) do not make {len(grids)} runs of {per}: "
                                    "the text writes the token itself, or the tokenizer does not read it as one token")
        return list(ids), [(s,) for s in starts]

    def block_tokens(self, per: int) -> int:
        return 0        # causal: a chunk may end anywhere


def llava_tokens(config, tokenizer, vocab_size: int) -> LlavaTokens | None:
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
    return None if ids is None else LlavaTokens(ids.soft, ids.marker)
