"""Qwen2.5-VL images end to end through every API surface on a live server: the tiny Qwen2.5-VL of
tests/fixtures/reference/tiny/qwen2_5_vl_vision (its chat template, each image's merged grid); each route's
answer is Model.chat's greedy reply to the same canonical messages (and `llambda run`'s), as
tests/test_images_e2e.py checks for Gemma 3, and the reference's two-image prompt gives transformers' greedy
tokens through the OpenAI route. The API and CLI layers are generic: what differs is the prompt's expansion (a run
of `<|image_pad|>` as long as the image's grid) and the positions after each image (M-RoPE), which the server's
scheduler keeps per sequence. The model's own tower runs (llambda.vision's Qwen2.5-VL, found by llambda.load):
nothing here is a double."""
from __future__ import annotations

import base64

import httpx
import pytest

import llambda

import test_vlm_qwen25vl as q  # noqa: E402  (the fixture and its images)
from test_images_e2e import _post, _want, every_surface, streamed  # noqa: E402  (Gemma 3's checks, shared)

WIDE, BIG = q.FIX_PNG["image_wide.png"], q.FIX_PNG["image_big.png"]
TINY = q.FIX_PNG["image_tiny.png"]


def _load(**kw):
    """The fixture with its own tower, found by load() (llambda.vision's Qwen2.5-VL: resized, patched, encoded)."""
    return llambda.load(q.FOLDER, backend="native", activations="f32", **{"n_ctx": 128, **kw})


@pytest.fixture(scope="module")
def served():
    """A live server on the fixture (two slots) and, as srv.model, another copy giving the library's answers."""
    from serverkit import LiveServer
    from llambda.server import ServerConfig, create_app
    with _load(n_slots=2) as m, _load() as ref:
        with LiveServer(create_app(m, ServerConfig(model_id="vis", parallel=2))) as srv:
            srv.model = ref
            yield srv


def test_every_surface_reaches_the_model(served):
    """OpenAI chat, Responses, Anthropic messages, Ollama chat and generate: Model.chat's greedy reply."""
    every_surface(served, WIDE, [WIDE, BIG])


def test_the_reference_prompt_through_the_openai_route(served):
    """The fixture's two-image chat: transformers' greedy tokens (their text) from /v1/chat/completions."""
    names = iter(q.TWO["images"])
    parts = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,"
                                                 + base64.b64encode(q.FIX_PNG[next(names)]).decode()}}
             if p["type"] == "image" else dict(p) for p in q.TWO["messages"][0]["content"]]
    want = q.TWO["greedy_new_tokens"]
    got = _post(served, "/v1/chat/completions", {"max_tokens": len(want), "temperature": 0, "ignore_eos": True,
                                                 "messages": [{"role": "user", "content": parts}]})
    assert got["choices"][0]["message"]["content"] == served.model.tokenizer.decode(want)
    assert got["usage"]["prompt_tokens"] == len(q.TWO["input_ids"])


def test_the_token_count_follows_each_image_grid(served):
    """A 3 x 5 image and a 3 x 2 one count their own grid's pads (and the two frame tokens), as Model.image_ids."""
    def count(data):
        b64 = base64.b64encode(data).decode()
        return _post(served, "/v1/messages/count_tokens", {"messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}}]}]})["input_tokens"]

    assert count(WIDE) - count(TINY) == 15 - 6


def test_streams_with_images(served):
    got, want = streamed(served, BIG)
    assert got == want


def test_run_with_an_image_flag(served, tmp_path, monkeypatch, capsys):
    """`llambda run MODEL --image FILE PROMPT`: the image before the prompt's text, Model.chat's reply."""
    from llambda import cli
    picture = tmp_path / "big.png"
    picture.write_bytes(BIG)
    reply = _want(served.model, BIG, "Look:")
    model = _load()
    monkeypatch.setattr(llambda.api, "load", lambda name, **kw: model)
    code = cli.main(["run", "-m", str(q.FOLDER), "--image", str(picture), "--temperature", "0", "-n", "6",
                     "--ignore-eos", "Look:"])
    assert (code, capsys.readouterr().out) == (0, reply + "\n")
