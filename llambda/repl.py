"""`llambda chat`: an interactive conversation at the terminal.

Line editing and a history kept under $LLAMBDA_HOME (readline where Python has it), Ctrl-C stops the
reply being written and keeps the conversation, Ctrl-D or /exit leaves. Input that is not a terminal
is read a message per line (or a triple-quoted block), so a script can pipe a conversation in; Ctrl-C there
ends the chat. Ollama's `/set parameter`, `/set system`, `/set verbose` and `/show` work too.
"""
from __future__ import annotations

import json
import os
import stat
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TextIO

from .errors import InvalidInputError, LlambdaError

HELP = """commands:
  /help, /?          this list
  /exit, /bye        leave (Ctrl-D too)
  /clear             forget the conversation (the system prompt stays)
  /system TEXT       set the system prompt (and forget the conversation; /set system TEXT too)
  /set parameter NAME VALUE   a sampling setting from the next reply on: temperature, top_k, top_p,
                     min_p, seed, num_predict, repeat_penalty, repeat_last_n, presence_penalty,
                     frequency_penalty, stop (its words: the stop strings)
  /set verbose       tokens and speed after each reply (/set quiet: not)
  /show parameters   the sampling settings (/show system: the system prompt; /show info: the model)
  /save FILE         write the conversation as JSON messages
  /load FILE         read a conversation written by /save (or any JSON list of messages)
  /stats             tokens and speed of the last reply
  \"\"\"                start and end a message of several lines (a line ending in \\ continues too;
                     Ctrl-D inside one sends it, then leaves)
Ctrl-C stops the reply being written; the conversation keeps what was said."""

IMAGES_HELP = """
images: name an image file in a message (./cat.png, ~/a.jpg, '/my pics/b.png', /my\\ pics/b.png):
                     PNG, JPEG, WebP, GIF or BMP; it goes with the message, its path taken out of the text"""

MULTILINE = '"""'
LOAD_MAX_BYTES = 64 << 20     # a conversation file; `/load /dev/zero` read until memory ran out
LINE_MAX_CHARS = 16 << 20     # a piped message (~4M tokens, past any context); `chat < /dev/zero` ran out of memory


# `/set parameter NAME`: Ollama's names (and the command line's) -> Model.chat_stream's arguments
PARAMETERS = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p", "seed": "seed",
              "num_predict": "max_tokens", "max_tokens": "max_tokens", "repeat_penalty": "repeat_penalty",
              "repeat_last_n": "repeat_last_n", "presence_penalty": "presence_penalty",
              "frequency_penalty": "frequency_penalty", "stop": "stop"}
INT_PARAMETERS = {"top_k", "seed", "max_tokens", "repeat_last_n"}


def _parameter(name: str, value: str):
    """(argument, value) for `/set parameter NAME VALUE`, checked as a reply would check it; ValueError
    with what to type otherwise."""
    from .engine import GenerationParams
    from .sampling import SamplingParams

    arg = PARAMETERS.get(name.lower().replace("-", "_"))
    if arg is None:
        if name.lower() in ("num_ctx", "num_thread", "num_batch", "num_gpu"):
            raise ValueError(f"{name} is set when the model loads (-c, -t on the command line), not in a chat")
        raise ValueError(f"unknown parameter {name!r}; one of {', '.join(sorted(PARAMETERS))}")
    if arg == "stop":
        return arg, value.split()
    try:
        v = int(value) if arg in INT_PARAMETERS else float(value)
    except ValueError:
        raise ValueError(f"{name} takes {'an integer' if arg in INT_PARAMETERS else 'a number'}, "
                         f"not {value!r}") from None
    if arg == "max_tokens":
        v = None if v < 0 else v         # Ollama's num_predict -1: no limit (the context's end)
        GenerationParams(max_tokens=v).validate()
    else:
        SamplingParams(**{arg: v}).validate()
    return arg, v


@dataclass
class ReplyStats:
    tokens: int = 0
    first_token_s: float = 0.0
    decode_tps: float = 0.0
    stopped: str = ""        # why it ended: "stop", "length", "context" or "interrupted"

    def line(self) -> str:
        return (f"{self.tokens} tokens, first after {self.first_token_s * 1000:.0f} ms, "
                f"{self.decode_tps:.1f} tokens/s, ended by {self.stopped or '?'}")


class ChatSession:
    """The conversation and the commands that change it, apart from any terminal."""

    def __init__(self, model, sampling: dict, system: str | None = None, hide_thinking: bool = False,
                 images: list[bytes] | None = None):
        self.model = model
        self.sampling = sampling
        self.system = system
        self.hide_thinking = hide_thinking      # --hidethinking: a reply is shown without its thought
        self.messages: list[dict] = []
        self.last = ReplyStats()
        self.verbose = False         # each reply's stats on stderr (-v, /set verbose)
        # a vision model's messages may name image files (commands/image_paths.py); --image's go with the first
        self.reads_images = bool(getattr(model, "accepts_images", False))
        self.images = list(images or [])

    def user_message(self, text: str) -> dict:
        """The user's message for `text`: with a vision model, the image files it names (and --image's,
        for the first message) as image parts before the text, their paths taken out of it."""
        found: list[bytes] = []
        if self.reads_images:
            from .commands.image_paths import find_images
            text, found = find_images(text)
        images, self.images = self.images + found, []
        if not images:
            return {"role": "user", "content": text}
        from .commands.image_paths import image_message
        return image_message(text, images)

    def names_an_image(self, line: str) -> bool:
        """Whether a line starting with "/" is a message naming an image file there (/tmp/cat.png ...),
        not a command (as ollama tells them apart)."""
        if not self.reads_images:
            return False
        from .commands.image_paths import starts_with_image
        return starts_with_image(line)

    def history(self) -> list[dict]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.messages

    def reply(self, text: str, write: Callable[[str], None]) -> str:
        """Stream the assistant's answer to `text` through `write`; Ctrl-C ends it early but keeps it."""
        self.messages.append(self.user_message(text))
        stats, out = ReplyStats(), []
        t0 = time.perf_counter()
        first = None
        try:
            events = self.model.chat_stream(self.history(), **self.sampling)
        except LlambdaError:     # refused (e.g. the conversation outgrew the context): no turn was taken
            self.messages.pop()
            raise
        except KeyboardInterrupt:
            # Ctrl-C while the prompt is rendered and tokenized (seconds for a long paste): no turn
            # either, and the chat goes on (it ended it, with the conversation)
            self.messages.pop()
            self.last = ReplyStats(stopped="interrupted")
            return ""
        shown, hider = self._shown(write)
        try:
            for ev in events:
                if ev.token >= 0:
                    stats.tokens += 1
                    first = first or time.perf_counter()
                if ev.text:
                    shown(ev.text)
                    out.append(ev.text)
                if ev.finish_reason:
                    stats.stopped = "context" if ev.context_full else ev.finish_reason
        except KeyboardInterrupt:
            stats.stopped = "interrupted"
        except LlambdaError:
            self.messages.pop()
            raise
        finally:
            events.close()     # free the model for the next turn at once
        if hider is not None:
            write(hider.finish())
        end = time.perf_counter()
        if first is not None:
            stats.first_token_s = first - t0
            if stats.tokens > 1 and end > first:
                stats.decode_tps = (stats.tokens - 1) / (end - first)
        self.last = stats
        answer = "".join(out)
        self.messages.append({"role": "assistant", "content": answer})
        return answer

    def _shown(self, write: Callable[[str], None]):
        """(how the reply's text reaches `write`, the ThoughtHider to finish or None): with hide_thinking,
        only what follows the thought (the conversation keeps the reply as written)."""
        if not self.hide_thinking:
            return write, None
        from .commands.run_flags import ThoughtHider
        from .server.harmony import speaks_harmony
        from .thinking import prompt_opens_thought
        prompt = self.model.render_chat(self.history(), **(self.sampling.get("template_kwargs") or {}))
        hider = ThoughtHider(prompt_opens_thought(prompt), speaks_harmony(self.model))
        return (lambda text: write(hider(text))), hider

    def command(self, line: str) -> str | None:
        """Run a /command; returns what to print, or None to leave."""
        name, _, arg = line.strip().partition(" ")
        arg = arg.strip()
        if name in ("/save", "/load") and arg.startswith("~"):
            arg = os.path.expanduser(arg)     # no shell expands it here: "~/c.json" was "no such directory"
        if name in ("/exit", "/quit", "/bye"):
            return None
        if name in ("/help", "/?"):
            return HELP + (IMAGES_HELP if self.reads_images else "")
        if name == "/set":
            return self._set(arg)
        if name == "/show":
            return self._show(arg)
        if name == "/clear":
            self.messages.clear()
            return "conversation cleared"
        if name == "/system":
            self.system = arg or None
            self.messages.clear()
            return "system prompt " + ("set" if arg else "removed") + "; conversation cleared"
        if name == "/stats":
            return self.last.line() if self.last.tokens or self.last.stopped else "no reply yet"
        if name == "/save":
            if not arg:
                return "usage: /save FILE"
            try:
                saved = [_saved(m) for m in self.history()]
                Path(arg).write_text(json.dumps(saved, ensure_ascii=False, indent=1), encoding="utf-8")
            except (OSError, ValueError) as e:   # ValueError: a NUL in the name, a lone surrogate in the text
                return f"cannot write {arg}: {getattr(e, 'strerror', None) or e}"
            return f"saved {len(self.messages)} messages to {arg}"
        if name == "/load":
            if not arg:
                return "usage: /load FILE"
            from .hub import catalogued_name
            if catalogued_name(arg) is not None and not os.path.lexists(arg):
                # Ollama's `/load MODEL` switches models: here it was "cannot read NAME: No such file"
                return (f"/load reads a conversation file; to talk to {catalogued_name(arg)}, leave (/bye) and "
                        f"run `llambda chat {catalogued_name(arg)}`")
            return self._load(arg)
        return f"unknown command {name}; /help lists them"

    def _set(self, arg: str) -> str:
        what, _, rest = arg.partition(" ")
        rest = rest.strip()
        if what == "parameter":
            name, _, value = rest.partition(" ")
            if not value.strip():
                return "usage: /set parameter NAME VALUE (/show parameters lists them)"
            try:
                key, v = _parameter(name, value.strip())
            except ValueError as e:
                return str(e)
            self.sampling[key] = v
            return f"set {name} to {v}"
        if what == "system":
            return self.command(f"/system {rest}")
        if what in ("verbose", "quiet"):
            self.verbose = what == "verbose"
            return f"stats after each reply {'on' if self.verbose else 'off'}"
        return "usage: /set parameter NAME VALUE, /set system TEXT, /set verbose or /set quiet"

    def _show(self, arg: str) -> str:
        if arg == "parameters":
            keys = sorted(set(PARAMETERS.values()) & self.sampling.keys())
            return "\n".join(f"{k:<18} {self.sampling[k]}" for k in keys) or "the model's defaults"
        if arg == "system":
            return self.system or "no system prompt"
        if arg == "info":
            m, c = self.model, getattr(self.model, "config", None)
            return (f"{getattr(m, 'name', '?')}: {getattr(c, 'arch', '?')}, context {getattr(m, 'n_ctx', '?')} "
                    f"tokens, {len(self.messages)} messages so far")
        return "usage: /show parameters, /show system or /show info"

    def _load(self, path: str) -> str:
        try:
            # a regular file, read bounded: a FIFO hung the chat, /dev/zero filled the memory
            with open(path, "rb", opener=lambda p, flags: os.open(p, flags | os.O_NONBLOCK)) as f:
                if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                    return f"cannot read {path}: not a regular file"
                raw = f.read(LOAD_MAX_BYTES + 1)
            if len(raw) > LOAD_MAX_BYTES:
                return f"cannot read {path}: more than {LOAD_MAX_BYTES} bytes, no conversation file"
            data = json.loads(raw.decode("utf-8"))
        except RecursionError:      # "[[[[..." nested past the interpreter's stack: once a traceback out of chat
            return f"cannot read {path}: JSON nested too deeply"
        except (OSError, ValueError) as e:
            return f"cannot read {path}: {getattr(e, 'strerror', None) or e}"
        ok = isinstance(data, list) and all(
            isinstance(m, dict) and m.get("role") in ("system", "user", "assistant") and isinstance(m.get("content"), str)
            for m in data)
        if not ok:
            return f"{path}: expected a JSON list of {{role, content}} messages"
        try:
            messages = [_loaded(m, self.reads_images) for m in data]
        except ValueError as e:
            return f"{path}: {e}"
        system = [m["content"] for m in messages if m["role"] == "system"]
        self.system = system[0] if system else self.system
        self.messages = [m for m in messages if m["role"] != "system"]
        return f"loaded {len(self.messages)} messages from {path}"


def _saved(message: dict) -> dict:
    """A message as /save writes it: a message with images as Ollama's (its text, `images` in base64)."""
    content = message["content"]
    if isinstance(content, str):
        return message
    import base64
    text = "\n".join(p["text"] for p in content if p["type"] == "text")
    return {"role": message["role"], "content": text,
            "images": [base64.b64encode(p["image"]).decode() for p in content if p["type"] == "image"]}


def _loaded(message: dict, reads_images: bool) -> dict:
    """A message /load read (role and content checked), its `images` (base64, as /save writes them) as
    image parts; ValueError for images a text model cannot take, or that are not base64 (ImageDataError, a
    ValueError: vision.base64_text's refusals, the server's too)."""
    out = {"role": message["role"], "content": message["content"]}
    images = message.get("images")
    if not images:
        return out
    if not reads_images:
        raise ValueError("the conversation holds images, and this model takes none (it has no vision tower)")
    if not isinstance(images, list):        # (a dict's keys were read)
        raise ValueError("'images' must be a list of base64 strings")
    from .vision.base64_text import decode_image_base64     # the server's decoder: the same text taken, the same refused
    data = [decode_image_base64(text, f"'images'[{i}]") for i, text in enumerate(images)]
    from .commands.image_paths import image_message
    from .vision.image import check_image
    for i, d in enumerate(data):
        # checked as an image file named in a message is: one kept in the conversation failed every message after
        try:
            check_image(d)
        except InvalidInputError as e:
            raise ValueError(f"'images'[{i}] is no image this model reads: {e}") from None
    return dict(image_message(out["content"], data), role=out["role"])


def _setup_readline(history_file: Path | None):
    """Line editing and a persisted history where the platform has readline; returns a save function."""
    try:
        import readline
    except ImportError:
        return lambda: None
    if history_file is None:
        return lambda: None
    try:
        readline.read_history_file(history_file)
    except OSError:
        pass
    readline.set_history_length(1000)

    def save():
        try:
            history_file.parent.mkdir(parents=True, exist_ok=True)
            readline.write_history_file(history_file)
        except OSError:
            pass          # a read-only home loses the history, not the chat
    return save


class UnfinishedMessage(EOFError):
    """The input ended inside a \"\"\" block or after a line ending in a backslash: `text` is the message
    typed so far, which the chat sends before it ends (Ollama's terminal chat drops it; a script's
    last block with no closing quotes was lost without a word)."""

    def __init__(self, text: str):
        super().__init__("the input ended inside a message")
        self.text = text


def read_message(prompt: Callable[[str], str]) -> str:
    """One user message: a line, lines joined by a trailing backslash, or a \"\"\"-fenced block."""
    line = prompt(">>> ")
    if line.strip().startswith(MULTILINE):
        first = line.strip()[len(MULTILINE):]
        if first.endswith(MULTILINE):                       # """one line"""
            return first[:-len(MULTILINE)]
        lines = [first] if first else []
        while True:
            nxt = _continued(prompt, lines)
            if nxt.rstrip().endswith(MULTILINE):
                lines.append(nxt.rstrip()[:-len(MULTILINE)])
                return "\n".join(lines).strip("\n")
            lines.append(nxt)
    lines = []
    while line.endswith("\\"):
        lines.append(line[:-1])
        line = _continued(prompt, lines)
    lines.append(line)
    return "\n".join(lines)


def _continued(prompt: Callable[[str], str], lines: list[str]) -> str:
    """The next line of a message of several; UnfinishedMessage with `lines` where the input ends."""
    try:
        return prompt("... ")
    except EOFError:
        raise UnfinishedMessage("\n".join(lines).strip("\n")) from None


def run_chat(session: ChatSession, banner: str, history_file: Path | None, verbose: bool = False,
             stdin: TextIO | None = None, stdout: TextIO | None = None) -> int:
    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout
    interactive = stdin.isatty() and stdout.isatty()

    def write(text: str) -> None:
        stdout.write(text)
        stdout.flush()

    session.verbose = session.verbose or verbose
    if not interactive:
        # a message per line, or a """ block (or lines ending in \\) as at the terminal; no prompts, no banner
        def next_line(_prompt: str) -> str:
            line = stdin.readline(LINE_MAX_CHARS + 1)
            if not line:
                raise EOFError
            if len(line) > LINE_MAX_CHARS and not line.endswith("\n"):
                raise LlambdaError(f"a message on stdin is longer than {LINE_MAX_CHARS} characters")
            return line.rstrip("\n")

        last = False
        while not last:
            try:
                text = read_message(next_line)
            except UnfinishedMessage as e:      # the script ended inside a message: sent, then the chat ends
                text, last = e.text, True
            except EOFError:
                return 0
            if not text.strip():
                continue
            if text.startswith("/") and not session.names_an_image(text):
                said = session.command(text)
                if said is None:
                    return 0
                print(said, file=sys.stderr)
                continue
            session.reply(text, write)
            write("\n")
            if session.last.stopped == "interrupted":
                # Ctrl-C in a script's chat ends it (status 130), where it once went on to the next line
                raise KeyboardInterrupt
            if session.verbose:
                print(f"[llambda] {session.last.line()}", file=sys.stderr)
        return 0

    save_history = _setup_readline(history_file)
    print(banner, file=stdout, flush=True)
    try:
        last = False
        while not last:
            try:
                text = read_message(input)
            except KeyboardInterrupt:
                write("\n(Ctrl-D or /exit to leave)\n")
                continue
            except UnfinishedMessage as e:      # Ctrl-D inside a message: it is sent, then the chat ends
                write("\n")
                text, last = e.text, True
            except EOFError:
                write("\n")
                return 0
            except UnicodeDecodeError:     # bytes that are no UTF-8 (a strict locale): once the chat ended
                write("(that input is not valid UTF-8; nothing was sent)\n")
                continue
            if not text.strip():
                continue
            if text.startswith("/") and not session.names_an_image(text):
                said = session.command(text)
                if said is None:
                    return 0
                write(said + "\n")
                continue
            try:
                session.reply(text, write)
            except LlambdaError as e:    # the conversation outgrew the context, ...: it ended the chat
                write(f"\n[error: {e}; the message was not added, /clear starts over]\n")
                continue
            if session.last.stopped == "interrupted":
                write(" [stopped]")
            elif session.last.stopped == "context":
                write("\n[the context is full: /clear to start over]")
            write("\n")
            if session.verbose:
                print(f"[llambda] {session.last.line()}", file=sys.stderr)
        return 0
    finally:
        save_history()
