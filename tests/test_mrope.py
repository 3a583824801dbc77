"""M-RoPE (Qwen2-VL, Qwen2.5-VL's text model; Qwen3-VL's, its sections interleaved): the rope op with per-section
positions, an image's RoPE positions (models/images.rope_rows against a NumPy twin of transformers'
get_rope_index written from reading it), the configs that carry the sections, and the Transformer's `rope=`
through prefill, plans and the scheduler's batches, on a small random Qwen2-VL text model (no fixture:
tests/test_vlm_qwen25vl.py checks whole models against transformers)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from llambda.backends.numpy_ref import NumpyBackend
from llambda.errors import InvalidInputError, ModelFormatError
from llambda.models import images as image_mod
from llambda.models.config import TransformerConfig
from llambda.models.images import image_block, rope_delta, rope_rows

native = pytest.importorskip("llambda._native", reason="C core not built (python setup.py build_ext --inplace)")

F32 = np.float32


def interleaved_twin(sections, half: int) -> np.ndarray:
    """Each pair's section as transformers' Qwen3VLTextRotaryEmbedding.recomposition_frequencies picks it: the
    temporal one everywhere, then slice(1, 3 * sections[1], 3) the height one, slice(2, 3 * sections[2], 3) the
    width one."""
    which = np.zeros(half, int)
    for dim, offset in ((1, 1), (2, 2)):
        which[offset:sections[dim] * 3:3] = dim
    return which


def ref_rope_sections(x, pos, inv_freq, sections, neox, f32_angle: bool, interleaved: bool = False):
    """Float64: pair i of section s turned by pos[s] * inv_freq[i] (the angle the float32 product, as HF and the
    C core compute it, or in float64, as the NumPy backend's rope does); the sections contiguous, or Qwen3-VL's
    interleaved ones."""
    x = x.astype(np.float64)
    half = len(inv_freq)
    which = (interleaved_twin(sections, half) if interleaved
             else np.concatenate([[s] * c for s, c in enumerate(sections)]).astype(int))
    if f32_angle:
        ang = (pos.astype(F32)[which].T * inv_freq[None, :]).astype(np.float64)
    else:
        ang = pos.astype(np.float64)[which].T * inv_freq.astype(np.float64)[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    if neox:
        a, b = x[..., :half].copy(), x[..., half:2 * half].copy()
        x[..., :half], x[..., half:2 * half] = a * c - b * s, a * s + b * c
    else:
        a, b = x[..., 0:2 * half:2].copy(), x[..., 1:2 * half:2].copy()
        x[..., 0:2 * half:2], x[..., 1:2 * half:2] = a * c - b * s, a * s + b * c
    return x


def inv_freq(rope_dim: int) -> np.ndarray:
    return (1.0 / 10000.0 ** (np.arange(0, rope_dim, 2) / rope_dim)).astype(F32)


CASES = [(1, 3, 16, 16, [2, 3, 3]), (37, 2, 128, 128, [16, 24, 24]), (5, 1, 24, 20, [4, 0, 6]), (9, 5, 12, 12, [6]),
         (7, 2, 128, 128, [24, 20, 20])]       # (the last: Qwen3-VL's real sections)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("n,heads,hd,rope_dim,sections", CASES)
def test_rope_sections_native_and_numpy_against_float64(isa, neox, n, heads, hd, rope_dim, sections, interleaved):
    from llambda.backends.native import NativeBackend
    if interleaved and len(sections) != 3:
        pytest.skip("interleaved M-RoPE (Qwen3-VL's) has three sections")
    r = np.random.default_rng(n + hd + neox)
    x = r.standard_normal((n, heads, hd)).astype(F32)
    pos = r.integers(0, 5000, (len(sections), n)).astype(np.int32)
    f = inv_freq(rope_dim)
    for backend in (NumpyBackend(), NativeBackend(threads=1)):
        want = ref_rope_sections(x, pos, f, sections, neox, isinstance(backend, NativeBackend), interleaved)
        y = x.copy()
        backend.rope_sections(y, pos, f, neox, sections, interleaved)
        np.testing.assert_allclose(y, want, rtol=0, atol=3e-6 * np.abs(want).max())
        assert np.array_equal(y[..., rope_dim:], x[..., rope_dim:])       # the dims past rope_dim untouched


@pytest.mark.parametrize("neox", [True, False])
def test_equal_sections_are_plain_rope_bit_for_bit_natively(isa, neox):
    """A text token's three positions are equal: M-RoPE is then the model's plain RoPE, the same bits."""
    from llambda.backends.native import NativeBackend
    r = np.random.default_rng(3)
    x = r.standard_normal((23, 4, 32)).astype(F32)
    p = r.integers(0, 9000, 23).astype(np.int32)
    f = inv_freq(32)
    plain, sect = x.copy(), x.copy()
    B = NativeBackend(threads=2)
    B.rope(plain, p, f, neox)
    B.rope_sections(sect, np.stack([p, p, p]), f, neox, [4, 6, 6])
    assert np.array_equal(plain, sect)
    a, b = x.copy(), x.copy()
    NumpyBackend().rope(a, p, f, neox)
    NumpyBackend().rope_sections(b, np.stack([p, p, p]), f, neox, [4, 6, 6])
    assert np.array_equal(a, b)


# -- an image's positions: transformers' get_rope_index, twinned ------------------------------------------

def get_rope_index_twin(ids: list[int], pad: int, grids: list[tuple[int, int]]) -> tuple[np.ndarray, int]:
    """transformers' Qwen2_5_VLModel.get_rope_index for still images (grid_t 1, merged grids given), one
    sequence: the tokens grouped by type (text or image pad); a text run counts on from the current position
    in all three rows; an image's run gets (t0, t0 + row, t0 + col) over its merged grid, row-major, and the
    current position moves on by max(gh, gw); delta = max + 1 - len."""
    kinds = [int(t == pad) for t in ids]
    cur, parts, images = 0, [], iter(grids)
    for kind, group in itertools.groupby(kinds):
        k = len(list(group))
        if kind == 0:
            parts.append(np.arange(cur, cur + k)[None].repeat(3, 0))
            cur += k
        else:
            gh, gw = next(images)
            assert gh * gw == k
            hh, ww = np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij")
            parts.append(np.stack([np.full(k, cur), cur + hh.reshape(-1), cur + ww.reshape(-1)]))
            cur += max(gh, gw)
    pos = np.concatenate(parts, axis=1)
    return pos, int(pos.max() + 1 - len(ids))


def prompt_with(grids, rng, pad=9, start=7, end=8):
    ids, blocks = [], []
    for gh, gw in grids:
        ids += list(rng.integers(10, 20, int(rng.integers(0, 4))))
        ids.append(start)
        blocks.append(image_block(len(ids), np.ones((gh * gw, 4), F32), causal=True, grid=(gh, gw)))
        ids += [pad] * (gh * gw)
        ids.append(end)
    ids += list(rng.integers(10, 20, 3))
    return ids, tuple(blocks)


@pytest.mark.parametrize("grids", [[(2, 3)], [(1, 1)], [(3, 1), (2, 2)], [(1, 5), (4, 2), (2, 7)]])
def test_rope_rows_are_get_rope_index(grids):
    rng = np.random.default_rng(len(grids))
    ids, blocks = prompt_with(grids, rng)
    want, delta = get_rope_index_twin(ids, 9, grids)
    got = rope_rows(blocks, 0, len(ids))
    assert got.dtype == np.int32 and np.array_equal(got.T, want)
    assert rope_delta(blocks) == delta
    # any window of positions (a prefill chunk) is the same rows
    for a, b in [(0, 1), (2, 9), (5, len(ids)), (len(ids) - 1, len(ids))]:
        a, b = min(a, len(ids) - 1), min(b, len(ids))
        assert np.array_equal(rope_rows(blocks, a, b), got[a:b])
    # past the prompt (decode): the position plus delta in every section
    assert np.array_equal(rope_rows(blocks, len(ids), len(ids) + 3),
                          (np.arange(len(ids), len(ids) + 3) + delta)[:, None].repeat(3, 1))


def test_no_grid_no_rows_and_the_digest_covers_the_grid():
    rows = np.ones((6, 4), F32)
    assert rope_rows((image_block(3, rows, True),), 0, 10) is None
    a, b = image_block(0, rows, True, (2, 3)), image_block(0, rows, True, (3, 2))
    assert a.digest != b.digest                     # the same rows, other positions after: not one prefix
    assert image_mod.images_agree(20, (a,), (b,)) == 0
    with pytest.raises(InvalidInputError, match="grid"):
        image_block(0, rows, True, (2, 2))


# -- configs --------------------------------------------------------------------------------------------

TEXT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=300, rms_norm_eps=1e-6, max_position_embeddings=512)


def test_hf_configs_nested_flat_and_old_spellings():
    from llambda.models.qwen2vl import config_from_hf
    new = config_from_hf(dict(TEXT, model_type="qwen2_5_vl_text",
                              rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 1e6}))
    old = config_from_hf(dict(TEXT, model_type="qwen2_5_vl", rope_theta=1e6,
                              rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}))
    for c in (new, old):
        assert c.rope_sections == [2, 3, 3] and c.rope_theta == 1e6 and c.attn_bias and c.rope_scaling is None
    with pytest.raises(ModelFormatError, match="mrope_section"):
        config_from_hf(dict(TEXT, rope_theta=1e6))
    with pytest.raises(ModelFormatError, match="sum to"):
        config_from_hf(dict(TEXT, rope_scaling={"type": "mrope", "mrope_section": [2, 3, 4]}))
    with pytest.raises(ModelFormatError, match="pair counts"):
        config_from_hf(dict(TEXT, rope_scaling={"type": "mrope", "mrope_section": "2,3,3"}))


def test_gguf_configs_llama_cpp_and_ollama_keys():
    from llambda.models.qwen2vl import config_from_gguf
    for arch, key in (("qwen2vl", "rope.dimension_sections"), ("qwen25vl", "rope.mrope_section")):
        meta = {"general.architecture": arch, f"{arch}.embedding_length": 64, f"{arch}.block_count": 2,
                f"{arch}.attention.head_count": 4, f"{arch}.attention.head_count_kv": 2,
                f"{arch}.feed_forward_length": 128, f"{arch}.vocab_size": 300,
                f"{arch}.{key}": np.array([2, 3, 3, 0], np.int32)}
        c = config_from_gguf(meta)
        assert c.rope_sections == [2, 3, 3] and c.rope_neox and c.attn_bias
        with pytest.raises(ModelFormatError, match="sections"):
            config_from_gguf({k: v for k, v in meta.items() if k != f"{arch}.{key}"})
        with pytest.raises(ModelFormatError, match="three sections"):
            config_from_gguf(dict(meta, **{f"{arch}.{key}": [8, 0, 0, 0]}))


def test_config_refuses_bad_sections():
    base = dict(arch="qwen2vl", vocab_size=10, n_layers=1, d_model=16, n_heads=2, n_kv_heads=1, head_dim=8, ffn_dim=8)
    assert TransformerConfig(**base, rope_sections=[1, 1, 2]).rope_sections == [1, 1, 2]
    for bad in ([1, 1, 1], [1, -1, 4], [1, 1, 1, 1, 0], [4.0]):
        with pytest.raises(ModelFormatError):
            TransformerConfig(**base, rope_sections=bad)
