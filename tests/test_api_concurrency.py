"""One model used by several generators and threads at once, and token ids checked at the door.

Every case must either give each generator the text it would have given alone, or fail at once with
a llambda error: never another generator's text, never a hang (threads are joined with timeouts).
"""
import asyncio
import itertools
import threading
from pathlib import Path

import numpy as np
import pytest

import llambda
from llambda.backends import available_backends
from llambda.errors import InvalidInputError, LlambdaError, ModelBusyError

TINY = Path(__file__).parent / "fixtures" / "reference" / "tiny"
BACKENDS = [b for b in ("native", "numpy") if b in available_backends()]
GREEDY = dict(max_tokens=16, temperature=0, ignore_eos=True)
SAMPLED = dict(max_tokens=16, temperature=1.0, seed=7, ignore_eos=True)


@pytest.fixture(scope="module", params=BACKENDS)
def model(request):
    with llambda.load(TINY / "llama", backend=request.param, n_ctx=128) as m:
        yield m


def prompts(m):
    v = m.config.vocab_size
    return [(7 * i + 3) % v for i in range(9)], [(11 * i + 5) % v for i in range(13)]


def alternate(*gens) -> list[list[int]]:
    """Consume the generators one item each in turn, in this thread."""
    outs = [[] for _ in gens]
    for items in itertools.zip_longest(*gens):
        for out, item in zip(outs, items):
            if item is not None:
                out.append(item)
    return outs


@pytest.mark.parametrize("kw", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_alternating_generators_give_their_own_text(model, kw):
    pa, pb = prompts(model)
    alone = [list(model.generate(pa, **kw)), list(model.generate(pb, **kw))]
    assert alone[0] != alone[1]
    assert alternate(model.generate(pa, **kw), model.generate(pb, **kw)) == alone
    # the same prompt twice (the whole prefix shared) and a prompt that extends the other one
    assert alternate(model.generate(pa, **kw), model.generate(pa, **kw)) == [alone[0], alone[0]]
    longer = pa + alone[0][:4]
    assert alternate(model.generate(pa, **kw), model.generate(longer, **kw)) == \
        [alone[0], list(model.generate(longer, **kw))]


def test_calls_between_the_steps_of_a_generator_do_not_change_its_text(model):
    pa, pb = prompts(model)
    alone = list(model.generate(pa, **GREEDY))
    want_logits = model.logits(pb)
    want_tokens = list(model.generate(pb, **GREEDY))
    gen = model.generate(pa, **GREEDY)
    got = [next(gen)]
    for tok in gen:
        got.append(tok)
        np.testing.assert_array_equal(model.logits(pb), want_logits)
        if len(got) == 5:
            assert list(model.generate(pb, **GREEDY)) == want_tokens
    assert got == alone


def test_a_suspended_generator_in_another_thread_does_not_block_logits(model):
    pa, pb = prompts(model)
    alone = list(model.generate(pa, **GREEDY))
    want = model.logits(pb)
    started, resume = threading.Event(), threading.Event()
    result = {}

    def consumer():
        gen = model.generate(pa, **GREEDY)
        toks = [next(gen)]
        started.set()
        resume.wait(60)                       # suspended at a yield meanwhile
        toks.extend(gen)
        result["tokens"] = toks

    def evaluator():
        result["logits"] = model.logits(pb)

    a = threading.Thread(target=consumer, daemon=True)
    a.start()
    assert started.wait(60)
    b = threading.Thread(target=evaluator, daemon=True)
    b.start()
    b.join(timeout=20)
    blocked = b.is_alive()
    resume.set()                              # lets a blocked evaluator finish too, so nothing hangs
    a.join(timeout=60)
    b.join(timeout=60)
    assert not blocked, "logits() waited on a generator suspended in another thread"
    np.testing.assert_array_equal(result["logits"], want)
    assert result["tokens"] == alone


def test_threads_generating_at_once_each_get_their_own_text(model):
    pa, pb = prompts(model)
    jobs = [pa, pb, pa[:5], pb[3:]]
    want = [list(model.generate(p, **SAMPLED)) for p in jobs]
    got = [None] * len(jobs)

    def run(i):
        got[i] = list(model.generate(jobs[i], **SAMPLED))

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert got == want


# -- a model a server's scheduler runs ---------------------------------------------------------

def _served_tokens(sched, ids) -> list[int]:
    """Greedy tokens of one sequence through a running scheduler."""
    from llambda.engine import GenerationParams, Sequence
    from llambda.sampling import SamplingParams
    from llambda.server.scheduler import Channel, Job

    async def main():
        ch = Channel()
        sp = SamplingParams(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0)
        seq = Sequence(None, ids, GenerationParams(max_tokens=16, sampling=sp, ignore_eos=True), slot=-1,
                       n_ctx=sched.model.n_ctx)
        sched.submit([Job(seq, ch, 0)])
        out = []
        while True:
            for _, ev in await asyncio.wait_for(ch.get(), 60):
                if ev.token >= 0:
                    out.append(ev.token)
                if ev.finish_reason:
                    return out

    return asyncio.run(main())


def test_library_calls_on_a_served_model_are_refused_and_its_prefix_forgotten(model):
    """A library call beside a running scheduler overwrote its steps' activations and its slot 0: the
    server's clients and the caller both got garbage, silently. While served, computing calls raise
    ModelBusyError; once the scheduler stops they work again, and the prefix the library had cached in
    slot 0 before (overwritten by the scheduler's sequences meanwhile) is not reused."""
    from llambda.server.metrics import Metrics
    from llambda.server.scheduler import Scheduler

    pa, pb = prompts(model)
    want = list(model.generate(pa, **GREEDY))
    served_want = list(model.generate(pb, **GREEDY))
    model.logits(pa)                       # slot 0 now holds pa: the library would reuse it
    early = model.generate(pa, **GREEDY)   # created before the server starts, consumed while it runs
    sched = Scheduler(model.transformer, Metrics(), n_slots=1)
    sched.start()
    try:
        with pytest.raises(ModelBusyError, match="served"):
            model.generate(pa, **GREEDY)
        with pytest.raises(ModelBusyError):
            model.logits(pa)
        with pytest.raises(ModelBusyError):
            model.embed([pa])
        with pytest.raises(ModelBusyError):
            next(early)
        with pytest.raises(ModelBusyError):     # two schedulers would overwrite each other too
            Scheduler(model.transformer, Metrics(), n_slots=1).start()
        assert _served_tokens(sched, pb) == served_want    # the server's sequence, on slot 0
    finally:
        sched.stop()
    assert list(model.generate(pa, **GREEDY)) == want


def test_a_served_models_draft_model_is_refused_too():
    """The server's steps draft with the draft model on its own buffers: a library call on it beside
    them would compute garbage there too."""
    from starlette.testclient import TestClient

    from llambda.server import ServerConfig, create_app

    with llambda.load(TINY / "llama", n_ctx=128, n_slots=2) as m:
        m.set_draft(llambda.load(TINY / "llama", n_ctx=128, n_slots=2))
        pa, _ = prompts(m)
        want = list(m.draft.generate(pa, **GREEDY))
        with TestClient(create_app(m, ServerConfig(parallel=1))):       # its lifespan runs the scheduler
            with pytest.raises(ModelBusyError):
                m.draft.generate(pa, **GREEDY)
            with pytest.raises(ModelBusyError):
                m.generate(pa, **GREEDY)
        assert list(m.draft.generate(pa, **GREEDY)) == want


# -- token ids ---------------------------------------------------------------------------------

BAD_IDS = [[1.7], ["5"], [True], [np.bool_(True)], [np.float32(2.0)], [None], [3, 2.0], "5", b"\x01\x02",
           np.array([1.0, 2.0]), np.array([[1, 2]]), 5]


@pytest.mark.parametrize("ids", BAD_IDS, ids=repr)
def test_ids_that_are_not_integers_are_refused(model, ids):
    with pytest.raises(InvalidInputError, match="integer"):
        model.logits(ids)
    if not isinstance(ids, str):          # a str prompt is text, for generate
        with pytest.raises(InvalidInputError, match="integer"):
            list(model.generate(ids, max_tokens=1))


@pytest.mark.parametrize("bad", [-1, "vocab", 10**30])
def test_ids_out_of_range_are_a_llambda_error(model, bad):
    v = model.config.vocab_size
    ids = [1, 2, v if bad == "vocab" else bad]
    for call in (lambda: model.logits(ids), lambda: list(model.generate(ids, max_tokens=1)),
                 lambda: model.complete(ids, max_tokens=1)):
        with pytest.raises(InvalidInputError, match=r"out of range \[0, ") as e:
            call()
        assert isinstance(e.value, LlambdaError) and isinstance(e.value, ValueError)


def test_empty_prompts_and_bad_logit_bias_are_llambda_errors(model):
    with pytest.raises(InvalidInputError):
        model.logits([])
    with pytest.raises(InvalidInputError):
        model.complete([], max_tokens=1)
    with pytest.raises(InvalidInputError, match="logit_bias keys out of range"):
        model.complete([1, 2], max_tokens=1, logit_bias={model.config.vocab_size: 1.0})


def test_integer_ids_of_any_integer_type_are_accepted(model):
    pa, _ = prompts(model)
    want = model.logits(pa)
    for ids in (np.array(pa, np.int32), np.array(pa, np.uint16), [np.int64(i) for i in pa], tuple(pa),
                iter(pa)):
        np.testing.assert_array_equal(model.logits(ids), want)
    assert list(model.generate(np.array(pa), **GREEDY)) == list(model.generate(pa, **GREEDY))


@pytest.mark.slow
def test_alternating_chats_on_a_real_model_give_their_own_text(smollm2_gguf):
    with llambda.load(smollm2_gguf, n_ctx=512) as m:
        chats = [[{"role": "user", "content": "Name three colors."}],
                 [{"role": "user", "content": "Write a haiku about the sea."}]]
        kw = dict(max_tokens=24, temperature=0)
        alone = [m.chat(c, **kw) for c in chats]
        texts = alternate(*(m.chat_stream(c, **kw) for c in chats))
        assert ["".join(ev.text for ev in t) for t in texts] == alone
