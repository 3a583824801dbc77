"""Tool calls in each model family's own syntax (llambda/server/tool_formats): which format a chat
template asks for, each format read streamed in pieces of every size and whole (the same answer),
what is not a call kept as content, parallel_tool_calls false, the text's spans for /v1/responses
logprobs, earlier calls rendered by such templates, and one end to end through the server."""
from __future__ import annotations

import json
import re

import httpx
import pytest

from llambda.chat import ChatTemplate
from llambda.constraints import Grammars, grammar_spec
from llambda.server.tool_formats import FORMATS, detect
from llambda.server.tool_formats.deepseek import DeepSeekFormat
from llambda.server.tool_formats.mistral import MistralFormat
from llambda.server.tools import ToolSetup

NAMES = {"get_weather", "get_time"}
PARAMS = {"get_weather": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                                          "metric": {"type": "boolean"}}},
          "get_time": {"type": "object", "properties": {"tz": {"type": "object"}}}}

DS_CALLS, DS_CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
DS_CALL, DS_END, DS_SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"

WEATHER = ("get_weather", {"city": "Paris"})
TIME = ("get_time", {"tz": {"a": 1}})

# (format, model output, content as read whole, [(name, arguments)])
CASES = [
    ("glm", "Let me check.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
            "</tool_call>\n<tool_call>get_time\n<arg_key>tz</arg_key>\n<arg_value>{\"a\": 1}</arg_value>\n"
            "</tool_call>", "Let me check.", [WEATHER, TIME]),
    ("glm", "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>12</arg_value>\n<arg_key>days</arg_key>\n"
            "<arg_value>3</arg_value>\n<arg_key>metric</arg_key>\n<arg_value>true</arg_value>\n</tool_call>\nDone.",
     "Done.", [("get_weather", {"city": "12", "days": 3, "metric": True})]),    # a string stays a string
    ("qwen3_coder", "Sure.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n"
                    "</tool_call>\n<tool_call>\n<function=get_time>\n<parameter=tz>\n{\"a\": 1}\n</parameter>\n"
                    "</function>\n</tool_call>", "Sure.", [WEATHER, TIME]),
    ("qwen3_coder", "<tool_call>\n<function=get_weather>\n<parameter=city>\n007\n</parameter>\n<parameter=days>\n2\n"
                    "</parameter>\n<parameter=metric>\nfalse\n</parameter>\n</function>\n</tool_call> after",
     "after", [("get_weather", {"city": "007", "days": 2, "metric": False})]),
    # a Hermes-style JSON call in GLM's or Qwen3-Coder's tags (models drift into it): a call too
    ("glm", '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>', "", [WEATHER]),
    ("qwen3_coder", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', "", [WEATHER]),
    ("mistral", 'Sure[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{"tz": {"a": 1}}',
     "Sure", [WEATHER, TIME]),
    ("mistral", '[TOOL_CALLS]get_weather[CALL_ID]a1B2c3D4e[ARGS]{"city": "Paris"}', "", [WEATHER]),
    ("mistral", '[TOOL_CALLS]get_weather{"city": "Paris"}', "", [WEATHER]),        # [ARGS] not shown
    ("mistral", 'Hm. [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, '
                '{"name": "get_time", "arguments": {"tz": {"a": 1}}}] ok', "Hm. ok", [WEATHER, TIME]),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris"}}', "", [WEATHER]),
    ("llama3", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
               '{"name": "get_time", "parameters": {"tz": {"a": 1}}}', "", [WEATHER, TIME]),
    ("llama3", 'Let me look.<|python_tag|>{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}',
     "Let me look.", [WEATHER]),
    ("deepseek", f'Hi{DS_CALLS}{DS_CALL}function{DS_SEP}get_weather\n```json\n{{"city": "Paris"}}\n```{DS_END}\n'
                 f'{DS_CALL}function{DS_SEP}get_time\n```json\n{{"tz": {{"a": 1}}}}\n```{DS_END}{DS_CALLS_END}',
     "Hi", [WEATHER, TIME]),
    ("deepseek", f'{DS_CALLS}{DS_CALL}get_weather{DS_SEP}{{"city": "Paris"}}{DS_END}{DS_CALL}get_time{DS_SEP}'
                 f'{{"tz": {{"a": 1}}}}{DS_END}{DS_CALLS_END} so', "so", [WEATHER, TIME]),     # V3.1
    ("tool_call_token", '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}, '
                        '{"name": "get_time", "arguments": {"tz": {"a": 1}}}]', "", [WEATHER, TIME]),  # Granite
    ("tool_call_token", 'Ok <|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]<|/tool_call|> '
                        'bye', "Ok bye", [WEATHER]),                                                # Phi-4-mini
    # Hermes (the default): tags, a bare object or a fenced one as the whole answer, other key orders
    ("hermes", 'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
               '<tool_call>{"arguments": {"tz": {"a": 1}}, "name": "get_time"}</tool_call> ok', "Sure. ok",
     [WEATHER, TIME]),
    ("hermes", '<tool_call>{"name": "get_weather", "arguments": {"city": "</tool_call>"}}</tool_call>', "",
     [("get_weather", {"city": "</tool_call>"})]),                    # a tag inside the arguments' strings
    ("hermes", '<tool_call>\n```json\n{"name": "get_time", "parameters": {"tz": {"a": 1}}}\n```\n</tool_call>',
     "", [TIME]),
    ("hermes", ' ```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```', "", [WEATHER]),
    ("hermes", '{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}', "", [WEATHER]),
    ("hermes", '{"name": "get_weather", "arguments": {}} and more', "", [("get_weather", {})]),   # the rest unread
]

# model output that is not a call of an offered tool: every character comes back as content
NOT_CALLS = [
    ("glm", "<tool_call>rm_rf\n<arg_key>x</arg_key>\n<arg_value>1</arg_value>\n</tool_call>"),    # not offered
    ("glm", "a <tool_call>get_weather\n<arg_key>city</arg_key> junk</tool_call> b"),      # no value: announced,
    ("glm", "<tool_cal> and <arg_key>"),
    ("glm", '<tool_call>{"name": "rm", "arguments": {}}</tool_call>'),
    ("qwen3_coder", "<tool_call>\n<function=rm>\n</function>\n</tool_call>"),
    ("qwen3_coder", "<tool_call>\nget_weather(city='Paris')\n</tool_call>"),
    ("mistral", '[TOOL_CALLS]rm[ARGS]{"a": 1}'),
    ("mistral", '[TOOL_CALLS] I cannot call tools.'),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
                '{"name": "rm", "arguments": {}}]'),
    ("mistral", "a [TOOL_CALL b [ARGS]"),
    ("llama3", '{"name": "Bob", "age": 3}'),
    ("llama3", '<|python_tag|>brave_search.call(query="x")'),
    ("deepseek", f'{DS_CALLS}{DS_CALL}function{DS_SEP}rm\n```json\n{{}}\n```{DS_END}{DS_CALLS_END}'),
    ("deepseek", f'{DS_CALL}oops{DS_END} text'),
    ("tool_call_token", '<|tool_call|>[{"name": "rm", "arguments": {}}]'),
    ("tool_call_token", '<|tool_call|> no json here'),
    ("tool_call_token", '<|tool_call|>[{"name": "get_weather", "arguments": [1]}]<|/tool_call|>'),
    ("hermes", '<tool_call>{"name": "rm", "arguments": {}}</tool_call>'),
    ("hermes", '<tool_call>[{"name": "get_weather", "arguments": {}}]</tool_call>'),
    ("hermes", '```python\nprint(1)\n```'),
    ("hermes", 'x {"name": "get_weather", "arguments": {}}'),              # not the whole answer
]


def _stream(fmt: str, text: str, size: int, parallel: bool = True):
    """(content, [(name, arguments text)]) of `text` fed in pieces of `size`; checks the deltas' shape."""
    p = FORMATS[fmt].parser(NAMES, parallel, PARAMS)
    content, calls = [], {}
    pieces = [p.feed(text[i:i + size]) for i in range(0, len(text), size)] + [p.finish()]
    for piece, deltas in pieces:
        content.append(piece)
        for d in deltas:
            if d["index"] not in calls:      # the first delta of a call announces it
                assert d["id"].startswith("call_") and d["type"] == "function" and d["function"]["name"]
                calls[d["index"]] = [d["function"]["name"], ""]
            else:
                assert "id" not in d and "name" not in d["function"]
            calls[d["index"]][1] += d["function"].get("arguments", "")
    assert sorted(calls) == list(range(len(calls)))
    return "".join(content), [tuple(calls[k]) for k in sorted(calls)], p


def _whole(fmt: str, text: str, parallel: bool = True):
    setup = ToolSetup(NAMES, parallel=parallel, format=FORMATS[fmt], params=PARAMS)
    content, calls = setup.extract(text)
    return content, [(c["function"]["name"], c["function"]["arguments"]) for c in calls], setup


@pytest.mark.parametrize("fmt, text, content, want", CASES)
def test_each_format_streamed_in_pieces_of_every_size_and_whole_agree(fmt, text, content, want):
    whole, calls, setup = _whole(fmt, text)
    assert whole == content
    assert [(n, json.loads(a)) for n, a in calls] == want
    for size in range(1, len(text) + 1):
        streamed, scalls, p = _stream(fmt, text, size)
        assert streamed.strip() == content, size
        assert [(n, json.loads(a)) for n, a in scalls] == want, size
        assert "".join(text[s:e] for s, e in p.content_spans()) == streamed, size
    # where the whole answer's content lies in the text (/v1/responses logprobs read whole)
    assert "".join(text[s:e] for s, e in setup.text_spans(text)) == content


@pytest.mark.parametrize("fmt, text", NOT_CALLS)
def test_what_is_not_a_call_stays_content(fmt, text):
    assert _whole(fmt, text)[:2] == (text, [])
    for size in range(1, len(text) + 1):
        content, calls, _ = _stream(fmt, text, size)
        if calls:                 # a call announced by its name whose rest is malformed: it went out (with
            assert len(calls) == 1 and calls[0][0] in NAMES    # what arguments had come); whole, it is text
            assert not any(o in content for o in FORMATS[fmt].openers), size
        else:
            assert content == text, size


@pytest.mark.parametrize("fmt, text, content, want", [c for c in CASES if len(c[3]) > 1])
def test_parallel_tool_calls_false_keeps_the_first_call(fmt, text, content, want):
    assert [(n, json.loads(a)) for n, a in _whole(fmt, text, parallel=False)[1]] == want[:1]
    for size in (1, 3, len(text)):
        assert [(n, json.loads(a)) for n, a in _stream(fmt, text, size, parallel=False)[1]] == want[:1]


@pytest.mark.parametrize("fmt, text, upto, args", [
    # arguments not JSON text: they go out whole at the call's end
    ("glm", "<tool_call>get_weather\n<arg_key>city</arg_key>", "<tool_call>get_weather\n", ""),
    ("qwen3_coder", "<tool_call>\n<function=get_weather>\n<parameter=city>\nPa", "<tool_call>\n<function=get_weather>",
     ""),
    # JSON arguments: in pieces as they arrive, as written
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Pa', "[TOOL_CALLS]get_weather[", '{"city": "Pa'),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city":', '[TOOL_CALLS][{"name": "get_weather",',
     '{"city":'),
    ("deepseek", f'{DS_CALLS}{DS_CALL}function{DS_SEP}get_weather\n```json\n{{"ci',
     f"{DS_CALLS}{DS_CALL}function{DS_SEP}get_weather\n", '{"ci'),
    ("deepseek", f'{DS_CALL}get_weather{DS_SEP}{{"ci', f"{DS_CALL}get_weather{DS_SEP}{{", '{"ci'),
    ("llama3", '<|python_tag|>{"name": "get_weather", "parameters": {"ci', '<|python_tag|>{"name": "get_weather",',
     '{"ci'),
    ("tool_call_token", '<|tool_call|>[{"name": "get_weather", "arguments": {"ci', '<|tool_call|>[{"name": "get_weather",',
     '{"ci'),
])
def test_a_call_is_announced_once_its_name_is_complete_and_a_cut_call_stays_a_call(fmt, text, upto, args):
    p = FORMATS[fmt].parser(NAMES, True, PARAMS)
    assert p.feed(upto[:-1]) == ("", [])
    sent = ""
    for i, ch in enumerate(text[len(upto) - 1:]):
        content, deltas = p.feed(ch)
        assert content == "" and len(deltas) <= 1
        if i == 0:
            assert [d["function"]["name"] for d in deltas] == ["get_weather"]
        sent += "".join(d["function"].get("arguments", "") for d in deltas)
    assert sent == args and p.finish() == ("", [])
    # read whole, a call the output limit cut stays the call as far as it got (as with Hermes)
    whole, calls, _ = _whole(fmt, text)
    assert whole == "" and calls == [("get_weather", args)]


def test_a_marker_cut_at_the_end_of_a_piece_is_held_back():
    for fmt, piece, rest in (("mistral", "Hi [TOOL_CA", 'LLS]get_time[ARGS]{}'),
                             ("glm", "Hi <tool_c", "all>get_time\n</tool_call>"),
                             ("deepseek", "Hi <｜tool▁cal", f"l▁begin｜>get_time{DS_SEP}{{}}{DS_END}"),
                             ("tool_call_token", "Hi <|tool_", 'call|>[{"name": "get_time", "arguments": {}}]')):
        p = FORMATS[fmt].parser(NAMES, True, PARAMS)
        assert p.feed(piece) == ("Hi", [])           # the blank waits too: a call may follow it
        content, deltas = p.feed(rest)
        assert content == "" and deltas[0]["function"]["name"] == "get_time"
        assert p.finish()[0] == ""


def test_streamed_text_logprobs_leave_out_a_native_call():
    """/v1/responses' output_text logprobs: the call's tokens are not the text's, streamed or read whole."""
    from test_responses_logprobs import _taken, _taken_whole
    pieces = ["Sure", ".", "\n", "[TOOL_CALLS]", "get_time", "[ARGS]", '{"tz": {}}', " Bye"]
    setup = ToolSetup({"get_time"}, format=FORMATS["mistral"], params=PARAMS)
    for cuts in ([len(pieces)], list(range(1, len(pieces) + 1))):
        assert _taken(pieces, setup, cuts) == ["Sure", ".", " Bye"], cuts
    assert _taken_whole(pieces, setup) == ["Sure", ".", " Bye"]


# -- a forced tool_choice in the format's own syntax ---------------------------------------------

FORCED = [("mistral", FORMATS["mistral"]), ("mistral array", MistralFormat(tagged=False)),
          ("deepseek r1", FORMATS["deepseek"]), ("deepseek v3.1", DeepSeekFormat(v31=True)),
          ("llama3", FORMATS["llama3"]), ("tool_call_token", FORMATS["tool_call_token"])]
FORCED_TOOLS = [{"type": "function", "function": {"name": n, "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}} for n in sorted(NAMES)]


def _write(fmt, name: str, args: str) -> str:
    """The whole call a model writes in the format (to cut the forced prefix from)."""
    return {"mistral": f"[TOOL_CALLS]{name}[ARGS]{args}",
            "mistral array": f'[TOOL_CALLS][{{"name": "{name}", "arguments": {args}}}]',
            "deepseek r1": f"{DS_CALLS}{DS_CALL}function{DS_SEP}{name}\n```json\n{args}\n```{DS_END}{DS_CALLS_END}",
            "deepseek v3.1": f"{DS_CALLS}{DS_CALL}{name}{DS_SEP}{args}{DS_END}{DS_CALLS_END}",
            "llama3": f'{{"name": "{name}", "parameters": {args}}}',
            "tool_call_token": f'<|tool_call|>[{{"name": "{name}", "arguments": {args}}}]'}[fmt]


@pytest.mark.parametrize("label, fmt", FORCED)
def test_a_forced_call_is_written_in_the_formats_own_syntax(label, fmt):
    """"required" and a named function: the prompt ends with the format's opening of a call (the
    name too where it is forced), the grammar makes the rest a valid call of an offered tool and
    nothing more, and the parser of that answer reads the prefix as the call's start."""
    from test_constrained import ByteVocab

    from llambda.constraints import Grammars, grammar_spec
    grammars = Grammars(ByteVocab(), 257)
    for choice, names in (("function", {"get_time"}), ("required", NAMES)):
        call = fmt.forced(FORCED_TOOLS, names, choice)
        prefix, lark = call.opening, call.grammar()
        g = grammars.compile(grammar_spec(grammar=lark))
        for name, args, ok in (("get_time", '{"city": "Oslo"}', True), ("get_time", '{"town": "Oslo"}', False),
                               ("rm", '{"city": "Oslo"}', False)):
            whole = _write(label, name, args)
            if not whole.startswith(prefix):
                assert not ok or name not in names
                continue
            text = whole[len(prefix):]
            c = g.start()
            took = all(c.try_advance(b) for b in text.encode()) and c.accepting     # the whole text, and ends
            assert took == ok, (label, choice, text)
            if ok:
                setup = ToolSetup(names, prefix, format=fmt, params=PARAMS)
                assert _calls_of(setup.extract(text)) == ("", [("get_time", {"city": "Oslo"})]), (label, choice)
                for size in (1, 3):
                    p = setup.parser()
                    out = [p.feed(text[i:i + size]) for i in range(0, len(text), size)] + [p.finish()]
                    assert "".join(c for c, _ in out) == "" and [c["name"] for c in p.calls] == ["get_time"]
                    assert json.loads(p.calls[0]["arguments"]) == {"city": "Oslo"} and p.content_spans() == []


def _calls_of(answer):
    content, calls = answer
    return content, [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


# -- which format a template asks for --------------------------------------------------------
# short snippets in each family's shape (how their templates write an earlier call), not copies

DETECT = [
    ("glm", "{% for tc in m.tool_calls %}<tool_call>{{ tc.name }}{% for k, v in tc.arguments.items() %}\n"
            "<arg_key>{{ k }}</arg_key>\n<arg_value>{{ v }}</arg_value>{% endfor %}\n</tool_call>{% endfor %}"),
    ("qwen3_coder", "{% if tools %}<tools>{% endif %}{% for tc in m.tool_calls %}<tool_call>\n"
                    "<function={{ tc.name }}>\n"
                    "{% for k, v in tc.arguments|items %}<parameter={{ k }}>\n{{ v }}\n</parameter>\n{% endfor %}"
                    "</function>\n</tool_call>{% endfor %}"),
    ("deepseek", "{% for tool in m.tool_calls %}{{'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + "
                 "'<｜tool▁sep｜>' + tool['function']['name'] + '\\n```json\\n' + tool['function']['arguments'] + "
                 "'\\n```<｜tool▁call▁end｜>'}}{% endfor %}"),
    ("mistral", "{% if tools %}[AVAILABLE_TOOLS]{{ tools|tojson }}[/AVAILABLE_TOOLS]{% endif %}"
                "{% for tc in m.tool_calls %}[TOOL_CALLS]{{ tc.function.name }}[ARGS]{{ tc.function.arguments }}"
                "{% endfor %}"),
    ("tool_call_token", "{% if tools %}<|start_of_role|>available_tools<|end_of_role|>{{ tools|tojson }}{% endif %}"
                        "<|tool_call|>{{ m.tool_calls|tojson }}"),
    ("tool_call_token", "{% if m.tools %}<|system|>{{ m.content }}<|tool|>{{ m.tools }}<|/tool|><|end|>{% endif %}"),
    ("llama3", "{% if tools %}Respond in the format {\"name\": function name, \"parameters\": ...}{% endif %}"
               "<|start_header_id|>ipython<|end_header_id|>\n\n{{ m.content }}<|eot_id|>"),
    (None, "{% if tools %}<tools>{{ tools|tojson }}</tools>{% endif %}<tool_call>\n{{ tc|tojson }}\n</tool_call>"),
    (None, "{% for m in messages %}{{ m.content }}{% endfor %}"),
]


@pytest.mark.parametrize("want, template", DETECT)
def test_the_format_is_told_from_the_template(want, template):
    got = detect(template)
    assert (got.name if got is not None else None) == want


def test_the_forced_form_is_told_from_the_template_too():
    v31 = ("{{'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>'+ tool['function']['name'] + '<｜tool▁sep｜>' + "
           "tool['function']['arguments'] + '<｜tool▁call▁end｜>'}}")
    r1 = DETECT[2][1]
    assert detect(v31).v31 and not detect(r1).v31
    assert detect(DETECT[3][1]).tagged                       # `[TOOL_CALLS]NAME[ARGS]{...}`
    assert not detect('{% if tools %}[AVAILABLE_TOOLS]{% endif %}[TOOL_CALLS] {{ calls|tojson }}').tagged


def test_gguf_templates_of_hermes_and_plain_models_keep_the_hermes_parser(qwen05_gguf):
    from llambda.formats.gguf import GGUFFile
    with GGUFFile(qwen05_gguf) as g:
        assert detect(g.metadata["tokenizer.chat_template"]) is None


def test_earlier_calls_render_through_templates_that_walk_or_join_their_arguments():
    """Templates take a call's arguments as an object (GLM's and Qwen3-Coder's walk its items) or join
    them to strings (DeepSeek's): OpenAI clients send a JSON string, Ollama's an object; both render."""
    history = [{"role": "user", "content": "weather?"}]
    for args in ('{"city": "Paris"}', {"city": "Paris"}):
        msgs = history + [{"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": args}}]}]
        glm = ChatTemplate("{% for m in messages %}{% for tc in m.tool_calls or [] %}<tool_call>{{ tc.function.name }}"
                           "{% for k, v in tc.function.arguments.items() %}<arg_key>{{ k }}</arg_key><arg_value>"
                           "{{ v }}</arg_value>{% endfor %}</tool_call>{% endfor %}{% endfor %}")
        assert glm.render(msgs) == ("<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
                                    "</tool_call>")
        ds = ChatTemplate("{% for m in messages %}{% for tc in m.tool_calls or [] %}"
                          "{{ '<｜tool▁call▁begin｜>' + tc['function']['name'] + '<｜tool▁sep｜>' + "
                          "tc['function']['arguments'] + '<｜tool▁call▁end｜>' }}|{{ tc.function.arguments }}|"
                          "{{ tc.function.arguments | tojson }}{% endfor %}{% endfor %}")
        call = '{"city": "Paris"}'
        assert ds.render(msgs) == f"{DS_CALL}get_weather{DS_SEP}{call}{DS_END}|{call}|{call}"


# -- through the server ------------------------------------------------------------------------

MISTRAL_TOKENS = ("[TOOL_CALLS]", "[ARGS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[INST]", "[/INST]")
MISTRAL_TEMPLATE = ("{% if tools %}[AVAILABLE_TOOLS]{{ tools | length }}[/AVAILABLE_TOOLS]{% endif %}"
                    "{% for m in messages %}{% if m['role'] == 'user' %}[INST]{{ m['content'] }}[/INST]"
                    "{% elif m.tool_calls %}{% for tc in m.tool_calls %}[TOOL_CALLS]{{ tc.function.name }}[ARGS]"
                    "{{ tc.function.arguments }}{% endfor %}{% else %}{{ m['content'] }}{% endif %}{% endfor %}")
TOOLS = [{"type": "function", "function": {"name": n, "parameters": PARAMS[n]}} for n in sorted(NAMES)]
ANSWER = 'Let me see.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'


@pytest.fixture(scope="module")
def mistral_live(tmp_path_factory):
    from serverkit import tiny_chat_server
    with tiny_chat_server(tmp_path_factory.mktemp("mistral"), "tiny-mistral", MISTRAL_TOKENS, MISTRAL_TEMPLATE) as srv:
        yield srv


def test_server_reads_a_mistral_models_calls_whole_and_streamed(mistral_live):
    from test_tool_calls import _stream_tool_calls

    c = mistral_live.client()
    # the regex makes the random model write exactly ANSWER
    kw = dict(model="tiny-mistral", messages=[{"role": "user", "content": "weather in Paris?"}], tools=TOOLS,
              max_tokens=200, temperature=0, extra_body={"regex": re.escape(ANSWER)})
    ch = c.chat.completions.create(**kw).choices[0]
    assert ch.finish_reason == "tool_calls" and ch.message.content == "Let me see."
    assert [(t.function.name, json.loads(t.function.arguments)) for t in ch.message.tool_calls] == [WEATHER]
    content, calls, finish = _stream_tool_calls(c, **kw)
    assert (content, finish) == ("Let me see.", "tool_calls")
    assert [(x["name"], json.loads(x["arguments"])) for x in calls] == [WEATHER]
    # the call goes back through the template, its arguments as the JSON the client sent
    call = ch.message.tool_calls[0]
    follow = kw["messages"] + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                               {"role": "tool", "tool_call_id": call.id, "content": "18C"}]
    r = httpx.post(mistral_live.url + "/apply-template", json={"messages": follow, "tools": TOOLS}, timeout=60)
    assert r.status_code == 200 and '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}' in r.json()["prompt"], r.text


def test_server_forces_a_call_in_the_models_own_syntax(mistral_live):
    """tool_choice a named function / "required": the prompt ends with `[TOOL_CALLS]get_time[ARGS]` (or
    `[TOOL_CALLS]`), so the model writes only the arguments (the name too under "required", then `[ARGS]`
    as its control token) under the grammar; no Hermes `<tool_call>` in what it generates."""
    from test_tool_calls import _stream_tool_calls

    c = mistral_live.client()
    kw = dict(model="tiny-mistral", messages=[{"role": "user", "content": "time?"}], tools=FORCED_TOOLS,
              max_tokens=40, temperature=0, logprobs=True)
    for choice, names in (({"type": "function", "function": {"name": "get_time"}}, ["get_time"]),
                          ("required", sorted(NAMES))):
        ch = c.chat.completions.create(**kw, tool_choice=choice).choices[0]
        assert len(ch.message.tool_calls) == 1 and ch.message.tool_calls[0].function.name in names
        assert not ch.message.content
        generated = "".join(t.token for t in ch.logprobs.content)
        assert "tool_call" not in generated and "TOOL_CALLS" not in generated, generated
        if choice == "required":        # the model wrote the name, then [ARGS] as its control token
            assert "[ARGS]" in [t.token for t in ch.logprobs.content], generated
            assert generated.startswith(ch.message.tool_calls[0].function.name + "[ARGS]{"), generated
        if ch.finish_reason == "tool_calls":
            assert json.loads(ch.message.tool_calls[0].function.arguments).keys() == {"city"}
        else:
            assert ch.finish_reason == "length"       # the random model's string ran past max_tokens
        content, calls, finish = _stream_tool_calls(c, **kw, tool_choice=choice)
        assert (content, finish) == ("", ch.finish_reason)
        assert calls == [{"name": ch.message.tool_calls[0].function.name,
                          "arguments": ch.message.tool_calls[0].function.arguments}]


def test_the_other_apis_read_a_native_call_too(mistral_live):
    """/v1/responses (a function_call item), /v1/messages (a tool_use block) and Ollama's /api/chat (tool_calls,
    arguments as an object) read the Mistral call as chat completions do, whole and streamed."""
    import anthropic
    c = mistral_live.client()
    user = [{"role": "user", "content": "weather in Paris?"}]
    tools = [{"type": "function", "name": n, "parameters": PARAMS[n]} for n in sorted(NAMES)]
    kw = dict(model="tiny-mistral", input=user, tools=tools, max_output_tokens=200, temperature=0,
              extra_body={"regex": re.escape(ANSWER)})
    for r in (c.responses.create(**kw), list(c.responses.create(stream=True, **kw))[-1].response):
        calls = [(o.name, json.loads(o.arguments)) for o in r.output if o.type == "function_call"]
        assert calls == [WEATHER] and r.output_text == "Let me see.", r.output

    a = anthropic.Anthropic(base_url=mistral_live.url, api_key="none", max_retries=0, timeout=120)
    akw = dict(model="tiny-mistral", messages=user, max_tokens=200,
               tools=[{"name": n, "input_schema": PARAMS[n]} for n in sorted(NAMES)],
               extra_body={"temperature": 0, "regex": re.escape(ANSWER)})
    whole = a.messages.create(**akw)
    with a.messages.stream(**akw) as stream:
        streamed = stream.get_final_message()
    for m in (whole, streamed):
        assert m.stop_reason == "tool_use"
        assert [(b.type, getattr(b, "text", None) or getattr(b, "input", None)) for b in m.content] == \
            [("text", "Let me see."), ("tool_use", WEATHER[1])]

    body = {"model": "tiny-mistral", "messages": user, "stream": False, "regex": re.escape(ANSWER),
            "tools": TOOLS, "options": {"temperature": 0, "num_predict": 200}}
    msg = httpx.post(mistral_live.url + "/api/chat", json=body, timeout=120).json()["message"]
    assert [(t["function"]["name"], t["function"]["arguments"]) for t in msg["tool_calls"]] == [WEATHER]
    assert msg["content"] == "Let me see."


def test_a_thought_then_a_native_call():
    """GLM-4.5 and DeepSeek-R1 think first: the thought is reasoning, the call after it a call, in any pieces."""
    from llambda.server.think import ThinkParser
    glm = "<tool_call>get_time\n<arg_key>tz</arg_key>\n<arg_value>{\"a\": 1}</arg_value>\n</tool_call>"
    for fmt, call in (("glm", glm),
                      ("deepseek", f"{DS_CALLS}{DS_CALL}function{DS_SEP}get_time\n```json\n{{\"tz\": {{\"a\": 1}}}}\n```"
                                   f"{DS_END}{DS_CALLS_END}")):
        text = "<think>The user wants the time.</think>\n\nSure." + call
        for size in (1, 4, len(text)):
            p = ThinkParser(FORMATS[fmt].parser(NAMES, True, PARAMS))
            content, deltas, reasoning = "", [], ""
            for piece in [text[i:i + size] for i in range(0, len(text), size)]:
                c, d = p.feed(piece)
                content, deltas, reasoning = content + c, deltas + d, reasoning + p.take_reasoning()
            c, d = p.finish()
            content, deltas, reasoning = content + c, deltas + d, reasoning + p.take_reasoning()
            assert (reasoning, content) == ("The user wants the time.", "Sure."), (fmt, size)
            assert [(c["name"], json.loads(c["arguments"])) for c in p.calls] == [TIME], (fmt, size)


# A template in Phi-4-mini's shape (written for this test): a system turn writes its message's own
# `tools` (JSON text) between <|tool|> and <|/tool|>; the template never reads the `tools` variable.
MESSAGE_TOOLS_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|tool|>", "<|/tool|>",
                        "<|tool_call|>", "<|/tool_call|>")
MESSAGE_TOOLS_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' and 'tools' in message and "
    "message['tools'] is not none %}<|system|>{{ message['content'] }}<|tool|>{{ message['tools'] }}<|/tool|>"
    "<|end|>{% else %}<|{{ message['role'] }}|>{{ message['content'] }}<|end|>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def test_templates_reading_tools_from_a_message_are_told_from_their_source():
    from llambda.chat import reads_message_tools
    assert reads_message_tools(MESSAGE_TOOLS_TEMPLATE)
    assert reads_message_tools("{% for m in loop_messages %}{{ m.tools }}{% endfor %}")
    assert reads_message_tools('{% for turn in messages %}{{ turn["tools"] }}{% endfor %}')
    # the tools variable, a message's tool_calls, someone else's tools: not a message's tools
    for src in (MISTRAL_TEMPLATE, "{% for m in messages %}{{ m.tool_calls }}{% endfor %}{{ tools | tojson }}",
                "{{ ns.tools }}{% for m in messages %}{{ m.content }}{% endfor %}", ""):
        assert not reads_message_tools(src), src


@pytest.fixture(scope="module")
def message_tools_live(tmp_path_factory):
    from serverkit import tiny_chat_server
    with tiny_chat_server(tmp_path_factory.mktemp("phi4"), "tiny-phi4", MESSAGE_TOOLS_TOKENS,
                          MESSAGE_TOOLS_TEMPLATE) as srv:
        yield srv


def test_offered_tools_reach_a_template_that_reads_them_from_the_system_message(message_tools_live):
    """Phi-4-mini's template reads the tools from the system message: passed only as the `tools`
    variable, offered tools never reached its prompt. They go on the system message now, as the JSON
    text of their functions (a system message is added first when there is none)."""
    def prompt(**body):
        r = httpx.post(message_tools_live.url + "/apply-template", json=body, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()["prompt"]
    functions = json.dumps([t["function"] for t in TOOLS], ensure_ascii=False)
    user = [{"role": "user", "content": "weather in Paris?"}]
    system = [{"role": "system", "content": "Be brief."}]
    assert prompt(messages=user, tools=TOOLS) == \
        f"<|system|><|tool|>{functions}<|/tool|><|end|><|user|>weather in Paris?<|end|><|assistant|>"
    assert prompt(messages=system + user, tools=TOOLS) == \
        f"<|system|>Be brief.<|tool|>{functions}<|/tool|><|end|><|user|>weather in Paris?<|end|><|assistant|>"
    # no tools offered (or tool_choice "none"): the messages as sent
    plain = "<|system|>Be brief.<|end|><|user|>weather in Paris?<|end|><|assistant|>"
    assert prompt(messages=system + user) == plain
    assert prompt(messages=system + user, tools=TOOLS, tool_choice="none") == plain
    # generation's prompt holds them too: the tools' system turn more tokens than without tools
    def prompt_tokens(**extra):
        r = httpx.post(message_tools_live.url + "/v1/chat/completions", timeout=60, json={
            "model": "tiny-phi4", "messages": user, "max_tokens": 1, **extra})
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens"]
    added = message_tools_live.model.tokenize(f"<|system|><|tool|>{functions}<|/tool|><|end|>")
    assert prompt_tokens(tools=TOOLS) - prompt_tokens() == len(added)


def test_the_library_template_puts_offered_tools_on_the_system_message_too():
    """ChatTemplate.render (what Model.chat uses) applies the same rule as the server's routes."""
    from llambda.chat import ChatTemplate
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    tpl = ChatTemplate(MESSAGE_TOOLS_TEMPLATE)
    text = tpl.render([{"role": "user", "content": "hi"}], tools=tools)
    assert json.dumps([tools[0]["function"]], ensure_ascii=False) in text
    assert "get_weather" not in tpl.render([{"role": "user", "content": "hi"}])
    assert "get_weather" not in ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}").render(
        [{"role": "user", "content": "hi"}], tools=tools)


# -- a forced call in GLM-4.5's and Qwen3-Coder's tagged syntax -------------------------------------

TAGGED_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 6},
                                         "days": {"type": "integer", "minimum": 1, "maximum": 9},
                                         "metric": {"type": "boolean"},
                                         "opts": {"type": "object", "properties": {"a": {"type": "integer"}},
                                                  "required": ["a"], "additionalProperties": False}},
        "required": ["city", "days"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"tz": {"type": "string", "enum": ["UTC", "CET"]}}}}}]
TAGGED_PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TAGGED_TOOLS}
GLM_CALL = ("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Pa<ri</arg_value>\n<arg_key>days</arg_key>\n"
            "<arg_value>3</arg_value>\n<arg_key>opts</arg_key>\n<arg_value>{\"a\": 1}</arg_value>\n</tool_call>")
QWEN_CALL = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nPa<ri\n</parameter>\n<parameter=days>\n3\n"
             "</parameter>\n<parameter=metric>\ntrue\n</parameter>\n</function>\n</tool_call>")
# (format, the whole call, its arguments or None where the grammar refuses it)
TAGGED = [
    ("glm", GLM_CALL, {"city": "Pa<ri", "days": 3, "opts": {"a": 1}}),
    ("glm", "<tool_call>get_time\n<arg_key>tz</arg_key>\n<arg_value>CET</arg_value>\n</tool_call>", {"tz": "CET"}),
    ("glm", "<tool_call>get_time\n</tool_call>", {}),
    ("glm", GLM_CALL.replace("Pa<ri", "Pa</arg_value>"), None),             # the closing tag inside a value
    ("glm", GLM_CALL.replace("Pa<ri", "Paris, France"), None),              # longer than maxLength
    ("glm", GLM_CALL.replace("<arg_value>3<", "<arg_value>three<"), None),  # not an integer
    ("glm", GLM_CALL.replace("<arg_value>3<", "<arg_value>12<"), None),     # past the maximum
    ("glm", GLM_CALL.replace('{"a": 1}', '{"b": 1}'), None),                # the object's schema
    ("glm", "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n</tool_call>",
     None),                                                                 # a required parameter missing
    ("glm", GLM_CALL.replace("<arg_key>days", "<arg_key>weeks"), None),     # an undeclared name
    ("glm", "<tool_call>get_weather\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n<arg_key>metric</arg_key>\n"
            "<arg_value>false</arg_value>\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n</tool_call>",
     {"days": 2, "metric": False, "city": "Oslo"}),                         # in another order
    ("glm", "<tool_call>get_weather\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n<arg_key>city</arg_key>\n"
            "<arg_value>Oslo</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>",
     None),                                                                 # a parameter twice
    ("glm", "<tool_call>get_time\n<arg_key>tz</arg_key>\n<arg_value>EST</arg_value>\n</tool_call>", None),  # enum
    ("glm", '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>', None),      # the Hermes form
    ("qwen3_coder", QWEN_CALL, {"city": "Pa<ri", "days": 3, "metric": True}),
    ("qwen3_coder", "<tool_call>\n<function=get_time>\n</function>\n</tool_call>", {}),
    ("qwen3_coder", QWEN_CALL.replace("Pa<ri", "a</tool_call>"), None),     # the call's closing tag in a value
    ("qwen3_coder", QWEN_CALL.replace("Pa<ri\n", "Pa<ri"), None),           # the newline before </parameter>
    ("qwen3_coder", QWEN_CALL.replace("true", "yes"), None),                # not a boolean
    ("qwen3_coder", QWEN_CALL.replace("<parameter=days>\n3\n</parameter>\n", ""), None),   # required
]


def _grammar_takes(grammars, lark: str, text: str) -> bool:
    c = grammars.compile(grammar_spec(grammar=lark)).start()
    return all(c.try_advance(b) for b in text.encode()) and c.accepting


@pytest.mark.parametrize("fmt, text, args", TAGGED)
def test_a_forced_tagged_call_follows_the_schema_as_far_as_the_tags_allow(fmt, text, args):
    """GLM-4.5's `<arg_key>`/`<arg_value>` pairs and Qwen3-Coder's `<parameter=K>` values: the grammar
    takes the declared names only (required ones present), a string as text (its enum, its length), any
    other value as JSON text valid against its schema; "required" and a named function, and after a
    thought (the opening then the grammar's too); what it takes parses back to the call."""
    from test_constrained import ByteVocab
    grammars = Grammars(ByteVocab(), 257)
    name = re.search(r"get_\w+", text).group(0)
    for choice, names in (("function", {name}), ("required", {"get_weather", "get_time"})):
        call = FORMATS[fmt].forced(TAGGED_TOOLS, names, choice)
        assert text.startswith(call.opening) or args is None, (fmt, choice, call.opening)
        rest = text[len(call.opening):] if text.startswith(call.opening) else text
        assert _grammar_takes(grammars, call.grammar(), rest) == (args is not None), (fmt, choice)
        assert _grammar_takes(grammars, call.grammar(inline=True), text) == (args is not None), (fmt, choice)
        if args is not None:
            setup = ToolSetup(names, call.opening, format=FORMATS[fmt], params=TAGGED_PARAMS)
            assert _calls_of(setup.extract(rest)) == ("", [(name, args)])
            whole = ToolSetup(names, format=FORMATS[fmt], params=TAGGED_PARAMS)
            assert _calls_of(whole.extract(text)) == ("", [(name, args)])      # after a thought: no prefix


class _ControlVocab:
    """A tokenizer view where the given texts are control tokens (ids 1000...), anything else bytes."""

    def __init__(self, controls):
        self.controls = list(controls)

    def encode(self, text, parse_special=True):
        if parse_special and text in self.controls:
            return [1000 + self.controls.index(text)]
        return list(text.encode())

    def is_special(self, i):
        return i >= 1000


def test_markers_that_are_control_tokens_are_written_as_those_tokens():
    """A grammar's text never produces a control token: a marker the vocabulary holds as one is written
    as that token (`<[id]>`), other text as text; after a thought the opening is too."""
    from llambda.server.tool_formats.forcing import Spelling
    spell = Spelling.of(_ControlVocab(["[TOOL_CALLS]", "[ARGS]"]), ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"))
    assert spell.ids == {"[TOOL_CALLS]": 1000, "[ARGS]": 1001}
    assert spell("a[ARGS][TOOL_CALLS]b[CALL_ID]") == '"a" <[1001]> <[1000]> "b[CALL_ID]"' and spell("") == '""'
    call = MistralFormat().forced(FORCED_TOOLS, NAMES, "required", spell)
    assert call.opening == "[TOOL_CALLS]" and '"get_time" <[1001]> args_' in call.grammar()
    assert call.grammar(inline=True).startswith("%llguidance {}\nstart: <[1000]> (")
    assert Spelling.of(None, ("[ARGS]",)).ids == {}
    # GLM's value tags as control tokens: a text value is followed by its closing token
    glm = FORMATS["glm"].force(TAGGED_TOOLS, {"get_weather"}, "function", _ControlVocab(FORMATS["glm"].markers))
    assert glm.opening == "<tool_call>get_weather" and "V_0_0 <[1005]>" in glm.grammar()
    assert glm.grammar(inline=True).startswith("%llguidance {}\nstart: <[1000]> \"get_weather\" (")


# -- through the server: a tiny random model on templates in GLM-4.5's and Qwen3-Coder's shape ------
# (written for these tests, not copies). GLM's tags are control tokens of the vocabulary (as in GLM-4.5's),
# Qwen3-Coder's <function=>/<parameter=> text; both think in <think> (Qwen3's switch, an opened thought).

THINK_SWITCH = ("{% if add_generation_prompt %}assistant:{% if enable_thinking is defined and not enable_thinking %}"
                "<think></think>\n{% elif open_thought is defined and open_thought %}<think>{% endif %}{% endif %}")
GLM_TOKENS = ("<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>",
              "<think>", "</think>")
GLM_TEMPLATE = ("{% if tools %}tools: {% for t in tools %}{{ t.function.name }} {% endfor %}\n{% endif %}"
                "{% for m in messages %}{{ m.role }}: {% for tc in m.tool_calls or [] %}<tool_call>"
                "{{ tc.function.name }}{% for k, v in tc.function.arguments.items() %}\n<arg_key>{{ k }}</arg_key>\n"
                "<arg_value>{{ v }}</arg_value>{% endfor %}\n</tool_call>{% endfor %}{{ m.content or '' }}\n"
                "{% endfor %}" + THINK_SWITCH)
QWEN_TOKENS = ("<tool_call>", "</tool_call>", "<think>", "</think>")
QWEN_TEMPLATE = ("{% if tools %}tools: {% for t in tools %}{{ t.function.name }} {% endfor %}\n{% endif %}"
                 "{% for m in messages %}{{ m.role }}: {% for tc in m.tool_calls or [] %}<tool_call>\n"
                 "<function={{ tc.function.name }}>\n{% for k, v in tc.function.arguments.items() %}<parameter={{ k }}>\n"
                 "{{ v }}\n</parameter>\n{% endfor %}</function>\n</tool_call>{% endfor %}{{ m.content or '' }}\n"
                 "{% endfor %}" + THINK_SWITCH)
# the whole call in each format's syntax: name, then the (key, value) pairs
TAGGED_SHAPES = {
    "glm": re.compile(r"<tool_call>(\w+)((?:\n<arg_key>\w+</arg_key>\n<arg_value>.*?</arg_value>)*)\n</tool_call>",
                      re.S),
    "qwen3_coder": re.compile(r"<tool_call>\n<function=(\w+)>\n((?:<parameter=\w+>\n.*?\n</parameter>\n)*)</function>\n"
                              r"</tool_call>", re.S)}
# what the prompt ends with where no thought comes first (the opening, prefilled)
OPENINGS = {("glm", "required"): "<tool_call>", ("glm", "get_weather"): "<tool_call>get_weather",
            ("qwen3_coder", "required"): "<tool_call>\n<function=",
            ("qwen3_coder", "get_weather"): "<tool_call>\n<function=get_weather>\n"}


@pytest.fixture(scope="module", params=[("glm", GLM_TOKENS, GLM_TEMPLATE), ("qwen3_coder", QWEN_TOKENS, QWEN_TEMPLATE)],
                ids=["glm", "qwen3_coder"])
def tagged_live(request, tmp_path_factory):
    from serverkit import tiny_chat_server
    fmt, tokens, template = request.param
    assert detect(template).name == fmt
    with tiny_chat_server(tmp_path_factory.mktemp(fmt), "tiny-" + fmt, tokens, template) as srv:
        srv.fmt = fmt
        yield srv


def _check_weather_args(args: dict) -> None:
    assert set(args) <= {"city", "days", "metric", "opts"} and {"city", "days"} <= set(args), args
    assert isinstance(args["city"], str) and len(args["city"]) <= 6, args
    assert type(args["days"]) is int and 1 <= args["days"] <= 9, args
    assert type(args.get("metric", True)) is bool and (set(args.get("opts", {"a": 1})) == {"a"}), args


@pytest.mark.parametrize("thinking", [False, True], ids=["no thought", "thought first"])
@pytest.mark.parametrize("choice", ["required", "get_weather"])
def test_server_forces_a_tagged_call_in_the_models_own_syntax(tagged_live, choice, thinking):
    """A forced tool_choice on a GLM-4.5 or Qwen3-Coder template: the model writes that format's call (its
    control tokens as tokens), never the Hermes JSON form, with arguments typed by the schema; the answer
    parses back to the call, whole and streamed. With a thought first (an opened <think>, closed by the
    thinking budget) the call's opening comes after the thought, under the grammar; without one it ends
    the prompt. The random model may pick any tool and values: the grammar forces the shape."""
    from test_tool_calls import _stream_tool_calls

    fmt = tagged_live.fmt
    c = tagged_live.client()
    tool_choice = choice if choice == "required" else {"type": "function", "function": {"name": choice}}
    think = {"chat_template_kwargs": {"open_thought": True}, "thinking_token_budget": 4} if thinking else \
        {"chat_template_kwargs": {"enable_thinking": False}}
    kw = dict(model="tiny-" + fmt, messages=[{"role": "user", "content": "weather?"}], tools=TAGGED_TOOLS,
              tool_choice=tool_choice, max_tokens=300, temperature=0, logprobs=True, extra_body=think,
              parallel_tool_calls=False)
    ch = c.chat.completions.create(**kw).choices[0]
    tokens = [t.token for t in ch.logprobs.content]
    generated = "".join(tokens)
    if thinking:
        thought, close, answer = generated.partition("</think>")
        assert close and ch.message.reasoning_content, generated
        answer = answer.lstrip()
    else:
        assert not generated.startswith("<tool_call>"), generated       # the opening was the prompt's
        answer = OPENINGS[fmt, choice] + generated
    m = TAGGED_SHAPES[fmt].fullmatch(answer)
    assert m is not None and '"name"' not in answer, answer
    name = m.group(1)
    assert name == choice or (choice == "required" and name in {"get_weather", "get_time"}), answer
    if fmt == "glm" and m.group(2):
        assert "<arg_key>" in tokens and "</arg_value>" in tokens, tokens     # one control token each
    assert ch.finish_reason == "tool_calls" and not ch.message.content
    (call,) = ch.message.tool_calls
    args = json.loads(call.function.arguments)
    assert call.function.name == name
    if name == "get_weather":
        _check_weather_args(args)
    else:
        assert set(args) <= {"tz"} and args.get("tz", "UTC") in ("UTC", "CET"), args
    content, calls, finish = _stream_tool_calls(c, **kw)
    assert (content, finish) == ("", "tool_calls")
    assert calls == [{"name": name, "arguments": call.function.arguments}]
    # parallel_tool_calls (the default): one or more calls, each in the format's tags (the random model
    # writes them until max_tokens cuts the last), every complete one of an offered tool as the schema asks
    kw["parallel_tool_calls"] = True
    ch = c.chat.completions.create(**kw).choices[0]
    answer = "".join(t.token for t in ch.logprobs.content)
    calls = ch.message.tool_calls
    opened = answer.count("<tool_call>") + (not thinking)       # a call cut before its name is text
    assert calls and len(calls) in ((opened - 1, opened) if ch.finish_reason == "length" else (opened,)), answer
    for call in calls[:-1] if ch.finish_reason == "length" else calls:
        assert call.function.name == choice or choice == "required", answer
        args = json.loads(call.function.arguments)
        _check_weather_args(args) if call.function.name == "get_weather" else None


HERMES_TEMPLATE = ("{% if tools %}tools: {% for t in tools %}{{ t.function.name }} {% endfor %}, called in "
                   "<tool_call>{json}</tool_call>\n{% endif %}{% for m in messages %}{{ m.role }}: {{ m.content }}\n"
                   "{% endfor %}" + THINK_SWITCH)


# JSON arguments: no other keys (a random model would write them to max_tokens)
HERMES_TOOLS = [{"type": "function", "function": {**t["function"], "parameters": {
    **t["function"]["parameters"], "additionalProperties": False}}} for t in TAGGED_TOOLS]


@pytest.fixture(scope="module")
def hermes_live(tmp_path_factory):
    """A Hermes-style template whose vocabulary holds <tool_call> and </tool_call> as control tokens."""
    from serverkit import tiny_chat_server
    assert detect(HERMES_TEMPLATE) is None
    with tiny_chat_server(tmp_path_factory.mktemp("hermes"), "tiny-hermes", QWEN_TOKENS, HERMES_TEMPLATE) as srv:
        yield srv


@pytest.mark.parametrize("thinking", [False, True], ids=["no thought", "thought first"])
def test_server_writes_hermes_tags_that_are_control_tokens_as_those_tokens(hermes_live, thinking):
    """A forced call in the Hermes form on a vocabulary where its tags are control tokens: the grammar
    writes `</tool_call>` (and after a thought `<tool_call>`, the opening being the grammar's) as the
    token, not spelled out in text, and the answer parses to the call."""
    c = hermes_live.client()
    think = {"chat_template_kwargs": {"open_thought": True}, "thinking_token_budget": 4} if thinking else \
        {"chat_template_kwargs": {"enable_thinking": False}}
    for choice in ({"type": "function", "function": {"name": "get_time"}}, "required"):
        ch = c.chat.completions.create(
            model="tiny-hermes", messages=[{"role": "user", "content": "time?"}], tools=HERMES_TOOLS,
            tool_choice=choice, parallel_tool_calls=False, max_tokens=200, temperature=0, logprobs=True,
            extra_body=think).choices[0]
        tokens = [t.token for t in ch.logprobs.content]
        assert tokens[-1] == "</tool_call>" and ("<tool_call>" in tokens) == thinking, tokens
        assert ch.finish_reason == "tool_calls" and not ch.message.content
        (call,) = ch.message.tool_calls
        args = json.loads(call.function.arguments)
        if call.function.name == "get_weather":
            _check_weather_args(args)
        else:
            assert call.function.name == "get_time" and args.get("tz", "UTC") in ("UTC", "CET"), args
    # parallel_tool_calls (the default) with a named function: one or more calls, all of it
    ch = c.chat.completions.create(
        model="tiny-hermes", messages=[{"role": "user", "content": "time?"}], tools=HERMES_TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_time"}}, max_tokens=120, temperature=0,
        logprobs=True, extra_body=think).choices[0]
    tokens = [t.token for t in ch.logprobs.content]
    assert ch.message.tool_calls and {t.function.name for t in ch.message.tool_calls} == {"get_time"}, tokens
    # (the random model goes on calling: one call was all the grammar allowed before)
    closed = tokens.count("</tool_call>")          # a call max_tokens cut comes back if its name was complete
    assert len(ch.message.tool_calls) >= 2 and len(ch.message.tool_calls) - closed in (
        (0, 1) if ch.finish_reason == "length" else (0,)), tokens


def test_a_parameter_the_tags_cannot_hold_is_left_out_or_refused():
    """A name the parsers would cut (`>` in Qwen3-Coder's `<parameter=K>`, blanks at its ends) or an
    enum whose values all hold a closing tag: an optional parameter is never written, a required one
    is a ConstraintError (the server's 400), not a call that parses to other arguments."""
    from test_constrained import ByteVocab

    from llambda.constraints import ConstraintError
    grammars = Grammars(ByteVocab(), 257)
    for fmt, close, named in (("glm", "</arg_value>", r"<arg_key>(.*?)</arg_key>"),
                              ("qwen3_coder", "</parameter>", r"<parameter=(.*?)>\\n")):
        odd = {"a>b": {"type": "string"}, " c": {"type": "integer"},
               "d": {"type": "string", "enum": ["x" + close, "y</tool_call>"]}, "e": {"type": "boolean"}}
        tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": odd}}}]
        lark = FORMATS[fmt].forced(tools, {"f"}, "function").grammar()
        assert re.findall(named, lark) == ["e"], lark
        grammars.compile(grammar_spec(grammar=lark))
        for key in ("a>b", " c", "d"):
            tools[0]["function"]["parameters"]["required"] = [key]
            with pytest.raises(ConstraintError, match=re.escape(repr(key))):
                FORMATS[fmt].forced(tools, {"f"}, "function")


def test_past_64_parameters_a_forced_tagged_call_keeps_the_schemas_order():
    """Any order takes one bit per parameter of llguidance's 64-bit rule parameter: a tool with more
    still compiles, its parameters then in the schema's order."""
    from test_constrained import ByteVocab
    grammars = Grammars(ByteVocab(), 257)
    props = {f"k{n}": {"type": "integer"} for n in range(70)}
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": props, "required": ["k3", "k69"]}}}]
    call = FORMATS["glm"].forced(tools, {"f"}, "function")
    pair = "\n<arg_key>{}</arg_key>\n<arg_value>1</arg_value>"
    for keys, ok in ((["k3", "k69"], True), (["k1", "k3", "k69"], True), (["k69", "k3"], False), (["k3"], False)):
        text = "".join(pair.format(k) for k in keys) + "\n</tool_call>"
        assert _grammar_takes(grammars, call.grammar(), text) == ok, keys


@pytest.mark.parametrize("key, schema, named", [("a>b", {"type": "string"}, "'a>b'"),
                                                ("d", {"type": "string", "format": "colour"}, "colour"),
                                                ("d", {"type": "string", "format": "uri"}, "uri")])
def test_server_refuses_a_forced_call_its_format_cannot_write(tagged_live, key, schema, named):
    """A parameter the tags cannot hold, or a keyword its text value cannot be held to (never silently
    left out): a 400 on 'tools' naming it."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {key: schema}, "required": [key]}}}]
    r = httpx.post(tagged_live.url + "/v1/chat/completions", timeout=60, json={
        "model": "tiny-" + tagged_live.fmt, "messages": [{"role": "user", "content": "x"}], "tools": tools,
        "tool_choice": "required", "max_tokens": 5})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools", r.text
    assert named in r.json()["error"]["message"]
