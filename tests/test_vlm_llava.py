"""LLaVA 1.5 on the language model's side: the template's `<image>` expanded to the tower's 16 `<image>` tokens
whose embeddings are the projector's rows, causal attention over everything; the whole model (llambda.load of the
HF directory with its own tower) through Model.chat against the tiny LlavaForConditionalGeneration of
tests/fixtures/reference/tiny/llava_vision (transformers' input_ids, logits and greedy tokens; tools/make_tiny_llava.py);
llama.cpp's layout (a text GGUF and an mlp mmproj, both written by llambda) loaded with mmproj=."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import llambda
from llambda.errors import InvalidInputError, ModelFormatError
from llambda.models import llava as llava_model
from llambda.models.llava_images import LlavaTokens

import archkit  # noqa: E402  (load on a mode's backend)
import test_vlm as vlm  # noqa: E402  (rows_logits)

FOLDER = Path(__file__).parent / "fixtures" / "reference" / "tiny" / "llava_vision"
REF = json.loads((FOLDER / "reference.json").read_text(encoding="utf-8"))
SOFT, PER = REF["image_token_id"], REF["tokens_per_image"]
PNG = {name: (FOLDER / name).read_bytes() for name in REF["images"]}
TWO, ONE = REF["prompts"]

# (backend, activations, budget of max |logit diff|): float32 everywhere within test_vlm's exact budget; the
# native default (bfloat16 tower products, q8 text activations) within Gemma 3's whole-model 0.1 (measured 0.039)
REAL = {"numpy": 1e-4, "native-exact": 1e-4, "native-fast": 0.1}


def load(mode: str, folder=FOLDER, **kw):
    """The folder (or a GGUF) on a mode's backend (archkit's, skipped where the C core is not built)."""
    return archkit.load(folder, mode, **{"n_ctx": 128, **kw})


def messages(prompt: dict) -> list:
    """The reference's messages, each image part holding the bytes of its file (prompt["images"], in order)."""
    images = {i: PNG[n] for i, n in enumerate(prompt["images"])}
    k = iter(range(len(images)))
    return [dict(msg, content=[dict(p) if p["type"] != "image" else {"type": "image", "image": images[next(k)]}
                               for p in msg["content"]]) for msg in prompt["messages"]]


def check_whole_model(m, prompt: dict, budget: float) -> None:
    """Model.chat on the reference's messages: the template's text, the processor's ids, the logits at the
    reference's rows, every position's argmax, the greedy tokens."""
    msgs = messages(prompt)
    text = m.render_chat(msgs)
    assert text == prompt["chat_text"]
    ids, blocks = m.image_prompt(text, [PNG[n] for n in prompt["images"]])
    assert ids == prompt["input_ids"]
    assert len(blocks) == len(prompt["images"]) and all(b.causal and len(b.rows) == PER for b in blocks)
    got = vlm.rows_logits(m, prompt, blocks)
    err = float(np.abs(got[prompt["rows"]] - np.load(FOLDER / prompt["logits_rows"])).max())
    assert err <= budget, f"max |logit diff| {err:.3g} > {budget}"
    assert got.argmax(axis=1).tolist() == prompt["argmax_per_position"]
    n = len(prompt["greedy_new_tokens"])
    tokens = [ev.token for ev in m.chat_stream(msgs, max_tokens=n, temperature=0, ignore_eos=True) if ev.token >= 0]
    assert tokens == prompt["greedy_new_tokens"]
    assert m.chat(msgs, max_tokens=n, temperature=0, ignore_eos=True) == m.tokenizer.decode(tokens)


@pytest.mark.parametrize("mode", list(REAL))
def test_whole_model_with_its_own_tower_matches_transformers(mode):
    """llambda.load finds the folder's LLaVA tower: two images in one turn, and one image after text, give
    transformers' ids, logits and greedy tokens."""
    with load(mode) as m:
        assert m.accepts_images and m.vision.family == "llava" and m.vision.attends == "causal"
        assert m.image_marker == "<image>" and m.image_block_tokens == 0 and m.config.arch == "llama"
        for prompt in (TWO, ONE):
            check_whole_model(m, prompt, REAL[mode])


def test_prefill_chunks_may_end_inside_an_image():
    """Causal attention over the image tokens: a prompt prefilled 5 tokens a forward gives the same answer."""
    with load("numpy", max_batch=5) as m:
        n = len(TWO["greedy_new_tokens"])
        tokens = [ev.token for ev in m.chat_stream(messages(TWO), max_tokens=n, temperature=0, ignore_eos=True)
                  if ev.token >= 0]
        assert tokens == TWO["greedy_new_tokens"]


def test_images_sent_again_are_not_encoded_again():
    with load("numpy") as m:
        msgs = messages(ONE)
        first = m.chat(msgs, max_tokens=3, temperature=0, ignore_eos=True)
        encoded = len(m.image_input.encoded)
        assert m.chat(msgs, max_tokens=3, temperature=0, ignore_eos=True) == first
        assert len(m.image_input.encoded) == encoded == 1


def test_image_text_is_the_processor_expansion():
    t = LlavaTokens(SOFT, "<image>")
    assert t.expand("a <image>\nb <image>", [(0, 0), (0, 0)], 3) == "a <image><image><image>\nb <image><image><image>"
    ids, starts = t.place([5, SOFT, SOFT, SOFT, SOFT, SOFT, SOFT, 7], 3, [(0, 0), (0, 0)])
    assert starts == [(1,), (4,)]          # two images side by side: one run, cut in two
    for bad in ([5, SOFT, SOFT, 7], [SOFT] * 4, [SOFT, SOFT, SOFT, 1, SOFT]):
        with pytest.raises(InvalidInputError, match=r"runs of \[3\]"):
            t.place(bad, 3, [(0, 0)])
    with pytest.raises(InvalidInputError, match="image markers"):
        t.expand("no marker", [(0, 0)], 3)
    nxt = LlavaTokens(SOFT, "<image>", "llava_next")        # LLaVA-NeXT: the base's 3 and 2 rows of 2 + newline
    assert nxt.count(2, 2, 3) == 9 and nxt.expand("<image>", [(2, 2)], 3) == "<image>" * 9
    assert nxt.place([SOFT] * 9 + [SOFT] * 5, 3, [(2, 2), (1, 1)])[1] == [(0,), (9,)]
    with pytest.raises(InvalidInputError):
        nxt.place([SOFT] * 13, 3, [(2, 2), (1, 1)])


def test_bad_image_requests_are_typed_errors():
    a, b = PNG["image_wide.png"], PNG["image_tall.png"]
    marker_typed = [{"role": "user", "content": [{"type": "image", "image": a}, {"type": "text", "text": "<image>"}]}]
    with load("numpy") as m:
        refused = [(m.render_chat(marker_typed), [a], "image markers"),      # the prompt writes <image> itself
                   (TWO["chat_text"], [a], "image markers"),                  # two markers, one image
                   (TWO["chat_text"], [a, b"not an image"], "not in a supported format")]
        for text, images, match in refused:
            with pytest.raises(InvalidInputError, match=match):
                m.image_ids(text, images)
        assert len(m.image_ids(m.render_chat(m.literal(marker_typed)), [a])[1]) == 1     # typed in a message: text
        m.chat(marker_typed, max_tokens=1)
        ids, starts = m.image_ids(TWO["chat_text"], [a, b])
        assert ids == TWO["input_ids"] and len(starts) == 2
        assert m.image_ids(TWO["chat_text"], 2) == (ids, starts)          # a count is enough: 16 tokens each
        blocks = m.encode_images([a, b], starts)
        with pytest.raises(InvalidInputError, match="no image fills"):
            m.generate(ids, images=blocks[:1], max_tokens=1)


def square_png() -> bytes:
    """A 56 x 56 PNG: the tower's own size, so the mmproj's letterbox and the directory's crop give its pixels."""
    import io
    from PIL import Image
    from visionkit import rgb_image
    buf = io.BytesIO()
    Image.fromarray(rgb_image(56, 56)).save(buf, format="PNG")
    return buf.getvalue()


def test_text_gguf_with_our_mmproj_loads_and_matches_the_directory(tmp_path):
    """llama.cpp's layout of a LLaVA (and Ollama's: a model blob and a projector blob): the text model as a plain
    llama GGUF (its <image> found in the vocabulary, no config) and the tower as an mlp mmproj, both written by
    llambda, loaded with mmproj=. An image of the tower's own 56 x 56 (no resize, so the mmproj's letterbox and
    the directory's crop give the same pixels) gives the directory's logits."""
    from llambda.tools.export import export
    from llambda.vision.mmproj import write_mmproj
    square = square_png()
    gg = export(FOLDER, tmp_path / "text.gguf", fmt="gguf")
    proj = write_mmproj(FOLDER, tmp_path / "mmproj.gguf", "f32")
    msgs = [{"role": "user", "content": [{"type": "text", "text": "Describe"}, {"type": "image", "image": square}]}]
    with load("numpy") as hf, load("numpy", folder=gg, mmproj=proj) as m:
        assert m.accepts_images and m.image_marker == "<image>" and m.source.metadata.get("hf.config") is None
        assert m.vision.cfg.preprocess == "letterbox"
        text = ONE["chat_text"]
        want_ids, want_blocks = hf.image_prompt(text, [square])
        ids, blocks = m.image_prompt(text, [square])
        assert ids == want_ids == ONE["input_ids"]
        inp = {"input_ids": ids}
        np.testing.assert_allclose(vlm.rows_logits(m, inp, blocks), vlm.rows_logits(hf, inp, want_blocks),
                                   atol=1e-4, rtol=0)
        assert m.chat(msgs, max_tokens=4, temperature=0, ignore_eos=True) == \
            hf.chat(msgs, max_tokens=4, temperature=0, ignore_eos=True)


def test_a_vocabulary_without_the_image_token_uses_its_unknown_token(tmp_path):
    """A text GGUF whose vocabulary has no <image> and no config (Ollama's llava files, converted from the original
    LLaVA checkpoints): the image's tokens are its <unk> (never in a prompt otherwise), their embeddings the
    tower's rows all the same: the directory's logits at every position."""
    from llambda.tools.export import export
    from llambda.vision.mmproj import write_mmproj
    from visionkit import rewrite_gguf

    def rename(meta):
        tokens = list(meta["tokenizer.ggml.tokens"])
        tokens[SOFT] = "<imagx>"
        meta["tokenizer.ggml.tokens"] = tokens
    gg = rewrite_gguf(export(FOLDER, tmp_path / "text.gguf", fmt="gguf"), tmp_path / "no_image.gguf", meta_edit=rename)
    proj = write_mmproj(FOLDER, tmp_path / "mmproj.gguf", "f32")
    square = square_png()
    with load("numpy") as hf, load("numpy", folder=gg, mmproj=proj) as m:
        assert m.image_marker == "<unk>" and m.image_input.layout.soft == 0
        text = ONE["chat_text"].replace("<image>", "<unk>")
        ids, blocks = m.image_prompt(text, [square])
        want_ids, want_blocks = hf.image_prompt(ONE["chat_text"], [square])
        assert ids == [0 if t == SOFT else t for t in want_ids]
        np.testing.assert_allclose(vlm.rows_logits(m, {"input_ids": ids}, blocks),
                                   vlm.rows_logits(hf, {"input_ids": want_ids}, want_blocks), atol=1e-4, rtol=0)
        with pytest.raises(InvalidInputError, match="image markers"):
            m.image_ids(text, [])
        # a chat template writing LLaVA's <image> for an image part (llava-hf's) reads as the <unk> marker
        assert m.image_prompt(ONE["chat_text"], [square])[0] == ids
        msgs = [{"role": "user", "content": [{"type": "text", "text": "Describe"}, {"type": "image", "image": square}]}]
        assert m.chat(msgs, max_tokens=3, temperature=0, ignore_eos=True) == \
            hf.chat(msgs, max_tokens=3, temperature=0, ignore_eos=True)


def test_a_vocabulary_with_no_image_or_unknown_token_is_a_typed_error(tmp_path):
    """No config, no <image>, no unknown token (a llama-3 vocabulary): the load with mmproj= says so."""
    from llambda.vision.mmproj import write_mmproj
    from test_export import tiny_llama_gguf
    text = tiny_llama_gguf(tmp_path / "text.gguf")
    proj = write_mmproj(FOLDER, tmp_path / "mmproj.gguf", "f32")
    with pytest.raises(InvalidInputError, match="image"):
        llambda.load(text, mmproj=proj, backend="numpy", n_ctx=64)


def test_llava_hf_text_config_without_sizes_takes_the_family_defaults():
    """llava-1.5-7b-hf's text_config holds no hidden_size (LlamaConfig's defaults): filled before the llama
    module reads it; an unknown family without sizes is refused."""
    cfg = {"model_type": "llava", "tie_word_embeddings": False,
           "text_config": {"model_type": "llama", "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
                           "vocab_size": 32064}}
    t = llava_model.text_config(cfg)
    assert (t["hidden_size"], t["intermediate_size"], t["num_hidden_layers"], t["vocab_size"],
            t["max_position_embeddings"], t["rms_norm_eps"]) == (4096, 11008, 32, 32064, 4096, 1e-5)
    c = llava_model.config_from_hf(cfg)
    assert (c.arch, c.d_model, c.n_layers, c.vocab_size) == ("llama", 4096, 32, 32064)
    with pytest.raises(ModelFormatError, match="hidden_size"):
        llava_model.text_config({"text_config": {"model_type": "gpt2"}})
    with pytest.raises(ModelFormatError, match="text_config"):
        llava_model.text_config({"text_config": 3})


@pytest.mark.parametrize("cfg, match", [
    ({"model_type": "llava_next", "hidden_size": 64}, "llava_next config without a text_config"),
    ({"model_type": "llava"}, "llava config without a text_config"),
    ({"model_type": "llava", "text_config": {"model_type": "llava_next", "hidden_size": 64}}, "names no text family"),
    ({"model_type": "llava", "text_config": {"model_type": "llava", "hidden_size": 64}}, "names no text family"),
    ({"model_type": "llava", "text_config": {"model_type": ["llama"]}}, "model_type must be a string"),
])
def test_a_config_whose_text_side_is_llava_again_is_refused(cfg, match):
    """A llava_next config.json without its text_config read itself as its text model, the module calling itself
    until a RecursionError; a text_config of model_type llava_next too, and a list model_type was a TypeError."""
    with pytest.raises(ModelFormatError, match=match):
        llava_model.config_from_hf(cfg)


@pytest.mark.parametrize("kind", [["llava"], {"a": 1}, 7])
def test_a_model_type_that_is_not_a_string_is_a_typed_error(tmp_path, kind):
    """config.json's model_type a list beside a vision_config: the tower's lookup (`kind in` a set) raised a bare
    TypeError (unhashable type) out of llambda.load. Now the tower is refused by name (its text_config still
    names the text model): the model loads for text only, with the warning saying why."""
    from llambda.errors import LlambdaWarning
    from visionkit import copy_fixture
    folder = copy_fixture(FOLDER, tmp_path / "m", config_edit=lambda c: c.update(model_type=kind))
    with pytest.warns(LlambdaWarning, match="model_type must be a string"):
        with llambda.load(folder, backend="numpy", n_ctx=64) as m:
            assert m.image_marker is None
            with pytest.raises(ModelFormatError, match="model_type must be a string"):
                from llambda.vision.load import open_layout
                open_layout(folder)

