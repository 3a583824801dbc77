"""The access log of a real `llambda serve`: one line per request (method, path, status, tokens in/out,
milliseconds, client) at the default level, as text or as JSON lines; uvicorn's own access log is off.
Also `--no-webui` (the chat page at / is gone: / answers "Ollama is running")."""
from __future__ import annotations

import json
import re
import time

import httpx

from serverkit import ServerProcess

TEXT_LINE = re.compile(r'INFO: +(?P<client>127\.0\.0\.1:\d+) "(?P<method>[A-Z]+) (?P<path>\S+)" (?P<status>\d{3}) '
                       r'tokens_in=(?P<tokens_in>\d+|-) tokens_out=(?P<tokens_out>\d+|-) (?P<ms>\d+\.\d) ms')
CHAT = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 6, "temperature": 0}


def _wait_lines(srv, parse, n: int, timeout=10.0) -> list[dict]:
    """The first `n` access records of the log, waiting for the last (written when a response ends)."""
    t0 = time.monotonic()
    while True:
        records = [r for r in map(parse, srv.log_path.read_text().splitlines()) if r]
        if len(records) >= n:
            return records
        assert time.monotonic() - t0 < timeout, f"{len(records)} access lines, expected {n}:\n{srv.log()}"
        time.sleep(0.05)


def _text_record(line: str) -> dict | None:
    m = TEXT_LINE.fullmatch(line.strip())
    if not m:
        return None
    r = m.groupdict()
    r["status"] = int(r["status"])
    for k in ("tokens_in", "tokens_out"):
        r[k] = None if r[k] == "-" else int(r[k])
    return r


def _requests(srv) -> list[tuple]:
    """Make one of each kind of request; returns the (method, path, status, tokens_in, tokens_out) expected."""
    url = srv.url
    expected = []
    r = httpx.post(url + "/v1/chat/completions", json=CHAT, timeout=60)
    u = r.json()["usage"]
    expected.append(("POST", "/v1/chat/completions", 200, u["prompt_tokens"], u["completion_tokens"]))
    # a stream: the counts are known only once it has ended, and the line waits for that
    usage = None
    with httpx.stream("POST", url + "/v1/chat/completions", timeout=60,
                      json={**CHAT, "max_tokens": 9, "stream": True, "stream_options": {"include_usage": True}}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                usage = json.loads(line[6:]).get("usage") or usage
    expected.append(("POST", "/v1/chat/completions", 200, usage["prompt_tokens"], usage["completion_tokens"]))
    # a client that hangs up mid-stream: logged with what was generated until then
    with httpx.stream("POST", url + "/v1/completions", timeout=60,
                      json={"prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True, "stream": True}) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i >= 6:
                break
    expected.append(("POST", "/v1/completions", 200, "some", "some"))
    # the other APIs' generations carry their counts too (Ollama's and Anthropic's, as each reports them)
    r = httpx.post(url + "/api/chat", json={"messages": CHAT["messages"], "stream": False,
                                            "options": {"num_predict": 5, "temperature": 0}}, timeout=60).json()
    expected.append(("POST", "/api/chat", 200, r["prompt_eval_count"], r["eval_count"]))
    u = httpx.post(url + "/v1/messages", json={**CHAT, "model": srv.model_id, "max_tokens": 4},
                   timeout=60).json()["usage"]
    expected.append(("POST", "/v1/messages", 200, u["input_tokens"], u["output_tokens"]))
    assert httpx.post(url + "/v1/chat/completions", content=b"{nope", timeout=30).status_code == 400
    expected.append(("POST", "/v1/chat/completions", 400, None, None))
    assert httpx.get(url + "/no/such/path", timeout=30).status_code == 404
    expected.append(("GET", "/no/such/path", 404, None, None))
    assert httpx.get(url + "/health", timeout=30).status_code == 200
    expected.append(("GET", "/health", 200, None, None))
    return expected


def _check(records: list[dict], expected: list[tuple]) -> None:
    got = [(r["method"], r["path"], r["status"], r["tokens_in"], r["tokens_out"]) for r in records]
    assert len(got) == len(expected), got
    for g, e in zip(got, expected):
        if e[3] == "some":     # the hung-up stream: a prompt, and fewer tokens than asked for
            assert g[:3] == e[:3] and g[3] > 0 and 0 < g[4] < 400, g
        else:
            assert g == e, (g, e)
    for r in records:
        assert r["client"].startswith("127.0.0.1:") and float(r["ms"]) >= 0


def test_text_access_log_one_line_per_request(smollm2_gguf, tmp_path):
    with ServerProcess(smollm2_gguf, tmp_path / "server.log", "--log-level", "info", "--parallel", "1",
                       "-c", "512") as srv:
        # startup made one /health (the first that answered) and one /v1/models request
        start = _wait_lines(srv, _text_record, 2)
        assert [(r["method"], r["path"]) for r in start] == [("GET", "/health"), ("GET", "/v1/models")]
        page = httpx.get(srv.url + "/", timeout=30)
        assert page.status_code == 200 and "default-src 'self'" in page.headers["content-security-policy"]
        expected = [("GET", "/", 200, None, None)] + _requests(srv)
        records = _wait_lines(srv, _text_record, 2 + len(expected))
        _check(records[2:], expected)
        time.sleep(0.3)
        log = srv.log_path.read_text()
        assert len([r for r in map(_text_record, log.splitlines()) if r]) == 2 + len(expected), log
        assert "HTTP/1.1" not in log, "uvicorn's own access log is on"


def test_json_log_and_no_webui(smollm2_gguf, tmp_path):
    with ServerProcess(smollm2_gguf, tmp_path / "server.log", "--log-level", "info", "--log-format", "json",
                       "--no-webui", "--parallel", "1", "-c", "512") as srv:
        root = httpx.get(srv.url + "/", timeout=30)       # Ollama's liveness line instead of the page
        assert root.status_code == 200 and root.text == "Ollama is running"
        assert httpx.get(srv.url + "/webui/app.js", timeout=30).status_code == 404
        expected = [("GET", "/", 200, None, None), ("GET", "/webui/app.js", 404, None, None)] + _requests(srv)

        def parse(line):
            obj = json.loads(line) if line.startswith("{") else None
            return obj if obj and obj["logger"] == "llambda.access" else None

        records = _wait_lines(srv, parse, 2 + len(expected))
        _check(records[2:], expected)
        for r in records:
            assert set(r) == {"time", "level", "logger", "method", "path", "status", "tokens_in", "tokens_out",
                              "ms", "client"}
            assert r["level"] == "info" and isinstance(r["ms"], float) and isinstance(r["status"], int)
        # every log line is JSON, uvicorn's too; only the startup banner (printed, not logged) is text
        lines = [ln for ln in srv.log_path.read_text().splitlines() if ln.strip()]
        other = [json.loads(ln) for ln in lines if not ln.startswith("[llambda]") and parse(ln) is None]
        assert any(o["logger"].startswith("uvicorn") and "message" in o for o in other), lines


def test_text_line_escapes_what_a_path_could_forge_a_line_with():
    # a decoded %0d%0a in a path used to end the line there and start a forged one; %1b reached the terminal
    from llambda.server.accesslog import _text
    path = '/a\r\nINFO:     127.0.0.1:9 "POST /v1/chat/completions" 200\x1b[31m\\'
    line = _text({"client": "127.0.0.1:1", "method": "GET", "path": path, "status": 404,
                  "tokens_in": None, "tokens_out": None, "ms": 1.0})
    assert len(line.splitlines()) == 1 and "\x1b" not in line
    assert line == ('127.0.0.1:1 "GET /a\\x0d\\x0aINFO:     127.0.0.1:9 \\x22POST /v1/chat/completions\\x22 '
                    '200\\x1b[31m\\x5c" 404 tokens_in=- tokens_out=- 1.0 ms')
    plain = _text({"client": None, "method": "GET", "path": "/v1/models", "status": 200,
                   "tokens_in": None, "tokens_out": None, "ms": 2.0})
    assert plain == '- "GET /v1/models" 200 tokens_in=- tokens_out=- 2.0 ms'
