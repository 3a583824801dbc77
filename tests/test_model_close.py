"""Model.close(): the model's memory is freed at once, and every later call is a ModelClosedError."""
import json
import subprocess
import sys
import threading
import weakref
from pathlib import Path

import pytest

import llambda
from llambda.backends import available_backends
from llambda.errors import ModelClosedError

TINY = Path(__file__).parent / "fixtures" / "reference" / "tiny" / "llama"
LONG = dict(max_tokens=100, temperature=1.0, seed=3, ignore_eos=True)
PROMPT = [(7 * i + 3) % 512 for i in range(9)]


def _memory_holders(m) -> list:
    """The objects holding a decoder's big memory: the KV cache and activations' arena, weight matrices, and the
    packed weights' mappings (native)."""
    t = m.transformer
    out = [m.backend.arena, t.layers[0].wq, t.layers[-1].w_down, t.tok_embd]
    return out + [mp.mm for mp in getattr(getattr(m.backend, "_weights", None), "_maps", [])]


@pytest.mark.parametrize("backend", available_backends())
@pytest.mark.parametrize("speculative", [None, "lookup"])
def test_close_frees_the_memory_while_the_model_and_a_stream_live_on(backend, speculative):
    """close() only closed the backend (a no-op) and the files: the weights, cache and plans lived as long as
    the Model object did, or a suspended generation holding it."""
    m = llambda.load(TINY, backend=backend, n_ctx=64)
    s = m.stream(PROMPT, speculative=speculative, **LONG)
    next(s)                                     # suspended mid-stream: it holds the model
    refs = [weakref.ref(h) for h in _memory_holders(m)]
    m.close()
    assert [r() for r in refs] == [None] * len(refs)
    with pytest.raises(ModelClosedError, match="closed"):
        next(s)
    with pytest.raises(ModelClosedError):
        m.transformer.forward([1], [0], [0], [0])      # the network itself: typed, never a freed array


def test_every_call_on_a_closed_model_is_a_model_closed_error():
    with llambda.load(TINY, n_ctx=64) as m:
        assert len(list(m.generate(PROMPT, max_tokens=3, temperature=0))) == 3
    m.close()                                   # twice (the with block closed it): nothing
    calls = {"complete": lambda: m.complete(PROMPT), "stream": lambda: m.stream(PROMPT),
             "generate": lambda: list(m.generate(PROMPT)), "logits": lambda: m.logits(PROMPT),
             "embed": lambda: m.embed([PROMPT]), "chat": lambda: m.chat([{"role": "user", "content": "hi"}]),
             "tokenize": lambda: m.tokenize("hi"), "detokenize": lambda: m.detokenize([1]),
             "memory_report": m.memory_report, "set_draft": lambda: m.set_draft(None)}
    for name, call in calls.items():
        with pytest.raises(ModelClosedError, match="was closed"):
            call()
        assert name


def test_close_waits_for_the_step_under_way_then_the_generation_ends_typed():
    """A close() from another thread while a token is computed: that token is delivered, the arrays go only
    after it, and the generation's next step raises ModelClosedError (never a crash in freed memory)."""
    m = llambda.load(TINY, n_ctx=128)
    forward, entered, proceed = m.transformer.forward, threading.Event(), threading.Event()
    steps = []

    def held_forward(*a, **kw):
        if len(steps) == 2:     # the second token's forward (the prompt took two) waits inside the model's lock
            entered.set()
            assert proceed.wait(60)
        out = forward(*a, **kw)
        steps.append(len(steps))
        return out

    m.transformer.forward = held_forward
    got, errors = [], []

    def consume():
        try:
            for ev in m.stream(PROMPT, **LONG):
                got.append(ev)
        except Exception as e:
            errors.append(e)

    consumer = threading.Thread(target=consume)
    consumer.start()
    assert entered.wait(60)
    closer = threading.Thread(target=m.close)
    closer.start()
    closer.join(0.5)
    assert closer.is_alive()                    # close() waits for the step under way
    proceed.set()
    closer.join(60)
    consumer.join(60)
    assert not closer.is_alive() and not consumer.is_alive()
    assert (len(got), len(steps)) == (2, 3)     # the token under way was delivered, then no other
    assert [type(e) for e in errors] == [ModelClosedError]


def test_a_draft_closed_under_its_target_is_a_model_closed_error():
    with llambda.load(TINY, n_ctx=64, draft=TINY) as m:
        draft = m.draft
        draft.close()
        with pytest.raises(ModelClosedError, match="draft model was closed"):
            list(m.generate(PROMPT, speculative="draft", **LONG))
        m.set_draft(None)
        assert len(list(m.generate(PROMPT, **dict(LONG, max_tokens=20)))) == 20
    with llambda.load(TINY, n_ctx=64, draft=TINY) as m:
        draft = m.draft
    with pytest.raises(ModelClosedError):       # closing the target closed its draft
        draft.logits(PROMPT)


def test_an_encoders_close_frees_it_and_later_calls_are_typed(minilm_dir):
    e = llambda.load(minilm_dir)
    assert e.embed(["a"]).shape == (1, e.config.hidden)
    enc = e.encoder
    refs = [weakref.ref(a) for a in (enc.word, enc.pos)]
    refs += [weakref.ref(mp.mm) for mp in getattr(getattr(e.backend, "_weights", None), "_maps", [])]
    del enc
    e.close()
    assert [r() for r in refs] == [None] * len(refs)
    for call in (lambda: e.embed(["a"]), lambda: e.tokenize("a"), e.memory_report):
        with pytest.raises(ModelClosedError):
            call()


_RSS_PROBE = """
import json, sys, llambda
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
m = llambda.load(sys.argv[1], threads=1, n_ctx=256)
m.complete("Hello", max_tokens=8, temperature=0)
loaded = rss()
m.close()
print(json.dumps({"weights": m.memory_plan.weights, "loaded": loaded, "closed": rss()}))
"""


def test_close_gives_the_weights_memory_back_to_the_system(smollm2_gguf):
    """Resident set before and after close(), the Model object still alive: the packed weights leave it."""
    res = subprocess.run([sys.executable, "-c", _RSS_PROBE, str(smollm2_gguf)], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    r = json.loads(res.stdout.strip().splitlines()[-1])
    assert r["loaded"] - r["closed"] >= 0.9 * r["weights"], r
