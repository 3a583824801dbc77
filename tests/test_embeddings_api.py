"""POST /v1/embeddings and /v1/rerank, /rerank on a live server, with the official openai client."""
from __future__ import annotations

import base64
import concurrent.futures

import httpx
import numpy as np
import openai
import pytest

import llambda
from llambda.server import ServerConfig, create_app
from serverkit import LOAD_KW, LiveServer, assert_error, post
from test_embeddings import TINY_TEXTS, _tiny_bert_dir


def _cfg(model_id):
    return ServerConfig(model_id=model_id, parallel=1, queue_size=8, max_body_bytes=256 * 1024,
                        max_tokens_cap=64, prefill_chunk=64)


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    emb, _, _ = _tiny_bert_dir(tmp_path_factory.mktemp("emb"))
    ce, _, _ = _tiny_bert_dir(tmp_path_factory.mktemp("ce"), classifier=True)
    return emb, ce


@pytest.fixture(scope="module")
def tiny_live(tiny_dirs):
    with llambda.load(tiny_dirs[0], backend="numpy") as m, LiveServer(create_app(m, _cfg("tiny-bert"))) as srv:
        yield m, srv


def test_embeddings_openai_client(tiny_live):
    m, srv = tiny_live
    client = srv.client()
    want = m.embed(TINY_TEXTS)
    r = client.embeddings.create(model="tiny-bert", input=TINY_TEXTS, encoding_format="float")
    assert [d.index for d in r.data] == list(range(len(TINY_TEXTS)))
    got = np.array([d.embedding for d in r.data], np.float32)
    assert np.abs(got - want).max() < 1e-6
    assert r.usage.prompt_tokens == sum(len(ids) for ids, _ in m.tokenizer.encode_for_encoder(TINY_TEXTS, 16))
    assert r.model == "tiny-bert"
    # the client's default asks for base64 and decodes it itself
    r64 = client.embeddings.create(model="tiny-bert", input="the cat sat on the mat")
    assert np.abs(np.array(r64.data[0].embedding, np.float32) - want[0]).max() < 1e-6


def test_embeddings_shapes_of_input(tiny_live):
    m, srv = tiny_live
    ids = m.tokenizer.encode_for_encoder(["a big dog runs"], 16)[0][0]
    want = m.embed(["a big dog runs"])[0]
    for body_input in (ids, [ids], "a big dog runs", ["a big dog runs"]):
        r = post(srv, "/v1/embeddings", {"input": body_input, "encoding_format": "base64"})
        assert r.status_code == 200, r.text
        data = r.json()["data"]
        assert len(data) == 1
        v = np.frombuffer(base64.b64decode(data[0]["embedding"]), "<f4")
        assert np.abs(v - want).max() < 1e-6
    r = post(srv, "/v1/embeddings", {"input": "the cat", "dimensions": 32})
    assert r.status_code == 200


@pytest.mark.parametrize("body, words", [
    ({}, ["input"]),
    ({"input": ""}, ["empty string"]),
    ({"input": []}, ["must not be empty"]),
    ({"input": [1, "a"]}, ["input[0]"]),
    ({"input": [[1, 2], [True]]}, ["input[1]"]),
    ({"input": 3}, ["'input'"]),
    ({"input": "x", "encoding_format": "int8"}, ["encoding_format"]),
    ({"input": "x", "dimensions": 16}, ["dimensions", "32"]),
    ({"input": [[99999]]}, ["out of range"]),
])
def test_embeddings_errors(tiny_live, body, words):
    _, srv = tiny_live
    assert_error(post(srv, "/v1/embeddings", body), 400, *words)


def test_embeddings_wrong_model_and_client_error(tiny_live):
    _, srv = tiny_live
    assert_error(post(srv, "/v1/embeddings", {"model": "other", "input": "x"}), 404, "does not exist")
    with pytest.raises(openai.BadRequestError, match="dimensions"):
        srv.client().embeddings.create(model="tiny-bert", input="x", dimensions=8)


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank"])
def test_rerank_refused_by_an_embedder(tiny_live, path):
    _, srv = tiny_live
    err = assert_error(post(srv, path, {"query": "q", "documents": ["a"]}), 400, "this model is not a reranker")
    assert err["code"] == "not_a_reranker"


def test_encoder_server_models_and_health(tiny_live):
    _, srv = tiny_live
    card = httpx.get(srv.url + "/v1/models").json()["data"][0]
    assert card["id"] == "tiny-bert" and card["meta"]["n_embd"] == 32
    assert httpx.get(srv.url + "/health").json()["status"] == "ok"
    assert_error(post(srv, "/v1/chat/completions", {"messages": []}), 404)


def test_encoder_server_speaks_ollamas_embed(tiny_live):
    """An encoder answers Ollama's /api/embed, /api/embeddings and listings too; /api/chat has no route."""
    import ollama
    m, srv = tiny_live
    client = ollama.Client(host=srv.url, timeout=60)
    r = client.embed(model="tiny-bert", input=TINY_TEXTS)
    assert np.abs(np.array(r.embeddings, np.float32) - m.embed(TINY_TEXTS)).max() < 1e-6
    assert r.prompt_eval_count == sum(len(ids) for ids, _ in m.tokenizer.encode_for_encoder(TINY_TEXTS, 16))
    one = client.embeddings(model="tiny-bert:latest", prompt=TINY_TEXTS[1]).embedding
    assert np.abs(np.array(one, np.float32) - m.embed(TINY_TEXTS[1:2])[0]).max() < 1e-6
    # truncate (default true) cuts a text at the model's 16 tokens; false refuses it, as Ollama does
    long = " ".join(TINY_TEXTS * 4)
    cut = client.embed(model="tiny-bert", input=long)
    assert cut.prompt_eval_count == 16 and np.abs(np.array(cut.embeddings[0]) - m.embed([long])[0]).max() < 1e-6
    with pytest.raises(ollama.ResponseError) as e:
        client.embed(model="tiny-bert", input=[TINY_TEXTS[0], long], truncate=False)
    assert e.value.status_code == 400 and "input[1]" in e.value.error and "context of 16" in e.value.error
    assert client.embed(model="tiny-bert", input=TINY_TEXTS[0], truncate=False).prompt_eval_count == \
        r.prompt_eval_count - sum(len(ids) for ids, _ in m.tokenizer.encode_for_encoder(TINY_TEXTS[1:], 16))
    # dimensions as on /v1/embeddings: the model's own, or a 400 naming it
    for route, body in (("/api/embed", {"input": "x"}), ("/v1/embeddings", {"input": "x"})):
        assert post(srv, route, {**body, "dimensions": 32}).status_code == 200
        bad = post(srv, route, {**body, "dimensions": 8})
        assert bad.status_code == 400 and "'dimensions' 8 is not supported" in bad.text and "32" in bad.text
    root = httpx.get(srv.url + "/", timeout=30)      # no chat page on an encoder: Ollama's liveness line
    assert root.status_code == 200 and root.text == "Ollama is running"
    shown = client.show("tiny-bert")
    assert shown.capabilities == ["embedding"] and shown.modelinfo["bert.embedding_length"] == 32
    assert [x.model for x in client.list().models] == ["tiny-bert:latest"]
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="tiny-bert", messages=[{"role": "user", "content": "hi"}])
    assert e.value.status_code == 404 and "no route" in e.value.error


def test_encoder_server_answers_api_ps_and_llambda_ps_lists_it(tiny_live, monkeypatch, capsys):
    """Ollama's /api/ps lists embedding models too: an encoder's entry has a decoder's shape, and `llambda ps`
    prints it (its 404 message said an embedding model's server had no /api/ps)."""
    import ollama

    from llambda.cli import main
    m, srv = tiny_live
    [entry] = ollama.Client(host=srv.url, timeout=60).ps().models
    assert entry.model == "tiny-bert:latest" and entry.context_length == m.n_ctx == 16
    assert entry.size == m.memory_plan.total and entry.size_vram == 0 and entry.expires_at.year == 9999
    raw = httpx.get(srv.url + "/api/ps", timeout=30).json()["models"][0]
    assert {"name", "model", "size", "digest", "details", "expires_at", "size_vram", "context_length"} == set(raw)
    assert httpx.get(srv.url + "/api/version", timeout=30).json()["version"].count(".") == 2
    monkeypatch.delenv("LLAMBDA_API_KEY", raising=False)
    assert main(["ps", "--host", srv.url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[1].split()[0] == "tiny-bert:latest" and lines[1].split()[-2:] == ["16", "Forever"]


def _allowed(response) -> set | None:
    """The Allow header's methods (Starlette lists a route's set of methods: in no fixed order)."""
    allow = response.headers.get("allow")
    return None if allow is None else {m.strip() for m in allow.split(",")}


def test_unknown_routes_and_methods_answer_as_on_a_decoder(tiny_live, tmp_path):
    """The encoder's app answered a wrong method with the bare "Method Not Allowed" and neither a 404 nor a
    405 with a code; a decoder's gave both. The same request now gets the same status, body and Allow
    header from either app (OpenAI's {"error": ...}, Ollama's under /api/)."""
    from serverkit import tiny_chat_server
    _, encoder = tiny_live
    asks = [("GET", "/v1/nope"), ("POST", "/nope"), ("GET", "/v1/embeddings"), ("DELETE", "/v1/models"),
            ("GET", "/api/nope"), ("PUT", "/health")]
    with tiny_chat_server(tmp_path, "tiny", (), None) as decoder:
        for method, path in asks:
            got = [httpx.request(method, srv.url + path, timeout=30) for srv in (encoder, decoder)]
            assert [r.status_code for r in got] == [404 if "nope" in path else 405] * 2, (method, path)
            assert got[0].json() == got[1].json(), (method, path)
            assert _allowed(got[0]) == _allowed(got[1]), (method, path)
    err = got[0].json()
    assert err == {"error": {"message": "method PUT is not allowed on /health", "type": "invalid_request_error",
                             "param": None, "code": "method_not_allowed"}}
    assert _allowed(got[0]) == {"GET", "HEAD"}
    assert assert_error(httpx.get(encoder.url + "/v1/nope"), 404, "no route GET /v1/nope")["code"] == "not_found"


def test_rerank_cross_encoder(tiny_dirs):
    docs = ["the cat sat", "a big dog", "mats", "small cats running"]
    with llambda.load(tiny_dirs[1], backend="numpy") as m, LiveServer(create_app(m, _cfg("tiny-ce"))) as srv:
        scores = m.score("the cat", docs)
        for path in ("/v1/rerank", "/rerank"):
            r = post(srv, path, {"query": "the cat", "documents": docs, "top_n": 3, "return_documents": True})
            assert r.status_code == 200, r.text
            res = r.json()["results"]
            assert [x["index"] for x in res] == list(np.argsort(-scores)[:3])
            assert all(abs(x["relevance_score"] - scores[x["index"]]) < 1e-5 for x in res)
            assert res[0]["document"]["text"] == docs[res[0]["index"]]
        assert_error(post(srv, "/v1/rerank", {"query": "q", "documents": []}), 400, "documents")
        assert_error(post(srv, "/v1/rerank", {"documents": ["a"]}), 400, "query")


# -- real models ------------------------------------------------------------------------------

def test_minilm_server_matches_library(minilm_dir):
    texts = ["A man is eating food.", "The new movie is awesome", "東京は日本の首都です。"]
    with llambda.load(minilm_dir) as m, LiveServer(create_app(m, _cfg("all-minilm-l6-v2"))) as srv:
        want = m.embed(texts)
        r = srv.client().embeddings.create(model="all-minilm-l6-v2", input=texts)
        got = np.array([d.embedding for d in r.data], np.float32)
        assert got.shape == (3, 384)
        assert np.abs(got - want).max() < 1e-6


def test_decoder_embeddings_on_the_scheduler(smollm2_gguf):
    """A decoder pooled on its last token, computed between scheduler steps in a spare slot:
    chat completions running at the same time give the same text as alone."""
    with llambda.load(smollm2_gguf, n_slots=2, n_ctx=256, **LOAD_KW) as m:
        texts = ["The capital of France is Paris.", "def add(a, b): return a + b"]
        with LiveServer(create_app(m, _cfg("smollm2"))) as srv:
            client = srv.client()

            def chat():
                return client.chat.completions.create(
                    model="smollm2", messages=[{"role": "user", "content": "Count to five."}],
                    max_tokens=24, temperature=0).choices[0].message.content
            alone = chat()
            with concurrent.futures.ThreadPoolExecutor(4) as ex:
                chats = [ex.submit(chat) for _ in range(2)]
                embs = [ex.submit(client.embeddings.create, model="smollm2", input=texts) for _ in range(3)]
                assert all(c.result() == alone for c in chats)
                vecs = [np.array([d.embedding for d in e.result().data], np.float32) for e in embs]
        assert vecs[0].shape == (2, m.config.d_model)
        assert np.allclose(np.linalg.norm(vecs[0], axis=1), 1, atol=1e-5)
        for v in vecs[1:]:
            assert np.abs(v - vecs[0]).max() < 1e-6
        lib = m.embed(texts)
        cos = (lib * vecs[0]).sum(1)
        assert cos.min() > 0.999, cos
        assert float(lib[0] @ lib[1]) < 0.99       # different texts, different vectors


def test_decoder_embed_truncate_keeps_the_start(smollm2_gguf, tiny_live):
    """The library's side of Ollama's truncate: a decoder refuses an input past its context unless
    told to cut it, and then keeps its first n_ctx tokens (as Ollama cuts)."""
    text = "word " * 40
    with llambda.load(smollm2_gguf, n_slots=1, n_ctx=32, **LOAD_KW) as m:
        ids = m._prompt_ids(text)
        assert len(ids) > 32
        with pytest.raises(llambda.ContextOverflowError):
            m.embed(text)
        assert np.abs(m.embed(text, truncate=True) - m.embed([ids[:32]])).max() < 1e-6
        assert m.embed_token_counts(text) == [len(ids)] and m.embed_token_counts(text, truncate=True) == [32]
        for call in (lambda: m.embed(text, truncate="no"), lambda: m.embed_token_counts(text, truncate=1)):
            with pytest.raises(llambda.InvalidInputError, match="truncate must be True or False"):
                call()
    with pytest.raises(llambda.InvalidInputError, match="truncate"):      # an encoder's counts alike
        tiny_live[0].embed_token_counts(text, truncate="no")


def test_decoder_without_a_spare_slot_is_refused(smollm2_gguf):
    with llambda.load(smollm2_gguf, n_slots=1, n_ctx=128, **LOAD_KW) as m, \
            LiveServer(create_app(m, _cfg("smollm2"))) as srv:
        assert_error(post(srv, "/v1/embeddings", {"input": "hi"}), 400, "slot to spare")


@pytest.mark.parametrize("model", [["smollm2"], {"id": "x"}])
def test_model_of_the_wrong_type_is_a_400(tiny_live, model):
    # a list or object used to reach a set lookup (unhashable): a 500
    _, srv = tiny_live
    for path in ("/v1/embeddings", "/v1/rerank"):
        assert_error(post(srv, path, {"model": model, "input": "hi", "query": "q", "documents": ["d"]}),
                     400, "'model' must be a string")


def test_decoder_embeddings_leave_room_for_streams(smollm2_gguf):
    """A decoder's embeddings run a scheduler call per prefill chunk's worth of inputs, so a running
    stream gets steps between them; a request of many long inputs used to hold the scheduler throughout."""
    with llambda.load(smollm2_gguf, n_slots=2, n_ctx=256, **LOAD_KW) as m:
        app = create_app(m, _cfg("smollm2"))
        sched = app.state.scheduler
        steps, calls = [], []
        real_step, real_embed = sched._step, m.embed

        def step():
            steps.append(None)
            real_step()

        def embed(items, **kw):
            calls.append((len(items), len(steps)))
            return real_embed(items, **kw)

        sched._step, m.embed = step, embed
        with LiveServer(app) as srv:
            client = srv.client()
            stream = client.completions.create(model="smollm2", prompt="Once upon a time", max_tokens=64,
                                               stream=True, extra_body={"ignore_eos": True})
            chunks = iter(stream)
            next(chunks)                       # the stream runs
            # ~45 tokens each: two would pass the prefill chunk (64), so each is a call of its own
            texts = [f"text number {i}: " + "word " * 40 for i in range(6)]
            r = client.embeddings.create(model="smollm2", input=texts)
            rest = list(chunks)
        assert len(r.data) == 6 and rest
        assert [n for n, _ in calls] == [1] * 6
        # the stream's steps went on between the inputs
        assert calls[-1][1] > calls[0][1], calls
        lib = real_embed(texts)
        got = np.array([d.embedding for d in r.data], np.float32)
        assert np.abs(got - lib).max() < 1e-4
