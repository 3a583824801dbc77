"""Grammars over a model's vocabulary, and the per-sequence state that masks its logits.

llguidance does the work: it compiles a JSON schema, a Lark or GBNF grammar or a regex, and
computes, for a parser state, the set of tokens that keep the output inside the grammar (in
native code, with the GIL released). What is ours: its view of the vocabulary, built from our
tokenizer's token bytes (so GGUF and Hugging Face models alike work, with no tokenizer.json);
errors as a `ConstraintError` that names the problem; the mask as a NumPy array of banned
tokens for the sampler.

JSON is generated compact (", " and ": " separators, no other whitespace) unless the schema's
own "x-guidance" options say otherwise: free whitespace lets a small model spend its token
budget on newlines, and the answer still parses the same.
"""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass

import numpy as np

from ..errors import InvalidInputError
from . import bounds
from .bounds import check_source, on_deep_stack

JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
KINDS = ("json_schema", "grammar", "lark", "regex")
MAX_ERROR_CHARS = 400
DEAD_END = "NoExtensionBias"      # llguidance's error where the grammar allows no next token at all
NON_VERBOSE = "<non-verbose/>"
BACKTRACE = "<backtrace>"   # where llguidance's errors would dump the parser's state (verbose_errors off)


class ConstraintError(InvalidInputError):
    """A JSON schema, grammar or regex that cannot be compiled, or output that leaves it."""


def _llg():
    try:
        import llguidance
    except ImportError as e:     # a dependency of the package; say what is missing, not a traceback
        raise ConstraintError(f"constrained decoding needs the llguidance package: {e}") from None
    return llguidance


def _clip(msg: str) -> str:
    msg = msg.split(BACKTRACE)[0]        # a panic's native backtrace: frames of the build machine, not the cause
    msg = " ".join(msg.replace(NON_VERBOSE, "").split())
    return msg if len(msg) <= MAX_ERROR_CHARS else msg[:MAX_ERROR_CHARS] + "..."


@dataclass(frozen=True)
class GrammarSpec:
    """What the output must follow. kind: "json_schema" (source: the schema as JSON text),
    "grammar" (GBNF, llama.cpp's format, or llguidance's Lark), "lark" (Lark only) or "regex"."""
    kind: str
    source: str

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ConstraintError(f"unknown grammar kind {self.kind!r}; one of {', '.join(KINDS)}")
        if not isinstance(self.source, str):
            raise ConstraintError(f"a {self.kind} must be given as a string, got {type(self.source).__name__}")


def grammar_spec(json_schema=None, grammar: str | None = None, regex: str | None = None) -> GrammarSpec | None:
    """The spec of at most one of: a JSON schema (a dict, or its JSON text), a GBNF/Lark grammar, a regex."""
    given = [k for k, v in (("json_schema", json_schema), ("grammar", grammar), ("regex", regex)) if v is not None]
    if len(given) > 1:
        raise ConstraintError(f"give at most one of json_schema, grammar and regex (got {' and '.join(given)})")
    if json_schema is not None:
        if isinstance(json_schema, (dict, bool)):
            try:
                json_schema = json.dumps(json_schema)
            except (TypeError, ValueError, RecursionError) as e:    # a set, a cycle, nesting past the stack
                raise ConstraintError(f"the JSON schema is not JSON: {_clip(str(e))}") from None
        elif not isinstance(json_schema, str):
            raise ConstraintError(f"json_schema must be a dict or JSON text, got {type(json_schema).__name__}")
        return GrammarSpec("json_schema", json_schema)
    if grammar is not None:
        if not isinstance(grammar, str) or not grammar.strip():
            raise ConstraintError("grammar must be a non-empty string (GBNF or Lark)")
        return GrammarSpec("grammar", grammar)
    if regex is not None:
        if not isinstance(regex, str):
            raise ConstraintError(f"regex must be a string, got {type(regex).__name__}")
        return GrammarSpec("regex", regex)
    return None


class Grammars:
    """llguidance's view of one model's vocabulary (built once, ~0.3 s at 49k tokens), and the
    grammars compiled against it."""

    def __init__(self, tokenizer, vocab_size: int):
        llg = _llg()
        if tokenizer.vocab_size > vocab_size:
            raise ConstraintError(f"the tokenizer has {tokenizer.vocab_size} tokens, the model's logits "
                                  f"only {vocab_size}")
        self.n_vocab = int(vocab_size)
        self.words = (self.n_vocab + 31) // 32
        eos = sorted(tokenizer.eot_ids)
        self.eos_ids = eos
        self.lltok = llg.LLTokenizer(llg.TokenizerWrapper(_VocabSource(tokenizer)), n_vocab=self.n_vocab,
                                     eos_token=eos or None)

    def compile(self, spec: GrammarSpec) -> "Grammar":
        """Check and compile; a ConstraintError names what is wrong. Drops the GIL while it builds,
        on a thread of its own whose stack holds the deepest grammar llguidance accepts."""
        too_big = check_source(spec.kind, spec.source, _what(spec.kind))
        if too_big:
            raise ConstraintError(too_big)
        return on_deep_stack(self._compile, spec)

    def _compile(self, spec: GrammarSpec) -> "Grammar":
        llg = _llg()
        try:
            if spec.kind == "json_schema":
                try:
                    schema = json.loads(spec.source)
                except (ValueError, RecursionError) as e:     # RecursionError: nesting past the stack
                    raise ConstraintError(f"the JSON schema is not valid JSON: {e}") from None
                if not isinstance(schema, (dict, bool)):
                    raise ConstraintError(f"a JSON schema must be an object, got {type(schema).__name__}")
                if schema is False:
                    raise ConstraintError("the JSON schema false allows no value at all")
                # true is any value, as {} is; llguidance takes only objects ("Expecting object schema")
                text = llg.LLMatcher.grammar_from_json_schema({} if schema is True else schema, defaults=JSON_STYLE)
            elif spec.kind == "grammar":
                text = llg.grammar_from("grammar", spec.source)
            elif spec.kind == "lark":
                text = llg.LLMatcher.grammar_from_lark(spec.source)
            else:
                text = llg.LLMatcher.grammar_from_regex(spec.source)
        except ConstraintError:
            raise
        except (ValueError, TypeError) as e:
            raise ConstraintError(f"invalid {_what(spec.kind)}: {_clip(str(e))}") from None
        # errors name the problem, not the parser's internal state (which the client cannot use)
        matcher = llg.LLMatcher(self.lltok, text, log_level=0, limits=bounds.parser_limits(llg))
        if matcher.is_error():
            raise ConstraintError(f"invalid {_what(spec.kind)}: {_clip(matcher.get_error())}")
        # the first mask, here rather than in the first decode step: a grammar that allows no output
        # at all ($ref cycles, rules that only refer to themselves) is refused before anything is
        # queued, and a costly first mask is paid off the scheduler (the sequences copy it)
        mask = _mask(matcher, np.zeros(self.words, np.int32),
                     dead_end="it allows no output at all (e.g. a rule or $ref that only refers to itself)")
        for why in (mask.failed, mask.too_costly):
            if why:
                raise ConstraintError(f"invalid {_what(spec.kind)}: {why}")
        return Grammar(self, matcher)


@dataclass(frozen=True)
class _Mask:
    seconds: float              # the CPU it took
    failed: str | None          # why the matcher failed, or None
    too_costly: str | None      # why it took too long to go on (bounds.check_mask_cost), or None


def _mask(matcher, bits: np.ndarray, dead_end: str) -> _Mask:
    """Compute the matcher's next mask into `bits`, timed in this thread's CPU; `dead_end` names the
    failure where the grammar allows no next token at all (the caller's words for where it is)."""
    t0 = bounds.cpu_now()
    matcher.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
    seconds = bounds.cpu_now() - t0
    failed = None
    if matcher.is_error():
        failed = _failure(matcher)
        if failed.startswith(DEAD_END):
            failed = dead_end
    return _Mask(seconds, failed, bounds.check_mask_cost(seconds))


def _failure(matcher) -> str:
    """Why the matcher failed: the limit on one mask it hit (named), or llguidance's words."""
    message = matcher.get_error()
    return bounds.limit_error(message) or _clip(message)


def _what(kind: str) -> str:
    return {"json_schema": "JSON schema", "grammar": "grammar", "lark": "grammar", "regex": "regex"}[kind]


class _VocabSource:
    """What llguidance's TokenizerWrapper reads: every token's bytes, the special ids, an encoder."""

    def __init__(self, tokenizer):
        self._tok = tokenizer
        self.eos_token_id = tokenizer.eos_id
        self.bos_token_id = tokenizer.bos_id
        self.tokens = [tokenizer.token_bytes(i) for i in range(tokenizer.vocab_size)]
        # control tokens (<|im_end|>, ...) are not text: grammars never spell them
        self.special_token_ids = [i for i in range(tokenizer.vocab_size) if tokenizer.is_special(i)]

    def __call__(self, text: str) -> list[int]:
        return self._tok.encode(text, parse_special=False)


class Grammar:
    """A compiled grammar; `start()` gives a fresh Constraint for each sequence (thread-safe)."""

    def __init__(self, grammars: Grammars, matcher):
        self.grammars = grammars
        self._origin = matcher
        self._lock = threading.Lock()

    def start(self) -> "Constraint":
        with self._lock:
            m = self._origin.deep_copy()     # cheaper than compiling again
        return Constraint(m, self.grammars)


class Constraint:
    """One sequence's position in its grammar.

    `banned()` is the mask of the next token as a bool array over the vocabulary (True: the token
    would leave the grammar; EOS is allowed only where the grammar may end); `advance()` follows
    the sampled token, `try_advance()` follows it if the grammar allows it (a check of ~1 us,
    no mask needed). `done`: the grammar can take nothing more. llguidance computes the mask in
    native code with the GIL released; `take_cpu_seconds()` is the CPU the masks and advances took,
    which the server charges to its step (bounds.py).
    """

    def __init__(self, matcher, grammars: Grammars):
        self._m = matcher
        self.n_vocab = grammars.n_vocab
        self._eos = frozenset(grammars.eos_ids)
        self._bits = np.zeros(grammars.words, np.int32)    # bit t of the mask: token t is allowed
        self._cpu = 0.0                                      # CPU of masks and advances since take_cpu_seconds()

    def banned(self) -> np.ndarray:
        mask = _mask(self._m, self._bits,
                     dead_end="no text can continue the output here (e.g. a $ref that only refers to itself)")
        self._cpu += mask.seconds
        if mask.too_costly:      # one such mask, not one a token, for the streams that share the server
            raise ConstraintError(mask.too_costly)
        if mask.failed:
            raise ConstraintError(f"the grammar failed: {mask.failed}")
        # little-endian words: byte k of word w holds tokens 32w+8k..32w+8k+7, lowest bit first
        return np.unpackbits((~self._bits).view(np.uint8), count=self.n_vocab, bitorder="little").view(np.bool_)

    @property
    def cpu_seconds(self) -> float:
        """The CPU its masks and advances took since take_cpu_seconds()."""
        return self._cpu

    def take_cpu_seconds(self) -> float:
        """The CPU its masks and advances took since the last call: the server charges it to its step."""
        seconds, self._cpu = self._cpu, 0.0
        return seconds

    def _timed(self, call, *args):
        """call(*args), its CPU added to the account: advancing is grammar work the step's budget counts too."""
        t0 = bounds.cpu_now()
        try:
            return call(*args)
        finally:
            self._cpu += bounds.cpu_now() - t0

    def advance(self, token: int) -> None:
        if not self._timed(self._m.consume_token, int(token)):
            raise ConstraintError(f"token {token} leaves the grammar: {_failure(self._m)}")

    def try_advance(self, token: int) -> bool:
        """Follow `token` if the grammar allows it here; False (and no change) if not. EOS is never
        followed: whether the output may end there is `accepting`."""
        return int(token) not in self._eos and self._timed(self._m.try_consume_tokens, [int(token)]) == 1

    def allows(self, tokens) -> bool:
        """The grammar takes all of `tokens` from here, none of them EOS (nothing is advanced)."""
        ids = [int(t) for t in tokens]
        return not self._eos.intersection(ids) and self._timed(self._m.validate_tokens, ids) == len(ids)

    @property
    def done(self) -> bool:
        """Nothing more can follow (the output is complete, or the matcher failed)."""
        return self._m.is_stopped()

    @property
    def accepting(self) -> bool:
        """The output so far is a complete sentence of the grammar."""
        return self._m.is_accepting()
