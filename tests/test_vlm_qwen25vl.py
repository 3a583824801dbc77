"""Images on the language model's side, Qwen2.5-VL (and Qwen2-VL, the same language side): an image is
`<|vision_start|>`, gh * gw `<|image_pad|>` (its merged grid), `<|vision_end|>`; the pads' embeddings are the
tower's rows; attention is causal; the pads' RoPE positions are M-RoPE's (t0, t0 + row, t0 + col) and the text
after an image runs behind its cache positions (rope_delta), in prefill chunks, decode steps, the library's
prefix reuse and the server's scheduler.

The first part runs a small random Qwen2.5-VL checkpoint written here (transformers 5's layout: a nested
text_config, model.language_model.* names, a vision tower's tensors beside) with a tower double, checking the
engine against itself (one forward over everything = chunks = decode steps; text-only = plain Qwen2) and
images.rope_rows against a twin of transformers' get_rope_index (tests/test_mrope.py)."""
from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

import llambda
from llambda.backends import available_backends
from llambda.errors import ContextOverflowError, InvalidInputError, ModelFormatError
from llambda.models import images as image_mod
from llambda.models.images import BatchImages, QwenTokens, image_block, rope_rows

import test_vlm as vlm  # noqa: E402  (the scheduler helpers)

START, PAD, END, VIDEO = 290, 291, 292, 293
WIDTH = 64
MODES = {"numpy": ("numpy", None), "native-exact": ("native", "f32"), "native-fast": ("native", None)}


def _random_checkpoint(dest: Path, model_type: str = "qwen2_5_vl", seed: int = 0) -> Path:
    """A small random checkpoint: Qwen2.5-VL's layout (nested text_config, M-RoPE sections [2, 3, 3] of
    head_dim 16) or, model_type "qwen2", the same weights as a plain Qwen2."""
    from llambda.formats.safetensors import write_safetensors
    rng = np.random.default_rng(seed)
    dest.mkdir(parents=True, exist_ok=True)
    text = dict(hidden_size=WIDTH, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=300, rms_norm_eps=1e-6, max_position_embeddings=512,
                tie_word_embeddings=False, hidden_act="silu")
    vl = model_type != "qwen2"
    if vl:
        cfg = {"architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": model_type,
               "image_token_id": PAD, "vision_start_token_id": START, "vision_end_token_id": END,
               "video_token_id": VIDEO, "tie_word_embeddings": False,
               "text_config": dict(text, model_type=f"{model_type}_text", rope_parameters={
                   "rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}),
               "vision_config": {"depth": 1, "hidden_size": 8, "out_hidden_size": WIDTH}}
        pre = "model.language_model."
    else:
        cfg = dict(text, architectures=["Qwen2ForCausalLM"], model_type="qwen2", rope_theta=10000.0)
        pre = "model."
    (dest / "config.json").write_text(json.dumps(cfg))

    def w(*shape):
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    t = {pre + "embed_tokens.weight": w(300, WIDTH), pre + "norm.weight": 1 + w(WIDTH), "lm_head.weight": w(300, WIDTH)}
    for i in range(2):
        p = f"{pre}layers.{i}."
        t.update({p + "input_layernorm.weight": 1 + w(WIDTH), p + "post_attention_layernorm.weight": 1 + w(WIDTH),
                  p + "self_attn.q_proj.weight": w(WIDTH, WIDTH), p + "self_attn.q_proj.bias": w(WIDTH),
                  p + "self_attn.k_proj.weight": w(32, WIDTH), p + "self_attn.k_proj.bias": w(32),
                  p + "self_attn.v_proj.weight": w(32, WIDTH), p + "self_attn.v_proj.bias": w(32),
                  p + "self_attn.o_proj.weight": w(WIDTH, WIDTH), p + "mlp.gate_proj.weight": w(96, WIDTH),
                  p + "mlp.up_proj.weight": w(96, WIDTH), p + "mlp.down_proj.weight": w(WIDTH, 96)})
    if vl:      # a tower's tensors: not the decoder's (llambda.vision reads them)
        t["model.visual.blocks.0.attn.qkv.weight"] = w(24, 8)
        t["model.visual.merger.mlp.0.weight"] = w(32, 32)
    write_safetensors(dest / "model.safetensors", t)
    return dest


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen25vl")
    return _random_checkpoint(root / "vl"), _random_checkpoint(root / "plain", "qwen2")


def png(width: int, height: int, shade: int) -> bytes:
    from PIL import Image
    buf = io.BytesIO()
    Image.new("RGB", (width, height), (shade, 255 - shade, shade // 2)).save(buf, "PNG")
    return buf.getvalue()


class GridTower:
    """A VisionTower double of the contract's grid family: grid from the size (28 pixels a merged token),
    pixels the image's own bytes' digest as numbers, encode_one rows drawn from them."""
    family, attends, tokens_per_image, hidden = "qwen2_5_vl", "causal", None, WIDTH

    def __init__(self):
        self.encoded = 0
        self.closed = False

    @staticmethod
    def load_image(data):
        from PIL import Image
        return Image.open(io.BytesIO(bytes(data)))

    def grid(self, width: int, height: int) -> tuple[int, int]:
        return max(1, height // 28), max(1, width // 28)

    def pixels(self, image) -> np.ndarray:
        gh, gw = self.grid(*image.size)
        seed = int(np.asarray(image.convert("RGB"))[0, 0].sum()) + 1000 * gh + gw
        return np.full((gh * gw * 4, 12), seed, np.float32)

    def encode_one(self, pixels: np.ndarray, grid: tuple) -> np.ndarray:
        self.encoded += 1
        n = len(pixels) // 4
        assert grid[0] * grid[1] == n
        return np.random.default_rng(int(pixels[0, 0])).standard_normal((n, WIDTH)).astype(np.float32)

    def close(self):
        self.closed = True


def load(folder, mode="native-exact", tower=True, **kw):
    """The checkpoint with a tower double attached (`tower`: True for GridTower, or a double's class)."""
    backend, activations = MODES[mode]
    if backend not in available_backends():
        pytest.skip(f"the {backend} backend is not available here (C core not built)")
    opts = {"n_ctx": 160, "vision": False, **kw}
    m = llambda.load(folder, backend=backend, activations=activations, **opts)
    if tower:
        double = GridTower if tower is True else tower
        m.attach_vision(double(), load_image=double.load_image)
    return m


IMAGES = [png(90, 60, 40), png(30, 100, 200)]          # grids (2, 3) and (3, 1)


def prompt_ids(m, images=IMAGES) -> tuple[list[int], tuple]:
    """Token ids of `text <image> text <image> text` through the model's layout (no tokenizer: the ids
    spelled out), and the blocks Model.encode_images makes."""
    grids = m.image_input.grids(images)
    ids, k = [5, 6, 7], 0
    for gh, gw in grids:
        ids += [START] + [PAD] * (gh * gw) + [END] + [20 + k, 21 + k]
        k += 2
    ids += [30, 31]
    lay = m.image_input.layout
    ids, starts = lay.place(ids, 0, grids)
    return ids, m.encode_images(images, starts)


def whole_logits(m, ids, blocks) -> np.ndarray:
    """Every position's logits in one forward, the RoPE rows from rope_rows."""
    t, n = m.transformer, len(ids)
    b = BatchImages()
    b.add(0, blocks, 0, n)
    rope = rope_rows(blocks, 0, n)
    return t.forward(np.array(ids, np.int32), np.zeros(n, np.int32), np.arange(n, dtype=np.int32), list(range(n)),
                     out=np.empty((n, t.cfg.vocab_size), np.float32), images=b, rope=rope)


def test_the_checkpoint_loads_as_qwen2vl_and_its_layout_is_found(ckpt):
    with load(ckpt[0]) as m:
        c = m.config
        assert c.arch == "qwen2vl" and c.rope_sections == [2, 3, 3] and c.attn_bias
        lay = m.image_input.layout
        assert isinstance(lay, QwenTokens) and (lay.start, lay.soft, lay.end) == (START, PAD, END)
        assert m.image_marker == "<|vision_start|><|image_pad|><|vision_end|>" and m.image_block_tokens == 0
        ids, blocks = prompt_ids(m)
        assert [b.grid for b in blocks] == [(2, 3), (3, 1)]
        assert all(b.causal and ids[b.start - 1] == START and ids[b.end] == END for b in blocks)
        assert m.vision.encoded == 2


@pytest.mark.parametrize("mode", list(MODES))
def test_text_only_is_plain_qwen2(ckpt, mode):
    """Equal positions in every section: M-RoPE is Qwen2's RoPE; the same weights as a qwen2 checkpoint give the
    same logits bit for bit, and the same greedy text through the library's stream."""
    ids = [5, 9, 33, 2, 17, 101, 250, 3, 8]
    with load(ckpt[0], mode, tower=False) as vl, load(ckpt[1], mode, tower=False) as plain:
        assert plain.config.rope_sections == []
        a, b = (vlm_rows(m, ids) for m in (vl, plain))
        assert np.array_equal(a, b)
        kw = dict(max_tokens=6, temperature=0, ignore_eos=True, logprobs=2)
        ea = [(e.token, e.logprob) for e in vl.stream(ids, **kw)]
        eb = [(e.token, e.logprob) for e in plain.stream(ids, **kw)]
        assert ea == eb


def vlm_rows(m, ids) -> np.ndarray:
    t, n = m.transformer, len(ids)
    return t.forward(np.array(ids, np.int32), np.zeros(n, np.int32), np.arange(n, dtype=np.int32), list(range(n)),
                     out=np.empty((n, t.cfg.vocab_size), np.float32)).copy()


@pytest.mark.parametrize("mode", list(MODES))
def test_decode_steps_after_images_continue_from_the_delta(ckpt, mode):
    """The library's greedy stream after two images: each new token's logits are those of one forward over the
    prompt and the tokens so far with rope_rows' positions (the text after the images behind by rope_delta)."""
    with load(ckpt[0], mode) as m:
        ids, blocks = prompt_ids(m)
        assert image_mod.rope_delta(blocks) == (3 - 6) + (3 - 3)
        evs = [e for e in m.stream(ids, images=blocks, max_tokens=5, temperature=0, ignore_eos=True, logprobs=1)
               if e.token >= 0]
        toks = [e.token for e in evs]
        full = whole_logits(m, ids + toks, blocks)
        tol = 1e-4 if mode != "native-fast" else 2e-2
        for k, e in enumerate(evs):
            row = full[len(ids) - 1 + k]
            assert int(np.argmax(row)) == e.token
            lp = row - (np.log(np.exp(row - row.max()).sum()) + row.max())
            assert abs(lp[e.token] - e.logprob) < tol
        # a wrong offset is visible: positions as plain token indices give other logits
        b = BatchImages()
        b.add(0, blocks, 0, len(ids))
        t, n = m.transformer, len(ids)
        plain = t.forward(np.array(ids, np.int32), np.zeros(n, np.int32), np.arange(n, dtype=np.int32), [n - 1],
                          images=b).copy()
        assert np.abs(plain[0] - full[n - 1]).max() > 1e-3


@pytest.mark.parametrize("max_batch", [3, 7, 16])
def test_prefill_chunks_give_the_same_tokens(ckpt, max_batch):
    with load(ckpt[0]) as whole:
        ids, blocks = prompt_ids(whole)
        want = [(e.token, e.logprob) for e in whole.stream(ids, images=blocks, max_tokens=6, temperature=0,
                                                            ignore_eos=True, logprobs=1)]
    with load(ckpt[0], max_batch=max_batch) as m:
        ids, blocks = prompt_ids(m)
        got = [(e.token, e.logprob) for e in m.stream(ids, images=blocks, max_tokens=6, temperature=0,
                                                       ignore_eos=True, logprobs=1)]
    assert [t for t, _ in got] == [t for t, _ in want]
    assert np.allclose([p for _, p in got], [p for _, p in want], atol=1e-5)


def test_library_prefix_reuse_stops_where_the_grid_differs(ckpt):
    """The same rows under another grid (3 x 2 for 2 x 3) put the text after the image elsewhere: the slot's
    prefix is reused only up to the block, and the answer is a fresh model's."""
    with load(ckpt[0]) as m:
        ids, blocks = prompt_ids(m)
        other = (image_block(blocks[0].start, blocks[0].rows, True, (3, 2)),) + blocks[1:]

        def run(bl):
            return [(e.token, e.logprob) for e in m.stream(ids, images=bl, max_tokens=4, temperature=0,
                                                           ignore_eos=True, logprobs=1)]
        a = run(blocks)
        with vlm.prefill_starts() as calls:
            b = run(other)
        assert calls[0] == blocks[0].start, calls
        with vlm.prefill_starts() as calls:
            assert run(other) == b
        assert min(calls) >= other[-1].end, calls
    with load(ckpt[0]) as fresh:
        assert [(e.token, e.logprob) for e in fresh.stream(ids, images=other, max_tokens=4, temperature=0,
                                                          ignore_eos=True, logprobs=1)] == b
    assert a != b


def test_scheduler_batch_invariance_with_images(ckpt):
    """The image request alone and beside text requests under prefill chunks that cut its image: the same tokens
    and logprob bits; its decode rows take their positions from its delta."""
    rng = np.random.default_rng(7)
    texts = [rng.integers(3, 280, size=n).tolist() for n in (23, 9)]
    with load(ckpt[0], n_slots=4, max_batch=48) as m:
        ids, blocks = prompt_ids(m)
        lib = [e.token for e in m.stream(ids, images=blocks, max_tokens=8, temperature=0, ignore_eos=True)]
        same_beside_text(m, ids, blocks, lib, texts)


def same_beside_text(m, ids, blocks, want: list[int], texts) -> None:
    """The scheduler: the image request alone gives `want`; beside two text requests, under prefill chunks of
    3, 5 and 17 tokens (cutting its images), the same tokens and logprob bits."""
    def step(jobs, chunk):
        return vlm.scheduler_run(m, [jobs], prefill_chunk=chunk)[0]

    alone = step([(ids, blocks, len(want))], 256)[0][0]
    assert [t for t, _, _ in alone] == want
    for chunk in (3, 5, 17):
        beside = step([(texts[0], (), 8), (ids, blocks, len(want)), (texts[1], (), 8)], chunk)[1][0]
        assert beside == alone, f"prefill_chunk {chunk}: the image request changed beside text requests"


def test_scheduler_prefix_cache_keeps_positions_apart(ckpt):
    """The server's slot table: the same ids and rows under another grid (the text after the image at other
    positions) reuse nothing past the block's start; the same grid again reuses the whole prompt but its last."""
    with load(ckpt[0], n_slots=1, max_batch=64) as m:
        ids, blocks = prompt_ids(m)
        other = (image_block(blocks[0].start, blocks[0].rows, True, (3, 2)),) + blocks[1:]
        fresh = [e.token for e in m.stream(ids, images=other, max_tokens=5, temperature=0, ignore_eos=True)]
        runs = [r[0] for r in vlm.scheduler_run(m, [[(ids, b, 5)] for b in (blocks, other, other)], 256)]
    (a, _), (b, cached_b), (b2, cached_b2) = runs
    assert [t for t, _, _ in b] == fresh and b != a
    assert cached_b <= blocks[0].start, "keys and values of other RoPE positions were reused"
    assert b2 == b and cached_b2 >= other[-1].end


def test_bad_towers_and_prompts_are_typed_errors(ckpt):
    with load(ckpt[0], tower=False) as m:
        class NoGrid(GridTower):
            def grid(self, width, height):
                return 0, 0

        m.attach_vision(NoGrid(), load_image=GridTower.load_image)
        with pytest.raises(ModelFormatError, match="grid"):
            prompt_ids(m)

        class Short(GridTower):
            def encode_one(self, pixels, grid):
                return super().encode_one(pixels, grid)[:-1]

        m.attach_vision(Short(), load_image=GridTower.load_image)
        with pytest.raises(ModelFormatError, match="rows of shape"):
            prompt_ids(m)

        m.attach_vision(GridTower(), load_image=GridTower.load_image)
        lay = m.image_input.layout
        with pytest.raises(InvalidInputError, match="image markers"):
            lay.expand("no image here", [(2, 3)])
        with pytest.raises(InvalidInputError, match="one run"):       # a pad typed outside an image's frame
            lay.place([5, PAD, 6, START] + [PAD] * 6 + [END, 7], 0, [(2, 3)])
        with pytest.raises(InvalidInputError, match="one run"):       # a run of the wrong length
            lay.place([5, START] + [PAD] * 5 + [END, 7], 0, [(2, 3)])
        ids, blocks = prompt_ids(m)
        with pytest.raises(InvalidInputError):                        # rope rows past the context
            m.transformer.forward(np.array(ids[:2], np.int32), np.zeros(2, np.int32), np.arange(2, dtype=np.int32),
                                  [1], rope=np.array([0, 10 ** 6]))
        with pytest.raises(InvalidInputError, match="shape"):
            m.transformer.forward(np.array(ids[:2], np.int32), np.zeros(2, np.int32), np.arange(2, dtype=np.int32),
                                  [1], rope=np.zeros((2, 2), np.int64))
        with pytest.raises(InvalidInputError, match="speculative"):
            m.stream(ids, images=blocks, speculative="lookup")


def test_an_image_past_the_context_is_refused_before_the_tower_runs(ckpt):
    """The memory plan counts the largest image the context holds (QwenVisionConfig.workspace_bytes(n_ctx)):
    encode_images refuses a larger one before decoding it, however it was placed."""
    with load(ckpt[0], n_ctx=16) as m:
        with pytest.raises(ContextOverflowError, match="25 tokens"):
            m.encode_images([png(140, 140, 9)], [0])            # 5 x 5 cells
        assert m.vision.encoded == 0
        blocks = m.encode_images([png(56, 84, 9)], [1])         # 3 x 2 fit
        assert m.vision.encoded == 1 and blocks[0].grid == (3, 2)


def test_a_grid_tower_needs_m_rope_and_a_plain_model_takes_no_rope(ckpt):
    with load(ckpt[1], tower=False) as plain:
        with pytest.raises(InvalidInputError, match="M-RoPE"):
            plain.attach_vision(GridTower(), load_image=GridTower.load_image)
        args = np.array([1, 2], np.int32), np.zeros(2, np.int32), np.arange(2, dtype=np.int32)
        with pytest.raises(InvalidInputError, match="RoPE positions"):
            plain.transformer.forward(*args, [1], rope=np.arange(2))
        plain.transformer.forward(*args, range(2))         # a decode step's plan recorded (native) ...
        with pytest.raises(InvalidInputError, match="RoPE positions"):     # ... refuses them too (had ignored them)
            plain.transformer.forward(*args, range(2), rope=[0, 1])


@pytest.mark.parametrize("fmt", ["gguf", "hf"])
def test_export_round_trip(ckpt, tmp_path, fmt):
    """Our GGUF of the text model (llama.cpp's qwen2vl: rope.dimension_sections, four int32 counts) and our HF
    directory (rope_scaling's mrope_section) read back as the same M-RoPE model: the same logits over an image
    prompt (its blocks from the checkpoint's own model: the written files hold no tokenizer to find the
    layout in)."""
    from llambda.tools.export import export
    out = tmp_path / ("text.gguf" if fmt == "gguf" else "text")
    export(ckpt[0], out, fmt, "f32")
    if fmt == "gguf":
        from llambda.formats.gguf import GGUFFile
        f = GGUFFile(out)
        try:
            key = "qwen2vl.rope.dimension_sections"
            assert np.asarray(f.metadata[key]).tolist() == [2, 3, 3, 0]
            assert "INT32" in str(f.metadata_types[key]), f.metadata_types[key]     # the one type llama.cpp reads
        finally:
            f.close()
    with load(ckpt[0]) as hf:
        ids, blocks = prompt_ids(hf)
        want = whole_logits(hf, ids, blocks)
    with load(out, tower=False) as back:
        assert back.config.arch == "qwen2vl" and back.config.rope_sections == [2, 3, 3]
        assert np.abs(whole_logits(back, ids, blocks) - want).max() < 1e-4


# --- against transformers: the tiny Qwen2_5_VLForConditionalGeneration of the fixture -------------------------
# (tests/fixtures/reference/tiny/qwen2_5_vl_vision, tools/make_tiny_qwen25vl.py; a tower double gives the
# fixture's merger rows for its images, so this part tests the language side alone)

FOLDER = Path(__file__).parent / "fixtures" / "reference" / "tiny" / "qwen2_5_vl_vision"
REF = json.loads((FOLDER / "reference.json").read_text(encoding="utf-8"))
FIX_PNG = {name: (FOLDER / name).read_bytes() for name in REF["images"]}
TWO = REF["prompts"][0]                 # two images (merged grids 3 x 5 and 3 x 4), text after each
TEXT = REF["text_only"]
BUDGET = {"numpy": 1e-4, "native-exact": 1e-4, "native-fast": 1e-2}        # test_vlm's (Gemma 3's) budgets


def npy(name: str) -> np.ndarray:
    return np.load(FOLDER / name)


class FixtureTower:
    """A VisionTower double of the contract (family, hidden, grid, pixels, encode_one, attends): the fixture's
    merged grid by the image's size, its flattened patches by the file's digest, its merger rows by patches
    (`folder`, `ref`, `files`: the fixture it serves; a subclass serves another's, `rows` its rows of an image)."""
    family, attends, tokens_per_image, hidden = "qwen2_5_vl", "causal", None, REF["config"]["text_config"]["hidden_size"]
    folder, ref, files = FOLDER, REF, FIX_PNG

    def __init__(self):
        import hashlib
        self.by_digest = {hashlib.sha256(self.files[n]).hexdigest(): n for n in self.ref["images"]}
        self.encoded = 0

    @staticmethod
    def load_image(data) -> str:
        import hashlib
        return hashlib.sha256(bytes(data)).hexdigest()

    def grid(self, width: int, height: int) -> tuple[int, int]:
        grids = {tuple(info["size"]): tuple(info["merged_grid"]) for info in self.ref["images"].values()}
        assert (width, height) in grids, f"no fixture image of {width} x {height}"
        return grids[width, height]

    def pixels(self, image) -> np.ndarray:
        name = self.by_digest.get(image)
        if name is None:
            raise InvalidInputError("the test tower knows only the fixture's images")
        return np.load(self.folder / self.ref["images"][name]["pixel_values"])

    def rows(self, info: dict) -> np.ndarray:
        return np.load(self.folder / info["merger_rows"])

    def encode_one(self, pixels: np.ndarray, grid: tuple) -> np.ndarray:
        self.encoded += 1
        for info in self.ref["images"].values():
            if np.array_equal(np.load(self.folder / info["pixel_values"]), pixels) and tuple(info["merged_grid"]) == grid:
                return self.rows(info)
        raise AssertionError("pixels of no fixture image")

    def close(self):
        pass


def fixture_model(mode: str, **kw):
    return load(FOLDER, mode, FixtureTower, **{"n_ctx": 128, **kw})


def fixture_messages(prompt: dict, images: dict = FIX_PNG) -> list:
    """The prompt's messages with its image parts as canonical ones holding the files' bytes (`images`: by name)."""
    files = iter(prompt["images"])
    return [{**msg, "content": [{"type": "image", "image": images[next(files)]} if p["type"] == "image" else dict(p)
                                for p in msg["content"]]} for msg in prompt["messages"]]


def fixture_blocks(prompt: dict) -> tuple:
    return tuple(image_block(lo, npy(REF["images"][name]["merger_rows"]), True,
                             tuple(REF["images"][name]["merged_grid"]))
                 for (lo, _), name in zip(prompt["image_runs"], prompt["images"]))


@pytest.mark.parametrize("mode", list(MODES))
def test_chat_gives_the_processor_ids_positions_logits_and_greedy_tokens(mode):
    """The chat template's text, the processor's input_ids (each image's merged grid from its header size),
    get_rope_index's positions and rope_deltas, the logits at the reference's rows (first and last token of
    each image, the tokens after each, the last three), every position's argmax, Model.chat's greedy answer,
    and the logits of each decode step after the images (transformers' recompute after each new token)."""
    with fixture_model(mode) as m:
        chat_matches_reference(m, TWO, FIX_PNG, FOLDER, BUDGET[mode])


def chat_matches_reference(m, prompt: dict, files: dict, folder: Path, budget: float) -> None:
    """The checks of test_chat_gives_the_processor_ids_positions_logits_and_greedy_tokens on `m` (a fixture's
    model, its tower attached) for the fixture's `prompt` (its images' bytes in `files`, its arrays in `folder`)."""
    def npy(name):
        return np.load(folder / name)

    msgs = fixture_messages(prompt, files)
    text = m.render_chat(msgs)
    assert text == prompt["chat_text"]
    ids, blocks = m.image_prompt(text, [files[n] for n in prompt["images"]])
    assert ids == prompt["input_ids"]
    assert [(b.start, b.end - 1) for b in blocks] == [tuple(r) for r in prompt["image_runs"]]
    assert np.array_equal(rope_rows(blocks, 0, len(ids)).T, np.array(prompt["position_ids"]))
    assert image_mod.rope_delta(blocks) == prompt["rope_deltas"]
    got = whole_logits(m, ids, blocks)
    err = float(np.abs(got[prompt["rows"]] - npy(prompt["logits_rows"])).max())
    assert err <= budget, f"max |logit diff| {err:.3g} > {budget}"
    assert got.argmax(axis=1).tolist() == prompt["argmax_per_position"]
    want = prompt["greedy_new_tokens"]
    evs = [ev for ev in m.chat_stream(msgs, max_tokens=len(want), temperature=0, ignore_eos=True) if ev.token >= 0]
    assert [ev.token for ev in evs] == want
    # row k of the reference chose new token k (argmax = want[k]): the prompt's last row, then each step's
    steps = whole_logits(m, ids + want, blocks)[len(ids) - 1:len(ids) - 1 + len(want)]
    ref_steps = npy(prompt["greedy_step_logits"])
    assert ref_steps.argmax(axis=1).tolist() == want
    # the library's own decode steps (the KV cache, positions from rope_delta): their logprobs
    lp = ref_steps - ref_steps.max(axis=1, keepdims=True)
    lp -= np.log(np.exp(lp).sum(axis=1, keepdims=True))
    evs = [ev for ev in m.stream(ids, images=blocks, max_tokens=len(want), temperature=0, ignore_eos=True,
                                 logprobs=1) if ev.token >= 0]
    assert [ev.token for ev in evs] == want
    err = max(abs(ev.logprob - lp[k, t]) for k, (ev, t) in enumerate(zip(evs, want)))
    assert err <= 2 * budget, f"decode steps' logprobs: max diff {err:.3g}"
    err = float(np.abs(steps - ref_steps).max())
    assert err <= budget, f"decode steps after the images: max |logit diff| {err:.3g} > {budget}"
    assert m.chat(msgs, max_tokens=len(want), temperature=0, ignore_eos=True) == m.tokenizer.decode(want)


@pytest.mark.parametrize("mode", list(MODES))
def test_text_only_prompt_matches_transformers(mode):
    with fixture_model(mode) as m:
        text_matches_reference(m, TEXT, FOLDER, BUDGET[mode])


def text_matches_reference(m, text_ref: dict, folder: Path, budget: float) -> None:
    """A fixture's text-only prompt on `m`: its chat text, ids, last three logits rows and greedy tokens."""
    text = m.render_chat(text_ref["messages"])
    assert text == text_ref["chat_text"]
    ids = m.tokenize(text)
    assert ids == text_ref["input_ids"]
    got = vlm_rows(m, ids)[-3:]
    assert float(np.abs(got - np.load(folder / text_ref["logits_last3"])).max()) <= budget
    want = text_ref["greedy_new_tokens"]
    assert list(m.generate(ids, max_tokens=len(want), temperature=0, ignore_eos=True)) == want


@pytest.mark.parametrize("max_batch", [3, 7, 16])
def test_fixture_chunked_prefill_gives_the_greedy_tokens(max_batch):
    with fixture_model("native-exact", max_batch=max_batch) as m:
        ids, blocks = m.image_prompt(TWO["chat_text"], [FIX_PNG[n] for n in TWO["images"]])
        want = TWO["greedy_new_tokens"]
        assert list(m.generate(ids, images=blocks, max_tokens=len(want), temperature=0, ignore_eos=True)) == want


def test_fixture_scheduler_batch_invariance_beside_text():
    rng = np.random.default_rng(11)
    texts = [rng.integers(7, 390, size=n).tolist() for n in (23, 9)]
    with fixture_model("native-exact", n_slots=4, max_batch=96) as m:
        same_beside_text(m, TWO["input_ids"], fixture_blocks(TWO), TWO["greedy_new_tokens"], texts)


def test_server_prepares_qwen25vl_requests():
    """The server's token count and prepared sequence are Model.image_prompt's, its rope_delta transformers'; no
    room is asked of the batch for a block (causal); each image is encoded once, in the image worker."""
    spec_of = vlm.chat_spec
    with fixture_model("native-exact", max_batch=8) as m:
        service, _ = vlm.service_for(m)
        spec = spec_of(fixture_messages(TWO))
        try:
            count = service._prompt_length(spec)
            prepared = service.prepare(spec)
            before, waiting = m.vision.encoded, not prepared.seqs and prepared.images is not None
            seq = service.encode(prepared).seqs[0][0]
        finally:
            service.workers.close()
            service.image_workers.close()
        assert count == len(TWO["input_ids"]) == len(seq.prompt_ids) and waiting
        assert (before, m.vision.encoded) == (0, 2) and seq.prompt_ids == TWO["input_ids"]
        assert seq.rope_delta == TWO["rope_deltas"]
        assert [b.digest for b in seq.images] == [b.digest for b in fixture_blocks(TWO)]


def test_server_refuses_image_tokens_without_their_image():
    """A text request (chat text or completion ids) holding the image pad token and no image: a 400, as the
    library's stream refuses it (the server had run the pad's text embedding where an image's rows belong)."""
    from llambda.server.errors import APIError
    from llambda.server.schemas import parse_completion
    with fixture_model("native-exact", max_batch=8) as m:
        pad = m.image_input.layout.soft
        with pytest.raises(InvalidInputError, match="no image fills"):
            list(m.stream([7, 8, pad, 9], max_tokens=1))
        service, _ = vlm.service_for(m)
        try:
            shown = m.tokenizer.decode([pad])
            with pytest.raises(APIError) as e:
                service.prepare(parse_completion({"prompt": [7, 8, pad, 9], "max_tokens": 2}))
            assert e.value.status == 400 and "no image fills" in str(e.value)
            # typed in a chat message the pad is text (Model.literal), not the token
            typed = service.prepare(vlm.chat_spec([{"role": "user", "content": f"look {shown} here"}]))
            assert pad not in typed.seqs[0][0].prompt_ids
            ok = service.prepare(parse_completion({"prompt": [7, 8, 9], "max_tokens": 2}))
            assert ok.seqs and ok.seqs[0][0].prompt_ids == [7, 8, 9]
        finally:
            service.workers.close()
            service.image_workers.close()


def test_llama_cpp_runs_our_qwen2vl_gguf(tmp_path):
    """llama.cpp loads our GGUF of the fixture's text model (architecture qwen2vl, four int32 section counts) and
    its text-only logits are transformers' (within test_export's f32 budget for llama.cpp, 0.05), as ours are."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the bench extra)")
    from llamacpp_ref import llama_cpp_logits
    from llambda.tools.export import export
    path = export(FOLDER, tmp_path / "text.gguf", fmt="gguf", qtype="f32")
    theirs = llama_cpp_logits(path, TEXT["input_ids"])
    assert float(np.abs(theirs - npy(TEXT["logits_last3"])[-1]).max()) <= 0.05
    with load(path, "numpy", tower=False) as m:
        assert m.config.arch == "qwen2vl" and m.tokenize(TEXT["chat_text"]) == TEXT["input_ids"]
        ours = vlm_rows(m, TEXT["input_ids"])[-1]
    assert float(np.abs(ours - npy(TEXT["logits_last3"])[-1]).max()) <= 1e-4


def test_a_text_gguf_finds_its_image_tokens_in_the_vocabulary(tmp_path):
    """llama.cpp's layout: the text GGUF has no config.json: <|vision_start|>, <|image_pad|>, <|vision_end|> come
    from its vocabulary; the image prompt and its logits are the reference's."""
    from llambda.tools.export import export
    path = export(FOLDER, tmp_path / "text.gguf", fmt="gguf", qtype="f32")
    with load(path, "native-exact", FixtureTower) as m:
        lay = m.image_input.layout
        assert (lay.start, lay.soft, lay.end) == (3, 5, 4)
        ids, blocks = m.image_prompt(TWO["chat_text"], [FIX_PNG[n] for n in TWO["images"]])
        assert ids == TWO["input_ids"]
        got = whole_logits(m, ids, blocks)[TWO["rows"]]
    assert float(np.abs(got - npy(TWO["logits_rows"])).max()) <= 1e-4


def test_speculative_decoding_on_text_prompts_and_not_on_images():
    """A text prompt on the Qwen2.5-VL model runs speculatively (a draft model of its own vocabulary, prompt
    lookup) and gives transformers' greedy tokens; an image prompt with an explicit mode is refused by name."""
    want = TEXT["greedy_new_tokens"]
    with fixture_model("native-exact", draft=FOLDER) as m:
        assert m.draft is not None and m.draft.config.rope_sections == [2, 3, 3]
        for mode in ("draft", "lookup"):
            got = list(m.generate(TEXT["input_ids"], max_tokens=len(want), temperature=0, ignore_eos=True,
                                  speculative=mode))
            assert got == want, mode
        ids, blocks = m.image_prompt(TWO["chat_text"], [FIX_PNG[n] for n in TWO["images"]])
        with pytest.raises(InvalidInputError, match="speculative"):
            m.stream(ids, images=blocks, speculative="draft")
        auto = list(m.generate(ids, images=blocks, max_tokens=8, temperature=0, ignore_eos=True))   # "auto": plain
        assert auto == TWO["greedy_new_tokens"]


# --- the whole model: its own tower (llambda.vision's Qwen2.5-VL, found by llambda.load) --------------------

REAL = {"numpy": ("numpy", None, 1e-4), "native-exact": ("native", "f32", 1e-4), "native-fast": ("native", None, 0.1)}


@pytest.mark.parametrize("mode", list(REAL))
def test_whole_model_with_its_own_tower_matches_transformers(mode):
    """No double: the folder's tower decodes, resizes and encodes the images; the chat's ids, the logits at the
    reference rows (the fast mode's bfloat16 tower within test_vlm_idefics3's budget for it) and the greedy
    tokens are transformers'."""
    with own_tower_model(FOLDER, mode) as m:
        assert m.vision is not None and m.vision.family == "qwen2_5_vl"
        own_tower_matches_reference(m, TWO, FIX_PNG, FOLDER, REAL[mode][2], [(3, 5), (3, 4)])


def own_tower_model(folder: Path, mode: str):
    backend, activations, _ = REAL[mode]
    if backend not in available_backends():
        pytest.skip(f"the {backend} backend is not available here (C core not built)")
    return llambda.load(folder, backend=backend, activations=activations, n_ctx=128)


def own_tower_matches_reference(m, prompt: dict, files: dict, folder: Path, budget: float, grids: list) -> None:
    """A fixture's model with its own tower: the chat's ids and merged grids, the logits at the reference rows
    within `budget`, the greedy tokens."""
    msgs = fixture_messages(prompt, files)
    ids, blocks = m.image_prompt(m.render_chat(msgs), [files[n] for n in prompt["images"]])
    assert ids == prompt["input_ids"] and [b.grid for b in blocks] == grids
    err = float(np.abs(whole_logits(m, ids, blocks)[prompt["rows"]] - np.load(folder / prompt["logits_rows"])).max())
    assert err <= budget, f"max |logit diff| {err:.3g} > {budget}"
    want = prompt["greedy_new_tokens"]
    assert [ev.token for ev in m.chat_stream(msgs, max_tokens=len(want), temperature=0, ignore_eos=True)
            if ev.token >= 0] == want


def test_text_gguf_with_our_mmproj_is_the_checkpoint(tmp_path):
    """llama.cpp's layout of Qwen2.5-VL: the text model as a qwen2vl GGUF (its image tokens found in the
    vocabulary) and the tower as a qwen2.5vl_merger mmproj, both written by llambda, loaded with mmproj=: the
    same prompt ids and logits as the checkpoint with its own tower (the fixture with llama.cpp's 112-pixel
    window, test_vision_qwen25vl's copy: the mmproj cannot say the fixture's own 56)."""
    from test_vision_qwen25vl import window112
    from llambda.tools.export import export
    from llambda.vision.mmproj import write_mmproj
    src = window112(tmp_path / "hf")
    gg = export(src, tmp_path / "text.gguf", fmt="gguf")
    proj = write_mmproj(src, tmp_path / "mmproj.gguf", "f32")
    images = [FIX_PNG[n] for n in TWO["images"]]
    out = []
    for path, extra in ((src, {}), (gg, {"mmproj": proj})):
        with llambda.load(path, backend="numpy", n_ctx=128, **extra) as m:
            assert m.accepts_images and m.image_marker == "<|vision_start|><|image_pad|><|vision_end|>"
            ids, blocks = m.image_prompt(TWO["chat_text"], images)
            out.append((ids, [b.grid for b in blocks], whole_logits(m, ids, blocks)))
    (ids_a, grids_a, a), (ids_b, grids_b, b) = out
    assert grids_a == grids_b == [(3, 5), (5, 6)]       # (this copy's max_pixels keeps the big image whole)
    assert ids_a == ids_b
    assert float(np.abs(a - b).max()) <= 1e-4


def _old_layout(dest: Path, model_type: str = "qwen2_5_vl") -> Path:
    """The fixture as the released checkpoints (transformers 4) store it: a flat config (rope_theta and
    rope_scaling {"type": "mrope", "mrope_section"} at the top), model.layers.* / visual.* names."""
    import shutil
    from llambda.formats.safetensors import open_safetensors_dir, write_safetensors
    dest.mkdir()
    for f in FOLDER.iterdir():
        if f.suffix == ".json" and f.name != "config.json" and f.name != "reference.json":
            shutil.copy(f, dest / f.name)
    cfg = json.loads((FOLDER / "config.json").read_text())
    text = cfg.pop("text_config")
    rope = text.pop("rope_parameters")
    flat = {**text, **cfg, "model_type": model_type, "rope_theta": rope["rope_theta"],
            "rope_scaling": {"type": "mrope", "mrope_section": rope["mrope_section"]}}
    (dest / "config.json").write_text(json.dumps(flat))
    st = open_safetensors_dir(FOLDER)
    try:
        renamed = {n.replace("model.language_model.", "model.").replace("model.visual.", "visual."): t
                   for n, t in st.tensors.items()}
        write_safetensors(dest / "model.safetensors", renamed)
    finally:
        st.close()
    return dest


class Qwen2VLTower(FixtureTower):
    family = "qwen2_vl"


@pytest.mark.parametrize("model_type", ["qwen2_5_vl", "qwen2_vl"])
def test_the_released_layout_and_qwen2_vl_read_the_same(tmp_path, model_type):
    """A flat transformers-4 config and the old tensor names, as Qwen/Qwen2.5-VL-*-Instruct ship, read as the same
    model; Qwen2-VL's language side (model_type qwen2_vl, a qwen2_vl tower) is the same: the reference logits."""
    folder = _old_layout(tmp_path / "old", model_type)
    tower = Qwen2VLTower if model_type == "qwen2_vl" else FixtureTower
    with load(folder, "numpy", tower, n_ctx=128) as m:
        assert m.config.rope_sections == [2, 3, 3] and m.image_input.layout.family == model_type
        ids, blocks = m.image_prompt(TWO["chat_text"], [FIX_PNG[n] for n in TWO["images"]])
        assert ids == TWO["input_ids"]
        err = float(np.abs(whole_logits(m, ids, blocks)[TWO["rows"]] - npy(TWO["logits_rows"])).max())
    assert err <= 1e-4, err


def test_an_ollama_qwen25vl_file_runs_text_and_tower_from_one_file(tmp_path):
    """Ollama's qwen2.5vl model file: one GGUF of architecture qwen25vl holding the text model (its M-RoPE sections
    under rope.mrope_section, three int32 counts, as Ollama's converter writes them) and the tower (v.*,
    qwen25vl.vision.*; test_vision_qwen25vl's copy of the fixture's tower as Ollama names it): llambda.load finds
    both, and the reference prompt gives transformers' ids, logits and greedy tokens."""
    from test_vision_qwen25vl import ollama_file
    from llambda.formats import gguf_writer
    from llambda.formats.gguf import GGUFFile
    from llambda.tools.export import export
    text = export(FOLDER, tmp_path / "text.gguf", fmt="gguf", qtype="f32")
    tower = ollama_file(tmp_path / "tower.gguf")
    meta, types, tensors = {}, {}, []
    for path, keep in ((text, lambda k: True), (tower, lambda k: k.startswith("qwen25vl.vision."))):
        f = GGUFFile(path)
        try:
            for k, v in f.metadata.items():
                if keep(k):
                    new = k.replace("qwen2vl.", "qwen25vl.", 1)
                    meta[new], types[new] = v, f.metadata_types[k]
            tensors += [(n, t.qtype, np.array(t.data), t.shape) for n, t in f.tensors.items()]
        finally:
            f.close()
    meta["general.architecture"] = "qwen25vl"
    del meta["qwen25vl.rope.dimension_sections"], types["qwen25vl.rope.dimension_sections"]
    meta["qwen25vl.rope.mrope_section"] = np.array([2, 3, 3], np.int32)
    one = tmp_path / "ollama.gguf"
    gguf_writer.write_gguf(one, meta, tensors, metadata_types=types)
    with llambda.load(one, backend="numpy", n_ctx=128) as m:
        assert m.config.arch == "qwen2vl" and m.config.rope_sections == [2, 3, 3]
        assert m.vision is not None and m.vision.family == "qwen2_5_vl"
        msgs = fixture_messages(TWO)
        ids, blocks = m.image_prompt(m.render_chat(msgs), [FIX_PNG[n] for n in TWO["images"]])
        assert ids == TWO["input_ids"]
        err = float(np.abs(whole_logits(m, ids, blocks)[TWO["rows"]] - npy(TWO["logits_rows"])).max())
        assert err <= 1e-4, err
        want = TWO["greedy_new_tokens"]
        assert [e.token for e in m.chat_stream(msgs, max_tokens=len(want), temperature=0, ignore_eos=True)
                if e.token >= 0] == want
