"""Logprobs on /v1/responses (include=["message.output_text.logprobs"], top_logprobs) on a live SmolLM2
server through the official `openai` client: the same tokens and values as chat completions' logprobs
for the same greedy request, whole and streamed (the text deltas' logprobs make the final ones), kept
by the store, and nothing when not asked for. The reasoning's share (none) is in tests/test_think.py."""
from __future__ import annotations

import openai
import pytest

from llambda.server.openai_format import ChoiceState
from llambda.server.text_logprobs import TextLogprobs
from llambda.server.tools import ToolSetup, hermes_prefix
from serverkit import MODEL_ID, assert_error, post

LOGPROBS = ["message.output_text.logprobs"]
QUESTION = "Write a haiku about the sea."


class _Strings:
    """Token ids as their own text (a token here is its index in the run's list of pieces)."""

    def __init__(self, pieces):
        self.pieces = pieces

    def get(self, token):
        return self.pieces[token], list(self.pieces[token].encode())


def _taken(pieces: list[str], setup: ToolSetup, cuts: list[int]) -> list[str]:
    """The text tokens' logprobs taken from a choice fed `pieces` (one token each) in runs ending at `cuts`,
    as the stream takes them: after each run is parsed, then at the end."""
    st = ChoiceState(0, tools=setup, text_logprobs=True)
    lp, taken = TextLogprobs(st, _Strings(pieces)), []
    for i, piece in enumerate(pieces):
        st.token_ends.add(piece)
        st.logprobs.append((i, -0.5, []))
        st.tool_parser.feed(piece)
        if i + 1 in cuts:
            taken += lp.take()
    st.tool_parser.finish()
    return [e["token"] for e in taken + lp.take(end=True)]


@pytest.mark.parametrize("pieces, setup, text", [
    # blanks and a tag in pieces first: only the thought's close settles that they were the thought's;
    # the blank line after it is neither the thought's nor the text's
    ([" ", "<thi", "nk>", "a b", "</th", "ink>", "\n\n", "Hi", " there"], ToolSetup(thinks=True),
     ["Hi", " there"]),
    # a blank that might have opened a thought turns out to be the answer's
    ([" ", "Hi"], ToolSetup(thinks=True), [" ", "Hi"]),
    # harmony: only the final message's body, not the analysis or any header or terminator
    (["<|channel|>", "analysis", "<|message|>", "hm", "<|end|>", "<|start|>", "assistant", "<|channel|>",
      "final", "<|message|>", "Hi", "<|e", "nd|>"], ToolSetup(harmony=True), ["Hi"]),
])
def test_a_streamed_token_waits_until_the_parser_settles_it(pieces, setup, text):
    for cuts in ([len(pieces)], list(range(1, len(pieces) + 1)), [2, 5]):
        assert _taken(pieces, setup, cuts) == text, cuts


def _taken_whole(pieces: list[str], setup: ToolSetup) -> list[str]:
    """The text tokens' logprobs of a choice read whole (its calls taken out at the end), fed `pieces`."""
    st = ChoiceState(0, tools=setup, text_logprobs=True)
    st.read_whole()
    for i, piece in enumerate(pieces):
        st.token_ends.add(piece)
        st.logprobs.append((i, -0.5, []))
        st.keep(piece, end=i + 1 == len(pieces))
    return [e["token"] for e in TextLogprobs(st, _Strings(pieces)).take(end=True)]


CALL = ['<tool_call>', '\n{"name": "f", "arguments": {', '"a": 1}}', '\n', '</tool_call>']
TOOLS = {"f"}


@pytest.mark.parametrize("pieces, setup, streamed, whole", [
    # text, then a call: the call's tokens are not the text's, nor the blank just before it (the output_text
    # is "Sure." streamed too: the blank waits until a call or text follows)
    (["Sure", ".", "\n"] + CALL, ToolSetup(TOOLS), ["Sure", "."], ["Sure", "."]),
    (["Sure", ". \n"] + CALL, ToolSetup(TOOLS), ["Sure", ". \n"], ["Sure", ". \n"]),     # a token partly the text's
    # text after a call too; the whitespace between calls is no one's
    (["Hi"] + CALL + ["\n"] + CALL + ["\n", "Done"], ToolSetup(TOOLS), ["Hi", "\n", "Done"], ["Hi", "\n", "Done"]),
    # a forced call (its start is our prefix): no text at all
    ([' {"a": 1', '}}', "\n", "</tool_call>"], ToolSetup(TOOLS, prefix=hermes_prefix("f")), [], []),
    # ...one the model fails to make is its text, every token of it
    ([" no", "pe", "</tool_call>"], ToolSetup(TOOLS, prefix=hermes_prefix("f")),
     [" no", "pe", "</tool_call>"], [" no", "pe", "</tool_call>"]),
    # a call to a tool not offered falls back to text, tags and all
    (["<tool_call>", '{"name": "g"}', "</tool_call>"], ToolSetup(TOOLS),
     ["<tool_call>", '{"name": "g"}', "</tool_call>"], ["<tool_call>", '{"name": "g"}', "</tool_call>"]),
    # a bare JSON call (no tags) is a call
    (['{"name": "f", ', '"arguments": {}}'], ToolSetup(TOOLS), [], []),
    # after a thought: neither the thought nor the call
    (["<think>", "x", "</think>", "\n\n", "Ok"] + CALL, ToolSetup(TOOLS, thinks=True), ["Ok"], ["Ok"]),
])
def test_tool_calls_written_as_text_carry_no_text_logprobs(pieces, setup, streamed, whole):
    for cuts in ([len(pieces)], list(range(1, len(pieces) + 1)), [2, 5]):
        assert _taken(pieces, setup, cuts) == streamed, cuts
    assert _taken_whole(pieces, setup) == whole


def _chat_logprobs(client, top: int) -> list[dict]:
    chat = client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": QUESTION}],
                                          max_tokens=16, temperature=0, logprobs=True, top_logprobs=top)
    return [e.model_dump() for e in chat.choices[0].logprobs.content]


def _same(got: list[dict], want: list[dict], top: int) -> None:
    """`got` are `want`'s tokens with the same values (within 1e-5), `top` alternatives each."""
    assert [e["token"] for e in got] == [e["token"] for e in want] and got
    for g, w in zip(got, want):
        assert abs(g["logprob"] - w["logprob"]) < 1e-5
        assert "bytes" not in w or g.get("bytes", w["bytes"]) == w["bytes"]
        assert len(g["top_logprobs"]) == top
        assert [t["token"] for t in g["top_logprobs"]] == [t["token"] for t in w["top_logprobs"]]
        assert all(abs(a["logprob"] - b["logprob"]) < 1e-5 for a, b in zip(g["top_logprobs"], w["top_logprobs"]))


def _part_logprobs(response) -> list[dict]:
    [item] = response.output
    return [e.model_dump() for e in item.content[0].logprobs]


@pytest.mark.parametrize("top", [0, 3])
def test_logprobs_are_chats_for_the_same_greedy_request(client, top):
    r = client.responses.create(model=MODEL_ID, input=QUESTION, max_output_tokens=16, temperature=0,
                                include=LOGPROBS, top_logprobs=top)
    got = _part_logprobs(r)
    _same(got, _chat_logprobs(client, top), top)
    assert "".join(e["token"] for e in got) == r.output_text     # the tokens spell the text
    assert r.top_logprobs == top


def test_streamed_text_deltas_carry_the_final_logprobs(client):
    kw = dict(model=MODEL_ID, input=QUESTION, max_output_tokens=16, temperature=0, include=LOGPROBS,
              top_logprobs=2)
    whole = _part_logprobs(client.responses.create(**kw))
    events = list(client.responses.create(stream=True, **kw))
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) >= 2 and all(e.logprobs for e in deltas)
    streamed = [lp.model_dump() for e in deltas for lp in e.logprobs]
    done = next(e for e in events if e.type == "response.output_text.done")
    assert [lp.model_dump() for lp in done.logprobs] == streamed
    part = next(e for e in events if e.type == "response.content_part.done").part
    final = events[-1].response
    assert [lp.model_dump() for lp in part.logprobs] == _part_logprobs(final)
    _same(streamed, _part_logprobs(final), 2)         # the events' entries are the part's, without bytes
    _same(_part_logprobs(final), whole, 2)
    # stored as answered: retrieving it gives them back
    assert _part_logprobs(client.responses.retrieve(final.id)) == _part_logprobs(final)


def test_stored_response_keeps_them_and_a_continuation_reads_its_text(client):
    first = client.responses.create(model=MODEL_ID, input="What is the capital of France?", max_output_tokens=8,
                                    temperature=0, include=LOGPROBS)
    assert _part_logprobs(client.responses.retrieve(first.id)) == _part_logprobs(first) != []
    kw = dict(model=MODEL_ID, input="And of Spain?", max_output_tokens=8, temperature=0)
    plain = client.responses.create(model=MODEL_ID, input="What is the capital of France?", max_output_tokens=8,
                                    temperature=0)
    assert plain.output_text == first.output_text
    # the earlier answer's logprobs are not part of the prompt: continuing either is the same
    assert client.responses.create(previous_response_id=first.id, **kw).output_text == \
        client.responses.create(previous_response_id=plain.id, **kw).output_text


def test_absent_when_not_asked_for(client):
    kw = dict(model=MODEL_ID, input=QUESTION, max_output_tokens=8, temperature=0)
    r = client.responses.create(**kw)
    assert r.output[0].content[0].logprobs == [] and r.top_logprobs == 0
    # top_logprobs alone does not ask for them (include does), as in OpenAI's API; it is echoed
    r = client.responses.create(top_logprobs=5, **kw)
    assert r.output[0].content[0].logprobs == [] and r.top_logprobs == 5
    events = list(client.responses.create(stream=True, **kw))
    assert all(e.logprobs == [] for e in events if e.type in ("response.output_text.delta",
                                                              "response.output_text.done"))


@pytest.mark.parametrize("top, words", [(21, "<= 20"), (-1, ">= 0"), ("3", "integer"), (True, "integer"),
                                        (2.5, "integer")])
def test_bad_top_logprobs_is_a_400_naming_it(live, top, words):
    body = {"model": MODEL_ID, "input": "Hi", "max_output_tokens": 2, "include": LOGPROBS, "top_logprobs": top}
    err = assert_error(post(live, "/v1/responses", body), 400, "top_logprobs", words)
    assert err["param"] == "top_logprobs", err
    # without include too: a bad value is not let through because it goes unused
    del body["include"]
    assert assert_error(post(live, "/v1/responses", body), 400, "top_logprobs")["param"] == "top_logprobs"


def test_the_openai_client_gets_the_400(client):
    with pytest.raises(openai.BadRequestError, match="top_logprobs"):
        client.responses.create(model=MODEL_ID, input="Hi", max_output_tokens=2, include=LOGPROBS, top_logprobs=50)
