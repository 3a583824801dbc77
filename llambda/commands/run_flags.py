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


def bare_think_as_true(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """A bare `--think` is `--think=true`, as ollama's flag library reads it: the word after it stays the
    model or the prompt (`llambda run --think qwen3 "hi"`), and `--think false` is true, then a word.
    Only for run and chat (or an alias of theirs): another command's error names the `--think` it was
    given. The command is found as `parser` reads its own options before it (top_level_end)."""
    at = top_level_end(argv, parser)
    subs = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    if at >= len(argv) or subs is None:
        return list(argv)
    command = subs.choices.get(argv[at])
    if command is None or all(command is not subs.choices.get(c) for c in THINKING_COMMANDS):
        return list(argv)
    out, options = list(argv[:at + 1]), True
    for w in argv[at + 1:]:
        options = options and w != "--"
        out.append("--think=true" if options and w == "--think" else w)
    return out


def top_level_end(argv: list[str], parser: argparse.ArgumentParser) -> int:
    """The index of the sub-command's word: past `parser`'s own options and the values they take (an option
    given as --name=value, a long option abbreviated as argparse allows, a value attached to a short one),
    or after a `--`; len(argv) when there is none. An unknown option is one word (argparse refuses it later)."""
    longs = [o for o in parser._option_string_actions if o.startswith("--")]
    i = 0
    while i < len(argv):
        w = argv[i]
        if w == "--":
            return i + 1
        if not w.startswith("-") or w == "-":
            return i
        name, eq, _ = w.partition("=")
        action = parser._option_string_actions.get(name)
        if action is None and name.startswith("--") and parser.allow_abbrev:
            near = [o for o in longs if o.startswith(name)]
            action = parser._option_string_actions[near[0]] if len(near) == 1 else None
        attached = bool(eq)
        if action is None and not w.startswith("--") and len(w) > 2:    # -xVALUE, or short flags run together
            action, attached = parser._option_string_actions.get(w[:2]), True
        i += 1
        if action is None or attached:
            continue
        nargs = action.nargs
        if nargs is None:
            nargs = 1
        if isinstance(nargs, int):
            i += nargs
        elif nargs in ("?", "*", "+"):      # argparse takes what does not look like an option (greedy)
            while i < len(argv) and not argv[i].startswith("-"):
                i += 1
                if nargs == "?":
                    break
    return len(argv)


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
