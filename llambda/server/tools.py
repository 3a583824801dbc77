"""Tool calls: how one request's answers are read for them (`ToolSetup`: the parser of the model's
own format, tool_formats, Hermes' `<tool_call>{json}</tool_call>` by default), reading a finished
answer whole with that same parser (`split_answer`), the Hermes form's grammars (under "auto" its own;
a forced call HermesFormat.forced's, the forcing code every format shares) and the generic tool prompt
for templates that know nothing of tools.

Every format's parser (tool_formats.blocks.BlockParser, harmony's, think's wrapper) turns text into
content and OpenAI-style tool-call deltas while it arrives; the non-streaming answer runs the same
parser over the whole text, so both agree.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from .tool_formats import FORMATS
from .tool_formats.forcing import Spelling
from .tool_formats.hermes import CLOSE as CLOSE_TAG
from .tool_formats.hermes import OPEN as OPEN_TAG
from .tool_formats.hermes import call_rules
from .tool_formats.hermes import opening as hermes_opening
from .tool_formats.json_text import loaded
from .tool_formats.pieces import merge_call_deltas  # noqa: F401 (ollama_api reads it here)


def tool_names(tools: list | None) -> set[str]:
    return {t["function"]["name"] for t in tools or []}


@dataclass
class ToolSetup:
    """How one request's answers are read for tool calls."""
    names: set[str] = field(default_factory=set)   # offered tools (empty: no parsing)
    prefix: str = ""                                # what we started the answer with (forced choice)
    parallel: bool = True                           # parallel_tool_calls
    harmony: bool = False                           # the model answers in harmony's channels (gpt-oss)
    thinks: bool = False                            # the model reasons in <think>...</think> first (think.py)
    thought_open: bool = False                      # ...and the prompt already opened that <think>
    format: object | None = None                    # the model's own call syntax (a tool_formats format);
                                                    # None: the Hermes form
    params: dict = field(default_factory=dict)      # each offered tool's parameters schema (typed values)

    def parser(self):
        """A parser of the answer's calls, whatever the format (feed/finish -> content and tool-call
        deltas, `.calls`, `content_spans()`, `settled()`: tool_formats.blocks.BlockParser)."""
        fmt = self.format if self.format is not None else FORMATS["hermes"]
        return fmt.parser(self.names, self.parallel, self.params, self.prefix)

    def extract(self, text: str) -> tuple[str, list[dict]]:
        content, calls, _ = split_answer(text, self.names, self.prefix, self.parallel, self.parser())
        return content, calls

    def text_spans(self, text: str) -> list[tuple[int, int]]:
        """Where extract(text)'s content lies in `text` (the calls left out)."""
        return split_answer(text, self.names, self.prefix, self.parallel, self.parser())[2]


def hermes_prefix(choice) -> str:
    """Text that starts the assistant's answer so the model must call a tool (Hermes-style templates).

    `choice` is "required" (the model picks the name) or the name of the forced function.
    """
    return hermes_opening("" if choice == "required" else choice)


def _valid_call(call: dict) -> bool:
    try:
        return call["complete"] and not call.get("bad") and isinstance(json.loads(call["arguments"]), dict)
    except ValueError:
        return False


def extract_tool_calls(text: str, names: set[str], prefix: str = "",
                       parallel: bool = True) -> tuple[str, list[dict]]:
    """(content, tool calls) of a finished answer: split_answer's, without where the content lies."""
    content, calls, _ = split_answer(text, names, prefix, parallel)
    return content, calls


def split_answer(text: str, names: set[str], prefix: str = "", parallel: bool = True,
                 parser=None) -> tuple[str, list[dict], list[tuple[int, int]]]:
    """(content, tool calls, where the content lies in `text`) of a finished answer; `text` is what
    the model generated after `prefix`.

    Calls must be complete with arguments that parse as a JSON object; otherwise the whole
    answer (with the prefix) is returned as content and no call. An answer that ends inside a
    call's arguments (cut by max_tokens) is the exception: its calls come back as streaming sent
    them, the last one's arguments as far as they got (as OpenAI returns a call cut by the limit).
    parser: a fresh parser of another format (tool_formats) to read it with, else the Hermes form's.
    """
    p = parser if parser is not None else ToolSetup(names, prefix, parallel).parser()
    content, _ = p.feed(text)
    rest, _ = p.finish()
    content += rest
    calls = []
    cut = bool(p.calls) and not p.calls[-1]["complete"]
    for c in p.calls:
        if not cut and not _valid_call(c):
            return prefix + text, [], [(0, len(text))] if text else []
        calls.append({"id": c["id"], "type": "function",
                      "function": {"name": c["name"], "arguments": c["arguments"]}})
    if not calls:
        return content, [], p.content_spans()
    return content.strip(), calls, _stripped(p.content_spans(), text)


def _stripped(spans: list[tuple[int, int]], text: str) -> list[tuple[int, int]]:
    """`spans` of `text` less the blanks their joined text starts and ends with (as str.strip())."""
    spans = list(spans)
    while spans and not text[spans[0][0]:spans[0][1]].strip():
        spans.pop(0)
    while spans and not text[spans[-1][0]:spans[-1][1]].strip():
        spans.pop()
    if spans:
        s, e = spans[0]
        spans[0] = (e - len(text[s:e].lstrip()), e)
        s, e = spans[-1]
        spans[-1] = (s, s + len(text[s:e].rstrip()))
    return spans


# -- constrained calls -------------------------------------------------------------------------
# A call is `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` whatever the template, so
# the parser above reads calls of Hermes-style templates and of the generic prompt alike. The
# grammar makes it valid by construction: the name one of the offered tools, the arguments valid
# against that tool's parameter schema.

def tool_grammar(tools: list, names: set[str], choice: str, parallel: bool, inline: bool = False,
                 tokenizer=None) -> str:
    """A Lark grammar (llguidance's dialect) for an answer under tools.

    choice "required" or "function" (names: the forced one): the Hermes form's forced call
    (HermesFormat.forced, the shared forcing code): the prompt already ends with `hermes_prefix(...)`
    (prefilled, cheaper than forced decode steps), and the grammar goes on from there: a tool name,
    its arguments, the closing tag; more calls with `parallel`. Where the answer comes after a
    thought, the prompt cannot end with it: with `inline` that prefix is then the grammar's first text.
    "auto": free text, but from a `<tool_call>` tag on (a lazy lexeme: it ends at the first
    occurrence of the tag) the call must be valid, and text may follow a call, as the parser
    expects. An answer that opens with `{` or a ``` fence is what the parser takes for a bare
    call (small models drop the tags), so there it must be a valid call too.
    tokenizer: the tags are written as its control tokens where they are ones (but for the opening
    tag under "auto": the lazy text before it ends at text, not at a token).
    """
    spell = Spelling.of(tokenizer, FORMATS["hermes"].markers)
    if choice != "auto":
        return FORMATS["hermes"].forced(tools, names, choice, spell, parallel).grammar(inline=inline)
    rules = "".join(r + "\n" for r in call_rules(tools, names, spell))
    start = (f'start: first body (lead body)* TEXT | FIRST | bare\n'
             f'first[lazy]: FIRST "{OPEN_TAG}"\n'
             f'lead[lazy]: TEXT "{OPEN_TAG}"\n'
             'bare: call | "```json\\n" call "\\n```" | "```\\n" call "\\n```"\n'
             # text that does not open a bare call: its first visible character is not "{",
             # and a ``` fence there names a language other than json
             'FIRST: /\\s*|\\s*([^\\s{`]|`[^`]|``[^`]|```([A-Za-ik-z]|j[^s]|js[^o]|jso[^n]|json[^ \\t\\n]'
             '|[^A-Za-z \\t\\n]))(.|\\n)*/')
    return f'%llguidance {{}}\n{start}\n{rules}'


GENERIC_TOOLS = """You can call these tools (functions), given as JSON schemas:
{tools}

To call a tool, answer with the call and nothing else, in this form:
<tool_call>
{{"name": "<function name>", "arguments": <the arguments as a JSON object>}}
</tool_call>
{rule}"""


def generic_tool_messages(messages: list, tools: list, choice: str, forced: str | None) -> list:
    """Messages for a template that knows nothing of tools: a system message describing the tools
    and the call format, earlier calls written in that format, tool results as user turns."""
    listing = json.dumps([{"name": t["function"]["name"], "description": t["function"].get("description", ""),
                           "parameters": t["function"].get("parameters") or {"type": "object"}}
                          for t in tools], ensure_ascii=False, indent=1)
    rule = {"required": "You must call one of the tools.",
            "function": f"You must call the tool {forced}."}.get(choice, "If no tool helps, answer directly.")
    text = GENERIC_TOOLS.format(tools=listing, rule=rule)
    first = messages[0] if messages else {}
    if first.get("role") in ("system", "developer"):
        return [{"role": "system", "content": f"{_text(first.get('content'))}\n\n{text}"}] \
            + written_history(messages[1:])
    return [{"role": "system", "content": text}] + written_history(messages)


def has_tool_turns(messages: list) -> bool:
    """Whether a conversation holds earlier calls or tool results (what a template without tools
    cannot render as they are)."""
    return any(isinstance(m, dict) and (m.get("tool_calls") or m.get("role") in ("tool", "function"))
               for m in messages)


def written_history(messages: list) -> list:
    """Messages (checked by chat.validate_messages) for a template that knows nothing of tools: earlier
    calls written in the <tool_call> format into their assistant turn, tool results as user turns. Also
    without tools offered now (tool_choice "none"): such a template cannot render a turn of calls alone."""
    out = []
    for m in messages:
        role = m.get("role")
        if role == "assistant" and m.get("tool_calls"):
            calls = "\n".join(_written_call(c) for c in m["tool_calls"])
            out.append({"role": "assistant", "content": (_text(m.get("content")) + "\n" + calls).strip()})
        elif role in ("tool", "function"):
            out.append({"role": "user", "content": f"<tool_response>\n{_text(m.get('content'))}\n</tool_response>"})
        else:
            out.append(m)
    return out


def _text(content) -> str:
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def _written_call(call: dict) -> str:
    fn = call.get("function") or {}
    args = loaded(fn.get("arguments", {}))
    return f"{OPEN_TAG}\n{json.dumps({'name': fn.get('name'), 'arguments': args}, ensure_ascii=False)}\n{CLOSE_TAG}"
