"""A language model's image input: the vision tower attached to it, its family's image token layout
(models/images), the rows kept for images sent again, and the rule that one image encoding at a time runs
through the tower's buffers. Model (api.py) holds one and answers its image calls through it.

Two kinds of tower (llambda.vision): crop towers (Gemma 3, Idefics3: `pixels(image)` -> [crops, 3, S, S],
`encode(pixels)` -> [crops, tokens_per_image, width]) and grid towers (Qwen2-VL: `pixels(image)` ->
[patches, values], `encode_one(pixels, grid)` -> [gh * gw, width], an image's tokens following its grid and
taking M-RoPE positions; Qwen3-VL's width d * (1 + tower.deepstack): the embeddings, then each DeepStack level's
columns, which the Transformer adds after its first layers). Both are decoded, cut and encoded one image at a
time, under the lock, and kept by the file's digest (EncodedRows)."""
from __future__ import annotations

import threading
from contextlib import contextmanager

import numpy as np

from ..errors import ContextOverflowError, InvalidInputError, ModelFormatError
from ..sampling import _is_int
from . import lfm2vl_images
from .glm4v_tokens import glm4v_tokens
from .images import (FAMILIES, GLM4V, GRID_FAMILIES, INTERNVL, LFM2VL, LLAVA, LLAVA_NEXT, MAX_CROPS_A_CALL, PIXTRAL,
                     QWEN3VL, SIZED_FAMILIES, EncodedRows, check_bytes, check_prompt, image_block, image_tokens,
                     run_lengths, tower_crops, tower_rows)
from .internvl_tokens import internvl_tokens
from .llava_images import llava_tokens
from .pixtral_tokens import pixtral_tokens

FIXED_SIZE = ("gemma3", LLAVA)     # families whose images take the same tokens whatever their size


class ImageInput:
    """`tower` (None: the model takes no images) and `layout` (ImageTokens, IdeficsTokens, ...) after attach()."""

    def __init__(self, model):
        self.model = model
        self.tower = None
        self.layout = None          # the image tokens' layout (models/images)
        self.load_image = None      # bytes -> image for the tower (attach; default llambda.vision's)
        # one image encoding at a time through the tower's buffers; an attach's levels, layout and tower change
        # together under it (reentrant: attach's replace takes it again)
        self.lock = threading.RLock()
        self.encoded = EncodedRows()        # the blocks of images encoded lately (sent again: not encoded again)

    # -- the tower ------------------------------------------------------------------
    def attach(self, tower, load_image=None) -> None:
        """Model.attach_vision's checks, then `tower` replaces the attached one (None: detach)."""
        m = self.model
        if tower is None:
            self.replace(None)
            return
        per, hidden = getattr(tower, "tokens_per_image", None), getattr(tower, "hidden", None)
        family = getattr(tower, "family", "gemma3")
        # Qwen2-VL, LFM2-VL, Pixtral: an image's tokens follow its grid
        gridded = family in SIZED_FAMILIES + (LFM2VL,) and per is None
        if (not gridded and (not _is_int(per) or per < 1)) or not _is_int(hidden):
            raise InvalidInputError("a vision tower needs integer tokens_per_image (None: a "
                                    f"{'/'.join(SIZED_FAMILIES)} "
                                    f"tower) and hidden, got {per!r}, {hidden!r}")
        cfg = m.config
        if int(hidden) != cfg.d_model:
            raise InvalidInputError(f"the vision tower's rows are {hidden} wide; this model's are {cfg.d_model}")
        if family in GRID_FAMILIES and not cfg.rope_sections:
            raise InvalidInputError(f"a {family} tower needs a text model with M-RoPE sections; {m.name!r} "
                                    f"({cfg.arch}) has none")
        if family in GRID_FAMILIES and cfg.rope_interleaved != (family == QWEN3VL):
            raise InvalidInputError(f"a {family} tower needs a text model whose M-RoPE sections are "
                                    f"{'interleaved' if family == QWEN3VL else 'contiguous'}; {m.name!r} "
                                    f"({cfg.arch}) has {'interleaved' if cfg.rope_interleaved else 'contiguous'} ones")
        deep = getattr(tower, "deepstack", 0)
        if deep and family != QWEN3VL:
            raise InvalidInputError(f"a {family} tower with DeepStack levels ({str(deep)[:20]}): only Qwen3-VL's "
                                    "have them")
        per = per or 1
        attends = getattr(tower, "attends", "block" if family == "gemma3" else "causal")
        if family not in FAMILIES or attends not in ("block", "causal"):
            raise InvalidInputError(f"a vision tower of family {str(family)[:40]!r} attending {str(attends)[:20]!r} "
                                    f"(known: {', '.join(FAMILIES)}; 'block' or 'causal')")
        if not m.transformer.takes_image_rows or (attends == "block" and "shortconv" in cfg.layer_kinds):
            raise InvalidInputError(f"a {cfg.arch} model cannot take image rows (plain attention layers only)")
        meta = getattr(m.source, "metadata", None) or {}
        hf = meta.get("hf.config")
        if family == PIXTRAL:
            ids = pixtral_tokens(hf, m.tokenizer, cfg.vocab_size)
        elif family == INTERNVL:
            ids = internvl_tokens(hf, m.tokenizer, cfg.vocab_size)
        elif family == GLM4V:
            ids = glm4v_tokens(hf, m.tokenizer, cfg.vocab_size)
        elif family in (LLAVA, LLAVA_NEXT):
            ids = llava_tokens(hf, m.tokenizer, cfg.vocab_size, family)
        else:
            ids = (lfm2vl_images.lfm2vl_tokens if family == LFM2VL else image_tokens)(hf, m.tokenizer, cfg.vocab_size,
                                                                                     family)
        if ids is None:
            raise InvalidInputError(f"{m.name!r} names no image tokens of {family}'s (" + (
                "no boi/eoi_token_index in its config, no <start_of_image>/<end_of_image> in its vocabulary)"
                if family == "gemma3" else "no image_token_id in its config, no <image> in its vocabulary)"
                if family in ("idefics3", LFM2VL, LLAVA, LLAVA_NEXT) else "no image_token_index in its config, no "
                "[IMG]/[IMG_BREAK]/[IMG_END] in its vocabulary)" if family == PIXTRAL else "no image_token_id in its "
                "config, no <img>/<IMG_CONTEXT>/</img> in its vocabulary)" if family == INTERNVL else "no image_start/"
                "image/image_end token ids in its config, no <|begin_of_image|>/<|image|>/<|end_of_image|> in its "
                "vocabulary)" if family == GLM4V else "no vision_start/image/"
                "vision_end token ids in its config, no <|vision_start|>/<|image_pad|>/<|vision_end|> in its vocabulary)"))
        if family == LFM2VL:
            ids = lfm2vl_images.for_tower(ids, tower)
        if (attends == "causal") != (ids.block_tokens(1) == 0):
            raise InvalidInputError(f"a {family} tower attending {attends!r}: this engine's {family} layout attends "
                                    f"{'causally' if ids.block_tokens(1) == 0 else 'within a block'}")
        block = ids.block_tokens(int(per))
        if block > m.transformer.ws.max_tokens or max(block, int(per)) >= m.n_ctx:
            raise InvalidInputError(f"an image takes {max(block, int(per))} tokens, more than a forward of "
                                    f"{m.transformer.ws.max_tokens} (max_batch) or the context of {m.n_ctx} holds")
        with self.lock:     # an encoding sees the old tower and width, or the new ones, never one of each
            levels_before = m.transformer.deepstack
            m.transformer.set_deepstack(deep)           # (checked against the config's own count first)
            try:
                self.layout, self.load_image = ids, load_image
                self.replace(tower)
            except BaseException:
                m.transformer.deepstack = levels_before
                raise

    def replace(self, tower) -> None:
        """The attached tower becomes `tower`; the one it replaces is closed (the model owned it), and the
        rows it gave are forgotten. Not under a running encoding (the lock)."""
        with self.lock:
            old, self.tower = self.tower, tower
            if old is not tower:
                self.encoded.clear()
                if old is not None:
                    old.close()

    @contextmanager
    def _holding(self, tower):
        """The lock, while `tower` (the one an encoding was prepared for) is still the attached one."""
        with self.lock:
            self.model._check_open()
            if self.tower is not tower:
                raise InvalidInputError("the model's vision tower was replaced (attach_vision) while these "
                                        "images were prepared for it: send them again")
            yield

    def _tower_now(self):
        tower = self.tower
        if tower is None:       # closed, or detached, since check_images
            self.model._check_open()
            raise InvalidInputError(f"the model {self.model.name!r} has no vision tower: it takes no images")
        return tower

    # -- a request's images -----------------------------------------------------------
    def check_prompt(self, ids: list[int], images: tuple = ()) -> None:
        check_prompt(ids, images, self.layout if self.tower is not None else None, self.model.transformer.image_width)

    def check_count(self, n: int) -> None:
        if not n:
            return
        m = self.model
        m._check_open()      # a closed model has no tower left: that is its error, not "takes no images"
        if self.tower is None:
            raise InvalidInputError(f"the model {m.name!r} has no vision tower: it takes no images")
        if n > m.max_images:
            raise InvalidInputError(f"{n} images in one request; this model takes at most {m.max_images}")

    def check_images(self, images: list) -> list[bytes]:
        images = list(images or ())
        self.check_count(len(images))
        return images

    def prompt_ids(self, text: str, images) -> tuple[list[int], list[tuple]]:
        """Model.image_ids: the prompt's token ids with each image expanded, and each image's run starts."""
        m = self.model
        grids = self.grids(images)
        per = int(self.tower.tokens_per_image or 0)
        ids, starts = self.layout.place(m._prompt_ids(self.layout.expand(text, grids, per)), per, grids)
        if len(ids) >= m.n_ctx:
            raise ContextOverflowError(f"the prompt with its {len(grids)} image(s) has {len(ids)} tokens; the "
                                       f"context holds {m.n_ctx} (prompt plus at least one new token)")
        return ids, starts

    def rows_bytes(self, ids: list[int], starts: list) -> int:
        """Model.image_rows_bytes: float32 rows image_width wide, one a soft token of each run at `starts`."""
        if self.layout is None or not starts:
            return 0
        runs = [(s,) if _is_int(s) else tuple(s) for s in starts]
        tokens = run_lengths(ids, self.layout.soft, [int(s) for at in runs for s in at])
        return tokens * int(self.model.transformer.image_width) * 4

    def grids(self, images) -> list[tuple[int, int]]:
        """Each image's crop or token grid (rows, cols; (0, 0): the whole image alone), from its header's size
        (after EXIF orientation); Gemma 3's and LLaVA's are all (0, 0), their images' count is enough (LLaVA's
        files' headers are still checked here when given)."""
        family = self.layout.family if self.layout is not None else None
        if _is_int(images):
            self.check_count(int(images))
            if int(images) and family not in FIXED_SIZE:
                raise InvalidInputError(f"a {family} prompt's length depends on its images' sizes: "
                                        "give image_ids the images' bytes, not their count")
            return [(0, 0)] * int(images)
        images = self.check_images(images)
        if not images or family == "gemma3":
            return [(0, 0)] * len(images)
        from ..vision.image import check_image
        # a merged grid has a token at least (LLaVA-NeXT's from an mmproj: none for an image llama.cpp does not tile)
        low = 1 if family in SIZED_FAMILIES and family != LLAVA_NEXT else 0
        out = []
        for data in images:
            check_bytes(data)
            size = check_image(data)
            if not (isinstance(size, tuple) and len(size) == 2):
                raise ModelFormatError("llambda.vision's check_image gave no image size")
            if family == LFM2VL:     # (rows, cols, th, tw): the tiles and the thumbnail's token grid
                out.append(lfm2vl_images.checked_grid(self.tower.grid(*size)))
                continue
            rows, cols = self.tower.grid(*size)
            if not (_is_int(rows) and _is_int(cols) and low <= rows and low <= cols and (rows == 0) == (cols == 0)):
                raise ModelFormatError(f"the vision tower gave the grid {rows!r} x {cols!r}")
            out.append((int(rows), int(cols)))
        return out

    def encode(self, images: list[bytes], starts: list) -> tuple:
        """Model.encode_images: the image blocks at `starts`, new images encoded, the others' rows reused."""
        images = self.check_images(images)
        if len(starts) != len(images):
            raise InvalidInputError(f"{len(images)} image(s) and {len(starts)} block start(s): one each")
        runs = [(s,) if _is_int(s) else tuple(s) for s in starts]
        for b in images:        # (bytes() of an int is that many zero bytes)
            check_bytes(b)
        # each file's size and header first: nothing copied or hashed of a file refused
        gridded = self.layout.family in SIZED_FAMILIES + (LFM2VL,)
        if gridded:             # (read once: the header's check and the image's grid)
            grids = self.grids(images)
        elif self.load_image is None:
            from ..vision.image import check_image
            for b in images:
                check_image(b)
        keys = [EncodedRows.key(bytes(b)) for b in images]
        found = {k: b for k in keys if (b := self.encoded.get(k)) is not None}
        todo = {k: data for k, data in zip(keys, images) if k not in found}      # each new file once
        if todo:
            if gridded:
                at = {k: g for k, g in zip(keys, grids)}
                encode = (self._encode_grids if self.layout.family != LFM2VL
                          else lambda f, g: lfm2vl_images.encode_tiles(self, f, g))
                found.update(zip(todo, encode(todo, [at[k] for k in todo])))
            else:
                found.update(zip(todo, self._encode_crops(todo)))
        out = []
        for k, at in zip(keys, runs):
            crops = found[k] if isinstance(found[k], tuple) else (found[k],)
            if len(crops) != len(at):
                raise InvalidInputError(f"an image of {len(crops)} crop(s) given {len(at)} block start(s): "
                                        "its starts must be image_ids' for it")
            out.extend(b.at(s) for b, s in zip(crops, at))
        return tuple(out)

    def _decoder(self):
        if self.load_image is not None:
            return self.load_image
        from ..vision import load_image      # the vision package, only for a model with a tower
        return load_image

    def _encode_crops(self, files: dict) -> list[tuple]:
        """The tower's blocks (at 0; a tuple of crops an image) of `files` (their EncodedRows keys -> bytes),
        kept in self.encoded: one image at a time decoded, cut into crops, encoded and let go (every image's
        crops held at once: 3 MB a SmolVLM crop, hundreds of MB)."""
        load_image, tower = self._decoder(), self._tower_now()
        causal = self.layout.block_tokens(1) == 0
        width = self.model.config.d_model
        out, shape = [], None
        for key, data in files.items():
            image = load_image(data)
            with self._holding(tower):
                px = tower_crops(tower.pixels(image))
                del image
                if out and px.shape[1:] != shape:
                    raise ModelFormatError(f"the vision tower's pixels are no arrays of one shape ({shape}, "
                                           f"{px.shape[1:]})")
                shape = px.shape[1:]
                per, step = int(tower.tokens_per_image), MAX_CROPS_A_CALL
                rows = np.concatenate([tower_rows(tower.encode(px[i:i + step]), len(px[i:i + step]), per, width)
                                       for i in range(0, len(px), step)])
                del px
                blocks = tuple(image_block(0, r, causal) for r in rows)
                self.encoded.put(key, blocks)
            out.append(blocks)
        return out

    def _encode_grids(self, files: dict, grids: list) -> list[tuple]:
        """Qwen2-VL's images: each its own patches (tower.pixels: [patches, C*T*P*P]), its grid (`grids`: tower.grid
        of its size), its rows (tower.encode_one of both: [gh * gw, width], in prompt order), one causal block an
        image, its grid on it (M-RoPE); one image at a time decoded, patched and encoded. LLaVA-NeXT's: its rows from
        the decoded image (tower.encode_image: layout.count(grid) of them), one causal block, no grid on it."""
        load_image, tower = self._decoder(), self._tower_now()
        m = self.model
        sized = self.layout.family == LLAVA_NEXT        # its rows from the image itself (tower.encode_image)
        for gh, gw in grids:    # the memory plan counts the largest image the context holds (workspace_bytes)
            n = self.layout.count(gh, gw, int(tower.tokens_per_image)) if sized else gh * gw
            if n >= m.n_ctx:
                raise ContextOverflowError(f"an image of {gh} x {gw} ({n} tokens) does not fit the context of "
                                           f"{m.n_ctx} (prompt plus at least one new token)")
        out = []
        for (key, data), (gh, gw) in zip(files.items(), grids):
            image = load_image(data)
            with self._holding(tower):
                width = m.transformer.image_width       # Qwen3-VL: the DeepStack levels' columns after the embeddings'
                if sized:
                    n = self.layout.count(gh, gw, int(tower.tokens_per_image))
                    blocks = (image_block(0, tower_rows([tower.encode_image(image)], 1, n, width)[0], causal=True),)
                    self.encoded.put(key, blocks)
                    out.append(blocks)
                    continue
                px = tower.pixels(image)
                del image
                try:
                    px = np.asarray(px, dtype=np.float32)
                except (TypeError, ValueError) as e:
                    raise ModelFormatError(f"the vision tower's pixels are no array of numbers ({e})") from None
                pixtral = self.layout.family == PIXTRAL           # Pixtral's: the image [C, h, w]
                if px.ndim != (3 if pixtral else 2) or not px.size:
                    raise ModelFormatError(f"the vision tower's pixels are of shape {px.shape}: no "
                                           f"{'[C, h, w]' if pixtral else '[patches, values]'} array")
                rows = tower_rows([tower.encode_one(px, (gh, gw))], 1, gh * gw, width)[0]
                if pixtral:         # a block a row of [IMG] tokens, [IMG_BREAK] between them
                    blocks = tuple(image_block(0, rows[r * gw:(r + 1) * gw], causal=True) for r in range(gh))
                else:
                    blocks = (image_block(0, rows, causal=True, grid=(gh, gw)),)
                self.encoded.put(key, blocks)   # under the lock: a tower attached since would not clear them
            out.append(blocks)
        return out
