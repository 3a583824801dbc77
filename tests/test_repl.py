"""`llambda chat`: the conversation and its commands (a fake model), and the real REPL on a terminal."""
from __future__ import annotations

import fcntl
import io
import json
import os
import pty
import select
import signal
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from llambda.engine import TokenEvent
from llambda.repl import ChatSession, read_message, run_chat


class FakeModel:
    """Answers every turn with the words of `reply`; remembers the history it was given."""

    def __init__(self, reply="one two three", interrupt_after=None):
        self.reply, self.interrupt_after, self.seen, self.closed = reply, interrupt_after, [], 0

    def chat_stream(self, messages, **kw):
        self.seen.append([dict(m) for m in messages])
        return self._events()

    def _events(self):
        try:
            for i, w in enumerate(self.reply.split()):
                if self.interrupt_after is not None and i == self.interrupt_after:
                    raise KeyboardInterrupt
                yield TokenEvent(i, w + " ")
            yield TokenEvent(-1, "", finish_reason="stop")
        finally:
            self.closed += 1


def test_turns_keep_history_and_system_prompt():
    m = FakeModel()
    s = ChatSession(m, {}, system="be brief")
    out = []
    assert s.reply("hi", out.append) == "one two three "
    s.reply("again", out.append)
    assert m.seen[1] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                         {"role": "assistant", "content": "one two three "}, {"role": "user", "content": "again"}]
    assert s.last.tokens == 3 and s.last.stopped == "stop"


def test_ctrl_c_stops_the_reply_and_keeps_the_conversation():
    m = FakeModel("a b c d e", interrupt_after=2)
    s = ChatSession(m, {})
    assert s.reply("go", lambda t: None) == "a b "
    assert s.last.stopped == "interrupted" and m.closed == 1       # the generation was closed at once
    assert s.messages[-1] == {"role": "assistant", "content": "a b "}
    m.interrupt_after = None
    s.reply("more", lambda t: None)
    assert len(m.seen[-1]) == 3


def test_commands(tmp_path):
    s = ChatSession(FakeModel(), {})
    s.reply("hi", lambda t: None)
    assert "/system" in s.command("/help")
    f = tmp_path / "conv.json"
    assert "saved 2" in s.command(f"/save {f}")
    assert json.loads(f.read_text())[0] == {"role": "user", "content": "hi"}
    assert s.command("/clear") == "conversation cleared" and s.messages == []
    assert "loaded 2" in s.command(f"/load {f}") and len(s.messages) == 2
    assert "cleared" in s.command("/system talk like a pirate") and s.system == "talk like a pirate"
    assert s.history()[0]["role"] == "system" and s.messages == []
    assert "unknown command" in s.command("/nope")
    assert "cannot read" in s.command(f"/load {tmp_path / 'missing.json'}")
    f.write_text('{"not": "a list"}')
    assert "expected a JSON list" in s.command(f"/load {f}")
    f.write_text("[" * 100_000 + "]" * 100_000)
    assert "nested too deeply" in s.command(f"/load {f}")
    assert "cannot write" in s.command(f"/save {tmp_path / 'no' / 'such' / 'dir.json'}")
    assert s.command("/exit") is None and s.command("/bye") is None


def test_multiline_input():
    def lines(*xs):
        it = iter(xs)
        return lambda prompt: next(it)
    assert read_message(lines('"""', "first", "", "second", '"""')) == "first\n\nsecond"
    assert read_message(lines('"""inline"""')) == "inline"
    assert read_message(lines("a \\", "b")) == "a \nb"
    assert read_message(lines("plain")) == "plain"


def test_piped_input_is_a_turn_per_line():
    m = FakeModel()
    out = io.StringIO()
    stdin = io.StringIO("hello\n\n/system short\nsecond\n/exit\nnever\n")
    assert run_chat(ChatSession(m, {}), "banner", None, stdin=stdin, stdout=out) == 0
    assert out.getvalue() == "one two three \none two three \n"       # no banner, no prompt when piped
    assert [len(x) for x in m.seen] == [1, 2] and m.seen[1][0]["role"] == "system"


class Terminal:
    """The master side of a pty: `expect` waits for text and consumes the output up to its end, keeping
    what came after it for the next call (a prompt often arrives in the same read as the text before it)."""

    def __init__(self, fd: int, proc):
        self.fd, self.proc, self.buf = fd, proc, b""

    def expect(self, needle: bytes, timeout: float) -> bytes:
        t0 = time.monotonic()
        while needle not in self.buf:
            left = timeout - (time.monotonic() - t0)
            if left <= 0:
                raise AssertionError(f"did not see {needle!r} in {self.buf[-2000:]!r} (child: {self.proc.poll()})")
            r, _, _ = select.select([self.fd], [], [], left)
            if not r:
                continue
            try:
                chunk = os.read(self.fd, 4096)
            except OSError:
                chunk = b""
            if not chunk:
                raise AssertionError(f"the terminal closed before {needle!r}: {self.buf[-2000:]!r} "
                                     f"(child: {self.proc.poll()})")
            self.buf += chunk
        at = self.buf.index(needle) + len(needle)
        seen, self.buf = self.buf[:at], self.buf[at:]
        return seen

    def send(self, data: bytes) -> None:
        os.write(self.fd, data)


def _controlling_terminal():
    """In the child: its own session with the pty (fd 0) as controlling terminal, so Ctrl-C is a SIGINT,
    and SIGINT's default action, as a shell in a terminal gives a program. A test run started as a
    background job of a shell without job control (`cmd &` in a script) ignores SIGINT, the child would
    inherit that, and Python then keeps it ignored: the reply ran on through Ctrl-C (three clean-clone
    runs, SigIgn 0x1001007 in the child)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def _signal_state(pid: int) -> str:
    """The Sig* lines of each of the process's threads (/proc), hex masks with SIGINT as bit 1."""
    out = []
    for status in sorted(Path(f"/proc/{pid}/task").glob("*/status")):
        try:
            lines = status.read_text().splitlines()
        except OSError:
            continue
        out.append(status.parent.name + ": " + " ".join(ln.replace("\t", "") for ln in lines
                                                        if ln.startswith(("SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt"))))
    return "; ".join(out)


def test_real_terminal_ctrl_c_stops_a_reply_and_history_is_kept(smollm2_gguf, tmp_path):
    env = dict(os.environ, LLAMBDA_HOME=str(tmp_path), PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "llambda.cli", "chat", "-m", str(smollm2_gguf), "-n", "2000",
                             "--ignore-eos", "-c", "2048"], stdin=slave, stdout=slave, stderr=slave, env=env,
                            preexec_fn=_controlling_terminal)
    os.close(slave)
    term = Terminal(master, proc)
    try:
        term.expect(b">>> ", 120)
        term.send(b"Tell me a very long story.\r")
        term.expect(b"Tell me a very long story.", 10)
        time.sleep(1.0)
        isig = bool(termios.tcgetattr(master)[3] & termios.ISIG)     # the line discipline makes ^C a SIGINT
        term.send(b"\x03")                  # Ctrl-C, as the terminal sends it
        try:
            term.expect(b"[stopped]", 30)
        except AssertionError as e:         # what the child did with the signal: ignored, blocked, pending, caught
            raise AssertionError(f"{e}; ISIG {isig}; child {_signal_state(proc.pid)}") from None
        term.expect(b">>> ", 10)
        assert proc.poll() is None           # the chat goes on
        term.send(b"/stats\r")
        term.expect(b"ended by interrupted", 10)
        term.expect(b">>> ", 10)
        term.send(b"\x04")                  # Ctrl-D leaves
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    assert "Tell me a very long story." in (tmp_path / "chat_history").read_text()


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_a_turn_the_model_refuses_keeps_the_chat_and_the_conversation(monkeypatch):
    from llambda.errors import ContextOverflowError

    class Full(FakeModel):          # a context that holds two messages
        def chat_stream(self, messages, **kw):
            if len(messages) > 2:
                raise ContextOverflowError(f"the prompt has {len(messages)} messages; the context holds 2")
            return super().chat_stream(messages, **kw)

    typed = iter(["hello", "too much now", "/stats"])

    def fake_input(prompt):
        try:
            return next(typed)
        except StopIteration:
            raise EOFError from None

    monkeypatch.setattr("builtins.input", fake_input)
    s, out = ChatSession(Full(), {}), _Tty()
    assert run_chat(s, "banner", None, stdin=_Tty(), stdout=out) == 0     # once: the error ended the chat
    assert "context holds 2" in out.getvalue() and "/clear starts over" in out.getvalue()
    assert s.messages == [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "one two three "}]


def test_load_and_save_refuse_odd_files_without_ending_the_chat(tmp_path):
    s = ChatSession(FakeModel(), {})
    s.reply("hi \udcff", lambda t: None)            # a byte of no UTF-8, as a C locale reads it
    assert "cannot write" in s.command(f"/save {tmp_path / 'x.json'}")       # was a UnicodeEncodeError
    assert "cannot write" in s.command(f"/save {tmp_path / 'a'}\x00b")      # was "embedded null byte"
    assert "not a regular file" in s.command("/load /dev/zero")             # was read until out of memory
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert "not a regular file" in s.command(f"/load {fifo}")               # was a hang (no writer)
    assert len(s.messages) == 2


def test_save_and_load_expand_the_home_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    s = ChatSession(FakeModel(), {})
    s.reply("hi", lambda t: None)
    assert "saved 2" in s.command("/save ~/conv.json")           # was: cannot write ~/conv.json: No such file
    assert json.loads((tmp_path / "conv.json").read_text())[0]["content"] == "hi"
    s.command("/clear")
    assert "loaded 2" in s.command("/load ~/conv.json") and len(s.messages) == 2


def test_a_piped_line_that_never_ends_is_refused(monkeypatch):
    # `chat < /dev/zero` read one endless line until memory ran out
    import llambda.repl as repl
    from llambda.errors import LlambdaError
    monkeypatch.setattr(repl, "LINE_MAX_CHARS", 100)
    m = FakeModel()
    ok = "x" * 100 + "\n"                          # at the limit: still a turn
    with pytest.raises(LlambdaError, match="longer than 100 characters"):
        run_chat(ChatSession(m, {}), "banner", None, stdin=io.StringIO(ok + "y" * 10_000), stdout=io.StringIO())
    assert len(m.seen) == 1 and m.seen[0][0]["content"] == "x" * 100


def test_ctrl_c_before_the_reply_starts_keeps_the_chat(monkeypatch):
    class SlowStart(FakeModel):      # Ctrl-C while the prompt is prepared, before any event
        def chat_stream(self, messages, **kw):
            if messages[-1]["content"] == "long paste":
                raise KeyboardInterrupt
            return super().chat_stream(messages, **kw)

    typed = iter(["long paste", "hi"])
    monkeypatch.setattr("builtins.input", lambda prompt: next(typed))
    s, out = ChatSession(SlowStart(), {}), _Tty()
    try:
        run_chat(s, "banner", None, stdin=_Tty(), stdout=out)
    except StopIteration:                   # the chat went on to ask for the next message
        pass
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C before the reply started ended the chat")
    assert "[stopped]" in out.getvalue()
    assert s.messages == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "one two three "}]


class _Recording(FakeModel):
    def chat_stream(self, messages, **kw):
        self.kw = kw
        return super().chat_stream(messages, **kw)


def test_set_parameter_and_show_as_in_ollama():
    # `/set parameter temperature 0` was "unknown command /set"
    m = _Recording()
    s = ChatSession(m, {"temperature": 0.8, "max_tokens": 256, "stop": []})
    assert s.command("/set parameter temperature 0") == "set temperature to 0.0"
    assert s.command("/set parameter num_predict 7").startswith("set num_predict")
    assert s.command("/set parameter stop END ###").startswith("set stop")
    s.command("/set parameter seed 3")
    s.reply("hi", lambda t: None)
    assert (m.kw["temperature"], m.kw["max_tokens"], m.kw["stop"], m.kw["seed"]) == (0.0, 7, ["END", "###"], 3)
    s.command("/set parameter num_predict -1")            # Ollama's "no limit"
    s.reply("hi", lambda t: None)
    assert m.kw["max_tokens"] is None
    assert "top_p must be <= 1.0" in s.command("/set parameter top_p 2")
    assert "takes an integer" in s.command("/set parameter top_k 0.5")
    assert "unknown parameter 'mirostat'" in s.command("/set parameter mirostat 1")
    assert "when the model loads" in s.command("/set parameter num_ctx 8192")
    assert s.command("/set parameter temperature").startswith("usage")
    assert s.sampling["temperature"] == 0.0 and "top_p" not in s.sampling     # refused values change nothing
    assert "temperature" in s.command("/show parameters") and "0.0" in s.command("/show parameters")
    assert "cleared" in s.command("/set system be brief") and s.system == "be brief"
    assert s.command("/show system") == "be brief"
    assert s.command("/?") == s.command("/help")


def test_set_verbose_prints_each_replys_stats(capsys):
    s = ChatSession(FakeModel(), {})
    assert "on" in s.command("/set verbose")
    run_chat(s, "banner", None, stdin=io.StringIO("hi\n/set quiet\nagain\n"), stdout=io.StringIO())
    assert capsys.readouterr().err.count("[llambda] 3 tokens") == 1


def test_piped_input_takes_multiline_messages():
    # a piped \"\"\" block was sent line by line, the quotes as messages of their own
    m = FakeModel()
    stdin = io.StringIO('"""\nfirst line\nsecond line\n"""\nnext\n')
    assert run_chat(ChatSession(m, {}), "banner", None, stdin=stdin, stdout=io.StringIO()) == 0
    assert [x[-1]["content"] for x in m.seen] == ["first line\nsecond line", "next"]


def test_ctrl_c_ends_a_piped_chat():
    # the reply stopped and the chat went on to the script's next line (exit status 0)
    m = FakeModel("a b c d", interrupt_after=2)
    with pytest.raises(KeyboardInterrupt):
        run_chat(ChatSession(m, {}), "banner", None, stdin=io.StringIO("go\nnext\n"), stdout=io.StringIO())
    assert len(m.seen) == 1


def test_load_with_a_model_name_says_how_to_switch(tmp_path, monkeypatch):
    # Ollama's `/load MODEL` switches models; here it read "cannot read qwen2.5-coder-0.5b: No such file"
    monkeypatch.chdir(tmp_path)
    s = ChatSession(FakeModel(), {})
    assert "llambda chat qwen2.5-coder-0.5b" in s.command("/load qwen2.5-coder-0.5b:latest")
    assert "cannot read" in s.command("/load conversation.json")


@pytest.mark.parametrize("script, sent", [('hi\n"""\nfirst line\nsecond line\n', "first line\nsecond line"),
                                          ("hi\nsome \\\n", "some ")])
def test_input_that_ends_inside_a_message_sends_it_then_leaves(script, sent):
    # a script's last \"\"\" block (or backslash line) with no end was dropped without a word
    m = FakeModel()
    out = io.StringIO()
    assert run_chat(ChatSession(m, {}), "banner", None, stdin=io.StringIO(script), stdout=out) == 0
    assert [x[-1]["content"] for x in m.seen] == ["hi", sent]
    assert out.getvalue() == "one two three \n" * 2


def test_ctrl_d_inside_a_block_at_the_terminal_sends_it(monkeypatch):
    # input() raises EOFError for Ctrl-D on an empty line; the terminal chat dropped the open block
    lines = iter(['"""', "typed so far"])

    def fake_input(prompt=""):
        try:
            return next(lines)
        except StopIteration:
            raise EOFError from None

    class Tty(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr("builtins.input", fake_input)
    m, out = FakeModel(), Tty()
    assert run_chat(ChatSession(m, {}), "banner", None, stdin=Tty(), stdout=out) == 0
    assert [x[-1]["content"] for x in m.seen] == ["typed so far"] and "one two three" in out.getvalue()


class ThinkingModel(FakeModel):
    """A reasoning model: its template ends the prompt with `opens` (Qwen3's `<think>\\n` when it opens the
    thought itself)."""

    def __init__(self, reply, opens=""):
        super().__init__(reply)
        self.opens = opens

    def render_chat(self, messages, **template_kwargs):
        return "<|im_start|>assistant\n" + self.opens


@pytest.mark.parametrize("reply, opens", [("<think> the user greets </think> Hello there", ""),
                                          ("the user greets </think> Hello there", "<think>\n")])
def test_hidethinking_shows_the_answer_and_keeps_the_reply(reply, opens):
    # --hidethinking: the thought was printed with the answer
    out = io.StringIO()
    s = ChatSession(ThinkingModel(reply, opens), {}, hide_thinking=True)
    assert run_chat(s, "banner", None, stdin=io.StringIO("hi\n"), stdout=out) == 0
    assert out.getvalue() == "Hello there \n"
    assert s.messages[-1]["content"] == " ".join(reply.split()) + " "     # the conversation: as generated
    out = io.StringIO()
    run_chat(ChatSession(ThinkingModel(reply, opens), {}), "banner", None, stdin=io.StringIO("hi\n"), stdout=out)
    assert "the user greets" in out.getvalue()
