"""Ollama's `think` as one mapping (thinking.think_template_kwargs) for both of its callers: `llambda run/chat
--think=VALUE` (commands/run_flags.py) and the Ollama API's JSON field (server/ollama_api.py)."""
import pytest

from llambda import cli, thinking
from llambda.commands import run_flags
from llambda.server import ollama_api, schemas

# --think's word -> Ollama's JSON value, and the template variables both set
CASES = [("true", True, {"enable_thinking": True}), ("false", False, {"enable_thinking": False}),
         ("high", "high", {"enable_thinking": True, "reasoning_effort": "high"}),
         ("medium", "medium", {"enable_thinking": True, "reasoning_effort": "medium"}),
         ("low", "low", {"enable_thinking": True, "reasoning_effort": "low"})]


def _cli(word: str) -> dict:
    a = cli.build_parser().parse_args(["chat", f"--think={word}"])
    return cli._template_kwargs(a).get("template_kwargs", {})


def _ollama(value) -> dict:
    """The template variables an /api/chat body's `think` ends as, through the chat fields it sets."""
    _, fields = ollama_api._think(schemas._Body({"think": value}))
    return schemas._template_kwargs(schemas._Body(fields))


@pytest.fixture
def calls(monkeypatch):
    """The helper's calls, from both callers' modules."""
    seen = []

    def spy(think):
        seen.append(think)
        return thinking.think_template_kwargs(think)
    monkeypatch.setattr(run_flags, "think_template_kwargs", spy)
    monkeypatch.setattr(ollama_api, "think_template_kwargs", spy)
    return seen


@pytest.mark.parametrize("word, value, want", CASES, ids=[c[0] for c in CASES])
def test_both_callers_map_think_through_the_one_helper(calls, word, value, want):
    assert thinking.think_template_kwargs(word) == thinking.think_template_kwargs(value) == want
    assert _cli(word) == want and calls == [word]
    assert _ollama(value) == want and calls == [word, value]


def test_unset_think_sets_nothing(calls):
    assert thinking.think_template_kwargs(None) == {}
    assert _cli_unset() == {} and _ollama(None) == {}


def _cli_unset() -> dict:
    return cli._template_kwargs(cli.build_parser().parse_args(["chat"])).get("template_kwargs", {})
