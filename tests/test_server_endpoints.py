"""llama-server's own endpoints on a live loopback server: /tokenize, /detokenize, /apply-template,
/infill, and fill-in-the-middle through `suffix` on /v1/completions (Qwen2.5-Coder has FIM tokens,
SmolLM2 has none)."""
from __future__ import annotations

import json

import httpx

from llambda.server.fim import find_fim_tokens, fim_prompt_ids
from serverkit import MODEL_ID, assert_error, post

# a function whose signature, docstring and return are given: the gap is its loop
FIB_PREFIX = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    a, b = 0, 1\n'
FIB_SUFFIX = "\n    return a\n"
FIB_FIM = f"<|fim_prefix|>{FIB_PREFIX}<|fim_suffix|>{FIB_SUFFIX}<|fim_middle|>"


# -- tokenize / detokenize / apply-template (SmolLM2) -----------------------------------------

def test_tokenize_and_detokenize(live, model):
    text = "Hello world, naïve café 🦙"
    r = post(live, "/tokenize", {"content": text})
    assert r.status_code == 200, r.text
    ids = r.json()["tokens"]
    assert ids == model.tokenize(text)
    assert post(live, "/detokenize", {"tokens": ids}).json() == {"content": text}

    pieces = post(live, "/tokenize", {"content": text, "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == ids
    # a piece is its text, or its bytes where a token holds part of a character; together they spell the text
    raw = b"".join(p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"]) for p in pieces)
    assert raw.decode() == text
    assert any(isinstance(p["piece"], list) for p in pieces), "the llama emoji is split over byte tokens"

    # control tokens are parsed by default, spelled out with parse_special false
    assert len(post(live, "/tokenize", {"content": "<|im_start|>"}).json()["tokens"]) == 1
    assert len(post(live, "/tokenize", {"content": "<|im_start|>", "parse_special": False}).json()["tokens"]) > 1
    assert post(live, "/tokenize", {"content": text, "add_special": True}).json()["tokens"] == \
        model.tokenize(text, add_bos=True)


def test_tokenize_errors(live, model):
    assert_error(post(live, "/tokenize", {}), 400, "content")
    assert_error(post(live, "/tokenize", {"content": 5}), 400, "content")
    assert_error(post(live, "/detokenize", {"tokens": ["a"]}), 400, "tokens")
    assert_error(post(live, "/detokenize", {"tokens": [model.config.vocab_size]}), 400, "out of range")
    assert post(live, "/detokenize", {"tokens": []}).json() == {"content": ""}


def test_apply_template(live, model):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    r = post(live, "/apply-template", {"messages": messages})
    assert r.status_code == 200, r.text
    assert r.json()["prompt"] == model.render_chat(messages)
    assert r.json()["prompt"].endswith("<|im_start|>assistant\n")
    assert_error(post(live, "/apply-template", {"messages": []}), 400, "messages")
    assert_error(post(live, "/apply-template", {"messages": [{"role": "wizard", "content": "x"}]}), 400, "role")



def test_apply_template_shows_the_prompt_generation_renders(live, model):
    """SmolLM2's template knows no tools: generation describes them in the generic tool prompt, and
    /apply-template said the template's own text without them (not the prompt the model was given)."""
    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
    messages = [{"role": "user", "content": "Time in Lima?"}]
    prompt = post(live, "/apply-template", {"messages": messages, "tools": tools}).json()["prompt"]
    assert "get_time" in prompt and "<tool_call>" in prompt, prompt
    assert prompt != model.render_chat(messages)
    # its tokens are the prompt's a chat completion counts
    r = post(live, "/v1/chat/completions", {"model": MODEL_ID, "messages": messages, "tools": tools, "max_tokens": 1})
    assert r.json()["usage"]["prompt_tokens"] == len(model.tokenize(prompt))


def test_model_without_fim_tokens_is_refused(live):
    err = assert_error(post(live, "/infill", {"input_prefix": "def f():\n", "input_suffix": "\n"}), 400,
                       "fill-in-the-middle")
    assert err["code"] == "fim_not_supported"
    assert_error(post(live, "/v1/completions", {"model": MODEL_ID, "prompt": "def f():", "suffix": "\n",
                                               "max_tokens": 4}), 400, "fill-in-the-middle")
    # an empty suffix is no suffix (as OpenAI treats it): a plain completion
    r = post(live, "/v1/completions", {"model": MODEL_ID, "prompt": "Hello", "suffix": "", "max_tokens": 2})
    assert r.status_code == 200, r.text


# -- fill in the middle (Qwen2.5-Coder) -------------------------------------------------------

def test_fim_tokens_found_from_vocabulary_and_metadata(qwen_live):
    tok = qwen_live.model.tokenizer
    fim = find_fim_tokens(tok, {})
    assert (fim.pre, fim.suf, fim.mid) == tuple(tok.encode(t)[0] for t in
                                                ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"))
    assert fim.sep == tok.encode("<|file_sep|>")[0] and fim.rep == tok.encode("<|repo_name|>")[0]
    # ids the GGUF metadata names win over the token strings
    assert find_fim_tokens(tok, {"tokenizer.ggml.fim_mid_token_id": 7}).mid == 7
    ids = fim_prompt_ids(tok, fim, FIB_PREFIX, FIB_SUFFIX)
    assert ids == tok.encode(FIB_FIM)
    # text that spells a FIM token is text, not the control token
    sneaky = fim_prompt_ids(tok, fim, "x = '<|fim_middle|>'", "")
    assert sneaky.count(fim.mid) == 1 and sneaky[-1] == fim.mid


def test_infill_completes_between_prefix_and_suffix(qwen_live):
    body = {"input_prefix": FIB_PREFIX, "input_suffix": FIB_SUFFIX, "n_predict": 24, "temperature": 0}
    r = post(qwen_live, "/infill", body)
    assert r.status_code == 200, r.text
    out = r.json()
    # the request went to the model in the FIM format
    assert out["prompt"] == FIB_FIM
    assert out["tokens_evaluated"] == len(qwen_live.model.tokenize(FIB_FIM))
    assert out["stop"] is True and out["stop_type"] in ("eos", "limit")
    assert 1 <= out["tokens_predicted"] <= 24
    middle = out["content"]
    # a plausible body: a loop stepping the pair
    assert ("for " in middle or "while " in middle) and "a, b = b, a + b" in middle, middle

    # streamed: the same text in pieces, then a last line with stop and the counts
    with httpx.stream("POST", qwen_live.url + "/infill", json={**body, "stream": True}, timeout=120) as s:
        events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: ")]
    assert all(not e["stop"] for e in events[:-1]) and events[-1]["stop"] is True
    assert "".join(e["content"] for e in events) == middle
    assert events[-1]["tokens_predicted"] == out["tokens_predicted"]


def test_infill_with_context_files_and_typed_prompt(qwen_live):
    body = {"input_prefix": "from utils import square\n\ndef area(side):\n", "prompt": "    return ",
            "input_suffix": "\n", "input_extra": [{"filename": "utils.py", "text": "def square(x):\n    return x * x"}],
            "n_predict": 8, "temperature": 0}
    out = post(qwen_live, "/infill", body).json()
    expected = ("<|repo_name|>project\n<|file_sep|>utils.py\ndef square(x):\n    return x * x\n"
                "<|file_sep|>current_file\n<|fim_prefix|>from utils import square\n\ndef area(side):\n    return "
                "<|fim_suffix|>\n<|fim_middle|>")
    assert out["prompt"] == expected
    assert out["tokens_evaluated"] == len(qwen_live.model.tokenize(expected))
    assert "square(side)" in out["content"] or "side * side" in out["content"], out["content"]
    assert_error(post(qwen_live, "/infill", {"input_prefix": "x", "input_extra": [{"filename": 3}]}), 400,
                 "input_extra[0]")
    assert_error(post(qwen_live, "/infill", {"input_prefix": 1}), 400, "input_prefix")


def test_completions_suffix_is_fim(qwen_live):
    client = qwen_live.client()
    r = client.completions.create(model="qwen", prompt=FIB_PREFIX, suffix=FIB_SUFFIX, max_tokens=24, temperature=0)
    assert r.usage.prompt_tokens == len(qwen_live.model.tokenize(FIB_FIM))
    infill = post(qwen_live, "/infill", {"input_prefix": FIB_PREFIX, "input_suffix": FIB_SUFFIX, "max_tokens": 24,
                                         "temperature": 0}).json()
    assert r.choices[0].text == infill["content"]
    assert_error(post(qwen_live, "/v1/completions", {"prompt": [1, 2], "suffix": "x"}), 400, "token ids")
    assert_error(post(qwen_live, "/v1/completions", {"prompt": "a", "suffix": "x", "echo": True}), 400, "echo")
