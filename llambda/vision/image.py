"""Image bytes -> an RGB Pillow image, refusing what is hostile or unsupported with InvalidInputError.

- formats: PNG, JPEG (phones' multi-picture MPO files too, which Pillow's JPEG plugin opens), WebP, GIF, BMP,
  TIFF; nothing else is even tried (Pillow's other plugins include EPS, which runs Ghostscript);
- limits: MAX_IMAGE_BYTES of encoded data, MAX_IMAGE_PIXELS (width x height) and MAX_IMAGE_SIDE, read from the
  header before any pixel is decoded: a decompression bomb is refused unread; MAX_JPEG_SCANS (each scan of a
  progressive JPEG decodes the whole image again);
- a truncated or corrupt file is refused (Pillow's LOAD_TRUNCATED_IMAGES is never set);
- animated images (GIF, WebP, APNG): the first frame;
- EXIF orientation is applied (the image as a viewer shows it, as transformers' load_image does), read from
  what the header holds (orientation(): the same tag check_image reads, so the size it gives is the
  decoded image's);
- to RGB as transformers' convert_to_rgb does: an image with alpha (RGBA, LA, a palette or greyscale with a
  transparent colour) is composited over white, everything else (L, P, CMYK, ...) through Pillow's
  convert("RGB"); but 16-bit greyscale is scaled to 8 bits first (Pillow's conversion clips it to white).
"""
from __future__ import annotations

import io
import warnings
from contextlib import contextmanager

from ..errors import InvalidInputError
from .records import check_records

MAX_IMAGE_BYTES = 20 << 20          # an image's file, wherever it comes from (OpenAI's own limit; the server's
                                     # and the CLI's too, so every path refuses the same files)
MAX_IMAGE_PIXELS = 64 << 20          # 8192 x 8192; Pillow's own bomb limit is 89.5M (its error at twice that)
# a side's bound (JPEG's and GIF's own): Pillow keeps a pointer a row, so a 1-pixel-wide image 64M rows tall
# had taken 1.8 GB to decode from a 127 KB PNG
MAX_IMAGE_SIDE = 65535
# a progressive JPEG's scans each pass over the whole image (~90 ms at 8192 x 8192), and one costs ~15 bytes:
# 300 repeated scans (413 KB) had taken 27 s to decode. libjpeg's progressive scripts write ~10
MAX_JPEG_SCANS = 100
FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF")


def pillow():
    """Pillow's Image and ImageOps modules; InvalidInputError saying how to install it where it is missing."""
    try:
        from PIL import Image, ImageOps
    except ImportError as e:    # a declared dependency, but an install may lack it
        raise InvalidInputError(f"images need Pillow (pip install Pillow): {e}") from None
    return Image, ImageOps


def load_image(data: bytes):
    """The image encoded in `data` (bytes of a PNG, JPEG, WebP, GIF, BMP or TIFF file) as an RGB
    PIL.Image.Image, fully decoded; InvalidInputError with a message for anything else."""
    Image, _ = pillow()
    with _refused(Image):
        im = _opened(Image, data)       # at its first frame (an animation's n_frames would walk every frame)
        turn = _TRANSPOSE.get(orientation(im))
        im.load()
        if turn is not None:
            im = im.transpose(getattr(Image.Transpose, turn))
        return to_rgb(im)


def check_image(data: bytes) -> tuple[int, int]:
    """What load_image refuses before decoding a pixel (not bytes, empty, too large, not one of FORMATS,
    too many pixels or scans, a side too long), told from the file's header alone: InvalidInputError. A file may still be corrupt
    further in. Returns (width, height) of the image load_image gives: its EXIF orientation applied."""
    Image, _ = pillow()
    with _refused(Image):
        im = _opened(Image, data)
        w, h = im.size
        turned = orientation(im) in _SWAPS
        im.close()
    return (h, w) if turned else (w, h)


# EXIF orientation (tag 0x0112) -> the transpose that shows the image upright (the EXIF specification's table;
# 1 and anything unknown: as stored). 5..8 swap width and height.
_TRANSPOSE = {2: "FLIP_LEFT_RIGHT", 3: "ROTATE_180", 4: "FLIP_TOP_BOTTOM", 5: "TRANSPOSE", 6: "ROTATE_270",
             7: "TRANSVERSE", 8: "ROTATE_90"}
_SWAPS = (5, 6, 7, 8)


def orientation(im) -> int:
    """The EXIF orientation of an opened image, from what its header holds (EXIF, a PNG's text or XMP chunks
    before the pixel data): Pillow's own getexif, without the PNG plugin's decode of the whole file to look
    for chunks after the pixels (those are ignored here and by load_image alike)."""
    Image, _ = pillow()
    value = Image.Image.getexif(im).get(0x0112, 1)
    return value if isinstance(value, int) else 1


def _opened(Image, data):
    """`data` opened by one of FORMATS' plugins, its header read and its size checked, no pixel decoded."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InvalidInputError(f"an image must be the bytes of an image file, got {type(data).__name__}")
    size = memoryview(data).nbytes      # before any copy: a 2 GB bytearray was copied whole, then refused
    if not size:
        raise InvalidInputError("the image is empty (0 bytes)")
    if size > MAX_IMAGE_BYTES:
        raise InvalidInputError(f"the image is {size} bytes, more than the {MAX_IMAGE_BYTES >> 20} MB allowed")
    if not isinstance(data, bytes):
        data = bytes(data)
    check_records(data)     # records Pillow would parse one by one in Python: bounded by the file's size
    Image.init()        # every plugin registered: a Pillow built without one (WebP) opens the others
    im = Image.open(io.BytesIO(data), formats=[f for f in FORMATS if f in Image.OPEN])
    w, h = im.size
    if w < 1 or h < 1:
        raise InvalidInputError(f"the image is {w} x {h} pixels: empty")
    if w * h > MAX_IMAGE_PIXELS:
        raise InvalidInputError(f"the image is {w} x {h} pixels, more than the {MAX_IMAGE_PIXELS >> 20}M "
                                "pixels allowed")
    if max(w, h) > MAX_IMAGE_SIDE:
        raise InvalidInputError(f"the image is {w} x {h} pixels: a side past the {MAX_IMAGE_SIDE} allowed")
    if im.format in ("JPEG", "MPO") and data.count(b"\xff\xda") > MAX_JPEG_SCANS:
        # (start-of-scan markers: FF DA never occurs inside a scan's data, which stuffs FF as FF 00)
        raise InvalidInputError(f"the JPEG has more than {MAX_JPEG_SCANS} scans (a progressive JPEG has ~10): "
                                "each one decodes the whole image again")
    return im


@contextmanager
def _refused(Image):
    """Pillow's errors while opening or decoding an image as InvalidInputErrors."""
    try:
        with warnings.catch_warnings():
            # past Pillow's own bound it warns, then refuses at twice it: ours is lower, both are errors here
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            yield
    except InvalidInputError:
        raise
    except Image.UnidentifiedImageError:
        raise InvalidInputError(f"the image is not in a supported format ({', '.join(FORMATS)}) or is "
                                "corrupt") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise InvalidInputError(f"the image has more than the {MAX_IMAGE_PIXELS >> 20}M pixels allowed") from None
    except MemoryError:
        raise InvalidInputError("the image does not fit in memory once decoded") from None
    except Exception as e:      # Pillow's decoders raise OSError, SyntaxError, ValueError, EOFError, struct.error...
        raise InvalidInputError(f"the image cannot be decoded ({type(e).__name__}: {str(e)[:200]})") from None


def to_rgb(im):
    """An RGB copy of a Pillow image, transparency composited over white (transformers' convert_to_rgb).
    16-bit greyscale (a PNG's I;16, or I holding 16-bit values) is scaled to 8 bits first, as llama.cpp's and
    Ollama's decoders read it (Pillow's convert("RGB"), transformers', clips it: everything past 255 white)."""
    Image, _ = pillow()
    if im.mode == "RGB":
        return im
    if im.mode.startswith("I;16") or im.mode == "I":
        import numpy as np
        w, h = im.size
        out = np.empty((h, w), np.uint8)
        band = max(1, (1 << 22) // w)   # rows at a time (4M values): the whole image in int64 had taken 1.2 GB
        for y in range(0, h, band):
            a = np.asarray(im.crop((0, y, w, min(h, y + band)))).astype(np.int64)
            np.clip(a, 0, 65535, out=a)
            a *= 255
            a += 32767
            a //= 65535
            out[y:y + len(a)] = a
        im = Image.fromarray(out, "L")
    if "A" in im.getbands() or im.info.get("transparency") is not None:
        rgba = im.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return im.convert("RGB")
