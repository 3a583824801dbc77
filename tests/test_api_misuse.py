"""Odd or hostile arguments to the public Model API: each is a llambda error (never a raw TypeError or
ValueError from deep inside), and a refused call leaves nothing behind that changes a later call's text."""
import warnings
from pathlib import Path

import numpy as np
import pytest

import llambda
from llambda.backends import available_backends
from llambda.errors import InvalidInputError, LlambdaError, TokenizerError

TINY = Path(__file__).parent / "fixtures" / "reference" / "tiny" / "llama"
SAMPLED = dict(max_tokens=12, temperature=1.0, seed=11, ignore_eos=True)


@pytest.fixture(scope="module")
def model():
    with llambda.load(TINY, n_ctx=128) as m:     # the native backend where it built, else numpy
        yield m


def prompt(m, n=9, step=7):
    return [(step * i + 3) % m.config.vocab_size for i in range(n)]


@pytest.mark.parametrize("slot", ["0", 1, -1, True, 0.0, None])
def test_embed_refuses_a_slot_that_is_not_one_of_the_models(model, slot):
    p, other = prompt(model), prompt(model, 20, 13)
    want = list(model.generate(p, **SAMPLED))
    with pytest.raises(InvalidInputError, match="slot"):
        model.embed([other], slot=slot)
    # slot "0" used to write slot 0 without forgetting what it held: this reused the wrong keys/values
    assert list(model.generate(p, **SAMPLED)) == want


def test_embed_accepts_a_numpy_integer_slot(model):
    p = prompt(model)
    np.testing.assert_array_equal(model.embed([p], slot=np.int64(0)), model.embed([p]))


@pytest.mark.parametrize("texts", [None, 5, 2.5, b"\x01\x02", bytearray(b"\x01")], ids=repr)
def test_embed_inputs_that_are_not_texts_or_ids_are_llambda_errors(model, texts):
    with pytest.raises(InvalidInputError, match="embed"):
        model.embed(texts)
    with pytest.raises(InvalidInputError, match="embed"):
        model.embed_token_counts(texts)


@pytest.mark.parametrize("stop", [5, 2.5, object(), {"a": 1}, {"x"}], ids=lambda s: type(s).__name__)
def test_a_stop_that_is_not_strings_is_a_llambda_error(model, stop):
    with pytest.raises(InvalidInputError, match="stop"):
        model.complete(prompt(model), max_tokens=2, stop=stop)


@pytest.mark.parametrize("flag", ["no", [0], 1, None, 0.0], ids=repr)
def test_ignore_eos_that_is_not_a_boolean_is_a_llambda_error(model, flag):
    """It was read by truthiness: ignore_eos="no" ignored the end of text, None and 0.0 did not."""
    with pytest.raises(InvalidInputError, match="ignore_eos"):
        model.complete(prompt(model), max_tokens=2, ignore_eos=flag)
    assert list(model.generate(prompt(model), **dict(SAMPLED, ignore_eos=np.bool_(True)))) == \
        list(model.generate(prompt(model), **SAMPLED))


@pytest.mark.parametrize("draft_max", [0, -1, 1.5, "4", True], ids=repr)
def test_draft_max_is_checked_without_speculation_too(model, draft_max):
    """Without a drafter it was ignored whatever it held (every other argument is checked)."""
    with pytest.raises(InvalidInputError, match="draft_max"):
        model.complete(prompt(model), max_tokens=2, draft_max=draft_max)
    model.complete(prompt(model), max_tokens=2, draft_max=1)


def test_stop_strings_in_an_array_are_accepted(model):
    # `stop or []` raised NumPy's "truth value of an array is ambiguous"
    p = prompt(model)
    stops = np.array(["\x00never", "\x01nor"])
    assert list(model.generate(p, stop=stops, **SAMPLED)) == list(model.generate(p, **SAMPLED))


@pytest.mark.parametrize("ids", [None, 5, [1.5]], ids=repr)
def test_detokenize_of_non_ids_is_a_tokenizer_error(smollm2_gguf, ids):
    with llambda.load(smollm2_gguf, n_ctx=64) as m:
        with pytest.raises(TokenizerError) as e:
            m.detokenize(ids)
        assert isinstance(e.value, LlambdaError)
        assert m.detokenize(np.array(m.tokenize("Hello there"))) == "Hello there"


@pytest.mark.parametrize("kw", [dict(n_slots=0), dict(n_slots="2"), dict(n_slots=1.5), dict(n_ctx=1), dict(n_ctx=-5),
                                dict(n_ctx="abc"), dict(n_ctx=64.5), dict(threads=-1), dict(threads="2"),
                                dict(threads=10**6), dict(max_batch=0), dict(max_batch=-1), dict(max_batch="8"),
                                dict(activations="x"), dict(kv_type="x")], ids=repr)
@pytest.mark.skipif("native" not in available_backends(), reason="the C core is not built (threads, kv_type)")
def test_load_arguments_of_the_wrong_type_or_range_are_llambda_errors(kw):
    with pytest.raises(InvalidInputError, match=next(iter(kw)) if next(iter(kw)) != "threads" else "thread"):
        llambda.load(TINY, backend="native", **kw)


def test_max_tokens_is_an_integer_count_of_any_integer_type_but_bool(model):
    p = prompt(model)
    assert list(model.generate(p, **{**SAMPLED, "max_tokens": np.int64(3)})) == list(model.generate(p, **SAMPLED))[:3]
    for bad in (True, 2.0, "3"):
        with pytest.raises(InvalidInputError, match="max_tokens"):
            model.complete(p, max_tokens=bad)
    with warnings.catch_warnings():
        warnings.simplefilter("error")      # np.uint8(0) - 1: "overflow encountered in scalar subtract"
        assert list(model.generate(p, speculative="lookup", **{**SAMPLED, "max_tokens": np.uint8(0)})) == []


@pytest.mark.parametrize("kv_type", ["x", 16])
def test_an_unknown_kv_type_is_refused_by_every_backend(kv_type):
    for backend in available_backends():
        with pytest.raises(InvalidInputError, match="kv_type"):
            llambda.load(TINY, backend=backend, n_ctx=64, kv_type=kv_type)


def test_load_counts_of_small_numpy_integer_types_do_not_overflow():
    # n_slots * n_ctx in np.int8/np.int16 arithmetic overflowed (NEP 50): a raw OverflowError
    with llambda.load(TINY, n_ctx=np.int16(250), n_slots=np.int8(3), max_batch=np.int16(512),
                      threads=np.int8(1)) as m, llambda.load(TINY, n_ctx=250, n_slots=3, max_batch=512, threads=1) as r:
        assert m.memory_plan.kv_cache == r.memory_plan.kv_cache
        assert m.memory_plan.activations == r.memory_plan.activations
        p = prompt(m, 100)
        assert list(m.generate(p, **SAMPLED)) == list(r.generate(p, **SAMPLED))


@pytest.mark.parametrize("what", [None, 5])
def test_load_of_something_that_is_not_a_name_or_path_is_a_llambda_error(what):
    with pytest.raises(InvalidInputError, match="name or a path"):
        llambda.load(what)


@pytest.mark.parametrize("name", ["a" * 5000, "/tmp/" + "b" * 300 + ".gguf"])
def test_a_name_too_long_for_the_file_system_is_not_found(name):
    from llambda.errors import ModelNotFoundError
    with pytest.raises(ModelNotFoundError):     # was a raw OSError (File name too long)
        llambda.load(name)


def test_activations_past_the_memory_are_refused_before_the_load():
    # the memory check left activations out: a huge max_batch was a raw MemoryError from NumPy
    from llambda.errors import InsufficientMemoryError
    from llambda.models import memory
    avail = memory.mem_available()
    if avail is None:
        pytest.skip("this platform does not say how much memory is available")
    sizes = []
    for max_batch in (1, 2):
        with llambda.load(TINY, n_ctx=64, max_batch=max_batch) as m:
            sizes.append(m.memory_plan.activations)
    per_token = sizes[1] - sizes[0]
    with pytest.raises(InsufficientMemoryError, match="activations"):
        llambda.load(TINY, n_ctx=64, max_batch=2 * avail // per_token + 2)


def test_draft_verification_fits_the_max_batch():
    # a verification forward feeds the last token and its drafts: with max_batch=2 the default of
    # 8 drafts was a raw ValueError ("batch of 9 tokens")
    p = [(7 * i + 3) % 512 for i in range(9)]
    with llambda.load(TINY, n_ctx=64) as plain:
        want = list(plain.generate(p, **SAMPLED))
    with llambda.load(TINY, n_ctx=64, max_batch=2, draft=TINY) as m:
        assert list(m.generate(p, speculative="draft", **SAMPLED)) == want
        assert list(m.generate(p, speculative="lookup", **SAMPLED)) == want
    with llambda.load(TINY, n_ctx=64, max_batch=1, draft=TINY) as m:
        assert list(m.generate(p, **SAMPLED)) == want       # "auto": plain decoding
        with pytest.raises(InvalidInputError, match="max_batch"):
            list(m.generate(p, speculative="draft", **SAMPLED))


def test_the_draft_models_own_calls_and_speculative_rounds_share_its_slot_safely():
    # the drafter and m.draft's own calls both use the draft's slot 0: after a speculative call,
    # m.draft.generate() reused keys/values of the other text (wrong tokens), and run at once
    # from two threads they computed in the same workspace
    import threading
    p, q = [(7 * i + 3) % 512 for i in range(9)], [(11 * i + 5) % 512 for i in range(13)]
    with llambda.load(TINY, n_ctx=64) as plain:
        want_p, want_q = list(plain.generate(p, **SAMPLED)), list(plain.generate(q, **SAMPLED))
    with llambda.load(TINY, n_ctx=64, draft=TINY) as m:
        assert list(m.draft.generate(q, **SAMPLED)) == want_q
        assert list(m.generate(p, speculative="draft", **SAMPLED)) == want_p
        assert list(m.draft.generate(q, **SAMPLED)) == want_q
        got = {"p": [], "q": []}

        def run(key, call):
            for _ in range(5):
                got[key].append(list(call()))

        threads = [threading.Thread(target=run, args=("p", lambda: m.generate(p, speculative="draft", **SAMPLED))),
                   threading.Thread(target=run, args=("q", lambda: m.draft.generate(q, **SAMPLED)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in threads)
        assert got == {"p": [want_p] * 5, "q": [want_q] * 5}


@pytest.mark.parametrize("ids", [None, 5], ids=repr)
def test_an_encoders_detokenize_of_non_ids_is_a_tokenizer_error(minilm_dir, ids):
    with llambda.load(minilm_dir) as m:
        with pytest.raises(TokenizerError):
            m.detokenize(ids)


@pytest.mark.parametrize("batch_size", [0, -1, "x", 2.5, None], ids=repr)
def test_an_encoders_batch_size_must_be_a_positive_integer(minilm_dir, batch_size):
    with llambda.load(minilm_dir) as m:
        for call in (lambda: m.embed(["a", "b"], batch_size=batch_size),
                     lambda: m.score("a query", ["a document"], batch_size=batch_size)):
            with pytest.raises(InvalidInputError, match="batch_size"):
                call()
        assert m.embed(["a", "b"], batch_size=np.int64(1)).shape == (2, m.config.hidden)


@pytest.mark.parametrize("draft", ["a/path", 5], ids=repr)
def test_set_draft_of_something_that_is_not_a_loaded_model_is_a_llambda_error(model, draft):
    with pytest.raises(InvalidInputError, match="set_draft"):
        model.set_draft(draft)     # was an AttributeError ('str' object has no attribute 'close')
    assert model.draft is None


def test_a_model_that_is_its_own_draft_generates_and_closes():
    p = [(7 * i + 3) % 512 for i in range(9)]
    with llambda.load(TINY, n_ctx=64) as plain:
        want = list(plain.generate(p, **SAMPLED))
    m = llambda.load(TINY, n_ctx=64)
    m.set_draft(m)
    assert list(m.generate(p, speculative="draft", **SAMPLED)) == want
    m.close()                      # closed its draft, itself, again and again: a RecursionError


def test_draft_threads_of_a_numpy_integer_type_are_accepted():
    with llambda.load(TINY, n_ctx=64, draft=TINY, draft_threads=np.int64(1)) as m:
        assert m.drafter.threads == 1
    with pytest.raises(InvalidInputError, match="draft_threads"):
        llambda.load(TINY, n_ctx=64, draft=TINY, draft_threads=np.bool_(True))


def test_a_cycle_of_drafts_is_refused():
    # m drafting with d and d with m: their rounds take the two models' locks in opposite orders
    with llambda.load(TINY, n_ctx=64) as m, llambda.load(TINY, n_ctx=64) as d:
        m.set_draft(d)
        with pytest.raises(InvalidInputError, match="cycle"):
            d.set_draft(m)
        assert d.draft is None and m.draft is d


def test_a_stream_can_be_closed_from_another_thread_while_it_computes(model):
    import threading
    import time
    p = prompt(model)
    want = list(model.generate(p, **SAMPLED))
    long = {**SAMPLED, "max_tokens": 100}
    s = model.stream(p, **long)
    got, started = [], threading.Event()

    def consume():
        started.set()
        for ev in s:
            got.append(ev)

    with model._lock:                 # the consumer's next() waits inside the generator for the model
        t = threading.Thread(target=consume, daemon=True)
        t.start()
        started.wait(10)
        time.sleep(0.2)
        s.close()                     # a generator raised ValueError: generator already executing
    t.join(timeout=30)
    assert not t.is_alive()
    assert len(got) <= 1              # the step under way, then the stream ended
    assert list(model.generate(p, **SAMPLED)) == want
    g = model.generate(p, **long)     # generate() too, closed from another thread between steps
    assert next(g) == want[0]
    t = threading.Thread(target=g.close)
    t.start()
    t.join(timeout=30)
    assert list(g) == []


def test_two_threads_may_consume_one_stream(model):
    import threading
    p = prompt(model)
    want = list(model.stream(p, **SAMPLED))
    s = model.stream(p, **SAMPLED)
    got, errors = [], []

    def consume():
        try:
            for ev in s:
                got.append(ev)
        except Exception as e:        # a second thread's next() raised ValueError: generator already executing
            errors.append(e)

    threads = [threading.Thread(target=consume, daemon=True) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors and not any(t.is_alive() for t in threads)
    assert sorted((e.token, e.text) for e in got) == sorted((e.token, e.text) for e in want)


@pytest.mark.skipif("native" not in available_backends(), reason="the C core is not built")
def test_a_model_without_batch_invariance_does_not_move_another_models_logits():
    # the C core's switch is process-wide: B's forwards set it off under A's ops (A's logits and
    # sampled text changed while B ran in another thread)
    import threading
    with llambda.load(TINY, n_ctx=128, backend="native") as a, llambda.load(TINY, n_ctx=128, backend="native") as b:
        b.backend.set_batch_invariant(False)
        pa, pb = prompt(a, 60), prompt(b, 100, 11)
        want_logits, want = a.logits(pa), list(a.generate(pa[:10], **SAMPLED))
        stop = threading.Event()

        def other():
            while not stop.is_set():
                b.logits(pb)
                list(b.generate(pb[:5], max_tokens=5))

        t = threading.Thread(target=other, daemon=True)
        t.start()
        try:
            for _ in range(30):
                np.testing.assert_array_equal(a.logits(pa), want_logits)
                assert list(a.generate(pa[:10], **SAMPLED)) == want
        finally:
            stop.set()
            t.join(timeout=60)


@pytest.mark.skipif("native" not in available_backends(), reason="the C core is not built")
def test_forwards_wanting_the_switch_set_otherwise_wait_for_each_other():
    import threading
    from llambda.backends.native import _SwitchGate
    gate, order = _SwitchGate(), []
    gate.enter(True)
    gate.enter(True)                       # the same setting: together

    def off():
        gate.enter(False)
        order.append("off")
        gate.exit()

    t = threading.Thread(target=off, daemon=True)
    t.start()
    t.join(timeout=0.3)
    assert t.is_alive() and not order      # waits while forwards wanting it on run
    gate.exit()
    order.append("on done")
    gate.exit()
    t.join(timeout=10)
    assert order == ["on done", "off"]
