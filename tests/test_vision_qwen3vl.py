"""The Qwen3-VL vision tower against transformers (tests/fixtures/reference/tiny/qwen3_vl_vision,
tools/make_tiny_qwen3vl.py): the processor's resize and flattened patches, the learned position grid resampled to
odd grids, the last block's output, the merger's rows and each DeepStack level's rows (encode_one's wide rows),
on the NumPy oracle and the native backend (every ISA path, both modes), read from the HF directory and from
llama.cpp's qwen3vl_merger mmproj we write (F32, F16, Q8_0); llama.cpp itself reading that mmproj; hostile
configs, files and calls."""
from __future__ import annotations

import functools
import sys
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest

from llambda.errors import InvalidInputError, ModelClosedError, ModelFormatError
from llambda.formats import gguf
from llambda.vision import load_image, load_vision, mmproj
from llambda.vision.image import check_image
from llambda.vision.qwen2vl import patch_positions
from llambda.vision.qwen2vl_pixels import smart_resize
from llambda.vision.qwen3vl import position_rows

Image = pytest.importorskip("PIL.Image")
sys.path.insert(0, str(Path(__file__).parent))
import visionkit  # noqa: E402

TINY, REF = visionkit.fixture("qwen3_vl_vision")
IMAGES, EXACT = sorted(REF["images"]), visionkit.EXACT
D, LEVELS = 64, len(REF["deepstack_visual_indexes"])          # the text width, the DeepStack levels
copy_fixture = functools.partial(visionkit.copy_fixture, TINY)


def ref(entry: dict, key: str) -> np.ndarray:
    return np.load(TINY / entry[key])


def wide_rows(entry: dict) -> np.ndarray:
    """The contract's rows of one image: [merger | level 0 | level 1], transformers' each."""
    return np.concatenate([ref(entry, "merger_rows")] + [np.load(TINY / f) for f in entry["deepstack_rows"]], axis=1)


def patches_of(tower, name: str) -> np.ndarray:
    return tower.pixels(load_image((TINY / name).read_bytes()))


def grid_of(name: str) -> tuple:
    return tuple(REF["images"][name]["merged_grid"])


def check_tower(tower, budget_hidden: float, budget_rows: float) -> dict:
    """Every fixture image through `tower`: the worst errors of the last block's output and of the wide rows (each
    column group: the merger's and each DeepStack level's)."""
    hidden, rows = [], []
    for name, entry in REF["images"].items():
        px = patches_of(tower, name)
        assert tower.grid(*entry["size"]) == grid_of(name)
        hidden.append(np.abs(tower.last_hidden_state(px, grid_of(name)) - ref(entry, "hidden_before_merger")).max())
        got, want = tower.encode_one(px, grid_of(name)), wide_rows(entry)
        assert got.shape == want.shape == (len(want), D * (1 + LEVELS))
        rows += [np.abs(got[:, k * D:(k + 1) * D] - want[:, k * D:(k + 1) * D]).max() for k in range(1 + LEVELS)]
    return visionkit.within(hidden, rows, budget_hidden, budget_rows)


numpy_tower = visionkit.numpy_tower_fixture(TINY)


vision_edit, rgb_image = visionkit.vision_edit, visionkit.rgb_image


# ---------------------------------------------------------------- preprocessing

@pytest.mark.parametrize("name", IMAGES)
def test_patches_equal_transformers(numpy_tower, name):
    visionkit.check_patches(numpy_tower, TINY, name, REF["images"][name], 3 * 2 * 8 * 8)


def test_the_fixture_resizes_both_ways(numpy_tower):
    """One image scaled up by min_pixels (25 x 15), one down by max_pixels (80 x 130), factor 16, mean = std =
    0.5: the processor's settings are Qwen3-VL's, not Qwen2-VL's defaults."""
    cfg = numpy_tower.cfg
    assert (cfg.patch_size, cfg.factor, cfg.min_pixels, cfg.max_pixels) == (8, 16, 2048, 4096)
    assert cfg.image_mean == cfg.image_std == (0.5, 0.5, 0.5)
    assert smart_resize(15, 25, cfg) == (48, 64) and smart_resize(130, 80, cfg) == (80, 48)


# ---------------------------------------------------------------- the learned position grid

def naive_bilinear(grid: np.ndarray, r: int, c: int, gh: int, gw: int) -> np.ndarray:
    """F.interpolate(mode="bilinear", align_corners=True) of the side x side grid at (r, c), in float64, one
    patch at a time: the textbook formula, not the vectorised taps."""
    side = int(round(len(grid) ** 0.5))
    g = grid.reshape(side, side, -1).astype(np.float64)
    y = r * (side - 1) / max(gh - 1, 1)
    x = c * (side - 1) / max(gw - 1, 1)
    y0, x0 = int(np.floor(y)), int(np.floor(x))
    y1, x1 = min(y0 + 1, side - 1), min(x0 + 1, side - 1)
    fy, fx = y - y0, x - x0
    return ((1 - fy) * (1 - fx) * g[y0, x0] + (1 - fy) * fx * g[y0, x1] + fy * (1 - fx) * g[y1, x0]
            + fy * fx * g[y1, x1])


@pytest.mark.parametrize("gh,gw", [(6, 8), (10, 6), (2, 2), (2, 14), (4, 4), (8, 8), (12, 2), (14, 10)])
def test_the_position_grid_is_resampled_as_transformers(gh, gw):
    """The 4 x 4 grid at odd patch grids (taller, wider, smaller than it, its own size), in the patches'
    block-major order: the textbook bilinear with aligned corners within float32 rounding; at the grid's own
    size the rows themselves."""
    grid = np.random.default_rng(gh * 31 + gw).standard_normal((16, 8)).astype(np.float32)
    rows, cols = patch_positions(gh, gw, 2)
    got = position_rows(grid, rows, cols, gh, gw)
    want = np.stack([naive_bilinear(grid, r, c, gh, gw) for r, c in zip(rows, cols)])
    assert got.dtype == np.float32 and got.shape == (gh * gw, 8)
    assert np.abs(got - want).max() <= 2e-6
    if (gh, gw) == (4, 4):
        np.testing.assert_array_equal(got, grid[rows * 4 + cols])
    corners = [i for i, (r, c) in enumerate(zip(rows, cols)) if r in (0, gh - 1) and c in (0, gw - 1)]
    side_rc = [(0 if r == 0 else 3) * 4 + (0 if c == 0 else 3) for r, c in zip(rows[corners], cols[corners])]
    np.testing.assert_array_equal(got[corners], grid[side_rc])      # aligned corners: the grid's own corners


def test_the_positions_matter(numpy_tower):
    """The tower's rows move when the position grid does (the test above can fail for the tower too)."""
    name = IMAGES[0]
    px = patches_of(numpy_tower, name)
    want = numpy_tower.encode_one(px, grid_of(name))
    d = None
    try:
        import tempfile
        d = Path(tempfile.mkdtemp())
        shifted = copy_fixture(d / "m", tensors_edit=lambda t: t.update(
            {"model.visual.pos_embed.weight": t["model.visual.pos_embed.weight"][::-1].copy()}))
        with closing(load_vision(shifted, backend="numpy")) as t:
            assert np.abs(t.encode_one(px, grid_of(name)) - want).max() > 0.05
    finally:
        if d is not None:
            import shutil
            shutil.rmtree(d)


# ---------------------------------------------------------------- the tower

def test_tower_facts(numpy_tower):
    t = numpy_tower
    assert t.family == "qwen3_vl" and t.hidden == D and t.deepstack == LEVELS == 2
    assert t.tokens_per_image is None and t.attends == "causal" and t.image_size is None
    assert t.cfg.deepstack_visual_indexes == (0, 1) and t.cfg.num_position_embeddings == 16
    px = patches_of(t, "image_wide.png")
    rows = t.encode_one(px, (3, 4))
    assert rows.shape == (12, D * 3) and rows.dtype == np.float32 and grid_of("image_wide.png") == (3, 4)
    np.testing.assert_array_equal(rows, t.encode_one(np.array(px), [3, 4]))


def test_other_families_have_no_deepstack():
    for folder in ("qwen2_5_vl_vision", "qwen2_vl_vision", "gemma3_vision"):
        with closing(load_vision(visionkit.fixture(folder)[0], backend="numpy")) as t:
            assert t.deepstack == 0, folder


@pytest.mark.parametrize("backend,activations,budgets", [
    ("numpy", None, (EXACT, EXACT)), ("native", "f32", (EXACT, EXACT)), ("native", None, (0.08, 0.04))],
    ids=["numpy", "native-exact", "native-default"])
def test_each_backend_matches_transformers(isa, backend, activations, budgets):
    """float32 (the NumPy oracle, the native exact mode): measured 4.8e-6 (hidden) and 1.9e-6 (rows) at most; the
    native default (bfloat16 products): 0.027 (hidden, values up to 6.7) and 0.013 (rows, up to 2.3), on every ISA
    path."""
    with closing(load_vision(TINY, backend=backend, activations=activations, threads=2)) as t:
        check_tower(t, *budgets)


@pytest.mark.parametrize("backend", ["numpy", "native"])
def test_the_mlp_in_row_blocks_is_the_same(monkeypatch, backend):
    from llambda.vision import qwen2vl_config
    monkeypatch.setattr(qwen2vl_config, "MLP_ROWS", 7)
    with closing(load_vision(TINY, backend=backend, activations="f32")) as t:
        check_tower(t, EXACT, EXACT)


def test_bad_calls_are_typed_errors(numpy_tower):
    visionkit.check_bad_encode_calls(numpy_tower, patches_of(numpy_tower, "image_tall.png"), (5, 3))


def test_grids_stay_within_max_pixels(numpy_tower):
    """Absurd and tiny sizes: the merged grid is bounded by max_pixels (16 cells of 16 x 16) and at least 1 x 1;
    pixels() agrees with grid(); a ratio past 200 is refused."""
    rng = np.random.default_rng(5)
    sizes = [(1, 1), (8192, 8192), (65535, 1000), (3, 500), (16, 16), (17, 33)] + \
        [tuple(int(v) for v in rng.integers(1, 300, 2)) for _ in range(10)]
    visionkit.check_grids_bounded(numpy_tower, sizes, 100_000)
    assert numpy_tower.cfg.max_pixels == 4096


def test_a_closed_tower_refuses_both_outputs():
    with closing(load_vision(TINY, backend="numpy")) as t:
        px = patches_of(t, "image_wide.png")
    t.close()                               # a second close is nothing
    for call in (t.encode_one, t.last_hidden_state):
        with pytest.raises(ModelClosedError):
            call(px, (3, 4))


def test_threads_take_turns(numpy_tower):
    """encode_one from several threads at once (pixels() too): each image's own wide rows."""
    got = visionkit.encode_in_threads(lambda n: numpy_tower.encode_one(patches_of(numpy_tower, n), grid_of(n)),
                                      IMAGES, copies=3)
    assert all(np.abs(got[n] - wide_rows(REF["images"][n])).max() <= EXACT for n in IMAGES)


def test_the_memory_plan_counts_every_tensor(numpy_tower):
    """params() is the files' count (the patch bias, the position grid and the DeepStack mergers included);
    the workspace grows with the DeepStack levels' rows."""
    from llambda.formats import safetensors
    with safetensors.SafetensorsFile(TINY / "model.safetensors") as st:
        n = sum(int(np.prod(t.shape)) for name, t in st.tensors.items() if ".visual." in f".{name}")
    cfg = numpy_tower.cfg
    assert cfg.params() == n
    import dataclasses
    flat = dataclasses.replace(cfg, deepstack_visual_indexes=())
    assert cfg.workspace_bytes() > flat.workspace_bytes() and cfg.workspace_bytes(4) < cfg.workspace_bytes()


# ---------------------------------------------------------------- the layouts a checkpoint comes in

def test_the_released_pixel_bounds_are_taken():
    """Qwen3-VL's preprocessor_config.json (65536 to 16777216 pixels: 64 to 16384 cells of 32 x 32) loads: the
    bound is in cells, 16384 an image whatever the cell's size; one pixel cell more is refused."""
    from llambda.vision.qwen2vl_config import QwenVisionConfig
    fields = dict(projector="qwen3_vl", hidden_size=1024, intermediate_size=4096, num_hidden_layers=24,
                  num_attention_heads=16, patch_size=16, text_hidden_size=2048, num_position_embeddings=2304,
                  deepstack_visual_indexes=[5, 11, 17], min_pixels=65536, max_pixels=16777216)
    cfg = QwenVisionConfig.from_fields(fields)
    assert cfg.max_patches() == 65536 and cfg.deepstack == 3 and cfg.position_side == 48
    with pytest.raises(ModelFormatError, match="max_pixels"):
        QwenVisionConfig.from_fields(dict(fields, max_pixels=16777216 + 1024))


def test_the_plans_of_released_towers_are_bounded_by_the_context():
    """Qwen3-VL-2B's and -8B's towers (their released vision configs, max_pixels 16777216): 407M and 576M
    parameters; the largest image (65536 patches) takes 4.9 / 7.0 GB of activations, one a 4096-token context
    holds 1.36 / 1.90 GB."""
    from llambda.vision.qwen2vl_config import QwenVisionConfig
    plans = []
    for width, mlp, depth, levels, text in ((1024, 4096, 24, [5, 11, 17], 2048), (1152, 4304, 27, [8, 16, 24], 4096)):
        cfg = QwenVisionConfig.from_fields(dict(
            projector="qwen3_vl", hidden_size=width, intermediate_size=mlp, num_hidden_layers=depth,
            num_attention_heads=16, patch_size=16, text_hidden_size=text, num_position_embeddings=2304,
            deepstack_visual_indexes=levels, min_pixels=65536, max_pixels=16777216))
        plans.append((round(cfg.params() / 1e6), round(cfg.workspace_bytes() / 1e9, 1),
                      round(cfg.workspace_bytes(4096) / 1e9, 2)))
        assert cfg.workspace_bytes(10 ** 6) == cfg.workspace_bytes()
    assert plans == [(407, 4.9, 1.36), (576, 7.0, 1.9)]


def test_a_tower_without_deepstack_gives_the_merger_rows_alone(tmp_path):
    """deepstack_visual_indexes [] (the DeepStack tensors left unread): rows of the text width only, the
    merger's own rows unchanged (the levels are a side path)."""
    d = copy_fixture(tmp_path / "flat", config_edit=vision_edit(deepstack_visual_indexes=[]))
    with closing(load_vision(d, backend="numpy")) as t:
        assert t.deepstack == 0
        for name, entry in REF["images"].items():
            rows = t.encode_one(patches_of(t, name), grid_of(name))
            assert rows.shape == (entry["n_tokens"], D)
            assert np.abs(rows - ref(entry, "merger_rows")).max() <= EXACT


def test_qwen3_vl_moe_and_released_configs_load_the_same_tower(tmp_path):
    """Qwen3-VL-30B-A3B's model_type (qwen3_vl_moe: its tower is Qwen3-VL's) and the released config.json's shape
    (vision_config model_type qwen3_vl, no rope_parameters; the text model's rope_scaling) read as the fixture;
    the tensors under visual. (transformers 4's names) too."""
    def moe(c):
        c["model_type"] = "qwen3_vl_moe"
        c["vision_config"]["model_type"] = "qwen3_vl"
        c["vision_config"].pop("rope_parameters")
    d = copy_fixture(tmp_path / "moe", config_edit=moe, tensors_edit=lambda t: t.update(
        {k[len("model."):]: t.pop(k) for k in [k for k in t if k.startswith("model.visual.")]}))
    with closing(load_vision(d, backend="numpy")) as t:
        assert t.family == "qwen3_vl"
        check_tower(t, EXACT, EXACT)


@pytest.mark.parametrize("config_edit,pre_edit,match", [
    (vision_edit(deepstack_visual_indexes=[0, 3]), None, "deepstack_visual_indexes"),     # past the depth (3)
    (vision_edit(deepstack_visual_indexes=[-1]), None, "deepstack_visual_indexes"),
    (vision_edit(deepstack_visual_indexes=[1, 0]), None, "increasing"),
    (vision_edit(deepstack_visual_indexes=[1, 1]), None, "distinct"),
    (vision_edit(deepstack_visual_indexes="0,1"), None, "deepstack_visual_indexes"),
    (vision_edit(deepstack_visual_indexes=[0.0, 1]), None, "deepstack_visual_indexes"),
    (vision_edit(deepstack_visual_indexes=[0, 1, 2]), None, "deepstack_merger_list.2"),  # no tensors for it
    # absent: transformers' default [8, 16, 24] (not none: a 27-block tower would lose its levels silently), here
    # past the depth
    (lambda c: c["vision_config"].pop("deepstack_visual_indexes"), None, r"deepstack_visual_indexes.*\(8, 16, 24\)"),
    (vision_edit(num_position_embeddings=15), None, "square"),
    (vision_edit(num_position_embeddings=0), None, "num_position_embeddings"),
    (vision_edit(num_position_embeddings=1 << 40), None, "num_position_embeddings"),
    (vision_edit(num_position_embeddings=None), None, "num_position_embeddings"),
    (vision_edit(num_position_embeddings=25), None, "shape"),                             # a square, not the file's
    (vision_edit(depth=10 ** 9), None, "depth"),
    (vision_edit(hidden_size=0), None, "hidden_size"),
    (vision_edit(num_heads=3), None, "heads"),
    (vision_edit(patch_size=0), None, "patch_size"),
    (vision_edit(hidden_act="silu"), None, "hidden_act"),
    (vision_edit(out_hidden_size=65), None, "width"),
    (vision_edit(intermediate_size=1 << 40), None, "intermediate_size"),
    (None, lambda p: p["size"].update(longest_edge=1 << 40), "max_pixels"),
    (None, lambda p: p["size"].update(shortest_edge=5000), "min_pixels"),
    (None, lambda p: p.update(patch_size=16), "patch_size"),
    (None, lambda p: p.update(image_std=[0.5, 0, 0.5]), "image_std"),
])
def test_hostile_configs_are_format_errors(tmp_path, config_edit, pre_edit, match):
    visionkit.refused(TINY, tmp_path / "bad", match, pre_edit=pre_edit, config_edit=config_edit)


@pytest.mark.parametrize("tensors_edit,match", [
    (lambda t: t.pop("model.visual.pos_embed.weight"), "pos_embed"),
    (lambda t: t.pop("model.visual.patch_embed.proj.bias"), "patch_embed.proj.bias"),
    (lambda t: t.pop("model.visual.deepstack_merger_list.1.norm.bias"), "deepstack_merger_list.1.norm.bias"),
    (lambda t: t.update({"model.visual.deepstack_merger_list.0.norm.weight": np.ones(32, np.float32)}), "shape"),
    (lambda t: t.update({"model.visual.pos_embed.weight": np.zeros((16, 31), np.float32)}), "shape"),
    (lambda t: t["model.visual.pos_embed.weight"].__setitem__((3, 4), np.nan), "non-finite"),
    (lambda t: t.pop("model.visual.merger.linear_fc2.bias"), "merger.linear_fc2.bias"),
])
def test_hostile_tensors_are_format_errors(tmp_path, tensors_edit, match):
    visionkit.refused(TINY, tmp_path / "bad", match, tensors_edit=tensors_edit)


# ---------------------------------------------------------------- llama.cpp's mmproj

@pytest.fixture(scope="module")
def mmproj_files(tmp_path_factory):
    return visionkit.write_mmprojs(TINY, tmp_path_factory.mktemp("qwen3vl_mmproj"))


def test_our_mmproj_is_in_llama_cpps_spelling(mmproj_files):
    with gguf.GGUFFile(mmproj_files["f32"]) as f:
        meta, names = f.metadata, set(f.tensors)
        assert meta["clip.projector_type"] == "qwen3vl_merger" and meta["clip.use_gelu"] is True
        assert list(meta["clip.vision.is_deepstack_layers"]) == [True, True, False]
        assert meta["clip.vision.image_size"] == 32 and meta["clip.vision.projection_dim"] == D
        assert f.tensors["v.position_embd.weight"].qtype == 0
    assert {"v.patch_embd.weight", "v.patch_embd.weight.1", "v.patch_embd.bias", "v.position_embd.weight",
            "v.blk.2.attn_qkv.weight", "v.blk.0.ffn_up.bias", "v.post_ln.bias", "mm.0.weight", "mm.2.bias",
            "v.deepstack.0.norm.weight", "v.deepstack.1.fc2.bias"} <= names
    assert not any(".attn_q." in n or "deepstack.2" in n for n in names)
    with gguf.GGUFFile(mmproj_files["q8_0"]) as f:
        assert f.tensors["v.position_embd.weight"].qtype == 0            # the grid stays float32


@pytest.mark.parametrize("qtype,budget", [("f32", EXACT), ("f16", 5e-3), ("q8_0", 0.08)])
def test_our_mmproj_reads_back(mmproj_files, qtype, budget):
    """The same rows as the HF directory (F16: measured 1.6e-3, Q8_0: 3.3e-2, of values up to 2.3)."""
    with closing(load_vision(mmproj_files[qtype], backend="numpy")) as t:
        assert (t.family, t.deepstack, t.cfg.num_position_embeddings) == ("qwen3_vl", 2, 16)
        assert (t.cfg.min_pixels, t.cfg.max_pixels) == (2048, 4096)
        worst = check_tower(t, 1.0, budget)
    assert worst["rows"] <= budget


def test_deepstack_levels_are_named_by_their_blocks(tmp_path):
    """Levels after blocks 1 and 2 (not 0 and 1): the mmproj names them v.deepstack.1 and v.deepstack.2 and flags
    those blocks, as llama.cpp's converter; read back, the same rows as the directory's."""
    d = copy_fixture(tmp_path / "hf", config_edit=vision_edit(deepstack_visual_indexes=[1, 2]))
    out = mmproj.write_mmproj(d, tmp_path / "m.gguf", "f32")
    with gguf.GGUFFile(out) as f:
        assert list(f.metadata["clip.vision.is_deepstack_layers"]) == [False, True, True]
        assert "v.deepstack.2.fc1.weight" in f.tensors and "v.deepstack.0.fc1.weight" not in f.tensors
    name = IMAGES[1]
    with closing(load_vision(d, backend="numpy")) as a, closing(load_vision(out, backend="numpy")) as b:
        assert b.cfg.deepstack_visual_indexes == (1, 2)
        px = patches_of(a, name)
        got = b.encode_one(px, grid_of(name))
        assert np.abs(a.encode_one(px, grid_of(name)) - got).max() <= EXACT
        # the levels moved: level 0's rows are no longer transformers' (taken after block 0)
        assert np.abs(got[:, D:2 * D] - wide_rows(REF["images"][name])[:, D:2 * D]).max() > 0.01


@pytest.mark.parametrize("edit,drop,match", [
    (lambda m: m.update({"clip.vision.is_deepstack_layers": [True, False]}), (), "is_deepstack_layers"),
    (lambda m: m.update({"clip.vision.is_deepstack_layers": [1, 1, 0]}), (), "is_deepstack_layers"),
    (lambda m: m.pop("clip.use_gelu"), (), "use_gelu"),
    (lambda m: m.update({"clip.vision.embedding_length": 48}), (), "shape"),
    (lambda m: m.update({"clip.vision.block_count": np.uint64(1 << 40)}), (), "block_count"),
    (lambda m: m.update({"clip.vision.min_pixels": 1 << 40}), (), "min_pixels"),
    (None, ("v.position_embd.weight",), "position_embd"),
    (None, ("v.deepstack.1.fc2.weight",), "deepstack_merger_list.1.linear_fc2.weight"),
    (None, ("v.blk.1.attn_qkv.bias",), "qkv"),
    (None, ("v.patch_embd.bias",), "patch_embed.proj.bias"),
])
def test_hostile_mmproj_is_a_format_error(mmproj_files, tmp_path, edit, drop, match):
    bad = visionkit.rewrite_gguf(mmproj_files["f32"], tmp_path / "bad.gguf", edit, drop)
    with pytest.raises(ModelFormatError, match=match):
        load_vision(bad, backend="numpy")


def test_a_non_square_position_grid_in_an_mmproj_is_a_format_error(mmproj_files, tmp_path):
    bad = visionkit.rewrite_gguf(mmproj_files["f32"], tmp_path / "bad.gguf", tensor_edit=lambda n, v: (
        v[:15] if n == "v.position_embd.weight" else v))
    with pytest.raises(ModelFormatError, match="square"):
        load_vision(bad, backend="numpy")


@pytest.mark.parametrize("qtype,budget", [("f32", 5e-3), ("f16", 5e-3), ("q8_0", 0.08)])
def test_llama_cpp_reads_our_mmproj(mmproj_files, tmp_path, qtype, budget):
    """llama.cpp (llama-cpp-python's libmtmd, in a child process) loads our qwen3vl_merger mmproj beside a 192-wide
    text model (its rows are the merger's and both DeepStack levels' joined, as ours) and gives our rows for a
    64 x 48 and an 80 x 48 image (no resize on either side; the 4 x 4 position grid resampled to 6 x 8 and 10 x 6
    patches): measured 2.7e-3 (F32), 2.7e-3 (F16), 3.3e-2 (Q8_0) of values up to 2.5, each column group."""
    with closing(load_vision(mmproj_files[qtype], backend="numpy")) as t:
        for h, w in ((48, 64), (80, 48)):
            rgb = rgb_image(h, w)
            theirs = visionkit.llama_cpp_rows(mmproj_files[qtype], rgb, tmp_path, ["<|vision_start|>",
                                                                                   "<|vision_end|>"], width=3 * D)
            ours = t.encode_one(t.pixels(Image.fromarray(rgb, "RGB")), t.grid(w, h))
            assert len(theirs) == 1 and theirs[0].shape == ours.shape == (h * w // 256, 3 * D)
            err = [float(np.abs(theirs[0][:, k * D:(k + 1) * D] - ours[:, k * D:(k + 1) * D]).max()) for k in range(3)]
            assert max(err) <= budget, (h, w, err)


# ---------------------------------------------------------------- Ollama's qwen3vl model file

OLLAMA_RENAMES = [("model.visual.", "v."), ("blocks.", "blk."), ("patch_embed.proj", "patch_embed"),
                  ("attn.proj", "attn_out"), ("deepstack_merger_list.", "deepstack_merger.")]


def ollama_file(dest: Path, arch: str = "qwen3vl", keys_edit=None, drop=()) -> Path:
    """The fixture's tower named as Ollama's converter names it in its qwen3vl model file (convert_qwen3vl.go's
    replacements and splits, as we read them) with its keys; no text tensors (the tower's reader needs none)."""
    from llambda.formats import gguf_writer, quants, safetensors
    with safetensors.SafetensorsFile(TINY / "model.safetensors") as st:
        hf = {n: t.to_float32() for n, t in st.tensors.items() if n.startswith("model.visual.")}
    tensors = []
    for name, v in hf.items():
        for a, b in OLLAMA_RENAMES:
            name = name.replace(a, b)
        if ".attn.qkv." in name:
            parts = {name.replace("attn.qkv", f"attn_{x}"): p for x, p in zip("qkv", np.split(v, 3))}
        elif name == "v.patch_embed.weight":
            parts = {name: v.reshape((-1,) + v.shape[2:])}          # [H * C, T, P, P]
        else:
            parts = {name: v}
        tensors += [(n, quants.QType.F32, np.ascontiguousarray(p)) for n, p in parts.items() if n not in drop]
    vis, pre = REF["config"]["vision_config"], REF["processor"]
    i32 = gguf_writer.GGUFValue((gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.INT32), vis["deepstack_visual_indexes"])
    meta = {"general.architecture": arch, f"{arch}.embedding_length": D} | {f"{arch}.vision.{k}": v for k, v in {
        "block_count": vis["depth"], "embedding_length": vis["hidden_size"], "attention.head_count": vis["num_heads"],
        "num_channels": 3, "patch_size": 8, "spatial_merge_size": 2, "temporal_patch_size": 2,
        "attention.layer_norm_epsilon": 1e-6, "rope.freq_base": 10000.0, "deepstack_visual_indexes": i32,
        "shortest_edge": pre["min_pixels"], "longest_edge": pre["max_pixels"],
        "image_mean": pre["image_mean"], "image_std": pre["image_std"]}.items()}
    if keys_edit is not None:
        keys_edit(meta)
    gguf_writer.write_gguf(dest, meta, tensors)
    return dest


@pytest.mark.parametrize("arch", ["qwen3vl", "qwen3vlmoe"])
def test_ollama_qwen3vl_file_reads_as_the_hf_directory(tmp_path, arch):
    """The MLP width and the position grid from the tensors' rows (no keys for them), the pixel bounds from the
    processor's edges: the same grids and rows as the directory; written back as llama.cpp's mmproj, the same."""
    with closing(load_vision(ollama_file(tmp_path / "ollama.gguf", arch), backend="numpy")) as t:
        assert (t.family, t.deepstack, t.cfg.intermediate_size, t.cfg.num_position_embeddings) == ("qwen3_vl", 2, 64, 16)
        check_tower(t, EXACT, EXACT)
    out = mmproj.write_mmproj(tmp_path / "ollama.gguf", tmp_path / "m.gguf", "f32")
    with closing(load_vision(out, backend="numpy")) as t:
        check_tower(t, EXACT, EXACT)


@pytest.mark.parametrize("edit,drop,match", [
    (lambda m: m.pop("qwen3vl.vision.block_count"), (), "block_count"),
    (lambda m: m.pop("qwen3vl.embedding_length"), (), "embedding_length"),
    (lambda m: m.update({"qwen3vl.vision.deepstack_visual_indexes": [0, 7]}), (), "deepstack_visual_indexes"),
    (lambda m: m.update({"qwen3vl.vision.longest_edge": 1 << 40}), (), "longest_edge"),
    (lambda m: m.update({"qwen3vl.vision.embedding_length": 48}), (), "shape"),
    (None, ("v.pos_embed.weight",), "pos_embed"),
    (None, ("v.blk.0.mlp.linear_fc1.weight",), "linear_fc1"),
    (None, ("v.blk.2.attn_k.bias",), "qkv"),
    (None, ("v.deepstack_merger.1.linear_fc1.bias",), "deepstack_merger_list.1.linear_fc1.bias"),
])
def test_hostile_ollama_files_are_format_errors(tmp_path, edit, drop, match):
    with pytest.raises(ModelFormatError, match=match):
        load_vision(ollama_file(tmp_path / "bad.gguf", keys_edit=edit, drop=drop), backend="numpy")
