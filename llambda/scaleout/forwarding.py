"""An HTTP request as the ingress hands it to a replica, and the text its prefix is routed on."""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..server.errors import APIError
from ..server.schemas import parse_json
from .prefix_policy import BLOCK_BYTES, block_keys

# Headers a replica's app reads; hop-by-hop ones (connection, keep-alive) stay at the ingress. Host,
# Origin and Sec-Fetch-Site let its Gatekeeper refuse DNS-rebound and cross-site requests.
FORWARDED_HEADERS = (b"authorization", b"x-api-key", b"content-type", b"content-length", b"accept",
                     b"anthropic-version", b"host", b"origin", b"sec-fetch-site")


@dataclass
class ForwardedRequest:
    method: str
    path: str
    query: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes
    prefix: list[bytes] = field(default_factory=list)   # block keys the router looks up


def prompt_text(body: object) -> str:
    """The part of a request body that becomes the start of the model's prompt, serialized the same
    way for every request: tools and system instructions first, then messages in order, then a
    completion's prompt. "" for a body that is not a generation request."""
    if not isinstance(body, dict):
        return ""
    parts: list[str] = []
    for name in ("tools", "system", "instructions"):     # rendered before the conversation
        if body.get(name) is not None:
            parts.append(json.dumps(body[name], sort_keys=True, ensure_ascii=False))
    messages = body.get("messages", body.get("input"))
    if isinstance(messages, list):
        for m in messages:
            if isinstance(m, dict):
                content = m.get("content")
                text = content if isinstance(content, str) else json.dumps(content, sort_keys=True,
                                                                           ensure_ascii=False)
                parts.append(f"{m.get('role')}\x1f{text}")
    elif isinstance(messages, str):
        parts.append(messages)
    prompt = body.get("prompt")
    if prompt is not None:
        parts.append(prompt if isinstance(prompt, str) else json.dumps(prompt))
    return "\x1e".join(parts)


def routing_keys(body_bytes: bytes, block_bytes: int = BLOCK_BYTES) -> list[bytes]:
    """Block keys of a raw request body; [] when it is not JSON (the replica answers 400 for that)."""
    try:
        body = parse_json(body_bytes)
    except APIError:
        return []
    return block_keys(prompt_text(body), block_bytes)
