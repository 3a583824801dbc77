"""One access log line per request, and the logging setup of `llambda serve` (text or JSON lines).

`AccessLog` is the outermost ASGI middleware: it times a request from its arrival until the last byte
of its response has been handed to the server (for a stream, until `data: [DONE]` or the hang-up), so
401s, 404s and 413s are logged too. A generation route leaves its `Generation` in the scope under
`GENERATION_KEY`; the line then carries its token counts, read after the response has finished.
It replaces uvicorn's own access log (`access_log=False` in runner.py), which knows no tokens.
"""
from __future__ import annotations

import json
import logging
import re
import time
from datetime import datetime, timezone

access_log = logging.getLogger("llambda.access")

GENERATION_KEY = "llambda.generation"   # scope key: the request's Generation, if it started one
LOG_FORMATS = ("text", "json")


class AccessLog:
    """ASGI middleware: log method, path, status, tokens in/out, milliseconds and client per request."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        status = [499]   # the client hung up before any response started

        async def send_seen(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_seen)
        except BaseException:
            if status[0] == 499:
                status[0] = 500
            raise
        finally:
            if access_log.isEnabledFor(logging.INFO):
                r = _record(scope, status[0], time.perf_counter() - t0)
                access_log.info("%s", _text(r), extra={"access": r})


def _record(scope, status: int, seconds: float) -> dict:
    client = scope.get("client")
    tokens_in = tokens_out = None
    gen = scope.get(GENERATION_KEY)
    if gen is not None:
        usage = gen.usage()
        tokens_in, tokens_out = usage.prompt, usage.completion
    return {"method": scope.get("method", ""), "path": scope.get("path", ""), "status": status,
            "tokens_in": tokens_in, "tokens_out": tokens_out, "ms": round(seconds * 1000, 1),
            "client": f"{client[0]}:{client[1]}" if client else None}


# what a decoded path may hold that would break a text line: %0a would forge a line of its own, %1b
# send terminal escapes, a quote end the field early
_UNSAFE = re.compile(r'[\x00-\x1f\x7f-\x9f"\\]')


def _escaped(text: str) -> str:
    return _UNSAFE.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _text(r: dict) -> str:
    dash = lambda v: "-" if v is None else v   # noqa: E731 - the common log format's "unknown"
    return (f'{dash(r["client"])} "{r["method"]} {_escaped(r["path"])}" {r["status"]} '
            f'tokens_in={dash(r["tokens_in"])} tokens_out={dash(r["tokens_out"])} {r["ms"]:.1f} ms')


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, and either the access fields or `message`."""

    def format(self, record: logging.LogRecord) -> str:
        obj = {"time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
               "level": record.levelname.lower(), "logger": record.name}
        access = getattr(record, "access", None)
        if access is not None:
            obj.update(access)
        else:
            obj["message"] = record.getMessage()
        if record.exc_info:
            obj["exception"] = self.formatException(record.exc_info)
        return json.dumps(obj, ensure_ascii=False)


def log_config(log_format: str, level: str) -> dict:
    """The logging.config dict uvicorn applies: its loggers and ours to stderr, in one format."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {log_format!r}")
    if log_format == "json":
        formatter = {"()": f"{__name__}.JsonFormatter"}
    else:
        # uvicorn's own formatter: "INFO:     message", coloured on a terminal
        formatter = {"()": "uvicorn.logging.DefaultFormatter", "fmt": "%(levelprefix)s %(message)s",
                     "use_colors": None}
    level = level.upper()
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"main": formatter},
        "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "main",
                                "stream": "ext://sys.stderr"}},
        "loggers": {
            "uvicorn": {"handlers": ["stderr"], "level": level, "propagate": False},
            "uvicorn.error": {"level": level},
            "llambda": {"handlers": ["stderr"], "level": level, "propagate": False},
        },
    }
