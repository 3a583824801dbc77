"""llambda under Ray Serve (llambda/scaleout): the routing policy, the forwarding format and the
metrics merge without Ray; then a live local Ray on 127.0.0.1 (dashboard off) with two replicas of
one thread each, against a single-process server, through a killed replica and a full queue.

The live tests need `ray[serve]` (the [ray] extra) and skip without it. Ray takes ~25 s to start
and deploy here; the module shares one deployment and shuts Ray down at the end."""
from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.util
import json
import os
import signal
import time

import httpx
import pytest

from llambda.errors import InvalidInputError
from llambda.scaleout import metrics_merge
from llambda.scaleout.asgi_call import call_asgi
from llambda.scaleout.forwarding import ForwardedRequest, prompt_text, route_of
from llambda.scaleout.options import ScaleoutOptions
from llambda.scaleout.prefix_policy import PrefixTable, block_keys, rank

HAVE_RAY = importlib.util.find_spec("ray") is not None and importlib.util.find_spec("ray.serve") is not None
needs_ray = pytest.mark.skipif(not HAVE_RAY, reason="ray[serve] is not installed (pip install '.[ray]')")

SYSTEM = "You are a concise assistant. Answer in one short sentence and never add anything else. " * 2


# --- the prefix policy, without Ray -------------------------------------------------------------

def test_block_keys_chain_so_a_longer_text_extends_a_shorter_ones_keys():
    turn1 = SYSTEM + "user: hello"
    turn2 = turn1 + " assistant: hi! user: and now?" * 5
    k1, k2 = block_keys(turn1, 32), block_keys(turn2, 32)
    assert len(k1) == len(turn1.encode()) // 32 and len(k2) > len(k1)
    assert k2[:len(k1)] == k1
    # the same block after a different prefix is another key: a key names the whole prefix
    other = block_keys("x" * 32 + turn1[32:], 32)
    assert other[1:] != k1[1:] and all(a != b for a, b in zip(other, k1))
    assert block_keys("short", 32) == []


def test_table_finds_the_longest_live_owner_and_forgets_the_dead():
    t = PrefixTable()
    keys = block_keys(SYSTEM * 3, 16)
    t.record(keys[:4], "a")
    t.record(keys, "b")           # b got the longer conversation last
    assert t.owner(keys, {"a", "b"}) == ("b", len(keys))
    assert t.owner(keys[:2], {"a"}) == (None, 0)       # b owns those blocks now, and b is not alive
    t.forget("b")
    assert t.owner(keys, {"a", "b"}) == (None, 0) and len(t) == 0


def test_table_is_bounded_least_recently_routed_first():
    t = PrefixTable(capacity=8)
    old, new = block_keys("o" * 64, 16), block_keys("n" * 128, 16)
    t.record(old, "a")
    t.record(new, "b")
    assert len(t) == 8 and t.owner(new, {"a", "b"}) == ("b", 8) and t.owner(old, {"a", "b"}) == (None, 0)


def test_rank_prefers_the_owner_until_its_slots_are_full():
    t = PrefixTable()
    keys = block_keys(SYSTEM, 16)
    t.record(keys, "a")
    groups, why = rank(t, keys, {"a": 1, "b": 0, "c": 3}, slots=2)
    assert why == "prefix" and groups[0] == ["a"] and groups[1] == ["b", "c"]
    groups, why = rank(t, keys, {"a": 2, "b": 1, "c": None}, slots=2)    # a full: least loaded first
    assert why == "busy" and groups == [["c", "b", "a"]]
    groups, why = rank(t, block_keys("unseen " * 20, 16), {"a": 0, "b": 5}, slots=2)
    assert why == "load" and groups == [["a", "b"]]
    assert rank(t, keys, {"b": 0}, slots=2)[1] == "load"     # the owner is gone


def routing_keys(raw: bytes) -> list[bytes]:
    return route_of("POST", "/v1/chat/completions", raw)[0]


def test_prompt_text_puts_a_conversation_before_its_continuation():
    turn1 = {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}]}
    turn2 = {"messages": turn1["messages"] + [{"role": "assistant", "content": "hello"},
                                              {"role": "user", "content": [{"type": "text", "text": "more"}]}]}
    assert prompt_text(turn2).startswith(prompt_text(turn1))
    raw1, raw2 = json.dumps(turn1).encode(), json.dumps(turn2).encode()
    k1, k2 = routing_keys(raw1), routing_keys(raw2)
    assert k1 and k2[:len(k1)] == k1
    # tools change the rendered prompt's start, so they are part of the prefix
    assert routing_keys(json.dumps({**turn1, "tools": [{"type": "function"}]}).encode())[0] != k1[0]
    assert prompt_text({"prompt": "Once upon"}) == "Once upon"
    for junk in (b"not json", b"[1, 2]", b"{\"messages\": 5}", b""):
        assert routing_keys(junk) == []            # the replica answers these with a 400


def test_metrics_merge_sums_each_sample_and_keeps_one_header():
    a = ('# HELP llambda_x things\n# TYPE llambda_x counter\nllambda_x{k="1"} 2\nllambda_x{k="2"} 1\n'
         '# HELP llambda_g a gauge\n# TYPE llambda_g gauge\nllambda_g 0.5\n')
    b = '# HELP llambda_x things\n# TYPE llambda_x counter\nllambda_x{k="1"} 3\n# HELP llambda_g a gauge\n' \
        '# TYPE llambda_g gauge\nllambda_g 0.25\n'
    merged = metrics_merge.merge([a, b])
    assert merged.count("# HELP llambda_x") == 1 and merged.count("# TYPE llambda_g") == 1
    assert 'llambda_x{k="1"} 5\n' in merged and 'llambda_x{k="2"} 1\n' in merged and "llambda_g 0.75\n" in merged
    assert metrics_merge.merge([]) == "\n"
    assert metrics_merge.samples(merged) == {'llambda_x{k="1"}': 5, 'llambda_x{k="2"}': 1, "llambda_g": 0.75}


def test_a_stored_responses_id_names_the_replica_that_keeps_it():
    """Each replica keeps its own /v1/responses store; its ids carry its tag, so the ingress can tell
    which replica a GET, a DELETE or a previous_response_id must reach."""
    from llambda.server.response_store import ResponseStore
    from llambda.scaleout.forwarding import replica_tag, stored_on

    replicas = ["a1b2c3d4", "e5f6g7h8", "zz"]
    tags = {replica_tag(u) for u in replicas}
    assert len(tags) == 3 and all(t.isalnum() and "_" not in t for t in tags)
    rid = ResponseStore(tag=replica_tag("e5f6g7h8")).new_id()
    for method, path in (("GET", f"/v1/responses/{rid}"), ("DELETE", f"/v1/responses/{rid}"),
                         ("GET", f"/v1/responses/{rid}/input_items")):
        keys, tag = route_of(method, path, b"")
        assert keys == [] and stored_on(tag, replicas) == "e5f6g7h8"
    body = json.dumps({"input": SYSTEM, "previous_response_id": rid}).encode()
    keys, tag = route_of("POST", "/v1/responses", body)
    assert keys and stored_on(tag, replicas) == "e5f6g7h8"
    assert stored_on(route_of("POST", "/v1/responses/input_tokens", body)[1], replicas) == "e5f6g7h8"
    # its replica gone: no pin (any replica answers, with a 404 saying so); ids without a tag route as usual
    assert stored_on(tag, ["a1b2c3d4"]) is None
    for method, path, raw in (("GET", "/v1/responses/resp_0123abcd", b""), ("GET", "/v1/models", b""),
                              ("POST", "/v1/responses", b'{"input": "x", "previous_response_id": 7}'),
                              ("POST", "/v1/responses", b"not json")):
        assert route_of(method, path, raw)[1] is None
    with pytest.raises(Exception, match="no longer running"):
        ResponseStore(tag=replica_tag("a1b2c3d4")).get(rid)


@needs_ray
def test_the_routers_send_a_stored_responses_requests_to_its_replica():
    from types import SimpleNamespace

    from llambda.scaleout.forwarding import replica_tag
    from llambda.scaleout.routers import _pinned

    replicas = [SimpleNamespace(replica_id=SimpleNamespace(unique_id=u)) for u in ("r1", "r2", "r3")]

    def pending(tag):
        req = ForwardedRequest("GET", "/v1/responses/x", b"", [], b"", [], tag)
        return SimpleNamespace(args=[req])

    assert _pinned(replicas, pending(replica_tag("r2"))) is replicas[1]
    assert _pinned(replicas, pending(replica_tag("gone"))) is None
    assert _pinned(replicas, pending(None)) is None and _pinned(replicas, None) is None


def test_options_refuse_what_cannot_run():
    ok = ScaleoutOptions.from_dict({"model": "m", "server": {"parallel": 2}})
    assert ok.slots == 2 and not ok.autoscaling
    assert ScaleoutOptions.from_dict({"model": "m", "min_replicas": 1, "max_replicas": 3}).autoscaling
    for bad, word in [({}, "model"), ({"model": "m", "replicaz": 2}, "replicaz"),
                      ({"model": "m", "replicas": 0}, "replicas"), ({"model": "m", "min_replicas": 2}, "both"),
                      ({"model": "m", "min_replicas": 3, "max_replicas": 2}, "min_replicas"),
                      ({"model": "m", "routing": "random"}, "routing"),
                      ({"model": "m", "server": {"parallel": 0}}, "parallel"),
                      ({"model": "m", "server": {"no_such": 1}}, "no_such"), ([], "mapping"),
                      ({"model": "m", "server": {"template_kwargs": {"tools": []}}}, "server: template_kwargs")]:
        with pytest.raises(InvalidInputError, match=word):
            ScaleoutOptions.from_dict(bad)


def test_call_asgi_streams_the_apps_answer_and_reports_a_hang_up():
    seen = {}

    async def app(scope, receive, send):
        seen["body"] = (await receive())["body"]
        await send({"type": "http.response.start", "status": 201, "headers": [(b"x-a", b"1")]})
        await send({"type": "http.response.body", "body": b"one", "more_body": True})
        await send({"type": "http.response.body", "body": b"two", "more_body": True})
        seen["next"] = await receive()            # waits until the caller goes away
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def main():
        req = ForwardedRequest("POST", "/x", b"", [], b"payload")
        parts = []
        stream = call_asgi(app, req)
        async for item in stream:
            parts.append(item)
            if item == b"two":
                break
        await stream.aclose()
        return parts

    parts = asyncio.run(main())
    assert parts == [{"status": 201, "headers": [(b"x-a", b"1")]}, b"one", b"two"]
    assert seen == {"body": b"payload", "next": {"type": "http.disconnect"}}


def test_the_single_machine_path_never_imports_ray():
    import subprocess
    import sys
    from pathlib import Path

    import llambda

    code = ("import sys, llambda.cli, llambda.server, llambda.scaleout.cli_args, llambda.scaleout.forwarding, "
            "llambda.scaleout.asgi_call, llambda.scaleout.metrics_merge; llambda.cli.build_parser(); "
            "print('ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(Path(llambda.__file__).parent.parent)})
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr


# --- live, under a local Ray --------------------------------------------------------------------

@needs_ray
def test_deployment_options_use_serve_autoscaling_and_the_router():
    from llambda.scaleout.deployment import engine_deployment_options

    opts = ScaleoutOptions.from_dict({"model": "m", "min_replicas": 1, "max_replicas": 4, "threads_per_replica": 2,
                                      "server": {"parallel": 3}, "queue_size": 5})
    o = engine_deployment_options(opts)
    assert o["autoscaling_config"]["min_replicas"] == 1 and o["autoscaling_config"]["max_replicas"] == 4
    assert o["autoscaling_config"]["target_ongoing_requests"] == 3 and "num_replicas" not in o
    assert o["ray_actor_options"] == {"num_cpus": 2} and o["max_queued_requests"] == 5
    assert o["request_router_config"].request_router_class.endswith("PrefixAwareRouter")
    fixed = engine_deployment_options(ScaleoutOptions.from_dict({"model": "m", "replicas": 3, "routing": "round_robin"}))
    assert fixed["num_replicas"] == 3 and "autoscaling_config" not in fixed
    assert fixed["request_router_config"].request_router_class.endswith("RoundRobinRouter")


@needs_ray
def test_cli_writes_a_serve_config_that_builds(tmp_path):
    import yaml

    from llambda.cli import main
    from llambda.scaleout.deployment import app_builder

    path = tmp_path / "serve.yaml"
    assert main(["serve", "-m", "smollm2-135m", "--replicas", "3", "--parallel", "2", "--api-key", "secret",
                 "--no-think", "--write-ray-config", str(path)]) == 0
    doc = yaml.safe_load(path.read_text())
    app = doc["applications"][0]
    assert app["import_path"] == "llambda.scaleout.deployment:app_builder" and app["args"]["replicas"] == 3
    # each replica's server renders with the serve flags' template variables
    assert ScaleoutOptions.from_dict(app["args"]).server_config().template_kwargs == {"enable_thinking": False}
    assert "secret" not in path.read_text()        # a key is not written into a file
    assert app_builder(app["args"]) is not None
    with pytest.raises(InvalidInputError):
        app_builder({**app["args"], "routing": "nope"})


MODEL_ID = "smollm2"
LOAD = {"n_ctx": 512, "kv_type": "f16"}


@pytest.fixture(scope="module")
def ray_app(smollm2_gguf):
    if not HAVE_RAY:
        pytest.skip("ray[serve] is not installed (pip install '.[ray]')")
    from serverkit import free_port

    from llambda.scaleout import launch

    opts = ScaleoutOptions(model=str(smollm2_gguf), replicas=2, threads_per_replica=1, queue_size=2, load=LOAD,
                           server={"model_id": MODEL_ID, "parallel": 2, "max_tokens_cap": 256,
                                   "max_body_bytes": 64 * 1024})
    launch.start_ray(num_cpus=4)     # logical: the 2 replicas, and the autoscaling test's 2
    try:
        port = free_port()
        launch.deploy(opts, "127.0.0.1", port)
        url = f"http://127.0.0.1:{port}"
        _wait_for_replicas(url, 2)
        yield url
    finally:
        launch.stop()
    import ray

    assert not ray.is_initialized()


def _metrics(url: str) -> dict[str, float]:
    return metrics_merge.samples(httpx.get(url + "/metrics", timeout=30).text)


def _wait_for_replicas(url: str, n: int, not_pids: set = frozenset(), timeout: float = 90.0) -> set[str]:
    """The replicas' pids once n of them (none in not_pids) report metrics."""
    t0 = time.monotonic()
    while True:
        pids = {k.split('pid="')[1].rstrip('"}') for k in _metrics(url) if k.startswith("llambda_replica_up")}
        if len(pids) == n and not pids & not_pids:
            return pids
        assert time.monotonic() - t0 < timeout, f"replicas did not report: {pids}"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def single(smollm2_gguf):
    """One in-process server with the same model settings: what the replicas must agree with."""
    import llambda
    from llambda.server import ServerConfig, create_app
    from serverkit import LiveServer

    with llambda.load(smollm2_gguf, threads=1, n_slots=3, **LOAD) as m:
        with LiveServer(create_app(m, ServerConfig(model_id=MODEL_ID, parallel=2))) as srv:
            yield srv


def _client(url):
    import openai

    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)


PROMPTS = ["Name three colors.", "What is the capital of France?", "Write a haiku about the sea."]


def test_ray_runs_on_loopback_without_a_dashboard(ray_app):
    import ray

    nodes = ray.nodes()
    assert nodes and all(n["NodeManagerAddress"] == "127.0.0.1" for n in nodes), nodes
    assert ray.get_runtime_context().gcs_address.startswith("127.0.0.1:")
    assert not ray._private.worker.global_worker.node.address_info.get("webui_url")


def test_openai_client_gets_the_single_servers_greedy_output(ray_app, single):
    ours, theirs = _client(ray_app), _client(single.url)
    for p in PROMPTS:
        kw = dict(model=MODEL_ID, messages=[{"role": "user", "content": p}], max_tokens=16, temperature=0)
        got = ours.chat.completions.create(**kw)
        want = theirs.chat.completions.create(**kw)
        assert got.choices[0].message.content == want.choices[0].message.content
        assert got.usage.completion_tokens == want.usage.completion_tokens
        streamed = "".join(c.choices[0].delta.content or "" for c in ours.chat.completions.create(stream=True, **kw)
                           if c.choices)
        assert streamed == want.choices[0].message.content
    got = ours.completions.create(model=MODEL_ID, prompt="Once upon a time", max_tokens=12, temperature=0)
    want = theirs.completions.create(model=MODEL_ID, prompt="Once upon a time", max_tokens=12, temperature=0)
    assert got.choices[0].text == want.choices[0].text
    assert [m.id for m in ours.models.list().data] == [MODEL_ID]
    assert httpx.get(ray_app + "/health", timeout=30).json()["status"] == "ok"


def test_bad_input_gets_the_same_4xx_as_a_single_server(ray_app):
    r = httpx.post(ray_app + "/v1/chat/completions", content=b"{not json", timeout=30)
    assert r.status_code == 400 and "malformed JSON" in r.json()["error"]["message"]
    r = httpx.post(ray_app + "/v1/chat/completions", content=b"x" * (65 * 1024), timeout=30)
    assert r.status_code == 413 and "exceeds" in r.json()["error"]["message"]
    r = httpx.post(ray_app + "/v1/chat/completions", json={"model": "other", "messages": []}, timeout=30)
    assert 400 <= r.status_code < 500 and r.json()["error"]["message"]


def test_ollama_streams_and_errors_pass_through_the_ingress(ray_app, single):
    """Ollama's newline-delimited JSON streams through the ingress as it comes (not read whole first,
    which would end in a Content-Length), and the ingress's own errors on /api/ have Ollama's shape."""
    body = {"model": MODEL_ID, "messages": [{"role": "user", "content": PROMPTS[1]}],
            "options": {"temperature": 0, "num_predict": 12}}
    want = httpx.post(single.url + "/api/chat", json={**body, "stream": False}, timeout=120).json()
    with httpx.stream("POST", ray_app + "/api/chat", json=body, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"] == "application/x-ndjson"
        assert "content-length" not in r.headers
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert "".join(x["message"]["content"] for x in lines) == want["message"]["content"] and lines[-1]["done"]
    r = httpx.post(ray_app + "/api/chat", content=b"x" * (65 * 1024), timeout=30)
    assert r.status_code == 413 and list(r.json()) == ["error"] and "exceeds" in r.json()["error"]


def test_cross_site_posts_and_rebound_hosts_are_refused_as_by_a_single_server(ray_app):
    # the ingress once forwarded neither Origin, Sec-Fetch-Site nor Host: a hostile page's POST ran
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    for headers, code in [({"Sec-Fetch-Site": "cross-site"}, "forbidden_origin"),
                          ({"Origin": "http://attacker.example"}, "forbidden_origin"),
                          ({"Host": "attacker.example"}, "forbidden_host")]:
        r = httpx.post(ray_app + "/v1/chat/completions", json=body, headers=headers, timeout=60)
        assert r.status_code == 403 and r.json()["error"]["code"] == code, (headers, r.text)
    r = httpx.post(ray_app + "/v1/chat/completions", json=body, headers={"Sec-Fetch-Site": "same-origin"}, timeout=60)
    assert r.status_code == 200, r.text


def test_a_conversations_turns_go_where_its_prefix_is_cached(ray_app):
    client = _client(ray_app)
    before = _metrics(ray_app)
    for topic in ("the sea", "mountains", "cities", "rivers"):
        messages = [{"role": "system", "content": SYSTEM + f" Topic: {topic}."},
                    {"role": "user", "content": f"Tell me about {topic}."}]
        first = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=8, temperature=0)
        messages += [{"role": "assistant", "content": first.choices[0].message.content},
                     {"role": "user", "content": "Say more."}]
        second = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=8, temperature=0)
        # the second turn found the first turn's prompt in its replica's cache
        assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 1
    after = _metrics(ray_app)
    key = 'llambda_router_requests_total{decision="prefix_owner"}'
    assert after.get(key, 0) - before.get(key, 0) >= 4


def test_stored_responses_are_reached_on_the_replica_that_made_them(ray_app):
    """Each replica stores its own responses: continuing, reading, listing and deleting one works
    whichever replica the prefix policy would pick for it (several, so both replicas hold some)."""
    client = _client(ray_app)
    firsts: dict[str, list] = {}       # replica tag -> responses it stored
    for i in range(20):                # short prompts go to either idle replica: until both have some
        r = client.responses.create(model=MODEL_ID, input=f"Say the number {i}.", max_output_tokens=4, temperature=0)
        firsts.setdefault(r.id.split("_")[1], []).append(r)
        if len(firsts) == 2 and sum(map(len, firsts.values())) >= 4:
            break
    assert len(firsts) == 2, firsts.keys()
    for tag, responses in firsts.items():
        for r in responses:
            follow = client.responses.create(model=MODEL_ID, input="Again.", previous_response_id=r.id,
                                             max_output_tokens=4, temperature=0)
            assert follow.id.split("_")[1] == tag                   # continued where it was stored
            assert client.responses.retrieve(r.id).output_text == r.output_text
            items = client.responses.input_items.list(follow.id, order="asc")
            assert [i.id for i in items][1:-1] == [o.id for o in r.output]
            client.responses.delete(r.id)
            with pytest.raises(Exception, match="no stored response"):
                client.responses.retrieve(r.id)


def test_a_client_hanging_up_cancels_its_generation_on_the_replica(ray_app):
    key = 'llambda_sequences_finished_total{reason="cancelled"}'
    before = _metrics(ray_app).get(key, 0)
    # 256 tokens (the cap) take a replica well over a second; the client gives up after 0.3 s
    body = {"model": MODEL_ID, "prompt": "Write a very long story about a lighthouse.", "max_tokens": 256,
            "temperature": 0, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):           # a non-streamed answer, given up on
        httpx.post(ray_app + "/v1/completions", json=body, timeout=0.3)
    with httpx.stream("POST", ray_app + "/v1/completions", json={**body, "stream": True}, timeout=60) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")      # hang up after the first event
    t0 = time.monotonic()
    while _metrics(ray_app).get(key, 0) < before + 2:
        assert time.monotonic() - t0 < 30, "the replicas did not cancel both generations"
        time.sleep(0.5)


def _ask(url, i, max_tokens=24):
    return httpx.post(url + "/v1/completions", json={"model": MODEL_ID, "prompt": f"Story {i}: once upon a time",
                                                      "max_tokens": max_tokens, "temperature": 0}, timeout=120)


def test_429_when_every_replica_and_the_queue_are_full(ray_app):
    # 2 replicas take 2 x (2 slots + 2 queued), the router holds 2 more: 30 at once must overflow
    with concurrent.futures.ThreadPoolExecutor(30) as pool:
        answers = list(pool.map(lambda i: _ask(ray_app, i, 48), range(30)))
    codes = [r.status_code for r in answers]
    assert set(codes) <= {200, 429} and 429 in codes and 200 in codes, codes
    busy = next(r for r in answers if r.status_code == 429)
    assert busy.headers["retry-after"] and "busy" in busy.json()["error"]["message"]


@needs_ray
@pytest.mark.parametrize("ndjson", [False, True])
def test_a_replica_dying_after_its_streams_end_adds_nothing_and_before_it_an_error_and_the_end(ndjson):
    # (a replica killed mid-load once ended a stream [DONE], error, [DONE]: the client read a second end)
    from collections import Counter

    from ray.exceptions import RayActorError

    from llambda.scaleout.ingress import IngressServer
    from llambda.server.ollama_api import NDJSON
    from llambda.server.openai_format import SSE_DONE

    last = b'{"model":"m","done":true}\n' if ndjson else SSE_DONE
    first = b'{"model":"m","response":"a \\"done\\": true","done":false}\n' if ndjson else b'data: {"choices":[]}\n\n'

    class Stream:
        def __init__(self, chunks):
            self.chunks = chunks

        def __aiter__(self):
            return self

        async def __anext__(self):
            if not self.chunks:
                raise RayActorError()
            return self.chunks.pop(0)

        def cancel(self):
            pass

    ingress = object.__new__(IngressServer)
    ingress.counts = Counter()
    media = NDJSON.encode() if ndjson else b"text/event-stream"

    async def read(chunks):
        return [c async for c in ingress._rest(Stream(list(chunks)), media)]

    whole = asyncio.run(read([first, last]))
    assert whole == [first, last] and ingress.counts["failed_mid_stream"] == 1
    cut = asyncio.run(read([first]))
    assert cut[0] == first and len(cut) == (2 if ndjson else 3) and b"failed" in cut[1]
    if not ndjson:
        assert cut[-1] == SSE_DONE


def _stream(url, i) -> list[str]:
    """The data lines of a streamed completion."""
    body = {"model": MODEL_ID, "prompt": f"Tale {i}: long ago", "max_tokens": 48, "temperature": 0, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
        if r.status_code != 200:
            return [f"status {r.status_code}: {r.read()!r}"]
        return [line for line in r.iter_lines() if line.startswith("data: ")]


def test_killing_a_replica_mid_load_leaves_the_service_answering(ray_app):
    pids = _wait_for_replicas(ray_app, 2)
    victim = int(sorted(pids)[0])
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        load = [pool.submit(_ask, ray_app, i, 32) for i in range(8)]
        streams = [pool.submit(_stream, ray_app, i) for i in range(4)]
        time.sleep(1.0)
        os.kill(victim, signal.SIGKILL)
        answers = [f.result(timeout=180) for f in load]     # none hangs
        streamed = [f.result(timeout=180) for f in streams]
    for lines in streamed:
        # whole, or cut with an error event; either way the stream is closed with [DONE]
        if lines[0].startswith("status "):
            assert lines[0].startswith(("status 429", "status 503")), lines
            continue
        assert lines[-1] == "data: [DONE]", lines[-3:]
        events = [json.loads(line[6:]) for line in lines[:-1]]
        assert all("choices" in e or e["error"]["message"] for e in events)
    codes = [r.status_code for r in answers]
    for r in answers:
        # retried elsewhere (200), or a clean error object (503: its replica died; 429: the survivor
        # and the queue are full meanwhile); never a hang or a bare 500
        assert r.status_code in (200, 429, 503), (codes, r.text)
        if r.status_code != 200:
            assert r.json()["error"]["message"], r.text
    assert codes.count(200) >= len(answers) // 2, codes
    assert _ask(ray_app, 99).status_code == 200          # the survivor answers at once
    new = _wait_for_replicas(ray_app, 2, not_pids={str(victim)})   # Ray started a replacement
    assert str(victim) not in new
    assert _ask(ray_app, 100).status_code == 200


def test_serve_autoscaler_adds_a_replica_when_requests_queue(ray_app, smollm2_gguf):
    from ray import serve

    from llambda.scaleout import launch

    opts = ScaleoutOptions(model=str(smollm2_gguf), min_replicas=1, max_replicas=2, threads_per_replica=1,
                           load=LOAD, server={"model_id": MODEL_ID, "parallel": 1},
                           autoscaling_config={"upscale_delay_s": 1.0, "look_back_period_s": 2.0,
                                               "metrics_interval_s": 0.5})
    port = int(ray_app.rsplit(":", 1)[1])
    launch.deploy(opts, "127.0.0.1", port, name="auto", route_prefix="/auto")
    url = ray_app + "/auto"
    try:
        assert _ask(url, 0).status_code == 200          # the ingress's router exists from its first request
        _wait_for_replicas(url, 1)
        stop = time.monotonic() + 90
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            # 4 requests at a time on 1 slot: they queue, and the autoscaler adds the second replica
            while time.monotonic() < stop and _metrics(url)["llambda_replicas"] < 2:
                list(pool.map(lambda i: _ask(url, i, 24), range(4)))
        assert _metrics(url)["llambda_replicas"] == 2
    finally:
        serve.delete("auto")
