"""The GLM-4.1V / GLM-4.6V vision tower against transformers (tests/fixtures/reference/tiny/glm4v_vision,
tools/make_tiny_glm4v.py): Glm4vImageProcessor's resize (a side under 28 scaled up first, the bounds counting two
temporal copies) and flattened patches, the learned position grid resampled by bicubic grid_sample to odd grids,
the downsample's rows and the merger's rows, on the NumPy oracle and the native backend (both modes); hostile
configs and calls."""
from __future__ import annotations

import functools
import sys
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest

from llambda.backends import available_backends
from llambda.errors import InvalidInputError, ModelClosedError
from llambda.formats import gguf
from llambda.vision import load_image, load_vision
from llambda.vision.glm4v import position_rows
from llambda.vision.glm4v_pixels import smart_resize
from llambda.vision.image import check_image
from llambda.vision.qwen2vl import patch_positions

Image = pytest.importorskip("PIL.Image")
sys.path.insert(0, str(Path(__file__).parent))
import visionkit  # noqa: E402

TINY, REF = visionkit.fixture("glm4v_vision")
IMAGES, EXACT = sorted(REF["images"]), visionkit.EXACT
copy_fixture = functools.partial(visionkit.copy_fixture, TINY)
numpy_tower = visionkit.numpy_tower_fixture(TINY)
# the native default (bfloat16 panels: each product's activations rounded once) against transformers' float32,
# relative to the largest value: two blocks, then the downsample and the merger's four products (measured: 6e-3
# downsampled, 1e-2 merged)
FAST = {"hidden": 2e-2, "rows": 3e-2}


def ref(entry: dict, key: str) -> np.ndarray:
    return np.load(TINY / entry[key])


def grid_of(name: str) -> tuple:
    return tuple(REF["images"][name]["merged_grid"])


def check_tower(tower, relative: bool = False) -> dict:
    """Every fixture image through `tower`: the worst errors of the downsample's rows and of the merger's
    (`relative`: over the reference's largest value)."""
    err = {"hidden": 0.0, "rows": 0.0}
    for name, entry in REF["images"].items():
        px = tower.pixels(load_image((TINY / name).read_bytes()))
        assert tower.grid(*entry["size"]) == grid_of(name)
        for key, got in (("hidden", tower.last_hidden_state(px, grid_of(name))),
                         ("rows", tower.encode_one(px, grid_of(name)))):
            want = ref(entry, "hidden_before_merger" if key == "hidden" else "merger_rows")
            assert got.shape == want.shape == (entry["n_tokens"], 64)
            e = float(np.abs(got - want).max()) / (float(np.abs(want).max()) if relative else 1.0)
            err[key] = max(err[key], e)
    return err


# ---------------------------------------------------------------- preprocessing

@pytest.mark.parametrize("name", IMAGES)
def test_patches_equal_transformers(numpy_tower, name):
    """Bit for bit: the same Pillow bicubic, rescale, normalize and patch order; the size and resized size."""
    entry = REF["images"][name]
    data = (TINY / name).read_bytes()
    assert check_image(data) == tuple(entry["size"])
    w, h = entry["size"]
    assert list(smart_resize(h, w, numpy_tower.cfg))[::-1] == entry["resized_wh"]
    assert list(numpy_tower.grid(w, h)) == entry["merged_grid"]
    px = numpy_tower.pixels(load_image(data))
    _, gh, gw = entry["grid_thw"]
    assert px.dtype == np.float32 and px.shape == (gh * gw, 3 * 2 * 14 * 14)
    np.testing.assert_array_equal(px, ref(entry, "pixel_values"))


def test_the_resize_rules(numpy_tower):
    """The fixture's three rules: rounding (150 x 90), max_pixels counted twice (180 x 130: 2 x 168 x 140 is past
    25088), a side under 28 scaled up first, then min_pixels (20 x 30 -> 28 x 42 -> 56 x 84); a ratio past 200
    refused; sizes that are not sizes refused."""
    cfg = numpy_tower.cfg
    assert (cfg.min_pixels, cfg.max_pixels, cfg.factor) == (6272, 25088, 28)
    assert smart_resize(90, 150, cfg) == (84, 140)
    assert smart_resize(130, 180, cfg) == (84, 112)
    assert smart_resize(30, 20, cfg) == (84, 56)
    assert smart_resize(1, 1, cfg) == (56, 56)          # scaled to 28 x 28, then up to min_pixels
    with pytest.raises(InvalidInputError, match="aspect"):
        numpy_tower.grid(5000, 20)
    for bad in (0, -3, 1.5, True, "9", 1 << 21):
        with pytest.raises(InvalidInputError):
            numpy_tower.grid(bad, 10)


# ---------------------------------------------------------------- the learned position grid

@pytest.mark.parametrize("key", sorted(REF["position_samples"]["samples"]))
def test_the_position_grid_is_resampled_as_transformers(key):
    """F.grid_sample's bicubic (A = -0.75, border, align_corners False) of a 4 x 4 grid at each patch of an odd
    grid (wider, taller, smaller than it, its size, bigger), in block-major order, within float32 rounding."""
    gh, gw = map(int, key.split("x"))
    grid = np.load(TINY / REF["position_samples"]["grid"])
    rows, cols = patch_positions(gh, gw, 2)
    got = position_rows(grid, rows, cols, gh, gw)
    want = np.load(TINY / REF["position_samples"]["samples"][key])
    assert got.dtype == np.float32 and got.shape == want.shape == (gh * gw, 8)
    assert np.abs(got - want).max() <= 2e-6


def test_the_positions_matter(numpy_tower, tmp_path):
    """The tower's rows move when the position grid does (the fixture's comparison can fail for it)."""
    name = IMAGES[0]
    px = numpy_tower.pixels(load_image((TINY / name).read_bytes()))
    want = numpy_tower.encode_one(px, grid_of(name))
    key = "model.visual.embeddings.position_embedding.weight"
    shifted = copy_fixture(tmp_path / "m", tensors_edit=lambda t: t.update({key: t[key][::-1].copy()}))
    with closing(load_vision(shifted, backend="numpy")) as t:
        assert np.abs(t.encode_one(px, grid_of(name)) - want).max() > 0.05


# ---------------------------------------------------------------- the tower

def test_numpy_tower_matches_transformers(numpy_tower):
    assert numpy_tower.family == "glm4v" and numpy_tower.tokens_per_image is None and numpy_tower.hidden == 64
    assert numpy_tower.deepstack == 0 and numpy_tower.attends == "causal"
    err = check_tower(numpy_tower)
    assert err["hidden"] <= EXACT and err["rows"] <= EXACT, err


@pytest.mark.parametrize("activations", ["f32", None])
def test_native_tower_matches_transformers(activations):
    if "native" not in available_backends():
        pytest.skip("the native backend is not available here (C core not built)")
    with closing(load_vision(TINY, backend="native", activations=activations)) as tower:
        if activations == "f32":
            err = check_tower(tower)
            assert err["hidden"] <= EXACT and err["rows"] <= EXACT, err
        else:
            err = check_tower(tower, relative=True)
            assert err["hidden"] <= FAST["hidden"] and err["rows"] <= FAST["rows"], err


def test_bad_calls_are_typed_errors(numpy_tower):
    name = IMAGES[0]
    px = numpy_tower.pixels(load_image((TINY / name).read_bytes()))
    visionkit.check_bad_encode_calls(numpy_tower, px, grid_of(name))


def test_a_closed_tower_refuses(tmp_path):
    tower = load_vision(TINY, backend="numpy")
    name = IMAGES[0]
    px = tower.pixels(load_image((TINY / name).read_bytes()))
    tower.close()
    with pytest.raises(ModelClosedError):
        tower.encode_one(px, grid_of(name))


# ---------------------------------------------------------------- hostile configs

def _drop(key):
    return lambda t: t.pop(key)


@pytest.mark.parametrize("edits, match", [
    ({"config_edit": visionkit.vision_edit(depth=0)}, "depth"),
    ({"config_edit": visionkit.vision_edit(num_heads=3)}, "hidden_size"),
    ({"config_edit": visionkit.vision_edit(hidden_act="gelu")}, "hidden_act"),
    ({"config_edit": visionkit.vision_edit(image_size=50)}, "image_size"),
    ({"config_edit": visionkit.vision_edit(out_hidden_size=32)}, "out_hidden_size"),
    ({"config_edit": visionkit.vision_edit(rms_norm_eps="tiny")}, "rms_norm_eps"),
    ({"config_edit": visionkit.vision_edit(attention_bias="yes")}, "attention_bias"),
    ({"config_edit": visionkit.vision_edit(patch_size=True)}, "patch_size"),
    ({"config_edit": visionkit.vision_edit(rope_parameters={"rope_theta": float("inf")})}, "rope_theta"),
    ({"pre_edit": lambda p: p.update(merge_size=3)}, "merge_size"),
    ({"pre_edit": lambda p: p.update(resample=2)}, "resample"),
    ({"pre_edit": lambda p: p["size"].update(longest_edge=10)}, "longest_edge"),
    ({"pre_edit": lambda p: p["size"].update(shortest_edge=10 ** 9)}, "shortest_edge"),
    ({"pre_edit": lambda p: p.update(image_std=[0.5, 0, 0.5])}, "image_std"),
    ({"tensors_edit": _drop("model.visual.downsample.weight")}, "downsample"),
    ({"tensors_edit": _drop("model.visual.embeddings.position_embedding.weight")}, "position_embedding"),
    ({"tensors_edit": lambda t: t.update({"model.visual.merger.gate_proj.weight": np.zeros((40, 64), np.float32)})},
     "gate_proj"),
])
def test_hostile_directories_are_typed_errors_naming_the_field(tmp_path, edits, match):
    visionkit.refused(TINY, tmp_path / "bad", match, **edits)


# ---------------------------------------------------------------- llama.cpp's glm4v mmproj

MMPROJ_BUDGET = {"f32": EXACT, "f16": 2e-3, "q8_0": 3e-2}     # the merger's rows against transformers' (measured: 2e-6, 1e-3, 1.8e-2)


@pytest.fixture(scope="module")
def mmproj_files(tmp_path_factory):
    return visionkit.write_mmprojs(TINY, tmp_path_factory.mktemp("glm4v_mmproj"))


@pytest.mark.parametrize("qtype", ["f32", "f16", "q8_0"])
def test_our_mmproj_reads_back_as_the_directory(mmproj_files, qtype):
    """write_mmproj's file: llama.cpp's names and keys (the merger's width from mm.gate's rows), read back to the
    directory's config and, within each type's rounding, its rows."""
    with gguf.GGUFFile(mmproj_files[qtype]) as f:
        assert f.metadata["clip.projector_type"] == "glm4v"
        assert {"v.norm_embd.weight", "mm.patch_merger.weight", "mm.model.fc.weight", "mm.post_norm.bias",
                "mm.gate.weight", "v.patch_embd.weight.1", "v.blk.1.attn_v.weight"} <= set(f.tensors)
    with closing(load_vision(mmproj_files[qtype], backend="numpy")) as t, closing(load_vision(TINY, "numpy")) as d:
        for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "image_size",
                    "text_hidden_size", "min_pixels", "max_pixels", "rms_norm_eps", "attention_bias", "image_mean"):
            assert getattr(t.cfg, key) == pytest.approx(getattr(d.cfg, key)), key
        err = check_tower(t)
        assert err["rows"] <= MMPROJ_BUDGET[qtype], err


@pytest.mark.parametrize("qtype", ["f32", "f16"])
def test_llama_cpp_reads_our_mmproj(mmproj_files, qtype, tmp_path):
    """llama-cpp-python 0.3.36's libmtmd on our file: the same token count and rows within 3e-3 of ours (its GELU
    is the tanh form) for images whose size both processors keep (multiples of 28, 8 tokens or more: below that
    llama.cpp scales up by its own bound of 8 tokens)."""
    with closing(load_vision(mmproj_files[qtype], backend="numpy")) as t:
        for h, w in ((84, 140), (112, 84)):
            rgb = visionkit.rgb_image(h, w)
            theirs = visionkit.llama_cpp_rows(mmproj_files[qtype], rgb, tmp_path, ["<|begin_of_image|>",
                                                                                   "<|end_of_image|>"], width=64)
            ours = t.encode_one(t.pixels(Image.fromarray(rgb, "RGB")), t.grid(w, h))
            assert len(theirs) == 1 and theirs[0].shape == ours.shape == (h * w // 784, 64)
            err = float(np.abs(theirs[0] - ours).max())
            assert err <= 3e-3, (h, w, err)


def _without(name):
    return {"drop": (name,)}


@pytest.mark.parametrize("edit, match", [
    ({"meta_edit": lambda m: m.pop("clip.vision.block_count")}, "block_count"),
    ({"meta_edit": lambda m: m.update({"clip.vision.image_size": 50})}, "image_size"),
    ({"meta_edit": lambda m: m.update({"clip.vision.attention.head_count": 3})}, "embedding_length"),
    ({"meta_edit": lambda m: m.update({"clip.has_vision_encoder": False})}, "has_vision_encoder"),
    ({"meta_edit": lambda m: m.update({"clip.vision.max_pixels": 7})}, "max_pixels"),
    (_without("mm.gate.weight"), "mm.gate.weight"),
    (_without("mm.patch_merger.weight"), "downsample"),
    (_without("v.patch_embd.weight.1"), "patch_embed"),
    (_without("v.blk.1.attn_k.weight"), "attn.qkv"),
])
def test_hostile_mmprojs_are_typed_errors(mmproj_files, tmp_path, edit, match):
    from llambda.errors import ModelFormatError
    bad = visionkit.rewrite_gguf(mmproj_files["f32"], tmp_path / "bad.gguf", **edit)
    with pytest.raises(ModelFormatError, match=match):
        load_vision(bad, backend="numpy")
