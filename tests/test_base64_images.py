"""Images sent as base64 text: one decoder (llambda.vision.base64_text) behind every surface that takes them,
so the server's APIs (a 400 naming the field) and the chat REPL's /load of a saved conversation (a line
naming the file's key) take the same texts and refuse the same ones, for the same reasons."""
from __future__ import annotations

import base64
import json

import pytest

from llambda.errors import ImageDataError, InvalidInputError
from llambda.repl import ChatSession
from llambda.server import images as server_images
from llambda.server.errors import APIError
from llambda.vision import base64_text
from llambda.vision.base64_text import decode_image_base64

from test_image_paths import PNG_A, FakeModel

B64 = base64.b64encode(PNG_A).decode()
TAKEN = {"plain": B64,
         "mime-lines": "\r\n".join(B64[i:i + 76] for i in range(0, len(B64), 76)),
         "lf-lines": "\n".join(B64[i:i + 64] for i in range(0, len(B64), 64)) + "\n"}
# text -> (the refusal's code, words its message holds)
REFUSED = {"short": ("aGk", "invalid_base64", "multiple of 4"),
           "dollar": ("a$k=", "invalid_base64", "'$' at 1"),
           "inner-pad": ("aG=k", "invalid_base64", "'='"),
           "space": ("aGk= ", "invalid_base64", "' '"),
           "urlsafe": ("aGk_", "invalid_base64", "'_'"),
           "too-much-pad": ("QQ=====", "invalid_base64", "not a multiple of 4"),
           "data-url": ("data:image/png;base64," + B64, "invalid_base64", "after its ','"),
           "empty": ("", None, "empty"),
           "number": (5, None, "base64 string, got a number"),
           "null": (None, None, "base64 string, got null"),
           "array": (["aGk="], None, "base64 string, got an array")}


def _load(tmp_path, images) -> tuple[ChatSession, str]:
    f = tmp_path / "conv.json"
    f.write_text(json.dumps([{"role": "user", "content": "look", "images": images}]))
    s = ChatSession(FakeModel({}, True), {})
    return s, s.command(f"/load {f}")


@pytest.mark.parametrize("name", TAKEN)
def test_both_surfaces_take_the_same_text(tmp_path, name):
    text = TAKEN[name]
    assert decode_image_base64(text, "x") == PNG_A
    assert server_images.decode_base64(text, "images[0]", server_images.ImageCount()) == PNG_A
    s, said = _load(tmp_path, [text])
    assert said.startswith("loaded 1 messages"), said
    assert s.messages[0]["content"][0] == {"type": "image", "image": PNG_A}


@pytest.mark.parametrize("name", REFUSED)
def test_both_surfaces_refuse_the_same_text_for_the_same_reason(tmp_path, name):
    text, code, words = REFUSED[name]
    with pytest.raises(ImageDataError) as core:
        decode_image_base64(text, "images[0]")
    assert isinstance(core.value, InvalidInputError) and isinstance(core.value, ValueError)    # typed, plain
    assert core.value.code == code and words in str(core.value), str(core.value)
    with pytest.raises(APIError) as served:
        server_images.decode_base64(text, "images[0]", server_images.ImageCount())
    assert (served.value.status, served.value.code, served.value.param) == (400, code, "images[0]")
    assert served.value.message == str(core.value)       # the server's 400 says what the core said
    s, said = _load(tmp_path, [B64, text])      # the second image refused
    assert "loaded" not in said and s.messages == []
    assert said.endswith(str(ImageDataError(str(core.value).replace("images[0]", "'images'[1]")))), said


def test_the_size_bound_is_one_for_both(tmp_path, monkeypatch):
    """Told from the text's length before anything is decoded, on both surfaces."""
    monkeypatch.setattr(base64_text, "MAX_IMAGE_BYTES", 96)
    assert decode_image_base64("A" * 128, "x") == bytes(96)
    with pytest.raises(APIError) as served:
        server_images.decode_base64("$" * 10**6, "images[0]", server_images.ImageCount())
    assert served.value.code == "image_too_large" and "96 bytes" in served.value.message
    said = _load(tmp_path, ["A" * 132])[1]
    assert "'images'[0]: the image is about 99 bytes; at most 96 bytes an image" in said, said


def test_the_server_counts_only_strings_it_was_sent():
    """A value that is no string is refused before it counts toward the request's images."""
    count = server_images.ImageCount()
    with pytest.raises(APIError):
        server_images.decode_base64(5, "x", count)
    assert count.n == 0
    server_images.decode_base64(B64, "x", count)
    assert count.n == 1
