"""Text <-> token ids: byte-level BPE and SentencePiece from model metadata.

Encoding runs on the HF `tokenizers` library, configured to reproduce each
model's original tokenizer; decoding and streaming are ours (token -> bytes
-> UTF-8) so that a character split over tokens is never emitted half-done.
"""
from .core import Tokenizer
from .stream import StreamDecoder
from .vocab import TokenizerWarning, TokenType

__all__ = ["Tokenizer", "StreamDecoder", "TokenizerWarning", "TokenType"]
