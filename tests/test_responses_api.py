"""POST /v1/responses (OpenAI's Responses API) on a live loopback server, driven by the official
`openai` client: text and item input, instructions, streaming events, function tools (Qwen2.5-Coder,
whose template renders tools), and the 400s for what is not supported."""
from __future__ import annotations

import json

import openai
import pytest

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
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        client.responses.create(model=MODEL_ID, input="Hi", previous_response_id="resp_123", max_output_tokens=4)
    with pytest.raises(openai.BadRequestError, match="input_image"):
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
