"""`llambda bench --spec draft|lookup`: speculative decoding against plain decoding, on code tasks.

Each task is a chat prompt to a code model, answered greedily (temperature 0), so speculative and
plain decoding must give the same text (the table says whether they did). The speed is decode
tokens/s: generated tokens over the time from the first token to the last (the prompt's prefill
is the same for both and left out). Repetitions alternate the engines so machine drift hits all.

Beside it, when llama-cpp-python is installed (--vs llama-cpp): llama.cpp on the same file, the
same prompt tokens and threads, plain and speculative, through llama-cpp-python's own
speculative loop (`Llama(draft_model=...)`): its `LlamaPromptLookupDecoding` for lookup, and for a
draft model a `LlamaDraftModel` that drafts greedily with a second `Llama` on the draft file.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

# A function of about 300 tokens to return with one change: the answer repeats the prompt.
EDIT_SOURCE = '''def summarize_orders(orders, currency="EUR", min_total=0.0):
    """Group orders by customer and return totals, counts and the largest order per customer."""
    summary = {}
    for order in orders:
        customer = order.get("customer")
        if customer is None:
            continue
        amount = float(order.get("amount", 0.0))
        if order.get("currency", currency) != currency:
            rate = order.get("rate")
            if rate is None:
                raise ValueError(f"order {order.get('id')} has no exchange rate")
            amount = amount * float(rate)
        entry = summary.setdefault(customer, {"total": 0.0, "count": 0, "largest": None})
        entry["total"] += amount
        entry["count"] += 1
        if entry["largest"] is None or amount > entry["largest"]["amount"]:
            entry["largest"] = {"id": order.get("id"), "amount": amount}
    result = []
    for customer, entry in sorted(summary.items()):
        if entry["total"] < min_total:
            continue
        average = entry["total"] / entry["count"]
        result.append({
            "customer": customer,
            "total": round(entry["total"], 2),
            "count": entry["count"],
            "average": round(average, 2),
            "largest_order": entry["largest"]["id"],
        })
    result.sort(key=lambda row: row["total"], reverse=True)
    return result
'''

TASKS = {
    "edit": ("Here is a Python function:\n\n```python\n" + EDIT_SOURCE + "```\n\n"
             "Return the whole function unchanged except for one thing: rename the parameter `min_total` "
             "to `minimum_total` everywhere. Reply with the code only."),
    "write": ("Write a Python function `parse_duration(text)` that parses strings such as '1h30m', '45s' or "
              "'2d 4h' into a number of seconds, raising ValueError on bad input, with a docstring and "
              "a few doctest examples. Reply with the code only."),
}


@dataclass
class SpecRow:
    engine: str
    mode: str              # "plain" | "draft" | "lookup"
    task: str
    samples: list[float] = field(default_factory=list)   # decode tokens/s per repetition
    tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    text: list[int] = field(default_factory=list)        # the generated ids (the last repetition)

    @property
    def median(self) -> float:
        return statistics.median(self.samples) if self.samples else float("nan")


def _timed(gen) -> tuple[list[int], float]:
    """Consume a token generator; (tokens, decode tokens/s from the first token to the last)."""
    out, first = [], None
    for tok in gen:
        if first is None:
            first = time.perf_counter()
        out.append(tok)
    end = time.perf_counter()
    rate = (len(out) - 1) / (end - first) if first is not None and len(out) > 1 and end > first else 0.0
    return out, rate


class Ours:
    name = "llambda"

    def __init__(self, path, draft_path, threads, n_ctx, draft_threads=None):
        from ..api import load
        self.model = load(path, threads=threads, n_ctx=n_ctx, draft=draft_path, draft_threads=draft_threads)

    def prompt(self, task: str) -> list[int]:
        return self.model._prompt_ids(self.model.render_chat([{"role": "user", "content": TASKS[task]}]))

    def run(self, ids, mode, n_gen, draft_max) -> tuple[list[int], float, int, int]:
        spec = None if mode == "plain" else mode
        toks, rate = _timed(self.model.generate(ids, max_tokens=n_gen, temperature=0, speculative=spec,
                                                draft_max=draft_max))
        st = self.model.spec_stats
        return toks, rate, (st.drafted if spec else 0), (st.accepted if spec else 0)


class LlamaCpp:
    name = "llama.cpp"

    def __init__(self, path, mode, draft_path, threads, n_ctx, draft_max, draft_threads=None):
        try:
            import llama_cpp
            from llama_cpp.llama_speculative import LlamaDraftModel, LlamaPromptLookupDecoding
        except ImportError:
            raise SystemExit("--vs llama-cpp needs the llama-cpp-python package: pip install '.[bench]'") from None
        kw = dict(n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, n_batch=512, verbose=False)
        self.llm = {"plain": llama_cpp.Llama(str(path), **kw)}
        # a draft model must be given at construction, and with logits_all=True: without it
        # llama-cpp-python 0.3.x sizes its logits store for one batch and fails past 512 tokens
        kw["logits_all"] = True
        if mode == "lookup":
            self.llm[mode] = llama_cpp.Llama(str(path), draft_model=LlamaPromptLookupDecoding(
                num_pred_tokens=draft_max), **kw)
        else:
            dt = draft_threads or threads
            drafter = llama_cpp.Llama(str(draft_path), **{**kw, "logits_all": False, "n_threads": dt,
                                                          "n_threads_batch": dt})

            class GreedyDraft(LlamaDraftModel):
                """Drafts k tokens greedily with the draft file (llama-cpp-python reuses its cached prefix)."""

                def __init__(self, k):
                    self.k = k

                def __call__(self, input_ids, **_):
                    import numpy as np
                    out = []
                    for tok in drafter.generate(input_ids.tolist(), temp=0.0, top_k=1, reset=True):
                        out.append(tok)
                        if len(out) >= self.k:
                            break
                    return np.asarray(out, dtype=np.intc)

            self.llm[mode] = llama_cpp.Llama(str(path), draft_model=GreedyDraft(draft_max), **kw)

    def run(self, ids, mode, n_gen, draft_max) -> tuple[list[int], float, int, int]:
        L = self.llm[mode]
        eos = L.token_eos()

        def gen():
            for i, tok in enumerate(L.generate(ids, temp=0.0, top_k=1, reset=True)):
                if tok == eos or i >= n_gen:
                    return
                yield tok
        toks, rate = _timed(gen())
        return toks, rate, 0, 0     # llama-cpp-python does not report acceptance


def run_spec_bench(path, mode: str, draft_path=None, threads: int | None = None, reps: int = 3,
                   vs_llama_cpp: bool = False, n_gen: int = 400, draft_max: int | None = None,
                   tasks=None, log=print, draft_threads: int | None = None) -> list[SpecRow]:
    from ..backends.native import default_threads
    from ..speculative import DEFAULT_DRAFT_MAX
    if mode == "draft" and draft_path is None:
        raise ValueError("--spec draft needs --model-draft")
    draft_max = draft_max or DEFAULT_DRAFT_MAX[mode]
    tasks = tasks or (["edit"] if mode == "lookup" else ["write", "edit"])
    n_ctx = 1024      # the prompt (~450 tokens) and the answer
    engines = [Ours(path, draft_path if mode == "draft" else None, threads, n_ctx, draft_threads)]
    if vs_llama_cpp:
        engines.append(LlamaCpp(path, mode, draft_path, threads or default_threads(), n_ctx, draft_max, draft_threads))
    rows: dict[tuple, SpecRow] = {}
    for task in tasks:
        ids = engines[0].prompt(task)
        for e in engines:                       # warm-up: page the weights in, record plans
            e.run(ids, "plain", 4, draft_max)
            e.run(ids, mode, 4, draft_max)
        for r in range(reps):
            order = engines if r % 2 == 0 else engines[::-1]
            for e in order:
                for m in (("plain", mode) if r % 2 == 0 else (mode, "plain")):
                    toks, rate, drafted, accepted = e.run(ids, m, n_gen, draft_max)
                    row = rows.setdefault((e.name, m, task), SpecRow(e.name, m, task))
                    row.samples.append(rate)
                    row.tokens, row.text = len(toks), toks
                    row.drafted += drafted
                    row.accepted += accepted
        log(f"  {task}: " + ", ".join(f"{k[0]} {k[1]} {v.median:.1f} t/s" for k, v in rows.items() if k[2] == task))
    return list(rows.values())


def markdown(rows: list[SpecRow], model_name: str, draft_name: str | None) -> str:
    plain = {(r.engine, r.task): r for r in rows if r.mode == "plain"}
    out = ["| model | task | engine | mode | tokens | decode t/s (median, min–max) | vs plain | acceptance | "
           "same text as plain |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        p = plain.get((r.engine, r.task))
        mode = r.mode if r.mode != "draft" else f"draft ({draft_name})"
        speedup = f"{r.median / p.median:.2f}×" if p and r.mode != "plain" and p.median > 0 else "-"
        acc = f"{100 * r.accepted / r.drafted:.0f}%" if r.drafted else "-"
        same = "-" if r.mode == "plain" or p is None else ("yes" if r.text == p.text else "no")
        out.append(f"| {model_name} | {r.task} | {r.engine} | {mode} | {r.tokens} | {r.median:.1f} "
                   f"({min(r.samples):.1f}–{max(r.samples):.1f}) | {speedup} | {acc} | {same} |")
    return "\n".join(out)
