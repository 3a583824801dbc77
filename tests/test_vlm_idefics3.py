"""Images on the language model's side, Idefics3 / SmolVLM: each image split into a grid of crops plus the whole
image, a run of `<image>` soft tokens per crop whose embeddings are the connector's rows, attention causal over
everything; through Model.chat, the engine's chunks, the prefix caches and the scheduler, against the tiny
Idefics3ForConditionalGeneration of tests/fixtures/reference/tiny/idefics3_vision (transformers' input_ids,
logits and greedy tokens; tools/make_tiny_idefics3.py).

Most tests use a tower double backed by the fixture: for an image of the fixture (known by its bytes) it gives
transformers' crop grid, pixel values and connector rows, so what they test is the language side alone
(llambda.vision's Idefics3 tower is tested against the same fixture in test_vision_idefics3.py). The images' sizes
come from llambda.vision's header check, as in use. The last tests run the whole model with the real tower: the
folder's own, and llama.cpp's layout (a text GGUF and an idefics3 mmproj, both written by llambda)."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

import llambda
from llambda.backends import available_backends
from llambda.errors import InvalidInputError, ModelFormatError
from llambda.models import images as image_mod
from llambda.models.images import IdeficsTokens

import test_vlm as vlm  # noqa: E402  (the scheduler and server helpers)

FOLDER = Path(__file__).parent / "fixtures" / "reference" / "tiny" / "idefics3_vision"
REF = json.loads((FOLDER / "reference.json").read_text(encoding="utf-8"))
SOFT, PER = REF["image_token_id"], REF["image_seq_len"]
PNG = {name: (FOLDER / name).read_bytes() for name in REF["images"]}
TWO = REF["prompts"][0]                     # two split images: 1 x 2 and 2 x 2 crops, each plus the global image
ONE = REF["no_split"]["prompts"][0]         # one image, not split (the processor with do_image_splitting false)

# (backend, activations, budget of max |logit diff|): test_vlm's (Gemma 3's) modes and budgets
MODES = vlm.MODES


def npy(name: str) -> np.ndarray:
    return np.load(FOLDER / name)


class FixtureTower:
    """A VisionTower double (the contract's members): grid, pixels and encode from the fixture's images."""
    family, attends, tokens_per_image, hidden = "idefics3", "causal", PER, REF["config"]["text_config"]["hidden_size"]

    def __init__(self, split: bool = True):
        self.images = REF["images"] if split else REF["no_split"]["images"]
        self.split = split
        self.by_digest = {hashlib.sha256(PNG[n]).hexdigest(): n for n in self.images}
        self.encoded = 0          # crops
        self.closed = False

    @staticmethod
    def load_image(data) -> str:
        return hashlib.sha256(bytes(data)).hexdigest()

    def grid(self, width: int, height: int) -> tuple[int, int]:
        for info in self.images.values():
            if tuple(info["size"]) == (width, height):
                return tuple(info["grid"])
        raise AssertionError(f"no fixture image of {width} x {height}")

    def pixels(self, image) -> np.ndarray:
        if image not in self.by_digest:
            raise InvalidInputError("the test tower knows only the fixture's images")
        return npy(self.images[self.by_digest[image]]["pixel_values"])

    def encode(self, pixels: np.ndarray) -> np.ndarray:
        assert pixels.ndim == 4 and pixels.shape[1:] == (3, 32, 32)
        self.encoded += len(pixels)
        for info in self.images.values():
            px = npy(info["pixel_values"])
            for k in range(len(px) - len(pixels) + 1):
                if np.array_equal(px[k:k + len(pixels)], pixels):
                    return npy(info["connector_rows"])[k:k + len(pixels)]
        raise AssertionError("pixels of no fixture image")

    def close(self):
        self.closed = True


def load(mode: str, folder=FOLDER, split: bool = True, tower: bool = True, **kw):
    backend, activations, _ = MODES[mode]
    if backend not in available_backends():
        pytest.skip(f"the {backend} backend is not available here (C core not built)")
    # the folder's own tower is not loaded: the double stands in for it (this file tests the language side)
    m = llambda.load(folder, backend=backend, activations=activations, **{"n_ctx": 128, "vision": False, **kw})
    if tower:
        m.attach_vision(FixtureTower(split), load_image=FixtureTower.load_image)
    return m


def messages(prompt: dict) -> list:
    """The reference's messages with each image part holding its file's bytes, in order."""
    files = iter(prompt["images"])
    out = []
    for msg in prompt["messages"]:
        content = [{"type": "image", "image": PNG[next(files)]} if p["type"] == "image" else dict(p)
                   for p in msg["content"]]
        out.append({**msg, "content": content})
    return out


def crop_blocks(prompt: dict, tower: FixtureTower | None = None) -> tuple:
    """The prompt's blocks as the fixture says: one per run of soft tokens, the connector's rows in order."""
    tower = tower or FixtureTower(prompt is not ONE)
    ids = np.asarray(prompt["input_ids"])
    starts = [i for i in range(len(ids)) if ids[i] == SOFT and (i == 0 or ids[i - 1] != SOFT)]
    rows = np.concatenate([npy(tower.images[n]["connector_rows"]) for n in prompt["images"]])
    assert len(starts) == len(rows)
    return tuple(image_mod.image_block(s, r, causal=True) for s, r in zip(starts, rows))


def rows_logits(m, prompt: dict, blocks=None) -> np.ndarray:
    """Logits of every position of a reference prompt, in one forward."""
    return vlm.rows_logits(m, prompt, blocks if blocks is not None else crop_blocks(prompt))


# --- Model.chat against transformers ----------------------------------------------------------------

@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("which", ["two split images", "one unsplit image"])
def test_chat_gives_the_processor_ids_the_logits_and_the_greedy_tokens(mode, which):
    """The chat template's text, the processor's input_ids (the crop grid expanded from each image's header
    size), the logits at the reference's rows, every position's argmax, and Model.chat's greedy answer."""
    prompt = TWO if which.startswith("two") else ONE
    budget = MODES[mode][2]
    with load(mode, split=prompt is TWO) as m:
        assert m.accepts_images and m.image_marker == "<image>" and m.image_block_tokens == 0
        msgs = messages(prompt)
        text = m.render_chat(msgs)
        assert text == prompt["chat_text"]
        ids, blocks = m.image_prompt(text, [PNG[n] for n in prompt["images"]])
        assert ids == prompt["input_ids"]
        assert len(blocks) == sum(m.vision.images[n]["n_crops"] for n in prompt["images"])
        assert all(b.causal and len(b.rows) == PER for b in blocks)
        got = rows_logits(m, prompt, blocks)
        err = float(np.abs(got[prompt["rows"]] - npy(prompt["logits_rows"])).max())
        assert err <= budget, f"max |logit diff| {err:.3g} > {budget}"
        assert got.argmax(axis=1).tolist() == prompt["argmax_per_position"]
        n = len(prompt["greedy_new_tokens"])
        tokens = [ev.token for ev in m.chat_stream(msgs, max_tokens=n, temperature=0, ignore_eos=True)
                  if ev.token >= 0]
        assert tokens == prompt["greedy_new_tokens"]
        assert m.chat(msgs, max_tokens=n, temperature=0, ignore_eos=True) == m.tokenizer.decode(tokens)


def test_block_attention_would_fail_the_fixture(monkeypatch):
    """Were a crop's tokens to see their whole run (Gemma 3's blocks), the logits would move: the tests above
    can tell causal attention from it."""
    with load("numpy") as m:
        base = rows_logits(m, TWO)
        blocks = tuple(image_mod.image_block(b.start, b.rows) for b in crop_blocks(TWO))    # not causal
        both_ways = rows_logits(m, TWO, blocks)
        assert np.abs(both_ways - base).max() > 1e-2
        err = float(np.abs(base[TWO["rows"]] - npy(TWO["logits_rows"])).max())
        assert err <= 1e-4


@pytest.mark.parametrize("max_batch", [3, 7, 16])
def test_prefill_chunks_may_end_inside_a_crop(max_batch):
    """Causal runs need no whole block in a forward: chunks of fewer tokens than a crop give the same greedy
    tokens, and attach_vision and the server ask for no room for a block."""
    with load("native-exact", max_batch=max_batch) as m:
        assert m.image_block_tokens == 0
        assert image_mod.chunk_end(crop_blocks(TWO), 0, 6, 10) == 6
        ids, blocks = m.image_prompt(TWO["chat_text"], [PNG[n] for n in TWO["images"]])
        got = list(m.generate(ids, images=blocks, max_tokens=len(TWO["greedy_new_tokens"]), temperature=0,
                              ignore_eos=True))
        assert got == TWO["greedy_new_tokens"]


def test_library_prefix_reuse_tells_crops_apart():
    """Slot 0's prefix is reused up to the first crop that differs: the same ids with the second image's rows
    swapped give that answer, the same images again reuse every crop."""
    other = crop_blocks(TWO)
    first_b = next(i for i, b in enumerate(other) if b.start > TWO["input_ids"].index(SOFT) + 20)
    swapped = other[:first_b] + tuple(image_mod.image_block(b.start, b.rows[::-1].copy(), True) for b in other[first_b:])

    def run(m, blocks):
        evs = m.stream(TWO["input_ids"], images=blocks, max_tokens=4, temperature=0, ignore_eos=True, logprobs=2)
        return [(ev.token, ev.logprob, tuple(ev.top_logprobs)) for ev in evs]

    with load("native-exact") as fresh:
        want = run(fresh, swapped)
    with load("native-exact") as m:
        a = run(m, other)
        with vlm.prefill_starts() as calls:
            b = run(m, swapped)
        assert b == want and b != a
        assert calls[0] == swapped[first_b].start, f"not reused up to the first crop that differs: {calls}"
        with vlm.prefill_starts() as calls:
            assert run(m, swapped) == want
        assert min(calls) >= swapped[-1].end, f"the same crops were computed again: {calls}"


def test_scheduler_batch_invariance_with_images():
    """The image request alone, and beside text requests under prefill chunks that cut its crops: the same
    tokens and logprob bits."""
    rng = np.random.default_rng(7)
    texts = [rng.integers(43, 450, size=n).tolist() for n in (23, 9)]
    ids, blocks = TWO["input_ids"], crop_blocks(TWO)
    with load("native-exact", n_slots=4, max_batch=96) as m:
        alone = vlm.scheduler_run(m, [[(ids, blocks, 8)]], prefill_chunk=256)[0][0][0]
        assert [t for t, _, _ in alone] == TWO["greedy_new_tokens"]
        for chunk in (3, 5, 17):
            runs = vlm.scheduler_run(m, [[(texts[0], (), 8), (ids, blocks, 8), (texts[1], (), 8)]],
                                     prefill_chunk=chunk)[0]
            assert runs[1][0] == alone, f"prefill_chunk {chunk}: the image request changed beside text requests"


def test_server_prepares_idefics3_requests():
    """The server's token count and prepared sequence are Model.image_prompt's; a batch smaller than a crop is
    no reason to refuse (causal runs); the image's crops are encoded once, in the image worker."""
    msgs = messages(TWO)
    with load("native-exact", max_batch=8) as m:
        service, _ = vlm.service_for(m)
        try:
            assert service._prompt_length(vlm.chat_spec(msgs)) == len(TWO["input_ids"])
            p = service.prepare(vlm.chat_spec(msgs))
            assert m.vision.encoded == 0 and not p.seqs and p.images is not None
            seq = service.encode(p).seqs[0][0]
            assert seq.prompt_ids == TWO["input_ids"] and len(seq.images) == 8 and m.vision.encoded == 8
            assert [b.digest for b in seq.images] == [b.digest for b in crop_blocks(TWO)]
        finally:
            service.workers.close()
            service.image_workers.close()


# --- what the layout is made of, and bad input ------------------------------------------------------

def test_image_text_is_the_processor_expansion():
    """IdeficsTokens writes each image as transformers' Idefics3Processor does (the reference's prompt_text)."""
    tokens = IdeficsTokens(SOFT)
    grids = [tuple(REF["images"][n]["grid"]) for n in TWO["images"]]
    assert tokens.expand(TWO["chat_text"], grids, PER) == TWO["prompt_text"]
    assert tokens.expand(ONE["chat_text"], [(0, 0)], PER) == ONE["prompt_text"]


def test_image_tokens_from_the_config_or_the_vocabulary():
    with load("numpy", tower=False) as m:
        from_config = image_mod.image_tokens(m.source.metadata["hf.config"], m.tokenizer, 450, "idefics3")
        from_vocab = image_mod.image_tokens(None, m.tokenizer, 450, "idefics3")
        assert from_config == from_vocab == IdeficsTokens(SOFT, "<image>")
        assert image_mod.image_tokens(None, None, 450, "idefics3") is None
        with pytest.raises(InvalidInputError, match="outside"):
            image_mod.image_tokens({"image_token_id": 900}, m.tokenizer, 450, "idefics3")
        with pytest.raises(InvalidInputError, match="family"):
            image_mod.image_tokens(None, m.tokenizer, 450, "llava")


def test_the_text_model_loads_from_the_idefics3_checkpoint():
    """model.text_model.* and the untied lm_head are the decoder; the vision tower's and the connector's tensors
    are left to llambda.vision. Without a tower, a text prompt runs and an image is refused."""
    with load("numpy", tower=False) as m:
        assert m.config.arch == "llama" and not m.config.tie_embeddings and not m.accepts_images
        assert m.chat([{"role": "user", "content": "hi"}], max_tokens=2, temperature=0) is not None
        with pytest.raises(InvalidInputError, match="no vision tower"):
            m.chat(messages(ONE), max_tokens=1)


def test_a_template_that_walks_lists_gets_text_messages_as_lists():
    """SmolVLM's template reads message['content'][0]['type'] and walks the parts: a string content was
    rendered as nothing. It now gets a text part."""
    with load("numpy", tower=False) as m:
        text = m.render_chat([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}])
        assert text == "<|im_start|>System: Be brief.<end_of_utterance>\nUser: Hello<end_of_utterance>\nAssistant:"


def test_bad_image_requests_are_typed_errors():
    with load("numpy") as m:
        a, b = PNG[TWO["images"][0]], PNG[TWO["images"][1]]
        typed = [{"role": "user", "content": [{"type": "image", "image": a}, {"type": "text", "text": "<image>"}]}]
        with pytest.raises(InvalidInputError, match="image markers"):    # a prompt that writes <image> itself
            m.image_ids(m.render_chat(typed), [a])
        # typed in a message it is text (Model.literal): the one image's runs alone
        assert len(m.image_ids(m.render_chat(m.literal(typed)), [a])[1]) == 1
        m.chat(typed, max_tokens=1)
        with pytest.raises(InvalidInputError, match="sizes"):           # a count says no grid
            m.image_ids(TWO["chat_text"], 2)
        ids, starts = m.image_ids(TWO["chat_text"], [a, b])
        assert [len(s) for s in starts] == [3, 5]
        with pytest.raises(InvalidInputError, match="crop"):            # starts that are not this image's
            m.encode_images([a, b], [starts[0], starts[1][:2]])
        with pytest.raises(InvalidInputError, match="not in a supported format"):
            m.image_ids(TWO["chat_text"], [a, b"not an image"])
        with pytest.raises(InvalidInputError, match="soft tokens only"):
            blocks = crop_blocks(TWO)
            m.generate(TWO["input_ids"], images=(image_mod.image_block(blocks[0].start - 1, blocks[0].rows, True),),
                       max_tokens=1)
        with pytest.raises(InvalidInputError, match="no image fills"):
            m.generate(TWO["input_ids"], images=crop_blocks(TWO)[:-1], max_tokens=1)

        class Lies(FixtureTower):
            def grid(self, width, height):
                return (1, 1)           # 2 crops in the prompt, 3 or 5 from pixels

        m.attach_vision(Lies(), load_image=FixtureTower.load_image)
        with pytest.raises(InvalidInputError, match="crop"):
            m.chat(messages(TWO), max_tokens=1)

        class Bad(FixtureTower):
            def grid(self, width, height):
                return (0, 2)

        m.attach_vision(Bad(), load_image=FixtureTower.load_image)
        with pytest.raises(ModelFormatError, match="grid"):
            m.chat(messages(TWO), max_tokens=1)

        class Blocky(FixtureTower):
            attends = "block"

        with pytest.raises(InvalidInputError, match="attending"):
            m.attach_vision(Blocky())


def test_a_gguf_of_the_text_model_finds_its_image_token(tmp_path):
    """llama.cpp's text GGUF of SmolVLM is a plain llama file: the image token is the vocabulary's <image> (no
    config), and the prompt and logits are the HF directory's."""
    from llambda.tools.export import export
    gg = export(FOLDER, tmp_path / "smolvlm-tiny.gguf", fmt="gguf")
    with load("numpy", folder=gg) as m:
        assert m.source.metadata.get("hf.config") is None
        ids, blocks = m.image_prompt(TWO["chat_text"], [PNG[n] for n in TWO["images"]])
        assert ids == TWO["input_ids"]
        got = rows_logits(m, TWO, blocks)
        assert float(np.abs(got[TWO["rows"]] - npy(TWO["logits_rows"])).max()) <= 1e-4


# --- the real tower (llambda.vision's Idefics3: the folder's own, or llama.cpp's mmproj) ------------------------

def folder_without_splitting(dest: Path) -> Path:
    """The fixture's folder with do_image_splitting false (the reference's no_split processor)."""
    import shutil
    shutil.copytree(FOLDER, dest)
    pre = json.loads((dest / "preprocessor_config.json").read_text(encoding="utf-8"))
    pre["do_image_splitting"] = False
    (dest / "preprocessor_config.json").write_text(json.dumps(pre), encoding="utf-8")
    return dest


def check_whole_model(m, prompt: dict, budget: float) -> None:
    """Model.chat on the reference's messages: the processor's ids, the logits rows, the greedy tokens."""
    msgs = messages(prompt)
    ids, blocks = m.image_prompt(m.render_chat(msgs), [PNG[n] for n in prompt["images"]])
    assert ids == prompt["input_ids"]
    got = rows_logits(m, prompt, blocks)
    err = float(np.abs(got[prompt["rows"]] - npy(prompt["logits_rows"])).max())
    assert err <= budget, f"max |logit diff| {err:.3g} > {budget}"
    n = len(prompt["greedy_new_tokens"])
    tokens = [ev.token for ev in m.chat_stream(msgs, max_tokens=n, temperature=0, ignore_eos=True) if ev.token >= 0]
    assert tokens == prompt["greedy_new_tokens"]


# (backend, activations, budget): the tower's float32 rows give transformers' logits within test_vlm's exact
# budget; the native default (bfloat16 tower products, q8 text activations) within Gemma 3's whole-model 0.1
REAL = {"numpy": ("numpy", None, 1e-4), "native-exact": ("native", "f32", 1e-4), "native-fast": ("native", None, 0.1)}


@pytest.mark.parametrize("mode", list(REAL))
def test_whole_model_with_its_own_tower_matches_transformers(mode, tmp_path):
    """llambda.load finds the folder's Idefics3 tower: both reference prompts (split, and unsplit with the
    no-split processor) give transformers' ids, logits and greedy tokens."""
    backend, activations, budget = REAL[mode]
    if backend not in available_backends():
        pytest.skip(f"the {backend} backend is not available here (C core not built)")
    for folder, prompt in ((FOLDER, TWO), (folder_without_splitting(tmp_path / "nosplit"), ONE)):
        with llambda.load(folder, backend=backend, activations=activations, n_ctx=128) as m:
            assert m.accepts_images and m.vision.family == "idefics3" and m.vision.attends == "causal"
            check_whole_model(m, prompt, budget)


def test_text_gguf_with_our_mmproj_matches_transformers(tmp_path):
    """llama.cpp's layout of SmolVLM: the text model as a plain llama GGUF (its <image> found in the vocabulary)
    and the tower as an idefics3 mmproj (both written by llambda), loaded with mmproj=: the reference again."""
    from llambda.tools.export import export
    from llambda.vision.mmproj import write_mmproj
    gg = export(FOLDER, tmp_path / "text.gguf", fmt="gguf")
    proj = write_mmproj(FOLDER, tmp_path / "mmproj.gguf", "f32")
    with llambda.load(gg, mmproj=proj, backend="numpy", n_ctx=128) as m:
        assert m.accepts_images and m.image_marker == "<image>"
        check_whole_model(m, TWO, 1e-4)


def test_a_smolvlm2_config_reads_the_same(tmp_path):
    """SmolVLM2's checkpoints (model_type smolvlm, SmolVLMForConditionalGeneration) keep Idefics3's names, tokens
    and prompt for images (its processor writes the same strings; video is not taken): the same answer."""
    import shutil
    d = tmp_path / "smolvlm2"
    shutil.copytree(FOLDER, d)
    cfg = json.loads((d / "config.json").read_text(encoding="utf-8"))
    cfg.update(model_type="smolvlm", architectures=["SmolVLMForConditionalGeneration"])
    (d / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    with llambda.load(d, backend="numpy", n_ctx=128) as m:
        assert m.accepts_images and m.config.arch == "llama"
        check_whole_model(m, TWO, 1e-4)
