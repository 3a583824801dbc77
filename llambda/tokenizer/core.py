"""`Tokenizer`: text <-> token ids for a model, from GGUF metadata or a HF directory."""
from __future__ import annotations

import contextlib
import gc
import threading
import warnings

import numpy as np

from ..errors import TokenizerError
from .build import build_backend
from .library import library_error
from .literal import Literals
from .pieces import BYTE_CHARS, TokenPieces
from .stream import StreamDecoder
from .vocab import TokenizerWarning, TokenType, Vocab, vocab_from_gguf_metadata

# encode_for_encoder: up to this many inputs are encoded one by one, not by the library's batch encode
SERIAL_ENCODE_MAX = 256
# read before a piece that continues a stretch of text (Tokenizer._encode_marked): a byte no merge takes
_PROBE = "\x00"


class Tokenizer:
    """Encode and decode text for one model.

    Attributes: `vocab_size`, `bos_id`, `eos_id`, `eot_ids` (every id that
    ends generation: EOS, EOT, EOM and end-of-turn tokens such as
    <|im_end|>, <end_of_turn>, <|endoftext|>), `add_bos`, `add_eos` (the
    model's own flags), `pad_id`, `unk_id`,
    `model` ("gpt2" byte-level BPE or "llama" SentencePiece), `pre`.
    """

    def __init__(self, backend, vocab: Vocab, byte_level: bool):
        self._backend = backend
        self._vocab = vocab
        self._tokens = vocab.tokens
        self._byte_level = byte_level
        self._pieces = TokenPieces(vocab.tokens, vocab.types, byte_level)
        self._special = frozenset(vocab.ids_of_type(TokenType.CONTROL, TokenType.UNKNOWN).tolist())
        # encode_special_tokens is a switch on the shared backend: flip it
        # under a lock so that concurrent encodes do not see each other's.
        self._lock = threading.Lock()
        self._parse_special = True
        self._literals: Literals | None = None     # built on first use (literals)
        self._literals_lock = threading.Lock()
        self._special_ids: frozenset = frozenset()   # the backend's control tokens (set with _literals)

        self.vocab_size: int = vocab.size
        self.bos_id: int | None = vocab.bos_id
        self.eos_id: int | None = vocab.eos_id
        self.pad_id: int | None = vocab.pad_id
        self.unk_id: int | None = vocab.unk_id
        self.eot_ids: frozenset[int] = vocab.end_of_generation_ids() | frozenset(vocab.extra.get("eog", ()))
        self.add_bos: bool = vocab.add_bos
        self.add_eos: bool = vocab.add_eos
        self.model: str = vocab.model
        self.pre: str = vocab.pre
        # SentencePiece with a space prefix: decode drops the one encode added.
        self._strip_first_space = vocab.model in ("llama", "t5") and vocab.add_space_prefix

        # Bytes the byte-level vocabulary cannot spell are dropped by BPE (as
        # the original tokenizers do); remember them so encode can say so.
        self._present_bytes = None
        if byte_level:
            missing = [b for b in range(256) if backend.token_to_id(BYTE_CHARS[b]) is None]
            if missing:
                self._present_bytes = bytes(b for b in range(256) if b not in missing)

    # ---- construction -------------------------------------------------------------------

    @classmethod
    def from_gguf_metadata(cls, metadata: dict) -> "Tokenizer":
        """From a GGUF's metadata dict (keys 'tokenizer.ggml.*')."""
        with _gc_paused():
            vocab = vocab_from_gguf_metadata(metadata)
            return cls(build_backend(vocab), vocab, byte_level=vocab.model == "gpt2")

    @classmethod
    def from_hf_dir(cls, path) -> "Tokenizer":
        """From a HF model directory: tokenizer.json, plus tokenizer_config.json,
        special_tokens_map.json, generation_config.json, config.json when present."""
        from .hf_dir import load_hf_dir

        backend, vocab, byte_level = load_hf_dir(path)
        return cls(backend, vocab, byte_level)

    @property
    def backend(self):
        """The HF `tokenizers.Tokenizer` doing the encoding (for export to tokenizer.json)."""
        return self._backend

    @property
    def vocab(self) -> Vocab:
        """Token strings, types, scores, special ids and flags as loaded."""
        return self._vocab

    # ---- encoding -------------------------------------------------------------------------

    def encode(self, text: str, add_bos: bool = False, parse_special: bool = True) -> list[int]:
        """Token ids of `text`.

        add_bos=True adds the model's special tokens the way llama.cpp's
        `llama_tokenize(add_special=true)` does: BOS in front if the model's
        add_bos flag is set (and it has a BOS; not twice if the text already
        starts with it, e.g. from a chat template), EOS at the end if its
        add_eos flag is set.  So SmolLM2/Qwen2.5 get nothing, Gemma gets <bos>.
        parse_special=True matches control tokens written in the text
        (e.g. "<|im_start|>") as single tokens; False spells them out as
        plain text.  User-defined added tokens (e.g. Qwen's <tool_call>) are
        matched either way.
        """
        if not isinstance(text, str):
            raise TokenizerError(f"encode() needs a str, got {type(text).__name__}")
        lit = self._literals
        if lit is not None and lit.holds_placeholders(text):
            ids = self._encode_marked(lit.split(text), parse_special)
        else:
            ids = self._encode_raw(text, parse_special)
        if self._present_bytes is not None and text:
            self._warn_dropped_bytes(text)
        if add_bos:
            if self.add_bos and (not ids or ids[0] != self.bos_id):
                ids.insert(0, self.bos_id)
            if self.add_eos:
                ids.append(self.eos_id)
        return ids

    def _encode_raw(self, text: str, parse_special: bool) -> list[int]:
        try:
            with self._lock:
                if self._parse_special != parse_special:
                    self._backend.encode_special_tokens = not parse_special
                    self._parse_special = bool(parse_special)
                return self._backend.encode(text, add_special_tokens=False).ids
        except BaseException as e:
            if not library_error(e):
                raise
            raise TokenizerError(f"cannot encode text: {_explain(text, e)}") from None

    def _encode_marked(self, pieces: list[tuple[str, bool]], parse_special: bool) -> list[int]:
        """A text holding Literals placeholders: each piece on its own, a literal one with its control tokens
        spelled out. A SentencePiece vocabulary that puts a space before each stretch of text between control
        tokens puts none before a piece that continues one (read after a byte token, _PROBE, whose ids are
        then dropped)."""
        ids: list[int] = []
        heads: dict[bool, list[int]] = {}       # the probe's own ids, once per parse mode
        for piece, literal in pieces:
            special = parse_special and not literal
            if not self._strip_first_space or not ids or ids[-1] in self._special_ids:
                ids += self._encode_raw(piece, special)
                continue
            head = heads.get(special)
            if head is None:
                head = heads[special] = self._encode_raw(_PROBE, special)
            both = self._encode_raw(_PROBE + piece, special)
            ids += both[len(head):] if both[:len(head)] == head else self._encode_raw(piece, special)
        return ids

    @property
    def literals(self) -> Literals:
        """The placeholders of control-token text in a caller's strings (tokenizer/literal.py)."""
        with self._literals_lock:       # one key: a text marked by one thread is read by another
            if self._literals is None:
                special = {i: t.content for i, t in self._backend.get_added_tokens_decoder().items() if t.special}
                self._special_ids = ids = frozenset(special)
                self._literals = Literals(special.values(), lambda text: self._special_spans(text, ids))
        return self._literals

    def _special_spans(self, text: str, ids: frozenset) -> list[tuple[int, int]]:
        """Where the backend matches control tokens in `text` (character offsets): a tokenization of it,
        for a vocabulary whose control tokens Literals does not look for itself."""
        try:
            with self._lock:
                if not self._parse_special:
                    self._backend.encode_special_tokens = False
                    self._parse_special = True
                enc = self._backend.encode(text, add_special_tokens=False)
        except BaseException as e:
            if not library_error(e):
                raise
            raise TokenizerError(f"cannot encode text: {_explain(text, e)}") from None
        return [off for i, off in zip(enc.ids, enc.offsets) if i in ids]

    def encode_for_encoder(self, texts: list[str], max_tokens: int) -> list[tuple[list[int], list[int]]]:
        """(ids, token_type_ids) per text with the model's own special tokens ([CLS] ... [SEP] for
        BERT, from tokenizer.json's post-processor), truncated to max_tokens as the original
        tokenizer truncates (the text's tokens are cut, the special tokens kept). A vocabulary whose backend
        has no post-processor (a GGUF's SentencePiece, as EmbeddingGemma's) gets its add_bos / add_eos
        tokens as llama.cpp's llama_tokenize(add_special) adds them."""
        # a (text, text) pair is one input of a cross-encoder: [CLS] a [SEP] b [SEP], type ids 0 then 1
        if any(not isinstance(t, str) and not (isinstance(t, tuple) and len(t) == 2
                                               and all(isinstance(x, str) for x in t)) for t in texts):
            raise TokenizerError("encode_for_encoder() needs a list of str or of (str, str) pairs")
        if max_tokens < 3:
            raise TokenizerError(f"max_tokens must be >= 3, got {max_tokens}")
        try:
            with self._lock:
                if not self._parse_special:
                    self._backend.encode_special_tokens = False
                    self._parse_special = True
                # the backend is shared: truncation is switched on only for this call
                front, back = self._encoder_specials(texts)
                self._backend.enable_truncation(max_tokens - len(front) - len(back))
                try:
                    # the library's batch encode spreads over its own thread pool, which a batch of short
                    # texts does not repay (32 short sentences: 0.7-1 ms one by one, 3-7 ms in a batch,
                    # on a loaded 2-core machine) and which competes with the encoder's own threads
                    if any(isinstance(t, tuple) for t in texts):
                        encs = self._encode_pairs(texts, max_tokens)
                    elif len(texts) <= SERIAL_ENCODE_MAX:
                        encs = [self._backend.encode(t, add_special_tokens=True) for t in texts]
                    else:
                        encs = self._backend.encode_batch(list(texts), add_special_tokens=True)
                finally:
                    self._backend.no_truncation()
        except BaseException as e:
            if not library_error(e):
                raise
            flat = [x for t in texts for x in ((t,) if isinstance(t, str) else t)]
            bad = next((t for t in flat if _explain(t, e) != str(e)), flat[0] if flat else "")
            raise TokenizerError(f"cannot encode text: {_explain(bad, e)}") from None
        if front or back:
            return [((front if front and e.ids[:1] != front else []) + list(e.ids) + back,
                     [0] * (len(e.ids) + len(front if front and e.ids[:1] != front else []) + len(back)))
                    for e in encs]
        return [(list(e.ids), list(e.type_ids)) for e in encs]

    def _encode_pairs(self, texts, max_tokens: int) -> list:
        """encode_for_encoder's texts with (a, b) pairs among them, each side encoded alone and cut before the
        library's truncation of the pair: that one keeps every overflowing piece of a and of b, and their
        product (two texts of 60 KB made some 10^6 pieces and gigabytes). Its longest-first cut depends only on
        the shorter side's length (as far as max_tokens + 1) and on which side is longer, so a side is cut to
        max_tokens + 1 tokens, one more for the longer side: the same tokens, type ids and special tokens."""
        pairs = [t if isinstance(t, tuple) else (t,) for t in texts]
        sides = [x for t in pairs for x in t]
        self._backend.no_truncation()
        try:
            if len(sides) <= SERIAL_ENCODE_MAX:
                encoded = [self._backend.encode(x, add_special_tokens=False) for x in sides]
            else:
                encoded = self._backend.encode_batch(sides, add_special_tokens=False)
        finally:
            self._backend.enable_truncation(max_tokens)
        out, k = [], 0
        for t in pairs:
            parts = encoded[k:k + len(t)]
            k += len(t)
            if len(parts) == 2:
                n = [len(e.ids) for e in parts]
                for e, mine, other in ((parts[0], n[0], n[1]), (parts[1], n[1], n[0])):
                    cap = max_tokens + 1 + (mine > other)
                    if mine > cap:
                        e.truncate(cap)
            out.append(self._backend.post_process(*parts, add_special_tokens=True))
        return out

    def _encoder_specials(self, texts) -> tuple[list[int], list[int]]:
        """The BOS and EOS encode_for_encoder adds itself: none where the backend's post-processor adds the
        model's special tokens, or for (text, text) pairs."""
        if getattr(self._backend, "post_processor", None) is not None or any(isinstance(t, tuple) for t in texts):
            return [], []
        return ([self.bos_id] if self.add_bos and self.bos_id is not None else [],
                [self.eos_id] if self.add_eos and self.eos_id is not None else [])

    def _warn_dropped_bytes(self, text: str) -> None:
        dropped = text.encode("utf-8").translate(None, self._present_bytes)
        if dropped:
            shown = ", ".join(f"0x{b:02x}" for b in sorted(set(dropped)))
            warnings.warn(f"the vocabulary has no token for byte(s) {shown}; {len(dropped)} byte(s) of the "
                          f"text were dropped, as the model's own tokenizer does", TokenizerWarning,
                          stacklevel=3)

    # ---- decoding -------------------------------------------------------------------------

    def _check_id(self, token_id) -> int:
        if isinstance(token_id, (bool, np.bool_)) or not isinstance(token_id, (int, np.integer)):
            raise TokenizerError(f"token id must be an integer, got {token_id!r}")
        i = int(token_id)
        if not 0 <= i < self.vocab_size:
            raise TokenizerError(f"token id {i} is out of range for a vocabulary of {self.vocab_size}")
        return i

    def _check_ids(self, ids) -> list[int]:
        """All ids as plain ints, validated in one pass (decode of long outputs)."""
        if isinstance(ids, np.ndarray):
            if ids.dtype.kind not in "iu":
                raise TokenizerError(f"token ids must be integers, got an array of {ids.dtype}")
            ids = ids.ravel().tolist()
        else:
            try:
                ids = list(ids)
            except TypeError:
                raise TokenizerError(f"token ids must be a sequence of integers, got {type(ids).__name__}") from None
        if set(map(type, ids)) - {int}:
            return [self._check_id(t) for t in ids]           # numpy scalars, or an error to name
        if ids and (min(ids) < 0 or max(ids) >= self.vocab_size):
            for t in ids:
                self._check_id(t)
        return ids

    def decode(self, ids, skip_special: bool = False) -> str:
        """Text of `ids`; bytes that are not valid UTF-8 become U+FFFD.

        skip_special drops control tokens (BOS, EOS, <|im_start|>, ...).
        For SentencePiece models that prepend a space when encoding, the
        leading space of the first token is removed again (unless that
        token is a control token, as in llama.cpp).
        """
        ids = self._check_ids(ids)
        if self.model == "bert":     # WordPiece: '##' joins pieces, which the library's decoder knows
            return self._backend.decode(ids, skip_special_tokens=skip_special)
        if skip_special:
            ids = [i for i in ids if i not in self._special]
        pieces = list(map(self._pieces, ids))
        if self._strip_first_space and ids and ids[0] not in self._special and pieces[0][:1] == b" ":
            pieces[0] = pieces[0][1:]
        return b"".join(pieces).decode("utf-8", errors="replace")

    def stream(self, skip_special: bool = False) -> StreamDecoder:
        """An incremental decoder: `.feed(id)` returns only complete characters, `.flush()` the rest.

        Meant for generated tokens continuing a prompt, so unlike decode() it
        never strips a leading space.
        """
        skip = self._special.__contains__ if skip_special else None
        return StreamDecoder(self._pieces, self._check_id, skip)

    def token_bytes(self, id) -> bytes:
        """The raw bytes a token stands for (control tokens: their text)."""
        return self._pieces(self._check_id(id))

    def token_text(self, id) -> str:
        """The token's string as written in the vocabulary."""
        return self._tokens[self._check_id(id)]

    def is_special(self, id) -> bool:
        """Control (or unknown) token: BOS, EOS, <|im_start|>, <end_of_turn>, ..."""
        return self._check_id(id) in self._special

    def token_type(self, id) -> TokenType:
        return TokenType(int(self._vocab.types[self._check_id(id)]))

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return (f"Tokenizer(model={self.model!r}, pre={self.pre!r}, vocab_size={self.vocab_size}, "
                f"bos={self.bos_id}, eos={self.eos_id}, add_bos={self.add_bos})")


@contextlib.contextmanager
def _gc_paused():
    """Building allocates ~1M small objects (vocab dict, merge pairs); letting the
    cyclic GC rescan the growing heap meanwhile costs ~20% of the load time."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _explain(text: str, err: Exception) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"the text holds a lone surrogate U+{ord(text[e.start]):04X} at index {e.start}, not valid Unicode"
    return str(err)
