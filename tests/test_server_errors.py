"""Client mistakes and limits on a live server: OpenAI error objects with a 4xx naming the field,
body size, routes, API key, the bounded queue (429), and the request schema as units."""
from __future__ import annotations

import time

import httpx
import openai
import pytest

import llambda
from llambda.server import ServerConfig, create_app
from serverkit import LOAD_KW, MODEL_ID, LiveServer, assert_error, chat, post

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
    # a tool whose parameters no grammar can follow (tools on SmolLM2, whose template has none,
    # go through the generic tool prompt: tests/test_server_constrained.py)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}]
    assert_error(post(live, url, {"model": MODEL_ID, "messages": msgs, "tools": tools}), 400, "tools", "objekt")
    # the official client surfaces them as typed exceptions
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL_ID, messages=[])
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=msgs)
    assert "gpt-4o" in str(e.value)
    assert not [k for k in live.metrics() if 'status="5' in k], "a client's mistake must never be a 5xx"


def test_malformed_messages_with_tools_are_400(live):
    """SmolLM2's template knows no tools, so tools go through the generic tool prompt, which rewrote
    the messages before anything checked them: a bad content part or tool call was a 500."""
    user = {"role": "user", "content": "hi"}
    tools = [{"type": "function", "function": {"name": "f"}}]
    cases = [([{"role": "system", "content": [{"type": "text", "text": 5}]}, user], "text"),
             ([user, {"role": "assistant", "content": None, "tool_calls": [1]}], "tool_calls[0]"),
             ([user, {"role": "assistant", "content": None, "tool_calls": "x"}], "tool_calls"),
             ([user, {"role": "assistant", "content": None, "tool_calls": [{"function": "x"}]}], "function"),
             ([user, {"role": "tool", "content": {"a": 1}}], "content"),
             ([{"role": "system", "content": 5}, user], "content")]
    for msgs, word in cases:
        err = assert_error(post(live, "/v1/chat/completions",
                                {"model": MODEL_ID, "messages": msgs, "tools": tools, "max_tokens": 2}), 400, word)
        assert err["param"] == "messages", err
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
    # a compressed body is refused by its header (read as it came it was "not UTF-8 text": a wrong cause)
    import gzip
    import json
    packed = gzip.compress(json.dumps({"model": MODEL_ID, "prompt": "Hi", "max_tokens": 2}).encode())
    for coding in ("gzip", "br", "deflate, gzip"):
        err = assert_error(post(live, "/v1/completions", content=packed, headers={"content-encoding": coding,
                                                                                 "content-type": "application/json"}),
                           415, "content-encoding", "uncompressed")
        assert err["code"] == "unsupported_media_type"
    assert post(live, "/v1/completions", {"model": MODEL_ID, "prompt": "Hi", "max_tokens": 1},
                headers={"content-encoding": "identity"}).status_code == 200



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



# -- the request schema ---------------------------------------------------------------------

def test_schema_validation_units():
    from llambda.server.errors import APIError
    from llambda.server.schemas import parse_chat, parse_completion
    msgs = [{"role": "user", "content": "hi"}]
    spec = parse_chat({"messages": msgs, "max_completion_tokens": 7, "stop": "x", "seed": -1,
                       "logit_bias": {"42": -100}, "top_k": 5, "min_p": 0.1, "n": 3})
    assert spec.max_tokens == 7 and spec.stop == ["x"] and spec.n == 3
    # -1 asks for a random seed (llama-server's, Ollama's and the library's convention); other negatives wrap
    assert spec.sampling["seed"] is None and spec.sampling["logit_bias"] == {42: -100.0}
    assert parse_chat({"messages": msgs, "seed": -2}).sampling["seed"] == 2**64 - 2
    assert spec.sampling["top_k"] == 5 and spec.sampling["temperature"] == 1.0
    bad = [
        ({"messages": msgs, "tool_choice": "required"}, "tool_choice"),
        ({"messages": msgs, "tool_choice": "any"}, "tool_choice"),
        ({"messages": msgs, "tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
        ({"messages": msgs, "tool_choice": {"type": "function"}}, "tool_choice"),
        ({"messages": msgs, "parallel_tool_calls": 1}, "parallel_tool_calls"),
        ({"messages": msgs, "response_format": {"type": "xml"}}, "response_format"),
        ({"messages": msgs, "response_format": {"type": "json_schema"}}, "response_format"),
        ({"messages": msgs, "json_schema": {"type": "object"}, "grammar": "root ::= \"a\""}, "at most one"),
        ({"messages": msgs, "grammar": 5}, "grammar"),
        ({"messages": msgs, "best_of": 2}, "best_of"),
        ({"messages": msgs, "temperature": True}, "temperature"),
        ({"messages": msgs, "top_p": 0}, "top_p"),
        ({"messages": msgs, "logit_bias": {"x": 1}}, "logit_bias"),
        ({"messages": msgs, "max_tokens": 5, "max_completion_tokens": 6}, "max_completion_tokens"),
        ({"messages": msgs, "tools": [{"type": "function", "function": {}}]}, "tools"),
        # arguments that are not an object: forced calls came back as text, with no tool_calls
        ({"messages": msgs, "tools": [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "string"}}}], "tool_choice": "required"}, "must describe an object"),
        ({"messages": msgs, "tools": [{"type": "function", "function": {"name": "f"}},
                                      {"type": "function", "function": {"name": "f", "parameters": {}}}]},
         "tools[1].function.name 'f' is taken"),
        ({"messages": msgs, "stop": ["a"] * 17}, "stop"),
    ]
    for body, param in bad:
        with pytest.raises(APIError) as e:
            parse_chat(body)
        assert e.value.status == 400 and param in e.value.message, (body, e.value.message)
    # fill-in-the-middle takes text (the FIM tokens come with the model, see test_server_endpoints.py)
    assert parse_completion({"prompt": "x", "suffix": "y"}).suffix == "y"
    with pytest.raises(APIError):
        parse_completion({"prompt": [1, 2], "suffix": "y"})
    with pytest.raises(APIError):
        parse_completion({"prompt": [[1, 2], []]})
    assert parse_completion({"prompt": [[1, 2], "a"], "logprobs": 0}).prompts == [[1, 2], "a"]


def test_stream_options_need_a_stream():
    """OpenAI refuses stream_options on a request that does not stream (a 400 naming the field); they
    were taken and ignored here."""
    from llambda.server.errors import APIError
    from llambda.server.schemas import parse_chat, parse_completion
    msgs = [{"role": "user", "content": "hi"}]
    opts = {"include_usage": True}
    for parse, body in ((parse_chat, {"messages": msgs}), (parse_completion, {"prompt": "hi"})):
        for stream in ({}, {"stream": False}):
            with pytest.raises(APIError) as e:
                parse({**body, **stream, "stream_options": opts})
            assert e.value.status == 400 and e.value.param == "stream_options", e.value.message
            assert "stream" in e.value.message
        assert parse({**body, "stream": True, "stream_options": opts}).include_usage
        assert not parse({**body, "stream": False, "stream_options": None}).include_usage


def test_message_ids_and_names_are_strings():
    """A message's tool_call_id and name reach the chat template as they are: a number, an object or a
    list was taken (and rendered into the prompt); now a 400 naming the field. Null is refused where the
    role requires the field (a tool message's tool_call_id, a function message's name)."""
    from llambda.server.errors import APIError
    from llambda.server.schemas import parse_chat
    user = {"role": "user", "content": "hi"}
    call = {"role": "assistant", "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    for key, role, value in (("tool_call_id", "tool", 5), ("tool_call_id", "tool", {"id": "c1"}),
                             ("tool_call_id", "tool", ["c1"]), ("tool_call_id", "tool", None),
                             ("tool_call_id", "user", 1.5), ("name", "user", 7), ("name", "tool", ["f"]),
                             ("name", "function", None), ("name", "assistant", True)):
        msgs = [user, call, {"role": role, "content": "18 C", key: value}]
        with pytest.raises(APIError) as e:
            parse_chat({"messages": msgs})
        assert e.value.status == 400 and e.value.param == f"messages[2].{key}", (key, role, value, e.value.message)
        assert f"messages[2].{key} must be a string" in e.value.message
    # strings, a null name where no role needs one, a tool message without an id: taken as before
    for extra in ({"tool_call_id": "c1", "name": "f"}, {"name": None}, {}):
        assert parse_chat({"messages": [user, call, {"role": "tool", "content": "18 C", **extra}]}).messages
    assert parse_chat({"messages": [{**user, "name": "ann", "tool_call_id": None}]}).messages


def test_text_to_tokenize_is_capped_per_request():
    """Tokenizing holds a few hundred bytes a character (a 4 MB /tokenize with pieces took 1.3 GB, six at
    once 8 GB): a request's text to tokenize is capped as a rendered chat prompt is, a 400 naming the field."""
    from llambda.server.embeddings_api import parse_input
    from llambda.server.errors import APIError
    from llambda.server.llama_api import parse_infill, tokenize
    from llambda.server.schemas import MAX_TEXT_CHARS, parse_completion
    half = "ab" * (MAX_TEXT_CHARS // 4)           # MAX_TEXT_CHARS / 2 characters
    assert parse_completion({"prompt": [half, half]}).prompts == [half, half]     # at the cap: fine
    cases = [(lambda: parse_completion({"prompt": half + half + "x"}), "prompt"),
             (lambda: parse_completion({"prompt": [half, [1, 2], half, "x"]}), "prompt"),
             (lambda: tokenize(None, {"content": half * 3}), "content"),
             (lambda: parse_input([half, half, "x"]), "input"),
             (lambda: parse_infill({"input_prefix": half, "input_suffix": half,
                                    "input_extra": [{"filename": "a", "text": "x"}]}), "input_prefix")]
    for call, param in cases:
        with pytest.raises(APIError) as e:
            call()
        assert e.value.status == 400 and param in e.value.message and str(MAX_TEXT_CHARS) in e.value.message


def test_logprobs_on_a_model_without_a_tokenizer_is_a_400():
    """A checkpoint with no tokenizer serves token ids, but logprobs need each token's text: a 400
    naming the field, before any work (it was a 500 from inside the response)."""
    from pathlib import Path
    tiny = Path(__file__).parent / "fixtures" / "reference" / "tiny" / "qwen3"
    with llambda.load(tiny, n_ctx=64, n_slots=1) as model:
        assert model.tokenizer is None
        with LiveServer(create_app(model, ServerConfig(model_id="tiny", parallel=1))) as srv:
            for body in (dict(prompt=[1, 2, 3], logprobs=2), dict(prompt=[1, 2, 3], echo=True, logprobs=0)):
                assert_error(post(srv, "/v1/completions", dict(model="tiny", max_tokens=2, **body)), 400, "tokenizer")
            r = post(srv, "/v1/completions", dict(model="tiny", prompt=[1, 2, 3], max_tokens=2))
            assert r.status_code == 200, r.text
            # /v1/responses has no 'logprobs' field: the error named one (its include asks for them)
            for stream in (False, True):
                err = assert_error(post(srv, "/v1/responses", dict(
                    model="tiny", input="Hi", stream=stream, include=["message.output_text.logprobs"])), 400, "tokenizer")
                assert err["param"] == "include" and "'include' asks for logprobs" in err["message"], err


def test_a_model_closed_while_served_answers_503(smollm2_gguf):
    """Model.close() by the program serving it (the library allows it: a generation still open then
    stops): running streams ended with a 500 "internal error in the model step" and a stack trace,
    /health said 200 "ok", and every later request was a 500 with another stack trace in the log.
    Now the streams end with a 503 saying the model was closed, /health is 503 and requests 503."""
    import threading

    with llambda.load(smollm2_gguf, n_slots=2, n_ctx=512, **LOAD_KW) as m:
        with LiveServer(create_app(m, ServerConfig(model_id=MODEL_ID, parallel=2))) as srv:
            lines, started = [], threading.Event()

            def stream():
                body = {"model": MODEL_ID, "messages": [{"role": "user", "content": "A story."}], "max_tokens": 400,
                        "ignore_eos": True, "stream": True}
                with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body, timeout=60) as s:
                    for line in s.iter_lines():
                        lines.append(line)
                        started.set()

            t = threading.Thread(target=stream)
            t.start()
            assert started.wait(30)
            m.close()
            t.join(60)
            assert not t.is_alive()
            errors = [line for line in lines if '"error"' in line]
            assert errors and "closed" in errors[-1] and "internal" not in errors[-1], lines[-3:]
            r = httpx.get(srv.url + "/health", timeout=30)
            assert r.status_code == 503 and "closed" in r.json()["reason"], r.text
            for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                               ("/v1/completions", {"prompt": "hi"}), ("/v1/embeddings", {"input": "hi"})):
                err = assert_error(post(srv, path, {"model": MODEL_ID, "max_tokens": 2, **body}), 503, "closed")
                assert err["code"] == "model_closed"
            assert post(srv, "/api/chat", {"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}],
                                           "stream": False}).status_code == 503
            assert not [k for k in srv.metrics() if 'status="500"' in k]
