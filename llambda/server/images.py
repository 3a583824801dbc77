"""Images in requests: the transport every API shares, and the canonical part they all become.

A chat message's content may be a list of parts, {"type": "text", "text": str} and the canonical
image part {"type": "image", "image": bytes} (the encoded file as sent: PNG, JPEG, WebP, ...), which
is what the generation path takes. Each API's module converts its own shapes into it with these
functions; they check the transport only: strict base64 (no silent garbage), a data: URL's media type
(image/*), each image's decoded size (MAX_IMAGE_BYTES, told from the base64's length before anything
is decoded) and the images of one request (MAX_IMAGES). Decoding the image itself, and refusing a
hostile one, is llambda.vision.load_image's work. Remote images (http:// URLs, Anthropic's url
sources) are refused: this server never makes outbound requests; so are file ids (no file store).
A request with images to a model without a vision tower is a 400 `model_without_vision` (require_vision, which
the Service asks).
"""
from __future__ import annotations

from typing import Any

from ..chat import image_part, message_images
from ..models.images import DEFAULT_MAX_IMAGES
from ..errors import ImageDataError
from ..vision.base64_text import decode_image_base64, kind as _kind
from ..vision.image import MAX_IMAGE_BYTES  # noqa: F401  (one image's encoded file: the decoder's own bound)
from .errors import APIError, bad_request, shown

MAX_IMAGES = DEFAULT_MAX_IMAGES  # images in one request (a continued conversation's included): the model's
                                 # own default bound, so the 9th is refused here, before it is decoded
MAX_URL_HEAD = 256              # a data: URL's "image/png;name=...;base64" before its ','
DETAILS = ("auto", "low", "high")   # OpenAI's `detail`: accepted, no effect (the tower's resolution is fixed)
REMOTE = ("remote images are not fetched: this server makes no outbound requests; send the image itself "
          "(base64, in a data: URL such as data:image/png;base64,...)")


def is_image_part(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") == "image" and isinstance(part.get("image"), bytes)


def joined_parts(parts: list):
    """Texts (str) and canonical image parts in order, as a message's content: one string on newlines when
    there is no image (as text parts are joined without images), else the parts, each run of texts joined."""
    if not any(isinstance(p, dict) for p in parts):
        return "\n".join(parts)
    out: list[dict] = []
    for p in parts:
        if isinstance(p, dict):
            out.append(p)
        elif out and out[-1]["type"] == "text":
            out[-1] = {"type": "text", "text": out[-1]["text"] + "\n" + p}
        else:
            out.append({"type": "text", "text": p})
    return out


class ImageCount:
    """The images of one request so far: a 400 past MAX_IMAGES, before the next one is decoded."""

    def __init__(self):
        self.n = 0

    def take(self, where: str) -> None:
        self.n += 1
        if self.n > MAX_IMAGES:
            raise bad_request(f"{where}: more than {MAX_IMAGES} images in one request (a continued "
                              "conversation's included)", param=where, code="too_many_images")


def decode_base64(text: Any, where: str, count: ImageCount) -> bytes:
    """An image sent as base64 text (vision.base64_text's checks, the REPL's too), counted; its refusals
    as 400s."""
    if isinstance(text, str):
        count.take(where)
    try:
        return decode_image_base64(text, where)
    except ImageDataError as e:
        raise bad_request(str(e), param=where, code=e.code) from None


def check_media_type(media: Any, where: str) -> None:
    """A declared media type must be an image's (image/png, image/jpeg, ...)."""
    if not isinstance(media, str) or not media.strip().lower().startswith("image/"):
        what = shown(media) if isinstance(media, str) else _kind(media)
        raise bad_request(f"{where}: the media type {what} is not an image's (image/png, image/jpeg, image/webp, "
                          "image/gif, ...)", param=where, code="invalid_media_type")


def from_url(url: Any, where: str, count: ImageCount) -> bytes:
    """An image given as a URL (OpenAI's image_url, Responses' input_image): only a base64 data: URL
    of an image media type; an http(s) URL is refused, not fetched."""
    if not isinstance(url, str):
        raise bad_request(f"{where} must be a URL string, got {_kind(url)}", param=where)
    scheme = url[:url.find(":")].strip().lower() if ":" in url[:12] else ""
    if scheme in ("http", "https"):
        raise bad_request(f"{where}: {REMOTE}", param=where, code="remote_image")
    if scheme != "data":
        raise bad_request(f"{where} must be a data: URL (data:image/png;base64,...), got {shown(url[:40])}",
                          param=where, code="invalid_image_url")
    head, comma, payload = url[url.find(":") + 1:].partition(",")
    if not comma:
        raise bad_request(f"{where}: a data: URL needs a ',' before its data", param=where,
                          code="invalid_image_url")
    if len(head) > MAX_URL_HEAD:
        raise bad_request(f"{where}: a data: URL's media type and parameters (before ',') are {len(head)} "
                          f"characters; at most {MAX_URL_HEAD}", param=where, code="invalid_image_url")
    fields = [f.strip().lower() for f in head.split(";")]
    check_media_type(fields[0], where)
    if fields[-1] != "base64":
        raise bad_request(f"{where}: only base64 data: URLs are taken (data:{fields[0]};base64,...)", param=where,
                          code="invalid_image_url")
    return decode_base64(payload, where, count)


def require_vision(service, spec) -> list[bytes]:
    """The images of a chat spec's messages (chat.message_images); a 400 `model_without_vision` when it
    holds some and the served model has no vision tower (Model.accepts_images). Service asks it, for every
    route that renders a chat."""
    images = message_images(spec.messages) if spec.kind == "chat" else []
    if not images or getattr(service.model, "accepts_images", False):
        return images
    raise APIError(400, f"the model {service.cfg.model_id!r} takes no images (it has no vision tower): send "
                        "text only, or serve a model with a vision tower (Gemma 3, SmolVLM)",
                   param=spec.messages_param, code="model_without_vision")


# -- OpenAI's chat content parts ------------------------------------------------------------

# content parts OpenAI's chat takes that this server does not: refused by name
REFUSED_PARTS = {"input_audio": "audio", "audio": "audio", "file": "files", "input_file": "files",
                 "video_url": "video"}


def openai_content(content: Any, where: str, role: Any, count: ImageCount) -> Any:
    """A chat message's content with its image_url parts as canonical image parts (other parts as
    they are: chat.py checks them). Canonical parts already there (another API's conversion) are
    counted."""
    if not isinstance(content, list):
        return content
    out = []
    for j, part in enumerate(content):
        at = f"{where}[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "image_url":
            if role != "user":
                raise bad_request(f"{at}: image_url parts are only allowed in user messages, not {shown(role)}",
                                  param=at)
            out.append(image_part(_image_url(part.get("image_url"), at, count)))
        elif kind == "image":
            if not is_image_part(part):
                raise bad_request(f"{at}: send an image as an image_url part (a data: URL), not an 'image' part",
                                  param=at)
            count.take(at)
            out.append(part)
        elif isinstance(kind, str) and kind in REFUSED_PARTS:
            raise bad_request(f"{at} is a {kind!r} part: this server reads no {REFUSED_PARTS[kind]} (text and "
                              "image_url parts are taken)", param=at)
        else:
            out.append(part)
    return out


def _image_url(v: Any, at: str, count: ImageCount) -> bytes:
    """{"url": ..., "detail": ...}, or the URL alone as a string (as some clients send it)."""
    if isinstance(v, str):
        return from_url(v, f"{at}.image_url", count)
    if not isinstance(v, dict):
        raise bad_request(f"{at}.image_url must be an object {{\"url\": \"data:...\"}} or a URL string, got "
                          f"{_kind(v)}", param=f"{at}.image_url")
    check_detail(v.get("detail"), f"{at}.image_url.detail")
    return from_url(v.get("url"), f"{at}.image_url.url", count)


def check_detail(v: Any, where: str) -> None:
    if v is not None and v not in DETAILS:
        what = shown(v) if isinstance(v, str) else _kind(v)
        raise bad_request(f"{where} must be one of {', '.join(DETAILS)}, got {what}", param=where)
