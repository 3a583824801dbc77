"""Images on the language model's side, Qwen3-VL: Qwen2-VL's layout and M-RoPE positions, Qwen3's text model
(q/k norms) with INTERLEAVED M-RoPE sections (pair i turns by the height position when i % 3 == 1, by the width
one when i % 3 == 2, within 3 x their section's count; else by the temporal one) and DeepStack (an image's rows
are [tokens, d * (1 + levels)]: the embeddings, then level j's columns, added to the image tokens' hidden states
after decoder layer j).

The first part runs a small random Qwen3-VL checkpoint written here (transformers 5's layout: a nested
text_config, model.language_model.* names, a vision_config naming two DeepStack levels) with a tower double
giving wide rows, checking the engine against itself (one forward = chunks cutting the images = decode steps;
text-only = plain Qwen3; the scheduler beside text requests) and the typed errors of bad configs, towers and
rows. The second part checks the whole language side against transformers' tiny Qwen3VLForConditionalGeneration
(tests/fixtures/reference/tiny/qwen3_vl_vision, tools/make_tiny_qwen3vl.py)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import llambda
from llambda.backends.base import pair_sections
from llambda.errors import InvalidInputError, LlambdaError, ModelFormatError
from llambda.models import images as image_mod
from llambda.models.images import BatchImages, QwenTokens, image_block, rope_rows

import test_vlm as vlm  # noqa: E402  (the scheduler helpers)
import test_vlm_qwen25vl as q25  # noqa: E402  (its tower double and images)

START, PAD, END, VIDEO = 290, 291, 292, 293
WIDTH, LEVELS, LAYERS = 64, 2, 3
MODES = q25.MODES


def _random_checkpoint(dest: Path, model_type: str = "qwen3_vl", seed: int = 0, levels: int = LEVELS,
                       rope: dict | None = None) -> Path:
    """A small random checkpoint: Qwen3-VL's layout (nested text_config, interleaved M-RoPE sections [2, 3, 3] of
    head_dim 16, `levels` DeepStack levels) or, model_type "qwen3", the same weights as a plain Qwen3."""
    from llambda.formats.safetensors import write_safetensors
    rng = np.random.default_rng(seed)
    dest.mkdir(parents=True, exist_ok=True)
    text = dict(hidden_size=WIDTH, intermediate_size=96, num_hidden_layers=LAYERS, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, vocab_size=300, rms_norm_eps=1e-6, max_position_embeddings=512,
                tie_word_embeddings=False, hidden_act="silu")
    vl = model_type != "qwen3"
    rope = rope or {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 3, 3], "mrope_interleaved": True}
    tokens = dict(image_token_id=PAD, vision_start_token_id=START, vision_end_token_id=END, video_token_id=VIDEO)
    vision = dict(depth=3, hidden_size=8, out_hidden_size=WIDTH, deepstack_visual_indexes=list(range(levels)))
    cfg = dict(tokens, architectures=["Qwen3VLForConditionalGeneration"], model_type=model_type, vision_config=vision,
               text_config=dict(text, model_type=f"{model_type}_text", rope_parameters=rope), tie_word_embeddings=False)
    if not vl:
        cfg = dict(text, architectures=["Qwen3ForCausalLM"], model_type="qwen3", rope_theta=1e4)
    pre = "model.language_model." if vl else "model."
    (dest / "config.json").write_text(json.dumps(cfg))

    def w(*shape):
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    t = {pre + "embed_tokens.weight": w(300, WIDTH), pre + "norm.weight": 1 + w(WIDTH), "lm_head.weight": w(300, WIDTH)}
    leaves = {"input_layernorm": (WIDTH,), "post_attention_layernorm": (WIDTH,), "self_attn.q_norm": (16,),
              "self_attn.k_norm": (16,), "self_attn.q_proj": (64, WIDTH), "self_attn.k_proj": (32, WIDTH),
              "self_attn.v_proj": (32, WIDTH), "self_attn.o_proj": (WIDTH, 64), "mlp.gate_proj": (96, WIDTH),
              "mlp.up_proj": (96, WIDTH), "mlp.down_proj": (WIDTH, 96)}
    for i in range(LAYERS):         # norms near 1, matrices small
        t.update({f"{pre}layers.{i}.{leaf}.weight": w(*shape) + (len(shape) == 1) for leaf, shape in leaves.items()})
    tower = {"model.visual.blocks.0.attn.qkv.weight": w(24, 8)} if vl else {}     # not the decoder's: llambda.vision's
    write_safetensors(dest / "model.safetensors", {**t, **tower})
    return dest


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """(the Qwen3-VL checkpoint, the same weights as a plain Qwen3)"""
    root = tmp_path_factory.mktemp("qwen3vl")
    return tuple(_random_checkpoint(root / kind, kind) for kind in ("qwen3_vl", "qwen3"))


class WideTower(q25.GridTower):
    """test_vlm_qwen25vl's tower double (grid from the size, 28 pixels a merged token) as the contract's qwen3_vl
    family: encode_one's rows [n, d * (1 + deepstack)], the embeddings then each DeepStack level's columns."""
    family, deepstack = "qwen3_vl", LEVELS

    def encode_one(self, pixels: np.ndarray, grid: tuple) -> np.ndarray:
        self.encoded += 1
        n = len(pixels) // 4
        assert grid[0] * grid[1] == n
        rng = np.random.default_rng(int(pixels[0, 0]))
        return rng.standard_normal((n, WIDTH * (1 + self.deepstack))).astype(np.float32)


def load(folder, mode="native-exact", tower=True, **kw):
    """The checkpoint with a tower double attached (`tower`: True for WideTower, or a double's class)."""
    return q25.load(folder, mode, WideTower if tower is True else tower, **kw)


# test_vlm_qwen25vl's: `text <image> text <image> text` as ids (the same START, PAD, END) and its blocks; every
# position's logits in one forward (RoPE rows from rope_rows); every position's logits of a text prompt
prompt_ids, whole_logits, rows_of = q25.prompt_ids, q25.whole_logits, q25.vlm_rows


def stream(m, ids, blocks, n=6):
    return [(e.token, e.logprob) for e in m.stream(ids, images=blocks, max_tokens=n, temperature=0, ignore_eos=True,
                                                   logprobs=1) if e.token >= 0]


def test_interleaved_pair_sections():
    """transformers' recomposition: H at i % 3 == 1 below 3 x sections[1], W at i % 3 == 2 below 3 x sections[2],
    the rest T; [24, 20, 20] of a 128-wide head, and the tiny [2, 3, 3] whose width takes 2 pairs of 8."""
    got = pair_sections([24, 20, 20], 64, True)
    assert [int((got == s).sum()) for s in range(3)] == [24, 20, 20]
    assert got[:6].tolist() == [0, 1, 2, 0, 1, 2] and got[60:].tolist() == [0, 0, 0, 0]
    assert pair_sections([2, 3, 3], 8, True).tolist() == [0, 1, 2, 0, 1, 2, 0, 1]
    assert pair_sections([2, 3, 3], 8, False).tolist() == [0, 0, 1, 1, 1, 2, 2, 2]


def _llama_cpp_imrope(sections, half: int) -> list:
    """llama.cpp's IMROPE rule (ggml's rope, as its public source reads): pair i to section i % 3 when i is below
    3 x that section's count, else to a fourth position (3; all 0 for a text token there)."""
    return [i % 3 if i < 3 * sections[i % 3] else 3 for i in range(half)]


def test_where_llama_cpps_interleaved_sections_differ_from_transformers():
    """Pairs past 3 x their section's count turn by llama.cpp's fourth position (0 for text) but by the temporal one
    in transformers (and here): pair 6 of the tiny [2, 3, 3], and pairs 61 and 62 of the released [24, 20, 20]
    (two of the three slowest at theta 5e6: 5e6 ** (-122 / 128) = 4.1e-7 rad a token, 0.11 rad at position
    262144; so llama.cpp's logits on a released Qwen3-VL differ from transformers' there, ours do not)."""
    for sections, half, pairs in (([2, 3, 3], 8, [6]), ([24, 20, 20], 64, [61, 62]), ([3, 3, 2], 8, [])):
        ours, theirs = pair_sections(sections, half, True).tolist(), _llama_cpp_imrope(sections, half)
        assert [i for i in range(half) if ours[i] != theirs[i]] == pairs, sections
        assert all(theirs[i] == 3 and ours[i] == 0 for i in pairs)


def test_the_checkpoint_loads_as_qwen3vl_and_its_layout_is_found(ckpt):
    with load(ckpt[0]) as m:
        c = m.config
        assert (c.arch, c.rope_sections, c.rope_interleaved, c.deepstack_levels, c.qk_norm) == \
            ("qwen3vl", [2, 3, 3], True, LEVELS, True)
        lay = m.image_input.layout
        assert isinstance(lay, QwenTokens) and (lay.start, lay.soft, lay.end, lay.family) == (START, PAD, END, "qwen3_vl")
        assert m.image_marker == "<|vision_start|><|image_pad|><|vision_end|>" and m.image_block_tokens == 0
        ids, blocks = prompt_ids(m)
        assert [b.grid for b in blocks] == [(2, 3), (3, 1)]
        assert all(b.causal and b.rows.shape[1] == WIDTH * (1 + LEVELS) for b in blocks)
        assert m.transformer.image_width == WIDTH * 3


@pytest.mark.parametrize("mode", list(MODES))
def test_text_only_is_plain_qwen3(ckpt, mode):
    """Equal positions in every section: interleaved M-RoPE is Qwen3's RoPE; the same weights as a qwen3 checkpoint
    give the same logits bit for bit, and the same greedy tokens."""
    ids = [5, 9, 33, 2, 17, 101, 250, 3, 8]
    with load(ckpt[0], mode, tower=False) as vl, load(ckpt[1], mode, tower=False) as plain:
        assert plain.config.rope_sections == [] and plain.config.arch == "qwen3"
        assert np.array_equal(rows_of(vl, ids), rows_of(plain, ids))
        kw = dict(max_tokens=6, temperature=0, ignore_eos=True, logprobs=2)
        assert [(e.token, e.logprob) for e in vl.stream(ids, **kw)] == \
            [(e.token, e.logprob) for e in plain.stream(ids, **kw)]


def test_deepstack_columns_count_and_zero_levels_add_nothing(ckpt):
    """The levels' columns change the logits at and after the images; zero columns give the logits of the
    embeddings alone with no levels (nothing else is added); and a level's columns matter only after the image."""
    with load(ckpt[0], "numpy") as m:
        ids, blocks = prompt_ids(m)
        full = whole_logits(m, ids, blocks)
        zero = tuple(image_block(b.start, np.concatenate([b.rows[:, :WIDTH], np.zeros_like(b.rows[:, WIDTH:])], 1),
                                 True, b.grid) for b in blocks)
        z = whole_logits(m, ids, zero)
        first = blocks[0].start
        assert np.array_equal(full[:first], z[:first])
        assert np.abs(full[first:] - z[first:]).max() > 1e-3
        m.transformer.deepstack = 0     # (set_deepstack refuses 0 against the config's 2: forced for this check)
        try:
            narrow = tuple(image_block(b.start, b.rows[:, :WIDTH], True, b.grid) for b in blocks)
            assert np.array_equal(whole_logits(m, ids, narrow), z)
        finally:
            m.transformer.deepstack = LEVELS


@pytest.mark.parametrize("mode", list(MODES))
def test_decode_steps_after_images_continue_from_the_delta(ckpt, mode):
    """The library's greedy stream after two images: each new token's logits are those of one forward over the
    prompt and the tokens so far (decode rows hold no image rows: DeepStack touches only the prefill's)."""
    with load(ckpt[0], mode) as m:
        ids, blocks = prompt_ids(m)
        assert image_mod.rope_delta(blocks) == (3 - 6) + (3 - 3)
        evs = stream(m, ids, blocks, 5)
        full = whole_logits(m, ids + [t for t, _ in evs], blocks)
        tol = 1e-4 if mode != "native-fast" else 2e-2
        for k, (tok, lp) in enumerate(evs):
            row = full[len(ids) - 1 + k]
            assert int(np.argmax(row)) == tok
            ref = row - (np.log(np.exp(row - row.max()).sum()) + row.max())
            assert abs(ref[tok] - lp) < tol


@pytest.mark.parametrize("max_batch", [3, 7, 16])
def test_prefill_chunks_cutting_an_image_give_the_same_tokens(ckpt, max_batch):
    """Chunks of 3 and 7 cut both images (a level's columns added for the image rows in each chunk); the logits
    of every position and the greedy tokens are the one-forward ones."""
    with load(ckpt[0]) as whole:
        ids, blocks = prompt_ids(whole)
        want = stream(whole, ids, blocks)
        ref = whole_logits(whole, ids, blocks).copy()
    with load(ckpt[0], max_batch=max_batch) as m:
        ids, blocks = prompt_ids(m)
        t, n, got = m.transformer, len(ids), []
        for lo in range(0, n, max_batch):
            hi = min(n, lo + max_batch)
            b = BatchImages()
            b.add(0, blocks, lo, hi)
            got.append(t.forward(np.array(ids[lo:hi], np.int32), np.zeros(hi - lo, np.int32),
                                 np.arange(lo, hi, dtype=np.int32), list(range(hi - lo)),
                                 out=np.empty((hi - lo, 300), np.float32), images=b, rope=rope_rows(blocks, lo, hi)))
        assert np.abs(np.concatenate(got) - ref).max() < 1e-5
        got = stream(m, ids, blocks)
    assert [t for t, _ in got] == [t for t, _ in want]
    assert np.allclose([p for _, p in got], [p for _, p in want], atol=1e-5)


def test_scheduler_batch_invariance_with_images(ckpt):
    rng = np.random.default_rng(7)
    texts = [rng.integers(3, 280, size=n).tolist() for n in (23, 9)]
    with load(ckpt[0], n_slots=4, max_batch=48) as m:
        ids, blocks = prompt_ids(m)
        lib = [e.token for e in m.stream(ids, images=blocks, max_tokens=8, temperature=0, ignore_eos=True)]
        q25.same_beside_text(m, ids, blocks, lib, texts)      # alone, and beside text under chunks of 3, 5, 17


def test_prefix_caches_tell_images_apart_by_their_deepstack_columns(ckpt):
    """Two images with the same embeddings and grid but other DeepStack columns are other images: their digests
    differ, the library's slot-0 prefix and the server's slot table reuse nothing past the block's start."""
    with load(ckpt[0], n_slots=1, max_batch=64) as m:
        ids, blocks = prompt_ids(m)
        rows = blocks[0].rows.copy()
        rows[:, WIDTH:] += 0.5
        other = (image_block(blocks[0].start, rows, True, blocks[0].grid),) + blocks[1:]
        assert other[0].digest != blocks[0].digest
        a = stream(m, ids, blocks, 4)
        with vlm.prefill_starts() as calls:
            b = stream(m, ids, other, 4)
        assert calls[0] == blocks[0].start, calls
        assert a != b
        runs = [r[0] for r in vlm.scheduler_run(m, [[(ids, bl, 4)] for bl in (blocks, other, other)], 256)]
    (ra, _), (rb, cached_b), (rb2, cached_b2) = runs
    assert [t for t, _, _ in ra] == [t for t, _ in a] and [t for t, _, _ in rb] == [t for t, _ in b]
    assert cached_b <= blocks[0].start, "keys and values of another image's DeepStack rows were reused"
    assert rb2 == rb and cached_b2 >= other[-1].end


@pytest.mark.parametrize("rope, match", [
    ({"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 3, 4]}, "sum to 9"),
    ({"rope_type": "default", "rope_theta": 1e4, "mrope_section": [4, 4]}, "three sections"),
    ({"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 3, 3], "mrope_interleaved": "yes"}, "true or false"),
    ({"rope_type": "default", "rope_theta": 1e4}, "no M-RoPE sections"),
])
def test_hostile_rope_configs_are_typed_errors(tmp_path, rope, match):
    with pytest.raises(ModelFormatError, match=match):
        llambda.load(_random_checkpoint(tmp_path / "bad", rope=rope), backend="numpy", vision=False)


@pytest.mark.parametrize("vision, match", [(None, "DeepStack levels"), ("tower", "must be an object"),
                                           ({"deepstack_visual_indexes": 3}, "should list block indexes")])
def test_hostile_deepstack_configs_are_typed_errors(tmp_path, vision, match):
    """More levels than decoder layers; a vision_config that is no object; indexes that are no list."""
    folder = _random_checkpoint(tmp_path / "bad", levels=LAYERS + 1)
    if vision is not None:
        cfg = json.loads((folder / "config.json").read_text())
        cfg["vision_config"] = vision
        (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelFormatError, match=match):
        llambda.load(folder, backend="numpy", vision=False)


def test_a_vision_config_naming_no_deepstack_indexes_takes_transformers_default(tmp_path):
    """transformers' Qwen3VLVisionConfig defaults deepstack_visual_indexes to [8, 16, 24] (Qwen3-VL-8B's): a config
    that omits them has three levels, not none (the text model would skip every DeepStack add, silently)."""
    folder = _random_checkpoint(tmp_path / "vl")
    cfg = json.loads((folder / "config.json").read_text())
    del cfg["vision_config"]["deepstack_visual_indexes"]
    (folder / "config.json").write_text(json.dumps(cfg))
    with load(folder, "numpy", tower=False) as m:
        assert m.config.deepstack_levels == 3 and m.transformer.image_width == WIDTH * 4


def test_bad_towers_and_rows_are_typed_errors(ckpt):
    with load(ckpt[0], tower=False) as m:
        class Narrow(WideTower):        # says 2 levels, gives the embeddings alone
            def encode_one(self, pixels, grid):
                return super().encode_one(pixels, grid)[:, :WIDTH]

        m.attach_vision(Narrow(), load_image=WideTower.load_image)
        with pytest.raises(ModelFormatError, match="rows of shape"):
            prompt_ids(m)

        class OneLevel(WideTower):
            deepstack = 1

        with pytest.raises(InvalidInputError, match="DeepStack"):
            m.attach_vision(OneLevel(), load_image=WideTower.load_image)

        class Qwen25(WideTower):        # contiguous sections' family on an interleaved model
            family, deepstack = "qwen2_5_vl", 0

        with pytest.raises(InvalidInputError, match="interleaved"):
            m.attach_vision(Qwen25(), load_image=WideTower.load_image)
        m.attach_vision(WideTower(), load_image=WideTower.load_image)
        ids, blocks = prompt_ids(m)
        narrow = tuple(image_block(b.start, b.rows[:, :WIDTH], True, b.grid) for b in blocks)
        with pytest.raises(InvalidInputError, match="wide"):
            m.stream(ids, images=narrow)
        b = BatchImages()
        b.add(0, narrow, 0, len(ids))
        with pytest.raises(InvalidInputError, match="width"):
            m.transformer.forward(np.array(ids, np.int32), np.zeros(len(ids), np.int32),
                                  np.arange(len(ids), dtype=np.int32), [0], images=b)
        with pytest.raises(InvalidInputError, match="DeepStack"):
            m.transformer.set_deepstack(LAYERS + 1)


def test_a_served_model_keeps_its_deepstack_levels(tmp_path):
    """A text GGUF that names no levels takes the attached tower's; while a server runs the model (its sequences
    hold rows of that width) a tower of another count is refused, one of the same count is not."""
    import threading
    from llambda.tools.export import export

    def levels(meta, types):
        del meta["qwen3vl.n_deepstack_layers"], types["qwen3vl.n_deepstack_layers"]
    path = _rewritten(export(FOLDER, tmp_path / "a.gguf", "gguf", "f32"), tmp_path / "b.gguf", levels)

    class OneLevel(FixtureTower):
        deepstack = 1

    with load(path, tower=FixtureTower, n_ctx=128) as m:
        assert m.config.deepstack_levels == 0 and m.transformer.image_width == 64 * 3
        stop = threading.Event()
        server = threading.Thread(target=stop.wait)
        server.start()
        m.transformer.served_by = server
        try:
            with pytest.raises(InvalidInputError, match="a server runs"):
                m.attach_vision(OneLevel(), load_image=FixtureTower.load_image)
            assert m.transformer.deepstack == 2 and type(m.vision) is FixtureTower
            m.attach_vision(FixtureTower(), load_image=FixtureTower.load_image)
        finally:
            stop.set()
            server.join()
            m.transformer.served_by = None
        m.attach_vision(OneLevel(), load_image=FixtureTower.load_image)
        assert m.transformer.image_width == 64 * 2


def test_a_tower_attached_while_an_image_encodes_leaves_none_of_the_old_rows_kept(ckpt, monkeypatch):
    """An image's rows are kept (for its file's next prompt) only while their tower is attached: a tower
    attached after the old one encoded an image but before its rows were kept clears the kept rows, and the old
    tower's rows must not be kept past it (they would be the new tower's answer for that file: wrong rows,
    silently, a tower of the same width)."""
    import threading
    from llambda.models import image_input as input_mod

    class Other(WideTower):             # another tower, the same width: other rows
        def encode_one(self, pixels, grid):
            return super().encode_one(pixels, grid) + 1

    with load(ckpt[0]) as m:
        old, new = m.vision, Other()
        attached = threading.Event()
        real = input_mod.image_block

        def block_then_attach(*a, **kw):     # the old tower has encoded; the new one attached meanwhile
            if not attached.is_set():
                t = threading.Thread(target=lambda: (m.attach_vision(new, load_image=Other.load_image),
                                                     attached.set()))
                t.start()
                t.join(timeout=0.5)      # (an attach that waits for the encoding's lock: not within this)
            return real(*a, **kw)
        monkeypatch.setattr(input_mod, "image_block", block_then_attach)
        first = m.encode_images(q25.IMAGES[:1], [3])[0]
        monkeypatch.setattr(input_mod, "image_block", real)
        assert attached.wait(10) and m.vision is new and old.encoded == 1
        again = m.encode_images(q25.IMAGES[:1], [3])[0]
        assert new.encoded == 1, "the old tower's rows were kept past the new tower's attach"
        assert np.array_equal(again.rows, first.rows + 1)


@pytest.mark.parametrize("levels", [1, 3])
def test_a_forward_adds_the_levels_its_rows_carry_whatever_is_attached_meanwhile(tmp_path, monkeypatch, levels):
    """A forward's image rows were checked against the model's width when it began; a tower of another level
    count attached meanwhile (another thread, no server: allowed) changes the model's count, not what those rows
    carry: the forward adds their two levels (had it read the new count: one level dropped, silently, or a
    third read past the rows' columns)."""
    import llambda.models.base as base_mod
    from llambda.tools.export import export

    def no_levels(meta, types):
        del meta["qwen3vl.n_deepstack_layers"], types["qwen3vl.n_deepstack_layers"]
    path = _rewritten(export(FOLDER, tmp_path / "a.gguf", "gguf", "f32"), tmp_path / "b.gguf", no_levels)

    class Other(FixtureTower):
        deepstack = levels

    with load(path, "numpy", FixtureTower, n_ctx=128) as m:
        ids, blocks = TWO["input_ids"], fixture_blocks(TWO)
        want = whole_logits(m, ids, blocks).copy()
        real = base_mod.Transformer._check_images

        def then_attach(self, images, n):
            real(self, images, n)
            m.attach_vision(Other(), load_image=Other.load_image)      # after the check, before the layers
        monkeypatch.setattr(base_mod.Transformer, "_check_images", then_attach)
        got = whole_logits(m, ids, blocks)
        assert m.transformer.deepstack == levels
    assert np.array_equal(got, want)


def test_an_image_encoded_while_a_tower_of_other_levels_attaches_is_never_blamed_on_the_file(tmp_path, monkeypatch):
    """A tower of another level count attaching (its levels set on the model, the tower not yet swapped) while an
    image starts encoding: the encoding sees the old tower with the old width or the new with the new (or is told
    to send the image again), never the new width with the old tower (a ModelFormatError naming the tower's rows,
    as if the file were bad)."""
    import threading
    import llambda.models.base as base_mod
    from llambda.tools.export import export

    def no_levels(meta, types):
        del meta["qwen3vl.n_deepstack_layers"], types["qwen3vl.n_deepstack_layers"]
    path = _rewritten(export(FOLDER, tmp_path / "a.gguf", "gguf", "f32"), tmp_path / "b.gguf", no_levels)

    class OneLevel(FixtureTower):
        deepstack = 1

    with load(path, "numpy", FixtureTower, n_ctx=128) as m:
        real, outcome = base_mod.Transformer.set_deepstack, []

        def encode():
            try:
                outcome.append(m.encode_images([FIX_PNG["image_wide.png"]], [3])[0].rows.shape)
            except LlambdaError as e:
                outcome.append(e)

        def set_then_encode(self, levels):     # the attach's levels set; the encoding starts in another thread
            real(self, levels)
            t = threading.Thread(target=encode)
            t.start()
            t.join(timeout=0.5)      # (an encoding that waits for the attach's lock: not within this)
        monkeypatch.setattr(base_mod.Transformer, "set_deepstack", set_then_encode)
        m.attach_vision(OneLevel(), load_image=OneLevel.load_image)
        monkeypatch.setattr(base_mod.Transformer, "set_deepstack", real)
        for _ in range(100):
            if outcome:
                break
            threading.Event().wait(0.05)
    got = outcome[0]
    assert got == (12, 64 * 2) or (isinstance(got, InvalidInputError) and "send them again" in str(got)), got


def test_a_qwen3vl_tower_needs_interleaved_sections(tmp_path):
    """Qwen2.5-VL's text model (contiguous sections) takes no qwen3_vl tower."""
    with load(q25._random_checkpoint(tmp_path / "q25"), tower=False) as m:
        with pytest.raises(InvalidInputError, match="interleaved"):
            m.attach_vision(WideTower(), load_image=WideTower.load_image)


def test_gguf_export_round_trip_and_hf_export_refused(ckpt, tmp_path):
    """Our GGUF of the text model (llama.cpp's qwen3vl: rope.dimension_sections four int32 counts,
    n_deepstack_layers a uint32) reads back as the same model: the same logits over an image prompt (its blocks
    from the checkpoint's own model: the written file holds no tokenizer). A HF directory is refused by name."""
    from llambda.formats.gguf import GGUFFile
    from llambda.tools.export import export
    out = export(ckpt[0], tmp_path / "text.gguf", "gguf", "f32")
    f = GGUFFile(out)
    try:
        key = "qwen3vl.rope.dimension_sections"
        assert f.metadata["general.architecture"] == "qwen3vl"
        assert np.asarray(f.metadata[key]).tolist() == [2, 3, 3, 0] and "INT32" in str(f.metadata_types[key])
        assert int(f.metadata["qwen3vl.n_deepstack_layers"]) == LEVELS
        assert getattr(f.metadata_types["qwen3vl.n_deepstack_layers"], "name", None) == "UINT32"   # llama.cpp's type
    finally:
        f.close()
    with load(ckpt[0]) as hf:
        ids, blocks = prompt_ids(hf)
        want = whole_logits(hf, ids, blocks).copy()
    with load(out, tower=False) as back:
        c = back.config
        assert (c.arch, c.rope_sections, c.rope_interleaved, c.deepstack_levels) == ("qwen3vl", [2, 3, 3], True, 2)
        assert np.abs(whole_logits(back, ids, blocks) - want).max() < 1e-4
    with pytest.raises(LlambdaError, match="GGUF only"):
        export(ckpt[0], tmp_path / "hf", "hf", "f32")


def _rewritten(src: Path, dest: Path, change) -> Path:
    """A copy of the GGUF `src` whose metadata `change(meta, types)` edits in place."""
    from llambda.formats import gguf_writer
    from llambda.formats.gguf import GGUFFile
    f = GGUFFile(src)
    try:
        meta, types = dict(f.metadata), dict(f.metadata_types)
        tensors = [(n, t.qtype, np.array(t.data), t.shape) for n, t in f.tensors.items()]
    finally:
        f.close()
    change(meta, types)
    gguf_writer.write_gguf(dest, meta, tensors, metadata_types=types)
    return dest


def test_ollama_and_hostile_gguf_metadata(ckpt, tmp_path):
    """Ollama's qwen3vl model file names the sections `mrope_sections` and the levels by its tower's
    vision.deepstack_visual_indexes: the same model. Sections that do not sum to head_dim / 2, two sections, and
    more levels than layers are typed errors."""
    from llambda.tools.export import export
    src = export(ckpt[0], tmp_path / "text.gguf", "gguf", "f32")
    sec, deep = "qwen3vl.rope.dimension_sections", "qwen3vl.n_deepstack_layers"

    def ollama(meta, types):
        for k in (sec, deep):
            del meta[k], types[k]
        meta["qwen3vl.mrope_sections"] = np.array([2, 3, 3], np.int32)
        meta["qwen3vl.vision.deepstack_visual_indexes"] = np.array([1, 2], np.int32)

    with llambda.load(_rewritten(src, tmp_path / "ollama.gguf", ollama), backend="numpy", vision=False) as m:
        c = m.config
        assert (c.rope_sections, c.rope_interleaved, c.deepstack_levels) == ([2, 3, 3], True, 2)
    bad = {"sum to 9": {sec: np.array([2, 3, 4, 0], np.int32)}, "three sections": {sec: np.array([4, 4, 0, 0], np.int32)},
           "DeepStack levels": {deep: np.uint32(LAYERS + 1)}}
    for k, (match, edit) in enumerate(bad.items()):
        path = _rewritten(src, tmp_path / f"bad{k}.gguf", lambda meta, types: meta.update(edit))
        with pytest.raises(ModelFormatError, match=match):
            llambda.load(path, backend="numpy", vision=False)


def test_llama_cpp_runs_our_qwen3vl_gguf(tmp_path):
    """llama.cpp (llama-cpp-python, where its version knows qwen3vl) loads our GGUF and gives our text-only logits.
    Sections [3, 3, 2]: the tiny [2, 3, 3] would differ (pair 6 of 8 turns by llama.cpp's fourth position, 0 for
    text, where transformers keeps it temporal: test_where_llama_cpps_interleaved_sections_differ_from_transformers;
    the released [24, 20, 20] differ at pairs 61 and 62, by at most 4e-7 rad a token)."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the bench extra)")
    from llamacpp_ref import llama_cpp_logits
    from llambda.tools.export import export
    folder = _random_checkpoint(tmp_path / "vl", rope={"rope_type": "default", "rope_theta": 1e4,
                                                       "mrope_section": [3, 3, 2], "mrope_interleaved": True})
    path = export(folder, tmp_path / "text.gguf", fmt="gguf", qtype="f32")
    ids = [5, 9, 33, 2, 17, 101, 250, 3, 8]
    theirs = llama_cpp_logits(path, ids)
    with llambda.load(path, backend="numpy", vision=False) as m:
        ours = rows_of(m, ids)[-1]
    # (llama.cpp's f16 cache: 0.0055 on this model, as on the same weights as a plain qwen3 GGUF)
    assert float(np.abs(theirs - ours).max()) <= 0.015


# --- against transformers: the tiny Qwen3VLForConditionalGeneration of the fixture ------------------------------
# (tests/fixtures/reference/tiny/qwen3_vl_vision, tools/make_tiny_qwen3vl.py; a tower double gives the fixture's
# rows for its images, [merger rows | DeepStack level 0 | level 1], so this part tests the language side alone)

FOLDER = Path(__file__).parent / "fixtures" / "reference" / "tiny" / "qwen3_vl_vision"
REF = json.loads((FOLDER / "reference.json").read_text(encoding="utf-8"))
FIX_PNG = {name: (FOLDER / name).read_bytes() for name in REF["images"]}
TWO = REF["prompts"][0]                 # two images (merged grids 3 x 4 and 5 x 3), text after each
TEXT = REF["text_only"]
BUDGET = {"numpy": 1e-4, "native-exact": 1e-4, "native-fast": 1e-2}        # test_vlm_qwen25vl's budgets


def npy(name: str) -> np.ndarray:
    return np.load(FOLDER / name)


def wide_rows(info: dict) -> np.ndarray:
    """An image's rows as the contract's encode_one gives them: the merger's, then each DeepStack level's."""
    return np.concatenate([npy(info["merger_rows"])] + [npy(n) for n in info["deepstack_rows"]], axis=1)


class FixtureTower(q25.FixtureTower):
    """test_vlm_qwen25vl's fixture double as the qwen3_vl contract's, serving this fixture: its wide rows."""
    family, hidden, deepstack = "qwen3_vl", REF["config"]["text_config"]["hidden_size"], len(REF["deepstack_visual_indexes"])
    folder, ref, files = FOLDER, REF, FIX_PNG

    def rows(self, info: dict) -> np.ndarray:
        return wide_rows(info)


def fixture_model(mode: str, **kw):
    return load(FOLDER, mode, FixtureTower, **{"n_ctx": 128, **kw})


def fixture_messages(prompt: dict) -> list:
    return q25.fixture_messages(prompt, FIX_PNG)


def fixture_blocks(prompt: dict) -> tuple:
    return tuple(image_block(lo, wide_rows(REF["images"][name]), True, tuple(REF["images"][name]["merged_grid"]))
                 for (lo, _), name in zip(prompt["image_runs"], prompt["images"]))


def test_the_fixture_loads_as_qwen3vl():
    with fixture_model("numpy") as m:
        c = m.config
        assert (c.arch, c.rope_sections, c.rope_interleaved, c.deepstack_levels) == ("qwen3vl", [2, 3, 3], True, 2)
        assert m.transformer.image_width == 64 * 3 and m.image_input.layout.family == "qwen3_vl"


@pytest.mark.parametrize("mode", list(MODES))
def test_chat_gives_the_processor_ids_positions_logits_and_greedy_tokens(mode):
    """The chat template's text, the processor's input_ids (each image's merged grid from its header size),
    get_rope_index's positions and rope_deltas, the logits at the reference's rows (first and last token of each
    image, the tokens after each, the last three), every position's argmax, Model.chat's greedy answer, and the
    logits of each decode step after the images (transformers' recompute after each new token)."""
    with fixture_model(mode) as m:
        q25.chat_matches_reference(m, TWO, FIX_PNG, FOLDER, BUDGET[mode])     # (Qwen2.5-VL's checks, this fixture)
        assert m.vision.encoded == 2


@pytest.mark.parametrize("mode", list(MODES))
def test_text_only_prompt_matches_transformers(mode):
    with fixture_model(mode) as m:
        q25.text_matches_reference(m, TEXT, FOLDER, BUDGET[mode])


@pytest.mark.parametrize("late, interleaved", [(1, True), (0, False)])
def test_the_fixture_fails_deepstack_one_layer_late_or_contiguous_sections(monkeypatch, late, interleaved):
    """The fixture can tell: DeepStack level j added after layer j + 1, or the sections contiguous (Qwen2-VL's),
    moves the image prompt's logits far past the budget."""
    import llambda.models.base as base_mod
    with fixture_model("numpy") as m:
        ids, blocks = m.image_prompt(TWO["chat_text"], [FIX_PNG[n] for n in TWO["images"]])
        if late:
            real = base_mod.Transformer._ffn_block

            def shifted(self, layer, x):        # after layer i: level i - 1's columns instead of level i's
                real(self, layer, x)
                i, d = next(k for k, L in enumerate(self.layers) if L is layer), self.cfg.d_model
                for r0, rows, _ in self._images.spans if self._images is not None else ():
                    if 1 <= i <= self.deepstack:
                        x[r0:r0 + len(rows)] += rows[:, d * i:d * (i + 1)]
                    if i < self.deepstack:
                        x[r0:r0 + len(rows)] -= rows[:, d * (i + 1):d * (i + 2)]
            monkeypatch.setattr(base_mod.Transformer, "_ffn_block", shifted)
        else:
            monkeypatch.setattr(m.config, "rope_interleaved", interleaved)
        err = float(np.abs(whole_logits(m, ids, blocks)[TWO["rows"]] - npy(TWO["logits_rows"])).max())
    assert err > 100 * BUDGET["numpy"], err


def test_fixture_chunks_and_the_scheduler_give_the_greedy_tokens():
    """Library prefills in chunks of 3, 7 and 16 tokens (cutting both images: each chunk adds the DeepStack
    columns of the image rows it holds), and the scheduler beside two text requests under chunks of 3, 5 and 17:
    transformers' greedy tokens, the same logprob bits alone and beside text."""
    want, images = TWO["greedy_new_tokens"], [FIX_PNG[n] for n in TWO["images"]]
    for max_batch in (3, 7, 16):
        with fixture_model("native-exact", max_batch=max_batch) as m:
            ids, blocks = m.image_prompt(TWO["chat_text"], images)
            got = m.generate(ids, images=blocks, max_tokens=len(want), temperature=0, ignore_eos=True)
            assert list(got) == want, f"max_batch {max_batch}"
    texts = [np.random.default_rng(11).integers(7, 390, size=n).tolist() for n in (23, 9)]
    with fixture_model("native-exact", n_slots=4, max_batch=96) as m:
        q25.same_beside_text(m, TWO["input_ids"], fixture_blocks(TWO), want, texts)


def test_every_chunk_size_and_every_reused_prefix_give_the_same_logits_and_tokens():
    """Prefill chunks of every size from 1 to 24 tokens (each image cut at every offset: the DeepStack columns of
    the image rows each chunk holds): every position's logits and the greedy tokens of one forward; slot 0 holding
    every prefix of the prompt that ends outside an image (its image's keys and values reused): the same tokens."""
    ids, blocks = TWO["input_ids"], fixture_blocks(TWO)
    with fixture_model("native-exact", max_batch=64) as m:
        ref = whole_logits(m, ids, blocks).copy()
        want = [e.token for e in m.stream(ids, images=blocks, max_tokens=6, temperature=0, ignore_eos=True)]
    for size in range(1, 25):
        with fixture_model("native-exact", max_batch=size) as m:
            t, got = m.transformer, []
            for lo in range(0, len(ids), size):
                hi = min(len(ids), lo + size)
                b = BatchImages()
                b.add(0, blocks, lo, hi)
                got.append(t.forward(np.array(ids[lo:hi], np.int32), np.zeros(hi - lo, np.int32),
                                     np.arange(lo, hi, dtype=np.int32), list(range(hi - lo)),
                                     out=np.empty((hi - lo, ref.shape[1]), np.float32), images=b,
                                     rope=rope_rows(blocks, lo, hi)))
            assert np.abs(np.concatenate(got) - ref).max() < 1e-5, size
            assert [e.token for e in m.stream(ids, images=blocks, max_tokens=6, temperature=0,
                                              ignore_eos=True)] == want, size
    with fixture_model("native-exact", max_batch=64, n_slots=1) as m:
        for cut in range(1, len(ids)):
            if any(b.start < cut <= b.end for b in blocks):
                continue
            list(m.stream(ids[:cut], images=tuple(b for b in blocks if b.end < cut), max_tokens=1))
            with vlm.prefill_starts() as calls:
                got = [e.token for e in m.stream(ids, images=blocks, max_tokens=6, temperature=0, ignore_eos=True)]
            assert got == want and calls[0] == cut, (cut, calls)


def test_the_scheduler_batches_requests_of_other_images_together():
    """Two image requests (the two-image prompt; its first image alone, and that image's rows scaled: another
    digest) beside a text request under prefill chunks of 3, 5, 17 and 256: each its own tokens and logprob bits
    alone; then one after another on one slot table (four slots), the shared prefix reused only where the image
    is the same."""
    ids, blocks = TWO["input_ids"], fixture_blocks(TWO)
    first = ids[:blocks[0].end + 6]                       # the first image and five tokens after it
    scaled = (image_block(blocks[0].start, blocks[0].rows * np.float32(1.1), True, blocks[0].grid),)
    jobs = [(ids, blocks, 6), (first, blocks[:1], 6), (first, scaled, 6)]
    text = np.random.default_rng(3).integers(7, 390, size=17).tolist()
    with fixture_model("native-exact", n_slots=4, max_batch=96, n_ctx=256) as m:
        alone = [vlm.scheduler_run(m, [[job]], 256)[0][0][0] for job in jobs]
        for chunk in (3, 5, 17, 256):
            runs = vlm.scheduler_run(m, [[jobs[0], (text, (), 6), jobs[1], jobs[2]]], chunk)[0]
            assert [runs[0][0], runs[2][0], runs[3][0]] == alone, chunk
        runs = vlm.scheduler_run(m, [[job] for job in jobs + jobs[1:2]], 256)
    assert [r[0][0] for r in runs] == alone + alone[1:2]
    reused = [r[0][1] for r in runs]
    # the first image's request reuses the two-image prompt's prefix, the scaled one nothing past the image's
    # start, the first image's again its own earlier slot (not the scaled one's)
    assert reused[1] == reused[3] == len(first) - 1 and reused[2] <= blocks[0].start, reused


def test_server_prepares_qwen3vl_requests():
    """The server's token count and prepared sequence are Model.image_prompt's, its rope_delta transformers'; each
    image is encoded once, in the image worker, its block's digest over every column."""
    with fixture_model("native-exact", max_batch=8) as m:
        service, _ = vlm.service_for(m)
        spec = vlm.chat_spec(fixture_messages(TWO))
        try:
            count = service._prompt_length(spec)
            seq = service.encode(service.prepare(spec)).seqs[0][0]
        finally:
            service.workers.close()
            service.image_workers.close()
        assert count == len(TWO["input_ids"]) == len(seq.prompt_ids) and seq.prompt_ids == TWO["input_ids"]
        assert m.vision.encoded == 2 and seq.rope_delta == TWO["rope_deltas"]
        assert [b.digest for b in seq.images] == [b.digest for b in fixture_blocks(TWO)]
        assert all(b.rows.shape[1] == 192 for b in seq.images)


def test_a_text_gguf_finds_its_image_tokens_in_the_vocabulary(tmp_path):
    """llama.cpp's layout: our qwen3vl GGUF of the text model has no config.json: <|vision_start|>, <|image_pad|>,
    <|vision_end|> come from its vocabulary, the levels from n_deepstack_layers; the image prompt and its logits
    are the reference's."""
    from llambda.tools.export import export
    path = export(FOLDER, tmp_path / "text.gguf", fmt="gguf", qtype="f32")
    with load(path, "native-exact", FixtureTower, n_ctx=128) as m:
        assert m.config.deepstack_levels == 2
        lay = m.image_input.layout
        assert (lay.start, lay.soft, lay.end) == tuple(REF["special_token_ids"][k] for k in
                                                       ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>"))
        ids, blocks = m.image_prompt(TWO["chat_text"], [FIX_PNG[n] for n in TWO["images"]])
        assert ids == TWO["input_ids"]
        got = whole_logits(m, ids, blocks)[TWO["rows"]]
    assert float(np.abs(got - npy(TWO["logits_rows"])).max()) <= 1e-4


def test_speculative_decoding_on_text_prompts_and_not_on_images():
    want = TEXT["greedy_new_tokens"]
    with fixture_model("native-exact", draft=FOLDER) as m:
        assert m.draft is not None and m.draft.config.rope_interleaved
        for mode in ("draft", "lookup"):
            assert list(m.generate(TEXT["input_ids"], max_tokens=len(want), temperature=0, ignore_eos=True,
                                   speculative=mode)) == want, mode
        ids, blocks = m.image_prompt(TWO["chat_text"], [FIX_PNG[n] for n in TWO["images"]])
        with pytest.raises(InvalidInputError, match="speculative"):
            m.stream(ids, images=blocks, speculative="draft")


# --- the whole model: its own tower (llambda.vision's Qwen3-VL, found by llambda.load) -------------------------

@pytest.mark.parametrize("mode", list(q25.REAL))
def test_whole_model_with_its_own_tower_matches_transformers(mode):
    """No double: the folder's tower decodes, resizes and encodes the images (its DeepStack levels set on the text
    model at load); the chat's ids, the logits at the reference rows (the fast mode's bfloat16 tower within
    test_vlm_qwen25vl's budget for it) and the greedy tokens are transformers'."""
    with q25.own_tower_model(FOLDER, mode) as m:
        assert m.vision is not None and m.vision.family == "qwen3_vl" and m.transformer.deepstack == 2
        q25.own_tower_matches_reference(m, TWO, FIX_PNG, FOLDER, q25.REAL[mode][2], [(3, 4), (5, 3)])


def test_text_gguf_with_our_mmproj_is_the_checkpoint(tmp_path):
    """llama.cpp's layout of Qwen3-VL: the text model as a qwen3vl GGUF (its image tokens found in the vocabulary,
    its levels in n_deepstack_layers) and the tower as a qwen3vl_merger mmproj, both written by llambda, loaded with
    mmproj=: the same prompt ids and logits as the checkpoint with its own tower, and the reference's."""
    from llambda.tools.export import export
    from llambda.vision.mmproj import write_mmproj
    gg = export(FOLDER, tmp_path / "text.gguf", fmt="gguf", qtype="f32")
    proj = write_mmproj(FOLDER, tmp_path / "mmproj.gguf", "f32")
    images = [FIX_PNG[n] for n in TWO["images"]]
    out = []
    for path, extra in ((FOLDER, {}), (gg, {"mmproj": proj})):
        with llambda.load(path, backend="numpy", n_ctx=128, **extra) as m:
            assert m.accepts_images and m.vision.family == "qwen3_vl" and m.transformer.deepstack == 2
            ids, blocks = m.image_prompt(TWO["chat_text"], images)
            out.append((ids, [b.grid for b in blocks], whole_logits(m, ids, blocks)))
    (ids_a, grids_a, a), (ids_b, grids_b, b) = out
    assert ids_a == ids_b == TWO["input_ids"] and grids_a == grids_b == [(3, 4), (5, 3)]
    assert float(np.abs(a - b).max()) <= 1e-4
    assert float(np.abs(b[TWO["rows"]] - npy(TWO["logits_rows"])).max()) <= 1e-4


def test_the_released_config_spelling_reads_the_same(tmp_path):
    """Qwen/Qwen3-VL-*-Instruct's config.json spells the text model's rotary as transformers 4 did: rope_theta beside
    rope_scaling {"rope_type": "default", "mrope_section", "mrope_interleaved"}: the same model, the reference's
    logits."""
    import shutil
    dest = tmp_path / "released"
    shutil.copytree(FOLDER, dest)
    cfg = json.loads((FOLDER / "config.json").read_text())
    rope = cfg["text_config"].pop("rope_parameters")
    cfg["text_config"]["rope_theta"] = rope.pop("rope_theta")
    cfg["text_config"]["rope_scaling"] = rope
    (dest / "config.json").write_text(json.dumps(cfg))
    with q25.own_tower_model(dest, "numpy") as m:
        assert (m.config.rope_sections, m.config.rope_interleaved, m.config.rope_theta) == ([2, 3, 3], True, 1e4)
        q25.own_tower_matches_reference(m, TWO, FIX_PNG, FOLDER, 1e-4, [(3, 4), (5, 3)])
