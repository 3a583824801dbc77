"""From a validated request to scheduler jobs, and from their events to OpenAI responses.

`Service.start(spec)` renders and tokenizes the prompt(s), checks them against the
context and the server's limits, creates one `Sequence` per choice and queues
them; the returned `Generation` either collects the whole answer or yields SSE
chunks as tokens arrive. Leaving either early (client gone, error) cancels the
jobs, which frees their slots before the scheduler's next step.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import AsyncIterator

from ..engine import GenerationParams, Sequence
from ..errors import ChatTemplateError, ContextOverflowError, LlambdaError, TokenizerError
from ..sampling import SamplingParams
from .config import ServerConfig
from .errors import APIError, bad_request
from .openai_format import (SSE_DONE, ChoiceState, TokenStrings, Usage, chat_logprobs, chat_response,
                            completion_logprobs, completion_response, new_id, now, sse)
from .scheduler import Channel, Job, JobFailure, QueueFull, Scheduler, ShuttingDown
from .schemas import GenerationSpec
from .tools import tool_names

DISCONNECTED = object()   # pushed into a channel when the client goes away


class ClientGone(Exception):
    """The client disconnected before the answer was complete."""


@dataclass
class Prepared:
    spec: GenerationSpec
    prompts: list[list[int]]          # token ids per prompt
    echoes: list[str]                 # text to echo per prompt ("" without echo)
    seqs: list[list[Sequence]]        # per prompt, one Sequence per choice


class Service:
    def __init__(self, model, scheduler: Scheduler, cfg: ServerConfig):
        self.model = model
        self.scheduler = scheduler
        self.cfg = cfg
        self.strings = TokenStrings(model.tokenizer) if model.tokenizer is not None else None
        src = getattr(model.source, "chat_template", None) or ""
        self.template_has_tools = "tools" in src

    # -- checks ------------------------------------------------------------------
    def check_model(self, name: str | None) -> None:
        if not self.cfg.accepts(name):
            raise APIError(404, f"the model {name!r} does not exist; this server serves {self.cfg.model_id!r}",
                           param="model", code="model_not_found")

    def _chat_ids(self, spec: GenerationSpec) -> list[int]:
        if spec.tools and not self.template_has_tools:
            raise bad_request(f"the chat template of {self.cfg.model_id!r} does not render tools; "
                              "this model cannot be given 'tools'", param="tools")
        try:
            text = self.model.render_chat(spec.messages, tools=spec.tools)
            return self.model._prompt_ids(text)
        except ChatTemplateError as e:
            raise bad_request(f"cannot render the messages: {e}", param="messages") from None
        except TokenizerError as e:
            raise bad_request(str(e), param="messages") from None

    def _completion_ids(self, prompt) -> list[int]:
        try:
            return self.model._prompt_ids(prompt)
        except (TokenizerError, ValueError) as e:
            raise bad_request(f"invalid prompt: {e}", param="prompt") from None

    def _max_tokens(self, spec: GenerationSpec, n_prompt: int) -> int | None:
        n_ctx, cap = self.model.n_ctx, self.cfg.max_tokens_cap
        if n_prompt >= n_ctx:
            raise APIError(400, f"the prompt has {n_prompt} tokens but this model's context holds {n_ctx} "
                                "(prompt plus at least one generated token); shorten the prompt",
                           param="messages" if spec.kind == "chat" else "prompt", code="context_length_exceeded")
        m = spec.max_tokens
        if m is None:
            return cap
        if cap is not None and m > cap:
            raise bad_request(f"max_tokens is {m}; this server generates at most {cap} tokens per request",
                              param="max_tokens")
        if n_prompt + m > n_ctx:
            raise APIError(400, f"this model's context holds {n_ctx} tokens, but {n_prompt + m} were requested "
                                f"({n_prompt} in the prompt, {m} for the completion); lower max_tokens or "
                                "shorten the prompt", param="max_tokens", code="context_length_exceeded")
        return m

    # -- start -----------------------------------------------------------------------
    async def start(self, spec: GenerationSpec) -> "Generation":
        """Validate against the model and queue the jobs; raises APIError for the client's mistakes.

        Rendering and tokenizing run in a worker thread: a long prompt must not stall running streams.
        """
        prepared = await asyncio.to_thread(self.prepare, spec)
        return self.launch(prepared)

    def prepare(self, spec: GenerationSpec) -> "Prepared":
        """Prompts, limits and one Sequence per choice (any thread)."""
        self.check_model(spec.model)
        if spec.echo and spec.logprobs:
            raise bad_request("'echo' together with 'logprobs' (prompt logprobs) is not supported", param="echo")
        if spec.kind == "chat":
            prompts = [self._chat_ids(spec)]
            echoes = [""]
        else:
            prompts = [self._completion_ids(p) for p in spec.prompts]
            echoes = [self._echo_text(p, ids) if spec.echo else "" for p, ids in zip(spec.prompts, prompts)]
        n_jobs = len(prompts) * spec.n
        if n_jobs > self.scheduler.capacity():
            raise bad_request(f"{n_jobs} sequences requested (prompts x n); this server holds at most "
                              f"{self.scheduler.capacity()} at once", param="n")
        seqs = []
        for ids in prompts:
            max_tokens = self._max_tokens(spec, len(ids))
            seqs.append([self._sequence(spec, ids, max_tokens, k) for k in range(spec.n)])
        return Prepared(spec, prompts, echoes, seqs)

    def launch(self, p: "Prepared") -> "Generation":
        """Queue the sequences (on the event loop, which receives their events)."""
        channel = Channel()
        jobs: list[Job] = []
        for pi, choices in enumerate(p.seqs):
            first = None
            for k, seq in enumerate(choices):
                job = Job(seq, channel, pi * p.spec.n + k, after=first)
                first = first or job
                jobs.append(job)
        gen = Generation(self, p.spec, channel, jobs, p.prompts, p.echoes)
        try:
            self.scheduler.submit(jobs)
        except QueueFull as e:
            raise APIError(429, f"{e}; retry later", kind="rate_limit_error", code="server_busy",
                           headers={"Retry-After": str(self.cfg.retry_after)}) from None
        except ShuttingDown as e:
            raise APIError(503, str(e), code="shutting_down",
                           headers={"Retry-After": str(self.cfg.retry_after)}) from None
        return gen

    def _echo_text(self, prompt, ids) -> str:
        if isinstance(prompt, str):
            return prompt
        return self.model.tokenizer.decode(ids) if self.model.tokenizer is not None else ""

    def _sequence(self, spec: GenerationSpec, ids: list[int], max_tokens: int | None, k: int) -> Sequence:
        kw = dict(spec.sampling)
        if kw.get("seed") is not None and k:
            kw["seed"] = (kw["seed"] + k) % 2**64     # seeded n > 1: distinct but reproducible choices
        try:
            sp = SamplingParams(**kw, logprobs=spec.top_logprobs)
            params = GenerationParams(max_tokens=max_tokens, sampling=sp, stop=list(spec.stop),
                                      ignore_eos=spec.ignore_eos)
            return Sequence(self.model.tokenizer, ids, params, slot=-1, n_ctx=self.model.n_ctx)
        except ContextOverflowError as e:
            raise APIError(400, str(e), code="context_length_exceeded") from None
        except (LlambdaError, ValueError) as e:
            raise bad_request(str(e)) from None


class Generation:
    """One request in flight."""

    def __init__(self, service: Service, spec: GenerationSpec, channel: Channel, jobs: list[Job],
                 prompts: list[list[int]], echoes: list[str]):
        self.service, self.spec, self.channel, self.jobs = service, spec, channel, jobs
        self.id = new_id("chatcmpl" if spec.kind == "chat" else "cmpl")
        self.created = now()
        self.model_id = service.cfg.model_id
        self.prompts = prompts
        self.tool_names = tool_names(spec.tools)
        self.states = {j.index: ChoiceState(j.index, echoes[j.index // spec.n], self.tool_names) for j in jobs}
        self.echo_len = {j.index: len(echoes[j.index // spec.n]) for j in jobs}

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
        return u

    def _absorb(self, idx: int, ev) -> str:
        """Record one event for a choice; returns its text."""
        st = self.states[idx]
        if ev.token >= 0:
            st.n_generated += 1
            if self.spec.logprobs:
                st.logprobs.append((ev.token, ev.logprob, ev.top_logprobs))
        if ev.finish_reason:
            st.finish_reason = ev.finish_reason
        return ev.text

    # -- whole answer ------------------------------------------------------------------
    async def collect(self) -> dict:
        remaining = {j.index for j in self.jobs}
        try:
            while remaining:
                for idx, ev in await self.channel.get():
                    if ev is DISCONNECTED:
                        raise ClientGone()
                    if isinstance(ev, JobFailure):
                        raise APIError(ev.status, ev.message, kind=ev.kind)
                    text = self._absorb(idx, ev)
                    if text:
                        self.states[idx].parts.append(text)
                    if ev.finish_reason:
                        remaining.discard(idx)
        finally:
            self.cancel()
        choices = [self.states[i] for i in sorted(self.states)]
        strings = self.service.strings
        if self.spec.kind == "chat":
            return chat_response(self.id, self.created, self.model_id, choices, self.usage(), strings,
                                 self.spec.logprobs, self.tool_names)
        return completion_response(self.id, self.created, self.model_id, choices, self.usage(), strings,
                                   self.spec.logprobs, self.echo_len)

    # -- streaming ---------------------------------------------------------------------
    def _chunk(self, choice: dict) -> bytes:
        obj = {"id": self.id, "object": "chat.completion.chunk" if self.spec.kind == "chat" else "text_completion",
               "created": self.created, "model": self.model_id, "choices": [choice]}
        if self.spec.include_usage:
            obj["usage"] = None
        return sse(obj)

    async def stream(self) -> AsyncIterator[bytes]:
        """SSE bytes: the chunks, an optional usage chunk, then `data: [DONE]`."""
        chat = self.spec.kind == "chat"
        remaining = {j.index for j in self.jobs}
        try:
            for idx in sorted(self.states):
                st = self.states[idx]
                if chat:
                    yield self._chunk({"index": idx, "delta": {"role": "assistant", "content": ""},
                                       "logprobs": None, "finish_reason": None})
                elif st.parts:   # echo
                    yield self._chunk({"index": idx, "text": st.parts[0], "logprobs": None, "finish_reason": None})
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
            if st.tool_filter is not None:
                text = st.tool_filter.feed(text)
            if text or entries:
                delta = {"content": text} if text else {}
                lp = chat_logprobs(entries, strings) if entries else None
                yield self._chunk({"index": idx, "delta": delta, "logprobs": lp, "finish_reason": None})
            if finish:
                if st.tool_filter is not None:
                    rest, calls = st.tool_filter.finish()
                    if rest:
                        yield self._chunk({"index": idx, "delta": {"content": rest}, "logprobs": None,
                                           "finish_reason": None})
                    if calls:
                        finish = "tool_calls"
                        deltas = [{"index": k, "id": c["id"], "type": "function", "function": c["function"]}
                                  for k, c in enumerate(calls)]
                        yield self._chunk({"index": idx, "delta": {"tool_calls": deltas}, "logprobs": None,
                                           "finish_reason": None})
                yield self._chunk({"index": idx, "delta": {}, "logprobs": None, "finish_reason": finish})
        else:
            if text or entries:
                lp = None
                if entries:
                    lp, st.offset = completion_logprobs(entries, strings, st.offset)
                yield self._chunk({"index": idx, "text": text, "logprobs": lp, "finish_reason": None})
            if finish:
                yield self._chunk({"index": idx, "text": "", "logprobs": None, "finish_reason": finish})
