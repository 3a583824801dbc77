"""LFM2-VL's vision tower against transformers (tests/fixtures/reference/tiny/lfm2vl_vision,
tools/make_tiny_lfm2vl.py): the image processor's layout (tiles, thumbnail, smart_resize) and patches, the SigLIP2
NaFlex tower's last hidden state and the projector's rows per crop, on the NumPy oracle and the native backend
(exact and default); hostile configs."""
from __future__ import annotations

import sys
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("PIL")

from llambda.backends import available_backends  # noqa: E402
from llambda.errors import InvalidInputError, ModelFormatError  # noqa: E402
from llambda.vision import load_image, load_vision  # noqa: E402
from llambda.vision.image import check_image  # noqa: E402
from llambda.vision.lfm2vl import axis_weights  # noqa: E402
from llambda.vision.lfm2vl_pixels import crop_count  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import visionkit  # noqa: E402

TINY, REF = visionkit.fixture("lfm2vl_vision")
IMAGES = sorted(REF["images"])
EXACT = visionkit.EXACT
BF16 = 0.05         # the native default's bfloat16 products after 2 random layers (seen: 0.018 hidden, 0.016 rows)
# Pillow's BILINEAR against torch's uint8 antialiased interpolate (transformers' torchvision resize): one level on
# a few values of a downscale (seen: 2/255 in (x - 127.5) / 127.5 on at most 0.7% of them)
ONE_LEVEL = 2 / 255 + 1e-6

numpy_tower = visionkit.numpy_tower_fixture(TINY)


def ref(name: str) -> np.ndarray:
    return np.load(TINY / name)


@pytest.mark.parametrize("name", IMAGES)
def test_layout_and_patches_match_transformers(numpy_tower, name):
    entry, data = REF["images"][name], (TINY / name).read_bytes()
    assert check_image(data) == tuple(entry["size"])
    rows, cols, th, tw = numpy_tower.grid(*entry["size"])
    assert [rows, cols] == entry["tiles"]
    assert [th * 16, tw * 16] == entry["thumbnail_hw"]
    crops = numpy_tower.pixels(load_image(data))
    assert len(crops) == crop_count(rows, cols, numpy_tower.cfg) == len(entry["crops"])
    for (px, grid), want in zip(crops, entry["crops"]):
        assert list(grid) == want["grid"]
        expect = ref(want["pixels"])
        assert px.dtype == np.float32 and px.shape == expect.shape
        diff = np.abs(px - expect)
        assert diff.max() <= ONE_LEVEL and (diff > 0).mean() < 0.01, (float(diff.max()), float((diff > 0).mean()))


def test_an_upscaled_image_is_bit_identical(numpy_tower):
    (px, _), = numpy_tower.pixels(load_image((TINY / "image_small.png").read_bytes()))
    np.testing.assert_array_equal(px, ref(REF["images"]["image_small.png"]["crops"][0]["pixels"]))


def test_position_weights_are_antialiased_bilinear():
    """Per axis: upsampling is bilinear with half-pixel centres (edges clamped); downsampling averages a support
    that grows with the scale; every row sums to 1."""
    up = axis_weights(8, 4)
    np.testing.assert_allclose(up.sum(1), 1, atol=1e-6)
    np.testing.assert_allclose(up[0], [1, 0, 0, 0], atol=1e-7)          # centre -0.25: clamped to the first
    np.testing.assert_allclose(up[1], [0.75, 0.25, 0, 0], atol=1e-7)    # centre 0.25
    down = axis_weights(2, 6)                                           # scale 3: support 3, centres 1 and 4
    np.testing.assert_allclose(down[0], np.array([2, 3, 2, 1, 0, 0]) / 8, atol=1e-6)
    np.testing.assert_allclose(axis_weights(6, 6), np.eye(6), atol=1e-7)


def check(tower, budget_hidden: float, budget_rows: float) -> dict:
    hidden, rows = [], []
    for entry in REF["images"].values():
        for c in entry["crops"]:
            px, grid = ref(c["pixels"]), tuple(c["grid"])
            hidden.append(np.abs(tower.last_hidden_state(px, grid) - ref(c["hidden"])).max())
            rows.append(np.abs(tower.encode_one(px, grid) - ref(c["rows"])).max())
    return visionkit.within(hidden, rows, budget_hidden, budget_rows)


def test_numpy_tower_matches_transformers(numpy_tower):
    check(numpy_tower, EXACT, EXACT)


@pytest.mark.parametrize("activations,budget", [("f32", EXACT), (None, BF16)])
def test_native_tower_matches_transformers(activations, budget):
    if "native" not in available_backends():
        pytest.skip("the native backend is not available here (C core not built)")
    with closing(load_vision(TINY, backend="native", activations=activations)) as t:
        check(t, budget, budget)


def test_tower_members(numpy_tower):
    t = numpy_tower
    assert (t.family, t.tokens_per_image, t.attends, t.deepstack, t.hidden, t.tile_tokens) == (
        "lfm2_vl", None, "causal", 0, 64, 16)


def test_bad_encode_calls(numpy_tower):
    c = REF["images"]["image_mid.png"]["crops"][0]
    px, (gh, gw) = ref(c["pixels"]), c["grid"]
    for bad in ((gh, gw + 2), (gh + 2, gw), (gh * gw, 1), (0, 0), f"{gh}x{gw}", (float(gh), float(gw)),
                (gh, gw, 1), (True, gh * gw), None, (gw * 2, gh // 2)):
        with pytest.raises(InvalidInputError):
            numpy_tower.encode_one(px, bad)
    with pytest.raises(InvalidInputError):
        numpy_tower.encode_one(px[:, :100], (gh, gw))
    bad = px.copy()
    bad[3, 7] = np.nan
    with pytest.raises(InvalidInputError, match="non-finite"):
        numpy_tower.encode_one(bad, (gh, gw))
    with pytest.raises(InvalidInputError):      # more patches than a crop can have
        numpy_tower.encode_one(np.zeros((80 * 80, px.shape[1]), np.float32), (80, 80))
    for image in ("not an image", b"not an image"):
        with pytest.raises(InvalidInputError):
            numpy_tower.pixels(image)
    for bad in (0, -3, 1.5, True, "9", 1 << 21):
        with pytest.raises(InvalidInputError):
            numpy_tower.grid(bad, 10)


@pytest.mark.parametrize("size", [(1, 1), (1, 700), (700, 1), (4000, 30), (999, 1001), (512, 512), (3, 90)])
def test_layouts_are_bounded(numpy_tower, size):
    """Any size: tiles within max_tiles, the crop within the patches a crop may have (a thinner image refused as
    InvalidInputError), pixels() agreeing with grid() for the small ones."""
    c = numpy_tower.cfg
    w, h = size
    if max(w, h) / min(w, h) > 40:
        with pytest.raises(InvalidInputError, match="too thin"):
            numpy_tower.grid(w, h)
        return
    rows, cols, th, tw = numpy_tower.grid(w, h)
    assert th >= 1 and tw >= 1 and th * tw * 4 <= c.max_crop_patches
    assert rows * cols == 1 or c.min_tiles <= rows * cols <= c.max_tiles
    if w * h <= 1_000_000:
        from PIL import Image
        im = Image.fromarray(visionkit.rgb_image(h, w), "RGB")
        crops = numpy_tower.pixels(im)
        assert len(crops) == crop_count(rows, cols, c)
        assert tuple(crops[-1][1]) == (th * 2, tw * 2)


HOSTILE = [
    ({"config_edit": visionkit.vision_edit(num_patches=35)}, "num_patches"),
    ({"config_edit": visionkit.vision_edit(hidden_size=33)}, "hidden_size"),
    ({"config_edit": visionkit.vision_edit(patch_size=0)}, "patch_size"),
    ({"config_edit": visionkit.vision_edit(hidden_act="relu")}, "hidden_act"),
    ({"config_edit": lambda c: c.update(projector_hidden_act="silu")}, "projector_hidden_act"),
    ({"config_edit": lambda c: c.update(downsample_factor=3)}, "downsample_factor"),
    ({"config_edit": lambda c: c.update(downsample_factor="2")}, "downsample_factor"),
    ({"config_edit": lambda c: c.update(vision_feature_layer=-2)}, "vision_feature_layer"),
    ({"config_edit": lambda c: c.update(projector_use_layernorm="yes")}, "projector_use_layernorm"),
    ({"config_edit": lambda c: c.update(projector_hidden_size=47)}, "linear_1"),
    ({"config_edit": lambda c: c["text_config"].update(hidden_size=None)}, "text_config.hidden_size"),
    ({"pre_edit": lambda p: p.update(encoder_patch_size=16)}, "encoder_patch_size"),
    ({"pre_edit": lambda p: p.update(max_image_tokens=10 ** 9)}, "max_image_tokens"),
    ({"pre_edit": lambda p: p.update(min_image_tokens=17)}, "min_image_tokens"),
    ({"pre_edit": lambda p: p.update(tile_size=60)}, "tile_size"),
    ({"pre_edit": lambda p: p.update(tile_size=1 << 20)}, "tile_size"),
    ({"pre_edit": lambda p: p.update(min_tiles=5)}, "min_tiles"),
    ({"pre_edit": lambda p: p.update(min_tiles=1)}, "min_tiles"),
    ({"pre_edit": lambda p: p.update(max_pixels_tolerance=float("nan"))}, "max_pixels_tolerance"),
    ({"pre_edit": lambda p: p.update(image_std=[0.5, 0, 0.5])}, "image_std"),
    ({"pre_edit": lambda p: p.update(resample=3)}, "resample"),
    ({"pre_edit": lambda p: p.update(use_thumbnail=1)}, "use_thumbnail"),
    ({"tensors_edit": lambda t: t.pop("model.multi_modal_projector.linear_2.bias")}, "linear_2.bias"),
    ({"tensors_edit": lambda t: t.__setitem__("model.vision_tower.embeddings.position_embedding.weight",
                                              np.full((36, 32), np.inf, np.float32))}, "non-finite"),
    ({"tensors_edit": lambda t: t.__setitem__("model.vision_tower.embeddings.patch_embedding.weight",
                                              np.zeros((32, 3, 8, 8), np.float32))}, "patch_embedding"),
]


@pytest.mark.parametrize("edits,match", HOSTILE, ids=[m + str(i) for i, (_, m) in enumerate(HOSTILE)])
def test_hostile_configs_are_typed_errors(tmp_path, edits, match):
    visionkit.refused(TINY, tmp_path / "m", match, **edits)


def test_a_hostile_config_loads_the_model_for_text(tmp_path):
    """A tower that cannot be read costs the images only: the text model loads, with a warning naming why."""
    import warnings

    import llambda
    src = visionkit.copy_fixture(TINY, tmp_path / "m", config_edit=visionkit.vision_edit(num_patches=35))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with llambda.load(src, backend="numpy") as m:
            assert m.vision is None
    assert any("num_patches" in str(w.message) for w in seen)
    with pytest.raises(ModelFormatError):
        load_vision(src, backend="numpy")


# ---------------------------------------------------------------- llama.cpp's mmproj

MMPROJ_BUDGET = {"f32": EXACT, "f16": 5e-3, "q8_0": 8e-2}     # seen: 2e-6, 1.7e-3, 3.4e-2 of values up to 3.6
CONTROL = ("<|image_start|>", "<|image_end|>", "<|img_thumbnail|>")


@pytest.fixture(scope="module")
def mmprojs(tmp_path_factory):
    return visionkit.write_mmprojs(TINY, tmp_path_factory.mktemp("mmproj"))


@pytest.mark.parametrize("qtype", ["f32", "f16", "q8_0"])
def test_our_mmproj_reads_back_as_the_directory(mmprojs, qtype):
    from llambda.formats import gguf
    with gguf.GGUFFile(mmprojs[qtype]) as f:
        meta, names = f.metadata, set(f.tensors)
        assert (meta["clip.projector_type"], int(meta["clip.vision.projector.scale_factor"])) == ("lfm2", 2)
        assert {"v.patch_embd.weight", "v.position_embd.weight", "v.post_ln.weight", "mm.input_norm.weight",
                "mm.1.weight", "mm.2.bias", "v.blk.1.ffn_down.weight"} <= names
        assert list(f.tensors["v.patch_embd.weight"].shape) == [32, 3, 8, 8]
    with closing(load_vision(mmprojs[qtype], backend="numpy")) as t:
        assert (t.cfg.tile_size, t.cfg.max_image_tokens, t.cfg.projector_hidden_size) == (64, 16, 48)
        budget = MMPROJ_BUDGET[qtype]
        check(t, budget if qtype == "f32" else 1.0, budget)


@pytest.fixture(scope="module")
def llama_cpp_like(tmp_path_factory):
    """The fixture with llama.cpp's own processor settings (its lfm2 preprocessor's constants), its F32 and F16
    mmprojs, and its tower."""
    from llambda.vision import mmproj
    from llambda.vision.lfm2vl_mmproj import LLAMA_CPP_PROCESSOR
    tmp = tmp_path_factory.mktemp("lfm2vl_llama_cpp")
    src = visionkit.copy_fixture(TINY, tmp / "m", pre_edit=lambda p: p.update(LLAMA_CPP_PROCESSOR))
    files = {q: mmproj.write_mmproj(src, tmp / f"{q}.gguf", q) for q in ("f32", "f16")}
    with closing(load_vision(src, backend="numpy")) as t:
        yield t, files, tmp


@pytest.mark.parametrize("size", [(192, 128), (1024, 512)])
def test_llama_cpp_reads_our_mmproj(llama_cpp_like, size):
    """libmtmd on our F32 and F16 files gives our rows: a 192 x 128 image kept as it is (96 tokens), and a 1024 x 512
    one cut into 1 x 2 tiles of 512 and a 352 x 176 thumbnail, in the same order; within 3e-3 of values up to 3.5
    (its projector's GELU is the tanh form, transformers' exact)."""
    from PIL import Image
    tower, files, tmp = llama_cpp_like
    w, h = size
    rgb = visionkit.rgb_image(h, w)
    ours = [tower.encode_one(px, g) for px, g in tower.pixels(Image.fromarray(rgb))]
    for qtype, path in files.items():
        theirs = visionkit.llama_cpp_rows(path, rgb, tmp, control_tokens=CONTROL, width=64)
        assert [r.shape for r in theirs] == [r.shape for r in ours], qtype
        worst = max(float(np.abs(a - b).max()) for a, b in zip(theirs, ours))
        assert worst <= 3e-3 if qtype == "f32" else worst <= 5e-3, (qtype, worst)


def test_hostile_mmproj_files(mmprojs, tmp_path):
    from llambda.vision.lfm2vl_mmproj import MMPROJ_KEYS
    src = mmprojs["f32"]
    cases = [
        (dict(meta_edit=lambda m: m.pop(MMPROJ_KEYS["downsample_factor"])), "scale_factor"),
        (dict(meta_edit=lambda m: m.__setitem__("clip.use_gelu", False)), "use_gelu"),
        (dict(meta_edit=lambda m: m.__setitem__(MMPROJ_KEYS["tile_size"], 1 << 30)), "tile_size"),
        (dict(drop=("mm.1.weight",)), "mm.1.weight"),
        (dict(drop=("v.blk.0.attn_q.bias",)), "q_proj.bias"),
        (dict(tensor_edit=lambda n, v: v.reshape(32, -1) if n == "v.patch_embd.weight" else v), "patch_embd"),
        (dict(tensor_edit=lambda n, v: v * np.inf if n == "mm.2.weight" else v), "non-finite"),
    ]
    for i, (edit, match) in enumerate(cases):
        bad = visionkit.rewrite_gguf(src, tmp_path / f"bad{i}.gguf", **edit)
        with pytest.raises(ModelFormatError, match=match):
            load_vision(bad, backend="numpy")


def test_a_tower_llama_cpp_cannot_say_is_not_written(tmp_path):
    from llambda.vision import mmproj
    src = visionkit.copy_fixture(TINY, tmp_path / "m", config_edit=lambda c: c.update(projector_use_layernorm=False),
                                 tensors_edit=lambda t: [t.pop(k) for k in list(t) if "layer_norm." in k
                                                         and "multi_modal" in k])
    with closing(load_vision(src, backend="numpy")):
        pass
    with pytest.raises(InvalidInputError, match="LayerNorm"):
        mmproj.write_mmproj(src, tmp_path / "x.gguf", "f32")


def test_first_release_layout_reads_as_transformers(numpy_tower, tmp_path):
    """LiquidAI's first release (model_type 'lfm2-vl', remote code): the LFM2-VL settings flat in
    processor_config.json, SigLIP2's processor (do_resize false) in preprocessor_config.json: the same crops and
    rows as transformers' layout of the same settings."""
    import json
    import shutil
    src = tmp_path / "first"
    shutil.copytree(TINY, src)
    cfg = json.loads((src / "config.json").read_text())
    cfg["model_type"] = "lfm2-vl"
    (src / "config.json").write_text(json.dumps(cfg))
    pre = json.loads((src / "preprocessor_config.json").read_text())
    flat = {k: pre.pop(k) for k in ("downsample_factor", "do_image_splitting", "min_tiles", "max_tiles",
                                    "use_thumbnail", "min_image_tokens", "max_image_tokens", "encoder_patch_size",
                                    "tile_size", "max_pixels_tolerance")}
    (src / "processor_config.json").write_text(json.dumps({"processor_class": "Lfm2VlProcessor", **flat}))
    pre.update(image_processor_type="Siglip2ImageProcessor", do_resize=False, max_num_patches=1024)
    (src / "preprocessor_config.json").write_text(json.dumps(pre))
    with closing(load_vision(src, backend="numpy")) as t:
        from dataclasses import replace
        assert t.family == "lfm2_vl" and replace(t.cfg, source=numpy_tower.cfg.source) == numpy_tower.cfg
        for name in IMAGES:
            got, want = t.pixels(load_image((TINY / name).read_bytes())), numpy_tower.pixels(
                load_image((TINY / name).read_bytes()))
            assert [g for _, g in got] == [g for _, g in want]
            for (a, g), (b, _) in zip(got, want):
                np.testing.assert_array_equal(a, b)
                np.testing.assert_array_equal(t.encode_one(a, g), numpy_tower.encode_one(b, g))
    flat["use_thumbnail"] = not flat["use_thumbnail"]           # the flat settings are the ones read
    (src / "processor_config.json").write_text(json.dumps({"processor_class": "Lfm2VlProcessor", **flat}))
    with closing(load_vision(src, backend="numpy")) as t:
        assert t.cfg.use_thumbnail == flat["use_thumbnail"]
