"""Tokenizer of a Hugging Face model directory.

tokenizer.json is loaded as is by the `tokenizers` library (it is the source
of truth for splitting and merging, and the only parser of that file); we only
read, from the loaded library's components, what our own layers need:
which tokens are special, how a token maps back to bytes (byte-level or
SentencePiece-style), and BOS/EOS/flags from
tokenizer_config.json, generation_config.json and config.json.
"""
from __future__ import annotations

import base64
import binascii
import json
import re
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer as Backend

from ..errors import TokenizerError
from ..formats.files import MAX_TOKENIZER_JSON_BYTES, read_json, read_small
from .charsmap import check_charsmap
from .library import library_error
from .vocab import TokenType, Vocab

_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")
# Unused ids a vocabulary may leave between its tokens (real ones leave none or a few hundred).
MAX_ID_GAP = 1 << 16
# Text a normalizer's Replace or Prepend writes per match (real ones: "▁" or " "). Normalizing runs in the
# library before any check of ours: Replace("a", 100k chars) took a 2000-char text to 23 GB.
MAX_NORMALIZER_TEXT = 16


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    data = read_json(path, path.name, TokenizerError)
    if not isinstance(data, dict):
        raise TokenizerError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _load_backend(tj: Path) -> Backend:
    """The library's tokenizer from one bounded read of tokenizer.json. Only the library parses it: a Python
    copy of the document (vocab dict, merge lists) cost ~7x the file's size on top of the library's own."""
    raw = read_small(tj, tj.name, TokenizerError, MAX_TOKENIZER_JSON_BYTES)
    try:
        return Backend.from_buffer(raw)
    except BaseException as e:
        if not library_error(e):
            raise
        raise TokenizerError(f"{tj}: the tokenizers library cannot load it: {e}") from None


def _component_spec(component) -> dict | None:
    """A normalizer, pre-tokenizer or decoder of the loaded library as JSON: what the library runs, in its own
    spelling (keys it ignores dropped, legacy ones converted)."""
    return None if component is None else json.loads(component.__getstate__())


def _check_precompiled(tj: Path, charsmap) -> None:
    """Refuse a Precompiled normalizer's charsmap (base64) that charsmap.py refuses."""
    try:
        blob = base64.b64decode(charsmap, validate=True)
    except (binascii.Error, ValueError, TypeError):
        raise TokenizerError(f"{tj}: normalizer Precompiled: precompiled_charsmap is not base64") from None
    check_charsmap(f"{tj}: normalizer Precompiled", blob)


def _check_normalizer_growth(tj: Path, spec) -> None:
    """Refuse a normalizer that writes more per match than real ones do: normalizing runs inside the
    library before any check of ours, so one bad rule multiplies every text's size."""
    for norm in _component_types(spec):
        if norm.get("type") == "Precompiled":
            _check_precompiled(tj, norm.get("precompiled_charsmap"))
            continue
        text = norm.get("content") if norm.get("type") == "Replace" else norm.get("prepend")
        if isinstance(text, str) and len(text) > MAX_NORMALIZER_TEXT:
            raise TokenizerError(f"{tj}: normalizer {norm.get('type')} writes {len(text)} chars per match, more "
                                 f"than the {MAX_NORMALIZER_TEXT} allowed (a text would grow without bound)")


def _component_types(spec) -> list[dict]:
    """A normalizer/pre-tokenizer/decoder spec flattened through its Sequences."""
    if not isinstance(spec, dict):
        return []
    out = [spec]
    for key in ("decoders", "pretokenizers", "normalizers"):
        subs = spec.get(key)         # the library ignores a stray non-list here; so must we (was a TypeError)
        for sub in subs if isinstance(subs, list) else []:
            out.extend(_component_types(sub))
    return out


def _token_content(value) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def load_hf_dir(path) -> tuple[Backend, Vocab, bool]:
    """(backend, vocab, byte_level) for a model directory."""
    folder = Path(path)
    if folder.is_file() and folder.name == "tokenizer.json":
        folder = folder.parent
    tj = folder / "tokenizer.json"
    if not tj.is_file():
        raise TokenizerError(f"{folder}: no tokenizer.json (only fast-tokenizer directories are supported)")
    backend = _load_backend(tj)
    # Encoders' tokenizer.json may fix padding and truncation (MiniLM's pads every text to 128):
    # encode() returns the text's own tokens; encoders truncate explicitly (encode_for_encoder)
    backend.no_padding()
    backend.no_truncation()
    model_type = type(backend.model).__name__
    if model_type not in ("BPE", "Unigram", "WordPiece"):
        raise TokenizerError(f"{tj}: model type {model_type!r} is not supported (BPE, Unigram or WordPiece only)")
    wordpiece = model_type == "WordPiece"
    _check_normalizer_growth(tj, _component_spec(backend.normalizer))
    decoder_spec = _component_spec(backend.decoder)
    decoder = _component_types(decoder_spec)
    pre = _component_types(_component_spec(backend.pre_tokenizer))
    byte_level = any(d.get("type") == "ByteLevel" for d in decoder + pre)
    metaspace = any(d.get("type") in ("Metaspace", "ByteFallback") or
                    (d.get("type") == "Replace" and d.get("content") == " ") for d in decoder)
    if not byte_level and not metaspace and not wordpiece:
        raise TokenizerError(f"{tj}: cannot tell how tokens map to bytes (decoder {decoder_spec!r})")
    # SentencePiece-style decoders that drop the space prepended at encode time.
    strip_first_space = not byte_level and any(
        (d.get("type") == "Strip" and d.get("start", d.get("left", 0))) or
        (d.get("type") == "Metaspace" and (d.get("prepend_scheme", "always") != "never"
                                           and d.get("add_prefix_space", True)))
        for d in decoder)

    ids = backend.get_vocab(with_added_tokens=True)
    n = max(ids.values()) + 1 if ids else 0
    if n == 0:
        raise TokenizerError(f"{tj}: the vocabulary is empty")
    # The tables below are sized by the largest id: a stray id of 1e9 must not allocate gigabytes.
    if n > len(ids) + MAX_ID_GAP:
        raise TokenizerError(f"{tj}: token id {n - 1} is far beyond the {len(ids)} tokens of the vocabulary")
    tokens = [""] * n
    types = np.full(n, TokenType.UNUSED, dtype=np.int32)
    for text, i in ids.items():
        tokens[i] = text
        types[i] = TokenType.NORMAL
    # <0xNN> tokens are bytes when the model falls back to them. The library keeps a Unigram's flag to itself;
    # converters give such a model the ByteFallback decoder, which spells them as bytes.
    byte_fallback = getattr(backend.model, "byte_fallback", None)
    if byte_fallback is None:
        byte_fallback = any(d.get("type") == "ByteFallback" for d in decoder)
    if byte_fallback:
        for text, i in ids.items():
            if _BYTE_TOKEN.fullmatch(text):
                types[i] = TokenType.BYTE
    for i, added in backend.get_added_tokens_decoder().items():
        types[i] = TokenType.CONTROL if added.special else TokenType.USER_DEFINED

    config = _read_json(folder / "tokenizer_config.json")
    special_map = _read_json(folder / "special_tokens_map.json")
    model_config = _read_json(folder / "config.json")
    gen_config = _read_json(folder / "generation_config.json")

    def special_id(name: str) -> int | None:
        content = _token_content(config.get(f"{name}_token")) or _token_content(special_map.get(f"{name}_token"))
        if content is not None:
            i = backend.token_to_id(content)
            if i is None:
                raise TokenizerError(f"{folder}: {name}_token {content!r} is not in the vocabulary")
            return i
        v = model_config.get(f"{name}_token_id")
        if isinstance(v, list):
            v = v[0] if v else None
        if isinstance(v, int) and not isinstance(v, bool):
            if not 0 <= v < n:
                raise TokenizerError(f"{folder}/config.json: {name}_token_id {v} is out of range (vocab {n})")
            return v
        return None

    vocab = Vocab(model="gpt2" if byte_level else "bert" if wordpiece else "llama", pre="tokenizer.json", tokens=tokens,
                  types=types, scores=None, merges=None)
    vocab.bos_id, vocab.eos_id = special_id("bos"), special_id("eos")
    vocab.unk_id, vocab.pad_id = special_id("unk"), special_id("pad")
    if wordpiece:
        vocab.extra["cls"], vocab.extra["sep"] = special_id("cls"), special_id("sep")
    vocab.add_space_prefix = strip_first_space

    # Without explicit flags, ask the post-processor what it adds.
    try:
        probe = backend.encode("a", add_special_tokens=True).ids
        plain = backend.encode("a", add_special_tokens=False).ids
    except BaseException as e:      # cannot encode "a" (a Unigram without unk_id): nothing known to be added
        if not library_error(e):
            raise
        probe = plain = []
    added_front = len(probe) > len(plain) and vocab.bos_id is not None and probe[0] == vocab.bos_id
    added_back = len(probe) > len(plain) and vocab.eos_id is not None and probe[-1] == vocab.eos_id
    flag = config.get("add_bos_token")
    vocab.add_bos = (bool(flag) if isinstance(flag, bool) else added_front) and vocab.bos_id is not None
    flag = config.get("add_eos_token")
    vocab.add_eos = (bool(flag) if isinstance(flag, bool) else added_back) and vocab.eos_id is not None

    extra_eos = gen_config.get("eos_token_id")
    extra_eos = extra_eos if isinstance(extra_eos, list) else [extra_eos]
    vocab.extra["eog"] = {i for i in extra_eos if isinstance(i, int) and 0 <= i < n}
    return backend, vocab, byte_level
