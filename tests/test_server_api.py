"""The OpenAI-compatible API on a live loopback server, driven by the official `openai` client:
completions, chat, streaming, logprobs, several choices, sampling, batching, metrics."""
from __future__ import annotations

import concurrent.futures as cf
import json

import httpx
import numpy as np

import llambda
from serverkit import LOAD_KW, MODEL_ID, PROMPTS, chat

# -- basics ---------------------------------------------------------------------------

def test_models_and_health(live, client):
    ids = [m.id for m in client.models.list().data]
    assert ids == [MODEL_ID]
    h = httpx.get(live.url + "/health").json()
    assert h["status"] == "ok" and h["slots_idle"] + h["slots_processing"] == 8


def test_chat_completion_and_usage(client, model):
    r = chat(client, "What is the capital of France?", max_tokens=12)
    c = r.choices[0]
    assert r.object == "chat.completion" and r.model == MODEL_ID
    assert c.message.role == "assistant" and c.message.content
    assert c.finish_reason in ("stop", "length")
    rendered = model.render_chat([{"role": "user", "content": "What is the capital of France?"}])
    assert r.usage.prompt_tokens == len(model._prompt_ids(rendered))
    assert 1 <= r.usage.completion_tokens <= 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    if c.finish_reason == "length":
        assert r.usage.completion_tokens == 12


def test_server_matches_single_stream_api(client, smollm2_gguf):
    """The scheduler's output equals llambda's own single-stream generation (same backend, and the
    batch-invariant kernels the server runs)."""
    messages = [{"role": "user", "content": "Tell me about the moon."}]
    r = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=20, temperature=0)
    with llambda.load(smollm2_gguf, n_ctx=512, **LOAD_KW) as single:
        single.backend.set_batch_invariant(True)
        expect = single.chat(messages, max_tokens=20, temperature=0)
    assert r.choices[0].message.content == expect


def test_completion_stop_and_max_tokens(client):
    prompt = "The days of the week are Monday, Tuesday,"
    full = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=16, temperature=0)
    text = full.choices[0].text
    assert full.object == "text_completion" and full.choices[0].finish_reason == "length"
    assert full.usage.completion_tokens == 16
    # stop at a word from the middle of the greedy text: the output is what came before it
    words = [w for w in text.split() if len(w) >= 3]
    assert words, text
    stop = words[len(words) // 2]
    cut = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=16, temperature=0, stop=[stop])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == text[:text.index(stop)]
    # max_completion_tokens (chat)
    r = chat(client, "Write a long story about dragons.", max_tokens=None, max_completion_tokens=5)
    assert r.usage.completion_tokens <= 5 and r.choices[0].finish_reason in ("length", "stop")


def test_prompt_longer_than_a_prefill_chunk(client, model):
    """A prompt spread over several steps (the live server's chunk is 64), with nothing else running."""
    prompt = "The quick brown fox jumps over the lazy dog. " * 20
    n_prompt = len(model._prompt_ids(prompt))
    assert n_prompt > 3 * 64
    r = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=4, temperature=0)
    assert r.usage.prompt_tokens == n_prompt and r.choices[0].finish_reason in ("stop", "length")


def test_completion_token_prompt_and_echo(client, model):
    ids = model.tokenize("Once upon a time")
    by_ids = client.completions.create(model=MODEL_ID, prompt=ids, max_tokens=8, temperature=0)
    by_text = client.completions.create(model=MODEL_ID, prompt="Once upon a time", max_tokens=8, temperature=0,
                                        echo=True)
    assert by_text.choices[0].text == "Once upon a time" + by_ids.choices[0].text
    batch = client.completions.create(model=MODEL_ID, prompt=["Once upon a time", "Hello"], max_tokens=4,
                                      temperature=0)
    assert [c.index for c in batch.choices] == [0, 1]
    assert batch.choices[0].text == by_ids.choices[0].text[:len(batch.choices[0].text)]


def test_streaming_equals_non_streaming(live, client):
    kw = dict(max_tokens=16, temperature=0)
    whole = chat(client, "Write a haiku about the sea.", **kw)
    stream = chat(client, "Write a haiku about the sea.", stream=True, stream_options={"include_usage": True}, **kw)
    parts, finish, usage, roles = [], None, None, []
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
            assert chunk.choices == []
            continue
        d = chunk.choices[0].delta
        if d.role:
            roles.append(d.role)
        if d.content:
            parts.append(d.content)
        if chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    assert roles == ["assistant"]
    assert "".join(parts) == whole.choices[0].message.content
    assert finish == whole.choices[0].finish_reason
    assert usage.completion_tokens == whole.usage.completion_tokens
    assert usage.prompt_tokens == whole.usage.prompt_tokens
    # the raw wire format ends with [DONE]
    with httpx.stream("POST", live.url + "/v1/completions", timeout=60,
                      json={"model": MODEL_ID, "prompt": "Hi", "max_tokens": 3, "stream": True}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln]
    assert lines[-1] == "data: [DONE]"
    assert all(ln.startswith("data: ") for ln in lines)
    assert json.loads(lines[-2][6:])["choices"][0]["finish_reason"] in ("length", "stop")


def test_logprobs(client):
    r = chat(client, "Name three colors.", max_tokens=8, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert "".join(t.token for t in content) == r.choices[0].message.content
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        tops = [x.logprob for x in t.top_logprobs]
        assert tops == sorted(tops, reverse=True)
        assert t.top_logprobs[0].token == t.token          # greedy: the chosen token is the most likely
        assert abs(t.top_logprobs[0].logprob - t.logprob) < 1e-6
        assert bytes(t.bytes).decode("utf-8", "replace") == t.token
    # streamed, the same entries arrive with the chunks
    streamed = [e for ch in chat(client, "Name three colors.", max_tokens=8, logprobs=True, top_logprobs=3,
                                 stream=True)
                for c in ch.choices if c.logprobs for e in c.logprobs.content]
    assert [e.token for e in streamed] == [t.token for t in content]
    assert np.allclose([e.logprob for e in streamed], [t.logprob for t in content], atol=1e-4)
    c = client.completions.create(model=MODEL_ID, prompt="One, two,", max_tokens=5, temperature=0, logprobs=2)
    lp = c.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == c.usage.completion_tokens
    assert "".join(lp.tokens) == c.choices[0].text
    assert lp.text_offset[0] == 0 and all(len(d) == 2 for d in lp.top_logprobs)


def _log_softmax(x):
    x = np.asarray(x, np.float64)
    m = x.max()
    return x - (m + np.log(np.exp(x - m).sum()))


def test_completion_echo_with_prompt_logprobs(client, model, smollm2_gguf):
    """echo + logprobs: the prompt's tokens come first, each scored by the model (the first has none)."""
    prompt = "The capital of France is"
    ids = model._prompt_ids(prompt)
    plain = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=3, temperature=0, logprobs=2)
    r = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=3, temperature=0, logprobs=2,
                                  echo=True)
    c, lp = r.choices[0], r.choices[0].logprobs
    assert c.text == prompt + plain.choices[0].text
    assert len(lp.tokens) == len(ids) + r.usage.completion_tokens
    assert "".join(lp.tokens) == c.text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    # the prompt was just evaluated for `plain`, but scoring needs every position: nothing reused
    assert r.usage.prompt_tokens_details.cached_tokens == 0
    # the generated part is what the request without echo reported
    assert lp.tokens[len(ids):] == plain.choices[0].logprobs.tokens
    assert np.allclose(lp.token_logprobs[len(ids):], plain.choices[0].logprobs.token_logprobs, atol=1e-3)
    # each prompt token's logprob is log_softmax of the logits after the tokens before it
    with llambda.load(smollm2_gguf, n_ctx=64, **LOAD_KW) as single:
        single.backend.set_batch_invariant(True)     # as the server computes
        for p in range(1, len(ids)):
            want = _log_softmax(single.logits(ids[:p]))
            assert abs(lp.token_logprobs[p] - want[ids[p]]) < 1e-3, (p, lp.token_logprobs[p], want[ids[p]])
            assert len(lp.top_logprobs[p]) == 2
            best = model.detokenize([int(np.argmax(want))])
            assert max(lp.top_logprobs[p], key=lp.top_logprobs[p].get) == best
            assert max(lp.top_logprobs[p].values()) >= lp.token_logprobs[p] - 1e-6
    # scoring only (max_tokens 0), two choices: both carry the prompt's logprobs
    scored = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=0, echo=True, logprobs=0, n=2)
    assert scored.usage.completion_tokens == 0
    for ch in scored.choices:
        assert ch.text == prompt and ch.finish_reason == "length"
        assert ch.logprobs.token_logprobs == lp.token_logprobs[:len(ids)]
    # streamed: the echo chunk carries the prompt's logprobs, the rest follows token by token
    chunks = list(client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=3, temperature=0,
                                            logprobs=2, echo=True, stream=True))
    head = chunks[0].choices[0]
    assert head.text == prompt and head.logprobs.tokens == lp.tokens[:len(ids)]
    assert head.logprobs.token_logprobs == lp.token_logprobs[:len(ids)]
    tokens = [t for ch in chunks for t in (ch.choices[0].logprobs.tokens if ch.choices[0].logprobs else [])]
    assert tokens == lp.tokens
    assert "".join(ch.choices[0].text for ch in chunks) == c.text


def test_streaming_with_several_choices(client):
    """n > 1 streamed: each choice's chunks carry its index; they spell what the same seeded request
    returns whole, each with one role chunk (chat) and one finish_reason."""
    kw = dict(max_tokens=10, temperature=1.0, seed=77, n=3)
    whole = chat(client, "Tell me about owls.", **kw)
    texts, roles, finishes, usage = {}, {}, {}, None
    for ch in chat(client, "Tell me about owls.", stream=True, stream_options={"include_usage": True}, **kw):
        if ch.usage is not None:
            usage = ch.usage
        for c in ch.choices:
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
            if c.delta.role:
                roles[c.index] = roles.get(c.index, 0) + 1
            if c.finish_reason:
                assert c.index not in finishes
                finishes[c.index] = c.finish_reason
    assert roles == {0: 1, 1: 1, 2: 1}
    assert [texts[i] for i in range(3)] == [c.message.content for c in whole.choices]
    assert [finishes[i] for i in range(3)] == [c.finish_reason for c in whole.choices]
    assert usage.completion_tokens == whole.usage.completion_tokens
    # legacy completions: two prompts x two choices = indexes 0..3
    got = {}
    for ch in client.completions.create(model=MODEL_ID, prompt=["Roses are", "The sky is"], max_tokens=4, n=2,
                                        temperature=0.9, seed=5, stream=True):
        for c in ch.choices:
            got[c.index] = got.get(c.index, "") + c.text
    same = client.completions.create(model=MODEL_ID, prompt=["Roses are", "The sky is"], max_tokens=4, n=2,
                                     temperature=0.9, seed=5)
    assert [got[i] for i in range(4)] == [c.text for c in same.choices]


def test_sampling_seed_n_and_penalties(client):
    kw = dict(max_tokens=12, temperature=1.0, top_p=0.95, seed=1234, n=2)
    a = chat(client, "Tell me a joke.", **kw)
    b = chat(client, "Tell me a joke.", **kw)
    assert [c.index for c in a.choices] == [0, 1]
    assert [c.message.content for c in a.choices] == [c.message.content for c in b.choices]
    assert a.usage.completion_tokens <= 2 * 12
    # extensions and penalties are accepted and change nothing about the response shape
    r = chat(client, "Tell me a joke.", max_tokens=6, temperature=0.7, seed=1,
             presence_penalty=0.5, frequency_penalty=0.5, extra_body={"top_k": 20, "min_p": 0.05})
    assert r.choices[0].message.content is not None


# -- batching --------------------------------------------------------------------------

def test_concurrent_greedy_equals_sequential(live, client):
    """8 concurrent greedy requests produce exactly the text each produces alone."""
    def one(p):
        return chat(client, p, max_tokens=16).choices[0].message.content

    alone = [one(p) for p in PROMPTS]
    before = live.metrics()
    with cf.ThreadPoolExecutor(8) as ex:
        together = list(ex.map(one, PROMPTS))
    after = live.wait_idle()
    assert together == alone
    steps = after["llambda_steps_total"] - before["llambda_steps_total"]
    tokens = after["llambda_step_tokens_total"] - before["llambda_step_tokens_total"]
    assert tokens / steps > 1.5, "concurrent requests should have shared forward steps"


def test_metrics_format(live):
    m = live.metrics()
    for name in ("llambda_prompt_tokens_total", "llambda_generated_tokens_total", "llambda_queue_depth",
                 "llambda_tokens_per_second", "llambda_time_to_first_token_seconds_count"):
        assert name in m
    assert m["llambda_generated_tokens_total"] > 0 and m["llambda_time_to_first_token_seconds_count"] > 0
