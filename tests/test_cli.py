"""The command line as a user runs it."""
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import llambda


def run_cli(*args, input=None, timeout=300):
    # no input: an empty stdin, not the test runner's (`run MODEL WORDS` reads a piped one, as ollama does)
    return subprocess.run([sys.executable, "-m", "llambda.cli", *args], capture_output=True, text=True,
                          input=input if input is not None else "", timeout=timeout)


def test_run_streams_a_greedy_completion(smollm2_gguf):
    out = run_cli("run", "-m", str(smollm2_gguf), "--temperature", "0", "--max-tokens", "8", "-v",
                  "The capital of France is")
    assert out.returncode == 0, out.stderr
    assert "Paris" in out.stdout
    assert "memory:" in out.stderr and "tokens/s" in out.stderr


def test_chat_keeps_history(smollm2_gguf):
    # exact mode: the fast mode's 8-bit rounding flips this prompt's first-token near-tie (margin 0.08)
    out = run_cli("chat", "-m", str(smollm2_gguf), "--activations", "f32", "--temperature", "0", "--max-tokens", "12",
                  input="What is the capital of France?\nAnd of Italy?\n")
    assert out.returncode == 0, out.stderr
    assert "Paris" in out.stdout and "Rome" in out.stdout


def test_chat_on_a_base_model_is_a_clear_error(gemma3_gguf):
    out = run_cli("chat", "-m", str(gemma3_gguf), input="hi\n")
    assert out.returncode == 1
    assert "no chat template" in out.stderr and "Traceback" not in out.stderr


def test_missing_model_is_a_clear_error(tmp_path):
    out = run_cli("run", "-m", str(tmp_path / "nope.gguf"), "hi")
    assert out.returncode == 1 and "no model file" in out.stderr and "Traceback" not in out.stderr


def test_corrupt_model_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\xff" * 64)
    out = run_cli("run", "-m", str(bad), "hi")
    assert out.returncode == 1 and "Traceback" not in out.stderr and "error" in out.stderr


def test_tokenize(smollm2_gguf):
    out = run_cli("tokenize", "-m", str(smollm2_gguf), "--ids", "The capital of France is")
    assert out.returncode == 0 and out.stdout.strip() == "[504, 3575, 282, 4649, 314]"


def test_same_seed_same_text(smollm2_gguf):
    with llambda.load(smollm2_gguf, n_ctx=128) as m:
        a = m.complete("Once upon a time", max_tokens=16, temperature=0.9, seed=7)
        b = m.complete("Once upon a time", max_tokens=16, temperature=0.9, seed=7)
        c = m.complete("Once upon a time", max_tokens=16, temperature=0.9, seed=8)
    assert a == b and a != c


def test_prompt_longer_than_context_is_an_error(smollm2_gguf):
    with llambda.load(smollm2_gguf, n_ctx=32) as m:
        with pytest.raises(llambda.ContextOverflowError):
            m.complete("word " * 100, max_tokens=4)


def test_generation_stops_at_context_end(smollm2_gguf):
    with llambda.load(smollm2_gguf, n_ctx=16) as m:
        evs = list(m.stream([504, 3575, 282, 4649, 314], max_tokens=100, temperature=0, ignore_eos=True))
    assert evs[-1].finish_reason == "length"
    assert sum(1 for e in evs if e.token >= 0) == 16 - 5


def test_stop_strings_end_generation(smollm2_gguf):
    with llambda.load(smollm2_gguf, n_ctx=128) as m:
        evs = list(m.stream("The capital of France is", max_tokens=32, temperature=0, stop=["."]))
    text = "".join(e.text for e in evs)
    assert evs[-1].finish_reason == "stop" and "." not in text and "Paris" in text


def _serve_with_fake_load(monkeypatch, argv: list[str], image_width: int | None = None) -> dict:
    """Run `llambda serve ARGV` with load() and serve() faked; returns what they were given. image_width: the fake
    model takes images, rows this wide."""
    import llambda.api
    import llambda.server
    from llambda.cli import build_parser

    seen = {}

    class FakeModel:
        name, n_ctx = "fake", 64
        config = type("C", (), {"arch": "llama"})()
        backend = type("B", (), {"name": "native"})()
        accepts_images = image_width is not None
        transformer = type("T", (), {"image_width": image_width})()

        def memory_report(self):
            return {"weights": 0}

        def close(self):
            seen["closed"] = True

    def fake_load(name, **kw):
        seen["load"] = (name, kw)
        return FakeModel()

    monkeypatch.setattr(llambda.api, "load", fake_load)
    monkeypatch.setattr(llambda.server, "serve", lambda model, cfg, log_level: seen.setdefault("cfg", cfg) and 0)
    # the port is not bound (a server of someone else's on 8080 must not fail these)
    monkeypatch.setattr(llambda.server.guard, "listening_socket", lambda host, port: __import__("io").StringIO())
    a = build_parser().parse_args(["serve", *argv])
    a.fn(a)
    return seen


def test_serve_passes_the_model_options_to_load(monkeypatch):
    # every option `serve` shares with run/chat reaches the loader (--kv-type was once dropped)
    seen = _serve_with_fake_load(monkeypatch, ["-m", "some.gguf", "--kv-type", "f32", "--activations", "f32",
                                               "-t", "2", "-c", "512", "--parallel", "3"])
    name, kw = seen["load"]
    assert name == "some.gguf"
    assert kw["kv_type"] == "f32" and kw["activations"] == "f32" and kw["threads"] == 2
    assert kw["n_ctx"] == 512 and kw["n_slots"] == 3 + 1      # a spare slot for /v1/embeddings
    assert seen["cfg"].parallel == 3 and seen["closed"]


def test_serve_defaults_to_an_f16_kv_cache(monkeypatch):
    # the server's own default (as llama-server's); `run` and the library keep f32
    from llambda.cli import build_parser
    _, kw = _serve_with_fake_load(monkeypatch, ["-m", "some.gguf"])["load"]
    assert kw["kv_type"] == "f16"
    assert build_parser().parse_args(["run", "hi"]).kv_type is None


@pytest.mark.parametrize("flags, words", [
    (["--port", "70000"], "--port must be 0-65535"), (["--port", "-1"], "--port must be 0-65535"),
    (["--shutdown-grace", "nan"], "--shutdown-grace must be"),
    (["--shutdown-grace", "inf"], "--shutdown-grace must be"),
    (["--shutdown-grace", "-5"], "--shutdown-grace must be"),
    (["--stored-responses", "-1"], "--stored-responses and --stored-bytes must be >= 0"),
    (["--stored-bytes", "-1"], "--stored-responses and --stored-bytes must be >= 0"),
    (["--image-rows-memory", "0"], "--image-rows-memory must be >= 1")])
def test_serve_refuses_bad_port_and_grace_before_loading(monkeypatch, flags, words):
    # these once reached bind() (OverflowError traceback) or crashed the shutdown on SIGTERM; now they
    # are refused before the model loads (a load here raises AssertionError, which pytest.raises lets through)
    import llambda.api
    from llambda.cli import build_parser

    def no_load(*args, **kw):
        raise AssertionError("the model was loaded before the options were checked")

    monkeypatch.setattr(llambda.api, "load", no_load)
    a = build_parser().parse_args(["serve", "-m", "some.gguf", *flags])
    with pytest.raises(ValueError, match=words):
        a.fn(a)


def test_serve_prints_an_ipv6_address_in_brackets(monkeypatch, capsys):
    # "http://::1:8080/v1" was printed: no browser or client takes that URL
    _serve_with_fake_load(monkeypatch, ["-m", "some.gguf", "--host", "::1", "--port", "8080"])
    err = capsys.readouterr().err
    assert "http://[::1]:8080/v1 " in err and "chat page at http://[::1]:8080/" in err, err
    _serve_with_fake_load(monkeypatch, ["-m", "some.gguf", "--host", "127.0.0.1", "--port", "8080"])
    assert "http://127.0.0.1:8080/v1 " in capsys.readouterr().err


def test_serve_accepts_edge_port_and_grace(monkeypatch):
    seen = _serve_with_fake_load(monkeypatch, ["-m", "some.gguf", "--port", "65535", "--shutdown-grace", "0"])
    assert seen["cfg"].port == 65535 and seen["cfg"].shutdown_grace == 0


def test_serve_passes_the_response_store_bounds(monkeypatch):
    from llambda.server.config import ServerConfig
    cfg = _serve_with_fake_load(monkeypatch, ["-m", "some.gguf"])["cfg"]
    assert (cfg.stored_responses, cfg.stored_bytes) == (ServerConfig.stored_responses, ServerConfig.stored_bytes)
    cfg = _serve_with_fake_load(monkeypatch, ["-m", "some.gguf", "--stored-responses", "0",
                                              "--stored-bytes", "1000"])["cfg"]
    assert (cfg.stored_responses, cfg.stored_bytes) == (0, 1000)


def test_serve_passes_and_prints_the_image_rows_budget(monkeypatch, capsys):
    """--image-rows-memory reaches the server's config; a model taking images says its budget at start (the
    default from its context and its rows' width), a text model says nothing of it."""
    cfg = _serve_with_fake_load(monkeypatch, ["-m", "some.gguf"])["cfg"]
    assert cfg.image_rows_memory is None and "encoded rows" not in capsys.readouterr().err
    _serve_with_fake_load(monkeypatch, ["-m", "some.gguf"], image_width=16384)     # 64 tokens: the 1 GiB floor
    assert "at most 1024 MiB of encoded rows at once (--image-rows-memory; 64 KiB a token)" in capsys.readouterr().err
    cfg = _serve_with_fake_load(monkeypatch, ["-m", "some.gguf", "--image-rows-memory", str(3 * 2**20)],
                                image_width=16384)["cfg"]
    assert cfg.image_rows_memory == 3 * 2**20 and "at most 3 MiB of encoded rows" in capsys.readouterr().err


TINY_LLAMA = str(__import__("pathlib").Path(__file__).parent / "fixtures" / "reference" / "tiny" / "llama")


def test_limits_warn_at_load():
    from llambda.backends.native import usable_cpus
    cpus = usable_cpus()
    train = llambda.load(TINY_LLAMA, backend="numpy").config.n_ctx_train
    with pytest.warns(llambda.LlambdaWarning, match=f"beyond the {train} this model was trained on"):
        llambda.load(TINY_LLAMA, backend="numpy", n_ctx=train * 2).close()
    with pytest.warns(llambda.LlambdaWarning, match=f"{cpus + 6} threads on {cpus} usable CPU"):
        llambda.load(TINY_LLAMA, threads=cpus + 6).close()


def test_a_cpu_quota_below_the_affinity_mask_lowers_the_limit(monkeypatch):
    import llambda.backends.native as nb
    monkeypatch.setattr(nb, "cgroup_cpu_quota", lambda: 1.0)
    assert nb.usable_cpus() == 1 and nb.default_threads() == 1
    with pytest.warns(llambda.LlambdaWarning, match="2 threads on 1 usable CPU"):
        llambda.load(TINY_LLAMA, threads=2).close()


def test_limits_are_said_on_the_command_line(smollm2_gguf):
    from llambda.backends.native import usable_cpus
    cpus = usable_cpus()
    out = run_cli("run", "-m", str(smollm2_gguf), "-c", "9000", "--kv-type", "f16", "-t", str(cpus + 1),
                  "--temperature", "0", "-n", "2", "hello")
    assert out.returncode == 0, out.stderr
    assert "llambda: warning: a context of 9000 tokens is beyond the 8192" in out.stderr
    assert f"llambda: warning: {cpus + 1} threads on {cpus} usable CPU(s)" in out.stderr
    assert "warnings.warn" not in out.stderr and "Traceback" not in out.stderr      # one plain line each
    out = run_cli("run", "-m", str(smollm2_gguf), "-c", "12", "--ignore-eos", "--temperature", "0", "-n", "100", "hi")
    assert out.returncode == 0, out.stderr
    assert "stopped: the context is full" in out.stderr
    out = run_cli("run", "-m", str(smollm2_gguf), "--ignore-eos", "--temperature", "0", "-n", "3", "hi")
    assert "context is full" not in out.stderr


def test_context_full_is_marked_on_the_last_event():
    with llambda.load(TINY_LLAMA, n_ctx=10) as m:
        events = list(m.stream([1, 2, 3], max_tokens=100, ignore_eos=True, temperature=0))
        assert events[-1].finish_reason == "length" and events[-1].context_full
        assert not any(e.context_full for e in events[:-1])
        events = list(m.stream([1, 2, 3], max_tokens=7, ignore_eos=True, temperature=0))   # 3 + 7 = 10: max_tokens
        assert events[-1].finish_reason == "length" and not events[-1].context_full


def test_version():
    out = run_cli("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"llambda {llambda.__version__}"


def test_closed_stdin_is_a_clear_error_for_run_embed_and_chat(tmp_path):
    # `<&-` leaves sys.stdin None: once an AttributeError / TypeError traceback
    for cmd in ("run", "embed", "chat"):
        out = subprocess.run([sys.executable, "-m", "llambda.cli", cmd, "-m", str(tmp_path / "nope.gguf")],
                             stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
                             preexec_fn=lambda: os.close(0))
        assert out.returncode == 1, out.stderr
        assert "stdin is closed" in out.stderr and "Traceback" not in out.stderr


def test_an_endless_stdin_is_refused_before_the_model_loads(tmp_path):
    # `run < /dev/zero` read until memory ran out
    with open("/dev/zero", "rb") as zero:
        out = subprocess.run([sys.executable, "-m", "llambda.cli", "run", "-m", str(tmp_path / "nope.gguf")],
                             stdin=zero, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "stdin holds more than" in out.stderr and "Traceback" not in out.stderr


def test_a_reader_that_leaves_early_ends_the_output_without_a_traceback(smollm2_gguf):
    # `llambda tokenize ... | head -1`: once a BrokenPipeError traceback
    proc = subprocess.Popen([sys.executable, "-m", "llambda.cli", "tokenize", "-m", str(smollm2_gguf),
                             "word " * 20000], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().split()[1] == "'word'"
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 141 and "Traceback" not in err and "Broken" not in err


def test_a_grammar_or_schema_file_that_never_ends_is_refused(tmp_path):
    # read whole: a MemoryError traceback (address space capped so a regression fails fast)
    import resource
    cap = lambda: resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    for flag in ("--json-schema", "--grammar"):
        out = subprocess.run([sys.executable, "-m", "llambda.cli", "run", "-m", str(tmp_path / "nope.gguf"), flag,
                              "/dev/zero", "hi"], capture_output=True, text=True, timeout=120, preexec_fn=cap)
        assert out.returncode == 1 and "holds more than" in out.stderr and "Traceback" not in out.stderr


def test_export_refuses_to_replace_a_device_or_fifo(tmp_path):
    # the GGUF is renamed into place: `--out /dev/null` as root replaced the device with a regular file
    tiny = Path(__file__).parent / "fixtures" / "reference" / "tiny" / "llama"
    fifo = tmp_path / "out.gguf"
    os.mkfifo(fifo)
    out = run_cli("export", "-m", str(tiny), "--format", "gguf", "--out", str(fifo), timeout=120)
    assert out.returncode == 1 and "not a regular file" in out.stderr and "Traceback" not in out.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_generating_with_an_encoder_is_a_clear_error(minilm_dir):
    # an EncoderModel has no stream() / chat_template(): once AttributeError tracebacks
    for cmd, stdin in (("run", None), ("chat", "hi\n")):
        args = [cmd, "-m", str(minilm_dir)] + (["hi"] if stdin is None else [])
        out = run_cli(*args, input=stdin, timeout=120)
        assert out.returncode == 1, out.stderr
        assert "is an encoder" in out.stderr and "Traceback" not in out.stderr
    out = run_cli("bench", "-m", str(minilm_dir), "-p", "8", "-n", "4", "-r", "1", timeout=120)
    assert out.returncode == 1 and "is an encoder" in out.stderr and "Traceback" not in out.stderr


def test_an_empty_model_name_is_refused(tmp_path):
    # `-m ""` loaded the current directory ("needs config.json"); `show ""` showed the default model
    for args in (("run", "-m", "", "hi"), ("show", ""), ("tokenize", "-m", " ", "hi")):
        out = subprocess.run([sys.executable, "-m", "llambda.cli", *args], capture_output=True, text=True,
                             timeout=120, cwd=tmp_path, env={**os.environ, "LLAMBDA_HOME": str(tmp_path / "home"),
                                                             "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
        assert out.returncode == 1 and "no model given" in out.stderr and "Traceback" not in out.stderr, args


class _FakeGenerator:
    """A loaded model as `run` uses it: records the prompt and the arguments of stream()."""
    name, is_encoder, spec_stats = "fake", False, None

    def __init__(self, seen, interrupt=False):
        self.seen, self.interrupt = seen, interrupt

    def stream(self, prompt, **kw):
        from llambda.engine import TokenEvent
        self.seen["prompt"], self.seen["kw"] = prompt, kw
        for i, piece in enumerate(self.seen.get("reply", ["ok"])):     # seen["reply"]: the text's pieces
            yield TokenEvent(i + 1, piece)
        if self.interrupt:
            raise KeyboardInterrupt
        yield TokenEvent(-1, "", finish_reason="stop")


@pytest.fixture
def fake_run(monkeypatch):
    """`llambda.cli.main` with load() faked: returns (seen, call); seen["load"] is the name loaded."""
    import llambda.api
    from llambda import cli

    seen = {}

    def fake_load(name, **kw):
        seen["load"] = name
        return _FakeGenerator(seen, seen.get("interrupt", False))

    monkeypatch.setattr(llambda.api, "load", fake_load)
    return seen, cli.main


def test_run_takes_a_model_as_its_first_word_as_ollama_does(fake_run, capsys):
    seen, main = fake_run
    # Ollama's `run MODEL PROMPT`, the name with its :latest tag, options between the words: was
    # "unrecognized arguments"
    assert main(["run", "SmolLM2-135M:latest", "-n", "3", "The", "capital", "--temperature", "0", "is"]) == 0
    assert seen["load"] == "smollm2-135m" and seen["prompt"] == "The capital is"
    assert seen["kw"]["max_tokens"] == 3 and seen["kw"]["temperature"] == 0
    assert main(["run", "The capital of France is"]) == 0          # one quoted prompt: the default model
    assert seen["load"] == "smollm2-135m" and seen["prompt"] == "The capital of France is"
    assert main(["run", "-m", TINY_LLAMA, "smollm2-135m", "hi"]) == 0      # -m given: every word is the prompt
    assert seen["load"] == TINY_LLAMA and seen["prompt"] == "smollm2-135m hi"
    assert main(["run", TINY_LLAMA, "hi"]) == 0                     # a HF directory as the first word
    assert seen["load"] == TINY_LLAMA and seen["prompt"] == "hi"
    capsys.readouterr()


@pytest.mark.parametrize("words, said", [(["llama3:8b", "hi there"], "'llama3:8b' is not a catalogued model"),
                                         (["smolm2-135m", "hello", "there"], "did you mean smollm2-135m?"),
                                         (["qwen2.5-coder"], "did you mean qwen2.5-coder-"),
                                         (["smollm2"], "did you mean smollm2-135m?")])
def test_run_refuses_a_first_word_that_is_a_mistyped_model(fake_run, capsys, words, said):
    # the typo was taken as the prompt (or its first word), on the default model
    seen, main = fake_run
    assert main(["run", *words]) == 1
    err = capsys.readouterr().err
    assert said in err and "give it with -p" in err and "Traceback" not in err and "load" not in seen, err


@pytest.mark.parametrize("words", [["Gemma", "is", "a", "name"], ["12:30", "is", "late"], ["smollm2 is small"],
                                   ["Once"]])
def test_run_takes_ordinary_first_words_as_the_prompt(fake_run, capsys, words):
    seen, main = fake_run
    assert main(["run", *words]) == 0
    assert seen["load"] == "smollm2-135m" and seen["prompt"] == " ".join(words)
    capsys.readouterr()


def test_run_without_a_prompt_at_a_terminal_starts_a_chat(fake_run, monkeypatch):
    # `ollama run MODEL`: a conversation; `llambda run MODEL` took the model's name as the prompt
    from llambda import cli
    seen, main = fake_run

    class Tty:
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stdin", Tty())
    monkeypatch.setattr(cli, "cmd_chat", lambda a: seen.setdefault("chat", (a.model, a.system, a.no_think)) and 0)
    assert main(["run", "smollm2-135m", "-n", "5"]) == 0
    assert seen["chat"] == ("smollm2-135m", None, False) and "prompt" not in seen


@pytest.mark.parametrize("flags, said", [(["--top-p", "2"], "--top-p must be <= 1.0"),
                                         (["--temperature", "-1"], "--temperature must be >= 0"),
                                         (["-n", "-5"], "-n/--max-tokens must be"),
                                         (["-c", "1"], "-c/--ctx-size must be"),
                                         (["-t", "-1"], "-t/--threads must be")])
def test_bad_sampling_values_are_named_by_their_flag_before_the_load(fake_run, capsys, flags, said):
    # once said after the whole load, by the library's names ("top_p must be <= 1.0")
    seen, main = fake_run
    assert main(["run", *flags, "hi"]) == 1
    err = capsys.readouterr().err
    assert f"llambda: error: {said}" in err and "load" not in seen, err


@pytest.mark.parametrize("args", [["run", ""], ["run", "smollm2-135m", ""], ["run", "-p", ""]])
def test_an_empty_prompt_is_refused_before_the_load(fake_run, capsys, args):
    # once refused only after the model loaded, in the library's words
    seen, main = fake_run
    assert main(args) == 1
    err = capsys.readouterr().err
    assert err.startswith("llambda: error: the prompt is empty") and err.count("\n") == 1 and "load" not in seen, err


def test_ctrl_c_during_run_ends_the_line_and_exits_130(fake_run, capsys):
    seen, main = fake_run
    seen["interrupt"] = True
    assert main(["run", "hi"]) == 130
    assert capsys.readouterr().out == "ok\n"        # the shell's prompt was left after the text


def test_pull_shows_progress_only_on_a_terminal(monkeypatch, capsys):
    # `llambda pull NAME 2>log` filled the log with every redraw of the bar
    import llambda.hub
    from llambda.cli import main
    seen = {}
    monkeypatch.setattr(llambda.hub, "pull", lambda name, progress, force, report=None: seen.update(
        name=name, progress=progress, report=report) or "/cache/file.gguf")
    assert main(["pull", "smollm2-135m:latest"]) == 0
    # the bars only to a terminal; the one-line outcome (sha256 verified) whatever stderr is
    assert seen == {"name": "smollm2-135m", "progress": False, "report": True}
    assert capsys.readouterr().out == "/cache/file.gguf\n"


def test_ls_lists_and_python_dash_m_runs_the_command(capsys):
    from llambda.cli import main
    assert main(["ls"]) == 0 and capsys.readouterr().out.startswith("NAME ")
    out = subprocess.run([sys.executable, "-m", "llambda", "--version"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == f"llambda {llambda.__version__}"


def test_mistyped_names_are_answered_with_the_close_ones(tmp_path, monkeypatch, capsys):
    from llambda.cli import main
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LLAMBDA_HOME", str(tmp_path / "home"))
    assert main(["pull", "smollm2"]) == 1
    assert "did you mean smollm2-135m?" in capsys.readouterr().err
    with pytest.raises(llambda.ModelNotFoundError, match="did you mean qwen2.5-coder-0.5b"):
        llambda.load("qwen2.5-coder-0.5")
    # a Hugging Face repository id, as other tools take it: said why it is not fetched
    with pytest.raises(llambda.ModelNotFoundError, match="Hugging Face repository id is not fetched.*smollm2-135m"):
        llambda.load("HuggingFaceTB/SmolLM2-135M-Instruct")


def test_quantize_and_export_refuse_to_overwrite_the_model_they_read(tmp_path, capsys):
    # the GGUF was renamed over its own source (a cached catalogued file too, which then failed its hash)
    import shutil
    from llambda.cli import main
    src = tmp_path / "tiny"
    shutil.copytree(TINY_LLAMA, src)
    before = {p.name: p.read_bytes() for p in src.iterdir() if p.is_file()}
    assert main(["export", "-m", str(src), "--format", "hf", "--out", str(src)]) == 1
    assert "is the model being read" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in src.iterdir() if p.is_file()} == before
    gguf = tmp_path / "tiny.gguf"
    assert main(["export", "-m", str(src), "--format", "gguf", "--out", str(gguf)]) == 0
    data = gguf.read_bytes()
    (tmp_path / "link.gguf").symlink_to(gguf)
    for out in (gguf, tmp_path / "link.gguf"):
        assert main(["quantize", str(gguf), str(out), "q8_0"]) == 1
        assert "is the model being read" in capsys.readouterr().err
    assert gguf.read_bytes() == data


def test_chat_takes_the_model_as_a_word(monkeypatch):
    # `llambda chat MODEL`, as `ollama run MODEL`: was "unrecognized arguments"
    from llambda import cli
    seen = {}
    monkeypatch.setattr(cli, "cmd_chat", lambda a: seen.setdefault("model", a.model) and 0)
    assert cli.main(["chat", "qwen2.5-coder-0.5b:latest", "-n", "4"]) == 0
    assert seen["model"] == "qwen2.5-coder-0.5b"


def test_embed_says_it_reads_a_terminal(monkeypatch, capsys):
    # `llambda embed` at a terminal waited for stdin with nothing said
    import io
    from llambda import cli

    class Tty(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stdin", Tty(""))
    assert cli.main(["embed", "-m", "nope.gguf"]) == 1          # nothing typed: nothing to embed
    err = capsys.readouterr().err
    assert "reading texts from stdin" in err and "nothing to embed" in err


def test_serve_on_a_port_in_use_is_refused_before_loading(monkeypatch):
    # the model loaded first (minutes for a large one), then "could not start"
    import socket
    import llambda.api
    from llambda.cli import build_parser
    from llambda.errors import LlambdaError

    def no_load(*args, **kw):
        raise AssertionError("the model was loaded before the port was checked")

    monkeypatch.setattr(llambda.api, "load", no_load)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        a = build_parser().parse_args(["serve", "-m", "some.gguf", "--port", str(taken.getsockname()[1])])
        with pytest.raises(LlambdaError, match="cannot serve on 127.0.0.1:.*in use"):
            a.fn(a)


def test_a_piped_prompt_loses_echos_newline(fake_run, monkeypatch, capsys):
    import io
    seen, main = fake_run
    monkeypatch.setattr(sys, "stdin", io.StringIO("The capital of France is\n"))
    assert main(["run", "-n", "4"]) == 0
    assert seen["prompt"] == "The capital of France is"
    monkeypatch.setattr(sys, "stdin", io.StringIO("def f():\n    return 1\n\n"))      # only the last one
    assert main(["run", "smollm2-135m"]) == 0
    assert seen["prompt"] == "def f():\n    return 1\n" and seen["load"] == "smollm2-135m"
    capsys.readouterr()


def test_no_command_says_what_to_type(capsys):
    # "the following arguments are required: cmd" named an internal variable
    from llambda.cli import main
    with pytest.raises(SystemExit) as e:
        main([])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "required: COMMAND" in err and "cmd" not in err


def test_a_folder_of_gguf_files_names_them(tmp_path, capsys):
    # was "a Hugging Face model directory needs config.json", with no word of the file beside
    from llambda.cli import main
    (tmp_path / "my model.Q4_K_M.gguf").write_bytes(b"GGUF")
    assert main(["show", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "give the path of the GGUF file in it (my model.Q4_K_M.gguf)" in err, err


def test_too_many_threads_is_named_by_its_flag(capsys):
    # was "set_threads: n must be in [1, 256]", the C function's own words
    from llambda.cli import main
    assert main(["run", "-m", TINY_LLAMA, "-t", "100000", "-n", "1", "hi"]) == 1
    err = capsys.readouterr().err
    assert "llambda: error: -t/--threads must be in [1, 256], got 100000" in err, err


def test_input_that_is_not_utf8_is_said_as_such(smollm2_gguf, capsys):
    # "the text holds a lone surrogate U+DCE9": Python's stand-in for the byte, not what the user gave
    from llambda.cli import main
    assert main(["tokenize", "-m", str(smollm2_gguf), "caf\udce9"]) == 1
    err = capsys.readouterr().err
    assert "the byte 0xE9 of an input that is not UTF-8" in err, err


def test_run_takes_llama_cli_prompt_flags(fake_run, tmp_path, capsys):
    # llama-cli's -p, -f and --n-predict were "unrecognized arguments"; ollama's -v was too
    seen, main = fake_run
    assert main(["run", "-p", "The capital", "--n-predict", "3"]) == 0
    assert seen["prompt"] == "The capital" and seen["kw"]["max_tokens"] == 3 and seen["load"] == "smollm2-135m"
    f = tmp_path / "prompt.txt"
    f.write_text("from a file\n")
    assert main(["run", "smollm2-135m:latest", "-f", str(f)]) == 0
    assert seen["prompt"] == "from a file\n" and seen["load"] == "smollm2-135m"
    del seen["load"]
    assert main(["run", "-f", str(f), "-p", "twice"]) == 1
    assert main(["run", "-p", "twice", "and", "words"]) == 1
    assert main(["run", "-f", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.count("the prompt is given twice") == 2 and "cannot read the prompt file" in err
    assert "load" not in seen
    with pytest.raises(SystemExit) as e:
        main(["-v"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"llambda {llambda.__version__}"


def test_tokenize_reads_stdin(smollm2_gguf):
    # `echo ... | llambda tokenize` was "the following arguments are required: text"
    out = run_cli("tokenize", "-m", str(smollm2_gguf), "--ids", input="The capital of France is\n")
    assert out.returncode == 0 and out.stdout.strip() == "[504, 3575, 282, 4649, 314]", out.stderr


def test_format_json_constrains_as_ollama_run_does(fake_run, capsys):
    # `ollama run MODEL --format json`: was "unrecognized arguments"
    import json as json_module
    seen, main = fake_run
    assert main(["run", "--format", "json", "a person:"]) == 0
    assert json_module.loads(seen["kw"]["json_schema"]) == {"type": "object"}
    del seen["load"]
    assert main(["run", "--format", "json", "--regex", "a+", "hi"]) == 1
    assert "give at most one of --json-schema (or --format json), --grammar and --regex" in capsys.readouterr().err
    assert "load" not in seen


def test_piped_text_goes_before_the_words_as_ollama_sends_it(fake_run, monkeypatch, tmp_path, capsys):
    # `cat notes.txt | llambda run MODEL "summarize this"` sent the words alone: the pipe was never read
    seen, main = fake_run
    notes = tmp_path / "notes.txt"
    notes.write_text("The meeting is at noon.\n")

    def run_with_stdin(stdin, args):
        monkeypatch.setattr(sys, "stdin", stdin)
        with stdin:
            assert main(args) == 0
        return seen["prompt"]

    # ollama's joining: the text as read (its newline kept), a space, the words
    assert run_with_stdin(open(notes), ["run", "smollm2-135m", "Summarize", "this:"]) == \
        "The meeting is at noon.\n Summarize this:"
    r, w = os.pipe()
    os.write(w, b"piped")
    os.close(w)
    assert run_with_stdin(os.fdopen(r), ["run", "hi"]) == "piped hi"
    r, w = os.pipe()
    os.close(w)
    assert run_with_stdin(os.fdopen(r), ["run", "hi"]) == "hi"          # an empty pipe adds nothing
    assert run_with_stdin(open(os.devnull), ["run", "hi"]) == "hi"      # nor a device
    assert run_with_stdin(open(notes), ["run", "-p", "as given"]) == "as given"    # llama-cli's -p: itself
    capsys.readouterr()


def test_ps_lists_a_live_servers_models_as_ollama_ps(monkeypatch, capsys):
    # there was no `llambda ps`: what a server held was only in its /api/ps JSON
    import httpx
    from serverkit import LiveServer, free_port

    from llambda.cli import main
    from llambda.server import ServerConfig, create_app

    monkeypatch.delenv("LLAMBDA_API_KEY", raising=False)
    with llambda.load(TINY_LLAMA, n_slots=2, n_ctx=64) as m:
        cfg = ServerConfig(model_id="tiny", parallel=1, api_key="sesame")
        with LiveServer(create_app(m, cfg)) as srv:
            assert main(["ps", "--host", srv.url]) == 1        # the server wants its key
            err = capsys.readouterr().err
            assert err == f"llambda: error: the server at {srv.url} asks for an API key: set LLAMBDA_API_KEY\n"
            monkeypatch.setenv("LLAMBDA_API_KEY", "sesame")
            assert main(["ps", "--host", f"127.0.0.1:{srv.port}"]) == 0     # OLLAMA_HOST's shape
            lines = capsys.readouterr().out.splitlines()
            digest = httpx.get(srv.url + "/api/ps", headers={"Authorization": "Bearer sesame"}
                               ).json()["models"][0]["digest"]
    assert lines[0].split() == ["NAME", "ID", "SIZE", "PROCESSOR", "CONTEXT", "UNTIL"] and len(lines) == 2
    name, ident, *rest = lines[1].split()
    # SIZE (the memory plan's total, two words), PROCESSOR (two), CONTEXT, UNTIL
    assert name == "tiny:latest" and ident == digest[:12] and rest[2:] == ["100%", "CPU", "64", "Forever"]
    assert rest[1] in ("KB", "MB"), lines[1]
    port = free_port()      # nothing listens there: one line, status 1
    assert main(["ps", "--host", f":{port}"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"llambda: error: no server answers at http://127.0.0.1:{port} (") and \
        err.count("\n") == 1, err
    assert main(["ps", "--host", "localhost:http"]) == 1
    assert "the port must be a number" in capsys.readouterr().err


def test_ps_columns_read_ollamas_fields():
    from datetime import datetime, timezone

    from llambda.commands.ps import human_bytes, processor, server_url, until
    now = datetime(2026, 12, 5, 12, 0, tzinfo=timezone.utc)
    assert until("9999-12-31T23:59:59Z", now) == "Forever"
    assert until("2026-12-05T12:04:30.123456789Z", now) == "4 minutes from now"     # Go's nanoseconds
    assert until("2026-12-05T11:59:00Z", now) == "Stopping..."
    assert human_bytes(98_000_000) == "98 MB" and human_bytes(1_130_000_000) == "1.1 GB"
    assert processor({"size": 100, "size_vram": 0}) == "100% CPU"
    assert processor({"size": 100, "size_vram": 25}) == "75%/25% CPU/GPU"
    assert server_url("http://[::1]:9000/") == "http://[::1]:9000" and server_url("example") == "http://example:8080"
    with pytest.raises(ValueError, match=r"--host '\[::1': Invalid IPv6 URL"):     # said without the flag's name
        server_url("[::1")


def test_ollama_run_flags_are_taken(fake_run, monkeypatch, capsys):
    # `ollama run MODEL --keepalive 5m --nowordwrap --hidethinking --think ...` was "unrecognized arguments"
    from llambda import cli
    seen, main = fake_run
    for flags in (["--keepalive", "5m"], ["--keepalive", "1h30m"], ["--keepalive", "0"], ["--keepalive", "-1"],
                  ["--keepalive=1.5h"], ["--nowordwrap"]):
        seen.clear()
        assert main(["run", "smollm2-135m", *flags, "hi"]) == 0, flags
        assert seen["prompt"] == "hi"
    for flags, said in ((["--keepalive", "5 minutes"], "is no duration"), (["--keepalive", "5x"], "is no duration"),
                        (["--think=maybe"], "is none of true, false, high, medium, low")):
        with pytest.raises(SystemExit) as e:
            main(["run", *flags, "hi"])
        assert e.value.code == 2 and said in capsys.readouterr().err
    # a bare --think is --think=true, as ollama's flags read it: the next word stays the model
    seen.clear()
    assert main(["run", "--think", "smollm2-135m", "hi"]) == 0
    assert seen["load"] == "smollm2-135m" and seen["prompt"] == "hi"
    assert "--think sets a chat template's thinking" in capsys.readouterr().err     # a completion has none
    with pytest.raises(SystemExit):     # another command's error names the flag as given (was "--think=true")
        main(["serve", "--think"])
    err = capsys.readouterr().err
    assert "unrecognized arguments: --think" in err and "--think=true" not in err
    # in a chat (`run MODEL` at a terminal, `chat`), --think is the template's thinking switch
    for flags, kw in ((["--think"], {"enable_thinking": True}), (["--think=false"], {"enable_thinking": False}),
                      (["--think=HIGH"], {"enable_thinking": True, "reasoning_effort": "high"}), ([], {})):
        a = cli.build_parser().parse_args(["chat", *flags])
        assert cli._template_kwargs(a) == ({"template_kwargs": kw} if kw else {}), flags
    a = cli.build_parser().parse_args(["chat", "--no-think", "--think=low"])
    with pytest.raises(ValueError, match="--no-think and --think=low say opposite things"):
        cli._template_kwargs(a)


def test_hidethinking_prints_only_the_answer_of_a_run(fake_run, capsys):
    seen, main = fake_run
    seen["reply"] = ["<think>", "\nThe user", " wants Paris.\n", "</think>", "\n\n", "Paris", " it is."]
    assert main(["run", "--hidethinking", "Capital?"]) == 0
    assert capsys.readouterr().out == "Paris it is.\n"
    assert main(["run", "Capital?"]) == 0          # without the flag: the text as generated
    assert capsys.readouterr().out.startswith("<think>\nThe user wants Paris.\n</think>")
    seen["reply"] = ["still thinking", "</think>", "Yes."]          # a prompt that opened the thought
    assert main(["run", "--hidethinking", "Is it?<think>"]) == 0
    assert capsys.readouterr().out == "Yes.\n"


def test_hidethinking_prints_only_the_final_message_of_a_harmony_run(fake_run, capsys, monkeypatch):
    from types import SimpleNamespace
    seen, main = fake_run
    # a gpt-oss: its template writes harmony's channels
    monkeypatch.setattr(_FakeGenerator, "source", SimpleNamespace(chat_template="<|channel|>final"), raising=False)
    seen["reply"] = ["<|channel|>", "analysis", "<|message|>", "The user wants", " Paris.", "<|end|>",
                     "<|start|>", "assistant", "<|channel|>", "final", "<|message|>", "Paris", " it is."]
    assert main(["run", "--hidethinking", "Capital?"]) == 0
    assert capsys.readouterr().out == "Paris it is.\n"
    assert main(["run", "Capital?"]) == 0          # without the flag: the text as generated, headers and all
    assert capsys.readouterr().out == "".join(seen["reply"]) + "\n"


def test_ps_says_what_answered_when_it_is_no_ollama_api(capsys):
    from serverkit import LiveServer
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from llambda.cli import main

    async def text(request):
        return PlainTextResponse("hello")

    with LiveServer(Starlette(routes=[Route("/elsewhere/api/ps", text)])) as srv:
        assert main(["ps", "--host", srv.url]) == 1
        # an embedding model's llambda server answers /api/ps too (test_embeddings_api): not named as lacking it
        assert capsys.readouterr().err == \
            f"llambda: error: {srv.url} has no /api/ps: it is neither a llambda server nor Ollama\n"
        assert main(["ps", "--host", srv.url + "/elsewhere/"]) == 1      # a URL's path is kept
        err = capsys.readouterr().err
    assert err == f"llambda: error: {srv.url}/elsewhere/api/ps did not answer as Ollama's /api/ps does " \
                  "(a JSON list of models)\n"


def _raw_server(answer):
    """A socket server on a free port that runs answer(conn) for each connection in a thread; returns
    (port, stop)."""
    import socket
    import threading
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    stop = threading.Event()

    def serve():
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            threading.Thread(target=answer, args=(conn, stop), daemon=True).start()
    threading.Thread(target=serve, daemon=True).start()

    def close():
        stop.set()
        srv.close()
    return srv.getsockname()[1], close


def test_ps_gives_up_on_a_server_that_trickles_its_answer(monkeypatch, capsys):
    # a byte every 0.05 s never hit the 10 s socket timeout: ps waited as long as the server kept sending
    import time

    from llambda.cli import main
    from llambda.commands import ps

    def trickle(conn, stop):
        conn.recv(4096)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n")
        while not stop.is_set():
            try:
                conn.sendall(b" ")
            except OSError:
                break
            time.sleep(0.05)
        conn.close()
    port, close = _raw_server(trickle)
    monkeypatch.setattr(ps, "TOTAL_S", 0.6)
    try:
        t = time.monotonic()
        assert main(["ps", "--host", f"127.0.0.1:{port}"]) == 1
        assert time.monotonic() - t < 5
    finally:
        close()
    assert "no whole answer within 0.6 s" in capsys.readouterr().err


@pytest.mark.parametrize("body", [b"[" * 200_000 + b"]" * 200_000, b'{"models": [{"size": NaN}]}',
                                  b'{"models": [{"size": Infinity}]}', b'{"models": {"a": 1}}', b"\xff\xfe"])
def test_ps_says_an_answer_is_not_ollamas_for_hostile_json(body, capsys):
    # a deep nesting was a RecursionError traceback; NaN/Infinity (not JSON) crashed the size column
    from llambda.cli import main

    def answer(conn, stop):
        conn.recv(4096)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        conn.close()
    port, close = _raw_server(answer)
    try:
        assert main(["ps", "--host", f"127.0.0.1:{port}"]) == 1
    finally:
        close()
    assert "did not answer as Ollama's /api/ps does" in capsys.readouterr().err


def test_ps_columns_of_absurd_fields_are_question_marks_and_printable():
    from datetime import datetime, timezone

    from llambda.commands.ps import table
    now = datetime(2026, 12, 5, 12, 0, tzinfo=timezone.utc)
    rows = table([{"name": "a\x1b[2Jb\nc", "size": float("nan"), "size_vram": 1},
                  {"name": "big", "size": 1e308, "size_vram": 1e307}, {"name": "huge", "size": 10**400},
                  {"name": "gpu", "size": 10, "size_vram": float("inf")}, {"name": "yes", "size": True}], now)
    assert rows[1].split()[:4] == ["a?[2Jb?c", "?", "100%", "CPU"]
    assert [r.split()[:3] for r in rows[2:]] == [["big", "?", "100%"], ["huge", "?", "100%"], ["gpu", "10", "B"],
                                                  ["yes", "?", "100%"]]
    assert all(ch.isprintable() for r in rows for ch in r)
