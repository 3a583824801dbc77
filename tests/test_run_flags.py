"""commands/run_flags.bare_think_as_true: the sub-command is found as the parser reads its own options before
it, so a top-level option (and the value it takes) is not taken for the command."""
import argparse

import pytest

from llambda import cli
from llambda.commands.run_flags import bare_think_as_true, top_level_end


def parser_with_top_level_options() -> argparse.ArgumentParser:
    """llambda's parser, with the kinds of top-level option argparse has: a value (separate, attached, after
    '=', abbreviated), a flag, an optional value."""
    ap = cli.build_parser()
    ap.add_argument("--log-level", "-l", default=None)
    ap.add_argument("--quiet", "-q", action="store_true")
    ap.add_argument("--color", nargs="?", const="always")
    return ap


@pytest.mark.parametrize("head", [["--log-level", "debug"], ["--log-level=debug"], ["-l", "debug"], ["-ldebug"],
                                  ["--log", "debug"], ["-q"], ["--quiet", "-l", "run"], ["--color", "-q"],
                                  ["--color", "never"], []])
@pytest.mark.parametrize("command", ["run", "chat"])
def test_a_bare_think_after_top_level_options(head, command):
    ap = parser_with_top_level_options()
    words = ["smollm2-135m", "hi"] if command == "run" else ["smollm2-135m"]     # chat takes a model only
    argv = [*head, command, "--think", *words]
    assert top_level_end(argv, ap) == len(head)
    got = bare_think_as_true(argv, ap)
    assert got == [*head, command, "--think=true", *words]
    a = ap.parse_args(got)
    assert a.cmd == command and a.think == "true"


@pytest.mark.parametrize("argv", [["--log-level", "run", "serve", "--think"],      # run is the option's value
                                  ["-l", "chat", "list", "--think"], ["serve", "--think"],
                                  ["run", "--", "--think"], ["--think"], ["-q"]])
def test_other_commands_and_words_keep_their_think(argv):
    assert bare_think_as_true(argv, parser_with_top_level_options()) == argv


def test_the_real_parser():
    ap = cli.build_parser()
    assert bare_think_as_true(["run", "--think", "m", "hi"], ap) == ["run", "--think=true", "m", "hi"]
    assert bare_think_as_true(["ls", "--think"], ap) == ["ls", "--think"]
