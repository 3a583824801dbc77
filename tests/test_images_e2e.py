"""Images end to end through every API surface on a live server: a tiny Gemma 3 (the gemma3_vision fixture)
with its own vision tower, attached by llambda.load (llambda.vision: the image decoded, preprocessed and
encoded for real); each route's answer is Model.chat's greedy reply to the same canonical messages (and
`llambda run`'s, a prompt naming an image file). tests/test_vlm.py supplies the folder with a tokenizer."""
from __future__ import annotations

import base64

import httpx
import pytest

import llambda

import test_vlm as vlm  # noqa: E402  (its folder with a tokenizer, chat template and the fixture's images)

PNG_A, PNG_B = vlm.PNG["image_a.png"], vlm.PNG["image_b.png"]
B64_A, B64_B = base64.b64encode(PNG_A).decode(), base64.b64encode(PNG_B).decode()
URL_A, URL_B = "data:image/png;base64," + B64_A, "data:image/png;base64," + B64_B
GREEDY = dict(max_tokens=6, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from serverkit import LiveServer
    from llambda.server import ServerConfig, create_app
    folder = vlm.folder_with_tokenizer(tmp_path_factory.mktemp("e2e") / "gemma", vlm.TEMPLATE)
    m = llambda.load(folder, backend="numpy", n_ctx=128, n_slots=2)
    ref = llambda.load(folder, backend="numpy", n_ctx=128)     # the library's answers (the served one is busy)
    assert m.accepts_images and ref.accepts_images            # the folder's own tower, found by load()
    with m, ref, LiveServer(create_app(m, ServerConfig(model_id="vis", parallel=2))) as srv:
        srv.model = ref
        yield srv


def served_pair(load):
    """A generator for a module fixture: a live server of load(n_slots=2) (model id "vis", 2 slots) whose `.model`
    is a second load(), the library's answers (the served model is busy); both with their own tower."""
    from serverkit import LiveServer
    from llambda.server import ServerConfig, create_app
    m = load(n_slots=2)
    ref = load()
    assert m.accepts_images and ref.accepts_images
    with m, ref, LiveServer(create_app(m, ServerConfig(model_id="vis", parallel=2))) as srv:
        srv.model = ref
        yield srv


def _want(model, *parts):
    msgs = [{"role": "user", "content": [({"type": "image", "image": p} if isinstance(p, bytes) else
                                          {"type": "text", "text": p}) for p in parts]}]
    return model.chat(msgs, **GREEDY)


def _post(srv, path, body):
    r = httpx.post(srv.url + path, json={"model": "vis", **body}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def every_surface(srv, image: bytes, ollama_images: list[bytes]) -> None:
    """Each route's greedy answer with `image` (Ollama's with `ollama_images`, before the text) is Model.chat's
    (srv.model's) to the same canonical messages."""
    b64 = base64.b64encode(image).decode()
    url = "data:image/png;base64," + b64
    want = _want(srv.model, "Look:", image)
    sampling = {"temperature": 0, "ignore_eos": True}
    got = _post(srv, "/v1/chat/completions", {"max_tokens": 6, **sampling, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "Look:"}, {"type": "image_url", "image_url": {"url": url}}]}]})
    assert got["choices"][0]["message"]["content"] == want
    got = _post(srv, "/v1/responses", {"max_output_tokens": 6, **sampling, "input": [{"role": "user", "content": [
        {"type": "input_text", "text": "Look:"}, {"type": "input_image", "image_url": url}]}]})
    assert got["output"][-1]["content"][0]["text"] == want
    got = _post(srv, "/v1/messages", {"max_tokens": 6, **sampling, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "Look:"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}}]}]})
    assert got["content"][0]["text"] == want
    want_ollama = _want(srv.model, *ollama_images, "Look:")
    b64s = [base64.b64encode(x).decode() for x in ollama_images]
    got = _post(srv, "/api/chat", {"stream": False, "options": {"temperature": 0, "num_predict": 6},
                                   "ignore_eos": True, "messages": [{"role": "user", "content": "Look:", "images": b64s}]})
    assert got["message"]["content"] == want_ollama
    got = _post(srv, "/api/generate", {"stream": False, "options": {"temperature": 0, "num_predict": 6},
                                       "ignore_eos": True, "prompt": "Look:", "images": b64s})
    assert got["response"] == want_ollama


def streamed(srv, image: bytes) -> tuple[str, str]:
    """(the streamed chat completion's text with `image`, Model.chat's answer)."""
    want = _want(srv.model, "Look:", image)
    url = "data:image/png;base64," + base64.b64encode(image).decode()
    body = {"model": "vis", "stream": True, "max_tokens": 6, "temperature": 0, "ignore_eos": True,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Look:"},
                                                      {"type": "image_url", "image_url": url}]}]}
    import json
    text = []
    with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                text += [c["delta"].get("content") or "" for c in json.loads(line[6:])["choices"]]
    return "".join(text), want


def test_every_surface_reaches_the_model(served):
    every_surface(served, PNG_A, [PNG_A])
    caps = _post(served, "/api/show", {})["capabilities"]
    assert "vision" in caps


def test_a_stored_conversation_keeps_its_images(served):
    first = _post(served, "/v1/responses", {"max_output_tokens": 3, "temperature": 0, "input": [
        {"role": "user", "content": [{"type": "input_image", "image_url": URL_B}, {"type": "input_text",
                                                                                   "text": "What?"}]}]})
    items = httpx.get(f"{served.url}/v1/responses/{first['id']}/input_items", timeout=60).json()["data"]
    assert items[0]["content"][0] == {"type": "input_image", "image_url": URL_B, "detail": "auto"}
    again = _post(served, "/v1/responses/input_tokens", {"previous_response_id": first["id"], "input": "And?"})
    text_only = _post(served, "/v1/responses/input_tokens", {"input": "What? And?"})
    # the continued prompt holds the image's block (its soft tokens) again
    assert again["input_tokens"] > text_only["input_tokens"] + vlm.PER
    counted = _post(served, "/v1/messages/count_tokens", {"messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": B64_A}}]}]})
    assert counted["input_tokens"] > vlm.PER


def test_streams_with_images(served):
    got, want = streamed(served, PNG_B)
    assert got == want


def test_run_on_the_command_line(served, tmp_path, monkeypatch, capsys):
    """`llambda run MODEL "... ./image_a.png"`: the prompt's image through the chat template, Model.chat's reply."""
    from llambda import cli
    (tmp_path / "image_a.png").write_bytes(PNG_A)
    monkeypatch.chdir(tmp_path)
    folder = served.model.source.path
    real_load = llambda.api.load

    def load(name, **kw):
        return real_load(folder, backend="numpy", n_ctx=128)

    monkeypatch.setattr(llambda.api, "load", load)
    want = _want(served.model, PNG_A, "Look:")
    assert cli.main(["run", "-m", str(folder), "--temperature", "0", "-n", "6", "--ignore-eos", "Look: ./image_a.png"]) == 0
    out = capsys.readouterr()
    assert out.out == want + "\n" and "Added image './image_a.png'" in out.err
