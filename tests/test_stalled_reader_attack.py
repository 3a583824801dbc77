"""A client that never reads its response (the attack round): once the connection's buffers are full, it
gets --send-timeout seconds to read some of it, then the connection is aborted. It had held the connection
and every answer event waiting to be sent (an n=4 stream with top_logprobs: ~17 MB of the server's memory)
for as long as it kept the socket open; enough such clients filled the connection cap and the memory.
"""
import json
import socket
import sys
import time
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from serverkit import ServerProcess  # noqa: E402
from test_export import tiny_llama_gguf  # noqa: E402


def _stalled(srv) -> float:
    return srv.metrics().get('llambda_connections_dropped_total{reason="stalled"}', 0.0)


def test_a_client_that_reads_nothing_is_dropped_and_a_slow_one_is_not(tmp_path):
    gguf = tiny_llama_gguf(tmp_path / "tiny.gguf")
    with ServerProcess(gguf, tmp_path / "srv.log", "--parallel", "4", "-c", "512", "--send-timeout", "2") as srv:
        # ~20 MB of stream: past what the kernel's buffers of both ends hold
        body = json.dumps({"model": srv.model_id, "prompt": "a", "max_tokens": 500, "n": 16, "stream": True,
                           "logprobs": 5, "ignore_eos": True, "temperature": 1.0, "seed": 1}).encode()
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
        s.connect(("127.0.0.1", srv.port))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        deadline = time.monotonic() + 120
        while _stalled(srv) < 1:
            assert time.monotonic() < deadline, "the client that reads nothing was never dropped: " + srv.log()
            time.sleep(0.5)
        # reset, not closed: the kernel dropped the MBs it held for the client at once (a FIN would have
        # waited behind them)
        s.settimeout(30)
        with pytest.raises(ConnectionResetError):
            while s.recv(1 << 20):
                pass
        s.close()
        assert httpx.get(srv.url + "/health", timeout=30).status_code == 200
        # a client reading the same stream slowly, but reading: served whole
        with httpx.stream("POST", srv.url + "/v1/completions", timeout=120,
                          json={**json.loads(body), "n": 2, "max_tokens": 200}) as r:
            lines = []
            for line in r.iter_lines():
                lines.append(line)
                if len(lines) % 50 == 0:
                    time.sleep(0.05)
        assert lines[-2:] == ["data: [DONE]", ""] or "data: [DONE]" in lines
        assert _stalled(srv) == 1
