"""Images in a prompt, on the language model's side: the tokens that frame an image (a family's layout), the
blocks of soft tokens a prompt holds (their rows from the vision tower, their identity), and the rules a
prefill and a prefix match follow for them.

The families' layouts (the tower says which: `tower.family`):
  - Gemma 3 (`ImageTokens`): an image is `begin, soft x N, end` (`<start_of_image>`, N = 256
    `<image_soft_token>`, `<end_of_image>`), a blank line either side; one crop, one block. Its soft tokens
    attend to every token of their own block, later ones too (Transformer.forward's kend), causally to
    everything before it.
  - Idefics3 / SmolVLM (`IdeficsTokens`): the template's `<image>` becomes, for an image split into rows x cols
    crops, `<fake_token_around_image><row_r_col_c>` + `<image>` x N per crop (a newline after each row), then
    a newline and the whole image's `<fake_token_around_image><global-img>` + `<image>` x N +
    `<fake_token_around_image>`; an unsplit image is the global part alone. One block per crop (each crop's
    run of soft tokens; a prefix then matches up to the first crop that differs, which causal attention
    allows); attention is causal everywhere (transformers' Idefics3: a plain Llama over the merged
    embeddings), so a block has no kend and a prefill chunk may end inside it.
  - Qwen2-VL / Qwen2.5-VL (`QwenTokens`): the template's `<|vision_start|><|image_pad|><|vision_end|>` gets N
    `<|image_pad|>` for an image whose merged grid is gh x gw (N = gh * gw, the tower's `grid`), one block an
    image, causal attention (transformers' Qwen2.5-VL: its text model's causal mask over the merged embeddings).
    Its tokens' RoPE positions are M-RoPE's (`rope_rows`): token k of the block, at row k // gw and column
    k % gw, turns by (t0, t0 + row, t0 + col), t0 the position a text token there would have; the text after
    it goes on at t0 + max(gh, gw), so a sequence's RoPE positions fall behind its cache positions by each
    image's N - max(gh, gw) (`rope_delta`; transformers' get_rope_index and rope_deltas).
  - Qwen3-VL: Qwen2-VL's layout and positions (transformers' Qwen3VLModel.get_rope_index for images); its rows
    are wider (DeepStack: the embeddings, then each level's d columns, which Transformer.forward adds after
    the decoder layer of that level), and the block's digest covers every column.
  - GLM-4.1V / GLM-4.6V: Qwen2-VL's layout and positions with `<|begin_of_image|>`, `<|image|>` x N,
    `<|end_of_image|>` (models/glm4v_tokens.py).
  - InternVL (`InternVLTokens`, models/internvl_tokens.py): `<img>`, the soft tokens of every tile, `</img>`;
    a block per tile, causal attention.
The soft tokens' embeddings are the tower's rows, written over the text embedding (after its scale: the rows
are not scaled). So:
  - a prefill chunk never ends strictly inside a block that attends both ways (`chunk_end`): its rows need
    the whole block's keys;
  - a prefix match stops where two sequences' images differ (`images_agree`): token ids alone do not say
    which image a block held (every soft token has the same id).
"""
from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np

from ..errors import InvalidInputError, ModelFormatError

BEGIN_TEXT, END_TEXT, SOFT_TEXT = "<start_of_image>", "<end_of_image>", "<image_soft_token>"
# Idefics3's (transformers' Idefics3Processor): the image token a template writes, the markers around a crop
IMAGE_TEXT, FAKE_TEXT, GLOBAL_TEXT = "<image>", "<fake_token_around_image>", "<global-img>"
# Qwen2-VL's and Qwen2.5-VL's (transformers' Qwen2VLProcessor): what a template writes for an image, and its pad
VISION_START, IMAGE_PAD, VISION_END = "<|vision_start|>", "<|image_pad|>", "<|vision_end|>"
GEMMA3, IDEFICS3, QWEN2VL, QWEN25VL, QWEN3VL = "gemma3", "idefics3", "qwen2_vl", "qwen2_5_vl", "qwen3_vl"
PIXTRAL = "pixtral"             # Mistral 3's tower: its layout is models/pixtral_tokens
LFM2VL = "lfm2_vl"               # its layout and encoding: models/lfm2vl_images.py
INTERNVL = "internvl"           # its layout: models/internvl_tokens.py
LLAVA, LLAVA_NEXT = "llava", "llava_next"       # their layout: llava_images.py (image_input.py picks it)
GLM4V = "glm4v"                 # Qwen2-VL's layout under GLM's token names: models/glm4v_tokens.py
FAMILIES = (GEMMA3, IDEFICS3, QWEN2VL, QWEN25VL, QWEN3VL, PIXTRAL, LFM2VL, INTERNVL, LLAVA, LLAVA_NEXT, GLM4V)
GRID_FAMILIES = (QWEN2VL, QWEN25VL, QWEN3VL, GLM4V)     # an image's tokens and RoPE positions follow its merged grid
SIZED_FAMILIES = GRID_FAMILIES + (PIXTRAL, LLAVA_NEXT)   # an image's token count follows its size (tower.grid;
                                                        # encode_one, LLaVA-NeXT's encode_image)
DEFAULT_MAX_IMAGES = 8          # images one request may hold (Model.max_images; the server's bound too)
ENCODED_ROWS_BYTES = 64 << 20   # the tower's rows kept for images sent again (EncodedRows): 24 of a 4B model's


def _marker_count(text: str, marker: str, n_images: int) -> None:
    n = text.count(marker)
    if n != n_images:
        raise InvalidInputError(f"the prompt holds {n} image markers ({marker}) for {n_images} image(s): the chat "
                                "template dropped an image part, or the text writes the marker itself")


def _expand_each(text: str, marker: str, grids: list, image_text) -> str:
    """`text` with its i-th image marker replaced by image_text(*grids[i]) (the marker count checked first)."""
    _marker_count(text, marker, len(grids))
    parts = text.split(marker)
    out = [parts[0]]
    for grid, after in zip(grids, parts[1:]):
        out.append(image_text(*grid))
        out.append(after)
    return "".join(out)


def _soft_runs(ids: list[int], soft: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(the ids as an array, the starts and ends of its runs of the soft id)."""
    a = np.asarray(ids, dtype=np.int64)
    edges = np.flatnonzero(np.diff(np.concatenate(([0], (a == soft).view(np.int8), [0]))))
    return a, edges[0::2], edges[1::2]


def run_lengths(ids: list[int], soft: int, starts: list[int]) -> int:
    """The soft tokens of the runs of `ids` that begin at `starts` (a layout's place(): its images' runs), together:
    the rows their images encode to."""
    _, lo, hi = _soft_runs(ids, soft)
    length = dict(zip(lo.tolist(), (hi - lo).tolist()))
    return sum(length.get(s, 0) for s in starts)


@dataclass(frozen=True)
class ImageTokens:
    """Gemma 3's layout: the token ids that frame an image and the begin marker's text (what a chat template
    writes)."""
    begin: int
    soft: int          # as the prompt holds it: an id past the embedding table is held as 0 (as transformers)
    end: int
    begin_text: str = BEGIN_TEXT
    end_text: str = END_TEXT
    family = GEMMA3

    @property
    def marker(self) -> str:
        return self.begin_text

    def expand(self, text: str, grids: list, per: int = 0) -> str:
        """The processor's expansion of each begin marker: a blank line around an empty block (its soft tokens
        are inserted between begin and end once tokenized: `place`). One block an image whatever its grid."""
        return expand_text(text, self)

    def place(self, ids: list[int], per: int, grids: list) -> tuple[list[int], list[tuple]]:
        """(the ids with each image's soft tokens, each image's run starts: one run)."""
        out, starts = insert_soft(ids, self, per, len(grids))
        return out, [(s,) for s in starts]

    def block_tokens(self, per: int) -> int:
        """The tokens of an image's block one forward must hold (begin, soft tokens, end)."""
        return per + 2


@dataclass(frozen=True)
class IdeficsTokens:
    """Idefics3's layout (SmolVLM): the `<image>` soft token a template writes, expanded per crop."""
    soft: int
    marker: str = IMAGE_TEXT      # the soft token's text: what a template writes for an image
    family = IDEFICS3

    def image_text(self, rows: int, cols: int, per: int) -> str:
        """An image's text as transformers' Idefics3Processor writes it (the crops row-major, then the whole
        image; rows = cols = 0: the whole image alone)."""
        run = self.marker * per
        glob = f"{FAKE_TEXT}{GLOBAL_TEXT}{run}{FAKE_TEXT}"
        if not rows and not cols:
            return glob
        tiles = "".join("".join(f"{FAKE_TEXT}<row_{r + 1}_col_{c + 1}>{run}" for c in range(cols)) + "\n"
                        for r in range(rows))
        return f"{tiles}\n{glob}"

    def expand(self, text: str, grids: list, per: int = 0) -> str:
        return _expand_each(text, self.marker, grids, lambda rows, cols: self.image_text(rows, cols, per))

    def place(self, ids: list[int], per: int, grids: list) -> tuple[list[int], list[tuple]]:
        """(the ids, each image's run starts): the runs of soft ids the expanded text tokenized to, checked to
        be the images' crops of `per` tokens each."""
        _, lo, hi = _soft_runs(ids, self.soft)
        want = [rows * cols + 1 for rows, cols in grids]
        if len(lo) != sum(want) or np.any(hi - lo != per):
            raise InvalidInputError(f"the prompt's image tokens ({self.marker}) do not make {sum(want)} runs of "
                                    f"{per} for the images' crops: the text writes the token itself, or the "
                                    "tokenizer does not read it as one token")
        starts, k = [], 0
        for n in want:
            starts.append(tuple(int(s) for s in lo[k:k + n]))
            k += n
        return list(ids), starts

    def block_tokens(self, per: int) -> int:
        return 0        # causal: a chunk may end anywhere


@dataclass(frozen=True)
class QwenTokens:
    """Qwen2-VL's and Qwen2.5-VL's layout: `<|vision_start|>`, gh * gw `<|image_pad|>`, `<|vision_end|>` an image,
    its grid the tower's merged one (tower.grid)."""
    start: int
    soft: int
    end: int
    start_text: str = VISION_START
    soft_text: str = IMAGE_PAD
    end_text: str = VISION_END
    family: str = QWEN25VL

    @property
    def marker(self) -> str:
        """What a chat template writes for an image part (Qwen's: the three tokens)."""
        return self.start_text + self.soft_text + self.end_text

    def expand(self, text: str, grids: list, per: int = 0) -> str:
        return _expand_each(text, self.marker, grids,
                            lambda gh, gw: self.start_text + self.soft_text * (gh * gw) + self.end_text)

    def place(self, ids: list[int], per: int, grids: list) -> tuple[list[int], list[tuple]]:
        """(the ids, each image's run start): one run of gh * gw pads an image, each between start and end."""
        a, lo, hi = _soft_runs(ids, self.soft)
        want = np.array([gh * gw for gh, gw in grids], dtype=np.int64)
        framed = (len(lo) == len(grids) and np.all(hi - lo == want) and np.all(lo >= 1) and np.all(hi < len(a))
                  and np.all(a[np.maximum(lo - 1, 0)] == self.start) and np.all(a[np.minimum(hi, len(a) - 1)] == self.end))
        if not framed:
            raise InvalidInputError(f"the prompt's image tokens ({self.soft_text}) do not make one run of each image's "
                                    f"{want.tolist()} tokens between {self.start_text} and {self.end_text}: the text "
                                    "writes the tokens itself, or the tokenizer does not read them as single tokens")
        return list(ids), [(int(s),) for s in lo]

    def block_tokens(self, per: int) -> int:
        return 0        # causal: a chunk may end anywhere


def image_tokens(config: dict | None, tokenizer, vocab_size: int, family: str = GEMMA3):
    """The image tokens of a family's layout (ImageTokens for Gemma 3, IdeficsTokens for Idefics3), or None
    when neither the config nor the vocabulary names them.
    Gemma 3: from a Hugging Face config (boi_token_index, eoi_token_index, image_token_index), else from the
    vocabulary's `<start_of_image>`, `<end_of_image>` and `<image_soft_token>` (a GGUF file).
    Idefics3: the config's image_token_id, else the vocabulary's `<image>` (llama.cpp's text GGUF of SmolVLM)."""
    if family == IDEFICS3:
        return _idefics_tokens(config, tokenizer, vocab_size)
    if family in GRID_FAMILIES and family != GLM4V:
        return _qwen_tokens(config, tokenizer, vocab_size, family)
    if family != GEMMA3:
        raise InvalidInputError(f"no image layout for the family {str(family)[:40]!r} ({', '.join(FAMILIES)})")
    ids = {}
    if isinstance(config, dict):
        for key, name in (("boi_token_index", "begin"), ("eoi_token_index", "end"), ("image_token_index", "soft")):
            v = config.get(key)
            if _index(v):
                ids[name] = v
    if tokenizer is not None:
        for text, name in ((BEGIN_TEXT, "begin"), (END_TEXT, "end"), (SOFT_TEXT, "soft")):
            if name not in ids:
                tid = _token_id(tokenizer, text)
                if tid is not None:
                    ids[name] = tid
    if "begin" not in ids or "end" not in ids:
        return None
    soft = ids.get("soft", vocab_size)      # Gemma 3's soft token is past a GGUF file's table: looked up as 0
    for name in ("begin", "end"):
        if ids[name] >= vocab_size:
            raise InvalidInputError(f"the {name}-of-image token {ids[name]} is outside the model's {vocab_size} "
                                    "token embeddings")
    begin_text = _text(tokenizer, ids["begin"], BEGIN_TEXT)
    end_text = _text(tokenizer, ids["end"], END_TEXT)
    return ImageTokens(ids["begin"], soft if soft < vocab_size else 0, ids["end"], begin_text, end_text)


def _index(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _idefics_tokens(config, tokenizer, vocab_size: int) -> IdeficsTokens | None:
    soft = config.get("image_token_id") if isinstance(config, dict) else None
    if not _index(soft):
        soft = _token_id(tokenizer, IMAGE_TEXT) if tokenizer is not None else None
    if soft is None:
        return None
    if soft >= vocab_size:
        raise InvalidInputError(f"the image token {soft} is outside the model's {vocab_size} token embeddings")
    text = _text(tokenizer, soft, IMAGE_TEXT)
    if tokenizer is not None and _token_id(tokenizer, text) != soft:
        raise InvalidInputError(f"the image token {soft} ({text[:40]!r}) is not read back as itself by the tokenizer: "
                                "a prompt could not hold it")
    return IdeficsTokens(soft, text)


def _qwen_tokens(config, tokenizer, vocab_size: int, family: str) -> QwenTokens | None:
    """The config's vision_start_token_id, image_token_id, vision_end_token_id (a HF directory), else the
    vocabulary's <|vision_start|>, <|image_pad|>, <|vision_end|> (a GGUF file); each read back by the tokenizer
    as itself (a prompt must be able to hold it)."""
    keys = {"start": ("vision_start_token_id",), "soft": ("image_token_id",), "end": ("vision_end_token_id",)}
    found = named_tokens(config, tokenizer, vocab_size, keys, {"start": VISION_START, "soft": IMAGE_PAD,
                                                               "end": VISION_END})
    if found is None:
        return None
    ids, shown = found
    return QwenTokens(ids["start"], ids["soft"], ids["end"], shown["start"], shown["soft"], shown["end"], family)


def named_tokens(config, tokenizer, vocab_size: int, keys: dict, texts: dict) -> tuple[dict, dict] | None:
    """({name: id}, {name: its text}) of a layout's tokens: each from the first of its config `keys[name]` set, else
    the vocabulary's `texts[name]`; None where one is not found. Each must lie in the embeddings and be read back
    by the tokenizer as itself (a prompt must be able to hold it)."""
    ids = {}
    if isinstance(config, dict):
        for name, names in keys.items():
            key = next((k for k in names if _index(config.get(k))), None)
            if key is not None:
                ids[name] = config[key]
    for name, text in texts.items():
        if name not in ids and tokenizer is not None:
            tid = _token_id(tokenizer, text)
            if tid is not None:
                ids[name] = tid
    if len(ids) < len(texts):
        return None
    shown = {}
    for name, tid in ids.items():
        if tid >= vocab_size:
            raise InvalidInputError(f"the image token {tid} is outside the model's {vocab_size} token embeddings")
        shown[name] = _text(tokenizer, tid, texts[name])
        if tokenizer is not None and _token_id(tokenizer, shown[name]) != tid:
            raise InvalidInputError(f"the image token {tid} ({shown[name][:40]!r}) is not read back as itself by the "
                                    "tokenizer: a prompt could not hold it")
    return ids, shown


def _token_id(tokenizer, text: str) -> int | None:
    try:
        ids = tokenizer.encode(text, add_bos=False, parse_special=True)
    except Exception:       # a tokenizer that cannot say: the config must
        return None
    return ids[0] if len(ids) == 1 else None


def _text(tokenizer, tid: int, default: str) -> str:
    if tokenizer is None:
        return default
    try:
        return tokenizer.token_text(tid) or default
    except Exception:
        return default


@dataclass(frozen=True, eq=False)
class ImageBlock:
    """One run of an image's soft tokens in a sequence (Gemma 3: the image; Idefics3: one crop): positions
    start .. start + len(rows) - 1."""
    start: int
    rows: np.ndarray     # (tokens_per_image, d_model * (1 + DeepStack levels)) float32, read-only
    digest: bytes        # sha256 of the rows: what the prefix cache tells images apart by
    causal: bool = False  # its tokens attend causally (Idefics3); else to the whole block (Gemma 3's kend)
    grid: tuple | None = None   # (gh, gw), the merged grid of an image whose tokens take M-RoPE positions (Qwen2-VL)

    @property
    def end(self) -> int:
        return self.start + len(self.rows)

    def at(self, start: int) -> "ImageBlock":
        """The same image's block at another position (its rows and digest shared, not copied)."""
        return replace(self, start=int(start))


class ImageKey(NamedTuple):
    """What a prefix cache keeps of a block once its sequence has gone: where it was and which image
    (not its rows: a slot's cached prefix must not hold megabytes of them)."""
    start: int
    end: int
    digest: bytes       # a block with a grid: of its rows and grid (the RoPE positions after it follow from both)


def image_keys(blocks) -> tuple:
    return tuple(ImageKey(b.start, b.end, b.digest) for b in blocks)


def image_block(start: int, rows: np.ndarray, causal: bool = False, grid=None) -> ImageBlock:
    """grid: (gh, gw) with gh * gw rows, an image whose tokens take M-RoPE positions (rope_rows); its digest
    covers the grid too, so a prefix match (images_agree) stops where the positions after an image would differ."""
    rows = np.array(rows, dtype=np.float32, order="C", copy=True)
    if rows.ndim != 2 or not len(rows):
        raise InvalidInputError(f"an image's rows must be a non-empty 2-D array, got shape {rows.shape}")
    if not np.isfinite(rows).all():
        raise InvalidInputError("an image's rows hold NaN or infinite values")
    h = hashlib.sha256(rows.tobytes())
    if grid is not None:
        gh, gw = grid
        if not (_index(gh) and _index(gw) and gh * gw == len(rows)):
            raise InvalidInputError(f"an image's grid {grid!r} does not hold its {len(rows)} rows")
        grid = (int(gh), int(gw))
        h.update(b"grid %d %d" % grid)
    rows.setflags(write=False)
    return ImageBlock(int(start), rows, h.digest(), bool(causal), grid)


def rope_delta(blocks) -> int:
    """How far a sequence's RoPE positions after its blocks fall behind their cache positions (<= 0): each
    gridded block's max(gh, gw) - gh * gw (transformers' rope_deltas)."""
    return sum(max(b.grid) - b.end + b.start for b in blocks if b.grid is not None)


def rope_rows(blocks, start: int, end: int) -> np.ndarray | None:
    """The M-RoPE positions int32 (end - start, 3) of a sequence's positions start..end-1 (cache positions),
    given its blocks; None where no block has a grid (every position its own, in all three sections)."""
    grids = [b for b in blocks if b.grid is not None]
    if not grids:
        return None
    n = end - start
    out = np.empty((n, 3), np.int64)
    delta, at = 0, start          # text positions before the next block: position + delta
    for b in grids:
        if b.start >= end:
            break
        lo = max(at, start)
        if lo < b.start:                                   # text before the block
            out[lo - start:b.start - start] = (np.arange(lo, b.start) + delta)[:, None]
        gh, gw = b.grid
        t0 = b.start + delta
        if b.end > start:                                  # the block's own tokens (the part in range)
            k = np.arange(max(b.start, start), min(b.end, end)) - b.start
            r = out[max(b.start, start) - start:min(b.end, end) - start]
            r[:, 0] = t0
            r[:, 1] = t0 + k // gw
            r[:, 2] = t0 + k % gw
        delta += max(gh, gw) - (b.end - b.start)
        at = b.end
    lo = max(at, start)
    if lo < end:
        out[lo - start:] = (np.arange(lo, end) + delta)[:, None]
    return out.astype(np.int32)


def expand_text(text: str, tokens: ImageTokens) -> str:
    """The processor's expansion of each begin marker: a blank line around an empty block (its soft
    tokens are inserted between begin and end once tokenized: `insert_soft`)."""
    return text.replace(tokens.begin_text, f"\n\n{tokens.begin_text}{tokens.end_text}\n\n")


def insert_soft(ids: list[int], tokens: ImageTokens, per_image: int, n_images: int) -> tuple[list[int], list[int]]:
    """Each adjacent (begin, end) pair of `ids` with `per_image` soft tokens between; (the ids, each block's
    start). InvalidInputError unless there are exactly n_images such pairs (a template that dropped an image,
    or an image marker typed in the text)."""
    out: list[int] = []
    starts: list[int] = []
    i = 0
    while i < len(ids):
        out.append(ids[i])
        if ids[i] == tokens.begin and i + 1 < len(ids) and ids[i + 1] == tokens.end:
            starts.append(len(out))
            out.extend([tokens.soft] * per_image)
        i += 1
    if len(starts) != n_images:
        raise InvalidInputError(f"the prompt holds {len(starts)} image markers ({tokens.begin_text}) for "
                                f"{n_images} image(s): the chat template dropped an image part, or the text "
                                "writes the marker itself")
    return out, starts


def check_prompt(ids, blocks: tuple[ImageBlock, ...], tokens, width: int) -> None:
    """Blocks (ImageBlocks of rows `width` wide) must lie inside the prompt, apart, in order, over soft-token
    ids, and not at its last token (its logits start generation); a soft id that no block covers is refused
    (no image's rows for it). `tokens`: the model's layout (ImageTokens, IdeficsTokens) or None (no images)."""
    last = 0
    for b in blocks:
        if not isinstance(b, ImageBlock):
            raise InvalidInputError(f"images must be ImageBlocks (Model.image_prompt), got {type(b).__name__}")
        if b.rows.shape[1] != width:
            raise InvalidInputError(f"an image block's rows are {b.rows.shape[1]} wide; this model's are {width}")
        if b.start < last or b.end >= len(ids):
            raise InvalidInputError("image blocks must lie apart, in order, before the prompt's last token")
        last = b.end
    if tokens is None:
        if blocks:
            raise InvalidInputError("this model takes no images")
        return
    soft = np.asarray(ids, dtype=np.int64) == tokens.soft
    covered = np.zeros(len(soft), np.bool_)
    for b in blocks:
        covered[b.start:b.end] = True
    if (covered & ~soft).any():
        raise InvalidInputError("an image block must cover image soft tokens only")
    if tokens.soft != 0 and (soft & ~covered).any():
        raise InvalidInputError("the prompt holds image soft tokens that no image fills "
                                f"(token {tokens.soft}); send the image itself")


def chunk_end(blocks, start: int, want: int, limit: int) -> int:
    """Where a prefill chunk from `start` ends (exclusive) when it would end at `want`, never past
    `limit`: not strictly inside an image block. Cut back to the block's start, or, when the chunk
    starts inside the block, carried to its end (if within limit); `start` when nothing fits now. A causal
    block (Idefics3's) may be cut anywhere: its rows need no later key."""
    for b in blocks:
        if not b.causal and b.start < want < b.end:
            if b.start > start:
                return b.start
            return b.end if b.end <= limit else start
    return want


def images_agree(n: int, held, blocks) -> int:
    """n, or the first position below it where two sequences' images differ (one holds a block there that
    the other does not, or another image): their keys and values are shared only up to there. Blocks or
    their ImageKeys alike."""
    if not held and not blocks:
        return n
    a = {b.start: b for b in held if b.start < n}
    c = {b.start: b for b in blocks if b.start < n}
    for s in sorted(set(a) | set(c)):
        x, y = a.get(s), c.get(s)
        if x is None or y is None or x.end != y.end or x.digest != y.digest:
            return s
    return n


# -- what a vision tower gives, checked (Model.encode_images) --------------------------------------------

MAX_CROPS_A_CALL = 16      # crops one tower.encode call takes (its bound is 64)


def check_bytes(data) -> None:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InvalidInputError(f"an image must be the bytes of an image file, got {type(data).__name__}")


def tower_crops(pixels) -> np.ndarray:
    """A tower's pixels of one image as float32 [n_crops, C, S, S] ([C, S, S]: one crop)."""
    try:
        p = np.asarray(pixels, dtype=np.float32)
    except (TypeError, ValueError) as e:
        raise ModelFormatError(f"the vision tower's pixels are no arrays of one shape ({e})") from None
    if p.ndim == 3:
        p = p[None]
    if p.ndim != 4 or not len(p):
        raise ModelFormatError(f"the vision tower's pixels are of shape {p.shape}: no [crops, C, S, S] array")
    return p


def tower_rows(out, n: int, per: int, width: int) -> np.ndarray:
    """The tower's rows of n crops, checked to be float32 [n, per, width]."""
    try:
        rows = np.asarray(out, dtype=np.float32)
    except (TypeError, ValueError) as e:
        raise ModelFormatError(f"the vision tower gave rows that are no array of numbers ({e})") from None
    if rows.shape != (n, per, width):
        raise ModelFormatError(f"the vision tower gave rows of shape {rows.shape}, expected {(n, per, width)}")
    return rows


def _nbytes(value) -> int:
    return sum(b.rows.nbytes for b in value) if isinstance(value, tuple) else value.rows.nbytes


class EncodedRows:
    """The blocks (rows and digest; an ImageBlock, or a tuple of them: an image's crops) of the images a tower
    encoded lately, by their file's sha256, the least
    recently used dropped past max_bytes: a conversation sends its images again with every turn, and the tower
    (tens of seconds an image on a CPU) then runs once for each image, not once a turn. Its own lock: a
    lookup does not wait behind an encoding."""

    def __init__(self, max_bytes: int = ENCODED_ROWS_BYTES):
        self.max_bytes = max_bytes
        self._blocks: OrderedDict[bytes, ImageBlock] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @staticmethod
    def key(data: bytes) -> bytes:
        return hashlib.sha256(data).digest()

    def get(self, key: bytes):
        """The image's block or blocks (ImageBlock.at moves one to its prompt's place), or None: not kept."""
        with self._lock:
            block = self._blocks.get(key)
            if block is not None:
                self._blocks.move_to_end(key)
            return block

    def put(self, key: bytes, block) -> None:
        size = _nbytes(block)
        with self._lock:
            if key in self._blocks or size > self.max_bytes:
                return
            self._blocks[key] = block
            self._bytes += size
            while self._bytes > self.max_bytes:
                self._bytes -= _nbytes(self._blocks.popitem(last=False)[1])

    def clear(self) -> None:
        """Forget every block (another tower's rows are not these)."""
        with self._lock:
            self._blocks.clear()
            self._bytes = 0

    def __len__(self) -> int:
        return len(self._blocks)


class BatchImages:
    """A forward batch's image rows: for each span of the batch's rows that are soft tokens, the tower's
    rows to write over their embeddings and the end of their block (attention's kend; -1 for a causal
    block: its tokens see what any token sees)."""

    def __init__(self):
        self.spans: list[tuple[int, np.ndarray, int]] = []      # (first batch row, rows, block end or -1)

    def add(self, offset: int, blocks, start: int, end: int) -> None:
        """A sequence's positions start..end-1 sit at batch rows offset..: its blocks' rows among them."""
        for b in blocks:
            lo, hi = max(b.start, start), min(b.end, end)
            if lo < hi:
                self.spans.append((offset + lo - start, b.rows[lo - b.start:hi - b.start], -1 if b.causal else b.end))

    def __bool__(self) -> bool:
        return bool(self.spans)

    def kend(self, pos: np.ndarray) -> np.ndarray | None:
        """Each row's key end, or None when every span is causal (attention as for text)."""
        if all(end < 0 for _, _, end in self.spans):
            return None
        out = pos.astype(np.int32) + 1
        for r0, rows, end in self.spans:
            if end >= 0:
                out[r0:r0 + len(rows)] = end
        return out
