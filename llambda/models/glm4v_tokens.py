"""GLM-4.1V / GLM-4.6V's image tokens (transformers' Glm4vProcessor): the template writes
`<|begin_of_image|><|image|><|end_of_image|>` for an image part and the processor repeats `<|image|>` once a merged
cell (gh * gw, the tower's grid): Qwen2-VL's layout (models/images.QwenTokens) under these names, with its M-RoPE
positions (Glm4vModel.get_rope_index gives an image's tokens (t0, t0 + row, t0 + col) and the text after it
t0 + max(gh, gw), as Qwen2-VL's)."""
from __future__ import annotations

from .images import GLM4V, QwenTokens, named_tokens

BEGIN, IMAGE, END = "<|begin_of_image|>", "<|image|>", "<|end_of_image|>"
KEYS = {"start": ("image_start_token_id",), "soft": ("image_token_id",), "end": ("image_end_token_id",)}


def glm4v_tokens(config, tokenizer, vocab_size: int) -> QwenTokens | None:
    """The config's image_start_token_id, image_token_id, image_end_token_id (a HF directory), else the
    vocabulary's <|begin_of_image|>, <|image|>, <|end_of_image|> (a GGUF file); None where not found."""
    found = named_tokens(config, tokenizer, vocab_size, KEYS, {"start": BEGIN, "soft": IMAGE, "end": END})
    if found is None:
        return None
    ids, shown = found
    return QwenTokens(ids["start"], ids["soft"], ids["end"], shown["start"], shown["soft"], shown["end"], GLM4V)
