"""A reasoning model's answer parsed once: the stream's own parser (a <think> thought or harmony's
channels) splits content from reasoning and, by where its spans lie against where each token ends,
counts usage's reasoning_tokens. Checked on random texts mixing both formats' tags, cut into random
tokens and fed in random pieces (as a stream coalesces tokens) or read whole: the three must agree.
"""
import random

import pytest

from llambda.server.harmony import _MAX_HEADER
from llambda.server.openai_format import ChoiceState
from llambda.server.reasoning_tokens import TokenEnds
from llambda.server.tools import ToolSetup
from llambda.thinking import MAX_HELD_BLANKS

# pieces of answers: both formats' tags, their parts, blanks, runs of blanks past what the think
# parser holds, text, and headers long enough to be over harmony's limit or near it
FRAGMENTS = ["<think>", "</think>", "<thi", "</th", "nk>", "<|channel|>", "analysis", "final", "commentary",
             "<|message|>", "<|end|>", "<|start|>", "assistant", "<|return|>", "<|call|>", "<|constrain|>",
             " to=functions.f ", " to=browser.x", "json", '{"a": 1}', "<|", "|>", " ", "\n", "\n\n",
             " \n" * MAX_HELD_BLANKS, "Paris", "é🙂", "x" * (_MAX_HEADER - 20), "y" * 7]


# how answers usually start and go on, so that many of the texts do hold a thought or analysis
OPENINGS = ["", "<think>", "\n<think>\n", "<|channel|>analysis<|message|>", "<|channel|>final<|message|>"]
MESSAGES = ["<|end|><|start|>assistant<|channel|>analysis<|message|>", "<|end|><|start|>assistant<|channel|>final"
            "<|message|>", "<|end|><|start|>assistant<|channel|>commentary to=functions.f<|message|>"]


def random_text(rng: random.Random) -> str:
    return rng.choice(OPENINGS) + "".join(rng.choice(FRAGMENTS + MESSAGES) for _ in range(rng.randint(0, 14)))


def random_cuts(rng: random.Random, n: int, mean: int) -> list[int]:
    """Sorted cut points in 0..n, about `mean` apart (1: every character)."""
    if mean == 1:
        return list(range(1, n))
    return sorted(rng.sample(range(1, n), min(n - 1, max(n // mean, 0)))) if n > 1 else []


def pieces(text: str, cuts: list[int]) -> list[str]:
    bounds = [0, *cuts, len(text)]
    return [text[i:j] for i, j in zip(bounds, bounds[1:])]


def overlapping(tokens: list[str], spans: list[tuple[int, int]]) -> int:
    """The tokens with text inside a span, or standing inside one with none: by the definition."""
    n, start = 0, 0
    for t in tokens:
        end = start + len(t)
        n += any((start < e and end > s) if t else s <= start < e for s, e in spans)
        start = end
    return n


def streamed(tools: ToolSetup, tokens: list[str], groups: list[int]):
    """(content, reasoning, calls, reasoning_tokens) as a stream reads them: the tokens' text coalesced
    into runs (a run ends before each index in `groups`), each run fed to the choice's parser."""
    st = ChoiceState(0, "", tools)
    content, reasoning = [], []
    for run in pieces(tokens, groups):
        for t in run:
            st.token_ends.add(t)
        c, _ = st.tool_parser.feed("".join(run))
        content.append(c), reasoning.append(st.tool_parser.take_reasoning())
    c, _ = st.tool_parser.finish()
    content.append(c), reasoning.append(st.tool_parser.take_reasoning())
    return "".join(content), "".join(reasoning), _calls(st), st.reasoning_tokens()


def whole(tools: ToolSetup, tokens: list[str], groups: list[int]):
    """The same read whole (Generation.collect): the runs kept, split as they came."""
    st = ChoiceState(0, "", tools)
    st.read_whole()
    runs = pieces(tokens, groups)
    for k, run in enumerate(runs):
        for t in run:
            st.token_ends.add(t)
        st.keep("".join(run), end=k == len(runs) - 1)
    return "".join(st.answer), "".join(st.thought), _calls(st), st.reasoning_tokens()


def _calls(st: ChoiceState) -> list:
    return [(c["name"], c["arguments"]) for c in st.tool_parser.calls]


SETUPS = [ToolSetup(thinks=True), ToolSetup(thinks=True, thought_open=True), ToolSetup({"f"}, harmony=True),
          ToolSetup({"f"}, harmony=True, parallel=False)]


@pytest.mark.parametrize("setup", range(len(SETUPS)))
def test_random_texts_split_and_count_alike_however_they_arrive(setup):
    tools = SETUPS[setup]
    rng = random.Random(setup)
    counted = 0
    for case in range(150):
        text = random_text(rng)
        tokens = pieces(text, random_cuts(rng, len(text), rng.choice([1, 3, 8])))
        tokens.insert(rng.randint(0, len(tokens)), "")      # a token with no text
        # the whole text as one run: the reference, its count by the definition from its spans
        one = ChoiceState(0, "", tools)
        c, _ = one.tool_parser.feed(text)
        rest, _ = one.tool_parser.finish()
        want = (c + rest, one.tool_parser.take_reasoning(), _calls(one),
                overlapping(tokens, one.tool_parser.reasoning_spans()))
        counted += want[3] > 0
        for mean in (1, 2, 5):
            groups = random_cuts(rng, len(tokens), mean)
            assert streamed(tools, tokens, groups) == want, (text, tokens, groups)
            assert whole(tools, tokens, groups) == want, (text, tokens, groups)
    assert counted > 15          # the texts do hold reasoning


def test_token_ends_count_the_tokens_in_the_spans():
    rng = random.Random(5)
    for _ in range(300):
        tokens = ["a" * rng.choice([0, 1, 1, 2, 5]) for _ in range(rng.randint(0, 12))]
        n = sum(map(len, tokens))
        edges = sorted(rng.sample(range(n + 2), min(n + 2, 2 * rng.randint(0, 3))))
        spans = [(s, e) for s, e in zip(edges[::2], edges[1::2])]
        ends = TokenEnds()
        for t in tokens:
            ends.add(t)
        assert ends.within(spans) == overlapping(tokens, spans), (tokens, spans)
    # text an end of generation lets out belongs to the last token
    ends = TokenEnds()
    ends.add("ab"), ends.add("c"), ends.add("de", token=False)
    assert ends.ends == [2, 5] and ends.within([(3, 4)]) == 1 and ends.within([(1, 2)]) == 1
