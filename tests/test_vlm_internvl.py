"""Images on the language model's side, InternVL 3 / 3.5: each image's tiles (a grid plus a thumbnail, or one tile)
as one run of `<IMG_CONTEXT>` soft tokens between `<img>` and `</img>`, one block per tile, attention causal over
everything; through Model.chat with the model's own tower (llambda.vision's InternVL, found by llambda.load) against
the tiny InternVLForConditionalGeneration of tests/fixtures/reference/tiny/internvl_vision (transformers' input_ids,
logits and greedy tokens; tools/make_tiny_internvl.py). The tower alone is tested in test_vision_internvl.py."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import llambda
from llambda.backends import available_backends
from llambda.errors import InvalidInputError
from llambda.models.internvl_tokens import InternVLTokens

import test_vlm as vlm  # noqa: E402  (rows_logits, the modes and budgets)

FOLDER = Path(__file__).parent / "fixtures" / "reference" / "tiny" / "internvl_vision"
REF = json.loads((FOLDER / "reference.json").read_text(encoding="utf-8"))
PNG = {name: (FOLDER / name).read_bytes() for name in REF["images"]}
PER = REF["image_seq_length"]
TWO, ONE = REF["prompts"]           # two images (3 x 1 tiles + thumbnail, 1 x 2 + thumbnail); one tile alone
# (backend, activations, budget): the tower's float32 rows give transformers' logits within test_vlm's exact
# budget; the native default (bfloat16 tower products, q8 text activations) within Gemma 3's whole-model 0.1
# (measured 0.029), as test_vlm_idefics3's real-tower tests
MODES = {**vlm.MODES, "native-fast": ("native", "q8", 0.1)}


def load(mode: str, folder: Path = FOLDER):
    """The folder's model with its own tower, in `mode` (MODES'); a skip where that backend is not built."""
    backend, activations, _ = MODES[mode]
    if backend in available_backends():
        return llambda.load(folder, backend=backend, activations=activations, n_ctx=256)
    pytest.skip(f"the {backend} backend is not available here (C core not built)")


def messages(prompt: dict) -> list:
    """The reference's messages, its image parts given the bytes of the prompt's images in turn."""
    images = [PNG[n] for n in prompt["images"]][::-1]

    def part(p: dict) -> dict:
        return {"type": "image", "image": images.pop()} if p["type"] == "image" else dict(p)
    return [dict(msg, content=list(map(part, msg["content"]))) for msg in prompt["messages"]]


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("which", ["two tiled images", "one tile"])
def test_chat_gives_the_processor_ids_the_logits_and_the_greedy_tokens(mode, which):
    """The chat template's text, the processor's input_ids (the tile grid from each image's header size), the
    logits at the reference's rows, every position's argmax, and Model.chat's greedy answer."""
    prompt = TWO if which.startswith("two") else ONE
    budget = MODES[mode][2]
    with load(mode) as m:
        assert m.accepts_images and m.image_marker == "<IMG_CONTEXT>" and m.image_block_tokens == 0
        assert m.vision.family == "internvl"
        msgs = messages(prompt)
        text = m.render_chat(msgs)
        assert text == prompt["chat_text"]
        ids, blocks = m.image_prompt(text, [PNG[n] for n in prompt["images"]])
        assert ids == prompt["input_ids"]
        assert len(blocks) == sum(REF["images"][n]["n_tiles"] for n in prompt["images"])
        assert all(b.causal and len(b.rows) == PER for b in blocks)
        logits = vlm.rows_logits(m, prompt, blocks)
        want = np.load(FOLDER / prompt["logits_rows"])
        worst = float(np.max(np.abs(logits[prompt["rows"]] - want)))
        assert worst <= budget, f"max |logit diff| {worst:.3g} > {budget}"
        assert np.argmax(logits, axis=1).tolist() == prompt["argmax_per_position"]
        n = len(prompt["greedy_new_tokens"])
        streamed = [ev.token for ev in m.chat_stream(msgs, max_tokens=n, temperature=0, ignore_eos=True)]
        assert [t for t in streamed if t >= 0] == prompt["greedy_new_tokens"]
        answer = m.chat(msgs, max_tokens=n, temperature=0, ignore_eos=True)
        assert answer == m.tokenizer.decode(prompt["greedy_new_tokens"])


def test_the_layout_expands_and_places_as_the_processor():
    ids = REF["special_token_ids"]
    t = InternVLTokens(ids["<img>"], ids["<IMG_CONTEXT>"], ids["</img>"], "<img>", "<IMG_CONTEXT>", "</img>")
    text = t.expand("a<IMG_CONTEXT>\nb<IMG_CONTEXT>\n", [(1, 3), (0, 0)], PER)
    assert text == ("a<img>" + "<IMG_CONTEXT>" * (4 * PER) + "</img>\nb<img>" + "<IMG_CONTEXT>" * PER + "</img>\n")
    s, c, e = ids["<img>"], ids["<IMG_CONTEXT>"], ids["</img>"]
    seq = [9, s] + [c] * (4 * PER) + [e, 9, s] + [c] * PER + [e, 9]
    _, starts = t.place(seq, PER, [(1, 3), (0, 0)])
    assert starts == [tuple(2 + PER * k for k in range(4)), (2 + 4 * PER + 3,)]
    with pytest.raises(InvalidInputError):          # a run one token short
        t.place(seq[:3] + seq[4:], PER, [(1, 3), (0, 0)])
    with pytest.raises(InvalidInputError):          # one marker for two images
        t.expand("a<IMG_CONTEXT>", [(0, 0), (0, 0)], PER)


def test_soft_tokens_without_an_image_are_refused():
    """Token ids that hold <IMG_CONTEXT> with no image's rows over them (a client sending ids) are refused, not run
    over the token's own embedding."""
    soft = REF["image_token_id"]
    with load("numpy") as m:
        with pytest.raises(InvalidInputError):
            m.check_prompt_images([1, 3, soft, soft, soft, soft, 4, 2], ())


def test_text_gguf_with_our_mmproj_matches_transformers(tmp_path):
    """llama.cpp's layout of InternVL: the text model as its qwen2 GGUF (the image tokens found in the vocabulary:
    no config) and the tower as an internvl mmproj, both written by llambda and loaded with mmproj=: the
    reference's ids and logits again."""
    from llambda.formats.gguf import GGUFFile
    from llambda.tools.export import export
    from llambda.vision.mmproj import write_mmproj
    text = export(FOLDER, tmp_path / "text.gguf", fmt="gguf")
    with GGUFFile(text) as f:
        assert f.metadata["general.architecture"] == "qwen2"
    proj = write_mmproj(FOLDER, tmp_path / "mmproj.gguf", "f32")
    with llambda.load(text, mmproj=proj, backend="numpy", n_ctx=256) as m:
        assert m.accepts_images and m.image_marker == "<IMG_CONTEXT>" and m.source.metadata.get("hf.config") is None
        for prompt in (TWO, ONE):
            ids, blocks = m.image_prompt(prompt["chat_text"], [PNG[n] for n in prompt["images"]])
            assert ids == prompt["input_ids"]
            logits = vlm.rows_logits(m, prompt, blocks)[prompt["rows"]]
            assert float(np.max(np.abs(logits - np.load(FOLDER / prompt["logits_rows"])))) <= 1e-4


def test_internvl_chat_directory_matches_transformers(tmp_path):
    """OpenGVLab's remote-code layout of the same weights (model_type internvl_chat: llm_config, language_model.*,
    vision_model.*, mlp1.*; test_vision_internvl.chat_layout writes it): the text model and the tower load, the
    image tokens come from the vocabulary (no image_token_id), and both prompts give transformers' ids and logits."""
    from test_vision_internvl import chat_layout
    d = chat_layout(FOLDER, tmp_path / "chat")
    with llambda.load(d, backend="numpy", n_ctx=256) as m:
        assert m.accepts_images and m.vision.family == "internvl" and m.config.arch == "qwen2"
        for prompt in (TWO, ONE):
            ids, blocks = m.image_prompt(m.render_chat(messages(prompt)), [PNG[n] for n in prompt["images"]])
            assert ids == prompt["input_ids"]
            logits = vlm.rows_logits(m, prompt, blocks)[prompt["rows"]]
            assert float(np.max(np.abs(logits - np.load(FOLDER / prompt["logits_rows"])))) <= 1e-4


def test_an_image_token_id_outside_the_vocabulary_loads_for_text_only(tmp_path):
    """config.json's image_token_id past the embeddings: a warning saying so, and the model loads for text only
    (never a crash, never an image over a wrong row)."""
    import shutil
    import warnings
    d = tmp_path / "bad"
    shutil.copytree(FOLDER, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["image_token_id"] = 10 ** 6
    (d / "config.json").write_text(json.dumps(cfg))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m = llambda.load(d, backend="numpy", n_ctx=256)
    with m:
        assert not m.accepts_images
        assert any("outside" in str(w.message) for w in caught)


QWEN3 = FOLDER.parent / "internvl_qwen3_vision"      # InternVL 3.5's shape: the same tower, a Qwen3 text model


@pytest.mark.parametrize("mode", list(MODES))
def test_a_qwen3_text_model_matches_transformers(mode):
    """InternVL 3.5 (text_config qwen3): both prompts give transformers' ids and logits; in the float32 modes also
    every argmax and the greedy tokens (the two-image prompt's smallest greedy margin is 0.012, under the native
    default's budget: there only the logits are held to it)."""
    budget = MODES[mode][2]
    ref = json.loads((QWEN3 / "reference.json").read_text(encoding="utf-8"))
    with load(mode, QWEN3) as m:
        assert m.accepts_images and m.config.arch == "qwen3"
        for prompt in ref["prompts"]:
            msgs = messages(prompt)
            ids, blocks = m.image_prompt(m.render_chat(msgs), [PNG[n] for n in prompt["images"]])
            assert ids == prompt["input_ids"]
            logits = vlm.rows_logits(m, prompt, blocks)
            worst = float(np.max(np.abs(logits[prompt["rows"]] - np.load(QWEN3 / prompt["logits_rows"]))))
            assert worst <= budget, f"max |logit diff| {worst:.3g} > {budget}"
            if budget <= 1e-4:
                assert np.argmax(logits, axis=1).tolist() == prompt["argmax_per_position"]
                n = len(prompt["greedy_new_tokens"])
                tokens = [ev.token for ev in m.chat_stream(msgs, max_tokens=n, temperature=0, ignore_eos=True)]
                assert [t for t in tokens if t >= 0] == prompt["greedy_new_tokens"]
