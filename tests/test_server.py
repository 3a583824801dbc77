"""The OpenAI-compatible server, live on loopback, driven by the official `openai` client.

One SmolLM2 server (8 slots) serves most tests; a second, tiny one (1 slot, API key)
checks auth and the bounded queue; subprocess servers check SIGTERM and memory.
Generations are short (max_tokens <= 24) to keep this file fast on 2 cores.
The model runs on the default backend; LLAMBDA_TEST_ACTIVATIONS=f32 selects the
native backend's exact mode instead (to tell kernel numerics from server bugs).
"""
from __future__ import annotations

import concurrent.futures as cf
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import uvicorn

import llambda
from llambda.server import ServerConfig, create_app
from llambda.server.config import DEFAULT_KV_TYPE
from llambda.server.tools import ToolCallParser, extract_tool_calls, hermes_prefix

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


@pytest.fixture(scope="module")
def model(smollm2_gguf):
    with llambda.load(smollm2_gguf, n_slots=8, n_ctx=512, **LOAD_KW) as m:
        yield m


@pytest.fixture(scope="module")
def live(model):
    cfg = ServerConfig(model_id=MODEL_ID, aliases={"smollm2-135m"}, parallel=8, queue_size=32,
                       max_body_bytes=64 * 1024, max_tokens_cap=256, prefill_chunk=64)
    with LiveServer(create_app(model, cfg)) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(live):
    return live.client()


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


# -- basics ---------------------------------------------------------------------------

def test_models_and_health(live, client):
    ids = [m.id for m in client.models.list().data]
    assert ids == [MODEL_ID]
    h = httpx.get(live.url + "/health").json()
    assert h["status"] == "ok" and h["slots_idle"] + h["slots_processing"] == 8


def test_chat_completion_and_usage(client, model):
    r = chat(client, "What is the capital of France?", max_tokens=12)
    c = r.choices[0]
    assert r.object == "chat.completion" and r.model == MODEL_ID
    assert c.message.role == "assistant" and c.message.content
    assert c.finish_reason in ("stop", "length")
    rendered = model.render_chat([{"role": "user", "content": "What is the capital of France?"}])
    assert r.usage.prompt_tokens == len(model._prompt_ids(rendered))
    assert 1 <= r.usage.completion_tokens <= 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    if c.finish_reason == "length":
        assert r.usage.completion_tokens == 12


def test_server_matches_single_stream_api(client, smollm2_gguf):
    """The scheduler's output equals llambda's own single-stream generation (same backend)."""
    messages = [{"role": "user", "content": "Tell me about the moon."}]
    r = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=20, temperature=0)
    with llambda.load(smollm2_gguf, n_ctx=512, **LOAD_KW) as single:
        expect = single.chat(messages, max_tokens=20, temperature=0)
    assert r.choices[0].message.content == expect


def test_completion_stop_and_max_tokens(client):
    prompt = "The days of the week are Monday, Tuesday,"
    full = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=16, temperature=0)
    text = full.choices[0].text
    assert full.object == "text_completion" and full.choices[0].finish_reason == "length"
    assert full.usage.completion_tokens == 16
    # stop at a word from the middle of the greedy text: the output is what came before it
    words = [w for w in text.split() if len(w) >= 3]
    assert words, text
    stop = words[len(words) // 2]
    cut = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=16, temperature=0, stop=[stop])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == text[:text.index(stop)]
    # max_completion_tokens (chat)
    r = chat(client, "Write a long story about dragons.", max_tokens=None, max_completion_tokens=5)
    assert r.usage.completion_tokens <= 5 and r.choices[0].finish_reason in ("length", "stop")


def test_prompt_longer_than_a_prefill_chunk(client, model):
    """A prompt spread over several steps (the live server's chunk is 64), with nothing else running."""
    prompt = "The quick brown fox jumps over the lazy dog. " * 20
    n_prompt = len(model._prompt_ids(prompt))
    assert n_prompt > 3 * 64
    r = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=4, temperature=0)
    assert r.usage.prompt_tokens == n_prompt and r.choices[0].finish_reason in ("stop", "length")


def test_completion_token_prompt_and_echo(client, model):
    ids = model.tokenize("Once upon a time")
    by_ids = client.completions.create(model=MODEL_ID, prompt=ids, max_tokens=8, temperature=0)
    by_text = client.completions.create(model=MODEL_ID, prompt="Once upon a time", max_tokens=8, temperature=0,
                                        echo=True)
    assert by_text.choices[0].text == "Once upon a time" + by_ids.choices[0].text
    batch = client.completions.create(model=MODEL_ID, prompt=["Once upon a time", "Hello"], max_tokens=4,
                                      temperature=0)
    assert [c.index for c in batch.choices] == [0, 1]
    assert batch.choices[0].text == by_ids.choices[0].text[:len(batch.choices[0].text)]


def test_streaming_equals_non_streaming(live, client):
    kw = dict(max_tokens=16, temperature=0)
    whole = chat(client, "Write a haiku about the sea.", **kw)
    stream = chat(client, "Write a haiku about the sea.", stream=True, stream_options={"include_usage": True}, **kw)
    parts, finish, usage, roles = [], None, None, []
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
            assert chunk.choices == []
            continue
        d = chunk.choices[0].delta
        if d.role:
            roles.append(d.role)
        if d.content:
            parts.append(d.content)
        if chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    assert roles == ["assistant"]
    assert "".join(parts) == whole.choices[0].message.content
    assert finish == whole.choices[0].finish_reason
    assert usage.completion_tokens == whole.usage.completion_tokens
    assert usage.prompt_tokens == whole.usage.prompt_tokens
    # the raw wire format ends with [DONE]
    with httpx.stream("POST", live.url + "/v1/completions", timeout=60,
                      json={"model": MODEL_ID, "prompt": "Hi", "max_tokens": 3, "stream": True}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln]
    assert lines[-1] == "data: [DONE]"
    assert all(ln.startswith("data: ") for ln in lines)
    assert json.loads(lines[-2][6:])["choices"][0]["finish_reason"] in ("length", "stop")


def test_logprobs(client):
    r = chat(client, "Name three colors.", max_tokens=8, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert "".join(t.token for t in content) == r.choices[0].message.content
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        tops = [x.logprob for x in t.top_logprobs]
        assert tops == sorted(tops, reverse=True)
        assert t.top_logprobs[0].token == t.token          # greedy: the chosen token is the most likely
        assert abs(t.top_logprobs[0].logprob - t.logprob) < 1e-6
        assert bytes(t.bytes).decode("utf-8", "replace") == t.token
    # streamed, the same entries arrive with the chunks
    streamed = [e for ch in chat(client, "Name three colors.", max_tokens=8, logprobs=True, top_logprobs=3,
                                 stream=True)
                for c in ch.choices if c.logprobs for e in c.logprobs.content]
    assert [e.token for e in streamed] == [t.token for t in content]
    assert np.allclose([e.logprob for e in streamed], [t.logprob for t in content], atol=1e-4)
    c = client.completions.create(model=MODEL_ID, prompt="One, two,", max_tokens=5, temperature=0, logprobs=2)
    lp = c.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == c.usage.completion_tokens
    assert "".join(lp.tokens) == c.choices[0].text
    assert lp.text_offset[0] == 0 and all(len(d) == 2 for d in lp.top_logprobs)


def _log_softmax(x):
    x = np.asarray(x, np.float64)
    m = x.max()
    return x - (m + np.log(np.exp(x - m).sum()))


def test_completion_echo_with_prompt_logprobs(client, model, smollm2_gguf):
    """echo + logprobs: the prompt's tokens come first, each scored by the model (the first has none)."""
    prompt = "The capital of France is"
    ids = model._prompt_ids(prompt)
    plain = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=3, temperature=0, logprobs=2)
    r = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=3, temperature=0, logprobs=2,
                                  echo=True)
    c, lp = r.choices[0], r.choices[0].logprobs
    assert c.text == prompt + plain.choices[0].text
    assert len(lp.tokens) == len(ids) + r.usage.completion_tokens
    assert "".join(lp.tokens) == c.text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    # the prompt was just evaluated for `plain`, but scoring needs every position: nothing reused
    assert r.usage.prompt_tokens_details.cached_tokens == 0
    # the generated part is what the request without echo reported
    assert lp.tokens[len(ids):] == plain.choices[0].logprobs.tokens
    assert np.allclose(lp.token_logprobs[len(ids):], plain.choices[0].logprobs.token_logprobs, atol=1e-3)
    # each prompt token's logprob is log_softmax of the logits after the tokens before it
    with llambda.load(smollm2_gguf, n_ctx=64, **LOAD_KW) as single:
        for p in range(1, len(ids)):
            want = _log_softmax(single.logits(ids[:p]))
            assert abs(lp.token_logprobs[p] - want[ids[p]]) < 1e-3, (p, lp.token_logprobs[p], want[ids[p]])
            assert len(lp.top_logprobs[p]) == 2
            best = model.detokenize([int(np.argmax(want))])
            assert max(lp.top_logprobs[p], key=lp.top_logprobs[p].get) == best
            assert max(lp.top_logprobs[p].values()) >= lp.token_logprobs[p] - 1e-6
    # scoring only (max_tokens 0), two choices: both carry the prompt's logprobs
    scored = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=0, echo=True, logprobs=0, n=2)
    assert scored.usage.completion_tokens == 0
    for ch in scored.choices:
        assert ch.text == prompt and ch.finish_reason == "length"
        assert ch.logprobs.token_logprobs == lp.token_logprobs[:len(ids)]
    # streamed: the echo chunk carries the prompt's logprobs, the rest follows token by token
    chunks = list(client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=3, temperature=0,
                                            logprobs=2, echo=True, stream=True))
    head = chunks[0].choices[0]
    assert head.text == prompt and head.logprobs.tokens == lp.tokens[:len(ids)]
    assert head.logprobs.token_logprobs == lp.token_logprobs[:len(ids)]
    tokens = [t for ch in chunks for t in (ch.choices[0].logprobs.tokens if ch.choices[0].logprobs else [])]
    assert tokens == lp.tokens
    assert "".join(ch.choices[0].text for ch in chunks) == c.text


def test_streaming_with_several_choices(client):
    """n > 1 streamed: each choice's chunks carry its index; they spell what the same seeded request
    returns whole, each with one role chunk (chat) and one finish_reason."""
    kw = dict(max_tokens=10, temperature=1.0, seed=77, n=3)
    whole = chat(client, "Tell me about owls.", **kw)
    texts, roles, finishes, usage = {}, {}, {}, None
    for ch in chat(client, "Tell me about owls.", stream=True, stream_options={"include_usage": True}, **kw):
        if ch.usage is not None:
            usage = ch.usage
        for c in ch.choices:
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
            if c.delta.role:
                roles[c.index] = roles.get(c.index, 0) + 1
            if c.finish_reason:
                assert c.index not in finishes
                finishes[c.index] = c.finish_reason
    assert roles == {0: 1, 1: 1, 2: 1}
    assert [texts[i] for i in range(3)] == [c.message.content for c in whole.choices]
    assert [finishes[i] for i in range(3)] == [c.finish_reason for c in whole.choices]
    assert usage.completion_tokens == whole.usage.completion_tokens
    # legacy completions: two prompts x two choices = indexes 0..3
    got = {}
    for ch in client.completions.create(model=MODEL_ID, prompt=["Roses are", "The sky is"], max_tokens=4, n=2,
                                        temperature=0.9, seed=5, stream=True):
        for c in ch.choices:
            got[c.index] = got.get(c.index, "") + c.text
    same = client.completions.create(model=MODEL_ID, prompt=["Roses are", "The sky is"], max_tokens=4, n=2,
                                     temperature=0.9, seed=5)
    assert [got[i] for i in range(4)] == [c.text for c in same.choices]


def test_sampling_seed_n_and_penalties(client):
    kw = dict(max_tokens=12, temperature=1.0, top_p=0.95, seed=1234, n=2)
    a = chat(client, "Tell me a joke.", **kw)
    b = chat(client, "Tell me a joke.", **kw)
    assert [c.index for c in a.choices] == [0, 1]
    assert [c.message.content for c in a.choices] == [c.message.content for c in b.choices]
    assert a.usage.completion_tokens <= 2 * 12
    # extensions and penalties are accepted and change nothing about the response shape
    r = chat(client, "Tell me a joke.", max_tokens=6, temperature=0.7, seed=1,
             presence_penalty=0.5, frequency_penalty=0.5, extra_body={"top_k": 20, "min_p": 0.05})
    assert r.choices[0].message.content is not None


# -- batching --------------------------------------------------------------------------

def test_concurrent_greedy_equals_sequential(live, client):
    """8 concurrent greedy requests produce exactly the text each produces alone."""
    def one(p):
        return chat(client, p, max_tokens=16).choices[0].message.content

    alone = [one(p) for p in PROMPTS]
    before = live.metrics()
    with cf.ThreadPoolExecutor(8) as ex:
        together = list(ex.map(one, PROMPTS))
    after = live.wait_idle()
    assert together == alone
    steps = after["llambda_steps_total"] - before["llambda_steps_total"]
    tokens = after["llambda_step_tokens_total"] - before["llambda_step_tokens_total"]
    assert tokens / steps > 1.5, "concurrent requests should have shared forward steps"


def test_metrics_format(live):
    m = live.metrics()
    for name in ("llambda_prompt_tokens_total", "llambda_generated_tokens_total", "llambda_queue_depth",
                 "llambda_tokens_per_second", "llambda_time_to_first_token_seconds_count"):
        assert name in m
    assert m["llambda_generated_tokens_total"] > 0 and m["llambda_time_to_first_token_seconds_count"] > 0


# -- bad input ---------------------------------------------------------------------------

def test_bad_requests_get_openai_errors(live, client):
    url = "/v1/chat/completions"
    msgs = [{"role": "user", "content": "hi"}]
    assert_error(post(live, url, content=b"{not json", headers={"content-type": "application/json"}), 400, "json")
    assert_error(post(live, url, content=b""), 400, "empty")
    assert_error(post(live, url, [1, 2]), 400, "object")
    err = assert_error(post(live, url, {"model": MODEL_ID, "messages": msgs, "temperature": "hot"}), 400,
                       "temperature")
    assert err["param"] == "temperature"
    assert_error(post(live, url, {"model": MODEL_ID, "messages": msgs, "max_tokens": -1}), 400, "max_tokens")
    assert_error(post(live, url, {"model": MODEL_ID, "messages": msgs, "n": 0}), 400, "'n'")
    assert_error(post(live, url, {"model": MODEL_ID, "messages": msgs, "stop": 5}), 400, "stop")
    assert_error(post(live, url, {"model": MODEL_ID, "messages": "hi"}), 400, "messages")
    assert_error(post(live, url, {"model": MODEL_ID, "messages": [{"role": "user"}]}), 400, "content")
    assert_error(post(live, url, {"model": MODEL_ID, "messages": [{"role": "robot", "content": "x"}]}), 400, "role")
    assert_error(post(live, url, {"model": MODEL_ID, "messages": msgs, "top_logprobs": 3}), 400, "logprobs")
    assert_error(post(live, "/v1/completions", {"model": MODEL_ID, "prompt": ""}), 400, "empty")
    assert_error(post(live, "/v1/completions", {"model": MODEL_ID, "prompt": [10**9]}), 400, "range")
    assert_error(post(live, "/v1/completions", {"model": MODEL_ID, "prompt": {"a": 1}}), 400, "prompt")
    assert_error(post(live, url, {"model": MODEL_ID, "messages": msgs, "max_tokens": 10_000}), 400, "at most")
    assert_error(post(live, url, {"model": MODEL_ID, "messages": msgs, "logit_bias": {"999999999": 1}}), 400,
                 "vocabulary")
    tool = [{"type": "function", "function": {"name": "f"}}]
    assert_error(post(live, url, {"model": MODEL_ID, "messages": msgs, "tools": tool,
                                  "tool_choice": {"type": "function", "function": {"name": "g"}}}), 400, "'g'")
    assert_error(post(live, url, {"model": MODEL_ID, "messages": msgs, "tool_choice": "required"}), 400, "tools")
    # tools on a model whose template cannot render them
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert_error(post(live, url, {"model": MODEL_ID, "messages": msgs, "tools": tools}), 400, "tools")
    # the official client surfaces them as typed exceptions
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL_ID, messages=[])
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=msgs)
    assert "gpt-4o" in str(e.value)
    assert not [k for k in live.metrics() if 'status="5' in k], "a client's mistake must never be a 5xx"


def test_prompt_longer_than_context(live, client):
    long_text = "word " * 800                      # > 512 tokens
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, long_text)
    assert e.value.code == "context_length_exceeded" and "512" in str(e.value)
    r = post(live, "/v1/completions", {"model": MODEL_ID, "prompt": "word " * 400, "max_tokens": 200})
    assert_error(r, 400, "context")


def test_body_size_routes_and_methods(live):
    big = {"model": MODEL_ID, "prompt": "x" * (70 * 1024)}
    assert_error(post(live, "/v1/completions", big), 413, "limit")
    assert_error(httpx.get(live.url + "/v1/nope"), 404)
    assert_error(httpx.get(live.url + "/v1/chat/completions"), 405)
    assert httpx.get(live.url + "/health").status_code == 200      # and the server is alive


# -- auth and the bounded queue -------------------------------------------------------------

@pytest.fixture(scope="module")
def small_live(smollm2_gguf):
    with llambda.load(smollm2_gguf, n_slots=1, n_ctx=512, **LOAD_KW) as m:
        cfg = ServerConfig(model_id=MODEL_ID, parallel=1, queue_size=1, api_key="s3cret")
        with LiveServer(create_app(m, cfg)) as srv:
            yield srv


def test_api_key(small_live):
    body = {"model": MODEL_ID, "prompt": "Hi", "max_tokens": 2}
    assert_error(post(small_live, "/v1/completions", body), 401, "api key")
    assert_error(post(small_live, "/v1/completions", body, headers={"Authorization": "Bearer wrong"}), 401)
    assert_error(httpx.get(small_live.url + "/metrics"), 401)
    with pytest.raises(openai.AuthenticationError):
        small_live.client(api_key="nope").models.list()
    ok = small_live.client(api_key="s3cret").completions.create(model=MODEL_ID, prompt="Hi", max_tokens=2)
    assert ok.usage.completion_tokens >= 1
    assert httpx.get(small_live.url + "/health").status_code == 200     # public


def test_queue_full_gets_429(small_live):
    auth = {"Authorization": "Bearer s3cret"}
    body = {"model": MODEL_ID, "prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True,
            "stream": True}
    with httpx.Client(base_url=small_live.url, headers=auth, timeout=60) as h:
        with h.stream("POST", "/v1/completions", json=body) as running:        # holds the only slot
            lines = running.iter_lines()
            next(lines)
            with h.stream("POST", "/v1/completions", json=body) as queued:     # holds the only queue place
                assert queued.status_code == 200
                r = h.post("/v1/completions", json={**body, "stream": False})
                err = assert_error(r, 429, "busy")
                assert err["type"] == "rate_limit_error" and int(r.headers["retry-after"]) >= 1
        # both streams hung up: the slot and the queue place come back
        t0 = time.monotonic()
        while h.get("/health").json()["slots_processing"] or h.get("/health").json()["queue"]:
            assert time.monotonic() - t0 < 30
            time.sleep(0.05)
        assert h.post("/v1/completions", json={**body, "stream": False, "max_tokens": 2}).status_code == 200


# -- pure units ------------------------------------------------------------------------------

def _parse_in_pieces(text, names, prefix="", parallel=True, seed=0):
    """Feed `text` to a ToolCallParser in random pieces; (content, calls assembled from the deltas)."""
    rng = random.Random(seed)
    p = ToolCallParser(names, prefix, parallel)
    content, calls = [], {}
    pieces = []
    i = 0
    while i < len(text):
        k = rng.randint(1, 5)
        pieces.append(p.feed(text[i:i + k]))
        i += k
    pieces.append(p.finish())
    for piece_content, deltas in pieces:
        content.append(piece_content)
        for d in deltas:
            if d["index"] not in calls:      # the first delta of a call announces it
                assert d["id"].startswith("call_") and d["type"] == "function" and d["function"]["name"]
                calls[d["index"]] = {"name": d["function"]["name"], "arguments": ""}
            else:
                assert "id" not in d and "name" not in d["function"], "only argument pieces after the first"
            calls[d["index"]]["arguments"] += d["function"].get("arguments", "")
    assert sorted(calls) == list(range(len(calls)))
    return "".join(content), [calls[k] for k in sorted(calls)]


def test_tool_call_parser_streams_calls_as_deltas():
    names = {"get_weather", "get_time"}
    weather = {"city": "Pa}ris \"{"}           # braces and quotes inside strings do not end the arguments
    cases = [
        # (model output, content, [(name, arguments)])
        ('Sure. <tool_call>\n{"name": "get_weather", "arguments": ' + json.dumps(weather) + '}\n</tool_call>',
         "Sure. ", [("get_weather", weather)]),
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
         '<tool_call>\n{"name": "get_time", "arguments": {"city": "Lima", "tz": [1, {"a": 2}]}}\n</tool_call>',
         "", [("get_weather", {"city": "Oslo"}), ("get_time", {"city": "Lima", "tz": [1, {"a": 2}]})]),
        # a bare JSON call (small Qwen models drop the tags), also in a fence
        ('{"name": "get_weather", "arguments": {"city": "Oslo"}}', "", [("get_weather", {"city": "Oslo"})]),
        ('```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Oslo"\n  }\n}\n```', "",
         [("get_weather", {"city": "Oslo"})]),
        # keys in the other order, or arguments as a string: parsed whole at the closing tag
        ('<tool_call>{"arguments": {"city": "X"}, "name": "get_time"}</tool_call>', "", [("get_time", {"city": "X"})]),
        ('<tool_call>{"name": "get_time", "arguments": "{\\"city\\": \\"X\\"}"}</tool_call>', "",
         [("get_time", {"city": "X"})]),
        # not calls: stays content, every character of it
        ('{"name": "Bob", "age": 3}', '{"name": "Bob", "age": 3}', []),
        ('a <toy> b', 'a <toy> b', []),
        ('<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>', '<tool_call>{"name": "rm_rf", "arguments": {}}'
         '</tool_call>', []),
        ("```python\nprint(1)\n```", "```python\nprint(1)\n```", []),
    ]
    for seed in range(3):
        for text, content, want in cases:
            got_content, calls = _parse_in_pieces(text, names, seed=seed)
            assert got_content == content, text
            assert [(c["name"], json.loads(c["arguments"])) for c in calls] == want, text
            whole_content, whole_calls = extract_tool_calls(text, names)
            assert whole_content == (content.strip() if want else content)
            assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in whole_calls] == want


def test_tool_call_parser_forced_choice_and_parallel_off():
    names = {"get_weather", "get_time"}
    forced = hermes_prefix("get_time")
    # the model continues the call we started; the prefix is never content
    content, calls = _parse_in_pieces(' {"city": "Rome"}}\n</tool_call>', {"get_time"}, prefix=forced)
    assert content == "" and calls == [{"name": "get_time", "arguments": '{"city": "Rome"}'}]
    content, calls = extract_tool_calls('get_weather", "arguments": {"city": "Rome"}}', names,
                                        prefix=hermes_prefix("required"))
    assert content == "" and calls[0]["function"]["name"] == "get_weather"
    # no valid call made of it (a number as arguments, a name not allowed): the text comes back whole
    for prefix, text in ((forced, "1}"), (hermes_prefix("required"), 'nope", "arguments": {}}')):
        content, calls = extract_tool_calls(text, names, prefix=prefix)
        assert calls == [] and content == prefix + text
    # cut short by max_tokens: streaming has sent the call's start; the whole answer is text
    cut = '<tool_call>{"name": "get_time", "arguments": {"city": "Ro'
    assert _parse_in_pieces(cut, names)[1] == [{"name": "get_time", "arguments": '{"city": "Ro'}]
    assert extract_tool_calls(cut, names) == (cut, [])
    # parallel_tool_calls false: the first call only
    two = ('<tool_call>{"name": "get_time", "arguments": {}}</tool_call>\n'
           '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>')
    assert [c["name"] for c in _parse_in_pieces(two, names, parallel=False)[1]] == ["get_time"]
    assert [c["function"]["name"] for c in extract_tool_calls(two, names, parallel=False)[1]] == ["get_time"]
    assert len(extract_tool_calls(two, names)[1]) == 2


def test_tool_call_parser_fuzz_loses_no_text():
    """Random mixes of the pieces calls are made of: the parser never raises, and whatever is not a
    call comes back as content, character for character."""
    names = {"f", "get_time"}
    parts = ["<tool_call>", "</tool_call>", "<tool", "_call>", "{", "}", "[", "]", '"', "\\", ":", ",", " ", "\n",
             '"name"', '"arguments"', '"f"', '"get_time"', '"x"', "```", "```json\n", "json", "1", "null", "text"]
    rng = random.Random(1234)
    for trial in range(400):
        text = "".join(rng.choice(parts) for _ in range(rng.randint(0, 30)))
        if rng.random() < 0.3:
            text = '<tool_call>{"name": "f", "arguments": ' + text
        content, calls = _parse_in_pieces(text, names, seed=trial)
        whole, whole_calls = extract_tool_calls(text, names)
        if not whole_calls:
            assert whole == text
        if not calls:
            assert content == text, (text, content)
        assert all(c["name"] in names for c in calls)


def test_schema_validation_units():
    from llambda.server.errors import APIError
    from llambda.server.schemas import parse_chat, parse_completion
    msgs = [{"role": "user", "content": "hi"}]
    spec = parse_chat({"messages": msgs, "max_completion_tokens": 7, "stop": "x", "seed": -1,
                       "logit_bias": {"42": -100}, "top_k": 5, "min_p": 0.1, "n": 3})
    assert spec.max_tokens == 7 and spec.stop == ["x"] and spec.n == 3
    assert spec.sampling["seed"] == 2**64 - 1 and spec.sampling["logit_bias"] == {42: -100.0}
    assert spec.sampling["top_k"] == 5 and spec.sampling["temperature"] == 1.0
    bad = [
        ({"messages": msgs, "tool_choice": "required"}, "tool_choice"),
        ({"messages": msgs, "tool_choice": "any"}, "tool_choice"),
        ({"messages": msgs, "tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
        ({"messages": msgs, "tool_choice": {"type": "function"}}, "tool_choice"),
        ({"messages": msgs, "parallel_tool_calls": 1}, "parallel_tool_calls"),
        ({"messages": msgs, "response_format": {"type": "json_object"}}, "response_format"),
        ({"messages": msgs, "best_of": 2}, "best_of"),
        ({"messages": msgs, "temperature": True}, "temperature"),
        ({"messages": msgs, "top_p": 0}, "top_p"),
        ({"messages": msgs, "logit_bias": {"x": 1}}, "logit_bias"),
        ({"messages": msgs, "max_tokens": 5, "max_completion_tokens": 6}, "max_completion_tokens"),
        ({"messages": msgs, "tools": [{"type": "function", "function": {}}]}, "tools"),
        ({"messages": msgs, "stop": ["a"] * 17}, "stop"),
    ]
    for body, param in bad:
        with pytest.raises(APIError) as e:
            parse_chat(body)
        assert e.value.status == 400 and param in e.value.message, (body, e.value.message)
    with pytest.raises(APIError):
        parse_completion({"prompt": "x", "suffix": "y"})
    with pytest.raises(APIError):
        parse_completion({"prompt": [[1, 2], []]})
    assert parse_completion({"prompt": [[1, 2], "a"], "logprobs": 0}).prompts == [[1, 2], "a"]


# -- tools with a Qwen template ---------------------------------------------------------------

QWEN_TOOLS = [{"type": "function", "function": {
    "name": name, "description": desc,
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    for name, desc in (("get_weather", "Get the current weather in a city"),
                       ("get_time", "Get the local time in a city"))]


def _stream_tool_calls(client, **kw):
    """(content, calls, finish) of a streamed chat; checks the deltas' OpenAI shape on the way."""
    content, calls, finish = [], {}, None
    for ch in client.chat.completions.create(stream=True, **kw):
        c = ch.choices[0]
        content.append(c.delta.content or "")
        for d in c.delta.tool_calls or []:
            if d.index not in calls:       # first delta: id, type and name; then argument pieces only
                assert d.id and d.type == "function" and d.function.name
                calls[d.index] = {"name": d.function.name, "arguments": d.function.arguments or ""}
            else:
                assert d.id is None and d.function.name is None
                calls[d.index]["arguments"] += d.function.arguments or ""
        finish = c.finish_reason or finish
    return "".join(content), [calls[k] for k in sorted(calls)], finish


def test_tools_with_qwen(qwen05_gguf):
    messages = [{"role": "user", "content": "What is the weather in Paris right now?"}]
    names = {"get_weather", "get_time"}
    with llambda.load(qwen05_gguf, n_slots=1, n_ctx=1024, **LOAD_KW) as m:
        with LiveServer(create_app(m, ServerConfig(model_id="qwen", parallel=1))) as srv:
            c = srv.client()
            kw = dict(model="qwen", messages=messages, tools=QWEN_TOOLS, max_tokens=30, temperature=0)
            r = c.chat.completions.create(**kw)
            choice = r.choices[0]
            assert choice.finish_reason == "tool_calls", choice.message.content
            call = choice.message.tool_calls[0]
            assert call.type == "function" and call.function.name == "get_weather"
            assert json.loads(call.function.arguments)["city"] == "Paris"
            # streamed: an announcing delta, then argument pieces; none of the call's text as content
            content, calls, finish = _stream_tool_calls(c, **kw)
            assert finish == "tool_calls" and "<tool_call>" not in content and "{" not in content
            assert calls[0]["name"] == "get_weather" and json.loads(calls[0]["arguments"])["city"] == "Paris"

            # a forced function: the answer is started as that call; streamed the same way
            forced = {"type": "function", "function": {"name": "get_time"}}
            r = c.chat.completions.create(**kw, tool_choice=forced, parallel_tool_calls=False)
            assert r.choices[0].finish_reason == "tool_calls"
            assert [t.function.name for t in r.choices[0].message.tool_calls] == ["get_time"]
            assert isinstance(json.loads(r.choices[0].message.tool_calls[0].function.arguments), dict)
            content, calls, finish = _stream_tool_calls(c, **dict(kw, max_tokens=12), tool_choice=forced)
            assert [x["name"] for x in calls] == ["get_time"] and not content.strip()
            assert finish == ("tool_calls" if calls[0]["arguments"].endswith("}") else "length")

            # required, on a question no tool answers: a call to some offered tool, or (the model
            # failing to make one) its text with finish_reason "stop"; never an error
            hello = dict(kw, messages=[{"role": "user", "content": "Hello! How are you?"}])
            r = c.chat.completions.create(**hello, tool_choice="required")
            ch = r.choices[0]
            if ch.finish_reason == "tool_calls":
                assert {t.function.name for t in ch.message.tool_calls} <= names
            else:
                assert ch.finish_reason in ("stop", "length") and ch.message.content

            # none: the model is not told about tools and nothing is parsed
            r_none = c.chat.completions.create(**dict(kw, max_tokens=4), tool_choice="none")
            assert r_none.choices[0].message.tool_calls is None
            assert r_none.usage.prompt_tokens < r.usage.prompt_tokens - 50      # no tool list in the prompt

            # a forced function that is not offered is the client's mistake
            with pytest.raises(openai.BadRequestError) as e:
                c.chat.completions.create(**kw, tool_choice={"type": "function", "function": {"name": "rm"}})
            assert "rm" in str(e.value) and e.value.status_code == 400

            # the tool result goes back through the template
            follow = messages + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                                 {"role": "tool", "tool_call_id": call.id, "content": "{\"temp_c\": 18}"}]
            r2 = c.chat.completions.create(model="qwen", messages=follow, tools=QWEN_TOOLS, max_tokens=8,
                                           temperature=0)
            assert r2.choices[0].message.content


# -- a real process: load, memory, SIGTERM ----------------------------------------------------------

def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


class ServerProcess:
    """`llambda serve` in a child process (its own RSS, real signals); output goes to a log file."""

    def __init__(self, model_path, log_path: Path, *flags: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [sys.executable, "-m", "llambda.cli", "serve", "-m", str(model_path), "--port", str(self.port),
                    "--log-level", "warning", *flags]
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    def __enter__(self):
        env = dict(os.environ, PYTHONPATH=str(Path(llambda.__file__).parent.parent))
        self._log = open(self.log_path, "w")
        # a file, not a pipe: nobody reads a pipe while the test runs, and a full one would block the server
        self.proc = subprocess.Popen(self.cmd, env=env, stdout=self._log, stderr=subprocess.STDOUT, text=True)
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
        self.model_id = httpx.get(self.url + "/v1/models").json()["data"][0]["id"]
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
