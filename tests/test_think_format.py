"""A reasoning model thinks, then answers in the requested format: a JSON schema, json_object, a regex
or a grammar constrains the answer after `</think>` (and the blanks the template writes after it),
the thought is free text (llambda/thinking.py's `holds_grammar`, engine.Sequence's sampling).

Checked on the thought's own state with test_thinking_budget's toy tokenizer, then end to end on
test_think's tiny random model with a Qwen3-like template. The random model closes a thought only
when told to: a small bias for the `</think>` control token makes it close one after a few tokens of
its own, a thinking budget closes it by force, and a template that opens `<think>` in the prompt
(`open_thought`) starts the output inside it.
"""
import json
import re
import warnings

import httpx
import jsonschema
import numpy as np
import pytest

from llambda.thinking import CLOSE, DONE, START, THOUGHT, ThinkingBudget, grammar_spells_thought, \
    prompt_closes_thought
from test_think import TEMPLATE, THINK_TOKENS, USER
from test_thinking_budget import ToyTokenizer

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                          "b": {"type": "boolean"}},
          "required": ["a", "b"], "additionalProperties": False}
FORMAT = {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}
OPENED = {"open_thought": True}
CLOSE_ID = "262"               # the tiny model's `</think>` control token (test_think's THINK_TOKENS)
OPEN_ID = "261"


# -- the thought's state -------------------------------------------------------------------------

def test_the_grammar_waits_for_the_thought_and_the_blanks_after_it():
    tok = ToyTokenizer()
    b = ThinkingBudget.build(tok, None, opened=False, after="\n\n", holds_grammar=True)
    t = b.start()
    assert t.holding and t.state == START
    # `<think>` in pieces opens the thought; a blank or any other text is the answer's
    assert t.opens("<th") and not t.opens("\n") and not t.opens("{")
    t.record("<th")
    assert t.opens("ink>") and not t.opens("ought")
    t.record("ink>\nhmm")
    assert t.state == THOUGHT and t.holding and t.forced() is None
    # a token that closes the thought and goes on into the answer is not the thought's
    assert t.crosses("</think>\n\n{") and not t.crosses("</think>\n") and not t.crosses("x")
    t.record("</think>\n")
    # the model closed it with one of the template's two newlines: the other is forced, then the grammar
    assert t.state == DONE and t.holding and t.forced() == ord("\n")
    t.record("\n", forced=True)
    assert not t.holding and t.forced() is None
    # no budget: nothing is forced in a long thought
    t = ThinkingBudget.build(tok, None, opened=True, holds_grammar=True).start()
    for _ in range(50):
        t.record("x")
    assert t.forced() is None and t.holding


def test_a_started_tag_is_completed_and_a_budget_closes_the_thought():
    tok = ToyTokenizer()
    t = ThinkingBudget.build(tok, 6, opened=False, holds_grammar=True).start()
    t.record("<thi")
    t.finish_tag()
    forced = []
    while t.forced() is not None:
        forced.append(t.forced())
        t.record(chr(forced[-1]), forced=True)
    assert "".join(map(chr, forced)) == "nk>" and t.state == THOUGHT
    # the budget's closing is free text (no grammar asked), and the grammar starts after it
    t.record("a"), t.record("b")
    assert t.forced() == 10 and t.holding
    while t.forced() is not None:
        token = t.forced()
        t.record(CLOSE if token == 1000 else chr(token), forced=True)
    assert not t.holding
    # the answer without a thought: the grammar's from the first token
    t = ThinkingBudget.build(tok, None, opened=False, holds_grammar=True).start()
    t.answer()
    assert not t.holding


def test_which_grammars_wait_and_which_prompts_closed_the_thought():
    assert not grammar_spells_thought("json_schema", json.dumps({"const": "</think>"}))
    assert not grammar_spells_thought("regex", r"\d+")
    assert grammar_spells_thought("regex", "<think>[a-z]+</think>\n\n[a-z]+")
    assert prompt_closes_thought("assistant:<think>\n\n</think>\n\n")
    assert not prompt_closes_thought("assistant:") and not prompt_closes_thought("assistant:<think>\n")
    assert prompt_closes_thought("assistant:", prefill="Sure") and not prompt_closes_thought("a:", "<think>x")


# -- the sampler under a waiting grammar (engine.Sequence) ----------------------------------------

class PieceTokenizer:
    """Tokens are the given strings (the last one EOS); encode takes the longest piece first (a
    character no piece starts: token 0 for it)."""

    def __init__(self, pieces):
        self.pieces, self.vocab_size, self.eot_ids = pieces, len(pieces), [len(pieces) - 1]

    def token_bytes(self, i):
        return self.pieces[i].encode()

    def stream(self):
        pieces = self.pieces

        class Stream:
            def feed(self, i):
                return pieces[i]

            def flush(self):
                return ""
        return Stream()

    def encode(self, text, add_bos=False, parse_special=True):
        out = []
        while text:
            i = max((i for i, p in enumerate(self.pieces[:-1]) if text.startswith(p)),
                    key=lambda i: len(self.pieces[i]), default=None)
            out.append(0 if i is None else i)
            text = text[1 if i is None else len(self.pieces[i]):]
        return out


class TakesAll:
    """A grammar that takes any token; it records what it was given."""

    def __init__(self, n):
        self.n, self.seen, self.done, self.accepting = n, [], False, True

    def start(self):
        return self

    def try_advance(self, t):
        self.seen.append(t)
        return True

    def advance(self, t):
        self.seen.append(t)

    def allows(self, ids):
        return True

    def banned(self):
        return np.zeros(self.n, np.bool_)

    def take_cpu_seconds(self):
        return 0.0


def _sequence(pieces, opened=True):
    from llambda.engine import GenerationParams, Sequence
    from llambda.sampling import SamplingParams
    tok = PieceTokenizer(pieces)
    grammar = TakesAll(len(pieces))
    thinking = ThinkingBudget.build(tok, None, opened=opened, after="\n\n", holds_grammar=True)
    params = GenerationParams(max_tokens=30, sampling=SamplingParams(temperature=0), grammar=grammar,
                              thinking=thinking)
    return Sequence(tok, [0], params, slot=0, n_ctx=100), grammar


def test_the_thought_neither_ends_the_output_nor_runs_into_the_answer():
    pieces = ["a", "</think>{", "</think>", "\n", "{", "<eos>"]
    seq, grammar = _sequence(pieces)
    # EOS first, then the token that closes and answers at once, then the close alone: the close is drawn
    logits = np.array([0.0, 8.0, 7.0, 1.0, 2.0, 9.0], np.float32)
    tokens = [seq.step(logits).token for _ in range(3)]
    assert [pieces[t] for t in tokens] == ["</think>", "\n", "\n"]      # the template's blanks forced
    assert grammar.seen == []                                                # the grammar waited
    logits[5] = -9.0
    assert seq.step(logits).token == 1 and grammar.seen == [1]              # then it governs


def test_a_thought_that_only_runs_into_the_answer_is_closed():
    crossing = [f"</think>{k}" for k in range(20)]
    pieces = ["a", "\n", "</think>", *crossing, "<eos>"]
    seq, grammar = _sequence(pieces)
    logits = np.zeros(len(pieces), np.float32)
    logits[3:23] = np.arange(40.0, 20.0, -1.0)          # every crossing token above the rest
    tokens = [seq.step(logits).token for _ in range(4)]
    assert "".join(pieces[t] for t in tokens) == "\n</think>\n\n" and grammar.seen == []


def test_a_thoughts_draws_share_one_mask():
    """Under a truncated distribution a thought's draws are made under the ban of the output's ends, one
    array the sequence keeps for all its tokens; a token's refused draws are lifted before the next."""
    from llambda.engine import GenerationParams, Sequence
    from llambda.sampling import SamplingParams
    pieces = ["a", "b", "</think>{", "<eos>"]
    tok = PieceTokenizer(pieces)
    thinking = ThinkingBudget.build(tok, None, opened=True, after="\n\n", holds_grammar=True)
    params = GenerationParams(max_tokens=30, sampling=SamplingParams(temperature=1.0, top_k=2, seed=3),
                              grammar=TakesAll(len(pieces)), thinking=thinking)
    seq = Sequence(tok, [0], params, slot=0, n_ctx=100)
    draws, sample = [], seq.sampler.sample

    def spy(logits, history, banned=None):
        draws.append((banned, banned.copy()))
        return sample(logits, history, banned)
    seq.sampler.sample = spy
    logits = np.array([1.0, 1.0, 3.0, 2.0], np.float32)    # the token that runs into the answer most likely
    firsts = []
    for _ in range(8):
        firsts.append(len(draws))
        assert pieces[seq.step(logits).token] in ("a", "b")
    assert len(draws) > len(firsts)                          # some draws were refused and drawn again
    assert all(banned is draws[0][0] for banned, _ in draws)
    assert all(draws[k][1].tolist() == [False, False, False, True] for k in firsts)


# -- on the server -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def live(tmp_path_factory):
    from serverkit import tiny_chat_server
    with tiny_chat_server(tmp_path_factory.mktemp("think-format"), "tiny-think", THINK_TOKENS, TEMPLATE) as srv:
        yield srv


def _post(live, path, body):
    r = httpx.post(live.url + path, json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def _chat(**kw) -> dict:
    return {"model": "tiny-think", "messages": USER, "max_tokens": 80, "temperature": 0,
            "response_format": FORMAT, **kw}


def _streamed(live, body) -> list[tuple[str, str, str]]:
    """(reasoning, content, finish_reason) of each choice, streamed."""
    with httpx.stream("POST", live.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=300) as s:
        chunks = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
    out = {}
    for c in chunks:
        for ch in c["choices"]:
            r, t, f = out.get(ch["index"], ("", "", None))
            d = ch["delta"]
            out[ch["index"]] = (r + d.get("reasoning_content", ""), t + (d.get("content") or ""),
                                ch.get("finish_reason") or f)
    return [out[i] for i in sorted(out)]


def _whole(choice) -> tuple[str, str, str]:
    return choice["message"].get("reasoning_content", ""), choice["message"]["content"], choice["finish_reason"]


def _valid(content: str) -> dict:
    obj = json.loads(content)
    jsonschema.validate(obj, SCHEMA)
    return obj


def test_the_model_thinks_then_answers_in_the_schema(live):
    """The model closes its own thought (a small bias for `</think>`), the schema's JSON follows;
    streamed is the same, and the usage counts the thought."""
    body = _chat(chat_template_kwargs=OPENED, logit_bias={CLOSE_ID: 1.0}, logprobs=True)
    out = _post(live, "/v1/chat/completions", body)
    choice = out["choices"][0]
    reasoning, content, finish = _whole(choice)
    assert reasoning and finish == "stop"
    _valid(content)
    tokens = "".join(bytes(t["bytes"]).decode("utf-8", "replace") for t in choice["logprobs"]["content"])
    assert tokens.endswith(CLOSE + "\n\n" + content)      # the template's blanks, then the JSON
    assert 0 < out["usage"]["completion_tokens_details"]["reasoning_tokens"] < out["usage"]["completion_tokens"]
    assert _streamed(live, body) == [(reasoning, content, finish)]


def test_a_budget_closes_the_thought_then_the_json(live):
    body = _chat(chat_template_kwargs=OPENED, thinking_token_budget=6)
    reasoning, content, finish = _whole(_post(live, "/v1/chat/completions", body)["choices"][0])
    assert reasoning and finish == "stop"
    _valid(content)
    assert _streamed(live, body) == [(reasoning, content, finish)]
    # a thought the output opens itself (`<think>` drawn, a bias for it), closed by the budget
    body = _chat(logit_bias={OPEN_ID: 100}, thinking_token_budget=4)
    reasoning, content, finish = _whole(_post(live, "/v1/chat/completions", body)["choices"][0])
    assert reasoning and finish == "stop"
    _valid(content)


def test_a_thought_cut_by_max_tokens_leaves_no_answer(live):
    reasoning, content, finish = _whole(_post(live, "/v1/chat/completions",
                                              _chat(chat_template_kwargs=OPENED, max_tokens=20))["choices"][0])
    assert reasoning and content == "" and finish == "length"


def test_each_choice_thinks_and_answers_on_its_own(live):
    """n = 2 sampled choices each close their own thought and answer valid JSON; speculative decoding
    gives the same tokens."""
    body = _chat(chat_template_kwargs=OPENED, thinking_token_budget=5, temperature=1.0, seed=11, n=2,
                 logit_bias={CLOSE_ID: 1.0})
    out = _post(live, "/v1/chat/completions", body)["choices"]
    for choice in out:
        reasoning, content, finish = _whole(choice)
        assert reasoning and finish == "stop"
        _valid(content)
    assert out[0]["message"] != out[1]["message"]
    assert _post(live, "/v1/chat/completions", {**body, "speculative": "lookup"})["choices"] == out
    assert _streamed(live, body) == [_whole(c) for c in out]


def test_a_regex_answer_after_the_thought(live):
    body = _chat(chat_template_kwargs=OPENED, thinking_token_budget=5, regex="[a-z]{3,8}", response_format=None)
    reasoning, content, finish = _whole(_post(live, "/v1/chat/completions", body)["choices"][0])
    assert reasoning and re.fullmatch("[a-z]{3,8}", content) and finish == "stop"


def test_responses_think_then_answer_in_the_format(live):
    """/v1/responses' text.format on a thinking template: a reasoning item, then the schema's JSON as the
    message (on input "a" the random model draws `<think>` first by itself; a budget closes it)."""
    r = _post(live, "/v1/responses", {"model": "tiny-think", "input": "a", "max_output_tokens": 80, "temperature": 0,
                                      "store": False, "thinking_token_budget": 6,
                                      "text": {"format": {"type": "json_schema", "name": "x", "schema": SCHEMA}}})
    assert [o["type"] for o in r["output"]] == ["reasoning", "message"] and r["status"] == "completed"
    assert r["output"][0]["content"][0]["text"]
    _valid(r["output"][1]["content"][0]["text"])


def test_without_a_thought_the_format_starts_at_once(live):
    """enable_thinking false (the template closes an empty thought in the prompt): the grammar governs
    from the first token, as a raw completion of that prompt under the schema does (as before this
    change: a guard of the path it leaves alone)."""
    off = {"enable_thinking": False}
    choice = _post(live, "/v1/chat/completions", _chat(chat_template_kwargs=off))["choices"][0]
    assert "reasoning_content" not in choice["message"] and choice["finish_reason"] == "stop"
    _valid(choice["message"]["content"])
    prompt = _post(live, "/apply-template", {"messages": USER, "chat_template_kwargs": off})["prompt"]
    raw = _post(live, "/v1/completions", {"model": "tiny-think", "prompt": prompt, "max_tokens": 80,
                                          "temperature": 0, "json_schema": SCHEMA})
    assert raw["choices"][0]["text"] == choice["message"]["content"]
    # Ollama's format, its `think: false` the template's switch: the same
    r = _post(live, "/api/chat", {"model": "tiny-think", "messages": USER, "stream": False, "format": SCHEMA,
                                  "options": {"temperature": 0, "num_predict": 80}, "think": False})
    assert r["message"] == {"role": "assistant", "content": choice["message"]["content"]}


# -- the library -----------------------------------------------------------------------------------

def test_model_chat_thinks_then_answers_in_the_schema(tmp_path):
    import llambda
    from test_export import tiny_llama_gguf
    gg = tiny_llama_gguf(tmp_path / "think.gguf", control_tokens=THINK_TOKENS, chat_template=TEMPLATE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", llambda.LlambdaWarning)     # a context beyond the tiny model's
        m = llambda.load(gg, n_slots=1, n_ctx=256)
    with m:
        kw = dict(json_schema=SCHEMA, max_tokens=80, temperature=0, template_kwargs=OPENED)
        text = m.chat(USER, thinking_budget=5, **kw)
        thought, _, answer = text.partition(CLOSE + "\n\n")
        assert thought and _valid(answer)
        # told not to think: the JSON at once
        _valid(m.chat(USER, json_schema=SCHEMA, max_tokens=80, temperature=0,
                      template_kwargs={"enable_thinking": False}))


def test_the_server_and_model_chat_decide_the_thought_alike(live, tmp_path):
    """The same prompt, format and budget give the same output, token for token, through the server and
    through Model.chat (both decide the budget and the grammar's wait by thinking.output_thinking): a
    thought the prompt opened, one the output opens itself, and none (the prompt closed it)."""
    import llambda
    from test_export import tiny_llama_gguf
    gg = tiny_llama_gguf(tmp_path / "think.gguf", control_tokens=THINK_TOKENS, chat_template=TEMPLATE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", llambda.LlambdaWarning)     # a context beyond the tiny model's
        m = llambda.load(gg, n_slots=1, n_ctx=512)
    cases = [(OPENED, 6, {}), ({}, 4, {OPEN_ID: 100}), ({"enable_thinking": False}, 4, {})]
    with m:
        for template_kwargs, budget, bias in cases:
            choice = _post(live, "/v1/chat/completions", _chat(chat_template_kwargs=template_kwargs, logprobs=True,
                                                              thinking_token_budget=budget, logit_bias=bias))
            served = [bytes(t["bytes"]) for t in choice["choices"][0]["logprobs"]["content"]]
            events = m.chat_stream(USER, json_schema=SCHEMA, max_tokens=80, temperature=0,
                                   template_kwargs=template_kwargs, thinking_budget=budget,
                                   logit_bias={int(k): v for k, v in bias.items()})
            tokens = [ev.token for ev in events if ev.token >= 0]
            assert [m.tokenizer.token_bytes(t) for t in tokens] == served
            text = m.tokenizer.decode(tokens)
            _valid(text.rpartition(CLOSE)[2])


# -- tools -----------------------------------------------------------------------------------------

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"]}}}]


@pytest.fixture(scope="module")
def live_tools(tmp_path_factory):
    """The thinking template, Hermes-style (it shows `<tool_call>`): calls are generated under a grammar."""
    from serverkit import tiny_chat_server
    template = TEMPLATE.replace("tools\n", "tools, called in <tool_call></tool_call>\n")
    with tiny_chat_server(tmp_path_factory.mktemp("think-tools"), "tiny-think", THINK_TOKENS, template) as srv:
        yield srv


def test_the_call_grammar_waits_for_the_thought(live_tools):
    """tool_choice auto: the call grammar starts after the thought, so the thought closes with the
    `</think>` control token (a grammar never spells one: over the whole output it kept the thought
    open to max_tokens). A forced call comes after the thought too, streamed or not; told not to
    think, the answer starts with the call as before."""
    body = {"model": "tiny-think", "messages": USER, "max_tokens": 200, "temperature": 0, "tools": TOOLS,
            "chat_template_kwargs": OPENED, "logit_bias": {CLOSE_ID: 1.0}}
    msg = _post(live_tools, "/v1/chat/completions", body)["choices"][0]["message"]
    assert msg["reasoning_content"] and msg["content"]
    forced = {**body, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    choice = _post(live_tools, "/v1/chat/completions", forced)["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["reasoning_content"]
    call = choice["message"]["tool_calls"][0]["function"]
    assert call["name"] == "get_weather" and json.loads(call["arguments"])["city"]
    with httpx.stream("POST", live_tools.url + "/v1/chat/completions", json={**forced, "stream": True},
                      timeout=300) as s:
        chunks = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == choice["message"]["reasoning_content"]
    assert "".join(c["function"].get("arguments", "") for d in deltas for c in d.get("tool_calls", [])) == \
        call["arguments"]
    off = {**forced, "chat_template_kwargs": {"enable_thinking": False}}
    choice = _post(live_tools, "/v1/chat/completions", off)["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and "reasoning_content" not in choice["message"]
