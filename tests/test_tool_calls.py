"""Tool calls: the parser of model output (streamed and whole), and tools end to end with a Qwen template."""
from __future__ import annotations

import json
import random
import re

import openai
import pytest

import llambda
from llambda.server import ServerConfig, create_app
from llambda.server.tools import ToolSetup, extract_tool_calls, hermes_prefix
from serverkit import LOAD_KW, LiveServer

# -- the parser ------------------------------------------------------------------------------

CALL_ID = re.compile(r"^call_[0-9a-f]{24}$")
NAMES = {"get_weather", "a", "b", "ok", "f"}


def test_single_tool_call():
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "°C"}}\n</tool_call>'
    content, calls = extract_tool_calls(text, NAMES)
    assert content == "" and len(calls) == 1
    call = calls[0]
    assert CALL_ID.match(call["id"]) and call["type"] == "function"
    assert call["function"]["name"] == "get_weather"
    assert call["function"]["arguments"] == '{"city": "Paris", "unit": "°C"}'


def test_several_calls_with_surrounding_text():
    text = ('Let me check.\n<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n'
            '<tool_call>{"name": "b", "arguments": {"n": [1, 2]}}</tool_call>\nDone.')
    content, calls = extract_tool_calls(text, NAMES)
    assert [c["function"]["name"] for c in calls] == ["a", "b"]
    assert calls[1]["function"]["arguments"] == '{"n": [1, 2]}'
    assert calls[0]["id"] != calls[1]["id"]
    assert content == "Let me check.\nDone."      # the blanks just before a call are not content


def test_what_is_not_a_call_stays_content():
    for text in ['<tool_call>\n{"name": "a", "arguments": {oops}\n</tool_call>',   # malformed JSON
                 '<tool_call>{"arguments": {}}</tool_call>',                         # no name
                 '<tool_call>[1, 2]</tool_call>',                                    # not an object
                 '<tool_call>{"name": "rm", "arguments": {}}</tool_call>',           # not an offered tool
                 "plain answer"]:
        assert extract_tool_calls(text, NAMES) == (text, [])
    # a complete call the model did not close (it stopped at end-of-text) still counts
    assert extract_tool_calls('<tool_call>\n{"name": "a", "arguments": {}}', NAMES)[1][0]["function"]["name"] == "a"
    # one good, one bad: the good one is extracted, the bad one kept verbatim
    mixed = '<tool_call>{"name": "ok", "arguments": {}}</tool_call>\n<tool_call>{bad}</tool_call>'
    content, calls = extract_tool_calls(mixed, NAMES)
    assert [c["function"]["name"] for c in calls] == ["ok"]
    assert content == "<tool_call>{bad}</tool_call>"


def test_tool_call_argument_variants():
    for body, args in [('{"name": "f", "parameters": {"x": 1}}', '{"x": 1}'),
                       ('{"name": "f"}', "{}"),
                       ('{"name": "f", "arguments": "{\\"x\\": 1}"}', '{"x": 1}')]:
        _, calls = extract_tool_calls(f"<tool_call>{body}</tool_call>", NAMES)
        assert calls[0]["function"]["arguments"] == args, body


def _parse_in_pieces(text, names, prefix="", parallel=True, seed=0):
    """Feed `text` to the Hermes form's parser in random pieces; (content, calls assembled from the deltas)."""
    rng = random.Random(seed)
    p = ToolSetup(names, prefix, parallel).parser()
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
        # the blank before the call is not content: streamed as read whole (it waits until a call or text follows)
        ('Sure. <tool_call>\n{"name": "get_weather", "arguments": ' + json.dumps(weather) + '}\n</tool_call>',
         "Sure.", [("get_weather", weather)]),
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
        ('Hm. \n<tool_call>{"name": "rm_rf"}</tool_call>', 'Hm. \n<tool_call>{"name": "rm_rf"}</tool_call>', []),
        ('a  \n b \n', 'a  \n b \n', []),        # blanks no call follows: content, the last ones at the end
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
    # cut short by max_tokens: the call as far as it got, as streaming sent it (earlier calls too)
    cut = 'Sure. <tool_call>{"name": "get_time", "arguments": {"city": "Ro'
    assert _parse_in_pieces(cut, names) == ("Sure.", [{"name": "get_time", "arguments": '{"city": "Ro'}])
    content, calls = extract_tool_calls(cut, names)
    assert content == "Sure." and [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == \
        [("get_time", '{"city": "Ro')]
    two_cut = '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>' + cut
    assert [c["function"]["arguments"] for c in extract_tool_calls(two_cut, names)[1]] == ["{}", '{"city": "Ro']
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




# -- the grammar of calls ----------------------------------------------------------------------

def test_tool_parameters_with_local_refs_compile_in_every_mode():
    """pydantic (and openai.pydantic_function_tool) write nested models and enums as "#/$defs/..."
    refs. Under tool_choice "auto", or "required" with parallel calls, every tool's parameters sit
    inside one call schema, where those refs pointed at its root: a 400 ("Pointer '/$defs/Unit'
    does not exist") for a well-formed tool. Each tool's parameters are now a resource of their own."""
    from test_constrained import ByteVocab

    from llambda.constraints import ConstraintError, Grammars, grammar_spec
    from llambda.server.tools import tool_grammar

    unit = {"$defs": {"Unit": {"enum": ["c", "f"]}}, "type": "object", "required": ["city", "unit"],
            "properties": {"city": {"type": "string"}, "unit": {"$ref": "#/$defs/Unit"}}}
    draft7 = {"$schema": "http://json-schema.org/draft-07/schema#", "definitions": {"U": {"enum": ["k"]}},
              "type": "object", "properties": {"u": {"$ref": "#/definitions/U"}}, "required": ["u"]}
    tools = [{"type": "function", "function": {"name": n, "parameters": p}} for n, p in (("w", unit), ("v", draft7))]
    grammars = Grammars(ByteVocab(), 257)
    for choice, parallel, opening in (("auto", True, "<tool_call>\n"), ("required", True, ""), ("required", False, "")):
        g = grammars.compile(grammar_spec(grammar=tool_grammar(tools, {"w", "v"}, choice, parallel)))
        for name, args, ok in (("w", '{"city": "Oslo", "unit": "c"}', True), ("v", '{"u": "k"}', True),
                               ("w", '{"city": "Oslo", "unit": "k"}', False), ("v", '{"u": "c"}', False)):
            call = f'{{"name": "{name}", "arguments": {args}}}'
            # "required" answers start after the prefilled `<tool_call>\n{"name": "`
            text = opening + call + "\n</tool_call>" if opening else call[len('{"name": "'):] + "\n</tool_call>"
            c = g.start()
            try:
                for b in text.encode():
                    c.advance(b)
                took = c.accepting
            except ConstraintError:
                took = False
            assert took == ok, (choice, parallel, text)


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


# -- a call cut by the output limit: the same answer streamed or not, in all three APIs -----------

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
           "required": ["city", "unit"]}
PARIS = [{"role": "user", "content": "What is the weather in Paris right now, in celsius?"}]


def _chat_cut(c, limit, **kw) -> tuple:
    """(finish, content, calls) of a chat answer, non-streamed and streamed."""
    r = c.chat.completions.create(max_tokens=limit, **kw).choices[0]
    whole = (r.finish_reason, r.message.content or "",
             [{"name": t.function.name, "arguments": t.function.arguments} for t in r.message.tool_calls or []])
    content, calls, finish = _stream_tool_calls(c, max_tokens=limit, **kw)
    return whole, (finish, content.strip(), calls)


def _responses_cut(c, limit, **kw) -> tuple:
    """(status, incomplete_details, output items without ids), non-streamed and streamed."""
    def said(r):
        return (r.status, r.incomplete_details and r.incomplete_details.reason,
                [o.model_dump(exclude={"id", "call_id"}, exclude_none=True) for o in r.output])
    whole = c.responses.create(max_output_tokens=limit, **kw)
    streamed = list(c.responses.create(max_output_tokens=limit, stream=True, **kw))
    return said(whole), said(streamed[-1].response)


def _messages_cut(a, limit, **kw) -> tuple:
    """(stop_reason, content blocks without ids), non-streamed and as the SDK assembles the stream."""
    def said(m):
        return m.stop_reason, [b.model_dump(exclude={"id"}, exclude_none=True) for b in m.content]
    whole = a.messages.create(max_tokens=limit, **kw)
    with a.messages.stream(max_tokens=limit, **kw) as stream:
        streamed = stream.get_final_message()
    return said(whole), said(streamed)


def test_a_call_cut_by_the_limit_is_the_same_streamed_or_not(qwen_live):
    """OpenAI answers a call cut by max_tokens with finish_reason "length" and the call's arguments as
    far as they got; the Responses API with an incomplete response holding the function_call; Anthropic
    with stop_reason "max_tokens" and the tool_use block, its input the object as far as it got. Both
    ways, as the streamed answer assembled is the non-streamed one."""
    import anthropic

    c = qwen_live.client()
    a = anthropic.Anthropic(base_url=qwen_live.url, api_key="none", max_retries=0, timeout=120)
    chat_tools = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
    forced = {"type": "function", "function": {"name": "get_weather"}}
    inputs = []
    for limit in (2, 5, 8):
        chat = dict(model="qwen", messages=PARIS, tools=chat_tools, tool_choice=forced, temperature=0)
        whole, streamed = _chat_cut(c, limit, **chat)
        assert whole == streamed, limit
        finish, content, [call] = whole
        assert finish == "length" and content == "" and call["name"] == "get_weather"
        with pytest.raises(ValueError):        # cut: not yet a JSON object
            json.loads(call["arguments"])

        whole, streamed = _responses_cut(c, limit, model="qwen", input=PARIS, temperature=0,
                                         tools=[{"type": "function", "name": "get_weather", "parameters": WEATHER}],
                                         tool_choice={"type": "function", "name": "get_weather"})
        assert whole == streamed, limit
        status, reason, [item] = whole
        assert (status, reason, item["type"], item["status"]) == ("incomplete", "max_output_tokens", "function_call",
                                                                   "incomplete")
        assert item["arguments"] == call["arguments"]

        whole, streamed = _messages_cut(a, limit, model="qwen", messages=PARIS,
                                        tools=[{"name": "get_weather", "input_schema": WEATHER}],
                                        tool_choice={"type": "tool", "name": "get_weather"},
                                        extra_body={"temperature": 0})
        assert whole == streamed, limit
        reason, [block] = whole
        assert reason == "max_tokens" and block["type"] == "tool_use" and block["name"] == "get_weather"
        inputs.append(block["input"])
    assert inputs[0] == {} and inputs[-1], inputs     # cut in the first key, and past a finished value

    # cut before the call's arguments began (here the model's own call, not forced, with its tag):
    # no call was announced, so its text is the answer both ways
    chat = dict(model="qwen", messages=PARIS, tools=chat_tools, tool_choice="required", temperature=0)
    whole, streamed = _chat_cut(c, 3, **chat)
    assert whole == streamed and whole[0] == "length" and whole[2] == [] and "get_weather" in whole[1]
