"""Where each generated token ends (reasoning_tokens.TokenEnds, an int a token) is kept only for what reads
it: usage's reasoning_tokens (a reasoning format) and /v1/responses' text logprobs, which tools split. A
chat completion offering tools asks for neither, so it keeps none. Live, on a tiny random llama whose
template thinks not."""
import httpx
import pytest

from llambda.server import openai_format
from llambda.server.openai_format import ChoiceState
from llambda.server.tools import ToolSetup

TEMPLATE = ("{% for m in messages %}{{ m.content }}\n{% endfor %}"
            "{% if tools %}{{ tools | length }} tools\n{% endif %}")
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
MESSAGES = [{"role": "user", "content": "Weather?"}]


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    from serverkit import tiny_chat_server
    with tiny_chat_server(tmp_path_factory.mktemp("ends"), "tiny-ends", (), TEMPLATE) as srv:
        yield srv


@pytest.fixture
def built(monkeypatch):
    """Every TokenEnds a choice builds, counted."""
    made = []

    class Counted(openai_format.TokenEnds):
        def __init__(self):
            super().__init__()
            made.append(self)
    monkeypatch.setattr(openai_format, "TokenEnds", Counted)
    return made


def test_a_choice_keeps_token_ends_only_for_what_reads_them():
    assert ChoiceState(0, tools=ToolSetup({"f"})).token_ends is None
    assert ChoiceState(0, tools=ToolSetup({"f"}), text_logprobs=True).token_ends is not None
    assert ChoiceState(0, tools=ToolSetup(thinks=True)).token_ends is not None      # reasoning_tokens
    assert ChoiceState(0, text_logprobs=True).token_ends is None                    # nothing splits the text


def _post(live, path, body):
    r = httpx.post(live.url + path, json={"model": "tiny-ends", "max_tokens": 4, "temperature": 0, **body},
                   timeout=120)
    assert r.status_code == 200, r.text
    return r.text


@pytest.mark.parametrize("stream", [False, True])
def test_a_chat_completion_with_tools_keeps_no_token_ends(live, built, stream):
    _post(live, "/v1/chat/completions", {"messages": MESSAGES, "tools": TOOLS, "logprobs": True, "stream": stream})
    assert built == []


def test_responses_text_logprobs_keep_them_and_only_they(live, built):
    body = {"input": "Weather?", "tools": [{"type": "function", "name": "get_weather",
                                            "parameters": {"type": "object"}}], "max_output_tokens": 4}
    body.pop("max_tokens", None)
    r = httpx.post(live.url + "/v1/responses", json={"model": "tiny-ends", "temperature": 0, **body}, timeout=120)
    assert r.status_code == 200, r.text
    assert built == []
    r = httpx.post(live.url + "/v1/responses", json={"model": "tiny-ends", "temperature": 0, **body,
                                                     "include": ["message.output_text.logprobs"]}, timeout=120)
    assert r.status_code == 200, r.text
    assert len(built) == 1
    parts = [p for item in r.json()["output"] if item["type"] == "message" for p in item["content"]]
    assert all(p["logprobs"] for p in parts if p["text"])
