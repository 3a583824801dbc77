"""Bounds on compiling and following a grammar, so that a hostile one is refused instead of crashing
the process, holding a core (and the GIL) for minutes or slowing every other stream.

Three costs that llguidance's own limits do not cover:
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

Following a grammar costs a token mask wherever sampling needs one, and the server computes the
masks on its scheduler thread between forward passes, where every stream waits for them. Three bounds:
- one mask, within llguidance: at most MASK_MAX_ITEMS Earley items and MASK_LEXER_FUEL of lexer work
  (its LLParserLimits, checked as it computes, so such a mask stops early); a grammar past them is
  refused (limit_error names the limit);
- one mask: at most MAX_MASK_CPU_SECONDS of CPU, or its sequence fails (check_mask_cost): what the
  limits above do not count (a literal being matched) is measured after the mask, not stopped;
- one step: the grammars' CPU (masks and advancing over tokens) of every constrained request
  together at most step_budget(): the larger of MAX_STEP_MASK_CPU_SECONDS and
  MASK_CPU_PER_SEQUENCE for each sequence whose grammar is in force in the step, so that n sequences
  (a request's n choices, or n requests) each just under the bound above do not stall the others n
  times as long, while many ordinary grammars (a busy server at a high --parallel) always fit.
  StepMasks keeps the account: once the step's CPU is past its budget no more masks are computed in
  it (the sequences left keep their logits and are sampled first in the next step, their tokens
  unchanged; a speculating one stops verifying its drafts), so a step exceeds the budget by one mask
  at most. A request is charged for all its sequences' CPU in the step (and, with speculation, for
  every verified row's); past the budget the dearest requests are refused (to_refuse), dearest
  first, until the rest fits: each gets a 400 in its own stream (step_budget_exceeded), the others
  go on unchanged. Holding back ends: a step that holds a sequence refuses a request, or what
  spent its budget has ended. Whether a request is refused depends on what shares its
  steps (a shared budget); its tokens never do.

The masks are computed on the scheduler thread, after the forward pass, only where sampling needs
one (the token drawn unmasked first is mostly allowed: one mask in ~6 tokens of a JSON schema). GPU
servers compute them while the GPU runs the forward; here the forward itself runs on the CPU, a pool
thread per physical core, which a mask thread beside it would compete with (not measured), and it
would compute every mask, the ~5 in 6 never needed too. (The results would not change: a mask
depends only on its own sequence's tokens. But a matcher must then be left alone meanwhile: one
called from two threads at once raises "Already borrowed".)
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
# CPU the masks of one scheduler step may take together: two masks at the cap above, or 20 of the
# dearest ordinary grammar's. A step of a 0.5B model (~25 ms) is then at most ~5x slower whatever
# the number of constrained sequences, where n sequences each at the cap above made it (1 + 2n)x.
MAX_STEP_MASK_CPU_SECONDS = 0.100
# ... or, with more constrained sequences in the step, this much each: twice the dearest ordinary
# grammar's mask, so a full server of ordinary grammars is never refused, and sequences at the cap
# above (5x this) still are.
MASK_CPU_PER_SEQUENCE = 0.010
# llguidance's own limits on one mask (LLParserLimits.step_max_items and step_lexer_fuel), its defaults
# made ours: by its documented speeds (~20k items/ms, ~14k fuel/ms) ~2.5 ms and ~14 ms, both under
# MAX_MASK_CPU_SECONDS. They stop a mask while it is computed; the CPU caps above can only follow one.
MASK_MAX_ITEMS = 50_000
MASK_LEXER_FUEL = 200_000
# how llguidance's errors say one of them was hit, and which
_LIMIT_ERRORS = (("Too many items", "step_max_items", "MASK_MAX_ITEMS"),
                 ("too many expressions constructed", "step_lexer_fuel", "MASK_LEXER_FUEL"))

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


def parser_limits(llg):
    """llguidance's LLParserLimits with our bounds on one mask (errors name no parser state)."""
    return llg.LLParserLimits(step_max_items=MASK_MAX_ITEMS, step_lexer_fuel=MASK_LEXER_FUEL, verbose_errors=False)


def limit_error(message: str) -> str | None:
    """Why the grammar stops, where llguidance's `message` says a limit on one mask was hit; else None."""
    for mark, option, name in _LIMIT_ERRORS:
        if mark in message:
            return (f"the grammar is too costly to follow: a token's mask needs more than llguidance's "
                    f"{option} limit ({globals()[name]}) allows")
    return None


def cpu_now() -> float:
    """This thread's CPU time: what a mask costs, whatever else the machine runs meanwhile."""
    return time.thread_time()


def step_budget(sequences: int) -> float:
    """CPU the masks of a step with this many constrained sequences may take together."""
    return max(MAX_STEP_MASK_CPU_SECONDS, MASK_CPU_PER_SEQUENCE * sequences)


def to_refuse(costs: dict, sequences: int = 0) -> list:
    """The keys of `costs` (request -> the CPU its masks took in one step) to refuse so that the
    rest fit step_budget(sequences): the dearest first (ties in the dict's order); [] when all fit."""
    total, budget = sum(costs.values()), step_budget(sequences)
    refused = []
    for key, seconds in sorted(costs.items(), key=lambda kv: -kv[1]):
        if total <= budget:
            break
        refused.append(key)
        total -= seconds
    return refused


class StepMasks:
    """One scheduler step's account of grammar CPU: the budget, what was spent, who was charged."""

    def __init__(self, sequences: int):
        self.sequences = sequences          # sequences whose grammar is in force: the budget grows with them
        self.budget = step_budget(sequences)
        self.spent = 0.0                    # every sequence's, those that ended or failed in the step too
        self.charged: dict = {}             # request -> the CPU of its sequences still running
        self.sampled = 0                    # constrained sequences sampled in the step

    def past(self, pending: float = 0.0) -> bool:
        """The budget is spent (with `pending` CPU not yet added): compute no more masks this step."""
        return self.spent + pending > self.budget

    def hold(self) -> bool:
        """Hold the next constrained sequence back to the next step: the budget is spent, and one was
        sampled already (each step moves one on, or a budget spent by nothing would hold them all)."""
        return self.sampled > 0 and self.past()

    def add(self, seconds: float, request=None) -> None:
        self.sampled += 1
        self.spent += seconds
        if request is not None:
            self.charged[request] = self.charged.get(request, 0.0) + seconds

    def to_refuse(self) -> list:
        return to_refuse(self.charged, self.sequences)


def step_budget_exceeded(seconds: float, total: float, sequences: int = 0) -> str:
    """Why a request whose masks took `seconds` of a step's `total` is refused."""
    return (f"the grammar is too costly to follow: this request's token masks took {seconds * 1e3:.0f} ms of "
            f"CPU in one step, the server's constrained requests together {total * 1e3:.0f} ms (at most "
            f"{step_budget(sequences) * 1e3:.0f} ms a step: the dearest requests are refused); fewer "
            "choices (n), or a grammar without literals tens of kB long, costs less")
