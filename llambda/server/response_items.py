"""The input items a stored response keeps, and GET /v1/responses/{id}/input_items lists.

Each item keeps only its type's own fields, as OpenAI's API lists them: a message its role and its
text parts (type and text), a function_call its call_id, name and arguments, a function_call_output
its call_id and output, a reasoning item its summary and content parts; and its id and status.
A field a client added reaches no template, so it is not kept: every request continuing the
conversation parses the whole entry again, and junk such as `"note": [{}, {}, ...]` costs some
twenty times its JSON size once parsed.

The items come here validated (responses_api._messages): only those four types, their parts text.
"""
from __future__ import annotations

import secrets

STATUSES = ("in_progress", "completed", "incomplete")
MAX_ID_CHARS = 128          # a longer id a client gave is replaced by one of ours
PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def text_parts(parts: list) -> list[dict]:
    """Checked text parts as kept: their type and text (annotations and logprobs are not read)."""
    return [{"type": part["type"], "text": part["text"]} for part in parts]


def _fields(item: dict, kind: str) -> dict:
    if kind == "message":
        content = item["content"]
        if isinstance(content, str):
            part = "output_text" if item["role"] == "assistant" else "input_text"
            content = [{"type": part, "text": content}]
        return {"role": item["role"], "content": text_parts(content)}
    if kind == "function_call":
        return {"call_id": item["call_id"], "name": item["name"], "arguments": item.get("arguments", "{}")}
    if kind == "function_call_output":
        output = item.get("output", "")
        return {"call_id": item["call_id"], "output": output if isinstance(output, str) else text_parts(output)}
    kept = {"summary": text_parts(item.get("summary") or [])}       # reasoning
    if item.get("content") is not None:
        kept["content"] = text_parts(item["content"])
    return kept


def stored_items(inp, earlier: list[dict]) -> list[dict]:
    """The (checked) request input as stored: a string is a user message, and every item has an id
    unique in the conversation (`earlier`: the items it continues)."""
    if isinstance(inp, str):
        inp = [{"role": "user", "content": inp}]
    seen = {item.get("id") for item in earlier}
    out = []
    for item in inp:
        kind = item.get("type", "message")
        given = item.get("id")
        ok = isinstance(given, str) and len(given) <= MAX_ID_CHARS and given not in seen
        kept = {"id": given if ok else new_id(PREFIX[kind]), "type": kind, **_fields(item, kind)}
        if item.get("status") in STATUSES:
            kept["status"] = item["status"]
        seen.add(kept["id"])
        out.append(kept)
    return out
