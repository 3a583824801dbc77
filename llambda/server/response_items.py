"""The input items a stored response keeps, and GET /v1/responses/{id}/input_items lists.

Each item keeps only its type's own fields, as OpenAI's API lists them: a message its role and its
text parts (type and text; an output_text part its annotations too, each its own type's fields), a
function_call its call_id, name and arguments, a function_call_output its call_id and output, a
reasoning item its summary and content parts and its encrypted_content (an opaque string a client
such as the openai SDK's agents passes back: ours to keep, not to read); and its id and status.
A field a client added reaches no template, so it is not kept: every request continuing the
conversation parses the whole entry again, and junk such as `"note": [{}, {}, ...]` costs some
twenty times its JSON size once parsed.

The items come here validated (responses_api._messages): only those four types, their parts text
(or an input_image's data: URL, kept as sent), annotations as `check_annotations` takes them.
"""
from __future__ import annotations

import secrets

from .errors import bad_request
from .schemas import _type

STATUSES = ("in_progress", "completed", "incomplete")
MAX_ID_CHARS = 128          # a longer id a client gave is replaced by one of ours
PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


# an output_text part's annotations, as OpenAI's API types them: each type's fields (str or int)
ANNOTATION_FIELDS = {
    "file_citation": {"file_id": str, "filename": str, "index": int},
    "url_citation": {"url": str, "title": str, "start_index": int, "end_index": int},
    "container_file_citation": {"container_id": str, "file_id": str, "filename": str, "start_index": int,
                                "end_index": int},
    "file_path": {"file_id": str, "index": int},
}


def check_annotations(annotations, where: str) -> None:
    """A 400 unless `annotations` (of an output_text part) is absent or an array of OpenAI's
    annotations, each with its type's fields: what a client sends back of an earlier answer."""
    if annotations is None:
        return
    if not isinstance(annotations, list):
        raise bad_request(f"{where} must be an array of annotations, got {_type(annotations)}", param=where)
    for i, note in enumerate(annotations):
        kind = note.get("type") if isinstance(note, dict) else None
        fields = ANNOTATION_FIELDS.get(kind) if isinstance(kind, str) else None    # a list: unhashable
        if fields is None:
            raise bad_request(f"{where}[{i}] must be an annotation object of type "
                              f"{', '.join(ANNOTATION_FIELDS)}", param=f"{where}[{i}]")
        for name, kind in fields.items():
            value = note.get(name)
            if not isinstance(value, kind) or isinstance(value, bool):
                raise bad_request(f"{where}[{i}]: a {note['type']} annotation needs "
                                  f"{'a string' if kind is str else 'an integer'} '{name}'", param=f"{where}[{i}]")


def _part(part: dict) -> dict:
    if part["type"] == "input_image":       # as OpenAI's API lists one (checked: a data: URL, no file_id)
        return {"type": "input_image", "image_url": part["image_url"], "detail": part.get("detail") or "auto"}
    kept = {"type": part["type"], "text": part["text"]}
    if part["type"] == "output_text":       # as OpenAI's API lists one: its annotations always
        kept["annotations"] = [{"type": note["type"], **{k: note[k] for k in ANNOTATION_FIELDS[note["type"]]}}
                               for note in part.get("annotations") or []]
    return kept


def text_parts(parts: list) -> list[dict]:
    """Checked parts as kept: their type and text, an output_text part's annotations (logprobs are not
    kept), an input_image's image_url and detail."""
    return [_part(part) for part in parts]


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
    if isinstance(item.get("encrypted_content"), str):
        kept["encrypted_content"] = item["encrypted_content"]
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
