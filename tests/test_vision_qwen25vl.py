"""The Qwen2.5-VL vision tower against transformers (tests/fixtures/reference/tiny/qwen2_5_vl_vision,
tools/make_tiny_qwen25vl.py): the processor's resize and flattened patches, the merged grid, the windowed
tower's last hidden state and the merger's rows, on the NumPy oracle and the native backend (every ISA path, both
modes), read from the HF directory and from llama.cpp's mmproj GGUF we write (F32, F16, Q8_0); llama.cpp itself
reading that mmproj; hostile configs, files and images."""
from __future__ import annotations

import functools
import json
import sys
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest

from llambda.errors import InvalidInputError, ModelClosedError, ModelFormatError
from llambda.formats import gguf
from llambda.vision import load_image, load_vision, mmproj
from llambda.vision.image import check_image
from llambda.vision.qwen2vl import window_order
from llambda.vision.qwen2vl_pixels import smart_resize

Image = pytest.importorskip("PIL.Image")
sys.path.insert(0, str(Path(__file__).parent))
import visionkit  # noqa: E402

TINY, REF = visionkit.fixture("qwen2_5_vl_vision")
IMAGES, EXACT = sorted(REF["images"]), visionkit.EXACT


def ref(entry: dict, key: str) -> np.ndarray:
    """The fixture's array named by `entry[key]`."""
    return np.load(TINY / entry[key])


def patches_of(tower, name: str) -> np.ndarray:
    data = (TINY / name).read_bytes()
    return tower.pixels(load_image(data))


def grid_of(name: str) -> tuple:
    """The fixture image's merged grid (what tower.grid gives for its size)."""
    return tuple(REF["images"][name]["merged_grid"])


def check_tower(tower, budget_hidden: float, budget_rows: float) -> dict:
    """Every fixture image through `tower`: the worst errors of the last block's output and the merger's rows."""
    hidden, rows = [], []
    for name, entry in REF["images"].items():
        px = patches_of(tower, name)
        assert tower.grid(*entry["size"]) == grid_of(name)
        hidden.append(np.abs(tower.last_hidden_state(px, grid_of(name)) - ref(entry, "hidden_before_merger")).max())
        rows.append(np.abs(tower.encode_one(px, grid_of(name)) - ref(entry, "merger_rows")).max())
    return visionkit.within(hidden, rows, budget_hidden, budget_rows)


numpy_tower = visionkit.numpy_tower_fixture(TINY)


copy_fixture = functools.partial(visionkit.copy_fixture, TINY)


vision_edit, rgb_image = visionkit.vision_edit, visionkit.rgb_image


# ---------------------------------------------------------------- preprocessing

@pytest.mark.parametrize("name", IMAGES)
def test_patches_equal_transformers(numpy_tower, name):
    visionkit.check_patches(numpy_tower, TINY, name, REF["images"][name], 3 * 2 * 14 * 14)


def test_smart_resize_follows_transformers_rounding(numpy_tower):
    cfg = numpy_tower.cfg                       # min_pixels 3136, max_pixels 12544, factor 28
    for name, entry in REF["images"].items():
        w, h = entry["size"]
        assert list(smart_resize(h, w, cfg))[::-1] == entry["resized_wh"], name
    assert smart_resize(42, 98, cfg) == (56, 112)       # 1.5 and 3.5 cells: Python's round, half to even
    assert smart_resize(70, 70, cfg) == (56, 56)        # 2.5 -> 2
    assert smart_resize(150, 90, cfg) == (140, 84)      # no change needed past the rounding
    assert smart_resize(1000, 1000, cfg) == (112, 112)  # past max_pixels: floor(1000 / beta / 28) * 28
    assert smart_resize(1, 150, cfg) == (28, 700)       # under min_pixels: ceil of each side scaled up (past max)
    with pytest.raises(InvalidInputError, match="aspect"):
        smart_resize(1, 201, cfg)


def test_grids_stay_within_max_pixels(numpy_tower):
    """Absurd and tiny sizes: the merged grid is bounded by max_pixels (16 cells here) and at least 1 x 1;
    pixels() agrees with grid()."""
    rng = np.random.default_rng(5)
    sizes = [(1, 1), (8192, 8192), (65535, 1000), (3, 500), (28, 28), (29, 57)] + \
        [tuple(int(v) for v in rng.integers(1, 400, 2)) for _ in range(12)]
    visionkit.check_grids_bounded(numpy_tower, sizes, 200_000)
    assert numpy_tower.cfg.max_pixels == 12544


def test_window_order_is_transformers(numpy_tower):
    for name, entry in REF["images"].items():
        mh, mw = entry["merged_grid"]
        order, sizes = window_order(mh, mw, numpy_tower.cfg.window_cells)
        assert order.tolist() == entry["window_index"], name
        assert [0] + list(np.cumsum(sizes) * 4) == entry["cu_window_seqlens"], name
    assert numpy_tower.cfg.window_cells == 2 and numpy_tower.cfg.fullatt_block_indexes == (1,)


# ---------------------------------------------------------------- the tower

def test_tower_facts(numpy_tower):
    t = numpy_tower
    assert t.family == "qwen2_5_vl" and t.hidden == 64 and t.tokens_per_image is None and t.attends == "causal"
    px = patches_of(t, "image_wide.png")
    rows = t.encode_one(px, (3, 5))
    assert rows.shape == (15, 64) and rows.dtype == np.float32 and grid_of("image_wide.png") == (3, 5)
    np.testing.assert_array_equal(rows, t.encode_one(np.array(px), [3, 5]))


def test_the_grid_is_the_callers_not_found_by_the_patches(numpy_tower):
    """Two images of transposed shapes (4 x 2 and 2 x 4 cells of one colour each, the colours in the same
    row-major order) have the same patches: each image's rows follow the grid given with them (a tower that
    looked the grid up by the patches' digest gave the second image's grid to the first: rows off by 0.57)."""
    t = numpy_tower
    colours = np.random.default_rng(0).integers(0, 256, (8, 3)).astype(np.uint8)

    def image(rows, cols):
        a = np.zeros((rows * 28, cols * 28, 3), np.uint8)
        for k in range(8):
            a[k // cols * 28:(k // cols + 1) * 28, k % cols * 28:(k % cols + 1) * 28] = colours[k]
        return Image.fromarray(a, "RGB")
    tall, wide = image(4, 2), image(2, 4)
    assert t.grid(*tall.size) == (4, 2) and t.grid(*wide.size) == (2, 4)
    pt, pw = t.pixels(tall), t.pixels(wide)
    assert np.array_equal(pt, pw)
    alone = load_vision(TINY, backend="numpy")
    try:
        want = alone.encode_one(alone.pixels(tall), (4, 2))
    finally:
        alone.close()
    got = t.encode_one(pt, t.grid(*tall.size))
    np.testing.assert_array_equal(got, want)
    assert np.abs(got - t.encode_one(pt, (2, 4))).max() > 0.01      # the grid matters: the test can fail


def test_numpy_oracle_matches_transformers(numpy_tower):
    check_tower(numpy_tower, EXACT, EXACT)


def test_native_exact_matches_transformers_on_every_isa(isa):
    with closing(load_vision(TINY, backend="native", activations="f32", threads=2)) as t:
        check_tower(t, EXACT, EXACT)


def test_native_fast_mode_within_its_budget(isa):
    """The native default (bfloat16 products): measured 0.032 (hidden, values up to 9.6) and 0.012 (rows, up to
    2.4) at most."""
    with closing(load_vision(TINY, backend="native", threads=2)) as t:
        check_tower(t, 0.08, 0.04)


def test_bad_calls_are_typed_errors(numpy_tower):
    visionkit.check_bad_encode_calls(numpy_tower, patches_of(numpy_tower, "image_big.png"), (3, 4))


def test_closed_tower_refuses():
    t = load_vision(TINY, backend="numpy")
    px = patches_of(t, "image_tiny.png")
    t.close()
    with pytest.raises(ModelClosedError):
        t.encode_one(px, (3, 2))


# ---------------------------------------------------------------- llama.cpp's mmproj

def window112(tmp: Path) -> Path:
    """The fixture with llama.cpp's window (112 pixels: 4 cells) and room for 64 cells an image."""
    return copy_fixture(tmp, config_edit=vision_edit(window_size=112),
                        pre_edit=lambda p: p["size"].update(longest_edge=28 * 28 * 64))


@pytest.fixture(scope="module")
def mmproj_files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("qwen25vl_mmproj")
    src = window112(tmp / "hf")
    return src, {q: mmproj.write_mmproj(src, tmp / f"mmproj-{q}.gguf", q) for q in ("f32", "f16", "q8_0")}


@pytest.mark.parametrize("qtype,budget", [("f32", EXACT), ("f16", 5e-3), ("q8_0", 0.08)])
def test_our_mmproj_reads_back(mmproj_files, qtype, budget):
    """Ours: the same rows as the HF directory (F16: measured 1.4e-3, Q8_0: 2.9e-2, of values up to 2.5)."""
    src, files = mmproj_files
    with gguf.GGUFFile(files[qtype]) as f:
        meta = f.metadata
        assert meta["clip.projector_type"] == "qwen2.5vl_merger" and meta["clip.vision.n_wa_pattern"] == 2
        assert "v.patch_embd.weight.1" in f.tensors and "v.blk.1.attn_k.bias" in f.tensors
    im = Image.fromarray(rgb_image(140, 168), "RGB")
    with closing(load_vision(src, backend="numpy")) as a, closing(load_vision(files[qtype], backend="numpy")) as b:
        assert a.grid(168, 140) == b.grid(168, 140) == (5, 6)
        assert (a.cfg.window_size, a.cfg.fullatt_block_indexes) == (b.cfg.window_size, b.cfg.fullatt_block_indexes)
        err = np.abs(a.encode_one(a.pixels(im), (5, 6)) - b.encode_one(b.pixels(im), (5, 6))).max()
    assert err <= budget, err


@pytest.mark.parametrize("qtype,budget", [("f32", 5e-3), ("f16", 5e-3), ("q8_0", 0.08)])
def test_llama_cpp_reads_our_mmproj(mmproj_files, tmp_path, qtype, budget):
    """llama.cpp (llama-cpp-python's libmtmd, in a child process) loads our qwen2.5vl_merger mmproj beside a 64-wide
    text model and gives our rows (each side reading the same file) for a 168 x 140 image (no resize on either
    side: 5 x 6 cells, 2 x 2 windows of 4 cells, partial ones included): measured 1.2e-3 (F32), 1.4e-3 (F16),
    3.0e-2 (Q8_0: llama.cpp's products round the activations to 8 bits too) of values up to 2.5."""
    rgb = rgb_image(140, 168)
    theirs = visionkit.llama_cpp_rows(mmproj_files[1][qtype], rgb, tmp_path, ["<|vision_start|>", "<|vision_end|>"])
    with closing(load_vision(mmproj_files[1][qtype], backend="numpy")) as t:
        ours = t.encode_one(t.pixels(Image.fromarray(rgb, "RGB")), t.grid(168, 140))
    assert len(theirs) == 1 and theirs[0].shape == ours.shape == (30, 64)
    err = np.abs(theirs[0] - ours).max()
    assert err <= budget, err


def test_write_mmproj_refuses_what_llama_cpp_cannot_say(tmp_path):
    with pytest.raises(InvalidInputError, match="112"):         # the fixture's own window, 56
        mmproj.write_mmproj(TINY, tmp_path / "x.gguf", "f32")
    d = copy_fixture(tmp_path / "irregular", config_edit=lambda c: c["vision_config"].update(
        window_size=112, depth=3, fullatt_block_indexes=[0, 2]), tensors_edit=lambda t: t.update(
        {k.replace("blocks.1.", "blocks.2."): v for k, v in t.items() if ".blocks.1." in k}))
    with pytest.raises(InvalidInputError, match="every"):
        mmproj.write_mmproj(d, tmp_path / "y.gguf", "f32")


@pytest.mark.parametrize("edit,drop,match", [
    (lambda m: m.pop("clip.vision.n_wa_pattern"), (), "n_wa_pattern"),
    (lambda m: m.update({"clip.vision.n_wa_pattern": 0}), (), "n_wa_pattern"),
    (lambda m: m.pop("clip.vision.block_count"), (), "block_count"),
    (lambda m: m.update({"clip.vision.block_count": np.uint64(1 << 40)}), (), "block_count must"),   # had hung
    (lambda m: m.update({"clip.vision.window_size": 100}), (), "window_size"),
    (lambda m: m.update({"clip.vision.embedding_length": 48}), (), "shape"),
    (None, ("v.patch_embd.weight.1",), "patch_embed"),
    (None, ("v.blk.1.attn_v.weight",), "qkv"),
    (None, ("mm.2.bias",), "mlp.2.bias"),
])
def test_hostile_mmproj_is_a_format_error(mmproj_files, tmp_path, edit, drop, match):
    bad = visionkit.rewrite_gguf(mmproj_files[1]["f32"], tmp_path / "bad.gguf", edit, drop)
    with pytest.raises(ModelFormatError, match=match):
        load_vision(bad, backend="numpy")


# ---------------------------------------------------------------- hostile Hugging Face directories

@pytest.mark.parametrize("config_edit,pre_edit,match", [
    (vision_edit(window_size=60), None, "multiple"),
    (vision_edit(window_size=14), None, "window_size"),
    (vision_edit(window_size=1 << 40), None, "window_size"),
    (vision_edit(fullatt_block_indexes=[2]), None, "fullatt"),
    (vision_edit(fullatt_block_indexes="1"), None, "fullatt"),
    (vision_edit(fullatt_block_indexes=None), None, "fullatt"),
    (vision_edit(num_heads=3), None, "heads"),
    (vision_edit(num_heads=16), None, "multiple of 4"),      # head dim 2: the 2D rotary needs 4 | head dim
    (vision_edit(depth=10 ** 9), None, "depth"),
    (vision_edit(hidden_size=-1), None, "hidden_size"),
    (vision_edit(patch_size=0), None, "patch_size"),
    (vision_edit(spatial_merge_size=1000), None, "merge_size"),
    (vision_edit(spatial_merge_size=3), None, "merge_size 2"),
    (vision_edit(hidden_act="gelu"), None, "hidden_act"),
    (vision_edit(out_hidden_size=65), None, "width"),
    (None, lambda p: p["size"].update(longest_edge=1 << 40), "max_pixels"),
    (None, lambda p: p["size"].update(shortest_edge=20000), "min_pixels"),
    (None, lambda p: p.update(resample=2), "bicubic"),
    (None, lambda p: p.update(patch_size=16), "patch_size"),
    (None, lambda p: p.update(image_std=[0, 1, 1]), "image_std"),
    (None, lambda p: p.update(image_mean="grey"), "image_mean"),
])
def test_hostile_configs_are_format_errors(tmp_path, config_edit, pre_edit, match):
    d = copy_fixture(tmp_path / "bad", pre_edit=pre_edit, config_edit=config_edit)
    with pytest.raises(ModelFormatError, match=match):
        load_vision(d, backend="numpy")


@pytest.mark.parametrize("tensors_edit,match", [
    (lambda t: t.pop("visual.blocks.1.attn.qkv.bias"), "attn.qkv.bias"),
    (lambda t: t.pop("visual.merger.ln_q.weight"), "ln_q"),
    (lambda t: t.update({"visual.blocks.0.mlp.gate_proj.weight": np.zeros((64, 31), np.float32)}), "shape"),
    (lambda t: t.update({"visual.patch_embed.proj.weight": np.zeros((32, 3, 1, 14, 14), np.float32)}), "shape"),
    (lambda t: t["visual.blocks.0.norm2.weight"].__setitem__(3, np.inf), "non-finite"),
    (lambda t: [t.pop(k) for k in list(t) if k.startswith("visual.")], "patch_embed"),
])
def test_hostile_tensors_are_format_errors(tmp_path, tensors_edit, match):
    d = copy_fixture(tmp_path / "bad", tensors_edit=tensors_edit)
    with pytest.raises(ModelFormatError, match=match):
        load_vision(d, backend="numpy")


def test_transformers_5_names_load_too(tmp_path):
    """transformers 5 keeps the tower under model.visual. in memory; either prefix loads."""
    d = copy_fixture(tmp_path / "m", tensors_edit=lambda t: t.update(
        {"model." + k: t.pop(k) for k in [k for k in t if k.startswith("visual.")]}))
    with closing(load_vision(d, backend="numpy")) as t:
        check_tower(t, EXACT, EXACT)


# ---------------------------------------------------------------- Qwen2-VL (tests/fixtures/reference/tiny/qwen2_vl_vision)

QWEN2VL, QWEN2VL_REF = visionkit.fixture("qwen2_vl_vision")


def check_qwen2vl(tower, budget_hidden: float, budget_rows: float) -> dict:
    """The Qwen2-VL fixture's one image (the Qwen2.5-VL folder's image_tiny.png) through `tower`."""
    px = tower.pixels(load_image((QWEN2VL / QWEN2VL_REF["image"]).read_bytes()))
    np.testing.assert_array_equal(px, np.load(QWEN2VL / QWEN2VL_REF["patches"]))
    assert tower.grid(20, 30) == (3, 2) and tower.family == "qwen2_vl" and tower.tokens_per_image is None
    hidden = np.abs(tower.last_hidden_state(px, (3, 2)) - np.load(QWEN2VL / QWEN2VL_REF["hidden_before_merger"])).max()
    rows = np.abs(tower.encode_one(px, (3, 2)) - np.load(QWEN2VL / QWEN2VL_REF["merger_rows"])).max()
    return visionkit.within([hidden], [rows], budget_hidden, budget_rows)


def test_qwen2vl_numpy_oracle_matches_transformers():
    with closing(load_vision(QWEN2VL, backend="numpy")) as t:
        check_qwen2vl(t, EXACT, EXACT)


def test_qwen2vl_native_exact_on_every_isa(isa):
    with closing(load_vision(QWEN2VL, backend="native", activations="f32", threads=2)) as t:
        check_qwen2vl(t, EXACT, EXACT)


def test_qwen2vl_native_fast_within_its_budget(isa):
    """Measured 0.024 (hidden, values up to ~9) and 0.0082 (rows, up to 1.9)."""
    with closing(load_vision(QWEN2VL, backend="native", threads=2)) as t:
        check_qwen2vl(t, 0.08, 0.04)


def test_qwen2vl_mmproj_reads_back_and_llama_cpp_agrees(tmp_path):
    """Our qwen2vl_merger mmproj (no clip.use_gelu: llama.cpp's MLP is then quick GELU, as Qwen2-VL's) reads back
    exactly and llama.cpp gives our rows (measured 1.2e-3 of values up to 2.4; with use_gelu it had been 1.4e-2)."""
    src = visionkit.copy_fixture(QWEN2VL, tmp_path / "hf", pre_edit=lambda p: p["size"].update(longest_edge=28 * 28 * 64))
    out = mmproj.write_mmproj(src, tmp_path / "mmproj.gguf", "f32")
    with gguf.GGUFFile(out) as f:
        assert f.metadata["clip.projector_type"] == "qwen2vl_merger" and "clip.use_gelu" not in f.metadata
    rgb = rgb_image(140, 168)
    im = Image.fromarray(rgb, "RGB")
    with closing(load_vision(src, backend="numpy")) as a, closing(load_vision(out, backend="numpy")) as b:
        ours = b.encode_one(b.pixels(im), (5, 6))
        assert np.abs(a.encode_one(a.pixels(im), (5, 6)) - ours).max() <= EXACT
    theirs = visionkit.llama_cpp_rows(out, rgb, tmp_path, ["<|vision_start|>", "<|vision_end|>"])
    assert len(theirs) == 1 and theirs[0].shape == ours.shape == (30, 64)
    err = np.abs(theirs[0] - ours).max()
    assert err <= 5e-3, err


# ---------------------------------------------------------------- Ollama's qwen25vl model file

def ollama_file(dest: Path, keys_edit=None) -> Path:
    """The fixture's tower as Ollama's converter names it in its qwen25vl model file (convert_qwen25vl.go's
    splits and replacements, as we read them: no Ollama file was at hand to check against) and its keys."""
    from llambda.formats import gguf_writer, quants, safetensors
    with safetensors.SafetensorsFile(TINY / "model.safetensors") as st:
        hf = {n[len("visual."):]: t.to_float32() for n, t in st.tensors.items() if n.startswith("visual.")}
    tensors = []
    for name, v in hf.items():
        if name == "patch_embed.proj.weight":
            tensors += [(f"v.patch_embd_{k}.weight", quants.QType.F32, np.ascontiguousarray(v[:, :, k])) for k in (0, 1)]
        elif ".attn.qkv." in name:
            i, kind = name.split(".")[1], name.rpartition(".")[2]
            tensors += [(f"v.blk.{i}.attn_{x}.{kind}", quants.QType.F32, p) for x, p in zip("qkv", np.split(v, 3))]
        else:
            for a, b in (("blocks", "blk"), ("attn.proj", "attn_out"), ("norm1", "ln1"), ("norm2", "ln2"),
                         ("mlp.gate_proj", "ffn_gate"), ("mlp.up_proj", "ffn_up"), ("mlp.down_proj", "ffn_down")):
                name = name.replace(a, b)
            tensors.append(("v." + name, quants.QType.F32, v))
    vis = REF["config"]["vision_config"]
    meta = {"general.architecture": "qwen25vl", "qwen25vl.embedding_length": 64,
            "qwen25vl.vision.block_count": vis["depth"], "qwen25vl.vision.embedding_length": vis["hidden_size"],
            "qwen25vl.vision.attention.head_count": vis["num_heads"], "qwen25vl.vision.num_channels": 3,
            "qwen25vl.vision.patch_size": 14, "qwen25vl.vision.spatial_merge_size": 2,
            "qwen25vl.vision.window_size": vis["window_size"], "qwen25vl.vision.temporal_patch_size": 2,
            "qwen25vl.vision.rope.freq_base": 10000.0, "qwen25vl.vision.max_pixels": 12544,
            "qwen25vl.vision.fullatt_block_indexes": gguf_writer.GGUFValue((gguf.GGUFValueType.ARRAY,
                                                                              gguf.GGUFValueType.INT32), [1])}
    if keys_edit is not None:
        keys_edit(meta)
    gguf_writer.write_gguf(dest, meta, tensors)
    return dest


def test_ollama_qwen25vl_file_reads_as_the_hf_directory(tmp_path, numpy_tower):
    """Min pixels are Ollama's 3136 (the fixture's too), so the same grid and rows; no tokens-per-second or
    intermediate-size key: the MLP's width from ffn_gate's shape."""
    with closing(load_vision(ollama_file(tmp_path / "ollama.gguf"), backend="numpy")) as t:
        assert t.family == "qwen2_5_vl" and t.cfg.intermediate_size == 64 and t.cfg.fullatt_block_indexes == (1,)
        check_tower(t, EXACT, EXACT)


@pytest.mark.parametrize("edit,match", [
    (lambda m: m.pop("qwen25vl.vision.block_count"), "block_count"),
    (lambda m: m.update({"qwen25vl.vision.window_size": 50}), "window_size"),
    (lambda m: m.update({"qwen25vl.vision.embedding_length": 48}), "shape"),
    (lambda m: m.update({"qwen25vl.vision.max_pixels": 1 << 40}), "max_pixels"),
])
def test_hostile_ollama_files_are_format_errors(tmp_path, edit, match):
    with pytest.raises(ModelFormatError, match=match):
        load_vision(ollama_file(tmp_path / "bad.gguf", edit), backend="numpy")


@pytest.mark.parametrize("backend", ["numpy", "native"])
def test_the_mlp_in_row_blocks_is_the_same(monkeypatch, backend):
    """The MLP runs MLP_ROWS rows at a time (a 16384-patch image's [n, F] buffers would be 0.9 GB each): blocks of 7
    rows, the last one short, give transformers' rows still."""
    from llambda.vision import qwen2vl_config
    monkeypatch.setattr(qwen2vl_config, "MLP_ROWS", 7)
    with closing(load_vision(TINY, backend=backend, activations="f32")) as t:
        check_tower(t, EXACT, EXACT)
    with closing(load_vision(QWEN2VL, backend=backend, activations="f32")) as t:
        check_qwen2vl(t, EXACT, EXACT)


def test_the_memory_plan_counts_the_largest_image(numpy_tower):
    """models/memory.add_vision reads params() and workspace_bytes(): the tower's parameter count is the files'
    (every tensor counted once) and the workspace covers the largest image max_pixels allows (64 patches)."""
    from llambda.formats import safetensors
    from llambda.models import memory
    for folder in (TINY, QWEN2VL):
        with safetensors.SafetensorsFile(folder / "model.safetensors") as st:
            n = sum(int(np.prod(t.shape)) for name, t in st.tensors.items() if name.startswith("visual."))
        with closing(load_vision(folder, backend="numpy")) as t:
            assert t.cfg.params() == n, folder
    cfg = numpy_tower.cfg
    assert cfg.max_patches() == 64
    plan = memory.MemoryPlan.__new__(memory.MemoryPlan)
    plan.n_ctx = 4096
    memory.add_vision(plan, cfg, 2)
    assert plan.vision == 2 * cfg.params() and plan.vision_workspace == cfg.workspace_bytes() > 64 * 4 * 7 * 32
    plan.n_ctx = 8                      # a context of 8 tokens holds an image of 7 cells (28 patches) at most
    memory.add_vision(plan, cfg, 2)
    assert plan.vision_workspace == cfg.workspace_bytes(8) < cfg.workspace_bytes()


def test_the_plan_of_a_3b_tower_is_bounded_by_the_context():
    """Qwen2.5-VL-3B's tower (its released config and max_pixels 12845056): the largest image takes 3.5 GB of
    activations, one a 4096-token context holds 0.96 GB (an 8 GB machine had been refused a 3B load for an image
    it could never take)."""
    from llambda.vision.qwen2vl_config import QwenVisionConfig
    cfg = QwenVisionConfig.from_fields(dict(
        projector="qwen2_5_vl", hidden_size=1280, intermediate_size=3420, num_hidden_layers=32,
        num_attention_heads=16, patch_size=14, text_hidden_size=2048, window_size=112,
        fullatt_block_indexes=[7, 15, 23, 31], min_pixels=3136, max_pixels=12845056))
    assert cfg.max_patches() == 65536 and 3.4e9 < cfg.workspace_bytes() < 3.6e9
    assert cfg.workspace_bytes(4096) < 1.0e9 and cfg.workspace_bytes(10 ** 6) == cfg.workspace_bytes()


def test_the_released_transformers_4_layout_loads(tmp_path):
    """Qwen/Qwen2.5-VL-*-Instruct as released: the text fields at config.json's top level (no text_config),
    vision_config's in_chans and spatial_patch_size, preprocessor_config.json's min_pixels / max_pixels (no size)."""
    def flat(c):
        c.update({k: v for k, v in c.pop("text_config").items() if k != "model_type"})
        v = c["vision_config"]
        v["in_chans"] = v.pop("in_channels")
        v["spatial_patch_size"] = v["patch_size"]

    def old_processor(p):
        size = p.pop("size")
        p.update(min_pixels=size["shortest_edge"], max_pixels=size["longest_edge"])
    d = copy_fixture(tmp_path / "released", config_edit=flat, pre_edit=old_processor)
    with closing(load_vision(d, backend="numpy")) as t:
        assert (t.cfg.min_pixels, t.cfg.max_pixels, t.hidden) == (3136, 12544, 64)
        check_tower(t, EXACT, EXACT)


def test_threads_take_turns(numpy_tower):
    """encode_one from several threads at once (pixels() too): each image's own rows."""
    got = visionkit.encode_in_threads(lambda n: numpy_tower.encode_one(patches_of(numpy_tower, n), grid_of(n)), IMAGES)
    assert all(np.abs(got[n] - ref(REF["images"][n], "merger_rows")).max() <= EXACT for n in IMAGES)


def test_transformers_5_processor_config_is_read(tmp_path):
    """transformers 5 saves the image processor's settings inside processor_config.json (image_processor): read
    there when preprocessor_config.json is absent (here max_pixels 3136 x 2: the big image gets fewer cells)."""
    d = copy_fixture(tmp_path / "t5")
    pre = json.loads((d / "preprocessor_config.json").read_text())
    pre["size"]["longest_edge"] = 6272
    (d / "processor_config.json").write_text(json.dumps({"image_processor": pre, "processor_class": "X"}))
    (d / "preprocessor_config.json").unlink()
    with closing(load_vision(d, backend="numpy")) as t:
        assert t.cfg.max_pixels == 6272 and t.grid(180, 130) == (2, 3)
