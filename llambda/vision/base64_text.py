"""An image sent as base64 text -> its file's bytes, checked before anything is decoded: the one decoder of
every surface that takes images as text (the server's APIs: llambda.server.images wraps its errors into
400s; the chat REPL's /load of a saved conversation), so each takes and refuses the same text.

Accepted: the standard alphabet, padded; line breaks are skipped (MIME writes them, Go's decoder reads
them). Refused, with ImageDataError (an InvalidInputError whose `code` names the refusal): text that is not
a string or is empty, any other character, missing or misplaced padding (no silent garbage), and an image
larger than MAX_IMAGE_BYTES, told from the text's length before it is decoded. Whether the bytes are an
image is the decoder's question (image.load_image, check_image).
"""
from __future__ import annotations

import base64
import re
from typing import Any

from ..errors import ImageDataError
from .image import MAX_IMAGE_BYTES

_BASE64 = re.compile(r"[A-Za-z0-9+/]*={0,2}")
_NOT_BASE64 = re.compile(r"[^A-Za-z0-9+/=]")


def decode_image_base64(text: Any, where: str) -> bytes:
    """The bytes of the image `text` holds as base64; `where` names it in the error (a request's field, a
    file's key)."""
    if not isinstance(text, str):
        raise ImageDataError(f"{where} must be a base64 string, got {kind(text)}")
    if "\n" in text or "\r" in text:
        text = text.replace("\r", "").replace("\n", "")
    size = len(text) // 4 * 3
    if size > MAX_IMAGE_BYTES:
        raise ImageDataError(f"{where}: the image is about {size} bytes; at most {MAX_IMAGE_BYTES} bytes an image",
                             code="image_too_large")
    if not text:
        raise ImageDataError(f"{where}: the image's base64 is empty")
    if not _BASE64.fullmatch(text) or len(text) % 4:
        bad = _NOT_BASE64.search(text)
        why = (f"the character {bad.group()!r} at {bad.start()}" if bad else
               "'=' inside the text" if "=" in text.rstrip("=") else
               f"{len(text)} characters, not a multiple of 4 (missing '=' padding?)" if len(text) % 4 else
               f"{len(text) - len(text.rstrip('='))} '=' at its end (at most 2)")
        if text[:5].lower() == "data:":
            why += " (a data: URL: send the base64 after its ',' alone here)"
        raise ImageDataError(f"{where} is not base64 (standard alphabet, padded): {why}", code="invalid_base64")
    return base64.b64decode(text, validate=True)


def kind(v: Any) -> str:
    """What a wrong value is, as an error says it: "null", "a boolean", "a number", "a string", "an array",
    "an object" (JSON's words), else the Python type's name."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    return {int: "a number", float: "a number", str: "a string", list: "an array",
            dict: "an object"}.get(type(v), type(v).__name__)
