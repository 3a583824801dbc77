"""The `llambda` command: run | chat | pull | list | ps | rm | show | tokenize | serve | bench | perplexity | export.

Every sub-command is a `cmd_NAME(args) -> exit code` function registered in `build_parser`."""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import warnings
from pathlib import Path

# Our C thread pool owns the cores; a second pool (OpenBLAS) spinning beside it collapses both.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from .errors import InsufficientMemoryError, LlambdaError, LlambdaWarning, ModelNotFoundError
from .commands.model_store import cmd_list, cmd_pull, cmd_rm, cmd_show
from .hub import CATALOG, DEFAULT_MODEL


def _add_model_args(p: argparse.ArgumentParser, runtime: bool = True,
                    ctx_help: str = "context length (default min(train, 4096))", default_model=DEFAULT_MODEL) -> None:
    """-m, and with `runtime` the options of a loaded model (threads, backend, precision, context).
    `default_model` None: the command fills it in (run: a first word may name the model)."""
    p.add_argument("-m", "--model", default=default_model,
                   help=f"catalogued name, .gguf file or HF directory (default {DEFAULT_MODEL})")
    if not runtime:
        return
    p.add_argument("-t", "--threads", type=int, default=None, help="threads (default: the cores this process may use)")
    p.add_argument("--backend", choices=["native", "numpy"], default=None, help="default: native where it built")
    p.add_argument("--activations", choices=["q8", "f32"], default=None,
                   help="native backend: q8 (fast, default) or f32 (exact)")
    p.add_argument("--kv-type", choices=["f32", "f16", "q8_0"], default=None,
                   help="native backend: KV cache precision (default f32, for serve f16; f16 halves its memory, "
                        "q8_0 halves f16's)")
    p.add_argument("-c", "--ctx-size", type=int, default=None, help=ctx_help)
    p.add_argument("-v", "--verbose", action="store_true", help="print memory budget and tokens/s")


def _add_image_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--image", action="append", metavar="FILE", default=None,
                   help="an image for a model with a vision tower (PNG, JPEG, WebP, GIF, BMP, TIFF; repeatable): "
                        "with `run` the prompt and its images go through the chat template; with `chat` they go "
                        "with the first message. Paths typed in a message (./cat.png, ~/a.jpg, '/my pics/b.png', "
                        "/my\\ pics/b.png) are taken as images too, for such a model only")


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("-n", "--max-tokens", "--n-predict", type=int, default=256,
                   help="most tokens to generate (default 256)")
    g.add_argument("--temperature", "--temp", type=float, default=0.8,
                   help="randomness; 0 picks the most likely token every time (default 0.8)")
    g.add_argument("--top-k", type=int, default=40, help="sample among the k most likely tokens; 0 = all (default 40)")
    g.add_argument("--top-p", type=float, default=0.95,
                   help="sample among the most likely tokens whose probabilities sum to p; 1 = off (default 0.95)")
    g.add_argument("--min-p", type=float, default=0.05,
                   help="drop tokens less likely than min-p times the most likely one; 0 = off (default 0.05)")
    g.add_argument("--repeat-penalty", type=float, default=1.0,
                   help="divide the logits of recent tokens by this; 1 = off (default 1.0)")
    g.add_argument("--repeat-last-n", type=int, default=64,
                   help="how many recent tokens the penalties look at; -1 = all, 0 = none (default 64)")
    g.add_argument("--presence-penalty", type=float, default=0.0,
                   help="subtract from the logit of every token already present (default 0)")
    g.add_argument("--frequency-penalty", type=float, default=0.0,
                   help="subtract this times a token's count so far from its logit (default 0)")
    g.add_argument("--seed", type=int, default=None, help="random seed, for reproducible sampling (default: random)")
    g.add_argument("--stop", action="append", default=[], help="stop when this text appears (repeatable)")
    g.add_argument("--ignore-eos", action="store_true", help="keep generating past the end-of-text token")


def _add_constraint_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("constrained output (at most one)")
    g.add_argument("--json-schema", metavar="FILE", default=None,
                   help="the output is JSON valid against the JSON schema in FILE")
    g.add_argument("--grammar", metavar="FILE", default=None,
                   help="the output follows the grammar in FILE (llama.cpp's GBNF, or llguidance's Lark)")
    g.add_argument("--regex", metavar="PATTERN", default=None, help="the output matches this regular expression")
    g.add_argument("--format", choices=["json"], default=None, dest="format",
                   help="json: the output is a JSON object (ollama run's --format json)")


def _add_speculative_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("speculative decoding (same output, faster where drafts are accepted)")
    g.add_argument("--model-draft", metavar="MODEL", default=None,
                   help="a smaller model of the same vocabulary drafting tokens for -m to verify")
    g.add_argument("--lookup", action="store_true",
                   help="draft from the prompt and the text so far (prompt lookup; no second model)")
    g.add_argument("--draft-max", type=int, default=None, metavar="N",
                   help="most tokens drafted per step (default 8 with a draft model, 10 with --lookup)")
    g.add_argument("--threads-draft", type=int, default=None, metavar="N",
                   help="threads of the draft model's forward passes (default: -t)")


def _add_lora_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lora", action="append", default=[], metavar="PATH[:SCALE]",
                   help="a LoRA adapter merged into the weights at load: a GGUF adapter (llama.cpp's) or a PEFT "
                        "directory, its update times SCALE (default 1); repeatable")


def _add_mmproj_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mmproj", metavar="FILE", default=None,
                   help="the vision tower of a GGUF model: llama.cpp's mmproj file (a Hugging Face directory or "
                        "Ollama's gemma3 file holds its own, found without this)")
    p.add_argument("--no-mmproj", action="store_true",
                   help="load no vision tower, not even one the model's own files hold (its memory saved; the "
                        "model then takes no images); llama.cpp's flag")


def _extra_files_kwargs(a) -> dict:
    """load() arguments of the files read beside the model: LoRA adapters, an mmproj vision tower (or none:
    --no-mmproj)."""
    from .formats.lora import parse_lora_arg
    specs = [parse_lora_arg(x) for x in getattr(a, "lora", None) or []]
    out = {"lora": specs} if specs else {}
    if getattr(a, "mmproj", None):
        if getattr(a, "no_mmproj", False):
            raise ValueError("--mmproj and --no-mmproj: give one or the other")
        out["mmproj"] = a.mmproj
    if getattr(a, "no_mmproj", False):
        out["vision"] = False
    return out


def _speculative_kwargs(a) -> dict:
    """stream() arguments from the flags: --lookup wins over the draft model for drafting."""
    if a.draft_max is not None and not (a.lookup or a.model_draft):
        raise ValueError("--draft-max needs --model-draft or --lookup")
    mode = "lookup" if a.lookup else ("draft" if a.model_draft else None)
    return dict(speculative=mode, draft_max=a.draft_max)


CONSTRAINT_MAX_CHARS = 16 << 20   # a grammar or JSON schema; the server takes 4 MiB bodies


def _read_capped(f, limit: int, source: str, error: type = LlambdaError, hint: str = "") -> str:
    """What `f` holds, read bounded (`/dev/zero` and endless pipes read until memory ran out); `error`
    when there is more than `limit` characters."""
    text = f.read(limit + 1)
    if len(text) > limit:
        raise error(f"{source} holds more than {limit} characters{hint}")
    return text


def _constraint_kwargs(a) -> dict:
    """json_schema/grammar/regex for Model.stream, read and checked before the model loads."""
    from .constraints import ConstraintError, grammar_spec

    def read(path: str, what: str) -> str:
        try:
            # bounded (`--grammar /dev/zero` read until MemoryError); a pipe such as <(...) still reads
            with open(path, encoding="utf-8") as f:
                return _read_capped(f, CONSTRAINT_MAX_CHARS, f"the {what} file {path}", ConstraintError)
        except (OSError, UnicodeDecodeError) as e:
            raise ConstraintError(f"cannot read the {what} file {path}: {e}") from None

    out = {}
    if a.format == "json":      # as the server's response_format json_object
        if a.json_schema is not None:
            raise ConstraintError("--format json and --json-schema: give one (a schema of type object is both)")
        out["json_schema"] = '{"type": "object"}'
    if a.json_schema is not None:
        out["json_schema"] = read(a.json_schema, "JSON schema")
    if a.grammar is not None:
        out["grammar"] = read(a.grammar, "grammar")
    if a.regex is not None:
        out["regex"] = a.regex
    try:
        spec = grammar_spec(**out)          # at most one
    except ConstraintError as e:            # "at most one" said with the library's names (json_schema, ...)
        if not str(e).startswith("give at most one"):
            raise
        raise ConstraintError("give at most one of --json-schema (or --format json), --grammar and --regex") from None
    if spec is not None and spec.kind == "json_schema":
        try:
            json.loads(spec.source)
        except ValueError as e:
            raise ConstraintError(f"{a.json_schema} is not valid JSON: {e}") from None
    return out


def _template_kwargs(a) -> dict:
    """--template-kwargs JSON and --no-think (chat, serve) as Model.chat_stream's and ServerConfig's
    template_kwargs, checked before the model loads."""
    from .chat import check_template_kwargs
    from .commands.run_flags import template_kwargs as think_template_kwargs
    from .errors import InvalidInputError

    kw = {}
    if a.template_kwargs is not None:
        try:
            kw = json.loads(a.template_kwargs)
        except ValueError as e:
            raise InvalidInputError(f"--template-kwargs is not valid JSON: {e}") from None
        kw = check_template_kwargs(kw)
    if a.no_think:
        kw["enable_thinking"] = False
    kw.update(think_template_kwargs(getattr(a, "think", None), a.no_think))    # serve has no --think
    return {"template_kwargs": kw} if kw else {}


# the library's names for what the flags set, as its errors name them ("top_p must be <= 1.0")
FLAG_NAMES = {"max_tokens": "-n/--max-tokens", "temperature": "--temperature", "top_k": "--top-k",
              "top_p": "--top-p", "min_p": "--min-p", "repeat_penalty": "--repeat-penalty",
              "repeat_last_n": "--repeat-last-n", "presence_penalty": "--presence-penalty",
              "frequency_penalty": "--frequency-penalty", "seed": "--seed", "stop strings": "--stop",
              "n_ctx": "-c/--ctx-size", "threads": "-t/--threads", "draft_max": "--draft-max",
              "draft_threads": "--threads-draft", "set_threads: n": "-t/--threads",   # the C pool's bound
              "grammar": "--grammar", "regex": "--regex"}


def _named_as_flag(message: str) -> str:
    """An error about a library argument, said with the flag the user typed: "--top-p must be <= 1.0";
    a lone surrogate U+DC80..U+DCFF, as the byte of no UTF-8 that it stands for."""
    m = re.search(r"lone surrogate U\+DC([89A-F][0-9A-F])\b", message)
    if m:      # Python's stand-in for an undecodable byte of argv or stdin
        message += f" (the byte 0x{m.group(1)} of an input that is not UTF-8: convert it, e.g. with iconv)"
    for name, flag in FLAG_NAMES.items():
        if message.startswith(name + " must"):
            return flag + message[len(name):]
    return message


def _check_generation_args(a) -> None:
    """The sampling flags and -c/-t, checked before the model loads (seconds to minutes): a bad value
    was said only after the load."""
    from .engine import GenerationParams
    from .models.config import MAX_POSITIONS
    from .sampling import SamplingParams

    kw = _sampling_kwargs(a)
    gen = {k: kw.pop(k) for k in ("max_tokens", "stop", "ignore_eos")}
    GenerationParams(sampling=SamplingParams(**kw), **gen).validate()
    if a.ctx_size is not None and not (a.ctx_size == 0 or 2 <= a.ctx_size <= MAX_POSITIONS):
        raise ValueError(f"-c/--ctx-size must be 0 (the default) or 2..{MAX_POSITIONS}, got {a.ctx_size}")
    if a.threads is not None and a.threads < 0:
        raise ValueError(f"-t/--threads must be >= 0 (0: the default), got {a.threads}")


def _sampling_kwargs(a) -> dict:
    return dict(max_tokens=a.max_tokens, temperature=a.temperature, top_k=a.top_k, top_p=a.top_p, min_p=a.min_p,
                repeat_penalty=a.repeat_penalty, repeat_last_n=a.repeat_last_n,
                presence_penalty=a.presence_penalty, frequency_penalty=a.frequency_penalty, seed=a.seed,
                stop=a.stop, ignore_eos=a.ignore_eos)


def _load(a, generates: bool = False, **extra):
    """`generates`: the command writes text, which an encoder (embedding model) cannot."""
    from .api import load
    t0, cpu0 = time.perf_counter(), time.process_time()
    model = load(a.model, backend=a.backend, threads=a.threads, n_ctx=a.ctx_size, activations=a.activations,
                 kv_type=a.kv_type, draft=getattr(a, "model_draft", None),
                 draft_threads=getattr(a, "threads_draft", None), **_extra_files_kwargs(a), **extra)
    if generates and getattr(model, "is_encoder", False):     # was an AttributeError traceback ('stream')
        model.close()
        raise LlambdaError(f"{a.model} is an encoder (an embedding model): it generates no text; "
                           f"`llambda embed -m {a.model}` gives its vectors")
    if a.verbose:
        mem = model.memory_report()
        parts = ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in mem.items())
        print(f"[llambda] {model.name}: {model.config.arch}, backend {model.backend.name} ({model.backend.precision}), "
              f"ctx {model.n_ctx}, loaded in {time.perf_counter() - t0:.2f} s (CPU {time.process_time() - cpu0:.2f} s)",
              file=sys.stderr)
        _print_plan(model)
        print(f"[llambda] memory: {parts}", file=sys.stderr)
    return model


def _print_plan(model) -> None:
    plan = getattr(model, "memory_plan", None)
    for line in plan.lines() if plan is not None else ():
        print(f"[llambda] memory plan: {line}", file=sys.stderr)


def _stream_out(events, verbose: bool, t_start: float, hider=None) -> str:
    """Writes the text as it comes (past its thought, with a --hidethinking `hider`); returns all of it."""
    n, first, text, context_full = 0, None, [], False
    shown = hider or (lambda t: t)
    for ev in events:
        context_full = context_full or ev.context_full
        if ev.token >= 0:
            n += 1
            if first is None:
                first = time.perf_counter()
        if ev.text:
            sys.stdout.write(shown(ev.text))
            sys.stdout.flush()
            text.append(ev.text)
    if hider is not None:
        sys.stdout.write(hider.finish())
    end = time.perf_counter()
    if context_full:
        print("\n[llambda] stopped: the context is full (-c/--ctx-size sets its length)", file=sys.stderr)
    if verbose:
        pre = (first or end) - t_start
        dec = (n - 1) / (end - first) if first and n > 1 and end > first else 0.0
        print(f"\n[llambda] {n} tokens; first token after {pre * 1000:.0f} ms; decode {dec:.1f} tokens/s",
              file=sys.stderr)
    return "".join(text)


STDIN_MAX_CHARS = 16 << 20    # ~4M tokens, past any context; `run < /dev/zero` read until memory ran out


def _read_stdin(what: str) -> str:
    """All of stdin, bounded; a clear error when it is closed (`<&-` made sys.stdin None: a traceback)."""
    if sys.stdin is None:
        raise LlambdaError(f"no {what} given and stdin is closed")
    return _read_capped(sys.stdin, STDIN_MAX_CHARS, "stdin", hint=f": too long for the {what}")


def _names_a_model(word: str) -> bool:
    """`run`'s first word is the model when it names one: a catalogued name (as Ollama users type it,
    `smollm2-135m:latest`), a .gguf file (found or not: a missing one is an error, not a prompt) or a
    Hugging Face model directory."""
    from . import hub
    return (hub.is_catalogued(word) or hub.catalogued_name(word) is not None or word.lower().endswith(".gguf")
            or os.path.isfile(os.path.join(word, "config.json")))


def _looks_like_a_model(word: str) -> bool:
    """A word shaped as a model name (`llama3:8b`) or close to a catalogued one (`smollm2`), which no prompt
    would start with."""
    from . import hub
    return not any(c.isspace() for c in word) and bool(
        re.fullmatch(r"[A-Za-z][\w.-]*:[\w.-]+", word) or hub.did_you_mean(word, 0.7))


def _run_model_and_prompt(a) -> str | None:
    """`llambda run [MODEL] PROMPT...` as `ollama run` takes it: without -m, a first word that names a
    model is the model; the other words, joined by spaces, are the prompt (None: none given)."""
    from . import hub
    words = list(a.prompt)
    if a.model is None:
        if words and _names_a_model(words[0]):
            a.model = _model_name(words.pop(0))
        elif words and _looks_like_a_model(words[0]):
            # `llambda run llama3:8b "hi"`, `llambda run smollm2`: a model meant, not a prompt for the default one
            said = hub.did_you_mean(words[0]) or "."
            raise ModelNotFoundError(f"{words[0]!r} is not a catalogued model ({', '.join(sorted(hub.CATALOG))})"
                                     f"{said} For a prompt that starts with it, give it with -p")
        else:
            a.model = DEFAULT_MODEL
    given = [w for w, v in (("-p", a.prompt_text), ("-f", a.prompt_file), ("the prompt's words", words)) if v]
    if len(given) > 1:
        raise ValueError(f"the prompt is given twice ({' and '.join(given)}): give it one way")
    if a.prompt_file is not None:
        try:
            with open(a.prompt_file, encoding="utf-8") as f:
                return _read_capped(f, STDIN_MAX_CHARS, f"the prompt file {a.prompt_file}")
        except (OSError, UnicodeDecodeError) as e:
            raise LlambdaError(f"cannot read the prompt file {a.prompt_file}: {getattr(e, 'strerror', None) or e}"
                               ) from None
    if a.prompt_text is not None:
        return a.prompt_text
    if not words:
        return None
    from .commands.piped_prompt import with_piped_text     # `cat notes | llambda run MODEL "summarize"`
    return with_piped_text(" ".join(words), lambda: _read_stdin("prompt"))


def _image_files(a) -> list[bytes]:
    """--image's files, read (and checked to be images) before the model loads."""
    from .commands.image_paths import read_image
    return [read_image(os.path.expanduser(path)) for path in a.image or []]


def cmd_run(a) -> int:
    prompt = _run_model_and_prompt(a)
    if prompt is None and sys.stdin is not None and sys.stdin.isatty():
        # `llambda run MODEL` at a terminal: a conversation, as `ollama run MODEL` and llama-cli start one
        # (reading a prompt from the terminal waited, silently, for Ctrl-D)
        a.system, a.template_kwargs, a.no_think = None, None, False
        return cmd_chat(a)
    _check_generation_args(a)
    constraint, spec = _constraint_kwargs(a), _speculative_kwargs(a)
    images = _image_files(a)
    if prompt is None:      # `echo "The capital of France is" | llambda run` continued after echo's newline
        prompt = _stdin_text("prompt")
    if not prompt and not images:   # was said only after the load, by the library ("give at least one token")
        raise ValueError("the prompt is empty: give the text to continue (as words, -p, -f FILE or on stdin)")
    from .commands.run_flags import ThoughtHider, warn_unused_in_completion
    from .server.harmony import speaks_harmony
    from .thinking import prompt_opens_thought
    model = _load(a, generates=True)
    if getattr(model, "accepts_images", False):
        # paths in a vision model's prompt are its images (a text model's prompt stays as typed)
        from .commands.image_paths import find_images
        prompt, found = find_images(prompt)
        images += found
    elif images:
        from .commands.image_paths import no_vision
        model.close()
        raise no_vision(a.model)
    if images:      # with images, a chat's one user turn (as ollama run sends it), through the chat template
        from .commands.image_paths import image_message
        from .commands.run_flags import template_kwargs
        template = template_kwargs(a.think, False)
        messages = [image_message(prompt, images)]
        events = model.chat_stream(messages, template_kwargs=template, **_sampling_kwargs(a), **constraint, **spec)
        shown_prompt = model.render_chat(messages, **template) if a.hidethinking else ""
    else:
        warn_unused_in_completion(a.think)
        events = None
        shown_prompt = prompt
    hider = ThoughtHider(prompt_opens_thought(shown_prompt), speaks_harmony(model)) if a.hidethinking else None
    t0 = time.perf_counter()
    try:
        if events is None:
            events = model.stream(prompt, **_sampling_kwargs(a), **constraint, **spec)
        _stream_out(events, a.verbose, t0, hider)
    except KeyboardInterrupt:
        sys.stdout.write("\n")      # the shell's prompt on a line of its own (exit status 130)
        raise
    if a.verbose and model.spec_stats is not None:
        st = model.spec_stats
        print(f"[llambda] speculative: {st.accepted} of {st.drafted} drafted tokens accepted "
              f"({100 * st.acceptance:.0f}%)", file=sys.stderr)
    sys.stdout.write("\n")
    return 0


def cmd_chat(a) -> int:
    from .hub import home
    from .repl import ChatSession, run_chat

    _check_generation_args(a)
    constraint, spec, template = _constraint_kwargs(a), _speculative_kwargs(a), _template_kwargs(a)
    if sys.stdin is None:       # `<&-`: once an AttributeError traceback, after the model loaded
        raise LlambdaError("no messages given and stdin is closed (chat reads them from it)")
    images = _image_files(a)
    model = _load(a, generates=True)
    if images and not getattr(model, "accepts_images", False):
        from .commands.image_paths import no_vision
        model.close()
        raise no_vision(a.model)
    model.chat_template()    # a clear error now for a model without a template
    if constraint:           # an invalid grammar is an error now, not at the first reply
        from .constraints import grammar_spec
        model.compile_grammar(grammar_spec(**constraint))
    session = ChatSession(model, {**_sampling_kwargs(a), **constraint, **spec, **template}, system=a.system,
                          hide_thinking=a.hidethinking, images=images)
    banner = (f"llambda chat: {a.model} ({model.config.arch}, ctx {model.n_ctx}). "
              "/help for commands, Ctrl-C stops a reply, Ctrl-D or /exit leaves.")
    return run_chat(session, banner, home() / "chat_history", verbose=a.verbose)


def _stdin_text(what: str) -> str:
    """stdin as a prompt or text: one final newline dropped, as $(...) drops it (echo's)."""
    text = _read_stdin(what)
    return text[:-1] if text.endswith("\n") else text


def cmd_tokenize(a) -> int:
    from .formats.open import open_named
    text = a.text if a.text is not None else _stdin_text("text")     # `echo hi | llambda tokenize`
    _, src = open_named(a.model)
    tok = src.tokenizer
    if tok is None:
        raise LlambdaError(src.tokenizer_error or "no tokenizer")
    ids = tok.encode(text, add_bos=a.add_bos, parse_special=not a.no_parse_special)
    if a.ids:
        print(ids)
    else:
        for i in ids:
            print(f"{i:>8} {_token_shown(tok, i, a.pieces)}")
    return 0


def cmd_embed(a) -> int:
    if not a.texts and sys.stdin is not None and sys.stdin.isatty():
        # at a terminal the read waited with nothing said
        print("[llambda] reading texts from stdin, one a line; Ctrl-D ends them", file=sys.stderr, flush=True)
    texts = list(a.texts) if a.texts else [line for line in _read_stdin("texts").split("\n") if line.strip()]
    if not texts:
        raise ValueError("nothing to embed: give texts as arguments or on stdin, one a line")
    model = _load(a, vision=False)
    try:
        vectors = model.embed(texts, batch_size=a.batch_size)
    finally:
        model.close()
    if a.format == "text":       # one line a text: the vector's numbers, space-separated
        for v in vectors:
            print(" ".join(f"{x:.7g}" for x in v))
    else:
        print(json.dumps({"model": model.name, "dimensions": int(vectors.shape[1]),
                          "data": [{"text": t, "embedding": v.tolist()} for t, v in zip(texts, vectors)]}))
    return 0


def model_id_for(name: str) -> str:
    """What /v1/models calls the model: a catalogued name as given, a file by its stem."""
    if name in CATALOG:
        return name
    return Path(name).stem or name


def _api_key(key: str | None) -> str | None:
    """The server's key: an empty one serves without a key (said once); one no HTTP client can send as
    given (spaces around it, which header parsing strips; a character outside printable ASCII) is refused."""
    if key is not None and not key.strip():
        warnings.warn("the API key (--api-key or LLAMBDA_API_KEY) is empty: the server requires none", LlambdaWarning)
        return None
    if key is not None and (key != key.strip() or not all(" " <= c <= "~" for c in key)):
        raise ValueError("the API key (--api-key or LLAMBDA_API_KEY) must be printable ASCII with no spaces around "
                         "it: a client cannot send it as given")
    return key


MAX_SHUTDOWN_GRACE = 86400     # a day: a bound on how long a SIGTERM may wait


DEFAULT_MAX_BODY = 4 * 2**20
VISION_MAX_BODY = 32 * 2**20     # a 20 MB image (llambda.vision's MAX_IMAGE_BYTES) is 26.7 MB as base64


def cmd_serve(a: argparse.Namespace) -> int:
    from .api import load
    from .server import ServerConfig, serve
    from .server.config import DEFAULT_KV_TYPE, url_host

    a.api_key = _api_key(a.api_key)
    if a.parallel < 1:
        raise ValueError("--parallel must be >= 1")
    if a.queue_size < 0 or (a.max_body is not None and a.max_body < 1) or a.prefill_chunk < 1:
        raise ValueError("--queue-size must be >= 0, --max-body and --prefill-chunk >= 1")
    if a.max_tokens_cap is not None and a.max_tokens_cap < 1:
        raise ValueError("--max-tokens-cap must be >= 1")
    stored = {k: v for k, v in (("stored_responses", a.stored_responses), ("stored_bytes", a.stored_bytes))
              if v is not None}
    if a.image_rows_memory is not None and a.image_rows_memory < 1:
        raise ValueError("--image-rows-memory must be >= 1 (bytes)")
    if any(v < 0 for v in stored.values()):
        raise ValueError("--stored-responses and --stored-bytes must be >= 0")
    if (a.max_connections is not None and a.max_connections < 1) or not a.header_timeout > 0 \
            or not a.body_timeout > 0 or not 0 < a.send_timeout < float("inf"):
        raise ValueError("--max-connections must be >= 1, --header-timeout, --body-timeout and --send-timeout > 0")
    # checked before the model loads: bind() raised OverflowError (a traceback) on a port out of range
    if not 0 <= a.port <= 65535:
        raise ValueError(f"--port must be 0-65535, not {a.port}")
    # nan crashed uvicorn's shutdown and inf the scheduler's wait (OverflowError) when SIGTERM came
    if not 0 <= a.shutdown_grace <= MAX_SHUTDOWN_GRACE:
        raise ValueError(f"--shutdown-grace must be 0-{MAX_SHUTDOWN_GRACE} seconds, not {a.shutdown_grace}")
    spec = _speculative_kwargs(a)
    load_kw = dict(backend=a.backend, n_ctx=a.ctx_size, activations=a.activations,
                   kv_type=a.kv_type or DEFAULT_KV_TYPE, draft=a.model_draft, draft_threads=a.threads_draft,
                   **_extra_files_kwargs(a))
    model_id = a.alias or model_id_for(a.model)
    aliases = {Path(a.model).name, Path(a.model).stem, a.model} - {model_id}
    cfg = ServerConfig(model_id=model_id, aliases=aliases, host=a.host, port=a.port, parallel=a.parallel,
                       queue_size=a.queue_size, max_tokens_cap=a.max_tokens_cap,
                       max_body_bytes=a.max_body or DEFAULT_MAX_BODY,
                       api_key=a.api_key, prefill_chunk=a.prefill_chunk, shutdown_grace=a.shutdown_grace,
                       max_connections=a.max_connections, header_timeout=a.header_timeout,
                       body_timeout=a.body_timeout, send_timeout=a.send_timeout, webui=not a.no_webui,
                       log_format=a.log_format,
                       speculative=spec["speculative"], draft_max=spec["draft_max"],
                       image_rows_memory=a.image_rows_memory, **stored, **_template_kwargs(a))
    if a.ray or a.write_ray_config:     # replicas under Ray Serve, each loading the model itself
        from .scaleout.cli_args import run
        return run(a, cfg, load_kw)
    if a.port != 0:
        # a port in use (or a host that is not this machine's) was said only once the model had loaded
        from .server.guard import listening_socket
        try:
            listening_socket(a.host, a.port).close()
        except OSError as e:
            raise LlambdaError(f"cannot serve on {a.host}:{a.port}: {e.strerror or e}") from None
    # one slot more than the parallel sequences: /v1/embeddings on a decoder runs in it
    try:
        model = load(a.model, threads=a.threads, n_slots=a.parallel + 1, **load_kw)
    except InsufficientMemoryError as e:
        fit = getattr(e, "slots_fit", None)     # the slots that fit at this context, as the library names them
        if fit is None:
            raise
        raise InsufficientMemoryError(f"{e}. --parallel {a.parallel} asks for {a.parallel + 1} slots (one more for "
                                      "/v1/embeddings): " + (f"at most --parallel {fit - 1} would fit" if fit >= 2
                                      else "not even --parallel 1 fits at this context (-c)")) from None
    cfg.aliases |= {model.name} - {model_id}
    if a.max_body is None and getattr(model, "accepts_images", False):
        cfg.max_body_bytes = VISION_MAX_BODY     # room for an image of the largest size a request takes
    if a.verbose:
        _print_plan(model)
    mem = model.memory_report()
    encoder = getattr(model, "is_encoder", False)
    what = (f"embeddings of {model.config.hidden} dimensions, up to {model.n_ctx} tokens" if encoder
            else f"{a.parallel} slots of {model.n_ctx} tokens")
    url = f"http://{url_host(a.host)}:{a.port}"
    print(f"[llambda] serving {model_id} ({model.config.arch}, backend {model.backend.name}) on "
          f"{url}/v1 with {what}; "
          f"memory {sum(mem.values()) / 2**20:.0f} MiB", file=sys.stderr, flush=True)
    if not encoder and getattr(model, "accepts_images", False):
        from .server.image_rows import budget_bytes, image_width
        rows = budget_bytes(model, cfg.image_rows_memory)
        print(f"[llambda] images: requests hold at most {rows / 2**20:.0f} MiB of encoded rows at once "
              f"(--image-rows-memory; {image_width(model) * 4 / 1024:g} KiB a token)", file=sys.stderr, flush=True)
    if not a.no_webui and not encoder:
        print(f"[llambda] chat page at {url}/", file=sys.stderr, flush=True)
    try:
        return serve(model, cfg, log_level=a.log_level)
    finally:
        model.close()


def _ints(s: str, what: str = "value") -> list[int]:
    try:
        vals = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{what}: expected comma-separated positive integers, got {s!r}") from None
    if not vals or min(vals) < 1:
        raise ValueError(f"{what}: expected comma-separated positive integers, got {s!r}")
    return vals


def _is_encoder_file(path) -> bool:
    from .formats.open import open_model
    src = open_model(Path(path))
    try:
        from .models import ENCODERS
        return getattr(src.config, "arch", None) in ENCODERS
    finally:
        src.close()


def cmd_bench(a) -> int:
    from .backends.native import default_threads
    from .hub import resolve
    from .tools.bench import markdown, run_bench

    path = resolve(a.model)
    if _is_encoder_file(path):      # was an AttributeError traceback ('transformer') after loading
        raise LlambdaError(f"{a.model} is an encoder (an embedding model): bench measures text generation")
    threads = _ints(a.threads_list, "--threads-list") if a.threads_list else [a.threads or default_threads()]
    if a.repetitions < 1:
        raise ValueError("-r/--repetitions must be at least 1")
    if a.spec:
        return _bench_speculative(a, path, threads)
    if a.depth < 0 or a.load < 0:
        raise ValueError("-d/--depth and --load must be >= 0")
    pp = [] if a.n_prompt == "0" else _ints(a.n_prompt, "-p")
    result = run_bench(path, pp, _ints(a.n_gen or "128", "-n"), threads, a.repetitions,
                       a.vs == "llama-cpp", backend=a.backend, activations=a.activations,
                       log=lambda s: print(s, file=sys.stderr), depth=a.depth, load=a.load, kv_type=a.kv_type)
    print(markdown(result, Path(path).name))
    return 0


def _bench_speculative(a, path, threads: list[int]) -> int:
    from .hub import resolve
    from .tools.spec_bench import markdown, run_spec_bench

    if len(threads) != 1 or a.depth or a.load:
        raise ValueError("--spec takes one thread count, and no -d/--load")
    draft = resolve(a.model_draft) if a.model_draft else None
    rows = run_spec_bench(path, a.spec, draft, threads[0], a.repetitions, a.vs == "llama-cpp",
                          n_gen=max(_ints(a.n_gen, "-n")) if a.n_gen else 400, draft_max=a.draft_max,
                          draft_threads=a.threads_draft,
                          log=lambda s: print(s, file=sys.stderr))
    print(markdown(rows, Path(path).name, Path(draft).name if draft else None))
    return 0


PERPLEXITY_MAX_CHARS = 256 << 20   # wikitext-2's test set is 1.3M characters


def cmd_perplexity(a) -> int:
    from .api import load
    from .tools.perplexity import perplexity

    try:
        with open(a.file, encoding="utf-8") as f:
            text = _read_capped(f, PERPLEXITY_MAX_CHARS, f"the text file {a.file}",
                                hint="; perplexity takes a shorter text (it would take days to score anyway)")
    except OSError as e:        # a directory, no permission: an error line, not a traceback
        raise LlambdaError(f"cannot read the text file {a.file}: {e.strerror or e}") from None
    if a.ctx_size < 2:
        raise ValueError("-c/--ctx-size must be at least 2 tokens")
    model = load(a.model, backend=a.backend, threads=a.threads, n_ctx=a.ctx_size, activations=a.activations,
                 kv_type=a.kv_type, vision=False)

    def show(i, ppl):
        print(f"[{i}]{ppl:.4f}", end=" ", flush=True, file=sys.stderr)

    res = perplexity(model, text, n_ctx=a.ctx_size, max_windows=a.chunks, progress=show)
    print(file=sys.stderr)
    print(f"{res.n_windows} windows of {a.ctx_size} tokens, {res.n_scored} tokens scored")
    print(f"perplexity: {res.ppl:.4f}")
    return 0


def cmd_export(a) -> int:
    from .tools.export import export
    out = export(a.model, a.out, fmt=a.format, qtype=a.type)
    print(f"[llambda] wrote {out}", file=sys.stderr)
    return 0


def cmd_quantize(a) -> int:
    from .tools.export import export
    from .formats.gguf import GGUFFile
    out = export(a.input, a.output, fmt="gguf", qtype=a.type, pure=a.pure)
    with GGUFFile(out) as f:
        counts: dict[str, int] = {}
        for t in f.tensors.values():
            counts[t.qtype.name] = counts.get(t.qtype.name, 0) + 1
    mix = ", ".join(f"{n} {k}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    print(f"[llambda] wrote {out} ({a.type.upper()}: {mix} tensors)", file=sys.stderr)
    return 0


def _token_shown(tok, i: int, piece: bool) -> str:
    """The text a token stands for, quoted; bytes that are part of a character as a bytes literal."""
    if piece or tok.is_special(i):
        return repr(tok.token_text(i))
    raw = tok.token_bytes(i)
    try:
        return repr(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return repr(raw)


def _add_template_args(p: argparse.ArgumentParser, scope: str = "") -> None:
    p.add_argument("--template-kwargs", metavar="JSON", default=None,
                   help='extra chat-template variables, e.g. \'{"reasoning_effort": "low"}\' (gpt-oss)' + scope)
    p.add_argument("--no-think", action="store_true",
                   help="tell a reasoning model not to think (enable_thinking false: Qwen3, SmolLM3)" + scope)


def build_parser() -> argparse.ArgumentParser:
    from . import __version__
    from .commands.run_flags import add_arguments as add_ollama_run_args

    ap = argparse.ArgumentParser(prog="llambda", description="CPU inference for LLMs")
    ap.add_argument("-v", "--version", action="version", version=f"llambda {__version__}")   # ollama -v
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND",
                            help="one of the commands below; `llambda COMMAND -h` says what it takes")

    p = sub.add_parser("run", help="complete a prompt, streaming to stdout",
                       description="Complete a prompt as it is written (no chat template: `llambda chat` "
                                   "holds a conversation), streaming the text to stdout. "
                                   "`llambda run MODEL PROMPT` works as with ollama; with no prompt, "
                                   "at a terminal, it starts `llambda chat`. With images (--image, or for a "
                                   "model with a vision tower image paths in the prompt: ./cat.png, "
                                   "'/my pics/cat.png'), the prompt and its images are one user message "
                                   "rendered by the chat template, as ollama run sends them.")
    _add_model_args(p, default_model=None)
    _add_sampling_args(p)
    _add_constraint_args(p)
    _add_speculative_args(p)
    _add_lora_args(p)
    _add_mmproj_arg(p)
    g = p.add_argument_group("the prompt as llama-cli takes it (instead of the words)")
    g.add_argument("-p", "--prompt", dest="prompt_text", metavar="TEXT", default=None, help="the prompt")
    g.add_argument("-f", "--file", dest="prompt_file", metavar="FILE", default=None,
                   help="the prompt is the text of FILE (as it is, final newline included)")
    add_ollama_run_args(p)
    _add_image_args(p)
    p.add_argument("prompt", nargs="*", metavar="[MODEL] PROMPT",
                   help="the prompt, its words joined by spaces, after the text of a piped stdin as ollama "
                        "sends it (no words: stdin alone; at a terminal, a chat); "
                        "without -m, a first word naming a model (a catalogued name, a .gguf file, a HF "
                        "directory) is the model")
    p.set_defaults(fn=cmd_run)

    p = sub.add_parser("chat", help="interactive chat with history")
    _add_model_args(p)
    _add_sampling_args(p)
    _add_constraint_args(p)
    _add_speculative_args(p)
    _add_lora_args(p)
    _add_mmproj_arg(p)
    p.add_argument("--system", default=None, help="system prompt")
    _add_template_args(p)
    add_ollama_run_args(p)
    _add_image_args(p)
    p.add_argument("model_arg", nargs="?", metavar="MODEL", help="the same as -m (`llambda chat MODEL`)")
    p.set_defaults(fn=cmd_chat)

    p = sub.add_parser("pull", help="download a catalogued model into the cache")
    p.add_argument("name")
    p.add_argument("--force", action="store_true", help="download again even if the cached copy verifies")
    p.set_defaults(fn=cmd_pull)

    p = sub.add_parser("list", aliases=["ls"], help="catalogued models: which are downloaded, their size and path")
    p.set_defaults(fn=cmd_list)

    from .commands.ps import add_parser as add_ps_parser
    add_ps_parser(sub)

    p = sub.add_parser("rm", help="remove downloaded models from the cache")
    p.add_argument("names", nargs="+", metavar="NAME")
    p.set_defaults(fn=cmd_rm)

    p = sub.add_parser("show", help="what a model holds: architecture, parameters, quant types, memory needed")
    _add_model_args(p, runtime=False)
    p.add_argument("-c", "--ctx-size", type=int, default=None, help="context to size the memory for "
                   "(default min(train, 4096))")
    p.add_argument("--kv-type", choices=["f32", "f16", "q8_0"], default=None, help="KV cache precision to plan for")
    p.add_argument("-v", "--verbose", action="store_true", help="also print the memory plan of a load")
    p.add_argument("model_arg", nargs="?", metavar="MODEL", help="the same as -m")
    p.set_defaults(fn=cmd_show)

    p = sub.add_parser("embed", help="embedding vectors of texts (an encoder such as all-minilm-l6-v2, "
                       "or a decoder pooled on its last token), L2-normalized")
    _add_model_args(p)
    p.add_argument("texts", nargs="*", metavar="TEXT", help="texts to embed (default: stdin, one a line)")
    p.add_argument("--format", choices=("json", "text"), default="json",
                   help="json: {model, dimensions, data: [{text, embedding}]}; text: a line of numbers a text")
    p.add_argument("--batch-size", type=int, default=32, help="texts per forward pass (encoders)")
    p.set_defaults(fn=cmd_embed)

    p = sub.add_parser("tokenize", help="show the tokens of a text")
    _add_model_args(p, runtime=False)
    p.add_argument("text", nargs="?", help="the text (default: stdin, less its final newline)")
    p.add_argument("--ids", action="store_true", help="print only the id list")
    p.add_argument("--add-bos", action="store_true", help="start with the model's BOS token if it uses one")
    p.add_argument("--no-parse-special", action="store_true",
                   help="treat text such as <|im_start|> as plain text, not as the special token")
    p.add_argument("--pieces", action="store_true",
                   help="show each token as written in the vocabulary (e.g. 'Ġworld') instead of its text")
    p.set_defaults(fn=cmd_tokenize)

    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server with continuous batching",
                       description="Serve /v1/chat/completions, /v1/completions, /v1/models, /health, /metrics, "
                                   "and the Responses, Anthropic, llama-server and Ollama (/api/*) APIs.")
    _add_model_args(p)
    _add_speculative_args(p)
    _add_lora_args(p)
    _add_mmproj_arg(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    p.add_argument("--parallel", "-np", type=int, default=4,
                   help="sequences decoded together = KV-cache slots, each of --ctx-size tokens (default 4)")
    p.add_argument("--queue-size", type=int, default=64,
                   help="sequences that may wait for a slot; beyond that requests get 429 (default 64)")
    p.add_argument("--api-key", default=os.environ.get("LLAMBDA_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on every route but /health and the chat page "
                        "(default: $LLAMBDA_API_KEY)")
    p.add_argument("--alias", default=None, help="model id to serve under (default: the -m name)")
    p.add_argument("--max-tokens-cap", type=int, default=None,
                   help="most tokens one request may generate (default: up to the context)")
    p.add_argument("--max-body", type=int, default=None,
                   help="request body limit in bytes (default 4 MiB; 32 MiB for a model with a vision tower, "
                        "room for one 20 MB image in base64)")
    # defaults None: ServerConfig's apply (importing them here would load the server for every command)
    p.add_argument("--stored-responses", type=int, default=None,
                   help="/v1/responses kept in memory for previous_response_id and GET; the oldest go "
                        "first (default 10000; 0: none)")
    p.add_argument("--stored-bytes", type=int, default=None,
                   help="their JSON together, in bytes; the oldest go first (default 256 MiB)")
    p.add_argument("--image-rows-memory", type=int, default=None, metavar="BYTES",
                   help="encoded image rows (float32, a row per image token) the requests hold at once, queued or "
                        "prefilling; a request waits for room, one larger alone is refused (default: max(4 requests "
                        "whose images fill the context, 1 GiB))")
    p.add_argument("--prefill-chunk", type=int, default=256,
                   help="prompt tokens evaluated per step while other streams run (default 256)")
    p.add_argument("--shutdown-grace", type=float, default=30.0,
                   help="seconds in-flight requests may take to finish after SIGTERM (default 30)")
    p.add_argument("--max-connections", type=int, default=None,
                   help="open connections; more are answered 503 and closed (default 2 x (parallel + "
                        "queue-size) + 16, within the open-file limit)")
    p.add_argument("--header-timeout", type=float, default=10.0,
                   help="seconds a client gets to send a request's headers (default 10)")
    p.add_argument("--body-timeout", type=float, default=30.0,
                   help="seconds a client gets to send a request's body (default 30)")
    p.add_argument("--send-timeout", type=float, default=60.0,
                   help="seconds a client that reads nothing of a response filling the connection's buffers "
                        "gets before the connection is aborted (default 60)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    p.add_argument("--log-format", default="text", choices=["text", "json"],
                   help="log lines (at info: one per request, with tokens in/out and ms) as text or as "
                        "one JSON object per line (default text)")
    p.add_argument("--no-webui", action="store_true", help="do not serve the chat page at /")
    _add_template_args(p, "; the default of every request, which a request's own override by name")
    from .scaleout.cli_args import add_arguments as add_scaleout_arguments
    add_scaleout_arguments(p)
    p.set_defaults(fn=cmd_serve)

    p = sub.add_parser("bench", help="prefill/decode tokens/s (llama-bench style)")
    _add_model_args(p)
    p.add_argument("-p", "--n-prompt", default="512", help="prompt lengths, comma-separated (default 512; 0: none)")
    p.add_argument("-n", "--n-gen", default=None,
                   help="generation lengths, comma-separated (default 128; with --spec, at most 400 tokens)")
    p.add_argument("--threads-list", default=None, help="thread counts, comma-separated (default: -t or all cores)")
    p.add_argument("-r", "--repetitions", type=int, default=5)
    p.add_argument("-d", "--depth", type=int, default=0,
                   help="tokens already in the cache before each test, as llama-bench's -d (default 0)")
    p.add_argument("--load", type=int, default=0, metavar="N",
                   help="run N busy-loop processes beside the benchmark, for both engines (default 0)")
    p.add_argument("--vs", choices=["llama-cpp"], default=None, help="also run llama.cpp (llama-cpp-python) on the same file")
    p.add_argument("--spec", choices=["draft", "lookup"], default=None,
                   help="speculative against plain decoding on code tasks (draft: with --model-draft)")
    p.add_argument("--model-draft", metavar="MODEL", default=None, help="the draft model of --spec draft")
    p.add_argument("--draft-max", type=int, default=None, metavar="N", help="most tokens drafted per step")
    p.add_argument("--threads-draft", type=int, default=None, metavar="N", help="threads of the draft model")
    p.set_defaults(fn=cmd_bench)

    p = sub.add_parser("perplexity", help="perplexity of a text file (llama.cpp's method)")
    _add_model_args(p, ctx_help="window length in tokens, also the context the model is loaded with (default 512)")
    p.set_defaults(ctx_size=512)
    p.add_argument("-f", "--file", required=True, help="text file")
    p.add_argument("--ctx", dest="ctx_size", type=int, help="the same as -c/--ctx-size")
    p.add_argument("--chunks", type=int, default=None, help="score at most this many windows")
    p.set_defaults(fn=cmd_perplexity)

    p = sub.add_parser("export", help="write a model as a Hugging Face directory or a GGUF file")
    _add_model_args(p, runtime=False)
    p.add_argument("--format", choices=["hf", "gguf"], required=True,
                   help="hf: a directory (model.safetensors, config.json, tokenizer); gguf: one file")
    p.add_argument("--out", required=True, help="output directory (hf) or file (gguf)")
    p.add_argument("--type", default=None,
                   help="tensor type: f32, f16, bf16 (both formats) or q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, "
                        "q6_k, iq4_nl, iq4_xs, mxfp4, or a mix as `quantize` takes (gguf; norms stay f32). Default: keep the "
                        "source's (hf: quantized ones become f32)")
    p.set_defaults(fn=cmd_export)

    p = sub.add_parser("quantize", help="write a model's matrices in another GGUF type (export --format gguf --type)")
    p.add_argument("input", help="a GGUF file (F32/F16/BF16/Q8_0 or any type llambda decodes) or a HF directory")
    p.add_argument("output", help="the GGUF file to write")
    p.add_argument("type", help="a mix as llama.cpp makes it: q4_k_m, q5_k_m, q3_k_m, q2_k (also q3_k_s, q3_k_l, "
                               "q4_k_s, q5_k_s); or one type for every matrix: q8_0, q4_0, q4_1, q5_0, q5_1, q3_k, "
                               "q4_k, q5_k, q6_k, iq4_nl, iq4_xs, mxfp4, f16, bf16, f32")
    p.add_argument("--pure", action="store_true", help="a mix's default type for every matrix (q2_k: all Q2_K)")
    p.set_defaults(fn=cmd_quantize)
    return ap


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"llambda: warning: {message}", file=sys.stderr)


def _model_name(name):
    """A catalogued model's name as Ollama users type it (`SmolLM2-135M`, `smollm2-135m:latest`) -> the
    catalogue's; anything else (a path) as it is. A file or directory of the very name typed wins."""
    from . import hub
    if not isinstance(name, str) or hub.is_catalogued(name):
        return name
    key = hub.catalogued_name(name)
    return name if key is None or os.path.lexists(name) else key


def main(argv=None) -> int:
    warnings.showwarning = _show_warning      # one plain line, not a source location
    from .commands.run_flags import bare_think_as_true
    ap = build_parser()
    argv = bare_think_as_true(sys.argv[1:] if argv is None else list(argv), ap)
    a, extra = ap.parse_known_args(argv)
    if extra and a.cmd == "run" and not any(w.startswith("-") for w in extra):
        # `run MODEL -n 8 PROMPT`: argparse takes one run of positionals; words after an option are the
        # prompt's too (they were "unrecognized arguments")
        a.prompt += extra
    elif extra:
        a = ap.parse_args(argv)       # its usage line and error for what is not understood
    if getattr(a, "model_arg", None) is not None:     # `show ""` showed the default model
        a.model = a.model_arg
    for attr in ("model", "model_draft", "name", "input"):      # pull's name, quantize's input
        if isinstance(getattr(a, attr, None), str):
            setattr(a, attr, _model_name(getattr(a, attr)))
    if getattr(a, "names", None):
        a.names = [_model_name(n) for n in a.names]
    try:
        rc = a.fn(a) or 0
        sys.stdout.flush()      # here, where a closed pipe is caught, not at exit
        return rc
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `llambda list | head -1`: the reader left, which is no error of ours; end as a program killed by
        # SIGPIPE would (status 141), without the traceback. Python's flush at exit would fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except (LlambdaError, FileNotFoundError, ValueError) as e:
        print(f"llambda: error: {_named_as_flag(str(e))}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
