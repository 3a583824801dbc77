"""Harmony (gpt-oss) answers: channels into content / reasoning_content, function messages into tool calls.

The parser is checked whole and fed in random pieces (the two must agree), and the server end to end
on a tiny random model whose vocabulary is harmony's, made to write a harmony answer by a regex
constraint (its text is exactly what a gpt-oss model would write).
"""
import itertools
import json
import random
import re

import httpx
import pytest

from llambda.server.harmony import _MAX_HEADER, HarmonyParser, harmony_vocabulary
from llambda.tokenizer import Tokenizer
from whole_outputs import extract_harmony

HARMONY_TOKENS = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>", "<|constrain|>")
THINK_THEN_ANSWER = ("<|channel|>analysis<|message|>The user asks for the capital. It is Paris.<|end|>"
                     "<|start|>assistant<|channel|>final<|message|>The capital of France is Paris.")
CALL = ("<|channel|>analysis<|message|>Need the weather tool.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
        '{"city": "Paris", "unit": "C"}')
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "weather",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


def fed_in_pieces(text, names=None, parallel=True, seed=0):
    """(content, reasoning, merged call deltas) of `text` fed to a parser in random pieces."""
    rng = random.Random(seed)
    p = HarmonyParser(names, parallel)
    content, reasoning, deltas, i = [], [], [], 0
    while i < len(text):
        j = min(len(text), i + rng.randint(1, 9))
        c, d = p.feed(text[i:j])
        content.append(c), reasoning.append(p.take_reasoning()), deltas.extend(d)
        i = j
    c, d = p.finish()
    content.append(c), reasoning.append(p.take_reasoning()), deltas.extend(d)
    calls = {}
    for d in deltas:
        have = calls.setdefault(d["index"], {"name": None, "arguments": ""})
        if "name" in d["function"]:
            have["name"] = d["function"]["name"]
        have["arguments"] += d["function"].get("arguments", "")
    return "".join(content), "".join(reasoning), [calls[k] for k in sorted(calls)]


@pytest.mark.parametrize("seed", range(6))
def test_channels_whole_and_streamed_agree(seed):
    content, reasoning, calls = extract_harmony(THINK_THEN_ANSWER)
    assert (content, reasoning, calls) == ("The capital of France is Paris.",
                                           "The user asks for the capital. It is Paris.", [])
    assert fed_in_pieces(THINK_THEN_ANSWER, seed=seed) == (content, reasoning, [])
    # when <|return|> is text (not an end-of-generation token), it ends the answer too
    assert extract_harmony(THINK_THEN_ANSWER + "<|return|>")[:2] == (content, reasoning)


@pytest.mark.parametrize("seed", range(6))
def test_function_message_is_a_tool_call(seed):
    content, reasoning, calls = extract_harmony(CALL, {"get_weather"})
    assert content == "" and reasoning == "Need the weather tool."
    assert [c["function"] for c in calls] == [{"name": "get_weather", "arguments": '{"city": "Paris", "unit": "C"}'}]
    assert calls[0]["id"].startswith("call_") and calls[0]["type"] == "function"
    _, _, streamed = fed_in_pieces(CALL, {"get_weather"}, seed=seed)
    assert streamed == [{"name": "get_weather", "arguments": '{"city": "Paris", "unit": "C"}'}]


def test_recipient_before_the_channel_and_explicit_call_end():
    text = ('<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Oslo"}'
            "<|call|>")
    _, _, calls = extract_harmony(text, {"get_weather"})
    assert calls[0]["function"]["arguments"] == '{"city": "Oslo"}'


@pytest.mark.parametrize("text, names, want", [
    # a tool the request did not offer, or a built-in one: the message stays visible text
    (CALL, set(), ("{\"city\": \"Paris\", \"unit\": \"C\"}", "Need the weather tool.", 0)),
    ("<|channel|>commentary to=browser.search<|message|>{\"q\": 1}", {"get_weather"}, ('{"q": 1}', "", 0)),
    # cut off by max_tokens: the call as far as it got, as streamed
    (CALL[:-5], {"get_weather"}, ("", "Need the weather tool.", 1)),
    # no header at all (a template that opened the final channel itself)
    ("Just the answer.", set(), ("Just the answer.", "", 0)),
    # still thinking when cut off
    ("<|channel|>analysis<|message|>Hmm, let me", set(), ("", "Hmm, let me", 0)),
    # a preamble in the commentary channel is for the user
    ("<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>final<|message|>Done.",
     set(), ("Checking.Done.", "", 0)),
    # a header cut short is format, not text
    ("<|channel|>analysis<|message|>x<|end|><|start|>assistant<|chan", set(), ("", "x", 0)),
])
def test_edge_cases(text, names, want):
    content, reasoning, calls = extract_harmony(text, names)
    assert (content, reasoning, len(calls)) == want
    streamed = fed_in_pieces(text, names)
    assert streamed[:2] == want[:2]
    for cut in range(len(text) + 1):       # the content bodies spell the content, however the text came
        p = HarmonyParser(names)
        p.feed(text[:cut]), p.feed(text[cut:]), p.finish()
        assert "".join(text[a:b] for a, b in p.content_spans()) == want[0], cut
    assert [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in calls] == streamed[2]


def test_parallel_tool_calls_off_keeps_the_first():
    two = CALL + "<|call|><|start|>assistant<|channel|>commentary to=functions.get_weather<|message|>{\"city\": \"Rome\"}"
    assert len(extract_harmony(two, {"get_weather"})[2]) == 2
    _, _, one = extract_harmony(two, {"get_weather"}, parallel=False)
    assert [json.loads(c["function"]["arguments"])["city"] for c in one] == ["Paris"]


HEADER_CASES = [
    # <|message|> starting at the limit, just past it, far past it, never; an analysis channel in each
    "<|channel|>analysis " + "h" * (_MAX_HEADER - 20) + "<|message|>thought<|end|>answer",
    "<|channel|>analysis " + "h" * (_MAX_HEADER - 19) + "<|message|>thought<|end|>answer",
    "<|channel|>analysis " + "h" * (2 * _MAX_HEADER) + "<|message|>thought<|end|>answer",
    "<|channel|>analysis " + "h" * (2 * _MAX_HEADER),
    "a<|end|><|start|>assistant<|channel|>analysis" + " " * (_MAX_HEADER - 30) + "<|message|>b<|end|>c",
    "a<|end|><|start|>assistant<|channel|>analysis" + " " * _MAX_HEADER + "<|message|>b<|end|>c",
]


@pytest.mark.parametrize("text", HEADER_CASES, ids=["at-limit", "past-limit", "far-past", "never", "later-within",
                                                   "later-past"])
def test_header_limit_does_not_depend_on_the_pieces(text):
    """Whether an overlong header is one: the same whole, a character at a time and in random pieces."""
    def read(cuts):
        p = HarmonyParser()
        content, reasoning = [], []
        for i, j in zip([0, *cuts], [*cuts, len(text)]):
            content.append(p.feed(text[i:j])[0]), reasoning.append(p.take_reasoning())
        content.append(p.finish()[0]), reasoning.append(p.take_reasoning())
        return "".join(content), "".join(reasoning), p.reasoning_spans()
    want = read([])
    assert want[:2] == extract_harmony(text)[:2]
    assert read(list(range(1, len(text)))) == want                 # a character at a time
    rng = random.Random(len(text))
    for most in (3, 50, 300, 600):                                  # random pieces of up to `most`
        cuts, at = [], rng.randint(1, most)
        while at < len(text):
            cuts.append(at)
            at += rng.randint(1, most)
        assert read(cuts) == want, cuts
    for k in range(0, len(text) + 1, 7):                            # in two, cut anywhere
        assert read([k]) == want, k


def test_header_limit():
    at_limit, past = HEADER_CASES[0], HEADER_CASES[1]
    assert at_limit.index("<|message|>") == _MAX_HEADER
    assert extract_harmony(at_limit)[:2] == ("answer", "thought")
    # past the limit the "header" is the answer's text (in any pieces too: above)
    assert extract_harmony(past)[:2] == (past.replace("<|end|>", ""), "")


def test_blanks_between_messages_are_not_held():
    """A model writing blanks after a message's end: the parser keeps none of them (it re-read all it
    held at every token: time quadratic in the output)."""
    p = HarmonyParser()
    p.feed("<|channel|>final<|message|>a<|end|>")
    for _ in range(1000):
        p.feed(" \n")
        assert len(p.buf) == 0
    assert p.feed("<|start|>assistant<|channel|>final<|message|>b") == ("b", [])
    assert p.finish() == ("", [])


def test_hidethinking_hides_the_analysis_of_a_harmony_chat(tmp_path):
    """`llambda chat --hidethinking` with a harmony model: the analysis channel was printed with the answer."""
    import io

    import llambda
    from llambda.repl import ChatSession, run_chat
    from test_export import tiny_llama_gguf

    gg = tiny_llama_gguf(tmp_path / "tiny.gguf", control_tokens=HARMONY_TOKENS, chat_template=TEMPLATE)
    answer = "<|channel|>analysis<|message|>greeting<|end|><|start|>assistant<|channel|>final<|message|>Hello"
    sampling = {"regex": re.escape(answer), "max_tokens": 200, "temperature": 0}
    with pytest.warns(llambda.LlambdaWarning, match="context"):
        m = llambda.load(gg, n_slots=1, n_ctx=512)
    with m:
        shown = {}
        for hide in (True, False):
            out = io.StringIO()
            s = ChatSession(m, sampling, hide_thinking=hide)
            assert run_chat(s, "banner", None, stdin=io.StringIO("hi\n"), stdout=out) == 0
            shown[hide] = out.getvalue()
            assert s.messages[-1]["content"] == answer          # the conversation keeps it as generated
    assert shown[True] == "Hello\n"
    assert shown[False] == answer + "\n"                        # without the flag: as generated, as before


def _harmony_vocab_meta(tokens):
    from llambda.tokenizer.pieces import BYTE_CHARS
    toks = list(BYTE_CHARS) + list(tokens)
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-4o", "tokenizer.ggml.tokens": toks,
            "tokenizer.ggml.token_type": [1] * 256 + [3] * len(tokens), "tokenizer.ggml.merges": []}


def test_end_stops_generation_only_outside_harmony():
    """<|return|> and <|call|> end a harmony answer; its <|end|> only closes the analysis message."""
    tk = Tokenizer.from_gguf_metadata(_harmony_vocab_meta(HARMONY_TOKENS))
    ids = {t: tk.encode(t)[0] for t in HARMONY_TOKENS}
    assert {ids["<|return|>"], ids["<|call|>"]} <= tk.eot_ids and ids["<|end|>"] not in tk.eot_ids
    assert harmony_vocabulary(tk)
    plain = Tokenizer.from_gguf_metadata(_harmony_vocab_meta(("<|end|>",)))
    assert plain.encode("<|end|>")[0] in plain.eot_ids and not harmony_vocabulary(plain)


# -- the server ------------------------------------------------------------------------------

TEMPLATE = ("{% for m in messages %}<|start|>{{ m['role'] }}<|message|>{{ m['content'] }}<|end|>{% endfor %}"
            "{% if tools %}<|start|>developer<|message|>{{ tools | length }} tools<|end|>{% endif %}"
            "<|start|>assistant")


@pytest.fixture(scope="module")
def harmony_live(tmp_path_factory):
    from serverkit import tiny_chat_server
    with tiny_chat_server(tmp_path_factory.mktemp("harmony"), "tiny-harmony", HARMONY_TOKENS, TEMPLATE) as srv:
        yield srv


def _body(answer: str, **kw) -> dict:
    # the regex makes the random model write exactly `answer`
    return {"model": "tiny-harmony", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 400,
            "temperature": 0, "extra_body": {"regex": re.escape(answer)}, **kw}


def test_server_splits_channels(harmony_live):
    body = _body(THINK_THEN_ANSWER)
    body.update(body.pop("extra_body"))
    r = httpx.post(harmony_live.url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    msg = r.json()["choices"][0]["message"]
    assert msg["content"] == "The capital of France is Paris."
    assert msg["reasoning_content"] == "The user asks for the capital. It is Paris."


def test_server_streams_reasoning_then_content(harmony_live):
    stream = harmony_live.client().chat.completions.create(**_body(THINK_THEN_ANSWER, stream=True))
    content, reasoning = "", ""
    for chunk in stream:
        for ch in chunk.choices:
            content += ch.delta.content or ""
            reasoning += (ch.delta.model_extra or {}).get("reasoning_content") or ""
            assert "<|" not in (ch.delta.content or "")
    assert content == "The capital of France is Paris."
    assert reasoning == "The user asks for the capital. It is Paris."


def test_server_harmony_tool_call(harmony_live):
    client = harmony_live.client()
    r = client.chat.completions.create(**_body(CALL, tools=TOOLS))
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls" and ch.message.content is None
    assert ch.message.tool_calls[0].function.name == "get_weather"
    assert json.loads(ch.message.tool_calls[0].function.arguments) == {"city": "Paris", "unit": "C"}
    names, args, finish = set(), "", None
    for chunk in client.chat.completions.create(**_body(CALL, tools=TOOLS, stream=True)):
        for c in chunk.choices:
            for tc in c.delta.tool_calls or []:
                names.add(tc.function.name) if tc.function.name else None
                args += tc.function.arguments or ""
            finish = c.finish_reason or finish
    assert names == {"get_weather"} and json.loads(args) == {"city": "Paris", "unit": "C"} and finish == "tool_calls"


@pytest.mark.parametrize("answer, tools", [(THINK_THEN_ANSWER, None), (CALL, TOOLS)])
def test_reasoning_tokens_are_the_analysis_messages(harmony_live, answer, tools):
    """usage's reasoning_tokens: the analysis message's tokens (header and <|end|> included), the same
    streamed or whole, on chat completions and /v1/responses."""
    body = _body(answer, logprobs=True, **({"tools": tools} if tools else {}))
    body.update(body.pop("extra_body"))
    out = httpx.post(harmony_live.url + "/v1/chat/completions", json=body, timeout=120).json()
    starts, at = [], 0
    for t in out["choices"][0]["logprobs"]["content"]:
        starts.append(at)
        at += len(t["bytes"])
    assert at == len(answer.encode())
    end = len(answer[:answer.index("<|end|>") + len("<|end|>")].encode())
    want = sum(1 for s in starts if s < end)
    assert 0 < want < out["usage"]["completion_tokens"]
    assert out["usage"]["completion_tokens_details"]["reasoning_tokens"] == want
    with httpx.stream("POST", harmony_live.url + "/v1/chat/completions", timeout=120,
                      json={**body, "stream": True, "stream_options": {"include_usage": True}}) as s:
        usage = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")][-1]["usage"]
    assert usage["completion_tokens_details"]["reasoning_tokens"] == want
    client = harmony_live.client()
    rtools = [{"type": "function", **t["function"]} for t in tools] if tools else []
    r = client.responses.create(**_responses_body(answer, tools=rtools))
    assert r.usage.output_tokens_details.reasoning_tokens == want
    events = list(client.responses.create(**_responses_body(answer, tools=rtools, stream=True)))
    assert events[-1].response.usage.output_tokens_details.reasoning_tokens == want


def test_random_conversations_route_every_body(seed=11):
    """Random runs of analysis / final / commentary / function messages, fed whole and in random
    pieces: each body lands in its own place, nothing is lost or duplicated."""
    rng = random.Random(seed)
    alphabet = "ab <|>{}\"':,.\n\tçé🙂"
    for case in range(200):
        want_content, want_reasoning, want_calls, parts, spans = "", "", [], [], []
        for k in range(rng.randint(1, 5)):
            body = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 20))).replace("<|", "<")
            kind = rng.choice(["analysis", "final", "commentary", "call"])
            head = "<|start|>assistant" if k else ""
            if kind == "call":
                body = json.dumps({"x": body})
                parts.append(f"{head}<|channel|>commentary to=functions.f <|constrain|>json<|message|>{body}<|call|>")
                want_calls.append(body)
            else:
                at = sum(map(len, parts))
                parts.append(f"{head}<|channel|>{kind}<|message|>{body}<|end|>")
                if kind == "analysis":
                    want_reasoning += body
                    spans.append((at, at + len(parts[-1])))
                else:
                    want_content += body
        text = "".join(parts)
        content, reasoning, calls = extract_harmony(text, {"f"})
        assert (content, reasoning, [c["function"]["arguments"] for c in calls]) == \
            (want_content, want_reasoning, want_calls), text
        streamed = fed_in_pieces(text, {"f"}, seed=case)
        assert streamed == (want_content, want_reasoning, [{"name": "f", "arguments": a} for a in want_calls]), text
        # where the analysis messages lie (usage's reasoning_tokens), whole or cut anywhere
        cut = rng.randint(0, len(text))
        p = HarmonyParser({"f"})
        p.feed(text[:cut]), p.feed(text[cut:]), p.finish()
        assert p.reasoning_spans() == spans, text
        # and the content bodies (the /v1/responses text's logprobs): they spell the content
        assert "".join(text[a:b] for a, b in p.content_spans()) == want_content, text


# -- the reasoning through /v1/responses and /v1/messages -------------------------------------

REASONING, ANSWER = "The user asks for the capital. It is Paris.", "The capital of France is Paris."


def _responses_body(answer: str, **kw) -> dict:
    return {"model": "tiny-harmony", "input": "hi", "max_output_tokens": 400, "temperature": 0,
            "extra_body": {"regex": re.escape(answer)}, **kw}


def test_responses_api_returns_the_analysis_as_a_reasoning_item(harmony_live):
    client = harmony_live.client()
    r = client.responses.create(**_responses_body(THINK_THEN_ANSWER))
    assert [o.type for o in r.output] == ["reasoning", "message"]
    assert [c.text for c in r.output[0].content] == [REASONING] and r.output[0].summary == []
    assert r.output_text == ANSWER and r.status == "completed"
    events = list(client.responses.create(**_responses_body(THINK_THEN_ANSWER, stream=True)))
    kinds = [e.type for e in events]
    reasoning = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert reasoning == REASONING and text == ANSWER
    # the reasoning item opens, streams, closes, then the message does: typed by the client as OpenAI's events
    assert kinds.index("response.reasoning_text.done") < kinds.index("response.output_text.delta")
    done = next(e for e in events if e.type == "response.reasoning_text.done")
    assert done.text == REASONING and done.output_index == 0
    items = [e.item for e in events if e.type == "response.output_item.done"]
    assert [i.type for i in items] == ["reasoning", "message"] and items[0].content[0].text == REASONING
    final = events[-1].response
    assert final.status == "completed" and [o.type for o in final.output] == ["reasoning", "message"]


def test_responses_logprobs_are_the_final_messages_body(harmony_live):
    """include logprobs: the message's are chat's for the final message's body only (no analysis, no
    header), whole and streamed."""
    client = harmony_live.client()
    kw = _responses_body(THINK_THEN_ANSWER, include=["message.output_text.logprobs"], top_logprobs=1)
    r = client.responses.create(**kw)
    got = [e.model_dump() for e in r.output[1].content[0].logprobs]
    assert "".join(e["token"] for e in got) == ANSWER and r.output[0].content[0].model_dump().get("logprobs") is None
    chat = client.chat.completions.create(model="tiny-harmony", messages=[{"role": "user", "content": "hi"}],
                                          max_tokens=400, temperature=0, logprobs=True, top_logprobs=1,
                                          extra_body={"regex": re.escape(THINK_THEN_ANSWER)})
    every = [e.model_dump() for e in chat.choices[0].logprobs.content]
    # the tokens ending past the start of the final message's body (its text is the output's end)
    ends = list(itertools.accumulate(len(e["bytes"]) for e in every))
    start = len(THINK_THEN_ANSWER[:THINK_THEN_ANSWER.rindex(ANSWER)].encode())
    want = [e for e, end in zip(every, ends) if end > start and e["bytes"]]
    assert [e["token"] for e in want] == [e["token"] for e in got]
    assert all(abs(g["logprob"] - w["logprob"]) < 1e-5 and len(g["top_logprobs"]) == 1 for g, w in zip(got, want))
    events = list(client.responses.create(stream=True, **kw))
    assert [lp.token for e in events if e.type == "response.output_text.delta" for lp in e.logprobs] == \
        [e["token"] for e in got]


def test_responses_api_reasoning_before_a_tool_call(harmony_live):
    r = harmony_live.client().responses.create(**_responses_body(CALL, tools=[
        {"type": "function", **TOOLS[0]["function"]}]))
    assert [o.type for o in r.output] == ["reasoning", "function_call"]
    assert r.output[0].content[0].text == "Need the weather tool."
    assert json.loads(r.output[1].arguments) == {"city": "Paris", "unit": "C"}


def _anthropic(srv):
    import anthropic
    return anthropic.Anthropic(base_url=srv.url, api_key="none", max_retries=0, timeout=120)


def test_messages_api_returns_the_analysis_as_thinking_blocks(harmony_live):
    client = _anthropic(harmony_live)
    body = {"model": "tiny-harmony", "max_tokens": 400, "messages": [{"role": "user", "content": "hi"}],
            "extra_body": {"temperature": 0, "regex": re.escape(THINK_THEN_ANSWER)}}
    m = client.messages.create(**body)
    assert [b.type for b in m.content] == ["thinking", "text"]
    assert m.content[0].thinking == REASONING and m.content[1].text == ANSWER and m.stop_reason == "end_turn"
    with client.messages.stream(**body) as stream:
        events = list(stream)
        final = stream.get_final_message()
    thinking = "".join(e.delta.thinking for e in events
                       if e.type == "content_block_delta" and e.delta.type == "thinking_delta")
    assert thinking == REASONING
    starts = [e.content_block.type for e in events if e.type == "content_block_start"]
    assert starts == ["thinking", "text"]
    assert [b.type for b in final.content] == ["thinking", "text"] and final.content[0].thinking == REASONING
    assert final.content[1].text == ANSWER


def test_ollama_api_returns_the_analysis_as_thinking(harmony_live):
    """/api/chat and /api/generate: the analysis channel as `thinking`, left out with think: false;
    llama-server's `regex` passes on as on the other APIs (it makes the random model write the answer)."""
    import ollama
    client = ollama.Client(host=harmony_live.url, timeout=120)
    body = {"model": "tiny-harmony", "messages": [{"role": "user", "content": "hi"}], "stream": False,
            "regex": re.escape(THINK_THEN_ANSWER), "options": {"temperature": 0, "num_predict": 400}}
    r = httpx.post(harmony_live.url + "/api/chat", json=body, timeout=120).json()
    assert r["message"] == {"role": "assistant", "content": ANSWER, "thinking": REASONING} and r["done"]
    with httpx.stream("POST", harmony_live.url + "/api/chat", json={**body, "stream": True}, timeout=120) as s:
        lines = [json.loads(line) for line in s.iter_lines() if line]
    assert "".join(line["message"].get("thinking", "") for line in lines) == REASONING
    assert "".join(line["message"]["content"] for line in lines) == ANSWER
    hidden = httpx.post(harmony_live.url + "/api/chat", json={**body, "think": False}, timeout=120).json()
    assert hidden["message"] == {"role": "assistant", "content": ANSWER}
    gen = httpx.post(harmony_live.url + "/api/generate", json={**body, "prompt": "hi", "think": "high"},
                     timeout=120).json()
    assert gen["response"] == ANSWER and gen["thinking"] == REASONING
    assert "thinking" in client.show("tiny-harmony").capabilities
    assert client.chat(messages=body["messages"], think=True, model="tiny-harmony", stream=False,
                       options={"num_predict": 4}).done      # the client's own way of asking for it


def test_a_call_cut_short_is_the_same_streamed_or_not(harmony_live):
    """A harmony call whose arguments stop early (as max_tokens cuts them) is the call so far, both ways:
    chat's arguments as written, Anthropic's input the object they hold so far."""
    cut = CALL[:-len(' "unit": "C"}')]          # '{"city": "Paris",'
    body = _body(cut, tools=TOOLS)
    body.update(body.pop("extra_body"))
    whole = httpx.post(harmony_live.url + "/v1/chat/completions", json=body, timeout=120).json()["choices"][0]
    calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
             for c in whole["message"]["tool_calls"]]
    assert calls == [{"name": "get_weather", "arguments": '{"city": "Paris",'}]
    streamed, finish = {}, None
    for chunk in harmony_live.client().chat.completions.create(stream=True, **_body(cut, tools=TOOLS)):
        for d in chunk.choices[0].delta.tool_calls or []:
            have = streamed.setdefault(d.index, {"name": d.function.name, "arguments": ""})
            have["arguments"] += d.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert list(streamed.values()) == calls and finish == whole["finish_reason"]

    client = _anthropic(harmony_live)
    anthropic_body = {"model": "tiny-harmony", "max_tokens": 400, "messages": [{"role": "user", "content": "hi"}],
                      "tools": [{"name": "get_weather", "input_schema": TOOLS[0]["function"]["parameters"]}],
                      "extra_body": {"temperature": 0, "regex": re.escape(cut)}}
    m = client.messages.create(**anthropic_body)
    with client.messages.stream(**anthropic_body) as stream:
        final = stream.get_final_message()
    assert [b.model_dump(exclude={"id"}) for b in m.content] == [b.model_dump(exclude={"id"}) for b in final.content]
    assert m.content[-1].type == "tool_use" and m.content[-1].input == {"city": "Paris"}
    assert m.stop_reason == final.stop_reason


# -- an earlier turn's analysis given back (the harmony guide: until a final answer) -------------

# Written for these tests after what gpt-oss's own template does with an assistant turn's `thinking`:
# a turn that called a tool shows it as an analysis message unless a later assistant turn answered
# (a final); a final turn never shows it.
GPT_OSS_LIKE = (
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' and m.tool_calls -%}"
    "{%- set later = namespace(final=false) -%}"
    "{%- for n in messages[loop.index:] -%}"
    "{%- if n.role == 'assistant' and not n.tool_calls -%}{%- set later.final = true -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if m.content and m.thinking -%}{{ raise_exception('content and thinking both') }}{%- endif -%}"
    "{%- set analysis = m.content or m.thinking -%}"
    "{%- if analysis and not later.final -%}<|start|>assistant<|channel|>analysis<|message|>{{ analysis }}<|end|>"
    "{%- endif -%}"
    "{%- for c in m.tool_calls -%}<|start|>assistant to=functions.{{ c.function.name }}<|channel|>commentary json"
    "<|message|>{{ c.function.arguments }}<|call|>{%- endfor -%}"
    "{%- elif m.role == 'assistant' -%}<|start|>assistant<|channel|>final<|message|>{{ m.content }}<|end|>"
    "{%- else -%}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if tools %}<|start|>developer<|message|>{{ tools | length }} tools<|end|>{% endif %}<|start|>assistant")
ANALYSIS = "<|channel|>analysis<|message|>"


@pytest.fixture(scope="module")
def gpt_oss_like(tmp_path_factory):
    """A tiny harmony model whose template gives a tool-calling turn's analysis back; `.model` is it."""
    from serverkit import tiny_chat_server
    with tiny_chat_server(tmp_path_factory.mktemp("gpt_oss_like"), "tiny-harmony", HARMONY_TOKENS,
                          GPT_OSS_LIKE) as srv:
        yield srv


def _called(reasoning_field: str = "reasoning_content") -> list:
    """A user question, an assistant turn that called get_weather after thinking, and the tool's result."""
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    return [{"role": "user", "content": "weather in Oslo?"},
            {"role": "assistant", "content": None, "tool_calls": [call], reasoning_field: "Need the weather tool."},
            {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}]


def _template(srv, messages, **kw):
    return httpx.post(srv.url + "/apply-template", json={"messages": messages, "tools": TOOLS, **kw}, timeout=60)


def test_chat_gives_a_tool_calling_turns_analysis_back_until_a_final_answer(gpt_oss_like):
    for field in ("reasoning_content", "reasoning"):
        prompt = _template(gpt_oss_like, _called(field)).json()["prompt"]
        assert ANALYSIS + "Need the weather tool.<|end|><|start|>assistant to=functions.get_weather" in prompt
    # what generation tokenizes is that prompt too
    body = _body("Sunny.", messages=_called(), tools=TOOLS, max_tokens=16)
    body.update(body.pop("extra_body"))
    r = httpx.post(gpt_oss_like.url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    r = r.json()
    prompt = _template(gpt_oss_like, _called()).json()["prompt"]
    assert r["usage"]["prompt_tokens"] == len(gpt_oss_like.model._prompt_ids(prompt))

    # after a final answer the analysis of that conversation is dropped (the final's own included)
    answered = _called() + [{"role": "assistant", "content": "18 C in Oslo.", "reasoning_content": "Say it."},
                            {"role": "user", "content": "thanks"}]
    prompt = _template(gpt_oss_like, answered).json()["prompt"]
    assert ANALYSIS not in prompt and "18 C in Oslo." in prompt

    # a turn with content and calls keeps its content as the analysis (the template takes one of them)
    both = _called()
    both[1] = {**both[1], "content": "Checking."}
    assert ANALYSIS + "Checking.<|end|>" in _template(gpt_oss_like, both).json()["prompt"]
    # reasoning that is not text is the client's mistake, named
    bad = _called()
    bad[1]["reasoning_content"] = ["x"]
    r = _template(gpt_oss_like, bad)
    assert r.status_code == 400 and "messages[1].reasoning_content" in r.json()["error"]["message"]


def test_responses_give_reasoning_items_back_to_the_turn_they_precede(gpt_oss_like):
    client = gpt_oss_like.client()
    tools = [{"type": "function", **TOOLS[0]["function"]}]
    items = [{"role": "user", "content": "weather in Oslo?"},
             {"type": "reasoning", "id": "rs_1", "summary": [],
              "content": [{"type": "reasoning_text", "text": "Need the weather tool."}]},
             {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
             {"type": "function_call_output", "call_id": "call_1", "output": "18 C"}]
    want = len(gpt_oss_like.model._prompt_ids(_template(gpt_oss_like, _called()).json()["prompt"]))
    assert client.responses.input_tokens.count(model="tiny-harmony", input=items, tools=tools).input_tokens == want
    without = [i for i in items if i.get("type") != "reasoning"]
    assert client.responses.input_tokens.count(model="tiny-harmony", input=without, tools=tools).input_tokens < want

    # a stored answer's reasoning item comes back with its call through previous_response_id
    first = client.responses.create(**_responses_body(CALL, tools=tools))
    assert [o.type for o in first.output] == ["reasoning", "function_call"]
    [call] = [o for o in first.output if o.type == "function_call"]
    answer = {"type": "function_call_output", "call_id": call.call_id, "output": "18 C"}
    counted = client.responses.input_tokens.count(model="tiny-harmony", input=[answer], tools=tools,
                                                  previous_response_id=first.id).input_tokens
    messages = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": "", "reasoning_content": "Need the weather tool.",
                 "tool_calls": [{"id": call.call_id, "type": "function",
                                 "function": {"name": "get_weather", "arguments": call.arguments}}]},
                {"role": "tool", "tool_call_id": call.call_id, "content": "18 C"}]
    prompt = _template(gpt_oss_like, messages).json()["prompt"]
    assert ANALYSIS + "Need the weather tool.<|end|>" in prompt
    assert counted == len(gpt_oss_like.model._prompt_ids(prompt))


def test_messages_give_thinking_blocks_back_to_their_turn(gpt_oss_like):
    """Anthropic's tool loop passes an assistant turn's thinking back with its tool_use: the same prompt."""
    tools = [{"name": "get_weather", "description": "weather", "input_schema": TOOLS[0]["function"]["parameters"]}]
    messages = [{"role": "user", "content": "weather in Oslo?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "Need the weather tool.", "signature": ""},
                    {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Oslo"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "18 C"}]}]
    counted = _anthropic(gpt_oss_like).messages.count_tokens(model="tiny-harmony", messages=messages, tools=tools)
    want = len(gpt_oss_like.model._prompt_ids(_template(gpt_oss_like, _called()).json()["prompt"]))
    assert counted.input_tokens == want
