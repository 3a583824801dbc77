"""LLaVA-NeXT (1.6) as llama.cpp's mlp mmproj with image_grid_pinpoints (the file Ollama's llava models carry): our
write_mmproj of the tiny llava_next directory (tests/fixtures/reference/tiny/llava_next_vision) in F32 / F16 /
Q8_0, read back; llama.cpp's own preprocessing for such a file (llava_next_cpp.py: no tiles for an image within
S x S, float32 pinpoint choice and resize); libmtmd (llama-cpp-python 0.3.36) reading our file; a text GGUF beside
it through Model.chat against the directory; the legacy converter's spelling (model.image_newline); hostile
files."""
from __future__ import annotations

import sys
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest

PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

import llambda  # noqa: E402
from llambda.backends import available_backends  # noqa: E402
from llambda.errors import ModelFormatError  # noqa: E402
from llambda.formats import gguf, gguf_writer, quants  # noqa: E402
from llambda.vision import llava_next, llava_next_cpp, load_vision  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import test_vlm as vlm  # noqa: E402
import visionkit  # noqa: E402
from test_llava_next import PNG, PROMPT, REF, TINY, numpy_tower  # noqa: E402,F401  (the fixture, its tower)
from visionkit import EXACT  # noqa: E402

TILED = ("image_wide.png", "image_tall.png", "image_big.png")      # larger than 56 on a side: llama.cpp tiles them


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return visionkit.write_mmprojs(TINY, tmp_path_factory.mktemp("llava_next_mmproj"))


def test_written_in_llama_cpp_spelling(files):
    """The LLaVA 1.5 keys and tensors, plus the pinpoints flattened as (width, height) pairs in the config's order
    (the directory's are (height, width)), spatial_unpad and v.image_newline [text width]."""
    with gguf.GGUFFile(files["f32"]) as f:
        m, t = f.metadata, f.tensors
        assert m["clip.projector_type"] == "mlp" and m["clip.has_llava_projector"] is True
        pins = [int(x) for x in m["clip.vision.image_grid_pinpoints"]]
        want = [x for h, w in REF["config"]["image_grid_pinpoints"] for x in (w, h)]
        assert pins == want and pins[:2] == [112, 56]
        assert m["clip.vision.mm_patch_merge_type"] == "spatial_unpad"
        assert tuple(t["v.image_newline"].shape) == (64,) and "model.image_newline" not in t
        assert list(m["clip.vision.feature_layer"]) == [2] and int(m["clip.vision.block_count"]) == 2


@pytest.mark.parametrize("qtype, budget", [("f32", 0.0), ("f16", 5e-3), ("q8_0", 0.08)])
@pytest.mark.parametrize("backend", ["numpy", "native"])
def test_round_trip_gives_the_directorys_rows(files, numpy_tower, qtype, budget, backend):
    """Read back (pinpoints as (height, width) again, llama.cpp's preprocessing): transformers' packed rows for
    every image llama.cpp tiles (the fixture's three: the same pinpoint, resize and tiles here), within F16's /
    Q8_0's rounding (measured 2.2e-3 / 0.057); the newline rows are the directory's vector."""
    if backend not in available_backends():
        pytest.skip("the native backend is not available here (C core not built)")
    with closing(load_vision(files[qtype], backend=backend, activations="f32")) as t:
        assert t.family == "llava_next" and t.cfg.preprocess == "anyres_cpp"
        assert t.cfg.grid_pinpoints == numpy_tower.cfg.grid_pinpoints
        for name in TILED:
            image = Image.open(TINY / name)
            assert t.grid(*image.size) == numpy_tower.grid(*image.size)
            np.testing.assert_array_equal(t.pixels(image), numpy_tower.pixels(image))
            got, want = t.encode_image(image), np.load(TINY / REF["images"][name]["rows"])
            assert got.shape == want.shape and np.abs(got - want).max() <= max(budget, EXACT), name


def test_an_image_within_the_tower_size_is_not_tiled(files, numpy_tower):
    """llama.cpp tiles only an image larger than S on a side: the 9 x 7 image is its base crop alone (16 rows, the
    directory's base rows), where transformers adds its 2 x 2 tiles' unpadded grid."""
    name = "image_small.png"
    image = Image.open(TINY / name)
    with closing(load_vision(files["f32"], backend="numpy")) as t:
        assert t.grid(9, 7) == (0, 0) and t.grid(56, 56) == (0, 0) and t.grid(57, 56) != (0, 0)
        assert t.pixels(image).shape == (1, 3, 56, 56)
        rows = t.encode_image(image)
        assert rows.shape == (16, 64)
        want = np.load(TINY / REF["images"][name]["rows"])
        assert want.shape[0] == REF["images"][name]["n_rows"] > 16
        np.testing.assert_allclose(rows, want[:16], atol=EXACT, rtol=0)


def test_llama_cpp_choices_in_float32():
    """The pinpoint and the resize llama.cpp computes in float32 against transformers' float64, on the sizes of
    llava-v1.6 (336, the default pinpoints) that both tile: the same pinpoints; the same resize but where the
    exact product is an integer float32 rounds up (1435 x 2352: 1435 * 672 / 2352 = 410, llama.cpp's ceil of
    410.00003 gives 411 columns); the pinpoint order is the file's."""
    from llambda.vision.llava_layouts import NEXT_PINPOINTS
    pins = [tuple(p) for p in NEXT_PINPOINTS]
    differ = []
    for w in range(337, 2400, 61):
        for h in range(20, 2400, 53):
            a, b = llava_next_cpp.best_resolution(w, h, pins), llava_next.best_resolution(w, h, pins)
            assert a == b, (w, h)
            cpp, hf = llava_next_cpp.resized_size(w, h, *a), llava_next.resized_size(w, h, *a)
            if cpp != hf:
                differ.append((w, h, cpp, hf))
    assert differ == [(1435, 2352, (411, 672), (410, 672))]
    assert llava_next_cpp.best_resolution(400, 400, [(336, 672), (672, 336)]) == (336, 672)     # the first of equals


def cpp_rows(files, rgb, tmp_path, qtype="f32") -> tuple[list, list]:
    """(llama.cpp's chunks for the image, the transcription of its graph over our crops in its chunk order: the
    tiles row-major, then the base crop)."""
    from test_vision_llava import cpp_graph_rows
    from llambda.vision.load import open_layout
    got = visionkit.llama_cpp_rows(files[qtype], rgb, tmp_path)
    layout = open_layout(TINY)
    try:
        with closing(load_vision(files[qtype], backend="numpy")) as t:
            px = t.pixels(Image.fromarray(rgb))
        want = [cpp_graph_rows(layout.cfg, layout.lookup, p.astype(np.float64)) for p in px]
    finally:
        for close in layout.closers:
            close()
    return got, want[1:] + want[:1]


@pytest.mark.parametrize("qtype", ["f32", "f16"])
def test_llama_cpp_reads_our_mmproj(files, tmp_path, qtype):
    """libmtmd (llama-cpp-python 0.3.36) loads our file and, for images wide, tall, square-within-S and large,
    makes the crops we make (the same pinpoint and tile count; an image within 56 x 56 the base alone) and gives
    a chunk of 16 rows per crop, the tiles first and the base last, each the transcription of its graph over our
    pixels (tiles within 5e-3 of values up to 4.5, measured 3.5e-3; a base crop resized by its own bicubic
    within 0.05, measured 0.039). Its layout is not LLaVA-NeXT's: no unpadding, no image_newline, the base after
    the tiles, 16 (1 + tiles) tokens (asserted, so a llama.cpp that lays them out as transformers shows here),
    besides its class-token order (test_vision_llava; each chunk asserted to differ from our crop's rows)."""
    with closing(load_vision(files[qtype], backend="numpy")) as t:
        for h, w in ((40, 75), (61, 30), (50, 50), (100, 130), (56, 112)):
            rgb = visionkit.rgb_image(h, w)
            got, want = cpp_rows(files, rgb, tmp_path, qtype)
            th, tw, r, c = llava_next_cpp.feature_grid(w, h, t.cfg)
            assert [g.shape for g in got] == [(16, 64)] * (1 + th * tw), (h, w)
            ours = t.encode(t.pixels(Image.fromarray(rgb)))
            ours = list(ours[1:]) + [ours[0]]           # (in its chunk order)
            for k, (g, x) in enumerate(zip(got, want)):
                base = k == len(got) - 1
                assert np.abs(g - x).max() <= (0.05 if base else 5e-3), (h, w, k, float(np.abs(g - x).max()))
                assert np.abs(g - ours[k]).max() > 0.5, "llama.cpp now agrees with LLaVA's class order"
            if th:
                assert sum(len(g) for g in got) != 16 + r * (c + 1), "llama.cpp now unpads with newlines"


def test_text_gguf_with_our_mmproj_matches_the_directory(files, tmp_path):
    """llama.cpp's (and Ollama's) layout of a LLaVA 1.6: the text model as a plain llama GGUF (its <image> from the
    vocabulary, no config) beside our mmproj, loaded with mmproj=: the fixture's two-image prompt (both images
    tiled by llama.cpp too) gives the processor's ids (each image's count 16 + r (c + 1)), the directory's logits
    and transformers' greedy tokens."""
    from llambda.tools.export import export
    text = export(TINY, tmp_path / "text.gguf", fmt="gguf")
    files_ = iter(PROMPT["images"])
    msgs = [{**msg, "content": [{"type": "image", "image": PNG[next(files_)]} if p["type"] == "image" else dict(p)
                                for p in msg["content"]]} for msg in PROMPT["messages"]]
    with llambda.load(TINY, backend="numpy", n_ctx=256) as hf, \
            llambda.load(text, mmproj=files["f32"], backend="numpy", n_ctx=256) as m:
        assert m.accepts_images and m.vision.family == "llava_next" and m.image_marker == "<image>"
        assert m.source.metadata.get("hf.config") is None
        images = [PNG[n] for n in PROMPT["images"]]
        ids, blocks = m.image_prompt(PROMPT["chat_text"], images)
        assert ids == PROMPT["input_ids"] == hf.image_prompt(PROMPT["chat_text"], images)[0]
        assert [len(b.rows) for b in blocks] == [REF["images"][n]["n_rows"] for n in PROMPT["images"]]
        got = vlm.rows_logits(m, PROMPT, blocks)
        assert np.abs(got[PROMPT["rows"]] - np.load(TINY / PROMPT["logits_rows"])).max() <= 1e-4
        n = len(PROMPT["greedy_new_tokens"])
        tokens = [ev.token for ev in m.chat_stream(msgs, max_tokens=n, temperature=0, ignore_eos=True)
                  if ev.token >= 0]
        assert tokens == PROMPT["greedy_new_tokens"]
        small = [{"role": "user", "content": [{"type": "image", "image": PNG["image_small.png"]}]}]
        text_small = m.render_chat(small)
        assert len(m.image_prompt(text_small, [PNG["image_small.png"]])[1][0].rows) == 16      # not tiled
        assert len(m.image_prompt(text_small, [PNG["image_small.png"]])[0]) < len(hf.image_prompt(
            text_small, [PNG["image_small.png"]])[0])
        assert isinstance(m.chat(small, max_tokens=2, temperature=0, ignore_eos=True), str)


def legacy(meta):
    """The legacy converter's spelling: no feature_layer (block_count the stored blocks), the original LLaVA
    config's copies llama.cpp ignores."""
    meta.pop("clip.vision.feature_layer")
    meta.update({"clip.vision.image_crop_resolution": 224, "clip.vision.image_aspect_ratio": "anyres",
                 "clip.vision.image_split_resolution": 224, "clip.vision.mm_projector_type": "mlp2x_gelu"})


def test_the_legacy_converters_file_reads_the_same(files, tmp_path, numpy_tower):
    """Ollama's llava files (convert_image_encoder_to_gguf.py over llava_surgery_v2.py's output): the newline as
    `model.image_newline`, no feature_layer, the original config's extra keys: the same rows."""
    with gguf.GGUFFile(files["f32"]) as f:
        meta = dict(f.metadata)
        legacy(meta)
        tensors = [("model.image_newline" if n == "v.image_newline" else n, quants.QType.F32,
                    np.ascontiguousarray(t.as_float32())) for n, t in f.tensors.items()]
    renamed = tmp_path / "legacy.gguf"
    gguf_writer.write_gguf(renamed, meta, tensors)
    image = Image.open(TINY / "image_wide.png")
    with closing(load_vision(renamed, backend="numpy")) as t:
        np.testing.assert_array_equal(t.encode_image(image), numpy_tower.encode_image(image))


def _pins(v):
    return lambda m: m.update({"clip.vision.image_grid_pinpoints": v})


@pytest.mark.parametrize("meta_edit, drop, match", [
    (_pins([]), (), "image_grid_pinpoints"),
    (_pins([112, 56, 56]), (), "image_grid_pinpoints"),                    # not pairs
    (_pins([112, 50]), (), "image_grid_pinpoints"),                        # not a multiple of 56
    (_pins([56 * 9, 56]), (), "image_grid_pinpoints"),                     # more than 8 tiles a side
    (_pins([2 ** 30, 2 ** 30]), (), "image_grid_pinpoints"),               # absurd
    (_pins([-56, 56]), (), "image_grid_pinpoints"),
    (_pins([56, 112] * 65), (), "image_grid_pinpoints"),                  # too many
    (_pins("112x56"), (), "image_grid_pinpoints"),
    (_pins([112.0, 56.0]), (), "image_grid_pinpoints"),                   # floats
    (lambda m: m.update({"clip.vision.mm_patch_merge_type": "flat"}), (), "mm_patch_merge_type"),
    (lambda m: m.pop("clip.vision.mm_patch_merge_type"), (), "mm_patch_merge_type"),
    (None, ("v.image_newline",), "image_newline"),
])
def test_hostile_files_are_refused(files, tmp_path, meta_edit, drop, match):
    with pytest.raises(ModelFormatError, match=match):
        load_vision(visionkit.rewrite_gguf(files["f32"], tmp_path / "bad.gguf", meta_edit, drop), "numpy")


def test_a_newline_of_another_width_is_refused(files, tmp_path):
    with gguf.GGUFFile(files["f32"]) as f:
        meta = dict(f.metadata)
        tensors = [(n, quants.QType.F32, np.zeros(32, np.float32) if n == "v.image_newline"
                    else np.ascontiguousarray(t.as_float32())) for n, t in f.tensors.items()]
    gguf_writer.write_gguf(tmp_path / "bad.gguf", meta, tensors)
    with pytest.raises(ModelFormatError, match="image_newline"):
        load_vision(tmp_path / "bad.gguf", "numpy")


def test_ollamas_vocabulary_without_the_image_token(files, tmp_path):
    """Ollama's llava 1.6 text GGUF has no <image> in its vocabulary (converted from the original checkpoints): the
    image's tokens are its <unk>, their embeddings our mmproj's rows all the same: the directory's logits."""
    from llambda.tools.export import export
    soft = REF["image_token_id"]

    def rename(meta):
        tokens = list(meta["tokenizer.ggml.tokens"])
        tokens[soft] = "<imagx>"
        meta["tokenizer.ggml.tokens"] = tokens
    text = visionkit.rewrite_gguf(export(TINY, tmp_path / "text.gguf", fmt="gguf"), tmp_path / "no_image.gguf",
                                  meta_edit=rename)
    images = [PNG[n] for n in PROMPT["images"]]
    with llambda.load(text, mmproj=files["f32"], backend="numpy", n_ctx=256) as m:
        assert m.image_marker == "<unk>"
        ids, blocks = m.image_prompt(PROMPT["chat_text"].replace("<image>", "<unk>"), images)
        assert ids == [0 if t == soft else t for t in PROMPT["input_ids"]]
        got = vlm.rows_logits(m, {"input_ids": ids}, blocks)
        assert np.abs(got[PROMPT["rows"]] - np.load(TINY / PROMPT["logits_rows"])).max() <= 1e-4
