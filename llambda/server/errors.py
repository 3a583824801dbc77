"""OpenAI-style error objects: `{"error": {"message", "type", "param", "code"}}` with an HTTP status."""
from __future__ import annotations

import json

SHOWN_CHARS = 100       # of a client's value quoted back in an error (a name may be megabytes)


class APIError(Exception):
    def __init__(self, status: int, message: str, kind: str | None = None, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind or _default_kind(status)
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}

    def json_bytes(self) -> bytes:
        return json.dumps(self.body(), ensure_ascii=False).encode()


def _default_kind(status: int) -> str:
    if status == 401:
        return "authentication_error"
    if status == 404:
        return "not_found_error"
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def shown(value) -> str:
    """A client's value as an error quotes it: its repr, cut to SHOWN_CHARS."""
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]}... ({len(text)} characters)"


def model_not_found(name, served: str) -> APIError:
    return APIError(404, f"the model {shown(name)} does not exist; this server serves {served!r}",
                    param="model", code="model_not_found")
