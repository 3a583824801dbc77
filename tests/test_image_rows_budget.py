"""The server's budget of encoded image rows (`--image-rows-memory`, server/image_rows.py): a request reserves its
images' rows before they are encoded, waits (on the event loop) while they do not fit beside what other requests
hold, and gives them back once its prompts are prefilled, or when it fails or its client leaves.

The first part checks RowsBudget, RowsLease and the image worker's `abandoned` hook alone; the second a live
server on the tiny Qwen3-VL of tests/fixtures/reference/tiny/qwen3_vl_vision (its own tower, rows 3 text widths
wide) whose budget holds one request's rows: concurrent requests, n > 1, a request past the budget, clients gone
while waiting, encoding and streaming, text beside it all. The image worker is held (Model.encode_images wrapped to
wait on an event) where a test needs a request to hold its lease; no assert depends on timing."""
from __future__ import annotations

import asyncio
import base64
import concurrent.futures as cf
import functools
import json
import socket
import threading
import time

import httpx
import pytest

import llambda
from llambda.server.image_rows import RowsBacklogFull, RowsBudget, RowsTooLarge, default_budget
from llambda.server.workers import PromptWorkers

import test_vlm_qwen3vl as q  # noqa: E402  (the fixture and its images)

WIDE, TALL = q.FIX_PNG["image_wide.png"], q.FIX_PNG["image_tall.png"]      # merged grids 3 x 4, 5 x 3


# --- the budget alone ---------------------------------------------------------------------------------------

def run_async(fn):
    """A test written as a coroutine, run on an event loop of its own."""
    @functools.wraps(fn)
    def test():
        asyncio.run(fn())
    return test


@run_async
async def test_reserve_wait_release_in_order():
    """Within the limit at once; past it a wait, first come first served (a smaller request does not pass a
    larger one ahead of it); a lease goes back once however often it is released; a request past the whole
    budget and one past the backlog are refused at once."""
    waited = []
    b = RowsBudget(10, backlog=2, on_wait=lambda: waited.append(1))
    a = await b.reserve(6)
    assert b.stats() == {"held": 6, "limit": 10, "waiting": 0}
    second = asyncio.ensure_future(b.reserve(6))
    third = asyncio.ensure_future(b.reserve(3))      # would fit beside `a`, but `second` came first
    await asyncio.sleep(0)
    assert b.stats()["waiting"] == 2 and not second.done() and not third.done() and len(waited) == 2
    with pytest.raises(RowsBacklogFull):
        await b.reserve(1)
    with pytest.raises(RowsTooLarge, match="--image-rows-memory"):
        await b.reserve(11)
    a.release()
    s = await second
    t = await third                                   # 6 + 3 fit together
    assert b.stats() == {"held": 9, "limit": 10, "waiting": 0}
    a.release()                                       # again: nothing more goes back
    assert b.stats()["held"] == 9
    s.release(), t.release()
    assert b.stats()["held"] == 0


@run_async
async def test_a_wait_cancelled_holds_nothing_even_when_granted_as_it_left():
    b = RowsBudget(10, backlog=4)
    a = await b.reserve(8)
    left = asyncio.ensure_future(b.reserve(5))
    await asyncio.sleep(0)
    left.cancel()                                     # gone while it waited
    with pytest.raises(asyncio.CancelledError):
        await left
    assert b.stats() == {"held": 8, "limit": 10, "waiting": 0}
    granted = asyncio.ensure_future(b.reserve(5))
    behind = asyncio.ensure_future(b.reserve(4))
    await asyncio.sleep(0)
    a.release()                                       # grants `granted` and `behind` (their wake-ups queued) ...
    granted.cancel()                                  # ... but its client leaves before it runs
    with pytest.raises(asyncio.CancelledError):
        await granted
    lease = await behind
    assert b.stats() == {"held": 4, "limit": 10, "waiting": 0}
    lease.release()
    assert b.stats()["held"] == 0


@run_async
async def test_a_lease_shared_by_its_sequences_goes_back_with_the_last():
    b = RowsBudget(10, backlog=1)
    lease = await b.reserve(7)
    lease.share(3)
    lease.let_go(), lease.let_go()
    assert b.stats()["held"] == 7
    lease.let_go()
    assert b.stats()["held"] == 0
    lease.release(), lease.let_go()                   # once only
    assert b.stats()["held"] == 0


def test_the_default_budget():
    assert default_budget(4096, 4096 * 4) == 4 * 4096 * 4096 * 4 * 4          # Qwen3-VL-8B: 1 GiB
    assert default_budget(4096, 2560) == 2**30                              # Gemma 3 4B: 160 MiB -> 1 GiB
    assert default_budget(32768, 4096 * 4) == 8 * 2**30


def test_the_image_worker_says_when_its_caller_left():
    """abandoned(result) once: at once for a job not begun, after the job for one running."""
    pool = PromptWorkers(1, backlog=4, name="test")
    go, entered = threading.Event(), threading.Event()
    calls = []

    def slow():
        entered.set()
        assert go.wait(30)
        return "rows"

    async def main():
        running = asyncio.ensure_future(pool.run(slow, abandoned=lambda r: calls.append(("running", r))))
        assert await asyncio.to_thread(entered.wait, 30)
        queued = asyncio.ensure_future(pool.run(lambda: "never", abandoned=lambda r: calls.append(("queued", r))))
        await asyncio.sleep(0)
        queued.cancel(), running.cancel()
        for t in (queued, running):
            with pytest.raises(asyncio.CancelledError):
                await t
        assert calls == [("queued", None)]
        go.set()
        for _ in range(3000):
            if len(calls) == 2:
                break
            await asyncio.sleep(0.01)
        assert calls == [("queued", None), ("running", "rows")]
    try:
        asyncio.run(main())
    finally:
        pool.close()


# --- a live server ----------------------------------------------------------------------------------------------

def _load(**kw):
    return llambda.load(q.FOLDER, backend="native", activations="f32", **{"n_ctx": 128, **kw})


def _canonical(*parts) -> list:
    return [{"role": "user", "content": [{"type": "image", "image": p} if isinstance(p, bytes)
                                         else {"type": "text", "text": p} for p in parts]}]


def _wire(*parts) -> list:
    return [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(p).decode()}}
        if isinstance(p, bytes) else {"type": "text", "text": p} for p in parts]}]


def _rows_bytes(m, *images) -> int:
    ids, starts = m.image_ids(m.render_chat(_canonical(*images, "hi")), list(images))
    return m.image_rows_bytes(ids, starts)


def test_a_sequence_lets_go_of_its_rows_once_prefilled():
    """The scheduler calls a job's images_done once, in the step that prefills the prompt's last chunk (before
    its first token), and the sequence keeps its blocks' keys only; the answer is the library's."""
    from llambda.engine import GenerationParams, Sequence
    from llambda.sampling import SamplingParams
    from llambda.server.metrics import Metrics
    from llambda.server.scheduler import Channel, Job, Scheduler
    with _load(n_slots=1) as m:
        ids, blocks = m.image_prompt(m.render_chat(_canonical(WIDE, "hi")), [WIDE])
        want = m.complete(ids, images=blocks, max_tokens=5, temperature=0, ignore_eos=True)
        sched = Scheduler(m.transformer, Metrics(), prefill_chunk=8)      # the prompt in several chunks
        sched.start()

        async def main():
            seq = Sequence(m.tokenizer, ids, GenerationParams(max_tokens=5, sampling=SamplingParams(temperature=0),
                                                              ignore_eos=True), slot=-1, n_ctx=m.n_ctx, images=blocks)
            job = Job(seq, Channel(), 0)
            seen = []
            job.images_done = lambda: seen.append((job.state, job.n_computed, len(seq.generated)))
            sched.submit([job])
            tokens = []
            while not job.finished or not tokens or tokens[-1].finish_reason is None:
                for _, ev in await asyncio.wait_for(job.channel.get(), 120):
                    assert not hasattr(ev, "status"), ev
                    if not tokens:      # the first token: the rows were let go before it
                        assert seen == [("prefill", len(ids), 0)], seen
                    tokens.append(ev)
            assert seen == [("prefill", len(ids), 0)]
            assert seq.images and all(not hasattr(b, "rows") for b in seq.images)
            return "".join(ev.text for ev in tokens)
        try:
            got = asyncio.run(main())
        finally:
            sched.stop()
        assert got == want


@pytest.fixture(scope="module")
def served():
    from serverkit import LiveServer
    from llambda.server import ServerConfig, create_app
    with _load(n_slots=2) as m, _load() as ref:
        width = m.transformer.image_width
        assert width == q.REF["config"]["text_config"]["hidden_size"] * 3        # two DeepStack levels
        assert _rows_bytes(m, WIDE) == 12 * width * 4 and _rows_bytes(m, TALL) == 15 * width * 4
        assert _rows_bytes(m, WIDE, TALL) == 27 * width * 4
        budget = _rows_bytes(m, TALL)         # one request's rows: any two together pass it
        cfg = ServerConfig(model_id="vis", parallel=2, image_rows_memory=budget)
        with LiveServer(create_app(m, cfg)) as srv:
            srv.model, srv.ref, srv.budget = m, ref, budget
            yield srv


def _body(*parts, **kw) -> dict:
    return {"model": "vis", "messages": _wire(*parts), "max_tokens": 6, "temperature": 0, "ignore_eos": True, **kw}


def _post(srv, body) -> httpx.Response:
    return httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=300)


def _want(srv, *parts, n=6) -> str:
    return srv.ref.chat(_canonical(*parts), max_tokens=n, temperature=0, ignore_eos=True)


def _until(srv, check, what: str, timeout: float = 120.0) -> dict:
    t0 = time.monotonic()
    while True:
        m = srv.metrics()
        if check(m):
            return m
        assert time.monotonic() - t0 < timeout, f"{what}: {m}"
        time.sleep(0.02)


def _idle(srv) -> dict:
    return _until(srv, lambda m: m["llambda_image_rows_bytes"] == 0 and m["llambda_image_rows_waiting"] == 0
                  and m["llambda_sequences_active"] == 0 and m["llambda_requests_in_flight"] == 1, "not idle")


class HeldWorker:
    """Model.encode_images waits for `go` (set on leaving): a request holds its lease in the image worker."""

    def __init__(self, srv, monkeypatch):
        self.go, self.entered = threading.Event(), threading.Event()
        real = srv.model.encode_images

        def held(images, starts):
            self.entered.set()
            assert self.go.wait(300)
            return real(images, starts)
        monkeypatch.setattr(srv.model, "encode_images", held)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.go.set()


class Sampler:
    """The held bytes, read from /metrics until stopped: their largest."""

    def __init__(self, srv):
        self.srv, self.most, self.stop = srv, 0.0, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self.stop.is_set():
            self.most = max(self.most, self.srv.metrics()["llambda_image_rows_bytes"])
            time.sleep(0.01)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(60)


def _raw_request(srv, body: dict, stream: bool = False) -> socket.socket:
    """A request sent on a socket of its own, which the test closes to hang up."""
    data = json.dumps({**body, "stream": stream}).encode()
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=300)
    s.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{srv.port}\r\nContent-Type: application/json\r\n".encode()
              + f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return s


def test_concurrent_requests_within_the_budget(served, monkeypatch):
    """Eight requests at once (one image each, n = 1 and 2) with room for one request's rows: every answer is
    Model.chat's; the held bytes never pass the budget, some requests wait, and all goes back to 0; every
    sequence's rows are dropped once it is done with them."""
    from llambda.server.scheduler import Scheduler
    wants = {WIDE: _want(served, WIDE, "what?"), TALL: _want(served, TALL, "what?")}
    jobs = []
    real_submit = Scheduler.submit
    monkeypatch.setattr(Scheduler, "submit", lambda self, js: (jobs.extend(js), real_submit(self, js))[1])
    before = served.metrics()
    cases = [(WIDE, 1), (TALL, 2), (TALL, 1), (WIDE, 2)] * 2
    with Sampler(served) as sampler, HeldWorker(served, monkeypatch) as held:
        with cf.ThreadPoolExecutor(len(cases)) as ex:
            first = ex.submit(_post, served, _body(cases[0][0], "what?", n=cases[0][1]))
            assert held.entered.wait(120)       # the first holds its lease in the worker: the others cannot fit
            rest = [ex.submit(_post, served, _body(img, "what?", n=n)) for img, n in cases[1:]]
            m = _until(served, lambda m: m["llambda_image_rows_waiting"] >= 1, "no request waited")
            assert m["llambda_image_rows_bytes"] == served.budget * 12 // 15        # the first's (WIDE) alone
            held.go.set()
            answers = [f.result() for f in [first] + rest]
    for (img, n), r in zip(cases, answers):
        assert r.status_code == 200, r.text
        assert [c["message"]["content"] for c in r.json()["choices"]] == [wants[img]] * n
    after = _idle(served)
    assert 0 < sampler.most <= served.budget
    assert after["llambda_image_rows_budget_bytes"] == served.budget
    assert after["llambda_image_rows_waits_total"] >= before["llambda_image_rows_waits_total"] + 1
    assert len(jobs) == sum(n for _, n in cases)
    assert all(j.images_done is None and all(not hasattr(b, "rows") for b in j.seq.images) for j in jobs)


def test_a_request_past_the_budget_is_a_400(served):
    before = served.metrics()
    r = _post(served, _body(WIDE, TALL, "both?"))
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert "--image-rows-memory" in err["message"] and err["code"] == "image_rows_memory", err
    m = _idle(served)
    key = 'llambda_image_refusals_total{reason="rows_memory"}'
    assert m[key] == before.get(key, 0) + 1


def test_clients_gone_while_waiting_and_while_encoding(served, monkeypatch):
    """One request in the (held) worker, one waiting for room: both hang up. The waiting one leaves at once,
    holding nothing; the encoding one's bytes stay held while the worker still makes its rows, and go back once
    it is done; nothing is answered to either."""
    per = _rows_bytes(served.model, WIDE)
    with HeldWorker(served, monkeypatch) as held:
        encoding = _raw_request(served, _body(WIDE, "one"))
        assert held.entered.wait(120)
        waiting = _raw_request(served, _body(WIDE, "two"))
        _until(served, lambda m: m["llambda_image_rows_waiting"] == 1, "the second request did not wait")
        waiting.close()
        m = _until(served, lambda m: m["llambda_image_rows_waiting"] == 0, "the wait was not left")
        assert m["llambda_image_rows_bytes"] == per
        encoding.close()
        m = _until(served, lambda m: m["llambda_requests_in_flight"] == 1, "the requests did not end")
        assert m["llambda_image_rows_bytes"] == per       # the worker still encodes its images
        held.go.set()
        _idle(served)


def test_a_stream_abandoned_and_n_choices(served):
    """A stream whose client hangs up after its first chunk, and a request of n = 3 beside it: the held bytes go
    back to 0; the choices are Model.chat's answer."""
    s = _raw_request(served, _body(TALL, "tell me", max_tokens=80), stream=True)
    try:
        got = b""
        while b"data:" not in got:                  # the headers, then the first chunk
            more = s.recv(4096)
            assert more, got
            got += more
        r = _post(served, _body(WIDE, "what?", n=3))
    finally:
        s.close()
    assert r.status_code == 200, r.text
    assert [c["message"]["content"] for c in r.json()["choices"]] == [_want(served, WIDE, "what?")] * 3
    _idle(served)


def test_text_requests_are_not_held_by_the_image_budget(served, monkeypatch):
    with HeldWorker(served, monkeypatch) as held, cf.ThreadPoolExecutor(2) as ex:
        images = [ex.submit(_post, served, _body(WIDE, "one"))]
        assert held.entered.wait(120)
        images.append(ex.submit(_post, served, _body(TALL, "two")))
        _until(served, lambda m: m["llambda_image_rows_waiting"] == 1, "the second request did not wait")
        text = _post(served, {"model": "vis", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]})
        assert text.status_code == 200, text.text
        assert served.metrics()["llambda_image_rows_waiting"] == 1
        held.go.set()
        assert [f.result().status_code for f in images] == [200, 200]
    _idle(served)


def test_the_budget_setting_is_checked():
    from llambda.errors import InvalidInputError
    from llambda.server import ServerConfig
    for bad in (0, -1, True, 1.5, "1"):
        with pytest.raises(InvalidInputError, match="image_rows_memory"):
            ServerConfig(image_rows_memory=bad)
    assert ServerConfig(image_rows_memory=1).image_rows_memory == 1


def test_waiting_requests_are_bounded_by_the_image_queue(monkeypatch):
    """A server whose image queue holds one request: one request in the (held) worker, one waiting for room, a
    third is a 429 at once (counted as the image queue's), and the two others are answered."""
    from serverkit import LiveServer
    from llambda.server import ServerConfig, create_app
    with _load(n_slots=2) as m:
        cfg = ServerConfig(model_id="vis", parallel=1, queue_size=1, prompt_workers=1,
                           image_rows_memory=_rows_bytes(m, TALL))
        with LiveServer(create_app(m, cfg)) as srv:
            srv.model = m
            with HeldWorker(srv, monkeypatch) as held, cf.ThreadPoolExecutor(2) as ex:
                first = ex.submit(_post, srv, _body(WIDE, "one"))
                assert held.entered.wait(120)
                second = ex.submit(_post, srv, _body(WIDE, "two"))
                before = _until(srv, lambda m: m["llambda_image_rows_waiting"] == 1, "the second did not wait")
                r = _post(srv, _body(TALL, "three"))
                assert r.status_code == 429 and r.headers["retry-after"], r.text
                key = 'llambda_image_refusals_total{reason="queue_full"}'
                assert srv.metrics()[key] == before.get(key, 0) + 1
                held.go.set()
                assert [first.result().status_code, second.result().status_code] == [200, 200]
            _idle(srv)
