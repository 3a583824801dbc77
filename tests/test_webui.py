"""The chat page at / (llambda/server/webui/): its routes and headers, and the page itself in a real
headless Chromium (Playwright driving Debian's /usr/bin/chromium; .ci/run installs it). Without
Playwright or Chromium the browser tests skip and say why; the route tests always run.

Set LLAMBDA_SCREENSHOTS=DIR to keep a screenshot of each browser test's page.
"""
from __future__ import annotations

import os
import re
import shutil
import time
from fnmatch import fnmatch
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from llambda.server import web
from serverkit import MODEL_ID, LiveServer, ServerProcess

ROOT = Path(__file__).resolve().parents[1]
BUNDLE = Path(web.__file__).parent / "webui"
CHROMIUM = os.environ.get("LLAMBDA_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"


# --- the routes, no browser, no model ------------------------------------------------------------

def test_page_and_assets_served_with_a_strict_csp():
    client = TestClient(Starlette(routes=web.routes()))
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert "unsafe" not in csp and "*" not in csp
    assert page.headers["x-content-type-options"] == "nosniff"
    for path, kind in [("/webui/app.js", "text/javascript"), ("/webui/style.css", "text/css"),
                       ("/webui/favicon.svg", "image/svg+xml")]:
        r = client.get(path)
        assert r.status_code == 200 and r.headers["content-type"].startswith(kind), path
        assert r.content == (BUNDLE / path.rsplit("/", 1)[1]).read_bytes()
    assert client.get("/webui/../config.py").status_code == 404
    assert client.get("/webui/index.html").status_code == 404


def test_bundle_is_self_contained():
    """Nothing from another origin, and nothing the CSP would block (inline script or style)."""
    for f in BUNDLE.iterdir():
        text = f.read_text(encoding="utf-8").replace('xmlns="http://www.w3.org/2000/svg"', "")   # a name, not a fetch
        assert "http://" not in text and "https://" not in text, f"{f.name} names another origin"
    html = (BUNDLE / "index.html").read_text(encoding="utf-8")
    assert not re.search(r"<script(?![^>]*\bsrc=)", html), "inline <script>"
    assert " style=" not in html and "<style" not in html and not re.search(r"\son\w+=", html)


def test_package_data_ships_the_bundle():
    """pyproject's package-data for llambda.server matches every file of webui/ (so wheels carry them)."""
    tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11+")
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    patterns = data["llambda.server"]
    files = sorted(p.relative_to(BUNDLE.parent).as_posix() for p in BUNDLE.iterdir())
    assert {"webui/index.html", "webui/app.js", "webui/style.css"} <= set(files)
    assert all(any(fnmatch(f, pat) for pat in patterns) for f in files), (files, patterns)


# --- the browser ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed (pip install -e '.[test]')")
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium, or set LLAMBDA_CHROMIUM)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM)
        yield b
        b.close()


@pytest.fixture
def page(browser, request):
    context = browser.new_context(viewport={"width": 1100, "height": 760})
    pg = context.new_page()
    errors = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    # the CSP reports what it blocks on the console; nothing should be blocked
    pg.on("console", lambda m: errors.append(m.text) if "Content Security Policy" in m.text else None)
    yield pg
    shots = os.environ.get("LLAMBDA_SCREENSHOTS")
    if shots:
        Path(shots).mkdir(parents=True, exist_ok=True)
        pg.screenshot(path=str(Path(shots) / f"{request.node.name}.png"))
    context.close()
    assert not errors, errors


@pytest.fixture(scope="module")
def bare_site():
    """The page alone (no model behind it): enough for what runs in the browser only."""
    with LiveServer(Starlette(routes=web.routes())) as srv:
        yield srv


RENDER = """(src) => { const d = document.createElement('div'); d.innerHTML = renderMarkdown(src);
  return {html: d.innerHTML, text: d.textContent,
          tags: [...d.querySelectorAll('*')].map(e => e.tagName.toLowerCase()),
          attrs: [...d.querySelectorAll('*')].flatMap(e => [...e.attributes].map(a => a.name + '=' + a.value))}; }"""


def test_markdown_renders_and_escapes(page, bare_site):
    page.goto(bare_site.url + "/")
    hostile = ('<img src=x onerror="window.pwned=1"> <script>window.pwned=1</script>\n'
               '[a](javascript:window.pwned=1) [b](data:text/html,x) [c](https://example.org/a_b_c?x=1&y="2")\n'
               '`<b>code</b>` **bold** and *it* and snake_case_name\n'
               '```html\n<svg onload="window.pwned=1"></svg>\n```')
    out = page.evaluate(RENDER, hostile)
    assert set(out["tags"]) <= {"p", "br", "a", "code", "strong", "em", "pre", "span"}, out["html"]
    assert not any(a.split("=", 1)[0].startswith("on") for a in out["attrs"]), out["attrs"]
    hrefs = [a for a in out["attrs"] if a.startswith("href=")]
    assert hrefs == ['href=https://example.org/a_b_c?x=1&y="2"'], hrefs
    assert "[a](javascript:window.pwned=1)" in out["text"] and "<script>" in out["text"]
    assert "<b>code</b>" in out["text"] and "snake_case_name" in out["text"]
    assert out["tags"].count("strong") == 1 and out["tags"].count("em") == 1
    assert page.evaluate("window.pwned") is None

    md = page.evaluate(RENDER, "# Title\n\n- one\n- two\n\n3. three\n4. four\n\n> quote\n\n"
                               "```python\ndef f(x):  # doubles\n    return x * 2\n```\nafter")
    assert md["tags"][:1] == ["h1"] and md["tags"].count("li") == 4 and "blockquote" in md["tags"]
    assert '<ol start="3">' in md["html"]
    assert '<span class="tok-kw">def</span>' in md["html"] and '<span class="tok-com"># doubles</span>' in md["html"]
    assert '<span class="tok-num">2</span>' in md["html"] and md["html"].endswith("<p>after</p>")
    # a code span as a link's label is code in the link (it was left a placeholder of NUL characters);
    # one in the target leaves the link as text
    out = page.evaluate(RENDER, "see [`requests`](https://pypi.org/project/requests) and [a](https://x.org/`y`)")
    assert '<a href="https://pypi.org/project/requests" target="_blank" rel="noopener noreferrer"><code>requests' \
           '</code></a>' in out["html"] and "\0" not in out["html"] and "\ufffd" not in out["html"], out["html"]
    assert out["text"].endswith("[a](https://x.org/y)") and out["tags"].count("a") == 1, out["html"]
    # an unclosed fence (an answer still streaming) is code up to the end
    assert page.evaluate(RENDER, "```js\nlet a = 'x'")["tags"] == ["pre", "code", "span", "span"]


def _settings(page, **fields):
    page.click("#settings-toggle")
    for selector, value in fields.items():
        page.fill(f"#{selector}", value)
    page.click("#settings button[type=submit]")
    assert page.locator("#settings").is_hidden()


WATCH_LENGTHS = """() => { window.lengths = [];
  new MutationObserver(() => { const b = document.querySelector('.msg.assistant:last-child .body');
    if (b) window.lengths.push(b.textContent.length); })
  .observe(document.getElementById('messages'), {childList: true, subtree: true, characterData: true}); }"""


def test_chat_streams_an_answer_and_keeps_it_across_reload(page, live):
    page.goto(live.url + "/")
    page.wait_for_selector(f"#model-info:has-text('Model {MODEL_ID}')")
    _settings(page, **{"temperature": "0", "max-tokens": "40", "extra": '{"ignore_eos": true}'})
    page.evaluate(WATCH_LENGTHS)
    page.fill("#input", "Tell me about the sea.")
    page.press("#input", "Shift+Enter")           # a new line, not a send
    page.keyboard.type("In two sentences.")
    assert page.input_value("#input") == "Tell me about the sea.\nIn two sentences."
    assert page.locator(".msg").count() == 0
    page.press("#input", "Enter")
    assert page.locator("#stop").is_visible()
    answer = page.locator(".msg.assistant").last
    answer.locator("xpath=self::*[@data-status='done']").wait_for(timeout=60_000)
    lengths = [n for n in page.evaluate("window.lengths") if n > 0]
    assert len(set(lengths)) >= 3 and lengths == sorted(lengths), f"not streamed: {lengths}"
    stats = answer.locator(".stats").inner_text()
    assert re.fullmatch(r"40 tokens · [\d.]+ tokens/s · first token after \d+ ms · prompt \d+ tokens", stats), stats
    assert page.locator("#send").is_visible() and page.locator("#stop").is_hidden()
    text = answer.locator(".body").inner_text()
    assert len(text) > 20
    assert page.locator(".msg.user .body").inner_text() == "Tell me about the sea.\nIn two sentences."

    page.reload()
    page.wait_for_selector(".msg.assistant")
    assert page.locator("#conversations li").count() == 1
    assert page.locator("#conversations li .open").inner_text() == "Tell me about the sea. In two sentences."
    assert page.locator(".msg.assistant .body").inner_text() == text
    assert page.locator(".msg.assistant .stats").inner_text() == stats
    page.click("#settings-toggle")
    assert page.input_value("#max-tokens") == "40" and page.input_value("#extra") == '{"ignore_eos":true}'
    page.click("#settings-toggle")

    # a second conversation; then delete the first
    page.click("#new-chat")
    assert page.locator(".msg").count() == 0
    page.fill("#input", "Hi")
    page.press("#input", "Enter")
    page.locator(".msg.assistant[data-status=done]").wait_for(timeout=60_000)
    assert page.locator("#conversations li").count() == 2
    page.click("[aria-label='Delete conversation: Tell me about the sea. In two sentences.']")
    assert page.locator("#conversations li").count() == 1
    page.reload()
    page.wait_for_selector(".msg.assistant")
    assert page.locator("#conversations li .open").all_inner_texts() == ["Hi"]


def test_a_reasoning_models_thought_is_shown_folded(page, tmp_path):
    """A thought (reasoning_content) goes in a folded "Thinking" box above the answer, and stays out of
    the conversation sent back (only the answer is the assistant's content)."""
    import json

    from serverkit import tiny_chat_server
    from test_think import ANSWER, OUTPUT, THINK_TOKENS, THOUGHT, TEMPLATE
    with tiny_chat_server(tmp_path, "tiny-think", THINK_TOKENS, TEMPLATE) as srv:
        page.goto(srv.url + "/")
        page.wait_for_selector("#model-info:has-text('Model tiny-think')")
        _settings(page, **{"temperature": "0", "max-tokens": "200",
                           "extra": json.dumps({"regex": re.escape(OUTPUT)})})     # the model writes OUTPUT
        page.fill("#input", "hi")
        page.press("#input", "Enter")
        answer = page.locator(".msg.assistant").last
        answer.locator("xpath=self::*[@data-status='done']").wait_for(timeout=60_000)
        thought = answer.locator(".thinking")
        assert thought.is_visible() and thought.get_attribute("open") is None
        assert answer.locator(".body").inner_text() == ANSWER
        thought.locator("summary").click()
        assert thought.locator(".text").inner_text() == THOUGHT
        page.reload()
        page.wait_for_selector(".msg.assistant")
        assert page.locator(".msg.assistant .thinking .text").text_content() == THOUGHT
        assert page.locator(".msg.user .thinking").is_hidden()


def _health(srv) -> dict:
    return httpx.get(srv.url + "/health", timeout=10).json()


def test_stop_ends_the_generation_on_the_server(page, live):
    page.goto(live.url + "/")
    page.wait_for_selector(f"#model-info:has-text('Model {MODEL_ID}')")
    _settings(page, **{"max-tokens": "250", "extra": '{"ignore_eos": true}'})
    before = live.metrics()
    page.fill("#input", "Write a very long story.")
    page.press("#input", "Enter")
    body = page.locator(".msg.assistant .body")
    page.wait_for_function("() => document.querySelector('.msg.assistant .body').textContent.length > 40")
    assert _health(live)["slots_processing"] == 1
    page.click("#stop")
    page.locator(".msg.assistant[data-status=stopped]").wait_for(timeout=5_000)
    assert page.locator(".msg.assistant .stats").inner_text() == "Stopped."
    shown = body.inner_text()
    t0 = time.monotonic()
    while _health(live)["slots_processing"]:
        assert time.monotonic() - t0 < 5, "the slot is still generating after Stop"
        time.sleep(0.05)
    after = live.wait_idle()
    generated = after["llambda_generated_tokens_total"] - before["llambda_generated_tokens_total"]
    assert 0 < generated < 250
    assert after['llambda_sequences_finished_total{reason="cancelled"}'] == \
        before.get('llambda_sequences_finished_total{reason="cancelled"}', 0) + 1
    time.sleep(0.5)
    assert live.metrics()["llambda_generated_tokens_total"] == after["llambda_generated_tokens_total"]
    assert body.inner_text() == shown     # the partial answer stays, and nothing more arrives
    page.reload()
    assert page.locator(".msg.assistant .body").inner_text() == shown


def test_api_key_flow(page, smollm2_gguf, tmp_path):
    key = "s3cret-key"
    with ServerProcess(smollm2_gguf, tmp_path / "server.log", "--api-key", key, "--parallel", "1",
                       "-c", "512") as srv:
        assert httpx.get(srv.url + "/").status_code == 200                      # the page is public
        assert httpx.get(srv.url + "/v1/models").status_code == 401             # the API is not
        page.goto(srv.url + "/")
        dialog = page.locator("#key-dialog")
        dialog.wait_for(state="visible")
        assert page.locator("#key-error").is_hidden()                           # no key yet: no error
        page.fill("#api-key", "wrong")
        page.press("#api-key", "Enter")
        page.wait_for_selector("#key-error:has-text('refused')")
        assert dialog.is_visible()
        # a key no HTTP header can carry is refused in the dialog, not kept (fetch would throw on each call)
        page.fill("#api-key", "ключ")
        page.press("#api-key", "Enter")
        page.wait_for_selector("#key-error:has-text('printable ASCII')")
        assert dialog.is_visible() and page.evaluate("localStorage.getItem('llambda.apiKey')") == "wrong"
        page.fill("#api-key", key)
        page.click("#key-form button[type=submit]")
        dialog.wait_for(state="hidden")
        page.wait_for_selector(f"#model-info:has-text('Model {srv.model_id}')")
        _settings(page, **{"max-tokens": "8", "temperature": "0"})
        page.fill("#input", "Hello")
        page.press("#input", "Enter")
        page.locator(".msg.assistant[data-status=done]").wait_for(timeout=60_000)
        assert page.locator(".msg.assistant .stats").inner_text().startswith("8 tokens")
        assert page.evaluate("localStorage.getItem('llambda.apiKey')") == key
        # the key kept in the browser is used again after a reload, without asking
        page.reload()
        page.wait_for_selector(f"#model-info:has-text('Model {srv.model_id}')")
        assert dialog.is_hidden()


# --- a hostile page in the same browser: cross-site POSTs and DNS rebinding ------------------------

def _gated(host: str = "127.0.0.1"):
    """An app recording the requests that get past the Gatekeeper (no model behind it)."""
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route
    from llambda.server.app import Gatekeeper
    from llambda.server.config import ServerConfig
    from llambda.server.metrics import Metrics

    seen = []

    async def record(request):
        seen.append((request.method, (await request.body()).decode()))
        return PlainTextResponse("ok")

    inner = Starlette(routes=web.routes() + [Route("/v1/chat/completions", record, methods=["POST"])])
    return Gatekeeper(inner, cfg=ServerConfig(host=host), metrics=Metrics()), seen


def test_gatekeeper_refuses_rebound_hosts_and_cross_site_posts():
    app, seen = _gated()
    client = TestClient(app, base_url="http://127.0.0.1:8080")
    for host in ["127.0.0.1:8080", "localhost:8080", "LOCALHOST", "[::1]:8080", "app.localhost:8080", "10.1.2.3"]:
        assert client.post("/v1/chat/completions", content="{}", headers={"Host": host}).status_code == 200, host
    for host in ["attacker.example:8080", "attacker.example", "127.0.0.1.attacker.example:8080", "localhost.evil"]:
        r = client.post("/v1/chat/completions", content="{}", headers={"Host": host})
        assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden_host", host
        assert client.get("/", headers={"Host": host}).status_code == 403, host   # the page too
    assert len(seen) == 6
    # a browser's cross-site (or same-site, another port) POST is refused; its same-origin one is not
    for site in ["cross-site", "same-site"]:
        r = client.post("/v1/chat/completions", content="{}", headers={"Sec-Fetch-Site": site})
        assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden_origin", site
    assert client.post("/v1/chat/completions", headers={"Sec-Fetch-Site": "same-origin"}).status_code == 200
    # an older browser sends Origin only
    assert client.post("/v1/chat/completions", headers={"Origin": "http://attacker.example"}).status_code == 403
    assert client.post("/v1/chat/completions", headers={"Origin": "null"}).status_code == 403
    assert client.post("/v1/chat/completions", headers={"Origin": "http://127.0.0.1:8080"}).status_code == 200
    # a browser extension's request (it has its own scheme; no web page can claim it) is not a web page's
    for origin in ["chrome-extension://abcdef", "moz-extension://1234"]:
        r = client.post("/v1/chat/completions", headers={"Origin": origin, "Sec-Fetch-Site": "cross-site"})
        assert r.status_code == 200, origin
    r = client.post("/v1/chat/completions", headers={"Origin": "null", "Sec-Fetch-Site": "cross-site"})
    assert r.status_code == 403
    # following a link from another site to the page is a GET: allowed
    assert client.get("/", headers={"Sec-Fetch-Site": "cross-site"}).status_code == 200
    assert len(seen) == 10
    # bound to all interfaces the machine's names are unknown: any Host, but still no cross-site POST
    app, seen = _gated("0.0.0.0")
    client = TestClient(app, base_url="http://llm.example:8080")
    assert client.post("/v1/chat/completions", content="{}").status_code == 200
    assert client.post("/v1/chat/completions", headers={"Sec-Fetch-Site": "cross-site"}).status_code == 403


def test_a_hostile_page_cannot_post_to_the_server(page):
    """Another origin's page sends the no-preflight kind of POST (text/plain): the server must not act on it."""
    from starlette.responses import HTMLResponse
    from starlette.routing import Route

    async def hostile(request):
        return HTMLResponse("<!doctype html><title>elsewhere</title>")

    app, seen = _gated()
    with LiveServer(app) as target, LiveServer(Starlette(routes=[Route("/", hostile)])) as other:
        page.goto(other.url.replace("127.0.0.1", "localhost") + "/")    # another origin, another site
        status = page.evaluate("""(url) => fetch(url + '/v1/chat/completions', {method: 'POST', mode: 'no-cors',
            headers: {'Content-Type': 'text/plain'}, body: '{"messages": []}'}).then(r => r.type)""", target.url)
        assert status == "opaque"          # sent; the browser hides the answer
        assert seen == []
        # the same POST from the server's own page goes through
        page.goto(target.url + "/")
        page.evaluate("""() => fetch('v1/chat/completions', {method: 'POST', body: 'same'}).then(r => r.status)""")
        assert seen == [("POST", "same")]


# --- images: a model with a vision tower, and one without ------------------------------------------

@pytest.fixture(scope="module")
def vision_site(tmp_path_factory):
    """The tiny Gemma 3 of the gemma3_vision fixture (its own tower, images encoded for real) served with the
    page; `.model` is a second load of it, for the library's own answers."""
    import llambda
    import test_vlm as vlm
    from llambda.server import ServerConfig, create_app
    folder = vlm.folder_with_tokenizer(tmp_path_factory.mktemp("webui") / "gemma", vlm.TEMPLATE)
    m = llambda.load(folder, backend="numpy", n_ctx=256)     # two turns holding two images of 78 tokens
    ref = llambda.load(folder, backend="numpy", n_ctx=256)
    with m, ref, LiveServer(create_app(m, ServerConfig(model_id="vis", parallel=1))) as srv:
        srv.model = ref
        yield srv


def _png(name: str) -> bytes:
    return (ROOT / "tests" / "fixtures" / "reference" / "tiny" / "gemma3_vision" / name).read_bytes()


# a File of these bytes, given to the page's input the way a paste or a drop gives it (a DataTransfer)
DISPATCH = """([kind, b64, name, type]) => {
  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  const dt = new DataTransfer();
  dt.items.add(new File([bytes], name, {type}));
  if (kind === 'paste') {
    const ev = new ClipboardEvent('paste', {clipboardData: dt, bubbles: true, cancelable: true});
    document.getElementById('input').dispatchEvent(ev);
    return ev.defaultPrevented;
  }
  const target = document.getElementById('messages');
  target.dispatchEvent(new DragEvent('dragover', {dataTransfer: dt, bubbles: true, cancelable: true}));
  const ev = new DragEvent('drop', {dataTransfer: dt, bubbles: true, cancelable: true});
  target.dispatchEvent(ev);
  return ev.defaultPrevented;
}"""
LOADED = "(sel) => [...document.querySelectorAll(sel)].map(i => i.complete && i.naturalWidth > 0)"


def _finished(page, nth: int, timeout: float = 120_000) -> str:
    """The status of the nth answer once it is no longer streaming (done, error, stopped)."""
    answer = page.locator(".msg.assistant").nth(nth)
    answer.locator("xpath=self::*[@data-status!='streaming']").wait_for(timeout=timeout)
    return answer.get_attribute("data-status")


def test_images_are_attached_sent_and_shown(page, vision_site, tmp_path):
    """The attach button, a paste and a drop each attach an image (a thumbnail, removable); the message is
    sent as OpenAI image_url parts holding data: URLs of the files' bytes, the tower encodes them (the
    server's count), the answer is the library's to the same images, and the thumbnails stay after a reload."""
    import base64
    import json

    png_a, png_b = _png("image_a.png"), _png("image_b.png")
    b64_a, b64_b = base64.b64encode(png_a).decode(), base64.b64encode(png_b).decode()
    page.goto(vision_site.url + "/")
    page.wait_for_selector("#model-info:has-text('Model vis')")
    assert "images" in page.inner_text("#model-info")
    assert page.locator("#attach").is_visible() and page.locator("#attachments").is_hidden()
    _settings(page, **{"temperature": "0", "max-tokens": "5", "extra": '{"ignore_eos": true}'})

    (tmp_path / "a.png").write_bytes(png_a)
    with page.expect_file_chooser() as chooser:          # the button opens the picker
        page.click("#attach")
    chooser.value.set_files(str(tmp_path / "a.png"))
    page.wait_for_function("() => document.querySelectorAll('#attachments .thumb').length === 1")
    assert page.evaluate(DISPATCH, ["paste", b64_b, "pasted.png", "image/png"]) is True
    page.wait_for_function("() => document.querySelectorAll('#attachments .thumb').length === 2")
    assert page.evaluate(DISPATCH, ["drop", b64_a, "dropped.png", "image/png"]) is True
    page.wait_for_function("() => document.querySelectorAll('#attachments .thumb').length === 3")
    assert all(page.evaluate(LOADED, "#attachments .thumb"))     # shown (blob: URLs, allowed by the CSP)
    page.click("[aria-label='Remove image 3']")                  # the dropped one taken off again
    assert page.locator("#attachments .thumb").count() == 2
    # a file that is no image is not attached, and the page says so
    assert page.evaluate(DISPATCH, ["drop", base64.b64encode(b"hello").decode(), "notes.txt", "text/plain"])
    page.wait_for_selector("#model-info:has-text('notes.txt is not an image')")
    assert page.locator("#attachments .thumb").count() == 2

    before = vision_site.metrics()["llambda_images_encoded_total"]
    sent = []
    page.on("request", lambda r: sent.append(r.post_data) if r.url.endswith("/v1/chat/completions") else None)
    page.fill("#input", "What is in them?")
    page.press("#input", "Enter")
    answer = page.locator(".msg.assistant").last
    answer.locator("xpath=self::*[@data-status='done']").wait_for(timeout=120_000)
    assert page.locator("#attachments").is_hidden()              # sent: nothing left attached
    (body,) = [json.loads(b) for b in sent]
    assert body["messages"] == [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64_a}},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64_b}},
        {"type": "text", "text": "What is in them?"}]}]
    assert vision_site.metrics()["llambda_images_encoded_total"] == before + 2
    want = vision_site.model.chat([{"role": "user", "content": [
        {"type": "image", "image": png_a}, {"type": "image", "image": png_b},
        {"type": "text", "text": "What is in them?"}]}], max_tokens=5, temperature=0, ignore_eos=True)
    kept = page.evaluate("JSON.parse(localStorage.getItem('llambda.chat.v1')).conversations[0].messages")
    assert kept[1]["content"] == want and answer.locator(".stats").inner_text().startswith("5 tokens")
    assert page.locator(".msg.user .images .thumb").count() == 2 and all(page.evaluate(LOADED, ".msg.user .thumb"))
    assert page.locator(".msg.user .body").inner_text() == "What is in them?"

    # a reload shows them again; a next turn sends the first turn's images again (the conversation is whole)
    page.reload()
    page.wait_for_selector(".msg.user .images .thumb")
    page.wait_for_function("() => [...document.querySelectorAll('.msg.user .thumb')].every(i => i.naturalWidth > 0)")
    page.wait_for_selector("#model-info:has-text('Model vis')")
    page.fill("#input", "And now?")
    page.press("#input", "Enter")
    assert _finished(page, 1) == "done", page.locator(".msg.assistant .stats").all_inner_texts()
    again = json.loads(sent[-1])["messages"]
    assert again[0] == body["messages"][0] and again[2] == {"role": "user", "content": "And now?"}

    # an image alone is a message too
    page.click("#new-chat")
    page.evaluate(DISPATCH, ["paste", b64_a, "alone.png", "image/png"])
    page.wait_for_selector("#attachments .thumb")
    page.press("#input", "Enter")
    page.locator(".msg.assistant[data-status=done]").wait_for(timeout=120_000)
    assert json.loads(sent[-1])["messages"][0]["content"] == [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64_a}}]
    assert page.locator(".msg.user .body").is_hidden() and page.locator(".msg.user .thumb").count() == 1


def test_a_text_model_offers_no_image_input(page, tmp_path):
    """No attach button; a pasted image is not taken (the paste goes on as the browser's own), a dropped one
    is refused saying why, and nothing is sent with images."""
    import base64

    from serverkit import tiny_chat_server
    from test_vlm import TEMPLATE
    b64 = base64.b64encode(_png("image_a.png")).decode()
    with tiny_chat_server(tmp_path, "tiny-text", (), TEMPLATE) as srv:
        assert httpx.get(srv.url + "/v1/models").json()["data"][0]["meta"]["vision"] is False
        page.goto(srv.url + "/")
        page.wait_for_selector("#model-info:has-text('Model tiny-text')")
        assert "images" not in page.inner_text("#model-info")
        assert page.locator("#attach").is_hidden() and page.locator("#attachments").is_hidden()
        assert page.evaluate(DISPATCH, ["paste", b64, "pasted.png", "image/png"]) is False
        assert page.evaluate(DISPATCH, ["drop", b64, "dropped.png", "image/png"]) is True   # not opened in place
        page.wait_for_selector("#model-info:has-text('takes no images')")
        assert page.locator("#attachments .thumb").count() == 0 and page.locator("#attachments").is_hidden()
        _settings(page, **{"max-tokens": "3"})
        page.fill("#input", "hi")
        page.press("#input", "Enter")
        page.locator(".msg.assistant[data-status=done]").wait_for(timeout=60_000)
        assert page.locator(".msg.user .images").count() == 0


def test_images_over_the_storage_quota_leave_the_conversation_kept(page, vision_site):
    """localStorage holds a few MB: a conversation whose images do not fit is kept without them (said on the
    page and in the message after a reload), not lost whole."""
    import base64
    page.goto(vision_site.url + "/")
    page.wait_for_selector("#model-info:has-text('Model vis')")
    _settings(page, **{"temperature": "0", "max-tokens": "2"})
    page.evaluate("""() => { const set = Storage.prototype.setItem;
      Storage.prototype.setItem = function (k, v) {
        if (String(v).includes('data:image')) throw new DOMException('quota', 'QuotaExceededError');
        return set.call(this, k, v); }; }""")
    page.evaluate(DISPATCH, ["paste", base64.b64encode(_png("image_b.png")).decode(), "b.png", "image/png"])
    page.fill("#input", "Keep me")
    page.press("#input", "Enter")
    assert _finished(page, 0) == "done"
    page.wait_for_selector("#model-info:has-text('kept without them')")
    assert page.locator(".msg.user .thumb").count() == 1        # this page still has it
    page.reload()
    page.wait_for_selector(".msg.user .lost")
    assert page.locator(".msg.user .lost").inner_text() == "1 image not kept in this browser"
    assert page.locator(".msg.user .body").inner_text() == "Keep me" and page.locator(".msg.user .thumb").count() == 0


def test_hostile_file_names_and_stored_images_run_nothing(page, vision_site):
    """A dropped file's name is shown as text; a stored conversation (this browser's localStorage, which another
    tab of the origin may have written) whose images are no data: URLs of an image, whose text and title hold
    markup, shows its thumbnails from blob: URLs or nothing: no script runs, no other URL is loaded (the CSP
    would say so on the console: the page fixture fails on that)."""
    import base64
    import json
    page.goto(vision_site.url + "/")
    page.wait_for_selector("#model-info:has-text('Model vis')")
    page.evaluate("() => { window.pwned = 0; }")
    name = '<img src=x onerror="window.pwned=1">.txt'
    page.evaluate(DISPATCH, ["drop", base64.b64encode(b"hello").decode(), name, "text/plain"])
    page.wait_for_selector("#model-info:has-text('is not an image')")
    assert page.inner_text("#model-info") == f"{name} is not an image"
    html = base64.b64encode(b"<script>window.pwned=5</script>").decode()
    stored = {"current": "c1", "conversations": [{"id": "c1", "title": "<img src=x onerror=window.pwned=2>",
                                                  "messages": [
        {"role": "user", "content": "<script>window.pwned=3</script>", "images": [
            "javascript:window.pwned=4", f"data:text/html;base64,{html}", '"><img src=x onerror=window.pwned=6>',
            "data:image/svg+xml;base64," + base64.b64encode(b"<svg xmlns='http://www.w3.org/2000/svg' "
                                                            b"onload='window.pwned=7'/>").decode()]},
        {"role": "assistant", "content": "[x](javascript:window.pwned=8) ![a](x\" onerror=\"window.pwned=9)",
         "status": "done"}]}]}
    page.add_init_script(f"window.pwned = 0; localStorage.setItem('llambda.chat.v1', {json.dumps(json.dumps(stored))})")
    page.reload()       # (set before the page's script runs: the page saves its own state as it goes)
    page.wait_for_selector(".msg.user .images")
    srcs = page.evaluate("() => [...document.querySelectorAll('img')].map(i => i.getAttribute('src'))")
    assert len(srcs) == 4 and all(s == "" or s.startswith("blob:") for s in srcs), srcs
    assert page.locator(".msg.user .body").inner_text() == "<script>window.pwned=3</script>"
    page.wait_for_timeout(300)
    assert page.evaluate("() => window.pwned") == 0
