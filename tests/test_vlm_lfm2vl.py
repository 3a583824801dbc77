"""Images on the language model's side, LFM2-VL: each image one crop (or tiles plus a thumbnail), a run of `<image>`
tokens per crop between `<|image_start|>` / `<|img_row_R_col_C|>` / `<|img_thumbnail|>` / `<|image_end|>` markers,
the projector's rows over their embeddings, attention causal over an LFM2 text model (short convolutions and
attention); against the tiny Lfm2VlForConditionalGeneration of tests/fixtures/reference/tiny/lfm2vl_vision
(transformers' input_ids, logits and greedy tokens; tools/make_tiny_lfm2vl.py), with the folder's own tower
(llambda.vision's LFM2-VL tower, found by llambda.load)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import llambda
from llambda.backends import available_backends
from llambda.errors import InvalidInputError
from llambda.models import images as image_mod
from llambda.models.lfm2vl_images import Lfm2VlTokens

sys.path.insert(0, str(Path(__file__).parent))
import test_vlm as vlm  # noqa: E402  (the scheduler helpers, the modes)
import visionkit  # noqa: E402

FOLDER, REF = visionkit.fixture("lfm2vl_vision")
SOFT = REF["image_token_id"]
PNG = {name: (FOLDER / name).read_bytes() for name in REF["images"]}
ONE, TWO = REF["prompts"]           # one unsplit image; a tiled image (1 x 2 + thumbnail) and a small one
MODES = vlm.MODES
# our Pillow resize is within one level of transformers' torch resize on a few values (test_vision_lfm2vl): the
# logits through our own pixels move by that much more than the exact modes' float error (seen: 2.3e-3)
OWN_PIXELS = 1e-2
TOWER_BF16 = 0.15       # the native default's bfloat16 tower too (its rows within 0.02: test_vision_lfm2vl; seen 0.057)


def npy(name: str) -> np.ndarray:
    return np.load(FOLDER / name)


def load(mode: str, **kw):
    backend, activations, _ = MODES[mode]
    if backend not in available_backends():
        pytest.skip(f"the {backend} backend is not available here (C core not built)")
    return llambda.load(FOLDER, backend=backend, activations=activations, **{"n_ctx": 256, **kw})


def messages(prompt: dict) -> list:
    files = iter(prompt["images"])
    return [{**msg, "content": [{"type": "image", "image": PNG[next(files)]} if p["type"] == "image" else dict(p)
                                for p in msg["content"]]} for msg in prompt["messages"]]


def reference_blocks(prompt: dict) -> tuple:
    """The prompt's blocks with transformers' own projector rows, one per run of soft tokens."""
    ids = np.asarray(prompt["input_ids"])
    starts = [i for i in range(len(ids)) if ids[i] == SOFT and (i == 0 or ids[i - 1] != SOFT)]
    rows = [npy(c["rows"]) for n in prompt["images"] for c in REF["images"][n]["crops"]]
    assert len(starts) == len(rows)
    return tuple(image_mod.image_block(s, r, causal=True) for s, r in zip(starts, rows))


@pytest.mark.parametrize("mode", list(MODES))
def test_logits_with_transformers_rows_match(mode):
    """The language side alone: transformers' projector rows over the prompt's runs give its logits."""
    with load(mode, vision=False) as m:
        for prompt in (ONE, TWO):
            got = vlm.rows_logits(m, prompt, reference_blocks(prompt))
            err = float(np.abs(got[prompt["rows"]] - npy(prompt["logits_rows"])).max())
            assert err <= MODES[mode][2], f"max |logit diff| {err:.3g}"
            assert got.argmax(axis=1).tolist() == prompt["argmax_per_position"]


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("which", ["one image", "tiled and small images"])
def test_chat_gives_the_processor_ids_the_logits_and_the_greedy_tokens(mode, which):
    """Model.chat with image parts and the folder's own tower: the chat template's text, the processor's input_ids
    (each image's tiles and thumbnail from its header's size), the logits at the reference's rows, the greedy reply."""
    prompt = ONE if which == "one image" else TWO
    with load(mode) as m:
        assert (m.accepts_images, m.image_marker, m.image_block_tokens) == (True, "<image>", 0)
        msgs = messages(prompt)
        assert m.render_chat(msgs) == prompt["chat_text"]
        ids, blocks = m.image_prompt(prompt["chat_text"], [PNG[n] for n in prompt["images"]])
        assert ids == prompt["input_ids"]
        assert len(blocks) == sum(len(REF["images"][n]["crops"]) for n in prompt["images"])
        assert all(b.causal for b in blocks)
        got = vlm.rows_logits(m, prompt, blocks)
        err = float(np.abs(got[prompt["rows"]] - npy(prompt["logits_rows"])).max())
        assert err <= (TOWER_BF16 if mode == "native-fast" else OWN_PIXELS), f"max |logit diff| {err:.3g}"
        n = len(prompt["greedy_new_tokens"])
        tokens = [ev.token for ev in m.chat_stream(msgs, max_tokens=n, temperature=0, ignore_eos=True)
                  if ev.token >= 0]
        assert tokens == prompt["greedy_new_tokens"]
        assert m.chat(msgs, max_tokens=n, temperature=0, ignore_eos=True) == m.tokenizer.decode(tokens)


@pytest.mark.parametrize("max_batch", [5, 16])
def test_prefill_chunks_may_end_inside_a_crop(max_batch):
    """Causal runs over conv and attention layers: chunks shorter than a crop give the same greedy tokens."""
    with load("native-exact", max_batch=max_batch) as m:
        ids, blocks = m.image_prompt(TWO["chat_text"], [PNG[n] for n in TWO["images"]])
        got = list(m.generate(ids, images=blocks, max_tokens=len(TWO["greedy_new_tokens"]), temperature=0,
                              ignore_eos=True))
        assert got == TWO["greedy_new_tokens"]


def test_scheduler_with_images_beside_text():
    rng = np.random.default_rng(7)
    texts = [rng.integers(30, 440, size=n).tolist() for n in (23, 9)]
    ids, blocks = TWO["input_ids"], reference_blocks(TWO)
    with load("native-exact", n_slots=4, max_batch=96, vision=False) as m:
        alone = vlm.scheduler_run(m, [[(ids, blocks, 8)]], prefill_chunk=256)[0][0][0]
        assert [t for t, _, _ in alone] == TWO["greedy_new_tokens"]
        for chunk in (3, 17):
            runs = vlm.scheduler_run(m, [[(texts[0], (), 8), (ids, blocks, 8), (texts[1], (), 8)]],
                                     prefill_chunk=chunk)[0]
            assert [t for t, _, _ in runs[1][0]] == TWO["greedy_new_tokens"], chunk


def test_image_text_is_the_processor_expansion():
    layout = Lfm2VlTokens(SOFT, tile_tokens=16)
    for prompt in (ONE, TWO):
        with load("numpy") as m:
            grids = m.image_input.grids([PNG[n] for n in prompt["images"]])
        assert layout.expand(prompt["chat_text"], grids) == prompt["prompt_text"]
    assert Lfm2VlTokens(SOFT, tile_tokens=2, thumbnail=False).image_text(1, 2, 1, 1) == (
        "<|image_start|><|img_row_1_col_1|><image><image><|img_row_1_col_2|><image><image><|image_end|>")


def thin_png() -> bytes:
    import io

    from PIL import Image
    out = io.BytesIO()
    Image.fromarray(visionkit.rgb_image(2, 300), "RGB").save(out, format="PNG")
    return out.getvalue()


def test_bad_image_requests_are_typed_errors():
    with load("numpy") as m:
        a, b = PNG["image_large.png"], PNG["image_small.png"]
        typed = [{"role": "user", "content": [{"type": "image", "image": a}, {"type": "text", "text": "<image>"}]}]
        with pytest.raises(InvalidInputError, match="image markers"):    # a prompt that writes <image> itself
            m.image_ids(m.render_chat(typed), [a])
        assert len(m.image_ids(m.render_chat(m.literal(typed)), [a])[1]) == 1     # typed in a message: text
        m.chat(typed, max_tokens=1)
        with pytest.raises(InvalidInputError, match="sizes"):           # a count says no grid
            m.image_ids(TWO["chat_text"], 2)
        ids, starts = m.image_ids(TWO["chat_text"], [a, b])
        assert ids == TWO["input_ids"] and [len(s) for s in starts] == [3, 1]
        with pytest.raises(InvalidInputError, match="crop"):            # starts that are not this image's
            m.encode_images([a, b], [starts[0][:2], starts[1]])
        with pytest.raises(InvalidInputError, match="not in a supported format"):
            m.image_ids(TWO["chat_text"], [a, b"not an image"])
        with pytest.raises(InvalidInputError, match="no image fills"):
            m.generate(TWO["input_ids"], images=reference_blocks(TWO)[:-1], max_tokens=1)
        with pytest.raises(InvalidInputError, match="too thin"):           # past the patches a crop may have
            m.chat([{"role": "user", "content": [{"type": "image", "image": thin_png()}]}], max_tokens=1)
        with pytest.raises(InvalidInputError, match="causal"):          # a block attending both ways: not here
            blk = reference_blocks(ONE)[0]
            list(m.generate(ONE["input_ids"], images=(image_mod.image_block(blk.start, blk.rows, False),),
                            max_tokens=1))


def test_the_text_model_alone_loads_and_refuses_images():
    with load("numpy", vision=False) as m:
        assert not m.accepts_images
        assert m.chat([{"role": "user", "content": "hi"}], max_tokens=2, temperature=0) is not None
        with pytest.raises(InvalidInputError):
            m.chat(messages(ONE), max_tokens=1)


def test_text_gguf_with_our_mmproj_matches_transformers(tmp_path):
    """llama.cpp's layout of LFM2-VL: the text model as an lfm2 GGUF (its <image> found in the vocabulary) and the
    tower as an lfm2 mmproj (both written by llambda; the mmproj keeps the directory's processor settings under our
    own keys), loaded with mmproj=: the reference's ids and greedy tokens, its logits within OWN_PIXELS."""
    from llambda.formats.gguf import GGUFFile
    from llambda.tools.export import export
    from llambda.vision.mmproj import write_mmproj
    gg = export(FOLDER, tmp_path / "text.gguf", fmt="gguf")
    with GGUFFile(gg) as f:
        assert f.metadata["general.architecture"] == "lfm2"
    proj = write_mmproj(FOLDER, tmp_path / "mmproj.gguf", "f32")
    with llambda.load(gg, mmproj=proj, backend="numpy", n_ctx=256) as m:
        assert m.accepts_images and m.image_marker == "<image>"
        ids, blocks = m.image_prompt(TWO["chat_text"], [PNG[n] for n in TWO["images"]])
        assert ids == TWO["input_ids"]
        got = vlm.rows_logits(m, TWO, blocks)
        assert float(np.abs(got[TWO["rows"]] - npy(TWO["logits_rows"])).max()) <= OWN_PIXELS
        tokens = list(m.generate(ids, images=blocks, max_tokens=len(TWO["greedy_new_tokens"]), temperature=0,
                                 ignore_eos=True))
        assert tokens == TWO["greedy_new_tokens"]


def test_a_second_turn_equals_a_fresh_model():
    """A conversation's second turn (its first turn's images sent again: their rows reused, the hybrid's state
    resumed where it is) gives the answer a fresh model gives to the whole conversation."""
    msgs = messages(TWO)
    with load("native-exact") as m:
        first = m.chat(msgs, max_tokens=8, temperature=0, ignore_eos=True)
        assert m.chat(msgs, max_tokens=8, temperature=0, ignore_eos=True) == first
        more = msgs + [{"role": "assistant", "content": first}, {"role": "user", "content": [
            {"type": "image", "image": PNG["image_mid.png"]}, {"type": "text", "text": "and this?"}]}]
        second = m.chat(more, max_tokens=8, temperature=0, ignore_eos=True)
    with load("native-exact") as fresh:
        assert fresh.chat(more, max_tokens=8, temperature=0, ignore_eos=True) == second
