"""Images on the language model's side, GLM-4.1V / GLM-4.6V (model_type glm4v): GLM-4's text layers with M-RoPE
over adjacent pairs of a partial rotary (three contiguous sections), Qwen2-VL's image layout and positions under
GLM's tokens (`<|begin_of_image|>`, gh * gw `<|image|>`, `<|end_of_image|>`).

Checked against transformers' tiny Glm4vForConditionalGeneration (tests/fixtures/reference/tiny/glm4v_vision,
tools/make_tiny_glm4v.py): the chat's ids, positions, logits and greedy tokens with a tower double serving the
reference's rows, and with the folder's own tower; the text-only prompt; the server's image content."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from llambda.errors import ModelFormatError
from llambda.models.images import QwenTokens

import test_vlm_qwen25vl as q25  # noqa: E402  (the Qwen-VL checks this layout shares)
from visionkit import copy_fixture

FOLDER = Path(__file__).parent / "fixtures" / "reference" / "tiny" / "glm4v_vision"
REF = json.loads((FOLDER / "reference.json").read_text(encoding="utf-8"))
FIX_PNG = {name: (FOLDER / name).read_bytes() for name in REF["images"]}
TWO = REF["prompts"][0]                 # two images (merged grids 3 x 5 and 3 x 4), text after each
TEXT = REF["text_only"]
MODES = q25.MODES
BUDGET = q25.BUDGET
# with its own tower: the native default's bfloat16 tower gives rows within about 1e-2 of transformers' (relative:
# two blocks, the downsample and the merger's four products each round their activations once), which moves the
# logits (at most 4.2 here) by up to 0.11 on this fixture; the greedy tokens stay transformers'
REAL = {**q25.REAL, "native-fast": ("native", None, 0.2)}


class GlmFixtureTower(q25.FixtureTower):
    """test_vlm_qwen25vl's fixture double serving this fixture's rows, as the glm4v family."""
    family, folder, ref, files = "glm4v", FOLDER, REF, FIX_PNG
    hidden = REF["config"]["text_config"]["hidden_size"]


def fixture_model(mode: str, **kw):
    return q25.load(FOLDER, mode, GlmFixtureTower, **{"n_ctx": 128, **kw})


def test_the_folder_reads_as_glm4v_with_its_tokens():
    with fixture_model("numpy") as m:
        c = m.config
        assert c.arch == "glm4v" and c.rope_sections == [2, 3, 3] and not c.rope_neox and not c.rope_interleaved
        assert c.rope_dim == 16 and c.head_dim == 32 and c.post_norms and c.attn_bias
        lay = m.image_input.layout
        ids = REF["special_token_ids"]
        assert isinstance(lay, QwenTokens) and lay.family == "glm4v"
        assert (lay.start, lay.soft, lay.end) == (ids["<|begin_of_image|>"], ids["<|image|>"], ids["<|end_of_image|>"])
        assert m.image_marker == "<|begin_of_image|><|image|><|end_of_image|>"


@pytest.mark.parametrize("mode", list(MODES))
def test_chat_gives_the_processor_ids_positions_logits_and_greedy_tokens(mode):
    """With the reference's rows: the template's text, the processor's ids, get_rope_index's positions and
    rope_deltas, the logits at the reference rows, every argmax, the greedy tokens, each decode step's logits."""
    with fixture_model(mode) as m:
        q25.chat_matches_reference(m, TWO, FIX_PNG, FOLDER, BUDGET[mode])


@pytest.mark.parametrize("mode", list(MODES))
def test_text_only_prompt_matches_transformers(mode):
    with fixture_model(mode) as m:
        q25.text_matches_reference(m, TEXT, FOLDER, BUDGET[mode])


@pytest.mark.parametrize("mode", list(REAL))
def test_whole_model_with_its_own_tower_matches_transformers(mode):
    """No double: the folder's own tower decodes, resizes and encodes the images (the native default's bfloat16
    tower within REAL's budget)."""
    with q25.own_tower_model(FOLDER, mode) as m:
        assert m.vision is not None and m.vision.family == "glm4v"
        q25.own_tower_matches_reference(m, TWO, FIX_PNG, FOLDER, REAL[mode][2], [(3, 5), (3, 4)])


def test_chat_with_an_image_part_gives_the_reference_text():
    """Model.chat with image parts (the files' bytes) answers transformers' greedy tokens' text."""
    import llambda
    want = TWO["greedy_new_tokens"]
    with llambda.load(FOLDER, backend="numpy", n_ctx=128) as m:
        text = m.chat(q25.fixture_messages(TWO, FIX_PNG), max_tokens=len(want), temperature=0, ignore_eos=True)
        assert text == m.tokenizer.decode(want)


def test_text_gguf_with_our_mmproj_is_the_checkpoint(tmp_path):
    """llama.cpp's layout: the text model as a glm4 GGUF with rope.dimension_sections (q/k rows half-split in the
    rotated dims, as llama.cpp's converter permutes them; its image tokens found in the vocabulary) and the tower
    as a glm4v mmproj, both written by llambda, loaded with mmproj=: the same ids, grids and logits as the
    checkpoint with its own tower, and transformers' greedy tokens."""
    import llambda
    from llambda.formats.gguf import GGUFFile
    from llambda.tools.export import export
    from llambda.vision.mmproj import write_mmproj
    gg = export(FOLDER, tmp_path / "text.gguf", fmt="gguf")
    proj = write_mmproj(FOLDER, tmp_path / "mmproj.gguf", "f32")
    with GGUFFile(gg) as f:
        assert f.metadata["general.architecture"] == "glm4"
        assert list(f.metadata["glm4.rope.dimension_sections"]) == [2, 3, 3, 0]
        assert int(f.metadata["glm4.rope.dimension_count"]) == 16
    images = [FIX_PNG[n] for n in TWO["images"]]
    out = []
    for path, extra in ((FOLDER, {}), (gg, {"mmproj": proj})):
        with llambda.load(path, backend="numpy", n_ctx=128, **extra) as m:
            assert m.config.arch == "glm4v" and m.config.rope_neox == (path == gg)
            assert m.accepts_images and m.image_marker == "<|begin_of_image|><|image|><|end_of_image|>"
            ids, blocks = m.image_prompt(TWO["chat_text"], images)
            out.append((ids, [b.grid for b in blocks], q25.whole_logits(m, ids, blocks).copy()))
            want = TWO["greedy_new_tokens"]
            assert list(m.generate(ids, images=blocks, max_tokens=len(want), temperature=0, ignore_eos=True)) == want
    (ids_a, grids_a, a), (ids_b, grids_b, b) = out
    assert ids_a == ids_b == TWO["input_ids"] and grids_a == grids_b == [(3, 5), (3, 4)]
    assert float(np.abs(a - b).max()) <= 1e-4


def test_llama_cpp_runs_our_glm4_gguf(tmp_path):
    """llama-cpp-python 0.3.36's libllama loads our glm4 GGUF with M-RoPE sections and its text-only logits are
    transformers' (within test_export's f32 budget for llama.cpp, 0.05): the permuted q/k rows turn as GLM-4's
    adjacent pairs did. (Its image positions are not checked here: that needs libmtmd's whole prompt.)"""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the bench extra)")
    from llamacpp_ref import llama_cpp_logits
    from llambda.tools.export import export
    path = export(FOLDER, tmp_path / "text.gguf", fmt="gguf", qtype="f32")
    want = np.load(FOLDER / TEXT["logits_last3"])[-1]
    theirs = llama_cpp_logits(path, TEXT["input_ids"])
    assert float(np.abs(theirs - want).max()) <= 0.05
    with q25.load(path, "numpy", tower=False) as m:
        assert m.config.arch == "glm4v" and m.tokenize(TEXT["chat_text"]) == TEXT["input_ids"]
        ours = q25.vlm_rows(m, TEXT["input_ids"])[-1]
    assert float(np.abs(ours - want).max()) <= 1e-4


@pytest.mark.parametrize("edit, field", [
    (lambda c: c["text_config"]["rope_parameters"].update(mrope_section=[2, 3, 4]), "rope sections"),
    (lambda c: c["text_config"]["rope_parameters"].pop("mrope_section"), "mrope_section"),
    (lambda c: c["text_config"].update(head_dim=16), "head_dim"),
    (lambda c: c["text_config"]["rope_parameters"].update(partial_rotary_factor=1.5), "partial_rotary_factor"),
])
def test_hostile_text_configs_are_typed_errors(tmp_path, edit, field):
    import llambda
    path = copy_fixture(FOLDER, tmp_path / "bad", config_edit=edit)
    with pytest.raises(ModelFormatError, match=field):
        llambda.load(path, backend="numpy", n_ctx=64, vision=False)


@pytest.mark.parametrize("edit, words", [
    (lambda c: c.update(image_token_id=5000), "image token 5000 is outside"),
    (lambda c: c["vision_config"].update(out_hidden_size=32), "vision_config.out_hidden_size 32"),
])
def test_a_tower_that_cannot_serve_loads_text_only_with_a_warning_naming_why(tmp_path, edit, words):
    import llambda
    path = copy_fixture(FOLDER, tmp_path / "m", config_edit=edit)
    with pytest.warns(llambda.LlambdaWarning, match=words):
        m = llambda.load(path, backend="numpy", n_ctx=64)
    with m:
        assert not m.accepts_images
        assert q25.vlm_rows(m, TEXT["input_ids"]).shape == (len(TEXT["input_ids"]), m.config.vocab_size)


@pytest.mark.parametrize("max_batch", [3, 7])
def test_chunked_prefill_gives_the_greedy_tokens(max_batch):
    """Prefill chunks that cut the images (causal: a chunk may end inside one) keep each token's M-RoPE position."""
    with fixture_model("native-exact", max_batch=max_batch) as m:
        ids, blocks = m.image_prompt(TWO["chat_text"], [FIX_PNG[n] for n in TWO["images"]])
        want = TWO["greedy_new_tokens"]
        assert list(m.generate(ids, images=blocks, max_tokens=len(want), temperature=0, ignore_eos=True)) == want
