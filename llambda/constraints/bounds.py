"""Bounds on compiling and following a grammar, so that a hostile one is refused instead of crashing
the process, holding a core (and the GIL) for minutes or slowing every other stream.

Two costs that llguidance's own limits do not cover:
- its compiler recurses once per level of rule nesting (a chain of $refs, a rule referring to the
  next): ~2-10 kB of native stack a level, so ~1000 nested $refs (80 kB of schema) overflow a
  thread's usual 8 MB stack and kill the process. Compiling runs on a thread of its own with a
  stack of DEEP_STACK_BYTES, where the deepest grammar llguidance accepts (its "schema too large"
  limit, fewer than 65k symbols: ~200 MB at most) still fits.
- its GBNF-to-Lark conversion is Python (holding the GIL) and marks which rules are terminals by
  a fixed point that may take one pass over the grammar per rule: a chain of 2500 rules (50 kB)
  takes ~30 s. Its worst case is rules x characters, held under MAX_GBNF_WORK (~1-2 s).
- a Lark grammar of 95k alternatives (1 MB) takes 13 s to compile (without the GIL, but a core
  and a prompt worker); MAX_GRAMMAR_CHARS keeps that near a second.
"""
from __future__ import annotations

import threading
import time

DEEP_STACK_BYTES = 512 * 2**20     # address space reserved; only the pages a deep grammar touches are used
FALLBACK_STACK_BYTES = 64 * 2**20  # where that much address space is not to be had
MAX_GRAMMAR_CHARS = 256 * 2**10    # a grammar or regex given as text (llguidance's compile grows faster than it)
MAX_GBNF_CHARS = 64 * 2**10        # GBNF, converted in Python at ~10 us a character
MAX_GBNF_WORK = 20_000_000         # rules x characters of a GBNF grammar (e.g. 400 rules in 50 kB)
# CPU a token's mask may take. The server computes the masks on its scheduler, between forward
# passes, so every stream waits for them: they take 0.05-5 ms, but llguidance's cost grows with
# the literal being matched (~0.4 us a character: a 200 kB const, 160 ms a token, made every
# other stream 13x slower) and its own fuel limits do not count it. 50 ms: 10x the dearest ordinary
# grammar measured (a 3 GHz Zen 2), so a slower CPU does not refuse one mid-answer, and a hostile
# grammar at most ~3x slows the others (a 0.5B step is ~25 ms) instead of 13x.
MAX_MASK_CPU_SECONDS = 0.050

_stack_lock = threading.Lock()     # threading.stack_size is process-wide: set it only around one start


def check_source(kind: str, source: str, what: str) -> str | None:
    """Why this grammar text is too big to compile, or None. JSON schemas and "lark" grammars (those
    llambda builds from tools' schemas) are left to llguidance's limits, which refuse them quickly."""
    if kind not in ("grammar", "regex"):
        return None
    if len(source) > MAX_GRAMMAR_CHARS:
        return f"the {what} has {len(source)} characters; at most {MAX_GRAMMAR_CHARS}"
    if kind == "grammar" and not _is_lark(source):
        rules = source.count("::=")
        if len(source) > MAX_GBNF_CHARS or rules * len(source) > MAX_GBNF_WORK:
            return (f"the GBNF grammar is too large to convert: {rules} rules in {len(source)} characters "
                    f"(at most {MAX_GBNF_CHARS} characters, and rules x characters at most {MAX_GBNF_WORK}); "
                    "a Lark grammar needs no conversion")
    return None


def _is_lark(source: str) -> bool:
    from llguidance.gbnf_to_lark import is_lark_syntax     # the test grammar_from uses to tell them apart
    return is_lark_syntax(source)


def on_deep_stack(fn, *args):
    """fn(*args) on a new thread with a DEEP_STACK_BYTES stack; its result, or its exception raised here.

    Where the address space is limited (ulimit -v) and no such thread can start, a smaller stack,
    then the caller's own: compiling still works, only the deepest grammars are at risk again."""
    out: dict = {}

    def run():
        try:
            out["value"] = fn(*args)
        except BaseException as e:      # handed to the caller's thread, which decides
            out["error"] = e

    t = None
    for size in (DEEP_STACK_BYTES, FALLBACK_STACK_BYTES):
        with _stack_lock:
            old = threading.stack_size(size)
            try:
                t = threading.Thread(target=run, name="llambda-grammar-compile", daemon=True)
                t.start()
                break
            except (RuntimeError, MemoryError):     # "can't start new thread": no room for the stack
                t = None
            finally:
                threading.stack_size(old)
    if t is None:
        return fn(*args)
    t.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


def check_mask_cost(seconds: float) -> str | None:
    """Why a mask that took `seconds` of CPU is too costly to go on with, or None."""
    if seconds <= MAX_MASK_CPU_SECONDS:
        return None
    return (f"the grammar is too costly to follow: a token's mask took {seconds * 1e3:.0f} ms of CPU (at most "
            f"{MAX_MASK_CPU_SECONDS * 1e3:.0f} ms); a literal tens of kB long (a const or enum value, a string "
            "in the grammar) or nesting thousands of levels deep is the usual cause")


def cpu_now() -> float:
    """This thread's CPU time: what a mask costs, whatever else the machine runs meanwhile."""
    return time.thread_time()
