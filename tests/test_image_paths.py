"""Images on the command line: `--image FILE` on run and chat, and image paths typed in a prompt or a
message, found as `ollama run` finds them (commands/image_paths.py), for a model that reads images only;
faked models (no vision tower is needed to test what reaches Model.chat_stream). The fixture's PNGs
(tools/make_tiny_gemma3_vision.py) are the images."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

import llambda.api
from llambda import cli
from llambda.commands import image_paths
from llambda.commands.image_paths import find_images, read_image, starts_with_image
from llambda.engine import TokenEvent
from llambda.errors import LlambdaError
from llambda.repl import ChatSession, run_chat
from llambda.server import images as server_images

FIXTURE = Path(__file__).parent / "fixtures" / "reference" / "tiny" / "gemma3_vision"
PNG_A = (FIXTURE / "image_a.png").read_bytes()
PNG_B = (FIXTURE / "image_b.png").read_bytes()


@pytest.fixture
def pics(tmp_path, monkeypatch):
    """A folder with a.png, "my cat.PNG" (a space, an upper-case extension), b (q).jpg and notes.png
    (text, no image); the working directory and HOME are it."""
    shutil.copy(FIXTURE / "image_a.png", tmp_path / "a.png")
    shutil.copy(FIXTURE / "image_b.png", tmp_path / "my cat.PNG")
    shutil.copy(FIXTURE / "image_a.png", tmp_path / "b (q).jpg")
    (tmp_path / "notes.png").write_text("not an image")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def _found(text):
    said = []
    rest, data = find_images(text, said.append)
    return rest, data, said


def test_paths_are_found_as_ollama_finds_them(pics):
    assert _found("what is in ./a.png?") == ("what is in ?", [PNG_A], ["Added image './a.png'"])
    assert _found(f"describe {pics}/a.png") == ("describe", [PNG_A], [f"Added image '{pics}/a.png'"])
    assert _found("compare ~/a.png and ./my\\ cat.PNG.")[:2] == ("compare and .", [PNG_A, PNG_B])
    assert _found("compare './my cat.PNG' with \"./a.png\"")[:2] == ("compare with", [PNG_B, PNG_A])
    assert _found("see ./b\\ \\(q\\).jpg")[:2] == ("see", [PNG_A])
    os.mkdir(pics / "sub")
    os.chdir(pics / "sub")
    assert _found("../a.png, please")[:2] == (", please", [PNG_A])


def test_a_typed_tiff_path_is_an_image_as_with_image(pics):
    """--image takes what the decoder takes (TIFF too): a typed path ending in .tif/.tiff is found as well."""
    from PIL import Image
    Image.open(pics / "a.png").save(pics / "scan.tiff")
    rest, data, said = _found("read ./scan.tiff")
    assert rest == "read" and len(data) == 1 and data[0] == (pics / "scan.tiff").read_bytes()


@pytest.mark.parametrize("text", [
    "a.png is a file name",                 # no ./ or / before it: a word
    "look at ./missing.png",                # no such file: stays text, as ollama leaves it
    "./a.png.bak is a backup",              # not an image extension at the end
    "./a.pngs",
    "see (./a.png)",                        # not a word of its own
    "./my cat.PNG",                         # an unescaped space ends the word: "./my" is no path
    "nothing here at all",
    "see https://example.com/a.png",        # a URL: nothing is fetched, and no word starts at its /
])
def test_words_that_are_not_image_paths_stay_text(pics, text):
    assert _found(text) == (text, [], [])


def test_finding_paths_takes_time_linear_in_the_text(pics):
    """Words that run to the text's end (escaped blanks, open quotes) are tried once, not from every
    start: a 16 MB prompt of them would never finish."""
    import time
    t0 = time.process_time()
    # (30 000 escaped blanks took the earlier pattern over 40 s: each word ran to the end)
    for text in ("/\\ " * 300_000, "'/a" * 300_000, " /" + "\\ /" * 30_000, "./a.pn" * 200_000):
        assert _found(text) == (text, [], [])
    assert time.process_time() - t0 < 10


def test_a_file_that_is_no_image_or_too_large_is_an_error(pics, monkeypatch):
    with pytest.raises(LlambdaError, match="notes.png is not an image"):
        find_images("read ./notes.png", lambda line: None)
    monkeypatch.setattr(image_paths, "MAX_IMAGE_BYTES", 100)
    with pytest.raises(LlambdaError, match="larger than"):
        find_images("see ./a.png", lambda line: None)


def test_read_image_refuses_odd_files(pics):
    with pytest.raises(LlambdaError, match="cannot read the image ./nope.png: No such file"):
        read_image("./nope.png")
    with pytest.raises(LlambdaError, match="Is a directory"):
        read_image(str(pics))
    os.mkfifo(pics / "fifo.png")        # would wait for a writer forever
    with pytest.raises(LlambdaError, match="not a regular file"):
        read_image("./fifo.png")
    from llambda.vision import image as vision_image
    assert image_paths.MAX_IMAGE_BYTES == server_images.MAX_IMAGE_BYTES == vision_image.MAX_IMAGE_BYTES


def test_image_files_are_the_decoders_formats(tmp_path):
    """read_image takes what llambda.vision's decoder takes (its header read, no pixel decoded): TIFF too;
    a file of another kind, or of more pixels than it takes, is refused before any model loads."""
    from PIL import Image
    for fmt in ("PNG", "JPEG", "GIF", "WEBP", "BMP", "TIFF"):
        path = tmp_path / f"a.{fmt.lower()}"
        Image.new("RGB", (4, 4), (9, 8, 7)).save(path, fmt)
        assert read_image(str(path)) == path.read_bytes(), fmt
    for name, data in (("wav", b"RIFF\0\0\0\0WAVEfmt " + bytes(32)), ("pdf", b"%PDF-1.7\n" + bytes(32)),
                       ("png", b"\x89PNG\r\n\x1a\n" + bytes(8)), ("webp", b"XXXX\0\0\0\0WEBP" + bytes(32))):
        (tmp_path / f"x.{name}").write_bytes(data)
        with pytest.raises(LlambdaError, match="is not an image"):
            read_image(str(tmp_path / f"x.{name}"))
    Image.new("1", (9000, 9000)).save(tmp_path / "big.png")       # 81M pixels, a small file
    with pytest.raises(LlambdaError, match="pixels"):
        read_image(str(tmp_path / "big.png"))


def test_a_line_starting_with_an_image_path_is_a_message(pics):
    assert starts_with_image(f"{pics}/a.png what is this?")
    assert not starts_with_image("/set parameter seed 1")
    assert not starts_with_image("/nope.png what")


# -- run ------------------------------------------------------------------------------------

class FakeModel:
    """A loaded model as run and chat use it; `accepts_images` as the vision branch's Model says it."""
    name, is_encoder, spec_stats = "fake", False, None

    def __init__(self, seen, accepts_images):
        self.seen, self.accepts_images = seen, accepts_images

    def _events(self):
        yield TokenEvent(1, "ok")
        yield TokenEvent(-1, "", finish_reason="stop")

    def stream(self, prompt, **kw):
        self.seen["prompt"] = prompt
        return self._events()

    def chat_stream(self, messages, **kw):
        self.seen.setdefault("chats", []).append([dict(m) for m in messages])
        self.seen["kw"] = kw
        return self._events()

    def render_chat(self, messages, **kw):
        return "<rendered>"

    def chat_template(self):
        return None

    def close(self):
        self.seen["closed"] = True


@pytest.fixture
def fake_load(monkeypatch):
    seen = {"vision": True}
    monkeypatch.setattr(llambda.api, "load", lambda name, **kw: FakeModel(seen, seen["vision"]))
    return seen


def test_run_sends_images_through_the_chat_template(pics, fake_load, capsys):
    assert cli.main(["run", "-m", "x.gguf", "--image", "./my cat.PNG", "--think=false", "what", "is", "./a.png"]) == 0
    assert "prompt" not in fake_load        # no raw completion
    assert fake_load["chats"] == [[{"role": "user", "content": [
        {"type": "image", "image": PNG_B}, {"type": "image", "image": PNG_A}, {"type": "text", "text": "what is"}]}]]
    assert fake_load["kw"]["template_kwargs"] == {"enable_thinking": False}
    out = capsys.readouterr()
    assert out.out == "ok\n" and "Added image './a.png'" in out.err
    # no text at all: the images alone
    assert cli.main(["run", "-m", "x.gguf", "--image", "a.png", ""]) == 0
    assert fake_load["chats"][-1] == [{"role": "user", "content": [{"type": "image", "image": PNG_A}]}]


def test_run_on_a_text_model_keeps_paths_as_text(pics, fake_load, capsys):
    fake_load["vision"] = False
    assert cli.main(["run", "-m", "x.gguf", "what is ./a.png"]) == 0
    assert fake_load["prompt"] == "what is ./a.png" and "chats" not in fake_load
    assert "Added image" not in capsys.readouterr().err


@pytest.mark.parametrize("args, said, loads", [
    (["--image", "./a.png"], "x.gguf takes no images (it has no vision tower)", True),
    (["--image", "./nope.png"], "cannot read the image ./nope.png: No such file or directory", False),
    (["--image", "./notes.png"], "./notes.png is not an image", False),
])
def test_run_image_errors_are_one_line(pics, fake_load, capsys, args, said, loads):
    fake_load["vision"] = False
    assert cli.main(["run", "-m", "x.gguf", *args, "hi"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"llambda: error: {said}") and err.count("\n") == 1, err
    assert ("closed" in fake_load) == loads


def test_run_refuses_a_bad_image_in_the_prompt(pics, fake_load, capsys):
    assert cli.main(["run", "-m", "x.gguf", "read ./notes.png"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("llambda: error: ./notes.png is not an image") and err.count("\n") == 1


# -- chat ------------------------------------------------------------------------------------

def test_chat_messages_take_images(pics):
    seen = {}
    s = ChatSession(FakeModel(seen, True), {}, images=[PNG_B])
    s.reply("hello ./a.png", lambda t: None)
    s.reply("and now?", lambda t: None)
    first = {"role": "user", "content": [{"type": "image", "image": PNG_B}, {"type": "image", "image": PNG_A},
                                         {"type": "text", "text": "hello"}]}
    assert seen["chats"][0] == [first]
    assert seen["chats"][1][2] == {"role": "user", "content": "and now?"}    # --image's went with the first only
    # /save writes the images as Ollama's messages hold them, /load reads them back
    assert "saved 4 messages" in s.command("/save conv.json")
    saved = json.loads((pics / "conv.json").read_text())
    assert saved[0]["content"] == "hello" and len(saved[0]["images"]) == 2
    s.command("/clear")
    assert "loaded 4 messages" in s.command("/load conv.json")
    assert s.messages[0] == first
    text = ChatSession(FakeModel({}, False), {})
    assert "takes none" in text.command("/load conv.json") and text.messages == []


@pytest.mark.parametrize("images", [{"QUJD": 1}, "QUJD", [5], ["QUJD"]], ids=["dict", "str", "number", "not-an-image"])
def test_load_refuses_images_that_are_not_base64_images(pics, images):
    """/load's `images`: a dict's keys were decoded as images, and base64 of no image was loaded, then failed
    every message after it (the conversation kept it)."""
    (pics / "bad.json").write_text(json.dumps([{"role": "user", "content": "a", "images": images}]))
    s = ChatSession(FakeModel({}, True), {})
    said = s.command("/load bad.json")
    assert "images" in said and "loaded" not in said and s.messages == []


def test_chat_on_a_text_model_keeps_paths_as_text(pics):
    seen = {}
    s = ChatSession(FakeModel(seen, False), {})
    s.reply("hello ./a.png", lambda t: None)
    assert seen["chats"][0] == [{"role": "user", "content": "hello ./a.png"}]


def test_a_piped_chat_takes_a_line_starting_with_an_image_path(pics, capsys):
    import io
    seen = {}
    s = ChatSession(FakeModel(seen, True), {})
    assert run_chat(s, "", None, stdin=io.StringIO(f"{pics}/a.png what is it?\n/nope.png\n"),
                    stdout=io.StringIO()) == 0
    assert seen["chats"] == [[{"role": "user", "content": [{"type": "image", "image": PNG_A},
                                                           {"type": "text", "text": "what is it?"}]}]]
    assert "unknown command /nope.png" in capsys.readouterr().err


def test_chat_refuses_image_flags_for_a_text_model(pics, fake_load, capsys):
    fake_load["vision"] = False
    assert cli.main(["chat", "-m", "x.gguf", "--image", "a.png"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("llambda: error: x.gguf takes no images") and err.count("\n") == 1


# -- serve -----------------------------------------------------------------------------------

@pytest.mark.parametrize("vision, argv, limit", [(False, [], 4 * 2**20), (True, [], 32 * 2**20),
                                                 (True, ["--max-body", "1000"], 1000)])
def test_serve_makes_room_for_an_image_in_the_body(monkeypatch, vision, argv, limit):
    """A model with a vision tower gets a body limit one image of the largest size fits in (base64),
    unless --max-body says otherwise."""
    import llambda.server
    import llambda.server.guard
    seen = {}

    class Served(FakeModel):
        n_ctx, config = 64, type("C", (), {"arch": "gemma3"})()
        backend = type("B", (), {"name": "native"})()

        def memory_report(self):
            return {"weights": 0}

    monkeypatch.setattr(llambda.api, "load", lambda name, **kw: Served(seen, vision))
    monkeypatch.setattr(llambda.server, "serve", lambda model, cfg, log_level: seen.setdefault("cfg", cfg) and 0)
    monkeypatch.setattr(llambda.server.guard, "listening_socket", lambda host, port: __import__("io").StringIO())
    a = cli.build_parser().parse_args(["serve", "-m", "x.gguf", *argv])
    a.fn(a)
    assert seen["cfg"].max_body_bytes == limit
    assert cli.VISION_MAX_BODY > 4 * server_images.MAX_IMAGE_BYTES / 3


def test_help_tells_a_vision_chat_how_to_send_images():
    assert "images: name an image file" in ChatSession(FakeModel({}, True), {}).command("/help")
    assert "images:" not in ChatSession(FakeModel({}, False), {}).command("/help")
