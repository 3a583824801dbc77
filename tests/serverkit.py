"""What the server tests share: a live server in a thread or a process, the model it serves, helpers.

The fixtures built on these (`model`, `live`: one SmolLM2 server with 8 slots, `client`) are in
conftest.py; each test module gets its own server (module scope). Generations are short
(max_tokens <= 24) to keep the tests fast on 2 cores. The model runs on the default backend;
LLAMBDA_TEST_ACTIVATIONS=f32 selects the native backend's exact mode instead (to tell kernel
numerics from server bugs).
"""
from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import openai
import uvicorn

import llambda
from llambda.server.config import DEFAULT_KV_TYPE

MODEL_ID = "smollm2"
# the KV precision `llambda serve` runs with, and the models it is compared against alike
LOAD_KW = {"kv_type": DEFAULT_KV_TYPE}
if os.environ.get("LLAMBDA_TEST_ACTIVATIONS"):
    LOAD_KW["activations"] = os.environ["LLAMBDA_TEST_ACTIVATIONS"]
PROMPTS = [
    "Name three colors.",
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Count from one to five.",
    "What is 2 + 2?",
    "Give me a synonym for happy.",
    "Who wrote Hamlet?",
    "Describe a cat in one sentence.",
]



def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    """uvicorn serving an app in a background thread on a free loopback port."""

    def __init__(self, app):
        self.app = app
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        t0 = time.monotonic()
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() - t0 < 60, "server did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(30)

    def client(self, **kw) -> openai.OpenAI:
        kw.setdefault("api_key", "none")
        return openai.OpenAI(base_url=self.url + "/v1", max_retries=0, timeout=120, **kw)

    def metrics(self) -> dict[str, float]:
        text = httpx.get(self.url + "/metrics", timeout=30).text
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def wait_idle(self, timeout=30.0) -> dict[str, float]:
        t0 = time.monotonic()
        while True:
            m = self.metrics()
            if m["llambda_slots_busy"] == 0 and m["llambda_queue_depth"] == 0 and \
                    m["llambda_sequences_active"] == 0 and m["llambda_requests_in_flight"] == 1:   # this one
                return m
            assert time.monotonic() - t0 < timeout, f"server not idle: {m}"
            time.sleep(0.05)


@contextmanager
def serving(model_path, n_slots: int, parallel: int, n_ctx: int = 512, **cfg):
    """A model of its own (n_slots KV slots) served in a LiveServer with `parallel` sequences."""
    from llambda.server import ServerConfig, create_app

    with llambda.load(model_path, n_slots=n_slots, n_ctx=n_ctx, **LOAD_KW) as m:
        with LiveServer(create_app(m, ServerConfig(model_id=MODEL_ID, parallel=parallel, **cfg))) as srv:
            yield srv


@contextmanager
def tiny_chat_server(folder: Path, model_id: str, control_tokens: tuple, chat_template: str):
    """A tiny random llama (test_export's) with these control tokens and chat template, served with 2
    slots; the server's `.model` is the loaded model. Its context is beyond the model's 64: fine here."""
    import pytest
    from test_export import tiny_llama_gguf

    from llambda.server import ServerConfig, create_app

    gg = tiny_llama_gguf(folder / "tiny.gguf", control_tokens=control_tokens, chat_template=chat_template)
    with pytest.warns(llambda.LlambdaWarning, match="context"):
        m = llambda.load(gg, n_slots=2, n_ctx=512)
    with m:
        with LiveServer(create_app(m, ServerConfig(model_id=model_id, parallel=2))) as srv:
            srv.model = m
            yield srv


def chat(client, content, **kw):
    kw.setdefault("max_tokens", 16)
    kw.setdefault("temperature", 0)
    return client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": content}], **kw)


def post(live, path, body=None, content=None, headers=None):
    return httpx.post(live.url + path, json=body, content=content, headers=headers, timeout=60)


def assert_error(resp, status, *words):
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert isinstance(err["message"], str) and err["type"]
    for w in words:
        assert w.lower() in err["message"].lower(), err["message"]
    return err


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


class ServerProcess:
    """`llambda serve` in a child process (its own RSS, real signals); output goes to a log file."""

    def __init__(self, model_path, log_path: Path, *flags: str, preexec_fn=None):
        self.preexec_fn = preexec_fn       # run in the child before exec (e.g. to lower its rlimits)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [sys.executable, "-m", "llambda.cli", "serve", "-m", str(model_path), "--port", str(self.port),
                    "--log-level", "warning", *flags]
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        key = flags[flags.index("--api-key") + 1] if "--api-key" in flags else None
        self.auth = {"Authorization": f"Bearer {key}"} if key else {}

    def __enter__(self):
        env = dict(os.environ, PYTHONPATH=str(Path(llambda.__file__).parent.parent))
        self._log = open(self.log_path, "w")
        # a file, not a pipe: nobody reads a pipe while the test runs, and a full one would block the server
        self.proc = subprocess.Popen(self.cmd, env=env, stdout=self._log, stderr=subprocess.STDOUT, text=True,
                                     preexec_fn=self.preexec_fn)
        t0 = time.monotonic()
        while True:
            assert self.proc.poll() is None, self.log()
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() - t0 < 120, "server did not start: " + self.log()
            time.sleep(0.1)
        self.model_id = httpx.get(self.url + "/v1/models", headers=self.auth).json()["data"][0]["id"]
        return self

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._log.close()

    def log(self) -> str:
        return Path(self.log_path).read_text()[-4000:]

    def metrics(self) -> dict[str, float]:
        return LiveServer.metrics(self)

    def wait_idle(self, timeout=30.0) -> dict[str, float]:
        return LiveServer.wait_idle(self, timeout)


def hang_up_mid_stream(live, path: str, body: dict, lines: int = 6) -> list[logging.LogRecord]:
    """Read a few lines of a streamed answer, hang up, wait until the server is idle again (its slot
    freed); returns the errors uvicorn logged meanwhile (an exception escaping the app is one)."""
    errors: list[logging.LogRecord] = []
    handler = logging.Handler(logging.ERROR)
    handler.emit = errors.append
    logger = logging.getLogger("uvicorn.error")
    logger.addHandler(handler)
    try:
        with httpx.stream("POST", live.url + path, json={**body, "stream": True}, timeout=60) as s:
            assert s.status_code == 200, s.read()
            it = s.iter_lines()
            for _ in range(lines):
                next(it)
        live.wait_idle()
    finally:
        logger.removeHandler(handler)
    return errors
