"""Images on the language model's side, Mistral 3 (Pixtral): an image is rows of `[IMG]` tokens (its merged grid's
columns each), `[IMG_BREAK]` between rows and `[IMG_END]` after, the `[IMG]` tokens' embeddings the tower's rows in
order, causal attention and plain positions; through Model.chat, the engine's prefill chunks and the server's
scheduler, against the tiny Mistral3ForConditionalGeneration of tests/fixtures/reference/tiny/pixtral_vision
(transformers' input_ids, logits and greedy tokens; tools/make_tiny_pixtral.py). The model's own tower runs
(llambda.vision's Pixtral, found by llambda.load; tested alone in test_vision_pixtral.py): nothing here is a
double."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import llambda
from llambda.backends import available_backends
from llambda.errors import ContextOverflowError, InvalidInputError
from llambda.models import images as image_mod
from llambda.models.pixtral_tokens import PixtralTokens, pixtral_tokens

import test_vlm as vlm  # noqa: E402  (the scheduler and server helpers)
import test_vlm_qwen25vl as qwen  # noqa: E402  (the scheduler's batch invariance beside text)

FOLDER = Path(__file__).parent / "fixtures" / "reference" / "tiny" / "pixtral_vision"
REF = json.loads((FOLDER / "reference.json").read_text(encoding="utf-8"))
FIX_PNG = {name: (FOLDER / name).read_bytes() for name in REF["images"]}
TWO = REF["prompt"]                  # two images (merged grids 3 x 4 and 2 x 4), text after each
IDS = REF["special_token_ids"]
IMG, BRK, END = IDS["[IMG]"], IDS["[IMG_BREAK]"], IDS["[IMG_END]"]
# (backend, activations, budget of max |logit diff|): the tower's float32 rows give transformers' logits within
# test_vlm's exact budget; the native default (bfloat16 tower products, q8 text activations) within Gemma 3's 0.1
REAL = {"numpy": ("numpy", None, 1e-4), "native-exact": ("native", "f32", 1e-4), "native-fast": ("native", None, 0.1)}


def load(mode: str = "native-exact", folder=FOLDER, **kw):
    backend, activations, _ = REAL[mode]
    if backend not in available_backends():
        pytest.skip(f"the {backend} backend is not available here (C core not built)")
    return llambda.load(folder, backend=backend, activations=activations, **{"n_ctx": 128, **kw})


def messages(prompt: dict, files: dict = FIX_PNG) -> list:
    names = iter(prompt["images"])
    return [{**msg, "content": [{"type": "image", "image": files[next(names)]} if p["type"] == "image" else dict(p)
                                for p in msg["content"]]} for msg in prompt["messages"]]


def matches_reference(m, ref: dict, folder: Path, files: dict, text: str | None = None) -> None:
    """The reference prompt `ref` of `folder` on m: the processor's ids (from `text`, else the chat template's
    rendering), the logits rows within 1e-4 (float32 paths), the greedy tokens."""
    text = m.render_chat(messages(ref, files)) if text is None else text
    ids, blocks = m.image_prompt(text, [files[n] for n in ref["images"]])
    assert ids == ref["input_ids"]
    got = vlm.rows_logits(m, ref, blocks)
    assert float(np.abs(got[ref["rows"]] - np.load(folder / ref["logits_rows"])).max()) <= 1e-4
    assert got.argmax(axis=1).tolist() == ref["argmax_per_position"]
    want = ref["greedy_new_tokens"]
    assert list(m.generate(ids, images=blocks, max_tokens=len(want), temperature=0, ignore_eos=True)) == want


@pytest.mark.parametrize("mode", list(REAL))
def test_whole_model_with_its_own_tower_matches_transformers(mode):
    """The chat template's text, the processor's input_ids (each image's rows from its header size), a block a
    row of [IMG] tokens, the logits at the reference's rows, every position's argmax, Model.chat's greedy answer."""
    budget = REAL[mode][2]
    with load(mode) as m:
        assert m.accepts_images and m.image_marker == "[IMG]" and m.image_block_tokens == 0
        assert m.vision.family == "pixtral" and m.vision.attends == "causal"
        msgs = messages(TWO)
        text = m.render_chat(msgs)
        assert text == TWO["chat_text"]
        ids, blocks = m.image_prompt(text, [FIX_PNG[n] for n in TWO["images"]])
        assert ids == TWO["input_ids"]
        assert [len(b.rows) for b in blocks] == [4, 4, 4, 4, 4] and all(b.causal and b.grid is None for b in blocks)
        assert all(ids[b.start - 1] in (IDS["[INST]"], BRK, END) or ids[b.start - 1] > END for b in blocks)
        assert [ids[b.end] for b in blocks] == [BRK, BRK, END, BRK, END]
        got = vlm.rows_logits(m, TWO, blocks)
        err = float(np.abs(got[TWO["rows"]] - np.load(FOLDER / TWO["logits_rows"])).max())
        assert err <= budget, f"max |logit diff| {err:.3g} > {budget}"
        assert got.argmax(axis=1).tolist() == TWO["argmax_per_position"]
        want = TWO["greedy_new_tokens"]
        reply = m.chat(msgs, max_tokens=len(want), temperature=0, ignore_eos=True)
        assert reply == m.tokenizer.decode(want)
        streamed = [ev.token for ev in m.chat_stream(msgs, max_tokens=len(want), temperature=0, ignore_eos=True)]
        assert [t for t in streamed if t >= 0] == want


MINISTRAL3 = FOLDER.parent / "pixtral_ministral3_vision"


@pytest.mark.parametrize("mode", ["numpy", "native-exact"])
def test_a_ministral3_text_model_takes_the_images_too(mode):
    """Ministral 3's composite (text_config ministral3: YaRN and the query temperature stepping every 16 positions,
    which the 41-token prompt crosses twice): transformers' ids, logits and greedy tokens (smallest greedy margin
    0.015, so the native default is not asked for the tokens)."""
    ref = json.loads((MINISTRAL3 / "reference.json").read_text(encoding="utf-8"))["prompt"]
    with load(mode, folder=MINISTRAL3) as m:
        assert m.config.arch == "ministral3" and m.config.attn_temp_scale == 0.1 and m.vision.family == "pixtral"
        matches_reference(m, ref, MINISTRAL3, FIX_PNG)


def test_the_rows_go_in_order():
    """The test can fail: the image rows of one block swapped with another's change the logits."""
    with load("numpy") as m:
        ids, blocks = m.image_prompt(TWO["chat_text"], [FIX_PNG[n] for n in TWO["images"]])
        swapped = (image_mod.image_block(blocks[0].start, blocks[1].rows, True),
                   image_mod.image_block(blocks[1].start, blocks[0].rows, True)) + blocks[2:]
        got = vlm.rows_logits(m, TWO, swapped)
    assert np.abs(got[TWO["rows"]] - np.load(FOLDER / TWO["logits_rows"])).max() > 1e-3


def test_prefill_chunks_give_the_greedy_tokens():
    """Forwards of 3, 7 and 16 tokens (a chunk ending inside a row of [IMG], or between rows): the same tokens."""
    for max_batch in (3, 7, 16):
        with load(max_batch=max_batch) as m:
            prompt = m.image_prompt(TWO["chat_text"], [FIX_PNG[n] for n in TWO["images"]])
            got = m.generate(prompt[0], images=prompt[1], max_tokens=8, temperature=0, ignore_eos=True)
            assert list(got) == TWO["greedy_new_tokens"], max_batch


def test_scheduler_batch_invariance_beside_text():
    rng = np.random.default_rng(11)
    texts = [rng.integers(8, 400, size=n).tolist() for n in (23, 9)]
    with load(n_slots=4, max_batch=96) as m:
        ids, blocks = m.image_prompt(TWO["chat_text"], [FIX_PNG[n] for n in TWO["images"]])
        qwen.same_beside_text(m, ids, blocks, TWO["greedy_new_tokens"], texts)


def test_server_prepares_pixtral_requests():
    """The server's token count and prepared sequence are Model.image_prompt's; no room is asked of the batch for
    a block (causal)."""
    with load(max_batch=8) as m:
        service, _ = vlm.service_for(m)
        spec = vlm.chat_spec(messages(TWO))
        try:
            count, prepared = service._prompt_length(spec), service.prepare(spec)
            seq = service.encode(prepared).seqs[0][0]
        finally:
            for pool in (service.workers, service.image_workers):
                pool.close()
        want_ids, want_blocks = m.image_prompt(TWO["chat_text"], [FIX_PNG[n] for n in TWO["images"]])
        assert count == len(TWO["input_ids"]) == len(seq.prompt_ids) and seq.prompt_ids == TWO["input_ids"]
        assert [b.digest for b in seq.images] == [b.digest for b in want_blocks]


# ---------------------------------------------------------------- the layout

def test_image_text_is_the_processor_expansion():
    t = PixtralTokens(IMG, BRK, END)
    assert t.image_text(2, 3) == "[IMG][IMG][IMG][IMG_BREAK][IMG][IMG][IMG][IMG_END]"
    assert t.image_text(1, 1) == "[IMG][IMG_END]"
    assert t.expand("a[IMG]b[IMG]", [(1, 2), (2, 1)]) == "a[IMG][IMG][IMG_END]b[IMG][IMG_BREAK][IMG][IMG_END]"
    with pytest.raises(InvalidInputError, match="markers"):
        t.expand("a[IMG][IMG]", [(1, 1)])


def test_place_checks_the_rows_and_their_ends():
    t = PixtralTokens(IMG, BRK, END)
    good = [1, IMG, IMG, BRK, IMG, IMG, END, 9]
    assert t.place(good, 0, [(2, 2)]) == (good, [(1, 4)])
    for bad, grids in (([1, IMG, IMG, END, IMG, IMG, END], [(2, 2)]),      # an end between the rows
                       ([1, IMG, IMG, BRK, IMG, END], [(2, 2)]),           # a short row
                       ([1, IMG, IMG, BRK, IMG, IMG, BRK], [(2, 2)]),      # no end
                       ([1, IMG, IMG, BRK, IMG, IMG], [(2, 2)]),           # the prompt ends inside
                       ([1, IMG, IMG, BRK, 9, IMG, IMG, END], [(2, 2)]),   # text between the rows
                       ([1, IMG, END, IMG, END], [(1, 1)]),                # an [IMG] typed in the text
                       (good, [(1, 4)]), (good, [(2, 2), (1, 1)])):
        with pytest.raises(InvalidInputError, match="rows"):
            t.place(bad, 0, grids)


def test_image_tokens_from_the_config_or_the_vocabulary():
    with load("numpy") as m:
        tok, vocab = m.tokenizer, m.config.vocab_size
        assert pixtral_tokens(REF["config"], tok, vocab) == pixtral_tokens(None, tok, vocab) == \
            PixtralTokens(IMG, BRK, END)
        with pytest.raises(InvalidInputError, match="outside"):
            pixtral_tokens({"image_token_index": vocab + 3}, tok, vocab)
        with pytest.raises(InvalidInputError, match="read back"):
            pixtral_tokens({"image_token_index": 300}, tok, vocab)
        with pytest.raises(InvalidInputError, match="three tokens"):
            pixtral_tokens({"image_token_index": BRK}, tok, vocab)
        assert pixtral_tokens(None, None, vocab) is None


def test_the_token_count_follows_each_image_size():
    """Two images of other sizes: their own rows of tokens (3 x 4 + 3 breaks and end; 3 x 2 + 3)."""
    with load("numpy") as m:
        one = m.image_prompt("[INST][IMG]hi[/INST]", [FIX_PNG["image_wide.png"]])[0]
        other = m.image_prompt("[INST][IMG]hi[/INST]", [FIX_PNG["image_tall.png"]])[0]
        assert len(one) - len(other) == (12 + 3) - (6 + 3)


def test_bad_image_requests_are_typed_errors():
    with load("numpy", n_ctx=20) as m:
        with pytest.raises(ContextOverflowError):          # 15 image tokens and the text past 20
            m.chat([{"role": "user", "content": [{"type": "image", "image": FIX_PNG["image_wide.png"]},
                                                 {"type": "text", "text": "What is in this image?"}]}], max_tokens=2)
        with pytest.raises(InvalidInputError, match="marker"):
            m.image_prompt("[INST][IMG][IMG]hi[/INST]", [FIX_PNG["image_wide.png"]])
        with pytest.raises(InvalidInputError):
            m.chat([{"role": "user", "content": [{"type": "image", "image": b"not an image"}]}], max_tokens=2)


def test_text_gguf_with_our_mmproj_matches_transformers(tmp_path):
    """llama.cpp's layout of Mistral 3: the text model as a GGUF (its [IMG], [IMG_BREAK], [IMG_END] found in the
    vocabulary) and the tower as a pixtral mmproj, both written by llambda, loaded with mmproj=: the reference."""
    from llambda.formats.gguf import GGUFFile
    from llambda.tools.export import export
    from llambda.vision.mmproj import write_mmproj
    gg = export(FOLDER, tmp_path / "text.gguf", fmt="gguf")
    with GGUFFile(gg) as f:
        assert f.metadata["general.architecture"] in ("llama", "mistral3")
    proj = write_mmproj(FOLDER, tmp_path / "mmproj.gguf", "f32")
    with llambda.load(gg, mmproj=proj, backend="numpy", n_ctx=128) as m:
        assert m.accepts_images and m.image_marker == "[IMG]" and m.vision.family == "pixtral"
        matches_reference(m, TWO, FOLDER, FIX_PNG, TWO["chat_text"])


PIX12B = FOLDER.parent / "pixtral12b_vision"


@pytest.mark.parametrize("mode", ["numpy", "native-exact"])
def test_pixtral_12b_layout_runs_whole(mode):
    """Pixtral-12B's LLaVA layout (a token a patch of 16, [IMG_BREAK] rows the same): transformers' ids, logits and
    greedy tokens."""
    ref = json.loads((PIX12B / "reference.json").read_text(encoding="utf-8"))["prompt"]
    files = {n: (PIX12B / n).read_bytes() for n in ref["images"]}
    with load(mode, folder=PIX12B) as m:
        assert m.vision.family == "pixtral" and m.image_marker == "[IMG]" and m.vision.grid(150, 90) == (5, 7)
        matches_reference(m, ref, PIX12B, files)


def ollama_file(dest: Path, folder: Path = FOLDER, meta_edit=None) -> Path:
    """An Ollama mistral3 model file of the fixture, as Ollama's converter lays one out: our text GGUF's keys
    renamed to mistral3.*, the tower and projector beside under Ollama's names and keys (pixtral_ollama.py)."""
    from llambda.formats.gguf import GGUFFile
    from llambda.formats.gguf_writer import write_gguf
    from llambda.formats.quants import QType
    from llambda.formats.safetensors import SafetensorsFile
    from llambda.tools.export import export
    from llambda.vision.pixtral_ollama import ollama_name
    text = export(folder, dest.with_suffix(".text.gguf"), fmt="gguf")
    with GGUFFile(text) as f:
        arch = f.metadata["general.architecture"]
        meta = {k.replace(f"{arch}.", "mistral3.", 1): v for k, v in f.metadata.items()}
        tensors = [(n, QType.F32, np.ascontiguousarray(t.as_float32())) for n, t in f.tensors.items()]
    cfg = json.loads((folder / "config.json").read_text())
    vis = cfg["vision_config"]
    meta.update({"general.architecture": "mistral3", "mistral3.vision.block_count": vis["num_hidden_layers"],
                 "mistral3.vision.embedding_length": vis["hidden_size"],
                 "mistral3.vision.feed_forward_length": vis["intermediate_size"],
                 "mistral3.vision.attention.head_count": vis["num_attention_heads"],
                 "mistral3.vision.attention.key_length": vis["head_dim"], "mistral3.vision.image_size": 112,
                 "mistral3.vision.patch_size": vis["patch_size"], "mistral3.vision.num_channels": 3,
                 "mistral3.vision.rope.freq_base": 10000.0, "mistral3.image_token_index": IMG,
                 "mistral3.spatial_merge_size": 2, "mistral3.mm.projector_bias": False,
                 "mistral3.mm.projector_hidden_act": "gelu"})
    if meta_edit is not None:
        meta_edit(meta)
    with SafetensorsFile(folder / "model.safetensors") as st:
        for name, t in st.tensors.items():
            if (o := ollama_name(name)) is not None:
                tensors.append((o, QType.F32, np.ascontiguousarray(t.to_float32()).reshape(t.shape)))
    out = dest.with_suffix(".gguf")
    write_gguf(out, meta, tensors)
    return out


def test_an_ollama_mistral3_file_runs_text_and_tower_from_one_file(tmp_path):
    """Ollama's mistral3 layout (checked on a file written here from the fixture with its converter's names and
    keys: no Ollama file was at hand): the text model and the tower from one file give transformers' ids, logits
    and greedy tokens."""
    path = ollama_file(tmp_path / "ollama")
    with load("numpy", folder=path) as m:
        assert m.accepts_images and m.vision.family == "pixtral" and m.config.arch == "ministral3"
        assert m.vision.cfg.longest_edge == 112 and m.vision.cfg.spatial_merge_size == 2
        matches_reference(m, TWO, FOLDER, FIX_PNG, TWO["chat_text"])


@pytest.mark.parametrize("edit,match", [
    (lambda m: m.pop("mistral3.vision.embedding_length"), "vision.embedding_length"),
    (lambda m: m.update({"mistral3.vision.attention.key_length": 8}), "key_length"),
    (lambda m: m.update({"mistral3.vision.attention.layer_norm_epsilon": 1e-6}), "layer_norm_epsilon"),
    (lambda m: m.update({"mistral3.spatial_merge_size": 3}), "spatial_merge_size"),
    (lambda m: m.update({"mistral3.vision.image_size": 1 << 30}), "vision.image_size"),
    (lambda m: m.update({"mistral3.vision.longest_edge": 0}), "vision.longest_edge"),
    (lambda m: m.update({"mistral3.mm.projector_hidden_act": "relu"}), "projector_hidden_act"),
])
def test_hostile_ollama_files_are_format_errors(tmp_path, edit, match):
    from llambda.errors import ModelFormatError
    from llambda.vision import load_vision
    with pytest.raises(ModelFormatError, match=match):
        load_vision(ollama_file(tmp_path / "bad", meta_edit=edit), backend="numpy")


def test_the_same_image_twice_and_again_later():
    """One file twice in a prompt: two images' rows of blocks, the same rows, the tower run once; sent again in a
    later prompt: its rows kept (EncodedRows), the blocks at the new places."""
    wide = FIX_PNG["image_wide.png"]
    with load("numpy") as m:
        calls = []
        encode = m.vision.encode_one
        m.vision.encode_one = lambda px, grid: calls.append(grid) or encode(px, grid)
        ids, blocks = m.image_prompt("[INST][IMG]a[IMG]b[/INST]", [wide, wide])
        assert len(blocks) == 6 and calls == [(3, 4)]
        assert all(np.array_equal(a.rows, b.rows) for a, b in zip(blocks[:3], blocks[3:]))
        assert [ids[b.end] for b in blocks] == [BRK, BRK, END] * 2
        ids2, again = m.image_prompt("[INST]x y[IMG]c[/INST]", [wide])
        assert calls == [(3, 4)] and [b.digest for b in again] == [b.digest for b in blocks[:3]]
        assert again[0].start != blocks[0].start and all(ids2[b.start] == IMG for b in again)
