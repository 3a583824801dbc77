"""Ollama's model listings for the one served model: GET /api/tags, POST /api/show, GET /api/ps,
GET /api/version; and GET / saying "Ollama is running", as Ollama's root does, where no chat page is
served there (clients probe it to see whether the server is up).

There is no Modelfile here, so /api/show's `modelfile` and `template` are empty (the chat template is
Jinja, not Ollama's Go template language) and its `parameters` say only `num_ctx`, the server's
context; `details` and `model_info` come from the loaded model's config and, for a GGUF file, its
`general.*` metadata. The digest identifies the file as served (its name, size and modification
time), not its content. LoRA adapters merged at load are listed under `adapters` in /api/show and
each /api/ps entry (llambda's own key, as /v1/models' meta.adapters: by file name, never by path).
"""
from __future__ import annotations

import hashlib
import os
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from .deltas import Http
from .errors import bad_request
from .openai_format import adapter_cards
from .schemas import _Body

PATHS = ("/api/tags", "/api/show", "/api/ps", "/api/version")
# the Ollama API release whose endpoints and fields this module and ollama_api.py answer (tools,
# structured outputs, think); clients compare it to decide which features to use
OLLAMA_API_VERSION = "0.9.0"
ROOT = "/"
RUNNING = "Ollama is running"
NEVER = "9999-12-31T23:59:59Z"     # /api/ps's expires_at: the model stays loaded while the server runs


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat().replace("+00:00", "Z")


def _files(path: Path) -> list[Path]:
    return [p for p in path.iterdir() if p.is_file()] if path.is_dir() else [path]


def _weights(model) -> tuple[int | None, str]:
    """(parameter count, the type most weights are stored in) of a GGUF model; (None, "") otherwise
    (a Hub directory's tensors may be converted when read, too costly for a listing)."""
    src = model.source
    if getattr(src, "format", None) != "gguf":
        return None, ""
    shares = src.shares_by_type()
    by_type = Counter({k: s.matrix_params for k, s in shares.items() if s.matrix_params})
    return sum(s.params for s in shares.values()), (by_type.most_common(1)[0][0] if by_type else "")


def _size_label(count: int | None, meta: dict) -> str:
    label = meta.get("general.size_label")
    if isinstance(label, str) and label:
        return label
    if count is None:
        return ""
    return f"{count / 1e9:.1f}B" if count >= 1e9 else f"{count / 1e6:.0f}M"


class ServedModel:
    """The served model as Ollama describes models (computed once, on first use)."""

    def __init__(self, service):
        self.service = service
        self._card: dict | None = None

    def card(self) -> dict:
        if self._card is None:
            self._card = self._describe()
        return self._card

    def _describe(self) -> dict:
        model = self.service.model
        cfg, src = model.config, model.source
        meta = getattr(src, "metadata", None) or {}
        files = _files(Path(src.path))
        stats = [os.stat(p) for p in files]
        size = sum(s.st_size for s in stats)
        mtime = max((s.st_mtime for s in stats), default=0.0)
        identity = f"{Path(src.path).name}:{size}:{max((s.st_mtime_ns for s in stats), default=0)}"
        count, qtype = _weights(model)
        arch = cfg.arch
        details = {"parent_model": "", "format": "gguf" if getattr(src, "format", "") == "gguf" else "safetensors",
                   "family": arch, "families": [arch], "parameter_size": _size_label(count, meta),
                   "quantization_level": qtype}
        return {"size": size, "modified_at": _iso(mtime), "details": details,
                "digest": hashlib.sha256(identity.encode()).hexdigest(), "model_info": self._info(count, meta)}

    def _info(self, count: int | None, meta: dict) -> dict:
        model = self.service.model
        cfg, arch = model.config, model.config.arch
        info = {k: v for k, v in meta.items()
                if k.startswith("general.") and isinstance(v, (str, int, float, bool))}
        info["general.architecture"] = arch
        if count is not None:
            info["general.parameter_count"] = count
        if getattr(model, "is_encoder", False):
            main = {"context_length": cfg.max_tokens, "embedding_length": cfg.hidden, "block_count": cfg.n_layers,
                    "attention.head_count": cfg.n_heads, "feed_forward_length": cfg.ffn, "vocab_size": cfg.vocab_size}
        else:
            main = {"context_length": cfg.n_ctx_train, "embedding_length": cfg.d_model, "block_count": cfg.n_layers,
                    "attention.head_count": cfg.n_heads, "attention.head_count_kv": cfg.n_kv_heads,
                    "attention.key_length": cfg.head_dim, "feed_forward_length": cfg.ffn_dim,
                    "vocab_size": cfg.vocab_size, "rope.freq_base": cfg.rope_theta}
            if cfg.n_experts:
                main.update({"expert_count": cfg.n_experts, "expert_used_count": cfg.n_experts_used})
        info.update({f"{arch}.{k}": v for k, v in main.items()})
        return info

    def capabilities(self) -> list[str]:
        s = self.service
        if getattr(s.model, "is_encoder", False):
            return ["embedding"]
        caps = ["completion", "tools"]      # tools: the template's own, or the generic tool prompt
        if getattr(s, "harmony", False) or getattr(s, "thinks", False):
            caps.append("thinking")
        if getattr(s, "fim", None) is not None:
            caps.append("insert")
        if getattr(s.model, "accepts_images", False):      # a vision tower is attached
            caps.append("vision")
        return caps

    def adapters(self) -> dict:
        """{"adapters": [...]} (llambda's key: Ollama's shapes have no place for adapters merged at load
        but the Modelfile's ADAPTER lines, and there is no Modelfile here), or {} without adapters."""
        cards = adapter_cards(self.service.model)
        return {"adapters": cards} if cards else {}

    def tagged(self) -> str:
        name = self.service.cfg.model_id
        return name if ":" in name else f"{name}:latest"

    def listing(self) -> dict:
        c = self.card()
        return {"name": self.tagged(), "model": self.tagged(), "modified_at": c["modified_at"], "size": c["size"],
                "digest": c["digest"], "details": c["details"]}


def root_route() -> Route:
    async def running(request: Request) -> Response:
        return PlainTextResponse(RUNNING)
    return Route(ROOT, running, methods=["GET", "HEAD"])


def routes(service, http: Http, served_name) -> list[Route]:
    served = ServedModel(service)

    async def tags(request: Request) -> Response:
        return http.json_response({"models": [served.listing()]})

    async def show(request: Request) -> Response:
        body = await http.body(request)
        if body is None:
            return Response(status_code=499)
        b = _Body(body)
        name = b.get("model") if b.get("model") not in (None, "") else b.get("name")
        if name in (None, ""):      # as Ollama answers it: which model to describe is not optional
            raise bad_request("model is required", param="model")
        served_name(service, name)
        c = served.card()
        # num_ctx: the context every request gets here (clients such as Continue size prompts by it)
        return http.json_response({"license": str(c["model_info"].get("general.license", "")), "modelfile": "",
                                   "parameters": f"num_ctx {service.model.n_ctx}", "template": "",
                                   "details": c["details"],
                                   "model_info": c["model_info"], "capabilities": served.capabilities(),
                                   "modified_at": c["modified_at"], **served.adapters()})

    async def ps(request: Request) -> Response:
        plan = getattr(service.model, "memory_plan", None)
        c = served.card()
        entry = dict(served.listing(), expires_at=NEVER, size=plan.total if plan is not None else c["size"],
                     size_vram=0, context_length=service.model.n_ctx, **served.adapters())
        del entry["modified_at"]
        return http.json_response({"models": [entry]})

    async def version(request: Request) -> Response:
        return http.json_response({"version": OLLAMA_API_VERSION})

    return [Route("/api/tags", tags, methods=["GET", "HEAD"]), Route("/api/show", show, methods=["POST"]),
            Route("/api/ps", ps, methods=["GET"]), Route("/api/version", version, methods=["GET"])]
