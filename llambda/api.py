"""The Python API: `llambda.load(...)` returns a `Model`."""
from __future__ import annotations

import os
import threading
import warnings
from pathlib import Path
from typing import Iterator, Sequence as Seq

import numpy as np

from . import engine
from .backends import create_backend
from .constraints import Grammar, Grammars, GrammarSpec, grammar_spec
from .engine import GenerationParams, Sequence, TokenEvent, token_ids
from .errors import ChatTemplateError, ContextOverflowError, InvalidInputError, LlambdaWarning, TokenizerError
from .formats.open import open_model
from .hub import is_catalogued, resolve
from .models.base import Transformer
from .sampling import SamplingParams

DEFAULT_CTX = 4096


def load(name_or_path: str | os.PathLike, backend: str | None = None, threads: int | None = None,
         n_ctx: int | None = None, n_slots: int = 1, activations: str | None = None,
         quantize: str | None = None, max_batch: int = 512, kv_type: str | None = None) -> "Model":
    """Load a catalogued model name, a .gguf file or a Hugging Face model directory.

    backend: "native" (the C core, default where it built) or "numpy" (the FP32 reference).
    activations: native only; "f32" for the exact mode, "q8" (default) quantizes activations to 8 bits.
    n_ctx: context length per sequence (default min(training context, 4096)); n_slots: sequences held at once.
    quantize: re-quantize float weights at load (e.g. "q8_0") so the fast kernels apply.
    kv_type: native only; "f32" (default) or "f16" KV cache. f16 halves the cache but moves logits:
      up to 0.025 on the tiny reference models, and it takes SmolLM2's fast mode from a worst top-20
      deviation of 0.43 to 0.57 against the FP32 reference (budget 0.5), so FP32 is the default.
    """
    path = resolve(name_or_path)
    src = open_model(Path(path))
    try:
        cfg = src.config
        kv_type = kv_type or "f32"
        be = create_backend(backend, threads=threads, activations=activations, kv_type=kv_type)
        ctx = int(n_ctx or min(cfg.n_ctx_train, DEFAULT_CTX))
        if ctx <= 1 or n_slots < 1:
            raise ValueError("n_ctx must be > 1 and n_slots >= 1")
        _warn_about_limits(cfg, ctx, threads)
        lookup = src.tensor
        if quantize:
            from .tools.quantize import quantizing_lookup
            lookup = quantizing_lookup(src.tensor, quantize)
        model = Transformer(cfg, lookup, be, n_ctx=ctx, n_slots=n_slots, max_tokens=max_batch)
    except BaseException:
        src.close()
        raise
    m = Model(model, src, be)
    m.name = display_name(name_or_path, Path(path))
    return m


def display_name(name_or_path, path: Path) -> str:
    """What to call a model: its catalogue name, else its file (or directory) name without .gguf.
    The file's own `general.name` stays in `Model.source.name`: it is often a training-run label."""
    if isinstance(name_or_path, str) and is_catalogued(name_or_path):
        return name_or_path
    return path.name[:-5] if path.name.endswith(".gguf") else path.name


def _warn_about_limits(cfg, n_ctx: int, threads: int | None) -> None:
    """Settings that work but rarely do what the user wants: say so once, at load."""
    if cfg.n_ctx_train and n_ctx > cfg.n_ctx_train:
        warnings.warn(f"a context of {n_ctx} tokens is beyond the {cfg.n_ctx_train} this model was trained on: "
                      "text past that point may degrade, and the KV cache grows with the context",
                      LlambdaWarning, stacklevel=4)
    usable = usable_cpus()
    if threads is not None and threads > usable:
        warnings.warn(f"{threads} threads on {usable} usable CPU(s): the extra threads wait for a core "
                      f"and slow every step down; use at most {usable}", LlambdaWarning, stacklevel=4)


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask), not the machine's count."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return os.cpu_count() or 1


class Model:
    """A loaded model. One KV-cache slot serves the library calls, and one call computes at a time.

    Generators (stream/generate/chat_stream) hold the model's lock only while they compute a
    token, never while suspended at a yield: any number of them may be consumed alternately,
    from one thread or several, and logits() in another thread waits at most one token's step.
    Before each step a generator checks that the slot still holds its own tokens (prompt and
    text so far); when another call has used the slot since, it evaluates them again (reusing
    the common prefix), so its text stays a continuation of its own tokens. That re-evaluation
    costs a prefill per switch, and as prompt prefix reuse does, it may round differently from
    the token-by-token path (greedy text can then differ at a near-tie, never become garbage).
    For many concurrent generations use the server's scheduler (`llambda serve`).
    """

    def __init__(self, transformer: Transformer, source, backend):
        self.transformer = transformer
        self.source = source
        self.backend = backend
        self.config = transformer.cfg
        self.tokenizer = source.tokenizer
        self.name = source.name
        self.n_ctx = transformer.n_ctx
        self._lock = threading.RLock()
        self._cached: list[int] = []   # tokens whose keys/values slot 0 holds (prefix reuse)
        self._template = None
        self._grammars = None          # llguidance's view of the vocabulary, built on first use
        self._grammars_lock = threading.Lock()

    # -- text <-> tokens ----------------------------------------------------
    def _tok(self):
        if self.tokenizer is None:
            why = self.source.tokenizer_error or "the model has no tokenizer files"
            raise TokenizerError(f"this model cannot tokenize text: {why}; pass token ids instead")
        return self.tokenizer

    def tokenize(self, text: str, add_bos: bool = False, parse_special: bool = True) -> list[int]:
        return self._tok().encode(text, add_bos=add_bos, parse_special=parse_special)

    def detokenize(self, ids: Seq[int]) -> str:
        return self._tok().decode(list(ids))

    def _prompt_ids(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            # add_bos=True adds BOS only if the model asks for one and the text does not already start with it
            return self._tok().encode(prompt, add_bos=True, parse_special=True)
        return token_ids(prompt, self.config.vocab_size)

    # -- evaluation ----------------------------------------------------------
    def logits(self, ids: Seq[int]) -> np.ndarray:
        """Logits (float32, (vocab,)) at the last position of `ids`, evaluated from an empty cache."""
        ids = token_ids(ids, self.config.vocab_size)
        if not ids:
            raise InvalidInputError("logits() needs at least one token")
        if len(ids) > self.n_ctx:
            raise ContextOverflowError(f"{len(ids)} tokens do not fit the context of {self.n_ctx}")
        with self._lock:
            self._cached = []
            out = engine.prefill(self.transformer, 0, ids, 0)
            self._cached = list(ids)
            return out

    def _prefill_reusing(self, ids: list[int]) -> np.ndarray:
        """Prefill slot 0, skipping the prefix its cache already holds. Call holding the lock."""
        n = len(self._cached)
        if n < len(ids) and self._cached == ids[:n]:
            common = n     # the usual next step of one generation: no per-token loop
        else:
            common = 0
            for a, b in zip(self._cached, ids):
                if a != b:
                    break
                common += 1
        common = min(common, len(ids) - 1)   # the last token is always evaluated, for its logits
        self._cached = self._cached[:common]
        # The last prompt token goes alone, through the same decode path however much of the
        # prompt was cached: batched and single-token kernels round differently, and the same
        # call with the same seed must give the same text.
        if common < len(ids) - 1:
            engine.prefill(self.transformer, 0, ids[common:-1], common)
        logits = engine.prefill(self.transformer, 0, ids[-1:], len(ids) - 1)
        self._cached = list(ids)
        return logits

    def stream(self, prompt, max_tokens: int | None = 256, temperature: float = 0.8, top_k: int = 40,
               top_p: float = 0.95, min_p: float = 0.05, repeat_penalty: float = 1.0, repeat_last_n: int = 64,
               presence_penalty: float = 0.0, frequency_penalty: float = 0.0, seed: int | None = None,
               stop: Seq[str] | str | None = None, ignore_eos: bool = False, logprobs: int = 0,
               logit_bias: dict | None = None, json_schema=None, grammar: str | None = None,
               regex: str | None = None) -> Iterator[TokenEvent]:
        """Generate, yielding a TokenEvent per token (text, logprobs) and a last one with finish_reason.

        At most one of json_schema (a dict or JSON text), grammar (GBNF, or llguidance's Lark) and
        regex constrains the output: only tokens that keep it inside are sampled, and generation
        stops where it is complete. An invalid one raises ConstraintError before any token.
        """
        sp = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                            repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n,
                            presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                            seed=seed, logprobs=logprobs, logit_bias=logit_bias)
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        spec = grammar_spec(json_schema=json_schema, grammar=grammar, regex=regex)
        params = GenerationParams(max_tokens=max_tokens, sampling=sp, stop=stops, ignore_eos=ignore_eos,
                                  grammar=self.compile_grammar(spec) if spec is not None else None)
        ids = self._prompt_ids(prompt)
        if isinstance(logit_bias, dict):
            token_ids(list(logit_bias), self.config.vocab_size, what="logit_bias keys")
        seq = Sequence(self.tokenizer, ids, params, slot=0, n_ctx=self.n_ctx)
        return self._run(seq)

    def _run(self, seq: Sequence) -> Iterator[TokenEvent]:
        while True:
            # The lock is never held across the yield (a suspended generator would block every
            # other caller); so each step first makes slot 0 hold this sequence's tokens again.
            # Uninterrupted, that is the one new token, on the same path as a decode step.
            with self._lock:
                logits = self._prefill_reusing(seq.tokens)
            ev = seq.step(logits)
            yield ev
            if seq.finished:
                return

    def generate(self, prompt, **kw) -> Iterator[int]:
        """Token ids as they are produced (EOS excluded). Options as for stream()."""
        for ev in self.stream(prompt, **kw):
            if ev.token >= 0:
                yield ev.token

    def complete(self, prompt, **kw) -> str:
        return "".join(ev.text for ev in self.stream(prompt, **kw))

    # -- constrained output ---------------------------------------------------
    def grammars(self) -> Grammars:
        """The model's vocabulary as llguidance sees it (built once, on first use; thread-safe)."""
        with self._grammars_lock:     # not the model's lock: building must not hold up generation
            if self._grammars is None:
                self._grammars = Grammars(self._tok(), self.config.vocab_size)
            return self._grammars

    def compile_grammar(self, spec: GrammarSpec) -> Grammar:
        """A GrammarSpec compiled for this model; ConstraintError when it is invalid."""
        return self.grammars().compile(spec)

    # -- chat ---------------------------------------------------------------
    def chat_template(self):
        if self._template is None:
            from .chat import ChatTemplate
            src = self.source.chat_template
            if not src:
                raise ChatTemplateError(
                    f"{self.name!r} has no chat template (a base model?): use complete()/`llambda run` for plain text")
            tok = self.tokenizer
            bos = tok.token_text(tok.bos_id) if tok is not None and tok.bos_id is not None else ""
            eos = tok.token_text(tok.eos_id) if tok is not None and tok.eos_id is not None else ""
            self._template = ChatTemplate(src, bos_token=bos, eos_token=eos)
        return self._template

    def render_chat(self, messages, add_generation_prompt: bool = True, tools=None, **extra) -> str:
        return self.chat_template().render(messages, add_generation_prompt=add_generation_prompt, tools=tools, **extra)

    def chat_stream(self, messages, tools=None, **kw) -> Iterator[TokenEvent]:
        return self.stream(self.render_chat(messages, tools=tools), **kw)

    def chat(self, messages, tools=None, **kw) -> str:
        """The assistant's reply to `messages` (OpenAI-style dicts), as text."""
        return "".join(ev.text for ev in self.chat_stream(messages, tools=tools, **kw))

    # -- housekeeping --------------------------------------------------------
    def memory_report(self) -> dict[str, int]:
        return self.transformer.memory_report()

    def close(self) -> None:
        self.backend.close()
        self.source.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
