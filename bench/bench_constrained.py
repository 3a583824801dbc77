"""What constrained decoding costs: decode throughput and time to first token with and without a
realistic 10-field JSON schema, at 1 and 8 concurrent streams, against a live `llambda serve`.

Both kinds of request go to the same server (SmolLM2 by default), greedy, on /v1/completions:
constrained ones carry llama-server's `json_schema` extension and end where the JSON is complete;
free ones ignore EOS and generate, for the same prompt, as many tokens as its constrained answer
(greedy: measured once in a warm-up), so both rounds do the same work with the same lengths (the
last, longest sequences of a round run in small batches: unequal lengths alone would cost). Rounds alternate (free,
constrained, free, ...) and every repeat passes over all levels: drift on a shared machine hits
both alike. Reported: medians of aggregate generated tokens/s and of time to first token, and,
less at the mercy of other processes on a loaded machine, the server's CPU time per generated
token and its step time outside the forward pass (sampling, grammar, bookkeeping) per token.
Targets (issue 15): at most 10% of throughput, at most 50 ms more TTFT. Not a test: run it by hand.

    python bench/bench_constrained.py                 # --repeat 5 -r 3 for steadier medians
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_server import (ROOT, Engine, add_common_args, free_port, llambda_serve_cmd, logged_round,  # noqa: E402
                          model_id, one_request, resolve_common_args, run_round)

# a customer record as an application would ask for one: strings, bounded numbers, an enum, a
# boolean, a date pattern, an array
SCHEMA = {
    "type": "object", "additionalProperties": False,
    "required": ["id", "name", "email", "age", "city", "country", "member", "score", "joined", "interests"],
    "properties": {
        "id": {"type": "integer", "minimum": 1, "maximum": 999999},
        "name": {"type": "string", "minLength": 2, "maxLength": 32},
        "email": {"type": "string", "pattern": "^[a-z0-9._]{1,20}@[a-z0-9]{1,15}\\.(com|org|net)$"},
        "age": {"type": "integer", "minimum": 18, "maximum": 99},
        "city": {"type": "string", "maxLength": 24},
        "country": {"enum": ["France", "Germany", "Italy", "Spain", "United Kingdom", "United States", "Japan"]},
        "member": {"type": "boolean"},
        "score": {"type": "number", "minimum": 0, "maximum": 100},
        "joined": {"type": "string", "pattern": "^20[0-2][0-9]-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])$"},
        "interests": {"type": "array", "items": {"type": "string", "maxLength": 16}, "minItems": 1, "maxItems": 3},
    },
}
PEOPLE = ["a baker from Lyon", "a retired pilot", "a young violinist", "a nurse in Osaka", "a chess champion",
          "a farmer in Texas", "a software engineer", "a marine biologist", "a librarian in Rome", "a taxi driver"]


def _prompt(k: int) -> str:
    return f"Customer record (JSON) for {PEOPLE[k % len(PEOPLE)]}:\n"


def server_counters(server: Engine) -> dict:
    """CPU seconds of the server process, and its step counters from /metrics."""
    with open(f"/proc/{server.proc.pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    out = {"cpu": (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")}
    for line in httpx.get(server.url + "/metrics", timeout=30).text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("llambda_forward_seconds_total", "llambda_step_seconds_total", "llambda_generated_tokens_total"):
            out[name.split("_")[1]] = float(value)
    return out


def measured_round(server: Engine, *args) -> dict:
    """logged_round plus the server's CPU ms and outside-forward step us per generated token."""
    before = server_counters(server)
    row = logged_round(*args)
    after = server_counters(server)
    n = max(1.0, after["generated"] - before["generated"])
    row["cpu_ms_per_token"] = 1000 * (after["cpu"] - before["cpu"]) / n
    row["overhead_us_per_token"] = 1e6 * ((after["step"] - before["step"]) - (after["forward"] - before["forward"])) / n
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_args(ap, "1,8")
    ap.add_argument("--max-tokens", type=int, default=400, help="cap of a constrained answer (default 400)")
    a = ap.parse_args(argv)
    threads, levels = resolve_common_args(a)
    port = free_port()
    cmd = llambda_serve_cmd(a, port, threads)
    server = Engine("server", cmd, port, env={"PYTHONPATH": str(ROOT)})
    print(f"== {' '.join(cmd)}", file=sys.stderr)
    server.start()
    load0 = os.getloadavg()[0]
    rows = []
    try:
        mid = model_id(server)
        constrained = Engine("json_schema", [], port, extra_body={"json_schema": SCHEMA})
        one_request(constrained, mid, "Hello", 8)      # warm-up (and the grammar machinery built)
        warm = run_round(constrained, mid, 1, len(PEOPLE), a.max_tokens, _prompt)
        if warm["errors"]:
            raise RuntimeError(warm["errors"][0])
        lengths = warm["lengths"]           # one request per prompt, in order (one stream)
        print(f"   constrained answers: {min(lengths)}-{max(lengths)} tokens; free requests generate as many",
              file=sys.stderr)
        free = Engine("free", [], port, extra_body={"ignore_eos": True})

        def free_cap(k: int) -> int:
            return lengths[k % len(PEOPLE)]

        for rep in range(a.repeat):
            for c in levels:
                for eng, cap in ((free, free_cap), (constrained, a.max_tokens)) if rep % 2 == 0 else \
                        ((constrained, a.max_tokens), (free, free_cap)):
                    rows.append(measured_round(server, rep, eng, mid, c, a.requests_per_stream, cap, _prompt))
    finally:
        server.stop()

    def med(kind, c, key):
        return statistics.median(r[key] for r in rows if r["engine"] == kind and r["streams"] == c)

    print(f"\n{Path(a.model).name}, {threads} threads, {a.parallel} slots, {min(lengths)}-{max(lengths)} tokens per "
          f"request (as the constrained answer), {a.requests_per_stream} requests per stream, "
          f"median of {a.repeat} passes; wall-clock tok/s and TTFT; load average {load0:.1f} at the start, "
          f"{os.getloadavg()[0]:.1f} at the end\n")
    print("| streams | free tok/s | json_schema tok/s | cost | free TTFT ms | json_schema TTFT ms | TTFT growth ms "
          "| CPU ms/token free, json | cost in CPU | outside-forward us/token free, json |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for c in levels:
        f, j = med("free", c, "tok_s"), med("json_schema", c, "tok_s")
        tf, tj = med("free", c, "ttft_ms"), med("json_schema", c, "ttft_ms")
        cf_, cj = med("free", c, "cpu_ms_per_token"), med("json_schema", c, "cpu_ms_per_token")
        of, oj = med("free", c, "overhead_us_per_token"), med("json_schema", c, "overhead_us_per_token")
        print(f"| {c} | {f:.1f} | {j:.1f} | {100 * (1 - j / f):+.1f}% | {tf:.0f} | {tj:.0f} | {tj - tf:+.0f} "
              f"| {cf_:.2f}, {cj:.2f} | {100 * (cj / cf_ - 1):+.1f}% | {of:.0f}, {oj:.0f} |")
    # rounds minutes apart see different loads: the cost within each pass (free and constrained back to back)
    print()
    for c in levels:
        costs = [100 * (1 - rj["tok_s"] / rf["tok_s"]) for rf in rows for rj in rows
                 if rf["rep"] == rj["rep"] and rf["streams"] == rj["streams"] == c
                 and rf["engine"] == "free" and rj["engine"] == "json_schema" and rf["tok_s"] > 0]
        # the scheduler thread is the critical path: what the grammar adds to its step time, per token,
        # over the wall time per token of the free round of the same pass (both stretch alike under load)
        added = [100 * (rj["overhead_us_per_token"] - rf["overhead_us_per_token"]) / (1e6 * rf["wall_s"] / rf["tokens"])
                 for rf in rows for rj in rows if rf["rep"] == rj["rep"] and rf["streams"] == rj["streams"] == c
                 and rf["engine"] == "free" and rj["engine"] == "json_schema" and rf["tokens"] > 0]
        print(f"{c} streams: throughput cost within each pass: median {statistics.median(costs):+.1f}% "
              f"({', '.join(f'{x:+.1f}' for x in costs)}); the grammar's share of the step time: median "
              f"{statistics.median(added):+.1f}% ({', '.join(f'{x:+.1f}' for x in added)})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
