"""Image files for `llambda run` and `llambda chat`: `--image FILE`, and paths typed in a message, as
`ollama run` finds them for a model that reads images.

A path in the text is taken when it starts with `/`, `./`, `../` or `~/` (a bare `cat.png` is a word)
and ends in an image extension (EXTENSIONS, any case); written plainly, its spaces and other shell
characters escaped with a backslash (`./my\\ cat.png`, as a terminal's drag and drop writes them), or in
quotes ('./my cat.png', "./my cat.png"). A path to no file stays text, as ollama leaves it; a file that
is there but cannot be read, is larger than an image may be, or is no image the vision tower's decoder
takes (by its header, llambda.vision's check_image: the same formats and limits, before the model loads)
is an error. Each image found is said on stderr ("Added image 'PATH'") and its path is taken out of the
message. The image is decoded by the model's vision tower (llambda.vision.load_image). For a model without
one, the text is left as typed (ollama does the same for its text models) and --image is an error.
"""
from __future__ import annotations

import os
import re
import stat
import sys
from typing import Callable

from ..chat import image_content
from ..errors import InvalidInputError, LlambdaError
from ..vision.image import MAX_IMAGE_BYTES, check_image     # the decoder's own bound and header checks

EXTENSIONS = ("png", "jpg", "jpeg", "webp", "gif", "bmp", "tif", "tiff")   # what vision.image decodes
_START = r"(?:[A-Za-z]:)?(?:\.{1,2}/|~/|/)"
_EXT = r"\.(?:" + "|".join(EXTENSIONS) + r")"
_PATHS = re.compile(
    rf"(?P<q>['\"])(?P<quoted>{_START}[^'\"\n]*?{_EXT})(?P=q)"                    # in quotes: as written
    # a word: after a blank that no backslash escapes (so no two words overlap: linear in the text)
    rf"|(?<!\S)(?<!\\\s)(?P<plain>{_START}(?:\\.|[^\s\\])*?{_EXT})(?=$|[\s,;:!?)\]}}]|\.(?:\s|$))",
    re.IGNORECASE)
_ESCAPED = re.compile(r"\\(.)")
def read_image(path: str) -> bytes:
    """An image file's bytes; LlambdaError for a file that is missing, unreadable, not a regular file,
    too large, or no image the vision tower's decoder takes (told from its header: check_image)."""
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
    try:
        check_image(data)
    except InvalidInputError as e:
        raise LlambdaError(f"{path} is not an image this model reads: {e}") from None
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
    return {"role": "user", "content": image_content(images, text)}


def no_vision(model_name: str) -> LlambdaError:
    return LlambdaError(f"{model_name} takes no images (it has no vision tower): --image needs a model with one "
                        "(Gemma 3 with its vision tower)")


def starts_with_image(line: str) -> bool:
    """Whether `line` starts with the path of an image file that is there (`/tmp/cat.png what is this?`):
    a message for a vision model, not a /command."""
    m = _PATHS.match(line.lstrip())
    return m is not None and m.group("plain") is not None and os.path.lexists(_unescaped(m.group("plain")))
