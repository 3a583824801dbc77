"""Qwen3-VL images end to end through every API surface on a live server: test_images_qwen25vl_e2e's checks (each
route's answer is Model.chat's greedy reply to the same canonical messages, and `llambda run --image`'s; the
reference's two-image prompt gives transformers' greedy tokens through the OpenAI route; token counts follow each
image's grid) on the tiny Qwen3-VL of tests/fixtures/reference/tiny/qwen3_vl_vision. The API and CLI layers are
generic: what differs is the positions after each image (interleaved M-RoPE, the scheduler's per-sequence delta)
and the image rows' DeepStack columns, which ride on the scheduler's sequences. The model's own tower runs
(llambda.vision's Qwen3-VL, found by llambda.load): nothing here is a double."""
from __future__ import annotations

import base64
import concurrent.futures as cf
import io

import httpx
import pytest

import llambda

import test_vlm_qwen3vl as q  # noqa: E402  (the fixture and its images)
from test_images_qwen25vl_e2e import (serve, test_every_surface_reaches_the_model,  # noqa: F401 (run here too)
                                      test_run_with_an_image_flag, test_streams_with_images,
                                      test_the_reference_prompt_through_the_openai_route,
                                      test_the_token_count_follows_each_image_grid)

WIDE, TALL = q.FIX_PNG["image_wide.png"], q.FIX_PNG["image_tall.png"]


def _load(**kw):
    """The fixture with its own tower, found by load() (llambda.vision's Qwen3-VL: resized, patched, encoded)."""
    return llambda.load(q.FOLDER, backend="native", activations="f32", **{"n_ctx": 128, **kw})


@pytest.fixture(scope="module")
def served():
    yield from serve(_load, q, (WIDE, TALL), (TALL, WIDE, 15 - 12))      # grids 3 x 4, 5 x 3


# --- attacks (what a checker's own prompts and files do): each route's answer, or a 400 ---------------------

def _url(data: bytes) -> dict:
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(data).decode()}}


def _canonical(msgs: list) -> list:
    """Messages whose content lists hold bytes (an image) and str (text), as Model.chat's parts."""
    return [{**m, "content": [{"type": "image", "image": p} if isinstance(p, bytes) else {"type": "text", "text": p}
                              for p in m["content"]]} for m in msgs]


def _wire(msgs: list) -> list:
    """The same messages as OpenAI's chat parts."""
    return [{**m, "content": [_url(p) if isinstance(p, bytes) else {"type": "text", "text": p} for p in m["content"]]}
            for m in msgs]


def _chat(served, msgs, **body) -> dict:
    body = {"model": "vis", "messages": _wire(msgs), "max_tokens": 6, "temperature": 0, "ignore_eos": True, **body}
    r = httpx.post(served.url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_odd_prompts_concurrently_with_two_choices_each(served):
    """An image alone, the same image twice, an image in an earlier turn and another in the last: each prompt
    twice, four requests at a time, n = 2: every choice is Model.chat's greedy reply (both slots busy, the choices
    after the first reusing its prefix)."""
    cases = [[{"role": "user", "content": [WIDE]}],
             [{"role": "user", "content": [WIDE, WIDE, "same?"]}],
             [{"role": "user", "content": [TALL, "What is in this image?"]},
              {"role": "assistant", "content": ["A cat."]}, {"role": "user", "content": ["And in this one?", WIDE]}]]
    wants = [served.model.chat(_canonical(c), max_tokens=6, temperature=0, ignore_eos=True) for c in cases]
    with cf.ThreadPoolExecutor(4) as ex:
        got = list(ex.map(lambda c: [ch["message"]["content"] for ch in _chat(served, c, n=2)["choices"]], cases * 2))
    assert got == [[w, w] for w in wants] * 2


def test_the_next_turn_reuses_the_answer_after_an_image(served):
    """Turn 2 holds turn 1's image and answer: its prefix (past the image, into the answer) is reused, and the
    reply is a fresh model's."""
    turn1 = [{"role": "user", "content": [TALL, "What is in this image?"]}]
    a1 = _chat(served, turn1)["choices"][0]["message"]["content"]
    turn2 = turn1 + [{"role": "assistant", "content": [a1]}, {"role": "user", "content": ["And in this one?", WIDE]}]
    got = _chat(served, turn2)
    with served.load() as fresh:
        want = fresh.chat(_canonical(turn2), max_tokens=6, temperature=0, ignore_eos=True)
    assert got["choices"][0]["message"]["content"] == want
    assert got["usage"]["prompt_tokens_details"]["cached_tokens"] > 2 + 15 + 2


def _file(mode: str, size: tuple, fmt: str) -> bytes:
    from PIL import Image
    out = io.BytesIO()
    Image.new(mode, size, 128).save(out, fmt)
    return out.getvalue()


def test_hostile_and_odd_files_are_answered_or_refused(served):
    """Broken files and a huge header are 400s naming the problem; 16-bit grey, RGBA, CMYK, GIF, BMP, TIFF,
    WebP, a 1 x 1 pixel and a 3000 x 3000 image (resized down) are answered; 8 images past the context are a 400
    on the OpenAI and Ollama routes."""
    import struct
    import zlib

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    bomb = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 100000, 100000, 8, 2, 0, 0, 0)) + \
        chunk(b"IDAT", zlib.compress(b"\x00" * 10)) + chunk(b"IEND", b"")
    refused = {"truncated": (WIDE[:len(WIDE) // 2], "truncated"), "bomb": (bomb, "pixels"),
               "ratio": (_file("RGB", (500, 2), "PNG"), "aspect ratio")}
    for name, (data, match) in refused.items():
        r = httpx.post(served.url + "/v1/chat/completions", json={"model": "vis", "max_tokens": 2, "messages": _wire(
            [{"role": "user", "content": [data, "hi"]}])}, timeout=120)
        assert r.status_code == 400 and match in r.json()["error"]["message"], (name, r.text)
    for mode, size, fmt in (("I;16", (40, 40), "PNG"), ("RGBA", (40, 40), "PNG"), ("CMYK", (40, 40), "JPEG"),
                            ("P", (40, 40), "GIF"), ("RGB", (40, 40), "BMP"), ("RGB", (40, 40), "TIFF"),
                            ("RGB", (40, 40), "WEBP"), ("RGB", (1, 1), "PNG"), ("RGB", (3000, 3000), "PNG")):
        _chat(served, [{"role": "user", "content": [_file(mode, size, fmt), "hi"]}], max_tokens=2)
    eight = base64.b64encode(TALL).decode()
    for route, body in (("/v1/chat/completions", {"messages": _wire([{"role": "user", "content": [TALL] * 8}])}),
                        ("/api/chat", {"stream": False, "messages": [{"role": "user", "content": "hi",
                                                                      "images": [eight] * 8}]})):
        r = httpx.post(served.url + route, json={"model": "vis", **body}, timeout=120)
        assert r.status_code == 400 and "context" in r.text, (route, r.text)
