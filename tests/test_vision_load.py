"""llambda.load() and the vision tower: found in the model's own files, given as llama.cpp's mmproj, or not
loaded (vision=False); a tower that does not fit leaves a text model with a warning, an asked-for one that
does not fit fails the load."""
from __future__ import annotations

import json
import shutil
import warnings

import numpy as np
import pytest

import llambda
from llambda.errors import InvalidInputError, LlambdaWarning
from llambda.vision.mmproj import write_mmproj

import test_vlm as vlm  # noqa: E402  (the fixture folder, its images, a folder with a tokenizer)

TINY = vlm.FOLDER
REF = vlm.REF
TEXT_ONLY = TINY.parent / "gemma3"          # the text-only tiny Gemma 3: no vision_config


def _soft_tokens(model, name: str) -> np.ndarray:
    t = model.vision
    return t.encode(t.pixels((TINY / name).read_bytes()))[0]


def test_the_folders_own_tower_is_attached():
    with llambda.load(TINY, backend="numpy", n_ctx=64) as m:
        assert m.accepts_images
        got = _soft_tokens(m, "image_a.png")
        assert np.abs(got - np.array(REF["images"]["image_a.png"]["soft_tokens"])).max() < 1e-4
        tower = m.vision
    assert tower.closed                      # the model owned it


def test_vision_false_loads_no_tower(tmp_path):
    folder = vlm.folder_with_tokenizer(tmp_path / "g", vlm.TEMPLATE)
    with llambda.load(folder, backend="numpy", n_ctx=128, vision=False) as m:
        assert not m.accepts_images and m.vision is None
        img = {"role": "user", "content": [{"type": "image", "image": vlm.PNG["image_a.png"]},
                                           {"type": "text", "text": "hi"}]}
        with pytest.raises(InvalidInputError, match="takes no images"):
            m.chat([img], max_tokens=2)


@pytest.mark.parametrize("qtype, budget", [("f32", 1e-4), ("f16", 2e-2)])
def test_an_mmproj_file_is_the_tower(tmp_path, qtype, budget):
    mmproj = write_mmproj(TINY, tmp_path / f"mmproj-{qtype}.gguf", qtype)
    with llambda.load(TINY, backend="numpy", n_ctx=64, mmproj=mmproj) as m:
        assert m.accepts_images
        got = _soft_tokens(m, "image_b.png")
        assert np.abs(got - np.array(REF["images"]["image_b.png"]["soft_tokens"])).max() < budget


def test_an_mmproj_without_a_tower_fails_the_load():
    with pytest.raises(InvalidInputError, match="holds no vision tower"):
        llambda.load(TINY, backend="numpy", n_ctx=64, mmproj=TEXT_ONLY)


@pytest.mark.parametrize("kw, msg", [({"mmproj": 3}, "mmproj must be a path"), ({"vision": "yes"}, "vision must be")])
def test_bad_vision_arguments(kw, msg):
    with pytest.raises(InvalidInputError, match=msg):
        llambda.load(TINY, backend="numpy", n_ctx=64, **kw)


def test_a_broken_tower_of_the_models_own_files_leaves_a_text_model(tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(TINY, broken)
    cfg = json.loads((broken / "config.json").read_text())
    cfg["vision_config"]["patch_size"] = 5            # 32 x 32 images do not cut into 5 x 5 patches
    (broken / "config.json").write_text(json.dumps(cfg))
    ids = REF["inputs"][0]["input_ids"][:5]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m = llambda.load(broken, backend="numpy", n_ctx=64)
    with m, llambda.load(TINY, backend="numpy", n_ctx=64, vision=False) as text:
        assert not m.accepts_images
        assert any(issubclass(w.category, LlambdaWarning) and "text only" in str(w.message) for w in caught)
        np.testing.assert_array_equal(m.logits(ids), text.logits(ids))


def test_attaching_another_tower_closes_the_one_it_replaces():
    with llambda.load(TINY, backend="numpy", n_ctx=64) as m:
        first = m.vision
        m.attach_vision(vlm.FixtureTower(), load_image=vlm.FixtureTower.load_image)
        assert first.closed and not m.vision.closed
        m.attach_vision(None)
        assert not m.accepts_images


def test_run_takes_an_mmproj(tmp_path, capsys):
    """`llambda run -m MODEL --mmproj FILE --image IMG`: the tower of the file, the reply Model.chat gives."""
    from llambda import cli
    folder = vlm.folder_with_tokenizer(tmp_path / "g", vlm.TEMPLATE)
    mmproj = write_mmproj(TINY, tmp_path / "mmproj.gguf", "f32")
    (tmp_path / "a.png").write_bytes(vlm.PNG["image_a.png"])
    with llambda.load(folder, backend="numpy", n_ctx=128, vision=False, mmproj=None) as m:
        assert not m.accepts_images
    with llambda.load(folder, backend="numpy", n_ctx=128, mmproj=mmproj) as m:
        want = m.chat([{"role": "user", "content": [{"type": "image", "image": vlm.PNG["image_a.png"]},
                                                    {"type": "text", "text": "Look:"}]}],
                      max_tokens=6, temperature=0, ignore_eos=True)
    assert cli.main(["run", "-m", str(folder), "--backend", "numpy", "-c", "128", "--mmproj", str(mmproj),
                     "--image", str(tmp_path / "a.png"), "--temperature", "0", "-n", "6", "--ignore-eos",
                     "Look:"]) == 0
    assert capsys.readouterr().out == want + "\n"
