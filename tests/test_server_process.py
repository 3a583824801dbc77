"""`llambda serve` as a real process: 200 requests from 16 clients with memory flat, SIGTERM draining."""
from __future__ import annotations

import concurrent.futures as cf
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

import llambda

from serverkit import PROMPTS, ServerProcess, _rss_kib

LOAD_REQUESTS = 200
LOAD_CLIENTS = 16


def _status_kind(status: int) -> str:
    return str(status) if status in (429, 503) else f"failed: HTTP {status}"


def _load_request(srv: ServerProcess, client: openai.OpenAI, i: int) -> str:
    """Request i of the load mix; returns its outcome: ok, hung_up, 429, 503 or failed: why."""
    mid = srv.model_id
    msgs = [{"role": "user", "content": PROMPTS[i % 8]}]
    kind = i % 10
    try:
        if kind == 0:             # a streaming client that hangs up after a few chunks
            body = {"model": mid, "messages": msgs, "max_tokens": 48, "ignore_eos": True, "stream": True,
                    "temperature": 0.8, "seed": i}
            with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body, timeout=60) as r:
                if r.status_code != 200:
                    return _status_kind(r.status_code)
                for n, _ in enumerate(r.iter_lines()):
                    if n >= 4:
                        break
            return "hung_up"
        if kind == 5:             # a non-streaming client that gives up before the answer
            body = {"model": mid, "prompt": PROMPTS[i % 8], "max_tokens": 48, "ignore_eos": True}
            try:
                r = httpx.post(srv.url + "/v1/completions", json=body, timeout=0.2)
            except httpx.TimeoutException:
                return "hung_up"
            return "ok" if r.status_code == 200 else _status_kind(r.status_code)
        if kind == 3:             # two choices: two sequences, so the queue can overflow (429)
            r = client.completions.create(model=mid, prompt=PROMPTS[i % 8], max_tokens=6, n=2, temperature=0.9,
                                          seed=i)
            assert [c.index for c in r.choices] == [0, 1]
            assert all(c.finish_reason in ("stop", "length") for c in r.choices)
            assert r.usage.completion_tokens <= 12      # 0 when both drew end-of-text at once
            return "ok"
        if kind in (1, 7):        # streamed chat with a usage chunk
            text, finish, usage = [], None, None
            for ch in client.chat.completions.create(model=mid, messages=msgs, max_tokens=8, temperature=0.8,
                                                     seed=i, stream=True, stream_options={"include_usage": True}):
                if ch.usage is not None:
                    usage = ch.usage
                for c in ch.choices:
                    text.append(c.delta.content or "")
                    finish = c.finish_reason or finish
            assert finish in ("stop", "length") and usage is not None and usage.completion_tokens <= 8
            return "ok"
        r = client.chat.completions.create(model=mid, messages=msgs, max_tokens=8, temperature=0.8, seed=i)
        assert r.choices[0].finish_reason in ("stop", "length") and r.choices[0].message.content is not None
        assert r.usage.completion_tokens <= 8
        return "ok"
    except openai.APIStatusError as e:
        return _status_kind(e.status_code)
    except Exception as e:     # a broken stream, a bad answer, a dropped connection
        return f"failed: {type(e).__name__}: {str(e)[:300]}"


def test_load_200_requests_16_clients_memory_flat(smollm2_gguf, tmp_path):
    """The issue's load test: 200 requests from 16 concurrent clients, some hanging up mid-stream.

    8 slots and 16 queue places hold the 16 clients' sequences (n=2 requests included) with room for
    hung-up ones the server has not yet noticed; a 429 would still be a deliberate refusal, and is
    allowed. Everything else must succeed, the server must come back to idle (no slot, queue place or
    request leaked), and a second wave must not grow its RSS by more than 8 MiB (measured: < 1 MiB).
    """
    flags = ["--parallel", "8", "--queue-size", "16", "-c", "256", "--max-tokens-cap", "64"]
    with ServerProcess(smollm2_gguf, tmp_path / "server.log", *flags) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=60)

        def wave(first: int) -> dict[str, int]:
            with cf.ThreadPoolExecutor(LOAD_CLIENTS) as ex:
                kinds = list(ex.map(lambda i: _load_request(srv, client, i), range(first, first + LOAD_REQUESTS)))
            counts: dict[str, int] = {}
            for k in kinds:
                counts[k] = counts.get(k, 0) + 1
            return counts

        counts = wave(0)
        failed = {k: n for k, n in counts.items() if k not in ("ok", "hung_up", "429", "503")}
        assert not failed, f"outcomes {counts}; server log:\n{srv.log()}"
        assert counts.get("hung_up", 0) >= LOAD_REQUESTS // 20
        assert counts.get("ok", 0) >= LOAD_REQUESTS // 2, counts
        m = srv.wait_idle()
        assert m['llambda_sequences_finished_total{reason="cancelled"}'] >= LOAD_REQUESTS // 10
        assert not [k for k in m if 'status="5' in k and not k.endswith('status="503"}')], m
        rss_1 = _rss_kib(srv.proc.pid)

        counts_2 = wave(LOAD_REQUESTS)
        failed = {k: n for k, n in counts_2.items() if k not in ("ok", "hung_up", "429", "503")}
        assert not failed, f"outcomes {counts_2}; server log:\n{srv.log()}"
        srv.wait_idle()
        rss_2 = _rss_kib(srv.proc.pid)
        print(f"load: wave 1 {counts}, wave 2 {counts_2}; RSS {rss_1} -> {rss_2} KiB")
        assert rss_2 - rss_1 < 8 * 1024, f"RSS grew {rss_2 - rss_1} KiB over a second wave of {LOAD_REQUESTS}"


def test_sigterm_lets_running_streams_finish(smollm2_gguf, tmp_path):
    flags = ["--parallel", "2", "-c", "512", "--shutdown-grace", "20"]
    with ServerProcess(smollm2_gguf, tmp_path / "server.log", *flags) as srv:
        # SIGTERM while a stream runs: the stream still completes, then the process exits 0
        body = {"model": srv.model_id, "prompt": "Once upon a time", "max_tokens": 24, "ignore_eos": True,
                "stream": True, "temperature": 0}
        with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=120) as r:
            lines = r.iter_lines()
            first = next(ln for ln in lines if ln)
            assert first.startswith("data: ")
            srv.proc.send_signal(signal.SIGTERM)
            rest = [ln for ln in lines if ln]
        assert rest[-1] == "data: [DONE]"
        final = json.loads(rest[-2][6:])
        assert final["choices"][0]["finish_reason"] == "length"
        assert srv.proc.wait(60) == 0
        with pytest.raises(httpx.TransportError):
            httpx.get(srv.url + "/health", timeout=2)


def test_sigterm_cancels_streams_after_grace(smollm2_gguf, tmp_path):
    flags = ["--parallel", "1", "-c", "4096", "--shutdown-grace", "0.5"]
    with ServerProcess(smollm2_gguf, tmp_path / "server.log", *flags) as srv:
        body = {"prompt": "Once upon a time", "max_tokens": 4000, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=120) as r:
            lines = r.iter_lines()
            next(ln for ln in lines if ln)
            srv.proc.send_signal(signal.SIGTERM)
            rest = [ln for ln in lines if ln]
        assert rest[-1] == "data: [DONE]"
        err = json.loads(rest[-2][6:])["error"]
        assert "shutting down" in err["message"]
        assert srv.proc.wait(60) == 0


TINY = Path(__file__).parent / "fixtures" / "reference" / "tiny" / "llama"


def test_a_second_sigint_during_the_drain_exits_at_once_without_a_traceback(tmp_path):
    """Ctrl-C twice: the second one, while the first waits for a running stream, printed asyncio's
    CancelledError tracebacks (uvicorn re-raised both signals into the event loop)."""
    flags = ["--parallel", "1", "-c", "65536", "--shutdown-grace", "120"]
    with ServerProcess(TINY, tmp_path / "server.log", *flags) as srv:
        body = {"prompt": [1, 2, 3], "max_tokens": 60000, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=120) as r:
            assert r.status_code == 200, r.read()
            while srv.metrics()["llambda_sequences_active"] < 1:    # (a model without a tokenizer streams no text)
                time.sleep(0.05)
            srv.proc.send_signal(signal.SIGINT)
            while True:             # draining: the listening socket is closed, the stream still runs
                try:
                    httpx.get(srv.url + "/health", timeout=2)
                except httpx.TransportError:
                    break
                time.sleep(0.05)
            assert srv.proc.poll() is None, srv.log()
            srv.proc.send_signal(signal.SIGINT)
            assert srv.proc.wait(60) == 130
        log = srv.log()
        assert "interrupted again: exiting now" in log and "Traceback" not in log, log


def test_port_0_says_the_port_it_got(smollm2_gguf, tmp_path):
    # with --port 0 the kernel picks the port; the server once printed only ":0", so nobody could connect
    env = dict(os.environ, PYTHONPATH=str(Path(llambda.__file__).parent.parent))
    log = tmp_path / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "llambda.cli", "serve", "-m", str(smollm2_gguf), "--port", "0",
                                 "--parallel", "1", "-c", "256"], env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        t0 = time.monotonic()
        while not (m := re.search(r"listening on (http://127\.0\.0\.1:(\d+))/", log.read_text())):
            assert proc.poll() is None and time.monotonic() - t0 < 120, log.read_text()
            time.sleep(0.1)
        assert int(m.group(2)) > 0
        while True:       # the line comes just before uvicorn starts serving
            try:
                assert httpx.get(m.group(1) + "/health", timeout=5).status_code == 200
                break
            except httpx.TransportError:
                assert time.monotonic() - t0 < 120, log.read_text()
                time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
