"""Server throughput: aggregate generated tokens/s with 1, 4 and 8 concurrent streams.

Starts `llambda serve` (and, when found, llama.cpp's `llama-server` with the same
number of parallel slots, and llama-cpp-python's server) on loopback, then for each
concurrency C runs C clients that each send R streaming /v1/completions requests
back to back (greedy, EOS ignored, N new tokens each). Aggregate tokens/s is all
generated tokens over the wall time of the round; TTFT is the time to the first
streamed text. Not a test: run it by hand.

    python bench/bench_server.py                      # llambda only (+ llama-server if on PATH)
    python bench/bench_server.py --llama-server /path/to/llama-server --llama-cpp-python [/path/to/python]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
TOPICS = ["a lighthouse keeper", "a robot learning to paint", "the first city on Mars", "a dragon who hates gold",
          "a detective in Venice", "a child who can talk to birds", "an old clock maker", "a storm at sea",
          "a library that never closes", "the last tree on Earth", "a chef in space", "a haunted train"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Engine:
    name: str
    cmd: list[str]
    port: int
    env: dict = field(default_factory=dict)
    extra_body: dict = field(default_factory=dict)
    proc: subprocess.Popen | None = None
    model_id: str = ""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 300) -> None:
        log = open(Path(tempfile.gettempdir()) / f"bench_server_{self.name}.log", "w")
        self.proc = subprocess.Popen(self.cmd, env={**os.environ, **self.env}, stdout=log, stderr=subprocess.STDOUT)
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode}); see {log.name}")
            try:
                if httpx.get(self.url + "/v1/models", timeout=2).status_code == 200 and \
                        httpx.get(self.url + "/health", timeout=2).status_code in (200, 404):
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.25)
        raise RuntimeError(f"{self.name} did not come up in {timeout} s")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _choices(line: bytes) -> list:
    """The choices of one `data: {...}` line; none if it is cut (an event split across reads)."""
    try:
        return json.loads(line[6:]).get("choices") or []
    except ValueError:
        return []


def _http_body(raw: bytes) -> bytes:
    """The body of a whole HTTP/1.1 response, de-chunked if it came in chunks."""
    head, _, body = raw.partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" not in head.lower():
        return body
    out, i = bytearray(), 0
    while i < len(body):
        j = body.find(b"\r\n", i)
        if j < 0:
            break
        size = int(body[i:j].split(b";")[0] or b"0", 16)
        if size == 0:
            break
        out += body[j + 2:j + 2 + size]
        i = j + 2 + size + 2
    return bytes(out)


def one_request(engine: Engine, model: str, prompt: str, max_tokens: int) -> tuple[int, float, float]:
    """(generated tokens, time to first text, total time) of one streamed completion.

    The client shares the machine's two cores with the server under test, so it is a bare socket
    (HTTP/1.1, Connection: close, read to EOF) that parses JSON only until the first text and in
    the final usage chunk: httpx reading every event cost ~0.7 ms of CPU per token (38% of a core
    at 8 streams, measured), time the engine then did not get."""
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}, **engine.extra_body}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{engine.port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    t0 = time.perf_counter()
    first = None
    data = bytearray()
    scanned = 0            # bytes of data already searched for the first text
    with socket.create_connection(("127.0.0.1", engine.port), timeout=600) as sock:
        sock.sendall(head + body)
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
            if first is None:
                end = data.rfind(b"\n")
                for line in bytes(data[scanned:end]).split(b"\n"):
                    line = line.strip()
                    if line.startswith(b"data: {") and any(ch.get("text") for ch in _choices(line)):
                        first = time.perf_counter()
                        break
                scanned = max(scanned, end)
    end_t = time.perf_counter()
    status = bytes(data[:data.find(b"\r\n")])
    if b" 200 " not in status + b" ":
        raise RuntimeError(f"{engine.name}: {status!r}: {bytes(data[:300])!r}")
    events = [line.strip() for line in _http_body(bytes(data)).split(b"\n") if line.strip().startswith(b"data: {")]
    usage = None
    for line in events:
        if b'"usage"' in line:
            usage = json.loads(line[6:]).get("usage") or usage
    if usage and usage.get("completion_tokens"):
        n = usage["completion_tokens"]
    else:   # no usage chunk: count the chunks that carry text
        n = sum(1 for line in events for ch in _choices(line) if ch.get("text"))
    return n, (first or end_t) - t0, end_t - t0


def story_prompt(k: int) -> str:
    return f"Once upon a time, there was {TOPICS[k % len(TOPICS)]}. One day,"


def run_round(engine: Engine, model: str, streams: int, per_stream: int, max_tokens: int,
              prompt_for=story_prompt) -> dict:
    """C streams of R requests each; prompt_for(k) gives the k-th request's prompt; max_tokens is a
    number or, per request, a function of k."""
    results: list[tuple[int, float, float]] = []
    errors: list[str] = []
    lock = threading.Lock()

    def client(k: int) -> None:
        for r in range(per_stream):
            try:
                i = k * per_stream + r
                res = one_request(engine, model, prompt_for(i), max_tokens(i) if callable(max_tokens) else max_tokens)
            except Exception as e:  # report, do not hide
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
    return {"engine": engine.name, "streams": streams, "requests": len(results), "errors": errors,
            "tokens": tokens, "wall_s": wall, "tok_s": tokens / wall if wall > 0 else 0.0,
            "ttft_ms": 1000 * statistics.median(r[1] for r in results) if results else float("nan"),
            "lengths": [r[0] for r in results]}


def logged_round(rep: int, engine: Engine, model: str, streams: int, per_stream: int, max_tokens: int,
                 prompt_for=story_prompt) -> dict:
    """run_round, its row marked with the pass it belongs to and a line on stderr."""
    row = run_round(engine, model, streams, per_stream, max_tokens, prompt_for)
    row["rep"] = rep
    print(f"   {engine.name} {streams} streams (rep {rep}): {row['tok_s']:.1f} tok/s aggregate, "
          f"TTFT {row['ttft_ms']:.0f} ms, {row['requests']} requests, {len(row['errors'])} errors", file=sys.stderr)
    return row


def model_id(engine: Engine) -> str:
    data = httpx.get(engine.url + "/v1/models", timeout=10).json()["data"]
    return data[0]["id"]


def add_common_args(ap: argparse.ArgumentParser, streams: str) -> None:
    """The options every server benchmark takes (this one and bench_constrained.py)."""
    ap.add_argument("-m", "--model", default=None, help="GGUF file (default: the catalogued smollm2-135m)")
    ap.add_argument("--streams", default=streams, help=f"concurrency levels (default {streams})")
    ap.add_argument("--parallel", type=int, default=8, help="server slots (default 8)")
    ap.add_argument("-r", "--requests-per-stream", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3, help="passes over the levels (median reported)")
    ap.add_argument("-c", "--ctx-size", type=int, default=1024, help="context per slot")
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("--llambda-args", default="", help="extra arguments for `llambda serve`")
    ap.add_argument("--json", default=None, help="write the rows here")


def resolve_common_args(a) -> tuple[int, list[int]]:
    """Fills in the default model; returns (threads, concurrency levels)."""
    sys.path.insert(0, str(ROOT))
    if a.model is None:
        from llambda.hub import ensure_model
        a.model = str(ensure_model("smollm2-135m"))
    return a.threads or _physical_cores(), [int(s) for s in a.streams.split(",")]


def llambda_serve_cmd(a, port: int, threads: int) -> list[str]:
    return [sys.executable, "-m", "llambda.cli", "serve", "-m", a.model, "--port", str(port),
            "--parallel", str(a.parallel), "-c", str(a.ctx_size), "-t", str(threads), "--log-level", "warning",
            *a.llambda_args.split()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_args(ap, "1,4,8")
    ap.add_argument("-n", "--max-tokens", type=int, default=128, help="tokens generated per request")
    ap.add_argument("--llama-server", default="auto", help="path to llama-server, 'auto' (PATH) or 'none'")
    ap.add_argument("--llama-cpp-python", nargs="?", const=sys.executable, default=None, metavar="PYTHON",
                    help="also run llama_cpp.server (it serializes requests) with this interpreter (default: ours)")
    ap.add_argument("--no-llambda", action="store_true", help="only the other engines")
    a = ap.parse_args(argv)
    threads, levels = resolve_common_args(a)
    engines: list[Engine] = []

    port = free_port()
    if not a.no_llambda:
        cmd = llambda_serve_cmd(a, port, threads)
        engines.append(Engine("llambda", cmd, port, env={"PYTHONPATH": str(ROOT)}, extra_body={"ignore_eos": True}))
    exe = shutil.which("llama-server") if a.llama_server == "auto" else (None if a.llama_server == "none"
                                                                           else a.llama_server)
    if exe:
        port = free_port()
        engines.append(Engine("llama-server", [exe, "-m", a.model, "--port", str(port), "-np", str(a.parallel),
                                               "-c", str(a.ctx_size * a.parallel), "-t", str(threads),
                                               "--no-webui"],
                              port, extra_body={"ignore_eos": True}))
    elif a.llama_server == "auto":
        print("(llama-server not on PATH: skipped; pass --llama-server PATH)", file=sys.stderr)
    if a.llama_cpp_python:
        port = free_port()
        engines.append(Engine("llama-cpp-python", [a.llama_cpp_python, "-m", "llama_cpp.server", "--model", a.model,
                                                   "--port", str(port), "--n_ctx", str(a.ctx_size),
                                                   "--n_threads", str(threads), "--interrupt_requests", "False"],
                              port, extra_body={"logit_bias": {"0": -100, "2": -100}}))

    # All servers up at once, rounds interleaved (A, B, A, B...) and every repeat a pass over all the
    # levels (1, 4, 8, 1, 4, 8...): drift on a shared machine hits all engines and levels alike.
    rows = []
    try:
        for eng in engines:
            print(f"== {eng.name}: {' '.join(eng.cmd)}", file=sys.stderr)
            eng.start()
            eng.model_id = model_id(eng)
            one_request(eng, eng.model_id, "Hello", 8)        # warm-up
        for rep in range(a.repeat):
            for c in levels:
                for eng in engines:
                    rows.append(logged_round(rep, eng, eng.model_id, c, a.requests_per_stream, a.max_tokens))
    finally:
        for eng in engines:
            eng.stop()

    def med(engine, c, key):
        vals = [r[key] for r in rows if r["engine"] == engine and r["streams"] == c]
        return statistics.median(vals) if vals else float("nan"), vals

    print(f"\nSmolLM2 ({Path(a.model).name}), {threads} threads, {a.parallel} slots, {a.max_tokens} tokens per "
          f"request, {a.requests_per_stream} requests per stream, median of {a.repeat} passes over the levels\n")
    print("| engine | streams | aggregate tok/s (median) | min–max | x vs 1 stream | median TTFT ms | errors |")
    print("|---|---|---|---|---|---|---|")
    for eng in engines:
        base, _ = med(eng.name, 1, "tok_s")
        for c in levels:
            tps, vals = med(eng.name, c, "tok_s")
            ttft, _ = med(eng.name, c, "ttft_ms")
            errs = sum(len(r["errors"]) for r in rows if r["engine"] == eng.name and r["streams"] == c)
            rel = f"{tps / base:.2f}" if base == base and base > 0 else "-"
            print(f"| {eng.name} | {c} | {tps:.1f} | {min(vals):.1f}–{max(vals):.1f} | {rel} | {ttft:.0f} | {errs} |")
    # the scaling bar compares rounds run minutes apart: per repeat, top level over 1 stream of the same pass
    top = max(levels)
    if 1 in levels and top > 1:
        print()
        for eng in engines:
            ratios = [rt["tok_s"] / r1["tok_s"] for r1 in rows for rt in rows
                      if r1["engine"] == rt["engine"] == eng.name and r1["rep"] == rt["rep"]
                      and r1["streams"] == 1 and rt["streams"] == top and r1["tok_s"] > 0]
            if ratios:
                print(f"{eng.name}: {top} streams / 1 stream within each pass: median {statistics.median(ratios):.2f}x "
                      f"({', '.join(f'{r:.2f}' for r in ratios)})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


def _physical_cores() -> int:
    try:
        from llambda.backends.native import physical_cores
        return physical_cores()
    except Exception:
        return os.cpu_count() or 1


if __name__ == "__main__":
    sys.exit(main())
