"""PEFT's `rank_pattern` / `alpha_pattern` keys matched against module names in linear time.

PEFT reads a key as a regular expression matched at the end of a module's name after a dot (or as the
whole name): `re.match(rf"(.*\\.)?({key})$", module)`. The keys come from an adapter's
adapter_config.json, and Python's backtracking `re` takes exponential time on some of them
(`(.*)*(.*)*Z`, `(\\d+)+Z` against a long name): a hostile adapter would hang the load. So a key is
parsed by Python's own regex parser and run here as a set of NFA states over the name, one character
at a time (the sets met are cached as a small DFA): time linear in the name, whatever the key.

Whether a key matches does not depend on greedy or lazy repeats, so those run as written; what a state
set cannot run (back-references, look-arounds, atomic groups and possessive repeats, \\b, case-insensitive
matching) is refused by name, as is a key longer than MAX_KEY_CHARS or compiling to more than
MAX_PROGRAM states (a bounded repeat is unrolled).
"""
from __future__ import annotations

import re

try:
    from re import _constants as _C, _parser as _P
except ImportError:         # Python 3.10
    import sre_constants as _C      # type: ignore[no-redef]
    import sre_parse as _P          # type: ignore[no-redef]

MAX_KEY_CHARS = 1000
MAX_PROGRAM = 1000          # NFA states of one key
MAX_CACHED_STEPS = 20000    # (state set, character) -> state set entries kept per key
MAX_WORK = 2_000_000        # NFA states compiled and stepped over (a cached step, a plain key: 1) by one
                            # adapter's keys: a few seconds at most; a real adapter's keys take thousands
# a key of these characters only is matched without the NFA ('.' is still any character, as in PEFT)
_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-/:.")

_CATEGORIES = {
    _C.CATEGORY_DIGIT: str.isdecimal, _C.CATEGORY_NOT_DIGIT: lambda c: not c.isdecimal(),
    _C.CATEGORY_SPACE: str.isspace, _C.CATEGORY_NOT_SPACE: lambda c: not c.isspace(),
    _C.CATEGORY_WORD: lambda c: c.isalnum() or c == "_",
    _C.CATEGORY_NOT_WORD: lambda c: not (c.isalnum() or c == "_"),
}
_BEGIN = (_C.AT_BEGINNING, _C.AT_BEGINNING_STRING)
_END = (_C.AT_END, _C.AT_END_STRING)


class PatternError(ValueError):
    """A key this matcher does not run (the message says why)."""


class Budget:
    """The work all the keys of one adapter may do (MAX_WORK), PatternError past it."""

    def __init__(self, limit: int = MAX_WORK):
        self.left = limit

    def spend(self, n: int) -> None:
        self.left -= n
        if self.left < 0:
            raise PatternError("cost too much to match against the module names (a pattern of too many "
                               "states, or too many patterns)")


class _Compiler:
    """A parsed key -> a program: ["char", test], ["split", a, b], ["jmp", a], ["bol"], ["eol"], ["match"];
    a state without a target goes on to the next one."""

    def __init__(self):
        self.prog: list[list] = []

    def add(self, *ins) -> int:
        if len(self.prog) >= MAX_PROGRAM:
            raise PatternError(f"compiles to more than {MAX_PROGRAM} states (a repeat too large?)")
        self.prog.append(list(ins))
        return len(self.prog) - 1

    def seq(self, items) -> None:
        for op, av in items:
            self.node(op, av)

    def node(self, op, av) -> None:
        if op is _C.LITERAL:
            self.add("char", lambda c, v=chr(av): c == v)
        elif op is _C.NOT_LITERAL:
            self.add("char", lambda c, v=chr(av): c != v)
        elif op is _C.ANY:
            self.add("char", lambda c: c != "\n")
        elif op is _C.IN:
            self.add("char", _char_class(av))
        elif op is _C.BRANCH:
            alts, jumps = av[1], []
            for i, alt in enumerate(alts):
                split = self.add("split", len(self.prog) + 1, None) if i < len(alts) - 1 else None
                self.seq(alt)
                if split is not None:
                    jumps.append(self.add("jmp", None))
                    self.prog[split][2] = len(self.prog)
            for j in jumps:
                self.prog[j][1] = len(self.prog)
        elif op is _C.SUBPATTERN:
            _group, add_flags, del_flags, sub = av
            if (add_flags | del_flags) & re.IGNORECASE:
                raise PatternError("case-insensitive matching is not supported")
            self.seq(sub)
        elif op in (_C.MAX_REPEAT, _C.MIN_REPEAT):
            lo, hi, sub = av
            for _ in range(lo):
                self.seq(sub)
            if hi == _C.MAXREPEAT:
                loop = self.add("split", len(self.prog) + 1, None)
                self.seq(sub)
                self.add("jmp", loop)
                self.prog[loop][2] = len(self.prog)
            else:
                for _ in range(hi - lo):
                    split = self.add("split", len(self.prog) + 1, None)
                    self.seq(sub)
                    self.prog[split][2] = len(self.prog)
        elif op is _C.AT and av in _BEGIN:
            self.add("bol")
        elif op is _C.AT and av in _END:
            self.add("eol")
        else:
            what = {"GROUPREF": "back-references", "GROUPREF_EXISTS": "conditional groups",
                    "ASSERT": "look-arounds", "ASSERT_NOT": "look-arounds", "ATOMIC_GROUP": "atomic groups",
                    "POSSESSIVE_REPEAT": "possessive repeats", "AT": "word boundaries"}.get(str(op), str(op))
            raise PatternError(f"{what} are not supported")


def _char_class(items):
    negate, tests = False, []
    for op, av in items:
        if op is _C.NEGATE:
            negate = True
        elif op is _C.LITERAL:
            tests.append(lambda c, v=chr(av): c == v)
        elif op is _C.RANGE:
            tests.append(lambda c, lo=av[0], hi=av[1]: lo <= ord(c) <= hi)
        elif op is _C.CATEGORY and av in _CATEGORIES:
            tests.append(_CATEGORIES[av])
        else:
            raise PatternError(f"{op} in a character class is not supported")
    return lambda c: any(t(c) for t in tests) != negate


class KeyMatcher:
    """One key; `matches(name)`: PEFT's `re.match(rf"(.*\\.)?({key})$", name)`, in linear time."""

    def __init__(self, key: str):
        if not isinstance(key, str):
            raise PatternError("is not a string")
        if len(key) > MAX_KEY_CHARS:
            raise PatternError(f"is longer than {MAX_KEY_CHARS} characters")
        self.plain = key if key and _PLAIN.issuperset(key) else None
        if self.plain is not None:
            return
        try:
            parsed = _P.parse(key)
        except re.error as e:
            raise PatternError(f"is not a valid regular expression ({e})") from None
        except RecursionError:
            raise PatternError("nests too deeply") from None
        if parsed.state.flags & re.IGNORECASE:
            raise PatternError("case-insensitive matching is not supported")
        c = _Compiler()
        try:
            c.seq(parsed)
        except RecursionError:
            raise PatternError("nests too deeply") from None
        c.add("match")
        self.prog = c.prog
        self._steps: dict[tuple[frozenset, str], frozenset] = {}
        self._first = self._closure((0,), begin=True, end=False)
        self._start = self._closure((0,), begin=False, end=False)

    def _closure(self, pcs, begin: bool, end: bool) -> frozenset:
        """The states reachable from `pcs` without reading a character: characters to read, the match,
        and `$`s waiting for the end."""
        out, stack, seen = set(), list(pcs), set()
        while stack:
            pc = stack.pop()
            if pc in seen:
                continue
            seen.add(pc)
            ins = self.prog[pc]
            kind = ins[0]
            if kind == "split":
                stack += (ins[1], ins[2])
            elif kind == "jmp":
                stack.append(ins[1])
            elif kind == "bol":
                if begin:
                    stack.append(pc + 1)
            elif kind == "eol":
                if end:
                    stack.append(pc + 1)
                else:
                    out.add(pc)
            else:
                out.add(pc)
        return frozenset(out)

    def _step(self, states: frozenset, ch: str) -> frozenset:
        moved = [pc + 1 for pc in states if self.prog[pc][0] == "char" and self.prog[pc][1](ch)]
        nxt = self._closure(moved, begin=False, end=False)
        return nxt | self._start if ch == "." else nxt     # `(.*\.)?`: the key may start after any dot

    @property
    def cost(self) -> int:
        """The work compiling the key took (Budget's units)."""
        return 1 if self.plain is not None else 100 + 2 * len(self.prog)

    def matches(self, name: str, budget: Budget | None = None) -> bool:
        budget = budget or Budget()
        if self.plain is not None:      # the key's characters stand for themselves, '.' for any one
            budget.spend(1)
            start = len(name) - len(self.plain)
            if start < 0 or (start > 0 and name[start - 1] != "."):
                return False
            tail = name[start:]
            return tail == self.plain or all(k == "." or k == c for k, c in zip(self.plain, tail))
        if not name:
            return len(self.prog) - 1 in self._closure((0,), begin=True, end=True)
        states, steps, work = self._first, self._steps, 0
        for ch in name:
            nxt = steps.get((states, ch))
            if nxt is None:
                nxt = self._step(states, ch)
                work += len(states) + len(nxt)
                if len(steps) < MAX_CACHED_STEPS:
                    steps[(states, ch)] = nxt
            states = nxt
        budget.spend(work + len(name))
        return len(self.prog) - 1 in self._closure(states, begin=False, end=True)
