"""What opening a model yields, whatever its format: config, tensors, tokenizer, chat template."""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from ..models.config import TransformerConfig
from .weights import WeightTensor


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
