"""The image worker on /health and /metrics: a live server with the tiny Gemma 3 of the gemma3_vision fixture
(its own vision tower, encoded for real), whose worker is held on one request's images (Model.encode_images
wrapped to wait) to see it encoding, stalled, queued and full; and a text model's server, which says nothing
of an image worker on /health and zeros on /metrics."""
from __future__ import annotations

import threading
import time

import httpx
import pytest

import llambda

import test_vlm as vlm

from test_images_e2e import URL_A

CHAT = {"model": "vis", "max_tokens": 2, "temperature": 0, "messages": [{"role": "user", "content": [
    {"type": "text", "text": "Look:"}, {"type": "image_url", "image_url": {"url": URL_A}}]}]}
NOT_A_PNG = "data:image/png;base64," + "iVBORw0KGgoAAAANSUhEUgAAAAEAAAAB" + "A" * 40


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from serverkit import LiveServer
    from llambda.server import ServerConfig, create_app
    folder = vlm.folder_with_tokenizer(tmp_path_factory.mktemp("health") / "gemma", vlm.TEMPLATE)
    m = llambda.load(folder, backend="numpy", n_ctx=128, n_slots=1)
    assert m.accepts_images
    # one request's images encode while one waits; a third is refused (queue 1); stalled after 0.3 s
    cfg = ServerConfig(model_id="vis", parallel=1, queue_size=1, prompt_workers=1, image_stall_seconds=0.3)
    with m, LiveServer(create_app(m, cfg)) as srv:
        srv.model = m
        yield srv


def _health(srv) -> httpx.Response:
    return httpx.get(srv.url + "/health", timeout=30)


def _post(srv, body=CHAT) -> httpx.Response:
    return httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=120)


def test_metrics_count_images_and_their_time(served):
    before = served.metrics()
    assert before["llambda_image_queue_depth"] == 0 and before["llambda_image_worker_busy"] == 0
    assert _post(served).status_code == 200
    after = served.metrics()
    assert after["llambda_images_encoded_total"] == before["llambda_images_encoded_total"] + 1
    assert after["llambda_image_encode_seconds_total"] > before["llambda_image_encode_seconds_total"]
    # an image the decoder refuses: a 400, counted as such
    bad = {**CHAT, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": NOT_A_PNG}}]}]}
    r = _post(served, bad)
    assert r.status_code == 400 and "invalid image" in r.json()["error"]["message"], r.text
    m = served.metrics()
    key = 'llambda_image_refusals_total{reason="invalid_image"}'
    assert m[key] == before.get(key, 0) + 1
    assert m["llambda_images_encoded_total"] == after["llambda_images_encoded_total"]
    text = httpx.get(served.url + "/metrics", timeout=30).text
    assert "# TYPE llambda_images_encoded_total counter" in text and "# TYPE llambda_image_queue_depth gauge" in text


def test_health_and_metrics_follow_a_held_worker_and_a_full_queue(served, monkeypatch):
    h = _health(served)
    assert h.status_code == 200 and h.json()["image_worker"] == {"state": "idle", "waiting": 0, "queue_size": 1,
                                                                 "encoding_seconds": 0.0}
    release, entered = threading.Event(), threading.Event()
    real = served.model.encode_images

    def held(images, starts):
        entered.set()
        assert release.wait(60)
        return real(images, starts)

    monkeypatch.setattr(served.model, "encode_images", held)
    codes = []
    posts = [threading.Thread(target=lambda: codes.append(_post(served).status_code)) for _ in range(2)]
    try:
        posts[0].start()
        assert entered.wait(30)
        posts[1].start()
        t0 = time.monotonic()
        while _health(served).json()["image_worker"]["waiting"] < 1:
            assert time.monotonic() - t0 < 30, _health(served).json()
            time.sleep(0.05)
        worker = _health(served).json()["image_worker"]
        assert worker["state"] in ("encoding", "stalled") and worker["waiting"] == 1
        m = served.metrics()
        assert m["llambda_image_queue_depth"] == 1 and m["llambda_image_worker_busy"] == 1
        refused = m.get('llambda_image_refusals_total{reason="queue_full"}', 0)
        r = _post(served)            # the queue is full: 429 at once, counted
        assert r.status_code == 429 and r.headers["retry-after"], r.text
        assert served.metrics()['llambda_image_refusals_total{reason="queue_full"}'] == refused + 1
        time.sleep(0.35)
        h = _health(served)          # stalled on one request's images: text is still served, so 200
        assert h.status_code == 200 and h.json()["status"] == "ok", h.text
        assert h.json()["image_worker"]["state"] == "stalled" and h.json()["image_worker"]["encoding_seconds"] > 0.3
        text = httpx.post(served.url + "/v1/chat/completions", timeout=60, json={
            "model": "vis", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
        assert text.status_code == 200, text.text
    finally:
        release.set()
        for t in posts:
            t.join(120) if t.ident else None
    assert codes == [200, 200]
    m = served.metrics()
    assert m["llambda_image_queue_depth"] == 0 and m["llambda_image_worker_busy"] == 0
    assert _health(served).json()["image_worker"]["state"] == "idle"


def test_a_text_models_server_has_no_image_worker_on_health(tmp_path):
    from serverkit import tiny_chat_server
    with tiny_chat_server(tmp_path, "tiny", (), vlm.TEMPLATE) as srv:
        h = _health(srv)
        assert h.status_code == 200 and "image_worker" not in h.json()
        m = srv.metrics()
        assert m["llambda_images_encoded_total"] == 0 and m["llambda_image_refusals_total"] == 0
        assert m["llambda_image_queue_depth"] == 0
