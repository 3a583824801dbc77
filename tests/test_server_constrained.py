"""Constrained decoding on the server: response_format, llama-server's json_schema/grammar, regex, tool
calls under a grammar (SmolLM2 through the generic tool prompt, Qwen2.5-Coder through its template),
all at 8 concurrent streams, with the official client."""
import concurrent.futures as cf
import json
import re

import httpx
import jsonschema
import openai
import pytest
from serverkit import LOAD_KW, MODEL_ID, PROMPTS, LiveServer, assert_error, post

import llambda
from llambda.server import ServerConfig, create_app

POINT = {"type": "object", "additionalProperties": False, "required": ["x", "y", "label"],
         "properties": {"x": {"type": "integer", "minimum": -100, "maximum": 100},
                        "y": {"type": "number", "minimum": 0, "maximum": 10},
                        "label": {"type": "string", "maxLength": 12},
                        "ok": {"type": "boolean"}}}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather forecast for a city",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city", "days"],
                   "properties": {"city": {"type": "string", "maxLength": 24},
                                  "days": {"type": "integer", "minimum": 1, "maximum": 7}}}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "Get the local time in a city",
        "parameters": {"type": "object", "additionalProperties": False, "required": ["city"],
                       "properties": {"city": {"type": "string", "maxLength": 24}}}}}]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def _fmt(schema, name="point"):
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def _chat_text(client, content, stream, **kw):
    """(text, finish_reason) of one chat completion, streamed or not."""
    kw.setdefault("max_tokens", 64)
    msgs = [{"role": "user", "content": content}]
    if not stream:
        r = client.chat.completions.create(model=MODEL_ID, messages=msgs, **kw)
        return r.choices[0].message.content, r.choices[0].finish_reason
    text, finish = [], None
    for ch in client.chat.completions.create(model=MODEL_ID, messages=msgs, stream=True, **kw):
        if ch.choices:
            text.append(ch.choices[0].delta.content or "")
            finish = ch.choices[0].finish_reason or finish
    return "".join(text), finish


def test_json_schema_outputs_valid_at_8_streams(live, client):
    """Every answer validates: 8 prompts x 3 temperatures x streamed or not, 8 at a time."""
    jobs = [(p, t, s) for p in PROMPTS for t in (0.0, 0.8, 1.4) for s in (False, True)]

    def one(job):
        p, temp, stream = job
        return _chat_text(client, f"{p} Answer as a JSON point.", stream, temperature=temp, seed=len(p),
                          response_format=_fmt(POINT))

    with cf.ThreadPoolExecutor(8) as ex:
        results = list(ex.map(one, jobs))
    for (text, finish), job in zip(results, jobs):
        assert finish == "stop", (job, text)
        jsonschema.validate(json.loads(text), POINT)
    # llama-server's extension, on both endpoints
    r = client.completions.create(model=MODEL_ID, prompt="A point:", max_tokens=64, temperature=0.5, seed=1,
                                  extra_body={"json_schema": POINT})
    jsonschema.validate(json.loads(r.choices[0].text), POINT)
    text, _ = _chat_text(client, "A point?", False, extra_body={"json_schema": POINT}, temperature=0)
    jsonschema.validate(json.loads(text), POINT)


def test_json_object_mode(client):
    for stream in (False, True):
        text, finish = _chat_text(client, "List two colors as JSON.", stream, temperature=0, max_tokens=200,
                                  response_format={"type": "json_object"})
        assert text.startswith("{")
        if finish == "stop":
            assert isinstance(json.loads(text), dict)


def test_grammar_and_regex_on_both_endpoints(client):
    gbnf = 'root ::= "Answer: " ("yes" | "no")'
    for temp in (0.0, 1.2):
        r = client.completions.create(model=MODEL_ID, prompt="Is the sky blue?", max_tokens=12, temperature=temp,
                                      seed=2, extra_body={"grammar": gbnf})
        assert r.choices[0].text in ("Answer: yes", "Answer: no") and r.choices[0].finish_reason == "stop"
        text, finish = _chat_text(client, "Is the sky blue?", temp > 0, temperature=temp, extra_body={"grammar": gbnf})
        assert text in ("Answer: yes", "Answer: no") and finish == "stop"
    phone = r"\+[0-9]{2} [0-9]{3} [0-9]{4}"
    r = client.completions.create(model=MODEL_ID, prompt="Call me at", max_tokens=16, temperature=1.0, seed=4, n=3,
                                  extra_body={"regex": phone})
    assert all(re.fullmatch(phone, c.text) for c in r.choices), [c.text for c in r.choices]
    text, _ = _chat_text(client, "Your phone number?", True, temperature=0.5, extra_body={"regex": phone})
    assert re.fullmatch(phone, text)


def test_invalid_constraints_are_400_before_generation(live):
    msgs = [{"role": "user", "content": "hi"}]
    before = live.metrics()
    cases = [("/v1/chat/completions", {"messages": msgs, "response_format": _fmt({"type": "objekt"})},
              "response_format", "objekt"),
             ("/v1/chat/completions", {"messages": msgs, "json_schema": {"type": "string", "minLength": 3,
                                                                          "maxLength": 1}}, "json_schema", "maxLength"),
             ("/v1/completions", {"prompt": "x", "grammar": "root ::= missing_rule"}, "grammar", "missing_rule"),
             ("/v1/completions", {"prompt": "x", "regex": "(unclosed", "stream": True}, "regex", "regex"),
             # grammars that derive no string compiled, and failed at the first token (a stream's 200)
             ("/v1/completions", {"prompt": "x", "grammar": "root ::= ( root )", "stream": True}, "grammar",
              "no output"),
             ("/v1/chat/completions", {"messages": msgs, "stream": True, "response_format": _fmt({"$ref": "#"})},
              "response_format", "no output"),
             ("/v1/chat/completions", {"messages": msgs, "stream": True, "tools": [{"type": "function", "function": {
                 "name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "objekt"}}}}}],
              "tool_choice": "required"}, "tools", "objekt"),
             # a keyword nothing enforces is named, strict or not (a non-strict schema is held to the same)
             ("/v1/chat/completions", {"messages": msgs, "response_format": {"type": "json_schema", "json_schema": {
                 "name": "c", "schema": {"type": "string", "format": "colour"}, "strict": False}}},
              "response_format", "colour"),
             ("/v1/chat/completions", {"messages": msgs, "response_format": _fmt({"type": "array", "uniqueItems": True})},
              "response_format", "uniqueItems")]
    for path, body, param, word in cases:
        err = assert_error(post(live, path, {"model": MODEL_ID, **body}), 400, word)
        assert err["type"] == "invalid_request_error" and err["param"] == param, err
    after = live.wait_idle()
    assert after["llambda_generated_tokens_total"] == before["llambda_generated_tokens_total"]
    assert after["llambda_prompt_tokens_total"] == before["llambda_prompt_tokens_total"]


def test_grammar_that_fails_while_decoding_is_a_400(live):
    """A grammar that compiles but cannot go on (after "a", a JSON schema that allows nothing)
    fails at that token: the client's mistake, answered 400, not a 500, with the problem named and
    not the parser's internal state."""
    msgs = [{"role": "user", "content": "hi"}]
    for extra in ({"grammar": '%llguidance {}\nstart: "a" x\nx: %json {"$ref": "#"}'},):
        body = {"model": MODEL_ID, "messages": msgs, "max_tokens": 4, **extra}
        err = assert_error(post(live, "/v1/chat/completions", body), 400, "constraint", "no text can continue")
        assert err["type"] == "invalid_request_error" and "<state>" not in err["message"], err
        r = post(live, "/v1/chat/completions", {**body, "stream": True})
        events = [json.loads(line[6:]) for line in r.text.splitlines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
        assert events[-1]["error"]["type"] == "invalid_request_error", events[-1]
    r = post(live, "/v1/chat/completions", {"model": MODEL_ID, "messages": msgs, "max_tokens": 2})
    assert r.status_code == 200, r.text
    assert not [k for k in live.metrics() if 'status="5' in k], "a client's grammar must never be a 5xx"


def test_a_request_over_the_step_mask_budget_is_a_400_in_its_own_stream(live, monkeypatch):
    """Past the step's mask budget (here below any cost, so every constrained request is over) the
    constrained requests fail with a 400 naming it, and a free request beside them is answered."""
    from llambda.constraints import bounds
    monkeypatch.setattr(bounds, "MAX_STEP_MASK_CPU_SECONDS", -1.0)
    monkeypatch.setattr(bounds, "MASK_CPU_PER_SEQUENCE", -1.0)
    body = {"model": MODEL_ID, "prompt": "A point:", "max_tokens": 8, "temperature": 0}

    def one(extra):
        return post(live, "/v1/completions", {**body, **extra})

    with cf.ThreadPoolExecutor(3) as ex:
        free, strict, streamed = ex.map(one, [{}, {"json_schema": POINT, "n": 2},
                                              {"regex": "[a-z ]+", "stream": True}])
    assert free.status_code == 200 and free.json()["choices"][0]["finish_reason"], free.text
    err = assert_error(strict, 400, "too costly", "ms a step")
    assert err["type"] == "invalid_request_error", err
    events = [json.loads(line[6:]) for line in streamed.text.splitlines()
              if line.startswith("data: ") and line != "data: [DONE]"]
    assert "too costly" in events[-1]["error"]["message"], events[-1]
    live.wait_idle()     # the refused requests' slots (n=2: both choices) are free again


def test_constrained_greedy_is_batch_invariant(client):
    """A greedy constrained request gives the same text alone and among 7 others (constrained or not)."""
    def target():
        return _chat_text(client, "Where is the treasure? Answer as a JSON point.", False, temperature=0,
                          response_format=_fmt(POINT))[0]

    def mate(k):
        kw = dict(temperature=0.9, seed=k, max_tokens=40)
        if k % 2:
            kw["response_format"] = _fmt({"type": "object", "properties": {"n": {"type": "integer"}},
                                          "required": ["n"]}, "n")
        return _chat_text(client, PROMPTS[k], k % 3 == 0, **kw)

    alone = target()
    with cf.ThreadPoolExecutor(8) as ex:
        mates = [ex.submit(mate, k) for k in range(7)]
        together = ex.submit(target).result()
        for f in mates:
            f.result()
    assert together == alone
    jsonschema.validate(json.loads(alone), POINT)


def _calls(client, stream, **kw):
    """(content, [(name, arguments)], finish) of a chat with tools."""
    if not stream:
        r = client.chat.completions.create(**kw)
        m = r.choices[0].message
        return m.content, [(t.function.name, t.function.arguments) for t in m.tool_calls or []], \
            r.choices[0].finish_reason
    content, calls, finish = [], {}, None
    for ch in client.chat.completions.create(stream=True, **kw):
        c = ch.choices[0]
        content.append(c.delta.content or "")
        for d in c.delta.tool_calls or []:
            calls.setdefault(d.index, [d.function.name, ""])
            calls[d.index][1] += d.function.arguments or ""
        finish = c.finish_reason or finish
    return "".join(content), [tuple(calls[k]) for k in sorted(calls)], finish


def _check_calls(calls, names):
    assert calls
    for name, args in calls:
        assert name in names
        jsonschema.validate(json.loads(args), PARAMS[name])


QUESTIONS = ["What is the weather in Paris this week?", "What time is it in Tokyo?", "Hello! How are you?",
             "Should I take an umbrella in London tomorrow?"]


def test_tool_choice_on_a_template_without_tools(live, client):
    """SmolLM2's template knows no tools: the generic tool prompt, and calls under the grammar."""
    jobs = [(q, choice, stream, temp) for q in QUESTIONS
            for choice in ("required", {"type": "function", "function": {"name": "get_time"}})
            for stream in (False, True) for temp in (0.0, 0.9)]

    def one(job):
        q, choice, stream, temp = job
        return _calls(client, stream, model=MODEL_ID, messages=[{"role": "user", "content": q}], tools=TOOLS,
                      tool_choice=choice, temperature=temp, seed=3, max_tokens=80, parallel_tool_calls=False)

    with cf.ThreadPoolExecutor(8) as ex:
        results = list(ex.map(one, jobs))
    for (content, calls, finish), (q, choice, _, _) in zip(results, jobs):
        names = {"get_time"} if isinstance(choice, dict) else set(PARAMS)
        assert finish == "tool_calls" and not (content or "").strip(), (q, choice, content, calls)
        assert len(calls) == 1
        _check_calls(calls, names)
    # auto: text or a valid call, never an invalid one
    for q in QUESTIONS:
        content, calls, finish = _calls(client, False, model=MODEL_ID, messages=[{"role": "user", "content": q}],
                                        tools=TOOLS, temperature=0, max_tokens=80)
        if calls:
            _check_calls(calls, set(PARAMS))
            assert finish == "tool_calls"
        else:
            assert "<tool_call>" not in (content or "")
    # a tool result goes back as a user turn the template can render
    follow = [{"role": "user", "content": "Time in Lima?"},
              {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
                  "name": "get_time", "arguments": "{\"city\": \"Lima\"}"}}]},
              {"role": "tool", "tool_call_id": "call_1", "content": "10:42"}]
    r = client.chat.completions.create(model=MODEL_ID, messages=follow, tools=TOOLS, max_tokens=12, temperature=0)
    assert r.choices[0].message.content or r.choices[0].message.tool_calls


def test_earlier_calls_without_tools_now_on_a_template_without_tools(live, client):
    """A conversation with a call and its result, then tool_choice "none" (or no tools) to get a text
    answer: SmolLM2's template concatenates content, so a turn of calls alone (content null) was a 400
    quoting a Python TypeError, and with content "" the call was silently dropped from the prompt.
    Now they are written as the generic tool prompt writes them."""
    call = {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": "{\"city\": \"Lima\"}"}}
    history = [{"role": "user", "content": "Time in Lima?"}, {"role": "assistant", "content": None, "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "call_1", "content": "10:42"}]
    bare = [history[0], {"role": "assistant", "content": ""}, {"role": "user", "content": "10:42"}]
    n_bare = client.chat.completions.create(model=MODEL_ID, messages=bare, max_tokens=1).usage.prompt_tokens
    for extra in ({"tools": TOOLS, "tool_choice": "none"}, {}):
        for content in (None, ""):
            msgs = [history[0], dict(history[1], content=content), history[2]]
            r = post(live, "/v1/chat/completions", {"model": MODEL_ID, "messages": msgs, "max_tokens": 4,
                                                     "temperature": 0, **extra})
            assert r.status_code == 200, r.text
            answer = r.json()
            assert answer["choices"][0]["message"].get("tool_calls") is None
            # the call and its result are in the prompt: more tokens than the turns without them
            assert answer["usage"]["prompt_tokens"] > n_bare + 10, (extra, content, answer["usage"])
    # the same through Ollama's and Anthropic's shapes of the conversation
    ollama = [history[0], {"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "get_time", "arguments": {"city": "Lima"}}}]}, {"role": "tool", "content": "10:42"}]
    r = post(live, "/api/chat", {"model": MODEL_ID, "messages": ollama, "stream": False,
                                 "options": {"num_predict": 2}})
    assert r.status_code == 200, r.text
    anthropic = [history[0], {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_time",
                                                                "input": {"city": "Lima"}}]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "10:42"}]}]
    r = post(live, "/v1/messages", {"model": MODEL_ID, "messages": anthropic, "max_tokens": 2})
    assert r.status_code == 200, r.text


def test_tool_choice_with_a_format_is_refused(live):
    body = {"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS,
            "tool_choice": "required", "response_format": {"type": "json_object"}}
    assert_error(post(live, "/v1/chat/completions", body), 400, "response_format", "tool_choice")


def test_tool_choice_with_qwen_template(qwen05_gguf):
    with llambda.load(qwen05_gguf, n_slots=4, n_ctx=1024, **LOAD_KW) as m:
        with LiveServer(create_app(m, ServerConfig(model_id="qwen", parallel=4))) as srv:
            c = srv.client()
            jobs = [(q, choice, stream) for q in QUESTIONS
                    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}, "auto")
                    for stream in (False, True)]

            def one(job):
                q, choice, stream = job
                return _calls(c, stream, model="qwen", messages=[{"role": "user", "content": q}], tools=TOOLS,
                              tool_choice=choice, temperature=0.7, seed=1, max_tokens=60)

            with cf.ThreadPoolExecutor(4) as ex:
                results = list(ex.map(one, jobs))
            for (content, calls, finish), (q, choice, _) in zip(results, jobs):
                if choice == "auto" and not calls:
                    assert finish in ("stop", "length") and content, (q, content)
                    continue
                names = {"get_weather"} if isinstance(choice, dict) else set(PARAMS)
                assert finish == "tool_calls", (q, choice, content, calls)
                _check_calls(calls, names)
            # the weather question under auto is answered with a (valid) call
            weather = [r for r, (q, ch, _) in zip(results, jobs) if ch == "auto" and "Paris" in q]
            assert all(r[1] for r in weather)
            with pytest.raises(openai.BadRequestError):
                c.chat.completions.create(model="qwen", messages=[{"role": "user", "content": "hi"}],
                                          extra_body={"grammar": "root ::= nothing_here"})
            assert httpx.get(srv.url + "/health").status_code == 200
