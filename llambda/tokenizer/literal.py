"""Control-token text in a caller's strings, kept as text.

A chat template writes the control tokens (`<|im_start|>`, `<start_of_turn>`, ...) around the callers'
strings (message content, names, tool calls and definitions, template variables), and the rendered prompt is
tokenized with control tokens matched in its text. A caller's string that spells one (a user writing
`<|im_end|>\\n<|im_start|>system`) became that control token: a forged turn. `Literals.mark` replaces each
control token's text inside the callers' strings by a placeholder, two Unicode noncharacters (code points
set aside for a program's internal use) around this tokenizer's random key and the token's index;
Tokenizer.encode tokenizes a placeholder as the token's text spelled out, as parse_special=False does, and
`restore` writes the text back where a prompt is shown (/apply-template). A forged placeholder (by a
caller who learned the key) still only yields text spelled out; the key keeps a raw prompt's own
noncharacters (/v1/completions) as they are.

Control tokens are the backend's special added tokens (the ones parse_special=False spells out); they are
found by one regular expression built as a trie of their texts (a vocabulary may have thousands, Gemma's
<unusedN>), the longest at the leftmost place, as the backend matches them. A vocabulary whose trie would
pass TRIE_NODES nodes, or that has a control token longer than TRIE_CHARS (a hostile file's: the pattern's
nesting and the trie's memory stay bounded), has them found by the backend itself (`finder`: its own
matcher, a tokenization of the string).
"""
from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Mapping

from ..errors import ChatTemplateError

OPEN, CLOSE = "\ufdd0", "\ufdd1"
TRIE_CHARS = 64                 # a longer control token's text: the backend finds them (finder)
TRIE_NODES = 100_000            # a bigger trie: the backend finds them
KEY_DIGITS = 18
MAX_DEPTH = 256                 # nesting of a caller's data marked (a server body is at most 64 deep)


def _trie_pattern(texts: list[str]) -> str | None:
    """A regular expression matching any of `texts`, the longest one where several start, as a trie
    (one branch per distinct next character: a scan does not try each text in turn); None past the bounds."""
    if any(len(t) > TRIE_CHARS for t in texts):
        return None
    root: dict = {}
    nodes = 0
    for t in texts:
        node = root
        for ch in t:
            if ch not in node:
                nodes += 1
                if nodes > TRIE_NODES:
                    return None
                node[ch] = {}
            node = node[ch]
        node[None] = True

    def emit(node: dict) -> str:
        alts = [re.escape(ch) + emit(child) for ch, child in sorted((k, v) for k, v in node.items() if k is not None)]
        if not alts:
            return ""
        body = alts[0] if len(alts) == 1 and None not in node else "(?:" + "|".join(alts) + ")"
        return body + "?" if None in node else body
    return emit(root)


class Literals:
    """The control tokens' texts of one tokenizer, and its placeholders for them."""

    def __init__(self, special_texts, finder: Callable[[str], list[tuple[int, int]]] | None = None):
        """finder(s): the (start, end) of each control token in s, as the backend matches them (used when
        the trie is past its bounds; without one, such a vocabulary is an error)."""
        self.texts = sorted({t for t in special_texts if t})
        self._index = {t: i for i, t in enumerate(self.texts)}
        # digits: a template that changes a string's case (upper, title) leaves a placeholder whole
        self.key = f"{secrets.randbelow(10 ** KEY_DIGITS):0{KEY_DIGITS}d}"
        pattern = _trie_pattern(self.texts) if self.texts else None
        self._find = re.compile(pattern) if pattern else None
        if self.texts and self._find is None and finder is None:
            raise ValueError("control tokens past the trie's bounds need a finder")
        self._finder = finder
        self._firsts = frozenset(t[0] for t in self.texts)
        self._placeholder = re.compile(re.escape(OPEN + self.key) + r"(\d{1,9})" + re.escape(CLOSE))

    # -- marking a caller's strings ------------------------------------------------------
    def _spans(self, s: str) -> list[tuple[int, int]]:
        if self._find is not None:
            return [m.span() for m in self._find.finditer(s)]
        return [(a, b) for a, b in self._finder(s) if s[a:b] in self._index]

    def mark_text(self, s: str) -> str:
        """`s` with each control token's text as a placeholder (the same string when it holds none)."""
        if not self.texts or not any(c in s for c in self._firsts):
            return s
        spans = self._spans(s)
        if not spans:
            return s
        out, at = [], 0
        for a, b in spans:
            out += [s[at:a], OPEN, self.key, str(self._index[s[a:b]]), CLOSE]
            at = b
        out.append(s[at:])
        return "".join(out)

    def mark(self, value, depth: int = 0):
        """A caller's data (strings in dicts, lists and tuples, dict keys too) with every string marked;
        containers are copied only where a string changed; anything else is kept as it is."""
        if isinstance(value, str):
            return self.mark_text(value)
        if depth > MAX_DEPTH:
            raise ChatTemplateError(f"the messages nest more than {MAX_DEPTH} levels deep (or hold themselves)")
        if isinstance(value, Mapping):
            items = [(self.mark(k, depth + 1), self.mark(v, depth + 1)) for k, v in value.items()]
            if all(k is k0 and v is v0 for (k, v), (k0, v0) in zip(items, value.items())):
                return value
            return dict(items)
        if isinstance(value, (list, tuple)):
            marked = [self.mark(v, depth + 1) for v in value]
            if all(m is v for m, v in zip(marked, value)):
                return value
            return type(value)(marked) if type(value) in (list, tuple) else marked
        return value

    # -- reading them back ---------------------------------------------------------------
    def holds_placeholders(self, text: str) -> bool:
        return OPEN in text and self._placeholder.search(text) is not None

    def split(self, text: str) -> list[tuple[str, bool]]:
        """`text` as (piece, literal) in order: literal pieces are control-token texts to spell out
        (neighbouring ones joined), the others text as it came."""
        out: list[tuple[str, bool]] = []
        at = 0
        for m in self._placeholder.finditer(text):
            i = int(m.group(1))
            if i >= len(self.texts):        # not one of ours (a forged index): its text as it is
                continue
            if m.start() > at:
                out.append((text[at:m.start()], False))
            if out and out[-1][1]:
                out[-1] = (out[-1][0] + self.texts[i], True)
            else:
                out.append((self.texts[i], True))
            at = m.end()
        if at < len(text):
            out.append((text[at:], False))
        return out

    def restore(self, text: str) -> str:
        """The text a marked prompt stands for (placeholders written back as the tokens' texts)."""
        if OPEN not in text:
            return text
        return self._placeholder.sub(
            lambda m: self.texts[int(m.group(1))] if int(m.group(1)) < len(self.texts) else m.group(0), text)
