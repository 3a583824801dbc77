"""OpenAI response objects: completions, chat completions, their stream chunks, logprobs, usage."""
from __future__ import annotations

import json
import os
import secrets
import time

from .harmony import HarmonyParser
from .reasoning_tokens import TokenEnds, counts_reasoning
from .think import ThinkParser
from .tools import ToolSetup


def adapter_cards(model) -> list[dict]:
    """The LoRA adapters merged into `model` at load as the listings show them (/v1/models' meta.adapters,
    Ollama's /api/show and /api/ps): by file name, never their path on the server's disk."""
    return [{"name": os.path.basename(ad["path"].rstrip("/\\")), **{k: v for k, v in ad.items() if k != "path"}}
            for ad in getattr(model, "adapters", None) or []]


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


def dumps(obj) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def sse(obj) -> bytes:
    return f"data: {dumps(obj)}\n\n".encode()


SSE_DONE = b"data: [DONE]\n\n"


class TokenStrings:
    """Text and UTF-8 bytes of single tokens, for logprobs (cached: the same ids recur)."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def get(self, token: int) -> tuple[str, list[int]]:
        hit = self._cache.get(token)
        if hit is None:
            raw = self._bytes(token)
            hit = (raw.decode("utf-8", errors="replace"), list(raw))
            if len(self._cache) < 200_000:
                self._cache[token] = hit
        return hit

    def _bytes(self, token: int) -> bytes:
        for name in ("token_bytes", "piece_bytes"):
            fn = getattr(self.tok, name, None)
            if fn is not None:
                return bytes(fn(token))
        return self.tok.decode([token]).encode("utf-8")


class Usage:
    def __init__(self):
        self.prompt = 0
        self.completion = 0
        self.cached = 0
        self.reasoning = 0          # of the completion tokens, those of a thought or analysis channel

    def as_dict(self) -> dict:
        return {"prompt_tokens": self.prompt, "completion_tokens": self.completion,
                "total_tokens": self.prompt + self.completion,
                "prompt_tokens_details": {"cached_tokens": self.cached},
                "completion_tokens_details": {"reasoning_tokens": self.reasoning}}


class ChoiceState:
    """What one choice has produced so far (text, logprobs, finish)."""

    def __init__(self, index: int, echo: str = "", tools: ToolSetup | None = None, text_logprobs: bool = False):
        """text_logprobs: the logprobs of the answer's text only are asked for (/v1/responses' output_text,
        text_logprobs.py), so where each token ends is kept also where only tools split the answer."""
        self.index = index
        self.parts: list[str] = [echo] if echo else []
        self.echo = echo
        self.offset = len(echo)          # text offset of the next token (completions logprobs)
        self.logprobs: list = []         # (token, logprob, top) per generated token
        self.prompt_logprobs: list | None = None   # (token, logprob | None, top | None) per prompt token (echo)
        self.finish_reason: str | None = None
        self.n_generated = 0
        self.tools = tools
        self.tool_parser = answer_parser(tools)
        # where each token ends, for usage's reasoning_tokens and the text's logprobs (None: no reasoning
        # format to count, and no text logprobs asked for where tools split the answer)
        split = text_logprobs and tools is not None and bool(tools.names)
        self.token_ends = TokenEnds() if counts_reasoning(tools) or split else None
        self.answer: list[str] = []      # read whole: the answer's text and its reasoning, split as they came
        self.thought: list[str] = []
        self.made_calls = False          # streaming: tool-call deltas went out
        self.whole = False               # read whole (read_whole): tool calls are extracted at the end

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def read_whole(self) -> None:
        """The answer is read whole, not streamed: only its reasoning is split off as it arrives (one
        parser, whose spans also count the reasoning tokens); tool calls in a thinking model's answer
        are extracted from the answer at the end, as without a thought."""
        self.tool_parser = answer_parser(self.tools, whole=True)
        self.whole = True

    def keep(self, text: str, end: bool) -> None:
        """A whole answer's next text (end: the choice finished); the parser splits it as it comes."""
        if text:
            self.parts.append(text)
        p = self.tool_parser
        if p is None:
            return
        content = p.feed(text)[0] if text else ""
        if end:
            content += p.finish()[0]
        self.answer.append(content)
        self.thought.append(p.take_reasoning())

    def reasoning_tokens(self) -> int:
        """The generated tokens in the thought or the analysis messages, as the answer's parser found them."""
        if self.token_ends is None or self.tool_parser is None:
            return 0
        return self.token_ends.within(self.tool_parser.reasoning_spans())


def answer_parser(tools: ToolSetup | None, whole: bool = False):
    """What reads a chat answer as it streams: harmony's channels, a <think> thought then tool calls
    or text, tool calls, or nothing (plain text). whole: an answer read whole leaves the tool calls
    after a thought (and without one) to ToolSetup.extract at the end."""
    if tools is not None and tools.harmony:
        return HarmonyParser(tools.names, tools.parallel)
    calls = tools.parser() if tools is not None and tools.names and not whole else None
    if tools is not None and tools.thinks:
        return ThinkParser(calls, tools.thought_open)
    return calls


def tool_finish(finish: str | None, has_calls: bool) -> str | None:
    """OpenAI says "tool_calls" when the answer ended by calling; a cut-off call stays "length"."""
    return "tool_calls" if has_calls and finish == "stop" else finish


# -- logprobs ------------------------------------------------------------------

def chat_logprobs(entries, strings: TokenStrings) -> dict:
    content = []
    for token, logprob, top in entries:
        text, raw = strings.get(token)
        tops = []
        for t, lp in top:
            tt, tb = strings.get(t)
            tops.append({"token": tt, "logprob": lp, "bytes": tb})
        content.append({"token": text, "logprob": logprob, "bytes": raw, "top_logprobs": tops})
    return {"content": content, "refusal": None}


def completion_logprobs(entries, strings: TokenStrings, offset: int) -> tuple[dict, int]:
    """The legacy format; returns it and the text offset after these tokens.

    An entry's logprob and top may be None (the first prompt token of an echo has no context).
    """
    tokens, lps, tops, offsets = [], [], [], []
    for token, logprob, top in entries:
        text, _ = strings.get(token)
        tokens.append(text)
        lps.append(logprob)
        tops.append(None if top is None else {strings.get(t)[0]: lp for t, lp in top})
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}, offset


# -- whole responses -------------------------------------------------------------

def chat_response(rid: str, created: int, model: str, choices: list[ChoiceState], usage: Usage,
                  strings: TokenStrings | None, want_logprobs: bool, tools: ToolSetup | None) -> dict:
    """`choices` were read whole (ChoiceState.read_whole, .keep)."""
    out = []
    for c in choices:
        text = c.text
        finish = c.finish_reason
        reasoning = ""
        if tools is not None and tools.thinks and not tools.harmony:
            reasoning, text = "".join(c.thought), "".join(c.answer)
        message = {"role": "assistant", "content": text}
        if tools is not None and tools.harmony:
            message, finish = harmony_message(c, finish)
        elif tools is not None and tools.names:
            content, calls = tools.extract(text)
            if calls:
                message = {"role": "assistant", "content": content or None, "tool_calls": calls}
                finish = tool_finish(finish, True)
            else:
                message["content"] = content
        if reasoning:
            message["reasoning_content"] = reasoning
        out.append({"index": c.index, "message": message,
                    "logprobs": chat_logprobs(c.logprobs, strings) if want_logprobs else None,
                    "finish_reason": finish})
    return {"id": rid, "object": "chat.completion", "created": created, "model": model,
            "system_fingerprint": _fingerprint(), "choices": out, "usage": usage.as_dict()}


def harmony_message(c: ChoiceState, finish: str | None) -> tuple[dict, str | None]:
    """The assistant message of a harmony answer read whole: final channel as content, analysis as
    reasoning_content, function messages as tool calls."""
    content, reasoning, calls = "".join(c.answer), "".join(c.thought), c.tool_parser.finished_calls()
    message = {"role": "assistant", "content": content or (None if calls else "")}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = calls
        finish = tool_finish(finish, True)
    return message, finish


def completion_response(rid: str, created: int, model: str, choices: list[ChoiceState], usage: Usage,
                        strings: TokenStrings | None, want_logprobs: bool) -> dict:
    out = []
    for c in choices:
        lp = None
        if want_logprobs:
            entries = (c.prompt_logprobs or []) + c.logprobs
            lp, _ = completion_logprobs(entries, strings, 0 if c.prompt_logprobs else len(c.echo))
        out.append({"index": c.index, "text": c.text, "logprobs": lp, "finish_reason": c.finish_reason})
    return {"id": rid, "object": "text_completion", "created": created, "model": model,
            "system_fingerprint": _fingerprint(), "choices": out, "usage": usage.as_dict()}


def _fingerprint() -> str:
    from .. import __version__
    return f"llambda-{__version__}"


def now() -> int:
    return int(time.time())
