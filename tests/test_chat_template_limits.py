"""Hostile chat templates (issue 12, item 2): every payload stops fast with a ChatTemplateError and
bounded memory, a failed render frees what it built at once, and a server whose model carries such a
template keeps answering other requests and still shuts down on SIGTERM.

The payloads run in a child process under an address-space limit, so a regression shows as a failed
test rather than a machine out of memory.
"""
from __future__ import annotations

import concurrent.futures as cf
import gc
import json
import os
import signal
import subprocess
import sys
import threading
import time
import tracemalloc
import weakref
from pathlib import Path

import httpx
import pytest

import llambda
from llambda.chat import ChatTemplate
from llambda.errors import ChatTemplateError
from llambda.server import ServerConfig, create_app
from serverkit import LOAD_KW, LiveServer, ServerProcess, assert_error

USER = [{"role": "user", "content": "hi"}]
TIME_LIMIT = 2.0                    # CPU seconds a payload may take to be refused
TRACED_LIMIT = 160 * 2**20          # peak Python allocations while refusing it
CHILD_ADDRESS_SPACE = 3 * 2**30     # the child dies rather than take the machine

S = "{% set s = 'ab' * 500000 %}"                   # a 1M-char string built by the template
DEEP = "{% set ns = namespace(x=1) %}{% for i in range(N) %}{% set ns.x = [ns.x] %}{% endfor %}"

PAYLOADS = {
    # the list
    "in_repeated": S + "{% for i in range(100000) %}{% if 'zz' in s %}{% endif %}{% endfor %}",
    "lipsum_huge": "{{ lipsum(100, false, 999999, 1000000) }}",
    "wordwrap_1": "{{ ('a' * 1000000)|wordwrap(1) }}",
    "join_repeated": S + "{{ ([s] * 1000)|join }}",
    "indent_huge": "{{ ('a\n' * 500000)|indent(999999) }}",
    "format_precision": "{{ ('%.999999f' * 1000)|format(*([1.5] * 1000)) }}",
    "tojson_deep_indent": DEEP.replace("N", "900") + "{{ ns.x|tojson(indent=999999) }}",
    # variants
    "in_test_repeated": S + "{% for i in range(100000) %}{% if 'zz' is in s %}{% endif %}{% endfor %}",
    "in_list_repeated": "{% set l = range(99999)|list %}{% for i in range(100000) %}{% if -1 in l %}{% endif %}"
                        "{% endfor %}",
    "in_nested_lists": S + "{% set a = [[s] * 1000] * 1000 %}{{ 'x' in a }}",
    "eq_distinct_copies": S + "{% set t = s[:] %}{% set a = [[s] * 1000] * 1000 %}{% set b = [[t] * 1000] * 1000 %}"
                          "{{ a == b }}",
    "eq_repeated": S + "{% set t = 'ab' * 500000 %}{% for i in range(100000) %}{% if s == t %}{% endif %}"
                   "{% endfor %}",
    "replace_count": "{{ ('a' * 1000)|replace('a', 'b' * 999, 999999999) }}",
    "replace_growth": "{{ ('a' * 100000)|replace('a', 'b' * 100) }}",
    "replace_method": "{{ ('a' * 100000).replace('a', 'b' * 100) }}",
    "center_repeated": "{% for i in range(100000) %}{% set x = 'a'|center(999999) %}{% endfor %}",
    "ljust_repeated": "{% for i in range(100000) %}{% set x = 'a'.ljust(999999) %}{% endfor %}",
    "list_repeat_printed": S + "{{ [s] * 1000 }}",
    "list_plus_repeated": S + "{% set l = [s] * 500000 %}{% for i in range(100000) %}{% set x = l + l %}{% endfor %}",
    "concat_loop": S + "{% for i in range(100000) %}{% set x = s ~ s %}{% endfor %}",
    "concat_list": S + "{{ ([s] * 1000) ~ '' }}",
    "percent_width": "{% for i in range(100000) %}{% set x = '%999999d' % 1 %}{% endfor %}",
    "percent_named_repeat": S + "{{ ('%(a)s' * 1000) % {'a': s} }}",
    "brace_format_repeat": S + "{{ ('{0}' * 1000).format(s) }}",
    "format_map_repeat": S + "{{ ('{a}' * 1000).format_map({'a': s}) }}",
    "brace_precision": "{{ ('{:.999999f}' * 100).format(*([1.5] * 100)) }}",
    "sort_big": "{% set l = range(99999)|map('string')|list %}{% for i in range(1000) %}{% set x = l|sort %}"
                "{% endfor %}",
    "sort_same_big_string": S + "{% for i in range(1000) %}{% set x = ([s] * 1000)|sort %}{% endfor %}",
    "dictsort_repeated": "{% set d = {} %}{% for i in range(1000) %}{% set x = (range(99999)|list|reverse|list)|sort %}"
                         "{% endfor %}",
    "unique_repeated": "{% for i in range(100) %}{% set x = range(99999)|map('string')|unique|list %}{% endfor %}",
    "groupby_repeated": "{% for i in range(100) %}{% set x = range(99999)|map('string')|groupby('0')|list %}"
                        "{% endfor %}",
    "urlize_big": "{{ ('www.a.com ' * 100000)|urlize }}",
    "xmlattr_big": S + "{% for i in range(10000) %}{% set x = {'a': s, 'b': s}|xmlattr %}{% endfor %}",
    "namespace_growth": S + "{% set ns = namespace() %}{% for i in range(100) %}{% set ns.x = range(30)|map('center', "
                        "999999)|list %}{% endfor %}",
    "map_center": "{{ range(1000)|map('center', 999999)|list|length }}",
    "range_step": "{% for i in range(0, 10**9, 1) %}{% endfor %}",
    "range_huge_step_loop": "{% for j in range(100000) %}{% for i in range(0, 10**9, 10**4) %}{% endfor %}{% endfor %}",
    "nested_macros": "{% macro a(s) %}{{ s }}{{ s }}{% endmacro %}{% macro b(s) %}{{ a(a(s)) }}{% endmacro %}"
                     "{{ b(b(b(b(b(b(b('x' * 1000))))))) }}",
    "macro_caller_repeat": S + "{% macro m() %}{{ caller() }}{{ caller() }}{% endmacro %}{% for i in range(1000) %}"
                           "{% call m() %}{{ s }}{% endcall %}{% endfor %}",
    "string_deep": DEEP.replace("N", "5000") + "{{ ns.x|string|length }}",
    "string_wide": S + "{{ ([s] * 1000)|string }}",
    "pprint_wide": S + "{{ ([s] * 1000)|pprint }}",
    "tojson_wide": S + "{{ ([s] * 1000)|tojson }}",
    "batch_huge": "{{ range(10)|batch(999999, 'x')|list }}",
    "slice_huge": "{% for i in range(1000) %}{% set x = range(10)|slice(999999, 'x')|list %}{% endfor %}",
    "sum_of_lists": S + "{{ ([[s] * 1000] * 1000)|sum(start=[])|length }}",
    "int_many_digits": "{% for i in range(100000) %}{% set x = ('9' * 1000000)|int %}{% endfor %}",
    "int_hex_digits": "{{ ('f' * 1000000)|int(base=16) }}",
    "int_power": "{% for i in range(100000) %}{% set x = (10 ** 4000) * (10 ** 4000) // 3 %}{% endfor %}",
    "striptags_comments": "{{ ('<!---->' * 140000)|striptags }}",
    "title_repeated": "{% for i in range(1000) %}{% set x = ('a-' * 500000)|title %}{% endfor %}",
    "escape_repeated": "{% for i in range(1000) %}{% set x = ('&' * 999999)|e %}{% endfor %}",
    "urlencode_repeated": S + "{% for i in range(10000) %}{% set x = s|urlencode %}{% endfor %}",
    "upper_repeated": S + "{% for i in range(100000) %}{% set x = s|upper %}{% endfor %}",
    "count_repeated": S + "{% for i in range(100000) %}{% set x = s.count('b') %}{% endfor %}",
    "split_repeated": S + "{% for i in range(10000) %}{% set x = s.split('a') %}{% endfor %}",
    "slice_copies": S + "{% for i in range(100000) %}{% set x = s[1:] %}{% endfor %}",
    "join_method": S + "{{ ''.join([s] * 1000) }}",
    "wordcount_repeated": "{% for i in range(1000) %}{% set x = ('a ' * 500000)|wordcount %}{% endfor %}",
    "truncate_end": "{{ ('a' * 10)|truncate(5, false, 'x' * 999999) }}",
    "cycler_loop": "{% set c = cycler(*range(99999)) %}{% for i in range(100000) %}{{ c.next() }}{% endfor %}",
    "strftime_long": "{{ strftime_now('%c' * 400000) }}",
    "constant_folding": "{{ ('ab'|center(999999))|wordwrap(1)|length }}" * 50,
    "loop_everything": "{% for i in range(100000) %}{% for m in messages %}{% endfor %}{% endfor %}",
}


# -- the payloads, in a child process ---------------------------------------------------------

def _payload_child() -> None:
    """Read template sources (JSON lines), render each, answer with what happened (JSON lines)."""
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (CHILD_ADDRESS_SPACE, CHILD_ADDRESS_SPACE))
    def render(source):
        try:
            ChatTemplate(source).render(USER)
            return {"raised": None}
        except BaseException as e:         # anything but a ChatTemplateError fails the test
            return {"raised": type(e).__name__, "message": str(e)[:300]}

    for line in sys.stdin:
        source = json.loads(line)
        gc.collect()
        # timed on its own (tracemalloc slows allocations 2-3x), in CPU time: the machine is shared
        cpu, wall = time.process_time(), time.perf_counter()
        out = render(source)
        out["cpu_seconds"], out["seconds"] = time.process_time() - cpu, time.perf_counter() - wall
        gc.collect()
        tracemalloc.start()
        again = render(source)
        out["traced_peak"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        out["same_outcome"] = again["raised"] == out["raised"]
        print(json.dumps(out), flush=True)


class PayloadRunner:
    def __init__(self):
        self.proc = None

    def start(self):
        code = "import sys; sys.path.insert(0, 'tests'); import test_chat_template_limits as t; t._payload_child()"
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, cwd=Path(__file__).parent.parent)

    def run(self, source: str, timeout: float = 30.0) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        self.proc.stdin.write(json.dumps(source) + "\n")
        self.proc.stdin.flush()
        with cf.ThreadPoolExecutor(1) as ex:
            fut = ex.submit(self.proc.stdout.readline)
            try:
                line = fut.result(timeout)
            except cf.TimeoutError:
                self.stop()
                pytest.fail(f"no answer within {timeout} s")
        if not line:
            code = self.proc.wait()
            self.proc = None
            pytest.fail(f"the render killed its process (exit status {code}: out of its address space?)")
        return json.loads(line)

    def stop(self):
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


@pytest.fixture(scope="module")
def runner():
    r = PayloadRunner()
    yield r
    r.stop()


@pytest.mark.parametrize("name", sorted(PAYLOADS))
def test_payload_is_refused_fast_with_bounded_memory(runner, name):
    out = runner.run(PAYLOADS[name])
    assert out["raised"] == "ChatTemplateError", out
    assert out["cpu_seconds"] < TIME_LIMIT and out["seconds"] < 5 * TIME_LIMIT, out
    assert out["same_outcome"] and out["traced_peak"] < TRACED_LIMIT, out


def test_the_child_measures_what_a_render_allocates(runner):
    # the control: a render within the limits succeeds, and its allocations show in the peak
    out = runner.run("{% set s = 'x' * 900000 %}{{ s ~ 'y' }}")
    assert out["raised"] is None and out["traced_peak"] > 1_800_000, out


# -- limits that need no child ---------------------------------------------------------------------

def test_cpu_budget_stops_a_render():
    # cheap steps, many of them: the step budget is out of the way, the clock stops it
    src = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    t0, c0 = time.perf_counter(), time.process_time()
    with pytest.raises(ChatTemplateError, match="CPU time"):
        ChatTemplate(src, max_steps=10**12, max_seconds=0.2).render(USER)
    # CPU time: bounded whatever the machine's load; wall time only against a hang (a loaded machine's
    # scheduler stretches a 0.2 s CPU budget to seconds of wall time)
    assert time.process_time() - c0 < 1.5
    assert time.perf_counter() - t0 < 30


def test_built_bytes_budget():
    src = "{% for i in range(100) %}{% set x = 'a'|center(100000) %}{% endfor %}ok"
    assert ChatTemplate(src, max_built_bytes=20 * 2**20).render(USER) == "ok"
    with pytest.raises(ChatTemplateError, match="MiB of values"):
        ChatTemplate(src, max_built_bytes=5 * 2**20).render(USER)


def test_template_source_size_is_bounded():
    """Compiling is not under the render budget and costs ~0.8 KB and ~13 us per source char: a 20 MB
    template in a GGUF once took gigabytes and minutes at first use. Past the cap it is refused at once."""
    from llambda.chat import MAX_SOURCE_CHARS
    unit = "{% if messages %}a{% endif %}"
    fits = unit * (MAX_SOURCE_CHARS // len(unit))
    assert ChatTemplate(fits).render(USER) == "a" * (MAX_SOURCE_CHARS // len(unit))
    c0 = time.process_time()
    with pytest.raises(ChatTemplateError, match="characters long"):
        ChatTemplate(unit * (20 * 2**20 // len(unit)))
    assert time.process_time() - c0 < 0.5


def test_a_template_that_does_not_compile_is_compiled_once(smollm2_gguf, monkeypatch):
    """A broken template used to be compiled again on every chat call (up to seconds at the source cap)."""
    import llambda
    import llambda.chat as chat_mod
    calls = []

    class Broken(ChatTemplate):
        def __init__(self, *a, **kw):
            calls.append(1)
            super().__init__("{% if %}")

    m = llambda.load(smollm2_gguf, n_ctx=64)
    try:
        monkeypatch.setattr(chat_mod, "ChatTemplate", Broken)
        for _ in range(3):
            with pytest.raises(ChatTemplateError, match="syntax error"):
                m.render_chat(USER)
        assert len(calls) == 1
    finally:
        m.close()


def test_error_messages_are_short():
    with pytest.raises(ChatTemplateError) as e:
        ChatTemplate("{{ raise_exception('x' * 100000) }}").render(USER)
    assert len(str(e.value)) < 3000
    with pytest.raises(ChatTemplateError) as e:
        ChatTemplate("{{ {}[('k' * 100000)].a }}").render(USER)
    assert len(str(e.value)) < 3000


def test_legitimate_uses_of_the_guarded_operations_render():
    msgs = [{"role": "user", "content": "a\nb & c"}]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    src = ("{{ messages[0].content|indent(4, first=true) }}|{{ tools|tojson(indent=4)|length > 0 }}|"
           "{{ '%s=%d' % ('n', 3) }}|{{ '{}:{:>4}'.format('k', 7) }}|{{ messages|map(attribute='role')|join(', ') }}|"
           "{{ 'x' in messages[0].content }}|{{ messages[0].content[:3] }}|{{ ['b', 'a']|sort|join }}|"
           "{{ messages[0].content|e }}|{{ (messages[0].content ~ '!')|upper }}|{{ 'ab'.join(['1', '2']) }}")
    out = ChatTemplate(src).render(msgs, tools=tools)
    assert out == "    a\n    b & c|True|n=3|k:   7|user|False|a\nb|ab|a\nb &amp; c|A\nB & C!|1ab2"


def test_a_long_conversation_near_the_output_cap_renders():
    # ~900k chars of content through a ChatML template: far from every budget
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": "word " * 18000} for i in range(10)]
    out = ChatTemplate.default_chatml().render(msgs)
    assert len(out) > 900_000


# -- a failed render frees its memory at once -----------------------------------------------------------

def test_failed_render_garbage_is_freed_without_gc():
    refs = []

    def keep(obj):
        refs.append(weakref.ref(obj))
        return ""

    src = "{% set ns = namespace(big='x' * 900000) %}{{ keep(ns) }}{% set t = ns.big ~ 'y' %}{{ 1 / 0 }}"
    template = ChatTemplate(src)
    gc.collect()
    gc.disable()        # only reference counting may free it: no cycle may hold it
    try:
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(3):
            with pytest.raises(ChatTemplateError, match="ZeroDivisionError"):
                template.render(USER, keep=keep)
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        assert refs and all(r() is None for r in refs)
        assert after - before < 200_000, f"{after - before} bytes still held after 3 failed renders"
    finally:
        gc.enable()


def test_budget_failures_free_their_memory_too():
    src = "{% set ns = namespace(big='x' * 900000) %}{{ keep(ns) }}{% for i in range(10**5) %}{% endfor %}"
    refs = []
    gc.collect()
    gc.disable()
    try:
        with pytest.raises(ChatTemplateError, match="work budget"):
            ChatTemplate(src, max_steps=1000).render(USER, keep=lambda o: refs.append(weakref.ref(o)) or "")
        assert refs and refs[0]() is None
    finally:
        gc.enable()


# -- the server ----------------------------------------------------------------------------------

ATTACKS = {
    # each ran for minutes (or took gigabytes) before the limits
    "loop": S + "{% for i in range(100000) %}{% if 'zz' in s %}{% endif %}{% endfor %}",
    "join": S + "{{ ([s] * 1000)|join }}",
    "wrap": "{{ ('a' * 1000000)|wordwrap(1) }}",
}
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
# Harmless unless the last message names an attack.
HOSTILE = ("{% set last = messages[-1]['content'] %}"
           + "".join(f"{{% if last == '{name}' %}}{src}{{% endif %}}" for name, src in ATTACKS.items())
           + CHATML)


@pytest.fixture(scope="module")
def hostile_live(smollm2_gguf):
    with llambda.load(smollm2_gguf, n_slots=2, n_ctx=256, **LOAD_KW) as m:
        m._template = ChatTemplate(HOSTILE, bos_token="", eos_token="<|im_end|>")   # as if from the file
        cfg = ServerConfig(model_id="smollm2", parallel=2, queue_size=8, prompt_workers=2)
        with LiveServer(create_app(m, cfg)) as srv:
            yield srv


def _chat(url, content, timeout=60, model="smollm2"):
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 4,
            "temperature": 0}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=timeout)


def test_hostile_template_requests_get_400_and_do_not_block_others(hostile_live):
    url = hostile_live.url
    # 6 attacks + 2 normal requests fit 2 workers and a backlog of 8: nobody is refused with a 429
    attacks = [name for name in ATTACKS for _ in range(2)]
    t0 = time.monotonic()
    with cf.ThreadPoolExecutor(len(attacks) + 2) as ex:
        hostile = [ex.submit(_chat, url, name) for name in attacks]
        time.sleep(0.2)                     # the attacks hold the prompt workers now
        normal = [ex.submit(_chat, url, "Name a color.") for _ in range(2)]
        health = httpx.get(url + "/health", timeout=5)
        for f in normal:
            r = f.result()
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["message"]["content"] is not None
        for f in hostile:
            assert_error(f.result(), 400, "chat template")
    elapsed = time.monotonic() - t0
    assert health.status_code == 200 and "prompts_preparing" in health.json()
    assert elapsed < 30, f"{len(attacks)} hostile and 2 normal requests took {elapsed:.1f} s"
    h = httpx.get(url + "/health", timeout=5).json()
    assert h["status"] == "ok" and h["prompts_preparing"] == 0 and h["prompts_waiting"] == 0


def test_health_reports_stalled_prompt_workers(smollm2_gguf):
    """/health answers 503 while every prompt worker is stuck (here: a job that sleeps)."""
    with llambda.load(smollm2_gguf, n_slots=1, n_ctx=128, **LOAD_KW) as m:
        cfg = ServerConfig(model_id="smollm2", parallel=1, prompt_workers=1, prompt_stall_seconds=0.3)
        app = create_app(m, cfg)
        with LiveServer(app) as srv:
            service = app.state.service
            release = threading.Event()
            service.prepare = lambda spec, _p=service.prepare: (release.wait(30), _p(spec))[1]
            with cf.ThreadPoolExecutor(1) as ex:
                stuck = ex.submit(_chat, srv.url, "hi")
                time.sleep(0.8)
                h = httpx.get(srv.url + "/health", timeout=5)
                assert h.status_code == 503 and h.json()["status"] == "stalled", h.text
                release.set()
                assert stuck.result().status_code == 200
            assert httpx.get(srv.url + "/health", timeout=5).status_code == 200


@pytest.fixture(scope="module")
def hostile_model_dir(tmp_path_factory):
    """A tiny HF model directory (random weights, byte-level tokenizer) whose template is HOSTILE."""
    from llambda.tools.export import export
    from test_export import tiny_llama_gguf

    tmp = tmp_path_factory.mktemp("hostile")
    hf = export(tiny_llama_gguf(tmp / "tiny.gguf"), tmp / "hf", fmt="hf")
    cfg_path = hf / "tokenizer_config.json"
    tok_cfg = json.loads(cfg_path.read_text())
    tok_cfg["chat_template"] = HOSTILE
    cfg_path.write_text(json.dumps(tok_cfg))
    return hf


def test_sigterm_ends_a_server_busy_with_hostile_renders(hostile_model_dir, tmp_path):
    with ServerProcess(hostile_model_dir, tmp_path / "server.log", "-c", "64", "--shutdown-grace", "2") as srv:
        assert srv.proc is not None
        ok = _chat(srv.url, "hi", model=srv.model_id)
        assert ok.status_code == 200, ok.text
        ex = cf.ThreadPoolExecutor(8)
        try:
            futures = [ex.submit(_chat, srv.url, name, 30, srv.model_id) for name in ATTACKS for _ in range(2)]
            time.sleep(0.3)
            rss_kib = int(next(ln.split()[1] for ln in open(f"/proc/{srv.proc.pid}/status")
                               if ln.startswith("VmRSS:")))
            t0 = time.monotonic()
            srv.proc.send_signal(signal.SIGTERM)
            code = srv.proc.wait(30)
            took = time.monotonic() - t0
            for f in futures:
                try:
                    status = f.result().status_code
                except httpx.TransportError:
                    continue
                assert status in (400, 429, 503), status
        finally:
            ex.shutdown(wait=False, cancel_futures=True)
        assert code == 0, srv.log()
        assert took < 15, f"SIGTERM took {took:.1f} s to end the server"
        assert rss_kib < 1_000_000, f"server RSS {rss_kib} KiB while rendering hostile templates"


if os.environ.get("LLAMBDA_PAYLOAD_TIMES"):         # a table of what each payload costs, for tuning
    def test_print_payload_costs(runner):
        for name in sorted(PAYLOADS):
            out = runner.run(PAYLOADS[name])
            print(f"{name:28s} {out['cpu_seconds']:6.3f} s  {out['traced_peak'] / 2**20:7.1f} MiB  {out.get('message', '')[:70]}")
