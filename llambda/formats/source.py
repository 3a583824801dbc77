"""What opening a model yields, whatever its format: config, tensors, tokenizer, chat template."""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Optional

import numpy as np

from ..errors import ModelFormatError
from ..models.config import TransformerConfig
from .quants import tensor_nbytes
from .weights import WeightTensor


@dataclass
class TypeShare:
    """What a file holds in one quant type."""
    tensors: int = 0
    nbytes: int = 0
    params: int = 0
    matrix_params: int = 0      # those of its tensors of two dimensions or more (not norms, biases)


@dataclass
class ModelSource:
    path: Path
    format: str                                   # "gguf" | "hf"
    config: TransformerConfig
    tensor: Callable[[str], Optional[WeightTensor]]
    metadata: dict = field(default_factory=dict)
    tokenizer: object | None = None
    tokenizer_error: str | None = None            # why there is no tokenizer
    chat_template: str | None = None
    name: str = ""
    closers: list = field(default_factory=list)
    tensor_names: list[str] = field(default_factory=list)   # every tensor `tensor` can return
    releasers: list = field(default_factory=list)   # each: (uint8 view of a mapped file) -> bytes released
    readers: list = field(default_factory=list)     # each with read_ahead() and stop_read_ahead() (readahead.py)
    # the file's tensors a name is read from, where every one of them must be read (see check_all_read)
    holders: Optional[Callable[[str], list[str]]] = None
    # the file's own names (HF's) a canonical name would be read from, for errors; None: the canonical ones
    file_names: Optional[Callable[[str], list[str]]] = None
    _read: set = field(default_factory=set, init=False, repr=False)

    def recording_lookup(self) -> Callable[[str], Optional[WeightTensor]]:
        """`tensor`, remembering the names a model read (for check_all_read)."""
        def lookup(name: str) -> WeightTensor | None:
            t = self.tensor(name)
            if t is not None:
                self._read.add(name)
            return t
        return lookup

    def check_all_read(self) -> None:
        """ModelFormatError naming the file's tensors the model did not read through recording_lookup: its
        metadata (config.json) describes less than the file holds (fewer layers, no shared expert), and
        running without them is another model. llama.cpp refuses such GGUF files too. (A HF directory's
        tensors outside the decoder, vision towers say, are not among its names: they are skipped.)"""
        if self.holders is None:
            return
        read = {n for name in self._read for n in self.holders(name)}
        unread = [n for n in self.tensor_names if n not in read]
        if unread:
            c, what = self.config, "config.json" if self.format == "hf" else "metadata"
            shown = ", ".join(repr(getattr(self.tensor(n), "name", n)) for n in unread[:3])   # the file's own names
            raise ModelFormatError(f"{self.path}: {len(unread)} tensors are not part of the model its {what} "
                                   f"describes ({c.arch}, {c.n_layers} layers), e.g. {shown}: the {what} and the "
                                   "tensors disagree")

    def tensors(self) -> Iterator[tuple[str, WeightTensor]]:
        """(name, tensor) of each name `tensor` returns one for, in the file's order."""
        for name in self.tensor_names:
            t = self.tensor(name)
            if t is not None:
                yield name, t

    def shares_by_type(self) -> dict[str, TypeShare]:
        """Each quant type's tensors, bytes and parameters, in the order the tensors first use the types."""
        out: dict[str, TypeShare] = {}
        for _, t in self.tensors():
            n = int(np.prod(t.shape))
            share = out.setdefault(t.qtype.name, TypeShare())
            share.tensors += 1
            share.nbytes += tensor_nbytes(t.qtype, t.shape)
            share.params += n
            if len(t.shape) >= 2:
                share.matrix_params += n
        return out

    def release(self, data) -> int:
        """Let go of the file pages under a tensor's bytes once a backend copied them (its packed copy
        is what runs): loading then holds the file's pages one tensor at a time, not all of them."""
        return sum(r(data) for r in self.releasers)

    @contextmanager
    def reading_ahead(self):
        """While loading: the files are read ahead of the tensors being packed, on threads of their own."""
        try:
            for r in self.readers:
                r.read_ahead()
            yield self
        finally:
            for r in self.readers:
                r.stop_read_ahead()

    def close(self) -> None:
        self.readers.clear()
        for c in self.closers:
            c()
        self.closers.clear()
        self.releasers.clear()
