"""A thinking budget (llambda/thinking.py): a `<think>` thought that has run N tokens is closed and the
answer follows. Checked on the budget's own state with a toy tokenizer, then end to end on a tiny
random model with a Qwen3-like template (test_think's): through the server's APIs (chat completions'
`thinking_token_budget`, /v1/responses, Anthropic's `thinking.budget_tokens`) and `Model.chat`.

The random model never closes a thought by itself: a template that opens `<think>` in the prompt
(`open_thought`) leaves it thinking until max_tokens unless the budget closes it.
"""
import json
import re
import warnings

import httpx
import pytest

from llambda.errors import InvalidInputError
from llambda.thinking import CLOSE, ThinkingBudget, check_budget, text_after_close
from test_think import OUTPUT, TEMPLATE, THINK_TOKENS, THOUGHT, USER

OPENED = {"open_thought": True}


class ToyTokenizer:
    """A token per character, `</think>` one token (id 1000) where control tokens are parsed."""

    def encode(self, text, add_bos=False, parse_special=True):
        out, i = [], 0
        while i < len(text):
            if parse_special and text.startswith(CLOSE, i):
                out.append(1000)
                i += len(CLOSE)
            else:
                out.append(ord(text[i]))
                i += 1
        return out


def _run(budget, pieces, allows=None):
    """Feed `pieces` as sampled tokens' texts; forced tokens take their place where due.
    Returns the output's tokens as ("forced", id) or ("sampled", text)."""
    state, out, pieces = budget.start(), [], list(pieces)
    while pieces or state.forced(allows) is not None:
        token = state.forced(allows)
        if token is not None:
            out.append(("forced", token))
            state.record(CLOSE if token == 1000 else chr(token), forced=True)
        else:
            text = pieces.pop(0)
            out.append(("sampled", text))
            state.record(text)
    return out


def test_the_budget_counts_the_thought_and_forces_the_close():
    tok = ToyTokenizer()
    b = ThinkingBudget.build(tok, 4, opened=False)
    assert b.close == ((1000, 10, 10), tuple(map(ord, CLOSE + "\n\n")))
    # `<think>` (after blanks, in pieces) opens the thought; its tokens count; then "\n</think>\n\n"
    out = _run(b, [" ", "<thi", "nk>", "a", "b", "c"])
    assert out == [("sampled", " "), ("sampled", "<thi"), ("sampled", "nk>"), ("sampled", "a"),
                   ("forced", 10), ("forced", 1000), ("forced", 10), ("forced", 10), ("sampled", "b"), ("sampled", "c")]
    # a thought that ends with a newline gets no second one
    assert [t for k, t in _run(b, ["<think>", "x", "y", "\n", "z"]) if k == "forced"] == [1000, 10, 10]
    # an answer without a thought, or a thought closed in time: nothing is forced
    assert all(k == "sampled" for k, _ in _run(b, ["Hi", " <think>", "a", "b", "c", "d"]))
    assert all(k == "sampled" for k, _ in _run(b, ["<think>", "a</th", "ink>", "b", "c", "d", "e"]))
    # opened by the prompt: counted from the first token
    assert _run(ThinkingBudget.build(tok, 2, opened=True), ["a", "b", "c"])[2:5] == \
        [("forced", 10), ("forced", 1000), ("forced", 10)]
    # a grammar that refuses the control token gets the plain-text spelling; one that refuses both: none now
    plain = _run(b, ["<think>", "a", "b", "c", "d"], allows=lambda ids: 1000 not in ids)
    assert "".join(chr(t) for k, t in plain if k == "forced") == "\n" + CLOSE + "\n\n"
    assert all(k == "sampled" for k, _ in _run(b, ["<think>", "a", "b", "c", "d"], allows=lambda ids: False))


@pytest.mark.parametrize("bad", [-1, True, 2.5, "5", None])
def test_a_budget_is_a_count_of_tokens(bad):
    with pytest.raises(InvalidInputError, match="thinking_budget"):
        check_budget(bad)


def test_what_the_template_writes_after_the_close():
    def render(messages, enable_thinking=True):
        return "assistant:<think>\n\n</think>\n" if not enable_thinking else "assistant:"
    assert text_after_close(render) == "\n"
    assert text_after_close(lambda m, enable_thinking=True: "assistant:") == "\n\n"     # nothing shown


# -- on the server ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def live(tmp_path_factory):
    from serverkit import tiny_chat_server
    with tiny_chat_server(tmp_path_factory.mktemp("budget"), "tiny-think", THINK_TOKENS, TEMPLATE) as srv:
        yield srv


def _post(live, path, body):
    return httpx.post(live.url + path, json=body, timeout=300)


def _chat(**kw) -> dict:
    return {"model": "tiny-think", "messages": USER, "max_tokens": 24, "temperature": 0, **kw}


def _streamed(live, body) -> tuple[str, str, dict]:
    with httpx.stream("POST", live.url + "/v1/chat/completions", timeout=300,
                      json={**body, "stream": True, "stream_options": {"include_usage": True}}) as s:
        chunks = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    return ("".join(d.get("reasoning_content", "") for d in deltas), "".join(d.get("content") or "" for d in deltas),
            chunks[-1]["usage"])


def test_the_budget_closes_the_thought(live):
    n = 5
    r = _post(live, "/v1/chat/completions", _chat(chat_template_kwargs=OPENED, thinking_token_budget=n, logprobs=True))
    assert r.status_code == 200, r.text
    choice, usage = r.json()["choices"][0], r.json()["usage"]
    tokens = [bytes(t["bytes"]).decode("utf-8", "replace") for t in choice["logprobs"]["content"]]
    rest = "".join(tokens[n:])
    assert rest.startswith(("\n" + CLOSE + "\n\n", CLOSE + "\n\n")), rest      # the close, forced after n tokens
    closing = 2 if rest.startswith("\n") else 1
    assert usage["completion_tokens_details"]["reasoning_tokens"] == n + closing
    msg = choice["message"]
    assert msg["reasoning_content"] and msg["content"] and choice["finish_reason"] == "length"
    assert "".join(tokens[:n]).strip() == msg["reasoning_content"]
    # the same streamed
    reasoning, content, s_usage = _streamed(live, _chat(chat_template_kwargs=OPENED, thinking_token_budget=n))
    assert (reasoning, content) == (msg["reasoning_content"], msg["content"])
    assert s_usage["completion_tokens_details"] == usage["completion_tokens_details"]
    # without the budget the model thinks to the end
    free = _post(live, "/v1/chat/completions", _chat(chat_template_kwargs=OPENED)).json()["choices"][0]
    assert free["message"]["content"] == "" and free["finish_reason"] == "length"


def test_a_budget_above_the_thought_changes_nothing(live):
    def run(body, **kw):
        out = _post(live, "/v1/chat/completions", {**body, **kw}).json()
        out["usage"].pop("prompt_tokens_details")       # what the prefix cache held differs
        return out["choices"], out["usage"]
    # a thought the model closes itself (the regex spells it out)
    closed = _chat(regex=re.escape(OUTPUT), max_tokens=200, logprobs=True)
    free = run(closed)
    assert free[0][0]["message"]["reasoning_content"] == THOUGHT
    assert run(closed, thinking_token_budget=500) == free
    # a grammar that allows no close inside the thought wins over the budget
    assert run(closed, thinking_token_budget=3)[0][0]["message"] == free[0][0]["message"]
    # a thought that runs to max_tokens (24): a budget of 24 changes nothing, one of 23 closes it
    running = _chat(chat_template_kwargs=OPENED, logprobs=True)
    free = run(running)
    assert run(running, thinking_token_budget=24) == free
    assert run(running, thinking_token_budget=23)[0] != free[0]


def test_the_budget_under_a_grammar(live):
    """A regex that allows the close anywhere in the thought: the budget closes it, the answer follows
    the regex (the tag spelled as text where the grammar does not take the control token). A bias
    against "<" keeps the model from closing the thought itself (forced tokens are not drawn)."""
    body = _chat(regex=r"<think>\n[a-z ]+\n?</think>\n\n[a-z]{1,5}", max_tokens=40, logit_bias={"60": -100})
    free = _post(live, "/v1/chat/completions", body).json()["choices"][0]
    assert free["finish_reason"] == "length" and free["message"]["content"] == ""
    r = _post(live, "/v1/chat/completions", {**body, "thinking_token_budget": 10}).json()
    choice = r["choices"][0]
    assert choice["finish_reason"] == "stop" and re.fullmatch("[a-z]{1,5}", choice["message"]["content"])
    assert choice["message"]["reasoning_content"]
    assert r["usage"]["completion_tokens_details"]["reasoning_tokens"] <= 10 + len("\n" + CLOSE)


def test_the_budget_is_the_sequences_own(live):
    """Each choice closes its own thought after its own n tokens (n > 1, sampled), and speculative
    decoding gives the same tokens (a forced token is verified like any other)."""
    body = _chat(chat_template_kwargs=OPENED, thinking_token_budget=6, logprobs=True, temperature=1.0, seed=7, n=2)
    out = _post(live, "/v1/chat/completions", body).json()
    for choice in out["choices"]:
        rest = "".join(bytes(t["bytes"]).decode("latin-1") for t in choice["logprobs"]["content"][6:])
        assert rest.startswith(("\n" + CLOSE, CLOSE)) and choice["message"]["content"]
    assert out["choices"][0]["message"] != out["choices"][1]["message"]
    drafted = _post(live, "/v1/chat/completions", {**body, "speculative": "lookup"}).json()
    assert drafted["choices"] == out["choices"]


@pytest.mark.parametrize("bad", [-1, "5", True, 1.5])
def test_a_bad_budget_is_400(live, bad):
    r = _post(live, "/v1/chat/completions", _chat(thinking_token_budget=bad))
    assert r.status_code == 400 and r.json()["error"]["param"] == "thinking_token_budget", r.text


def test_responses_take_the_budget(live):
    """/v1/responses passes thinking_token_budget on to chat (its checks included)."""
    body = {"model": "tiny-think", "input": "hi", "max_output_tokens": 24, "temperature": 0, "store": False,
            "regex": re.escape(OUTPUT)}
    whole = _post(live, "/v1/responses", {**body, "max_output_tokens": 200, "thinking_token_budget": 500}).json()
    assert [o["type"] for o in whole["output"]] == ["reasoning", "message"]
    r = _post(live, "/v1/responses", {**body, "thinking_token_budget": -1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "thinking_token_budget", r.text


@pytest.mark.parametrize("thinking, max_tokens, param, message", [
    ({"type": "enabled"}, 2000, "thinking.budget_tokens", "thinking.enabled.budget_tokens: Field required"),
    ({"type": "enabled", "budget_tokens": "x"}, 2000, "thinking.budget_tokens", "valid integer"),
    ({"type": "enabled", "budget_tokens": 1023}, 2000, "thinking.budget_tokens",
     "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024"),
    ({"type": "enabled", "budget_tokens": 1024}, 1024, "max_tokens",
     "max_tokens must be greater than thinking.budget_tokens"),
])
def test_anthropic_checks_the_budget_as_anthropic_does(live, thinking, max_tokens, param, message):
    body = {"model": "tiny-think", "max_tokens": max_tokens, "messages": USER, "thinking": thinking}
    r = _post(live, "/v1/messages", body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and message in err["message"]


def test_anthropic_budget_reaches_the_generation():
    """budget_tokens becomes the chat spec's budget (the tiny model's context holds no 1024-token
    thought; chat completions' tests above show what the budget does)."""
    from llambda.server.anthropic_api import parse_messages
    body = {"model": "m", "max_tokens": 2000, "messages": USER, "thinking": {"type": "enabled", "budget_tokens": 1024}}
    spec = parse_messages(body)
    assert spec.thinking_budget == 1024 and spec.template_kwargs == {"enable_thinking": True}
    assert parse_messages({**body, "thinking": {"type": "disabled"}}).thinking_budget is None
    # count_tokens has no max_tokens to compare the budget with
    assert parse_messages({k: v for k, v in body.items() if k != "max_tokens"}, counting=True).thinking_budget == 1024


# -- the library -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The tiny model with the thinking template, and with a template that has no thought."""
    import llambda
    from test_export import tiny_llama_gguf
    folder = tmp_path_factory.mktemp("budget-lib")
    plain = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}assistant:"
    out = []
    for name, template in (("think", TEMPLATE), ("plain", plain)):
        gg = tiny_llama_gguf(folder / f"{name}.gguf", control_tokens=THINK_TOKENS, chat_template=template)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", llambda.LlambdaWarning)     # a context beyond the tiny model's
            out.append(llambda.load(gg, n_slots=1, n_ctx=256))
    yield out
    for m in out:
        m.close()


def test_model_chat_budget(models):
    think, plain = models
    kw = dict(template_kwargs=OPENED, max_tokens=20, temperature=0)
    free = [ev.token for ev in think.chat_stream(USER, **kw) if ev.token >= 0]
    events = [ev for ev in think.chat_stream(USER, thinking_budget=4, **kw) if ev.token >= 0]
    assert [ev.token for ev in events[:4]] == free[:4] and len(events) == 20
    rest = "".join(ev.text for ev in events[4:])
    assert rest.startswith(("\n" + CLOSE + "\n\n", CLOSE + "\n\n")) and CLOSE not in think.tokenizer.decode(free)
    assert think.chat(USER, thinking_budget=4, **kw) == "".join(ev.text for ev in events)
    # no thought in the template: the budget has nothing to close
    assert plain.chat(USER, thinking_budget=2, max_tokens=12, temperature=0) == \
        plain.chat(USER, max_tokens=12, temperature=0)
    with pytest.raises(InvalidInputError, match="thinking_budget"):
        think.chat(USER, thinking_budget=-3, max_tokens=4)
