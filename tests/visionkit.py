"""Helpers the vision tower tests share: a fixture directory copied with its configs or tensors edited, an
mmproj GGUF rewritten with its metadata edited or tensors dropped, llama.cpp's rows of an image."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from llambda.formats import gguf, gguf_writer, quants, safetensors


def copy_fixture(src: Path, dest: Path, pre_edit=None, config_edit=None, tensors_edit=None) -> Path:
    """The fixture directory `src` copied to `dest`, its processor settings, config or tensors edited in place by
    the given callables."""
    shutil.copytree(src, dest)
    for name, edit in (("preprocessor_config.json", pre_edit), ("config.json", config_edit)):
        if edit is not None:
            d = json.loads((dest / name).read_text())
            edit(d)
            (dest / name).write_text(json.dumps(d))
    if tensors_edit is not None:
        with safetensors.SafetensorsFile(dest / "model.safetensors") as st:
            tensors = {n: t.to_float32() for n, t in st.tensors.items()}
        tensors_edit(tensors)
        safetensors.write_safetensors(dest / "model.safetensors", tensors)
    return dest


def check_patches(tower, folder: Path, name: str, entry: dict, values: int) -> None:
    """The fixture image `name`'s flattened patches (`values` each) are transformers' bit for bit (the same
    Pillow resize), its size and merged grid as reference.json's `entry` says."""
    from llambda.vision import load_image
    from llambda.vision.image import check_image
    from llambda.vision.qwen2vl_pixels import smart_resize
    data = (folder / name).read_bytes()
    assert check_image(data) == tuple(entry["size"])
    assert list(tower.grid(*entry["size"])) == entry["merged_grid"]
    w, h = entry["size"]
    assert list(smart_resize(h, w, tower.cfg))[::-1] == entry["resized_wh"]
    px = tower.pixels(load_image(data))
    _, gh, gw = entry["grid_thw"]
    assert px.dtype == np.float32 and px.shape == (gh * gw, values)
    np.testing.assert_array_equal(px, np.load(folder / entry["pixel_values"]))


def check_grids_bounded(tower, sizes: list, decode_below: int) -> None:
    """Each (w, h) of `sizes`: a merged grid of at least 1 x 1 within max_pixels (smart_resize's ceil may pass it
    by a cell a side), pixels() agreeing with it (images under `decode_below` pixels made and cut), a ratio past
    200 refused; grid() refuses what is not a size."""
    from llambda.errors import InvalidInputError
    from PIL import Image
    rng, cfg = np.random.default_rng(5), tower.cfg
    m2 = cfg.spatial_merge_size ** 2
    for w, h in sizes:
        if max(w, h) / min(w, h) > 200:
            with pytest.raises(InvalidInputError, match="aspect"):
                tower.grid(w, h)
            continue
        mh, mw = tower.grid(w, h)
        assert mh >= 1 and mw >= 1 and mh * mw * cfg.factor ** 2 <= cfg.max_pixels + cfg.factor ** 2 * (mh + mw)
        if w * h < decode_below:
            im = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB")
            assert tower.pixels(im).shape[0] == mh * mw * m2, (w, h)
    for bad in (0, -3, 1.5, True, "9", 1 << 21):
        with pytest.raises(InvalidInputError):
            tower.grid(bad, 10)


def vision_edit(**kw):
    """A config.json edit: vision_config's keys set to `kw`."""
    return lambda c: c["vision_config"].update(kw)


def rgb_image(h: int, w: int, seed: int = 3) -> np.ndarray:
    """An h x w RGB test image (uint8): gradients, a wave and noise."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    return np.clip(np.stack([xx * 255 / w, yy * 255 / h, 127 + 100 * np.sin(xx / 3 + yy / 5)], -1)
                   + rng.normal(0, 20, (h, w, 3)), 0, 255).astype(np.uint8)


def numpy_tower_fixture(src: Path):
    """A module-scoped pytest fixture: the tower of `src` on the NumPy backend, closed after the module."""
    @pytest.fixture(scope="module")
    def numpy_tower():
        from llambda.vision import load_vision
        tower = load_vision(src, backend="numpy")
        yield tower
        tower.close()
    return numpy_tower


def refused(src: Path, dest: Path, match: str, **edits) -> None:
    """The fixture `src` copied to `dest` with `edits` (copy_fixture's) does not load: a ModelFormatError saying
    `match`."""
    from llambda.errors import ModelFormatError
    from llambda.vision import load_vision
    with pytest.raises(ModelFormatError, match=match):
        load_vision(copy_fixture(src, dest, **edits), backend="numpy")


def rewrite_gguf(src: Path, dest: Path, meta_edit=None, drop=(), tensor_edit=None) -> Path:
    """A copy of the F32 GGUF `src`, its metadata edited in place by `meta_edit`, the tensors `drop` left out,
    each tensor's values through `tensor_edit(name, values)` where given."""
    with gguf.GGUFFile(src) as f:
        meta = dict(f.metadata)
        if meta_edit is not None:
            meta_edit(meta)
        tensors = [(n, quants.QType.F32, np.ascontiguousarray(
                    t.as_float32() if tensor_edit is None else tensor_edit(n, t.as_float32())))
                   for n, t in f.tensors.items() if n not in drop]
        gguf_writer.write_gguf(dest, meta, tensors)
    return dest


def llama_cpp_rows(mmproj, rgb: np.ndarray, tmp: Path, control_tokens=(), width: int = 64) -> list:
    """llama.cpp's rows (llama-cpp-python's libmtmd, tests/llamacpp_ref.py) of an RGB image [h, w, 3] uint8 with
    `mmproj` beside a tiny `width`-wide llama text model holding `control_tokens` (its width must be the mmproj's
    rows': Qwen3-VL's are the text width times 1 + its DeepStack levels); a skip where libmtmd is absent."""
    pytest.importorskip("llama_cpp")
    try:
        from llama_cpp import mtmd_cpp  # noqa: F401
    except Exception as e:      # an older build without the multimodal library
        pytest.skip(f"llama-cpp-python has no mtmd library here ({e})")
    sys.path.insert(0, str(Path(__file__).parent))
    from llamacpp_ref import mtmd_image_rows
    from test_export import tiny_llama_gguf
    text = tiny_llama_gguf(tmp / "text.gguf", control_tokens=control_tokens, width=width)   # mtmd looks these up
    return mtmd_image_rows(text, mmproj, rgb, tmp)


def check_bad_encode_calls(tower, px, grid: tuple) -> None:
    """A Qwen-VL tower's encode_one refuses, as InvalidInputError, grids that do not fit the image's patches `px`
    (its grid `grid`) or are not two positive integers, patches of another width or rank, non-finite values, a
    grid past max_pixels; encode() and pixels() refuse what is not theirs."""
    from llambda.errors import InvalidInputError
    gh, gw = grid
    for bad in ((gh, gw + 1), (gh + 1, gw), (gh * gw, 0), (0, 0), f"{gh}x{gw}", (float(gh), float(gw)), (-gh, -gw),
                (gh, gw, 1), (True, gh * gw), None):
        with pytest.raises(InvalidInputError):
            tower.encode_one(px, bad)
    with pytest.raises(InvalidInputError):
        tower.encode_one(px[:, :100], grid)
    with pytest.raises(InvalidInputError):
        tower.encode_one(px.reshape(-1), grid)
    for value in (np.nan, np.inf):
        bad = px.copy()
        bad[3, 7] = value
        with pytest.raises(InvalidInputError, match="non-finite"):
            tower.encode_one(bad, grid)
    with pytest.raises(InvalidInputError, match="encode_one"):
        tower.encode(px[None])
    for image in ("not an image", b"not an image"):
        with pytest.raises(InvalidInputError):
            tower.pixels(image)
    with pytest.raises(InvalidInputError, match="max_pixels"):      # a grid bigger than max_pixels allows
        tower.encode_one(np.zeros((64 * 64, px.shape[1]), np.float32), (32, 32))


def write_mmprojs(src: Path, tmp: Path) -> dict:
    """{qtype: path} of the tower of `src` written as llama.cpp's mmproj in F32, F16 and Q8_0 under `tmp`."""
    from llambda.vision import mmproj
    return {q: mmproj.write_mmproj(src, tmp / f"mmproj-{q}.gguf", q) for q in ("f32", "f16", "q8_0")}


def encode_in_threads(encode, names: list, copies: int = 2) -> dict:
    """{name: encode(name)} with each name encoded `copies` times at once from as many threads (the last result
    kept); the first exception any of them raised is raised."""
    import threading
    errors, got = [], {}

    def one(name):
        try:
            got[name] = encode(name)
        except Exception as e:      # noqa: BLE001 - raised below
            errors.append(e)
    threads = [threading.Thread(target=one, args=(n,)) for n in list(names) * copies]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return got


EXACT = 1e-4        # transformers in float32 (eager attention) against our float32 paths


def fixture(folder: str) -> tuple[Path, dict]:
    """(the directory, its reference.json) of a tiny vision fixture under tests/fixtures/reference/tiny."""
    tiny = Path(__file__).parent / "fixtures/reference/tiny" / folder
    return tiny, json.loads((tiny / "reference.json").read_text(encoding="utf-8"))


def within(hidden: list, rows: list, budget_hidden: float, budget_rows: float) -> dict:
    """The worst of each list of errors, asserted within its budget."""
    worst = {"hidden": float(max(hidden)), "rows": float(max(rows))}
    assert worst["hidden"] <= budget_hidden and worst["rows"] <= budget_rows, worst
    return worst
