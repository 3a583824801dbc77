"""Chat templates: HF-style Jinja templates rendered in a locked-down sandbox, and tool-call parsing.

The environment mirrors what transformers gives a template (ImmutableSandboxedEnvironment,
trim_blocks + lstrip_blocks, loopcontrols, `raise_exception`, `strftime_now`, a `tojson`
that is plain `json.dumps`), so rendered prompts match HF byte for byte. A template comes
from a model file, i.e. from strangers, so on top of Jinja's sandbox we:
  - raise at once on any access to an unsafe attribute (Jinja would return a silent Undefined),
  - check sizes *before* building big values (`'a' * n`, `x ** n`, padding widths, replace),
  - count work (loop iterations, calls, output writes, and the size of what each filter, test,
    method, operator and comparison scans) against a budget, stop a render that has used more than
    its CPU time, and cap both the rendered size and the total size of the values a render builds,
  - drop a failed render's frames at once: Jinja's traceback holds them (and every big value they
    built) in a reference cycle that only the cyclic GC would free.
A single operation is refused *before* it runs when its estimated result or work is too large,
since nothing can interrupt one C call (and a long one holds the GIL for the whole server).
"""
from __future__ import annotations

import contextvars
import functools
import itertools
import json
import re
import string
import sys
import time
import traceback
from collections.abc import Mapping, Sized
from datetime import datetime
from typing import Any

from jinja2 import TemplateError, TemplateSyntaxError, nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError
from jinja2.utils import Namespace
from jinja2.visitor import NodeTransformer

from .errors import ChatTemplateError, InvalidInputError

DEFAULT_MAX_OUTPUT_CHARS = 1_000_000   # rendered prompt; a 128k-token prompt is ~500k chars
DEFAULT_MAX_STEPS = 250_000            # loop iterations + calls + output writes per render
DEFAULT_MAX_SECONDS = 1.5              # CPU time of one render (real templates: a few ms); a backstop
                                       # behind the step budget, which stops most work within ~1 s
DEFAULT_MAX_BUILT_BYTES = 64 * 2**20   # all values a render builds, summed (not just the live ones)
_PRODUCED_FACTOR = 8                   # all text written (incl. set blocks, macros) vs the output cap
MAX_SOURCE_CHARS = 256 * 1024           # template source; real ones are 0.3-20k chars. Compiling costs
                                       # ~0.8 KB of memory and ~13 us per char: 1 MB took 0.7 GB and 12 s
_MAX_INT_BITS = 16_384                 # integers a template may build (~4900 digits)
_SCAN_UNITS = 1024                     # chars (or items) a C-level scan handles per budget step
_MAX_JSON_INDENT = 32                  # tojson indent/separators (templates use 2 or 4)
_MAX_LIPSUM_WORDS = 10_000
_MAX_ERROR_CHARS = 2_000               # of an error message quoting the template (it goes back to clients)

# The render budget in force; a ContextVar so concurrent renders (threads) don't share it.
_BUDGET: contextvars.ContextVar["_Budget | None"] = contextvars.ContextVar("llambda_chat_budget", default=None)
_END = object()


class _Budget:
    __slots__ = ("steps", "produced", "built", "max_steps", "max_produced", "max_built", "max_seconds",
                 "deadline")

    def __init__(self, max_steps: int, max_produced: int, max_built: int = DEFAULT_MAX_BUILT_BYTES,
                 max_seconds: float = DEFAULT_MAX_SECONDS):
        self.steps = 0
        self.produced = 0
        self.built = 0
        self.max_steps = max_steps
        self.max_produced = max_produced
        self.max_built = max_built
        self.max_seconds = max_seconds
        # this thread's CPU time: a render waiting for the GIL behind others is not charged for it
        self.deadline = time.thread_time() + max_seconds

    def step(self, n: int = 1) -> None:
        self.steps += n
        if self.steps > self.max_steps:
            raise ChatTemplateError(
                f"chat template exceeded its work budget ({self.max_steps} steps): runaway loop or recursion?")
        # the clock costs ~0.5 us: read it every 256 steps, and after every sized operation
        if (n > 1 or not self.steps & 255) and time.thread_time() > self.deadline:
            raise ChatTemplateError(f"chat template ran for more than {self.max_seconds:g} s of CPU time")

    def build(self, n_bytes: int) -> None:
        self.built += n_bytes
        if self.built > self.max_built:
            raise ChatTemplateError(
                f"chat template built more than {self.max_built >> 20} MiB of values while rendering")

    def produce(self, n_chars: int) -> None:
        self.produced += n_chars
        if self.produced > self.max_produced:
            raise ChatTemplateError(
                f"chat template wrote more than {self.max_produced} characters while rendering")


def _step(n: int = 1) -> None:
    budget = _BUDGET.get()
    if budget is not None:
        budget.step(n)


def _scan(units: int) -> None:
    """Charge a C-level pass over `units` chars or items (one step per _SCAN_UNITS)."""
    _step(1 + units // _SCAN_UNITS)


def _shallow_len(value: Any) -> int:
    return len(value) if isinstance(value, Sized) and not isinstance(value, Namespace) else 0


def _measure(value: Any, limit: int, indent: int = 0) -> tuple[int, int]:
    """(an upper estimate of len(str(value)), repr or JSON, nodes visited), without building it.

    Shared references count each time, as printing repeats them; the walk stops once the size
    passes `limit`, so it costs at most ~limit/3 visits. Escapes in repr/JSON can make a string up
    to ~10x longer than counted here: the result is checked again once built.
    """
    size = seen = 0
    stack = [(iter((value,)), 0)]      # iterators, not items: a long list is not copied
    while stack and size <= limit:
        items, depth = stack[-1]
        v = next(items, _END)
        if v is _END:
            stack.pop()
            continue
        seen += 1
        size += 3 + depth * indent     # separators, quotes, brackets, the indentation of its line
        if isinstance(v, str):
            size += len(v)
        elif isinstance(v, bool) or v is None:
            size += 5
        elif isinstance(v, int):
            size += v.bit_length() // 3 + 1
        elif isinstance(v, float):
            size += 24
        elif isinstance(v, Mapping):
            stack.append((itertools.chain.from_iterable(v.items()), depth + 1))
        elif isinstance(v, (list, tuple, set, frozenset)):
            stack.append((iter(v), depth + 1))
        elif isinstance(v, Namespace):     # its repr shows its attributes
            stack.append((iter((v._Namespace__attrs,)), depth))
        else:
            size += 80                     # a default repr, "<Macro 'f'>", an Undefined's ""
    return size, seen


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
    """Route loops, `~` concatenation, comparisons, slices and every output write through the
    environment's guards."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = _env_call("llambda_iter", node.iter)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        # each part is measured before str() turns it into text, the whole once joined
        node.nodes = [_env_call("llambda_part", child) for child in node.nodes]
        return _env_call("llambda_sized", node)

    def visit_Compare(self, node: nodes.Compare) -> nodes.Node:
        # `in` and `==` scan their operands; Jinja compiles them to plain Python operators
        self.generic_visit(node)
        node.expr = _env_call("llambda_operand", node.expr)
        for op in node.ops:
            op.expr = _env_call("llambda_operand", op.expr)
        return node

    def visit_Getitem(self, node: nodes.Getitem) -> nodes.Node:
        self.generic_visit(node)
        # slices bypass the sandbox's getitem; a slice is a copy
        return _env_call("llambda_sized", node) if isinstance(node.arg, nodes.Slice) else node

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


_PERCENT_SPEC = re.compile(r"%(?:\((?P<key>[^)]*)\))?[#0\- +]*(?P<width>\*|\d+)?(?:\.(?P<prec>\*|\d+))?")
_DIGITS = re.compile(r"\d+")
_PADDING_METHODS = frozenset({"center", "ljust", "rjust", "zfill"})
_SIZED_TYPES = (str, list, tuple, dict)
_NUMBER_CHARS = 320          # the longest a formatted number gets without a width ('%f' % 1e308)
_LINE_BREAKS = ("\n", "\r", "\v", "\f", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029")
_HTML_SPECIAL = ("&", "<", ">", '"', "'")     # escaping makes each up to 5 chars

# Filters that loop in Python over each item (or char) they get: one budget step per item, not
# per _SCAN_UNITS; wordwrap's textwrap is slower still.
_PER_ITEM_FILTERS = frozenset({"batch", "dictsort", "groupby", "map", "max", "min", "pprint", "reject",
                               "rejectattr", "select", "selectattr", "slice", "sort", "sum", "unique", "urlize",
                               "xmlattr"})
_FILTER_WEIGHT = {**dict.fromkeys(_PER_ITEM_FILTERS, _SCAN_UNITS), "wordwrap": 4 * _SCAN_UNITS,
                  "title": _SCAN_UNITS // 8, "wordcount": 64}     # measured: ~0.17 us and ~60 ns a char
# Tests that scan their operands (`x is in y`, `s is lower`, `a is eq b`); the others look at a type.
_SCANNING_TESTS = frozenset({"in", "lower", "upper", "eq", "equalto", "==", "ne", "!=", "lt", "<", "lessthan",
                             "le", "<=", "gt", ">", "greaterthan", "ge", ">=", "sameas"})
# Filters that take any iterable: a generator (from map/select) becomes a list to be measured.
_ITERABLE_FILTERS = frozenset({"batch", "join", "max", "min", "slice", "sort", "sum", "unique", "groupby"})


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(str(fmt))


def _short(text: str) -> str:
    return text if len(text) <= _MAX_ERROR_CHARS else text[:_MAX_ERROR_CHARS] + "... (truncated)"


def _raise_exception(message: Any) -> None:
    raise ChatTemplateError(_short(str(message)))


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # transformers' filter: plain json.dumps (insertion order, no HTML escaping), unlike Jinja's.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _arg(args, kwargs, i: int, name: str, default: Any = None) -> Any:
    """A filter's parameter `name`, given at position i (after the value) or by keyword."""
    return args[i] if len(args) > i else kwargs.get(name, default)


class _ChatSandbox(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"+", "*", "**", "%"})

    def __init__(self, max_chars: int):
        # optimized=False: Jinja's optimizer would run filters on constant arguments at compile
        # time, outside any render's budget
        super().__init__(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, _GenerationTag],
                         optimized=False)
        self.max_chars = max_chars
        self.filters["tojson"] = _tojson
        self.filters = {name: self._guard_filter(name, f) for name, f in self.filters.items()}
        self.tests = {name: self._guard_test(name, f) for name, f in self.tests.items()}
        self.globals["raise_exception"] = _raise_exception
        self.globals["strftime_now"] = self._guard_callable("strftime_now", _strftime_now)
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

    def _size(self, value: Any, what: str, indent: int = 0) -> int:
        """The estimated printed size of `value`; refused above the size cap."""
        if isinstance(value, str):
            return self._expect(len(value), what)
        size, seen = _measure(value, self.max_chars, indent)
        self._expect(size, what)
        _step(seen)         # the walk is a Python loop: a step per node
        return size

    def _expect(self, size: int, what: str) -> int:
        if size > self.max_chars:
            raise self._too_big(what)
        return size

    def _materialize(self, value: Any) -> Any:
        """A generator as a list (at most max_chars items), so it can be measured; else as is."""
        if isinstance(value, (Sized, str)) or not hasattr(value, "__iter__"):
            return value
        items = list(itertools.islice(value, self.max_chars + 1))
        if len(items) > self.max_chars:
            raise self._too_big("a list")
        return items

    def _percent_size(self, fmt: str, values: Any) -> int:
        """Upper estimate of `fmt % values`: widths, precisions and the arguments each spec takes."""
        positional = list(values) if isinstance(values, tuple) else [] if isinstance(values, Mapping) else [values]
        size = len(fmt)
        for m in _PERCENT_SPEC.finditer(fmt):
            size += _NUMBER_CHARS
            for g in ("width", "prec"):
                if m.group(g) == "*":
                    n = positional.pop(0) if positional else 0
                    size += n if isinstance(n, int) else 0
                elif m.group(g):
                    size += int(m.group(g))
            if m.group("key") is not None:
                arg = values.get(m.group("key")) if isinstance(values, Mapping) else None
            else:
                arg = positional.pop(0) if positional else None
            size += self._size(arg, "a formatted string")
            self._expect(size, "a formatted string")
        return size

    def _brace_size(self, fmt: str, args, kwargs) -> int:
        """Upper estimate of `fmt.format(*args, **kwargs)`; a field may repeat an argument."""
        try:
            fields = list(string.Formatter().parse(fmt))
        except ValueError:
            return len(fmt)        # format() will refuse it
        ints = [v for v in (*args, *kwargs.values()) if isinstance(v, int) and not isinstance(v, bool)]
        size, auto = len(fmt), 0
        for _, field, spec, _ in fields:
            if field is None:
                continue
            base = re.split(r"[.\[]", field, maxsplit=1)[0]
            if base == "":
                base, auto = auto, auto + 1
            arg = kwargs.get(base) if isinstance(base, str) and not base.isdigit() else \
                (args[int(base)] if int(base) < len(args) else None)
            size += _NUMBER_CHARS + sum(int(n) for n in _DIGITS.findall(spec or ""))
            if spec and "{" in spec:       # a width given as an argument
                size += sum(abs(n) for n in ints)
            size += self._size(arg, "a formatted string")
            self._expect(size, "a formatted string")
        return size

    def _check_replace(self, s: Any, old: Any, new: Any, count: Any = -1) -> int:
        s, old, new = str(s), str(old), str(new)
        hits = s.count(old)
        if isinstance(count, int) and count >= 0:
            hits = min(hits, count)
        return self._expect(len(s) + hits * max(0, len(new) - len(old)), "a replaced string")

    def _check_result(self, value: Any) -> Any:
        if isinstance(value, _SIZED_TYPES) and len(value) > self.max_chars:
            raise self._too_big(f"a {type(value).__name__}")
        if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > _MAX_INT_BITS:
            raise ChatTemplateError(f"chat template built an integer of more than {_MAX_INT_BITS} bits")
        if isinstance(value, (str, list, tuple, dict, int)):
            budget = _BUDGET.get()
            if budget is not None:
                # a list's items are mostly new objects too (split, map): ~56 bytes each
                extra = 56 * len(value) if isinstance(value, (list, tuple, dict)) else 0
                budget.build(sys.getsizeof(value) + extra)
        return value

    # -- what a filter will scan and build, checked before it runs ------------------------
    # Each returns the units of work (chars or items) and raises when the result would be too big.

    def _pre_filter(self, name: str, value: Any, args, kwargs) -> int:
        text = value if isinstance(value, str) else None
        n = _shallow_len(value)
        if name == "format" and text is not None:
            return self._percent_size(text, kwargs or tuple(args))
        if name == "replace" and len(args) >= 2:
            return self._check_replace(value, *args[:3])
        if name == "join":
            sep = str(_arg(args, kwargs, 0, "d", ""))
            return self._expect(self._size(value, "a joined string") + len(sep) * n, "a joined string")
        if name in ("string", "pprint", "list", "xmlattr", "urlencode") and text is None:
            size = self._size(value, f"a {name} result", indent=1 if name == "pprint" else 0)
            return size * (6 if name in ("xmlattr", "urlencode") else 1)
        if name == "tojson":
            return self._pre_tojson(value, args, kwargs)
        if name == "center":
            return self._expect(max(n, _arg(args, kwargs, 0, "width", 80)), "a centered string")
        if name == "indent" and text is not None:
            width = _arg(args, kwargs, 0, "width", 4)
            pad = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
            lines = 2 + sum(text.count(c) for c in _LINE_BREAKS)
            return self._expect(len(text) + lines * pad, "an indented string")
        if name in ("e", "escape", "forceescape") and text is not None:
            return self._expect(n + 4 * sum(text.count(c) for c in _HTML_SPECIAL), "an escaped string")
        if name == "urlencode" and text is not None:
            return self._expect(12 * n, "a URL-encoded string")    # 4 UTF-8 bytes, 3 chars each
        if name == "wordwrap" and text is not None:
            wrap = _arg(args, kwargs, 2, "wrapstring", None) or "\n"
            return self._expect(n * (1 + len(str(wrap))), "a wrapped string")
        if name == "urlize" and text is not None:
            extra = sum(len(str(v)) for v in (*args, *kwargs.values()) if isinstance(v, str))
            return self._expect(3 * n + (n // 2 + 1) * (64 + extra), "a urlized string")
        if name == "truncate" and text is not None:
            end = _arg(args, kwargs, 2, "end", "...")
            return self._expect(n + len(str(end)), "a truncated string")
        if name == "striptags" and text is not None:
            return n * (1 + text.count("<"))            # markupsafe copies the text per tag
        if name == "batch":
            return self._expect(n + abs(_arg(args, kwargs, 0, "linecount", 0) or 0), "a batched list")
        if name == "slice":
            return self._expect(n + abs(_arg(args, kwargs, 0, "slices", 0) or 0), "a sliced list")
        if name == "sum":
            # sum() of lists copies the partial sum at each step: quadratic
            size = sum(len(v) for v in value if isinstance(v, (list, tuple, str))) if n else 0
            return n + self._expect(size, "a summed list") * n // _SCAN_UNITS
        if name in ("sort", "dictsort", "unique", "groupby", "min", "max"):
            size = self._size(value, f"the input of {name}")
            return n + size * max(1, n.bit_length()) // _SCAN_UNITS
        if name in ("title", "capitalize", "upper", "lower", "wordcount", "trim", "striptags") and text is None:
            return self._size(value, f"the input of {name}")
        return n

    def _pre_tojson(self, value: Any, args, kwargs) -> int:
        indent = _arg(args, kwargs, 1, "indent", None)
        separators = _arg(args, kwargs, 2, "separators", None)
        width = len(indent) if isinstance(indent, str) else indent if isinstance(indent, int) else 0
        seps = separators if isinstance(separators, (list, tuple)) else ()
        if width > _MAX_JSON_INDENT or any(len(str(s)) > _MAX_JSON_INDENT for s in seps):
            raise ChatTemplateError(f"chat template asked tojson for an indent or separator longer than "
                                    f"{_MAX_JSON_INDENT}")
        size, seen = _measure(value, self.max_chars, indent=width + sum(len(str(s)) for s in seps))
        self._expect(size, "a JSON string")
        # the walk, and with an indent json.dumps' pure-Python encoder: a step per node each
        _step(seen * (2 if indent is not None else 1))
        return size

    def _guard_filter(self, name: str, f):
        # Filters marked pass_context/eval_context/environment get that object first, then the value.
        skip = 2 if hasattr(f, "jinja_pass_arg") else 1
        weight = _FILTER_WEIGHT.get(name, 1)

        @functools.wraps(f)
        def guarded(*args, **kwargs):
            _step()
            self._check_int_args(name, args[skip:], kwargs)
            if len(args) >= skip:
                value = args[skip - 1]
                if name in _ITERABLE_FILTERS:
                    value = self._materialize(value)
                    args = (*args[:skip - 1], value, *args[skip:])
                _scan(self._pre_filter(name, value, args[skip:], kwargs) * weight)
            return self._check_result(f(*args, **kwargs))

        return guarded

    def _guard_test(self, name: str, f):
        skip = 2 if hasattr(f, "jinja_pass_arg") else 1

        scans = name in _SCANNING_TESTS

        @functools.wraps(f)
        def guarded(*args, **kwargs):
            _scan(sum(self._operand_units(a) for a in args[skip - 1:]) if scans else 0)
            return f(*args, **kwargs)

        return guarded

    def _guard_callable(self, name: str, f):
        @functools.wraps(f)
        def guarded(*args, **kwargs):
            self._check_int_args(name, args, kwargs)
            if name == "lipsum":
                n, lo, hi = _arg(args, kwargs, 0, "n", 5), _arg(args, kwargs, 2, "min", 20), \
                    _arg(args, kwargs, 3, "max", 100)
                words = n * max(lo, hi) if all(isinstance(v, int) for v in (n, lo, hi)) else 0
                if n > 100 or words > _MAX_LIPSUM_WORDS:
                    raise ChatTemplateError(f"chat template asked lipsum() for more than 100 paragraphs or "
                                            f"{_MAX_LIPSUM_WORDS} words")
                _step(1 + words)
            elif name == "strftime_now" and args:
                self._expect(32 * len(str(args[0])), "a formatted date")    # '%c' is 2 chars -> 24
            return self._check_result(f(*args, **kwargs))

        return guarded

    def _operand_units(self, value: Any) -> int:
        if isinstance(value, str):
            return len(value)
        if isinstance(value, (list, tuple, dict, set, frozenset, Namespace)):
            # comparing containers compares their items, recursively
            size, seen = _measure(value, self.max_chars)
            self._expect(size, "an operand of a comparison")
            _step(seen)
            return size
        return _shallow_len(value)

    # -- hooks the compiled template calls ------------------------------------------------

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (Jinja's signature)
        _step()
        if getattr(__obj, "__self__", None) is __self:    # our own llambda_* guards (kwargs: Jinja's loop vars)
            return __obj(*args)
        target = getattr(__obj, "__wrapped__", __obj)   # str.format comes wrapped by the sandbox
        owner = getattr(target, "__self__", None)
        name = getattr(target, "__name__", "")
        if isinstance(owner, str):
            units = len(owner)
            if name in _PADDING_METHODS:
                __self._check_int_args(f"str.{name}", args, kwargs)
                units += max((a for a in args if isinstance(a, int)), default=0)
            elif name == "expandtabs":
                size = args[0] if args else kwargs.get("tabsize", 8)
                if isinstance(size, int) and len(owner) + owner.count("\t") * max(size, 0) > __self.max_chars:
                    raise __self._too_big("an expanded string")
            elif name == "replace" and len(args) >= 2:
                units = __self._check_replace(owner, *args[:3])
            elif name == "format":
                units = __self._brace_size(owner, args, kwargs)
            elif name == "format_map" and args and isinstance(args[0], Mapping):
                units = __self._brace_size(owner, (), args[0])
            elif name == "join" and args:
                items = __self._materialize(args[0])
                args = (items, *args[1:])
                units = __self._expect(__self._size(items, "a joined string") + len(owner) * _shallow_len(items),
                                       "a joined string")
            else:
                units += sum(_shallow_len(a) for a in args)
            _scan(units)
        elif isinstance(owner, (list, tuple, dict)):
            # list.index/count compare every item
            _scan(__self._operand_units(owner) if name in ("index", "count") else len(owner))
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
            if isinstance(left, seq_types) and isinstance(right, seq_types):
                if len(left) + len(right) > self.max_chars:
                    raise self._too_big(f"a concatenated {type(left).__name__}")
                _scan(len(left) + len(right))
        elif operator == "**":
            if isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1 and \
                    right * abs(left).bit_length() > _MAX_INT_BITS:
                raise ChatTemplateError(f"chat template built an integer of more than {_MAX_INT_BITS} bits")
        elif operator == "%" and isinstance(left, str):
            _scan(self._percent_size(left, right))
        return self._check_result(super().call_binop(context, operator, left, right))

    def llambda_iter(self, iterable: Any) -> Any:
        return _CountedIterable(iterable)

    def llambda_sized(self, value: Any) -> Any:
        return self._check_result(value)

    def llambda_part(self, value: Any) -> Any:
        if not isinstance(value, str):
            self._size(value, "a concatenated string")
        return value

    def llambda_operand(self, value: Any) -> Any:
        # the common case, a short string or a number, costs nothing
        if not (isinstance(value, str) and len(value) < _SCAN_UNITS or isinstance(value, (int, float))):
            _scan(self._operand_units(value))
        return value

    def llambda_emit(self, value: Any) -> str:
        if not isinstance(value, str):
            self._size(value, "printed text")
        text = str(value)
        budget = _BUDGET.get()
        if budget is not None:
            budget.produce(len(text))
        return text


def _drop_frames(exc: BaseException) -> None:
    """Free what a failed render built now: clear the locals of every frame in the tracebacks of
    `exc` and the exceptions chained to it, and unlink them (a frame holds its exception)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if exc.__traceback__ is not None:
            traceback.clear_frames(exc.__traceback__)
            exc.__traceback__ = None
        nxt = exc.__cause__ or exc.__context__
        exc.__cause__ = exc.__context__ = None
        exc = nxt


# --- messages ----------------------------------------------------------------------------

def _flatten_content(content: Any, where: str, image_marker: str | None = None,
                     keep_images: bool = False, as_lists: bool = False) -> str | list | None:
    """A message's content as templates get it: a string (text parts joined on newlines; an image part, where
    images are taken, as `image_marker`, the image's marker text, in its place), or with `keep_images` and an
    image among the parts, the list of parts itself ({"type": "text", "text"} and {"type": "image"}, the
    image's bytes left out) for a template that walks content lists (Gemma 3's). `as_lists`: always the list
    of parts, a string as one text part (SmolVLM's template walks lists only: a string's text was dropped)."""
    if content is None:
        return content
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if as_lists else content
    if isinstance(content, (list, tuple)):
        texts, parts, images = [], [], 0
        for j, part in enumerate(content):
            if not isinstance(part, Mapping):
                raise ChatTemplateError(f"{where}: content part {j} must be an object, got {type(part).__name__}")
            kind = part.get("type")
            if kind == "image":
                if image_marker is None:
                    raise ChatTemplateError(f"{where}: content part {j} is an image; this model takes no images")
                if not isinstance(part.get("image"), (bytes, bytearray, memoryview)):
                    raise ChatTemplateError(f"{where}: content part {j} needs the image file's bytes in 'image'")
                images += 1
                texts.append(image_marker)
                parts.append({"type": "image"})
                continue
            if kind != "text":
                raise ChatTemplateError(
                    f"{where}: content part {j} has type {kind!r}; only 'text' and 'image' parts are supported")
            text = part.get("text")
            if not isinstance(text, str):
                raise ChatTemplateError(f"{where}: content part {j} needs a string 'text'")
            texts.append(text)
            parts.append({"type": "text", "text": text})
        if (images and keep_images) or as_lists:
            return parts
        # Several text parts are one message: join them on newlines (as vLLM does).
        return "\n".join(texts)
    raise ChatTemplateError(
        f"{where}: 'content' must be a string, null or a list of text parts, got {type(content).__name__}")


def image_part(data: bytes) -> dict:
    """The canonical image part of a message's content: the image file's bytes (what Model.chat takes; each
    API's shape becomes it, server/images.py)."""
    return {"type": "image", "image": data}


def image_content(images: list[bytes], text: str) -> list[dict]:
    """A message's content of images and then its text (where Ollama and `ollama run` put them): an image
    part for each, then a text part unless the text is empty."""
    return [image_part(data) for data in images] + ([{"type": "text", "text": text}] if text else [])


def message_images(messages: Any) -> list:
    """The image parts' bytes (bytes, bytearray or memoryview, uncopied) of a message list, in the order of the messages and of their parts (the order
    a template writes their markers in); [] for anything else (validate_messages says what is wrong)."""
    out: list = []
    if not isinstance(messages, (list, tuple)):
        return out
    for msg in messages:
        content = msg.get("content") if isinstance(msg, Mapping) else None
        if isinstance(content, (list, tuple)):
            out.extend(p["image"] for p in content     # as given: a copy is load_image's, once its size is checked
                       if isinstance(p, Mapping) and p.get("type") == "image"
                       and isinstance(p.get("image"), (bytes, bytearray, memoryview)))
    return out


def reads_images(template: str) -> bool:
    """Whether a template writes image parts itself (it compares a part's type with 'image', as Gemma 3's
    does): it then gets content lists holding images; others get the begin-of-image text in the part's place."""
    return "'image'" in template or '"image"' in template


class ToolArguments(dict):
    """A call's arguments as templates get them: an object (GLM's and Qwen3-Coder's templates walk its
    items, most `tojson` it), which printed or joined to a string (`'...' + arguments`, as DeepSeek's
    templates write it) is its JSON text, as an OpenAI client sent it."""

    def __str__(self) -> str:
        return json.dumps(self, ensure_ascii=False)

    def __add__(self, other):
        return str(self) + other if isinstance(other, str) else NotImplemented

    def __radd__(self, other):
        return other + str(self) if isinstance(other, str) else NotImplemented


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
                fn["arguments"] = ToolArguments(parsed)
        elif isinstance(args, dict):
            fn["arguments"] = ToolArguments(args)
        call["function"] = fn
        out.append(call)
    return out


def validate_messages(messages: Any, image_marker: str | None = None, keep_images: bool = False,
                      as_lists: bool = False) -> list[dict]:
    """Check an OpenAI-style message list and return normalized copies.

    Each message needs a string `role` and a `content` that is a string, a list of
    {"type": "text", "text": ...} parts (joined with newlines) or, for an assistant message,
    null/absent when it carries `tool_calls`. Other keys are kept as they are. Image parts
    ({"type": "image", "image": bytes}) only with an `image_marker` (see _flatten_content; `as_lists` too).
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
        content = _flatten_content(msg.get("content"), where, image_marker, keep_images, as_lists)
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


# --- extra template variables ------------------------------------------------------------

def _render_context(extra: Mapping, bos_token: str, eos_token: str, messages: list, tools: list | None,
                    add_generation_prompt: bool) -> dict:
    """A render's variables: the token texts and `documents`, which ChatTemplate.render's own extra
    variables may replace (unchecked: a library caller's documents), then those, then the conversation."""
    context = {"bos_token": bos_token, "eos_token": eos_token, "documents": None}
    context.update(extra)
    context.update(messages=messages, tools=tools, add_generation_prompt=add_generation_prompt)
    return context


# What a caller may add to a render (`enable_thinking`, `reasoning_effort`, ...): data, bounded like a
# request body's fields. The names the renderer sets itself, and the template's functions, stay its own.
RESERVED_TEMPLATE_VARS = (frozenset(_render_context({}, "", "", [], None, True))
                          | frozenset(_ChatSandbox(DEFAULT_MAX_OUTPUT_CHARS).globals))
MAX_TEMPLATE_VARS = 32
MAX_TEMPLATE_VAR_DEPTH = 8          # nesting of one value (a list in a dict is 2)
MAX_TEMPLATE_VARS_CHARS = 64 * 1024  # all values as JSON


def check_template_kwargs(kwargs: Any) -> dict:
    """Extra chat-template variables, checked: a mapping of identifiers (not reserved names) to JSON-like
    values (None, bool, numbers, strings, lists, string-keyed dicts), bounded in count, depth and size.
    Returns a copy; raises InvalidInputError saying what is wrong."""
    if kwargs is None:
        return {}
    if not isinstance(kwargs, Mapping):
        raise InvalidInputError(f"template variables must be an object, got {type(kwargs).__name__}")
    if len(kwargs) > MAX_TEMPLATE_VARS:
        raise InvalidInputError(f"at most {MAX_TEMPLATE_VARS} template variables, got {len(kwargs)}")
    out = {}
    for name, value in kwargs.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise InvalidInputError(f"template variable names must be identifiers, got {_short(repr(name))}")
        if name in RESERVED_TEMPLATE_VARS:
            raise InvalidInputError(f"template variable {name!r} is set by the renderer itself; "
                                    f"reserved: {', '.join(sorted(RESERVED_TEMPLATE_VARS))}")
        _check_plain(value, name)
        out[name] = value
    try:
        size = len(json.dumps(out, ensure_ascii=False, allow_nan=False))
    except ValueError:        # a float NaN/inf, or an int past Python's 4300 digits: plain data, but not JSON
        raise InvalidInputError("template variables must not hold NaN, infinity or an integer too long to "
                                "write (over 4300 digits)") from None
    if size > MAX_TEMPLATE_VARS_CHARS:
        raise InvalidInputError(f"template variables are {size} characters as JSON; "
                                f"at most {MAX_TEMPLATE_VARS_CHARS}")
    return out


def _check_plain(root: Any, name: str) -> None:
    """A JSON-like value at most MAX_TEMPLATE_VAR_DEPTH deep (walked without recursion)."""
    stack = [(root, 0)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_TEMPLATE_VAR_DEPTH:
            raise InvalidInputError(f"template variable {name!r} is nested more than {MAX_TEMPLATE_VAR_DEPTH} "
                                    "levels deep")
        if value is None or isinstance(value, (bool, int, float, str)):
            continue
        if isinstance(value, (list, tuple)):
            stack.extend((v, depth + 1) for v in value)
        elif isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
            stack.extend((v, depth + 1) for v in value.values())
        else:
            raise InvalidInputError(f"template variable {name!r} holds a value of type {type(value).__name__}; values must be "
                                    "null, booleans, numbers, strings, lists or objects with string keys")


# --- the template ------------------------------------------------------------------------

_CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


# -- tools a template reads from a message ------------------------------------------------------
# Phi-4-mini's chat template writes a system turn's `message['tools']` (a JSON text of the functions,
# between `<|tool|>` and `<|/tool|>`) and never reads `tools`: offered tools passed the usual way never
# reach its prompt. Such a template is told from its source (`reads_message_tools`), as the server's
# tool_formats tells the call formats; render() then puts the tools on the system message, as the JSON
# text of their function definitions (the shape Phi-4-mini's model card gives), adding an empty system
# message first when the conversation has none.

# the names a template gives a message: `message`, and its loops' (`{% for m in messages %}`)
_MESSAGE_LOOP = re.compile(r"\bfor\s+(\w+)\s+in\s+\w*messages\b")


def reads_message_tools(template: str) -> bool:
    """Whether a chat template's source reads the tools from a message: `message['tools']`,
    `message["tools"]` or `message.tools` (not `message.tool_calls`), under any name its loops give one."""
    if not template or "tools" not in template:
        return False
    names = {"message"} | set(_MESSAGE_LOOP.findall(template))
    pattern = rf"""\b(?:{'|'.join(map(re.escape, sorted(names)))})\s*(?:\[\s*['"]tools['"]\s*\]|\.tools\b)"""
    return re.search(pattern, template) is not None


def tools_text(tools: list) -> str:
    """The offered (chat-completions) tools as the JSON text such a template expects: their functions."""
    return json.dumps([t.get("function", t) for t in tools], ensure_ascii=False)   # a bare function too


def with_message_tools(messages: list, tools: list) -> list:
    """`messages` with the tools on the first system message (a copy; the request's own `tools` there,
    if any, replaced by the offered ones), or on a new empty system message put first."""
    text = tools_text(tools)
    for i, m in enumerate(messages):
        if isinstance(m, dict) and m.get("role") == "system":
            return messages[:i] + [{**m, "tools": text}] + messages[i + 1:]
    return [{"role": "system", "content": "", "tools": text}] + list(messages)


class ChatTemplate:
    """A compiled chat template. `render(messages)` gives the prompt text (special tokens as text)."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "", name: str | None = None,
                 *, max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS, max_steps: int = DEFAULT_MAX_STEPS,
                 max_seconds: float = DEFAULT_MAX_SECONDS, max_built_bytes: int = DEFAULT_MAX_BUILT_BYTES):
        if not isinstance(source, str) or not source.strip():
            raise ChatTemplateError("chat template source must be a non-empty string")
        if len(source) > MAX_SOURCE_CHARS:
            raise ChatTemplateError(f"chat template{f' {name!r}' if name else ''} is {len(source)} characters "
                                    f"long, more than the {MAX_SOURCE_CHARS} a template may have")
        self.source = source
        self.reads_message_tools = reads_message_tools(source)
        self.reads_images = reads_images(source)
        self._drops_strings: bool | None = None     # (_lists_only: found on the first render)
        self.bos_token = bos_token or ""
        self.eos_token = eos_token or ""
        self.name = name
        self.max_output_chars = int(max_output_chars)
        self.max_steps = int(max_steps)
        self.max_seconds = float(max_seconds)
        self.max_built_bytes = int(max_built_bytes)
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
               image_marker: str | None = None, **extra) -> str:
        """The prompt text. image_marker: the begin-of-image text of a model that takes images (image
        parts are refused without one); the caller checks that the text holds one per image."""
        msgs = validate_messages(messages, image_marker, self.reads_images, self._lists_only())
        tools = _validate_tools(tools)
        if tools and self.reads_message_tools:     # Phi-4-mini: the tools go on the system message
            msgs = with_message_tools(msgs, tools)
        context = _render_context(extra, self.bos_token, self.eos_token, msgs, tools,
                                  bool(add_generation_prompt))
        return self._budgeted(context)

    def _lists_only(self) -> bool:
        """Whether the template writes a message's content only as a list of parts (SmolVLM's walks
        `message['content']` as parts: a string's text was dropped): found once, by rendering a user message
        whose string content must show in the prompt; a template that fails on it is taken to write strings."""
        if self._drops_strings is None:
            self._drops_strings = False
            if self.reads_images:
                probe = "llambda-string-content-probe"
                try:
                    text = self._budgeted(_render_context({}, self.bos_token, self.eos_token,
                                                          [{"role": "user", "content": probe}], None, False))
                except ChatTemplateError:
                    text = probe
                self._drops_strings = probe not in text
        return self._drops_strings

    def _budgeted(self, context: dict) -> str:
        """The template rendered with `context` within this template's budgets; ChatTemplateError."""
        token = _BUDGET.set(_Budget(self.max_steps, self.max_output_chars * _PRODUCED_FACTOR,
                                    self.max_built_bytes, self.max_seconds))
        try:
            return self._render(context)
        except Exception as e:
            error = self._typed_error(e)
            _drop_frames(e)
        finally:
            _BUDGET.reset(token)
        # raised outside the except block, so it carries no __context__ (the frames just dropped)
        raise error

    def _render(self, context: dict) -> str:
        # root_render_func rather than generate(): generate() rewrites a failure's traceback
        # through frames that reference each other, keeping everything alive until a GC pass
        chunks = []
        size = 0
        gen = self._template.root_render_func(self._template.new_context(context))
        try:
            for chunk in gen:
                size += len(chunk)
                if size > self.max_output_chars:
                    raise ChatTemplateError(f"rendered chat prompt exceeds {self.max_output_chars} characters")
                chunks.append(chunk)
        finally:
            gen.close()
        return "".join(chunks)

    def _typed_error(self, e: Exception) -> ChatTemplateError:
        if isinstance(e, ChatTemplateError):
            return e
        if isinstance(e, SecurityError):
            return ChatTemplateError(f"chat template{self._label()} attempted an unsafe operation: {_short(str(e))}")
        if isinstance(e, TemplateError):
            return ChatTemplateError(f"chat template{self._label()} failed: {_short(str(e))}")
        if isinstance(e, RecursionError):
            return ChatTemplateError(f"chat template{self._label()} recursed too deeply")
        if isinstance(e, MemoryError):
            return ChatTemplateError(f"chat template{self._label()} ran out of memory")
        # a template bug (TypeError, ZeroDivisionError, ...) is the template's error
        return ChatTemplateError(f"chat template{self._label()} failed: {type(e).__name__}: {_short(str(e))}")

    def __repr__(self) -> str:
        return f"ChatTemplate(name={self.name!r}, {len(self.source)} chars)"
