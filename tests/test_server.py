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
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
import uvicorn

import llambda
from llambda.server import ServerConfig, create_app
from llambda.server.tools import ToolCallFilter, extract_tool_calls

MODEL_ID = "smollm2"
LOAD_KW = {"activations": os.environ["LLAMBDA_TEST_ACTIVATIONS"]} if os.environ.get("LLAMBDA_TEST_ACTIVATIONS") else {}
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
    c = client.completions.create(model=MODEL_ID, prompt="One, two,", max_tokens=5, temperature=0, logprobs=2)
    lp = c.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == c.usage.completion_tokens
    assert "".join(lp.tokens) == c.choices[0].text
    assert lp.text_offset[0] == 0 and all(len(d) == 2 for d in lp.top_logprobs)


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

@pytest.mark.xfail(reason="known gap (issue 5): matmuls are batch-invariant in the server (set_batch_invariant), "
                          "but attention's prefill tiles / split-K decode still round differently with the batch "
                          "composition, which can flip a near-tie greedy token", strict=False)
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


def test_load_with_disconnects_leaves_server_idle(live, client):
    """40 requests from 8 clients, some hanging up mid-stream: all others succeed, no slot leaks."""
    def work(i):
        body = {"model": MODEL_ID, "messages": [{"role": "user", "content": PROMPTS[i % 8]}],
                "max_tokens": 24 if i % 5 else 200, "temperature": 0.8, "seed": i}
        if i % 5 == 0:                      # disconnect after a few chunks
            body["stream"] = True
            body["extra"] = "ignored"
            with httpx.stream("POST", live.url + "/v1/chat/completions", json=body, timeout=60) as r:
                assert r.status_code == 200
                for n, _ in enumerate(r.iter_lines()):
                    if n >= 6:
                        break
            return "hung up"
        if i % 5 == 1:                      # a non-streaming client that gives up
            try:
                httpx.post(live.url + "/v1/chat/completions", json={**body, "max_tokens": 200}, timeout=0.3)
            except httpx.TimeoutException:
                return "hung up"
            return "ok"
        if i % 2:
            r = post(live, "/v1/chat/completions", body)
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["finish_reason"] in ("stop", "length")
            return "ok"
        text = "".join(ch.choices[0].delta.content or "" for ch in
                       client.chat.completions.create(stream=True, **{k: v for k, v in body.items()
                                                                       if k != "model"}, model=MODEL_ID)
                       if ch.choices)
        return "ok" if isinstance(text, str) else "bad"

    with cf.ThreadPoolExecutor(8) as ex:
        results = list(ex.map(work, range(40)))
    assert set(results) <= {"ok", "hung up"}
    m = live.wait_idle()
    assert m["llambda_requests_in_flight"] == 1          # this /metrics request
    assert m['llambda_sequences_finished_total{reason="cancelled"}'] >= 1
    assert m.get('llambda_requests_total{endpoint="/v1/chat/completions",status="500"}', 0) == 0


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
    # tools on a model whose template cannot render them
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert_error(post(live, url, {"model": MODEL_ID, "messages": msgs, "tools": tools}), 400, "tools")
    # the official client surfaces them as typed exceptions
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL_ID, messages=[])
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=msgs)
    assert "gpt-4o" in str(e.value)


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

def test_tool_call_filter_holds_back_the_call():
    names = {"get_weather"}
    f = ToolCallFilter(names)
    out = f.feed("Sure. <tool") + f.feed("_call>\n{\"name\": \"get_weather\", ")
    out += f.feed("\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>")
    rest, calls = f.finish()
    assert out == "Sure. " and rest == ""
    assert calls[0]["function"]["name"] == "get_weather"
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}
    g = ToolCallFilter(names)
    assert g.feed("a <to") == "a " and g.feed("y>") == "<toy>" and g.finish() == ("", [])
    # a bare JSON call (small Qwen models drop the tags), also in a fence
    for text in ('{"name": "get_weather", "arguments": {"city": "Oslo"}}',
                 '```json\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n```'):
        h = ToolCallFilter(names)
        assert "".join(h.feed(c) for c in text) == ""
        rest, calls = h.finish()
        assert rest == "" and json.loads(calls[0]["function"]["arguments"]) == {"city": "Oslo"}
    # JSON that names no offered tool stays content
    plain = '{"name": "Bob", "age": 3}'
    h = ToolCallFilter(names)
    assert h.feed(plain) == "" and h.finish() == (plain, [])
    assert extract_tool_calls(plain, names) == (plain, [])


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

def test_tools_with_qwen(qwen05_gguf):
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    messages = [{"role": "user", "content": "What is the weather in Paris right now?"}]
    with llambda.load(qwen05_gguf, n_slots=1, n_ctx=1024, **LOAD_KW) as m:
        with LiveServer(create_app(m, ServerConfig(model_id="qwen", parallel=1))) as srv:
            c = srv.client()
            r = c.chat.completions.create(model="qwen", messages=messages, tools=tools, max_tokens=40,
                                          temperature=0)
            choice = r.choices[0]
            assert choice.finish_reason == "tool_calls", choice.message.content
            call = choice.message.tool_calls[0]
            assert call.type == "function" and call.function.name == "get_weather"
            assert json.loads(call.function.arguments)["city"] == "Paris"
            # streamed: the same call arrives as a tool_calls delta, none of its text as content
            calls, content, finish = [], [], None
            for ch in c.chat.completions.create(model="qwen", messages=messages, tools=tools, max_tokens=40,
                                                temperature=0, stream=True):
                d = ch.choices[0].delta
                content.append(d.content or "")
                calls.extend(d.tool_calls or [])
                finish = ch.choices[0].finish_reason or finish
            assert finish == "tool_calls" and "<tool_call>" not in "".join(content)
            assert calls[0].function.name == "get_weather"
            # the tool result goes back through the template
            follow = messages + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                                 {"role": "tool", "tool_call_id": call.id, "content": "{\"temp_c\": 18}"}]
            r2 = c.chat.completions.create(model="qwen", messages=follow, tools=tools, max_tokens=8,
                                           temperature=0)
            assert r2.choices[0].message.content


# -- a real process: SIGTERM and memory ----------------------------------------------------------

def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_subprocess_memory_flat_and_sigterm_graceful(smollm2_gguf, tmp_path):
    port = free_port()
    cmd = [sys.executable, "-m", "llambda.cli", "serve", "-m", str(smollm2_gguf), "--port", str(port),
           "--parallel", "4", "-c", "512", "--shutdown-grace", "20", "--log-level", "warning"]
    env = dict(os.environ, PYTHONPATH=str(Path(llambda.__file__).parent.parent))
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        t0 = time.monotonic()
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() - t0 < 120
            time.sleep(0.1)
        models = httpx.get(url + "/v1/models").json()
        model_id = models["data"][0]["id"]

        def burst(k):
            def one(i):
                body = {"model": model_id, "prompt": PROMPTS[i % 8], "max_tokens": 8, "temperature": 0.9,
                        "seed": i, "stream": bool(i % 2)}
                r = httpx.post(url + "/v1/completions", json=body, timeout=120)
                assert r.status_code == 200, r.text
            with cf.ThreadPoolExecutor(4) as ex:
                list(ex.map(one, range(k)))

        burst(24)                                    # warm-up: caches, allocator pools
        rss_warm = _rss_kib(proc.pid)
        burst(24)
        burst(24)
        rss_after = _rss_kib(proc.pid)
        assert rss_after - rss_warm < 24 * 1024, f"RSS grew {rss_after - rss_warm} KiB over 48 requests"

        # SIGTERM while a stream runs: the stream still completes, then the process exits 0
        body = {"model": model_id, "prompt": "Once upon a time", "max_tokens": 24, "ignore_eos": True,
                "stream": True, "temperature": 0}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
            lines = r.iter_lines()
            first = next(ln for ln in lines if ln)
            assert first.startswith("data: ")
            proc.send_signal(signal.SIGTERM)
            rest = [ln for ln in lines if ln]
        assert rest[-1] == "data: [DONE]"
        final = json.loads(rest[-2][6:])
        assert final["choices"][0]["finish_reason"] == "length"
        assert proc.wait(60) == 0
        with pytest.raises(httpx.TransportError):
            httpx.get(url + "/health", timeout=2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sigterm_cancels_streams_after_grace(smollm2_gguf):
    port = free_port()
    cmd = [sys.executable, "-m", "llambda.cli", "serve", "-m", str(smollm2_gguf), "--port", str(port),
           "--parallel", "1", "-c", "4096", "--shutdown-grace", "0.5", "--log-level", "warning"]
    env = dict(os.environ, PYTHONPATH=str(Path(llambda.__file__).parent.parent))
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        t0 = time.monotonic()
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() - t0 < 120
            time.sleep(0.1)
        body = {"prompt": "Once upon a time", "max_tokens": 4000, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
            lines = r.iter_lines()
            next(ln for ln in lines if ln)
            proc.send_signal(signal.SIGTERM)
            rest = [ln for ln in lines if ln]
        assert rest[-1] == "data: [DONE]"
        err = json.loads(rest[-2][6:])["error"]
        assert "shutting down" in err["message"]
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
