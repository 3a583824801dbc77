"""POST /v1/messages (Anthropic's Messages API) on a live loopback server, driven by the official
`anthropic` client: system, content blocks, stop sequences, streaming events, tools with
input_schema -> tool_use blocks and tool_result turns (Qwen2.5-Coder), Anthropic-shaped errors,
the x-api-key header, and /v1/messages/count_tokens."""
from __future__ import annotations

import json

import anthropic
import httpx
import pytest

from llambda.server import ServerConfig, create_app
from serverkit import MODEL_ID, LiveServer, hang_up_mid_stream, post

GREEDY = {"temperature": 0}     # sampling fields the client does not name go in the body as they are
TOOLS = [{"name": "get_weather", "description": "Get the current weather in a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
CHAT_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": TOOLS[0]["description"],
                                                "parameters": TOOLS[0]["input_schema"]}}]
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


def _client(srv, key: str = "none") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=srv.url, api_key=key, max_retries=0, timeout=120)


def _anthropic_error(resp, status: int, kind: str, *words) -> str:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert body["type"] == "error" and body["error"]["type"] == kind, body
    for w in words:
        assert w.lower() in body["error"]["message"].lower(), body
    return body["error"]["message"]


@pytest.fixture(scope="module")
def aclient(live):
    return _client(live)


# -- text (SmolLM2) ---------------------------------------------------------------------------

def test_message_is_the_chat_answer(aclient, client, model):
    msg = aclient.messages.create(model=MODEL_ID, max_tokens=12, system="Be brief.",
                                  messages=[{"role": "user", "content": "What is the capital of France?"}],
                                  extra_body=GREEDY)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the capital of France?"}]
    chat = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=12, temperature=0)
    assert msg.type == "message" and msg.role == "assistant" and msg.model == MODEL_ID and msg.id.startswith("msg_")
    [block] = msg.content
    assert block.type == "text" and block.text == chat.choices[0].message.content
    assert msg.stop_reason == ("max_tokens" if chat.choices[0].finish_reason == "length" else "end_turn")
    assert msg.stop_sequence is None
    assert msg.usage.input_tokens == len(model._prompt_ids(model.render_chat(messages)))
    assert msg.usage.output_tokens == chat.usage.completion_tokens

    # text blocks and a system given as blocks are the same prompt
    blocks = aclient.messages.create(model=MODEL_ID, max_tokens=12, system=[{"type": "text", "text": "Be brief."}],
                                     messages=[{"role": "user", "content": [
                                         {"type": "text", "text": "What is the capital of France?"}]}],
                                     extra_body=GREEDY)
    assert blocks.content[0].text == block.text and blocks.usage.input_tokens == msg.usage.input_tokens


def test_stop_sequences(aclient):
    kw = dict(model=MODEL_ID, max_tokens=16, messages=[{"role": "user", "content": "Tell me about the moon."}],
              extra_body=GREEDY)
    text = aclient.messages.create(**kw).content[0].text
    words = [w for w in text.split() if len(w) >= 3 and text.index(w) > 0]
    assert words, text
    stop = words[len(words) // 2]
    cut = aclient.messages.create(stop_sequences=[stop], **kw)
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert cut.content[0].text == text[:text.index(stop)]


def test_assistant_prefill_is_continued(aclient, client, model):
    """A last assistant turn of text is the start of the answer (Anthropic's prefill): the prompt ends
    with it, not with a closed turn and a fresh one, and the reply is only what follows it."""
    user = [{"role": "user", "content": "Give a JSON object with the key a set to 1."}]
    prefill = '{"a":'
    kw = dict(model=MODEL_ID, max_tokens=8, messages=user + [{"role": "assistant", "content": prefill}],
              extra_body=GREEDY)
    msg = aclient.messages.create(**kw)
    prompt = model.render_chat(user) + prefill
    raw = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=8, temperature=0)
    assert msg.usage.input_tokens == len(model._prompt_ids(prompt))
    assert msg.content[0].text == raw.choices[0].text
    streamed = "".join(e.delta.text for e in aclient.messages.create(stream=True, **kw)
                       if e.type == "content_block_delta")
    assert streamed == msg.content[0].text


def test_streamed_events(aclient, live):
    kw = dict(model=MODEL_ID, max_tokens=16, messages=[{"role": "user", "content": "Write a haiku about the sea."}],
              extra_body=GREEDY)
    whole = aclient.messages.create(**kw)
    with aclient.messages.stream(**kw) as stream:
        texts = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(texts) >= 2 and "".join(texts) == whole.content[0].text
    assert final.content[0].text == whole.content[0].text and final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert final.usage.input_tokens == whole.usage.input_tokens

    # the raw event sequence
    events = list(aclient.messages.create(stream=True, **kw))
    kinds = [e.type for e in events]
    n = kinds.count("content_block_delta")
    assert kinds == ["message_start", "content_block_start"] + ["content_block_delta"] * n + \
        ["content_block_stop", "message_delta", "message_stop"]
    assert events[0].message.content == [] and events[0].message.stop_reason is None
    assert events[1].content_block.type == "text" and events[1].index == 0
    assert all(e.delta.type == "text_delta" for e in events[2:2 + n])
    assert events[-2].delta.stop_reason == whole.stop_reason
    # each SSE message names its event, as Anthropic's stream does (how many deltas depends on how
    # the tokens were coalesced for the client, so runs of one name count once)
    with httpx.stream("POST", live.url + "/v1/messages", json={**kw.pop("extra_body"), **kw, "stream": True},
                      timeout=120) as s:
        names = [line[7:] for line in s.iter_lines() if line.startswith("event: ")]
    assert list(dict.fromkeys(names)) == list(dict.fromkeys(kinds))


def test_errors_have_anthropics_shape(aclient, live):
    with pytest.raises(anthropic.BadRequestError):
        aclient.messages.create(model=MODEL_ID, max_tokens=8, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": "http://127.0.0.1/x.png"}}]}])
    with pytest.raises(anthropic.NotFoundError):
        aclient.messages.create(model="claude-nonexistent", max_tokens=8, messages=QUESTION)
    body = {"model": MODEL_ID, "messages": QUESTION}
    _anthropic_error(post(live, "/v1/messages", body), 400, "invalid_request_error", "max_tokens")
    _anthropic_error(post(live, "/v1/messages", {**body, "max_tokens": 4, "temperature": 1.5}), 400,
                     "invalid_request_error", "temperature")
    _anthropic_error(post(live, "/v1/messages", {**body, "max_tokens": 4, "messages": [{"role": "system",
                                                                                      "content": "x"}]}),
                     400, "invalid_request_error", "role")
    _anthropic_error(post(live, "/v1/messages", content=b"{not json", headers={"content-type": "application/json"}),
                     400, "invalid_request_error", "JSON")
    # a tool whose schema no grammar can follow (SmolLM2's template has no notion of tools: they go
    # through the generic tool prompt, and calls are generated under a grammar)
    bad_tool = [{**TOOLS[0], "input_schema": {"type": "objekt"}}]
    _anthropic_error(post(live, "/v1/messages", {**body, "max_tokens": 4, "tools": bad_tool}), 400,
                     "invalid_request_error", "objekt")


def test_tool_errors_name_anthropics_fields(live):
    # chat's checks of the tool each becomes named chat's fields (tools[i].function.parameters)
    body = {"model": MODEL_ID, "messages": QUESTION, "max_tokens": 4}
    for tools, words in (([TOOLS[0], TOOLS[0]], "tools[1].name 'get_weather' is taken"),
                         ([{**TOOLS[0], "input_schema": 3}], "tools[0].input_schema must be a JSON Schema object"),
                         ([{**TOOLS[0], "input_schema": {"type": "array"}}], "tools[0].input_schema must describe")):
        for path in ("/v1/messages", "/v1/messages/count_tokens"):
            message = _anthropic_error(post(live, path, {**body, "tools": tools}), 400, "invalid_request_error", words)
            assert "function" not in message and "parameters" not in message, message


def test_block_ids_must_be_strings(live):
    """A tool_result's tool_use_id (required) and a tool_use's id were made strings with str(): 5 became
    "5", an object its Python repr, in the prompt. Now a 400 naming the block's own field."""
    use = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Lima"}}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C"}

    def body(use, result):
        return {"model": MODEL_ID, "max_tokens": 2, "tools": TOOLS,
                "messages": QUESTION + [{"role": "assistant", "content": [use]}, {"role": "user", "content": [result]}]}
    cases = [({**use, "id": 7}, result, "messages[1].content[0].id"),
             ({**use, "id": {"x": 1}}, result, "messages[1].content[0].id"),
             (use, {**result, "tool_use_id": 5}, "messages[2].content[0].tool_use_id"),
             (use, {**result, "tool_use_id": None}, "messages[2].content[0].tool_use_id"),
             (use, {k: v for k, v in result.items() if k != "tool_use_id"}, "messages[2].content[0].tool_use_id")]
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        for u, res, field in cases:
            _anthropic_error(post(live, path, body(u, res)), 400, "invalid_request_error", f"{field} must be a string")
    r = post(live, "/v1/messages/count_tokens", body(use, result))
    assert r.status_code == 200, r.text


def test_metadata_and_service_tier_are_of_anthropics_types(live):
    """metadata and service_tier change nothing here, but were taken whatever they held; a wrong type
    is now a 400 naming the field, the right ones are still accepted (and ignored)."""
    body = {"model": MODEL_ID, "messages": QUESTION, "max_tokens": 2}
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        for extra, field in (({"metadata": "u-1"}, "'metadata'"), ({"metadata": [1]}, "'metadata'"),
                             ({"metadata": {"user_id": 5}}, "metadata.user_id"),
                             ({"metadata": {"user_id": {"id": "u"}}}, "metadata.user_id"),
                             ({"service_tier": 3}, "'service_tier'"), ({"service_tier": {}}, "'service_tier'")):
            _anthropic_error(post(live, path, {**body, **extra}), 400, "invalid_request_error", field)
        for extra in ({"metadata": {"user_id": "u-1"}}, {"metadata": {}}, {"metadata": {"user_id": None}},
                      {"service_tier": "auto"}):
            r = post(live, path, {**body, **extra})
            assert r.status_code == 200, (extra, r.text)


def test_hostile_system_stop_sequences_and_lone_prefill(live):
    """What a fuzzer found: a system of 0, false or {} was taken as no system prompt (a 200); a text
    block with a non-string text was called "a 'text' block; only text blocks are supported"; too many
    stop_sequences were refused naming chat's 'stop'; an assistant turn alone (a prefill with nothing
    before it) was "'messages' must not be empty"."""
    body = {"model": MODEL_ID, "messages": QUESTION, "max_tokens": 2}
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        for system in (0, False, {}, 1.5):
            _anthropic_error(post(live, path, {**body, "system": system}), 400, "invalid_request_error", "system")
        message = _anthropic_error(post(live, path, {**body, "system": [{"type": "text", "text": 5}]}), 400,
                                   "invalid_request_error", "system[0]", "string 'text'")
        assert "only text blocks" not in message
        for stops, words in ((["x"] * 17, ("stop_sequences", "at most 16")), ([""], ("stop_sequences",)),
                             ([5], ("stop_sequences",)), ("x", ("stop_sequences",))):
            message = _anthropic_error(post(live, path, {**body, "stop_sequences": stops}), 400,
                                       "invalid_request_error", *words)
            assert "'stop'" not in message, message
        message = _anthropic_error(post(live, path, {**body, "messages": [{"role": "assistant", "content": "Hi"}]}),
                                   400, "invalid_request_error", "only an assistant turn")
    # what is fine stays fine: an empty system, 16 stop sequences, a prefill after a system prompt
    for extra in ({"system": ""}, {"system": []}, {"stop_sequences": ["x"] * 16},
                  {"system": "Be brief.", "messages": [{"role": "assistant", "content": "Hi"}]}):
        r = post(live, "/v1/messages", {**body, **extra})
        assert r.status_code == 200, (extra, r.text)


def test_count_tokens_is_what_the_message_reports(aclient, live):
    """count_tokens takes the body /v1/messages takes, without max_tokens, and counts the rendered prompt:
    system, blocks, tools (the generic tool prompt here) and an assistant prefill included."""
    prefill = [{"role": "user", "content": "Name three colors."}, {"role": "assistant", "content": "Red,"}]
    for kw in (dict(system="Be brief.", messages=QUESTION), dict(messages=QUESTION, tools=TOOLS),
               dict(messages=prefill, system=[{"type": "text", "text": "Be brief."}])):
        counted = aclient.messages.count_tokens(model=MODEL_ID, **kw)
        msg = aclient.messages.create(model=MODEL_ID, max_tokens=2, extra_body=GREEDY, **kw)
        assert counted.input_tokens == msg.usage.input_tokens > 0, kw
    assert aclient.messages.count_tokens(model=MODEL_ID, messages=QUESTION, tools=TOOLS).input_tokens > \
        aclient.messages.count_tokens(model=MODEL_ID, messages=QUESTION).input_tokens
    # the create's checks, in Anthropic's error shape
    with pytest.raises(anthropic.NotFoundError):
        aclient.messages.count_tokens(model="claude-nonexistent", messages=QUESTION)
    path = "/v1/messages/count_tokens"
    _anthropic_error(post(live, path, {"messages": QUESTION}), 400, "invalid_request_error", "model")
    _anthropic_error(post(live, path, {"model": MODEL_ID, "messages": []}), 400, "invalid_request_error", "messages")
    _anthropic_error(post(live, path, {"model": MODEL_ID, "messages": [{"role": "user", "content": "x" * 1_000_001}]}),
                     413, "request_too_large")
    _anthropic_error(post(live, path, content=b"{not json", headers={"content-type": "application/json"}),
                     400, "invalid_request_error", "JSON")


def test_tools_through_the_generic_prompt(aclient):
    # greedy and room to finish: sampled, a long made-up city ran past a 40-token budget now and then
    r = aclient.messages.create(model=MODEL_ID, max_tokens=96, messages=QUESTION, tools=TOOLS,
                                tool_choice={"type": "any"}, extra_body={"temperature": 0})
    uses = [b for b in r.content if b.type == "tool_use"]
    assert r.stop_reason == "tool_use" and [u.name for u in uses] == ["get_weather"]
    assert isinstance(uses[0].input["city"], str)


def test_x_api_key(spare_model):
    """Anthropic's clients send the key as x-api-key; a missing or wrong one is an Anthropic 401.
    No request here generates (the key is proven by getting past it to a 404 or 400)."""
    cfg = ServerConfig(model_id=MODEL_ID, parallel=1, api_key="s3cret")
    with LiveServer(create_app(spare_model, cfg)) as srv:
        with pytest.raises(anthropic.AuthenticationError):
            _client(srv, "wrong").messages.create(model=MODEL_ID, max_tokens=4, messages=QUESTION)
        _anthropic_error(post(srv, "/v1/messages", {}), 401, "authentication_error", "x-api-key")
        _anthropic_error(post(srv, "/v1/messages/count_tokens", {}), 401, "authentication_error", "x-api-key")
        with pytest.raises(anthropic.NotFoundError):       # past the key
            _client(srv, "s3cret").messages.create(model="other", max_tokens=4, messages=QUESTION)
        _anthropic_error(post(srv, "/v1/messages", {}, headers={"x-api-key": "s3cret"}), 400,
                         "invalid_request_error")
        # the OpenAI routes take it too, and still answer in OpenAI's shape
        r = post(srv, "/v1/completions", {}, headers={"x-api-key": "wrong"})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


def test_client_hanging_up_mid_stream(live):
    """The generation is cancelled (its slot freed) and the stream ends without an error escaping."""
    cancelled = 'llambda_sequences_finished_total{reason="cancelled"}'
    before = live.metrics().get(cancelled, 0)
    errors = hang_up_mid_stream(live, "/v1/messages", {"model": MODEL_ID, "max_tokens": 200, "ignore_eos": True,
                                                    "messages": [{"role": "user", "content": "Tell me a long story."}]})
    assert errors == []
    assert live.metrics()[cancelled] == before + 1


# -- tools (Qwen2.5-Coder) ---------------------------------------------------------------------

def test_tool_use_and_tool_result(qwen_live):
    client = _client(qwen_live)
    kw = dict(model="qwen", max_tokens=24, messages=QUESTION, tools=TOOLS, tool_choice={"type": "any"},
              extra_body=GREEDY)
    msg = client.messages.create(**kw)
    uses = [b for b in msg.content if b.type == "tool_use"]
    assert len(uses) == 1, msg.content
    use = uses[0]
    assert use.name == "get_weather" and use.input["city"] == "Paris" and use.id
    assert msg.stop_reason == "tool_use"

    # streamed: a tool_use block whose input arrives as input_json_delta pieces
    events = list(client.messages.create(stream=True, **kw))
    start = next(e for e in events if e.type == "content_block_start" and e.content_block.type == "tool_use")
    assert start.content_block.name == "get_weather" and start.content_block.input == {}
    pieces = [e.delta.partial_json for e in events if e.type == "content_block_delta"
              and e.delta.type == "input_json_delta" and e.index == start.index]
    assert len(pieces) >= 2
    with client.messages.stream(**kw) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == [b.type for b in msg.content]
    assert final.content[-1].input == use.input and final.stop_reason == "tool_use"

    # the tool's result in the next user turn, rendered as the chat template renders a tool message
    follow = QUESTION + [
        {"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": use.name, "input": use.input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                      "content": [{"type": "text", "text": "18 C, sunny"}]}]}]
    reply = client.messages.create(model="qwen", max_tokens=8, messages=follow, tools=TOOLS, extra_body=GREEDY)
    m = qwen_live.model
    messages = QUESTION + [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": use.id, "type": "function", "function": {"name": use.name, "arguments": json.dumps(use.input)}}]},
        {"role": "tool", "tool_call_id": use.id, "content": "18 C, sunny"}]
    rendered = m.render_chat(messages, tools=CHAT_TOOLS)
    assert "<tool_response>\n18 C, sunny\n</tool_response>" in rendered
    assert reply.usage.input_tokens == len(m._prompt_ids(rendered))
