"""What constrained decoding costs: decode throughput and time to first token with and without a
realistic 10-field JSON schema, at 1 and 8 concurrent streams, against a live `llambda serve`.

Both kinds of request go to the same server (SmolLM2 by default), greedy, on /v1/completions:
constrained ones carry llama-server's `json_schema` extension and end where the JSON is complete;
free ones ignore EOS and generate as many tokens as the constrained answers took (the median,
measured in a warm-up), so both rounds do the same amount of work. Rounds alternate (free,
constrained, free, ...) and every repeat passes over all levels: drift on a shared machine hits
both alike. Reported: medians of aggregate generated tokens/s and of time to first token. Targets
(issue 15): at most 10% of throughput, at most 50 ms more TTFT. Not a test: run it by hand.

    python bench/bench_constrained.py                 # --repeat 5 -r 3 for steadier medians
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_server import ROOT, Engine, _physical_cores, free_port, model_id, one_request  # noqa: E402

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


def run_round(engine: Engine, model: str, streams: int, per_stream: int, max_tokens: int) -> dict:
    results, errors, lock = [], [], threading.Lock()

    def client(k: int) -> None:
        for r in range(per_stream):
            try:
                res = one_request(engine, model, _prompt(k * per_stream + r), max_tokens)
            except Exception as e:   # report, do not hide
                with lock:
                    errors.append(str(e))
                return
            with lock:
                results.append(res)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(streams)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    tokens = sum(r[0] for r in results)
    return {"kind": engine.name, "streams": streams, "requests": len(results), "errors": errors, "tokens": tokens,
            "wall_s": wall, "tok_s": tokens / wall if wall > 0 else 0.0,
            "ttft_ms": 1000 * statistics.median(r[1] for r in results) if results else float("nan"),
            "lengths": [r[0] for r in results]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", default=None, help="GGUF file (default: the catalogued smollm2-135m)")
    ap.add_argument("--streams", default="1,8", help="concurrency levels (default 1,8)")
    ap.add_argument("--parallel", type=int, default=8, help="server slots (default 8)")
    ap.add_argument("-r", "--requests-per-stream", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3, help="passes over the levels (median reported)")
    ap.add_argument("-c", "--ctx-size", type=int, default=1024, help="context per slot")
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("--max-tokens", type=int, default=400, help="cap of a constrained answer (default 400)")
    ap.add_argument("--llambda-args", default="", help="extra arguments for `llambda serve`")
    ap.add_argument("--json", default=None, help="write the rows here")
    a = ap.parse_args(argv)

    sys.path.insert(0, str(ROOT))
    if a.model is None:
        from llambda.hub import ensure_model
        a.model = str(ensure_model("smollm2-135m"))
    threads = a.threads or _physical_cores()
    levels = [int(s) for s in a.streams.split(",")]
    port = free_port()
    cmd = [sys.executable, "-m", "llambda.cli", "serve", "-m", a.model, "--port", str(port), "--parallel",
           str(a.parallel), "-c", str(a.ctx_size), "-t", str(threads), "--log-level", "warning",
           *a.llambda_args.split()]
    server = Engine("server", cmd, port, env={"PYTHONPATH": str(ROOT)})
    print(f"== {' '.join(cmd)}", file=sys.stderr)
    server.start()
    rows = []
    try:
        mid = model_id(server)
        constrained = Engine("json_schema", [], port, extra_body={"json_schema": SCHEMA})
        one_request(constrained, mid, "Hello", 8)      # warm-up (and the grammar machinery built)
        warm = run_round(constrained, mid, 1, len(PEOPLE), a.max_tokens)
        if warm["errors"]:
            raise RuntimeError(warm["errors"][0])
        n = int(statistics.median(warm["lengths"]))
        print(f"   constrained answers: {min(warm['lengths'])}-{max(warm['lengths'])} tokens, median {n}; "
              f"free requests generate {n}", file=sys.stderr)
        free = Engine("free", [], port, extra_body={"ignore_eos": True})
        for rep in range(a.repeat):
            for c in levels:
                for eng, cap in ((free, n), (constrained, a.max_tokens)) if rep % 2 == 0 else \
                        ((constrained, a.max_tokens), (free, n)):
                    row = run_round(eng, mid, c, a.requests_per_stream, cap)
                    row["rep"] = rep
                    rows.append(row)
                    print(f"   {eng.name} {c} streams (rep {rep}): {row['tok_s']:.1f} tok/s, TTFT "
                          f"{row['ttft_ms']:.0f} ms, {row['requests']} requests, {len(row['errors'])} errors",
                          file=sys.stderr)
    finally:
        server.stop()

    def med(kind, c, key):
        return statistics.median(r[key] for r in rows if r["kind"] == kind and r["streams"] == c)

    print(f"\n{Path(a.model).name}, {threads} threads, {a.parallel} slots, {n} tokens per request "
          f"(the median constrained answer), {a.requests_per_stream} requests per stream, "
          f"median of {a.repeat} passes\n")
    print("| streams | free tok/s | json_schema tok/s | cost | free TTFT ms | json_schema TTFT ms | TTFT growth ms |")
    print("|---|---|---|---|---|---|---|")
    for c in levels:
        f, j = med("free", c, "tok_s"), med("json_schema", c, "tok_s")
        tf, tj = med("free", c, "ttft_ms"), med("json_schema", c, "ttft_ms")
        print(f"| {c} | {f:.1f} | {j:.1f} | {100 * (1 - j / f):+.1f}% | {tf:.0f} | {tj:.0f} | {tj - tf:+.0f} |")
    # rounds minutes apart see different loads: the cost within each pass (free and constrained back to back)
    print()
    for c in levels:
        costs = [100 * (1 - rj["tok_s"] / rf["tok_s"]) for rf in rows for rj in rows
                 if rf["rep"] == rj["rep"] and rf["streams"] == rj["streams"] == c
                 and rf["kind"] == "free" and rj["kind"] == "json_schema" and rf["tok_s"] > 0]
        print(f"{c} streams: throughput cost within each pass: median {statistics.median(costs):+.1f}% "
              f"({', '.join(f'{x:+.1f}' for x in costs)})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
