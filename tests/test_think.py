"""Reasoning in <think>...</think>: split from the answer as it streams, and the template variables
that control it (chat_template_kwargs, reasoning_effort and each API's own field).

The parser is checked on crafted texts, whole and cut at every position (the two must agree); the
server end to end on a tiny random model with a Qwen3-like template, made to write a thought by a
regex constraint (its text is exactly what a reasoning model would write).
"""
import json
import random
import re

import httpx
import pytest

from llambda.chat import check_template_kwargs
from llambda.errors import ChatTemplateError, InvalidInputError
from llambda.server.think import ThinkParser
from llambda.server.tools import ToolSetup
from llambda.thinking import MAX_HELD_BLANKS, prompt_opens_thought, template_thinks
from whole_outputs import split_thinking

# (output, the prompt opened the thought, reasoning, content)
CASES = [
    ("<think>\nThe capital is Paris.\n</think>\n\nParis.", False, "The capital is Paris.", "Paris."),
    ("  <think>a</think>b", False, "a", "b"),
    # the template opened <think> itself: only the close appears
    ("The user asks.\n</think>\n\nParis.", True, "The user asks.", "Paris."),
    # Qwen3 told not to think closes an empty thought in the prompt: the output is the answer
    ("Paris.", False, "", "Paris."),
    # text before <think>: no thought, the tags are the answer's text
    ("Hi <think>x</think> there", False, "", "Hi <think>x</think> there"),
    # cut off before </think> (max_tokens): all reasoning
    ("<think>\nStill thinking about it", False, "Still thinking about it", ""),
    ("Still thinking </thi", True, "Still thinking </thi", ""),
    # a <think> inside the thought is its text; the first </think> ends it; a later one is the answer's
    ("<think>a <think> b</think>c</think>", False, "a <think> b", "c</think>"),
    ("<think></think>\n\nanswer", False, "", "answer"),
    ("<think>", False, "", ""),
    ("", False, "", ""),
    ("<thi", False, "", "<thi"),
    ("\n\n", False, "", "\n\n"),
    ("an answer with </think> in it", False, "", "an answer with </think> in it"),
]


def fed(text, opened, cuts, inner=None):
    """(reasoning, content, call deltas) of `text` fed to a parser cut at `cuts`."""
    p = ThinkParser(inner, opened)
    reasoning, content, deltas = [], [], []
    bounds = [0, *cuts, len(text)]
    for i, j in zip(bounds, bounds[1:]):
        c, d = p.feed(text[i:j])
        content.append(c), reasoning.append(p.take_reasoning()), deltas.extend(d)
    c, d = p.finish()
    content.append(c), reasoning.append(p.take_reasoning()), deltas.extend(d)
    return "".join(reasoning), "".join(content), deltas


@pytest.mark.parametrize("text, opened, reasoning, content", CASES)
def test_split_whole_and_cut_anywhere(text, opened, reasoning, content):
    assert split_thinking(text, opened) == (reasoning, content)
    for k in range(len(text) + 1):          # a tag split across two deltas at every position
        assert fed(text, opened, [k])[:2] == (reasoning, content), k
    assert fed(text, opened, list(range(1, len(text))))[:2] == (reasoning, content)   # a character at a time
    rng = random.Random(len(text))
    cuts = sorted(rng.sample(range(1, len(text)), min(3, max(len(text) - 1, 0)))) if len(text) > 1 else []
    assert fed(text, opened, cuts)[:2] == (reasoning, content)


@pytest.mark.parametrize("text, opened, reasoning, content", CASES)
def test_reasoning_span_whole_and_cut_anywhere(text, opened, reasoning, content):
    """Where the thought lies, tags included (usage's reasoning_tokens): the answer is what follows it."""
    spans = []
    for k in range(len(text) + 1):
        p = ThinkParser(None, opened)
        p.feed(text[:k]), p.feed(text[k:])
        spans.append(p.reasoning_spans())
    assert all(s == spans[0] for s in spans)
    end = spans[0][0][1] if spans[0] else 0
    assert (spans[0] == []) == (not opened and not text.lstrip().startswith("<think>"))
    assert reasoning in text[:end] and text[end:].strip() == content.strip()



@pytest.mark.parametrize("text, opened, reasoning, content", CASES)
def test_content_span_whole_and_cut_anywhere(text, opened, reasoning, content):
    """Where the answer's text lies (the /v1/responses text's logprobs): it spells the content."""
    for k in range(len(text) + 1):
        p = ThinkParser(None, opened)
        p.feed(text[:k]), p.feed(text[k:]), p.finish()
        assert "".join(text[a:b] for a, b in p.content_spans()) == content, k


def test_a_run_of_blanks_is_held_back_bounded():
    """A model writing nothing but blanks: the parser holds at most MAX_HELD_BLANKS of them (it re-read
    all it held at every token: time quadratic in the output), whole and streamed still agree."""
    run = " \n" * (3 * MAX_HELD_BLANKS)
    for text, opened in ((f"<think>a{run}", False), (f"<think>{run}b{run}</think>{run}c", False),
                         (f"x{run}</think>y", True), (f"{run}<think>a</think>b", False), (run, False)):
        for step in (1, 7, MAX_HELD_BLANKS + 3):
            p = ThinkParser(None, opened)
            for i in range(0, len(text), step):
                p.feed(text[i:i + step])
                assert len(p.buf) <= MAX_HELD_BLANKS + len("</think>") + step
            assert fed(text, opened, list(range(step, len(text), step)))[:2] == split_thinking(text, opened)
    # the thought keeps the blanks before its last MAX_HELD_BLANKS ones; a <think> after more leading
    # blanks than that is the answer's text
    reasoning, content = split_thinking(f"<think>a{run}</think>b")
    assert reasoning == "a" + run[:len(run) - MAX_HELD_BLANKS] and content == "b"
    assert split_thinking(f"{run}<think>a</think>b") == ("", f"{run}<think>a</think>b")
    assert split_thinking(" " * MAX_HELD_BLANKS + "<think>a</think>b") == ("a", "b")


def test_reasoning_streams_before_the_close():
    p = ThinkParser()
    assert p.feed("<think>\nLet me see") == ("", [])
    assert p.take_reasoning() == "Let me see"      # not held until </think>
    p.feed(" more </th")
    assert p.take_reasoning() == " more"           # the blank and the partial tag are held
    assert p.feed("ink>\n\nDone") == ("Done", []) and p.take_reasoning() == ""


@pytest.mark.parametrize("cut", range(0, 80, 7))
def test_tool_call_after_the_thought(cut):
    text = ('<think>I need the weather.</think>\n\n'
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>')
    reasoning, content, deltas = fed(text, False, [cut], ToolSetup({"get_weather"}).parser())
    assert reasoning == "I need the weather." and content == ""
    assert deltas[0]["function"]["name"] == "get_weather"
    assert json.loads("".join(d["function"].get("arguments", "") for d in deltas)) == {"city": "Oslo"}


def test_which_templates_and_prompts_think():
    assert template_thinks("{{ '<think>\\n' }}") and template_thinks("{% if '</think>' in c %}")
    assert not template_thinks("{{ messages }}") and not template_thinks(None)
    assert prompt_opens_thought("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_thought("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt_opens_thought("user: what does <think> mean?\nassistant:")
    assert not prompt_opens_thought("assistant:")
    # an answer's given start (prefill) that opens a thought, or closes the one the prompt opened
    assert prompt_opens_thought("assistant:", "<think>\nLet me") and not prompt_opens_thought("a:", "<think>x</think>")
    assert prompt_opens_thought("assistant:<think>\n", "Let me") and not prompt_opens_thought("a:<think>", "x</think>")


@pytest.mark.parametrize("kwargs, message", [
    ({"messages": []}, "set by the renderer"),
    ({"add_generation_prompt": False}, "set by the renderer"),
    ({"raise_exception": 1}, "set by the renderer"),
    ({"not a name": 1}, "identifiers"),
    ([("enable_thinking", False)], "must be an object"),
    ({"x": {"a": [[[[[[[[[1]]]]]]]]]}}, "nested"),
    ({"x": "a" * 70_000}, "characters"),
    ({f"v{i}": 0 for i in range(33)}, "at most 32"),
    ({"x": float("nan")}, "NaN"),
    ({"x": [10 ** 5000]}, "integer too long"),
    ({"x": {1: 2}}, "string keys"),
])
def test_template_kwargs_are_bounded(kwargs, message):
    with pytest.raises(InvalidInputError, match=message):
        check_template_kwargs(kwargs)


def test_template_kwargs_pass_plain_data():
    kw = {"enable_thinking": False, "reasoning_effort": "low", "opts": {"a": [1, 2.5, None, "x"]}}
    assert check_template_kwargs(kw) == kw and check_template_kwargs(None) == {}


# -- a model that thinks ------------------------------------------------------------------------

THINK_TOKENS = ("<think>", "</think>")
# Qwen3's switch (enable_thinking false closes an empty thought), QwQ's opening of the thought
# (open_thought, a variable of this test), gpt-oss's reasoning_effort; `refuse` shows a variable arrived
TEMPLATE = ("{% if refuse is defined %}{{ raise_exception('refused: ' ~ refuse) }}{% endif %}"
            "{% if reasoning_effort is defined %}Reasoning: {{ reasoning_effort }}\n{% endif %}"
            "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if tools %}{{ tools | length }} tools\n{% endif %}"
            "{% if add_generation_prompt %}assistant:"
            "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
            "{% elif open_thought is defined and open_thought %}<think>\n{% endif %}{% endif %}")
THOUGHT, ANSWER = "The user greets me. I greet back.", "Hello there."
OUTPUT = f"<think>\n{THOUGHT}\n</think>\n\n{ANSWER}"
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    from serverkit import tiny_chat_server
    with tiny_chat_server(tmp_path_factory.mktemp("think"), "tiny-think", THINK_TOKENS, TEMPLATE) as srv:
        yield srv


def _post(live, path, body, **kw):
    return httpx.post(live.url + path, json=body, timeout=120, **kw)


def _chat(answer: str = OUTPUT, **kw) -> dict:
    # the regex makes the random model write exactly `answer`
    return {"model": "tiny-think", "messages": USER, "max_tokens": 200, "temperature": 0,
            "regex": re.escape(answer), **kw}


def test_template_kwargs_reach_the_template(live):
    def prompt(**kw):
        r = _post(live, "/apply-template", {"messages": USER, **kw})
        assert r.status_code == 200, r.text
        return r.json()["prompt"]
    assert prompt() == "user: hi\nassistant:"
    assert prompt(chat_template_kwargs={"enable_thinking": False}) == "user: hi\nassistant:<think>\n\n</think>\n\n"
    assert prompt(chat_template_kwargs={"enable_thinking": True}) == "user: hi\nassistant:"
    assert prompt(reasoning_effort="high") == "Reasoning: high\nuser: hi\nassistant:"
    # OpenAI's other efforts reach the template as the nearest level it knows
    assert prompt(reasoning_effort="minimal") == prompt(reasoning_effort="none") == prompt(reasoning_effort="low")
    assert prompt(reasoning_effort="xhigh") == prompt(reasoning_effort="high")


@pytest.mark.parametrize("body, param", [
    ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
    ({"chat_template_kwargs": {"add_generation_prompt": False}}, "chat_template_kwargs"),
    ({"chat_template_kwargs": "enable_thinking=false"}, "chat_template_kwargs"),
    ({"chat_template_kwargs": {"x": [[[[[[[[[[0]]]]]]]]]]}}, "chat_template_kwargs"),
    ({"reasoning_effort": "extreme"}, "reasoning_effort"),
    ({"reasoning_effort": 3}, "reasoning_effort"),
    ({"reasoning_effort": "low", "chat_template_kwargs": {"reasoning_effort": "high"}}, "reasoning_effort"),
])
def test_bad_controls_are_400(live, body, param):
    r = _post(live, "/v1/chat/completions", {**_chat(), **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_chat_separates_the_thought(live):
    r = _post(live, "/v1/chat/completions", _chat())
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["message"]["reasoning_content"] == THOUGHT
    assert choice["message"]["content"] == ANSWER and choice["finish_reason"] == "stop"


def test_streamed_and_whole_agree(live):
    whole = _post(live, "/v1/chat/completions", _chat())
    with httpx.stream("POST", live.url + "/v1/chat/completions", json=_chat(stream=True), timeout=120) as s:
        chunks = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    content = "".join(d.get("content") or "" for d in deltas)
    msg = whole.json()["choices"][0]["message"]
    assert (reasoning, content) == (msg["reasoning_content"], msg["content"]) == (THOUGHT, ANSWER)
    assert all("<think>" not in d.get("content", "") and "</think>" not in d.get("content", "") for d in deltas)


def test_thought_opened_by_the_prompt(live):
    """A template that opens <think> itself: the output starts mid-thought and only closes it."""
    body = _chat(f"{THOUGHT}\n</think>\n\n{ANSWER}", chat_template_kwargs={"open_thought": True})
    msg = _post(live, "/v1/chat/completions", body).json()["choices"][0]["message"]
    assert (msg["reasoning_content"], msg["content"]) == (THOUGHT, ANSWER)


def test_tool_call_after_the_thought_on_the_server(live):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    body = _chat(f"<think>\n{THOUGHT}\n</think>\n\n{call}", tools=tools)
    choice = _post(live, "/v1/chat/completions", body).json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["reasoning_content"] == THOUGHT
    assert [c["function"] for c in choice["message"]["tool_calls"]] == \
        [{"name": "get_weather", "arguments": '{"city": "Oslo"}'}]
    with httpx.stream("POST", live.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=120) as s:
        chunks = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == THOUGHT
    assert "".join(c["function"].get("arguments", "") for d in deltas for c in d.get("tool_calls", [])) == \
        '{"city": "Oslo"}'
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_cut_off_while_thinking(live):
    r = _post(live, "/v1/chat/completions", _chat(max_tokens=20)).json()["choices"][0]
    assert r["finish_reason"] == "length" and r["message"]["content"] == ""
    assert THOUGHT.startswith(r["message"]["reasoning_content"]) and r["message"]["reasoning_content"]


def _reasoning_tokens_of(logprobs: dict, output: str, end: int) -> int:
    """The generated tokens that start before `end` (a character offset into `output`): the thought's,
    counted from the tokens' own bytes as logprobs give them."""
    starts, at = [], 0
    for t in logprobs["content"]:
        starts.append(at)
        at += len(t["bytes"])
    assert at == len(output.encode())          # the tokens spell the output
    return sum(1 for s in starts if s < len(output[:end].encode()))


def text_tokens(logprobs: list[dict], start: int) -> list[dict]:
    """The entries of the tokens whose bytes reach past byte `start` of the output they spell."""
    out, at = [], 0
    for e in logprobs:
        at += len(e["bytes"])
        if at > start and e["bytes"]:
            out.append(e)
    return out


def _usages(live, body) -> list[dict]:
    """usage of a chat completion whole and streamed, and of /v1/responses whole and streamed."""
    whole = _post(live, "/v1/chat/completions", body).json()["usage"]
    with httpx.stream("POST", live.url + "/v1/chat/completions", timeout=120,
                      json={**body, "stream": True, "stream_options": {"include_usage": True}}) as s:
        streamed = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")][-1]["usage"]
    resp = {"model": body["model"], "input": body["messages"], "max_output_tokens": body["max_tokens"],
            "temperature": 0, "regex": body["regex"], "store": False,
            **{k: v for k, v in body.items() if k == "chat_template_kwargs"}}
    r_whole = _post(live, "/v1/responses", resp).json()["usage"]
    with httpx.stream("POST", live.url + "/v1/responses", json={**resp, "stream": True}, timeout=120) as s:
        events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
    r_streamed = events[-1]["response"]["usage"]
    return [whole, streamed, r_whole, r_streamed]


def test_reasoning_tokens_are_the_thoughts(live):
    """usage's reasoning_tokens: the tokens of the thought, tags included, the same whichever way read."""
    body = _chat(logprobs=True)
    out = _post(live, "/v1/chat/completions", body).json()
    want = _reasoning_tokens_of(out["choices"][0]["logprobs"], OUTPUT, OUTPUT.index("</think>") + len("</think>"))
    assert 0 < want < out["usage"]["completion_tokens"]
    chat, streamed, r_whole, r_streamed = _usages(live, body)
    assert [u["completion_tokens_details"]["reasoning_tokens"] for u in (chat, streamed)] == [want, want]
    assert [u["output_tokens_details"]["reasoning_tokens"] for u in (r_whole, r_streamed)] == [want, want]
    assert chat["completion_tokens"] == r_whole["output_tokens"] == out["usage"]["completion_tokens"]
    # cut off while thinking: every token is the thought's
    cut = _usages(live, _chat(max_tokens=12))
    assert [u["completion_tokens_details"]["reasoning_tokens"] for u in cut[:2]] == [12, 12]
    assert [u["output_tokens_details"]["reasoning_tokens"] for u in cut[2:]] == [12, 12]
    # no thought: none (chat completions only: /v1/responses takes no chat_template_kwargs, and its
    # regex answer now waits for a thought the random model may start)
    off = _usages(live, _chat(ANSWER, chat_template_kwargs={"enable_thinking": False}))
    assert [u["completion_tokens_details"]["reasoning_tokens"] for u in off[:2]] == [0, 0]
    # a template that opens the thought: only the close is generated, and counted
    opened = f"{THOUGHT}\n</think>\n\n{ANSWER}"
    body = _chat(opened, chat_template_kwargs={"open_thought": True}, logprobs=True)
    out = _post(live, "/v1/chat/completions", body).json()
    want = _reasoning_tokens_of(out["choices"][0]["logprobs"], opened, opened.index("</think>") + len("</think>"))
    assert out["usage"]["completion_tokens_details"]["reasoning_tokens"] == want > 0


def test_completions_stay_raw(live):
    body = {"model": "tiny-think", "prompt": "user: hi\nassistant:", "max_tokens": 200, "temperature": 0,
            "regex": re.escape(OUTPUT)}
    assert _post(live, "/v1/completions", body).json()["choices"][0]["text"] == OUTPUT


def _prompt_tokens(live, **kw) -> int:
    prompt = _post(live, "/apply-template", {"messages": USER, **kw}).json()["prompt"]
    return len(_post(live, "/tokenize", {"content": prompt, "add_special": True}).json()["tokens"])


def test_responses_reasoning_item_and_effort(live):
    body = {"model": "tiny-think", "input": "hi", "max_output_tokens": 200, "temperature": 0,
            "regex": re.escape(OUTPUT), "reasoning": {"effort": "low"}, "store": False}
    r = _post(live, "/v1/responses", body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert [o["type"] for o in out["output"]] == ["reasoning", "message"]
    assert out["output"][0]["content"][0]["text"] == THOUGHT
    assert out["output"][1]["content"][0]["text"] == ANSWER
    assert out["reasoning"]["effort"] == "low"
    assert out["usage"]["input_tokens"] == _prompt_tokens(live, reasoning_effort="low")
    bad = _post(live, "/v1/responses", {**body, "reasoning": {"effort": "max"}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "reasoning.effort"


def test_responses_logprobs_leave_out_the_thought(live):
    """Only output_text carries logprobs: chat's for the tokens of the answer's text (not the thought,
    its tags or the blank lines after it), whole and streamed; the reasoning item and its events have none."""
    chat = _post(live, "/v1/chat/completions", _chat(logprobs=True, top_logprobs=2)).json()
    every = chat["choices"][0]["logprobs"]["content"]
    want = text_tokens(every, len(OUTPUT[:OUTPUT.index(ANSWER)].encode()))
    body = {"model": "tiny-think", "input": "hi", "max_output_tokens": 200, "temperature": 0, "store": False,
            "regex": re.escape(OUTPUT), "include": ["message.output_text.logprobs"], "top_logprobs": 2}
    reasoning, message = _post(live, "/v1/responses", body).json()["output"]
    assert (reasoning["content"][0]["text"], message["content"][0]["text"]) == (THOUGHT, ANSWER)
    assert "logprobs" not in reasoning["content"][0]
    got = message["content"][0]["logprobs"]
    assert 0 < len(got) < len(every) and [e["token"] for e in got] == [e["token"] for e in want]
    assert all(abs(g["logprob"] - w["logprob"]) < 1e-5 and len(g["top_logprobs"]) == 2 for g, w in zip(got, want))
    with httpx.stream("POST", live.url + "/v1/responses", json={**body, "stream": True}, timeout=120) as s:
        events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
    assert all("logprobs" not in e for e in events if e["type"].startswith("response.reasoning_text."))
    streamed = [lp["token"] for e in events if e["type"] == "response.output_text.delta" for lp in e["logprobs"]]
    assert streamed == [e["token"] for e in got]
    assert events[-1]["response"]["output"][1]["content"][0]["logprobs"] == got


def test_responses_logprobs_leave_out_a_tool_call_written_after_the_text(live):
    """A `<tool_call>` block after the answer's text is the call's, not output_text's: read whole, its
    tokens were in the message's logprobs; streamed, the list stopped short of the text's end."""
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    output = f"<think>\n{THOUGHT}\n</think>\n\n{ANSWER}\n{call}"
    body = {"model": "tiny-think", "input": "hi", "max_output_tokens": 200, "temperature": 0, "store": False,
            "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}],
            "regex": re.escape(output), "include": ["message.output_text.logprobs"]}
    whole = _post(live, "/v1/responses", body).json()["output"]
    assert [o["type"] for o in whole] == ["reasoning", "message", "function_call"]
    part = whole[1]["content"][0]
    assert part["text"] == ANSWER and "".join(e["token"] for e in part["logprobs"]).strip() == ANSWER
    with httpx.stream("POST", live.url + "/v1/responses", json={**body, "stream": True}, timeout=120) as s:
        events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    streamed = [lp["token"] for e in deltas for lp in e["logprobs"]]
    assert "".join(streamed) == "".join(e["delta"] for e in deltas) and "".join(streamed).strip() == ANSWER
    final = events[-1]["response"]["output"]
    assert [o["type"] for o in final] == ["reasoning", "message", "function_call"]
    assert [e["token"] for e in final[1]["content"][0]["logprobs"]] == streamed


def test_messages_thinking_blocks_and_disabled(live):
    body = {"model": "tiny-think", "max_tokens": 200, "messages": USER, "temperature": 0, "regex": re.escape(OUTPUT)}
    r = _post(live, "/v1/messages", body).json()
    assert [(b["type"], b.get("thinking") or b.get("text")) for b in r["content"]] == \
        [("thinking", THOUGHT), ("text", ANSWER)]
    off = _post(live, "/v1/messages", {**body, "regex": re.escape(ANSWER), "thinking": {"type": "disabled"}}).json()
    assert off["usage"]["input_tokens"] == _prompt_tokens(live, chat_template_kwargs={"enable_thinking": False})
    assert [b["type"] for b in off["content"]] == ["text"]
    on = _post(live, "/v1/messages/count_tokens", {**body, "thinking": {"type": "enabled", "budget_tokens": 1024}})
    assert on.status_code == 200 and on.json()["input_tokens"] == _prompt_tokens(live)
    bad = _post(live, "/v1/messages", {**body, "thinking": {"type": "sometimes"}})
    assert bad.status_code == 400 and bad.json()["error"]["message"]
    # a prefill that opens the thought: the output goes on thinking, then answers
    prefilled = {**body, "messages": USER + [{"role": "assistant", "content": "<think>\nThe user"}],
                 "regex": re.escape(THOUGHT[len("The user"):] + "\n</think>\n\n" + ANSWER)}
    r = _post(live, "/v1/messages", prefilled).json()
    assert [(b["type"], b.get("thinking") or b.get("text")) for b in r["content"]] == \
        [("thinking", THOUGHT[len("The user "):]), ("text", ANSWER)]


def test_ollama_think(live):
    body = {"model": "tiny-think", "messages": USER, "stream": False, "regex": re.escape(OUTPUT),
            "options": {"temperature": 0, "num_predict": 200}}
    r = _post(live, "/api/chat", body).json()
    assert r["message"] == {"role": "assistant", "content": ANSWER, "thinking": THOUGHT}
    with httpx.stream("POST", live.url + "/api/chat", json={**body, "stream": True}, timeout=120) as s:
        lines = [json.loads(line) for line in s.iter_lines() if line]
    assert "".join(line["message"].get("thinking", "") for line in lines) == THOUGHT
    assert "".join(line["message"]["content"] for line in lines) == ANSWER
    # think: false tells the template not to think (and no thinking is returned)
    off = _post(live, "/api/chat", {**body, "think": False, "regex": re.escape(ANSWER)}).json()
    assert off["message"] == {"role": "assistant", "content": ANSWER}
    assert off["prompt_eval_count"] == _prompt_tokens(live, chat_template_kwargs={"enable_thinking": False})
    high = _post(live, "/api/chat", {**body, "think": "high"}).json()
    assert high["prompt_eval_count"] == _prompt_tokens(live, reasoning_effort="high")
    assert "thinking" in httpx.post(live.url + "/api/show", json={"model": "tiny-think"}).json()["capabilities"]


def test_python_api_template_kwargs(live):
    m = live.model
    with pytest.raises(InvalidInputError, match="set by the renderer"):
        m.chat(USER, template_kwargs={"messages": []}, max_tokens=1)
    # the variables reach the template (it raises on `refuse`, before anything is generated)
    with pytest.raises(ChatTemplateError, match="refused: 7"):
        m.chat(USER, template_kwargs={"refuse": 7}, max_tokens=1)
    with pytest.raises(ChatTemplateError, match="refused: 8"):
        list(m.chat_stream(USER, template_kwargs={"refuse": 8}, max_tokens=1))


def test_cli_chat_template_kwargs(tmp_path):
    import subprocess
    import sys

    from test_export import tiny_llama_gguf
    gg = tiny_llama_gguf(tmp_path / "tiny.gguf", control_tokens=THINK_TOKENS, chat_template=TEMPLATE)

    def chat(*flags):
        return subprocess.run([sys.executable, "-m", "llambda.cli", "chat", "-m", str(gg), "--max-tokens", "2",
                               *flags], capture_output=True, text=True, input="hi\n", timeout=300)
    out = chat("--template-kwargs", '{"refuse": "yes"}')     # the template saw the variable
    assert "refused: yes" in out.stderr and "Traceback" not in out.stderr
    assert chat("--no-think").returncode == 0
    for bad, message in (("{x", "not valid JSON"), ('{"tools": []}', "set by the renderer")):
        out = chat("--template-kwargs", bad)
        assert out.returncode == 1 and message in out.stderr and "Traceback" not in out.stderr


def test_serve_template_kwargs_are_every_requests_default(tmp_path):
    """`llambda serve --no-think` (or --template-kwargs): the prompt renders with it unless a request
    sets the same variable; a bad default stops the server before it loads the model."""
    import subprocess
    import sys

    from serverkit import ServerProcess
    from test_export import tiny_llama_gguf
    gg = tiny_llama_gguf(tmp_path / "tiny.gguf", control_tokens=THINK_TOKENS, chat_template=TEMPLATE)
    closed = "user: hi\nassistant:<think>\n\n</think>\n\n"
    with ServerProcess(gg, tmp_path / "serve.log", "--no-think", "--template-kwargs", '{"reasoning_effort": "low"}',
                       "-c", "256") as srv:
        def prompt(**kw):
            r = httpx.post(srv.url + "/apply-template", json={"messages": USER, **kw}, timeout=60)
            assert r.status_code == 200, r.text
            return r.json()["prompt"]
        assert prompt() == "Reasoning: low\n" + closed
        assert prompt(chat_template_kwargs={"enable_thinking": True}) == "Reasoning: low\nuser: hi\nassistant:"
        assert prompt(reasoning_effort="high") == "Reasoning: high\n" + closed
        # Ollama's think: true turns thinking back on; the thought comes back apart
        body = {"model": srv.model_id, "messages": USER, "stream": False, "think": True,
                "regex": re.escape(OUTPUT), "options": {"temperature": 0, "num_predict": 200}}
        r = httpx.post(srv.url + "/api/chat", json=body, timeout=120).json()
        assert r["message"] == {"role": "assistant", "content": ANSWER, "thinking": THOUGHT}
        on = len(httpx.post(srv.url + "/tokenize", json={"content": prompt(chat_template_kwargs={
            "enable_thinking": True}), "add_special": True}, timeout=60).json()["tokens"])
        assert r["prompt_eval_count"] == on
    out = subprocess.run([sys.executable, "-m", "llambda.cli", "serve", "-m", str(gg), "--template-kwargs",
                          '{"messages": []}'], capture_output=True, text=True, timeout=300)
    assert out.returncode == 1 and "set by the renderer" in out.stderr and "Traceback" not in out.stderr


def test_server_config_checks_its_template_kwargs():
    from llambda.server import ServerConfig
    assert ServerConfig(template_kwargs={"enable_thinking": False}).template_kwargs == {"enable_thinking": False}
    with pytest.raises(InvalidInputError, match="template_kwargs: .*set by the renderer"):
        ServerConfig(template_kwargs={"tools": []})
