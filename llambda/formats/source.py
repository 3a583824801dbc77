"""What opening a model yields, whatever its format: config, tensors, tokenizer, chat template."""
from __future__ import annotations

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

    def close(self) -> None:
        for c in self.closers:
            c()
        self.closers.clear()
