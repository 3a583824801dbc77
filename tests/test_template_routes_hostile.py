"""A GGUF's hostile chat template (a long loop, a huge join, a wordwrap of a megabyte) reached through every
route that renders it, not only /v1/chat/completions (the attack round): each a 4xx within its render
budget, and the server healthy and serving afterwards. Held (no fix needed)."""
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_chat_template_limits import ATTACKS, hostile_live  # noqa: E402,F401 (the fixture)


def routes(content):
    user = [{"role": "user", "content": content}]
    return {
        "responses": ("/v1/responses", {"model": "smollm2", "input": content, "max_output_tokens": 16}),
        "responses_tokens": ("/v1/responses/input_tokens", {"model": "smollm2", "input": content}),
        "anthropic": ("/v1/messages", {"model": "smollm2", "max_tokens": 4, "messages": user}),
        "anthropic_tokens": ("/v1/messages/count_tokens", {"model": "smollm2", "messages": user}),
        "ollama_chat": ("/api/chat", {"model": "smollm2", "stream": False, "messages": user}),
        "ollama_generate": ("/api/generate", {"model": "smollm2", "stream": False, "prompt": content}),
        "apply_template": ("/apply-template", {"messages": user}),
    }


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_every_route_refuses_a_hostile_render(hostile_live, attack):
    url = hostile_live.url
    with ThreadPoolExecutor(8) as ex:
        got = {name: ex.submit(httpx.post, url + path, json=body, timeout=60)
               for name, (path, body) in routes(attack).items()}
        for name, f in got.items():
            r = f.result()
            assert 400 <= r.status_code < 500, (name, r.status_code, r.text[:300])
    ok = httpx.post(url + "/api/chat", timeout=60, json={"model": "smollm2", "stream": False,
                                                          "messages": [{"role": "user", "content": "hi"}],
                                                          "options": {"num_predict": 2}})
    assert ok.status_code == 200, ok.text
    assert httpx.get(url + "/health", timeout=10).status_code == 200
