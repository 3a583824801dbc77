"""Images on every API surface: each API's shapes converted into the canonical image part
({"type": "image", "image": bytes}, server/images.py), the transport checked (strict base64, data: URLs of
an image media type, no remote URLs or file ids, the size of an image and the count of a request), and on
a live server with a text model every route and shape answering 400 `model_without_vision` in its own
error shape. Offline: a tiny random llama (test_export's) is the text model; the fixture's two PNGs
(tools/make_tiny_gemma3_vision.py) are the images. The end-to-end answers of a vision model come with
the vision tower (tests of their own)."""
from __future__ import annotations

import base64
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from llambda.chat import message_images
from llambda.server import ServerConfig, images
from llambda.server.anthropic_api import parse_messages
from llambda.server.errors import APIError
from llambda.server.ollama_api import parse_ollama_chat, parse_ollama_generate
from llambda.server.ollama_models import ServedModel
from llambda.server.response_items import stored_items
from llambda.server.response_store import ResponseStore
from llambda.server.responses_api import parse_responses
from llambda.server.schemas import GenerationSpec, parse_chat

FIXTURE = Path(__file__).parent / "fixtures" / "reference" / "tiny" / "gemma3_vision"
PNG_A = (FIXTURE / "image_a.png").read_bytes()
PNG_B = (FIXTURE / "image_b.png").read_bytes()
B64_A = base64.b64encode(PNG_A).decode()
B64_B = base64.b64encode(PNG_B).decode()
URL_A = "data:image/png;base64," + B64_A
URL_B = "data:image/png;base64," + B64_B


def _refused(fn, *words, code: str | None = None, status: int = 400) -> APIError:
    with pytest.raises(APIError) as e:
        fn()
    assert e.value.status == status, e.value.message
    for w in words:
        assert w.lower() in e.value.message.lower(), e.value.message
    if code is not None:
        assert e.value.code == code, (e.value.code, e.value.message)
    return e.value


def _image(data: bytes) -> dict:
    return {"type": "image", "image": data}


# -- the transport ----------------------------------------------------------------------------

def test_base64_is_decoded_strictly():
    count = images.ImageCount()
    assert images.decode_base64(B64_A, "x", count) == PNG_A
    # line breaks, as MIME writes base64 (and Go's decoder, Ollama's, skips them)
    wrapped = "\r\n".join(B64_B[i:i + 76] for i in range(0, len(B64_B), 76))
    assert images.decode_base64(wrapped, "x", count) == PNG_B
    for bad, why in [("aGk", "multiple of 4"), ("a$k=", "'$' at 1"), ("aG=k", "'='"), ("aGk=" + " ", "' '"),
                     ("aGk_", "'_'"), ("", "empty"), ("aGké", "'é'")]:
        _refused(lambda: images.decode_base64(bad, "images[0]", images.ImageCount()), "images[0]", why)
    for bad in (None, 5, ["aGk="], {"data": "aGk="}):
        _refused(lambda: images.decode_base64(bad, "images[0]", images.ImageCount()), "base64 string")


def test_an_image_over_the_limit_is_refused_before_decoding(monkeypatch):
    from llambda.vision import base64_text
    monkeypatch.setattr(base64_text, "MAX_IMAGE_BYTES", 96)     # the one decoder's bound (the REPL's too)
    assert images.decode_base64("A" * 128, "x", images.ImageCount()) == bytes(96)
    err = _refused(lambda: images.decode_base64("A" * 132, "images[0]", images.ImageCount()), "99 bytes", "96",
                   code="image_too_large")
    assert err.param == "images[0]"
    # told from the length: a long text of garbage is refused as too large, never scanned or decoded
    _refused(lambda: images.decode_base64("$" * 10**6, "x", images.ImageCount()), code="image_too_large")


def test_the_transport_bound_is_the_models():
    """A request is refused past the images a model takes by default, before the extra ones are decoded."""
    from llambda.models.images import DEFAULT_MAX_IMAGES
    assert images.MAX_IMAGES == DEFAULT_MAX_IMAGES


def test_images_of_a_request_are_counted(monkeypatch):
    monkeypatch.setattr(images, "MAX_IMAGES", 2)
    count = images.ImageCount()
    images.decode_base64(B64_A, "a", count)
    images.decode_base64(B64_A, "b", count)
    _refused(lambda: images.decode_base64(B64_A, "images[2]", count), "more than 2 images", code="too_many_images")


BAD_URLS = [
    ("http://127.0.0.1/cat.png", ["remote images are not fetched", "outbound"], "remote_image"),
    ("https://example.com/cat.png", ["remote images"], "remote_image"),
    ("HTTPS://example.com/cat.png", ["remote images"], "remote_image"),
    ("ftp://example.com/cat.png", ["data: URL"], "invalid_image_url"),
    ("file:///etc/passwd", ["data: URL"], "invalid_image_url"),
    ("cat.png", ["data: URL"], "invalid_image_url"),
    ("data:image/png;base64" + B64_A, ["','"], "invalid_image_url"),
    ("data:text/plain;base64,aGk=", ["text/plain", "not an image"], "invalid_media_type"),
    ("data:;base64,aGk=", ["not an image"], "invalid_media_type"),
    ("data:application/octet-stream;base64," + B64_A, ["not an image"], "invalid_media_type"),
    ("data:image/png," + B64_A, ["only base64"], "invalid_image_url"),
    ("data:image/png;base64,iVBORw0KGgo%3D", ["not base64", "'%'"], "invalid_base64"),
    ("data:image/png" + ";" * 10**6 + "base64,aGk=", ["before ','", "at most 256"], "invalid_image_url"),
]


@pytest.mark.parametrize("url, words, code", BAD_URLS, ids=[f"{i}-{c}" for i, (_, _, c) in enumerate(BAD_URLS)])
def test_data_urls(url, words, code):
    _refused(lambda: images.from_url(url, "u", images.ImageCount()), *words, code=code)


def test_data_url_forms_taken():
    count = images.ImageCount()
    for url in (URL_A, "DATA:IMAGE/PNG;BASE64," + B64_A, "data:image/png;name=a.png;base64," + B64_A,
                "data:image/jpeg;base64," + B64_A):     # the declared type is not the decoder's business
        assert images.from_url(url, "u", count) == PNG_A


# -- OpenAI chat completions ------------------------------------------------------------------

def _chat(*parts, role="user") -> GenerationSpec:
    return parse_chat({"messages": [{"role": role, "content": list(parts)}]})


def test_openai_image_url_parts_become_canonical():
    spec = _chat({"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": URL_A}},
                 {"type": "image_url", "image_url": {"url": URL_B, "detail": "low"}},
                 {"type": "image_url", "image_url": URL_A})      # a bare string, as some clients send it
    assert spec.messages[0]["content"] == [{"type": "text", "text": "What is this?"}, _image(PNG_A), _image(PNG_B),
                                           _image(PNG_A)]
    assert len(message_images(spec.messages)) == 3
    # text-only messages are as they were
    plain = parse_chat({"messages": [{"role": "user", "content": "hi"},
                                     {"role": "user", "content": [{"type": "text", "text": "a"}]}]})
    assert plain.messages == [{"role": "user", "content": "hi"}, {"role": "user", "content": [{"type": "text",
                                                                                                   "text": "a"}]}]
    assert message_images(plain.messages) == []


@pytest.mark.parametrize("part, role, words", [
    ({"type": "image_url", "image_url": {"url": URL_A}}, "assistant", ["only allowed in user messages"]),
    ({"type": "image_url", "image_url": {"url": URL_A}}, "system", ["only allowed in user messages"]),
    ({"type": "image_url", "image_url": {"url": URL_A, "detail": "ultra"}}, "user", ["detail", "auto, low, high"]),
    ({"type": "image_url", "image_url": 5}, "user", ["image_url must be an object"]),
    ({"type": "image_url"}, "user", ["image_url must be an object"]),
    ({"type": "image_url", "image_url": {}}, "user", ["image_url.url must be a URL string"]),
    ({"type": "image_url", "image_url": {"url": "http://x/cat.png"}}, "user", ["remote images"]),
    ({"type": "input_audio", "input_audio": {"data": "aGk=", "format": "wav"}}, "user", ["'input_audio'", "audio"]),
    ({"type": "file", "file": {"file_id": "file-1"}}, "user", ["'file'", "files"]),
    ({"type": "image", "image": B64_A}, "user", ["image_url"]),     # the library's part, from JSON: not bytes
])
def test_openai_parts_refused(part, role, words):
    err = _refused(lambda: _chat(part, role=role), "messages[0].content[0]", *words)
    assert err.param.startswith("messages[0].content[0]")


def test_openai_image_count(monkeypatch):
    monkeypatch.setattr(images, "MAX_IMAGES", 3)
    part = {"type": "image_url", "image_url": {"url": URL_A}}
    messages = [{"role": "user", "content": [part, part]}, {"role": "assistant", "content": "ok"},
                {"role": "user", "content": [part, part]}]
    _refused(lambda: parse_chat({"messages": messages}), "messages[2].content[1]", "more than 3",
             code="too_many_images")


# -- the Responses API -----------------------------------------------------------------------

def _responses(inp, store=None, **body):
    return parse_responses({"input": inp, **body}, store or ResponseStore())


def test_responses_input_image():
    inp = [{"role": "user", "content": [{"type": "input_text", "text": "Compare"},
                                        {"type": "input_image", "image_url": URL_A, "detail": "high"},
                                        {"type": "input_text", "text": "with"},
                                        {"type": "input_text", "text": "this"},
                                        {"type": "input_image", "image_url": URL_B}]}]
    spec, _, _, items = _responses(inp)
    assert spec.messages[0]["content"] == [{"type": "text", "text": "Compare"}, _image(PNG_A),
                                           {"type": "text", "text": "with\nthis"}, _image(PNG_B)]
    # kept as sent, so that a continuation (and input_items) gives them back
    kept = items[0]["content"]
    assert kept[1] == {"type": "input_image", "image_url": URL_A, "detail": "high"}
    assert kept[4] == {"type": "input_image", "image_url": URL_B, "detail": "auto"}
    assert stored_items(items, []) == [dict(item, id=item["id"]) for item in items]
    # a function call's output may hold an image too
    calls = [{"type": "function_call", "call_id": "c1", "name": "shot", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "c1",
              "output": [{"type": "input_image", "image_url": URL_A}]}]
    spec, _, _, _ = _responses(inp + calls)
    assert spec.messages[-1] == {"role": "tool", "tool_call_id": "c1", "content": [_image(PNG_A)]}


@pytest.mark.parametrize("part, words", [
    ({"type": "input_image", "file_id": "file-123"}, ["file ids are not supported", "file store"]),
    ({"type": "input_image", "image_url": "https://example.com/a.png"}, ["remote images"]),
    ({"type": "input_image", "image_url": URL_A, "detail": "max"}, ["detail"]),
    ({"type": "input_image"}, ["image_url must be a URL string"]),
    ({"type": "input_image", "image_url": "data:text/html;base64,aGk="}, ["not an image"]),
    ({"type": "input_file", "file_data": "aGk="}, ["'input_file'", "input_image"]),
    ({"type": "input_audio", "input_audio": {}}, ["'input_audio'"]),
])
def test_responses_refused(part, words):
    _refused(lambda: _responses([{"role": "user", "content": [part]}]), "input[0].content[0]", *words)


@pytest.mark.parametrize("role", ["assistant", "system", "developer"])
def test_responses_image_only_from_the_user(role):
    _refused(lambda: _responses([{"role": role, "content": [{"type": "input_image", "image_url": URL_A}]}]),
             "input[0].content[0]", "user messages")


# -- Anthropic's Messages API ----------------------------------------------------------------

def _source(data=B64_A, media="image/png", kind="base64") -> dict:
    return {"type": "image", "source": {"type": kind, "media_type": media, "data": data}}


def _messages(content, role="user", **body):
    return parse_messages({"model": "m", "max_tokens": 8, "messages": [{"role": role, "content": content}], **body})


def test_anthropic_image_blocks():
    spec = _messages([_source(), {"type": "text", "text": "What is it?"}, _source(B64_B)])
    assert spec.messages[0]["content"] == [_image(PNG_A), {"type": "text", "text": "What is it?"}, _image(PNG_B)]
    # in a tool result, after the assistant's call; the user's own text follows it
    body = {"model": "m", "max_tokens": 8, "messages": [
        {"role": "user", "content": "Take a picture"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "camera", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                      "content": [{"type": "text", "text": "here"}, _source()]},
                                     {"type": "text", "text": "Describe it"}]}]}
    spec = parse_messages(body)
    assert spec.messages[2] == {"role": "tool", "tool_call_id": "t1",
                                "content": [{"type": "text", "text": "here"}, _image(PNG_A)]}
    assert spec.messages[3] == {"role": "user", "content": "Describe it"}
    body["messages"][2]["content"][0]["is_error"] = True
    body["messages"][2]["content"][0]["content"] = [_source()]
    assert parse_messages(body).messages[2]["content"] == [{"type": "text", "text": "Error:"}, _image(PNG_A)]


@pytest.mark.parametrize("block, role, words", [
    ({"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}, "user",
     ["source", "remote images are not fetched"]),
    ({"type": "image", "source": {"type": "file", "file_id": "file_1"}}, "user", ["file sources", "file store"]),
    ({"type": "image", "source": {"type": "text", "data": "x"}}, "user", ["base64"]),
    ({"type": "image"}, "user", ["base64"]),
    (_source(media="application/pdf"), "user", ["media_type", "not an image"]),
    (_source(media=None), "user", ["media_type", "not an image"]),
    (_source(data="not base64!"), "user", ["source.data", "not base64"]),
    (_source(data=None), "user", ["source.data", "base64 string"]),
    (_source(), "assistant", ["'image' block", "assistant"]),
    ({"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "aGk="}}, "user",
     ["'document' block"]),
])
def test_anthropic_refused(block, role, words):
    _refused(lambda: _messages([block] if role == "user" else [{"type": "text", "text": "x"}, block], role=role),
             *words)


def test_anthropic_system_takes_no_image():
    _refused(lambda: _messages("hi", system=[_source()]), "system[0]", "only text blocks")


# -- Ollama's API ----------------------------------------------------------------------------

def _service(accepts_images: bool = False):
    cfg = ServerConfig(model_id="tiny")
    model = SimpleNamespace(accepts_images=accepts_images)
    return SimpleNamespace(cfg=cfg, model=model, check_model=lambda name: None)


def test_ollama_chat_images():
    body = {"model": "tiny", "messages": [{"role": "user", "content": "What is this?", "images": [B64_A, B64_B]},
                                          {"role": "assistant", "content": "Two squares."},
                                          {"role": "user", "images": [B64_A]}]}
    spec = parse_ollama_chat(body, _service()).spec
    # the images before the text, where Ollama's prompt puts them
    assert spec.messages[0]["content"] == [_image(PNG_A), _image(PNG_B), {"type": "text", "text": "What is this?"}]
    assert spec.messages[1] == {"role": "assistant", "content": "Two squares."}
    assert spec.messages[2]["content"] == [_image(PNG_A)]


@pytest.mark.parametrize("message, words", [
    ({"role": "user", "content": "x", "images": "aGk="}, ["messages[0].images", "array"]),
    ({"role": "user", "content": "x", "images": ["aGk"]}, ["messages[0].images[0]", "not base64"]),
    ({"role": "user", "content": "x", "images": [5]}, ["messages[0].images[0]", "base64 string"]),
    ({"role": "user", "content": "x", "images": ["data:image/png;base64," + B64_A]},
     ["not base64", "':'", "after its ',' alone"]),
    ({"role": "assistant", "content": "x", "images": [B64_A]}, ["user (or tool) message"]),
    ({"role": "user", "content": ["x"], "images": [B64_A]}, ["content must be a string"]),
])
def test_ollama_chat_refused(message, words):
    _refused(lambda: parse_ollama_chat({"messages": [message]}, _service()), *words)


def test_ollama_generate_images():
    spec = parse_ollama_generate({"prompt": "Describe", "system": "Be brief", "images": [B64_A]}, _service()).spec
    assert spec.kind == "chat"
    assert spec.messages == [{"role": "system", "content": "Be brief"},
                             {"role": "user", "content": [_image(PNG_A), {"type": "text", "text": "Describe"}]}]
    for extra, words in [({"raw": True}, ["raw: true", "no place for images"]),
                         ({"suffix": "end"}, ["suffix", "no place for images"])]:
        _refused(lambda: parse_ollama_generate({"prompt": "x", "images": [B64_A], **extra}, _service()), *words)
    _refused(lambda: parse_ollama_generate({"prompt": "x", "images": [B64_A, "$$$$"]}, _service()),
             "images[1]", "not base64")


def test_ollama_image_count(monkeypatch):
    monkeypatch.setattr(images, "MAX_IMAGES", 2)
    _refused(lambda: parse_ollama_generate({"prompt": "x", "images": [B64_A] * 3}, _service()),
             "images[2]", "more than 2")
    messages = [{"role": "user", "content": "x", "images": [B64_A]}] * 3
    _refused(lambda: parse_ollama_chat({"messages": messages}, _service()), "messages[2].images[0]", "more than 2")


def test_show_lists_vision_when_the_model_reads_images():
    service = _service(accepts_images=True)
    service.model.is_encoder = False
    assert "vision" in ServedModel(service).capabilities()
    assert "vision" not in ServedModel(_service(accepts_images=False)).capabilities()


def test_require_vision():
    spec = parse_chat({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": URL_A}]}]})
    assert images.require_vision(_service(accepts_images=True), spec) == [PNG_A]
    err = _refused(lambda: images.require_vision(_service(), spec), "'tiny'", "takes no images", "vision tower",
                   code="model_without_vision")
    assert err.param == "messages"
    images.require_vision(_service(), parse_chat({"messages": [{"role": "user", "content": "hi"}]}))
    # a model that says nothing (before the vision branches) takes no images
    bare = SimpleNamespace(cfg=ServerConfig(model_id="bare"), model=SimpleNamespace())
    _refused(lambda: images.require_vision(bare, spec), "'bare'", code="model_without_vision")


# -- every route on a live server with a text model ------------------------------------------

@pytest.fixture(scope="module")
def text_server(tmp_path_factory):
    from serverkit import tiny_chat_server
    with tiny_chat_server(tmp_path_factory.mktemp("images"), "tiny-text", (), None) as srv:
        yield srv


OPENAI_SHAPE = lambda r: r.json()["error"]["message"]       # noqa: E731
ANTHROPIC_SHAPE = lambda r: r.json()["error"]["message"]    # noqa: E731
OLLAMA_SHAPE = lambda r: r.json()["error"]                  # noqa: E731
IMAGE_URL = {"type": "image_url", "image_url": {"url": URL_A}}
INPUT_IMAGE = {"type": "input_image", "image_url": URL_A}
TOOL_TURNS = [{"role": "user", "content": "Take a picture"},
              {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "camera", "input": {}}]},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [_source()]}]}]

ROUTES = [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, IMAGE_URL]}],
                              "max_tokens": 2}, OPENAI_SHAPE),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": URL_A}]}],
                              "max_tokens": 2, "stream": True}, OPENAI_SHAPE),
    ("/apply-template", {"messages": [{"role": "user", "content": [IMAGE_URL]}]}, OPENAI_SHAPE),
    ("/v1/responses", {"input": [{"role": "user", "content": [INPUT_IMAGE]}], "max_output_tokens": 2}, OPENAI_SHAPE),
    ("/v1/responses", {"input": [{"role": "user", "content": [INPUT_IMAGE]}], "max_output_tokens": 2,
                       "stream": True}, OPENAI_SHAPE),
    ("/v1/responses/input_tokens", {"input": [{"role": "user", "content": [INPUT_IMAGE]}]}, OPENAI_SHAPE),
    ("/v1/messages", {"max_tokens": 2, "messages": [{"role": "user", "content": [_source()]}]}, ANTHROPIC_SHAPE),
    ("/v1/messages", {"max_tokens": 2, "messages": TOOL_TURNS, "stream": True}, ANTHROPIC_SHAPE),
    ("/v1/messages/count_tokens", {"messages": [{"role": "user", "content": [_source()]}]}, ANTHROPIC_SHAPE),
    ("/api/chat", {"messages": [{"role": "user", "content": "hi", "images": [B64_A]}]}, OLLAMA_SHAPE),
    ("/api/chat", {"messages": [{"role": "user", "content": "hi", "images": [B64_A]}], "stream": False},
     OLLAMA_SHAPE),
    ("/api/generate", {"prompt": "hi", "images": [B64_A]}, OLLAMA_SHAPE),
]


@pytest.mark.parametrize("path, body, message", ROUTES, ids=[f"{p}-{i}" for i, (p, _, _) in enumerate(ROUTES)])
def test_a_text_model_refuses_images_on_every_route(text_server, path, body, message):
    r = httpx.post(text_server.url + path, json={"model": "tiny-text", **body}, timeout=60)
    assert r.status_code == 400, r.text
    text = message(r)
    assert "'tiny-text' takes no images" in text and "vision tower" in text, text
    if message is OPENAI_SHAPE:
        assert r.json()["error"]["code"] == "model_without_vision"
    if message is ANTHROPIC_SHAPE:
        assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"
    if message is OLLAMA_SHAPE:
        assert list(r.json()) == ["error"]


@pytest.mark.parametrize("path, body, words", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@@"}}]}]}, ["not base64"]),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": "https://example.com/cat.png"}]}]}, ["remote images"]),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": "data:text/plain;base64,aGk="}]}]}, ["not an image"]),
    ("/v1/responses", {"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]},
     ["file ids"]),
    ("/v1/messages", {"max_tokens": 2, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}]}]}, ["remote images"]),
    ("/api/chat", {"messages": [{"role": "user", "content": "hi", "images": ["aGk"]}]}, ["not base64"]),
    ("/api/generate", {"prompt": "hi", "raw": True, "images": [B64_A]}, ["raw: true"]),
])
def test_malformed_images_are_400s_on_the_live_server(text_server, path, body, words):
    r = httpx.post(text_server.url + path, json={"model": "tiny-text", **body}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    text = err if isinstance(err, str) else err["message"]
    for w in words:
        assert w in text, text


def test_text_still_works_and_show_says_no_vision(text_server):
    r = httpx.post(text_server.url + "/v1/chat/completions", timeout=60,
                   json={"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "max_tokens": 2})
    assert r.status_code == 200, r.text
    caps = httpx.post(text_server.url + "/api/show", json={"model": "tiny-text"}, timeout=60).json()["capabilities"]
    assert "vision" not in caps and "completion" in caps


def test_official_clients_send_shapes_taken(text_server, tmp_path):
    """The shapes the openai, anthropic and ollama packages send (the ollama client encodes a file's
    bytes or path itself) reach the model check: model_without_vision, not a shape error."""
    import anthropic
    import ollama
    import openai
    client = openai.OpenAI(base_url=text_server.url + "/v1", api_key="none", max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny-text", max_tokens=2, messages=[{"role": "user", "content": [
            {"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": URL_A, "detail": "low"}}]}])
    assert e.value.code == "model_without_vision"
    with pytest.raises(openai.BadRequestError, match="takes no images"):
        client.responses.create(model="tiny-text", max_output_tokens=2, input=[{"role": "user", "content": [
            {"type": "input_text", "text": "hi"}, {"type": "input_image", "image_url": URL_B, "detail": "auto"}]}])
    aclient = anthropic.Anthropic(base_url=text_server.url, api_key="none", max_retries=0)
    with pytest.raises(anthropic.BadRequestError, match="takes no images"):
        aclient.messages.create(model="tiny-text", max_tokens=2, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": B64_A}}]}])
    (tmp_path / "b.png").write_bytes(PNG_B)
    oclient = ollama.Client(host=text_server.url)
    for images in ([PNG_A], [str(tmp_path / "b.png")]):
        with pytest.raises(ollama.ResponseError, match="takes no images"):
            oclient.chat(model="tiny-text", messages=[{"role": "user", "content": "hi", "images": images}])
    with pytest.raises(ollama.ResponseError, match="takes no images"):
        oclient.generate(model="tiny-text", prompt="hi", images=[PNG_A])
