"""The raw bytes each token stands for, computed lazily and cached.

Byte-level BPE vocabularies spell each byte as a printable character (GPT-2's
table: printable Latin-1 stands for itself, the other 68 bytes map to
U+0100.. in byte order).  SentencePiece vocabularies write spaces as U+2581
and single bytes as <0xNN> tokens.  Control and unknown tokens stand for
their own text; user-defined ones too, except that SentencePiece's U+2581
still means a space.
"""
from __future__ import annotations

import re

import numpy as np

from .vocab import TokenType

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_TEXT_TYPES = (TokenType.CONTROL, TokenType.UNKNOWN)


def _gpt2_byte_chars() -> list[str]:
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = [""] * 256, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


BYTE_CHARS = _gpt2_byte_chars()                       # byte -> stand-in character
_CHAR_TO_LATIN1 = {ord(c): chr(b) for b, c in enumerate(BYTE_CHARS)}


def byte_level_to_bytes(text: str) -> bytes:
    latin = text.translate(_CHAR_TO_LATIN1)
    try:
        return latin.encode("latin-1")
    except UnicodeEncodeError:
        # A character outside the byte table (seen in some added tokens):
        # it stands for its own UTF-8.
        return b"".join(c.encode("latin-1") if ord(c) < 256 else c.encode("utf-8") for c in latin)


def sentencepiece_to_bytes(text: str, is_byte_token: bool) -> bytes:
    if is_byte_token:
        m = _BYTE_TOKEN.fullmatch(text)
        if m:
            return bytes([int(m.group(1), 16)])
    return text.replace("\u2581", " ").encode("utf-8")


class TokenPieces:
    """token id -> bytes, filled on first use (a 262k vocab would cost ~0.3 s up front)."""

    def __init__(self, tokens: list[str], types: np.ndarray, byte_level: bool):
        self._tokens = tokens
        self._types = types
        self._byte_level = byte_level
        self._cache: list[bytes | None] = [None] * len(tokens)

    def __call__(self, token_id: int) -> bytes:
        piece = self._cache[token_id]
        if piece is None:
            piece = self._cache[token_id] = self._compute(token_id)
        return piece

    def _compute(self, i: int) -> bytes:
        text, kind = self._tokens[i], int(self._types[i])
        if kind in _TEXT_TYPES or (kind == TokenType.USER_DEFINED and self._byte_level):
            return text.encode("utf-8")
        if self._byte_level:
            return byte_level_to_bytes(text)
        return sentencepiece_to_bytes(text, kind == TokenType.BYTE)
