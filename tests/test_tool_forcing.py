"""Forced tool calls in each format's own syntax (llambda/server/tool_formats/forcing.py, tagged.py,
tools.tool_grammar): several calls under tool_choice "required" or a named function when
parallel_tool_calls is true, exactly one when it is false; JSON values in GLM's and Qwen3-Coder's tags
that never hold a closing tag; `pattern` and `format` of text values enforced as llguidance enforces
them in JSON (or refused, naming the keyword); the Hermes form built by the shared forcing code."""
from __future__ import annotations

import json

import pytest
from test_constrained import ByteVocab

from llambda.constraints import Grammars, grammar_spec
from llambda.server.tool_formats import FORMATS
from llambda.server.tool_formats.deepseek import DeepSeekFormat
from llambda.server.tool_formats.mistral import MistralFormat
from llambda.server.tools import ToolSetup, hermes_prefix, tool_grammar

DS_CALLS, DS_CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
DS_CALL, DS_END, DS_SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"

TOOLS = [{"type": "function", "function": {"name": n, "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
    "additionalProperties": False}}} for n in ("get_time", "get_weather")]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
NAMES = set(PARAMS)


@pytest.fixture(scope="module")
def grammars():
    return Grammars(ByteVocab(), 257)


def _takes(grammars, lark: str, text: str) -> bool:
    c = grammars.compile(grammar_spec(grammar=lark)).start()
    return all(c.try_advance(b) for b in text.encode()) and c.accepting


def _glm(name, city):
    return f"<tool_call>{name}\n<arg_key>city</arg_key>\n<arg_value>{city}</arg_value>\n</tool_call>"


def _qwen(name, city):
    return f"<tool_call>\n<function={name}>\n<parameter=city>\n{city}\n</parameter>\n</function>\n</tool_call>"


def _obj(key):
    return lambda n, c: f'{{"name": "{n}", "{key}": {{"city": "{c}"}}}}'


# (label, format, how it writes each call, how calls are joined, (before, after) the calls)
WRITERS = [
    ("hermes", FORMATS["hermes"], lambda n, c: f'<tool_call>\n{_obj("arguments")(n, c)}\n</tool_call>', "\n", ("", "")),
    ("mistral", FORMATS["mistral"], lambda n, c: f'[TOOL_CALLS]{n}[ARGS]{{"city": "{c}"}}', "", ("", "")),
    ("mistral array", MistralFormat(tagged=False), _obj("arguments"), ", ", ("[TOOL_CALLS][", "]")),
    ("tool_call_token", FORMATS["tool_call_token"], _obj("arguments"), ", ", ("<|tool_call|>[", "]")),
    ("llama3", FORMATS["llama3"], _obj("parameters"), "; ", ("", "")),
    ("deepseek r1", FORMATS["deepseek"],
     lambda n, c: f'{DS_CALL}function{DS_SEP}{n}\n```json\n{{"city": "{c}"}}\n```{DS_END}', "\n",
     (DS_CALLS, DS_CALLS_END)),
    ("deepseek v3.1", DeepSeekFormat(v31=True), lambda n, c: f'{DS_CALL}{n}{DS_SEP}{{"city": "{c}"}}{DS_END}', "",
     (DS_CALLS, DS_CALLS_END)),
    ("glm", FORMATS["glm"], _glm, "\n", ("", "")),
    ("qwen3_coder", FORMATS["qwen3_coder"], _qwen, "\n", ("", "")),
]


def _answer(write, join, ends, calls):
    return ends[0] + join.join(write(n, c) for n, c in calls) + ends[1]


def _forced(label, fmt, choice, names, parallel, tools=TOOLS):
    """(the prompt's end, the grammar of the rest) of a forced call in the format."""
    if label == "hermes":
        opening = hermes_prefix("required" if choice == "required" else next(iter(names)))
        return opening, tool_grammar(tools, names, choice, parallel)
    call = fmt.forced(tools, names, choice, parallel=parallel)
    return call.opening, call.grammar()


@pytest.mark.parametrize("label, fmt, write, join, ends", WRITERS, ids=[w[0] for w in WRITERS])
def test_required_makes_one_or_more_calls_with_parallel_tool_calls_and_exactly_one_without(
        grammars, label, fmt, write, join, ends):
    """OpenAI's "required" is one or more calls: with parallel_tool_calls the grammar takes further calls
    in the format's own syntax (a named function: more calls of it), without it exactly one; whatever it
    takes parses back to those calls, in pieces and whole."""
    one = [("get_weather", "Oslo")]
    two = [("get_weather", "Oslo"), ("get_time", "Rome")]
    same = [("get_time", "Oslo"), ("get_time", "Rome")]
    for choice, names in (("required", NAMES), ("function", {"get_time"})):
        for parallel in (True, False):
            opening, lark = _forced(label, fmt, choice, names, parallel)
            for calls in (one, two, same, [("get_time", "Oslo")]):
                text = _answer(write, join, ends, calls)
                ok = all(n in names for n, _ in calls) and (parallel or len(calls) == 1)
                assert text.startswith(opening) or not ok, (label, choice, opening)
                rest = text[len(opening):] if text.startswith(opening) else text
                assert _takes(grammars, lark, rest) == ok, (label, choice, parallel, text)
                if not ok:
                    continue
                setup = ToolSetup(names, opening, parallel, format=None if label == "hermes" else fmt,
                                  params=PARAMS)
                content, got = setup.extract(rest)
                assert content == "" and [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                                          for c in got] == [(n, {"city": c}) for n, c in calls], (label, text)


# -- JSON values in GLM's and Qwen3-Coder's tags never hold a closing tag -------------------------

NESTED_TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"obj": {"type": "object"}, "arr": {"type": "array", "items": {"type": "string"}},
                                     "deep": {"$ref": "#/$defs/d"}, "s": {"type": "string"}},
    "$defs": {"d": {"type": "object", "properties": {"k": {"type": "array"}}, "additionalProperties": False}}}}}]
NESTED_PARAMS = {"f": NESTED_TOOLS[0]["function"]["parameters"]}


def _glm_call(key, value):
    return f"<tool_call>f\n<arg_key>{key}</arg_key>\n<arg_value>{value}</arg_value>\n</tool_call>"


def _qwen_call(key, value):
    return f"<tool_call>\n<function=f>\n<parameter={key}>\n{value}\n</parameter>\n</function>\n</tool_call>"


# (format, key, value as written, taken); what is taken must read back to json.loads(value) (or the text)
NESTED = [(fmt, key, value, ok) for fmt in ("glm", "qwen3_coder") for key, value, ok in (
    ("obj", '{"a": "<tool_call> and <arg_key> are text"}', True),
    ("obj", '{"a": "x</tool_call>"}', False),
    ("obj", '{"a": {"b": ["</tool_call>"]}}', False),                 # at any depth
    ("obj", '{"</tool_call>": 1}', False),                            # in a key
    ("arr", '["ok", "</tool_call>"]', False),
    ("arr", '["<\\/tool_call>"]', False),                             # llguidance writes no \\/ escape
    ("deep", '{"k": [{"z": "</tool_call>"}]}', False),                # through a $ref
    ("deep", '{"k": [{"z": "</tool_call"}]}', True),
)] + [
    ("glm", "obj", '{"a": "x</arg_value>"}', False), ("glm", "arr", '["</arg_value>"]', False),
    ("glm", "obj", '{"a": "</parameter> <parameter=x>"}', True),      # Qwen3-Coder's tags are GLM's text
    ("qwen3_coder", "obj", '{"a": "x</parameter>"}', False), ("qwen3_coder", "arr", '["</parameter>"]', False),
    # the reference parser (vLLM's) also ends a value before <parameter= and </function>: never written
    ("qwen3_coder", "obj", '{"a": "<parameter=x>"}', False), ("qwen3_coder", "arr", '["</function>"]', False),
    ("qwen3_coder", "s", "a <parameter=b> c", False), ("qwen3_coder", "s", "x</function>", False),
    ("qwen3_coder", "s", "<function=x> </arg_value>", True),
]


@pytest.mark.parametrize("fmt, key, value, ok", NESTED)
def test_a_json_value_in_the_tags_never_holds_a_closing_tag(grammars, fmt, key, value, ok):
    """A parameter typed as an object or array is JSON text between the tags; a string or key in it,
    at any depth (through $refs too), never holds the value's or the call's closing tag (nor, in
    Qwen3-Coder's, `<parameter=` or `</function>`, where the model's own parser ends a value), and what
    the grammar takes reads back to exactly the value written."""
    text = (_glm_call if fmt == "glm" else _qwen_call)(key, value)
    call = FORMATS[fmt].forced(NESTED_TOOLS, {"f"}, "function")
    assert text.startswith(call.opening)
    assert _takes(grammars, call.grammar(), text[len(call.opening):]) == ok, text
    if ok:
        setup = ToolSetup({"f"}, call.opening, format=FORMATS[fmt], params=NESTED_PARAMS)
        content, got = setup.extract(text[len(call.opening):])
        want = value if key == "s" else json.loads(value)
        assert content == "" and [json.loads(c["function"]["arguments"]) for c in got] == [{key: want}]


def test_the_pattern_of_strings_without_a_tag_is_exact(grammars):
    """tag_free.avoiding: the strings it takes are exactly those holding none of the words, checked on
    every string of up to 4 pieces of the words (and their starts) against `in`, through llguidance
    (a JSON string under the pattern) and Python's re alike."""
    import itertools
    import re

    from llambda.server.tool_formats.tag_free import avoiding
    words = ["</parameter>", "</tool_call>", "<parameter=", "</function>"]
    rx = avoiding(words)
    g = grammars.compile(grammar_spec(json_schema={"type": "string", "pattern": rx}))
    pieces = ["<", "/", "x", "</para", "meter>", "<parameter", "=", "</tool_call>", "</function", ">"]
    for n in range(5):
        for parts in itertools.product(pieces, repeat=n):
            s = "".join(parts)
            want = not any(w in s for w in words)
            assert (re.fullmatch(rx, s) is not None) == want, s
            if n <= 3:
                c = g.start()
                assert (all(c.try_advance(b) for b in json.dumps(s).encode()) and c.accepting) == want, s
    with pytest.raises(ValueError):
        avoiding(["<a<", "<b"])


# -- pattern and format: a text value held to what llguidance holds a JSON string to --------------

FORMAT_SAMPLES = {
    "date": ["2024-02-29", "2024-02-30", "2023-04-31", "2023-04-30", "2024-1-01", "2024-12-31", "abcd-01-01",
             "2024-13-01", "2024-00-10", "2024-01-00"],
    "time": ["12:30:00Z", "12:30:00", "23:59:60+01:00", "24:00:00Z", "12:30:00.123-05:30", "12:30:00z",
             "12:60:00Z", "12:30:00+24:00", "12:30:00.Z"],
    "date-time": ["2024-02-29T12:30:00Z", "2024-02-29t12:30:00+02:00", "2024-02-29 12:30:00Z", "2024-02-29T12:30Z",
                  "2024-02-30T12:30:00Z"],
    "duration": ["P1Y2M3DT4H5M6S", "PT5M", "P3W", "P", "PT", "P1Y3D", "P1DT", "P1M2D", "PT1H2S", "P1W2D", "P2D",
                 "PT4H5M", "P1Y2M"],
    "email": ["a@b.co", "a.b+c@x-y.org", "a..b@c.d", ".a@b.c", "a@[1.2.3.4]", "a@[1.2.3.256]", "a@-b.c", "a@b-.c",
              "@b.c", "a b@c.d", "a@b", "{x}~@y"],
    "hostname": ["example.com", "a-b.c", "-a.com", "a..b", "x" * 63, "x" * 64, "a.b-", "a"],
    "ipv4": ["1.2.3.4", "255.255.255.255", "256.1.1.1", "01.2.3.4", "1.2.3", "1.2.3.4.5", "0.0.0.0"],
    "ipv6": ["::", "::1", "1::", "1:2:3:4:5:6:7:8", "1:2:3:4:5:6:7::", "1::8", "1:2:3:4:5:6:7:8:9", "1:::2",
             "::ffff:1.2.3.4", "12345::", "1:2:3:4:5:6::7:8", "a:b::c:d", "1:2:3:4:5:6:7", "fe80::1:2:3:4:5:6"],
    "uuid": ["123e4567-e89b-12d3-a456-426614174000", "123e4567e89b12d3a456426614174000",
             "123E4567-E89B-12D3-A456-42661417400G", "123E4567-E89B-12D3-A456-42661417400F"],
}
PATTERN_SAMPLES = [("^[A-Z]{3}$", ["ABC", "abc", "ABCD", ""]), ("[0-9]", ["a1b", "ab", "1"]),
                   ("^a|b$", ["ax", "xb", "xa", "a", "b"]), ("^\\d+(\\.\\d+)?$", ["1", "1.5", "1.", "a"]),
                   ("colou?r", ["my color", "colr", "colour!"]), ("^$", ["", "a"]), ("\\$$", ["a$", "a"]),
                   ("[$^]", ["^", "a"]), ("^(a|b)c$", ["ac", "bc", "abc"]), ("\\w+@", ["ab@", "@"])]


def _text_call(fmt, value):
    return (_glm_call if fmt == "glm" else _qwen_call)("v", value)


def _one_string_tool(schema):
    return [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"v": schema}, "required": ["v"]}}}]


@pytest.mark.parametrize("fmt", ["glm", "qwen3_coder"])
@pytest.mark.parametrize("kind, key", [("format", k) for k in FORMAT_SAMPLES] + [("pattern", None)])
def test_a_text_values_pattern_and_format_are_llguidances(grammars, fmt, kind, key):
    """A string parameter written as text takes exactly the strings llguidance takes as a JSON string
    under the same `format` (each of OpenAI's strict mode's) or `pattern` (searched for, anchored per
    alternative): llguidance's JSON enforcement is the oracle; what is taken reads back as written."""
    cases = [({"type": "string", "format": key}, FORMAT_SAMPLES[key])] if kind == "format" else \
        [({"type": "string", "pattern": p}, samples) for p, samples in PATTERN_SAMPLES]
    for schema, samples in cases:
        call = FORMATS[fmt].forced(_one_string_tool(schema), {"f"}, "function")
        text_grammar = grammars.compile(grammar_spec(grammar=call.grammar()))
        json_grammar = grammars.compile(grammar_spec(json_schema=schema))
        taken = 0
        for s in samples:
            c = json_grammar.start()
            want = all(c.try_advance(b) for b in json.dumps(s).encode()) and c.accepting
            text = _text_call(fmt, s)[len(call.opening):]
            c = text_grammar.start()
            assert (all(c.try_advance(b) for b in text.encode()) and c.accepting) == want, (schema, s, want)
            if want:
                taken += 1
                params = {"f": _one_string_tool(schema)[0]["function"]["parameters"]}
                got = ToolSetup({"f"}, call.opening, format=FORMATS[fmt], params=params).extract(text)[1]
                assert json.loads(got[0]["function"]["arguments"]) == {"v": s}
        assert 0 < taken < len(samples), schema          # the samples tell both ways


@pytest.mark.parametrize("fmt", ["glm", "qwen3_coder"])
@pytest.mark.parametrize("schema, named", [
    ({"type": "string", "format": "uri"}, "'format' \"uri\""),          # llguidance's, not OpenAI strict's
    ({"type": "string", "format": "colour"}, "Unknown format: colour"),
    ({"type": "string", "pattern": "(?=a)b"}, "look-around"),
    ({"type": "string", "pattern": "(^a)"}, "'pattern' \"(^a)\""),
    ({"type": "string", "maxLength": 5000}, "'maxLength' past 2000"),
    ({"type": "string", "anyOf": [{"pattern": "a"}, {"pattern": "b"}]}, "'anyOf'"),
    ({"type": "string", "uniqueItems": True}, "uniqueItems"),
    ({"type": "string", "enum": ["a", "b"], "pattern": "^c"}, "Unsatisfiable"),
])
def test_a_keyword_a_text_value_cannot_be_held_to_is_refused_by_name(fmt, schema, named):
    """Never silently left out: a keyword a text value cannot be held to is a ConstraintError (the
    server's 400 on 'tools') naming the tool, the parameter and the keyword, required or not."""
    from llambda.constraints import ConstraintError
    for required in (["v"], []):
        tools = _one_string_tool(schema)
        tools[0]["function"]["parameters"]["required"] = required
        with pytest.raises(ConstraintError) as e:
            FORMATS[fmt].forced(tools, {"f"}, "function")
        assert "tool 'f', parameter 'v'" in str(e.value) and named in str(e.value), str(e.value)


def test_enum_values_follow_a_pattern_too(grammars):
    tools = _one_string_tool({"type": "string", "enum": ["ab", "cd", "ce"], "pattern": "^c"})
    call = FORMATS["glm"].forced(tools, {"f"}, "function")
    for s, ok in (("ab", False), ("cd", True), ("ce", True), ("cf", False)):
        assert _takes(grammars, call.grammar(), _text_call("glm", s)[len(call.opening):]) == ok, s


@pytest.mark.parametrize("label, fmt", [(w[0], w[1]) for w in WRITERS if w[0] not in ("glm", "qwen3_coder")])
def test_json_formats_enforce_pattern_and_format_and_refuse_what_llguidance_cannot(grammars, label, fmt):
    """The JSON-form formats write arguments under llguidance's %json: `pattern` and `format` are held,
    and an unknown format or keyword is a ConstraintError naming it when the grammar compiles."""
    from llambda.constraints import ConstraintError
    tools = _one_string_tool({"type": "string", "format": "date", "pattern": "^2024"})
    opening, lark = _forced(label, fmt, "function", {"f"}, False, tools)
    g = grammars.compile(grammar_spec(grammar=lark))
    key = "parameters" if label == "llama3" else "arguments"
    for value, ok in (("2024-02-29", True), ("2023-02-28", False), ("2024-02-30", False)):
        text = {"hermes": f'<tool_call>\n{{"name": "f", "arguments": {{"v": "{value}"}}}}\n</tool_call>',
                "mistral": f'[TOOL_CALLS]f[ARGS]{{"v": "{value}"}}',
                "deepseek r1": f'{DS_CALLS}{DS_CALL}function{DS_SEP}f\n```json\n{{"v": "{value}"}}\n```{DS_END}'
                               f'{DS_CALLS_END}',
                "deepseek v3.1": f'{DS_CALLS}{DS_CALL}f{DS_SEP}{{"v": "{value}"}}{DS_END}{DS_CALLS_END}'}.get(
            label, {"mistral array": "[TOOL_CALLS][", "tool_call_token": "<|tool_call|>["}.get(label, "")
            + f'{{"name": "f", "{key}": {{"v": "{value}"}}}}' + ("]" if label in ("mistral array", "tool_call_token")
                                                              else ""))
        assert text.startswith(opening), (label, opening)
        c = g.start()
        assert (all(c.try_advance(b) for b in text[len(opening):].encode()) and c.accepting) == ok, (label, value)
    for schema, named in (({"type": "string", "format": "colour"}, "colour"), ({"type": "array", "uniqueItems": True},
                                                                                "uniqueItems")):
        with pytest.raises(ConstraintError, match=named):
            grammars.compile(grammar_spec(grammar=_forced(label, fmt, "required", {"f"}, False,
                                                          _one_string_tool(schema))[1]))


# -- the Hermes form: one more user of the shared forcing code, its grammars unchanged ------------

def _hermes_golden_cases():
    """(key, tools, names, choice, parallel, inline, tokenizer) of each grammar the fixture holds."""
    class Controls:       # <tool_call> and </tool_call> as control tokens 1000 and 1001
        def encode(self, text, parse_special=True):
            tags = ["<tool_call>", "</tool_call>"]
            return [1000 + tags.index(text)] if parse_special and text in tags else list(text.encode())

        def is_special(self, i):
            return i >= 1000
    for label, tools in (("two", TOOLS), ("nested", NESTED_TOOLS)):
        names = sorted(t["function"]["name"] for t in tools)
        for choice, chosen in (("required", names), ("function", names[:1])):
            for parallel in (False, True):
                for inline in (False, True):
                    for spelled, tok in (("text", None), ("controls", Controls())):
                        yield (f"{label} {choice} parallel={parallel} inline={inline} {spelled}", tools, set(chosen),
                               choice, parallel, inline, tok)


def test_the_hermes_forced_grammar_is_the_shared_codes_and_unchanged(grammars):
    """tools.tool_grammar's forced calls are HermesFormat.forced's (forcing.forced_call, as every other
    format's): for "required" and a named function, parallel or not, after a thought or not, its tags as
    text or as control tokens, the grammar is the one written before the change (the fixture, written
    by tools.tool_grammar at commit 1eac8b0, before it used the shared code) but for parentheses around the start rule's body and the rules' order; and on a
    corpus of answers both grammars take the same ones."""
    from pathlib import Path
    golden = json.loads((Path(__file__).parent / "fixtures" / "tool_grammars" / "hermes_forced.json").read_text())
    cases = list(_hermes_golden_cases())
    assert sorted(k for k, *_ in cases) == sorted(golden)
    seen = set()
    for key, tools, names, choice, parallel, inline, tok in cases:
        new = tool_grammar(tools, names, choice, parallel, inline=inline, tokenizer=tok)
        call = FORMATS["hermes"].force(tools, names, choice, tok, parallel)
        assert new == call.grammar(inline=inline)
        # the old grammar: the same start rule without ForcedCall's parentheses around its body, the same rules
        lead = call.spell(call.opening) + " " if inline else ""
        head, start, *rules = golden[key].strip().split("\n")
        assert (head, start, sorted(rules)) == ("%llguidance {}", f"start: {lead}{call.rest}", sorted(call.rules)), key
        if tok is not None:
            continue
        opening = hermes_prefix("required" if choice == "required" else next(iter(names)))
        old_g, new_g = (grammars.compile(grammar_spec(grammar=g)) for g in (golden[key], new))
        for calls in ([("get_time", "Oslo")], [("get_time", "Oslo"), ("get_weather", "x")], [("f", "Oslo")]):
            for glue in ("\n", ""):
                text = glue.join(f'<tool_call>\n{{"name": "{n}", "arguments": {{"city": "{c}"}}}}\n</tool_call>'
                                 for n, c in calls)
                for variant in (text, text.replace('"arguments": ', '"arguments":'), text.replace("}\n</", "}</"),
                                text.replace("\n{", "{")):
                    answer = variant if inline else variant[len(opening):] if variant.startswith(opening) else None
                    if answer is None:
                        continue
                    took = []
                    for g in (old_g, new_g):
                        c = g.start()
                        took.append(all(c.try_advance(b) for b in answer.encode()) and c.accepting)
                    assert took[0] == took[1], (key, answer)
                    seen.add(took[0])
    assert seen == {True, False}           # the corpus tells both ways


@pytest.mark.parametrize("schema, ok, bad", [
    ({"type": "array", "items": [{"type": "string"}]}, '["x"]', '["</tool_call>"]'),          # a tuple's items
    ({"type": "array", "prefixItems": [{"type": "integer"}]}, '[1, "x"]', '[1, "</tool_call>"]'),
    ({"anyOf": [{"type": "object"}, {"type": "null"}]}, '{"a": ["x"]}', '{"a": ["</tool_call>"]}'),
    ({"type": "object", "properties": {"</tool_call>": {"type": "integer"}}}, '{"b": 1}', '{"</tool_call>": 1}'),
    # an object declared in an object (llguidance had refused the schema: its free keys' pattern matched the
    # declared key, and the two objects' schemas intersected without end), at any depth
    ({"type": "object", "properties": {"a": {"type": "object"}}}, '{"a": {"b": {"c": "x"}}, "d": 1}',
     '{"a": {"b": "</tool_call>"}}'),
    ({"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "object"}}}}},
     '{"a": {"b": {"c": ["x"]}}}', '{"a": {"b": {"c": ["</tool_call>"]}}}'),
    ({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "object"}}}}, '{"a": [{"k": 1}]}',
     '{"a": [{"k": "</tool_call>"}]}'),
    # a declared key is taken as declared, `<` and all; a free key holds no `<`
    ({"type": "object", "properties": {"a<b": {"type": "object"}}}, '{"a<b": {"x": 1}}', '{"a<c": 1}'),
    ({"type": "object"}, '{"a": {"b": 1}}', '{"a": {"<b": 1}}'),
])
def test_tag_free_reaches_every_place_a_string_can_stand(grammars, schema, ok, bad):
    from llambda.server.tool_formats.tag_free import tag_free
    g = grammars.compile(grammar_spec(json_schema=tag_free(schema, ["</tool_call>"])))
    for text, want in ((ok, True), (bad, False)):
        c = g.start()
        assert (all(c.try_advance(b) for b in text.encode()) and c.accepting) == want, text


@pytest.mark.parametrize("fmt", ["glm", "qwen3_coder"])
def test_object_parameters_holding_objects_compile_and_fit(grammars, fmt):
    """Three tools of 20 object parameters, each holding an object and an array of objects: their forced grammar
    fits the grammar size limit (the tags' pattern on every object's free keys had put it past), compiles, and
    takes a call."""
    props = {f"k{i}": {"type": "object", "properties": {"x": {"type": "object"}, "y": {
        "type": "array", "items": {"type": "object"}}}} for i in range(20)}
    tools = [{"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": props,
                                                                         "required": ["k0"]}}} for n in "fgh"]
    call = FORMATS[fmt].forced(tools, {"f", "g", "h"}, "required", parallel=True)
    value = '{"x": {"a": 1}, "y": [{"b": "c"}]}'
    text = (_glm_call if fmt == "glm" else _qwen_call)("k0", value)
    assert _takes(grammars, call.grammar(), text[len(call.opening):]), text
