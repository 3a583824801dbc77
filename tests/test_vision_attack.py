"""Images as a hostile client or a careless caller sends them: decoding bounds (memory, not only pixels),
the library's image calls given what is not an image or a tower that lies, and a closed model. The tiny
Gemma 3 of tests/fixtures/reference/tiny/gemma3_vision with its own tower (test_vlm's folder with a
tokenizer and chat template)."""
from __future__ import annotations

import base64
import io
import struct
import threading
import tracemalloc
import zlib

import numpy as np
import pytest

import llambda
from llambda.errors import InvalidInputError, ModelClosedError, ModelFormatError, ModelNotFoundError
from llambda.vision.image import MAX_IMAGE_SIDE, load_image, to_rgb

import test_vlm as vlm  # noqa: E402  (the folder with a tokenizer, the fixture's images)

PNG_A = vlm.PNG["image_a.png"]


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def _black_png(w: int, h: int) -> bytes:
    """A 1-bit greyscale PNG of w x h black pixels: a few KB however many rows."""
    row = b"\0" * (1 + (w + 7) // 8)
    z = zlib.compressobj(9)
    data = b"".join(z.compress(row * 4096) for _ in range(h // 4096)) + z.compress(row * (h % 4096)) + z.flush()
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 1, 0, 0, 0, 0))
            + _chunk(b"IDAT", data) + _chunk(b"IEND", b""))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return vlm.folder_with_tokenizer(tmp_path_factory.mktemp("attack") / "gemma", vlm.TEMPLATE)


def _load(folder, **kw):
    return llambda.load(folder, backend="numpy", n_ctx=128, **kw)


# -- decoding ------------------------------------------------------------------------------------------

def test_a_side_past_the_bound_is_refused_before_decoding():
    """A 1-pixel-wide image 64M rows tall is within the pixel bound, but Pillow's pointer a row made its
    127 KB PNG cost 1.8 GB to decode: a side is bounded too (JPEG's and GIF's own 65535)."""
    assert load_image(_black_png(1, MAX_IMAGE_SIDE)).size == (1, MAX_IMAGE_SIDE)
    for w, h in ((1, MAX_IMAGE_SIDE + 1), (MAX_IMAGE_SIDE + 1, 1)):
        with pytest.raises(InvalidInputError, match="a side past"):
            load_image(_black_png(w, h))


def test_16_bit_greyscale_is_scaled_in_bounded_memory():
    """I;16 to 8 bits as before (v * 255 / 65535, rounded), without the whole image in int64 (an 8192 x 8192
    PNG had taken 1.2 GB to convert)."""
    rng = np.random.default_rng(0)
    small = rng.integers(0, 65536, (37, 53), dtype=np.uint16)
    want = ((small.astype(np.int64) * 255 + 32767) // 65535).astype(np.uint8)
    got = np.asarray(to_rgb(_pil().fromarray(small)))
    assert (got == want[:, :, None]).all()
    big = _pil().fromarray(np.full((4096, 4096), 40000, np.uint16))
    tracemalloc.start()
    try:
        rgb = to_rgb(big)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert rgb.getpixel((4095, 4095)) == (156, 156, 156)
    assert peak < 8 * 4096 * 4096, f"{peak >> 20} MB of NumPy arrays at once for a 16M-pixel image"


def test_a_jpeg_of_too_many_scans_is_refused_unread():
    """Each scan of a progressive JPEG decodes the whole image again and costs ~15 bytes: a 8192 x 8192 JPEG
    with its last scan repeated 300 times (413 KB) had taken 27 s to decode."""
    from llambda.vision.image import MAX_JPEG_SCANS
    buf = io.BytesIO()
    _pil().new("RGB", (64, 64), (120, 130, 140)).save(buf, "JPEG", progressive=True)
    data = buf.getvalue()
    assert load_image(data).size == (64, 64)       # a progressive JPEG's own scans (~10) are fine
    last = data[data.rindex(b"\xff\xda"):-2]         # its last scan, up to the end-of-image marker
    with pytest.raises(InvalidInputError, match="scans"):
        load_image(data[:-2] + last * MAX_JPEG_SCANS + b"\xff\xd9")


def _pil():
    from PIL import Image
    return Image


# -- the library's image calls -------------------------------------------------------------------------

class _Tracked:
    """A decoded image whose lifetime is counted."""
    alive = peak = 0

    def __init__(self):
        _Tracked.alive += 1
        _Tracked.peak = max(_Tracked.peak, _Tracked.alive)

    def __del__(self):
        _Tracked.alive -= 1


class _Tower:
    """A VisionTower double: rows of one value per image; `lie` makes encode give something else."""
    tokens_per_image, hidden = vlm.PER, 64

    def __init__(self, lie=None):
        self.lie, self.closed = lie, False

    def pixels(self, image):
        return np.zeros((3, 4, 4), np.float32)

    def encode(self, pixels):
        if self.lie is not None:
            return self.lie(len(pixels))
        return np.ones((len(pixels), self.tokens_per_image, self.hidden), np.float32)

    def close(self):
        self.closed = True


def test_images_are_decoded_one_at_a_time(folder):
    """Each image is made into pixels before the next is decoded: 8 images of 8192 x 8192 held decoded at
    once had been 2 GB for a request of 1.5 MB."""
    with _load(folder, vision=False) as m:
        m.attach_vision(_Tower(), load_image=lambda data: _Tracked())
        _Tracked.alive = _Tracked.peak = 0
        blocks = m.encode_images([b"first", b"second", b"third", b"fourth"], [2, 40, 80, 100])   # 4 files
        assert len(blocks) == 4 and _Tracked.peak == 1 and _Tracked.alive == 0


@pytest.mark.parametrize("image", ["abc", 1 << 40, None, [1, 2]], ids=["str", "int", "None", "list"])
def test_encode_images_takes_bytes_only(folder, image):
    """bytes() of a str was a TypeError, of an int that many zero bytes (a terabyte: MemoryError)."""
    with _load(folder) as m:
        with pytest.raises(InvalidInputError, match="bytes of an image file"):
            m.encode_images([image], [2])


def test_an_oversized_bytes_like_image_is_refused_uncopied(folder):
    """A bytearray or memoryview image part past the size bound: refused before any copy (chat's
    message_images and load_image each copied it whole first: a 2 GB one was 4 GB more)."""
    big = np.zeros(40 << 20, np.uint8)        # calloc'd: no page touched until something copies it
    with _load(folder) as m:
        for image in (memoryview(big), memoryview(big).cast("B", (big.size // 8, 8))):
            tracemalloc.start()
            try:
                with pytest.raises(InvalidInputError, match="more than the 20 MB"):
                    m.chat([{"role": "user", "content": [{"type": "image", "image": image}]}], max_tokens=1)
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
            assert peak < 8 << 20, f"{peak >> 20} MB allocated to refuse it"


def test_encode_images_takes_one_start_an_image(folder):
    with _load(folder) as m:
        with pytest.raises(InvalidInputError, match="one each"):
            m.encode_images([PNG_A, PNG_A], [2])


@pytest.mark.parametrize("lie", [lambda n: "abc", lambda n: [[[0.0] * 64] * vlm.PER, [[0.0] * 63]]],
                         ids=["str", "ragged"])
def test_a_tower_giving_no_array_is_a_model_format_error(folder, lie):
    with _load(folder, vision=False) as m:
        m.attach_vision(_Tower(lie), load_image=lambda data: object())
        with pytest.raises(ModelFormatError, match="no array of numbers"):
            m.chat(vlm.user("x", PNG_A), max_tokens=1)
        m.attach_vision(_Tower(), load_image=lambda data: object())
        assert m.chat(vlm.user("x", PNG_A), max_tokens=1, temperature=0)      # the model still answers


def test_a_tower_giving_pixels_of_two_shapes_is_a_model_format_error(folder):
    """np.stack's ValueError had come out bare."""
    class Ragged(_Tower):
        def pixels(self, image):
            return np.zeros((3, 4, 4 + image), np.float32)

    with _load(folder, vision=False) as m:
        m.attach_vision(Ragged(), load_image=lambda data: len(data))
        with pytest.raises(ModelFormatError, match="pixels"):
            m.encode_images([b"a", b"bb"], [2, 40])
        class Text(_Tower):
            def pixels(self, image):
                return "pixels"
        m.attach_vision(Text(), load_image=lambda data: object())
        with pytest.raises(ModelFormatError, match="pixels"):
            m.encode_images([b"a"], [2])


def test_a_tower_replaced_during_a_request_is_not_used_for_it(folder):
    """The tower is read once a request: replaced (attach_vision) while its images are decoded, the request
    is refused, not encoded by a tower that attach_vision has closed."""
    decoding, go = threading.Event(), threading.Event()

    def slow_decode(data):
        decoding.set()
        go.wait(10)
        return object()

    with _load(folder, vision=False) as m:
        first = _Tower()
        m.attach_vision(first, load_image=slow_decode)
        out = {}

        def request():
            try:
                out["blocks"] = m.encode_images([PNG_A], [2])
            except Exception as e:      # noqa: BLE001 (what it raised is the test's)
                out["error"] = e
        t = threading.Thread(target=request)
        t.start()
        assert decoding.wait(10)
        m.attach_vision(_Tower(), load_image=slow_decode)
        go.set()
        t.join(10)
        assert first.closed
        assert isinstance(out.get("error"), InvalidInputError) and "replaced" in str(out["error"]), out


def test_images_to_a_closed_model_are_a_model_closed_error(folder):
    """After close() (the tower freed with the model) accepts_images was False, so a server answered images
    with a 400 model_without_vision (test below); every image call is a ModelClosedError."""
    m = _load(folder)
    m.close()
    with pytest.raises(ModelClosedError):
        m.chat(vlm.user("x", PNG_A), max_tokens=1)
    with pytest.raises(ModelClosedError):
        m.encode_images([PNG_A], [2])
    with pytest.raises(ModelClosedError):
        m.accepts_images


def test_a_server_whose_model_was_closed_answers_images_503(folder):
    """An image request to a server whose model its program closed was a 400 model_without_vision."""
    from starlette.testclient import TestClient

    from llambda.server import ServerConfig, create_app
    m = _load(folder)
    url = "data:image/png;base64," + base64.b64encode(PNG_A).decode()
    body = {"model": "vis", "max_tokens": 1, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "x"}, {"type": "image_url", "image_url": {"url": url}}]}]}
    with TestClient(create_app(m, ServerConfig(model_id="vis", parallel=1)), base_url="http://127.0.0.1") as client:
        assert client.post("/v1/chat/completions", json=body).status_code == 200
        m.close()
        r = client.post("/v1/chat/completions", json=body)
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_closed", r.text
        r = client.post("/api/chat", json={"model": "vis", "stream": False, "messages": [
            {"role": "user", "content": "x", "images": [base64.b64encode(PNG_A).decode()]}]})
        assert r.status_code == 503, r.text


def test_a_missing_mmproj_is_model_not_found(folder, tmp_path):
    """It was a bare FileNotFoundError, not a llambda error."""
    with pytest.raises(ModelNotFoundError, match="no such file"):
        _load(folder, mmproj=tmp_path / "mmproj-missing.gguf")


def test_hostile_png_headers_are_refused_unread():
    """Sizes from the header alone: a 0 x 0, a 2^31-wide and a 100000^2 PNG, each a few bytes."""
    for w, h in ((0, 0), (2**31 - 1, 1), (100000, 100000)):
        data = (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
                + _chunk(b"IDAT", zlib.compress(b"\0" * 100)) + _chunk(b"IEND", b""))
        with pytest.raises(InvalidInputError):
            load_image(data)


# -- the server ----------------------------------------------------------------------------------------

class _GatedTower(_Tower):
    """encode waits for `go`: image requests held inside the tower as long as a test wants."""

    def __init__(self):
        super().__init__()
        self.go, self.entered = threading.Event(), threading.Event()

    def encode(self, pixels):
        self.entered.set()
        self.go.wait(60)
        return super().encode(pixels)


def test_text_requests_are_not_held_behind_image_encodings(folder):
    """The tower's encodings run one at a time; requests waiting for it held the prompt workers, so a text
    request waited for every image before it (minutes on a real tower). They now wait in a worker of their
    own."""
    import httpx
    from serverkit import LiveServer

    from llambda.server import ServerConfig, create_app
    m = _load(folder, vision=False, n_slots=2)
    tower = _GatedTower()
    m.attach_vision(tower, load_image=lambda data: object())
    url = "data:image/png;base64," + base64.b64encode(PNG_A).decode()
    image_body = {"model": "vis", "max_tokens": 1, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "x"}, {"type": "image_url", "image_url": {"url": url}}]}]}
    text_body = {"model": "vis", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
    with m, LiveServer(create_app(m, ServerConfig(model_id="vis", parallel=2, prompt_workers=2))) as srv:
        codes = []
        images = [threading.Thread(target=lambda: codes.append(
            httpx.post(srv.url + "/v1/chat/completions", json=image_body, timeout=120).status_code))
            for _ in range(4)]
        for t in images:
            t.start()
        try:
            assert tower.entered.wait(30)
            r = httpx.post(srv.url + "/v1/chat/completions", json=text_body, timeout=15)
            assert r.status_code == 200, r.text
        finally:
            tower.go.set()
            for t in images:
                t.join(120)
        assert codes == [200] * 4


def test_base64_of_too_much_padding_says_so():
    """'====' was said to be "4 characters, not a multiple of 4"."""
    from llambda.server.errors import APIError
    from llambda.server.images import ImageCount, decode_base64
    for text, why in (("QQ=====", "not a multiple of 4"), ("====", "4 '=' at its end"), ("QQ======", "6 '='")):
        with pytest.raises(APIError, match=why):
            decode_base64(text, "x", ImageCount())
