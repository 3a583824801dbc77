"""The LLaVA 1.5 vision tower (CLIP ViT + the MLP projector) against transformers (tests/fixtures/reference/tiny/
llava_vision and llava_layers_vision, tools/make_tiny_llava.py): the CLIP processor's pixels (resize the shortest edge, centre
crop; LlavaImageProcessor's pad to a square), every feature layer, the projector's rows, on the NumPy oracle and
the native backend (every ISA path); a list of feature layers with the "full" strategy and no projector bias;
llama.cpp's mlp mmproj we write (F32, F16, Q8_0) read back, and llama.cpp itself reading it; hostile configs and
files."""
from __future__ import annotations

import dataclasses
import json
import sys
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest

PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

from llambda.errors import InvalidInputError, ModelFormatError  # noqa: E402
from llambda.formats import gguf, gguf_writer, quants  # noqa: E402
from llambda.vision import load_image, load_vision, mmproj  # noqa: E402
from llambda.vision.llava import llava_pixels  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import visionkit  # noqa: E402
from visionkit import EXACT  # noqa: E402

TINY, REF = visionkit.fixture("llava_vision")
LAYERS, LREF = visionkit.fixture("llava_layers_vision")
FEATURE = 2          # hidden_states[-2] of 3 blocks: after 2 of them


def ref(folder: Path, entry: dict, key: str) -> np.ndarray:
    return np.load(folder / entry[key])


numpy_tower = visionkit.numpy_tower_fixture(TINY)


@pytest.fixture(scope="module")
def mmproj_files(tmp_path_factory):
    return visionkit.write_mmprojs(TINY, tmp_path_factory.mktemp("llava_mmproj"))


def check_tower(tower, folder: Path, images: dict, budget: float, layers=(FEATURE,), drop_class=True) -> dict:
    """Every image's feature rows (the chosen hidden states joined) and projector rows against transformers'."""
    feats, rows = [], []
    for name, entry in images.items():
        px = ref(folder, entry, "pixel_values")
        hs = ref(folder, entry, "hidden_states")
        want = np.concatenate([hs[k][1 if drop_class else 0:] for k in layers], axis=1)
        feats.append(np.abs(tower.last_hidden_state(px) - want).max())
        rows.append(np.abs(tower.encode(px[None])[0] - ref(folder, entry, "rows")).max())
    return visionkit.within(feats, rows, budget, budget)


@pytest.mark.parametrize("name", sorted(REF["images"]))
def test_pixels_equal_transformers(numpy_tower, name):
    """CLIPImageProcessor (PIL backend): shortest edge to 56 by Pillow's bicubic, the centre 56 x 56, rescale and
    normalize with OpenAI CLIP's mean and std: bit for bit, an image smaller than the crop (scaled up) too."""
    px = numpy_tower.pixels(load_image((TINY / name).read_bytes()))
    assert px.shape == (1, 3, 56, 56) and px.dtype == np.float32
    np.testing.assert_array_equal(px[0], ref(TINY, REF["images"][name], "pixel_values"))
    assert numpy_tower.grid(*REF["images"][name]["size"]) == (0, 0)


@pytest.mark.parametrize("name", sorted(REF["pad"]["images"]))
def test_pad_to_square_equals_llava_image_processor(numpy_tower, name):
    """LlavaImageProcessor's do_pad: the image centred on a square of its longer side filled with int(mean * 255),
    then the same resize and crop: bit for bit; read from preprocessor_config.json's do_pad too."""
    cfg = dataclasses.replace(numpy_tower.cfg, do_pad=True)
    want = ref(TINY, REF["pad"]["images"][name], "pixel_values")
    np.testing.assert_array_equal(llava_pixels(Image.open(TINY / name), cfg)[0], want)


def test_do_pad_is_read_from_the_processor(tmp_path):
    d = visionkit.copy_fixture(TINY, tmp_path / "pad", pre_edit=lambda p: p.update(do_pad=True))
    with closing(load_vision(d, backend="numpy")) as t:
        for name, entry in REF["pad"]["images"].items():
            np.testing.assert_array_equal(t.pixels(Image.open(TINY / name))[0], ref(TINY, entry, "pixel_values"))


def test_tower_facts(numpy_tower):
    t = numpy_tower
    assert (t.family, t.attends, t.tokens_per_image, t.hidden, t.image_size) == ("llava", "causal", 16, 64, 56)
    assert t.cfg.feature_layers == (FEATURE,) and t.cfg.layers_run == 2 and not t.cfg.keep_class
    assert t.cfg.hidden_act == "quick_gelu" and t.cfg.projector_bias


def test_numpy_oracle_matches_transformers(numpy_tower):
    check_tower(numpy_tower, TINY, REF["images"], EXACT)


@pytest.mark.parametrize("activations, budget", [("f32", EXACT), (None, 0.06)])
def test_native_matches_transformers_on_every_isa(isa, activations, budget):
    """The exact mode (float32 panels) and the default (bfloat16 products: measured 0.028 of values up to 5)."""
    with closing(load_vision(TINY, backend="native", activations=activations, threads=2)) as t:
        check_tower(t, TINY, REF["images"], budget)


@pytest.mark.parametrize("backend", ["numpy", "native"])
def test_feature_layer_list_full_strategy_no_bias(backend):
    """vision_feature_layer [-3, -1] (hidden_states 1 and 3 joined in that order), "full" (17 rows, the class
    token first), a projector without biases: transformers' rows."""
    with closing(load_vision(LAYERS, backend=backend, activations="f32" if backend == "native" else None)) as t:
        assert t.cfg.feature_layers == (1, 3) and t.cfg.keep_class and t.tokens_per_image == 17
        assert not t.cfg.projector_bias
        entry = LREF["images"]["image_wide.png"]
        np.testing.assert_array_equal(t.pixels(Image.open(LAYERS / "image_wide.png"))[0],
                                      ref(LAYERS, entry, "pixel_values"))
        check_tower(t, LAYERS, LREF["images"], EXACT, layers=(1, 3), drop_class=False)


def test_a_batch_of_images_do_not_see_each_other(numpy_tower):
    names = sorted(REF["images"])
    px = np.stack([ref(TINY, REF["images"][n], "pixel_values") for n in names])
    out = numpy_tower.encode(px)
    assert out.shape == (3, 16, 64)
    np.testing.assert_allclose(out, np.stack([ref(TINY, REF["images"][n], "rows") for n in names]), atol=EXACT, rtol=0)


def test_transformers_5_prefixes_and_the_hub_prefixes_read_the_same(tmp_path, numpy_tower):
    """The fixture saves `vision_tower.` / `multi_modal_projector.` (transformers 5.25's save); llava-hf's
    checkpoints hold `vision_tower.vision_model.`, transformers 5 in memory `model.vision_tower.`: the same rows."""
    px = ref(TINY, REF["images"]["image_wide.png"], "pixel_values")[None]
    want = numpy_tower.encode(px)
    for tower_pre, proj_pre in (("vision_tower.vision_model.", "multi_modal_projector."),
                                ("model.vision_tower.", "model.multi_modal_projector.")):
        def edit(t, tower_pre=tower_pre, proj_pre=proj_pre):
            for n in list(t):
                if n.startswith("vision_tower."):
                    t[tower_pre + n[len("vision_tower."):]] = t.pop(n)
                elif n.startswith("multi_modal_projector."):
                    t[proj_pre + n[len("multi_modal_projector."):]] = t.pop(n)
        d = visionkit.copy_fixture(TINY, tmp_path / tower_pre.replace(".", "_"), tensors_edit=edit)
        with closing(load_vision(d, backend="numpy")) as t:
            np.testing.assert_array_equal(t.encode(px), want)


def test_older_processor_ints_read_the_same(tmp_path, numpy_tower):
    """Older CLIP processor configs say `size: 56` (the shortest edge) and `crop_size: 56`: the same pixels."""
    d = visionkit.copy_fixture(TINY, tmp_path / "ints", pre_edit=lambda p: p.update(size=56, crop_size=56))
    with closing(load_vision(d, backend="numpy")) as t:
        for name, entry in REF["images"].items():
            np.testing.assert_array_equal(t.pixels(Image.open(TINY / name))[0], ref(TINY, entry, "pixel_values"))


def test_llava_hf_config_spelling_reads_the_same(tmp_path, numpy_tower):
    """llava-hf's config.json keeps only what differs from the defaults: no hidden_act (CLIP's quick_gelu), no
    layer_norm_eps (1e-5), no vision_feature_layer (-2) or strategy ("default"), no projector keys (gelu, bias)."""
    def edit(c):
        for k in ("hidden_act", "layer_norm_eps", "num_channels"):
            c["vision_config"].pop(k)
        for k in ("vision_feature_layer", "vision_feature_select_strategy", "projector_hidden_act",
                  "multimodal_projector_bias"):
            c.pop(k)
    d = visionkit.copy_fixture(TINY, tmp_path / "hub", config_edit=edit)
    px = ref(TINY, REF["images"]["image_tall.png"], "pixel_values")[None]
    with closing(load_vision(d, backend="numpy")) as t:
        np.testing.assert_array_equal(t.encode(px), numpy_tower.encode(px))


# --- llama.cpp's mmproj (the mmproj_files fixture: F32, F16 and Q8_0 of the directory's tower) -------------------


def test_mmproj_is_written_in_llama_cpp_spelling(mmproj_files):
    with gguf.GGUFFile(mmproj_files["f32"]) as f:
        m, names = f.metadata, set(f.tensors)
    assert m["general.architecture"] == "clip" and m["clip.projector_type"] == "mlp"
    assert m["clip.has_llava_projector"] is True and m["clip.use_gelu"] is False
    assert int(m["clip.vision.block_count"]) == 2 and list(m["clip.vision.feature_layer"]) == [2]
    assert int(m["clip.vision.projection_dim"]) == 64
    assert {"v.class_embd", "v.patch_embd.weight", "v.position_embd.weight", "v.pre_ln.weight", "v.pre_ln.bias",
            "v.blk.1.ffn_up.weight", "v.blk.1.ffn_down.bias", "mm.0.weight", "mm.0.bias", "mm.2.weight",
            "mm.2.bias"} <= names
    assert not any(n.startswith(("v.blk.2.", "v.post_ln")) for n in names)     # blocks past the feature layer
    with gguf.GGUFFile(mmproj_files["f32"]) as f:
        assert f.tensors["v.blk.0.ffn_up.weight"].shape == (64, 32)            # fc1: [F, H]


@pytest.mark.parametrize("qtype, budget", [("f32", 0.0), ("f16", 5e-3), ("q8_0", 0.08)])
@pytest.mark.parametrize("backend", ["numpy", "native"])
def test_mmproj_round_trip(mmproj_files, numpy_tower, qtype, budget, backend):
    """Our mmproj read back gives the directory's rows for the same pixels (F16 measured 2.3e-3, Q8_0 0.056 of
    values up to 5); its own preprocessing is llama.cpp's letterbox."""
    with closing(load_vision(mmproj_files[qtype], backend=backend, activations="f32")) as t:
        assert t.family == "llava" and t.cfg.preprocess == "letterbox" and t.tokens_per_image == 16
        for entry in REF["images"].values():
            px = ref(TINY, entry, "pixel_values")[None]
            assert np.abs(t.encode(px) - numpy_tower.encode(px)).max() <= max(budget, EXACT)


def test_letterbox_geometry(mmproj_files):
    """llama.cpp's fixed-size preprocessing: a 56 x 56 image as it is; one side 56: pasted centred on
    (122, 116, 104) unresized; smaller or larger: scaled (aspect kept) to fit, then centred."""
    with closing(load_vision(mmproj_files["f32"], backend="numpy")) as t:
        rgb = visionkit.rgb_image(40, 56)
        px = t.pixels(Image.fromarray(rgb))[0]
        canvas = np.empty((56, 56, 3), np.uint8)
        canvas[:] = (122, 116, 104)
        canvas[8:48] = rgb
        mean, std = np.asarray(t.cfg.image_mean, np.float32), np.asarray(t.cfg.image_std, np.float32)
        want = ((canvas.astype(np.float64) * (1 / 255)).astype(np.float32) - mean) / std
        np.testing.assert_array_equal(px, np.moveaxis(want, -1, 0))
        wide = t.pixels(Image.fromarray(visionkit.rgb_image(20, 30)))[0]       # -> 56 x 38 (ceil), at row 9
        assert np.all(wide[:, :9] == wide[:, :1, :1]) and np.all(wide[:, 47:] == wide[:, :1, :1])
        assert not np.all(wide[:, 9:10] == wide[:, :1, :1])


def cpp_graph_rows(cfg, lookup, px: np.ndarray) -> np.ndarray:
    """A transcription of llama.cpp's clip_graph_llava (as llama-cpp-python 0.3.36 builds it) in float64: the class
    embedding concatenated AFTER the patches, positions 0..P over [patches, class], the blocks up to the feature
    layer, rows 1..P taken (patches 1..P-1 and the class token), then mm.0, tanh GELU, mm.2."""
    def w(name):
        return np.asarray(lookup(name).to_float32(), np.float64)

    def ln(x, pre):
        m = x.mean(-1, keepdims=True)
        v = ((x - m) ** 2).mean(-1, keepdims=True)
        return (x - m) / np.sqrt(v + cfg.layer_norm_eps) * w(pre + ".weight") + w(pre + ".bias")

    H, p, g, nh = cfg.hidden_size, cfg.patch_size, cfg.patches_per_side, cfg.num_attention_heads
    patches = px.reshape(3, g, p, g, p).transpose(1, 3, 0, 2, 4).reshape(g * g, -1)
    x = np.concatenate([patches @ w("embeddings.patch_embedding.weight").reshape(H, -1).T,
                        w("embeddings.class_embedding")[None]]) + w("embeddings.position_embedding.weight")
    x = ln(x, "pre_layrnorm")
    d = H // nh
    for i in range(cfg.layers_run):
        pre = f"encoder.layers.{i}."
        h = ln(x, pre + "layer_norm1")
        q, k, v = (h @ w(f"{pre}self_attn.{z}_proj.weight").T + w(f"{pre}self_attn.{z}_proj.bias") for z in "qkv")
        o = np.empty_like(q)
        for j in range(nh):
            s = slice(j * d, (j + 1) * d)
            a = q[:, s] @ k[:, s].T / np.sqrt(d)
            a = np.exp(a - a.max(1, keepdims=True))
            o[:, s] = (a / a.sum(1, keepdims=True)) @ v[:, s]
        x = x + o @ w(pre + "self_attn.out_proj.weight").T + w(pre + "self_attn.out_proj.bias")
        u = ln(x, pre + "layer_norm2") @ w(pre + "mlp.fc1.weight").T + w(pre + "mlp.fc1.bias")
        x = x + (u / (1 + np.exp(-1.702 * u))) @ w(pre + "mlp.fc2.weight").T + w(pre + "mlp.fc2.bias")
    u = x[1:1 + g * g] @ w("linear_1.weight").T + w("linear_1.bias")
    u = 0.5 * u * (1 + np.tanh(np.sqrt(2 / np.pi) * (u + 0.044715 * u ** 3)))
    return u @ w("linear_2.weight").T + w("linear_2.bias")


@pytest.mark.parametrize("qtype", ["f32", "f16"])
def test_llama_cpp_reads_our_mmproj(mmproj_files, tmp_path, qtype):
    """libmtmd (llama-cpp-python 0.3.36) loads our mlp mmproj and gives, for images square, padded and scaled
    both ways, the rows of a transcription of its own graph over our letterbox pixels within 5e-3 of values up to
    4.5 (measured 3.7e-3): every key and tensor is read as we mean it, its preprocessing is ours. That graph puts
    the class token after the patches and takes rows 1..P (the class row among them), which is not LLaVA's math
    (transformers' and ours: class first, rows 1..P the patches): its rows are asserted to differ from ours, so
    a llama.cpp that fixes it shows here (docs/VISION.md)."""
    from llambda.vision.load import open_layout
    layout = open_layout(TINY)
    try:
        with closing(load_vision(mmproj_files[qtype], backend="numpy")) as t:
            for h, w in ((56, 56), (40, 56), (56, 33), (30, 20), (100, 80)):
                rgb = visionkit.rgb_image(h, w)
                got = visionkit.llama_cpp_rows(mmproj_files[qtype], rgb, tmp_path)
                assert len(got) == 1 and got[0].shape == (16, 64)
                px = t.pixels(Image.fromarray(rgb))
                want = cpp_graph_rows(layout.cfg, layout.lookup, px[0].astype(np.float64))
                assert np.abs(got[0] - want).max() <= 5e-3, (h, w, float(np.abs(got[0] - want).max()))
                assert np.abs(got[0] - t.encode(px)[0]).max() > 0.5, "llama.cpp now agrees with LLaVA's class order"
    finally:
        for close in layout.closers:
            close()


def _strip_projector_bias(t):
    for n in [n for n in t if n.startswith("multi_modal_projector.") and n.endswith(".bias")]:
        del t[n]


def _two_layer_projector(t):
    t["multi_modal_projector.linear_1.weight"] = np.zeros((64, 64), np.float32)


@pytest.mark.parametrize("config_edit, tensors_edit, match", [
    (lambda c: c.update(vision_feature_select_strategy="full"), None, "full"),
    (lambda c: c.update(vision_feature_layer=[-1, -3]), _two_layer_projector, "layer order"),
    (lambda c: c.update(multimodal_projector_bias=False), _strip_projector_bias, "biases"),
])
def test_write_mmproj_refuses_what_llama_cpp_cannot_say(tmp_path, config_edit, tensors_edit, match):
    d = visionkit.copy_fixture(TINY, tmp_path / "d", config_edit=config_edit, tensors_edit=tensors_edit)
    load_vision(d, backend="numpy").close()          # the directory itself loads
    with pytest.raises(InvalidInputError, match=match):
        mmproj.write_mmproj(d, tmp_path / "out.gguf")


def test_old_converters_swapped_ffn_names_read_the_same(mmproj_files, tmp_path, numpy_tower):
    """convert_image_encoder_to_gguf.py named fc1 `ffn_down` and fc2 `ffn_up`: read back by shape, as llama.cpp.
    Its files have no feature_layer: it stored the blocks up to LLaVA's -2 (block_count = 2 here, the oldest files
    saying 3 with 2 stored), and all of them run (transformers' hidden_states[-2]; llama.cpp's graph runs one
    fewer, ggml-org/llama.cpp#25817)."""
    px = ref(TINY, REF["images"]["image_wide.png"], "pixel_values")[None]
    for block_count in (2, 3):
        renamed = tmp_path / f"old{block_count}.gguf"
        with gguf.GGUFFile(mmproj_files["f32"]) as f:
            meta = dict(f.metadata)
            meta.pop("clip.vision.feature_layer")
            meta["clip.vision.block_count"] = block_count
            tensors = []
            for n, t in f.tensors.items():
                n2 = n.replace("ffn_up", "ffn_tmp").replace("ffn_down", "ffn_up").replace("ffn_tmp", "ffn_down")
                tensors.append((n2, quants.QType.F32, np.ascontiguousarray(t.as_float32())))
            gguf_writer.write_gguf(renamed, meta, tensors)
        with closing(load_vision(renamed, backend="numpy")) as t:
            assert t.cfg.feature_layers == (2,)
            np.testing.assert_array_equal(t.encode(px), numpy_tower.encode(px))


# --- hostile configs and files -----------------------------------------------------------------------------------

@pytest.mark.parametrize("config_edit, match", [
    (lambda c: c.update(vision_feature_layer=7), "vision_feature_layer"),
    (lambda c: c.update(vision_feature_layer=[]), "vision_feature_layer"),
    (lambda c: c.update(vision_feature_layer=[-2, 2]), "twice"),
    (lambda c: c.update(vision_feature_layer="-2"), "vision_feature_layer"),
    (lambda c: c.update(vision_feature_select_strategy="cls"), "vision_feature_select_strategy"),
    (lambda c: c.update(projector_hidden_act="relu"), "projector_hidden_act"),
    (lambda c: c.update(multimodal_projector_bias="yes"), "multimodal_projector_bias"),
    (lambda c: c["vision_config"].update(hidden_act="silu"), "hidden_act"),
    (lambda c: c["vision_config"].update(model_type="siglip_vision_model"), "clip_vision_model"),
    (lambda c: c["vision_config"].update(image_size=60), "image_size"),
    (lambda c: c["vision_config"].update(num_attention_heads=3), "heads"),
    (lambda c: c["vision_config"].update(layer_norm_eps=float("nan")), "layer_norm_eps"),
    (lambda c: c["vision_config"].update(num_hidden_layers=10 ** 6), "num_hidden_layers"),
    (lambda c: c["text_config"].pop("hidden_size") and c["text_config"].update(model_type="gpt2"),
     "text_config.hidden_size"),
])
def test_hostile_configs_are_refused(tmp_path, config_edit, match):
    visionkit.refused(TINY, tmp_path / "d", match, config_edit=config_edit)


@pytest.mark.parametrize("pre_edit, match", [
    (lambda p: p.update(size={"shortest_edge": 40}), "shortest_edge"),
    (lambda p: p.update(size={"height": 64, "width": 64}), "size"),
    (lambda p: p.update(crop_size={"height": 56, "width": 40}), "crop_size"),
    (lambda p: p.update(crop_size={"height": 48, "width": 48}), "crop_size"),
    (lambda p: p.update(resample=11), "resample"),
    (lambda p: p.update(do_resize=False), "do_resize"),
    (lambda p: p.update(do_pad="no"), "do_pad"),
    (lambda p: p.update(image_std=[0.2, 0.0, 0.2]), "image_std"),
    (lambda p: p.update(do_center_crop=False), "crops nothing"),
])
def test_hostile_processor_settings_are_refused(tmp_path, pre_edit, match):
    visionkit.refused(TINY, tmp_path / "d", match, pre_edit=pre_edit)


@pytest.mark.parametrize("tensors_edit, match", [
    (lambda t: t.pop("vision_tower.embeddings.class_embedding"), "class_embedding"),
    (lambda t: t.pop("vision_tower.pre_layrnorm.bias"), "pre_layrnorm"),
    (lambda t: t.pop("vision_tower.encoder.layers.1.mlp.fc2.weight"), "missing"),
    (lambda t: t.update({"vision_tower.embeddings.position_embedding.weight": np.zeros((16, 32), np.float32)}),
     "shape"),
    (lambda t: t.update({"multi_modal_projector.linear_2.weight": np.full((64, 64), np.inf, np.float32)}),
     "non-finite"),
    (lambda t: t.pop("multi_modal_projector.linear_1.weight"), "linear_1"),
])
def test_missing_or_bad_tensors_are_refused(tmp_path, tensors_edit, match):
    visionkit.refused(TINY, tmp_path / "d", match, tensors_edit=tensors_edit)


def test_a_deeper_block_than_the_features_is_not_needed(tmp_path, numpy_tower):
    """Block 2 (past hidden_states[-2]) is never read: a checkpoint without it loads, the same rows."""
    d = visionkit.copy_fixture(TINY, tmp_path / "d", tensors_edit=lambda t: [
        t.pop(n) for n in list(t) if n.startswith("vision_tower.encoder.layers.2.")])
    px = ref(TINY, REF["images"]["image_wide.png"], "pixel_values")[None]
    with closing(load_vision(d, backend="numpy")) as t:
        np.testing.assert_array_equal(t.encode(px), numpy_tower.encode(px))


@pytest.mark.parametrize("meta_edit, drop, match", [
    (lambda m: m.update({"clip.vision.feature_layer": [9]}), (), "feature_layer"),
    (lambda m: m.update({"clip.vision.feature_layer": "2"}), (), "feature_layer"),
    (lambda m: m.update({"clip.use_silu": True}), (), "use_silu"),
    (lambda m: m.update({"clip.vision.image_grid_pinpoints": [112, 56]}), (), "pinpoints"),
    (lambda m: m.update({"clip.has_llava_projector": False}), (), "has_llava_projector"),
    (lambda m: m.pop("clip.vision.image_mean"), (), "image_mean"),
    (lambda m: m.pop("clip.vision.embedding_length"), (), "embedding_length"),
    (None, ("mm.2.weight",), "mm.2.weight"),
    (None, ("v.blk.1.attn_q.weight",), "q_proj"),
    # each a bare TypeError before: block_count compared with the feature layers, projector_type hashed
    (lambda m: m.update({"clip.vision.block_count": "x"}), (), "block_count"),
    (lambda m: m.update({"clip.vision.block_count": [0, 0]}), (), "block_count"),
    (lambda m: m.update({"clip.projector_type": [0, 0]}), (), "projector_type"),
])
def test_hostile_mmproj_files_are_refused(mmproj_files, tmp_path, meta_edit, drop, match):
    with pytest.raises(ModelFormatError, match=match):         # each a typed error naming the key or tensor
        load_vision(visionkit.rewrite_gguf(mmproj_files["f32"], tmp_path / "bad.gguf", meta_edit, drop), "numpy")


def test_bad_encode_calls_are_typed_errors(numpy_tower):
    px = ref(TINY, REF["images"]["image_wide.png"], "pixel_values")
    for bad in (px, px[None, :, :40], np.zeros((0, 3, 56, 56), np.float32), np.zeros((65, 3, 56, 56), np.float32)):
        with pytest.raises(InvalidInputError):
            numpy_tower.encode(bad)
    nan = px.copy()[None]
    nan[0, 1, 2, 3] = np.nan
    with pytest.raises(InvalidInputError, match="non-finite"):
        numpy_tower.encode(nan)
    for image in ("not an image", b"not an image"):
        with pytest.raises(InvalidInputError):
            numpy_tower.pixels(image)


def real_config(**extra):
    """llava-1.5-7b-hf's tower and processor settings (no weights: the preprocessing alone)."""
    from llambda.vision.llava_config import LlavaVisionConfig
    return LlavaVisionConfig.from_fields({"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24,
                                          "num_attention_heads": 16, "image_size": 336, "patch_size": 14,
                                          "text_hidden_size": 4096, "shortest_edge": 336, **extra})


def pattern(w: int, h: int) -> np.ndarray:
    """tools/make_tiny_llava.py's pattern(): the same bytes."""
    return (np.arange(h * w * 3, dtype=np.int64) * 37 % 251).astype(np.uint8).reshape(h, w, 3)


def test_real_settings_pixels_equal_transformers_bit_for_bit():
    """At llava-1.5's own 336 settings, images of 500 x 375, 640 x 480, 200 x 800, 337 x 335, 1000 x 40 and 7 x 9 give
    the CLIP processor's pixel values bit for bit (their sha256 recorded by the tool)."""
    import hashlib
    cfg = real_config()
    for w, h, digest in REF["llava_1_5_pixels"]["width_height_sha256"]:
        px = llava_pixels(Image.fromarray(pattern(w, h)), cfg)[0]
        assert hashlib.sha256(np.ascontiguousarray(px, np.float32).tobytes()).hexdigest() == digest, (w, h)
