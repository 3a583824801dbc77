"""Image requests as a hostile client sends them, through a live server's routes: the tiny Gemma 3
(gemma3_vision, with test_vlm's byte tokenizer and template) and the tiny Idefics3 (idefics3_vision, its own
SmolVLM template); their own towers, encoded for real.

- a client that hangs up while its request waits for the image worker: its images are never encoded (the
  worker's queue is not a place to leave seconds of tower work for nobody), and the server goes on;
- Idefics3 images whose crops make a prompt past the context: a 400 naming the context before any image is
  decoded or encoded;
- requests of both families' images interleaved with text requests and hang-ups: every answer is the answer
  the request gets alone, and no slot is left held.
"""
from __future__ import annotations

import base64
import io
import json
import shutil
import threading
import time

import httpx
import numpy as np
import pytest

import llambda

import test_vlm as vlm
import test_vlm_idefics3 as ivlm


def _png(w: int, h: int, colour=(200, 30, 60)) -> bytes:
    from PIL import Image
    b = io.BytesIO()
    Image.new("RGB", (w, h), colour).save(b, "PNG")
    return b.getvalue()


def _body(*images: bytes, text: str = "Look:", n: int = 3, **extra) -> dict:
    parts = [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(i).decode()}}
             for i in images]
    return {"model": "vis", "max_tokens": n, "temperature": 0, **extra,
            "messages": [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]}


def _post(srv, body, timeout=120) -> httpx.Response:
    return httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=timeout)


def _serve(model, **cfg):
    from serverkit import LiveServer
    from llambda.server import ServerConfig, create_app
    return LiveServer(create_app(model, ServerConfig(model_id="vis", **cfg)))


class Held:
    """Model.encode_images wrapped: each call's first image recorded, every call held until released."""

    def __init__(self, model):
        self.real, self.calls = model.encode_images, []
        self.entered, self.release = threading.Event(), threading.Event()

    def __call__(self, images, starts):
        self.calls.append(bytes(images[0]))
        self.entered.set()
        assert self.release.wait(60)
        return self.real(images, starts)


@pytest.fixture(scope="module")
def gemma_folder(tmp_path_factory):
    return vlm.folder_with_tokenizer(tmp_path_factory.mktemp("hostile") / "gemma", vlm.TEMPLATE)


def test_a_request_whose_client_left_while_queued_is_never_encoded(gemma_folder, monkeypatch):
    """The image worker's queue holds one request: one whose client hangs up while it waits leaves it at once
    (the next request is queued, not a 429) and is never encoded."""
    first, left, later = _png(40, 30), _png(30, 40, (10, 200, 10)), _png(50, 50, (0, 0, 250))
    with llambda.load(gemma_folder, backend="numpy", n_ctx=128, n_slots=1) as m, \
            _serve(m, parallel=1, queue_size=1, prompt_workers=1) as srv:
        held = Held(m)
        monkeypatch.setattr(m, "encode_images", held)
        codes = []
        posts = [threading.Thread(target=lambda image=image: codes.append(_post(srv, _body(image)).status_code))
                 for image in (first, later)]
        posts[0].start()
        try:
            assert held.entered.wait(30)
            with pytest.raises(httpx.TimeoutException):     # waits behind `first`, then hangs up
                _post(srv, _body(left), timeout=1.0)
            t0 = time.monotonic()
            while httpx.get(srv.url + "/health", timeout=30).json()["image_worker"]["waiting"]:
                assert time.monotonic() - t0 < 10, "the request whose client left still holds the image queue"
                time.sleep(0.05)
            posts[1].start()
            while httpx.get(srv.url + "/health", timeout=30).json()["image_worker"]["waiting"] < 1 and not codes:
                assert time.monotonic() - t0 < 30
                time.sleep(0.05)
        finally:
            held.release.set()
            for t in posts:
                t.join(120) if t.ident else None
        assert sorted(codes) == [200, 200]
        assert held.calls == [first, later], "the images of a request whose client had gone were encoded"
        m_ = srv.wait_idle()
        assert m_["llambda_image_queue_depth"] == 0 and m_["llambda_image_worker_busy"] == 0


@pytest.fixture(scope="module")
def big_grid(tmp_path_factory):
    """The Idefics3 fixture with a longest edge of 6 crops (the most a processor may have): a square image is
    6 x 6 crops and the whole image, 37 runs of soft tokens."""
    d = tmp_path_factory.mktemp("grid") / "idefics3"
    shutil.copytree(ivlm.FOLDER, d)
    p = d / "preprocessor_config.json"
    cfg = json.loads(p.read_text())
    cfg["size"] = {"longest_edge": 6 * cfg["max_image_size"]["longest_edge"]}
    p.write_text(json.dumps(cfg))
    return d


def test_crops_past_the_context_are_a_400_before_any_image_is_decoded(big_grid, monkeypatch):
    import llambda.vision.image as vimage
    with llambda.load(big_grid, backend="numpy", n_ctx=512) as m, _serve(m, parallel=1) as srv:
        assert m.vision.grid(1000, 1000) == (6, 6)
        decoded = []
        real_load = vimage.load_image
        monkeypatch.setattr(vimage, "load_image", lambda data: decoded.append(1) or real_load(data))
        monkeypatch.setattr(m, "encode_images", lambda *a: pytest.fail("encoded"))
        big = [_png(1000, 1000, (i, 0, 0)) for i in range(8)]
        t0 = time.monotonic()
        r = _post(srv, _body(*big))
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
        assert "context" in r.json()["error"]["message"] and time.monotonic() - t0 < 10
        assert not decoded
        # the Anthropic route counts them alike (a count is no generation: no 400)
        count = httpx.post(srv.url + "/v1/messages/count_tokens", timeout=60, json={"model": "vis", "messages": [
            {"role": "user", "content": [{"type": "image", "source": {
                "type": "base64", "media_type": "image/png", "data": base64.b64encode(big[0]).decode()}}]}]})
        assert count.status_code == 200 and count.json()["input_tokens"] > 37 * ivlm.PER, count.text


@pytest.fixture(scope="module")
def idefics():
    """A served Idefics3 (.srv) and the library's own copy (.ref: the served one's forwards are the server's)."""
    with llambda.load(ivlm.FOLDER, backend="numpy", n_ctx=256) as m, \
            llambda.load(ivlm.FOLDER, backend="numpy", n_ctx=256) as ref, _serve(m, parallel=1) as srv:
        srv.ref = ref
        yield srv


@pytest.mark.parametrize("size", [(1, 60000), (60000, 1), (1, 1)])
def test_extreme_aspect_ratios_are_answered(idefics, size):
    """A 1 x 60000 or 60000 x 1 image (one side of 1 pixel against a long one: Idefics3's resizes keep at least
    one crop a side) is answered as the library answers it."""
    image = _png(*size)
    r = _post(idefics, _body(image))
    assert r.status_code == 200, r.text
    want = idefics.ref.chat([{"role": "user", "content": [{"type": "image", "image": image},
                                                          {"type": "text", "text": "Look:"}]}],
                            max_tokens=3, temperature=0)
    assert r.json()["choices"][0]["message"]["content"] == want


def test_both_families_interleaved_with_text_and_hang_ups(gemma_folder):
    """Image requests (both families, distinct images), text requests and streams the client leaves after a few
    lines, all at once: each answer is the one the request got alone, and every slot is free afterwards."""
    images = [_png(20 + 7 * i, 30 + 5 * i, (40 * i, 255 - 30 * i, 90)) for i in range(4)]
    with llambda.load(gemma_folder, backend="numpy", n_ctx=128, n_slots=2) as g, \
            llambda.load(ivlm.FOLDER, backend="numpy", n_ctx=256, n_slots=2) as i_, \
            _serve(g, parallel=2) as gs, _serve(i_, parallel=2) as is_:
        bodies = [(srv, _body(*pair, n=4)) for srv in (gs, is_) for pair in ([images[0]], images[1:3], [images[3]])]
        bodies += [(srv, {"model": "vis", "max_tokens": 4, "temperature": 0,
                          "messages": [{"role": "user", "content": f"text {k}"}]}) for srv in (gs, is_) for k in range(2)]

        def answer(srv, body):
            r = _post(srv, body)
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["message"]["content"]

        alone = [answer(srv, body) for srv, body in bodies]
        got: dict[int, str] = {}
        errors: list[BaseException] = []

        def run(k):
            try:
                got[k] = answer(*bodies[k])
            except BaseException as e:      # reported below
                errors.append(e)

        def hang_up(srv, body):
            try:
                with httpx.stream("POST", srv.url + "/v1/chat/completions", json={**body, "stream": True,
                                                                                 "max_tokens": 30},
                                  timeout=60) as s:
                    next(s.iter_lines())
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=run, args=(k,)) for k in range(len(bodies))]
        threads += [threading.Thread(target=hang_up, args=(srv, _body(images[k % 4], text="bye")))
                    for srv in (gs, is_) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
        assert not errors, errors
        assert [got[k] for k in range(len(bodies))] == alone
        for srv in (gs, is_):
            m = srv.wait_idle()
            assert m["llambda_image_queue_depth"] == 0 and m["llambda_image_worker_busy"] == 0
            h = httpx.get(srv.url + "/health", timeout=30).json()
            assert h["slots_idle"] == 2 and h["image_worker"]["state"] == "idle", h


def test_the_tower_holds_one_images_crops_at_a_time():
    """Model.encode_images with several images: while the tower encodes, the pixels of one image are alive, not
    every image's (a request's 8 images of 17 SmolVLM crops of 3 MB each had all been held at once)."""
    import gc
    import weakref
    images = [_png(60 + 3 * i, 64, (30 * i, 9, 9)) for i in range(3)]
    with llambda.load(ivlm.FOLDER, backend="numpy", n_ctx=256) as m:
        tower = m.vision
        alive, seen = [], []
        real_pixels, real_encode = tower.pixels, tower.encode

        def pixels(image):
            px = real_pixels(image)
            alive.append(weakref.ref(px))
            return px

        def encode(px):
            gc.collect()
            seen.append(sum(r() is not None for r in alive))
            return real_encode(px)

        tower.pixels, tower.encode = pixels, encode
        text = m.render_chat([{"role": "user", "content": [{"type": "image", "image": i} for i in images]}])
        ids, blocks = m.image_prompt(text, images)
        assert len(alive) == 3 and seen and max(seen) == 1, seen
        assert len(blocks) == sum(r * c + 1 for r, c in m.image_input.grids(images))


@pytest.mark.parametrize("text", ["hello <image> world", "<fake_token_around_image><global-img><image>", "plain"])
def test_the_image_token_typed_without_an_image_is_refused_as_the_library_refuses_it(idefics, text):
    """A completion's prompt holding the image soft token with no image: the library refuses it (no image's rows
    for the token); the server had answered it, the text embedding of `<image>` in the image's place. Typed in
    a chat message it is text (Model.literal), in the library and on the server alike."""
    from llambda.errors import InvalidInputError
    idefics.ref.chat([{"role": "user", "content": text}], max_tokens=2, temperature=0)
    refused = "<image>" in text
    if refused:
        with pytest.raises(InvalidInputError, match="no image fills"):
            list(idefics.ref.stream(text, max_tokens=2))
    for path, body, status in (("/v1/chat/completions", {"messages": [{"role": "user", "content": text}]}, 200),
                               ("/v1/completions", {"prompt": text}, 400 if refused else 200)):
        r = httpx.post(idefics.url + path, timeout=60, json={"model": "vis", "max_tokens": 2, **body})
        assert r.status_code == status, r.text
        if status == 400:
            assert "no image fills" in r.json()["error"]["message"]


def test_a_receive_that_fails_while_a_request_starts_leaves_it_to_go_on():
    """Http.started: an ASGI receive that raises (no disconnect said) neither loses the started generation nor
    raises asyncio's InvalidStateError; one that says the client left before the start ends gives None and
    cancels the start."""
    import asyncio

    from llambda.server.deltas import Http

    class Service:
        def __init__(self, delay):
            self.delay, self.cancelled = delay, False

        async def start(self, spec):
            try:
                await asyncio.sleep(self.delay)
            except asyncio.CancelledError:
                self.cancelled = True
                raise
            return ("gen", spec)

    class Request:
        def __init__(self, receive):
            self.receive = receive

    async def broken():
        raise RuntimeError("the connection's reader failed")

    async def hung_up():
        return {"type": "http.disconnect"}

    http = Http(None, None, None, None)

    async def main():
        assert await http.started(Request(broken), Service(0.05), "spec") == ("gen", "spec")
        service = Service(5)
        assert await http.started(Request(hung_up), service, "spec") is None
        await asyncio.sleep(0)
        assert service.cancelled

    asyncio.run(main())


def test_a_prefix_shared_up_to_the_crop_that_differs_gives_each_requests_own_answer(idefics):
    """One slot: requests whose images agree in their first image (its crops' rows reused from the slot's cached
    prefix) and differ in the second, or are the same images in the other order, each get the answer the library
    gives them alone."""
    a, b, c = _png(64, 40, (250, 0, 0)), _png(40, 64, (0, 250, 0)), _png(64, 40, (0, 0, 250))
    for images in ([a, b], [a, c], [a, b], [b, a], [a], [a, b, c]):
        r = _post(idefics, _body(*images, n=4))
        assert r.status_code == 200, r.text
        want = idefics.ref.chat([{"role": "user", "content": [*({"type": "image", "image": i} for i in images),
                                                              {"type": "text", "text": "Look:"}]}],
                                max_tokens=4, temperature=0)
        assert r.json()["choices"][0]["message"]["content"] == want, len(images)


def _chunk(kind: bytes, body: bytes) -> bytes:
    import struct
    import zlib
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _records_bombs() -> dict:
    """Files of ~8 MB that are almost all records Pillow parses one by one in Python, and a picture."""
    from PIL import Image
    size = 8 << 20
    png, jpg, gif = io.BytesIO(), io.BytesIO(), io.BytesIO()
    Image.new("RGB", (8, 8)).save(png, "PNG")
    Image.new("RGB", (8, 8)).save(jpg, "JPEG")
    Image.new("P", (8, 8)).save(gif, "GIF")
    png, jpg, gif = png.getvalue(), jpg.getvalue(), gif.getvalue()
    empty = _chunk(b"prVt", b"")
    at = gif.index(b"\x2c", 13 + (3 << ((gif[10] & 7) + 1) if gif[10] & 0x80 else 13))
    return {"png": png[:33] + empty * (size // len(empty)) + png[33:],
            "jpeg": jpg[:2] + b"\xff\xfe\x00\x02" * (size // 4) + jpg[2:],
            "gif": gif[:at] + b"\x21\xfe\x01a\x00" * (size // 5) + gif[at:]}


@pytest.mark.parametrize("kind", ["png", "jpeg", "gif"])
def test_a_file_of_countless_header_records_is_refused_at_once(kind):
    """8 MB of empty PNG chunks, JPEG comments or GIF comment blocks: Pillow parses each in Python with the GIL
    held (a 19 MB PNG had taken 8 s to open, and 9 s more to load); refused in milliseconds, by check_image and
    load_image alike."""
    from llambda.errors import InvalidInputError
    from llambda.vision import check_image, load_image
    data = _records_bombs()[kind]
    for f in (check_image, load_image):
        t0 = time.process_time()
        with pytest.raises(InvalidInputError, match="parsed one at a time"):
            f(data)
        assert time.process_time() - t0 < 0.5


def test_files_of_ordinary_records_are_taken():
    """What is refused is the count against the size: a PNG in 8 KB data chunks (libpng's), a JPEG with its usual
    segments and a long comment, a GIF with comments, and a long animated GIF are decoded."""
    from PIL import Image

    from llambda.vision import load_image
    rng = np.random.default_rng(0)
    noise = Image.fromarray(rng.integers(0, 256, (600, 800, 3), dtype=np.uint8))
    b = io.BytesIO()
    noise.save(b, "PNG", compress_level=0)
    raw = b.getvalue()
    iend = raw.rindex(b"IEND") - 4
    pos, idat = 8, b""
    chunks = []
    while pos < iend:
        n = int.from_bytes(raw[pos:pos + 4], "big")
        kind, body = raw[pos + 4:pos + 8], raw[pos + 8:pos + 8 + n]
        if kind == b"IDAT":
            idat += body
        else:
            chunks.append(_chunk(kind, body))
        pos += 12 + n
    split = b"".join(_chunk(b"IDAT", idat[i:i + 8192]) for i in range(0, len(idat), 8192))
    png = raw[:8] + chunks[0] + b"".join(chunks[1:]) + split + _chunk(b"IEND", b"")
    assert len(split) // 8204 > 128 and load_image(png).size == (800, 600)
    b = io.BytesIO()
    noise.save(b, "JPEG", comment=b"x" * 60000, exif=Image.Exif().tobytes())
    assert load_image(b.getvalue()).size == (800, 600)
    frames = [Image.new("P", (16, 16), i % 7) for i in range(3000)]
    b = io.BytesIO()
    frames[0].save(b, "GIF", save_all=True, append_images=frames[1:], comment=b"c" * 2000, duration=10)
    t0 = time.process_time()
    assert load_image(b.getvalue()).size == (16, 16) and time.process_time() - t0 < 0.5
