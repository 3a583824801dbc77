"""Hostile and careless clients (issue 12, item 5): absurd numbers and shapes get a 4xx naming the field;
slow clients are cut off; the connection cap answers at once; running out of file descriptors neither
floods the log nor spins; /health says 503 when completions cannot be served.

Every server listens on 127.0.0.1; every loop below is bounded in count and time.
"""
from __future__ import annotations

import collections
import json
import logging
import os
import resource
import socket
import threading
import time

import httpx
import pytest

from llambda.server import ServerConfig, create_app
from serverkit import MODEL_ID, LiveServer, ServerProcess, assert_error, post

MSGS = [{"role": "user", "content": "hi"}]
DIGITS = "9" * 5000


def _raw(live, path, text: str):
    return post(live, path, content=text.encode(), headers={"content-type": "application/json"})


def _chat_with(field: str, value_json: str) -> str:
    return f'{{"model": "{MODEL_ID}", "messages": {json.dumps(MSGS)}, "max_tokens": 2, "{field}": {value_json}}}'


# -- absurd numbers and shapes ---------------------------------------------------------------

@pytest.fixture(scope="module")
def live(model):
    """An in-thread server whose body limit (8 MiB) lets the huge arrays reach the parser."""
    cfg = ServerConfig(model_id=MODEL_ID, parallel=2, queue_size=4, max_body_bytes=8 * 2**20)
    with LiveServer(create_app(model, cfg)) as srv:
        yield srv


def test_absurd_numbers_get_400_naming_the_field(live):
    url = "/v1/chat/completions"
    cases = [
        ("max_tokens", DIGITS), ("seed", DIGITS), ("n", DIGITS), ("temperature", DIGITS),
        ("temperature", "1e400"), ("top_p", "-1e400"), ("temperature", "NaN"), ("min_p", "Infinity"),
        ("presence_penalty", "-Infinity"), ("top_k", "1e300"), ("max_tokens", "1e300"), ("n", "1e30"),
        ("repeat_last_n", str(2**70)), ("temperature", "0." + "1" * 5000),
        ("user", DIGITS),                       # a field we ignore is still checked
        ("logit_bias", f'{{"1": {DIGITS}}}'), ("logit_bias", '{"1": 1e400}'), ("logit_bias", '{"1": NaN}'),
    ]
    for field, value in cases:
        r = _raw(live, url, _chat_with(field, value))
        err = assert_error(r, 400)
        assert field in err["message"] and field in (err["param"] or ""), (field, value[:20], err)
        assert len(err["message"]) < 400, err["message"]          # the number is not echoed whole
    err = assert_error(_raw(live, url, _chat_with("logit_bias", f'{{"{DIGITS}": 1}}')), 400, "logit_bias")
    assert err["param"] == "logit_bias"
    # nested: the path says where
    tools = '[{"type": "function", "function": {"name": "f", "parameters": {"maximum": 1e999}}}]'
    err = assert_error(_raw(live, url, _chat_with("tools", tools)), 400)
    assert err["param"] == "tools[0].function.parameters.maximum", err
    r = _raw(live, "/v1/completions", f'{{"model": "{MODEL_ID}", "prompt": [1, 2, {DIGITS}]}}')
    assert assert_error(r, 400)["param"] == "prompt[2]"
    assert_error(post(live, "/v1/completions", {"model": MODEL_ID, "prompt": [1, 2**40]}), 400, "prompt")
    assert_error(post(live, "/v1/completions", {"model": MODEL_ID, "prompt": [[1], [-5]]}), 400, "prompt[1]")
    assert_error(_raw(live, url, DIGITS), 400)
    assert_error(_raw(live, url, "NaN"), 400)
    assert httpx.get(live.url + "/health").status_code == 200
    assert not [k for k in live.metrics() if 'status="5' in k], "a client's mistake must never be a 5xx"


def test_deep_nesting_and_huge_arrays_get_400(live):
    url = "/v1/chat/completions"
    deep = "[" * 100_000 + "]" * 100_000                           # past Python's recursion limit
    assert_error(_raw(live, url, _chat_with("messages", deep)), 400, "nested")
    nested = "[" * 200 + "]" * 200                                  # under it, over ours
    err = assert_error(_raw(live, url, _chat_with("metadata", nested)), 400, "nested")
    assert err["param"].startswith("metadata[0][0]")
    bodies = [
        ({"messages": MSGS, "stop": ["x"] * 100_000}, "stop"),
        ({"messages": MSGS, "logit_bias": {str(i): 1 for i in range(5000)}}, "logit_bias"),
        ({"messages": [{"role": "user", "content": ""}] * 20_000}, "messages"),
        ({"messages": MSGS, "tools": [{"type": "function", "function": {"name": f"f{i}"}} for i in range(1000)]},
         "tools"),
    ]
    for body, field in bodies:
        err = assert_error(post(live, url, {"model": MODEL_ID, "max_tokens": 2, **body}), 400, field)
        assert err["param"] == field
    # a batch of 20k prompts is refused for its size before any of it is tokenized
    t0 = time.monotonic()
    r = post(live, "/v1/completions", {"model": MODEL_ID, "prompt": ["hello there"] * 20_000})
    assert_error(r, 400, "sequences")
    assert time.monotonic() - t0 < 5
    assert not [k for k in live.metrics() if 'status="5' in k]


def test_bodies_are_parsed_off_the_event_loop(live, monkeypatch):
    """Parsing and checking a 4 MB body of a million empty arrays took 1-2 s; on the event loop
    that stalled every running stream. It runs in a thread of its own pool (no running loop there;
    not the default pool, whose threads /health probes)."""
    import asyncio

    from llambda.server import app as app_module
    on_loop = []

    def parse(raw):
        try:
            asyncio.get_running_loop()
            on_loop.append(True)
        except RuntimeError:
            on_loop.append(not threading.current_thread().name.startswith("llambda-json"))
        return real(raw)

    real = app_module.parse_json
    monkeypatch.setattr(app_module, "parse_json", parse)
    body = {"model": MODEL_ID, "messages": MSGS, "max_tokens": 1, "metadata": [[]] * 100_000}
    assert post(live, "/v1/chat/completions", body).status_code == 200
    assert_error(_raw(live, "/v1/completions", "{not json"), 400, "json")
    assert on_loop == [False, False]


def test_rate_limit_filter_units():
    from llambda.server.guard import RateLimitFilter
    f = RateLimitFilter(interval=60.0, max_kinds=4)

    def rec(msg, exc=None, level=logging.ERROR):
        r = logging.LogRecord("llambda.server", level, __file__, 1, msg, (), (type(exc), exc, None) if exc else None)
        return f.filter(r), r

    assert rec("accept failed %s", OSError(24, "Too many open files"))[0]
    assert not any(rec("accept failed %s", OSError(24, "Too many open files"))[0] for _ in range(1000))
    assert rec("accept failed %s", OSError(12, "Cannot allocate memory"))[0]       # another kind
    assert rec("step failed")[0] and rec("x", level=logging.INFO)[0] and rec("x", level=logging.INFO)[0]
    f._kinds[next(k for k in f._kinds if k[3] == 24)][0] -= 61                        # a minute later
    ok, r = rec("accept failed %s", OSError(24, "Too many open files"))
    assert ok and "1000 more like this" in r.getMessage()
    for i in range(20):
        rec(f"kind {i}")
    assert len(f._kinds) <= 4


# -- slow clients and the connection cap (a real `llambda serve`) ------------------------------------

def _read_until_closed(s: socket.socket, deadline: float) -> bytes | None:
    """What the server sent before closing the connection, or None if it is still open at `deadline`."""
    data = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        s.settimeout(left)
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            return None
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5)


def _health(live):
    try:
        r = httpx.get(live.url + "/health", timeout=10)
    except httpx.TransportError as e:
        return None, repr(e)
    return r.status_code, r.json() if r.headers.get("content-type") == "application/json" else r.text


def _wait_health(live, status: int, timeout: float):
    t0 = time.monotonic()
    while True:
        code, body = _health(live)
        if code == status:
            return body
        assert time.monotonic() - t0 < timeout, (code, body)
        time.sleep(0.1)


def test_slow_clients_are_cut_off(smollm2_gguf, tmp_path):
    with ServerProcess(smollm2_gguf, tmp_path / "slow.log", "--parallel", "2", "--header-timeout", "2",
                       "--body-timeout", "2", "--max-connections", "100") as srv:
        t0 = time.monotonic()
        silent = [_connect(srv.port) for _ in range(20)]
        partial_head = [_connect(srv.port) for _ in range(20)]
        for s in partial_head:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: appli")
        partial_body = [_connect(srv.port) for _ in range(10)]
        for s in partial_body:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 100\r\n\r\n{\"prompt\": ")
        # meanwhile, a normal client is served
        r = httpx.post(srv.url + "/v1/completions", json={"model": srv.model_id, "prompt": "Hi", "max_tokens": 2},
                       timeout=30)
        assert r.status_code == 200, r.text
        # a byte every 0.25 s: activity alone does not extend the deadline
        dribbler = _connect(srv.port)
        t_drib = time.monotonic()
        head = b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Pad: " + b"a" * 200
        for i in range(len(head)):
            try:
                dribbler.sendall(head[i:i + 1])
            except OSError:
                break
            if time.monotonic() - t_drib > 6:
                break
            time.sleep(0.25)
        assert time.monotonic() - t_drib < 6, "the dribbling client was not cut off"
        deadline = time.monotonic() + 6
        for s in silent:
            assert _read_until_closed(s, deadline) is not None, "a silent connection was held past its deadline"
        for s in partial_head:
            got = _read_until_closed(s, deadline)
            assert got is not None and got.startswith(b"HTTP/1.1 408"), got
        for s in partial_body:
            got = _read_until_closed(s, deadline)
            assert got is not None and got.startswith(b"HTTP/1.1 408") and b"request_timeout" in got, got
        assert time.monotonic() - t0 < 15
        for s in silent + partial_head + partial_body + [dribbler]:
            s.close()
        m = srv.metrics()
        assert m['llambda_connections_dropped_total{reason="timeout"}'] >= 41
        assert httpx.get(srv.url + "/health", timeout=5).status_code == 200
        # once per kind in the log, not once per connection
        assert srv.log().count("no complete request head") <= 2, srv.log()


def test_connection_cap_answers_at_once_and_spares_running_streams(smollm2_gguf, tmp_path):
    with ServerProcess(smollm2_gguf, tmp_path / "cap.log", "--parallel", "2", "--max-connections", "8",
                       "--header-timeout", "30") as srv:
        body = {"model": srv.model_id, "prompt": "Once upon a time", "max_tokens": 40, "ignore_eos": True,
                "stream": True}
        with httpx.Client(timeout=30) as h, h.stream("POST", srv.url + "/v1/completions", json=body) as stream:
            assert stream.status_code == 200
            lines = stream.iter_lines()
            next(lines)
            idle = [_connect(srv.port) for _ in range(7)]       # with the stream: the cap of 8
            time.sleep(0.3)
            refused = []
            for _ in range(5):
                t0 = time.monotonic()
                s = _connect(srv.port)         # refused before it says anything: no request needed
                got = _read_until_closed(s, t0 + 3)
                assert got is not None and time.monotonic() - t0 < 2, "over the cap, a connection must end at once"
                assert got == b"" or got.startswith(b"HTTP/1.1 503"), got
                refused.append(got)
                s.close()
            assert any(b"too_many_connections" in g for g in refused), refused
            chunks = [ln for ln in lines if ln.startswith("data: ")]
            # the stream ran to its end: all 40 tokens (a chunk may carry several, or none while a
            # character is incomplete), then the closing chunk
            assert chunks[-1] == "data: [DONE]" and '"finish_reason":"length"' in chunks[-2], chunks[-3:]
            for s in idle:
                s.close()
        _wait_health(srv, 200, 10)          # connections are taken again
        assert srv.metrics()['llambda_connections_dropped_total{reason="cap"}'] >= 5


def test_over_the_cap_clients_that_send_their_request_at_once_read_the_503(smollm2_gguf, tmp_path):
    """Real clients send their request as soon as they connect, and many connect at once. Closing
    on a request the server had not read made the kernel reset the connection, and the client lost
    the 503 it had been sent (httpx: ReadError, for most of a burst)."""
    import asyncio

    async def burst(url, body, n):
        limits = httpx.Limits(max_connections=n, max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=20, limits=limits) as h:
            async def one():
                try:
                    r = await h.post(url + "/v1/completions", json=body)
                    return r.status_code, r.json().get("error", {}).get("code")
                except httpx.TransportError as e:
                    return repr(e)
            return await asyncio.gather(*(one() for _ in range(n)))

    with ServerProcess(smollm2_gguf, tmp_path / "cap.log", "--parallel", "1", "--max-connections", "1") as srv:
        # a running generation keeps the server busy: refused connections' requests arrive before it closes them
        running = {"model": srv.model_id, "prompt": "Once upon a time", "max_tokens": 3000, "ignore_eos": True,
                   "stream": True}
        with httpx.Client(timeout=60) as h, h.stream("POST", srv.url + "/v1/completions", json=running) as stream:
            assert stream.status_code == 200
            lines = stream.iter_lines()         # kept: a dropped iterator closes the response
            next(lines)                         # the stream holds the one connection allowed
            body = {"model": srv.model_id, "prompt": "hi", "max_tokens": 1}
            answers = asyncio.run(burst(srv.url, body, 100))
        assert answers == [(503, "too_many_connections")] * 100, collections.Counter(answers)
        _wait_health(srv, 200, 10)
        assert srv.metrics()['llambda_connections_dropped_total{reason="cap"}'] >= 100


def test_refused_connections_linger_only_in_the_descriptors_above_the_cap(smollm2_gguf, tmp_path):
    """A refused connection lingers for its client's request: 64 descriptors, a cap of 24 and 100
    refused clients that never close would have run the server out of descriptors. As many linger as
    the descriptors above the cap leave; the rest are closed at once, and none is shed for lack of one."""
    with ServerProcess(smollm2_gguf, tmp_path / "linger.log", "--parallel", "1", "--max-connections", "24",
                       "--header-timeout", "60", preexec_fn=_low_fd_limit) as srv:
        held = [_connect(srv.port) for _ in range(24)]
        time.sleep(0.5)
        refused = []
        for _ in range(100):
            s = _connect(srv.port)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            refused.append(s)
        time.sleep(1.0)
        for s in held + refused:
            s.close()
        _wait_health(srv, 200, 15)
        m = srv.metrics()
        assert m.get('llambda_connections_dropped_total{reason="fds"}', 0) == 0, m
        assert m['llambda_connections_dropped_total{reason="cap"}'] >= 100


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _low_fd_limit():
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))


def test_out_of_file_descriptors(smollm2_gguf, tmp_path):
    """With 64 descriptors and a cap set above them, 150 idle connections exhaust the server: it must
    shed (503 or close) new connections without spinning or flooding its log, and serve /health again
    once the connections are gone."""
    with ServerProcess(smollm2_gguf, tmp_path / "fds.log", "--parallel", "2", "--max-connections", "1000",
                       "--header-timeout", "60", preexec_fn=_low_fd_limit) as srv:
        pid = srv.proc.pid
        held = []
        for _ in range(150):
            held.append(_connect(srv.port))
        time.sleep(1.0)
        assert len(os.listdir(f"/proc/{pid}/fd")) >= 60, "the server did not run out of descriptors"
        size0 = os.path.getsize(srv.log_path)
        cpu0 = _cpu_seconds(pid)
        answers = []
        for _ in range(5):
            t0 = time.monotonic()
            try:
                r = httpx.get(srv.url + "/health", timeout=2)
                answers.append(r.status_code)
                if r.status_code == 503:
                    assert "file descriptors" in r.text
            except httpx.TransportError:
                answers.append("closed")
            time.sleep(max(0.0, 0.6 - (time.monotonic() - t0)))
        cpu = _cpu_seconds(pid) - cpu0
        grown = os.path.getsize(srv.log_path) - size0
        assert 503 in answers or "closed" in answers, answers
        assert grown < 20_000, f"the log grew by {grown} bytes in 3 s: " + srv.log()[-2000:]
        assert cpu < 1.0, f"{cpu:.2f} s of CPU in 3 s while out of descriptors: a spinning accept loop?"
        for s in held:
            s.close()
        _wait_health(srv, 200, 10)          # and /health answers again once they are gone
        r = httpx.post(srv.url + "/v1/completions", json={"model": srv.model_id, "prompt": "Hi", "max_tokens": 2},
                       timeout=30)
        assert r.status_code == 200, r.text


# -- /health tells the truth -------------------------------------------------------------------

def _cfg(**kw) -> ServerConfig:
    return ServerConfig(model_id=MODEL_ID, parallel=2, queue_size=4, **kw)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_health_503_when_the_scheduler_thread_dies(spare_model):
    class Killed(BaseException):      # not an Exception: the scheduler's own guard does not catch it
        pass

    app = create_app(spare_model, _cfg())
    sched = app.state.scheduler
    with LiveServer(app) as live:
        code, body = _health(live)
        assert code == 200 and body["status"] == "ok" and {"slots_idle", "slots_processing", "queue"} <= set(body)

        def die():
            raise Killed()
        sched._iterate = die
        try:       # the request wakes the scheduler, which dies; nobody answers it
            httpx.post(live.url + "/v1/completions", json={"model": MODEL_ID, "prompt": "Hi", "max_tokens": 5,
                                                           "ignore_eos": True}, timeout=1)
        except httpx.TimeoutException:
            pass
        body = _wait_health(live, 503, 5)
        assert body["status"] == "unavailable" and "scheduler" in body["reason"], body
        assert body["queue"] + body["slots_processing"] >= 1


def test_health_503_when_the_scheduler_is_stuck(spare_model):
    app = create_app(spare_model, _cfg(stall_timeout=1.0))
    transformer = spare_model.transformer
    release = threading.Event()
    real_forward = transformer.forward

    def stuck_forward(*a, **kw):
        release.wait(20)
        return real_forward(*a, **kw)

    with LiveServer(app) as live:
        assert _health(live)[0] == 200
        transformer.forward = stuck_forward
        try:
            done = []
            t = threading.Thread(target=lambda: done.append(httpx.post(
                live.url + "/v1/completions", json={"model": MODEL_ID, "prompt": "Hi", "max_tokens": 2},
                timeout=30)))
            t.start()
            time.sleep(0.3)
            assert _health(live)[0] == 200                     # a slow step is not yet a stuck one
            body = _wait_health(live, 503, 5)
            assert "no progress" in body["reason"] and body["slots_processing"] == 1, body
        finally:
            release.set()
            del transformer.forward
        t.join(30)
        assert done and done[0].status_code == 200
        _wait_health(live, 200, 5)


def test_health_503_when_the_prompt_workers_are_stuck(spare_model):
    app = create_app(spare_model, _cfg(prompt_stall_seconds=1.0))
    service = app.state.service
    release = threading.Event()
    real_prepare = service.prepare

    def slow_prepare(spec):       # a render that takes forever (issue 12 item 2's templates)
        release.wait(20)
        return real_prepare(spec)

    with LiveServer(app) as live:
        assert _health(live)[0] == 200
        service.prepare = slow_prepare
        threads = []
        try:
            for _ in range(service.workers.n_workers):
                t = threading.Thread(target=lambda: httpx.post(
                    live.url + "/v1/completions", json={"model": MODEL_ID, "prompt": "Hi", "max_tokens": 2},
                    timeout=30))
                t.start()
                threads.append(t)
            body = _wait_health(live, 503, 10)
            assert "prompt worker" in body["reason"] and body["status"] == "stalled", body
        finally:
            release.set()
        for t in threads:
            t.join(30)
        _wait_health(live, 200, 10)
