"""Incremental detokenization that never splits a UTF-8 character.

A token may end in the middle of a multi-byte character (byte-level BPE
splits emoji and CJK across tokens; SentencePiece falls back to <0xNN>
tokens).  The decoder keeps such a tail until the character completes, so
each `feed` returns only whole characters, and the concatenation of all
`feed` results plus `flush()` equals `Tokenizer.decode` of the same ids
(invalid bytes become U+FFFD the same way in both: Python's incremental
UTF-8 decoder with errors="replace" agrees with the one-shot decoder).
"""
from __future__ import annotations

import codecs
from typing import Callable


class StreamDecoder:
    def __init__(self, piece: Callable[[int], bytes], check_id: Callable[[int], int],
                 skip: Callable[[int], bool] | None = None):
        self._piece = piece
        self._check_id = check_id
        self._skip = skip
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token_id: int) -> str:
        """Text completed by this token ('' while a character is still partial)."""
        i = self._check_id(token_id)
        if self._skip is not None and self._skip(i):
            return ""
        return self._utf8.decode(self._piece(i))

    def flush(self) -> str:
        """End of stream: a dangling partial character comes out as U+FFFD. Resets the decoder."""
        out = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return out

    @property
    def pending(self) -> bytes:
        """Bytes held back because they do not yet form a whole character."""
        return self._utf8.getstate()[0]
