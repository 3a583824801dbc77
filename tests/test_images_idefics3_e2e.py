"""Idefics3 / SmolVLM images end to end through every API surface on a live server: the tiny Idefics3 of
tests/fixtures/reference/tiny/idefics3_vision (SmolVLM's chat template, its crop grids); each route's answer is
Model.chat's greedy reply to the same canonical messages (and `llambda run`'s, a prompt naming an image file), as
tests/test_images_e2e.py checks for Gemma 3. The API and CLI layers are generic: what differs is the prompt's
expansion (a run of soft tokens per crop) and its length, which depends on each image's size. The model's own
tower runs (llambda.vision's Idefics3, found by llambda.load): nothing here is a double."""
from __future__ import annotations

import base64

import httpx
import pytest

import llambda

import test_vlm_idefics3 as vlm  # noqa: E402  (the fixture and its images)
from test_images_e2e import _post, _want, every_surface, streamed  # noqa: E402  (Gemma 3's checks, shared)

WIDE, SQUARE = vlm.PNG["image_wide.png"], vlm.PNG["image_square.png"]
B64_W, B64_S = base64.b64encode(WIDE).decode(), base64.b64encode(SQUARE).decode()


def _load(**kw):
    """The fixture with its own tower, found by load() (llambda.vision's Idefics3: decoded, cropped, encoded)."""
    return llambda.load(vlm.FOLDER, backend="numpy", **{"n_ctx": 128, **kw})


@pytest.fixture(scope="module")
def served():
    from serverkit import LiveServer
    from llambda.server import ServerConfig, create_app
    m = _load(n_slots=2)
    ref = _load()       # the library's answers (the served one is busy)
    assert m.accepts_images and ref.accepts_images
    with m, ref, LiveServer(create_app(m, ServerConfig(model_id="vis", parallel=2))) as srv:
        srv.model = ref
        yield srv


def test_every_surface_reaches_the_model(served):
    every_surface(served, WIDE, [WIDE, SQUARE])


def test_the_token_count_follows_each_image_grid(served):
    """A wide image (1 x 2 crops and the whole image: 3 runs) and a square one (2 x 2 and the whole: 5 runs) count
    their own crops' tokens, as Model.image_ids does."""
    def count(data):
        return _post(served, "/v1/messages/count_tokens", {"messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}]}]})["input_tokens"]

    def library(image):
        text = served.model.render_chat([{"role": "user", "content": [{"type": "image", "image": image}]}])
        return len(served.model.image_ids(text, [image])[0])

    wide, square = count(B64_W), count(B64_S)
    assert (wide, square) == (library(WIDE), library(SQUARE))
    assert square - wide == 2 * (vlm.PER + 2) + 1    # two crops more (their two marker tokens each), a row's newline


def test_streams_with_images(served):
    got, want = streamed(served, SQUARE)
    assert got == want


def test_a_bad_image_is_a_400(served):
    r = httpx.post(served.url + "/v1/chat/completions", timeout=60, json={"model": "vis", "max_tokens": 2, "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,"
                                                                          + base64.b64encode(b"not a png").decode()}}]}]})
    assert r.status_code == 400, r.text


def test_run_on_the_command_line(served, tmp_path, monkeypatch, capsys):
    """`llambda run MODEL "... ./image_wide.png"`: the prompt's image through the chat template, Model.chat's reply."""
    from llambda import cli
    (tmp_path / "image_wide.png").write_bytes(WIDE)
    monkeypatch.chdir(tmp_path)
    model = _load()
    monkeypatch.setattr(llambda.api, "load", lambda name, **kw: model)
    want = _want(served.model, WIDE, "Look:")
    assert cli.main(["run", "-m", str(vlm.FOLDER), "--temperature", "0", "-n", "6", "--ignore-eos",
                     "Look: ./image_wide.png"]) == 0
    out = capsys.readouterr()
    assert out.out == want + "\n" and "Added image './image_wide.png'" in out.err
