"""`llambda ps` finds the server as ollama does: --host, else OLLAMA_HOST (host, host:port, :port,
scheme://host:port; blanks and quotes around it dropped, empty as unset), else `llambda serve`'s address;
its default port stays llambda serve's 8080 (https: 443). Live on the tiny llama."""
from pathlib import Path

import pytest

import llambda
from llambda.cli import main
from llambda.commands.ps import DEFAULT_HOST, address, server_url

TINY_LLAMA = str(Path(__file__).parent / "fixtures" / "reference" / "tiny" / "llama")


@pytest.mark.parametrize("env, flag, want", [
    (None, None, "http://127.0.0.1:8080"), ("", None, "http://127.0.0.1:8080"), ("  ", None, "http://127.0.0.1:8080"),
    ("example", None, "http://example:8080"), ("example:11434", None, "http://example:11434"),
    (":9000", None, "http://127.0.0.1:9000"), ("http://example:9000", None, "http://example:9000"),
    ("https://example", None, "https://example:443"), ("'example:7'", None, "http://example:7"),
    (' "[::1]:9000" ', None, "http://[::1]:9000"), ("0.0.0.0", None, "http://0.0.0.0:8080"),
    ("example:11434", "other:1", "http://other:1"),           # --host wins
])
def test_the_address_as_ollama_reads_it(monkeypatch, env, flag, want):
    if env is None:
        monkeypatch.delenv("OLLAMA_HOST", raising=False)
    else:
        monkeypatch.setenv("OLLAMA_HOST", env)
    assert server_url(*address(flag)) == want


def test_a_bad_ollama_host_is_named(monkeypatch, capsys):
    monkeypatch.setenv("OLLAMA_HOST", "localhost:http")
    assert main(["ps"]) == 1
    assert capsys.readouterr().err == ("llambda: error: OLLAMA_HOST 'localhost:http': the port must be a number "
                                       "from 0 to 65535\n")
    monkeypatch.setenv("OLLAMA_HOST", "ftp://example")
    assert main(["ps"]) == 1
    assert "OLLAMA_HOST 'ftp://example': the scheme must be http or https" in capsys.readouterr().err


def test_ps_asks_the_server_ollama_host_names(monkeypatch, capsys):
    from serverkit import LiveServer, free_port

    from llambda.server import ServerConfig, create_app
    monkeypatch.delenv("LLAMBDA_API_KEY", raising=False)
    with llambda.load(TINY_LLAMA, n_slots=1, n_ctx=64) as m:
        with LiveServer(create_app(m, ServerConfig(model_id="tiny", parallel=1))) as srv:
            for env in (f"127.0.0.1:{srv.port}", srv.url, f":{srv.port}"):
                monkeypatch.setenv("OLLAMA_HOST", env)
                assert main(["ps"]) == 0, env
                lines = capsys.readouterr().out.splitlines()
                assert lines[1].split()[0] == "tiny:latest", env
            nobody = free_port()
            assert main(["ps", "--host", f"127.0.0.1:{nobody}"]) == 1      # --host over OLLAMA_HOST
            assert f"no server answers at http://127.0.0.1:{nobody} (" in capsys.readouterr().err
            monkeypatch.setenv("OLLAMA_HOST", f"127.0.0.1:{nobody}")
            assert main(["ps", "--host", srv.url]) == 0
            capsys.readouterr()
            assert main(["ps"]) == 1
            err = capsys.readouterr().err
            assert err.startswith(f"llambda: error: no server answers at http://127.0.0.1:{nobody} (OLLAMA_HOST) ("), err
    assert DEFAULT_HOST == "http://127.0.0.1:8080"
