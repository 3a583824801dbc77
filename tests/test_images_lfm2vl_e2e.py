"""LFM2-VL images end to end through every API surface on a live server: the tiny LFM2-VL of
tests/fixtures/reference/tiny/lfm2vl_vision (its own tower, found by llambda.load; an LFM2 text model of short
convolutions and attention); each route's answer is Model.chat's greedy reply to the same canonical messages, as
tests/test_images_e2e.py checks for Gemma 3. What differs is the prompt's expansion (tiles, a thumbnail) and its
length, which depends on each image's size."""
from __future__ import annotations

import base64

import pytest

import llambda

import test_vlm_lfm2vl as vlm  # noqa: E402  (the fixture and its images)
from test_images_e2e import _post, every_surface, streamed  # noqa: E402  (Gemma 3's checks, shared)

LARGE, SMALL = vlm.PNG["image_large.png"], vlm.PNG["image_small.png"]


@pytest.fixture(scope="module")
def served():
    """A live server of the fixture (2 slots) and, as srv.model, a second copy for the library's answers."""
    from contextlib import ExitStack

    from serverkit import LiveServer
    from llambda.server import ServerConfig, create_app
    with ExitStack() as stack:
        m, ref = (stack.enter_context(llambda.load(vlm.FOLDER, backend="numpy", n_ctx=256, n_slots=slots))
                  for slots in (2, 1))
        assert m.accepts_images and ref.accepts_images
        srv = stack.enter_context(LiveServer(create_app(m, ServerConfig(model_id="vis", parallel=2))))
        srv.model = ref
        yield srv


def test_every_surface_reaches_the_model(served):
    every_surface(served, LARGE, [LARGE, SMALL])


def test_the_token_count_follows_each_image(served):
    """A tiled image (2 tiles of 16 tokens, a 12-token thumbnail, 3 markers) and a small one (6 tokens) count as
    Model.image_ids does."""
    def count(data):
        return _post(served, "/v1/messages/count_tokens", {"messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": base64.b64encode(data).decode()}}]}]})["input_tokens"]

    def library(image):
        text = served.model.render_chat([{"role": "user", "content": [{"type": "image", "image": image}]}])
        return len(served.model.image_ids(text, [image])[0])

    large, small = count(LARGE), count(SMALL)
    assert (large, small) == (library(LARGE), library(SMALL))
    assert large - small == (2 * 16 + 12 + 3) - 6


def test_streams_with_images(served):
    got, want = streamed(served, LARGE)
    assert got == want


def test_a_too_thin_image_is_a_400(served):
    import httpx
    url = "data:image/png;base64," + base64.b64encode(vlm.thin_png()).decode()
    r = httpx.post(served.url + "/v1/chat/completions", timeout=60, json={"model": "vis", "max_tokens": 2, "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]})
    assert r.status_code == 400 and "too thin" in r.text, r.text
