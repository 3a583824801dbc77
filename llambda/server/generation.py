"""From a validated request to scheduler jobs, and from their events to OpenAI responses.

`Service.start(spec)` renders and tokenizes the prompt(s), checks them against the
context and the server's limits, creates one `Sequence` per choice and queues
them; the returned `Generation` either collects the whole answer or yields SSE
chunks as tokens arrive. Leaving either early (client gone, error) cancels the
jobs, which frees their slots before the scheduler's next step.
"""
from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, replace
from typing import AsyncIterator

from ..chat import validate_messages
from ..constraints import ConstraintError, GrammarSpec
from ..engine import GenerationParams, Sequence
from ..errors import ChatTemplateError, ContextOverflowError, InvalidInputError, LlambdaError, TokenizerError
from ..sampling import SamplingParams
from ..speculative import DEFAULT_DRAFT_MAX, PromptLookup, Speculation, check_rollback
from ..thinking import PromptThought, ThinkingBudget, output_thinking, prompt_thought, template_thinks
from .config import ServerConfig
from .errors import APIError, bad_request, model_not_found
from .fim import find_fim_tokens, fim_prompt_ids, require_fim
from .harmony import speaks_harmony, with_analysis
from .image_rows import RowsBacklogFull, RowsBudget, RowsLease, RowsTooLarge, budget_bytes
from .images import require_vision
from .openai_format import (SSE_DONE, ChoiceState, TokenStrings, Usage, chat_logprobs, chat_response,
                            completion_logprobs, completion_response, new_id, now, sse, tool_finish)
from .scheduler import Channel, Job, JobFailure, PromptLogprobs, QueueFull, Scheduler, ShuttingDown
from .schemas import GenerationSpec
from .tool_formats import FORMATS
from .tool_formats import detect as detect_tool_format
from .tools import (OPEN_TAG, ToolSetup, generic_tool_messages, has_tool_turns, tool_grammar, tool_names,
                    written_history)
from .workers import PoolClosed, PoolFull, PromptWorkers

EMBED_WORKERS = 2         # threads waiting for a decoder's embeddings (the scheduler runs them one call at a time)
DISCONNECTED = object()   # pushed into a channel when the client goes away


class ClientGone(Exception):
    """The client disconnected before the answer was complete."""


def check_event(ev) -> None:
    """An event read from a channel: ClientGone when the client hung up, an APIError when the job failed."""
    if ev is DISCONNECTED:
        raise ClientGone()
    if isinstance(ev, JobFailure):
        raise APIError(ev.status, ev.message, kind=ev.kind)


@dataclass
class Prepared:
    spec: GenerationSpec
    prompts: list[list[int]]          # token ids per prompt
    echoes: list[str]                 # text to echo per prompt ("" without echo)
    seqs: list[list[Sequence]]        # per prompt, one Sequence per choice
    tools: ToolSetup | None = None    # how answers are read for tool calls (chat with tools)
    grammar: object = None            # the compiled grammar and the thought budget the seqs are made with
    thinking: ThinkingBudget | None = None
    images: "PendingImages | None" = None   # a chat's images still to encode; the seqs are made once they are


@dataclass(frozen=True)
class PendingImages:
    """A chat's image files and each one's run starts in its prompt (Model.image_ids), for Model.encode_images;
    the bytes of the rows they will encode to (Model.image_rows_bytes: what the request reserves)."""
    files: list
    starts: list
    nbytes: int = 0


class Service:
    def __init__(self, model, scheduler: Scheduler, cfg: ServerConfig):
        self.model = model
        self.scheduler = scheduler
        self.cfg = cfg
        self.strings = TokenStrings(model.tokenizer) if model.tokenizer is not None else None
        src = getattr(model.source, "chat_template", None) or ""
        self.template_has_tools = "tools" in src
        # gpt-oss answers in channels (analysis, final) and calls tools as messages to functions.NAME
        self.harmony = speaks_harmony(model)
        # other families call tools in their own syntax (GLM, Qwen3-Coder, DeepSeek, Mistral, ...): read in
        # it; a forced tool_choice is written in it where the format can, else in the Hermes form
        self.tool_format = None if self.harmony else detect_tool_format(src)
        # Hermes/Qwen-style templates: calls are <tool_call>{json}</tool_call>, so a forced
        # tool_choice can start the answer with the opening of a call
        self.template_hermes = OPEN_TAG in src and self.tool_format is None
        # Qwen3, SmolLM3, QwQ, DeepSeek-R1: a thought in <think>...</think> comes before the answer
        self.thinks = not self.harmony and template_thinks(src)
        self.workers = PromptWorkers(cfg.prompt_workers, backlog=max(cfg.queue_size, cfg.prompt_workers))
        # the vision tower's encodings (one at a time: the model's image input's lock): a thread of their own, so that
        # requests waiting for the tower hold no prompt worker (text requests had waited behind them all)
        self.image_workers = PromptWorkers(1, backlog=max(cfg.queue_size, cfg.prompt_workers), name="image")
        # the encoded rows requests hold at once (image_rows.py): reserved before the encoding, waited for on the
        # event loop (as many waiting as the image queue holds), given back once the prompts are prefilled
        self.image_rows = RowsBudget(budget_bytes(model, cfg.image_rows_memory),
                                     backlog=self.image_workers.backlog,
                                     on_wait=scheduler.metrics.image_rows_waited)
        self._embed_workers: PromptWorkers | None = None      # made on first use (embed_workers)
        self._pools_lock = threading.Lock()
        self.fim = find_fim_tokens(model.tokenizer, getattr(model.source, "metadata", None))
        if cfg.speculative not in (None, "off"):
            check_rollback(model.config)      # a default every request would be refused for: refuse it now

    def warm_grammars(self) -> None:
        """Build what constrained decoding needs ahead of the first request (any thread)."""
        try:
            self.model.grammars()
        except Exception:     # no tokenizer, no llguidance: the request that needs it will say so
            pass

    @property
    def embed_workers(self) -> PromptWorkers:
        """The threads a decoder's embeddings wait in (for the scheduler thread, which runs them between
        steps): made on first use, so a Service that serves none starts none."""
        with self._pools_lock:
            if self._embed_workers is None:
                self._embed_workers = PromptWorkers(EMBED_WORKERS, backlog=max(self.cfg.queue_size, EMBED_WORKERS),
                                                    name="embed")
            return self._embed_workers

    def close_workers(self) -> None:
        """Every pool's idle threads exit (a busy one finishes its job); new jobs are refused (503)."""
        self.workers.close()
        self.image_workers.close()
        self.embed_workers.close()      # (made now if it was not: a later embedding request is refused too)

    # -- checks ------------------------------------------------------------------
    def check_model(self, name: str | None) -> None:
        if not self.cfg.accepts(name):
            raise model_not_found(name, self.cfg.model_id)

    def template_messages(self, messages: list) -> list:
        """The messages as this model's chat template takes them (harmony's: reasoning as `thinking`)."""
        return with_analysis(messages) if self.harmony else messages

    def render_chat(self, messages: list, tools: list | None, spec: GenerationSpec) -> str:
        """The prompt's text: the server's template variables (--template-kwargs) under the request's own
        (the request's strings literal: Model.literal)."""
        return self.model.render_chat(messages, tools=tools,
                                      **{**self.cfg.template_kwargs, **self.model.literal(spec.template_kwargs)})

    def chat_prompt(self, spec: GenerationSpec) -> str:
        """The chat template's text for the spec's messages and tools, as generation renders it
        (/apply-template shows it); raises ChatTemplateError."""
        require_vision(self, spec)
        return self.model.restore_literal(self._render(spec)[0])

    def _check_tool_names(self, spec: GenerationSpec) -> None:
        """An offered tool's name is written by llambda itself too (the generic tool prompt's rule, a forced
        call's opening, the call grammar), not only by the template: one that holds the text of a control
        token would be that token there (a forged turn). No tool is named so: a 400."""
        names = tool_names(spec.tools) if spec.tools else set()
        for name in sorted(names | ({spec.forced_tool} if spec.forced_tool else set())):
            if isinstance(name, str) and self.model.literal(name) != name:
                raise bad_request(f"the tool name {name[:80]!r} holds the text of one of this model's control "
                                  "tokens", param="tools")

    def _render(self, spec: GenerationSpec) -> tuple[str, bool]:
        """(the template's text, whether the tools went in through the generic tool prompt). The request's
        strings are literal (Model.literal): a control token's text in them is tokenized as text."""
        self._check_tool_names(spec)
        client, tools = self.model.literal(spec.messages), self.model.literal(spec.tools)
        messages = self.template_messages(client)
        generic = bool(spec.tools) and not self.template_has_tools
        if generic:
            # the template cannot render tools: describe them in a system message instead; the
            # rewrite reads content and tool_calls, so check their shapes first (a 400, not a crash)
            messages = generic_tool_messages(validate_messages(client, self.model.image_marker), tools,
                                             spec.tool_choice,
                                             spec.forced_tool)
            tools = None
        elif not self.template_has_tools and has_tool_turns(client):
            # no tools now (tool_choice "none", or none sent), but earlier calls and results: written as
            # the generic prompt writes them (a template that concatenates content fails on a turn of
            # calls alone, others drop the calls)
            messages = written_history(validate_messages(client, self.model.image_marker))
        return self.render_chat(messages, tools, spec), generic

    def _chat_images(self, spec: GenerationSpec) -> list[bytes]:
        """The request's images (canonical image parts), checked against the model: a 400
        `model_without_vision` for a model without a vision tower, or past its images per request."""
        images = require_vision(self, spec)
        if not images:
            return []
        try:        # a model whose max_images is below the transport's bound (images.MAX_IMAGES)
            images = self.model.check_images(images)
        except InvalidInputError as e:
            raise bad_request(str(e), param=spec.messages_param, code="too_many_images") from None
        if spec.speculative not in (None, "off"):
            raise bad_request("'speculative' does not take images: speculative decoding runs on text prompts only",
                              param="speculative")
        per = self.model.image_block_tokens       # an image block one forward holds whole (0: causal, none)
        room = self.scheduler.max_batch - max(self.scheduler.n_slots, self.scheduler.spec_rows)
        if per > room:
            raise bad_request(f"an image takes {per} tokens of a forward; this server's batch of "
                              f"{self.scheduler.max_batch} leaves {room} beside its streams", param=spec.messages_param)
        return images

    def _chat_ids(self, spec: GenerationSpec) -> tuple[list[int], ToolSetup | None, GrammarSpec | None,
                                                       PromptThought | None, tuple]:
        """The prompt, how the answer is read for tool calls, the grammar tool calls follow, where
        the prompt leaves a `<think>` template's thought, and its images with their runs' starts (None
        without any: `_encode` makes the blocks, once every other check has passed)."""
        images = self._chat_images(spec)
        try:
            text, generic = self._render(spec)
            # a thought may come first: a forced call then starts after it, not in the prompt
            thought = prompt_thought(self.thinks, text, spec.prefill)
            think_first = thought is not None and thought.may_come
            setup, grammar = self._tool_setup(spec, constrained=generic or self.template_hermes, generic=generic,
                                              think_first=think_first, native=None if generic else self.tool_format)
            if self.harmony and not generic:
                setup = replace(setup or ToolSetup(), harmony=True)
            if thought is not None:
                setup = replace(setup or ToolSetup(), thinks=True, thought_open=thought.opened)
            if spec.prefill:
                # the answer continues the given text; a forced call or a harmony channel would have to
                # start where it stands, so those are refused rather than silently mixed
                if self.harmony or (setup is not None and setup.prefix):
                    raise bad_request("a trailing assistant message (prefill) cannot be combined with a forced "
                                      "tool_choice or with this model's channels", param=spec.messages_param)
                text += self.model.literal(spec.prefill)
            if setup is not None:
                text += setup.prefix
            if not images:
                return self.model._prompt_ids(text), setup, grammar, thought, None
            ids, starts = self.model.image_ids(text, images)     # the images' sizes from their headers
            return ids, setup, grammar, thought, PendingImages(images, starts, self.model.image_rows_bytes(ids, starts))
        except ContextOverflowError as e:
            raise APIError(400, str(e), param=spec.messages_param, code="context_length_exceeded") from None
        except InvalidInputError as e:       # the images' markers do not match the images, a bad image (image_ids)
            raise bad_request(str(e), param=spec.messages_param) from None
        except ChatTemplateError as e:
            raise bad_request(f"cannot render {spec.messages_shown}: {self.model.restore_literal(str(e))}",
                              param=spec.messages_param) from None
        except TokenizerError as e:
            raise bad_request(str(e), param=spec.messages_param) from None

    def _tool_setup(self, spec: GenerationSpec, constrained: bool, generic: bool = False,
                    think_first: bool = False, native=None) -> tuple[ToolSetup | None, GrammarSpec | None]:
        """Calls in the <tool_call> format (Hermes-style templates and the generic prompt) are
        generated under a grammar: with tool_choice "required" or a forced function the answer is
        a call, with "auto" it may be text, and a call it starts is valid. Calls in other
        templates' formats are only parsed under "auto". think_first: a `<think>` thought may come before the
        answer (the grammar waits for it), so a forced call's opening is the grammar's, not the prompt's.
        native: the model's own call format (tool_formats), read instead of the Hermes form; a forced
        call is written in it (its opening prefilled, or after a thought the grammar's first text; its
        markers as the vocabulary's control tokens where they are ones), the rest under its grammar;
        a format that cannot write one leaves it to the Hermes form, and that answer is read as Hermes."""
        if not spec.tools:
            return None, None
        names = {spec.forced_tool} if spec.tool_choice == "function" else tool_names(spec.tools)
        forced = spec.tool_choice != "auto"
        constrained = constrained or (native is not None and forced)     # a forced call is under a grammar
        try:
            native_call = native.force(spec.tools, names, spec.tool_choice, self.model.tokenizer,
                                       parallel=spec.parallel_tool_calls) if native and forced else None
        except ConstraintError as e:         # a tool the format cannot call as its schema asks
            raise bad_request(f"'tools': {e}", param="tools") from None
        if forced and native_call is None:
            native = None
            if constrained:     # the Hermes form's, several calls not through the generic prompt (below)
                native_call = FORMATS["hermes"].force(spec.tools, names, spec.tool_choice, self.model.tokenizer,
                                                      parallel=spec.parallel_tool_calls and not generic)
        # the answer starts as a call (prefilled, not decoded token by token; after a thought, the grammar's)
        prefix = "" if native_call is None or think_first else native_call.opening
        setup = ToolSetup(names, prefix, spec.parallel_tool_calls, format=native,
                          params={t["function"]["name"]: t["function"].get("parameters") or {} for t in spec.tools})
        if not constrained:
            return setup, None
        if spec.constraint is not None and spec.tool_choice != "auto":
            raise bad_request(f"'{spec.constraint_param}' cannot be combined with a tool_choice that forces "
                              "a call", param=spec.constraint_param)
        if spec.constraint is not None:      # auto: the client's format for text answers wins
            return setup, None
        # "required" and a named function are one or more calls with parallel_tool_calls (OpenAI's
        # "required"; a named one: more calls of it), but not through the generic prompt: models never
        # trained on calls repeat them until max_tokens
        if native_call is not None:          # in the model's own syntax (or the Hermes form)
            return setup, GrammarSpec("lark", native_call.grammar(inline=think_first))
        return setup, GrammarSpec("lark", tool_grammar(spec.tools, names, "auto", parallel=True,
                                                       tokenizer=self.model.tokenizer))

    def _completion_ids(self, prompt, spec: GenerationSpec) -> list[int]:
        try:
            if spec.suffix is not None:
                fim = require_fim(self.fim, self.cfg.model_id, "suffix")
                return fim_prompt_ids(self.model.tokenizer, fim, prompt, spec.suffix, spec.fim_files)
            return self.model._prompt_ids(prompt)
        except (TokenizerError, ValueError) as e:
            raise bad_request(f"invalid prompt: {e}", param="prompt") from None

    def _encode(self, spec: GenerationSpec, pending: PendingImages | None) -> tuple:
        """The image blocks of a chat prompt: the vision tower runs here, in the image worker (`encode`; not a
        prompt worker: text requests are not held behind the tower) (Model.encode_images: under the model's
        image input's lock, never the scheduler's; running streams keep decoding, the C core interleaving their ops
        with the tower's)."""
        if pending is None:
            return ()
        t0 = time.perf_counter()
        try:
            blocks = self.model.encode_images(pending.files, pending.starts)
        except InvalidInputError as e:        # an image the decoder refuses (llambda.vision's limits)
            self.scheduler.metrics.image_refused("invalid_image")
            raise bad_request(f"invalid image: {e}", param=spec.messages_param) from None
        self.scheduler.metrics.images_encoded(len(pending.files), time.perf_counter() - t0)
        return blocks

    def _max_tokens(self, spec: GenerationSpec, n_prompt: int) -> int | None:
        n_ctx, cap = self.model.n_ctx, self.cfg.max_tokens_cap
        if n_prompt >= n_ctx:
            raise APIError(400, f"the prompt has {n_prompt} tokens but this model's context holds {n_ctx} "
                                "(prompt plus at least one generated token); shorten the prompt",
                           param=spec.messages_param if spec.kind == "chat" else "prompt",
                           code="context_length_exceeded")
        m = spec.max_tokens
        if m is None:
            return cap
        field = spec.max_tokens_param
        if cap is not None and m > cap:
            raise bad_request(f"{field} is {m}; this server generates at most {cap} tokens per request",
                              param=field)
        if n_prompt + m > n_ctx:
            raise APIError(400, f"this model's context holds {n_ctx} tokens, but {n_prompt + m} were requested "
                                f"({n_prompt} in the prompt, {m} for the completion); lower {field} or "
                                "shorten the prompt", param=field, code="context_length_exceeded")
        return m

    # -- start -----------------------------------------------------------------------
    async def start(self, spec: GenerationSpec) -> "Generation":
        """Validate against the model and queue the jobs; raises APIError for the client's mistakes.

        Rendering and tokenizing run in a worker thread: a long prompt must not stall running streams.
        """
        p = await self.in_worker(self.prepare, spec)
        if not p.images:
            return self.launch(p)
        lease = await self._reserve_rows(p)
        try:
            # a client gone while its images wait or encode: the lease goes back once the image worker has
            # dropped or finished the job (its rows are then garbage), not before
            p = await self.in_worker(self.encode, p, pool=self.image_workers, abandoned=lambda _: lease.release())
        except asyncio.CancelledError:
            raise
        except BaseException:
            lease.release()
            raise
        return self.launch(p, lease)

    async def _reserve_rows(self, p: "Prepared") -> RowsLease:
        """The lease on a chat's image rows (waiting for room: no worker held); a 400 when they pass the whole
        budget, a 429 when as many requests as the image queue holds already wait."""
        try:
            return await self.image_rows.reserve(p.images.nbytes)
        except RowsTooLarge as e:
            self.scheduler.metrics.image_refused("rows_memory")
            raise bad_request(str(e), param=p.spec.messages_param, code="image_rows_memory") from None
        except RowsBacklogFull as e:
            self.scheduler.metrics.image_refused("queue_full")
            raise self._refused(e, busy=True) from None

    async def count_prompt(self, spec: GenerationSpec) -> int:
        """The tokens a chat spec's prompt has, rendered and tokenized as `start` would (in a worker
        thread as well); nothing is queued, and a prompt too long for the context is still counted."""
        return await self.in_worker(self._prompt_length, spec)

    def _prompt_length(self, spec: GenerationSpec) -> int:
        self.check_model(spec.model)
        ids = self._chat_ids(spec)[0]
        return len(ids)

    async def in_worker(self, fn, *args, pool: PromptWorkers | None = None, abandoned=None):
        """fn(*args) in one of the server's own pools (the prompt workers by default), never the event loop's
        default executor: jobs that wait long there (a decoder's embeddings wait for the scheduler) left no
        thread for the chats' bodies and /health's probe; a full pool is a 429 at once, a closed one 503.
        abandoned: PromptWorkers.run's (the caller cancelled)."""
        try:
            return await (pool or self.workers).run(fn, *args, abandoned=abandoned)
        except (PoolFull, PoolClosed) as e:
            if pool is self.image_workers and isinstance(e, PoolFull):
                self.scheduler.metrics.image_refused("queue_full")
            raise self._refused(e, busy=isinstance(e, PoolFull)) from None

    def _refused(self, e: Exception, busy: bool) -> APIError:
        """429 when a queue or the prompt workers are full, 503 while shutting down; both say when to retry."""
        retry = {"Retry-After": str(self.cfg.retry_after)}
        if busy:
            return APIError(429, f"{e}; retry later", kind="rate_limit_error", code="server_busy", headers=retry)
        return APIError(503, str(e), code="shutting_down", headers=retry)

    def prompts_stalled(self) -> bool:
        """Every prompt worker busy on one job for longer than a render's budget could explain."""
        s = self.workers.stats()
        return s["busy"] >= self.workers.n_workers and s["oldest_seconds"] > self.cfg.prompt_stall_seconds

    def prepare(self, spec: GenerationSpec) -> "Prepared":
        """Prompts, limits and one Sequence per choice (any thread); a chat's images are left to `encode`."""
        self.check_model(spec.model)
        # before any tokenizing: a batch of 100k prompts is refused for its count, not after the work
        n_jobs = (len(spec.prompts) if spec.kind == "completion" else 1) * spec.n
        if n_jobs > self.scheduler.capacity():
            raise bad_request(f"{n_jobs} sequences requested (prompts x n); this server holds at most "
                              f"{self.scheduler.capacity()} at once", param="n")
        if (spec.logprobs or spec.top_logprobs) and self.strings is None:
            raise bad_request(f"'{spec.logprobs_param}' asks for logprobs, which need the tokens' text, and this model "
                              "has no tokenizer", param=spec.logprobs_param)
        tools = thought = None
        constraint, param = spec.constraint, spec.constraint_param
        if spec.kind == "chat":
            ids, tools, tool_constraint, thought, pending = self._chat_ids(spec)
            if tool_constraint is not None:
                constraint, param = tool_constraint, "tools"
            prompts = [ids]
            echoes = [""]
        else:
            pending = None
            prompts = [self._completion_ids(p, spec) for p in spec.prompts]
            echoes = [self._echo_text(p, ids) if spec.echo else "" for p, ids in zip(spec.prompts, prompts)]
        bias = spec.sampling.get("logit_bias") or {}
        vocab = self.model.config.vocab_size
        if bias and max(bias) >= vocab:
            raise bad_request(f"'logit_bias' names token {max(bias)}, outside this model's vocabulary of {vocab}",
                              param="logit_bias")
        grammar = self._compile(constraint, param) if constraint is not None else None
        self._speculative_mode(spec)      # a request for a draft model the server lacks: 400 now
        # decided as the library's Model.chat decides it
        thinking = output_thinking(thought, spec.thinking_budget, constraint, self.model._tok,
                                   self.model._text_after_thought)
        for ids in prompts:
            self._max_tokens(spec, len(ids))          # a 400 before the images' encoding
        p = Prepared(spec, prompts, echoes, [], tools, grammar=grammar, thinking=thinking, images=pending)
        return p if p.images else self._with_sequences(p, ())

    def encode(self, p: "Prepared") -> "Prepared":
        """A prepared chat's images through the vision tower, then its Sequences (the image worker)."""
        return self._with_sequences(p, self._encode(p.spec, p.images))

    def _with_sequences(self, p: "Prepared", blocks: tuple) -> "Prepared":
        for ids in p.prompts:
            try:        # the image token in a text (typed by the user) with no image: refused as Model.stream does
                self.model.check_prompt_images(ids, blocks)
            except InvalidInputError as e:
                raise bad_request(str(e), param=p.spec.messages_param if p.spec.kind == "chat" else "prompt") from None
            max_tokens = self._max_tokens(p.spec, len(ids))
            p.seqs.append([self._sequence(p.spec, ids, max_tokens, k, p.grammar, p.thinking, blocks)
                           for k in range(p.spec.n)])
        p.images = None
        return p

    def _compile(self, constraint: GrammarSpec, param: str):
        """The grammar, compiled before anything is queued: an invalid one is the client's 400."""
        try:
            return self.model.compile_grammar(constraint)
        except ConstraintError as e:
            raise bad_request(f"'{param}': {e}", param=param) from None
        except TokenizerError as e:
            raise bad_request(f"'{param}' needs a tokenizer: {e}", param=param) from None

    def _speculative_mode(self, spec: GenerationSpec) -> str | None:
        mode = spec.speculative if spec.speculative is not None else self.cfg.speculative
        if mode not in (None, "off"):
            try:
                check_rollback(self.model.config)
            except InvalidInputError as e:
                raise bad_request(f"'speculative': {e}", param="speculative") from None
        if mode == "draft" and getattr(self.model, "drafter", None) is None:
            raise bad_request("'speculative': \"draft\" needs a draft model; this server has none "
                              "(llambda serve --model-draft)", param="speculative")
        return None if mode == "off" else mode

    def _speculation(self, spec: GenerationSpec, seq: Sequence | None = None):
        """A sequence's speculative decoding (its own drafter state), or None (a prompt holding images:
        the server's default speculation does not apply to it, an explicit one was refused)."""
        if seq is not None and seq.images:
            return None
        mode = self._speculative_mode(spec)
        if mode is None:
            return None
        k = spec.draft_max or self.cfg.draft_max or DEFAULT_DRAFT_MAX[mode]
        drafter = self.model.drafter if mode == "draft" else PromptLookup()
        return Speculation(drafter, k)

    def launch(self, p: "Prepared", lease: RowsLease | None = None) -> "Generation":
        """Queue the sequences (on the event loop, which receives their events). lease: the one on their image
        rows, given back when the last of them has let go of the rows (Job.drop_images), or now if they are not
        queued."""
        try:
            return self._launch(p, lease)
        except BaseException:
            if lease is not None:
                for choices in p.seqs:
                    for seq in choices:
                        seq.drop_image_rows()
                lease.release()
            raise

    def _launch(self, p: "Prepared", lease: RowsLease | None) -> "Generation":
        channel = Channel()
        jobs: list[Job] = []
        # echo with logprobs: the first choice of each prompt scores the prompt for all of them
        score = p.spec.top_logprobs if (p.spec.echo and p.spec.logprobs) else None
        for pi, choices in enumerate(p.seqs):
            first = None
            for k, seq in enumerate(choices):
                job = Job(seq, channel, pi * p.spec.n + k, after=first,
                          prompt_logprobs=score if first is None else None, speculation=self._speculation(p.spec, seq))
                first = first or job
                jobs.append(job)
        if lease is not None:
            lease.share(len(jobs))
            for job in jobs:
                job.images_done = lease.let_go
        gen = Generation(self, p.spec, channel, jobs, p.prompts, p.echoes, p.tools)
        try:
            self.scheduler.submit(jobs)
        except (QueueFull, ShuttingDown) as e:
            raise self._refused(e, busy=isinstance(e, QueueFull)) from None
        return gen

    def _echo_text(self, prompt, ids) -> str:
        if isinstance(prompt, str):
            return prompt
        return self.model.tokenizer.decode(ids) if self.model.tokenizer is not None else ""

    def _sequence(self, spec: GenerationSpec, ids: list[int], max_tokens: int | None, k: int,
                  grammar=None, thinking: ThinkingBudget | None = None, images=()) -> Sequence:
        kw = dict(spec.sampling)
        if kw.get("seed") is not None and k:
            kw["seed"] = (kw["seed"] + k) % 2**64     # seeded n > 1: distinct but reproducible choices
        try:
            sp = SamplingParams(**kw, logprobs=spec.top_logprobs, chosen_logprob=bool(spec.logprobs))
            params = GenerationParams(max_tokens=max_tokens, sampling=sp, stop=list(spec.stop),
                                      ignore_eos=spec.ignore_eos, grammar=grammar, thinking=thinking)
            seq = Sequence(self.model.tokenizer, ids, params, slot=-1, n_ctx=self.model.n_ctx, images=images)
            if spec.suffix is not None and not spec.ignore_eos:
                seq.eot |= self.fim.end_ids     # a new FIM block or file means the gap is filled
            return seq
        except ContextOverflowError as e:
            raise APIError(400, str(e), code="context_length_exceeded") from None
        except (LlambdaError, ValueError) as e:
            raise bad_request(str(e)) from None


class Generation:
    """One request in flight."""

    def __init__(self, service: Service, spec: GenerationSpec, channel: Channel, jobs: list[Job],
                 prompts: list[list[int]], echoes: list[str], tools: ToolSetup | None = None):
        self.service, self.spec, self.channel, self.jobs = service, spec, channel, jobs
        self.id = new_id("chatcmpl" if spec.kind == "chat" else "cmpl")
        self.created = now()
        self.model_id = service.cfg.model_id
        self.prompts = prompts
        self.tools = tools
        self.states = {j.index: ChoiceState(j.index, echoes[j.index // spec.n], tools, spec.text_logprobs)
                       for j in jobs}

    # -- lifetime --------------------------------------------------------------------
    def cancel(self) -> None:
        for j in self.jobs:
            j.cancel()
        self.service.scheduler.wake()

    def client_gone(self) -> None:
        """From the disconnect watcher."""
        self.channel.queue.put_nowait([(-1, DISCONNECTED)])

    def usage(self) -> Usage:
        u = Usage()
        u.prompt = sum(len(p) for p in self.prompts)
        u.completion = sum(s.n_generated for s in self.states.values())
        # siblings (n > 1) copy the first choice's prompt KV; count each prompt's reuse once
        u.cached = sum(j.n_cached for j in self.jobs if j.after is None)
        u.reasoning = sum(s.reasoning_tokens() for s in self.states.values())
        return u

    def _absorb(self, idx: int, ev) -> str:
        """Record one event for a choice; returns its text."""
        st = self.states[idx]
        if st.token_ends is not None and (ev.token >= 0 or ev.text):
            st.token_ends.add(ev.text, token=ev.token >= 0)
        if ev.token >= 0:
            st.n_generated += 1
            if self.spec.logprobs:
                st.logprobs.append((ev.token, ev.logprob, ev.top_logprobs))
        if ev.finish_reason:
            st.finish_reason = ev.finish_reason
        return ev.text

    def _prompt_scored(self, idx: int, ev: PromptLogprobs) -> list[int]:
        """Give a prompt's logprobs to every choice of that prompt; returns their indexes."""
        entries = ev.entries
        n = self.spec.n
        first = idx - idx % n
        echo = self.states[first].echo
        strings = self.service.strings
        # a BOS the model adds is not part of the echoed text: leave it out so the tokens spell the text
        if entries and strings is not None and entries[0][1] is None and len(entries) > 1:
            head = strings.get(entries[0][0])[0]
            if not echo.startswith(head):
                entries = entries[1:]
        siblings = [k for k in range(first, first + n) if k in self.states]
        for k in siblings:
            self.states[k].prompt_logprobs = list(entries)
        return siblings

    # -- whole answer ------------------------------------------------------------------
    async def collect(self) -> dict:
        remaining = {j.index for j in self.jobs}
        for st in self.states.values():
            st.read_whole()
        try:
            while remaining:
                for idx, ev in await self.channel.get():
                    check_event(ev)
                    if isinstance(ev, PromptLogprobs):
                        self._prompt_scored(idx, ev)
                        continue
                    self.states[idx].keep(self._absorb(idx, ev), end=bool(ev.finish_reason))
                    if ev.finish_reason:
                        remaining.discard(idx)
        finally:
            self.cancel()
        choices = [self.states[i] for i in sorted(self.states)]
        strings = self.service.strings
        if self.spec.kind == "chat":
            return chat_response(self.id, self.created, self.model_id, choices, self.usage(), strings,
                                 self.spec.logprobs, self.tools)
        return completion_response(self.id, self.created, self.model_id, choices, self.usage(), strings,
                                   self.spec.logprobs)

    # -- streaming ---------------------------------------------------------------------
    def _chunk(self, choice: dict) -> bytes:
        obj = {"id": self.id, "object": "chat.completion.chunk" if self.spec.kind == "chat" else "text_completion",
               "created": self.created, "model": self.model_id, "choices": [choice]}
        if self.spec.include_usage:
            obj["usage"] = None
        return sse(obj)

    def _echo_chunk(self, idx: int) -> bytes:
        """The echoed prompt of a streamed completion, with its logprobs when they were asked for."""
        st = self.states[idx]
        lp = None
        if st.prompt_logprobs is not None:
            lp, st.offset = completion_logprobs(st.prompt_logprobs, self.service.strings, 0)
        return self._chunk({"index": idx, "text": st.echo, "logprobs": lp, "finish_reason": None})

    async def stream(self) -> AsyncIterator[bytes]:
        """SSE bytes: the chunks, an optional usage chunk, then `data: [DONE]`."""
        chat = self.spec.kind == "chat"
        remaining = {j.index for j in self.jobs}
        # echo with logprobs waits for the prompt's scores (they come before the first token)
        echo_waits = self.spec.echo and self.spec.logprobs
        try:
            for idx in sorted(self.states):
                st = self.states[idx]
                if chat:
                    yield self._chunk({"index": idx, "delta": {"role": "assistant", "content": ""},
                                       "logprobs": None, "finish_reason": None})
                elif st.echo and not echo_waits:
                    yield self._echo_chunk(idx)
            while remaining:
                items = await self.channel.get()
                grouped: dict[int, list] = {}
                for idx, ev in items:
                    if ev is DISCONNECTED:
                        return
                    if isinstance(ev, JobFailure):
                        yield sse(APIError(ev.status, ev.message, kind=ev.kind).body())
                        yield SSE_DONE
                        return
                    if isinstance(ev, PromptLogprobs):
                        for k in self._prompt_scored(idx, ev):
                            yield self._echo_chunk(k)
                        continue
                    grouped.setdefault(idx, []).append(ev)
                for idx, evs in grouped.items():
                    for piece in self._stream_choice(idx, evs, chat):
                        yield piece
                    if self.states[idx].finish_reason:
                        remaining.discard(idx)
            if self.spec.include_usage:
                obj = {"id": self.id, "object": "chat.completion.chunk" if chat else "text_completion",
                       "created": self.created, "model": self.model_id, "choices": [],
                       "usage": self.usage().as_dict()}
                yield sse(obj)
            yield SSE_DONE
        finally:
            self.cancel()

    def _stream_choice(self, idx: int, evs: list, chat: bool):
        """Chunks for a run of events of one choice (coalesced: the client may lag behind)."""
        st = self.states[idx]
        first_lp = len(st.logprobs)
        text = "".join(self._absorb(idx, ev) for ev in evs)
        entries = st.logprobs[first_lp:]
        finish = st.finish_reason
        strings = self.service.strings
        if chat:
            parser = st.tool_parser
            calls: list[dict] = []
            if parser is not None:
                text, calls = parser.feed(text)
            reasoning = self._reasoning(parser)
            if text or entries or calls or reasoning:
                yield self._chunk({"index": idx, "delta": self._delta(st, text, calls, reasoning),
                                   "logprobs": chat_logprobs(entries, strings) if entries else None,
                                   "finish_reason": None})
            if finish:
                if parser is not None:
                    rest, calls = parser.finish()
                    reasoning = self._reasoning(parser)
                    if rest or calls or reasoning:
                        yield self._chunk({"index": idx, "delta": self._delta(st, rest, calls, reasoning),
                                           "logprobs": None,
                                           "finish_reason": None})
                    finish = tool_finish(finish, st.made_calls)
                yield self._chunk({"index": idx, "delta": {}, "logprobs": None, "finish_reason": finish})
        else:
            if text or entries:
                lp = None
                if entries:
                    lp, st.offset = completion_logprobs(entries, strings, st.offset)
                yield self._chunk({"index": idx, "text": text, "logprobs": lp, "finish_reason": None})
            if finish:
                yield self._chunk({"index": idx, "text": "", "logprobs": None, "finish_reason": finish})

    @staticmethod
    def _reasoning(parser) -> str:
        """Harmony's analysis channel text that arrived (other parsers have none)."""
        return parser.take_reasoning() if parser is not None else ""

    @staticmethod
    def _delta(st: ChoiceState, text: str, calls: list[dict], reasoning: str = "") -> dict:
        delta: dict = {}
        if reasoning:
            delta["reasoning_content"] = reasoning
        if text:
            delta["content"] = text
        if calls:
            delta["tool_calls"] = calls
            st.made_calls = True
        return delta
