"""LLaVA-NeXT (llava_next) against transformers (tests/fixtures/reference/tiny/llava_next_vision,
tools/make_tiny_llava_next.py): the anyres preprocessing (the best pinpoint, the tiles of the padded resize, the
base crop), the packed rows (the tiles' rows unpadded to the image's aspect, image_newline a row, the base's
first), on numpy and native; the whole model through Model.chat (the processor's ids, logits, greedy tokens);
hostile configs."""
from __future__ import annotations

import json
import sys
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest

PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

import llambda  # noqa: E402
from llambda.backends import available_backends  # noqa: E402
from llambda.errors import InvalidInputError, ModelFormatError  # noqa: E402
from llambda.vision import load_vision  # noqa: E402
from llambda.vision.llava_next import best_resolution, feature_grid  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import test_vlm as vlm  # noqa: E402
import visionkit  # noqa: E402
from visionkit import EXACT  # noqa: E402

TINY, REF = visionkit.fixture("llava_next_vision")
PNG = {name: (TINY / name).read_bytes() for name in REF["images"]}
PROMPT = REF["prompts"][0]
numpy_tower = visionkit.numpy_tower_fixture(TINY)


@pytest.mark.parametrize("name", sorted(REF["images"]))
def test_crops_grid_and_rows_equal_transformers(numpy_tower, name):
    """Bit-identical crops (the base, then the tiles row-major), the token count the processor expands to, the
    packed rows (exact float32)."""
    entry, t = REF["images"][name], numpy_tower
    w, h = entry["size"]
    image = Image.open(TINY / name)
    np.testing.assert_array_equal(t.pixels(image), np.load(TINY / entry["pixel_values"]))
    r, c = t.grid(w, h)
    assert t.tokens_per_image + r * (c + 1) == entry["n_rows"]
    rows = t.encode_image(image)
    assert rows.shape == (entry["n_rows"], 64)
    assert np.abs(rows - np.load(TINY / entry["rows"])).max() <= EXACT


@pytest.mark.parametrize("activations, budget", [("f32", EXACT), (None, 0.06)])
def test_native_matches_transformers(activations, budget):
    if "native" not in available_backends():
        pytest.skip("the native backend is not available here (C core not built)")
    with closing(load_vision(TINY, backend="native", activations=activations)) as t:
        for name, entry in REF["images"].items():
            got = t.encode_image(Image.open(TINY / name))
            assert np.abs(got - np.load(TINY / entry["rows"])).max() <= budget


def test_best_resolution_and_unpadding_follow_transformers_rounding(numpy_tower):
    """select_best_resolution's ties (a tiny square image takes the first, least wasteful 1 x 2) and the
    unpadding's int(round(x, 7)); the grids of many sizes stay inside their tiles' grid, one side whole."""
    pins = numpy_tower.cfg.grid_pinpoints
    assert best_resolution(9, 9, pins) == (56, 112) and best_resolution(100, 100, pins) == (112, 112)
    assert best_resolution(300, 40, pins) == (56, 168)
    for w in range(1, 400, 23):
        for h in range(1, 400, 29):
            try:
                th, tw, r, c = feature_grid(w, h, numpy_tower.cfg)
            except InvalidInputError as e:      # nothing left of one side after the unpadding: thin images only
                assert "too thin" in str(e) and max(w / h, h / w) > 8, (w, h)
                continue
            assert 0 < r <= th * 4 and 0 < c <= tw * 4 and (r == th * 4 or c == tw * 4), (w, h)


def test_encode_image_refuses_what_is_not_an_image(numpy_tower):
    for bad in ("x", b"not an image", 3):
        with pytest.raises(InvalidInputError):
            numpy_tower.encode_image(bad)


@pytest.mark.parametrize("backend, activations, budget", [("numpy", None, 1e-4), ("native", "f32", 1e-4),
                                                          ("native", None, 0.1)])
def test_whole_model_matches_transformers(backend, activations, budget):
    """Model.chat with two images (a 1 x 2 and a 2 x 1 tile grid, unpadded rows and columns): the template's
    text, the processor's ids (each image's own count), logits, argmax and greedy tokens."""
    if backend not in available_backends():
        pytest.skip(f"the {backend} backend is not available here (C core not built)")
    files = iter(PROMPT["images"])
    msgs = [{**msg, "content": [{"type": "image", "image": PNG[next(files)]} if p["type"] == "image" else dict(p)
                                for p in msg["content"]]} for msg in PROMPT["messages"]]
    with llambda.load(TINY, backend=backend, activations=activations, n_ctx=256) as m:
        assert m.accepts_images and m.vision.family == "llava_next" and m.image_marker == "<image>"
        text = m.render_chat(msgs)
        assert text == PROMPT["chat_text"]
        ids, blocks = m.image_prompt(text, [PNG[n] for n in PROMPT["images"]])
        assert ids == PROMPT["input_ids"]
        assert [len(b.rows) for b in blocks] == [REF["images"][n]["n_rows"] for n in PROMPT["images"]]
        got = vlm.rows_logits(m, PROMPT, blocks)
        assert np.abs(got[PROMPT["rows"]] - np.load(TINY / PROMPT["logits_rows"])).max() <= budget
        if budget <= 1e-4:      # (the fast mode's bfloat16 tower flips one close pair at position 104)
            assert got.argmax(axis=1).tolist() == PROMPT["argmax_per_position"]
        n = len(PROMPT["greedy_new_tokens"])
        tokens = [ev.token for ev in m.chat_stream(msgs, max_tokens=n, temperature=0, ignore_eos=True)
                  if ev.token >= 0]
        assert tokens == PROMPT["greedy_new_tokens"]
        with pytest.raises(InvalidInputError, match="sizes"):      # a count cannot say the tokens
            m.image_ids(text, 2)


def test_an_image_larger_than_the_context_is_refused():
    with llambda.load(TINY, backend="numpy", n_ctx=48) as m:
        msgs = [{"role": "user", "content": [{"type": "image", "image": PNG["image_big.png"]}]}]
        with pytest.raises(llambda.errors.ContextOverflowError):
            m.chat(msgs, max_tokens=1)


@pytest.mark.parametrize("config_edit, pre_edit, match", [
    (lambda c: c.update(image_grid_pinpoints=[[56, 100]]), None, "image_grid_pinpoints"),
    (lambda c: c.update(image_grid_pinpoints=[]), None, "image_grid_pinpoints"),
    (lambda c: c.update(image_grid_pinpoints=[[56, 56 * 9]]), None, "image_grid_pinpoints"),
    (lambda c: c.update(image_grid_pinpoints="56x112"), None, "image_grid_pinpoints"),
    (lambda c: c.update(vision_feature_select_strategy="full"), None, "full"),
    (None, lambda p: p.update(image_grid_pinpoints=[[56, 112]]), "not config.json's"),
])
def test_hostile_configs_are_refused(tmp_path, config_edit, pre_edit, match):
    visionkit.refused(TINY, tmp_path / "d", match, config_edit=config_edit, pre_edit=pre_edit)


def test_a_missing_image_newline_is_refused(tmp_path):
    visionkit.refused(TINY, tmp_path / "d", "image_newline", tensors_edit=lambda t: t.pop("image_newline"))


def test_memory_plan_counts_the_tiles():
    from llambda.vision.load import open_layout
    layout = open_layout(TINY)
    try:
        c = layout.cfg
        assert c.max_tiles == 4 and c.workspace_bytes() > 5 * c.mm_tokens_per_image * c.text_hidden_size * 4
    finally:
        for close in layout.closers:
            close()
    assert ModelFormatError     # (imported for the refusals above)


def test_token_counts_on_llava_v1_6_settings_equal_the_processors():
    """LlavaNextProcessor's counts (reference.json, made by the tool on llava-v1.6's 336 / 14 / default pinpoints)
    for 31 image sizes from 1 x 1 to 2048 x 1500: 576 + r (c + 1) of our grid."""
    from llambda.vision.llava_config import LlavaVisionConfig
    from llambda.vision.llava_layouts import NEXT_PINPOINTS
    cfg = LlavaVisionConfig.from_fields({"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24,
                                         "num_attention_heads": 16, "image_size": 336, "patch_size": 14,
                                         "text_hidden_size": 4096, "grid_pinpoints": NEXT_PINPOINTS})
    got = []
    for w, h, want in REF["llava_v1_6_counts"]["width_height_tokens"]:
        _, _, r, c = feature_grid(w, h, cfg)
        got.append([w, h, cfg.mm_tokens_per_image + r * (c + 1)])
    assert got == REF["llava_v1_6_counts"]["width_height_tokens"]


def test_real_settings_crops_equal_transformers_bit_for_bit():
    """At llava-v1.6's own settings (336, the default pinpoints) the base crop and tiles of images from 7 x 9 to
    1000 x 40 are LlavaNextImageProcessor's bit for bit (their sha256 recorded by the tool)."""
    import hashlib
    from llambda.vision.llava_layouts import NEXT_PINPOINTS
    from llambda.vision.llava_next import next_pixels
    from test_vision_llava import pattern, real_config
    cfg = real_config(grid_pinpoints=NEXT_PINPOINTS)
    for w, h, digest in REF["llava_v1_6_pixels"]["width_height_sha256"]:
        px = next_pixels(Image.fromarray(pattern(w, h)), cfg)
        assert hashlib.sha256(np.ascontiguousarray(px, np.float32).tobytes()).hexdigest() == digest, (w, h)
