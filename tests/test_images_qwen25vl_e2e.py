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


def serve(load, fixture, images: tuple, counted: tuple):
    """A live server on a grid family's fixture (two slots) as these tests read it: srv.model, another copy giving
    the library's answers; srv.load, a fresh copy; srv.fixture, the test module of its reference (FOLDER, TWO,
    FIX_PNG); srv.images, two image files (one alone, both in Ollama's list); srv.counted, two files and the
    difference of their token counts."""
    from serverkit import LiveServer
    from llambda.server import ServerConfig, create_app
    with load(n_slots=2) as m, load() as ref:
        with LiveServer(create_app(m, ServerConfig(model_id="vis", parallel=2))) as srv:
            srv.model, srv.load, srv.fixture, srv.images, srv.counted = ref, load, fixture, images, counted
            yield srv


@pytest.fixture(scope="module")
def served():
    yield from serve(_load, q, (WIDE, BIG), (WIDE, TINY, 15 - 6))     # grids 3 x 5, 3 x 2


def test_every_surface_reaches_the_model(served):
    """OpenAI chat, Responses, Anthropic messages, Ollama chat and generate: Model.chat's greedy reply."""
    every_surface(served, served.images[0], list(served.images))


def test_the_reference_prompt_through_the_openai_route(served):
    """The fixture's two-image chat: transformers' greedy tokens (their text) from /v1/chat/completions."""
    fix = served.fixture
    names = iter(fix.TWO["images"])
    parts = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,"
                                                 + base64.b64encode(fix.FIX_PNG[next(names)]).decode()}}
             if p["type"] == "image" else dict(p) for p in fix.TWO["messages"][0]["content"]]
    want = fix.TWO["greedy_new_tokens"]
    got = _post(served, "/v1/chat/completions", {"max_tokens": len(want), "temperature": 0, "ignore_eos": True,
                                                 "messages": [{"role": "user", "content": parts}]})
    assert got["choices"][0]["message"]["content"] == served.model.tokenizer.decode(want)
    assert got["usage"]["prompt_tokens"] == len(fix.TWO["input_ids"])


def test_the_token_count_follows_each_image_grid(served):
    """Two images count their own grid's pads (and the two frame tokens each), as Model.image_ids."""
    def count(data):
        b64 = base64.b64encode(data).decode()
        return _post(served, "/v1/messages/count_tokens", {"messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}}]}]})["input_tokens"]

    a, b, diff = served.counted
    assert count(a) - count(b) == diff


def test_streams_with_images(served):
    got, want = streamed(served, served.images[1])
    assert got == want


def test_run_with_an_image_flag(served, tmp_path, monkeypatch, capsys):
    """`llambda run MODEL --image FILE PROMPT`: the image before the prompt's text, Model.chat's reply."""
    from llambda import cli
    picture = tmp_path / "picture.png"
    picture.write_bytes(served.images[1])
    reply = _want(served.model, served.images[1], "Look:")
    model = served.load()
    monkeypatch.setattr(llambda.api, "load", lambda name, **kw: model)
    code = cli.main(["run", "-m", str(served.fixture.FOLDER), "--image", str(picture), "--temperature", "0", "-n",
                     "6", "--ignore-eos", "Look:"])
    assert (code, capsys.readouterr().out) == (0, reply + "\n")
