"""`ollama run`'s own flags, as `llambda run` and `llambda chat` take them: --think[=VALUE],
--hidethinking, --nowordwrap and --keepalive DURATION.

--think sets the chat template's thinking switch (enable_thinking: Qwen3, SmolLM3) and, as a level, its
reasoning_effort (gpt-oss), as the server's Ollama API reads `think`. --hidethinking lets the model think
but prints only what follows its `<think>` thought, or of a harmony answer (gpt-oss) only the bodies of its
final and commentary messages, as the server's parsers split them. --nowordwrap and --keepalive are
accepted so that commands written for ollama run here: llambda never wraps the text (it writes it as
generated), and the model lives in the command's own process, which ends with it, so there is nothing to
keep loaded.
"""
from __future__ import annotations

import argparse
import re
import warnings

from ..errors import LlambdaWarning
from ..thinking import think_template_kwargs

THINK_VALUES = ("true", "false", "high", "medium", "low")
# Go's time.ParseDuration, as ollama parses --keepalive ("5m", "1h30m", "1.5h", "-1m", "0"), and a bare
# integer: seconds, as Ollama's keep_alive field and OLLAMA_KEEP_ALIVE take it ("-1": forever)
_DURATION = re.compile(r"[-+]?(?:0|(?:(?:\d+\.?\d*|\.\d+)(?:ns|us|µs|μs|ms|s|m|h))+|\d+)")


def think_value(text: str) -> str:
    v = text.strip().lower()
    if v not in THINK_VALUES:
        raise argparse.ArgumentTypeError(f"{text!r} is none of {', '.join(THINK_VALUES)}")
    return v


def keepalive_duration(text: str) -> str:
    if not _DURATION.fullmatch(text.strip()):
        raise argparse.ArgumentTypeError(f"{text!r} is no duration: a number and a unit (30s, 5m, 1h, 1h30m), "
                                         "0, or seconds as a bare integer (-1: forever)")
    return text.strip()


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("ollama run's flags")
    g.add_argument("--think", type=think_value, nargs="?", const="true", default=None, metavar="VALUE",
                   help="a chat's thinking: --think (true), --think=false, or a level high, medium, low "
                        "(gpt-oss's reasoning_effort); a template that reads neither ignores it, and `run` "
                        "with a prompt has no template (default: the template's own)")
    g.add_argument("--hidethinking", action="store_true",
                   help="let a reasoning model think but print only its answer (what follows its <think> "
                        "thought; of gpt-oss, its final messages, not the analysis)")
    g.add_argument("--nowordwrap", action="store_true",
                   help="accepted as ollama takes it; llambda never wraps the output (it writes the text as "
                        "generated)")
    g.add_argument("--keepalive", type=keepalive_duration, default=None, metavar="DURATION",
                   help="accepted and checked as ollama takes it (5m, 1h, 30s, 0, -1); it changes nothing "
                        "here: the model is loaded in this command's own process, which ends with the answer")


THINKING_COMMANDS = ("run", "chat")      # the sub-commands that take --think


def bare_think_as_true(argv: list[str]) -> list[str]:
    """A bare `--think` is `--think=true`, as ollama's flag library reads it: the word after it stays the
    model or the prompt (`llambda run --think qwen3 "hi"`), and `--think false` is true, then a word.
    Only for run and chat: another command's error names the `--think` it was given."""
    command = next((w for w in argv if not w.startswith("-")), None)
    if command not in THINKING_COMMANDS:
        return list(argv)
    out, options = [], True
    for w in argv:
        options = options and w != "--"
        out.append("--think=true" if options and w == "--think" else w)
    return out


def template_kwargs(think: str | None, no_think: bool) -> dict:
    """The chat-template variables --think sets (none when it is not given)."""
    if think is None:
        return {}
    if no_think and think != "false":
        raise ValueError(f"--no-think and --think={think} say opposite things: give one")
    return think_template_kwargs(think)


def warn_unused_in_completion(think: str | None) -> None:
    """`run` with a prompt completes the text as written: no chat template for --think to set."""
    if think is not None:
        warnings.warn("--think sets a chat template's thinking; `run` with a prompt completes the text as "
                      "written, without one (a chat does: `llambda chat`, or `run MODEL` at a terminal)",
                      LlambdaWarning)


class ThoughtHider:
    """--hidethinking: the generated text in, the text past its `<think>` thought out (and the blank
    lines after `</think>`); `opened`: the prompt already opened the thought. A thought never closed is
    all hidden. harmony: the model answers in harmony's channels (gpt-oss): out come its final and
    commentary messages' bodies, without their headers; the analysis messages are the thought."""

    def __init__(self, opened: bool, harmony: bool = False):
        from ..server.harmony import HarmonyParser
        from ..server.think import ThinkParser
        self.parser = HarmonyParser() if harmony else ThinkParser(opened=opened)

    def __call__(self, text: str) -> str:
        shown = self.parser.feed(text)[0]
        self.parser.take_reasoning()      # not shown: not kept either
        return shown

    def finish(self) -> str:
        return self.parser.finish()[0]
