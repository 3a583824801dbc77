"""llambda under Ray Serve: prefix-aware routing against round-robin, and two 1-thread replicas
against one 2-thread `llambda serve`.

1. Routing. One local Ray (loopback, dashboard off) runs two applications of 2 replicas x 1 thread:
   prefix-aware routing at / and round-robin at /rr. C conversations run at once, each T turns of a
   streamed chat (a system prompt shared by all, a persona of its own, then its history); rounds
   alternate between the two applications. Reported per policy: the prefix-cache hit rate (cached
   prompt tokens / prompt tokens, from each response's usage, turns 2+), the servers' own counters
   (/metrics), how the router placed requests, and time to first token.
2. Throughput. The prefix-aware application (2 replicas x 1 thread, P slots each) against
   `llambda serve -t 2 --parallel 2P`, and `-t 1` as a control (run after Ray is shut down, or before
   it with --single-first, so neither pays for the other): 1 and S streams of independent streamed
   completions, aggregate generated tokens/s.

Not a test: run it by hand (about 5-10 minutes on 2 loaded cores).

    python bench/bench_ray.py [--conversations 6 --turns 4 --repeat 2 --streams 8]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_server import ROOT, Engine, free_port, logged_round, model_id, one_request  # noqa: E402

sys.path.insert(0, str(ROOT))
SHARED = ("You are a helpful assistant for a travel agency. Answer politely, in two sentences at most, and "
          "never invent prices or dates. If you do not know, say so and suggest asking a human agent. ")
PERSONAS = ["a hiker planning the Alps", "a family going to the seaside", "a student on a rail pass",
            "a retired couple on a cruise", "a chef touring markets", "a cyclist crossing France",
            "a photographer chasing auroras", "a diver visiting reefs"]
QUESTIONS = ["Where should I go first?", "What should I pack?", "How do I get around?", "Any food to try?",
             "What about the weather?", "Is it safe at night?"]


def chat_turn(url: str, model: str, messages: list, max_tokens: int) -> dict:
    """One streamed chat turn: its text, time to first text, and usage."""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first, text, usage = None, [], {}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{r.status_code}: {r.read()[:300]!r}")
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            obj = json.loads(line[6:])
            usage = obj.get("usage") or usage
            for ch in obj.get("choices") or []:
                piece = (ch.get("delta") or {}).get("content")
                if piece:
                    first = first or time.perf_counter()
                    text.append(piece)
    end = time.perf_counter()
    return {"text": "".join(text), "ttft": (first or end) - t0, "usage": usage}


def conversations(url: str, model: str, n: int, turns: int, max_tokens: int, tag: str) -> list[dict]:
    """n conversations at once, each `turns` turns; one row per turn."""
    rows, errors, lock = [], [], threading.Lock()

    def talk(k: int) -> None:
        messages = [{"role": "system", "content": f"{SHARED}The customer is {PERSONAS[k % len(PERSONAS)]} "
                                                  f"(ticket {tag}-{k})."}]
        for t in range(turns):
            messages.append({"role": "user", "content": QUESTIONS[(k + t) % len(QUESTIONS)]})
            try:
                res = chat_turn(url, model, messages, max_tokens)
            except Exception as e:    # report, do not hide
                with lock:
                    errors.append(str(e))
                return
            messages.append({"role": "assistant", "content": res["text"]})
            with lock:
                rows.append({"turn": t, **res})

    threads = [threading.Thread(target=talk, args=(k,)) for k in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        print(f"   {len(errors)} errors, first: {errors[0]}", file=sys.stderr)
    return rows


def scrape(url: str) -> dict[str, float]:
    from llambda.scaleout.metrics_merge import samples

    return samples(httpx.get(url + "/metrics", timeout=30).text)


def wait_for_replicas(url: str, n: int, timeout: float = 120) -> None:
    t0 = time.monotonic()
    while scrape(url).get("llambda_replicas", 0) < n or \
            sum(1 for k in scrape(url) if k.startswith("llambda_replica_up")) < n:
        if time.monotonic() - t0 > timeout:
            raise RuntimeError("replicas did not report")
        time.sleep(0.5)


def pct(vals: list[float], q: float) -> float:
    vals = sorted(vals)
    return vals[min(len(vals) - 1, int(q * len(vals)))] if vals else float("nan")


def routing_part(a, model_path: str) -> dict:
    from llambda.scaleout import launch
    from llambda.scaleout.options import ScaleoutOptions

    def options(routing):
        return ScaleoutOptions(model=model_path, replicas=2, threads_per_replica=1, routing=routing,
                               load={"n_ctx": a.ctx_size}, server={"model_id": "smollm2", "parallel": a.parallel})

    launch.start_ray(num_cpus=4)          # logical CPUs: both applications' replicas placed at once
    port = free_port()
    apps = {"prefix": f"http://127.0.0.1:{port}", "round_robin": f"http://127.0.0.1:{port}/rr"}
    try:
        launch.deploy(options("prefix"), "127.0.0.1", port, name="prefix", route_prefix="/")
        launch.deploy(options("round_robin"), "127.0.0.1", port, name="round_robin", route_prefix="/rr")
        for url in apps.values():
            wait_for_replicas(url, 2)
        result = {name: {"rows": [], "metrics": {}} for name in apps}
        for rep in range(a.repeat):
            order = list(apps) if rep % 2 == 0 else list(apps)[::-1]
            for name in order:
                before = scrape(apps[name])
                t0 = time.perf_counter()
                rows = conversations(apps[name], "smollm2", a.conversations, a.turns, a.max_tokens, f"{rep}{name}")
                print(f"   {name} rep {rep}: {len(rows)} turns in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
                time.sleep(2.5)           # replicas report their counters every second
                after = scrape(apps[name])
                result[name]["rows"] += rows
                for k, v in after.items():
                    if k.startswith(("llambda_prompt_tokens", "llambda_router_requests_total")):
                        result[name]["metrics"][k] = result[name]["metrics"].get(k, 0) + v - before.get(k, 0)
        tput = throughput_rounds(a, Engine("ray: 2 replicas x 1 thread", [], port))
    finally:
        launch.stop()
    return {"routing": result, "throughput": tput}


def throughput_rounds(a, eng: Engine) -> list[dict]:
    eng.model_id = model_id(eng)
    one_request(eng, eng.model_id, "Hello", 8)       # warm-up
    # 1 stream shows what the extra hop (proxy, ingress, handle) costs; a.streams, the aggregate
    return [logged_round(rep, eng, eng.model_id, streams, a.requests_per_stream, a.gen_tokens)
            for rep in range(a.repeat) for streams in sorted({1, a.streams})]


def single_server(a, model_path: str, threads: int) -> list[dict]:
    port = free_port()
    cmd = [sys.executable, "-m", "llambda.cli", "serve", "-m", model_path, "--port", str(port), "-t", str(threads),
           "--parallel", str(2 * a.parallel), "-c", str(a.ctx_size), "--log-level", "warning"]
    eng = Engine(f"llambda serve -t {threads}", cmd, port, env={"PYTHONPATH": str(ROOT)})
    eng.start()
    try:
        return throughput_rounds(a, eng)
    finally:
        eng.stop()


def single_servers(a, model_path: str) -> list[list[dict]]:
    """The 2-thread server the replicas are compared with, and a 1-thread one as a control: on a loaded
    machine it tells the cost of a thread pool waiting on a descheduled thread from Ray's."""
    return [single_server(a, model_path, t) for t in (2, 1)]


def _label(sample: str) -> str:
    """The label value of a one-label sample name: 'x{k="v"}' -> 'v'."""
    return sample.split('"')[1]


def report(a, part1: dict, single: list[dict]) -> None:
    print(f"\n{a.conversations} conversations at once x {a.turns} turns, {a.max_tokens} tokens per answer, "
          f"2 replicas x 1 thread x {a.parallel} slots, {a.repeat} rounds per policy (alternating)\n")
    print("| routing | turns | hit rate, turns 2+ (usage) | hit rate, all turns (/metrics) | "
          "TTFT median ms, turns 2+ | TTFT p90 ms | placements |")
    print("|---|---|---|---|---|---|---|")
    for name, res in part1["routing"].items():
        later = [r for r in res["rows"] if r["turn"] > 0]
        prompt = sum(r["usage"].get("prompt_tokens", 0) for r in later)
        cached = sum((r["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0) for r in later)
        m = res["metrics"]
        all_prompt, all_cached = m.get("llambda_prompt_tokens_total", 0), m.get("llambda_prompt_tokens_cached_total", 0)
        ttft = [1000 * r["ttft"] for r in later]
        places = ", ".join(f"{_label(k)} {int(v)}" for k, v in sorted(m.items())
                           if k.startswith("llambda_router_requests_total"))
        print(f"| {name} | {len(res['rows'])} | {cached / max(prompt, 1):.0%} | {all_cached / max(all_prompt, 1):.0%} | "
              f"{statistics.median(ttft) if ttft else float('nan'):.0f} | {pct(ttft, 0.9):.0f} | {places} |")
    print(f"\nThroughput: 1 and {a.streams} streams x {a.requests_per_stream} streamed completions of "
          f"{a.gen_tokens} tokens, {a.repeat} rounds ({'the single server first, then Ray' if a.single_first else 'Ray first, then the single server after Ray stopped'})\n")
    print("| server | streams | aggregate tok/s (median) | min–max | median TTFT ms | errors |")
    print("|---|---|---|---|---|---|")
    for rows in (part1["throughput"], *single):
        for streams in sorted({r["streams"] for r in rows}):
            level = [r for r in rows if r["streams"] == streams]
            tps = [r["tok_s"] for r in level]
            print(f"| {level[0]['engine']} | {streams} | {statistics.median(tps):.1f} | {min(tps):.1f}–{max(tps):.1f} | "
                  f"{statistics.median(r['ttft_ms'] for r in level):.0f} | {sum(len(r['errors']) for r in level)} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", default=None, help="GGUF file (default: the catalogued smollm2-135m)")
    ap.add_argument("--conversations", type=int, default=6, help="conversations at once (default 6)")
    ap.add_argument("--turns", type=int, default=4, help="turns per conversation (default 4)")
    ap.add_argument("-n", "--max-tokens", type=int, default=24, help="tokens per answer (default 24)")
    ap.add_argument("--parallel", type=int, default=4, help="slots per replica (default 4)")
    ap.add_argument("-c", "--ctx-size", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=2, help="rounds per policy and per server (default 2)")
    ap.add_argument("--streams", type=int, default=8, help="throughput: concurrent streams (default 8)")
    ap.add_argument("-r", "--requests-per-stream", type=int, default=2)
    ap.add_argument("--gen-tokens", type=int, default=64, help="throughput: tokens per completion (default 64)")
    ap.add_argument("--single-first", action="store_true", help="run the single server before Ray, not after")
    ap.add_argument("--json", default=None, help="write the raw rows here")
    a = ap.parse_args(argv)
    if a.model is None:
        from llambda.hub import ensure_model
        a.model = str(ensure_model("smollm2-135m"))
    if a.single_first:
        single = single_servers(a, a.model)
        part1 = routing_part(a, a.model)
    else:
        part1 = routing_part(a, a.model)
        single = single_servers(a, a.model)
    report(a, part1, single)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"routing": part1["routing"], "throughput": part1["throughput"] + sum(single, [])}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
