"""Offline tools built on the engine: export, quantize, bench, perplexity, tokenizer export.

Nothing on the generation path imports these, except `quantize` for `load(..., quantize=...)`.
"""
