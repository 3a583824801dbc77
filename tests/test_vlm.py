"""Images on the language model's side (Gemma 3): soft-token rows in place of the image tokens, each image's
block attended both ways, through the engine, the prefix caches, the scheduler and Model.chat, against the
tiny Gemma3ForConditionalGeneration of tests/fixtures/reference/tiny/gemma3_vision (transformers' logits).

The vision tower here is a test double backed by the fixture: it gives, for each fixture image's bytes,
transformers' own soft tokens (reference.json "images"), so what is tested is the language side alone
(llambda.vision's tower is tested against the same fixture in its own tests)."""
from __future__ import annotations

import asyncio
import hashlib
import json
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

import llambda
from llambda.backends import available_backends
from llambda.errors import ContextOverflowError, InvalidInputError
from llambda.models import images as image_mod
from llambda.models.images import BatchImages, image_block

FOLDER = Path(__file__).parent / "fixtures" / "reference" / "tiny" / "gemma3_vision"
REF = json.loads((FOLDER / "reference.json").read_text(encoding="utf-8"))
BOI, EOI, SOFT, PER = REF["config"]["boi_token_index"], REF["config"]["eoi_token_index"], \
    REF["config"]["image_token_index"], REF["config"]["mm_tokens_per_image"]
PNG = {name: (FOLDER / name).read_bytes() for name in REF["images"]}

# (backend, activations, budget of max |logit diff|): as tests/test_tiny_models.py's modes
MODES = {"numpy": ("numpy", None, 1e-4), "native-exact": ("native", "f32", 1e-4), "native-fast": ("native", "q8", 1e-2)}


class FixtureTower:
    """A VisionTower double: pixels() are the fixture's pixel values of an image (known by its bytes'
    digest), encode() maps each back to transformers' soft tokens of that image."""
    tokens_per_image, hidden = PER, REF["config"]["text_config"]["hidden_size"]

    def __init__(self):
        self.by_digest = {hashlib.sha256(b).hexdigest(): name for name, b in PNG.items()}
        self.encoded = 0
        self.closed = False

    @staticmethod
    def load_image(data: bytes):
        return hashlib.sha256(data).hexdigest()

    def pixels(self, image) -> np.ndarray:
        if image not in self.by_digest:
            raise InvalidInputError("the test tower knows only the fixture's images")
        return np.array(REF["images"][self.by_digest[image]]["pixel_values"], np.float32)

    def encode(self, pixels: np.ndarray) -> np.ndarray:
        out = []
        for p in pixels:
            name = next(n for n in REF["images"] if np.array_equal(p, np.array(REF["images"][n]["pixel_values"],
                                                                                  np.float32)))
            out.append(REF["images"][name]["soft_tokens"])
        self.encoded += len(pixels)
        return np.array(out, np.float32)

    def close(self):
        self.closed = True


def load(mode: str, folder=FOLDER, tower=True, **kw):
    backend, activations, _ = MODES[mode]
    if backend not in available_backends():
        pytest.skip(f"the {backend} backend is not available here (C core not built)")
    # the folder's own tower is not loaded: the double stands in for it, so this file tests the language side alone
    m = llambda.load(folder, backend=backend, activations=activations, **{"n_ctx": 128, "vision": False, **kw})
    if tower:
        m.attach_vision(FixtureTower(), load_image=FixtureTower.load_image)
    return m


def blocks_of(inp, names=None) -> tuple:
    ids = inp["input_ids"]
    starts = [i for i in range(1, len(ids)) if ids[i] == SOFT and ids[i - 1] == BOI]
    names = names or inp["images"]
    return tuple(image_block(s, REF["images"][n]["soft_tokens"]) for s, n in zip(starts, names))


def rows_logits(m, inp, blocks=None) -> np.ndarray:
    """Logits of every position of one input, in one forward (the blocks whole)."""
    ids, t = inp["input_ids"], m.transformer
    n = len(ids)
    b = BatchImages()
    b.add(0, blocks if blocks is not None else blocks_of(inp), 0, n)
    return t.forward(np.array(ids, np.int32), np.zeros(n, np.int32), np.arange(n, dtype=np.int32), list(range(n)),
                     out=np.empty((n, t.cfg.vocab_size), np.float32), images=b)


@pytest.mark.parametrize("mode", list(MODES))
def test_logits_argmax_and_greedy_match_transformers(mode):
    budget = MODES[mode][2]
    with load(mode) as m:
        assert m.accepts_images and m.vision is not None
        for k, inp in enumerate(REF["inputs"]):
            got = rows_logits(m, inp)
            err = float(np.abs(got[inp["rows"]] - np.array(inp["logits_rows"], np.float32)).max())
            assert err <= budget, f"input {k}: max |logit diff| {err:.3g} > {budget}"
            assert got.argmax(axis=1).tolist() == inp["argmax_per_position"], f"input {k}: argmax differs"
            # through the library's generation: prefill in chunks that never split a block, then decode
            greedy = list(m.generate(inp["input_ids"], images=blocks_of(inp), max_tokens=len(inp["greedy_new_tokens"]),
                                     temperature=0, ignore_eos=True))
            assert greedy == inp["greedy_new_tokens"], f"input {k}: greedy continuation differs"


def test_a_causal_only_attention_fails_the_fixture(monkeypatch):
    """Without each block's keys past a soft token's own position, the logits move by about the fixture's
    causal_only_max_abs_logit_diff: the tests above can fail."""
    monkeypatch.setattr(BatchImages, "kend", lambda self, pos: pos.astype(np.int32) + 1)
    with load("numpy") as m:
        for inp in REF["inputs"]:
            got = rows_logits(m, inp)[inp["rows"]]
            err = float(np.abs(got - np.array(inp["logits_rows"], np.float32)).max())
            assert err > 0.5 * inp["causal_only_max_abs_logit_diff"] > 1e-2


def test_each_image_sees_only_its_own_block():
    """The two-image input: the first block's logits do not change when the second image does (no token
    sees a later image), the second's do; and rows are the same whichever chunking computes them."""
    inp = REF["inputs"][1]
    with load("numpy") as m:
        base = rows_logits(m, inp)
        swapped = rows_logits(m, inp, blocks_of(inp, ["image_b.png", "image_b.png"]))
        first_end = blocks_of(inp)[0].end
        second = blocks_of(inp)[1].start
        np.testing.assert_array_equal(base[:second], swapped[:second])
        assert np.abs(base[second:] - swapped[second:]).max() > 1e-3
        del first_end


@pytest.mark.parametrize("max_batch", [18, 20, 33])
def test_prefill_chunks_never_split_a_block(max_batch):
    """A forward of max_batch tokens: chunks end before a block or are carried to its end, the logits are
    the same as in one forward."""
    inp = REF["inputs"][1]
    with load("numpy", max_batch=max_batch) as m:
        from llambda import engine
        seen = []
        forward = m.transformer.forward

        def spy(tokens, slots, pos, rows, out=None, images=None):
            seen.append((int(pos[0]), int(pos[-1]) + 1))
            return forward(tokens, slots, pos, rows, out, images)

        m.transformer.forward = spy
        got = engine.prefill(m.transformer, 0, inp["input_ids"], 0, blocks_of(inp))
        for b in blocks_of(inp):
            assert not any(b.start < e < b.end for _, e in seen), seen
        want = np.array(inp["logits_rows"][-1], np.float32)
        assert np.abs(got - want).max() < 1e-4


def test_a_block_wider_than_a_forward_is_refused_at_attach():
    with load("numpy", tower=False, max_batch=16) as m:
        with pytest.raises(InvalidInputError, match="max_batch"):
            m.attach_vision(FixtureTower(), load_image=FixtureTower.load_image)
        assert not m.accepts_images


@contextmanager
def prefill_starts():
    """The start of every engine.prefill call the library makes meanwhile."""
    calls = []
    prefill = llambda.engine.prefill

    def spy(model, slot, ids, start, images=()):
        calls.append(start)
        return prefill(model, slot, ids, start, images)

    llambda.api.engine.prefill = spy
    try:
        yield calls
    finally:
        llambda.api.engine.prefill = prefill


def test_library_prefix_reuse_tells_images_apart():
    """Slot 0's prefix is reused up to where the images differ: the same ids with another image give
    that image's answer (its logprobs' bits), the same image again reuses its block."""
    inp = REF["inputs"][0]

    def run(m, name):
        evs = m.stream(inp["input_ids"], images=blocks_of(inp, [name]), max_tokens=6, temperature=0,
                       ignore_eos=True, logprobs=3)
        return [(ev.token, ev.logprob, tuple(ev.top_logprobs)) for ev in evs]

    with load("native-exact") as fresh:
        want_b = run(fresh, "image_b.png")
    with load("native-exact") as m:
        a = run(m, "image_a.png")
        assert [t for t, _, _ in a][:6] == inp["greedy_new_tokens"][:6]
        b = run(m, "image_b.png")
        assert b == want_b and b != a
        with prefill_starts() as calls:
            again = run(m, "image_b.png")
        assert again == want_b
        assert min(calls) >= blocks_of(inp)[0].end, f"the same image's block was computed again: {calls}"


# --- the scheduler: batch invariance, the prefix cache ------------------------------------------

def scheduler_run(m, rounds, prefill_chunk):
    """Run rounds of sequences (ids, blocks, max tokens) through one Scheduler on `m`, a round once the
    last has ended; per round, per job (its (token, logprob, top) events, its prompt tokens reused)."""
    from llambda.engine import GenerationParams, Sequence
    from llambda.sampling import SamplingParams
    from llambda.server.metrics import Metrics
    from llambda.server.scheduler import Channel, Job, Scheduler

    sched = Scheduler(m.transformer, Metrics(), prefill_chunk=prefill_chunk)
    sched.start()

    async def one(jobs_spec):
        ch = Channel()
        jobs = []
        for k, (ids, blocks, n) in enumerate(jobs_spec):
            sp = SamplingParams(temperature=0, logprobs=3)
            seq = Sequence(None, ids, GenerationParams(max_tokens=n, sampling=sp, ignore_eos=True), slot=-1,
                           n_ctx=m.n_ctx, images=blocks)
            jobs.append(Job(seq, ch, k))
        sched.submit(jobs)
        out = {k: [] for k in range(len(jobs))}
        done = set()
        while len(done) < len(jobs):
            for idx, ev in await asyncio.wait_for(ch.get(), 60):
                assert not hasattr(ev, "status"), ev
                if ev.token >= 0:
                    out[idx].append((ev.token, ev.logprob, tuple(ev.top_logprobs)))
                if ev.finish_reason:
                    done.add(idx)
        while not sched.idle():
            await asyncio.sleep(0.005)
        return [(out[k], jobs[k].n_cached) for k in range(len(jobs))]

    try:
        return [asyncio.run(one(r)) for r in rounds]
    finally:
        sched.stop()


def test_scheduler_batch_invariance_with_images():
    """An image request alone, and batched with text requests under other prefill chunk sizes: the same
    tokens and the same logprob bits (the server's batch-invariant schedule)."""
    inp = REF["inputs"][1]
    rng = np.random.default_rng(5)
    texts = [rng.integers(3, 500, size=n).tolist() for n in (23, 9)]
    with load("native-exact", n_slots=4, max_batch=64) as m:
        alone = scheduler_run(m, [[(inp["input_ids"], blocks_of(inp), 8)]], prefill_chunk=256)[0][0][0]
        assert [t for t, _, _ in alone] == inp["greedy_new_tokens"]
        for chunk in (5, 17):
            runs = scheduler_run(m, [[(texts[0], (), 8), (inp["input_ids"], blocks_of(inp), 8), (texts[1], (), 8)]],
                                 prefill_chunk=chunk)[0]
            assert runs[1][0] == alone, f"prefill_chunk {chunk}: the image request changed beside text requests"


def test_scheduler_prefix_cache_tells_two_images_apart():
    inp = REF["inputs"][0]
    ids = inp["input_ids"]
    with load("native-exact", n_slots=2, max_batch=64) as m:
        want_b = scheduler_run(m, [[(ids, blocks_of(inp, ["image_b.png"]), 6)]], 256)[0][0][0]
    with load("native-exact", n_slots=1, max_batch=64) as m:
        rounds = scheduler_run(m, [[(ids, blocks_of(inp, [name]), 6)] for name in
                                   ("image_a.png", "image_b.png", "image_b.png")], 256)
        (a, _), (b, cached_b), (b2, cached_b2) = (r[0] for r in rounds)
        assert [t for t, _, _ in a] == inp["greedy_new_tokens"][:6]
        assert b == want_b and b != a
        block = blocks_of(inp)[0]
        assert cached_b <= block.start, "another image's keys and values were reused"
        assert b2 == want_b and cached_b2 >= block.end, "the same image's block was not reused"


def test_slot_table_matches_images_by_identity():
    from llambda.server.prefix_cache import SlotTable
    inp = REF["inputs"][0]
    ids = inp["input_ids"]
    a, b = blocks_of(inp), blocks_of(inp, ["image_b.png"])
    t = SlotTable(2, min_reuse=1)
    t.acquire(0, list(ids), len(ids) - 1, a)
    t.release(0)
    assert t.place(ids, images=b).reuse == a[0].start
    assert t.place(ids, images=a).reuse == len(ids) - 1
    assert t.place(ids, images=()).reuse == a[0].start
    assert t.place(ids, images=blocks_of(inp)).reuse == len(ids) - 1    # equal rows: the same image


# --- chat: templates, limits, errors --------------------------------------------------------------

TEMPLATE = ("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' "
            "else m['role'] }}\n{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for item in "
            "m['content'] %}{% if item['type'] == 'image' %}<start_of_image>{% elif item['type'] == 'text' %}"
            "{{ item['text'] }}{% endif %}{% endfor %}{% endif %}<end_of_turn>\n{% endfor %}"
            "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
PLAIN = ("{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}"
         "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
DROPS = TEMPLATE.replace("<start_of_image>{% elif", "{% elif")


def folder_with_tokenizer(dest: Path, template: str) -> Path:
    """The fixture folder with a byte-level tokenizer (one token per byte, no merges) over its 512 ids: the
    image tokens at the config's ids, and the chat template."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    dest.mkdir()
    for name in ("config.json", "model.safetensors", "generation_config.json", "preprocessor_config.json"):
        (dest / name).symlink_to(FOLDER / name)
    special = {0: "<pad>", 1: "<eos>", 2: "<bos>", 3: "<start_of_turn>", 4: "<end_of_turn>",
               BOI: "<start_of_image>", EOI: "<end_of_image>", SOFT: "<image_soft_token>"}
    vocab = {text: i for i, text in special.items()}
    for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet())):
        vocab[ch] = 10 + i
    for i in range(512):
        if i not in vocab.values():
            vocab[f"<unused{i}>"] = i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special.values()])
    tok.save(str(dest / "tokenizer.json"))
    (dest / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "add_bos_token": True,
         "chat_template": template}), encoding="utf-8")
    return dest


def user(*parts):
    return [{"role": "user", "content": [({"type": "image", "image": p} if isinstance(p, bytes) else
                                          {"type": "text", "text": p}) for p in parts]}]


@pytest.fixture(scope="module")
def chat_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("vlm")
    return {name: folder_with_tokenizer(root / name, t) for name, t in
            (("gemma", TEMPLATE), ("plain", PLAIN), ("drops", DROPS))}


@pytest.mark.parametrize("kind", ["gemma", "plain"])
def test_chat_with_an_image_is_the_expanded_prompt(chat_dirs, kind):
    """The image part renders as the template writes it (Gemma's) or as <start_of_image> in its place (a
    template that reads no parts), then expands as the processor does: "\\n\\n", begin, 16 soft, end,
    "\\n\\n"; the reply is the generation over those ids and the tower's rows."""
    with load("native-exact", chat_dirs[kind]) as m:
        msgs = user("Look:", PNG["image_a.png"], "what is it?")
        text = m.render_chat(msgs)
        assert text.count("<start_of_image>") == 1 and "Look:" in text
        ids, blocks = m.image_prompt(text, [PNG["image_a.png"]])
        b = blocks[0]
        assert ids[b.start - 1] == BOI and ids[b.end] == EOI and ids[b.start:b.end] == [SOFT] * PER
        nl = m.tokenize("\n\n", parse_special=False)
        assert ids[b.start - 1 - len(nl):b.start - 1] == nl and ids[b.end + 1:b.end + 1 + len(nl)] == nl
        np.testing.assert_array_equal(b.rows, np.array(REF["images"]["image_a.png"]["soft_tokens"], np.float32))
        kw = dict(max_tokens=8, temperature=0, ignore_eos=True)
        want = "".join(ev.text for ev in m.stream(ids, images=blocks, **kw))
        events = list(m.chat_stream(msgs, **kw))
        assert "".join(ev.text for ev in events) == want and len(events) >= 8
        assert m.chat(msgs, **kw) == want


def test_chat_stop_strings_and_json_schema_with_an_image(chat_dirs):
    pytest.importorskip("llguidance")
    with load("native-exact", chat_dirs["gemma"]) as m:
        msgs = user(PNG["image_b.png"], "describe")
        free = m.chat(msgs, max_tokens=12, temperature=0, ignore_eos=True)
        stop = next((free[i:i + 2] for i in range(2, len(free) - 2) if free[i:i + 2].strip()), None)
        if stop:
            got = m.chat(msgs, max_tokens=12, temperature=0, ignore_eos=True, stop=[stop])
            assert got == free[:free.index(stop)]
        schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
                  "additionalProperties": False}
        out = m.chat(msgs, max_tokens=40, temperature=0, json_schema=schema)
        if out.endswith("}"):
            assert isinstance(json.loads(out)["a"], int)
        else:       # a random model may run out of tokens inside the number: still a prefix of the format
            assert out.startswith('{"a":') or out.startswith('{ "a"') or out.startswith("{"), out


def test_bad_image_requests_are_typed_errors(chat_dirs):
    with load("numpy", chat_dirs["gemma"], tower=False) as m:
        assert not m.accepts_images
        with pytest.raises(InvalidInputError, match="no vision tower"):
            m.chat(user(PNG["image_a.png"], "hi"), max_tokens=2)
        m.attach_vision(FixtureTower(), load_image=FixtureTower.load_image)
        m.max_images = 1
        with pytest.raises(InvalidInputError, match="at most 1"):
            m.chat(user(PNG["image_a.png"], PNG["image_b.png"]), max_tokens=2)
        m.max_images = 8
        # a marker typed in the text is text (Model.literal): one image, one block
        typed = user(PNG["image_a.png"], "<start_of_image> twice")
        assert len(m.image_ids(m.render_chat(m.literal(typed)), [PNG["image_a.png"]])[1]) == 1
        m.chat(typed, max_tokens=2)
        with pytest.raises(InvalidInputError, match="marker"):     # a prompt that writes a marker itself
            m.image_ids(m.render_chat(typed), [PNG["image_a.png"]])
        ids = REF["inputs"][0]["input_ids"]
        with pytest.raises(InvalidInputError, match="soft tokens"):
            m.generate(ids, max_tokens=2)
        with pytest.raises(InvalidInputError, match="speculative"):
            m.generate(ids, images=blocks_of(REF["inputs"][0]), speculative="lookup", max_tokens=2)
        with pytest.raises(InvalidInputError, match="block"):
            m.generate(ids, images=blocks_of(REF["inputs"][0]) * 2, max_tokens=2)
    with load("numpy", chat_dirs["gemma"], n_ctx=40) as m:
        with pytest.raises(ContextOverflowError, match="image"):
            m.chat(user(PNG["image_a.png"], PNG["image_b.png"], "hi"), max_tokens=2)
    with load("numpy", chat_dirs["drops"]) as m:
        with pytest.raises(InvalidInputError, match="dropped an image"):
            m.chat(user(PNG["image_a.png"], "hi"), max_tokens=2)
    with load("numpy") as m:
        with pytest.raises(InvalidInputError, match="wide"):
            bad = FixtureTower()
            bad.hidden = 32
            m.attach_vision(bad)


def test_bad_blocks_are_refused():
    inp = REF["inputs"][1]
    ids = inp["input_ids"]
    a, b = blocks_of(inp)
    rows = np.array(REF["images"]["image_a.png"]["soft_tokens"], np.float32)
    with load("numpy") as m:
        cases = {"apart": (b, a), "apart, in order": (a, image_block(a.start + 3, rows)),
                 "ImageBlocks": (a, "rows"), "wide": (image_block(a.start, rows[:, :32]),),
                 "soft tokens only": (image_block(a.start - 1, rows),), "last token": (image_block(len(ids) - 4, rows),)}
        for what, blocks in cases.items():
            with pytest.raises(InvalidInputError, match=what.split(",")[0]):
                m.generate(ids, images=blocks, max_tokens=1)
        with pytest.raises(InvalidInputError, match="NaN"):
            image_block(a.start, np.full_like(rows, np.nan))

        class Wrong(FixtureTower):
            def encode(self, pixels):
                return super().encode(pixels)[:, :8]

        m.attach_vision(Wrong(), load_image=FixtureTower.load_image)
        with pytest.raises(llambda.errors.ModelFormatError, match="shape"):
            m.encode_images([PNG["image_a.png"]], [3])


def test_an_image_sent_again_is_not_encoded_again(chat_dirs):
    """A conversation sends its images with every turn: the tower runs once for each file (EncodedRows),
    once for a file sent twice in one request, and again under another tower."""
    a, b = PNG["image_a.png"], PNG["image_b.png"]
    with load("numpy", chat_dirs["gemma"]) as m:
        tower = m.vision
        first = m.encode_images([a], [3])
        assert tower.encoded == 1
        again = m.encode_images([b, a, b], [3, 300, 600])
        assert tower.encoded == 2 and [x.start for x in again] == [3, 300, 600]
        assert again[1].rows is first[0].rows and again[1].digest == first[0].digest
        assert again[0].digest == again[2].digest != first[0].digest
        msgs = user(a, "what is it?")
        m.chat(msgs, max_tokens=2, temperature=0)
        m.chat(msgs, max_tokens=2, temperature=0)
        assert tower.encoded == 2
        m.attach_vision(FixtureTower(), load_image=FixtureTower.load_image)
        m.encode_images([a], [3])
        assert m.vision.encoded == 1 and tower.closed


def test_encoded_rows_keep_the_latest_used():
    rows = np.ones((4, 8), np.float32)       # 128 bytes a block
    kept = image_mod.EncodedRows(max_bytes=300)
    for key in (b"a", b"b"):
        kept.put(key, image_block(0, rows))
    assert kept.get(b"a").at(5).start == 5          # a used last: b goes first
    kept.put(b"c", image_block(0, rows))
    assert len(kept) == 2 and kept.get(b"b") is None and kept.get(b"a") is not None
    kept.put(b"big", image_block(0, np.ones((100, 8), np.float32)))     # past the bound alone: not kept
    assert kept.get(b"big") is None and len(kept) == 2
    kept.clear()
    assert len(kept) == 0


def test_close_closes_the_tower():
    m = load("numpy")
    tower = m.vision
    m.close()
    assert tower.closed and m.vision is None
    with pytest.raises(llambda.errors.ModelClosedError):
        m.chat(user(PNG["image_a.png"], "hi"), max_tokens=2)


def test_image_tokens_from_a_vocabulary(chat_dirs):
    """Without the config's indexes (a GGUF file) the vocabulary names them."""
    with load("numpy", chat_dirs["gemma"], tower=False) as m:
        got = image_mod.image_tokens(None, m.tokenizer, m.config.vocab_size)
        assert (got.begin, got.end, got.soft) == (BOI, EOI, SOFT)
        assert image_mod.image_tokens(None, None, 512) is None
        # a soft token past the embedding table is held as 0 (transformers looks it up as 0)
        assert image_mod.image_tokens({"boi_token_index": 1, "eoi_token_index": 2, "image_token_index": 900},
                                      None, 512).soft == 0



# --- the server's generation path ---------------------------------------------------------------

def service_for(m):
    from llambda.server.config import ServerConfig
    from llambda.server.generation import Service
    from llambda.server.metrics import Metrics
    from llambda.server.scheduler import Scheduler

    sched = Scheduler(m.transformer, Metrics(), n_slots=1)
    return Service(m, sched, ServerConfig(model_id="tiny-vision", prompt_workers=1)), sched


def chat_spec(messages, **body):
    from dataclasses import replace

    from llambda.server.schemas import parse_chat
    spec = parse_chat({"messages": [{"role": "user", "content": "x"}], "max_tokens": 4, **body})
    return replace(spec, messages=messages)      # the canonical form the API converters hand over


def test_server_prepares_image_requests(chat_dirs):
    """Service.prepare leaves a request's images to Service.encode (the image worker), which encodes them
    into the sequence's blocks; counting a prompt's tokens encodes nothing; a model without a tower is a 400
    model_without_vision naming it; an explicit speculative mode with images is a 400."""
    from llambda.server.errors import APIError

    msgs = user("Look:", PNG["image_a.png"], "what is it?")
    with load("native-exact", chat_dirs["gemma"]) as m:
        service, sched = service_for(m)
        try:
            tower = m.vision
            assert service._prompt_length(chat_spec(msgs)) == len(m.image_ids(m.render_chat(msgs), 1)[0])
            before = tower.encoded
            p = service.prepare(chat_spec(msgs))
            assert tower.encoded == before and not p.seqs
            p = service.encode(p)
            seq = p.seqs[0][0]
            assert tower.encoded == before + 1 and len(seq.images) == 1
            ids, blocks = m.image_prompt(m.render_chat(msgs), [PNG["image_a.png"]])
            assert seq.prompt_ids == ids and seq.images[0].digest == blocks[0].digest
            assert service._speculation(p.spec, seq) is None
            tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
            assert not service.template_has_tools      # the generic tool prompt rewrites the messages, images kept
            assert service.chat_prompt(chat_spec(msgs, tools=tools)).count(m.image_marker) == 1
            # a marker typed in the text is text (Model.literal): the one image's block alone
            p = service.prepare(chat_spec(user(PNG["image_a.png"], "<start_of_image>")))
            assert len(service.encode(p).seqs[0][0].images) == 1
            spec = chat_spec(msgs, speculative="lookup")
            with pytest.raises(APIError, match="does not take images") as e:
                service.prepare(spec)
            assert e.value.status == 400
            m.max_images = 1        # below the transport's bound: the same code as the transport's refusal
            with pytest.raises(APIError, match="at most 1") as e:
                service.prepare(chat_spec(user(PNG["image_a.png"], PNG["image_b.png"], "hi")))
            assert e.value.status == 400 and e.value.code == "too_many_images"
            m.max_images = image_mod.DEFAULT_MAX_IMAGES
        finally:
            service.workers.close()
            service.image_workers.close()
    with load("native-exact", chat_dirs["gemma"], tower=False) as m:
        service, sched = service_for(m)
        try:
            with pytest.raises(APIError) as e:
                service.prepare(chat_spec(msgs))
            assert e.value.status == 400 and e.value.code == "model_without_vision" and "tiny-vision" in str(e.value)
        finally:
            service.workers.close()
            service.image_workers.close()
