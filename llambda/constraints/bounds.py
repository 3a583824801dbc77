"""Bounds on compiling a grammar, so that a hostile one is refused instead of crashing the process
or holding a core (and the GIL) for minutes.

Two costs that llguidance's own limits do not cover:
- its compiler recurses once per level of rule nesting (a chain of $refs, a rule referring to the
  next): ~2-10 kB of native stack a level, so ~1000 nested $refs (80 kB of schema) overflow a
  thread's usual 8 MB stack and kill the process. Compiling runs on a thread of its own with a
  stack of DEEP_STACK_BYTES, where the deepest grammar llguidance accepts (its "schema too large"
  limit, fewer than 65k symbols: ~200 MB at most) still fits.
- its GBNF-to-Lark conversion is Python (holding the GIL) and marks which rules are terminals by
  a fixed point that may take one pass over the grammar per rule: a chain of 2500 rules (50 kB)
  takes ~30 s. Its worst case is rules x characters, held under MAX_GBNF_WORK (~1-2 s).
"""
from __future__ import annotations

import threading

DEEP_STACK_BYTES = 512 * 2**20     # address space reserved; only the pages a deep grammar touches are used
MAX_GRAMMAR_CHARS = 2**20          # a GBNF or Lark grammar (that of 128 tools' schemas), or a regex
MAX_GBNF_WORK = 20_000_000         # rules x characters of a GBNF grammar (e.g. 400 rules in 50 kB)

_stack_lock = threading.Lock()     # threading.stack_size is process-wide: set it only around one start


def check_source(kind: str, source: str, what: str) -> str | None:
    """Why this grammar text is too big to compile, or None."""
    if kind == "json_schema":
        return None                # llguidance refuses a schema too large for it, quickly
    if len(source) > MAX_GRAMMAR_CHARS:
        return f"the {what} has {len(source)} characters; at most {MAX_GRAMMAR_CHARS}"
    if kind == "grammar" and not _is_lark(source):
        rules = source.count("::=")
        if rules * len(source) > MAX_GBNF_WORK:
            return (f"the GBNF grammar is too large to convert: {rules} rules in {len(source)} characters "
                    f"(rules x characters at most {MAX_GBNF_WORK}); a Lark grammar needs no conversion")
    return None


def _is_lark(source: str) -> bool:
    from llguidance.gbnf_to_lark import is_lark_syntax     # the test grammar_from uses to tell them apart
    return is_lark_syntax(source)


def on_deep_stack(fn, *args):
    """fn(*args) on a new thread with a DEEP_STACK_BYTES stack; its result, or its exception raised here."""
    out: dict = {}

    def run():
        try:
            out["value"] = fn(*args)
        except BaseException as e:      # handed to the caller's thread, which decides
            out["error"] = e

    with _stack_lock:
        old = threading.stack_size(DEEP_STACK_BYTES)
        try:
            t = threading.Thread(target=run, name="llambda-grammar-compile", daemon=True)
            t.start()
        finally:
            threading.stack_size(old)
    t.join()
    if "error" in out:
        raise out["error"]
    return out["value"]
