"""Server settings (the `llambda serve` flags)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..chat import check_template_kwargs
from ..errors import InvalidInputError

# The KV cache precision `llambda serve` loads with unless --kv-type says otherwise (llama-server's
# default too). Decode attention reads every running sequence's keys and values from memory each
# step, so at 8 streams halving them was worth +7-20% aggregate tokens/s here; the library and
# `run` keep f32, the exact choice (f16 moves logits by up to ~0.03 on the reference models).
DEFAULT_KV_TYPE = "f16"

# What /v1/responses keeps for previous_response_id and GET (response_store.py): entries, and their
# JSON together (a few % of a 24 GB machine; a long conversation's entry holds all of its turns).
DEFAULT_STORED_RESPONSES = 10_000
DEFAULT_STORED_BYTES = 256 * 2**20
# One stored conversation's input items at most: a continuing request parses them whole (into several
# times their size), so the budget alone would let a chain of requests grow one entry to all of it. A
# context window's worth of turns is a few MB at most; what grows past this is not prompt (fields no
# template reads), refused with a 400 before generating.
MAX_STORED_CONVERSATION_BYTES = 16 * 2**20


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
    max_connections: int | None = None        # open connections; beyond: 503 and close (None: from
                                              # parallel and queue_size, see guard.default_max_connections)
    header_timeout: float = 10.0              # seconds a client gets to send a request head; then 408/close
    body_timeout: float = 30.0                # seconds a client gets to send a request body; then 408
    send_timeout: float = 60.0                # seconds a client whose response fills the write buffer gets to
                                              # read some of it; then the connection is aborted
    stall_timeout: float = 60.0               # /health says 503 when the scheduler makes no step this long
                                              # while work waits
    webui: bool = True                        # serve the chat page at / (--no-webui: off)
    log_format: str = "text"                  # "text" or "json" (one object per line), access log included
    prompt_workers: int = 4                   # threads rendering chat templates and tokenizing prompts
    prompt_stall_seconds: float = 30.0        # /health says 503 once all of them are stuck this long
    # /health says the image worker is "stalled" once one request's images take this long (8 images of a 4B
    # model's tower are ~6 min of one core's CPU); text is still served, so the status stays 200
    image_stall_seconds: float = 600.0
    # bytes of encoded image rows the requests hold at once (queued, encoding or prefilling: image_rows.py); None:
    # max(4 requests whose images fill the context, 1 GiB), from the model (image_rows.default_budget)
    image_rows_memory: int | None = None
    speculative: str | None = None            # requests' default: "draft" (needs a draft model), "lookup" or None
    draft_max: int | None = None              # tokens drafted per step at most (None: speculative's default)
    stored_responses: int = DEFAULT_STORED_RESPONSES   # /v1/responses kept (0: none); beyond: oldest out
    stored_bytes: int = DEFAULT_STORED_BYTES  # their JSON together; beyond: oldest out
    replica_tag: str = ""                     # a scale-out replica's: in its response ids, for the ingress
    # extra chat-template variables of every request (--template-kwargs, --no-think); a request's own
    # (chat_template_kwargs, reasoning_effort, think, thinking) override them name by name
    template_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        # checked as a request's are, however the config was made (flags, a Serve config file, code)
        try:
            self.template_kwargs = check_template_kwargs(self.template_kwargs)
        except InvalidInputError as e:
            raise InvalidInputError(f"template_kwargs: {e}") from None
        m = self.image_rows_memory
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
            raise InvalidInputError(f"image_rows_memory must be a number of bytes >= 1 (or None), not {m!r}")

    def accepts(self, name: str | None) -> bool:
        return name is None or name == self.model_id or name in self.aliases


def url_host(host: str) -> str:
    """`host` as a URL spells it: an IPv6 address in brackets (http://::1:8080/ is no URL)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
