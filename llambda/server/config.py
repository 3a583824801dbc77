"""Server settings (the `llambda serve` flags)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ServerConfig:
    model_id: str = "llambda"                 # the id /v1/models lists and requests name
    aliases: set[str] = field(default_factory=set)   # other names accepted in the `model` field
    host: str = "127.0.0.1"
    port: int = 8080
    parallel: int = 4                         # KV slots = sequences decoded together
    queue_size: int = 64                      # sequences waiting for a slot; beyond: 429
    max_tokens_cap: int | None = None         # per-request limit on generated tokens (None: the context)
    max_body_bytes: int = 4 * 2**20           # request body cap; beyond: 413
    api_key: str | None = None                # when set, /v1/* and /metrics need `Authorization: Bearer KEY`
    prefill_chunk: int = 256                  # prompt tokens evaluated per step (running streams keep flowing)
    shutdown_grace: float = 30.0              # seconds in-flight requests get to finish after SIGTERM
    retry_after: int = 1                      # seconds, in the Retry-After header of 429/503

    def accepts(self, name: str | None) -> bool:
        return name is None or name == self.model_id or name in self.aliases
