"""The responses POST /v1/responses keeps (`store`, true unless the request says false), so that a
later request can continue one (`previous_response_id`), read it back (GET /v1/responses/{id}), list
its input items or delete it.

An entry is two JSON texts: the response object as it was answered (and where its `output` array
lies in it), and the conversation's input items (every item before the answer, the continued
responses' included, so an entry never needs the entries it continued). Held as bytes, the byte
budget counts what memory really holds, and nothing is serialized twice: a response is encoded once
(`encode_response`, the bytes its reply sends too), and a continuing conversation's bytes are the
continued entry's items and output joined as they are, then the new items (`conversation`). The store is
bounded by entries and by bytes; past either, the oldest entries go first. One conversation's items
are bounded too (`conversation`), so no single request parses more than that. One lock, so any
thread may call it (worker threads read and write a request's conversation, the event loop the
rest). Nothing survives a restart. A response being generated to be stored is `pending` until its
answer is put (or its request is gone): a DELETE meanwhile is honoured (it is then not kept) and a GET
says it is not done yet.

Ids are `resp_<48 hex digits>`; a scale-out replica's are `resp_<tag>_<48 hex digits>`, the tag
naming the replica, so the ingress sends a request naming the id to the one replica that has it.
"""
from __future__ import annotations

import json
import secrets
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass

from .config import DEFAULT_STORED_BYTES, DEFAULT_STORED_RESPONSES, MAX_STORED_CONVERSATION_BYTES
from .errors import APIError, bad_request
from .openai_format import dumps

SHOWN_ID_CHARS = 100                     # of an unknown id, quoted back in an error


@dataclass(frozen=True)
class EncodedResponse:
    data: bytes                 # the response object, JSON
    output: tuple[int, int]     # the byte span of its `output` array in `data`


def encode_response(response: dict) -> EncodedResponse:
    """The response object as JSON (as `dumps` writes it), serialized key by key so that the span
    of its `output` is known."""
    pieces, at, output = [], 1, (0, 0)
    for key, value in response.items():
        head = f"{dumps(key)}:".encode()
        text = dumps(value).encode()
        if key == "output":
            start = at + (1 if pieces else 0) + len(head)
            output = (start, start + len(text))
        pieces.append(head + text)
        at += len(pieces[-1]) + (1 if len(pieces) > 1 else 0)
    return EncodedResponse(b"{" + b",".join(pieces) + b"}", output)


def _joined(*arrays: bytes) -> bytes:
    """JSON arrays as one array, their elements' texts kept as they are."""
    inner = [a[1:-1] for a in arrays if a[1:-1].strip()]
    return b"[" + b",".join(inner) + b"]"


@dataclass(frozen=True)
class Stored:
    response: bytes             # the response object, JSON
    output: tuple[int, int]     # where its `output` array lies in `response`
    items: bytes                # the input items, JSON array

    @property
    def size(self) -> int:
        return len(self.response) + len(self.items)

    def response_object(self) -> dict:
        return json.loads(self.response)

    def output_json(self) -> bytes:
        start, end = self.output
        return self.response[start:end]

    def output_items(self) -> list[dict]:
        return json.loads(self.output_json())

    def input_items(self) -> list[dict]:
        return json.loads(self.items)


def tag_of(response_id) -> str | None:
    """The replica tag an id carries, or None (an id of a single server, or no id of ours)."""
    if not isinstance(response_id, str):
        return None
    parts = response_id.split("_")
    return parts[1] if len(parts) == 3 and parts[0] == "resp" and parts[1] else None


class ResponseStore:
    def __init__(self, max_responses: int = DEFAULT_STORED_RESPONSES, max_bytes: int = DEFAULT_STORED_BYTES,
                 tag: str = "", max_conversation_bytes: int = MAX_STORED_CONVERSATION_BYTES):
        self.max_responses, self.max_bytes, self.tag = max_responses, max_bytes, tag
        self.max_conversation_bytes = max_conversation_bytes
        self._entries: OrderedDict[str, Stored] = OrderedDict()
        self._bytes = 0
        self._pending: dict[str, bool] = {}     # id -> deleted while being generated
        self._lock = threading.Lock()

    def new_id(self) -> str:
        token = secrets.token_hex(24)
        return f"resp_{self.tag}_{token}" if self.tag else f"resp_{token}"

    def conversation(self, continued: Stored | None, items: list) -> bytes:
        """A conversation's input items as an entry holds them (those of `continued`, the entry it
        continues, as they are, then the new `items`), or a 400 when they are more than one entry
        may hold (checked before the request generates)."""
        data = dumps(items).encode()
        if continued is not None:       # its input items, then its output
            data = _joined(continued.items, continued.output_json(), data)
        # the whole store's budget bounds one entry too: input alone past it could never be kept
        limit = min(self.max_conversation_bytes, self.max_bytes)
        if len(data) > limit:
            raise bad_request(f"this conversation's input items would be stored as {len(data)} bytes of JSON, more "
                              f"than the {limit} one stored response may hold; start a new "
                              "conversation, or send this request with store: false", param="input",
                              code="conversation_too_large")
        return data

    @property
    def keeps_any(self) -> bool:
        """False when this server stores no response (--stored-responses 0)."""
        return self.max_responses >= 1

    def pending(self, response_id: str, owner: object) -> None:
        """Note that `response_id` is being generated to be stored, for as long as `owner` (the
        request's run) lives: a request that fails or is left never puts it, and is forgotten with it."""
        with self._lock:
            self._pending[response_id] = False
        weakref.finalize(owner, self._settle, response_id)

    def _settle(self, response_id: str) -> None:
        with self._lock:
            self._pending.pop(response_id, None)

    def put(self, response_id: str, response: EncodedResponse, items: bytes) -> bool:
        """Keep a response (evicting the oldest as needed) with its input items (`conversation`'s
        bytes of them); False when it alone exceeds the budget, or was deleted while being generated."""
        entry = Stored(response.data, response.output, items)
        with self._lock:
            if self._pending.pop(response_id, False):
                return False
        if not self.keeps_any or entry.size > self.max_bytes:
            return False
        with self._lock:
            old = self._entries.pop(response_id, None)
            if old is not None:
                self._bytes -= old.size
            self._entries[response_id] = entry
            self._bytes += entry.size
            while len(self._entries) > self.max_responses or self._bytes > self.max_bytes:
                _, gone = self._entries.popitem(last=False)
                self._bytes -= gone.size
        return True

    def get(self, response_id: str, param: str | None = None) -> Stored:
        """The entry, or a 404 naming the id (`param`: the request field that named it)."""
        with self._lock:
            entry = self._entries.get(response_id)
            generating = self._pending.get(response_id) is False
        if entry is None:
            if generating:
                code = "previous_response_not_found" if param == "previous_response_id" else "response_not_found"
                raise APIError(404, f"the response {str(response_id)[:SHOWN_ID_CHARS]!r} is still being generated; "
                               "it is stored once its answer is complete", param=param, code=code)
            raise self._not_found(response_id, param)
        return entry

    def delete(self, response_id: str) -> None:
        """Remove a stored response; one still being generated is then not kept."""
        with self._lock:
            entry = self._entries.pop(response_id, None)
            if entry is not None:
                self._bytes -= entry.size
            elif self._pending.get(response_id) is False:
                self._pending[response_id] = True
                return
        if entry is None:
            raise self._not_found(response_id, None)

    def stats(self) -> dict:
        with self._lock:
            return {"responses": len(self._entries), "bytes": self._bytes}

    def _not_found(self, response_id, param: str | None) -> APIError:
        shown = str(response_id)[:SHOWN_ID_CHARS]
        tag = tag_of(response_id)
        if self.tag and tag is not None and tag != self.tag:
            why = "it was stored by a replica that is no longer running"
        else:
            why = (f"it was never stored (store: false), was deleted, or was evicted (this server keeps at most "
                   f"{self.max_responses} responses of {self.max_bytes} bytes together, oldest out first)")
        code = "previous_response_not_found" if param == "previous_response_id" else "response_not_found"
        return APIError(404, f"no stored response with id {shown!r}: {why}", param=param, code=code)
