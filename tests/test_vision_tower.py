"""The Gemma 3 vision tower (llambda/vision) against transformers' outputs in the tiny gemma3_vision folder
(tools/make_tiny_gemma3_vision.py): the pixel values, the SigLIP encoder's last hidden state and the
projector's soft tokens, on the NumPy oracle and the native backend (every ISA path), read from the HF
directory, from llama.cpp's mmproj GGUF we write (F32, F16, Q8_0) and from an Ollama-layout GGUF written
here; llama.cpp itself reading our mmproj (where llama-cpp-python has its multimodal library); hostile
images and hostile files refused with typed errors."""
from __future__ import annotations

import io
import json
import struct
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from llambda.errors import InvalidInputError, LlambdaError, ModelClosedError, ModelFormatError
from llambda.formats.gguf import GGUFFile
from llambda.formats.gguf_writer import write_gguf
from llambda.formats.quants import QType
from llambda.formats.safetensors import SafetensorsFile, write_safetensors

PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

from llambda.vision import load_image, load_vision  # noqa: E402
from llambda.vision import image as image_mod  # noqa: E402
from llambda.vision.mmproj import write_mmproj  # noqa: E402

TINY = Path(__file__).parent / "fixtures" / "reference" / "tiny" / "gemma3_vision"
REF = json.loads((TINY / "reference.json").read_text(encoding="utf-8"))
IMAGES = sorted(REF["images"])
EXACT = 1e-4        # float32 end to end (transformers ran in float32, eager attention)


def ref(name: str, key: str) -> np.ndarray:
    return np.asarray(REF["images"][name][key], dtype=np.float32)


def pixels_of(tower, name: str) -> np.ndarray:
    """The image's one crop [3, S, S] (Gemma 3 never splits: pixels() gives [1, 3, S, S])."""
    px = tower.pixels(load_image((TINY / name).read_bytes()))
    assert px.shape[0] == 1, px.shape
    return px[0]


def check_tower(tower, budget_hidden: float, budget_soft: float) -> dict:
    """Every fixture image through `tower`: the worst hidden-state and soft-token errors, each within budget."""
    worst = {"hidden": 0.0, "soft": 0.0}
    for name in IMAGES:
        px = pixels_of(tower, name)
        hidden = tower.last_hidden_state(px)
        soft = tower.encode(px[None])[0]
        worst["hidden"] = max(worst["hidden"], float(np.abs(hidden - ref(name, "vision_last_hidden_state")).max()))
        worst["soft"] = max(worst["soft"], float(np.abs(soft - ref(name, "soft_tokens")).max()))
    assert worst["hidden"] <= budget_hidden and worst["soft"] <= budget_soft, worst
    return worst


@pytest.fixture(scope="module")
def numpy_tower():
    t = load_vision(TINY, backend="numpy")
    yield t
    t.close()


# ---------------------------------------------------------------- preprocessing and the tower itself

@pytest.mark.parametrize("name", IMAGES)
def test_pixel_values_equal_transformers(numpy_tower, name):
    w, h = REF["images"][name]["size"]
    im = load_image((TINY / name).read_bytes())
    assert im.size == (w, h) and im.mode == "RGB"          # non-square sources, both resized to 32 x 32
    px = numpy_tower.pixels(im)
    assert px.dtype == np.float32 and px.shape == (1, 3, 32, 32)
    assert numpy_tower.grid(w, h) == (0, 0)
    np.testing.assert_allclose(px[0], ref(name, "pixel_values"), atol=1e-6, rtol=0)


@pytest.mark.parametrize("rescale,mean,std", [
    (1 / 255, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),                                                    # Gemma 3, SmolVLM
    (0.00392156862745098, (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)),   # CLIP's
    (1 / 255, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),                                        # ImageNet's
    (1.0, (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)),                                  # neither rescale nor normalize
    (0.7, (-1.25, 3.0, 0.1), (2.5, 0.03, 7.0))])
def test_normalize_pixels_is_the_float64_order_bit_for_bit(rescale, mean, std):
    """The byte tables give the bits of x * rescale in float64, then float32, then (x - mean) / std in float32:
    every byte value in every channel, of a crop cut from a larger image (a strided view, as Idefics3's)."""
    from llambda.vision.preprocess import normalize_pixels
    rng = np.random.default_rng(7)
    big = rng.integers(0, 256, (20, 40, 3), dtype=np.uint8)
    for c in range(3):
        big[:16, :16, c] = rng.permutation(256).reshape(16, 16)
    a = big[:16, :19]
    want = ((a.astype(np.float64) * rescale).astype(np.float32) - np.asarray(mean, np.float32)) \
        / np.asarray(std, np.float32)
    got = normalize_pixels(a, rescale, mean, std)
    assert got.dtype == np.float32 and got.shape == (3, 16, 19)
    assert got.tobytes() == np.ascontiguousarray(want.transpose(2, 0, 1)).tobytes()
    out = np.full((2, 3, 16, 19), np.nan, np.float32)
    normalize_pixels(a, rescale, mean, std, out[1])
    assert out[1].tobytes() == got.tobytes() and np.isnan(out[0]).all()


def test_tower_facts(numpy_tower):
    assert numpy_tower.tokens_per_image == 16 and numpy_tower.hidden == 64
    assert numpy_tower.family == "gemma3" and numpy_tower.attends == "block"
    out = numpy_tower.encode(np.stack([pixels_of(numpy_tower, n) for n in IMAGES]))
    assert out.shape == (2, 16, 64) and out.dtype == np.float32
    for i, name in enumerate(IMAGES):       # a batch's images do not see each other
        np.testing.assert_allclose(out[i], ref(name, "soft_tokens"), atol=EXACT, rtol=0)


def test_numpy_oracle_matches_transformers(numpy_tower):
    check_tower(numpy_tower, EXACT, EXACT)


def test_native_exact_matches_transformers_on_every_isa(isa):
    t = load_vision(TINY, backend="native", activations="f32", threads=2)
    try:
        check_tower(t, EXACT, EXACT)
    finally:
        t.close()


def test_native_fast_mode_within_its_budget(isa):
    """The native default (bfloat16 products): measured 0.018 (hidden) and 0.014 (soft tokens) at most."""
    t = load_vision(TINY, backend="native", threads=2)
    try:
        check_tower(t, 0.05, 0.05)
    finally:
        t.close()


def test_numpy_attention_in_head_groups_is_the_same(monkeypatch):
    """The oracle's attention holds a group of heads' scores at a time (a real tower: 16 x 4096^2 floats)."""
    from llambda.backends import numpy_ref
    rng = np.random.default_rng(3)
    qkv = rng.standard_normal((40, 3 * 4 * 8)).astype(np.float32)
    starts = np.array([0, 17, 40], np.int32)
    be = numpy_ref.NumpyBackend()
    whole = np.empty((40, 32), np.float32)
    be.encoder_attention(qkv, starts, 4, whole)
    monkeypatch.setattr(numpy_ref, "ENCODER_SCORES_MAX", 17 * 17)      # one head at a time
    grouped = np.empty((40, 32), np.float32)
    be.encoder_attention(qkv, starts, 4, grouped)
    np.testing.assert_allclose(grouped, whole, atol=1e-6, rtol=0)


def test_google_checkpoint_names_load_too(tmp_path):
    """Google's checkpoints spell the tower `vision_tower.vision_model.*`; transformers 5 saved `vision_tower.*`."""
    folder = tmp_path / "g3"
    folder.mkdir()
    for f in ("config.json", "preprocessor_config.json"):
        (folder / f).write_bytes((TINY / f).read_bytes())
    with SafetensorsFile(TINY / "model.safetensors") as st:
        renamed = {("vision_tower.vision_model." + n[len("vision_tower."):] if n.startswith("vision_tower.") else n): t
                   for n, t in st.tensors.items()}
        write_safetensors(folder / "model.safetensors", renamed)
    t = load_vision(folder, backend="numpy")
    check_tower(t, EXACT, EXACT)
    t.close()


def test_a_real_gemma3_config_reads_as_the_real_tower():
    """google/gemma-3-4b-it's config.json and preprocessor_config.json as published (their vision fields; the
    processor's null pan-and-scan settings): 27 layers of 1152 over 64 x 64 patches, 256 tokens of 2560."""
    from llambda.vision.config import VisionConfig
    from llambda.vision.layouts import hf_fields
    cfg = {"architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999, "eoi_token_index": 256000,
           "image_token_index": 262144, "mm_tokens_per_image": 256, "model_type": "gemma3",
           "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                           "num_hidden_layers": 34, "sliding_window": 1024},
           "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                             "model_type": "siglip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 27,
                             "patch_size": 14, "vision_use_head": False}}
    pre = {"do_convert_rgb": None, "do_normalize": True, "do_pan_and_scan": None, "do_rescale": True,
           "do_resize": True, "image_mean": [0.5, 0.5, 0.5], "image_processor_type": "Gemma3ImageProcessor",
           "image_seq_length": 256, "image_std": [0.5, 0.5, 0.5], "pan_and_scan_max_num_crops": None,
           "pan_and_scan_min_crop_size": None, "pan_and_scan_min_ratio_to_activate": None,
           "processor_class": "Gemma3Processor", "resample": 2, "rescale_factor": 0.00392156862745098,
           "size": {"height": 896, "width": 896}}
    c = VisionConfig.from_fields(hf_fields(cfg, pre, "gemma-3-4b-it"), source="gemma-3-4b-it")
    assert (c.n_patches, c.pool, c.mm_tokens_per_image, c.text_hidden_size, c.head_dim) == (4096, 4, 256, 2560, 72)
    assert c.layer_norm_eps == 1e-6 and c.image_mean == (0.5, 0.5, 0.5)
    assert 150 << 20 < c.workspace_bytes() < 250 << 20
    assert 400e6 < c.params() < 440e6          # SigLIP so400m's tower and the projector


def test_encode_refuses_bad_pixels_and_a_closed_tower():
    t = load_vision(TINY, backend="numpy")
    with pytest.raises(InvalidInputError):
        t.encode(np.zeros((1, 3, 16, 16), np.float32))
    with pytest.raises(InvalidInputError):
        t.encode(np.zeros((3, 32, 32), np.float32))
    with pytest.raises(InvalidInputError):
        t.encode(np.full((1, 3, 32, 32), np.nan, np.float32))
    with pytest.raises(InvalidInputError):
        t.pixels("not an image")
    t.close()
    with pytest.raises(ModelClosedError):
        t.encode(np.zeros((1, 3, 32, 32), np.float32))


def test_threads_take_turns():
    """One image's buffers are reused: calls from several threads must not mix them."""
    from concurrent.futures import ThreadPoolExecutor
    t = load_vision(TINY, backend="native", activations="f32", threads=2)
    px = {n: pixels_of(t, n) for n in IMAGES}
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda i: (IMAGES[i % 2], t.encode(px[IMAGES[i % 2]][None])[0]), range(16)))
    for name, out in outs:
        np.testing.assert_allclose(out, ref(name, "soft_tokens"), atol=EXACT, rtol=0)
    t.close()


def test_a_model_source_and_a_backend_instance_are_taken():
    """load() can hand its opened source and its backend: the tower reopens the path and gets a backend of
    its own of the same kind, threads and precision."""
    from llambda.backends import create_backend
    from llambda.formats.open import open_model
    src = open_model(TINY)
    be = create_backend("native", threads=2, activations="f32")
    try:
        t = load_vision(src, be)
    finally:
        src.close()
    assert t.backend is not be and t.backend.name == "native" and t.backend.exact and t.backend.threads == 2
    check_tower(t, EXACT, EXACT)
    t.close()
    with pytest.raises(InvalidInputError):
        load_vision(TINY, backend=3)


def test_sources_without_a_tower_give_none(tmp_path):
    assert load_vision(TINY.parent / "gemma3", backend="numpy") is None          # a text-only directory
    plain = tmp_path / "plain.gguf"
    write_gguf(plain, {"general.architecture": "llama"}, {"x.weight": (QType.F32, np.zeros((2, 32), np.float32))})
    assert load_vision(plain, backend="numpy") is None


# ---------------------------------------------------------------- the tower in the whole model

@pytest.mark.parametrize("backend, activations, budget", [("numpy", None, EXACT), ("native", "f32", EXACT),
                                                           ("native", None, 0.1)])
def test_whole_model_with_the_real_tower_matches_transformers(backend, activations, budget):
    """The language side (Model.attach_vision, the vlm branch) fed by this tower, not a double: logits of the
    fixture's image prompts against transformers', and the greedy continuations. Measured: 4e-6 (numpy and
    native exact), 0.037 (the native default: bfloat16 tower and q8 text)."""
    import llambda
    from llambda.models.images import BatchImages
    m = llambda.load(TINY, backend=backend, activations=activations, n_ctx=128)    # the folder's own tower
    try:
        assert m.accepts_images
        for inp in REF["inputs"]:
            ids = inp["input_ids"]
            starts = [i for i in range(1, len(ids)) if ids[i] == 502 and ids[i - 1] == 500]
            blocks = m.encode_images([(TINY / n).read_bytes() for n in inp["images"]], starts)
            t, n = m.transformer, len(ids)
            b = BatchImages()
            b.add(0, blocks, 0, n)
            got = t.forward(np.array(ids, np.int32), np.zeros(n, np.int32), np.arange(n, dtype=np.int32),
                            list(range(n)), out=np.empty((n, t.cfg.vocab_size), np.float32), images=b)
            assert np.abs(got[inp["rows"]] - np.array(inp["logits_rows"], np.float32)).max() <= budget
            greedy = list(m.generate(ids, images=blocks, max_tokens=len(inp["greedy_new_tokens"]), temperature=0,
                                     ignore_eos=True))
            assert greedy == inp["greedy_new_tokens"]
    finally:
        m.close()


# ---------------------------------------------------------------- llama.cpp's mmproj GGUF

@pytest.fixture(scope="module")
def mmproj_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("mmproj")
    return {q: write_mmproj(TINY, d / f"mmproj-{q}.gguf", q) for q in ("f32", "f16", "q8_0")}


def test_mmproj_is_written_in_llama_cpp_spelling(mmproj_files):
    """The keys and names llama.cpp's clip loader reads (tools/mtmd/clip-impl.h; convert_hf_to_gguf.py's
    Gemma3VisionModel), spelled out here rather than taken from layouts.py."""
    with GGUFFile(mmproj_files["f32"]) as f:
        m = f.metadata
        assert m["general.architecture"] == "clip" and m["clip.projector_type"] == "gemma3"
        assert m["clip.has_vision_encoder"] is True and m["clip.use_gelu"] is True
        assert (m["clip.vision.embedding_length"], m["clip.vision.feed_forward_length"], m["clip.vision.block_count"],
                m["clip.vision.attention.head_count"], m["clip.vision.image_size"], m["clip.vision.patch_size"],
                m["clip.vision.projection_dim"]) == (32, 64, 2, 2, 32, 4, 64)
        assert m["clip.vision.projector.scale_factor"] == 2          # 8 x 8 patches pooled to 4 x 4 (default 4)
        names = set(f.tensors)
        for n in ("v.patch_embd.weight", "v.patch_embd.bias", "v.position_embd.weight", "v.post_ln.weight",
                  "v.post_ln.bias", "mm.input_projection.weight", "mm.soft_emb_norm.weight"):
            assert n in names
        for leaf in ("ln1", "attn_q", "attn_k", "attn_v", "attn_out", "ln2", "ffn_up", "ffn_down"):
            assert {f"v.blk.1.{leaf}.weight", f"v.blk.1.{leaf}.bias"} <= names
        assert f.tensors["mm.input_projection.weight"].ne == (64, 32)         # HF's [vision, text], ne reversed
        assert f.tensors["v.patch_embd.weight"].ne == (4, 4, 3, 32)
        with SafetensorsFile(TINY / "model.safetensors") as st:              # the norm stored as 1 + w
            w = st.tensors["multi_modal_projector.mm_soft_emb_norm.weight"].to_float32()
            np.testing.assert_array_equal(f.tensors["mm.soft_emb_norm.weight"].as_float32(), w + 1)
    with GGUFFile(mmproj_files["q8_0"]) as f:
        assert f.tensors["v.blk.0.ffn_down.weight"].qtype == QType.Q8_0
        assert f.tensors["v.patch_embd.weight"].qtype == QType.F16          # 48 columns: no whole Q8_0 block
        assert f.tensors["v.blk.0.ln1.weight"].qtype == QType.F32


# measured worst errors (hidden, soft): f32 1.2e-6, 9.6e-7; f16 1.6e-3, 1.5e-3; q8_0 0.037, 0.026
MMPROJ_BUDGETS = {"f32": (EXACT, EXACT), "f16": (5e-3, 5e-3), "q8_0": (0.1, 0.08)}


@pytest.mark.parametrize("qtype", sorted(MMPROJ_BUDGETS))
@pytest.mark.parametrize("backend", ["numpy", "native"])
def test_mmproj_round_trip(mmproj_files, qtype, backend):
    t = load_vision(mmproj_files[qtype], backend=backend, activations="f32", threads=2)
    assert t.tokens_per_image == 16 and t.hidden == 64
    check_tower(t, *MMPROJ_BUDGETS[qtype])
    t.close()


@pytest.mark.parametrize("qtype, budget", [("f32", 5e-3), ("q8_0", 0.05)])
def test_llama_cpp_reads_our_mmproj(mmproj_files, tmp_path, qtype, budget):
    """llama.cpp (llama-cpp-python's libmtmd, in a child process) loads the mmproj we write beside a 64-wide
    text model and gives our soft tokens for the same pixels: a 32 x 32 image (no resize on either side, so
    the resampling filters, which differ, play no part). Measured: 1.0e-3 (f32), 0.016 (q8_0: llama.cpp
    multiplies Q8_0 weights by 8-bit activations), of values up to 3.7."""
    pytest.importorskip("llama_cpp")
    try:
        from llama_cpp import mtmd_cpp  # noqa: F401
    except Exception as e:      # an older build without the multimodal library
        pytest.skip(f"llama-cpp-python has no mtmd library here ({e})")
    sys.path.insert(0, str(Path(__file__).parent))
    from test_export import tiny_llama_gguf         # a 64-wide llama with a tokenizer: mtmd needs one
    text = tiny_llama_gguf(tmp_path / "text.gguf")
    from llamacpp_ref import mtmd_image_rows
    rgb = np.asarray(Image.open(TINY / IMAGES[0]).convert("RGB").resize((32, 32), Image.Resampling.BILINEAR))
    [theirs] = mtmd_image_rows(text, mmproj_files[qtype], rgb, tmp_path)
    t = load_vision(mmproj_files[qtype], backend="numpy")
    ours = t.encode(t.pixels(Image.fromarray(rgb, "RGB")))[0]
    t.close()
    assert theirs.shape == ours.shape == (16, 64)
    assert np.abs(theirs - ours).max() <= budget, np.abs(theirs - ours).max()


# ---------------------------------------------------------------- Ollama's gemma3 GGUF (tower inside)

OLLAMA_LAYER = {"layer_norm1": "layer_norm1", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
                "self_attn.v_proj": "attn_v", "self_attn.out_proj": "attn_output", "layer_norm2": "layer_norm2",
                "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2"}


def ollama_gguf(path: Path, drop_key: str | None = None, drop_tensor: str | None = None, **meta_over) -> Path:
    """The tiny folder's tower as Ollama's converter (convert/convert_gemma3.go) names it, inside a gemma3
    model file (a stand-in text part: the tower's loader reads none of it); the soft-embedding norm + 1."""
    tensors = {"token_embd.weight": (QType.F32, np.zeros((512, 64), np.float32))}
    with SafetensorsFile(TINY / "model.safetensors") as st:
        for name, t in st.tensors.items():
            v = t.to_float32()
            if name.startswith("vision_tower.encoder.layers."):
                i, rest = name[len("vision_tower.encoder.layers."):].split(".", 1)
                leaf, kind = rest.rsplit(".", 1)
                out = f"v.blk.{i}.{OLLAMA_LAYER[leaf]}.{kind}"
            elif name.startswith("vision_tower.embeddings."):
                out = "v." + name[len("vision_tower.embeddings."):]
            elif name.startswith("vision_tower."):
                out = "v." + name[len("vision_tower."):]
            elif name == "multi_modal_projector.mm_input_projection_weight":
                out = "mm.mm_input_projection.weight"
            elif name == "multi_modal_projector.mm_soft_emb_norm.weight":
                out, v = "mm.mm_soft_emb_norm.weight", v + 1
            else:
                continue
            if out != drop_tensor:
                tensors[out] = (QType.F32, np.ascontiguousarray(v))
    meta = {"general.architecture": "gemma3", "gemma3.embedding_length": 64, "gemma3.block_count": 4,
            "gemma3.vision.block_count": 2, "gemma3.vision.embedding_length": 32,
            "gemma3.vision.feed_forward_length": 64, "gemma3.vision.image_size": 32, "gemma3.vision.patch_size": 4,
            "gemma3.vision.num_channels": 3, "gemma3.vision.attention.head_count": 2,
            "gemma3.vision.attention.layer_norm_epsilon": 1e-6, "gemma3.mm.tokens_per_image": 16}
    meta.update({k.replace("__", "."): v for k, v in meta_over.items()})
    meta.pop(drop_key, None)
    write_gguf(path, meta, tensors)
    return path


@pytest.mark.parametrize("backend", ["numpy", "native"])
def test_ollama_layout_matches_transformers(tmp_path, backend):
    t = load_vision(ollama_gguf(tmp_path / "g3.gguf"), backend=backend, activations="f32", threads=2)
    check_tower(t, EXACT, EXACT)
    t.close()


def test_ollama_file_without_its_mlp_width_key(tmp_path):
    """Older Ollama files lack gemma3.vision.feed_forward_length: the MLP's tensor gives it."""
    t = load_vision(ollama_gguf(tmp_path / "g3.gguf", drop_key="gemma3.vision.feed_forward_length"), backend="numpy")
    check_tower(t, EXACT, EXACT)
    t.close()


def test_ollama_model_file_loads_as_text_and_as_vision(tmp_path):
    """Ollama's gemma3 file holds the decoder and the tower: the text loader skips the tower's `v.*`/`mm.*`
    tensors (they once made it look for attention biases and refuse the file), the tower loads from it."""
    import llambda
    from llambda.tools.export import export
    text = export(TINY, tmp_path / "text.gguf", fmt="gguf", progress=False)
    tower = ollama_gguf(tmp_path / "tower.gguf")
    with GGUFFile(text) as t, GGUFFile(tower) as v:
        meta = {**t.metadata, **{k: x for k, x in v.metadata.items() if k.startswith(("gemma3.vision.", "gemma3.mm."))}}
        types = {**t.metadata_types, **v.metadata_types}
        write_gguf(tmp_path / "both.gguf", meta,
                   list(t.tensors.values()) + [i for n, i in v.tensors.items() if n.startswith(("v.", "mm."))],
                   metadata_types={k: types[k] for k in meta})
    ids = [5, 100, 3, 7, 200, 42]
    both, alone = (llambda.load(p, backend="numpy") for p in (tmp_path / "both.gguf", text))
    np.testing.assert_array_equal(both.logits(ids), alone.logits(ids))
    t = load_vision(tmp_path / "both.gguf", backend="numpy")
    check_tower(t, EXACT, EXACT)
    t.close()


# ---------------------------------------------------------------- hostile files

def _mmproj_with(path: Path, src: Path, meta: dict | None = None, drop: str | None = None,
                 reshape: str | None = None) -> Path:
    with GGUFFile(src) as f:
        m = {**f.metadata, **(meta or {})}
        m = {k: v for k, v in m.items() if v is not None}
        ts = []
        for name, info in f.tensors.items():
            if name == drop:
                continue
            v = info.as_float32()
            if name == reshape:
                v = v[..., :-1] if v.ndim > 1 else v[:-1]
            ts.append((name, QType.F32, np.ascontiguousarray(v)))
        write_gguf(path, m, ts)
    return path


@pytest.mark.parametrize("meta, words", [
    ({"clip.vision.image_size": 1 << 30}, "image_size"),
    ({"clip.vision.patch_size": 0}, "patch_size"),
    ({"clip.vision.patch_size": 5}, "multiple of the patch size"),
    ({"clip.vision.projector.scale_factor": 3}, "scale_factor"),
    ({"clip.vision.projector.scale_factor": 16}, "scale_factor"),
    ({"clip.vision.attention.head_count": 3}, "heads"),
    ({"clip.vision.embedding_length": "32"}, "embedding_length"),
    ({"clip.vision.block_count": 1 << 40}, "block_count"),
    ({"clip.vision.embedding_length": 48}, "shape"),                   # sizes that disagree with the tensors
    ({"clip.vision.block_count": 3}, "missing"),
    ({"clip.projector_type": "llava"}, "projector type"),
    ({"clip.use_gelu": False}, "use_gelu"),
    ({"clip.vision.image_mean": [0.5, 0.5]}, "image_mean"),
    ({"clip.vision.image_std": [0.5, 0.0, 0.5]}, "image_std"),
    ({"clip.vision.attention.layer_norm_epsilon": float("nan")}, "epsilon"),
])
def test_hostile_mmproj_metadata_is_a_model_format_error(mmproj_files, tmp_path, meta, words):
    bad = _mmproj_with(tmp_path / "bad.gguf", mmproj_files["f32"], meta=meta)
    with pytest.raises(ModelFormatError, match=words):
        load_vision(bad, backend="numpy")


@pytest.mark.parametrize("drop, reshape, words", [
    ("v.blk.1.attn_out.weight", None, "self_attn.out_proj.weight"),
    ("mm.input_projection.weight", None, "mm_input_projection_weight"),
    (None, "v.blk.0.ffn_up.weight", "shape"),
    (None, "v.position_embd.weight", "shape"),
])
def test_missing_or_misshapen_tensors_are_named(mmproj_files, tmp_path, drop, reshape, words):
    bad = _mmproj_with(tmp_path / "bad.gguf", mmproj_files["f32"], drop=drop, reshape=reshape)
    with pytest.raises(ModelFormatError, match=words):
        load_vision(bad, backend="native", threads=2)


def test_non_finite_weights_are_refused(mmproj_files, tmp_path):
    src = tmp_path / "nan.gguf"
    with GGUFFile(mmproj_files["f32"]) as f:
        ts = [(n, QType.F32, np.where(np.arange(i.as_float32().size).reshape(i.shape) == 0, np.nan, i.as_float32())
               if n == "v.blk.0.attn_q.weight" else np.ascontiguousarray(i.as_float32())) for n, i in f.tensors.items()]
        write_gguf(src, dict(f.metadata), ts)
    with pytest.raises(ModelFormatError, match="non-finite"):
        load_vision(src, backend="numpy")


def test_hostile_ollama_file(tmp_path):
    with pytest.raises(ModelFormatError, match="tokens_per_image"):
        load_vision(ollama_gguf(tmp_path / "a.gguf", gemma3__mm__tokens_per_image=15), backend="numpy")
    with pytest.raises(ModelFormatError, match="image_size"):
        load_vision(ollama_gguf(tmp_path / "b.gguf", gemma3__vision__image_size=-1), backend="numpy")
    with pytest.raises(ModelFormatError, match="mlp.fc2.bias"):
        load_vision(ollama_gguf(tmp_path / "c.gguf", drop_tensor="v.blk.1.mlp.fc2.bias"), backend="numpy")
    with pytest.raises(ModelFormatError, match="block_count"):
        load_vision(ollama_gguf(tmp_path / "d.gguf", drop_key="gemma3.vision.block_count"), backend="numpy")


@pytest.mark.parametrize("edit, words", [
    (lambda c, p: c["vision_config"].update(image_size=10 ** 9), "image_size"),
    (lambda c, p: c["vision_config"].update(patch_size=7), "multiple of the patch size"),
    (lambda c, p: c.update(mm_tokens_per_image=[16]), "mm_tokens_per_image"),
    (lambda c, p: c["text_config"].pop("hidden_size"), "hidden_size"),
    (lambda c, p: c["vision_config"].update(hidden_act="quick_gelu"), "hidden_act"),
    (lambda c, p: p.update(do_pan_and_scan=True), "pan-and-scan"),
    (lambda c, p: p.update(size={"height": 64, "width": 64}), "resizes"),
    (lambda c, p: p.update(image_std=[0.5, 0, 0.5]), "image_std"),
    (lambda c, p: p.update(image_mean=[10 ** 400, 0, 0]), "image_mean"),           # past float's range
    (lambda c, p: c["vision_config"].update(layer_norm_eps=10 ** 400), "layer_norm_eps"),
    (lambda c, p: p.update(rescale_factor="1/255"), "rescale_factor"),
])
def test_hostile_hf_config(tmp_path, edit, words):
    folder = tmp_path / "g3"
    folder.mkdir()
    cfg = json.loads((TINY / "config.json").read_text())
    pre = json.loads((TINY / "preprocessor_config.json").read_text())
    edit(cfg, pre)
    (folder / "config.json").write_text(json.dumps(cfg))
    (folder / "preprocessor_config.json").write_text(json.dumps(pre))
    (folder / "model.safetensors").symlink_to(TINY / "model.safetensors")
    with pytest.raises(ModelFormatError, match=words):
        load_vision(folder, backend="numpy")


# ---------------------------------------------------------------- hostile and unusual images

def _png(im) -> bytes:
    b = io.BytesIO()
    im.save(b, "PNG")
    return b.getvalue()


def _png_claiming(w: int, h: int) -> bytes:
    """A 1 x 1 PNG whose header claims w x h (its IHDR CRC fixed): a decompression bomb's shape."""
    raw = bytearray(_png(Image.new("RGB", (1, 1))))
    raw[16:24] = struct.pack(">II", w, h)
    raw[29:33] = struct.pack(">I", zlib.crc32(bytes(raw[12:29])) & 0xFFFFFFFF)
    return bytes(raw)


@pytest.mark.parametrize("data, words", [
    (b"", "empty"),
    (b"\x89PNG\r\n\x1a\n" + b"\0" * 40, "supported format|decoded"),
    (b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\n", "supported format"),   # Pillow runs Ghostscript for EPS
    (b"P6\n4 4\n255\n" + bytes(48), "supported format"),                               # PPM: Pillow reads it, we do not
    ("a string", "bytes"),
    (None, "bytes"),
])
def test_bad_image_data_is_invalid_input(data, words):
    with pytest.raises(InvalidInputError, match=words):
        load_image(data)


def test_truncated_images_are_refused():
    full = (TINY / IMAGES[0]).read_bytes()
    for cut in (len(full) // 2, len(full) // 4, 60):      # (past the pixel data, a lost IEND decodes whole)
        with pytest.raises(InvalidInputError):
            load_image(full[:cut])
    b = io.BytesIO()
    Image.new("RGB", (64, 64), (10, 200, 30)).save(b, "JPEG")
    with pytest.raises(InvalidInputError):
        load_image(b.getvalue()[:300])


def test_decompression_bombs_are_refused_before_decoding():
    with pytest.raises(InvalidInputError, match="pixels"):
        load_image(_png_claiming(20000, 20000))         # past our 64M bound, under Pillow's 2 x 89M error
    with pytest.raises(InvalidInputError, match="pixels"):
        load_image(_png_claiming(100000, 100000))       # past Pillow's own error too


def test_too_many_bytes(monkeypatch):
    monkeypatch.setattr(image_mod, "MAX_IMAGE_BYTES", 100)
    with pytest.raises(InvalidInputError, match="MB"):
        load_image((TINY / IMAGES[0]).read_bytes())


def test_alpha_is_composited_over_white_as_transformers_does():
    rgba = Image.new("RGBA", (4, 4), (0, 0, 255, 0))          # fully transparent blue
    rgba.putpixel((0, 0), (255, 0, 0, 255))                   # one opaque red pixel
    rgba.putpixel((1, 0), (0, 0, 0, 128))                     # half-transparent black
    im = load_image(_png(rgba))
    assert im.mode == "RGB"
    assert im.getpixel((3, 3)) == (255, 255, 255) and im.getpixel((0, 0)) == (255, 0, 0)
    assert all(abs(c - 127) <= 1 for c in im.getpixel((1, 0)))
    pal = Image.new("P", (2, 1))
    pal.putpalette([0, 0, 0, 200, 10, 10] + [0] * 762)
    pal.putpixel((1, 0), 1)
    pal.info["transparency"] = 0
    b = io.BytesIO()
    pal.save(b, "PNG", transparency=0)
    im = load_image(b.getvalue())
    assert im.getpixel((0, 0)) == (255, 255, 255) and im.getpixel((1, 0)) == (200, 10, 10)


def test_greyscale_cmyk_and_palette_become_rgb():
    grey = load_image(_png(Image.new("L", (3, 2), 77)))
    assert grey.mode == "RGB" and grey.getpixel((2, 1)) == (77, 77, 77)
    b = io.BytesIO()
    Image.new("CMYK", (8, 8), (0, 255, 255, 0)).save(b, "JPEG")
    cmyk = load_image(b.getvalue())
    assert cmyk.mode == "RGB" and cmyk.size == (8, 8)
    r, g, bl = cmyk.getpixel((4, 4))
    assert r > 200 and g < 60 and bl < 60                      # cyan 0, magenta and yellow full: red


def test_16_bit_greyscale_is_scaled_not_clipped():
    """Pillow opens a 16-bit greyscale PNG as I;16 and its convert("RGB") clips it (all past 255 white, as
    transformers gets it); llama.cpp's and Ollama's decoders scale it to 8 bits, and so do we."""
    a = np.array([[0, 257 * 100, 65535, 257 * 128 + 100]], np.uint16)
    b = io.BytesIO()
    Image.fromarray(a).save(b, "PNG")
    im = load_image(b.getvalue())
    assert [im.getpixel((x, 0)) for x in range(4)] == [(0, 0, 0), (100, 100, 100), (255, 255, 255), (128, 128, 128)]


def test_animated_gif_takes_its_first_frame():
    frames = [Image.new("RGB", (6, 6), c) for c in ((250, 0, 0), (0, 250, 0), (0, 0, 250))]
    b = io.BytesIO()
    frames[0].save(b, "GIF", save_all=True, append_images=frames[1:], duration=50, loop=0)
    im = load_image(b.getvalue())
    assert im.size == (6, 6)
    r, g, bl = im.getpixel((3, 3))
    assert r > 200 and g < 50 and bl < 50


def test_exif_orientation_is_applied():
    src = Image.new("RGB", (40, 20), (0, 0, 0))
    src.paste((255, 255, 255), (0, 0, 20, 20))                # left half white
    exif = Image.Exif()
    exif[0x0112] = 6                                           # rotate 90 degrees clockwise to display
    b = io.BytesIO()
    src.save(b, "JPEG", exif=exif.tobytes(), quality=95)
    im = load_image(b.getvalue())
    assert im.size == (20, 40)                                 # upright, as a viewer shows it
    assert sum(im.getpixel((10, 5))) > 600 and sum(im.getpixel((10, 35))) < 150


def test_every_image_error_is_a_llambda_error():
    """A sweep of corruptions of a real PNG and JPEG: each decodes or fails with a typed error."""
    rng = np.random.default_rng(5)
    b = io.BytesIO()
    Image.open(TINY / IMAGES[1]).save(b, "JPEG")
    for data in ((TINY / IMAGES[1]).read_bytes(), b.getvalue()):
        for _ in range(60):
            bad = bytearray(data)
            for at in rng.integers(0, len(bad), size=rng.integers(1, 8)):
                bad[at] = int(rng.integers(0, 256))
            try:
                im = load_image(bytes(bad))
                assert im.mode == "RGB"
            except LlambdaError:
                pass
