"""LLaVA 1.5 and LLaVA-NeXT images end to end through every API surface on a live server: the tiny LLaVA of
tests/fixtures/reference/tiny/llava_vision (llava-hf's chat template: images before the text) and the tiny LLaVA-NeXT
of llava_next_vision (an image's token count from its size); each route's answer is Model.chat's greedy reply to the
same canonical messages, as tests/test_images_e2e.py checks for Gemma 3. The models' own towers run
(llambda.vision's CLIP + projector, found by llambda.load): nothing here is a double."""
from __future__ import annotations

import base64

import httpx
import pytest

import llambda

import test_vlm_llava as vlm  # noqa: E402  (the fixture and its images)
from test_images_e2e import _post, every_surface, served_pair, streamed  # noqa: E402  (Gemma 3's checks, shared)

WIDE, TALL = vlm.PNG["image_wide.png"], vlm.PNG["image_tall.png"]


def _load(**kw):
    return llambda.load(vlm.FOLDER, backend="numpy", **{"n_ctx": 128, **kw})


@pytest.fixture(scope="module")
def served():
    yield from served_pair(_load)


def test_every_surface_reaches_the_model(served):
    every_surface(served, WIDE, [WIDE, TALL])
    assert "vision" in _post(served, "/api/show", {})["capabilities"]


def test_every_image_counts_its_tokens(served):
    """An image is 16 `<image>` tokens whatever its size: the server's counts are Model.image_ids' lengths."""
    def count(*images):
        return _post(served, "/v1/messages/count_tokens", {"messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": base64.b64encode(x).decode()}} for x in images]}]})["input_tokens"]

    def library(*images):
        text = served.model.render_chat([{"role": "user", "content": [{"type": "image", "image": x} for x in images]}])
        ids = served.model.image_ids(text, list(images))[0]
        assert ids.count(vlm.SOFT) == vlm.PER * len(images)
        return len(ids)
    assert (count(WIDE), count(WIDE, TALL), count(TALL)) == (library(WIDE), library(WIDE, TALL), library(TALL))
    assert count(WIDE) == count(TALL)


def test_streams_with_images(served):
    got, want = streamed(served, TALL)
    assert got == want


def test_a_bad_image_is_a_400_on_the_messages_route(served):
    bad = base64.b64encode(b"GIF89a not really").decode()
    r = httpx.post(served.url + "/v1/messages", timeout=60, json={"model": "vis", "max_tokens": 2, "messages": [
        {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/gif",
                                                                  "data": bad}}]}]})
    assert r.status_code == 400, r.text


NEXT = vlm.FOLDER.parent / "llava_next_vision"


@pytest.fixture(scope="module")
def served_next():
    yield from served_pair(lambda **kw: llambda.load(NEXT, backend="numpy", **{"n_ctx": 256, **kw}))


def test_llava_next_every_surface_and_its_token_counts(served_next):
    """LLaVA-NeXT through every route; count_tokens follows each image's grid (a 75 x 40 and a 130 x 90 image:
    52 and 70 image tokens), as Model.image_ids."""
    wide, big = (NEXT / "image_wide.png").read_bytes(), (NEXT / "image_big.png").read_bytes()
    every_surface(served_next, wide, [wide, big])

    def count(image):
        return _post(served_next, "/v1/messages/count_tokens", {"messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": base64.b64encode(image).decode()}}]}]})["input_tokens"]
    assert count(big) - count(wide) == 70 - 52
