"""The InternVL 3 / 3.5 vision tower against transformers (tests/fixtures/reference/tiny/internvl_vision: LayerNorm
blocks with q/k/v biases as InternViT-300M's; internvl_rms_vision: RMSNorm blocks with q/k norms and no biases as
InternViT-6B's; tools/make_tiny_internvl.py): the processor's tiles and grid, the tower's last hidden state per
tile, the projector's rows, on the NumPy oracle and the native backend (every ISA path); hostile configs."""
from __future__ import annotations

import json
import sys
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest

PIL = pytest.importorskip("PIL")

from llambda.backends import available_backends  # noqa: E402
from llambda.errors import InvalidInputError, ModelFormatError  # noqa: E402
from llambda.vision import internvl_pixels, load_image, load_vision  # noqa: E402
from llambda.vision.image import check_image  # noqa: E402
from llambda.vision.internvl_config import InternVLConfig  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import visionkit  # noqa: E402

TINY = Path(__file__).parent / "fixtures/reference/tiny"
FOLDERS = {f: TINY / f for f in ("internvl_vision", "internvl_rms_vision")}
REFS = {f: json.loads((d / "reference.json").read_text(encoding="utf-8")) for f, d in FOLDERS.items()}
MAIN = FOLDERS["internvl_vision"]
REF = REFS["internvl_vision"]
IMAGES = sorted(REF["images"])
EXACT = 1e-4        # transformers in float32 (eager attention); our float32 paths
FAST = 0.05         # the native default (bfloat16 products), Gemma 3's and Idefics3's tower budget


def ref(folder: str, entry: dict, key: str) -> np.ndarray:
    return np.load(FOLDERS[folder] / entry[key])


def check_tower(tower, folder: str, budget: float) -> dict:
    """Every fixture image's tiles through `tower`: the worst errors of the last hidden states (the class token,
    row 0 of transformers', is not ours) and of the projector's rows."""
    worst = {"hidden": 0.0, "rows": 0.0}
    width = tower.hidden
    for name, entry in REFS[folder]["images"].items():
        tiles = tower.pixels(load_image((FOLDERS[folder] / name).read_bytes()))
        states = np.stack([tower.last_hidden_state(tile) for tile in tiles])
        err = np.abs(states - ref(folder, entry, "vision_last_hidden_state")[:, 1:]).max()
        worst["hidden"] = max(worst["hidden"], float(err))
        out = tower.encode(tiles)
        assert out.shape == (len(tiles), tower.tokens_per_image, width)
        want = ref(folder, entry, "projector_rows").reshape(out.shape)
        worst["rows"] = max(worst["rows"], float(np.abs(out - want).max()))
    assert max(worst.values()) <= budget, worst
    return worst


@pytest.fixture(scope="module")
def numpy_tower():
    with closing(load_vision(MAIN, backend="numpy")) as t:
        yield t


# ---------------------------------------------------------------- preprocessing

@pytest.mark.parametrize("name", IMAGES)
def test_tiles_equal_transformers(numpy_tower, name):
    """The tile grid from the header's size, grid()'s (rows, cols) ((0, 0): one tile, no thumbnail) and the
    tiles' pixel values, bit for bit (the same Pillow resizes and arithmetic)."""
    entry, data = REF["images"][name], (MAIN / name).read_bytes()
    size = check_image(data)
    assert list(size) == entry["size"]
    cols, rows = internvl_pixels.tile_grid(*size, numpy_tower.cfg)
    assert [cols, rows] == entry["tiles_cols_rows"]
    assert numpy_tower.grid(*size) == ((rows, cols) if cols * rows > 1 else (0, 0))
    tiles = numpy_tower.pixels(load_image(data))
    want = ref("internvl_vision", entry, "pixel_values")
    assert tiles.dtype == np.float32 and tiles.shape == want.shape == (entry["num_patches"], 3, 56, 56)
    np.testing.assert_array_equal(tiles, want)


def test_tile_grid_follows_the_processor_rules():
    """transformers' get_optimal_tiled_canvas, transcribed from its rules (the closest ratio; a tie goes to the
    later arrangement when the image's area passes half of its tiles'), checked on many sizes."""
    cfg = InternVLConfig.from_fields({"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                                      "num_attention_heads": 2, "image_size": 448, "patch_size": 14,
                                      "text_hidden_size": 64, "max_patches": 12})

    def rule(w, h):
        cands = sorted(((a, b) for a in range(1, 13) for b in range(1, 13) if 1 <= a * b <= 12), key=lambda g: g[0] * g[1])
        best, diff = (1, 1), float("inf")
        for a, b in cands:
            d = abs(w / h - a / b)
            if d < diff:
                best, diff = (a, b), d
            elif d == diff and w * h > 0.5 * 448 * 448 * a * b:
                best = (a, b)
        return best
    rng = np.random.default_rng(5)
    sizes = [(448, 448), (896, 448), (448, 896), (1000, 10), (10, 1000), (1344, 448), (100, 50), (2000, 1000)]
    sizes += [tuple(int(v) for v in rng.integers(1, 3000, 2)) for _ in range(300)]
    for w, h in sizes:
        assert internvl_pixels.tile_grid(w, h, cfg) == rule(w, h), (w, h)
    assert internvl_pixels.tile_grid(1000, 400, cfg) == (5, 2)   # ratio 2.5: (2, 1), (3, 1) ... (5, 2) exact
    assert internvl_pixels.tile_grid(300, 100, cfg) == (3, 1)


# ---------------------------------------------------------------- the tower

@pytest.mark.parametrize("folder", list(FOLDERS))
def test_numpy_oracle_matches_transformers(folder):
    with closing(load_vision(FOLDERS[folder], backend="numpy")) as t:
        assert t.family == "internvl" and t.attends == "causal" and t.tokens_per_image == 4 and t.hidden == 64
        assert t.cfg.norm_type == ("rms_norm" if "rms" in folder else "layer_norm")
        assert t.cfg.use_qk_norm == ("rms" in folder)
        check_tower(t, folder, EXACT)


@pytest.mark.parametrize("folder", list(FOLDERS))
@pytest.mark.parametrize("activations, budget", [("f32", EXACT), (None, FAST)])
def test_native_matches_transformers_on_every_isa(isa, folder, activations, budget):
    """The exact mode (float32 panels) and the default (bfloat16 products, held to Gemma 3's tower budget)."""
    with closing(load_vision(FOLDERS[folder], backend="native", activations=activations, threads=2)) as t:
        check_tower(t, folder, budget)


def test_layer_scale_matters(tmp_path):
    """The fixture's layer scales are not 1: with them set to 1 the rows move (the fold into proj / fc2 is read)."""
    d = visionkit.copy_fixture(MAIN, tmp_path / "ones", tensors_edit=lambda t: t.update(
        {n: np.ones_like(v) for n, v in t.items() if ".lambda_" in n}))
    with closing(load_vision(d, backend="numpy")) as t:
        entry = REF["images"]["image_square.png"]
        px = ref("internvl_vision", entry, "pixel_values")
        assert np.abs(t.encode(px) - ref("internvl_vision", entry, "projector_rows").reshape(1, 4, 64)).max() > 0.05


def test_model_prefix_layout_reads_the_same(tmp_path):
    """transformers 4's saves (and the -hf repositories) keep the tower under model.vision_tower., the projector
    under model.multi_modal_projector.: the same tower."""
    d = visionkit.copy_fixture(MAIN, tmp_path / "t4", tensors_edit=lambda t: [
        t.__setitem__("model." + n, t.pop(n)) for n in list(t) if n.startswith(("vision_tower.", "multi_modal"))])
    with closing(load_vision(d, backend="numpy")) as t:
        check_tower(t, "internvl_vision", EXACT)


def test_encode_refuses_bad_pixels(numpy_tower):
    with pytest.raises(InvalidInputError):
        numpy_tower.encode(np.zeros((1, 3, 28, 28), np.float32))
    bad = np.zeros((1, 3, 56, 56), np.float32)
    bad[0, 0, 0, 0] = np.nan
    with pytest.raises(InvalidInputError):
        numpy_tower.encode(bad)


# ---------------------------------------------------------------- hostile configs

def vis(**kw):
    return visionkit.vision_edit(**kw)


@pytest.mark.parametrize("edit, match", [
    (dict(config_edit=vis(norm_type="batch_norm")), "norm_type"),
    (dict(config_edit=vis(hidden_act="relu")), "hidden_act"),
    (dict(config_edit=vis(image_size=[56, 42])), "image_size"),
    (dict(config_edit=vis(image_size=50)), "image_size"),
    (dict(config_edit=vis(patch_size=0)), "patch_size"),
    (dict(config_edit=vis(hidden_size=33)), "hidden_size"),
    (dict(config_edit=vis(num_hidden_layers=10 ** 9)), "num_hidden_layers"),
    (dict(config_edit=vis(use_qk_norm="yes")), "use_qk_norm"),
    (dict(config_edit=vis(layer_norm_eps=float("nan"))), "layer_norm_eps"),
    (dict(config_edit=lambda c: c.update(downsample_ratio=0.3)), "downsample_ratio"),
    (dict(config_edit=lambda c: c.update(downsample_ratio=1 / 3)), "downsample_ratio"),
    (dict(config_edit=lambda c: c.update(vision_feature_layer=-2)), "vision_feature_layer"),
    (dict(config_edit=lambda c: c.update(vision_feature_select_strategy="full")), "vision_feature_select_strategy"),
    (dict(config_edit=lambda c: c.update(projector_hidden_act="silu")), "projector_hidden_act"),
    (dict(config_edit=lambda c: c.update(image_seq_length=256)), "image_seq_length"),
    (dict(config_edit=lambda c: c["text_config"].update(hidden_size=None)), "text_config.hidden_size"),
    (dict(pre_edit=lambda p: p.update(size={"height": 112, "width": 112})), "size"),
    (dict(pre_edit=lambda p: p.update(size={"height": 56, "width": 28})), "size"),
    (dict(pre_edit=lambda p: p.update(max_patches=0)), "max_patches"),
    (dict(pre_edit=lambda p: p.update(max_patches=10 ** 6)), "max_patches"),
    (dict(pre_edit=lambda p: p.update(min_patches=7)), "max_patches"),
    (dict(pre_edit=lambda p: p.update(resample=9)), "resample"),
    (dict(pre_edit=lambda p: p.update(image_std=[0, 1, 1])), "image_std"),
    (dict(tensors_edit=lambda t: t.pop("vision_tower.encoder.layer.1.lambda_2")), "lambda_2"),
    (dict(tensors_edit=lambda t: t.update({"vision_tower.embeddings.position_embeddings": np.zeros((1, 5, 32), np.float32)})),
     "position_embeddings"),
    (dict(tensors_edit=lambda t: t.pop("multi_modal_projector.linear_1.weight")), "linear_1"),
    (dict(tensors_edit=lambda t: t["vision_tower.embeddings.cls_token"].__setitem__((0, 0, 0), np.inf)), "cls_token"),
])
def test_hostile_configs_and_tensors_are_refused(tmp_path, edit, match):
    visionkit.refused(MAIN, tmp_path / "bad", match, **edit)


# ---------------------------------------------------------------- llama.cpp's mmproj

@pytest.fixture(scope="module")
def mmprojs(tmp_path_factory):
    return visionkit.write_mmprojs(MAIN, tmp_path_factory.mktemp("mmproj"))


@pytest.mark.parametrize("qtype, budget", [("f32", EXACT), ("f16", 5e-3), ("q8_0", 0.05)])
@pytest.mark.parametrize("backend, activations", [("numpy", None), ("native", "f32")])
def test_mmproj_reads_back_as_the_directory(mmprojs, qtype, budget, backend, activations):
    """Our mmproj (F32, F16, Q8_0) read back: the same config, grids and tiles, the rows within the type's budget
    (measured 1.8e-6, 1.1e-3, 2.5e-2)."""
    if backend not in available_backends():
        pytest.skip(f"the {backend} backend is not available here")
    with closing(load_vision(mmprojs[qtype], backend=backend, activations=activations)) as t:
        c = t.cfg
        assert t.family == "internvl"
        assert (c.min_patches, c.max_patches, c.scale_factor, c.norm_type, c.attention_bias, c.use_qk_norm) == (
            1, 6, 2, "layer_norm", True, False)
        for name, entry in REF["images"].items():
            assert t.grid(*entry["size"]) == load_vision(MAIN, backend="numpy").grid(*entry["size"])
            tiles = t.pixels(load_image((MAIN / name).read_bytes()))
            np.testing.assert_array_equal(tiles, ref("internvl_vision", entry, "pixel_values"))
            out = t.encode(tiles)
            want = ref("internvl_vision", entry, "projector_rows").reshape(out.shape)
            assert float(np.abs(out - want).max()) <= budget


def test_mmproj_writer_refuses_what_llama_cpp_cannot_say(tmp_path):
    """llama.cpp runs RMSNorm blocks only for InternViT-6B's size, and no final LayerNorm."""
    from llambda.vision.mmproj import write_mmproj
    with pytest.raises(InvalidInputError, match="RMSNorm"):
        write_mmproj(FOLDERS["internvl_rms_vision"], tmp_path / "rms.gguf")
    d = visionkit.copy_fixture(MAIN, tmp_path / "pool", config_edit=vis(use_mean_pooling=False), tensors_edit=lambda t: t.update(
        {"vision_tower.layernorm.weight": np.ones(32, np.float32), "vision_tower.layernorm.bias": np.zeros(32, np.float32)}))
    with pytest.raises(InvalidInputError, match="use_mean_pooling"):
        write_mmproj(d, tmp_path / "pool.gguf")


@pytest.mark.parametrize("edit, drop, match", [
    (lambda m: m.pop("clip.vision.projector.scale_factor"), (), "scale_factor"),
    (lambda m: m.update({"clip.vision.projector.scale_factor": 3}), (), "scale_factor"),
    (lambda m: m.update({"clip.vision.preproc_max_tiles": 0}), (), "preproc_max_tiles"),
    (lambda m: m.update({"clip.vision.block_count": 10 ** 9}), (), "block_count"),
    (lambda m: m.update({"clip.has_vision_encoder": False}), (), "has_vision_encoder"),
    (lambda m: m.update({"clip.use_silu": True}), (), "use_silu"),
    (None, ("v.blk.1.ls2.weight",), "lambda_2"),
    (None, ("v.class_embd",), "cls_token"),
    (None, ("mm.model.mlp.3.weight",), "linear_2"),
])
def test_hostile_mmprojs_are_refused(mmprojs, tmp_path, edit, drop, match):
    bad = visionkit.rewrite_gguf(mmprojs["f32"], tmp_path / "bad.gguf", meta_edit=edit, drop=drop)
    with pytest.raises(ModelFormatError, match=match):
        load_vision(bad, backend="numpy")


def llama_cpp_twin(tmp_path: Path) -> Path:
    """The fixture with the position table as llama.cpp's graph applies it: llama.cpp 0.3.36 puts the class token
    AFTER the patches (ggml_concat) and adds the table's rows in order, so patch i takes row i (transformers': row
    i + 1) and the class token the last row. Attention does not see the order of rows, so this folder, run our way,
    is llama.cpp's model of the original file."""
    key = "vision_tower.embeddings.position_embeddings"
    return visionkit.copy_fixture(MAIN, tmp_path / "twin", tensors_edit=lambda t: t.update(
        {key: np.roll(t[key], 1, axis=1)}))


@pytest.mark.parametrize("h, w", [(56, 56), (56, 112)])
def test_llama_cpp_reads_our_mmproj(mmprojs, tmp_path, h, w):
    """llama-cpp-python 0.3.36's libmtmd on our F32 mmproj: the same tiles in the same order (tiles row-major, the
    thumbnail last), each tile's rows our twin's (see llama_cpp_twin) within 3e-3 (its GELU is the tanh form, ours
    erf); the thumbnail (its own bicubic resize) within 0.1. Against transformers' order llama.cpp is off by ~1.1
    on this fixture: its CLS-last graph shifts every patch's position (as llama.cpp issue 25814 says of llava's)."""
    from PIL import Image
    rgb = visionkit.rgb_image(h, w)
    got = visionkit.llama_cpp_rows(mmprojs["f32"], rgb, tmp_path, control_tokens=("<img>", "</img>"), width=64)
    with closing(load_vision(llama_cpp_twin(tmp_path), backend="numpy")) as twin, \
            closing(load_vision(MAIN, backend="numpy")) as ours:
        tiles = twin.pixels(Image.fromarray(rgb))
        want, plain = twin.encode(tiles), ours.encode(tiles)
    assert [g.shape for g in got] == [(4, 64)] * len(tiles)
    got = np.stack(got)
    exact = len(tiles) - (len(tiles) > 1)       # the tiles cut without a resize
    assert float(np.abs(got[:exact] - want[:exact]).max()) <= 3e-3
    assert float(np.abs(got - want).max()) <= 0.1
    assert float(np.abs(got - plain).max()) > 0.5      # the twin is what llama.cpp computes, not transformers' order


# ---------------------------------------------------------------- OpenGVLab's internvl_chat layout

def chat_layout(src: Path, dest: Path) -> Path:
    """The fixture `src` saved as OpenGVLab's remote-code directory (model_type internvl_chat): its config's names
    (vision_config in InternVisionModel's, llm_config, the tiling keys), its tensors renamed (vision_model.*, each
    block's q/k/v as one attn.qkv, mlp1.*) and nothing else changed: the same model."""
    def config(c: dict) -> None:
        v = c["vision_config"]
        c.clear()
        c.update(architectures=["InternVLChatModel"], model_type="internvl_chat", downsample_ratio=0.5, select_layer=-1,
                 ps_version="v2", min_dynamic_patch=1, max_dynamic_patch=6, dynamic_image_size=True, use_thumbnail=True,
                 force_image_size=v["image_size"][0], llm_config=config.text, template="internvl2_5",
                 vision_config={"architectures": ["InternVisionModel"], "model_type": "intern_vit_6b",
                                "hidden_size": v["hidden_size"], "intermediate_size": v["intermediate_size"],
                                "num_hidden_layers": v["num_hidden_layers"], "num_attention_heads": v["num_attention_heads"],
                                "image_size": v["image_size"][0], "patch_size": v["patch_size"][0],
                                "layer_norm_eps": v["layer_norm_eps"], "norm_type": v["norm_type"], "hidden_act": "gelu",
                                "qkv_bias": v["attention_bias"], "qk_normalization": v["use_qk_norm"]})
    config.text = json.loads((src / "config.json").read_text())["text_config"]

    def tensors(t: dict) -> None:
        names = {"vision_tower.embeddings.cls_token": "vision_model.embeddings.class_embedding",
                 "vision_tower.embeddings.position_embeddings": "vision_model.embeddings.position_embedding",
                 "vision_tower.embeddings.patch_embeddings.projection": "vision_model.embeddings.patch_embedding",
                 "multi_modal_projector.layer_norm": "mlp1.0", "multi_modal_projector.linear_1": "mlp1.1",
                 "multi_modal_projector.linear_2": "mlp1.3", "layernorm_before": "norm1", "layernorm_after": "norm2",
                 "attention.projection_layer": "attn.proj", "attention.q_norm": "attn.q_norm",
                 "attention.k_norm": "attn.k_norm", "lambda_1": "ls1", "lambda_2": "ls2",
                 "vision_tower.encoder.layer.": "vision_model.encoder.layers."}
        for n in [n for n in t if ".attention.q_proj." in n]:
            parts = [t.pop(n.replace(".q_proj.", f".{x}_proj.")) for x in "qkv"]
            t[n.replace(".attention.q_proj.", ".attn.qkv.")] = np.concatenate(parts)
        for n in list(t):
            new = n
            for a, b in names.items():
                new = new.replace(a, b)
            t[new] = t.pop(n)
    return visionkit.copy_fixture(src, dest, config_edit=config, tensors_edit=tensors)


@pytest.mark.parametrize("folder", list(FOLDERS))
def test_internvl_chat_layout_reads_the_same(tmp_path, folder):
    """OpenGVLab's InternVLChatModel directory of the same weights: the same config, tiles and rows."""
    d = chat_layout(FOLDERS[folder], tmp_path / "chat")
    with closing(load_vision(d, backend="numpy")) as t:
        assert t.family == "internvl" and (t.cfg.min_patches, t.cfg.max_patches) == (1, 6)
        assert t.cfg.image_mean == (0.485, 0.456, 0.406)
        check_tower(t, folder, EXACT)


@pytest.mark.parametrize("edit, match", [
    (lambda c: c.update(ps_version="v1"), "ps_version"),
    (lambda c: c.update(use_thumbnail=False), "use_thumbnail"),
    (lambda c: c.update(force_image_size=448), "force_image_size"),
    (lambda c: c.update(select_layer=-4), "select_layer"),
    (lambda c: c.update(max_dynamic_patch=0), "max_dynamic_patch"),
    (lambda c: c["vision_config"].update(qkv_bias="yes"), "qkv_bias"),
    (lambda c: c.pop("llm_config"), "llm_config"),
])
def test_hostile_internvl_chat_configs_are_refused(tmp_path, edit, match):
    d = chat_layout(MAIN, tmp_path / "chat")
    cfg = json.loads((d / "config.json").read_text())
    edit(cfg)
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelFormatError, match=match):
        load_vision(d, backend="numpy")


def test_mmproj_of_an_internvl_chat_directory(tmp_path):
    """write_mmproj reads OpenGVLab's layout too (attn.qkv split into llama.cpp's attn_q/k/v): the file gives the
    directory's rows."""
    from llambda.vision.mmproj import write_mmproj
    out = write_mmproj(chat_layout(MAIN, tmp_path / "chat"), tmp_path / "chat.gguf", "f32")
    with closing(load_vision(out, backend="numpy")) as t:
        check_tower(t, "internvl_vision", EXACT)
