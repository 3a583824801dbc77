"""`llambda ps`: the models a running server holds, listed as `ollama ps` lists Ollama's.

It asks the server's Ollama API (GET /api/ps, which `llambda serve` answers, and so does Ollama) at
`--host`, else at OLLAMA_HOST as ollama reads it (surrounding quotes and blanks dropped; empty: unset),
else at `llambda serve`'s own address, and prints NAME, ID, SIZE, PROCESSOR, CONTEXT and UNTIL. `LLAMBDA_API_KEY`, the key `llambda serve` takes from the environment, is sent when it is set.
"""
from __future__ import annotations

import http.client
import json
import math
import os
import re
import threading
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime, timezone

from ..errors import LlambdaError

DEFAULT_HOST = "http://127.0.0.1:8080"     # `llambda serve`'s --host and --port defaults
DEFAULT_PORTS = {"http": 8080, "https": 443}
TIMEOUT_S = 10.0                           # each socket operation's
TOTAL_S = 30.0                             # the whole answer's: a server trickling bytes is cut off
ANSWER_MAX_BYTES = 1 << 20                 # one model's entry is a few hundred bytes
FOREVER_AFTER_DAYS = 20 * 365              # an expiry this far ahead is "Forever" (the server's is year 9999)


def server_url(host: str, named: str = "--host") -> str:
    """`--host` (or OLLAMA_HOST: `named`, which errors name) as Ollama's OLLAMA_HOST is written (`host`,
    `host:port`, `:port`, `http://host:port`) -> the server's base URL; ValueError naming what is wrong."""
    text = host.strip()
    if not text:
        raise ValueError(f"{named} is empty: give the server's address, e.g. 127.0.0.1:8080")
    try:
        parts = urllib.parse.urlsplit(text if "://" in text else "http://" + text)
    except ValueError as e:     # "[::1": urllib's message alone does not say which argument
        raise ValueError(f"{named} {host!r}: {e}") from None
    if parts.scheme not in DEFAULT_PORTS:
        raise ValueError(f"{named} {host!r}: the scheme must be http or https, not {parts.scheme!r}")
    try:
        port = parts.port or DEFAULT_PORTS[parts.scheme]
    except ValueError:      # "host:abc", "host:99999"
        raise ValueError(f"{named} {host!r}: the port must be a number from 0 to 65535") from None
    name = parts.hostname or "127.0.0.1"
    name = f"[{name}]" if ":" in name else name          # an IPv6 address
    return f"{parts.scheme}://{name}:{port}{parts.path.rstrip('/')}"


def _fetch(request) -> bytes:
    with urllib.request.urlopen(request, timeout=TIMEOUT_S) as r:
        return r.read(ANSWER_MAX_BYTES + 1)


def _fetch_within(request, seconds: float) -> bytes:
    """_fetch in a daemon thread: a socket timeout bounds each read, not a server sending a byte per read
    (or a header line at a time) forever; past `seconds` the thread is left to the process's exit."""
    got: dict = {}

    def run():
        try:
            got["raw"] = _fetch(request)
        except BaseException as e:     # re-raised in the caller's thread
            got["error"] = e
    t = threading.Thread(target=run, name="llambda-ps", daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        raise TimeoutError(f"no whole answer within {seconds:g} s")
    if "error" in got:
        raise got["error"]
    return got["raw"]


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def running_models(base: str, api_key: str | None, named: str = "--host") -> list[dict]:
    """/api/ps's `models` at `base` (given by `named`: --host or OLLAMA_HOST); LlambdaError in one line when
    no server answers or it is not one."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    request = urllib.request.Request(base + "/api/ps", headers=headers)
    try:
        raw = _fetch_within(request, TOTAL_S)
    except urllib.error.HTTPError as e:
        if e.code == 401:
            said = "refused the key in LLAMBDA_API_KEY" if api_key else "asks for an API key: set LLAMBDA_API_KEY"
            raise LlambdaError(f"the server at {base} {said}") from None
        if e.code == 404:
            raise LlambdaError(f"{base} has no /api/ps: it is neither a llambda server nor Ollama") from None
        raise LlambdaError(f"the server at {base} answered /api/ps with HTTP {e.code}") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
        reason = getattr(e, "reason", None) or e
        where = "" if named == "--host" else f" ({named})"
        raise LlambdaError(f"no server answers at {base}{where} ({reason}): start one with `llambda serve`, "
                           "or give its address with --host") from None
    try:   # NaN/Infinity are Python's extension, not JSON; a deep nesting is RecursionError
        models = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)["models"] \
            if len(raw) <= ANSWER_MAX_BYTES else None
    except (ValueError, TypeError, KeyError, RecursionError):
        models = None
    if not isinstance(models, list) or not all(isinstance(m, dict) for m in models):
        raise LlambdaError(f"{base}/api/ps did not answer as Ollama's /api/ps does (a JSON list of models)")
    return models


def _size(n) -> float | None:
    """A byte count as a float, or None when it is none (a bool, a string, negative, past Go's int64 that
    Ollama's sizes are)."""
    if isinstance(n, bool) or not isinstance(n, (int, float)):
        return None
    try:
        v = float(n)
    except OverflowError:       # an integer past a float
        return None
    return v if math.isfinite(v) and 0 <= v < 2.0**63 else None


def human_bytes(n) -> str:
    """Decimal units, as ollama ps prints them: 98 MB, 1.1 GB."""
    n = _size(n)
    if n is None:
        return "?"
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            v = n / scale
            return f"{v:.0f} {unit}" if v >= 10 or v == int(v) else f"{v:.1f} {unit}"
    return f"{int(n)} B"


def processor(m: dict) -> str:
    """Where the weights are: all on the CPU here (size_vram 0); a GPU's share as Ollama says it."""
    size, vram = _size(m.get("size")), _size(m.get("size_vram") or 0)
    if not size or not vram:
        return "100% CPU"
    if vram >= size:
        return "100% GPU"
    cpu = round(100 * ((size - vram) / size))     # divided first: 100 * size may pass a float
    return f"{cpu}%/{100 - cpu}% CPU/GPU"


def until(expires_at, now: datetime) -> str:
    """How long the model stays loaded: "Forever" (llambda serve keeps it while it runs), "4 minutes
    from now", "Stopping..." once past; the field as given when it is no timestamp."""
    if not isinstance(expires_at, str):
        return "?"
    # fromisoformat: no "Z" before Python 3.11, at most 6 fraction digits (Ollama's Go times have 9)
    text = re.sub(r"(\.\d{6})\d+", r"\1", expires_at.replace("Z", "+00:00"))
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        return expires_at
    left = ((t if t.tzinfo else t.replace(tzinfo=timezone.utc)) - now).total_seconds()
    if left > FOREVER_AFTER_DAYS * 86400:
        return "Forever"
    if left <= 0:
        return "Stopping..."
    for unit, s in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if left >= 2 * s:
            return f"{int(left // s)} {unit}s from now"
    return "About a minute from now" if left >= 60 else "Less than a minute from now"


def table(models: list[dict], now: datetime) -> list[str]:
    rows = [("NAME", "ID", "SIZE", "PROCESSOR", "CONTEXT", "UNTIL")]
    for m in models:
        digest = str(m.get("digest") or "")
        ctx = m.get("context_length")
        rows.append((str(m.get("name") or m.get("model") or "?"), digest.removeprefix("sha256:")[:12],
                     human_bytes(m.get("size")), processor(m), str(ctx) if ctx is not None else "",
                     until(m.get("expires_at"), now)))
    # the server's strings reach a terminal: control characters (escape sequences, newlines) as "?"
    rows = [tuple("".join(ch if ch.isprintable() else "?" for ch in c) for c in r) for r in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["    ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def add_parser(sub) -> None:
    p = sub.add_parser("ps", help="models loaded in a running server (llambda serve, or Ollama), as ollama ps",
                       description="List the models a running server holds (its Ollama API's /api/ps): "
                                   "name, id, size, processor, context and how long it stays loaded.")
    p.add_argument("--host", default=None,
                   help="the server's address: host, host:port, :port or a URL (default: OLLAMA_HOST when set, "
                        f"as ollama reads it, else {DEFAULT_HOST}, llambda serve's)")
    p.set_defaults(fn=cmd_ps)


def address(flag: str | None) -> tuple[str, str]:
    """The server's address and what gave it: --host, else OLLAMA_HOST as ollama reads the variable
    (blanks and quotes around it dropped; empty is unset), else llambda serve's default."""
    if flag is not None:
        return flag, "--host"
    env = os.environ.get("OLLAMA_HOST", "").strip().strip("\"'")
    return (env, "OLLAMA_HOST") if env else (DEFAULT_HOST, "--host")


def cmd_ps(a) -> int:
    host, named = address(a.host)
    base = server_url(host, named)
    models = running_models(base, os.environ.get("LLAMBDA_API_KEY") or None, named)
    print("\n".join(table(models, datetime.now(timezone.utc))))
    return 0
