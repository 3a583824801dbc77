"""The continuous-batching scheduler against a fake model whose KV cache records token ids.

The fake's logits at a position depend on every token its slot holds at positions
0..p, read back from its "KV cache". So a batch that mixes slots wrongly, a prefix
copied from the wrong slot, a chunk evaluated at the wrong positions, or a read of
a position never written changes the output (or raises), and the output must equal
an oracle that simply recomputes from the full token history.
"""
from __future__ import annotations

import asyncio
import ctypes
import hashlib
import time
from contextlib import contextmanager
from types import SimpleNamespace

import numpy as np
import pytest

from llambda.constraints import Constraint
from llambda.engine import GenerationParams, Sequence
from llambda.sampling import SamplingParams
from llambda.server.metrics import Metrics
from llambda.server.prefix_cache import SlotTable
from llambda.server.scheduler import Channel, Job, JobFailure, PromptLogprobs, QueueFull, Scheduler, ShuttingDown

VOCAB = 40
EOT = 0


def fake_logits(history) -> np.ndarray:
    digest = hashlib.sha256(np.asarray(history, np.int64).tobytes()).digest()
    rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
    x = rng.standard_normal(VOCAB).astype(np.float32)
    x[EOT] -= 1.5   # EOS now and then, not at once
    return x


class FakeCache:
    def __init__(self, n_slots, n_ctx):
        self.toks = np.full((n_slots, n_ctx), -1, np.int64)
        self.copies = []
        self.commits = 0

    def commit(self):
        self.commits += 1

    def copy_prefix(self, src, dst, n):
        assert src != dst and n > 0
        assert (self.toks[src, :n] >= 0).all(), "copying positions the source never wrote"
        self.toks[dst, :n] = self.toks[src, :n]
        self.toks[dst, n:] = -1          # what follows is stale: make any read of it fail
        self.copies.append((src, dst, n))


class FakeWorkspace:
    def __init__(self, max_tokens, max_logit_rows=16):
        self.max_tokens = max_tokens
        self.max_logit_rows = max_logit_rows


class FakeTransformer:
    def __init__(self, n_slots=4, n_ctx=96, max_tokens=64, fail_when=None, nan_after=None, max_logit_rows=16):
        self.n_slots, self.n_ctx = n_slots, n_ctx
        self.ws = FakeWorkspace(max_tokens, max_logit_rows)
        self.rows_asked = []             # logit rows per call
        self.cache = FakeCache(n_slots, n_ctx)
        self.batches = []                # (n tokens, n distinct slots) per call
        self.fail_when = fail_when
        self.nan_after = nan_after       # a token id whose next-token logits come out NaN

    def forward(self, tokens, slots, pos, logit_rows):
        tokens, slots, pos = np.asarray(tokens), np.asarray(slots), np.asarray(pos)
        assert len(tokens) <= self.ws.max_tokens
        assert all(0 <= r < len(tokens) for r in logit_rows), "a logit row outside the batch"
        assert len(set(zip(slots.tolist(), pos.tolist()))) == len(tokens), "two tokens at one (slot, position)"
        if self.fail_when is not None and self.fail_when(tokens):
            raise RuntimeError("injected failure")
        self.batches.append((len(tokens), len(set(slots.tolist()))))
        self.rows_asked.append(len(logit_rows))
        self.cache.toks[slots, pos] = tokens
        out = np.empty((len(logit_rows), VOCAB), np.float32)
        for i, r in enumerate(logit_rows):
            s, p = slots[r], pos[r]
            hist = self.cache.toks[s, :p + 1]
            assert (hist >= 0).all(), f"slot {s} read position(s) never written before {p}"
            out[i] = fake_logits(hist)
            if self.nan_after is not None and hist[-1] == self.nan_after:
                out[i] = np.nan
        return out


class FakeDecoder:
    def feed(self, t):
        return f"<{t}>"

    def flush(self):
        return ""


class FakeTokenizer:
    eot_ids = frozenset({EOT})

    def stream(self):
        return FakeDecoder()


def oracle(prompt, max_tokens, n_ctx=96) -> list[int]:
    """Greedy generation recomputing every step from the whole history."""
    toks, out = list(prompt), []
    while len(out) < max_tokens and len(toks) < n_ctx:
        t = int(np.argmax(fake_logits(toks)))
        if t == EOT:
            break
        toks.append(t)
        out.append(t)
    return out


def make_job(channel, prompt, max_tokens, index=0, after=None, n_ctx=96, temperature=0.0, seed=None,
             prompt_logprobs=None, grammar=None):
    sp = SamplingParams(temperature=temperature, top_k=0, top_p=1.0, min_p=0.0, seed=seed)
    seq = Sequence(FakeTokenizer(), prompt, GenerationParams(max_tokens=max_tokens, sampling=sp, grammar=grammar),
                   slot=-1, n_ctx=n_ctx)
    return Job(seq, channel, index, after=after, prompt_logprobs=prompt_logprobs)


async def collect(channel, n_jobs, cancel_after=None, jobs=None):
    """Tokens per job index until every job has finished (or failed).

    The second dict maps job index -> JobFailure, and "prompt_logprobs" -> {index: entries}.
    """
    tokens = {}
    failures = {}
    done = set()
    while len(done) < n_jobs:
        for idx, ev in await asyncio.wait_for(channel.get(), 30):
            if isinstance(ev, PromptLogprobs):
                assert idx not in tokens, "prompt logprobs must come before the first token"
                failures.setdefault("prompt_logprobs", {})[idx] = ev.entries
                continue
            if isinstance(ev, JobFailure):
                failures[idx] = ev
                done.add(idx)
                continue
            if ev.token >= 0:
                tokens.setdefault(idx, []).append(ev.token)
                if cancel_after and idx in cancel_after and len(tokens[idx]) == cancel_after[idx]:
                    jobs[idx].cancel()
                    done.add(idx)
            if ev.finish_reason:
                done.add(idx)
    return tokens, failures


async def wait_idle(sched, timeout=10.0):
    t0 = time.monotonic()
    while not sched.idle():
        assert time.monotonic() - t0 < timeout, f"scheduler not idle: {sched.stats()}"
        await asyncio.sleep(0.01)


def run(coro):
    return asyncio.run(coro)


@contextmanager
def running(model, metrics=None, **kw):
    """A started scheduler over `model`, stopped on the way out whatever happens."""
    sched = Scheduler(model, metrics or Metrics(), **kw)
    sched.start()
    try:
        yield sched
    finally:
        sched.stop()


def run_jobs(sched, make_jobs, **collect_kw):
    """Submit make_jobs(channel) at once; (jobs, tokens, failures) once all ended and the scheduler is idle."""
    async def main():
        ch = Channel()
        jobs = make_jobs(ch)
        sched.submit(jobs)
        toks, fails = await collect(ch, len(jobs), jobs=jobs, **collect_kw)
        await wait_idle(sched)
        return jobs, toks, fails
    return run(main())


def prompts_with_shared_prefix(rng, n, shared_len=12):
    shared = rng.integers(1, VOCAB, shared_len).tolist()
    out = []
    for i in range(n):
        tail = rng.integers(1, VOCAB, int(rng.integers(1, 20))).tolist()
        out.append((shared if i % 2 == 0 else []) + tail)
    return out


@pytest.mark.parametrize("chunk", [3, 7, 256])
def test_batched_equals_oracle(chunk):
    """Many concurrent sequences, chunked prefill, prefix reuse: each equals its own sequential run."""
    rng = np.random.default_rng(chunk)
    prompts = prompts_with_shared_prefix(rng, 10)
    model = FakeTransformer(n_slots=4)
    with running(model, prefill_chunk=chunk, queue_size=16) as sched:
        _, toks, fails = run_jobs(sched, lambda ch: [make_job(ch, p, 12, index=i) for i, p in enumerate(prompts)])
    assert not fails
    for i, p in enumerate(prompts):
        assert toks.get(i, []) == oracle(p, 12), f"sequence {i} differs from its sequential run"
    # several sequences really shared steps, and prompts larger than the chunk were split
    assert max(b[1] for b in model.batches) > 1
    assert max(b[0] for b in model.batches) <= chunk + 4


def test_scheduler_commits_the_cache_once_at_start():
    """Pages of the KV arena are written when the scheduler is made, not by a later step."""
    model = FakeTransformer()
    Scheduler(model)
    assert model.cache.commits == 1


def test_kv_cache_commit_zeroes_every_slot():
    from llambda.backends.base import KVCache
    k = [np.full((2, 8, 1, 4), 7.0, np.float32) for _ in range(3)]
    v = [np.full((2, 8, 1, 4), -3.0, np.float16) for _ in range(3)]
    cache = KVCache(3, 2, 8, 1, 4, np.float32, k, v, {})
    cache.commit()
    assert all(not a.any() for a in k + v)
    assert [a.shape for a in cache.k] == [(2, 8, 1, 4)] * 3


def test_prefix_cache_reuses_in_place_and_by_copy():
    system = list(range(1, 21))                     # a 20-token "system prompt"
    model = FakeTransformer(n_slots=3)
    metrics = Metrics()
    with running(model, metrics, prefill_chunk=64) as sched:
        (j1,), t1, f1 = run_jobs(sched, lambda ch: [make_job(ch, system + [30, 31], 4)])
        # a free slot holding the system prompt: reused in place
        (j2,), t2, f2 = run_jobs(sched, lambda ch: [make_job(ch, system + [32, 33, 34], 4)])
        # two at once: the first reuses the cached slot in place, the second copies from it (busy)
        (a, b), toks, f3 = run_jobs(sched, lambda ch: [make_job(ch, system + [35], 30, index=0),
                                                       make_job(ch, system + [36, 37], 4, index=1)])
    assert not f1 and not f2 and not f3
    t1, t2, ta, tb = t1.get(0, []), t2.get(0, []), toks.get(0, []), toks.get(1, [])
    assert j1.n_cached == 0 and t1 == oracle(system + [30, 31], 4)
    assert j2.n_cached == 20 and t2 == oracle(system + [32, 33, 34], 4)
    assert b.n_cached >= 20 and tb == oracle(system + [36, 37], 4)
    assert ta == oracle(system + [35], 30)
    assert model.cache.copies, "the second concurrent request should have copied the shared prefix"
    assert metrics.cached_prompt_tokens >= 40


def test_identical_prompt_still_evaluates_last_token():
    model = FakeTransformer(n_slots=1)
    prompt = [5, 6, 7, 8, 9, 10]
    with running(model) as sched:
        (j1,), t1, _ = run_jobs(sched, lambda ch: [make_job(ch, prompt, 6)])
        (j2,), t2, _ = run_jobs(sched, lambda ch: [make_job(ch, prompt, 6)])
    (c1, t1), (c2, t2) = (j1.n_cached, t1.get(0, [])), (j2.n_cached, t2.get(0, []))
    assert c1 == 0 and c2 == len(prompt) - 1
    assert t1 == t2 == oracle(prompt, 6)


def test_siblings_share_prompt_and_seeds_reproduce():
    """n > 1: later choices wait for the first one's prefill and copy its KV."""
    model = FakeTransformer(n_slots=4)
    prompt = list(range(3, 23))

    def siblings(ch, seed=7):
        first = make_job(ch, prompt, 8, index=0, temperature=1.0, seed=seed)
        return [first] + [make_job(ch, prompt, 8, index=k, after=first, temperature=1.0, seed=seed + k)
                          for k in range(1, 3)]

    with running(model, prefill_chunk=4) as sched:
        jobs, toks, fails = run_jobs(sched, siblings)
        _, toks_again, fails_again = run_jobs(sched, siblings)
    assert not fails and not fails_again
    assert [j.n_cached for j in jobs[1:]] == [len(prompt) - 1] * 2
    assert toks == toks_again, "seeded sampling must be reproducible through the scheduler"


def test_cancel_frees_slot_and_others_continue():
    model = FakeTransformer(n_slots=2, n_ctx=200)
    prompts = [[1, 2, 3], [4, 5, 6], [7, 8, 9], [10, 11, 12]]

    def make(ch):
        jobs = [make_job(ch, p, 40, index=i, n_ctx=200) for i, p in enumerate(prompts)]
        for j in jobs:
            j.seq.eot = set()            # run to max_tokens: the cancelled ones must be cut short
        return jobs

    with running(model, queue_size=4) as sched:
        jobs, toks, fails = run_jobs(sched, make, cancel_after={0: 3, 1: 5})
    assert not fails
    assert len(toks[2]) == 40 and len(toks[3]) == 40       # waited for the freed slots, then ran
    assert sched.slots.n_free() == 2


def test_queue_full_and_capacity():
    model = FakeTransformer(n_slots=1)
    sched = Scheduler(model, Metrics(), queue_size=2)   # not started: nothing leaves the queue

    async def main():
        ch = Channel()
        sched.submit([make_job(ch, [1, 2], 4, index=i) for i in range(3)])
        with pytest.raises(QueueFull):
            sched.submit([make_job(ch, [1, 2], 4)])

    run(main())
    assert sched.stats()["waiting"] == 3


def test_failed_step_fails_its_jobs_and_the_loop_survives():
    model = FakeTransformer(n_slots=2, fail_when=lambda toks: 33 in toks.tolist())
    with running(model) as sched:
        _, _, fails = run_jobs(sched, lambda ch: [make_job(ch, [33, 1, 2], 5)])
        _, toks, fails2 = run_jobs(sched, lambda ch: [make_job(ch, [1, 2, 3], 5)])
    assert fails[0].status == 500 and "injected failure" in fails[0].message
    assert not fails2 and toks.get(0, []) == oracle([1, 2, 3], 5)
    assert sched.slots.n_free() == 2


def test_drain_cancels_after_grace_and_refuses_new_work():
    model = FakeTransformer(n_slots=1, n_ctx=10_000)
    sched = Scheduler(model, Metrics())
    sched.start()

    async def main():
        ch = Channel()
        job = make_job(ch, [1, 2, 3], None, n_ctx=10_000)
        job.seq.eot = set()              # would run for 10k tokens
        sched.submit([job])
        await asyncio.sleep(0.05)
        sched.drain(0.2)
        with pytest.raises(ShuttingDown):
            sched.submit([make_job(ch, [1, 2], 3)])
        toks, fails = await collect(ch, 1)
        return toks, fails

    try:
        toks, fails = run(main())
    finally:
        sched.stop()
    assert fails[0].status == 503
    assert 0 < len(toks.get(0, [])) < 9_000
    assert sched.idle()


def test_slot_table_placement():
    t = SlotTable(3, min_reuse=2)
    a = [1, 2, 3, 4, 5]
    p = t.place(a)
    assert p.reuse == 0 and p.copy_from == -1
    t.acquire(p.slot, list(a), 0)
    t.set_valid(p.slot, 5)
    # same prefix while the first is busy: copy from it into another slot
    q = t.place([1, 2, 3, 9])
    assert q.slot != p.slot and q.copy_from == p.slot and q.reuse == 3
    t.release(p.slot)
    # now free: reuse in place; never the whole prompt (the last token needs logits)
    r = t.place([1, 2, 3, 4, 5])
    assert r.slot == p.slot and r.copy_from == -1 and r.reuse == 4
    # below min_reuse: an empty slot is preferred over evicting the cached one
    s = t.place([1, 7])
    assert s.slot != p.slot and s.reuse == 0
    for k in range(3):
        t.acquire(k, [], 0)
    assert t.place([1, 2]) is None


def test_sampling_failure_fails_only_that_sequence():
    model = FakeTransformer(n_slots=2, nan_after=34)
    with running(model) as sched:
        _, toks, fails = run_jobs(sched, lambda ch: [make_job(ch, [1, 2, 34], 5, index=0),
                                                     make_job(ch, [1, 2, 3], 5, index=1)])
    assert list(fails) == [0] and fails[0].status == 500 and "NaN" in fails[0].message
    assert toks.get(1, []) == oracle([1, 2, 3], 5)


def log_softmax(x):
    x = np.asarray(x, np.float64)
    m = x.max()
    return x - (m + np.log(np.exp(x - m).sum()))


def test_prompt_logprobs_cover_every_prompt_token():
    """echo + logprobs: each prompt token's logprob comes from the logits of the position before it,
    even when the prompt is split over steps with little logit room and shares steps with others."""
    rng = np.random.default_rng(5)
    model = FakeTransformer(n_slots=3, max_logit_rows=5)
    prompt = rng.integers(1, VOCAB, 23).tolist()
    other_prompt = rng.integers(1, VOCAB, 9).tolist()
    with running(model, prefill_chunk=64) as sched:
        run_jobs(sched, lambda ch: [make_job(ch, prompt, 6, index=0)])   # fills the prefix cache with the same prompt
        (other, scored), toks, extra = run_jobs(sched, lambda ch: [make_job(ch, other_prompt, 20, index=1),
                                                                   make_job(ch, prompt, 6, index=0, prompt_logprobs=3)])
    entries = extra["prompt_logprobs"][0]
    assert scored.n_cached == 0, "prompt logprobs need every position evaluated: no prefix reuse"
    assert [e[0] for e in entries] == prompt
    assert entries[0][1] is None and entries[0][2] is None
    for p in range(1, len(prompt)):
        want = log_softmax(fake_logits(prompt[:p]))
        tok, lp, top = entries[p]
        assert abs(lp - want[tok]) < 1e-5, p
        best = np.argsort(-want, kind="stable")[:3]
        assert [t for t, _ in top] == best.tolist()
        assert np.allclose([v for _, v in top], want[best], atol=1e-5)
    assert toks.get(0, []) == oracle(prompt, 6) and toks.get(1, []) == oracle(other_prompt, 20)
    assert max(model.rows_asked) <= 5, "a step asked for more logit rows than the workspace holds"


def test_prompt_logprobs_with_no_generated_tokens():
    """max_tokens 0 (scoring only): the scores still arrive, then a finish without tokens."""
    model = FakeTransformer(n_slots=1)
    prompt = [4, 8, 15, 16, 23, 42 % VOCAB]
    with running(model) as sched:
        _, toks, extra = run_jobs(sched, lambda ch: [make_job(ch, prompt, 0, prompt_logprobs=0)])
    entries = extra["prompt_logprobs"][0]
    assert not toks and len(entries) == len(prompt) and all(top == [] for _, _, top in entries[1:])


def test_a_prompt_finishing_beside_prompt_logprobs_stays_within_the_logit_rows():
    """A prompt scored for its logprobs takes the step's logit rows left; a prompt whose last chunk came
    after it in the same step asked for one row more (a fresh rows x vocab array each such step). Its
    last token now waits for the next step, and both still equal their sequential runs."""
    rng = np.random.default_rng(9)
    model = FakeTransformer(n_slots=3, max_logit_rows=5)
    scored_prompt = rng.integers(1, VOCAB, 23).tolist()
    short = [rng.integers(1, VOCAB, 3).tolist(), rng.integers(1, VOCAB, 4).tolist()]
    with running(model, prefill_chunk=64) as sched:
        _, toks, extra = run_jobs(sched, lambda ch: [make_job(ch, scored_prompt, 6, index=0, prompt_logprobs=2),
                                                     make_job(ch, short[0], 6, index=1),
                                                     make_job(ch, short[1], 6, index=2)])
    assert [e[0] for e in extra["prompt_logprobs"][0]] == scored_prompt
    assert toks.get(0, []) == oracle(scored_prompt, 6)
    assert toks.get(1, []) == oracle(short[0], 6) and toks.get(2, []) == oracle(short[1], 6)
    assert max(model.rows_asked) <= 5, "a step asked for more logit rows than the workspace holds"


class OracleDrafter:
    """Drafts the fake model's own greedy continuation: every draft is accepted, so the draft length
    grows to its maximum and a speculating stream fills the step's rows."""

    def draft(self, tokens, k, slot=0):
        toks, out = list(tokens), []
        while len(out) < k:
            t = int(np.argmax(fake_logits(toks)))
            out.append(t)
            toks.append(t)
        return out


def test_speculating_streams_leave_rows_for_prompts_being_scored():
    """Drafts took every logit row a step has, and a prompt scored for its logprobs (which needs rows
    for its chunks) waited until the speculating stream ended."""
    from llambda.speculative import Speculation

    model = FakeTransformer(n_slots=3, n_ctx=200, max_tokens=64, max_logit_rows=5)
    long_prompt = [3, 4, 5]
    scored_prompt = [6, 7, 8, 9, 10, 11, 12, 13, 14]
    sched = Scheduler(model, Metrics(), prefill_chunk=64, spec_rows=5)

    async def main():
        ch = Channel()
        spec = make_job(ch, long_prompt, 120, index=0, n_ctx=200)
        spec.seq.eot = set()
        spec.speculation = Speculation(OracleDrafter(), 8)
        scored = make_job(ch, scored_prompt, 2, index=1, n_ctx=200, prompt_logprobs=1)
        sched.submit([spec, scored])     # queued before the loop starts: the steps do not depend on timing
        sched.start()
        tokens, finished = [], []
        while len(finished) < 2:
            for idx, ev in await asyncio.wait_for(ch.get(), 30):
                if isinstance(ev, PromptLogprobs):
                    continue
                if idx == 0 and ev.token >= 0:
                    tokens.append(ev.token)
                if ev.finish_reason:
                    finished.append(idx)
        return tokens, finished

    try:
        tokens, finished = run(main())
    finally:
        sched.stop()
    assert finished == [1, 0], "the scored prompt waited for the speculating stream to end"
    assert max(model.rows_asked) <= 5
    assert tokens == oracle(long_prompt, 120, n_ctx=200)


class CostlyMatcher:
    """An llguidance matcher that allows every token but refuses each drawn one unmasked (so every
    token needs a mask), and whose mask costs `cost` seconds of an injected CPU clock."""

    def __init__(self, cost, clock):
        self.cost, self.clock = cost, clock

    def unsafe_compute_mask_ptr(self, ptr, nbytes):
        self.clock[0] += self.cost
        ctypes.memset(ptr, 0xFF, nbytes)

    def try_consume_tokens(self, tokens):
        return 0

    def consume_token(self, token):
        return True

    def is_error(self):
        return False

    def is_stopped(self):
        return False

    def is_accepting(self):
        return True


class DearAdvanceMatcher(CostlyMatcher):
    """Takes every token drawn unmasked (no mask is ever needed), each at `cost` of the clock."""

    def try_consume_tokens(self, tokens):
        self.clock[0] += self.cost
        return len(tokens)


class CostlyGrammar:
    def __init__(self, cost, clock, matcher=CostlyMatcher):
        self.cost, self.clock, self.matcher = cost, clock, matcher

    def start(self):
        vocab = SimpleNamespace(n_vocab=VOCAB, words=(VOCAB + 31) // 32, eos_ids=[EOT])
        return Constraint(self.matcher(self.cost, self.clock), vocab)


class StepClock(Metrics):
    """Metrics that note the injected CPU clock as each step ends: the differences are the steps'
    grammar CPU (nothing else moves that clock)."""

    def __init__(self, clock):
        super().__init__()
        self.clock, self.marks = clock, [clock[0]]

    def step(self, *args, **kw):
        self.marks.append(self.clock[0])
        super().step(*args, **kw)

    def per_step(self):
        return [b - a for a, b in zip(self.marks, self.marks[1:])]


def run_costly(model, metrics, requests, max_tokens=10, **sched_kw):
    """requests: name -> (prompt, grammar or None, choices); submitted in that order before the loop
    starts (one first step). name -> (tokens by index, failures by index)."""
    sched = Scheduler(model, metrics, **sched_kw)

    async def main():
        channels = {k: Channel() for k in requests}
        jobs = {k: [make_job(channels[k], p, max_tokens, index=i, grammar=g) for i in range(n)]
                for k, (p, g, n) in requests.items()}
        sched.submit([j for js in jobs.values() for j in js])
        sched.start()
        done = await asyncio.gather(*(collect(channels[k], len(jobs[k])) for k in requests))
        await wait_idle(sched)
        return dict(zip(requests, done))

    try:
        return run(main())
    finally:
        sched.stop()


def test_masks_over_the_step_budget_refuse_the_dearest_requests_only(monkeypatch):
    """Constrained requests whose masks are each under the one-mask cap but together over a step's
    budget: the dearest request (by all its sequences' masks, here two choices) fails with a 400 in
    its own stream, the others (dearer sequences among them) go on with the tokens they would have
    had alone. CPU comes from an injected clock, not timings."""
    from llambda.constraints import bounds
    clock = [0.0]
    monkeypatch.setattr(bounds, "cpu_now", lambda: clock[0])
    cap, budget = bounds.MAX_MASK_CPU_SECONDS, bounds.MAX_STEP_MASK_CPU_SECONDS
    costs = {"a": 0.9 * cap, "b": 0.48 * cap, "c": 0.6 * cap, "d": 0.2 * cap, "e": None}   # a mask's; e: none
    choices = {"b": 2}
    assert (0.9 + 2 * 0.48 + 0.6 + 0.2) * cap > budget >= (0.9 + 0.6 + 0.2) * cap    # over only with b
    prompts = {"a": [5, 6, 7], "b": [8, 9], "c": [10, 11, 12, 13], "d": [14, 15], "e": [16, 17, 18]}
    assert all(len(oracle(p, 10)) >= 3 for p in prompts.values())   # every one runs for a few steps
    model = FakeTransformer(n_slots=6)
    sched = Scheduler(model, Metrics())

    async def main():
        channels = {k: Channel() for k in costs}
        jobs = {k: [make_job(channels[k], prompts[k], 10, index=i,
                             grammar=CostlyGrammar(c, clock) if c is not None else None)
                    for i in range(choices.get(k, 1))] for k, c in costs.items()}
        sched.submit([j for js in jobs.values() for j in js])    # queued before the loop: one first step
        sched.start()
        done = await asyncio.gather(*(collect(channels[k], len(jobs[k])) for k in costs))
        await wait_idle(sched)
        return dict(zip(costs, done))

    try:
        out = run(main())
    finally:
        sched.stop()
    toks, fails = out["b"]
    assert set(fails) == {0, 1} and all(f.status == 400 and f.kind == "invalid_request_error" for f in fails.values())
    assert "too costly" in fails[0].message and f"at most {budget * 1e3:.0f} ms a step" in fails[0].message
    for k in "acde":
        toks, fails = out[k]
        assert not fails, (k, fails)
        assert toks[0] == oracle(prompts[k], 10), k


class _FormatWaitingForThought(Sequence):
    """A sequence whose output format waits for a thought to close (llambda.thinking): it has a
    grammar, but none is in force (live_constraint), so it asks for no mask."""

    @property
    def live_constraint(self):
        return None


def test_formats_waiting_for_a_thought_do_not_raise_the_step_mask_budget(monkeypatch):
    """The step's mask budget grows with the sequences whose grammar is in force; sequences whose format
    waits for a thought must not raise it, or many thinking requests would let dear masks through."""
    from llambda.constraints import bounds
    clock = [0.0]
    monkeypatch.setattr(bounds, "cpu_now", lambda: clock[0])
    cap = bounds.MAX_MASK_CPU_SECONDS
    n_waiting = 12
    assert 3 * 0.9 * cap > bounds.step_budget(3) and 3 * 0.9 * cap <= bounds.step_budget(3 + n_waiting)
    model = FakeTransformer(n_slots=3 + n_waiting)
    sched = Scheduler(model, Metrics())
    sp = SamplingParams(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0)

    async def main():
        dear = [Channel() for _ in range(3)]
        waiting = [Channel() for _ in range(n_waiting)]
        jobs = [make_job(ch, [5 + i, 6, 7], 6, grammar=CostlyGrammar(0.9 * cap, clock)) for i, ch in enumerate(dear)]
        for i, ch in enumerate(waiting):
            params = GenerationParams(max_tokens=6, sampling=sp, grammar=CostlyGrammar(0.0, clock))
            jobs.append(Job(_FormatWaitingForThought(FakeTokenizer(), [20 + i, 9], params, slot=-1, n_ctx=96), ch, 0))
        sched.submit(jobs)          # queued before the loop: one first step
        sched.start()
        done = await asyncio.gather(*(collect(ch, 1) for ch in dear + waiting))
        await wait_idle(sched)
        return done[:3], done[3:]

    try:
        dear, waiting = run(main())
    finally:
        sched.stop()
    assert sum(bool(fails) for _, fails in dear) >= 1, "the dear masks were let through by waiting formats"
    assert not any(fails for _, fails in waiting)


def test_a_step_stops_computing_masks_once_its_budget_is_spent(monkeypatch):
    """Six requests whose masks are each under the one-mask cap: the step that found them over the
    budget computed all six first (a stall of every mask at once). Now no step's grammar CPU passes
    its budget by more than one mask: the constrained sequences left wait for the next step (their
    tokens unchanged), free requests sample in every step, and the dearest requests get their 400."""
    from llambda.constraints import bounds
    clock = [0.0]
    monkeypatch.setattr(bounds, "cpu_now", lambda: clock[0])
    dear = 0.9 * bounds.MAX_MASK_CPU_SECONDS
    budget = bounds.step_budget(8)                  # 6 dear + 2 cheap constrained sequences
    assert 6 * dear > budget + dear
    requests = {f"dear{i}": ([5 + i, 6, 7], CostlyGrammar(dear, clock), 1) for i in range(6)}
    requests.update({f"cheap{i}": ([14 + i, 15], CostlyGrammar(0.0005, clock), 1) for i in range(2)})
    requests.update({f"free{i}": ([20 + i, 9, 3], None, 1) for i in range(2)})
    metrics = StepClock(clock)
    out = run_costly(FakeTransformer(n_slots=10), metrics, requests)
    assert max(metrics.per_step()) <= budget + dear + 1e-9, metrics.per_step()
    refused = [k for k, (_, fails) in out.items() if fails]
    assert refused and all(k.startswith("dear") for k in refused), refused
    for k in refused:
        fail = out[k][1][0]
        assert fail.status == 400 and "ms a step" in fail.message, fail
    for k, (p, _, _) in requests.items():
        if k not in refused:
            assert out[k][0][0] == oracle(p, 10), k     # waiting a step changed no token


def test_a_sequence_waiting_alone_is_sampled_without_a_forward(monkeypatch):
    """A sequence that waited (the step's budget spent before its turn) keeps its logits: the next
    step samples it from them, without feeding its token again, even when nothing else runs."""
    from llambda.constraints import bounds
    clock = [0.0]
    monkeypatch.setattr(bounds, "cpu_now", lambda: clock[0])
    monkeypatch.setattr(bounds, "MAX_STEP_MASK_CPU_SECONDS", 0.030)
    monkeypatch.setattr(bounds, "MASK_CPU_PER_SEQUENCE", 0.003)
    requests = {"dear": ([5, 6, 7], CostlyGrammar(0.040, clock), 1), "cheap": ([8, 9], CostlyGrammar(0.001, clock), 1)}
    model, metrics = FakeTransformer(n_slots=2), StepClock(clock)
    out = run_costly(model, metrics, requests)
    assert out["dear"][1][0].status == 400
    assert not out["cheap"][1] and out["cheap"][0][0] == oracle([8, 9], 10)
    assert len(model.batches) < len(metrics.per_step()), "the waiting sequence was fed again"


def test_advancing_over_tokens_is_charged_to_the_step(monkeypatch):
    """Grammars that never need a mask but whose advance over each token is dear (a long literal
    costs there too) were not charged: three of them took the step past its budget unrefused."""
    from llambda.constraints import bounds
    clock = [0.0]
    monkeypatch.setattr(bounds, "cpu_now", lambda: clock[0])
    dear = 0.9 * bounds.MAX_MASK_CPU_SECONDS
    assert 3 * dear > bounds.step_budget(3) >= 2 * dear
    requests = {f"r{i}": ([5 + i, 6, 7], CostlyGrammar(dear, clock, DearAdvanceMatcher), 1) for i in range(3)}
    out = run_costly(FakeTransformer(n_slots=3), Metrics(), requests)
    refused = [k for k, (_, fails) in out.items() if fails]
    assert len(refused) == 1 and "ms a step" in out[refused[0]][1][0].message
    for k, (p, _, _) in requests.items():
        if k not in refused:
            assert out[k][0][0] == oracle(p, 10), k


def test_verifying_drafts_stops_once_the_steps_budget_is_spent(monkeypatch):
    """A speculating constrained stream computes a mask per verified row: nine rows could take the
    step a mask's worth past its budget several times over. Verification stops at the budget (the
    rows left are drawn again next step), the request is refused, a free request beside it goes on."""
    from llambda.constraints import bounds
    from llambda.speculative import Speculation
    clock = [0.0]
    monkeypatch.setattr(bounds, "cpu_now", lambda: clock[0])
    mask = 0.015
    budget = bounds.step_budget(1)
    assert 9 * mask > budget + mask
    model, metrics = FakeTransformer(n_slots=2, n_ctx=200), StepClock(clock)
    sched = Scheduler(model, metrics)

    async def main():
        spec_ch, free_ch = Channel(), Channel()
        spec = make_job(spec_ch, [3, 4, 5], 40, n_ctx=200, grammar=CostlyGrammar(mask, clock))
        spec.seq.eot = set()
        spec.speculation = Speculation(OracleDrafter(), 8)
        sched.submit([spec, make_job(free_ch, [6, 7], 10)])
        sched.start()
        done = await asyncio.gather(collect(spec_ch, 1), collect(free_ch, 1))
        await wait_idle(sched)
        return done

    try:
        (spec_toks, spec_fails), (free_toks, free_fails) = run(main())
    finally:
        sched.stop()
    assert max(metrics.per_step()) <= budget + mask + 1e-9, metrics.per_step()
    assert spec_fails[0].status == 400 and "ms a step" in spec_fails[0].message
    assert not free_fails and free_toks[0] == oracle([6, 7], 10)


def test_a_budget_spent_before_any_mask_still_moves_a_sequence_on_each_step(monkeypatch):
    """A step whose budget is spent before its first mask (here a negative budget) samples its first
    constrained sequence anyway, which is refused: held back instead, none would ever move on."""
    from llambda.constraints import bounds
    clock = [0.0]
    monkeypatch.setattr(bounds, "cpu_now", lambda: clock[0])
    monkeypatch.setattr(bounds, "MAX_STEP_MASK_CPU_SECONDS", -1.0)
    monkeypatch.setattr(bounds, "MASK_CPU_PER_SEQUENCE", -1.0)
    requests = {f"c{i}": ([5 + i, 6], CostlyGrammar(0.0, clock), 1) for i in range(3)}
    requests["free"] = ([9, 8, 7], None, 1)
    out = run_costly(FakeTransformer(n_slots=4), Metrics(), requests)
    assert all(out[f"c{i}"][1][0].status == 400 for i in range(3))
    assert not out["free"][1] and out["free"][0][0] == oracle([9, 8, 7], 10)
