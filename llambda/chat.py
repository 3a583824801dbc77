"""Chat templates: HF-style Jinja templates rendered in a locked-down sandbox, and tool-call parsing.

The environment mirrors what transformers gives a template (ImmutableSandboxedEnvironment,
trim_blocks + lstrip_blocks, loopcontrols, `raise_exception`, `strftime_now`, a `tojson`
that is plain `json.dumps`), so rendered prompts match HF byte for byte. A template comes
from a model file, i.e. from strangers, so on top of Jinja's sandbox we:
  - raise at once on any access to an unsafe attribute (Jinja would return a silent Undefined),
  - check sizes *before* building big values (`'a' * n`, `x ** n`, padding widths, replace),
  - count work (loop iterations, calls, output writes) against a budget, so a template cannot
    hang the server, and cap the rendered size.
"""
from __future__ import annotations

import contextvars
import functools
import json
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from jinja2 import TemplateError, TemplateSyntaxError, nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError
from jinja2.visitor import NodeTransformer

from .errors import ChatTemplateError

DEFAULT_MAX_OUTPUT_CHARS = 1_000_000   # rendered prompt; a 128k-token prompt is ~500k chars
DEFAULT_MAX_STEPS = 250_000            # loop iterations + calls + output writes per render
_PRODUCED_FACTOR = 8                   # all text written (incl. set blocks, macros) vs the output cap
_MAX_INT_BITS = 16_384                 # integers a template may build (~4900 digits)

# The render budget in force; a ContextVar so concurrent renders (threads) don't share it.
_BUDGET: contextvars.ContextVar["_Budget | None"] = contextvars.ContextVar("llambda_chat_budget", default=None)


class _Budget:
    __slots__ = ("steps", "produced", "max_steps", "max_produced")

    def __init__(self, max_steps: int, max_produced: int):
        self.steps = 0
        self.produced = 0
        self.max_steps = max_steps
        self.max_produced = max_produced

    def step(self, n: int = 1) -> None:
        self.steps += n
        if self.steps > self.max_steps:
            raise ChatTemplateError(
                f"chat template exceeded its work budget ({self.max_steps} steps): runaway loop or recursion?")

    def produce(self, n_chars: int) -> None:
        self.produced += n_chars
        if self.produced > self.max_produced:
            raise ChatTemplateError(
                f"chat template wrote more than {self.max_produced} characters while rendering")


def _step(n: int = 1) -> None:
    budget = _BUDGET.get()
    if budget is not None:
        budget.step(n)


# --- the sandbox -------------------------------------------------------------------------

class _GenerationTag(Extension):
    """`{% generation %}...{% endgeneration %}` (transformers' assistant-mask marker): render the body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body).set_lineno(lineno)


def _env_call(attr: str, arg: nodes.Expr) -> nodes.Call:
    # EnvironmentAttribute compiles to `environment.<attr>`: a template cannot shadow it.
    call = nodes.Call(nodes.EnvironmentAttribute(attr), [arg], [], None, None)
    return call.set_lineno(arg.lineno or 1)


class _GuardTransformer(NodeTransformer):
    """Route loops, `~` concatenation and every output write through the environment's guards."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = _env_call("llambda_iter", node.iter)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        return _env_call("llambda_sized", node)

    def visit_Output(self, node: nodes.Output) -> nodes.Node:
        self.generic_visit(node)
        node.nodes = [_env_call("llambda_emit", child) for child in node.nodes]
        return node


class _CountedIterable:
    """Wraps a for-loop's iterable: each iteration costs one budget step; len() passes through."""

    __slots__ = ("_inner",)

    def __init__(self, inner):
        self._inner = inner

    def __iter__(self):
        budget = _BUDGET.get()
        for item in self._inner:
            if budget is not None:
                budget.step()
            yield item

    def __len__(self) -> int:
        return len(self._inner)


_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?")
_BRACE_SPEC = re.compile(r"\{[^{}]*:([^{}]*)\}")
_DIGITS = re.compile(r"\d+")
_PADDING_METHODS = frozenset({"center", "ljust", "rjust", "zfill"})
_SIZED_TYPES = (str, list, tuple, dict)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(str(fmt))


def _raise_exception(message: Any) -> None:
    raise ChatTemplateError(str(message))


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # transformers' filter: plain json.dumps (insertion order, no HTML escaping), unlike Jinja's.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


class _ChatSandbox(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"+", "*", "**", "%"})

    def __init__(self, max_chars: int):
        super().__init__(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, _GenerationTag])
        self.max_chars = max_chars
        self.filters["tojson"] = _tojson
        self.filters = {name: self._guard_filter(name, f) for name, f in self.filters.items()}
        self.globals["raise_exception"] = _raise_exception
        self.globals["strftime_now"] = _strftime_now
        lipsum = self.globals.get("lipsum")
        if lipsum is not None:
            self.globals["lipsum"] = self._guard_callable("lipsum", lipsum)

    # Jinja returns an Undefined for unsafe attributes, which prints as "" and lets a probing
    # template carry on; we stop it right there.
    def unsafe_undefined(self, obj: Any, attribute: str):
        raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe")

    def getattr(self, obj: Any, attribute: str) -> Any:
        # `x._name` is probing even when the attribute does not exist (Jinja would say Undefined).
        if isinstance(attribute, str) and attribute.startswith("_"):
            raise SecurityError(f"access to private attribute {attribute!r} is not allowed")
        return super().getattr(obj, attribute)

    # -- size checks ----------------------------------------------------------------------

    def _too_big(self, what: str) -> ChatTemplateError:
        return ChatTemplateError(f"chat template tried to build {what} larger than {self.max_chars} characters")

    def _check_int_args(self, name: str, args, kwargs) -> None:
        for v in (*args, *kwargs.values()):
            if isinstance(v, int) and not isinstance(v, bool) and abs(v) > self.max_chars:
                raise ChatTemplateError(f"chat template passed {v} to {name!r}: argument too large")

    def _check_format(self, fmt: Any, args, kwargs) -> None:
        """Widths in a %- or {}-format string bound what it allocates; `*` widths come from args."""
        if not isinstance(fmt, str):
            return
        dynamic_width = False
        numbers: list[str] = []
        for m in _PERCENT_SPEC.finditer(fmt):
            for g in m.groups():
                if g == "*":
                    dynamic_width = True
                elif g:
                    numbers.append(g)
        for m in _BRACE_SPEC.finditer(fmt):
            numbers.extend(_DIGITS.findall(m.group(1)))
        if re.search(r"\{[^{}]*\{", fmt):   # nested replacement field: width given as an argument
            dynamic_width = True
        if any(int(n) > self.max_chars for n in numbers):
            raise self._too_big("a formatted string")
        if dynamic_width:
            flat = list(args) + list(kwargs.values())
            for a in list(flat):
                if isinstance(a, (tuple, list)):
                    flat.extend(a)
                elif isinstance(a, Mapping):
                    flat.extend(a.values())
            self._check_int_args("format", flat, {})

    def _check_replace(self, s: Any, old: Any, new: Any, count: Any = -1) -> None:
        s, old, new = str(s), str(old), str(new)
        hits = s.count(old)
        if isinstance(count, int) and count >= 0:
            hits = min(hits, count)
        if len(s) + hits * max(0, len(new) - len(old)) > self.max_chars:
            raise self._too_big("a replaced string")

    def _check_result(self, value: Any) -> Any:
        if isinstance(value, _SIZED_TYPES) and len(value) > self.max_chars:
            raise self._too_big(f"a {type(value).__name__}")
        if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > _MAX_INT_BITS:
            raise ChatTemplateError(f"chat template built an integer of more than {_MAX_INT_BITS} bits")
        return value

    def _guard_filter(self, name: str, f):
        # Filters marked pass_context/eval_context/environment get that object first, then the value.
        skip = 2 if hasattr(f, "jinja_pass_arg") else 1

        @functools.wraps(f)
        def guarded(*args, **kwargs):
            _step()
            self._check_int_args(name, args[skip:], kwargs)
            value = args[skip - 1] if len(args) >= skip else None
            if name == "format":
                self._check_format(value, args[skip:], kwargs)
            elif name == "replace" and len(args) >= skip + 2:
                self._check_replace(value, args[skip], args[skip + 1], *args[skip + 2:skip + 3])
            return self._check_result(f(*args, **kwargs))

        return guarded

    def _guard_callable(self, name: str, f):
        @functools.wraps(f)
        def guarded(*args, **kwargs):
            self._check_int_args(name, args, kwargs)
            if name == "lipsum" and args and isinstance(args[0], int) and args[0] > 100:
                raise ChatTemplateError("chat template asked lipsum() for more than 100 paragraphs")
            return self._check_result(f(*args, **kwargs))

        return guarded

    # -- hooks the compiled template calls ------------------------------------------------

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (Jinja's signature)
        _step()
        target = getattr(__obj, "__wrapped__", __obj)   # str.format comes wrapped by the sandbox
        owner = getattr(target, "__self__", None)
        if isinstance(owner, str):
            name = getattr(target, "__name__", "")
            if name in _PADDING_METHODS:
                __self._check_int_args(f"str.{name}", args, kwargs)
            elif name == "expandtabs":
                size = args[0] if args else kwargs.get("tabsize", 8)
                if isinstance(size, int) and len(owner) + owner.count("\t") * max(size, 0) > __self.max_chars:
                    raise __self._too_big("an expanded string")
            elif name == "replace" and len(args) >= 2:
                __self._check_replace(owner, *args[:3])
            elif name in ("format", "format_map"):
                __self._check_format(owner, args, kwargs)
        return __self._check_result(super().call(__context, __obj, *args, **kwargs))

    def call_binop(self, context, operator: str, left: Any, right: Any) -> Any:
        _step()
        seq_types = (str, list, tuple)
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, seq_types) and isinstance(n, int) and len(seq) * n > self.max_chars:
                    raise self._too_big(f"a repeated {type(seq).__name__}")
            if isinstance(left, int) and isinstance(right, int) and \
                    left.bit_length() + right.bit_length() > _MAX_INT_BITS:
                raise ChatTemplateError(f"chat template built an integer of more than {_MAX_INT_BITS} bits")
        elif operator == "+":
            if isinstance(left, seq_types) and isinstance(right, seq_types) and \
                    len(left) + len(right) > self.max_chars:
                raise self._too_big(f"a concatenated {type(left).__name__}")
        elif operator == "**":
            if isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1 and \
                    right * abs(left).bit_length() > _MAX_INT_BITS:
                raise ChatTemplateError(f"chat template built an integer of more than {_MAX_INT_BITS} bits")
        elif operator == "%" and isinstance(left, str):
            self._check_format(left, (right,), {})
        return self._check_result(super().call_binop(context, operator, left, right))

    def llambda_iter(self, iterable: Any) -> Any:
        return _CountedIterable(iterable)

    def llambda_sized(self, value: Any) -> Any:
        return self._check_result(value)

    def llambda_emit(self, value: Any) -> str:
        text = str(value)
        budget = _BUDGET.get()
        if budget is not None:
            budget.produce(len(text))
        return text


# --- messages ----------------------------------------------------------------------------

def _flatten_content(content: Any, where: str) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, Mapping):
                raise ChatTemplateError(f"{where}: content part {j} must be an object, got {type(part).__name__}")
            kind = part.get("type")
            if kind != "text":
                raise ChatTemplateError(
                    f"{where}: content part {j} has type {kind!r}; only 'text' parts are supported")
            text = part.get("text")
            if not isinstance(text, str):
                raise ChatTemplateError(f"{where}: content part {j} needs a string 'text'")
            texts.append(text)
        # Several text parts are one message: join them on newlines (as vLLM does).
        return "\n".join(texts)
    raise ChatTemplateError(
        f"{where}: 'content' must be a string, null or a list of text parts, got {type(content).__name__}")


def _normalize_tool_calls(tool_calls: Any, where: str) -> list[dict]:
    if not isinstance(tool_calls, (list, tuple)):
        raise ChatTemplateError(f"{where}: 'tool_calls' must be a list, got {type(tool_calls).__name__}")
    out = []
    for j, call in enumerate(tool_calls):
        if not isinstance(call, Mapping):
            raise ChatTemplateError(f"{where}: tool_calls[{j}] must be an object")
        call = dict(call)
        fn = call.get("function")
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise ChatTemplateError(f"{where}: tool_calls[{j}] needs a 'function' with a string 'name'")
        fn = dict(fn)
        args = fn.get("arguments")
        # OpenAI clients send arguments as a JSON string; templates `tojson` them, so hand them
        # the object (as transformers' own examples and vLLM do). Unparseable strings stay strings.
        if isinstance(args, str):
            try:
                parsed = json.loads(args)
            except ValueError:
                parsed = None
            if isinstance(parsed, dict):
                fn["arguments"] = parsed
        call["function"] = fn
        out.append(call)
    return out


def validate_messages(messages: Any) -> list[dict]:
    """Check an OpenAI-style message list and return normalized copies.

    Each message needs a string `role` and a `content` that is a string, a list of
    {"type": "text", "text": ...} parts (joined with newlines) or, for an assistant message,
    null/absent when it carries `tool_calls`. Other keys are kept as they are.
    """
    if not isinstance(messages, (list, tuple)):
        raise ChatTemplateError(f"messages must be a list of objects, got {type(messages).__name__}")
    if not messages:
        raise ChatTemplateError("messages must not be empty")
    out = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, Mapping):
            raise ChatTemplateError(f"messages[{i}] must be an object with 'role' and 'content', "
                                    f"got {type(msg).__name__}")
        role = msg.get("role")
        if not isinstance(role, str) or not role:
            raise ChatTemplateError(f"messages[{i}] needs a non-empty string 'role'"
                                    + ("" if role is None else f", got {type(role).__name__}"))
        where = f"messages[{i}] (role {role!r})"
        norm = dict(msg)
        has_calls = msg.get("tool_calls") is not None
        if has_calls:
            norm["tool_calls"] = _normalize_tool_calls(msg["tool_calls"], where)
        if "content" not in msg and not (role == "assistant" and has_calls):
            raise ChatTemplateError(f"{where} has no 'content'")
        content = _flatten_content(msg.get("content"), where)
        if content is None and not (role == "assistant" and has_calls):
            raise ChatTemplateError(f"{where}: 'content' may be null only for an assistant message with tool_calls")
        norm["content"] = content
        out.append(norm)
    return out


def _validate_tools(tools: Any) -> list | None:
    if tools is None:
        return None
    if not isinstance(tools, (list, tuple)) or not all(isinstance(t, Mapping) for t in tools):
        raise ChatTemplateError("tools must be a list of objects (OpenAI tool definitions)")
    return list(tools)


# --- the template ------------------------------------------------------------------------

_CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


class ChatTemplate:
    """A compiled chat template. `render(messages)` gives the prompt text (special tokens as text)."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "", name: str | None = None,
                 *, max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS, max_steps: int = DEFAULT_MAX_STEPS):
        if not isinstance(source, str) or not source.strip():
            raise ChatTemplateError("chat template source must be a non-empty string")
        self.source = source
        self.bos_token = bos_token or ""
        self.eos_token = eos_token or ""
        self.name = name
        self.max_output_chars = int(max_output_chars)
        self.max_steps = int(max_steps)
        self._env = _ChatSandbox(self.max_output_chars)
        try:
            tree = self._env.parse(source)
            tree = _GuardTransformer().visit(tree)
            self._template = self._env.from_string(tree)
        except TemplateSyntaxError as e:
            raise ChatTemplateError(f"chat template{self._label()} has a syntax error at line {e.lineno}: "
                                    f"{e.message}") from None
        except (TemplateError, RecursionError) as e:
            raise ChatTemplateError(f"chat template{self._label()} does not compile: {e}") from None

    @classmethod
    def default_chatml(cls) -> "ChatTemplate":
        """A plain ChatML template, for callers that explicitly ask for one (never a silent fallback)."""
        return cls(_CHATML, name="chatml")

    @classmethod
    def from_metadata(cls, metadata: Mapping, name: str | None = None) -> "ChatTemplate":
        """The template a GGUF carries (`tokenizer.chat_template`), with its BOS/EOS token texts.

        A model without one (a base model) is an error: it was not trained on any chat format.
        """
        source = metadata.get("tokenizer.chat_template")
        if not isinstance(source, str) or not source.strip():
            raise ChatTemplateError(
                "this model has no chat template (no 'tokenizer.chat_template' in its metadata); it is "
                "probably a base model: use plain completion, or supply a template explicitly")
        tokens = metadata.get("tokenizer.ggml.tokens")

        def token_text(key: str) -> str:
            tid = metadata.get(key)
            if tokens is None or not isinstance(tid, int) or not 0 <= tid < len(tokens):
                return ""
            return str(tokens[tid])

        return cls(source, token_text("tokenizer.ggml.bos_token_id"), token_text("tokenizer.ggml.eos_token_id"),
                   name=name or metadata.get("general.name"))

    def _label(self) -> str:
        return f" {self.name!r}" if self.name else ""

    def render(self, messages: list[dict], add_generation_prompt: bool = True, tools: list | None = None,
               **extra) -> str:
        msgs = validate_messages(messages)
        context = {"bos_token": self.bos_token, "eos_token": self.eos_token, "documents": None}
        context.update(extra)
        context.update(messages=msgs, tools=_validate_tools(tools), add_generation_prompt=bool(add_generation_prompt))
        token = _BUDGET.set(_Budget(self.max_steps, self.max_output_chars * _PRODUCED_FACTOR))
        try:
            chunks = []
            size = 0
            for chunk in self._template.generate(context):
                size += len(chunk)
                if size > self.max_output_chars:
                    raise ChatTemplateError(f"rendered chat prompt exceeds {self.max_output_chars} characters")
                chunks.append(chunk)
            return "".join(chunks)
        except ChatTemplateError:
            raise
        except SecurityError as e:
            raise ChatTemplateError(f"chat template{self._label()} attempted an unsafe operation: {e}") from None
        except TemplateError as e:
            raise ChatTemplateError(f"chat template{self._label()} failed: {e}") from None
        except RecursionError:
            raise ChatTemplateError(f"chat template{self._label()} recursed too deeply") from None
        except MemoryError:
            raise ChatTemplateError(f"chat template{self._label()} ran out of memory") from None
        except Exception as e:  # a template bug (TypeError, ZeroDivisionError, ...) is the template's error
            raise ChatTemplateError(f"chat template{self._label()} failed: {type(e).__name__}: {e}") from None
        finally:
            _BUDGET.reset(token)

    def __repr__(self) -> str:
        return f"ChatTemplate(name={self.name!r}, {len(self.source)} chars)"
