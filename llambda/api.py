"""The Python API: `llambda.load(...)` returns a `Model`."""
from __future__ import annotations

import os
import threading
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence as Seq

import numpy as np

from . import engine
from .backends import create_backend
from .backends.native import KV_TYPES, usable_cpus
from .constraints import Grammar, Grammars, GrammarSpec, grammar_spec
from .engine import GenerationParams, Sequence, TokenEvent, token_ids
from .errors import (ChatTemplateError, ContextOverflowError, InvalidInputError, LlambdaWarning, ModelBusyError,
                     ModelClosedError, ModelFormatError, TokenizerError)
from .formats.lora import adapter_specs
from .formats.lora_merge import LoraMerge, merge_peak, open_adapters
from .formats.open import open_named
from .hub import is_catalogued
from .models import encoder_module, memory
from .models.base import Transformer, live_server
from .models.bert import BertConfig, BertEncoder, pack_batch
from .models.config import MAX_POSITIONS
from .models.image_input import ImageInput
from .models.images import DEFAULT_MAX_IMAGES, image_keys, images_agree
from .sampling import SamplingParams, _is_int

DEFAULT_CTX = 4096
_DRAFTS = threading.Lock()    # Model.set_draft: its check for a cycle of drafts and the draft set, one at a time


def load(name_or_path: str | os.PathLike, backend: str | None = None, threads: int | None = None,
         n_ctx: int | None = None, n_slots: int = 1, activations: str | None = None,
         quantize: str | None = None, max_batch: int = 512, kv_type: str | None = None,
         check_memory: bool = True, draft: str | os.PathLike | None = None,
         draft_threads: int | None = None, lora=None, mmproj: str | os.PathLike | None = None,
         vision: bool = True) -> "Model":
    """Load a catalogued model name, a .gguf file or a Hugging Face model directory.

    backend: "native" (the C core, default where it built) or "numpy" (the FP32 reference).
    threads: native only; the threads this model's computations run on (default: one per usable physical
        core). The C core's thread pool is one per process: a load grows it to this count when it has fewer
        threads (it never shrinks it), and each model's forward passes use at most its own count, whatever
        the other models in the process asked for.
    activations: native only; "f32" for the exact mode, "q8" (default) quantizes activations to 8 bits
        (an encoder's fast mode: bfloat16 weights and activations, float32 sums).
    n_ctx: context length per sequence (default min(training context, 4096); at most 2**24); n_slots: sequences
        held at once.
    quantize: re-quantize float weights at load (e.g. "q8_0") so the fast kernels apply. A matrix whose rows do
      not split into the type's blocks (a K-quant's 256 values) takes llama.cpp's fallback (Q4_K -> Q5_0, ...)
      or stays as it is; one LlambdaWarning counts them.
    kv_type: native only; "f32" (default) or "f16" KV cache. f16 halves the cache but moves logits:
      up to 0.025 on the tiny reference models, and it takes SmolLM2's fast mode from a worst top-20
      deviation of 0.43 to 0.57 against the FP32 reference (budget 0.5), so FP32 is the default.
      "q8_0" (ggml's Q8_0 blocks: 34 bytes per 32 values) takes about half of f16's memory, for long
      contexts; it needs head_dim a multiple of 32.
    check_memory: refuse (InsufficientMemoryError) before reading any weight when the weights and the KV
      cache (and the vision tower's weights and activations) exceed the memory available; `Model.memory_plan`
      is the plan either way (models/memory.py).
    draft: a smaller model of the same vocabulary (name or path) for speculative decoding; loaded
      with the same backend, threads, context and quantize=. generate/stream then speculate with it by default;
      draft_threads: the threads its forward passes use (default: threads).
    lora: LoRA adapters merged into the weights at load: a path (a GGUF adapter file or a PEFT directory),
      a (path, scale) pair, or a list of them (a tuple of paths only is a list); each adapter's update is
      scaled by its scale (default 1).
      A quantized weight is dequantized, merged and quantized again to its own type (a warning says so).
      `Model.adapters` describes them. Not applied to the draft model.
    mmproj: where the vision tower is (llambda.vision): llama.cpp's mmproj GGUF beside a GGUF model. Without it
      the model's own files are read for one (a Hugging Face directory of Gemma 3, Ollama's gemma3 GGUF); a
      tower found there that cannot be read is a warning and the model loads for text only. vision=False
      loads no tower (its memory and load time saved; the model then takes no images).
    """
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise InvalidInputError(f"load() takes a model name or a path, got {type(name_or_path).__name__}")
    _check_counts(n_ctx=(n_ctx, 0, True), n_slots=(n_slots, 1, False), threads=(threads, 0, True),
                  max_batch=(max_batch, 1, False))
    # plain ints from here: sizes computed from an np.int8 count overflowed (a raw OverflowError)
    n_slots, max_batch = int(n_slots), int(max_batch)
    n_ctx, threads = (None if v is None else int(v) for v in (n_ctx, threads))
    # (a str first: a list here was an unhashable TypeError)
    if kv_type is not None and (not isinstance(kv_type, str) or kv_type not in KV_TYPES):
        raise InvalidInputError(f"kv_type must be one of {sorted(KV_TYPES)}, got {kv_type!r}")
    _check_flag("vision", vision)
    if mmproj is not None and not isinstance(mmproj, (str, os.PathLike)):
        raise InvalidInputError(f"mmproj must be a path, got {type(mmproj).__name__}")
    lora_specs = adapter_specs(lora)
    path, src = open_named(name_or_path)
    if isinstance(src.config, BertConfig):
        if lora_specs or mmproj is not None:
            src.close()
            raise InvalidInputError(f"{'LoRA adapters (lora=)' if lora_specs else 'a vision tower (mmproj=)'} apply "
                                    "to decoder models, not encoders")
        return _load_encoder(name_or_path, path, src, backend, threads, activations, quantize)
    adapters, merge = [], None
    try:
        cfg = src.config
        kv_type = kv_type or "f32"
        be = create_backend(backend, threads=threads, activations=activations, kv_type=kv_type)
        ctx = int(n_ctx or min(cfg.n_ctx_train, DEFAULT_CTX))
        if not 1 < ctx <= MAX_POSITIONS:
            # past 2^24 positions are not exact in float32 (RoPE) and the C core refuses the cache: that
            # was a raw ValueError at the first forward step, after allocating the whole KV cache
            raise InvalidInputError(f"n_ctx must be in 2..{MAX_POSITIONS}, got {ctx}")
        _warn_about_limits(cfg, ctx, threads)
        lookup, at_load = src.recording_lookup(), None
        if lora_specs:
            adapters = open_adapters(lora_specs, src)
            merge = LoraMerge(lookup, adapters, cfg, release=src.release)
            lookup = merge.lookup
        if quantize:
            from .tools.quantize import load_fallback_note, qtype_at_load, quantizing_lookup
            lookup, at_load = quantizing_lookup(lookup, quantize, release=src.release), qtype_at_load(quantize)
            note = load_fallback_note(src.tensors(), quantize)
            if note:
                warnings.warn(note, LlambdaWarning, stacklevel=2)
        mplan = plan_memory(src, be, ctx, n_slots, max_batch, qtype_at_load=at_load, vision=vision, mmproj=mmproj)
        mplan.merge_peak = merge_peak(adapters, src) if adapters else 0
        if check_memory:
            memory.check(mplan)
        with src.reading_ahead(), be.loading(mplan.weights):
            model = Transformer(cfg, lookup, be, n_ctx=ctx, n_slots=n_slots, max_tokens=max_batch,
                                release=src.release, file_names=src.file_names)
        src.check_all_read()
        if merge is not None:
            merge.finish()
    except BaseException:
        src.close()
        raise
    finally:
        for ad in adapters:
            ad.close()
    m = Model(model, src, be)
    m.adapters = [ad.describe() for ad in adapters]
    m.memory_plan = mplan
    m.name = display_name(name_or_path, path)
    try:
        _attach_tower(m, src, be, threads, activations, mmproj, vision)
    except BaseException:
        m.close()
        raise
    if m.vision is None:        # none found, or one that could not be read: the plan is the text model's
        memory.without_vision(mplan)
    if draft is not None:
        try:
            m.set_draft(load(draft, n_ctx=m.n_ctx, n_slots=n_slots, backend=backend, threads=threads,
                             activations=activations, kv_type=kv_type, quantize=quantize, vision=False),
                        threads=draft_threads)
        except BaseException:
            m.close()
            raise
    return m


def _attach_tower(m: "Model", src, be, threads, activations, mmproj, vision) -> None:
    """The vision tower of `mmproj`, else of the model's own files, attached to m (none with vision=False)."""
    if not vision:
        return
    from .vision import load_vision
    if mmproj is not None:      # asked for: any failure is the load's
        tower = load_vision(mmproj, backend=be, threads=threads, activations=activations)
        if tower is None:
            raise InvalidInputError(f"{os.fspath(mmproj)} holds no vision tower this engine reads")
        _attach_or_close(m, tower)
        return
    try:                        # found in the model's own files: a tower that does not fit costs the images only
        tower = load_vision(src, backend=be, threads=threads, activations=activations)
        if tower is not None:
            _attach_or_close(m, tower)
    except (ModelFormatError, InvalidInputError) as e:
        warnings.warn(f"{m.name}: its vision tower cannot be used ({e}); the model loads for text only",
                      LlambdaWarning, stacklevel=4)


def _plan_tower(mplan, src, be, mmproj) -> None:
    """Count in `mplan` the vision tower _attach_tower would attach (its VisionConfig, read from the files'
    headers: no weight is read), at the bytes its backend keeps a weight in (as an encoder's: bfloat16 in the
    native fast mode). A tower that cannot be read is planned as none: attaching it says why."""
    from .vision.load import open_layout
    try:
        with warnings.catch_warnings():      # an unsupported tower's warning is said once, when attaching
            warnings.simplefilter("ignore")
            layout = open_layout(Path(mmproj if mmproj is not None else src.path))
    except (OSError, ValueError):   # the typed errors of a file that cannot be read (ModelFormatError, ...)
        return
    if layout is None:
        return
    for close in layout.closers:
        close()
    memory.add_vision(mplan, layout.cfg, _dense_bytes(be), os.fspath(mmproj) if mmproj is not None else "")


def _attach_or_close(m: "Model", tower) -> None:
    try:
        m.attach_vision(tower)
    except BaseException:
        tower.close()
        raise


def _check_counts(**args) -> None:
    """InvalidInputError unless each value is an integer >= its minimum (or None where optional): a
    string or a negative count used to fail deep in the load as a raw TypeError or ValueError."""
    for name, (v, lo, optional) in args.items():
        if v is None and optional:
            continue
        if not _is_int(v) or v < lo:
            raise InvalidInputError(f"{name} must be an integer >= {lo}{' or None' if optional else ''}, got {v!r}")


def _check_flag(name: str, v) -> None:
    """InvalidInputError unless v is a bool: "no" would count as true."""
    if not isinstance(v, bool):
        raise InvalidInputError(f"{name} must be True or False, got {v!r}")


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
        warnings.warn(f"{threads} threads on {usable} usable CPU(s) (affinity mask and cgroup CPU quota): the "
                      f"extra threads wait for a core; use at most {usable}", LlambdaWarning, stacklevel=4)


class Model:
    """A loaded model. One KV-cache slot serves the library calls, and one call computes at a time.

    Generators (stream/generate/chat_stream) hold the model's lock only while they compute a
    token, never while suspended at a yield: any number of them may be consumed alternately,
    from one thread or several, and logits() in another thread waits at most one token's step.
    Before each step a generator checks that the slot still holds its own tokens (prompt and
    text so far); when another call has used the slot since, it evaluates them again (reusing
    the common prefix), so its text stays a continuation of its own tokens. That re-evaluation
    costs a prefill per switch; with the native backend's default batch invariance it computes the
    same bits as the first evaluation did (with `backend.set_batch_invariant(False)` it may round
    differently, and greedy text can then differ at a near-tie, never become garbage).
    For many concurrent generations use the server's scheduler (`llambda serve`).

    close() (or leaving `with llambda.load(...) as m:`) frees the model's memory at once; see close().
    """

    def __init__(self, transformer: Transformer, source, backend):
        self.transformer = transformer
        self.source = source
        self.memory_plan = None     # llambda.memory.MemoryPlan, set by load()
        self.adapters: list[dict] = []  # the LoRA adapters merged at load (path, format, scale, tensors, rank)
        self.backend = backend
        self.config = transformer.cfg
        self.tokenizer = source.tokenizer
        self.name = source.name
        self.n_ctx = transformer.n_ctx
        self._lock = threading.RLock()
        self._cached: list[int] = []   # tokens whose keys/values slot 0 holds (prefix reuse)
        self._server_seen = None       # the scheduler thread that last ran the model (transformer.served_by)
        self._template = None
        self._template_error: str | None = None   # a template that did not compile, said again without recompiling
        self._thought_after: str | None = None    # what the template writes after `</think>` (on first use)
        self._grammars = None          # llguidance's view of the vocabulary, built on first use
        self._grammars_lock = threading.Lock()
        self.draft: Model | None = None  # the draft model for speculative decoding (load(..., draft=))
        self.drafter = None             # drafts from self.draft (speculative.DraftModel)
        self.spec_stats = None           # drafted/accepted counts of the last speculative generation
        self._closed = self._freed = False
        self.max_images = DEFAULT_MAX_IMAGES   # images one chat request may hold
        self.image_input = ImageInput(self)      # the vision tower (attach_vision) and the images it encodes
        self._cached_images: tuple = ()  # the images among the tokens slot 0 holds (models/images.ImageKey)

    def _check_open(self) -> None:
        if self._closed:
            raise ModelClosedError(f"the model {self.name!r} was closed (close() freed it): load it again")

    @property
    def closed(self) -> bool:
        """Whether close() was called (a server serving the model answers 503 from then on)."""
        return self._closed

    def _network(self):
        return self.transformer

    # -- text <-> tokens ----------------------------------------------------
    def _tok(self):
        self._check_open()
        if self.tokenizer is None:
            why = self.source.tokenizer_error or "the model has no tokenizer files"
            raise TokenizerError(f"this model cannot tokenize text: {why}; pass token ids instead")
        return self.tokenizer

    def tokenize(self, text: str, add_bos: bool = False, parse_special: bool = True) -> list[int]:
        return self._tok().encode(text, add_bos=add_bos, parse_special=parse_special)

    def detokenize(self, ids: Seq[int]) -> str:
        return self._tok().decode(ids)     # decode checks ids (None, a str, floats) with a TokenizerError

    def _prompt_ids(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            # add_bos=True adds BOS only if the model asks for one and the text does not already start with it
            ids = self._tok().encode(prompt, add_bos=True, parse_special=True)
            if ids and max(ids) >= self.config.vocab_size:
                raise ModelFormatError(f"the tokenizer gave token id {max(ids)} but the model has only "
                                       f"{self.config.vocab_size} token embeddings: tokenizer and weights differ")
            return ids
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
            self._take_slot()
            self._cached, self._cached_images = [], ()
            out = engine.prefill(self.transformer, 0, ids, 0)
            self._cached = list(ids)
            return out

    def _check_not_served(self) -> None:
        """ModelBusyError while a server's scheduler runs this model, unless called on its thread
        (embeddings in its spare slot): a library forward beside its steps would overwrite their
        activations and its slot 0, and both would compute garbage."""
        thread = live_server(self.transformer)
        if thread is not None and thread is not threading.current_thread():
            raise ModelBusyError(f"{self.name!r} is being served (create_app / llambda serve): its forward passes "
                                 "and KV-cache slots belong to the server's scheduler until it stops; send the "
                                 "request to the server, or load the model a second time for library calls")

    def _take_slot(self) -> None:
        """Before a library forward, holding the lock: refused once closed or while served; and once a
        scheduler has run the model, slot 0 holds its sequences' keys/values, not the prefix _cached names."""
        self._check_open()
        self._check_not_served()
        server = self.transformer.served_by
        if server is not self._server_seen:
            self._cached, self._cached_images = [], ()
            self._server_seen = server

    def _sync(self, ids: list[int], images: tuple = ()) -> None:
        """Make slot 0 hold the keys/values of exactly `ids` (and its image blocks), reusing the prefix it
        holds (up to where the images differ); what it lacks is prefilled as a prompt is. Call holding the
        lock: each step of a generation does, so one still open after close() raises ModelClosedError here."""
        self._take_slot()
        # a hybrid model's recurrent state resumes only where it is (Transformer.resume_point)
        common = images_agree(engine.common_prefix(self._cached, ids), self._cached_images, images)
        common = self.transformer.resume_point(0, common)
        self._cached = self._cached[:common]
        self._cached_images = image_keys(b for b in images if b.end <= common)
        if common < len(ids):
            engine.prefill(self.transformer, 0, ids[common:], common, images)
        self._cached = list(ids)
        self._cached_images = image_keys(b for b in images if b.start < len(ids))

    @contextmanager
    def rows_invariant(self):
        """Forward passes inside run batch-invariantly, then the backend's own setting is back.
        Decode steps (a lone token, a speculative verification's rows) are invariant, so a row's
        logits are the same bits alone or verified among drafts; a prompt's bulk prefill runs under
        the backend's own setting (the default schedule, unless the caller made it invariant, as the
        server does): this never turns a caller's invariance off."""
        b = self.backend
        if not hasattr(b, "set_batch_invariant") or b.batch_invariant:
            yield
            return
        b.set_batch_invariant(True)
        try:
            yield
        finally:
            b.set_batch_invariant(False)

    def _prefill_reusing(self, ids: list[int], images: tuple = ()) -> np.ndarray:
        """Prefill slot 0, skipping the prefix its cache already holds; the logits of the last token
        (never an image's: check_prompt). Call holding the lock."""
        # The last prompt token goes alone, through the same decode path however much of the
        # prompt was cached: batched and single-token kernels round differently, and the same
        # call with the same seed must give the same text.
        self._sync(ids[:-1], images)
        with self.rows_invariant():
            logits = engine.prefill(self.transformer, 0, ids[-1:], len(ids) - 1, images)   # (images: its RoPE position)
        self._cached = list(ids)
        return logits

    def stream(self, prompt, max_tokens: int | None = 256, temperature: float = 0.8, top_k: int = 40,
               top_p: float = 0.95, min_p: float = 0.05, repeat_penalty: float = 1.0, repeat_last_n: int = 64,
               presence_penalty: float = 0.0, frequency_penalty: float = 0.0, seed: int | None = None,
               stop: Seq[str] | str | None = None, ignore_eos: bool = False, logprobs: int = 0,
               logit_bias: dict | None = None, json_schema=None, grammar: str | None = None,
               regex: str | None = None, speculative: str | None = "auto",
               draft_max: int | None = None, thinking=None, images=()) -> "Stream":
        """Generate, yielding a TokenEvent per token (text, logprobs) and a last one with finish_reason.
        The Stream's close() may be called from another thread: it ends before its next step.

        speculative: "draft" (the model loaded with load(..., draft=)), "lookup" (prompt lookup:
        drafts copied from earlier text) or None; "auto" is "draft" when a draft model is loaded,
        else None. The output is the same as without it, token for token (with a seed, sampled
        output too); draft_max caps the tokens drafted per step.

        At most one of json_schema (a dict or JSON text), grammar (GBNF, or llguidance's Lark) and
        regex constrains the output: only tokens that keep it inside are sampled, and generation
        stops where it is complete. An invalid one raises ConstraintError before any token.

        thinking: a thinking.ThinkingBudget (chat_stream builds it): a `<think>` thought is closed
        once it has run that many tokens; with holds_grammar the constraint above waits for the
        thought's end (chat_stream on a thinking template: the format constrains the answer).

        images: the image blocks of a prompt of token ids (image_prompt builds them; chat_stream takes
        image parts in messages). Speculative decoding does not take them: "auto" then decodes plainly,
        an explicit mode is an InvalidInputError.
        """
        self._check_open()
        sp = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                            repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n,
                            presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                            seed=seed, logprobs=logprobs, logit_bias=logit_bias)
        try:        # not `stop or []`: an int would be dropped silently, an array has no truth value
            if isinstance(stop, (dict, set, frozenset)):    # its keys or an unordered set are no list of stops
                raise TypeError
            stops = [stop] if isinstance(stop, str) else [] if stop is None else list(stop)
        except TypeError:
            raise InvalidInputError(f"stop must be a string or a list of strings, got {type(stop).__name__}") from None
        spec = grammar_spec(json_schema=json_schema, grammar=grammar, regex=regex)
        params = GenerationParams(max_tokens=max_tokens, sampling=sp, stop=stops, ignore_eos=ignore_eos,
                                  grammar=self.compile_grammar(spec) if spec is not None else None,
                                  thinking=thinking)
        ids = self._prompt_ids(prompt)
        images = tuple(images or ())
        self.check_prompt_images(ids, images)
        if isinstance(logit_bias, dict):
            token_ids(list(logit_bias), self.config.vocab_size, what="logit_bias keys")
        seq = Sequence(self.tokenizer, ids, params, slot=0, n_ctx=self.n_ctx, images=images)
        self._check_not_served()      # at the call, as the other checks (each step checks again)
        if images and speculative not in ("auto", None):
            raise InvalidInputError("speculative decoding does not take images: pass speculative=None")
        mode = None if images else self._speculative_mode(speculative)
        ws = self.transformer.ws
        if draft_max is not None and mode is None:      # unused, still checked (as every other argument)
            from .speculative import check_draft_max
            check_draft_max(draft_max, max(1, min(ws.max_logit_rows, ws.max_tokens) - 1))
        # a verification feeds the last token and its drafts in one forward: max_batch (ws.max_tokens)
        # bounds them too, else a draft model's round was a raw ValueError at load(max_batch=1)
        limit = min(ws.max_logit_rows, ws.max_tokens) - 1
        if mode is None or (limit < 1 and speculative == "auto"):
            return Stream(self._run(seq))
        if limit < 1:
            raise InvalidInputError(f"speculative decoding needs max_batch >= 2 (this model was loaded with "
                                    f"{ws.max_tokens})")
        from . import speculative as spec
        k = spec.check_draft_max(draft_max if draft_max is not None else min(spec.DEFAULT_DRAFT_MAX[mode], limit), limit)
        drafter = self.drafter if mode == "draft" else spec.PromptLookup()
        self.spec_stats = spec.SpecStats()
        return Stream(spec.stream(self, seq, spec.Speculation(drafter, k, self.spec_stats)))

    def _speculative_mode(self, speculative) -> str | None:
        if speculative == "auto":
            return "draft" if self.draft is not None else None
        from .speculative import check_mode, check_rollback
        mode = check_mode(speculative)
        if mode is not None:
            check_rollback(self.config)
        if mode == "draft" and self.draft is None:
            raise InvalidInputError("speculative='draft' needs a draft model: load(..., draft=NAME_OR_PATH)")
        return mode

    def set_draft(self, draft: "Model | None", threads: int | None = None) -> None:
        """Use `draft` (a loaded model, which this one then owns) for speculative decoding, its drafting
        forward passes on `threads` (default: the threads it was loaded with); VocabularyMismatchError
        when its tokens are not this model's."""
        self._check_open()
        if draft is None:
            self.draft = self.drafter = None
            return
        if not isinstance(draft, Model):    # an EncoderModel or a path has no transformer to draft with
            raise InvalidInputError(f"set_draft() takes a loaded decoder model (llambda.load), "
                                    f"got {type(draft).__name__}")
        from . import speculative
        # one set_draft at a time, from the cycle check to the draft set: two at once (a.set_draft(b),
        # b.set_draft(a)) both passed the check
        with _DRAFTS:
            # a draft round holds this model's lock, then the draft's: a draft that drafts with this model
            # again would take them in the other order (a deadlock between two threads)
            seen, d = set(), draft.draft
            while d is not None and id(d) not in seen:
                if d is self:
                    raise InvalidInputError("the draft model speculates with this model: a cycle of drafts")
                seen.add(id(d))
                d = d.draft
            try:
                speculative.check_rollback(self.config)
                speculative.check_rollback(draft.config, "the draft model")
                _check_counts(draft_threads=(threads, 1, True))
                threads = None if threads is None else int(threads)     # np.int64(2) was refused
                self.drafter = speculative.DraftModel(draft.transformer, draft.tokenizer, self.tokenizer,
                                                      self.config.vocab_size, n_slots=self.transformer.n_slots,
                                                      threads=threads, owner=draft)
            except BaseException:
                draft.close()
                raise
            self.draft = draft

    def _run(self, seq: Sequence) -> Iterator[TokenEvent]:
        while True:
            # The lock is never held across the yield (a suspended generator would block every
            # other caller); so each step first makes slot 0 hold this sequence's tokens again.
            # Uninterrupted, that is the one new token, on the same path as a decode step.
            with self._lock:
                logits = self._prefill_reusing(seq.tokens, seq.images)
            ev = seq.step(logits)
            yield ev
            if seq.finished:
                return

    def generate(self, prompt, **kw) -> "Stream":
        """Token ids as they are produced (EOS excluded). Options as for stream(), which checks them
        at the call; its close() may come from another thread too."""
        return Stream(ev.token for ev in self.stream(prompt, **kw) if ev.token >= 0)

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
        if not isinstance(spec, GrammarSpec):
            raise InvalidInputError(f"compile_grammar() needs a GrammarSpec (llambda.constraints.grammar_spec), "
                                    f"got {type(spec).__name__}")
        return self.grammars().compile(spec)

    # -- chat ---------------------------------------------------------------
    def chat_template(self):
        self._check_open()
        if self._template is None:
            if self._template_error is not None:    # compiling a broken template again costs up to seconds
                raise ChatTemplateError(self._template_error)
            from .chat import ChatTemplate
            src = self.source.chat_template
            if not src:
                raise ChatTemplateError(
                    f"{self.name!r} has no chat template (a base model?): use complete()/`llambda run` for plain text")
            tok = self.tokenizer
            bos = tok.token_text(tok.bos_id) if tok is not None and tok.bos_id is not None else ""
            eos = tok.token_text(tok.eos_id) if tok is not None and tok.eos_id is not None else ""
            try:
                self._template = ChatTemplate(src, bos_token=bos, eos_token=eos)
            except ChatTemplateError as e:
                self._template_error = str(e)
                raise
        return self._template

    def render_chat(self, messages, add_generation_prompt: bool = True, tools=None, **extra) -> str:
        """The chat template's text; image parts (models with a vision tower only) as the template writes
        them or, where it does not, as the begin-of-image text in the part's place (chat.py)."""
        return self.chat_template().render(messages, add_generation_prompt=add_generation_prompt, tools=tools,
                                           image_marker=self.image_marker, **extra)

    def literal(self, value):
        """A caller's strings (in messages, tools, template variables: dicts and lists of them) with the
        text of the model's control tokens in them kept as text when the rendered prompt is tokenized
        (tokenizer/literal.py): a user's `<|im_end|>` cannot end its turn. A model without a tokenizer: as given."""
        return value if self.tokenizer is None else self.tokenizer.literals.mark(value)

    def restore_literal(self, text: str) -> str:
        """The text a prompt of literal() strings stands for (to be shown, not tokenized)."""
        return text if self.tokenizer is None else self.tokenizer.literals.restore(text)

    # -- images (models/image_input.ImageInput) ----------------------------------
    @property
    def vision(self):
        """The vision tower (attach_vision), or None: a text-only model."""
        return self.image_input.tower

    @property
    def accepts_images(self) -> bool:
        """Whether chat messages may hold image parts: a vision tower is attached (attach_vision).
        ModelClosedError after close() (its tower was freed with it), as every call on a closed model."""
        self._check_open()
        return self.vision is not None

    @property
    def image_marker(self) -> str | None:
        """The text an image part becomes in a prompt (chat.py; Gemma 3's begin-of-image token, Idefics3's
        `<image>`, Qwen2-VL's `<|vision_start|><|image_pad|><|vision_end|>`, InternVL's `<IMG_CONTEXT>`), or None: no
        images taken."""
        return self.image_input.layout.marker if self.vision is not None else None

    @property
    def image_block_tokens(self) -> int:
        """The tokens of an image block that one forward must hold whole (Gemma 3: its soft tokens and their
        begin and end; 0 where attention over images is causal, Idefics3: a chunk may end anywhere)."""
        self._check_open()
        if self.vision is None:
            return 0
        return self.image_input.layout.block_tokens(int(self.vision.tokens_per_image or 0))

    def attach_vision(self, tower, load_image=None) -> None:
        """Attach a vision tower (llambda.vision's VisionTower: family, tokens_per_image, hidden, attends, grid,
        pixels, encode or encode_one, close), which this model then owns (close() closes it); None detaches it.
        A tower without `family` is taken for Gemma 3's (one crop an image, attending within its block). Its
        rows must be this model's width, the model must know its image tokens (Gemma 3: a HF config's
        boi/eoi/image_token_index, else the vocabulary's <start_of_image>, <end_of_image>, <image_soft_token>;
        Idefics3: image_token_id, else <image>; Qwen2-VL: the vision start/end and image pad tokens, and M-RoPE
        sections; Qwen3-VL: the same, interleaved sections, and its `deepstack` levels, whose columns follow the
        embeddings' in each row: at most one a decoder layer, and the model's own count where its files name one;
        InternVL: image_token_id, else <IMG_CONTEXT>, and <img> / </img> from the vocabulary),
        and a block must fit a forward and the context.
        load_image(data) -> image: what decodes an image part's bytes (bytes, bytearray or memoryview, as given)
        for tower.pixels (default: llambda.vision's load_image, whose limits refuse bad or hostile files with an
        InvalidInputError)."""
        self._check_open()
        self.image_input.attach(tower, load_image)

    def check_prompt_images(self, ids: list[int], images: tuple = ()) -> None:
        """InvalidInputError unless the image blocks lie over the prompt's image soft tokens and every soft
        token is under one (models/images.check_prompt): a text or token ids that hold the image token with
        no image (a user typing `<image>`) are refused, by the library and the server alike."""
        self.image_input.check_prompt(ids, images)

    def check_images(self, images: list) -> list[bytes]:
        """The images of a request, checked: none, or this model takes images and at most max_images."""
        return self.image_input.check_images(images)

    def image_prompt(self, text: str, images: list[bytes]) -> tuple[list[int], tuple]:
        """A rendered chat prompt holding one image marker per image -> (its token ids with each image expanded
        as the family's processor expands it, the blocks with the tower's rows)."""
        images = self.check_images(images)
        ids, starts = self.image_ids(text, images)
        return ids, self.encode_images(images, starts)

    def image_ids(self, text: str, images) -> tuple[list[int], list[tuple]]:
        """The token ids of a prompt text holding one image marker per image, each expanded as the family's
        processor does (Gemma 3: "\n\n" begin, the soft tokens, end "\n\n"; Idefics3: a run of soft tokens per
        crop of the image's grid; Qwen2-VL: a token per cell of its grid), and each image's run starts; no image
        is decoded (a prompt's token count). images: the image files' bytes (their sizes read from their
        headers: the Idefics3 and Qwen2-VL layouts depend on them), or their count where the tower's layout
        does not depend on size (Gemma 3, LLaVA)."""
        return self.image_input.prompt_ids(text, images)

    def image_rows_bytes(self, ids: list[int], starts: list) -> int:
        """The bytes of the rows encode_images(images, starts) gives for image_ids' (ids, starts), known before any
        image is decoded: float32, one row a soft token, the attached tower's width (Qwen3-VL's DeepStack levels'
        columns too); 0 without images. What a server's request holds until its prompt is prefilled."""
        return self.image_input.rows_bytes(ids, starts)

    def encode_images(self, images: list[bytes], starts: list) -> tuple:
        """The image blocks at `starts` (one entry an image: its runs' starts, image_ids', or an int for an image
        of one run): each image decoded, then the tower's rows for all of them; an image
        encoded lately (the same file's bytes: a conversation sends its images with every turn) takes the
        rows kept from then. The tower runs under the image input's lock (one encoding at a time through
        its buffers), not the model's lock: a generation's steps, or a server's scheduler, go on meanwhile
        (the C core interleaves their ops with the tower's)."""
        return self.image_input.encode(images, starts)

    def chat_stream(self, messages, tools=None, template_kwargs=None, thinking_budget: int | None = None,
                    **kw) -> Iterator[TokenEvent]:
        """The reply's token events; `template_kwargs`: extra chat-template variables, e.g.
        {"enable_thinking": False} (Qwen3, SmolLM3) or {"reasoning_effort": "low"} (gpt-oss); a
        template that does not read one ignores it (checked by chat.check_template_kwargs).
        `thinking_budget`: a `<think>` thought (Qwen3, SmolLM3, QwQ, R1) is closed once it has run
        that many tokens, and the answer follows; a template without one ignores it."""
        from .chat import check_template_kwargs, message_images
        from .thinking import check_budget
        extra = check_template_kwargs(template_kwargs)
        budget = check_budget(thinking_budget) if thinking_budget is not None else None
        images = self.check_images(message_images(messages))
        # the callers' strings literal: a control token's text in them is not that token
        prompt = self.render_chat(self.literal(messages), tools=self.literal(tools), **self.literal(extra))
        spec = grammar_spec(json_schema=kw.get("json_schema"), grammar=kw.get("grammar"), regex=kw.get("regex"))
        thinking = self._thinking(prompt, budget, spec)
        if images:
            ids, blocks = self.image_prompt(prompt, images)
            return self.stream(ids, thinking=thinking, images=blocks, **kw)
        return self.stream(prompt, thinking=thinking, **kw)

    def _thinking(self, prompt: str, tokens: int | None, spec: GrammarSpec | None):
        """The ThinkingBudget of a chat prompt (a budget, a grammar that waits for the thought's end),
        or None where there is neither or the template has no `<think>` thought; decided as the
        server decides it (thinking.output_thinking)."""
        from .thinking import output_thinking, prompt_thought, template_thinks
        thought = prompt_thought(template_thinks(self.source.chat_template), prompt)
        return output_thinking(thought, tokens, spec, self._tok, self._text_after_thought)

    def _text_after_thought(self) -> str:
        """What the chat template writes after `</think>` (thinking.text_after_close), rendered once: the
        library's chat and the server's requests both ask."""
        if self._thought_after is None:
            from .thinking import text_after_close
            self._thought_after = text_after_close(self.render_chat)
        return self._thought_after

    def chat(self, messages, tools=None, template_kwargs=None, thinking_budget: int | None = None, **kw) -> str:
        """The assistant's reply to `messages` (OpenAI-style dicts), as text (a reasoning model's
        `<think>...</think>` included: the server splits it off as reasoning_content)."""
        return "".join(ev.text for ev in self.chat_stream(messages, tools=tools, template_kwargs=template_kwargs,
                                                          thinking_budget=thinking_budget, **kw))

    # -- embeddings ------------------------------------------------------------
    is_encoder = False
    is_reranker = False

    def embed(self, texts, batch_size: int = 32, slot: int = 0, truncate: bool = False) -> np.ndarray:
        """(n, d_model) L2-normalized vectors: a decoder used as an embedder is pooled on its last
        token (the final-normed hidden state there). `texts`: strings or lists of token ids.
        One input at a time (batch_size is accepted for symmetry with encoders); `slot`: the
        KV-cache slot it overwrites (the server passes one its scheduler does not use). An input
        longer than the context is a ContextOverflowError, or with truncate=True cut to its first
        n_ctx tokens (as Ollama cuts one)."""
        items = _embed_inputs(texts)
        _check_flag("truncate", truncate)
        t = self.transformer
        # checked here: slot "0" would write slot 0 without the _cached reset below (the next
        # generation would reuse keys/values of the embedded text), slot 5 would be a raw ValueError
        if not _is_int(slot) or not 0 <= slot < t.n_slots:
            raise InvalidInputError(f"slot must be an integer in [0, {t.n_slots}), got {slot!r}")
        slot = int(slot)
        out = np.empty((len(items), self.config.d_model), np.float32)
        with self._lock:
            self._take_slot()
            if slot == 0:
                self._cached = []      # slot 0 is overwritten: nothing in it is a generation's prefix
            for r, item in enumerate(items):
                ids = self._prompt_ids(item) if isinstance(item, str) else token_ids(item, self.config.vocab_size)
                if not ids:
                    raise InvalidInputError("cannot embed an empty input")
                if truncate:
                    ids = ids[:self.n_ctx]
                if len(ids) > self.n_ctx:
                    raise ContextOverflowError(f"{len(ids)} tokens do not fit the context of {self.n_ctx}")
                head, last = ids[:-1], ids[-1:]
                if head:
                    engine.prefill(t, slot, head, 0)
                h = t.final_hidden(np.asarray(last, np.int32), np.full(1, slot, np.int32),
                                   np.asarray([len(ids) - 1], np.int32), [0])[0]
                out[r] = h / max(float(np.linalg.norm(h)), 1e-12)
        return out

    def embed_token_counts(self, texts, truncate: bool = False) -> list[int]:
        """Tokens each input takes (usage.prompt_tokens of /v1/embeddings): as many as it has, or
        with truncate=True as many as embed(truncate=True) runs (at most n_ctx)."""
        _check_flag("truncate", truncate)
        counts = [len(self._prompt_ids(x)) if isinstance(x, str) else len(x) for x in _embed_inputs(texts)]
        return [min(n, self.n_ctx) for n in counts] if truncate else counts

    # -- housekeeping --------------------------------------------------------
    def memory_report(self) -> dict[str, int]:
        self._check_open()
        return self.transformer.memory_report()

    def close(self) -> None:
        """Free the model's memory now: its weights, KV cache, activations, recorded plans, file mappings
        and its draft model. A call computing when close() comes finishes first (close() takes the model's
        lock: a logits() or embed() call, a generation's current token); a generation still open then
        raises ModelClosedError at its next token, as does every later call. A second close() does nothing."""
        # Said before taking the lock: a generation's next step stops at once, where a consumer looping on
        # next() could take the lock (not a fair one) again and again before close() gets it.
        self._closed = True
        with self._lock:
            if self._freed:
                return
            self._freed = True
            draft = getattr(self, "draft", None)
            if draft is not None:
                self.draft = self.drafter = None    # first: a cycle of drafts (m.set_draft(m)) was a RecursionError
                draft.close()
            if getattr(self, "image_input", None) is not None:     # (an EncoderModel has none)
                self.image_input.replace(None)   # under its lock: an encoding under way ends first
            self._network().close()     # the arrays go now, whoever still holds the network
            self._grammars = None
            self.backend.close()
            self.source.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Stream:
    """The items of one generation (TokenEvents; token ids from generate()): an iterator whose
    close() may come from any thread.

    A generator's close() from another thread while it computes raises ValueError ("generator
    already executing"), and so does a second thread's next(): here close() marks the stream,
    which ends before its next step (the one being computed is still returned), and concurrent
    next() calls take turns."""

    def __init__(self, gen):
        self._gen = gen
        self._turn = threading.Lock()
        self._closed = False

    def __iter__(self):
        return self

    def __next__(self):
        with self._turn:
            if self._closed:
                self._gen.close()
                raise StopIteration
            return next(self._gen)

    def close(self) -> None:
        self._closed = True
        if self._turn.acquire(blocking=False):     # not being consumed now: end it at once
            try:
                self._gen.close()
            finally:
                self._turn.release()


def _embed_inputs(texts) -> list:
    """A string, a list of strings, a list of token ids or a list of lists of ids -> a list of inputs."""
    if isinstance(texts, str):
        return [texts]
    if isinstance(texts, (bytes, bytearray)):   # iterable, but its bytes are not token ids
        raise InvalidInputError(f"embed() takes strings or lists of token ids, got {type(texts).__name__}")
    try:
        items = list(texts)
    except TypeError:
        raise InvalidInputError(f"embed() takes a string or a list of inputs, got {type(texts).__name__}") from None
    if items and all(isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in items):
        return [items]          # one input given as token ids
    for i in items:
        if not isinstance(i, str) and not (isinstance(i, (list, tuple, np.ndarray))):
            raise InvalidInputError(f"embed() takes strings or lists of token ids, got {type(i).__name__}")
    return items


def plan_memory(src, be, n_ctx: int = DEFAULT_CTX, n_slots: int = 1, max_batch: int = 512, qtype_at_load=None,
                vision: bool = False, mmproj=None):
    """The memory plan of loading `src` on backend `be`, as load() makes it (and `llambda show -v` prints):
    weights in the types `be` keeps them in (the NumPy backend: all float32), an encoder's dense layers in
    bfloat16 in the native fast mode; vision: with the vision tower load() would attach (mmproj's, else
    the model's own files')."""
    if isinstance(src.config, BertConfig):
        return memory.encoder_plan(src, TOKEN_BUDGET, _dense_bytes(be))
    p = memory.plan(src, n_ctx, n_slots, be.kv_type, max_batch, be, float_weights=be.name == "numpy",
                    qtype_at_load=qtype_at_load)
    if vision:
        _plan_tower(p, src, be, mmproj)
    return p


def _dense_bytes(be) -> int:
    """Bytes a dense weight of an encoder (BERT, a vision tower) takes on `be`: bfloat16 in the native fast mode."""
    return 2 if be.name == "native" and not getattr(be, "exact", True) else 4


def _load_encoder(name_or_path, path: Path, src, backend, threads, activations, quantize) -> "EncoderModel":
    try:
        if quantize:
            raise InvalidInputError("quantize= is not supported for encoder models")
        # an encoder's fast mode (the default) multiplies bfloat16 weights and activations with float32
        # sums (all-MiniLM-L6-v2: cosine >= 0.99997 to float64); activations="f32" keeps float32 weights
        be = create_backend(backend, threads=threads, activations=activations)
        mplan = plan_memory(src, be)
        enc = encoder_module(src.config.arch).ENCODER(src.config, src.tensor, be)
    except BaseException:
        src.close()
        raise
    m = EncoderModel(enc, src, be)
    m.memory_plan = mplan
    m.name = display_name(name_or_path, path)
    return m


# tokens one encoder batch may hold (its widest activation, tokens x intermediate size floats, is
# 100 MB for a 1536-wide MLP); longer texts, smaller batches
TOKEN_BUDGET = 1 << 14


# a length no input reaches (a request body is a few MiB): "do not truncate" to the tokenizer
UNCUT = 2**31 - 1
# the longest text an encoder reads: no released encoder trains past it (8192: bge-m3, ModernBERT), and the
# attention's time grows with its square; a config without a position table (rotary encoders) could claim millions
ENCODER_MAX_TOKENS = 8192


class EncoderModel:
    """A loaded encoder (BERT family): embed() texts, or score() (query, document) pairs when it
    is a cross-encoder. One call computes at a time."""

    is_encoder = True
    accepts_images = False       # (no vision tower attaches to an encoder)

    def __init__(self, encoder: BertEncoder, source, backend):
        self.encoder, self.source, self.backend = encoder, source, backend
        self.config = encoder.cfg
        self.tokenizer = source.tokenizer
        self.name = source.name
        if self.config.max_tokens > ENCODER_MAX_TOKENS:
            warnings.warn(f"{self.name}: its configuration allows {self.config.max_tokens} tokens a text; texts are "
                          f"cut at {ENCODER_MAX_TOKENS}", LlambdaWarning, stacklevel=3)
            self.config.max_tokens = ENCODER_MAX_TOKENS
        self.n_ctx = self.config.max_tokens
        self.is_reranker = self.config.n_labels > 0
        self.memory_plan = None     # llambda.memory.EncoderPlan, set by load()
        self._lock = threading.RLock()
        self._closed = self._freed = False

    def _network(self):
        return self.encoder

    def _tok(self):
        self._check_open()
        if self.tokenizer is None:
            raise TokenizerError(f"this model cannot tokenize text: {self.source.tokenizer_error}")
        return self.tokenizer

    # text <-> tokens as a decoder's, through this model's _tok
    tokenize, detokenize = Model.tokenize, Model.detokenize

    def _encode(self, items: list, limit: int | None = None) -> list[tuple[list[int], list[int]]]:
        """(ids, type_ids) per input: texts through the tokenizer ([CLS] ... [SEP], truncated to
        `limit`, by default the model's length); token ids are taken as given (the caller's special
        tokens), truncated to the same length."""
        self._check_open()
        cfg = self.config
        limit = cfg.max_tokens if limit is None else limit
        texts = [i for i in items if isinstance(i, str)]
        enc = iter(self._tok().encode_for_encoder(texts, limit) if texts else [])
        out = []
        for n, i in enumerate(items):
            if isinstance(i, str):
                out.append(next(enc))
                if not out[-1][0]:      # no special tokens added and no text token: nothing to run on
                    raise InvalidInputError(f"input {n} encodes to no tokens: nothing to embed")
            else:
                ids = token_ids(i, cfg.vocab_size)[:limit]
                if not ids:
                    raise InvalidInputError("cannot embed an empty list of token ids")
                out.append((ids, [0] * len(ids)))
        return out

    def embed_token_counts(self, texts, truncate: bool = True) -> list[int]:
        """Tokens each input takes as embed runs it (cut at the model's length), or with
        truncate=False as many as it has: more than n_ctx where embed would cut it."""
        _check_flag("truncate", truncate)
        return [len(ids) for ids, _ in self._encode(_embed_inputs(texts), None if truncate else UNCUT)]

    def embed(self, texts, batch_size: int = 32) -> np.ndarray:
        """(n, hidden) L2-normalized sentence vectors, pooled as the model says (mean over the
        real tokens for sentence-transformers models). Batched: each batch of up to `batch_size`
        inputs is packed back to back (no padding); a vector does not depend on its batch."""
        items = _embed_inputs(texts)
        _check_counts(batch_size=(batch_size, 1, False))     # "x" was a raw ValueError from int()
        out = np.empty((len(items), self.config.hidden), np.float32)
        encoded = self._encode(items)
        with self._lock:
            self._check_open()
            for rows in self._batches([len(ids) for ids, _ in encoded], batch_size):
                ids, types, starts = pack_batch([encoded[i] for i in rows])
                out[rows] = self.encoder.pool(self.encoder.forward(ids, types, starts), starts)
        return out

    @staticmethod
    def _batches(lens: list[int], batch_size: int):
        """Input indices in batches of up to batch_size inputs and TOKEN_BUDGET tokens (one input
        alone may exceed it), by length as sentence-transformers batches."""
        order = sorted(range(len(lens)), key=lens.__getitem__)
        rows: list[int] = []
        tokens = 0
        for i in order:
            if rows and (len(rows) >= max(1, int(batch_size)) or tokens + lens[i] > TOKEN_BUDGET):
                yield rows
                rows, tokens = [], 0
            rows.append(i)
            tokens += lens[i]
        if rows:
            yield rows

    def score(self, query: str, documents: Seq[str], batch_size: int = 32) -> np.ndarray:
        """A cross-encoder's relevance logit of each document for the query (its first label)."""
        _check_counts(batch_size=(batch_size, 1, False))     # 0 was a raw ValueError from range()
        if not self.is_reranker:
            raise InvalidInputError("this model is not a reranker (no sequence-classification head)")
        out = np.empty(len(documents), np.float32)
        with self._lock:
            self._check_open()
            for s in range(0, len(documents), batch_size):
                pairs = [(query, d) for d in documents[s:s + batch_size]]
                ids, types, starts = pack_batch(self._tok().encode_for_encoder(pairs, self.config.max_tokens))
                hidden = self.encoder.forward(ids, types, starts)
                out[s:s + len(pairs)] = self.encoder.classify(hidden, starts)[:, 0]
        return out

    def memory_report(self) -> dict[str, int]:
        self._check_open()
        return self.backend.memory_report()

    # closing is the same as a decoder's: the network, the backend, then the files
    close, _check_open, closed = Model.close, Model._check_open, Model.closed
    __enter__, __exit__ = Model.__enter__, Model.__exit__
