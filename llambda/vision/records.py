"""A bound on the records of an image file that Pillow reads one by one in Python before any pixel: PNG chunks,
JPEG segments before the first scan, GIF blocks before the first image.

Pillow parses them in a Python loop, holding the GIL, at 1-5 us each; a 19 MB PNG of 1.7M empty chunks had
taken 8 s to open and 9 s more to load (every stream of the server slowed meanwhile), a JPEG of 5M empty
comments 5.5 s, a GIF of 4M comment blocks 2.4 s, and an image is opened up to three times (its size for the
prompt, the check before encoding, the decoding). `check_records(data)` walks the file's own structure, at
most max_records(len(data)) steps (~20 ms for 20 MB), and refuses a file of more with InvalidInputError, before
Pillow sees it. Legitimate files are far below: a PNG's data chunks are 8 KB or more (libpng's), a JPEG has
tens of segments before its first scan, a GIF a few extensions before its first image. A file cut short or
malformed is left to Pillow, which refuses it.
"""
from __future__ import annotations

from ..errors import InvalidInputError

BASE_RECORDS = 1024          # records any file may have, plus one per RECORD_BYTES of it
RECORD_BYTES = 1024


def max_records(nbytes: int) -> int:
    return BASE_RECORDS + nbytes // RECORD_BYTES


def check_records(data: bytes) -> None:
    """InvalidInputError when the PNG, JPEG or GIF in `data` holds more records than max_records allows."""
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        walk, kind = _png, "PNG chunks"
    elif data[:2] == b"\xff\xd8":
        walk, kind = _jpeg, "JPEG segments before its first scan"
    elif data[:6] in (b"GIF87a", b"GIF89a"):
        walk, kind = _gif, "GIF blocks before its first image"
    else:
        return
    limit = max_records(len(data))
    if walk(data, limit) > limit:
        raise InvalidInputError(f"the image holds more than {limit} {kind} (for its {len(data)} bytes): each is "
                                "parsed one at a time before any pixel")


def _png(data: bytes, limit: int) -> int:
    """Chunks counted, up to limit + 1 (IEND or the data's end stop the walk)."""
    n, pos, end = 0, 8, len(data)
    while pos + 8 <= end and n <= limit:
        n += 1
        if data[pos + 4:pos + 8] == b"IEND":
            break
        pos += 12 + int.from_bytes(data[pos:pos + 4], "big")
    return n


def _jpeg(data: bytes, limit: int) -> int:
    """Marker segments before the first start-of-scan (FF DA), up to limit + 1."""
    n, pos, end = 0, 2, len(data)
    while pos + 2 <= end and n <= limit:
        if data[pos] != 0xFF:
            break                               # not a marker: Pillow's to refuse
        marker = data[pos + 1]
        if marker == 0xFF:                      # a fill byte before the marker
            pos += 1
            continue
        n += 1
        if marker == 0xDA or marker == 0xD9:    # the first scan (decoded in C from here), or the end
            break
        if 0xD0 <= marker <= 0xD7 or marker == 0x01:
            pos += 2                            # no length
        else:
            pos += 2 + int.from_bytes(data[pos + 2:pos + 4], "big")
    return n


def _gif(data: bytes, limit: int) -> int:
    """Extension blocks and their sub-blocks before the first image descriptor (0x2C), up to limit + 1."""
    end = len(data)
    if end < 13:
        return 0
    pos = 13 + (3 << ((data[10] & 7) + 1) if data[10] & 0x80 else 0)     # header, screen, global colour table
    n = 0
    while pos < end and n <= limit and data[pos] == 0x21:                 # an extension: label, sub-blocks
        pos += 2
        while pos < end and n <= limit:
            n += 1
            size = data[pos]
            pos += 1 + size
            if not size:
                break
    return n
