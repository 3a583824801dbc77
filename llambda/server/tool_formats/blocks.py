"""Any tool-call format (base.ToolFormat; Hermes' too, hermes.py) read as the text streams in.

`BlockParser` is every format's parser (feed/finish -> content and OpenAI tool-call deltas,
`.calls`, `content_spans()`, `settled()`, `take_reasoning()`, `reasoning_spans()`). Text is content
until one of the format's markers; the unit that follows is held until it ends, then parsed whole:
its calls go out then (arguments whole), except that a call whose name the format can tell early is
announced (id, type, name) as soon as that name is complete, and then its arguments, where they are
JSON text, in pieces as they arrive. A unit that is not a call of an offered tool with an object as
arguments comes back as content, marker and all, so nothing the model wrote is lost; a unit whose
first call was already announced and then does not parse keeps the call, with the arguments sent so
far or none, marked bad (the answer read whole is then all text, `split_answer`); one the answer
ended in is a call cut short. The blanks just before a unit
and between units are not content, and a marker cut at the end of a piece is held back. parallel
False: the first call only, later units dropped.
"""
from __future__ import annotations

import json

from .pieces import add_span, merge_call_deltas, new_call_id, partial_suffix
from .json_text import json_end

START, TEXT, UNIT, AFTER = "start", "text", "unit", "after"


class BlockParser:
    def __init__(self, fmt, names: set[str], parallel: bool = True, params: dict | None = None, prefix: str = ""):
        self.fmt, self.names, self.parallel, self.params = fmt, names, parallel, params or {}
        self.state = START if fmt.bare else TEXT
        self.buf = ""                 # text not yet decided on (always the tail of what was fed)
        self.seen = 0                 # characters fed
        self.calls: list[dict] = []   # {"id", "name", "arguments", "complete"}
        self.opener = ""              # the marker (or glue) the unit being read began with
        self.lead = ""                # the blanks just before it: content only if it is no call
        self.block_at = 0             # where the unit (with its lead) began in the text fed
        self.announced = False        # the unit's first call went out already
        self.named = False            # the unit's head was read (a name, offered or not: it no longer changes)
        self.skip = False             # the unit is dropped (parallel_tool_calls false, a call made)
        self.args_from: int | None = None
        self.args_sent = 0
        self.memo: dict = {}
        self._out: list[tuple] = []
        self._spans: list[tuple[int, int]] = []
        # a forced call's opening (the prompt's end, not generated): read first, its output (the call's
        # announcement) carried to the first real output, and the spans counted after it
        self._skip = len(prefix)
        self._carry: tuple | None = None
        if prefix:
            self._carry = self.feed(prefix)

    # -- output ----------------------------------------------------------------------------------
    def _here(self) -> int:
        return self.seen - len(self.buf)

    def _content(self, text: str, at: int) -> None:
        if text.strip() or (text and not self.calls):      # blanks between calls are not content
            self._out.append(("content", text))
            add_span(self._spans, at, len(text))

    def _announce(self, name: str) -> None:
        self.calls.append({"id": new_call_id(), "name": name, "arguments": "", "complete": False})
        self._out.append(("delta", {"index": len(self.calls) - 1, "id": self.calls[-1]["id"], "type": "function",
                                    "function": {"name": name, "arguments": ""}}))

    def _args(self, args: dict) -> None:
        text = json.dumps(args, ensure_ascii=False)
        self.calls[-1]["arguments"] = text
        self.calls[-1]["complete"] = True
        self._out.append(("delta", {"index": len(self.calls) - 1, "function": {"arguments": text}}))

    def content_spans(self) -> list[tuple[int, int]]:
        """Where the content lies in the generated text (after any prefix)."""
        return [(max(s - self._skip, 0), e - self._skip) for s, e in self._spans if e > self._skip]

    def settled(self) -> int:
        """How much of the text fed is decided: not what is held, nor a unit not yet announced."""
        at = self.block_at if self.state == UNIT and not self.announced else self._here()
        return max(at - self._skip, 0)

    def reasoning_spans(self) -> list[tuple[int, int]]:
        return []

    def take_reasoning(self) -> str:
        return ""

    # -- feeding -----------------------------------------------------------------------------------
    def feed(self, text: str) -> tuple[str, list[dict]]:
        """Content to emit now and tool-call deltas, for the next piece of the answer."""
        self.buf, self.seen = self.buf + text, self.seen + len(text)
        while self._advance():
            continue
        return self._take()

    def finish(self) -> tuple[str, list[dict]]:
        buf, self.buf = self.buf, ""
        if self.state == UNIT:
            self._close(buf, ended=False)
        else:
            self._content(buf, self.seen - len(buf))
        self.state = TEXT
        return self._take()

    def _take(self) -> tuple[str, list[dict]]:
        out, self._out = self._out, []
        content, deltas = "".join(v for k, v in out if k == "content"), [v for k, v in out if k == "delta"]
        if self._carry is not None:
            (c0, d0), self._carry = self._carry, None
            content, deltas = c0 + content, d0 + deltas
        return content, merge_call_deltas(deltas)

    def _advance(self) -> bool:
        s = self.state
        if s == START:
            starts = self.fmt.bare_start(self.buf)
            if starts is None:
                return False
            if starts:
                self._open("", "", self._here())
            else:
                self.state = TEXT
            return True
        if s == TEXT:
            return self._text()
        if s == UNIT:
            end = self.fmt.unit_end(self.buf, self.opener, self.memo)
            body = self.buf if end is None else self.buf[:end]
            if not (self.skip or self.named):      # read the head once: not again at every token
                name = self.fmt.head(body, self.opener)
                self.named = name is not None
                if self.named and name in self.names:
                    self._announce(name)
                    self.announced = True
            if self.announced:
                self._stream_args(body)
            if end is None:
                return False
            self.buf = self.buf[end:]
            # the glue after a unit (a closing wrapper, a separator) is dropped only after calls
            self.state = AFTER if self._close(body, ended=True) else TEXT
            return True
        if s == AFTER:
            step = self.fmt.after(self.buf)
            if step is None:
                return False
            kind, n = step
            glue, self.buf = self.buf[:n], self.buf[n:]
            if kind == "unit":
                self._open(glue, "", self._here() - n)
            else:
                self.state = TEXT
            return True
        return False

    def _text(self) -> bool:
        found = [(self.buf.find(o), o) for o in self.fmt.openers]
        found = [(at, o) for at, o in found if at >= 0]
        if not found:
            if self.calls and not self.buf.strip():
                return False              # blanks after a call: content only if text follows
            keep = max(partial_suffix(self.buf, o) for o in self.fmt.openers)
            text = self.buf[:len(self.buf) - keep]
            keep += len(text) - len(text.rstrip())      # trailing blanks wait: a call may follow them
            self._content(self.buf[:len(self.buf) - keep], self._here())
            self.buf = self.buf[len(self.buf) - keep:]
            return False
        at, opener = min(found, key=lambda f: (f[0], -len(f[1])))
        text = self.buf[:at].rstrip()
        self._content(text, self._here())
        lead = self.buf[len(text):at]
        block_at = self._here() + len(text)
        self.buf = self.buf[at + len(opener):]
        self._open(opener, lead, block_at)
        return True

    def _open(self, opener: str, lead: str, at: int) -> None:
        self.opener, self.lead, self.block_at = opener, lead, at
        self.announced = self.named = False
        self.args_from = None                 # where the announced call's arguments start in the unit
        self.args_sent = 0                    # how much of them went out
        self.memo: dict = {}                  # the format's notes on this unit while it grows
        self.skip = bool(self.calls) and not self.parallel
        self.state = UNIT

    def _stream_args(self, body: str) -> None:
        """The announced call's JSON arguments that arrived, as written, up to where they balance."""
        if self.args_from is None:
            self.args_from = self.fmt.args_at(body, self.opener)
            if self.args_from is None:
                return
        end = json_end(body, self.args_from, self.memo)
        piece = body[self.args_from + self.args_sent:len(body) if end is None else end]
        if piece:
            self.args_sent += len(piece)
            self.calls[-1]["arguments"] += piece
            self._out.append(("delta", {"index": len(self.calls) - 1, "function": {"arguments": piece}}))

    def _close(self, body: str, ended: bool) -> bool:
        """A unit read to its end (ended) or to the end of the answer: its calls (True), or its text."""
        if self.skip:
            return True
        calls = self.fmt.parse(body, self.opener, self.params)
        valid = bool(calls) and all(n in self.names and isinstance(a, dict) for n, a in calls)
        if self.announced:
            mine = valid and calls[0][0] == self.calls[-1]["name"]
            self.calls[-1]["bad"] = ended and not mine      # read whole, the answer is then all text
            if self.args_from is not None:
                # its arguments went out as they came: complete unless the answer ended inside them
                # (as read whole too: the same parser); not a call after all, the arguments say so
                self.calls[-1]["complete"] = ended or mine
                if not mine:
                    return True
            elif mine:
                self._args(calls[0][1])
            else:
                # announced, then not a call: malformed (complete, no valid arguments) or cut short
                self.calls[-1]["complete"] = ended
                return True
            calls = calls[1:]
        elif not valid:
            self._content(self.lead + self.opener + body, self.block_at)
            return False
        for name, args in calls:
            if self.calls and not self.parallel:
                break
            self._announce(name)
            self._args(args)
        return True
