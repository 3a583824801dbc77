"""Requests that wait long in a thread must not take the event loop's default executor (the attack round).

A decoder's embeddings wait in a thread for the scheduler, and /tokenize and /apply-template tokenize and
render there: a handful of those at once (the default executor has min(32, CPUs + 4) threads) left no
thread for a chat's body, so every chat completion hung and /health said 503 ("the event loop's thread
pool is exhausted") while the machine was idle. Embeddings run in a bounded pool of their own now, /tokenize
and /apply-template in the prompt workers (as a chat's render): past a pool's backlog a 429 at once, and
/health stays honest.
"""
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

import llambda

sys.path.insert(0, str(Path(__file__).parent))
from serverkit import LiveServer  # noqa: E402
from test_export import tiny_llama_gguf  # noqa: E402

DEFAULT_EXECUTOR = min(32, (os.cpu_count() or 1) + 4)     # asyncio's default executor's threads


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_llama_gguf(tmp_path_factory.mktemp("pool") / "tiny.gguf")


@pytest.mark.parametrize("route", ["embeddings", "ollama_embed", "tokenize", "apply_template"])
def test_requests_waiting_in_threads_leave_chats_and_health_alone(tiny, monkeypatch, route):
    from llambda.server import ServerConfig, create_app

    release, entered = threading.Event(), threading.Semaphore(0)
    path, body = {
        "embeddings": ("/v1/embeddings", {"model": "tiny", "input": "hello"}),
        "ollama_embed": ("/api/embed", {"model": "tiny", "input": "hello"}),
        "tokenize": ("/tokenize", {"content": "hello"}),
        "apply_template": ("/apply-template", {"messages": [{"role": "user", "content": "hello"}]}),
    }[route]
    with llambda.load(tiny, n_slots=3, n_ctx=64) as m:
        tok = m.tokenizer
        real_encode, real_render = type(tok).encode, type(m).render_chat

        def wait():                 # a long wait in the request's thread (not the scheduler's)
            entered.release()
            release.wait(60)

        def slow_encode(self, text, *a, **kw):
            if text.endswith("hello") and threading.current_thread().name != "llambda-scheduler":
                wait()
            return real_encode(self, text, *a, **kw)

        def slow_render(self, messages, *a, **kw):
            if messages[-1]["content"] == "hello":
                wait()
            return real_render(self, messages, *a, **kw)
        monkeypatch.setattr(type(tok), "encode", slow_encode)
        monkeypatch.setattr(type(m), "render_chat", slow_render)
        cfg = ServerConfig(model_id="tiny", parallel=2, queue_size=4)
        with LiveServer(create_app(m, cfg)) as srv, ThreadPoolExecutor(DEFAULT_EXECUTOR + 8) as ex:
            try:
                waiting = [ex.submit(httpx.post, srv.url + path, json=body, timeout=120)
                           for _ in range(DEFAULT_EXECUTOR + 4)]
                assert entered.acquire(timeout=30)       # at least one is in its wait
                if "embed" not in route:
                    # the chat comes after every request is in the prompt workers (running or queued) or answered
                    # 429: under load some arrive late, and a chat queued before them would wait behind the held
                    # jobs as any queued job does (not what this test is about)
                    deadline = time.monotonic() + 20
                    while time.monotonic() < deadline:
                        h = httpx.get(srv.url + "/health", timeout=30).json()
                        if h["prompts_preparing"] + h["prompts_waiting"] + sum(f.done() for f in waiting) >= len(waiting):
                            break
                        time.sleep(0.05)
                health = httpx.get(srv.url + "/health", timeout=30)
                assert health.status_code == 200, health.text
                chat = ex.submit(httpx.post, srv.url + "/v1/chat/completions", timeout=120,
                                 json={"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]})
                # the prompt workers themselves may be full of /tokenize and /apply-template jobs: a 429 then
                # (bounded, at once), never a hang; embeddings have a pool of their own
                assert chat.result(timeout=30).status_code in ((200,) if "embed" in route else (200, 429))
            finally:
                release.set()
            codes = [f.result(timeout=60).status_code for f in waiting]
            assert set(codes) <= {200, 429} and 200 in codes, codes
