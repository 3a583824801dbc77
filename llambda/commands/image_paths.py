"""Image files for `llambda run` and `llambda chat`: `--image FILE`, and paths typed in a message, as
`ollama run` finds them for a model that reads images.

A path in the text is taken when it starts with `/`, `./`, `../` or `~/` (a bare `cat.png` is a word)
and ends in an image extension (EXTENSIONS, any case); written plainly, its spaces and other shell
characters escaped with a backslash (`./my\\ cat.png`, as a terminal's drag and drop writes them), or in
quotes ('./my cat.png', "./my cat.png"). A path to no file stays text, as ollama leaves it; a file that
is there but cannot be read, is no image (by its first bytes: PNG, JPEG, GIF, WebP, BMP) or is larger
than the server's limit for an image is an error. Each image found is said on stderr ("Added image
'PATH'") and its path is taken out of the message. Only the transport is checked here: the image is
decoded by the model's vision tower (llambda.vision.load_image). For a model without one, the text is
left as typed (ollama does the same for its text models) and --image is an error.
"""
from __future__ import annotations

import os
import re
import stat
import sys
from typing import Callable

from ..errors import LlambdaError
from ..vision.image import MAX_IMAGE_BYTES     # the decoder's and the server's bound: the same files refused

EXTENSIONS = ("png", "jpg", "jpeg", "webp", "gif", "bmp")
_START = r"(?:[A-Za-z]:)?(?:\.{1,2}/|~/|/)"
_EXT = r"\.(?:" + "|".join(EXTENSIONS) + r")"
_PATHS = re.compile(
    rf"(?P<q>['\"])(?P<quoted>{_START}[^'\"\n]*?{_EXT})(?P=q)"                    # in quotes: as written
    # a word: after a blank that no backslash escapes (so no two words overlap: linear in the text)
    rf"|(?<!\S)(?<!\\\s)(?P<plain>{_START}(?:\\.|[^\s\\])*?{_EXT})(?=$|[\s,;:!?)\]}}]|\.(?:\s|$))",
    re.IGNORECASE)
_ESCAPED = re.compile(r"\\(.)")
_MAGIC: tuple[tuple[bytes, int], ...] = ((b"\x89PNG\r\n\x1a\n", 0), (b"\xff\xd8\xff", 0), (b"GIF87a", 0),
                                         (b"GIF89a", 0), (b"WEBP", 8), (b"BM", 0))


def looks_like_an_image(head: bytes) -> bool:
    """Whether a file's first bytes are an image format's signature (RIFF....WEBP for WebP)."""
    if head[8:12] == b"WEBP" and not head.startswith(b"RIFF"):
        return False
    return any(head[at:at + len(sig)] == sig for sig, at in _MAGIC)


def read_image(path: str) -> bytes:
    """An image file's bytes; LlambdaError for a file that is missing, unreadable, not a regular file,
    too large, or no image."""
    try:
        # O_NONBLOCK: a FIFO named here would wait for a writer forever
        with open(path, "rb", opener=lambda p, flags: os.open(p, flags | os.O_NONBLOCK)) as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise LlambdaError(f"cannot read the image {path}: not a regular file")
            data = f.read(MAX_IMAGE_BYTES + 1)
    except OSError as e:
        raise LlambdaError(f"cannot read the image {path}: {e.strerror or e}") from None
    if len(data) > MAX_IMAGE_BYTES:
        raise LlambdaError(f"the image {path} is larger than {MAX_IMAGE_BYTES // 2**20} MB")
    if not looks_like_an_image(data[:16]):
        raise LlambdaError(f"{path} is not an image (PNG, JPEG, WebP, GIF or BMP)")
    return data


def _unescaped(path: str) -> str:
    return os.path.expanduser(_ESCAPED.sub(r"\1", path))


def find_images(text: str, said: Callable[[str], None] | None = None) -> tuple[str, list[bytes]]:
    """(the text without the image paths found in it, their files' bytes in order). `said` gets the
    "Added image 'PATH'" line of each (default: stderr)."""
    said = said or (lambda line: print(line, file=sys.stderr, flush=True))
    found: list[bytes] = []
    kept: list[str] = []
    at = 0
    for m in _PATHS.finditer(text):
        path = m.group("quoted") or _unescaped(m.group("plain"))
        if m.group("quoted"):
            path = os.path.expanduser(path)
        if not os.path.lexists(path):
            continue        # no such file: a word that only looks like a path
        found.append(read_image(path))
        said(f"Added image '{path}'")
        kept.append(text[at:m.start()])
        at = m.end()
    if not found:
        return text, []
    kept.append(text[at:])
    return re.sub(r"[ \t]{2,}", " ", "".join(kept)).strip(), found


def image_message(text: str, images: list[bytes]) -> dict:
    """A user message of images (canonical parts, Model.chat's) and then the text."""
    parts = [{"type": "image", "image": data} for data in images]
    return {"role": "user", "content": parts + ([{"type": "text", "text": text}] if text else [])}


def no_vision(model_name: str) -> LlambdaError:
    return LlambdaError(f"{model_name} takes no images (it has no vision tower): --image needs a model with one "
                        "(Gemma 3 with its vision tower)")


def starts_with_image(line: str) -> bool:
    """Whether `line` starts with the path of an image file that is there (`/tmp/cat.png what is this?`):
    a message for a vision model, not a /command."""
    m = _PATHS.match(line.lstrip())
    return m is not None and m.group("plain") is not None and os.path.lexists(_unescaped(m.group("plain")))
