"""The Idefics3 / SmolVLM vision tower against transformers (tests/fixtures/reference/tiny/idefics3_vision,
tools/make_tiny_idefics3.py): the processor's crops and grid, the SigLIP tower's last hidden state per crop,
the connector's rows, on the NumPy oracle and the native backend (every ISA path), read from the HF
directory and from llama.cpp's mmproj GGUF we write (F32, F16, Q8_0); llama.cpp itself reading that mmproj;
the image's size as check_image reads it (EXIF orientation); hostile configs and files."""
from __future__ import annotations

import io
import json
import sys
import zlib
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest

PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

from llambda.errors import InvalidInputError, ModelFormatError  # noqa: E402
from llambda.formats import gguf  # noqa: E402
from llambda.vision import idefics3, load_image, load_vision, mmproj, preprocess  # noqa: E402
from llambda.vision.image import check_image  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import visionkit  # noqa: E402

TINY = Path(__file__).parent / "fixtures/reference/tiny/idefics3_vision"
REF = json.loads((TINY / "reference.json").read_text(encoding="utf-8"))
IMAGES = sorted(REF["images"])
EXACT = 1e-4        # transformers in float32 (eager attention); our float32 paths


def ref(entry: dict, key: str) -> np.ndarray:
    return np.load(TINY / entry[key])


def crops_of(tower, name: str) -> np.ndarray:
    return tower.pixels(load_image((TINY / name).read_bytes()))


def check_tower(tower, budget_hidden: float, budget_rows: float, images: dict | None = None) -> dict:
    """Every fixture image's crops through `tower`: the worst hidden-state and connector-row errors."""
    hidden, rows = [], []
    for name, entry in (images or REF["images"]).items():
        px = crops_of(tower, name)
        got = np.stack([tower.last_hidden_state(p) for p in px])
        hidden.append(np.abs(got - ref(entry, "vision_last_hidden_state")).max())
        rows.append(np.abs(tower.encode(px) - ref(entry, "connector_rows")).max())
    worst = {"hidden": float(max(hidden)), "rows": float(max(rows))}
    assert worst["hidden"] <= budget_hidden and worst["rows"] <= budget_rows, worst
    return worst


@pytest.fixture(scope="module")
def numpy_tower():
    with closing(load_vision(TINY, backend="numpy")) as t:
        yield t


def copy_fixture(dest: Path, pre_edit=None, config_edit=None, tensors_edit=None) -> Path:
    """The fixture's directory copied to `dest`, its processor settings, config or tensors edited."""
    return visionkit.copy_fixture(TINY, dest, pre_edit, config_edit, tensors_edit)


# ---------------------------------------------------------------- preprocessing

@pytest.mark.parametrize("name", IMAGES)
def test_crops_equal_transformers(numpy_tower, name):
    entry = REF["images"][name]
    data = (TINY / name).read_bytes()
    w, h = entry["size"]
    assert check_image(data) == (w, h)
    rows, cols = numpy_tower.grid(w, h)
    assert [rows, cols] == entry["grid"]
    px = numpy_tower.pixels(load_image(data))
    assert px.dtype == np.float32 and px.shape == (rows * cols + 1, 3, 32, 32) == ref(entry, "pixel_values").shape
    np.testing.assert_array_equal(px, ref(entry, "pixel_values"))     # the same Pillow resizes: bit-identical


def test_the_sizes_follow_transformers_rounding():
    for name, entry in REF["images"].items():
        w, h = entry["size"]
        first = preprocess.longest_edge_size(w, h, 64)
        assert list(first) == entry["resized_wh"], name
        assert list(preprocess.split_size(*first, 32)) == entry["split_resized_wh"], name
    # by hand: the short side truncated, then up to even; the long side is the one scaled when taller
    assert preprocess.longest_edge_size(45, 20, 64) == (64, 28) and preprocess.longest_edge_size(9, 7, 64) == (64, 50)
    assert preprocess.longest_edge_size(20, 64, 64) == (20, 64) and preprocess.longest_edge_size(7, 9, 64) == (50, 64)
    assert preprocess.longest_edge_size(1, 1000, 64) == (1, 64)             # 0.064 -> 0 (even), then at least 1
    assert preprocess.longest_edge_size(5000, 10, 4100) == (4096, 7)    # 4100 x 8, then below the 4096 cap
    assert preprocess.split_size(64, 28, 32) == (64, 32) and preprocess.split_size(20, 64, 32) == (32, 64)
    assert preprocess.split_size(1, 49, 49) == (49, 49)      # int(49 * (1 / 49)) is 0: still one crop wide


def test_grid_agrees_with_the_crops_for_many_sizes(numpy_tower):
    rng = np.random.default_rng(5)
    sizes = [(1, 1), (1, 300), (300, 1), (32, 32), (64, 64), (65, 64), (33, 97)] + \
        [tuple(int(v) for v in rng.integers(1, 200, 2)) for _ in range(20)]
    for w, h in sizes:
        rows, cols = numpy_tower.grid(w, h)
        assert 1 <= rows <= 2 and 1 <= cols <= 2, (w, h)        # every image splits: longest edge 64 = 2 crops
        im = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB")
        assert numpy_tower.pixels(im).shape[0] == rows * cols + 1, (w, h)


def test_unsplit_crops_and_rows_equal_transformers(tmp_path):
    d = copy_fixture(tmp_path / "nosplit", pre_edit=lambda p: p.update(do_image_splitting=False))
    images = REF["no_split"]["images"]
    t = load_vision(d, backend="numpy")
    try:
        for name, entry in images.items():
            assert t.grid(*entry["size"]) == (0, 0) and entry["grid"] == [0, 0]
            px = crops_of(t, name)
            np.testing.assert_array_equal(px, ref(entry, "pixel_values"))
        check_tower(t, EXACT, EXACT, images)
    finally:
        t.close()


def test_pixel_shuffle_is_transformers_view_permute_order():
    """pixel_shuffle against a line-by-line NumPy transcription of Idefics3Connector.pixel_shuffle's view /
    permute / reshape sequence (x.view(h, w, D) -> view(h, w/s, D*s) -> permute -> ...)."""
    side, s, D = 8, 2, 3
    x = np.random.default_rng(0).standard_normal((side * side, D)).astype(np.float32)
    y = x.reshape(side, side, D).reshape(side, side // s, D * s).transpose(1, 0, 2)
    y = y.reshape(side // s, side // s, D * s * s).transpose(1, 0, 2).reshape(side * side // (s * s), D * s * s)
    out = np.empty_like(y)
    idefics3.pixel_shuffle(x, side, s, out)
    np.testing.assert_array_equal(out, y)


# ---------------------------------------------------------------- the tower

def test_tower_facts(numpy_tower):
    t = numpy_tower
    assert (t.family, t.attends, t.tokens_per_image, t.hidden, t.image_size) == ("idefics3", "causal", 4, 64, 32)
    assert REF["image_seq_len"] == t.tokens_per_image
    px = np.concatenate([crops_of(t, n) for n in IMAGES])
    out = t.encode(px)
    assert out.shape == (len(px), 4, 64) and out.dtype == np.float32
    np.testing.assert_allclose(out, np.concatenate([ref(REF["images"][n], "connector_rows") for n in IMAGES]),
                               atol=EXACT, rtol=0)          # a batch's crops do not see each other


def test_numpy_oracle_matches_transformers(numpy_tower):
    check_tower(numpy_tower, EXACT, EXACT)


@pytest.mark.parametrize("activations, budget", [("f32", EXACT), (None, 0.05)])
def test_native_matches_transformers_on_every_isa(isa, activations, budget):
    """The exact mode (float32 panels) and the default (bfloat16 products, held to Gemma 3's tower budget)."""
    with closing(load_vision(TINY, backend="native", activations=activations, threads=2)) as t:
        check_tower(t, budget, budget)


def test_transformers_5_processor_layout_reads_the_same(tmp_path):
    """transformers 5 saves the image processor's settings inside processor_config.json (no
    preprocessor_config.json): the same tower."""
    d = copy_fixture(tmp_path / "t5")
    pre = json.loads((d / "preprocessor_config.json").read_text())
    both = json.loads((d / "processor_config.json").read_text())
    (d / "processor_config.json").write_text(json.dumps({**both, "image_processor": pre}))
    (d / "preprocessor_config.json").unlink()
    t = load_vision(d, backend="numpy")
    try:
        assert (t.cfg.longest_edge, t.cfg.do_image_splitting, t.cfg.resample) == (64, True, 1)
        check_tower(t, EXACT, EXACT)
    finally:
        t.close()


def test_smolvlm_model_type_reads_the_same(tmp_path):
    d = copy_fixture(tmp_path / "smolvlm", config_edit=lambda c: c.update(model_type="smolvlm"))
    t = load_vision(d, backend="numpy")
    try:
        assert t.family == "idefics3"
        check_tower(t, EXACT, EXACT)
    finally:
        t.close()


def test_a_crop_the_patch_does_not_divide_leaves_its_last_pixels_unread(tmp_path, numpy_tower):
    """SmolVLM-Instruct's crops are 384 pixels of patches of 14: 27 patches a side, Conv2d's "valid" padding
    leaves the last 6 pixels of each side unread. Here: crops of 36 with patches of 8 -> the same 4 x 4 patches
    as the fixture's 32, so a 36 x 36 crop encodes as its top-left 32 x 32 does."""
    d = copy_fixture(tmp_path / "odd", config_edit=lambda c: c["vision_config"].update(image_size=36),
                     pre_edit=lambda p: p.update(max_image_size={"longest_edge": 36}, size={"longest_edge": 72}))
    t = load_vision(d, backend="numpy")
    try:
        assert (t.tokens_per_image, t.grid(72, 72)) == (4, (2, 2))
        px = crops_of(t, IMAGES[0])
        assert px.shape[1:] == (3, 36, 36)
        for crop in px:
            np.testing.assert_array_equal(t.last_hidden_state(crop), numpy_tower.last_hidden_state(crop[:, :32, :32]))
    finally:
        t.close()


# ---------------------------------------------------------------- llama.cpp's mmproj GGUF

@pytest.fixture(scope="module")
def mmproj_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("mmproj")
    return {q: mmproj.write_mmproj(TINY, d / f"mmproj-{q}.gguf", q) for q in ("f32", "f16", "q8_0")}


def test_mmproj_is_written_in_llama_cpp_spelling(mmproj_files):
    """The keys and names llama.cpp's clip loader reads for PROJECTOR_TYPE_IDEFICS3 (tools/mtmd/clip.cpp)."""
    with gguf.GGUFFile(mmproj_files["f32"]) as f:
        m = f.metadata
        assert m["clip.projector_type"] == "idefics3" and m["general.architecture"] == "clip"
        assert m["clip.vision.projector.scale_factor"] == 2 and m["clip.vision.preproc_image_size"] == 64
        assert (m["clip.vision.image_size"], m["clip.vision.patch_size"],
                m["clip.vision.projection_dim"]) == (32, 8, 64)
        assert list(f.tensors["mm.model.fc.weight"].shape) == [64, 128]       # HF's [text, s*s*H]
        assert not any(n.startswith("mm.") and n != "mm.model.fc.weight" for n in f.tensors)


@pytest.mark.parametrize("qtype, budgets", [("f32", (EXACT, EXACT)), ("f16", (5e-3, 5e-3)), ("q8_0", (0.1, 0.08))])
@pytest.mark.parametrize("backend", ["numpy", "native"])
def test_mmproj_round_trip(mmproj_files, qtype, budgets, backend):
    t = load_vision(mmproj_files[qtype], backend=backend, activations="f32", threads=2)
    try:
        assert (t.family, t.cfg.longest_edge, t.cfg.do_image_splitting, t.cfg.resample) == ("idefics3", 64, True, 1)
        for name in IMAGES:         # the same crops from the GGUF's keys as from the processor's config
            np.testing.assert_array_equal(crops_of(t, name), ref(REF["images"][name], "pixel_values"))
        check_tower(t, *budgets)
    finally:
        t.close()


def test_llama_cpp_reads_our_mmproj(mmproj_files, tmp_path):
    """llama.cpp (llama-cpp-python's libmtmd, in a child process) loads our idefics3 mmproj beside a 64-wide text
    model, cuts a 64 x 64 image into the same 2 x 2 tiles and the global image, in the same order, and gives our
    rows: the tiles are exact slices on both sides (no resize); the global image is a 64 -> 32 Lanczos
    downscale, llama.cpp's own against Pillow's. Measured 2.7e-3 at most (values up to 3.5)."""
    marks = ["<fake_token_around_image>", "<global-img>"] + [f"<row_{r}_col_{c}>" for r in range(1, 7)
                                                             for c in range(1, 7)]
    rng = np.random.default_rng(3)
    yy, xx = np.mgrid[0:64, 0:64]
    rgb = np.clip(np.stack([4 * xx, 4 * yy, 127 + 100 * np.sin(xx / 3 + yy / 5)], -1)
                  + rng.normal(0, 20, (64, 64, 3)), 0, 255).astype(np.uint8)
    theirs = visionkit.llama_cpp_rows(mmproj_files["f32"], rgb, tmp_path, marks)
    t = load_vision(mmproj_files["f32"], backend="numpy")
    try:
        assert t.grid(64, 64) == (2, 2)
        ours = t.encode(t.pixels(Image.fromarray(rgb, "RGB")))
    finally:
        t.close()
    assert len(theirs) == 5 and all(r.shape == (4, 64) for r in theirs)
    err = np.abs(np.stack(theirs) - ours).max(axis=(1, 2))
    assert err.max() <= 5e-3, err


def test_write_mmproj_refuses_what_llama_cpp_cannot_say(tmp_path):
    d = copy_fixture(tmp_path / "nosplit", pre_edit=lambda p: p.update(do_image_splitting=False))
    with pytest.raises(InvalidInputError, match="split"):
        mmproj.write_mmproj(d, tmp_path / "x.gguf", "f32")


def without_key(src: Path, dest: Path, key: str) -> Path:
    """A copy of the F32 mmproj `src` without the metadata `key`."""
    return visionkit.rewrite_gguf(src, dest, lambda meta: meta.pop(key))


def test_mmproj_without_longest_edge_is_one_crop(mmproj_files, tmp_path):
    """An mmproj without clip.vision.preproc_image_size (older files): no splitting."""
    old = without_key(mmproj_files["f32"], tmp_path / "old.gguf", "clip.vision.preproc_image_size")
    t = load_vision(old, backend="numpy")
    try:
        assert t.grid(500, 300) == (0, 0) and t.pixels(Image.new("RGB", (50, 30))).shape == (1, 3, 32, 32)
    finally:
        t.close()


# ---------------------------------------------------------------- the image's size as check_image reads it

def _jpeg(w: int, h: int, orientation: int | None) -> bytes:
    b = io.BytesIO()
    im = Image.new("RGB", (w, h), (200, 10, 10))
    if orientation is None:
        im.save(b, "JPEG")
    else:
        exif = Image.Exif()
        exif[0x0112] = orientation
        im.save(b, "JPEG", exif=exif.tobytes())
    return b.getvalue()


def _png_with_exif_chunk(w: int, h: int, orientation: int, before_pixels: bool) -> bytes:
    """A PNG with an eXIf chunk before (or after) its IDAT."""
    b = io.BytesIO()
    Image.new("RGB", (w, h), (10, 200, 10)).save(b, "PNG")
    png = b.getvalue()
    exif = Image.Exif()
    exif[0x0112] = orientation
    data = exif.tobytes()[6:]           # without the "Exif\0\0" header: the eXIf chunk holds the TIFF bytes
    chunk = len(data).to_bytes(4, "big") + b"eXIf" + data + zlib.crc32(b"eXIf" + data).to_bytes(4, "big")
    at = png.index(b"IDAT") - 4 if before_pixels else png.index(b"IEND") - 4
    return png[:at] + chunk + png[at:]


@pytest.mark.parametrize("orientation, swapped", [(None, False), (1, False), (3, False), (5, True), (6, True),
                                                  (8, True)])
def test_check_image_gives_the_decoded_size(orientation, swapped):
    data = _jpeg(40, 24, orientation)
    want = (24, 40) if swapped else (40, 24)
    assert check_image(data) == want == load_image(data).size


@pytest.mark.parametrize("before_pixels", [True, False])
def test_check_image_and_load_image_agree_on_a_png_exif_chunk(before_pixels):
    """A PNG's eXIf chunk before the pixels turns the image; one after them is ignored by both (reading it
    would decode the whole file in the header check): the grid from check_image's size is the crops'."""
    data = _png_with_exif_chunk(40, 24, 6, before_pixels)
    assert check_image(data) == load_image(data).size == ((24, 40) if before_pixels else (40, 24))


# ---------------------------------------------------------------- hostile configs and files

def _fails(tmp_path, match, **edits):
    d = copy_fixture(tmp_path / "bad", **edits)
    with pytest.raises(ModelFormatError, match=match):
        load_vision(d, backend="numpy")


@pytest.mark.parametrize("scale, match", [(3, "does not divide"), (0, "scale_factor"), (8, "scale_factor"),
                                          ("2", "scale_factor"), (True, "scale_factor")])
def test_a_scale_factor_that_does_not_fit_is_refused(tmp_path, scale, match):
    _fails(tmp_path, match, config_edit=lambda c: c.update(scale_factor=scale))


@pytest.mark.parametrize("edit, match", [
    (lambda p: p.update(size={"longest_edge": 10 ** 9}), "longest_edge"),
    (lambda p: p.update(size={"longest_edge": 7 * 32}), "crops"),            # 7 crops a side: no <row_7_col_1>
    (lambda p: p.update(size={"height": 64, "width": 64}), "longest_edge"),
    (lambda p: p.update(size=[64]), "longest_edge"),
    (lambda p: p.update(max_image_size={"longest_edge": 64}), "max_image_size"),
    (lambda p: p.update(do_image_splitting="yes"), "do_image_splitting"),
    (lambda p: p.update(resample=9), "resample"),
    (lambda p: p.update(do_resize=False), "do_resize"),
    (lambda p: p.update(image_mean=[0.5, float("nan"), 0.5]), "image_mean"),
])
def test_hostile_processor_settings_are_refused(tmp_path, edit, match):
    _fails(tmp_path, match, pre_edit=edit)


@pytest.mark.parametrize("edit, match", [
    (lambda t: t.pop("model.connector.modality_projection.proj.weight"), "connector"),
    (lambda t: t.update({"model.connector.modality_projection.proj.weight": np.zeros((64, 96), np.float32)}), "shape"),
    (lambda t: t.update({"model.connector.modality_projection.proj.weight": np.full((64, 128), np.inf, np.float32)}),
     "non-finite"),
    (lambda t: t.pop("model.vision_model.encoder.layers.1.mlp.fc2.weight"), "missing"),
])
def test_missing_or_bad_tensors_are_refused(tmp_path, edit, match):
    _fails(tmp_path, match, tensors_edit=edit)


def test_an_image_seq_len_that_is_not_the_towers_is_refused(tmp_path):
    d = copy_fixture(tmp_path / "seq")
    both = json.loads((d / "processor_config.json").read_text())
    (d / "processor_config.json").write_text(json.dumps({**both, "image_seq_len": 64}))
    with pytest.raises(ModelFormatError, match="image_seq_len 64"):
        load_vision(d, backend="numpy")


def test_an_mmproj_without_its_scale_factor_is_refused(mmproj_files, tmp_path):
    bad = without_key(mmproj_files["f32"], tmp_path / "x.gguf", "clip.vision.projector.scale_factor")
    with pytest.raises(ModelFormatError, match="scale_factor"):
        load_vision(bad, backend="numpy")


@pytest.mark.parametrize("w, h", [(0, 5), (5, -1), (2.5, 3), ("4", 4), (True, 4), (1 << 21, 4)])
def test_grid_refuses_bad_sizes(numpy_tower, w, h):
    with pytest.raises(InvalidInputError, match="width and height"):
        numpy_tower.grid(w, h)
