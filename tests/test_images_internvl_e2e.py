"""InternVL images end to end through every API surface on a live server: the tiny InternVL of
tests/fixtures/reference/tiny/internvl_vision (its chat template, its tile grids); each route's answer is
Model.chat's greedy reply to the same canonical messages, as tests/test_images_e2e.py checks for Gemma 3. What
differs from the other families is the prompt's expansion (one run of soft tokens a tile between <img> and
</img>) and its length, which depends on each image's size. The model's own tower runs (llambda.vision's InternVL,
found by llambda.load): nothing here is a double."""
from __future__ import annotations

import base64

import httpx
import pytest

import llambda

import test_vlm_internvl as vlm  # noqa: E402  (the fixture and its images)
from test_images_e2e import _post, every_surface, streamed  # noqa: E402  (Gemma 3's checks, shared)

WIDE, SQUARE = vlm.PNG["image_wide.png"], vlm.PNG["image_square.png"]


def _load(**kw):
    return llambda.load(vlm.FOLDER, backend="numpy", **{"n_ctx": 256, **kw})


@pytest.fixture(scope="module")
def served():
    """A live server of the fixture (two slots) and, as srv.model, a second copy for the library's answers."""
    from serverkit import LiveServer
    from llambda.server import ServerConfig, create_app
    busy, library = _load(n_slots=2), _load()
    try:
        assert busy.accepts_images and library.accepts_images
        live = LiveServer(create_app(busy, ServerConfig(model_id="vis", parallel=2)))
        with live as srv:
            srv.model = library
            yield srv
    finally:
        busy.close()
        library.close()


def test_every_surface_reaches_the_model(served):
    every_surface(served, WIDE, [WIDE, SQUARE])


def test_the_token_count_follows_each_image_grid(served):
    """A wide image (3 x 1 tiles and the thumbnail) and a square one (one tile) count their own tiles' tokens, as
    Model.image_ids does."""
    lib = served.model
    counted, expanded = [], []
    for image in (WIDE, SQUARE):
        part = {"type": "base64", "media_type": "image/png", "data": base64.b64encode(image).decode()}
        body = {"messages": [{"role": "user", "content": [{"type": "image", "source": part}]}]}
        counted.append(_post(served, "/v1/messages/count_tokens", body)["input_tokens"])
        prompt = lib.render_chat([{"role": "user", "content": [{"type": "image", "image": image}]}])
        expanded.append(len(lib.image_ids(prompt, [image])[0]))
    assert counted == expanded
    assert counted[0] - counted[1] == 3 * vlm.PER      # three tiles more, no other token


def test_streams_with_images(served):
    got, want = streamed(served, WIDE)
    assert got == want


def test_a_truncated_image_is_a_400(served):
    """A PNG cut short after its header (its size is readable, its pixels are not): a 400, not a 500."""
    cut = base64.b64encode(WIDE[:len(WIDE) // 2]).decode()
    body = {"model": "vis", "max_tokens": 2, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + cut}}]}]}
    r = httpx.post(served.url + "/v1/chat/completions", timeout=60, json=body)
    assert r.status_code == 400, r.text
