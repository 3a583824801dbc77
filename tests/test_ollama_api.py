"""Ollama's API (/api/chat, /api/generate, /api/embed, the listings) on a live loopback server, driven by
the official `ollama` client and by raw httpx for the newline-delimited JSON framing: answers equal
the OpenAI routes' for the same prompt and options, options map onto sampling, format constrains,
tools round-trip (Qwen2.5-Coder), errors are `{"error": ...}`, a stream ends with its error line."""
from __future__ import annotations

import json
import logging

import httpx
import jsonschema
import ollama
import pytest

from llambda.server import ServerConfig, anthropic_api, create_app, ollama_api
from serverkit import MODEL_ID, LiveServer, assert_error, hang_up_mid_stream, post, serving

QUESTION = "What is the capital of France?"
GREEDY = {"temperature": 0, "num_predict": 12}
# in the key order the ollama client sends a tool in (its model puts `required` before `properties`):
# the template renders the tools as JSON, so the OpenAI route gets the same prompt only from the same order
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def oclient(live):
    return ollama.Client(host=live.url, timeout=120)


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def _error(resp, status: int, *words) -> str:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert list(body) == ["error"] and isinstance(body["error"], str), body
    for w in words:
        assert w.lower() in body["error"].lower(), body
    return body["error"]


def _lines(live, path: str, body: dict) -> tuple[httpx.Response, list[dict]]:
    with httpx.stream("POST", live.url + path, json=body, timeout=120) as r:
        lines = [json.loads(line) for line in r.iter_lines() if line]
    return r, lines


def _check_done(obj: dict, reason: str) -> None:
    assert obj["done"] is True and obj["done_reason"] == reason
    for k in ("total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration", "eval_count",
              "eval_duration"):
        assert isinstance(obj[k], int) and obj[k] >= 0, (k, obj)


# -- chat and generate against the OpenAI routes ---------------------------------------------

def test_chat_is_the_openai_answer(oclient, client):
    messages = [{"role": "system", "content": "Be brief."}] + _user(QUESTION)
    r = oclient.chat(model=MODEL_ID, messages=messages, options=GREEDY, stream=False)
    want = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=12, temperature=0)
    assert r.message.role == "assistant" and r.message.content == want.choices[0].message.content
    assert r.model == MODEL_ID and r.done and r.message.tool_calls is None
    assert r.done_reason == want.choices[0].finish_reason       # "stop" or "length", both Ollama's words
    assert r.prompt_eval_count == want.usage.prompt_tokens and r.eval_count == want.usage.completion_tokens

    # streamed: the pieces add up to the same text; the last chunk is the done one
    chunks = list(oclient.chat(model=f"{MODEL_ID}:latest", messages=messages, options=GREEDY, stream=True))
    assert len(chunks) >= 3 and all(not c.done for c in chunks[:-1]) and chunks[-1].done
    assert "".join(c.message.content for c in chunks) == r.message.content
    assert chunks[-1].eval_count == r.eval_count and chunks[-1].done_reason == r.done_reason


def test_ndjson_framing(live):
    r, lines = _lines(live, "/api/chat", {"model": MODEL_ID, "messages": _user(QUESTION), "options": GREEDY})
    assert r.status_code == 200 and r.headers["content-type"] == "application/x-ndjson"    # streams by default
    assert all(line["done"] is False and line["model"] == MODEL_ID and line["created_at"].endswith("Z")
               for line in lines[:-1])
    assert [line["message"]["role"] for line in lines] == ["assistant"] * len(lines)
    _check_done(lines[-1], lines[-1]["done_reason"])
    assert lines[-1]["message"]["content"] == "" and len(lines) >= 3
    whole = post(live, "/api/chat", {"model": MODEL_ID, "messages": _user(QUESTION), "options": GREEDY,
                                     "stream": False})
    assert whole.headers["content-type"] == "application/json"
    assert whole.json()["message"]["content"] == "".join(line["message"]["content"] for line in lines)
    _check_done(whole.json(), lines[-1]["done_reason"])


def test_generate_is_the_chat_or_the_completion(oclient, client):
    r = oclient.generate(model=MODEL_ID, prompt=QUESTION, system="Be brief.", options=GREEDY, stream=False)
    messages = [{"role": "system", "content": "Be brief."}] + _user(QUESTION)
    want = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=12, temperature=0)
    assert r.response == want.choices[0].message.content and r.prompt_eval_count == want.usage.prompt_tokens
    streamed = list(oclient.generate(model=MODEL_ID, prompt=QUESTION, system="Be brief.", options=GREEDY,
                                     stream=True))
    assert "".join(c.response for c in streamed) == r.response and streamed[-1].done

    # raw: the prompt as it is, no template: a completion
    raw = oclient.generate(model=MODEL_ID, prompt="Once upon a time", raw=True, options=GREEDY, stream=False)
    done = client.completions.create(model=MODEL_ID, prompt="Once upon a time", max_tokens=12, temperature=0)
    assert raw.response == done.choices[0].text and raw.eval_count == done.usage.completion_tokens
    assert raw.done_reason == done.choices[0].finish_reason
    streamed = list(oclient.generate(model=MODEL_ID, prompt="Once upon a time", raw=True, options=GREEDY,
                                     stream=True))
    assert "".join(c.response for c in streamed) == raw.response


def test_an_empty_prompt_loads_the_model(oclient, live):
    r = oclient.generate(model=MODEL_ID, prompt="", stream=False)
    assert r.done and r.done_reason == "load" and r.response == ""
    r, lines = _lines(live, "/api/chat", {"model": MODEL_ID, "messages": []})
    assert r.status_code == 200 and len(lines) == 1 and lines[0]["done_reason"] == "load"
    assert lines[0]["message"] == {"role": "assistant", "content": ""}
    _error(post(live, "/api/generate", {"model": "other"}), 404, "other")     # still checks the name


# -- options ------------------------------------------------------------------------------------

def test_options_map_onto_sampling(oclient, client):
    kw = dict(model=MODEL_ID, messages=_user("Write a haiku about the sea."), stream=False)
    sampled = {"temperature": 1.0, "top_k": 50, "top_p": 0.95, "min_p": 0.05, "num_predict": 16}
    a = oclient.chat(**kw, options={**sampled, "seed": 1234})
    b = oclient.chat(**kw, options={**sampled, "seed": 1234})
    assert a.message.content == b.message.content
    want = client.chat.completions.create(model=MODEL_ID, messages=kw["messages"], max_tokens=16, temperature=1.0,
                                          top_p=0.95, seed=1234, extra_body={"top_k": 50, "min_p": 0.05})
    assert a.message.content == want.choices[0].message.content

    # num_predict is max_tokens: cut there, with "length"
    cut = oclient.chat(**kw, options={"temperature": 0, "num_predict": 3})
    assert cut.eval_count == 3 and cut.done_reason == "length"
    # stop strings end the answer before them
    text = oclient.chat(**kw, options={"temperature": 0, "num_predict": 16}).message.content
    word = [w for w in text.split() if len(w) >= 3 and text.index(w) > 0][0]
    stopped = oclient.chat(**kw, options={"temperature": 0, "num_predict": 16, "stop": [word]})
    assert stopped.message.content == text[:text.index(word)] and stopped.done_reason == "stop"
    # the penalties are the OpenAI route's
    pen = {"repeat_penalty": 1.3, "presence_penalty": 0.5, "frequency_penalty": 0.5}
    got = oclient.chat(**kw, options={"temperature": 0, "num_predict": 16, **pen}).message.content
    want = client.chat.completions.create(model=MODEL_ID, messages=kw["messages"], max_tokens=16, temperature=0,
                                          presence_penalty=0.5, frequency_penalty=0.5,
                                          extra_body={"repeat_penalty": 1.3})
    assert got == want.choices[0].message.content
    # how Ollama loads a model (num_ctx, num_gpu, ...), keep_alive and unknown options change nothing here;
    # num_predict -1 is "no limit" and seed -1 "a random seed"
    same = oclient.chat(**kw, keep_alive="5m", options={"temperature": 0, "num_predict": 16, "num_ctx": 64,
                                                        "num_gpu": 99, "num_thread": 3, "no_such_option": 1})
    assert same.message.content == text
    unlimited = oclient.chat(model=MODEL_ID, messages=_user(QUESTION), stream=False,
                             options={"temperature": 0, "num_predict": -1, "seed": -1})
    assert unlimited.done_reason == "stop"


# -- format, tools, embeddings -----------------------------------------------------------------

def test_format_json_and_schema(oclient, client):
    r = oclient.chat(model=MODEL_ID, messages=_user("Name three colors."), format="json", stream=False,
                     options={"temperature": 0, "num_predict": 64})
    assert r.done_reason == "stop" and isinstance(json.loads(r.message.content), dict)
    want = client.chat.completions.create(model=MODEL_ID, messages=_user("Name three colors."), max_tokens=64,
                                          temperature=0, response_format={"type": "json_object"})
    assert r.message.content == want.choices[0].message.content
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                               "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    for stream in (False, True):
        out = oclient.generate(model=MODEL_ID, prompt="Make up a person.", format=schema, stream=stream,
                               options={"temperature": 0, "num_predict": 64})
        text = out.response if not stream else "".join(c.response for c in out)
        jsonschema.validate(json.loads(text), schema)


@pytest.fixture(scope="module")
def spare_live(smollm2_gguf):
    """A server whose model has a KV slot more than it runs sequences in: a decoder's embeddings use it."""
    with serving(smollm2_gguf, n_slots=3, parallel=2) as srv:
        yield srv


def test_tools_without_a_type_are_functions(live):
    """Ollama's tools are OpenAI's with `type` optional."""
    body = {"model": MODEL_ID, "messages": _user("What is the weather in Paris?"), "stream": False,
            "options": {"temperature": 0, "num_predict": 8}}
    typed = post(live, "/api/chat", {**body, "tools": TOOLS}).json()
    bare = post(live, "/api/chat", {**body, "tools": [{"function": TOOLS[0]["function"]}]}).json()
    assert bare["message"] == typed["message"] and bare["prompt_eval_count"] == typed["prompt_eval_count"]
    _error(post(live, "/api/chat", {**body, "tools": [{"type": "web_search"}]}), 400, "function")


def test_embed_is_the_openai_embedding(spare_live):
    oclient, client = ollama.Client(host=spare_live.url, timeout=120), spare_live.client()
    texts = ["The capital of France is Paris.", "def add(a, b): return a + b"]
    got = oclient.embed(model=MODEL_ID, input=texts)
    want = client.embeddings.create(model=MODEL_ID, input=texts, encoding_format="float")
    assert len(got.embeddings) == 2
    for row, w in zip(got.embeddings, want.data):
        assert row == pytest.approx(w.embedding, abs=1e-6)
    assert got.prompt_eval_count == want.usage.prompt_tokens
    one = oclient.embed(model=MODEL_ID, input=texts[0])
    assert one.embeddings[0] == pytest.approx(got.embeddings[0], abs=1e-6)
    old = oclient.embeddings(model=MODEL_ID, prompt=texts[1])
    assert old.embedding == pytest.approx(got.embeddings[1], abs=1e-6)
    assert oclient.embed(model=MODEL_ID, input=[]).embeddings == []      # Ollama's "load the model"


# -- the listings ---------------------------------------------------------------------------------

def test_tags_show_ps_version(oclient, live, model):
    [m] = oclient.list().models
    assert m.model == f"{MODEL_ID}:latest" and m.size == model.source.path.stat().st_size
    assert len(m.digest) == 64 and m.modified_at is not None
    d = m.details
    assert (d.format, d.family, d.parameter_size, d.quantization_level) == ("gguf", "llama", "135M", "Q4_1")
    raw = httpx.get(live.url + "/api/tags", timeout=30).json()["models"][0]
    assert raw["name"] == raw["model"]

    shown = oclient.show(MODEL_ID)
    cfg = model.config
    info = shown.modelinfo
    assert info["general.architecture"] == "llama" and info["llama.context_length"] == cfg.n_ctx_train
    assert info["llama.block_count"] == cfg.n_layers and info["llama.embedding_length"] == cfg.d_model
    assert info["llama.attention.head_count_kv"] == cfg.n_kv_heads and 1e8 < info["general.parameter_count"] < 2e8
    assert shown.details == d and "completion" in shown.capabilities and "thinking" not in shown.capabilities
    assert shown.parameters == f"num_ctx {model.n_ctx}" and shown.modelfile == "" and shown.template == ""
    with pytest.raises(ollama.ResponseError) as e:
        oclient.show("llama3")
    assert e.value.status_code == 404
    # which model to describe is required, as Ollama answers it ("model is required"); the old `name` still works
    for body in ({}, {"model": ""}, {"name": ""}, {"model": "", "name": ""}, {"model": None}):
        _error(post(live, "/api/show", body), 400, "model is required")
    _error(post(live, "/api/show", {"model": 5}), 400, "model")
    for body in ({"name": MODEL_ID}, {"model": "", "name": MODEL_ID}, {"model": f"{MODEL_ID}:latest"}):
        assert post(live, "/api/show", body).json()["details"] == raw["details"], body

    [p] = oclient.ps().models
    assert p.model == m.model and p.digest == m.digest and p.context_length == model.n_ctx and p.size > 0
    assert httpx.get(live.url + "/api/version", timeout=30).json()["version"].count(".") == 2


# -- errors -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("body, status, words", [
    ({"model": "llama3", "messages": _user("hi")}, 404, ["llama3", MODEL_ID]),
    ({"messages": _user("hi"), "options": {"temperature": "hot"}}, 400, ["options.temperature"]),
    ({"messages": _user("hi"), "options": {"num_predict": 10**6}}, 400, ["options.num_predict"]),
    ({"messages": _user("hi"), "options": {"top_k": -3}}, 400, ["options.top_k"]),
    ({"messages": _user("hi"), "options": {"num_predict": -5}}, 400, ["options.num_predict", "-1"]),
    ({"messages": _user("hi"), "options": {"seed": 3.5}}, 400, ["options.seed"]),
    ({"messages": _user("hi"), "options": [1]}, 400, ["options", "object"]),
    ({"messages": _user("hi"), "options": {"mirostat": 2}}, 400, ["mirostat"]),
    ({"messages": _user("hi"), "format": "xml"}, 400, ["format"]),
    ({"messages": _user("hi"), "format": {"type": "objekt"}}, 400, ["format"]),
    ({"messages": [{"role": "user", "content": "hi", "images": ["aGk="]}]}, 400, ["takes no images", MODEL_ID]),
    ({"messages": [{"role": "robot", "content": "hi"}]}, 400, ["role"]),
    ({"messages": [{"role": "tool", "content": "18 C", "tool_name": ["f"]}]}, 400, ["tool_name"]),
    # chat's own fields, passed on as they are: named as given
    ({"messages": [{"role": "user", "content": "hi", "name": {"a": 1}}]}, 400, ["messages[0].name", "string"]),
    ({"messages": "hi"}, 400, ["messages"]),
    ({"messages": _user("hi"), "stream": "yes"}, 400, ["stream"]),
    ({"messages": _user("hi"), "think": "very"}, 400, ["think"]),
    ({"messages": _user("hi"), "top_logprobs": 2}, 400, ["top_logprobs", "logprobs"]),
    ({"messages": _user("hi"), "logprobs": True, "top_logprobs": 99}, 400, ["top_logprobs"]),
    # checked though unused: were taken whatever they held
    ({"messages": _user("hi"), "top_logprobs": ""}, 400, ["top_logprobs"]),
    ({"messages": _user("hi"), "top_logprobs": []}, 400, ["top_logprobs"]),
    ({"messages": _user("hi"), "keep_alive": [5]}, 400, ["keep_alive"]),
    ({"messages": _user("hi"), "keep_alive": True}, 400, ["keep_alive"]),
    ({"messages": [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f",
                                                                                    "arguments": "{}"}}]}]},
     400, ["arguments", "object"]),
])
def test_chat_errors(live, body, status, words):
    _error(post(live, "/api/chat", {"model": MODEL_ID, **body}), status, *words)


def test_generate_and_other_errors(live):
    _error(post(live, "/api/generate", {"prompt": "hi", "images": ["aGk="]}), 400, "takes no images")
    _error(post(live, "/api/generate", {"prompt": "hi", "template": "{{ .Prompt }}"}), 400, "template")
    _error(post(live, "/api/generate", {"prompt": "hi", "context": [1, 2, 3]}), 400, "context")
    _error(post(live, "/api/generate", {"prompt": "hi", "raw": True, "system": "x"}), 400, "system")
    _error(post(live, "/api/generate", {"prompt": "hi", "suffix": "there"}), 400, "fill-in-the-middle")
    _error(post(live, "/api/generate", {"prompt": 3}), 400, "prompt")
    _error(post(live, "/api/generate", {"prompt": "hi", "raw": True, "logprobs": True, "top_logprobs": 9}), 400,
           "top_logprobs")
    _error(post(live, "/api/chat", content=b"{not json"), 400, "JSON")
    _error(post(live, "/api/chat", content=b"x" * (70 * 1024)), 413, "exceeds")
    _error(post(live, "/api/embed", {"model": MODEL_ID, "input": [3.5]}), 400, "input")
    _error(post(live, "/api/embed", {"model": "nope", "input": "x"}), 404, "nope")
    _error(post(live, "/api/embed", {"model": MODEL_ID, "input": "x", "keep_alive": {}}), 400, "keep_alive")
    _error(post(live, "/api/embeddings", {"model": MODEL_ID, "prompt": "x", "options": 5}), 400, "options")
    _error(post(live, "/api/generate", {"prompt": "hi", "keep_alive": None, "top_logprobs": False}), 400,
           "top_logprobs")
    for keep in ("5m", "-1", 300, -1, 0, 2.5):      # what Ollama takes is fine (and ignored)
        r = post(live, "/api/generate", {"model": MODEL_ID, "prompt": "", "keep_alive": keep, "stream": False})
        assert r.status_code == 200, r.text
    for path in ("/api/pull", "/api/push", "/api/create", "/api/copy"):
        _error(post(live, path, {"model": "llama3"}), 501, "llambda pull", "llambda serve")
    _error(httpx.request("DELETE", live.url + "/api/delete", json={"model": "x"}, timeout=30), 501, "llambda pull")
    _error(post(live, "/api/nothing", {}), 404, "/api/nothing")
    # another site's page may not use the server, whatever the API
    _error(post(live, "/api/chat", {"messages": _user("hi")}, headers={"Origin": "http://evil.example"}), 403,
           "cross-origin")
    _error(httpx.get(live.url + "/api/tags", headers={"Host": "evil.example"}, timeout=30), 403, "Host")


def test_api_key(spare_model):
    """With an API key every /api route wants it (Ollama's client sends $OLLAMA_API_KEY as a bearer)."""
    cfg = ServerConfig(model_id=MODEL_ID, parallel=1, api_key="s3cret")
    with LiveServer(create_app(spare_model, cfg)) as srv:
        _error(httpx.get(srv.url + "/api/tags", timeout=30), 401, "API key")
        with pytest.raises(ollama.ResponseError) as e:
            ollama.Client(host=srv.url).list()
        assert e.value.status_code == 401
        assert ollama.Client(host=srv.url, headers={"Authorization": "Bearer s3cret"}).list().models


def test_root_says_ollama_is_running_without_the_chat_page(spare_model, live):
    """Clients probe / to see whether an Ollama server is up; with the chat page on, / stays the page."""
    cfg = ServerConfig(model_id=MODEL_ID, parallel=1, api_key="s3cret", webui=False)
    with LiveServer(create_app(spare_model, cfg)) as srv:
        for method in ("GET", "HEAD"):        # no key needed, as /health
            r = httpx.request(method, srv.url + "/", timeout=30)
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
            assert r.text == ("Ollama is running" if method == "GET" else "")
        _error(httpx.get(srv.url + "/api/tags", timeout=30), 401, "API key")
    page = httpx.get(live.url + "/", timeout=30)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")


def test_embed_cuts_a_longer_input_to_its_start_unless_truncate_false(spare_live):
    """As Ollama: truncate (default true) cuts an input longer than the context to its first tokens, a
    decoder's as an encoder's (a decoder's was a 400 either way); false refuses it, with the counts."""
    long = "word " * 600         # over the 512-token context
    err = _error(post(spare_live, "/api/embed", {"model": MODEL_ID, "input": ["short", long], "truncate": False}),
                 400, "input[1]", "context of 512", "truncate")
    assert "tokens" in err
    _error(post(spare_live, "/api/embed", {"model": MODEL_ID, "input": "x", "truncate": "no"}), 400, "truncate")
    fits = post(spare_live, "/api/embed", {"model": MODEL_ID, "input": "short", "truncate": False})
    assert fits.status_code == 200 and len(fits.json()["embeddings"]) == 1
    ids = post(spare_live, "/tokenize", {"content": long, "add_special": True}).json()["tokens"]
    assert len(ids) > 512
    start = spare_live.client().embeddings.create(model=MODEL_ID, input=ids[:512], encoding_format="float")
    for body in ({"input": ["short", long]}, {"input": ["short", long], "truncate": True}):
        cut = post(spare_live, "/api/embed", {"model": MODEL_ID, **body})
        assert cut.status_code == 200, cut.text
        out = cut.json()
        assert out["prompt_eval_count"] == fits.json()["prompt_eval_count"] + 512
        assert out["embeddings"][1] == pytest.approx(start.data[0].embedding, abs=1e-6)
        assert out["embeddings"][0] == pytest.approx(fits.json()["embeddings"][0], abs=1e-6)
    legacy = post(spare_live, "/api/embeddings", {"model": MODEL_ID, "prompt": long}).json()
    assert legacy["embedding"] == pytest.approx(start.data[0].embedding, abs=1e-6)
    # OpenAI's route refuses one, as OpenAI's API does
    assert_error(post(spare_live, "/v1/embeddings", {"model": MODEL_ID, "input": long}), 400, "context")


def test_error_after_the_stream_started_is_its_last_line(smollm2_gguf):
    """A server shutting down mid-answer ends the stream with {"error": ...} instead of a done line."""
    with serving(smollm2_gguf, n_slots=2, parallel=1) as srv:
        body = {"model": MODEL_ID, "prompt": "1, 2, 3, 4, 5,", "raw": True,
                "options": {"temperature": 0, "num_predict": 400}}
        with httpx.stream("POST", srv.url + "/api/generate", json=body, timeout=120) as r:
            lines = r.iter_lines()
            first = json.loads(next(lines))
            srv.app.state.scheduler.drain(0)
            rest = [json.loads(line) for line in lines if line]
    assert first["done"] is False and first["response"]
    assert rest and list(rest[-1]) == ["error"] and "shutting down" in rest[-1]["error"]
    assert not any(line.get("done") for line in rest)


def test_client_hanging_up_mid_stream(live):
    cancelled = 'llambda_sequences_finished_total{reason="cancelled"}'
    before = live.metrics().get(cancelled, 0)
    errors = hang_up_mid_stream(live, "/api/generate", {"model": MODEL_ID, "prompt": "1, 2, 3, 4, 5,", "raw": True,
                                                        "options": {"temperature": 0, "num_predict": 200}})
    assert errors == [] and live.metrics()[cancelled] == before + 1


# -- tools and fill-in-the-middle (Qwen2.5-Coder) -------------------------------------------------

def test_tool_call_round_trip(qwen_live):
    oc = ollama.Client(host=qwen_live.url, timeout=120)
    question = _user("What is the weather in Paris?")
    r = oc.chat(model="qwen", messages=question, tools=TOOLS, options={"temperature": 0, "num_predict": 48},
                stream=False)
    [call] = r.message.tool_calls
    assert call.function.name == "get_weather" and call.function.arguments == {"city": "Paris"}
    assert r.done_reason == "stop"
    streamed = list(oc.chat(model="qwen", messages=question, tools=TOOLS,
                            options={"temperature": 0, "num_predict": 48}, stream=True))
    calls = [c for chunk in streamed for c in chunk.message.tool_calls or []]
    assert [(c.function.name, c.function.arguments) for c in calls] == [("get_weather", {"city": "Paris"})]
    assert streamed[-1].done and streamed[-1].done_reason == "stop"

    # the result goes back as a tool message: the prompt is the one the OpenAI route renders
    follow = question + [{"role": "assistant", "content": "", "tool_calls": [call.model_dump()]},
                         {"role": "tool", "content": "18 C, sunny", "tool_name": "get_weather"}]
    reply = oc.chat(model="qwen", messages=follow, tools=TOOLS, options={"temperature": 0, "num_predict": 12},
                    stream=False)
    want = qwen_live.client().chat.completions.create(
        model="qwen", tools=TOOLS, max_tokens=12, temperature=0, messages=question + [
            {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1_0", "type": "function", "function": {
                "name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]},
            {"role": "tool", "content": "18 C, sunny", "name": "get_weather"}])
    assert (reply.message.content or None) == want.choices[0].message.content
    # num_predict may cut the reply inside a second call: both routes give it as far as it got
    assert [c.function.name for c in reply.message.tool_calls or []] == \
        [c.function.name for c in want.choices[0].message.tool_calls or []]
    assert reply.done_reason == want.choices[0].finish_reason
    lines = list(oc.chat(model="qwen", messages=follow, tools=TOOLS, options={"temperature": 0, "num_predict": 12},
                         stream=True))
    assert [c.model_dump() for line in lines for c in line.message.tool_calls or []] == \
        [c.model_dump() for c in reply.message.tool_calls or []]
    assert reply.prompt_eval_count == want.usage.prompt_tokens
    assert "insert" in oc.show("qwen").capabilities


def test_suffix_is_fill_in_the_middle(qwen_live):
    oc = ollama.Client(host=qwen_live.url, timeout=120)
    r = oc.generate(model="qwen", prompt="def add(a, b):\n    ", suffix="\n\nprint(add(1, 2))\n",
                    options={"temperature": 0, "num_predict": 12}, stream=False)
    want = qwen_live.client().completions.create(model="qwen", prompt="def add(a, b):\n    ",
                                                 suffix="\n\nprint(add(1, 2))\n", max_tokens=12, temperature=0)
    assert r.response == want.choices[0].text and r.response


def test_logprobs(oclient, client):
    """`logprobs` and `top_logprobs` give each token's as the OpenAI route does, in Ollama's field names;
    streamed, each line carries its own tokens'."""
    kw = dict(model=MODEL_ID, messages=_user(QUESTION), options=GREEDY, logprobs=True, top_logprobs=3)
    r = oclient.chat(stream=False, **kw)
    want = client.chat.completions.create(model=MODEL_ID, messages=_user(QUESTION), max_tokens=12, temperature=0,
                                          logprobs=True, top_logprobs=3).choices[0].logprobs.content
    assert [(x.token, x.logprob) for x in r.logprobs] == [(w.token, w.logprob) for w in want]
    assert [[(t.token, t.logprob) for t in x.top_logprobs] for x in r.logprobs] == \
        [[(t.token, t.logprob) for t in w.top_logprobs] for w in want]
    streamed = list(oclient.chat(stream=True, **kw))
    assert [x.token for c in streamed for x in c.logprobs or []] == [x.token for x in r.logprobs]
    assert all(len(c.logprobs or []) >= 1 for c in streamed[:-1])
    raw = oclient.generate(model=MODEL_ID, prompt="Once upon a time", raw=True, options=GREEDY, stream=False,
                           logprobs=True, top_logprobs=2)
    assert "".join(x.token for x in raw.logprobs) == raw.response and len(raw.logprobs[0].top_logprobs) == 2
    assert oclient.chat(stream=False, model=MODEL_ID, messages=_user(QUESTION), options=GREEDY).logprobs is None


def test_an_unknown_model_name_is_quoted_cut(live):
    # a name of 50000 characters is not echoed whole (on Ollama's routes nor the OpenAI and Anthropic ones)
    name = "m" * 50_000
    for path, body in (("/api/chat", {"messages": _user("hi")}), ("/api/show", {}), ("/api/generate", {"prompt": "hi"})):
        message = _error(post(live, path, {**body, "model": name}), 404, "not found", "50002 characters")
        assert len(message) < 500
    for path, body in (("/v1/chat/completions", {"messages": _user("hi")}),
                       ("/v1/messages", {"messages": _user("hi"), "max_tokens": 4}),
                       ("/v1/messages/count_tokens", {"messages": _user("hi")})):
        resp = post(live, path, {**body, "model": name})
        assert resp.status_code == 404 and "50002 characters" in resp.text and len(resp.text) < 600, resp.text[:200]


def test_a_server_fault_keeps_each_apis_error_shape(live, monkeypatch, caplog):
    # an unexpected exception (a bug) still answers in the shape the route's clients read
    def fault(*args, **kwargs):
        raise RuntimeError("injected fault")
    monkeypatch.setattr(ollama_api, "parse_ollama_chat", fault)
    monkeypatch.setattr(anthropic_api, "parse_messages", fault)
    with caplog.at_level(logging.ERROR, logger="llambda.server"):
        _error(post(live, "/api/chat", {"model": MODEL_ID, "messages": _user("hi")}), 500, "internal server error")
        resp = post(live, "/v1/messages", {"model": MODEL_ID, "max_tokens": 4, "messages": _user("hi")})
    assert resp.status_code == 500 and resp.json()["type"] == "error", resp.text
    assert resp.json()["error"]["type"] == "api_error" and "RuntimeError" in resp.json()["error"]["message"]
    assert "injected fault" in caplog.text       # logged for the operator, not sent to the client
    assert "injected fault" not in resp.text
