"""Speculative decoding inside continuous batching: a sequence's verification rows join the step's
batch, and its output is what plain decoding gives.

The scheduler runs over test_scheduler's fake model, whose logits at a position depend on every
token its slot's cache holds up to there (read back from the cache): verification rows at wrong
positions, rejected drafts left where a later read sees them, or a slot mixed up would change the
output, which must equal an oracle that recomputes from the whole history. Drafters here are
deliberately wrong part of the time. Then the HTTP side on a tiny model: the per-request field,
its errors, and the /metrics counters.
"""
from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

import llambda
from llambda.server import ServerConfig
from llambda.server.app import create_app
from llambda.server.metrics import Metrics
from llambda.speculative import PromptLookup, Speculation
from serverkit import LiveServer, assert_error, post
from test_scheduler import (VOCAB, FakeTransformer, make_job, oracle, prompts_with_shared_prefix, run_jobs,
                            running)

TINY = Path(__file__).parent / "fixtures" / "reference" / "tiny"


class NoisyOracleDrafter:
    """Drafts the oracle's greedy continuation, with each token replaced by a wrong one with
    probability `wrong` (a seeded generator: reproducible)."""

    def __init__(self, wrong: float, seed: int = 0):
        self.wrong = wrong
        self.rng = np.random.default_rng(seed)
        self.calls = []

    def draft(self, tokens, k, slot=0):
        self.calls.append((len(tokens), k, slot))
        out = oracle(tokens, k, n_ctx=10**6)
        return [int(self.rng.integers(1, VOCAB)) if self.rng.random() < self.wrong else t for t in out]


def spec_jobs(prompts, max_tokens, drafter_for, k=5, **kw):
    def make(ch):
        jobs = []
        for i, p in enumerate(prompts):
            j = make_job(ch, p, max_tokens, index=i, **kw)
            j.speculation = Speculation(drafter_for(i), k)
            jobs.append(j)
        return jobs
    return make


@pytest.mark.parametrize("wrong", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("chunk", [4, 256])
def test_batched_speculation_equals_the_oracle(wrong, chunk):
    rng = np.random.default_rng(int(wrong * 10) + chunk)
    prompts = prompts_with_shared_prefix(rng, 6)
    model = FakeTransformer(n_slots=4, n_ctx=96, max_tokens=64)
    metrics = Metrics()
    with running(model, metrics, prefill_chunk=chunk, spec_rows=16) as sched:
        _, toks, fails = run_jobs(sched, spec_jobs(prompts, 24, lambda i: NoisyOracleDrafter(wrong, i)))
    assert not fails
    for i, p in enumerate(prompts):
        assert toks.get(i, []) == oracle(p, 24), i
    assert metrics.draft_tokens > 0
    if wrong == 0.0:
        assert metrics.draft_accepted == metrics.draft_tokens
    elif wrong == 1.0:
        assert metrics.draft_accepted < metrics.draft_tokens
    # verification rows went through the model: some steps asked for more logit rows than streams
    assert max(model.rows_asked) > 4


def test_prompt_lookup_in_the_scheduler_equals_the_oracle():
    prompts = [[3, 4, 5, 6, 3, 4, 5, 6, 3, 4], [7, 8, 7, 8, 7, 8, 9]]
    model = FakeTransformer(n_slots=2, n_ctx=96)
    metrics = Metrics()
    with running(model, metrics) as sched:
        _, toks, fails = run_jobs(sched, spec_jobs(prompts, 30, lambda i: PromptLookup()))
    assert not fails
    for i, p in enumerate(prompts):
        assert toks.get(i, []) == oracle(p, 30)
    assert metrics.draft_tokens > 0


def test_seeded_sampling_is_the_same_with_and_without_speculation():
    rng = np.random.default_rng(5)
    prompts = prompts_with_shared_prefix(rng, 4)
    model = FakeTransformer(n_slots=4, n_ctx=96)
    with running(model) as sched:
        _, plain, _ = run_jobs(sched, lambda ch: [make_job(ch, p, 20, index=i, temperature=1.0, seed=i)
                                                  for i, p in enumerate(prompts)])
        _, spec, fails = run_jobs(sched, lambda ch: [
            _with(make_job(ch, p, 20, index=i, temperature=1.0, seed=i), NoisyOracleDrafter(0.2, i))
            for i, p in enumerate(prompts)])
    assert not fails
    assert spec == plain


def _with(job, drafter, k=4):
    job.speculation = Speculation(drafter, k)
    return job


def test_a_full_batch_steps_speculation_aside():
    """With as many streams as the speculative rows, no stream gets drafts: nobody is slowed."""
    rng = np.random.default_rng(9)
    prompts = [rng.integers(1, VOCAB, 6).tolist() for _ in range(4)]   # no shared prefix: all admitted at once
    model = FakeTransformer(n_slots=4, n_ctx=96)
    metrics = Metrics()
    drafters = [NoisyOracleDrafter(0.0, i) for i in range(4)]
    with running(model, metrics, spec_rows=4) as sched:
        _, toks, fails = run_jobs(sched, spec_jobs(prompts, 16, lambda i: drafters[i]))
    assert not fails
    for i, p in enumerate(prompts):
        assert toks.get(i, []) == oracle(p, 16)
    # every step held at most the four streams' own rows: drafts came only once streams had finished
    assert max(model.rows_asked) <= 4
    assert metrics.draft_tokens < sum(len(oracle(p, 16)) for p in prompts)


def test_a_failing_drafter_costs_only_the_speculation():
    class Broken:
        def draft(self, tokens, k, slot=0):
            raise RuntimeError("drafter bug")

    prompts = [[1, 2, 3], [4, 5, 6, 7]]
    model = FakeTransformer(n_slots=2, n_ctx=96)
    with running(model) as sched:
        _, toks, fails = run_jobs(sched, spec_jobs(prompts, 12, lambda i: Broken()))
    assert not fails
    for i, p in enumerate(prompts):
        assert toks.get(i, []) == oracle(p, 12)


# ---------------------------------------------------------------- HTTP


@pytest.fixture(scope="module")
def live(smollm2_gguf):
    model = llambda.load(smollm2_gguf, n_ctx=512, n_slots=3, draft=smollm2_gguf)
    cfg = ServerConfig(model_id="tiny", parallel=2, speculative="lookup")
    with LiveServer(create_app(model, cfg)) as srv:
        yield srv
    model.close()


def completion(live, **kw):
    body = {**dict(model="tiny", prompt=PROMPT, max_tokens=40, temperature=0, ignore_eos=True), **kw}
    r = post(live, "/v1/completions", body)
    assert r.status_code == 200, r.text
    text = r.json()["choices"][0]["text"]
    assert text
    return text


PROMPT = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\nThe same two functions again:\n"


def test_http_per_request_speculation_gives_plain_output_and_counts(live):
    before = live.metrics()
    plain = completion(live, speculative="off")
    mid = live.metrics()
    assert mid["llambda_draft_tokens_total"] == before["llambda_draft_tokens_total"]
    assert completion(live, speculative="draft", draft_max=6) == plain
    assert completion(live) == plain                 # the server's default: lookup
    assert completion(live, speculative="lookup", seed=3) == plain
    after = live.metrics()
    drafted = after["llambda_draft_tokens_total"] - mid["llambda_draft_tokens_total"]
    accepted = after["llambda_draft_tokens_accepted_total"] - mid["llambda_draft_tokens_accepted_total"]
    assert drafted > 0 and 0 < accepted <= drafted
    # sampled with a seed: the same text with and without speculation
    s = dict(temperature=1.0, seed=42)
    assert completion(live, speculative="draft", **s) == completion(live, speculative="off", **s)


@pytest.mark.parametrize("body,words", [
    (dict(speculative="medusa"), ["speculative"]),
    (dict(speculative=3), ["speculative"]),
    (dict(speculative="lookup", draft_max=0), ["draft_max"]),
    (dict(speculative="lookup", draft_max=10**6), ["draft_max"]),
])
def test_http_bad_speculation_fields_are_400(live, body, words):
    r = post(live, "/v1/completions", dict(model="tiny", prompt=[1, 2, 3], max_tokens=2, **body))
    assert_error(r, 400, *words)


def test_http_draft_without_a_draft_model_is_400():
    with llambda.load(TINY / "llama", n_ctx=64, n_slots=2) as model:
        with LiveServer(create_app(model, ServerConfig(model_id="tiny", parallel=1))) as srv:
            r = post(srv, "/v1/completions", dict(model="tiny", prompt=[1, 2, 3], max_tokens=2, speculative="draft"))
            assert_error(r, 400, "draft model")
            r = httpx.post(srv.url + "/v1/completions", json=dict(model="tiny", prompt=[1, 2, 3], max_tokens=2,
                                                                  speculative="lookup"), timeout=60)
            assert r.status_code == 200, r.text
