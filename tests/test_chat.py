"""Chat templates: byte-exact against transformers' renderings, HF environment features,
sandbox escapes and resource limits, message validation, tool-call parsing."""
import json
from datetime import datetime

import pytest

from llambda.chat import ChatTemplate, check_template_kwargs, validate_messages
from llambda.errors import ChatTemplateError, InvalidInputError, LlambdaError
from llambda.formats.gguf import GGUFFile
from tests.conftest import load_reference

USER = [{"role": "user", "content": "hi"}]


def render(source, messages=USER, **kw):
    return ChatTemplate(source).render(messages, **kw)


# --- the real templates vs transformers ------------------------------------------------------

@pytest.fixture(scope="module")
def smollm2_metadata(smollm2_gguf):
    with GGUFFile(smollm2_gguf) as f:
        return dict(f.metadata)


@pytest.fixture(scope="module")
def qwen05_metadata(qwen05_gguf):
    with GGUFFile(qwen05_gguf) as f:
        return dict(f.metadata)


@pytest.mark.model
@pytest.mark.parametrize("model", ["smollm2", "qwen05"])
def test_renders_exactly_like_transformers(model, request):
    metadata = request.getfixturevalue(f"{model}_metadata")
    ref = load_reference(f"{model}_chat_template.json")
    assert metadata["tokenizer.chat_template"] == ref["chat_template"]
    template = ChatTemplate.from_metadata(metadata)
    assert ref["conversations"]
    for conv in ref["conversations"]:
        got = template.render(conv["messages"], add_generation_prompt=conv["add_generation_prompt"],
                              tools=conv.get("tools"))
        assert got == conv["rendered"], conv["name"]
    if model == "qwen05":
        assert any("tools" in c for c in ref["conversations"])


def test_special_tokens_come_from_metadata(smollm2_metadata, qwen05_metadata):
    smol = ChatTemplate.from_metadata(smollm2_metadata)
    assert (smol.bos_token, smol.eos_token) == ("<|im_start|>", "<|im_end|>")
    qwen = ChatTemplate.from_metadata(qwen05_metadata)
    assert (qwen.bos_token, qwen.eos_token) == ("<|endoftext|>", "<|im_end|>")


def test_base_model_without_template_is_a_clear_error():
    with pytest.raises(ChatTemplateError, match="no chat template"):
        ChatTemplate.from_metadata({"general.architecture": "gemma3", "tokenizer.ggml.tokens": ["<pad>"]})


def test_qwen_renders_assistant_tool_calls_and_tool_results(qwen05_metadata):
    template = ChatTemplate.from_metadata(qwen05_metadata)
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 20}'},
    ]
    out = template.render(messages, add_generation_prompt=True)
    # OpenAI sends arguments as a JSON string; the template must see the object, as in training.
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
            '</tool_call><|im_end|>\n') in out
    assert out.endswith('<|im_start|>user\n<tool_response>\n{"temp": 20}\n</tool_response><|im_end|>\n'
                        '<|im_start|>assistant\n')


# --- environment features templates rely on ----------------------------------------------------

def test_tojson_is_plain_json_dumps():
    data = {"b": 1, "a": "<é & '>", "n": [1, 2]}
    assert render("{{ x|tojson }}", x=data) == json.dumps(data, ensure_ascii=False)
    assert render("{{ x|tojson(indent=2) }}", x=data) == json.dumps(data, ensure_ascii=False, indent=2)
    assert render("{{ x|tojson(sort_keys=true, separators=[',', ':']) }}", x=data) == \
        json.dumps(data, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    assert render("{{ x|tojson(ensure_ascii=true) }}", x=data) == json.dumps(data)


def test_trim_and_lstrip_blocks_and_no_trailing_newline():
    assert render("{% if true %}\n  x\n    {% endif %}\nend\n") == "  x\nend"


def test_loopcontrols():
    assert render("{% for i in range(9) %}{% if i == 1 %}{% continue %}{% endif %}"
                  "{% if i == 4 %}{% break %}{% endif %}{{ i }}{% endfor %}") == "023"


def test_raise_exception_carries_the_template_message():
    with pytest.raises(ChatTemplateError) as exc:
        render("{% if messages[0].role != 'system' %}{{ raise_exception('System message required') }}{% endif %}")
    assert str(exc.value) == "System message required"
    assert isinstance(exc.value, ValueError) and isinstance(exc.value, LlambdaError)


def test_globals_and_extra_kwargs():
    t = ChatTemplate("{{ bos_token }}|{{ eos_token }}|{{ add_generation_prompt }}|{{ tools }}|{{ flavour }}"
                     "|{{ messages|length }}", bos_token="<s>", eos_token="</s>")
    assert t.render(USER, flavour="mint") == "<s>|</s>|True|None|mint|1"
    assert t.render(USER, add_generation_prompt=False, tools=[{"type": "function"}], flavour=1) == \
        "<s>|</s>|False|[{'type': 'function'}]|1|1"


def test_template_kwargs_cannot_replace_what_the_renderer_sets(monkeypatch):
    """Every variable a render passes the template and every global of its environment is refused as
    an extra template variable (check_template_kwargs), whatever names they are."""
    t = ChatTemplate("{{ messages|length }}")
    seen = {}
    real = ChatTemplate._render

    def recording(self, context):
        seen.update(context)
        return real(self, context)

    monkeypatch.setattr(ChatTemplate, "_render", recording)
    t.render(USER, tools=[{"type": "function"}], flavour="mint")
    names = (set(seen) - {"flavour"}) | set(t._env.globals)
    assert {"messages", "tools", "add_generation_prompt", "bos_token", "raise_exception", "range"} <= names
    for name in sorted(names):
        with pytest.raises(InvalidInputError, match="set by the renderer"):
            check_template_kwargs({name: 1})
    # a library caller's own documents still reach a direct render (it checks nothing)
    assert ChatTemplate("{{ documents|length }}").render(USER, documents=["a", "b"]) == "2"


def test_strftime_now():
    years = {str(datetime.now().year), str(datetime.now().year + 1)}   # a render across new year
    assert render("{{ strftime_now('%Y') }}") in years


def test_namespace_undefined_and_generation_tag():
    src = ("{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}"
           "{{ ns.n }}{% if messages[0].tool_calls %}calls{% endif %}"
           "{% generation %}[{{ messages[0].content }}]{% endgeneration %}")
    assert render(src, [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]) == "2[a]"


def test_default_chatml():
    t = ChatTemplate.default_chatml()
    assert t.name == "chatml"
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    assert t.render(msgs) == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    assert t.render(msgs, add_generation_prompt=False).endswith("U<|im_end|>\n")


# --- broken and hostile templates -------------------------------------------------------------

@pytest.mark.parametrize("source", ["{% for %}", "{{ x", "{% if a %}", "{% endfor %}", ""])
def test_syntax_errors(source):
    with pytest.raises(ChatTemplateError):
        ChatTemplate(source)


@pytest.mark.parametrize("source", [
    "{{ ''.__class__ }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__ }}",
    "{{ joiner.__init__.__globals__.os }}",
    "{{ namespace.__init__ }}",
    "{{ self.__init__ }}",
    "{{ ''['__class__'] }}",
    "{{ messages._private }}",
    "{{ ''|attr('__class__') }}",
    "{{ messages|map(attribute='__class__')|list }}",
    "{{ '{0.__class__}'.format('') }}",
    "{{ '{0.__class__.__mro__}'.format_map({'0': 1}) }}",
    "{{ '%s'|format(''.__class__) }}",
    "{% for m in messages %}{{ loop.__class__ }}{% endfor %}",
    "{{ messages.append(1) }}",
    "{{ messages[0].update({'role': 'x'}) }}",
    "{{ messages[0].pop('role') }}",
    "{% include 'x' %}",
])
def test_sandbox_escapes_are_refused(source):
    with pytest.raises(ChatTemplateError):
        render(source)


def test_escape_attempt_does_not_run(tmp_path):
    marker = tmp_path / "pwned"
    source = "{{ cycler.__init__.__globals__.os.system('touch " + str(marker) + "') }}"
    with pytest.raises(ChatTemplateError, match="unsafe"):
        render(source)
    assert not marker.exists()


def test_input_messages_are_not_mutated():
    msgs = [{"role": "user", "content": [{"type": "text", "text": "a"}]}]
    render("{{ messages[0].content }}", msgs)
    assert msgs == [{"role": "user", "content": [{"type": "text", "text": "a"}]}]


@pytest.mark.parametrize("source", [
    "{% for i in range(10**9) %}x{% endfor %}",
    "{{ 'a' * 1000000000 }}",
    "{{ [0] * (10**9) }}",
    "{{ 10**(10**10) }}",
    "{% set ns = namespace(x=3) %}{% for i in range(100) %}{% set ns.x = ns.x * ns.x %}{% endfor %}",
    "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "{{ 'a'|center(1000000000) }}",
    "{{ 'a'.ljust(1000000000) }}",
    "{{ '%01000000000d' % 1 }}",
    "{{ '%*d' % (1000000000, 1) }}",
    "{{ '{:>1000000000}'.format(1) }}",
    "{{ '{:>{w}}'.format(1, w=1000000000) }}",
    "{{ ('a' * 100000).replace('a', 'a' * 100000) }}",
    "{{ ('a' * 100000)|replace('a', 'a' * 100000) }}",
    "{{ [1]|batch(1000000000, 'x')|list }}",
    "{{ [1]|slice(1000000000)|list }}",
    "{{ messages|tojson(indent=1000000000) }}",
    "{{ lipsum(100000) }}",
    "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
])
def test_resource_bombs_are_refused(source):
    with pytest.raises(ChatTemplateError):
        render(source)


def test_work_budget_stops_long_loops():
    nested = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    with pytest.raises(ChatTemplateError, match="work budget"):
        ChatTemplate(nested, max_steps=20000).render(USER)
    recursive = ("{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}"
                 "{{ f(40) }}")
    with pytest.raises(ChatTemplateError, match="work budget"):
        ChatTemplate(recursive, max_steps=20000).render(USER)


def test_output_size_is_capped():
    src = "{% for i in range(1000) %}0123456789{% endfor %}"
    assert len(ChatTemplate(src, max_output_chars=10000).render(USER)) == 10000
    with pytest.raises(ChatTemplateError, match="exceeds 9999"):
        ChatTemplate(src, max_output_chars=9999).render(USER)
    # text built up inside a set block (never output) counts too
    hidden = "{% set s %}{% for i in range(1000) %}{% for j in range(20) %}0123456789{% endfor %}" \
             "{% endfor %}{% endset %}done"
    with pytest.raises(ChatTemplateError, match="characters"):
        ChatTemplate(hidden, max_output_chars=10000).render(USER)


def test_template_runtime_errors_are_typed():
    for source in ("{{ 1 / 0 }}", "{{ undefined_fn() }}", "{{ messages[0].content + 1 }}", "{{ x|tojson }}"):
        with pytest.raises(ChatTemplateError):
            render(source, x=object()) if "x|" in source else render(source)


def test_a_long_conversation_renders_within_budget(qwen05_metadata):
    template = ChatTemplate.from_metadata(qwen05_metadata)
    msgs = []
    for i in range(1000):
        msgs += [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]
    out = template.render(msgs + [{"role": "user", "content": "last"}])
    assert out.count("<|im_start|>") == 2002 + 1


# --- message validation -----------------------------------------------------------------------

@pytest.mark.parametrize("messages,match", [
    ("hello", "list"),
    ({"role": "user", "content": "x"}, "list"),
    ([], "empty"),
    (["hi"], r"messages\[0\]"),
    ([{"content": "x"}], "role"),
    ([{"role": 3, "content": "x"}], "role"),
    ([{"role": ""}], "role"),
    ([{"role": "user"}], "content"),
    ([{"role": "user", "content": None}], "null"),
    ([{"role": "user", "content": 5}], "content"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "image_url"),
    ([{"role": "user", "content": [{"type": "text"}]}], "text"),
    ([{"role": "user", "content": ["raw"]}], "part"),
    ([{"role": "assistant", "content": None}], "null"),
    ([{"role": "assistant", "tool_calls": "x"}], "tool_calls"),
    ([{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}], "name"),
    ([{"role": "user", "content": "ok"}, {"role": "user"}], r"messages\[1\]"),
])
def test_invalid_messages(messages, match):
    with pytest.raises(ChatTemplateError, match=match):
        validate_messages(messages)
    with pytest.raises(ChatTemplateError):
        ChatTemplate.default_chatml().render(messages)


def test_valid_messages_are_normalized_copies():
    msgs = [
        {"role": "system", "content": "s", "name": "sys"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                              "function": {"name": "f", "arguments": '{"x": 1}'}}]},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "g", "arguments": "not json"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "r"},
    ]
    out = validate_messages(msgs)
    assert out[0] == {"role": "system", "content": "s", "name": "sys"}
    assert out[1]["content"] == "a\nb"
    assert out[2]["content"] is None
    assert out[2]["tool_calls"][0]["function"]["arguments"] == {"x": 1}
    assert out[2]["tool_calls"][0]["id"] == "c1"
    assert out[3]["tool_calls"][0]["function"]["arguments"] == "not json"
    assert out[4]["tool_call_id"] == "c1"
    assert msgs[2]["tool_calls"][0]["function"]["arguments"] == '{"x": 1}'   # input untouched
    assert msgs[1]["content"][0] == {"type": "text", "text": "a"}


def test_tools_must_be_a_list_of_objects():
    with pytest.raises(ChatTemplateError, match="tools"):
        render("{{ tools }}", tools="get_weather")
    with pytest.raises(ChatTemplateError, match="tools"):
        render("{{ tools }}", tools=["get_weather"])
