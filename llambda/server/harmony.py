"""OpenAI's harmony format (gpt-oss): the answer as channels, parsed as the text streams in.

A gpt-oss answer is a run of messages, each a header and a body:

    <|channel|>analysis<|message|>...thinking...<|end|>
    <|start|>assistant<|channel|>final<|message|>...the answer...<|return|>

and a call of a function tool is a message to a recipient, its body the JSON arguments:

    <|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>

(the recipient may also stand before `<|channel|>`). The analysis channel becomes the OpenAI
`reasoning_content`, the final (and commentary) channel the `content`, and a message to
`functions.NAME` of an offered tool an OpenAI tool call. `<|return|>` and `<|call|>` end the
generation (the tokenizer counts them as end-of-generation tokens), so usually the text stops
just before them. `HarmonyParser` has blocks.BlockParser's interface (feed/finish -> content and
tool-call deltas, `.calls`), plus `take_reasoning()` for the analysis text that arrived.
`with_analysis` goes the other way: an earlier turn's reasoning into the prompt, as the template wants it.
"""
from __future__ import annotations

import re

from .errors import bad_request
from .schemas import _type
from .tool_formats.pieces import merge_call_deltas, new_call_id, partial_suffix

START, CHANNEL, MESSAGE, CONSTRAIN = "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"
END, RETURN, CALL = "<|end|>", "<|return|>", "<|call|>"
_TERMINATORS = (END, RETURN, CALL)
_HEADER_OPENERS = (CHANNEL, START, CONSTRAIN, " to=")
_MAX_HEADER = 512         # a "header" whose <|message|> starts further in is not one: its text is content
_CHANNEL_RE = re.compile(r"<\|channel\|>\s*([^\s<]+)")
_RECIPIENT_RE = re.compile(r"(?:^|\s)to=([^\s<]+)")

# parser states
OPENING, HEADER, BODY, GAP = "opening", "header", "body", "gap"


def speaks_harmony(model) -> bool:
    """The model answers in harmony's channels: its vocabulary has `<|channel|>`, or its chat template writes one."""
    src = getattr(getattr(model, "source", None), "chat_template", None) or ""
    return harmony_vocabulary(getattr(model, "tokenizer", None)) or CHANNEL in src


def harmony_vocabulary(tokenizer) -> bool:
    """The model speaks harmony: its vocabulary has the `<|channel|>` token."""
    vocab = getattr(tokenizer, "vocab", None) if tokenizer is not None else None
    tokens = getattr(vocab, "tokens", None)
    return tokens is not None and CHANNEL in tokens


class HarmonyParser:
    """Feed generated text; get (content, tool-call deltas) back, and the reasoning by take_reasoning().

    names: the function tools the request offered (a message to any other recipient is content);
    parallel: False keeps only the first call.
    """

    def __init__(self, names: set[str] | None = None, parallel: bool = True):
        self.names = names or set()
        self.parallel = parallel
        self.state = OPENING
        self.buf = ""
        self.sink = "content"      # where the current body goes: "content", "reasoning" or "call"
        self.calls: list[dict] = []   # {"id", "name", "arguments"}
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._deltas: list[dict] = []
        self.seen = 0              # characters fed (buf is always their tail)
        self._message_at = 0       # where the current message began, its header included
        self._analysis: list[tuple[int, int]] = []   # (start, end) of each analysis message, ended
        self._body_at = 0          # where the current message's body began
        self._bodies: list[tuple[int, int]] = []     # (start, end) of each content message's body, ended

    # -- output ------------------------------------------------------------------------------
    def _emit(self, text: str) -> None:
        if not text:
            return
        if self.sink == "reasoning":
            self._reasoning.append(text)
        elif self.sink == "call":
            self.calls[-1]["arguments"] += text
            self._deltas.append({"index": len(self.calls) - 1, "function": {"arguments": text}})
        elif self.sink == "content":
            self._content.append(text)
        # "drop": a further call while parallel_tool_calls is false

    def _take(self) -> tuple[str, list[dict]]:
        content, deltas = "".join(self._content), merge_call_deltas(self._deltas)
        self._content, self._deltas = [], []
        return content, deltas

    def take_reasoning(self) -> str:
        """The analysis-channel text that arrived since the last call."""
        out, self._reasoning = "".join(self._reasoning), []
        return out

    def finished_calls(self) -> list[dict]:
        """The calls as a whole answer's message lists them (one cut by max_tokens with its arguments
        as far as they got)."""
        return [{"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                for c in self.calls]

    def reasoning_spans(self) -> list[tuple[int, int]]:
        """Where the analysis messages lie in the text fed so far, header and terminator included; one
        still open runs to the end."""
        if self.state == BODY and self.sink == "reasoning":
            return self._analysis + [(self._message_at, self.seen)]
        return list(self._analysis)

    def content_spans(self) -> list[tuple[int, int]]:
        """Where the content messages' bodies lie in the text fed so far (no header, no terminator); one
        still open runs to the end."""
        if self.state == BODY and self.sink == "content":
            return self._bodies + [(self._body_at, self.seen)]
        return list(self._bodies)

    def settled(self) -> int:
        """How much of the text fed so far has its place (analysis, content, ...) decided: all but what is held."""
        return self.seen - len(self.buf)

    # -- feeding -------------------------------------------------------------------------------
    def feed(self, text: str) -> tuple[str, list[dict]]:
        """Content to emit now and tool-call deltas (OpenAI `delta.tool_calls` entries)."""
        self.buf += text
        self.seen += len(text)
        while self._advance():
            pass
        return self._take()

    def finish(self) -> tuple[str, list[dict]]:
        """Whatever is still held, at the end of the answer (a call's `<|call|>` ends the generation
        and is not in the text; one cut by max_tokens keeps the arguments it has)."""
        if self.state == BODY:
            self._emit(self.buf)
            self._analysis, self._bodies = self.reasoning_spans(), self.content_spans()
        elif self.state in (OPENING, GAP) and self.buf.strip():
            self.sink = "content"
            self._emit(self.buf)
            self._bodies.append((self.seen - len(self.buf), self.seen))
        # HEADER: a header cut short is format, not text
        self.buf, self.state = "", GAP
        return self._take()

    def _advance(self) -> bool:
        """One state transition over `buf`; False when it needs more text."""
        if self.state in (OPENING, GAP):
            return self._between()
        if self.state == HEADER:
            # decided on the header's first _MAX_HEADER + len(MESSAGE) characters alone, so however
            # the text arrived in pieces: <|message|> starting past _MAX_HEADER is not the header's
            at = self.buf.find(MESSAGE, 0, _MAX_HEADER + len(MESSAGE))
            if at < 0:
                if len(self.buf) >= _MAX_HEADER + len(MESSAGE):
                    self._open_body("content")
                    return True
                return False
            header, self.buf = self.buf[:at], self.buf[at + len(MESSAGE):]
            self._open_body(self._sink_of(header))
            return True
        return self._body()

    def _between(self) -> bool:
        """Before a message: its header starts here, or (an answer without one) its body does."""
        head = self.buf if self.state == OPENING else self.buf.lstrip()
        if self.state == GAP:
            self.buf = head               # blanks between messages are dropped, not re-read at every token
        if not head:
            return False
        if head.startswith(START) or head.startswith(_HEADER_OPENERS):
            self._message_at = self.seen - len(head)
            self.buf, self.state = head[len(START):] if head.startswith(START) else head, HEADER
            return True
        if any(o.startswith(head) for o in _HEADER_OPENERS + (START,)):
            return False                  # an opener may be arriving
        self.buf = head
        self._open_body("content")
        return True

    def _body(self) -> bool:
        cut = [(self.buf.find(t), t) for t in _TERMINATORS]
        cut = [(i, t) for i, t in cut if i >= 0]
        if not cut:
            keep = max(partial_suffix(self.buf, t) for t in _TERMINATORS)
            self._emit(self.buf[:len(self.buf) - keep])
            self.buf = self.buf[len(self.buf) - keep:]
            return False
        at, term = min(cut)
        self._emit(self.buf[:at])
        if self.sink == "content":
            self._bodies.append((self._body_at, self.seen - len(self.buf) + at))
        self.buf = self.buf[at + len(term):]
        if self.sink == "reasoning":
            self._analysis.append((self._message_at, self.seen - len(self.buf)))
        self.sink = "content"
        self.state = GAP
        return True

    # -- messages ------------------------------------------------------------------------------
    def _sink_of(self, header: str) -> str:
        m = _RECIPIENT_RE.search(header)
        if m is not None:
            recipient = m.group(1)
            name = recipient[len("functions."):] if recipient.startswith("functions.") else None
            if name in self.names:
                if self.calls and not self.parallel:
                    return "drop"
                self.calls.append({"id": new_call_id(), "name": name, "arguments": ""})
                self._deltas.append({"index": len(self.calls) - 1, "id": self.calls[-1]["id"], "type": "function",
                                     "function": {"name": name, "arguments": ""}})
                return "call"
            return "content"
        m = _CHANNEL_RE.search(header)
        return "reasoning" if m is not None and m.group(1) == "analysis" else "content"

    def _open_body(self, sink: str) -> None:
        """The body starts where `buf` does."""
        self.sink, self.state = sink, BODY
        self._body_at = self.seen - len(self.buf)


def with_analysis(messages: list) -> list:
    """The messages with each assistant turn's reasoning as the `thinking` field gpt-oss's template reads.

    OpenAI's harmony guide: a turn that called a tool gives its analysis back in the next prompt
    (until a final answer, after which the template drops it). Clients send it back as chat's
    `reasoning_content` (what we answer with) or `reasoning`; `thinking`, if given, stays. The template
    refuses content and thinking together on a tool-call turn (content is then that turn's analysis),
    so such a turn is left as it came.
    """
    out = []
    for i, m in enumerate(messages):
        reasoning = _reasoning_of(m, i) if isinstance(m, dict) and m.get("role") == "assistant" else None
        if reasoning and "thinking" not in m and not (m.get("tool_calls") and m.get("content")):
            m = {**m, "thinking": reasoning}
        out.append(m)
    return out


def _reasoning_of(message: dict, i: int) -> str | None:
    for key in ("reasoning_content", "reasoning"):
        v = message.get(key)
        if v is not None and not isinstance(v, str):
            raise bad_request(f"messages[{i}].{key} must be a string, got {_type(v)}", param=f"messages[{i}].{key}")
        if v:
            return v
    return None

