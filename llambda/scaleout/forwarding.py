"""An HTTP request as the ingress hands it to a replica, the text its prefix is routed on, and the
replica a stored response lives on (each replica keeps its own /v1/responses store)."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Iterable

from ..server.errors import APIError
from ..server.response_store import tag_of
from ..server.schemas import parse_json
from .prefix_policy import block_keys

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
    replica_tag: str | None = None      # the tag of the replica that stored the response it names


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


def _parsed(body_bytes: bytes):
    try:
        return parse_json(body_bytes)
    except APIError:
        return None     # not JSON: the replica answers 400 for that


def replica_tag(unique_id: str) -> str:
    """The tag a replica puts in its response ids: hex (ids split on '_'), short, from its Ray id."""
    return hashlib.blake2b(unique_id.encode(), digest_size=4).hexdigest()


def route_of(method: str, path: str, body_bytes: bytes) -> tuple[list[bytes], str | None]:
    """(prefix keys, stored-response replica tag) of a request: the block keys of a POST body's prompt
    text ([] when it is not JSON); the tag of the id in the path of GET/DELETE
    /v1/responses/<id>[/input_items], or of a POST body's previous_response_id."""
    if method != "POST":
        parts = path.split("/")
        named = parts[3] if len(parts) >= 4 and parts[1:3] == ["v1", "responses"] else None
        return [], tag_of(named)
    body = _parsed(body_bytes)
    prev = body.get("previous_response_id") if isinstance(body, dict) else None
    return block_keys(prompt_text(body)), tag_of(prev)


def stored_on(tag: str | None, unique_ids: Iterable[str]) -> str | None:
    """The replica (by Ray's unique id) whose tag `tag` is, among these; None when none is."""
    if tag is None:
        return None
    return next((u for u in unique_ids if replica_tag(u) == tag), None)
