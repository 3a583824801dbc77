"""The Pixtral vision tower with Mistral 3's projector against transformers (tests/fixtures/reference/tiny/
pixtral_vision, tools/make_tiny_pixtral.py): the processor's resize and pixels, the merged grid, the tower's last
hidden state and the projector's rows, on the NumPy oracle and the native backend (every ISA path, both modes);
hostile configs, tensors and calls."""
from __future__ import annotations

import functools
import json
import sys
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest

from llambda.errors import InvalidInputError, ModelClosedError, ModelFormatError
from llambda.vision import load_image, load_vision
from llambda.vision.image import check_image
from llambda.vision.pixtral import rotary_tables
from llambda.vision.pixtral_pixels import resized

Image = pytest.importorskip("PIL.Image")
sys.path.insert(0, str(Path(__file__).parent))
import visionkit  # noqa: E402

TINY, REF = visionkit.fixture("pixtral_vision")
IMAGES, EXACT = sorted(REF["images"]), visionkit.EXACT

numpy_tower = visionkit.numpy_tower_fixture(TINY)
copy_fixture = functools.partial(visionkit.copy_fixture, TINY)
vision_edit = visionkit.vision_edit


def ref(entry: dict, key: str) -> np.ndarray:
    return np.load(TINY / entry[key])


def pixels_of(tower, name: str) -> np.ndarray:
    return tower.pixels(load_image((TINY / name).read_bytes()))


def check_tower(tower, budget_hidden: float, budget_rows: float) -> dict:
    """Every fixture image through `tower`: the worst errors of the last hidden state and the projector's rows."""
    hidden, rows = [], []
    for name, entry in REF["images"].items():
        px, grid = pixels_of(tower, name), tuple(entry["merged_grid"])
        assert tower.grid(*entry["size"]) == grid
        hidden.append(np.abs(tower.last_hidden_state(px, grid) - ref(entry, "hidden")).max())
        rows.append(np.abs(tower.encode_one(px, grid) - ref(entry, "projector_rows")).max())
    return visionkit.within(hidden, rows, budget_hidden, budget_rows)


# ---------------------------------------------------------------- preprocessing

@pytest.mark.parametrize("name", IMAGES)
def test_pixels_equal_transformers(numpy_tower, name):
    entry = REF["images"][name]
    data = (TINY / name).read_bytes()
    assert check_image(data) == tuple(entry["size"])
    assert list(resized(*entry["size"], numpy_tower.cfg)) == entry["resized_hw"]
    px = numpy_tower.pixels(load_image(data))
    assert px.dtype == np.float32 and list(px.shape) == [3] + entry["resized_hw"]
    np.testing.assert_array_equal(px, ref(entry, "pixel_values"))


def test_resize_follows_transformers_rounding(numpy_tower):
    cfg = numpy_tower.cfg                       # longest edge 112, patch 14 x merge 2 = 28
    assert resized(150, 90, cfg) == (84, 112)   # ratio 150/112: h = floor(67.2) = 67 -> up to 84
    assert resized(10, 10, cfg) == (28, 28)     # never enlarged but to one cell
    assert resized(29, 28, cfg) == (28, 56)     # 29 columns: a second cell
    assert resized(112, 112, cfg) == (112, 112)
    assert resized(113, 20, cfg) == (28, 112)   # 113 -> floor(112.0) = 112; 20 -> floor(19.8) = 19 -> 28
    with pytest.raises(InvalidInputError, match="no pixel"):
        resized(5000, 10, cfg)                  # 10 / (5000/112) < 1
    assert numpy_tower.grid(150, 90) == (3, 4) and numpy_tower.grid(1, 1) == (1, 1)


def test_rotary_splits_even_frequencies_to_rows_odd_to_columns():
    """transformers' axial rope: inv_freq over the head dim, its even entries turn by the row, its odd ones by
    the column (a grid's transposed patch must not get the same angles)."""
    cos, sin = rotary_tables(2, 3, 16, 10000.0)
    f = 1.0 / 10000.0 ** (np.arange(0, 16, 2) / 16)
    ang = np.arctan2(sin.astype(np.float64), cos)
    np.testing.assert_allclose(ang[5, :4], 1 * f[0::2], rtol=1e-5)      # patch (1, 2): row 1
    np.testing.assert_allclose(ang[5, 4:], 2 * f[1::2], rtol=1e-5)      # column 2
    assert cos.shape == sin.shape == (6, 8)


def test_tower_facts(numpy_tower):
    t = numpy_tower
    assert (t.family, t.tokens_per_image, t.hidden, t.deepstack, t.attends) == ("pixtral", None, 64, 0, "causal")
    assert t.cfg.patch_size == 14 and t.cfg.spatial_merge_size == 2 and t.cfg.longest_edge == 112


# ---------------------------------------------------------------- the tower against transformers

def test_numpy_oracle_matches_transformers(numpy_tower):
    check_tower(numpy_tower, EXACT, EXACT)


@pytest.mark.parametrize("activations,budgets", [("f32", (EXACT, EXACT)), (None, (0.1, 0.06))])
def test_native_matches_transformers_on_every_isa(isa, activations, budgets):
    """Exact mode (float32 panels) within EXACT; the native default (bfloat16 products) within its budget:
    measured 0.046 (hidden, values up to ~5) and 0.029 (rows, values up to 2.7) at most."""
    with closing(load_vision(TINY, backend="native", activations=activations, threads=2)) as t:
        check_tower(t, *budgets)


def test_the_image_grid_matters(numpy_tower):
    """encode_one's rows depend on the grid it is given (the test can fail): a 2 x 4 image and the same pixels
    read as its transpose's shape are other rows."""
    px = pixels_of(numpy_tower, "image_flat.png")
    rows = numpy_tower.encode_one(px, (2, 4))
    t = np.ascontiguousarray(px.transpose(0, 2, 1))
    assert np.abs(numpy_tower.encode_one(t, (4, 2)) - rows).max() > 0.01


def test_gelu_blocks_and_an_earlier_feature_layer(tmp_path):
    """hidden_act gelu (Pixtral-12B's blocks) and vision_feature_layer 1 (layer 0's output: the second block is not
    run) against a float64 NumPy twin of transformers' math written here from its definitions."""
    d = copy_fixture(tmp_path / "g", config_edit=lambda c: (c["vision_config"].update(hidden_act="gelu"),
                                                           c.update(vision_feature_layer=1)))
    with closing(load_vision(d, backend="numpy")) as t:
        assert t.cfg.layers_run == 1 and t.cfg.hidden_act == "gelu"
        px = pixels_of(t, "image_tall.png")
        got = t.encode_one(px, (3, 2))
    np.testing.assert_allclose(got, _twin(px, (3, 2), layers=1, act="gelu"), atol=2e-5)
    # and the fixture's own settings through the twin: transformers' rows (the twin itself is checked)
    entry = REF["images"]["image_tall.png"]
    np.testing.assert_allclose(_twin(ref(entry, "pixel_values"), (3, 2), layers=2, act="silu"),
                               ref(entry, "projector_rows"), atol=2e-5)


def _twin(px, grid, layers: int, act: str) -> np.ndarray:
    """transformers' PixtralVisionModel + Mistral3MultiModalProjector in float64 NumPy, from the checkpoint."""
    from math import erf
    from llambda.formats.safetensors import SafetensorsFile
    with SafetensorsFile(TINY / "model.safetensors") as st:
        w = {n: t.to_float32().astype(np.float64) for n, t in st.tensors.items() if not n.startswith("language")}

    def rms(x, g, eps=1e-5):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g
    gelu = np.vectorize(lambda u: 0.5 * u * (1 + erf(u / np.sqrt(2))))
    P, H, heads, d = 14, 32, 2, 16
    gh, gw = grid[0] * 2, grid[1] * 2
    pt = px.astype(np.float64).reshape(3, gh, P, gw, P).transpose(1, 3, 0, 2, 4).reshape(gh * gw, -1)
    x = rms(pt @ w["vision_tower.patch_conv.weight"].reshape(H, -1).T, w["vision_tower.ln_pre.weight"])
    f = 1.0 / 10000.0 ** (np.arange(0, d, 2) / d)
    r, c = np.divmod(np.arange(gh * gw), gw)
    ang = np.concatenate([r[:, None] * f[0::2], c[:, None] * f[1::2]], 1)
    cos, sin = np.cos(np.concatenate([ang, ang], 1)), np.sin(np.concatenate([ang, ang], 1))

    def rope(q):
        half = np.concatenate([-q[..., d // 2:], q[..., :d // 2]], -1)
        return q * cos[:, None] + half * sin[:, None]
    for i in range(layers):
        p = f"vision_tower.transformer.layers.{i}."
        h = rms(x, w[p + "attention_norm.weight"])
        q, k, v = (h @ w[p + f"attention.{n}_proj.weight"].T for n in "qkv")
        q, k, v = (a.reshape(-1, heads, d) for a in (q, k, v))
        q, k = rope(q), rope(k)
        s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(d)
        s = np.exp(s - s.max(-1, keepdims=True))
        o = np.einsum("hqk,khd->qhd", s / s.sum(-1, keepdims=True), v).reshape(-1, H)
        x = x + o @ w[p + "attention.o_proj.weight"].T
        h = rms(x, w[p + "ffn_norm.weight"])
        g = h @ w[p + "feed_forward.gate_proj.weight"].T
        g = g / (1 + np.exp(-g)) if act == "silu" else gelu(g)
        x = x + (g * (h @ w[p + "feed_forward.up_proj.weight"].T)) @ w[p + "feed_forward.down_proj.weight"].T
    h = rms(x, w["multi_modal_projector.norm.weight"])
    mh, mw = grid
    joined = h.reshape(mh, 2, mw, 2, H).transpose(0, 2, 4, 1, 3).reshape(mh * mw, 4 * H)
    m = joined @ w["multi_modal_projector.patch_merger.merging_layer.weight"].T
    return gelu(m @ w["multi_modal_projector.linear_1.weight"].T) @ w["multi_modal_projector.linear_2.weight"].T


# ---------------------------------------------------------------- misuse and hostile files

def test_bad_calls_are_typed_errors(numpy_tower):
    px = pixels_of(numpy_tower, "image_wide.png")           # merged 3 x 4
    for bad in ((3, 5), (4, 4), (0, 0), "3x4", (3.0, 4.0), (-3, -4), (3, 4, 1), (True, 12), None, (3, 10 ** 6)):
        with pytest.raises(InvalidInputError):
            numpy_tower.encode_one(px, bad)
    for bad_px in (px[:, :56], px.reshape(-1), px[None], px.tolist()):
        with pytest.raises(InvalidInputError):
            numpy_tower.encode_one(bad_px, (3, 4))
    for value in (np.nan, np.inf):
        bad = px.copy()
        bad[1, 3, 7] = value
        with pytest.raises(InvalidInputError, match="non-finite"):
            numpy_tower.encode_one(bad, (3, 4))
    for image in ("not an image", b"not an image"):
        with pytest.raises(InvalidInputError):
            numpy_tower.pixels(image)
    for size in ((0, 5), (True, 5), (2.5, 5), (1 << 21, 5)):
        with pytest.raises(InvalidInputError):
            numpy_tower.grid(*size)


def test_closed_tower_refuses():
    t = load_vision(TINY, backend="numpy")
    px = pixels_of(t, "image_tall.png")
    t.close()
    t.close()
    with pytest.raises(ModelClosedError):
        t.encode_one(px, (3, 2))


def _pre(**kw):
    return lambda p: p.update(kw)


@pytest.mark.parametrize("config_edit,pre_edit,match", [
    (vision_edit(num_attention_heads=16), None, "multiple of 4"),    # head dim 2
    (vision_edit(num_attention_heads=3), None, "heads"),
    (vision_edit(num_hidden_layers=10 ** 9), None, "num_hidden_layers"),
    (vision_edit(hidden_size=-1), None, "hidden_size"),
    (vision_edit(patch_size=0), None, "patch_size"),
    (vision_edit(hidden_act="relu"), None, "hidden_act"),
    (vision_edit(head_dim=8), None, "head_dim"),
    (vision_edit(model_type="siglip"), None, "pixtral"),
    (vision_edit(rope_parameters={"rope_theta": float("nan")}), None, "rope_theta"),
    (lambda c: c.update(spatial_merge_size=3), None, "spatial_merge_size"),
    (lambda c: c.update(spatial_merge_size="2"), None, "spatial_merge_size"),
    (lambda c: c.update(vision_feature_layer=[-1, -2]), None, "vision_feature_layer"),
    (lambda c: c.update(vision_feature_layer=7), None, "vision_feature_layer"),
    (lambda c: c.update(projector_hidden_act="silu"), None, "projector_hidden_act"),
    (lambda c: c.update(multimodal_projector_bias="no"), None, "multimodal_projector_bias"),
    (lambda c: c["text_config"].update(hidden_size=65), None, "linear_1|shape"),
    (lambda c: c["text_config"].update(rms_norm_eps=-1), None, "rms_norm_eps"),
    (lambda c: c.pop("text_config"), None, "text_config"),
    (None, _pre(size={"longest_edge": 1 << 40}), "longest_edge"),
    (None, _pre(size={"longest_edge": 4096}), "longest_edge"),     # past MAX_PATCHES of 14
    (None, _pre(size={"height": 224, "width": 224}), "longest_edge"),
    (None, _pre(resample=2), "bicubic"),
    (None, _pre(do_resize=False), "bicubic"),
    (None, _pre(image_std=[0, 1, 1]), "image_std"),
    (None, _pre(image_mean="grey"), "image_mean"),
])
def test_hostile_configs_are_format_errors(tmp_path, config_edit, pre_edit, match):
    visionkit.refused(TINY, tmp_path / "bad", match, pre_edit=pre_edit, config_edit=config_edit)


def test_processor_config_must_agree(tmp_path):
    d = copy_fixture(tmp_path / "bad")
    p = json.loads((d / "processor_config.json").read_text())
    (d / "processor_config.json").write_text(json.dumps(dict(p, spatial_merge_size=1)))
    with pytest.raises(ModelFormatError, match="processor_config.json's spatial_merge_size"):
        load_vision(d, backend="numpy")


@pytest.mark.parametrize("tensors_edit,match", [
    (lambda t: t.pop("vision_tower.transformer.layers.1.attention.k_proj.weight"), "k_proj"),
    (lambda t: t.pop("multi_modal_projector.patch_merger.merging_layer.weight"), "merging_layer"),
    (lambda t: t.update({"vision_tower.transformer.layers.0.feed_forward.gate_proj.weight":
                         np.zeros((64, 31), np.float32)}), "shape"),
    (lambda t: t.update({"vision_tower.patch_conv.weight": np.zeros((32, 3, 16, 16), np.float32)}), "shape"),
    (lambda t: t["vision_tower.transformer.layers.0.ffn_norm.weight"].__setitem__(3, np.inf), "non-finite"),
    (lambda t: [t.pop(k) for k in list(t) if k.startswith("vision_tower.")], "patch_conv"),
])
def test_hostile_tensors_are_format_errors(tmp_path, tensors_edit, match):
    visionkit.refused(TINY, tmp_path / "bad", match, tensors_edit=tensors_edit)


def test_transformers_5_names_load_too(tmp_path):
    """transformers 5 keeps the parts under model. in memory; either prefix loads."""
    d = copy_fixture(tmp_path / "m", tensors_edit=lambda t: t.update(
        {"model." + k: t.pop(k) for k in [k for k in t if not k.startswith("lm_head")]}))
    with closing(load_vision(d, backend="numpy")) as t:
        check_tower(t, EXACT, EXACT)


def test_threads_take_turns(numpy_tower):
    got = visionkit.encode_in_threads(
        lambda n: numpy_tower.encode_one(pixels_of(numpy_tower, n), tuple(REF["images"][n]["merged_grid"])), IMAGES)
    for name in IMAGES:
        np.testing.assert_allclose(got[name], ref(REF["images"][name], "projector_rows"), atol=EXACT)


def test_the_memory_plan_counts_the_largest_image(numpy_tower):
    cfg = numpy_tower.cfg
    assert cfg.max_patches() == 8 * 8                 # 112 / 14 a side
    assert cfg.workspace_bytes(1) < cfg.workspace_bytes()
    n = sum(t.size for t in [numpy_tower.encoder.ln_pre, numpy_tower.encoder.norm])
    assert cfg.params() > n


# ---------------------------------------------------------------- llama.cpp's pixtral mmproj

@pytest.fixture(scope="module")
def mmproj_files(tmp_path_factory):
    return visionkit.write_mmprojs(TINY, tmp_path_factory.mktemp("mmproj"))


def _break_row() -> np.ndarray:
    from llambda.formats.safetensors import SafetensorsFile
    with SafetensorsFile(TINY / "model.safetensors") as st:
        table = st.tensors["language_model.model.embed_tokens.weight"].to_float32()
    return np.asarray(table).reshape(-1, 64)[REF["special_token_ids"]["[IMG_BREAK]"]]


@pytest.mark.parametrize("qtype,budget", [("f32", EXACT), ("f16", 6e-3), ("q8_0", 0.15)])
def test_our_mmproj_reads_back(mmproj_files, qtype, budget):
    """Our mmproj (q and k rows permuted for llama.cpp, the [IMG_BREAK] row beside) read back: the directory's rows
    (measured 2.7e-6, 2.9e-3, 8.3e-2 of values up to 2.7)."""
    from llambda.formats.gguf import GGUFFile
    with GGUFFile(mmproj_files[qtype]) as f:
        assert f.metadata["clip.projector_type"] == "pixtral" and f.metadata["clip.use_silu"] is True
        assert f.metadata["clip.vision.spatial_merge_size"] == 2 and f.metadata["clip.vision.image_size"] == 112
        np.testing.assert_array_equal(f.tensors["v.token_embd.img_break"].as_float32().reshape(-1), _break_row())
    with closing(load_vision(mmproj_files[qtype], backend="numpy")) as t:
        assert (t.family, t.hidden, t.cfg.longest_edge) == ("pixtral", 64, 112)
        check_tower(t, 1.0, budget)


@pytest.mark.parametrize("qtype,budget", [("f32", 1e-2), ("f16", 1.5e-2), ("q8_0", 0.25)])
def test_llama_cpp_reads_our_mmproj(mmproj_files, tmp_path, numpy_tower, qtype, budget):
    """llama-cpp-python's libmtmd on our file: an image's rows with its [IMG_BREAK] row after each but the last
    (llama.cpp writes them itself); ours within `budget` (measured f32 5.6e-3 of values up to 2.3: its projector's
    GELU is the tanh one; f16 7.4e-3; q8_0 0.14). Sizes taken unresized on both sides (multiples of 28, >= 8
    tokens: llama.cpp's least)."""
    for h, w in ((84, 112), (84, 84), (56, 112)):
        rgb = visionkit.rgb_image(h, w)
        rows = visionkit.llama_cpp_rows(mmproj_files[qtype], rgb, tmp_path, control_tokens=("[IMG_BREAK]",
                                                                                            "[IMG_END]"))
        gh, gw = numpy_tower.grid(w, h)
        ours = numpy_tower.encode_one(numpy_tower.pixels(Image.fromarray(rgb)), (gh, gw))
        assert len(rows) == 1 and rows[0].shape == (gh * gw + gh - 1, 64)
        at = np.arange(len(rows[0]))
        breaks = (at + 1) % (gw + 1) == 0
        np.testing.assert_array_equal(rows[0][breaks], np.broadcast_to(_break_row(), (gh - 1, 64)))
        err = float(np.abs(rows[0][~breaks] - ours).max())
        assert err <= budget, (h, w, err)


@pytest.mark.parametrize("edit,drop,match", [
    (lambda m: m.pop("clip.vision.block_count"), (), "block_count"),
    (lambda m: m.update({"clip.vision.block_count": np.uint64(1 << 40)}), (), "block_count"),
    (lambda m: m.pop("clip.vision.spatial_merge_size"), (), "spatial_merge_size"),      # Pixtral-12B's: no merger
    (lambda m: m.update({"clip.use_gelu": True}), (), "use_silu"),
    (lambda m: m.pop("clip.use_silu"), (), "use_silu"),
    (lambda m: m.update({"clip.vision.attention.layer_norm_epsilon": 1e-6}), (), "layer_norm_epsilon"),
    (lambda m: m.update({"clip.vision.image_size": 1 << 20}), (), "image_size"),
    (lambda m: m.update({"clip.vision.embedding_length": 48}), (), "shape"),
    (None, ("mm.patch_merger.weight",), "spatial_merge_size"),        # a merge of 2 without its merger
    (None, ("mm.input_norm.weight",), "projector.norm"),
    (None, ("v.blk.1.attn_k.weight",), "k_proj"),
    (None, ("v.pre_ln.weight",), "ln_pre"),
])
def test_hostile_mmproj_is_a_format_error(mmproj_files, tmp_path, edit, drop, match):
    with pytest.raises(ModelFormatError, match=match):
        load_vision(visionkit.rewrite_gguf(mmproj_files["f32"], tmp_path / "bad.gguf", edit, drop), backend="numpy")


@pytest.mark.parametrize("config_edit,match", [
    (vision_edit(rope_parameters={"rope_theta": 20000.0, "rope_type": "axial"}), "rope theta"),
    (lambda c: c.update(vision_feature_layer=-2), "vision_feature_layer"),
    (lambda c: c["text_config"].update(rms_norm_eps=1e-6), "eps"),
])
def test_write_mmproj_refuses_what_llama_cpp_cannot_say(tmp_path, config_edit, match):
    from llambda.vision import mmproj
    d = copy_fixture(tmp_path / "d", config_edit=config_edit)
    with pytest.raises(InvalidInputError, match=match):
        mmproj.write_mmproj(d, tmp_path / "x.gguf", "f32")


def test_write_mmproj_needs_the_break_token(tmp_path):
    from llambda.vision import mmproj
    d = copy_fixture(tmp_path / "d")
    tok = json.loads((d / "tokenizer.json").read_text())
    tok["added_tokens"] = [t for t in tok["added_tokens"] if t["content"] != "[IMG_BREAK]"]
    (d / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(InvalidInputError, match="IMG_BREAK"):
        mmproj.write_mmproj(d, tmp_path / "x.gguf", "f32")
    # and an mmproj written again from our mmproj keeps its row
    out = mmproj.write_mmproj(TINY, tmp_path / "a.gguf", "f32")
    again = mmproj.write_mmproj(out, tmp_path / "b.gguf", "f32")
    with closing(load_vision(again, backend="numpy")) as t:
        check_tower(t, EXACT, EXACT)


# ---------------------------------------------------------------- Pixtral-12B's layout (model_type llava)

PIX12B, PIX12B_REF = visionkit.fixture("pixtral12b_vision")


def check_12b(tower, budget_hidden: float, budget_rows: float) -> dict:
    hidden, rows = [], []
    for name, entry in PIX12B_REF["images"].items():
        px = tower.pixels(load_image((PIX12B / name).read_bytes()))
        np.testing.assert_array_equal(px, np.load(PIX12B / entry["pixel_values"]))
        grid = tuple(entry["merged_grid"])
        assert tower.grid(*entry["size"]) == grid
        hidden.append(np.abs(tower.last_hidden_state(px, grid) - np.load(PIX12B / entry["hidden"])).max())
        rows.append(np.abs(tower.encode_one(px, grid) - np.load(PIX12B / entry["projector_rows"])).max())
    return visionkit.within(hidden, rows, budget_hidden, budget_rows)


@pytest.mark.parametrize("backend,activations,budgets", [("numpy", None, (EXACT, EXACT)),
                                                         ("native", "f32", (EXACT, EXACT)),
                                                         ("native", None, (0.12, 0.08))])
def test_pixtral_12b_layout_matches_transformers(backend, activations, budgets):
    """LlavaForConditionalGeneration with a pixtral vision_config (patches of 16, GELU blocks, LLaVA's projector
    with biases, no merger: a token a patch): transformers' pixels, hidden state and rows (native default measured
    0.062 / 0.036)."""
    with closing(load_vision(PIX12B, backend=backend, activations=activations, threads=2)) as t:
        assert (t.family, t.cfg.merger, t.cfg.spatial_merge_size, t.cfg.hidden_act) == ("pixtral", False, 1, "gelu")
        check_12b(t, *budgets)


@pytest.mark.parametrize("config_edit,match", [
    (lambda c: c.update(vision_feature_select_strategy="default"), "vision_feature_select_strategy"),
    (lambda c: c.pop("vision_feature_select_strategy"), "vision_feature_select_strategy"),
    (lambda c: c.update(vision_feature_layer=[-1, -2]), "vision_feature_layer"),
    (lambda c: c["vision_config"].update(patch_size=14), "patch_size"),
])
def test_hostile_pixtral_12b_configs(tmp_path, config_edit, match):
    visionkit.refused(PIX12B, tmp_path / "bad", match, config_edit=config_edit)


def test_pixtral_12b_mmproj_and_llama_cpp(tmp_path):
    """Our mmproj of it (no spatial_merge_size key, no merger: llama.cpp's n_merge 1) reads back and llama.cpp gives
    our rows with its [IMG_BREAK] rows between (measured 4.9e-3 of values up to 3.3)."""
    from llambda.vision import mmproj
    out = mmproj.write_mmproj(PIX12B, tmp_path / "m.gguf", "f32")
    with closing(load_vision(out, backend="numpy")) as t:
        check_12b(t, 1.0, EXACT)
        h, w = 48, 64
        rgb = visionkit.rgb_image(h, w)
        rows = visionkit.llama_cpp_rows(out, rgb, tmp_path, control_tokens=("[IMG_BREAK]", "[IMG_END]"))[0]
        gh, gw = t.grid(w, h)
        ours = t.encode_one(t.pixels(Image.fromarray(rgb)), (gh, gw))
    breaks = (np.arange(len(rows)) + 1) % (gw + 1) == 0
    assert (gh, gw) == (3, 4) and rows.shape == (gh * gw + gh - 1, 64)
    assert float(np.abs(rows[~breaks] - ours).max()) <= 1e-2
