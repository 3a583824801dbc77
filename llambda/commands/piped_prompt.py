"""`cat notes.txt | llambda run MODEL "summarize this"`: the piped text goes before the prompt's words,
as `ollama run` sends it (the text as read, final newline included, a space, then the words; an empty
pipe adds nothing). Only a pipe or a file is read: a terminal is the chat's, and a character device
(/dev/null, /dev/zero) or a closed stdin holds no text meant as a prompt."""
from __future__ import annotations

import os
import stat
import sys
from typing import Callable


def stdin_is_piped() -> bool:
    """stdin is a pipe or a regular file (`cat f |`, `< f`)."""
    try:
        mode = os.fstat(sys.stdin.fileno()).st_mode
    except (AttributeError, OSError, ValueError):     # None (`<&-`), or a stand-in with no descriptor
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISREG(mode)


def with_piped_text(words: str, read_stdin: Callable[[], str]) -> str:
    """The prompt of `run`'s words, after what stdin holds when it is piped."""
    if not stdin_is_piped():
        return words
    piped = read_stdin()
    return f"{piped} {words}" if piped else words
