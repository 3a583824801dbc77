"""POST /v1/responses (OpenAI's Responses API) on a live loopback server, driven by the official
`openai` client: text and item input, instructions, streaming events, function tools (Qwen2.5-Coder,
whose template renders tools), and the 400s for what is not supported; stored responses
(previous_response_id, retrieve, delete, input_items, eviction) and input token counts."""
from __future__ import annotations

import json
import threading

import httpx
import openai
import pytest

from llambda.server.errors import APIError
from llambda.server.openai_format import dumps
from llambda.server.response_store import ResponseStore, encode_response
from llambda.server.responses_api import parse_responses
from serverkit import MODEL_ID, assert_error, hang_up_mid_stream, post

TOOLS = [{"type": "function", "name": "get_weather", "description": "Get the current weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
CHAT_TOOLS = [{"type": "function", "function": {k: v for k, v in TOOLS[0].items() if k != "type"}}]
QUESTION = "What is the weather in Paris?"


def _events(stream) -> list:
    events = list(stream)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    return events


# -- text (SmolLM2) ---------------------------------------------------------------------------

def test_text_input_with_instructions_is_the_chat_answer(client, model):
    r = client.responses.create(model=MODEL_ID, input="What is the capital of France?", instructions="Be brief.",
                                max_output_tokens=12, temperature=0)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the capital of France?"}]
    chat = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=12, temperature=0)
    assert r.object == "response" and r.model == MODEL_ID and r.id.startswith("resp_")
    assert r.output_text == chat.choices[0].message.content and r.output_text
    assert r.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")
    if r.status == "incomplete":
        assert r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.input_tokens == len(model._prompt_ids(model.render_chat(messages)))
    assert r.usage.output_tokens == chat.usage.completion_tokens
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    [item] = r.output
    assert item.type == "message" and item.role == "assistant" and item.content[0].type == "output_text"
    assert r.instructions == "Be brief." and r.max_output_tokens == 12 and r.temperature == 0


def test_message_items_with_text_parts(client):
    text = client.responses.create(model=MODEL_ID, input="Name three colors.", max_output_tokens=8, temperature=0)
    items = client.responses.create(
        model=MODEL_ID, max_output_tokens=8, temperature=0,
        input=[{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Name three colors."}]}])
    assert items.output_text == text.output_text
    # an earlier assistant turn (output_text parts) and a developer message are part of the prompt
    longer = client.responses.create(
        model=MODEL_ID, max_output_tokens=4, temperature=0,
        input=[{"role": "developer", "content": "Answer in French."},
               {"role": "user", "content": "Hi"},
               {"role": "assistant", "content": [{"type": "output_text", "text": "Bonjour!"}]},
               {"role": "user", "content": "Name three colors."}])
    assert longer.usage.input_tokens > text.usage.input_tokens


def test_streamed_events(client):
    kw = dict(model=MODEL_ID, input="Write a haiku about the sea.", max_output_tokens=16, temperature=0)
    whole = client.responses.create(**kw)
    events = _events(client.responses.create(stream=True, **kw))
    kinds = [e.type for e in events]
    n_deltas = kinds.count("response.output_text.delta")
    assert n_deltas >= 2
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added"] + ["response.output_text.delta"] * n_deltas + \
        ["response.output_text.done", "response.content_part.done", "response.output_item.done",
         "response.completed" if whole.status == "completed" else "response.incomplete"]
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text
    done = next(e for e in events if e.type == "response.output_text.done")
    assert done.text == text and done.item_id == events[2].item.id
    final = events[-1].response
    assert final.output_text == text and final.usage.output_tokens == whole.usage.output_tokens
    assert final.status == whole.status


def test_refused_requests(live, client):
    with pytest.raises(openai.NotFoundError, match="'resp_123'"):
        client.responses.create(model=MODEL_ID, input="Hi", previous_response_id="resp_123", max_output_tokens=4)
    with pytest.raises(openai.BadRequestError, match="'conversation' is not supported"):
        client.responses.create(model=MODEL_ID, input="Hi", conversation="conv_1", max_output_tokens=4)
    with pytest.raises(openai.BadRequestError, match="remote images are not fetched"):
        client.responses.create(model=MODEL_ID, max_output_tokens=4, input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": "http://127.0.0.1/x.png"}]}])
    with pytest.raises(openai.BadRequestError, match="only function tools"):
        client.responses.create(model=MODEL_ID, input="Hi", tools=[{"type": "web_search"}], max_output_tokens=4)
    # SmolLM2's template has no notion of tools: the generic tool prompt, and the call under a grammar
    r = client.responses.create(model=MODEL_ID, input=QUESTION, tools=TOOLS, tool_choice="required",
                                max_output_tokens=40, temperature=0)
    calls = [o for o in r.output if o.type == "function_call"]
    assert [c.name for c in calls] == ["get_weather"] and isinstance(json.loads(calls[0].arguments)["city"], str)
    assert_error(post(live, "/v1/responses", {"model": MODEL_ID}), 400, "'input' is required")
    assert_error(post(live, "/v1/responses", {"input": "Hi", "max_output_tokens": 0}), 400, "max_output_tokens")
    # past the server's cap: the error names the Responses field, not chat's max_tokens
    err = assert_error(post(live, "/v1/responses", {"input": "Hi", "max_output_tokens": 10**6}), 400,
                       "max_output_tokens is 1000000")
    assert err["param"] == "max_output_tokens", err
    assert_error(post(live, "/v1/responses", {"input": [{"type": "item_reference", "id": "x"}]}), 400,
                 "item_reference")
    assert_error(post(live, "/v1/responses", {"input": "Hi", "text": {"format": {"type": "json_schema",
                                                                               "name": "x", "schema": 3}}}),
                 400, "text.format.schema")
    assert_error(post(live, "/v1/responses", {"input": "Hi", "text": {"format": {"type": "yaml"}}}), 400,
                 "text.format")
    # a schema that does not compile (llguidance's error, at prepare) names text.format, not chat's response_format
    err = assert_error(post(live, "/v1/responses", {"input": "Hi", "text": {"format": {
        "type": "json_schema", "name": "x", "schema": {"type": "integer", "minimum": 5, "maximum": 1}}}}),
        400, "'text.format'", "minimum")
    assert err["param"] == "text.format" and "response_format" not in err["message"], err
    # a tool_choice object is refused in the Responses API's own shape (chat's nested one is not it)
    for choice in ({"type": "function"}, {"type": "function", "function": {"name": "get_weather"}},
                   {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "get_weather"}]}):
        msg = assert_error(post(live, "/v1/responses", {"input": "Hi", "tools": TOOLS, "tool_choice": choice}), 400,
                           "tool_choice")["message"]
        assert '"name": "..."' in msg and '"function": {' not in msg, msg
    forced = client.responses.create(model=MODEL_ID, input=QUESTION, tools=TOOLS, max_output_tokens=40, temperature=0,
                                     tool_choice={"type": "function", "name": "get_weather"})
    assert [o.name for o in forced.output if o.type == "function_call"] == ["get_weather"], forced.output


def test_errors_about_the_prompt_name_input(live, model):
    # the chat spec the input becomes has 'messages', a field a Responses client never sent
    from llambda.chat import ChatTemplate
    kept = model._template
    model._template = ChatTemplate("{{ raise_exception('no such turn') }}")
    try:
        for path in ("/v1/responses", "/v1/responses/input_tokens"):
            err = assert_error(post(live, path, {"model": MODEL_ID, "input": "Hi", "max_output_tokens": 2}), 400,
                               "cannot render", "no such turn")
            assert err["param"] == "input", err
    finally:
        model._template = kept
    err = assert_error(post(live, "/v1/responses", {"input": "word " * 800, "max_output_tokens": 2}), 400, "context")
    assert err["param"] == "input" and err["code"] == "context_length_exceeded", err


def test_an_input_chat_would_refuse_is_refused_naming_input(live):
    # the checks chat makes of its messages named 'messages', which a Responses request does not have
    thought = {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "Hmm."}]}
    err = assert_error(post(live, "/v1/responses", {"input": [thought]}), 400, "'input'", "reasoning")
    assert err["param"] == "input", err
    many = {"input": [{"role": "user", "content": "Hi"}] * 4097}      # more than the 64 KiB body of `live`
    with pytest.raises(APIError) as e:
        parse_responses(many, ResponseStore())
    assert e.value.param == "input" and "4097" in e.value.message and "messages'" not in e.value.message


def test_json_schema_format(live):
    """text.format json_schema is validated and handed to the chat spec's response_format, which
    constrains the output: valid JSON."""
    schema = {"type": "object", "properties": {"color": {"type": "string"}}, "required": ["color"]}
    body = {"model": MODEL_ID, "input": "Name a color as JSON.", "max_output_tokens": 24, "temperature": 0,
            "text": {"format": {"type": "json_schema", "name": "color", "schema": schema, "strict": True}}}
    r = post(live, "/v1/responses", body)
    out = r.json()
    assert r.status_code == 200 and out["text"]["format"]["name"] == "color", out
    assert out["status"] == "completed"
    assert isinstance(json.loads(out["output"][0]["content"][0]["text"])["color"], str)


def test_client_hanging_up_mid_stream(live):
    """The generation is cancelled (its slot freed) and the stream ends without an error escaping."""
    cancelled = 'llambda_sequences_finished_total{reason="cancelled"}'
    before = live.metrics().get(cancelled, 0)
    errors = hang_up_mid_stream(live, "/v1/responses", {"model": MODEL_ID, "input": "Tell me a long story.", "max_output_tokens": 200,
                                                     "ignore_eos": True})
    assert errors == []
    assert live.metrics()[cancelled] == before + 1


# -- stored responses (SmolLM2) ----------------------------------------------------------------

def _items(*texts):
    roles = ("user", "assistant")
    return [{"role": roles[i % 2], "content": t} for i, t in enumerate(texts)]


def test_previous_response_id_continues_the_conversation_without_its_instructions(client):
    first = client.responses.create(model=MODEL_ID, input="What is the capital of France?", instructions="Be brief.",
                                    max_output_tokens=12, temperature=0)
    assert first.store is True and first.previous_response_id is None
    kw = dict(model=MODEL_ID, max_output_tokens=12, temperature=0)
    follow = client.responses.create(input="And of Spain?", previous_response_id=first.id, **kw)
    # the same conversation sent whole: the first turn, its answer, the new turn; no system message
    whole = client.responses.create(input=_items("What is the capital of France?", first.output_text,
                                                 "And of Spain?"), **kw)
    assert follow.previous_response_id == first.id and follow.id not in (first.id, whole.id)
    assert follow.output_text == whole.output_text and follow.output_text
    assert follow.usage.input_tokens == whole.usage.input_tokens
    # streamed alike, and the streamed answer is stored as its last event holds it
    events = _events(client.responses.create(input="And of Spain?", previous_response_id=first.id, stream=True, **kw))
    final = events[-1].response
    assert final.output_text == whole.output_text and final.previous_response_id == first.id
    assert client.responses.retrieve(final.id).model_dump() == final.model_dump()
    # a chain: the third turn continues the second, which continued the first
    third = client.responses.create(input="And of Italy?", previous_response_id=follow.id, **kw)
    whole3 = client.responses.create(input=_items("What is the capital of France?", first.output_text,
                                                  "And of Spain?", follow.output_text, "And of Italy?"), **kw)
    assert third.output_text == whole3.output_text and third.usage.input_tokens == whole3.usage.input_tokens


NOT_FOUND = 'llambda_requests_total{endpoint="/v1/responses/{id}",status="404"}'


def test_retrieve_returns_the_response_and_delete_removes_it(live, client):
    r = client.responses.create(model=MODEL_ID, input="Name three colors.", max_output_tokens=8, temperature=0,
                                metadata={"k": "v"})
    got = client.responses.retrieve(r.id)
    assert got.model_dump() == r.model_dump() and got.metadata == {"k": "v"}
    not_found = live.metrics().get(NOT_FOUND, 0)
    raw = httpx.delete(f"{live.url}/v1/responses/{r.id}", timeout=30)
    assert raw.status_code == 200 and raw.json() == {"id": r.id, "object": "response", "deleted": True}
    for call in (lambda: client.responses.retrieve(r.id), lambda: client.responses.delete(r.id),
                 lambda: client.responses.input_items.list(r.id),
                 lambda: client.responses.create(model=MODEL_ID, input="Hi", previous_response_id=r.id)):
        with pytest.raises(openai.NotFoundError, match=r.id):
            call()
    assert_error(httpx.get(f"{live.url}/v1/responses/{r.id}x", timeout=30), 404, "no stored response")
    # /metrics counts them under one label, not one per id: retrieve, delete, input_items and the last one
    assert live.metrics()[NOT_FOUND] == not_found + 4
    # a stored response cannot be streamed again: refused rather than answered in the wrong format
    kept = client.responses.create(model=MODEL_ID, input="Hi", max_output_tokens=2)
    assert_error(httpx.get(f"{live.url}/v1/responses/{kept.id}?stream=true", timeout=30), 400, "stream")


def test_a_response_deleted_while_it_streams_is_not_kept(live):
    """DELETE of a response still streaming said 404 "never stored", and the response was stored when
    its answer ended: the delete was lost. Now it is honoured (200; the finished response says store
    false and is not kept), and a GET meanwhile says it is still being generated."""
    import gc
    store = live.app.state.responses
    body = {"model": MODEL_ID, "input": "Tell me a long story.", "max_output_tokens": 250, "ignore_eos": True,
            "stream": True}
    for delete in (True, False):
        with httpx.stream("POST", live.url + "/v1/responses", json=body, timeout=60) as s:
            events = (json.loads(line[5:]) for line in s.iter_lines() if line.startswith("data:"))
            rid = next(events)["response"]["id"]
            assert_error(httpx.get(f"{live.url}/v1/responses/{rid}", timeout=30), 404, "still being generated")
            if delete:
                r = httpx.delete(f"{live.url}/v1/responses/{rid}", timeout=30)
                assert r.status_code == 200 and r.json() == {"id": rid, "object": "response", "deleted": True}, r.text
            last = [e for e in events][-1]
        assert last["type"] == "response.incomplete" and last["response"]["store"] is (not delete), last["response"]
        got = httpx.get(f"{live.url}/v1/responses/{rid}", timeout=30)
        assert got.status_code == (404 if delete else 200), got.text
    # a stream left half-way is never stored, and not remembered as pending either
    hang_up_mid_stream(live, "/v1/responses", body)
    gc.collect()
    assert not store._pending


def test_metadata_is_bounded_as_in_openais_api_and_echoed(live, client):
    # it is echoed and stored with every response: unbounded, it was as large as the body allowed
    most = {f"{i:02d}" + "k" * 62: "v" * 512 for i in range(16)}
    r = client.responses.create(model=MODEL_ID, input="Hi", max_output_tokens=2, metadata=most)
    assert r.metadata == most and client.responses.retrieve(r.id).metadata == most
    assert client.responses.create(model=MODEL_ID, input="Hi", max_output_tokens=2, store=False).metadata == {}
    for metadata, words in (({**most, "one more": "v"}, ("17 keys", "16")),
                            ({"k" * 65: "v"}, ("65 characters", "64")),
                            ({"k": "v" * 513}, ("'k'", "513 characters", "512")),
                            ({"k": 5}, ("'k'", "string")), ({"k": None}, ("'k'", "string")),
                            (["k", "v"], ("object",))):
        err = assert_error(post(live, "/v1/responses", {"input": "Hi", "metadata": metadata}), 400, "metadata", *words)
        assert err["param"] == "metadata", err


def test_ignored_fields_are_of_openais_types():
    """truncation, user, service_tier, safety_identifier and prompt_cache_key change nothing here, but
    were taken whatever they held (a number, an object); now a wrong type is a 400 naming the field."""
    store = ResponseStore()
    body = {"model": MODEL_ID, "input": "Hi"}
    for name, value in (("truncation", "sometimes"), ("truncation", True), ("truncation", ["auto"]),
                        ("user", 5), ("user", {"id": "u"}), ("service_tier", 1), ("safety_identifier", []),
                        ("prompt_cache_key", False)):
        with pytest.raises(APIError) as e:
            parse_responses({**body, name: value}, store)
        assert e.value.status == 400 and e.value.param == name and name in e.value.message, (name, value)
    fine = {"truncation": "disabled", "user": "u-1", "service_tier": "auto", "safety_identifier": "s",
            "prompt_cache_key": "k"}
    assert parse_responses({**body, **fine}, store)[0].messages == parse_responses(body, store)[0].messages
    assert parse_responses({**body, "truncation": "auto", "user": None}, store)[0].messages


def test_store_false_keeps_nothing(live, client):
    r = client.responses.create(model=MODEL_ID, input="Name three colors.", max_output_tokens=4, store=False)
    assert r.store is False
    with pytest.raises(openai.NotFoundError, match="never stored"):
        client.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model=MODEL_ID, input="More.", previous_response_id=r.id, max_output_tokens=4)
    err = e.value.body
    assert err["param"] == "previous_response_id" and err["code"] == "previous_response_not_found", err
    streamed = _events(client.responses.create(model=MODEL_ID, input="Hi", max_output_tokens=4, store=False,
                                               stream=True))
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(streamed[-1].response.id)
    assert_error(post(live, "/v1/responses", {"input": "Hi", "store": "no"}), 400, "'store' must be a boolean")
    assert_error(post(live, "/v1/responses", {"input": "Hi", "previous_response_id": 5}), 400,
                 "previous_response_id")


def test_input_items_pages_in_either_order(live, client):
    texts = [f"Turn {i}." for i in range(5)]
    r = client.responses.create(model=MODEL_ID, input=_items(*texts), max_output_tokens=2)
    asc = list(client.responses.input_items.list(r.id, limit=2, order="asc"))    # the SDK follows `after`
    assert [i.content[0].text for i in asc] == texts and [i.role for i in asc] == [m["role"] for m in _items(*texts)]
    assert len({i.id for i in asc}) == 5
    desc = list(client.responses.input_items.list(r.id, limit=3))      # desc by default, as OpenAI's
    assert [i.id for i in desc] == [i.id for i in reversed(asc)]
    page = httpx.get(f"{live.url}/v1/responses/{r.id}/input_items", params={"limit": 2, "order": "asc",
                                                                          "after": asc[1].id}, timeout=30).json()
    assert page["object"] == "list" and [i["id"] for i in page["data"]] == [asc[2].id, asc[3].id]
    assert page["first_id"] == asc[2].id and page["last_id"] == asc[3].id and page["has_more"] is True
    last = httpx.get(f"{live.url}/v1/responses/{r.id}/input_items", params={"order": "asc", "after": asc[4].id},
                     timeout=30).json()
    assert last["data"] == [] and last["has_more"] is False and last["first_id"] is None
    for params, word in (({"limit": 0}, "limit"), ({"limit": 101}, "limit"), ({"limit": "x"}, "limit"),
                         ({"order": "up"}, "order"), ({"after": "msg_nope"}, "after")):
        assert_error(httpx.get(f"{live.url}/v1/responses/{r.id}/input_items", params=params, timeout=30), 400, word)
    # a continued response's items: the earlier input, the earlier output, then the new input
    follow = client.responses.create(model=MODEL_ID, input="Last turn.", previous_response_id=r.id, max_output_tokens=2)
    items = list(client.responses.input_items.list(follow.id, order="asc"))
    assert [i.id for i in items] == [i.id for i in asc] + [o.id for o in r.output] + [items[-1].id]
    assert items[-1].content[0].text == "Last turn." and items[5].content[0].text == r.output_text


def test_input_items_keep_only_each_types_own_fields(live):
    # a field a client adds reaches no prompt: kept, it was listed back and parsed again by every
    # request continuing the conversation (junk such as [{}, {}, ...] costs ~24x its JSON once parsed)
    junk = [{}] * 1_000
    call = {"call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'}
    items = [{"type": "message", "role": "developer", "content": "Be brief.", "status": "completed", "note": junk},
             {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Plan.", "x": junk}],
              "content": [{"type": "reasoning_text", "text": "Think.", "x": junk}], "encrypted_content": "e" * 999},
             {"type": "function_call", "id": "fc_given", "status": "completed", "extra": junk, **call},
             {"type": "function_call_output", "call_id": "call_1", "output": '{"temperature_c": 18}', "extra": junk},
             {"role": "user", "id": "i" * 200, "status": junk,
              "content": [{"type": "input_text", "text": "Thanks.", "annotations": junk}]}]
    r = post(live, "/v1/responses", {"model": MODEL_ID, "input": items, "max_output_tokens": 2})
    assert r.status_code == 200, r.text
    listed = httpx.get(f"{live.url}/v1/responses/{r.json()['id']}/input_items", params={"order": "asc"},
                       timeout=30).json()["data"]
    assert [{k: v for k, v in item.items() if k != "id"} for item in listed] == [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be brief."}],
         "status": "completed"},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Plan."}],
         "content": [{"type": "reasoning_text", "text": "Think."}], "encrypted_content": "e" * 999},
        {"type": "function_call", "status": "completed", **call},
        {"type": "function_call_output", "call_id": "call_1", "output": '{"temperature_c": 18}'},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Thanks."}]}]
    # a client's id is kept, one too long to be an id is replaced
    assert listed[2]["id"] == "fc_given" and listed[4]["id"].startswith("msg_") and len(listed[4]["id"]) < 100
    assert len(live.app.state.responses.get(r.json()["id"]).items) < 3_000
    # a summary is kept, so it is checked as content is
    assert_error(post(live, "/v1/responses", {"input": [{"type": "reasoning", "summary": "Plan."},
                                                        {"role": "user", "content": "Hi"}]}), 400, "input[0].summary")


def test_a_stored_conversation_is_parsed_off_the_event_loop(live, client, monkeypatch):
    # up to 16 MiB of JSON: parsed on the event loop, it stalled every running stream
    from llambda.server.response_store import Stored
    threads = []
    for name in ("input_items", "output_items"):
        parse = getattr(Stored, name)
        monkeypatch.setattr(Stored, name, lambda self, parse=parse: threads.append(threading.get_ident()) or
                            parse(self))
    first = client.responses.create(model=MODEL_ID, input="Hi", max_output_tokens=2)
    client.responses.create(model=MODEL_ID, input="More.", previous_response_id=first.id, max_output_tokens=2)
    client.responses.input_tokens.count(model=MODEL_ID, input="More.", previous_response_id=first.id)
    assert len(list(client.responses.input_items.list(first.id))) == 1
    assert len(threads) == 5 and live.thread.ident not in threads, (threads, live.thread.ident)


def test_a_response_is_serialized_once_off_the_event_loop_and_a_continuation_only_its_new_items(
        live, client, monkeypatch):
    # the stored conversation was written again whole by each continuing request (up to 16 MiB), and
    # a response was serialized twice, put() on the event loop, then the reply
    filler = "x" * 30_000           # kept (a reasoning summary), never in the prompt
    turn = [{"type": "reasoning", "summary": [{"type": "summary_text", "text": filler}]},
            {"role": "user", "content": "Hi"}]
    first = client.responses.create(model=MODEL_ID, input=turn, max_output_tokens=2)
    # echoed in the response, not in the prompt (tool_choice none): 20,000 characters
    tools = [{**TOOLS[0], "description": "Weather. " * 2_000}]
    echoed = len(tools[0]["description"])
    written = []        # (thread, characters) of each JSON text the server wrote
    real, tester = json.dumps, threading.get_ident()

    def spy(obj, *args, **kw):
        text = real(obj, *args, **kw)
        if threading.get_ident() != tester:
            written.append((threading.get_ident(), len(text)))
        return text
    monkeypatch.setattr(json, "dumps", spy)
    kw = dict(model=MODEL_ID, input="More.", tools=tools, tool_choice="none", previous_response_id=first.id,
              max_output_tokens=2)
    whole = client.responses.create(**kw)
    big = [thread for thread, n in written if n >= echoed]
    assert len(big) == 1 and live.thread.ident not in big, (written, live.thread.ident)
    assert max(n for _, n in written) < len(filler), written
    written.clear()
    events = _events(client.responses.create(stream=True, **kw))
    big = [thread for thread, n in written if n >= echoed]
    assert len(big) == 2 and live.thread.ident not in big, (written, live.thread.ident)      # started, finished
    assert max(n for _, n in written) < len(filler), written
    monkeypatch.undo()
    # what was sent is what was kept, and a continuation holds the whole conversation still
    for r in (whole, events[-1].response):
        assert client.responses.retrieve(r.id).model_dump() == r.model_dump()
        items = list(client.responses.input_items.list(r.id, order="asc"))
        assert items[0].summary[0].text == filler and [i.id for i in items[2:3]] == [first.output[0].id]
        assert items[-1].content[0].text == "More." and len(items) == 4
    assert events[0].response.tools[0].description == tools[0]["description"]
    assert events[0].response.status == "in_progress"


def test_stored_items_keep_encrypted_reasoning_and_annotations(live, client):
    # OpenAI keeps both: clients (the openai SDK's agents, include=["reasoning.encrypted_content"])
    # pass earlier reasoning items and answers back as they got them
    note = {"type": "url_citation", "url": "https://example.com/", "title": "Example", "start_index": 0,
            "end_index": 5}
    path = {"type": "file_path", "file_id": "file_1", "index": 2}
    items = [{"role": "user", "content": "Hi"},
             {"type": "reasoning", "id": "rs_given", "summary": [], "encrypted_content": "gAAAA-opaque=="},
             {"type": "message", "role": "assistant", "content": [
                 {"type": "output_text", "text": "Hello", "annotations": [note, {**path, "extra": [{}] * 50}]}]},
             {"role": "user", "content": "More."}]
    r = client.responses.create(model=MODEL_ID, input=items, max_output_tokens=2)
    follow = client.responses.create(model=MODEL_ID, input="Again.", previous_response_id=r.id, max_output_tokens=2)
    for response_id in (r.id, follow.id):
        listed = httpx.get(f"{live.url}/v1/responses/{response_id}/input_items", params={"order": "asc"},
                           timeout=30).json()["data"]
        assert listed[1] == {"id": "rs_given", "type": "reasoning", "summary": [],
                             "encrypted_content": "gAAAA-opaque=="}, listed[1]
        assert listed[2]["content"] == [{"type": "output_text", "text": "Hello", "annotations": [note, path]}]
    assert follow.usage.input_tokens > r.usage.input_tokens
    # an output_text part's annotations are OpenAI's types with their fields, encrypted_content a string
    text = {"type": "output_text", "text": "Hello"}
    for item, where, words in (
            ({"role": "assistant", "content": [{**text, "annotations": [{"type": "url_citation", "url": "u"}]}]},
             "input[0].content[0].annotations[0]", ("url_citation", "title")),
            ({"role": "assistant", "content": [{**text, "annotations": [{"type": "quote"}]}]},
             "input[0].content[0].annotations[0]", ("file_citation", "url_citation")),
            ({"role": "assistant", "content": [{**text, "annotations": {"type": "file_path"}}]},
             "input[0].content[0].annotations", ("array",)),
            ({"role": "assistant", "content": [{**text, "annotations": [{**path, "index": "2"}]}]},
             "input[0].content[0].annotations[0]", ("integer", "index")),
            ({"type": "reasoning", "summary": [], "encrypted_content": 5}, "input[0].encrypted_content", ("string",))):
        err = assert_error(post(live, "/v1/responses", {"input": [item, {"role": "user", "content": "Hi"}]}), 400,
                           where, *words)
        assert err["param"] == where, err


def test_an_item_role_or_annotation_type_that_is_no_string_is_a_400(live):
    """A fuzzer's find: an input item whose role was an object or an array (unhashable) was a 500
    TypeError, on /v1/responses and /v1/responses/input_tokens; so was an annotation's type."""
    for role in ({"": []}, [1], 5, None):
        for path in ("/v1/responses", "/v1/responses/input_tokens"):
            for item in ({"role": role, "content": "Hi"}, {"type": "message", "role": role, "content": "Hi"}):
                err = assert_error(post(live, path, {"model": MODEL_ID, "input": [item], "max_output_tokens": 2}), 400,
                                   "role")
                assert err["param"] == "input[0]", err
    # an output_text part's annotation of an unhashable type was a 500 TypeError too
    for kind in ([1], {"a": 1}):
        turn = {"role": "assistant", "content": [{"type": "output_text", "text": "o", "annotations": [{"type": kind}]}]}
        body = {"model": MODEL_ID, "input": [turn, {"role": "user", "content": "x"}], "max_output_tokens": 2}
        err = assert_error(post(live, "/v1/responses", body), 400, "annotation")
        assert err["param"] == "input[0].content[0].annotations[0]", err
    assert not [k for k in live.metrics() if 'status="5' in k]


def test_errors_name_the_responses_fields_not_chats(live, model):
    # chat's checks of its tools and of a prompt that cannot render named chat's fields
    # (tools[i].function, 'the messages'), which a Responses request does not have
    for tools, words in (([TOOLS[0], TOOLS[0]], "tools[1].name 'get_weather' is taken"),
                         ([{"type": "function", "name": "f", "parameters": 3}], "tools[0].parameters must be"),
                         ([{"type": "function", "name": "f", "parameters": {"type": "array"}}],
                          "tools[0].parameters must describe an object"),
                         ([{"type": "function"}], "tools[0] must be an object with a non-empty string 'name'")):
        err = assert_error(post(live, "/v1/responses", {"input": "Hi", "tools": tools}), 400, words)
        assert "function" not in err["message"].replace("'function'", "") and err["param"].startswith("tools["), err
    # a text part whose text is not a string is said so (it was "a 'input_text' part; only input_text ...")
    err = assert_error(post(live, "/v1/responses", {"input": [{"role": "user", "content": [
        {"type": "input_text", "text": 3}]}]}), 400, "input[0].content[0]", "string 'text'")
    assert "only input_text" not in err["message"], err
    # a client's type or name is quoted back cut short (it was whole: as long as the body allowed)
    long = "x" * 20_000
    for body, where in (({"input": [{"role": "user", "content": [{"type": long, "text": "Hi"}]}]},
                         "input[0].content[0]"),
                        ({"input": [{"type": long}]}, "input[0].type"),
                        ({"input": "Hi", "tools": [{"type": long}]}, "tools[0]"),
                        ({"input": "Hi", "tools": [{"type": "function", "name": long}] * 2}, "tools[1].name")):
        err = assert_error(post(live, "/v1/responses", body), 400, where, "20002 characters")
        assert len(err["message"]) < 500, len(err["message"])
    from llambda.chat import ChatTemplate
    kept = model._template
    model._template = ChatTemplate("{{ raise_exception('no such turn') }}")
    try:
        for body, fields in (({"input": "Hi"}, "'input'"),
                             ({"input": "Hi", "instructions": "Be brief."}, "'instructions' and 'input'")):
            err = assert_error(post(live, "/v1/responses", body), 400, f"cannot render {fields}: no such turn")
            assert "messages" not in err["message"] and err["param"] == "input", err
    finally:
        model._template = kept


def test_the_oldest_responses_are_evicted_past_the_count(live, client):
    store = live.app.state.responses
    assert (store.max_responses, store.max_bytes) == (live.app.state.config.stored_responses,
                                                      live.app.state.config.stored_bytes)
    before = store.max_responses
    store.max_responses = 2
    try:
        ids = [client.responses.create(model=MODEL_ID, input=f"Say {w}.", max_output_tokens=2).id
               for w in ("one", "two", "three")]
        with pytest.raises(openai.NotFoundError, match="evicted"):
            client.responses.retrieve(ids[0])
        assert [client.responses.retrieve(i).id for i in ids[1:]] == ids[1:]
        assert store.stats()["responses"] == 2
    finally:
        store.max_responses = before


def test_a_response_the_store_cannot_hold_says_store_false(live, client):
    # past --stored-bytes an entry is not kept: the answer said store: true all the same
    store = live.app.state.responses
    kw = dict(model=MODEL_ID, input="Name three colors.", max_output_tokens=2, temperature=0)   # one size
    entry = store.get(client.responses.create(**kw).id)
    before = store.max_bytes, store.max_responses
    store.max_bytes = entry.size - 1        # room for the input items, not for the answer with them
    try:
        held = store.stats()
        r = client.responses.create(**kw)
        assert r.store is False and store.stats() == held
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(r.id)
        events = _events(client.responses.create(stream=True, **kw))
        assert events[0].response.store is True and events[-1].response.store is False
        assert store.stats() == held
        # input alone past the budget: refused before generating, as a conversation past its own cap
        resp = post(live, "/v1/responses", {**kw, "input": "x" * entry.size})
        err = assert_error(resp, 400, str(store.max_bytes), "store: false")
        assert err["code"] == "conversation_too_large" and err["param"] == "input", err
        assert client.responses.create(**{**kw, "input": "Hi " * 100}, store=False).store is False
        # a server that stores none (--stored-responses 0) says so from the start
        store.max_bytes, store.max_responses = before[0], 0
        events = _events(client.responses.create(stream=True, **kw))
        assert events[0].response.store is False and events[-1].response.store is False
        assert client.responses.create(**kw).store is False
    finally:
        store.max_bytes, store.max_responses = before


def _response(i: int, text: str):
    return encode_response({"id": f"resp_{i}", "object": "response", "output": [{"type": "message", "content": text}]})


def _put(store: ResponseStore, response_id: str, response, items: list) -> bool:
    return store.put(response_id, response, dumps(items).encode())


def test_store_evicts_oldest_first_by_count_and_by_bytes():
    s = ResponseStore(max_responses=3, max_bytes=10**6)
    for i in range(5):
        assert _put(s, f"resp_{i}", _response(i, "x"), [{"type": "message", "id": f"m{i}"}])
    assert s.stats()["responses"] == 3
    with pytest.raises(Exception, match="evicted"):
        s.get("resp_1")
    assert s.get("resp_2").response_object()["id"] == "resp_2"
    one = s.get("resp_4").size
    s = ResponseStore(max_responses=100, max_bytes=2 * one + one // 2)    # room for two entries of that size
    for i in range(4):
        _put(s, f"resp_{i}", _response(i, "x"), [{"type": "message", "id": f"m{i}"}])
    assert s.stats() == {"responses": 2, "bytes": 2 * one}
    assert s.get("resp_3").input_items() == [{"type": "message", "id": "m3"}]
    # a bigger entry pushes out as many old ones as it needs; one bigger than the budget is not kept
    assert _put(s, "resp_big", _response(9, "y" * one), [])
    assert s.stats()["responses"] == 1
    assert not _put(s, "resp_huge", _response(9, "y" * 3 * one), []) and s.stats()["responses"] == 1
    s.delete("resp_big")
    assert s.stats() == {"responses": 0, "bytes": 0}
    with pytest.raises(Exception, match="not found|no stored response"):
        s.delete("resp_big")
    assert not _put(ResponseStore(max_responses=0), "resp_x", _response(0, "x"), [])


def test_store_keeps_its_bounds_under_concurrent_writers():
    s = ResponseStore(max_responses=50, max_bytes=20_000)

    def writer(k):
        for i in range(300):
            _put(s, f"resp_{k}_{i}", _response(i, "z" * (i % 97)), [{"id": f"m{k}{i}"}])
            if i % 7 == 0:
                try:
                    s.delete(f"resp_{k}_{i - 3}")
                except Exception:
                    pass
    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    st = s.stats()
    assert st["responses"] <= 50 and st["bytes"] <= 20_000
    assert st["bytes"] == sum(entry.size for entry in s._entries.values())


def test_input_tokens_are_the_prompt_tokens_generation_reports(live, client):
    kw = dict(model=MODEL_ID, input=_items("Hi", "Hello!", "Name three colors."), instructions="Be brief.")
    r = client.responses.create(max_output_tokens=2, **kw)
    counted = client.responses.input_tokens.count(**kw)
    assert counted.object == "response.input_tokens" and counted.input_tokens == r.usage.input_tokens
    # with tools (described in a generic system prompt for this model) and a continued response
    tools = client.responses.input_tokens.count(tools=TOOLS, **kw).input_tokens
    assert tools == client.responses.create(max_output_tokens=2, tools=TOOLS, **kw).usage.input_tokens
    assert tools > counted.input_tokens
    follow = dict(model=MODEL_ID, input="And two more?", previous_response_id=r.id)
    assert client.responses.input_tokens.count(**follow).input_tokens == \
        client.responses.create(max_output_tokens=2, **follow).usage.input_tokens
    # a stored conversation alone (no new input, as the SDK allows) counts as that conversation sent whole
    alone = client.responses.input_tokens.count(model=MODEL_ID, previous_response_id=r.id).input_tokens
    whole = _items("Hi", "Hello!", "Name three colors.") + [
        {"role": "assistant", "content": r.output_text}]
    assert alone == client.responses.input_tokens.count(model=MODEL_ID, input=whole).input_tokens
    # the create's checks and errors; a text past the cap is refused before any tokenizing
    assert_error(post(live, "/v1/responses/input_tokens", {"model": MODEL_ID}), 400, "'input' is required")
    assert_error(post(live, "/v1/responses/input_tokens", {"model": "other", "input": "Hi"}), 404, "other")
    assert_error(post(live, "/v1/responses/input_tokens", {"input": "Hi", "previous_response_id": "resp_gone"}),
                 404, "resp_gone")


# -- function tools (Qwen2.5-Coder) ------------------------------------------------------------

def test_function_tool_call(qwen_live):
    client = qwen_live.client()
    kw = dict(model="qwen", input=QUESTION, tools=TOOLS, tool_choice="required", max_output_tokens=24, temperature=0)
    r = client.responses.create(**kw)
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1, r.output
    call = calls[0]
    assert call.name == "get_weather" and call.call_id and call.status == "completed"
    assert json.loads(call.arguments)["city"] == "Paris"
    assert r.tools[0].name == "get_weather" and r.tool_choice == "required"

    # streamed: the call announced as an item, its arguments in deltas, then done
    events = _events(client.responses.create(stream=True, **kw))
    added = [e for e in events if e.type == "response.output_item.added" and e.item.type == "function_call"]
    assert len(added) == 1 and added[0].item.name == "get_weather" and added[0].item.arguments == ""
    item_id = added[0].item.id
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert done.item_id == item_id and done.arguments == args == call.arguments
    final = next(e for e in events if e.type == "response.output_item.done" and e.item.type == "function_call")
    assert final.item.arguments == args and final.item.status == "completed"
    assert events[-1].type in ("response.completed", "response.incomplete")
    assert [o.type for o in events[-1].response.output] == [o.type for o in r.output]

    # the next turn: the call and its output as items, rendered as the chat template renders them
    follow = [{"role": "user", "content": QUESTION},
              {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
              {"type": "function_call_output", "call_id": call.call_id, "output": '{"temperature_c": 18}'}]
    r2 = client.responses.create(model="qwen", input=follow, tools=TOOLS, max_output_tokens=8, temperature=0)
    messages = [{"role": "user", "content": QUESTION},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": call.call_id, "type": "function",
                     "function": {"name": call.name, "arguments": call.arguments}}]},
                {"role": "tool", "tool_call_id": call.call_id, "content": '{"temperature_c": 18}'}]
    m = qwen_live.model
    rendered = m.render_chat(messages, tools=CHAT_TOOLS)
    assert "<tool_response>\n{\"temperature_c\": 18}\n</tool_response>" in rendered
    assert r2.usage.input_tokens == len(m._prompt_ids(rendered))


def _answer(r) -> list:
    """What a response said: its items' kinds, texts and calls (ids differ between responses)."""
    return [(o.type, o.content[0].text if o.type == "message" else (o.name, o.arguments)) for o in r.output]


def test_tool_round_trip_through_previous_response_id(qwen_live):
    """The call's output answered through previous_response_id gives what sending the whole conversation gives."""
    client = qwen_live.client()
    kw = dict(model="qwen", tools=TOOLS, temperature=0)
    first = client.responses.create(input=QUESTION, tool_choice="required", max_output_tokens=24, **kw)
    [call] = [o for o in first.output if o.type == "function_call"]
    answer = {"type": "function_call_output", "call_id": call.call_id, "output": '{"temperature_c": 18}'}
    follow = client.responses.create(input=[answer], previous_response_id=first.id, max_output_tokens=40, **kw)
    whole = client.responses.create(max_output_tokens=40, input=[
        {"role": "user", "content": QUESTION},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        answer], **kw)
    assert _answer(follow) == _answer(whole) and follow.output, follow.output
    assert follow.usage.input_tokens == whole.usage.input_tokens
    streamed = _events(client.responses.create(input=[answer], previous_response_id=first.id, max_output_tokens=40,
                                               stream=True, **kw))
    assert _answer(streamed[-1].response) == _answer(whole)
    counted = client.responses.input_tokens.count(model="qwen", tools=TOOLS, input=[answer],
                                                  previous_response_id=first.id)
    assert counted.input_tokens == follow.usage.input_tokens


def test_a_chain_cannot_grow_one_stored_conversation_past_its_cap(live, client):
    # each entry holds its whole conversation, text no template reads included (a reasoning item's
    # summary): without a cap per conversation, a chain of requests would grow one entry to the whole
    # budget, which every continuing request then parses whole
    store = live.app.state.responses
    before = store.max_conversation_bytes
    store.max_conversation_bytes = 50_000
    filler = "x" * 20_000       # kept, but never reaches the prompt
    turn = [{"type": "reasoning", "summary": [{"type": "summary_text", "text": filler}]},
            {"role": "user", "content": "Hi"}]
    try:
        first = client.responses.create(model=MODEL_ID, input=turn, max_output_tokens=2)
        second = client.responses.create(model=MODEL_ID, input=turn, previous_response_id=first.id,
                                         max_output_tokens=2)
        held = store.stats()
        resp = post(live, "/v1/responses", {"model": MODEL_ID, "input": turn, "previous_response_id": second.id,
                                            "max_output_tokens": 2})
        assert_error(resp, 400, "conversation", "50000", "store: false")
        assert resp.json()["error"]["code"] == "conversation_too_large"
        assert store.stats() == held        # refused before generating: nothing new kept
        # not kept, it may still be answered
        assert client.responses.create(model=MODEL_ID, input=turn, previous_response_id=second.id,
                                       max_output_tokens=2, store=False).status in ("completed", "incomplete")
    finally:
        store.max_conversation_bytes = before


def test_input_tokens_is_no_stored_response_id(live):
    # GET or DELETE on the counting endpoint is a wrong method there, not a lookup of a response
    # whose id would be 'input_tokens'
    for method in ("GET", "DELETE"):
        resp = httpx.request(method, f"{live.url}/v1/responses/input_tokens", timeout=30)
        assert_error(resp, 405, method, "/v1/responses/input_tokens")
        assert "no stored response" not in resp.text


@pytest.mark.parametrize("stream", [False, True])
def test_a_lone_surrogate_is_a_400_not_a_crash(live, stream):
    # JSON may escape half a surrogate pair; no UTF-8 answer (nor stored response) can hold it. In a
    # field no template reads (metadata, an item's extra field) it reached the answer: a 500, or a
    # stream cut short
    for body, where in ((b'"metadata": {"a": "x\\ud800"}', "metadata.a"),
                        (b'"metadata": {"\\udc00": "x"}', "metadata"),
                        (b'"input": [{"role": "user", "content": "Hi", "note": "\\uDBFF"}]', "input[0].note")):
        raw = b'{"model": "%s", "max_output_tokens": 2, "stream": %s, %s' % (
            MODEL_ID.encode(), b"true" if stream else b"false", body)
        if not raw.endswith(b"]"):
            raw += b', "input": "Hi"'
        resp = post(live, "/v1/responses", content=raw + b"}", headers={"content-type": "application/json"})
        assert_error(resp, 400, "surrogate", where)
    # a pair is one character, and an escaped backslash before 'ud800' is text
    for text in ("\\ud83d\\ude00", "\\\\ud800"):
        raw = b'{"model": "%s", "max_output_tokens": 2, "input": "Hi", "metadata": {"a": "%s"}}' % (
            MODEL_ID.encode(), text.encode())
        assert post(live, "/v1/responses", content=raw, headers={"content-type": "application/json"}).status_code == 200


def test_chat_template_kwargs_are_taken_and_checked_as_chats():
    # a client could not turn a model's thinking off on this route: only reasoning.effort reached the template
    spec = parse_responses({"input": "Hi", "chat_template_kwargs": {"enable_thinking": False},
                            "reasoning": {"effort": "low"}}, ResponseStore())[0]
    assert spec.template_kwargs == {"enable_thinking": False, "reasoning_effort": "low"}
    for kwargs, words in (({"messages": []}, "set by the renderer itself"), (3, "must be an object")):
        with pytest.raises(APIError) as e:
            parse_responses({"input": "Hi", "chat_template_kwargs": kwargs}, ResponseStore())
        assert e.value.param == "chat_template_kwargs" and words in e.value.message, e.value.message
    with pytest.raises(APIError) as e:
        parse_responses({"input": "Hi", "chat_template_kwargs": {"reasoning_effort": "high"},
                         "reasoning": {"effort": "low"}}, ResponseStore())
    assert e.value.param == "reasoning.effort" and "give it once" in e.value.message


def test_include_is_a_list_of_openais_values():
    spec = parse_responses({"input": "Hi", "include": ["reasoning.encrypted_content", "file_search_call.results"]},
                           ResponseStore())[0]
    assert spec.template_kwargs == {} and not spec.logprobs
    # the logprobs are chat's, with top_logprobs alternatives (tests/test_responses_logprobs.py)
    spec = parse_responses({"input": "Hi", "include": ["message.output_text.logprobs"], "top_logprobs": 4},
                           ResponseStore())[0]
    assert spec.logprobs and spec.top_logprobs == 4
    for include, param, words in (("reasoning.encrypted_content", "include", "must be an array of strings"),
                                  (["reasoning.summary"], "include[0]", "known values"),
                                  ([3], "include[0]", "known values")):
        with pytest.raises(APIError) as e:
            parse_responses({"input": "Hi", "include": include}, ResponseStore())
        assert e.value.param == param and words in e.value.message, e.value.message
