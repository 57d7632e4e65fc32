"""What a refused job leaves in its run folder: nothing it did not find there.

Hydra makes the job's folder and writes ``.hydra/{config,hydra,overrides}.yaml`` and the job's log before the
job's own code runs, so a refusal that only the job can make (an unknown sample id, an empty data file, an
offset past the data) would leave a new empty folder, or rewrite a finished run's ``.hydra`` record. ``run.py``
takes a :class:`Snapshot` of the folder a single run will use before Hydra starts, and on such a refusal
:func:`undo` puts back exactly what was there: Hydra's files as they were (or gone), the folder gone if the job
made it. A sweep's jobs have no snapshot: their Hydra files are removed only when the folder holds nothing
else and the files were written by this process. Nothing else is ever touched. Standard library only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

#: Files Hydra writes into a job's folder before the job runs (the log's name is the job's: ``run.log``).
HYDRA_FILES = (".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml")


@dataclass
class Snapshot:
    """A run folder before Hydra touched it: whether it and its ``.hydra/`` existed, its nearest existing
    ancestor, and Hydra's files and every log in it (None: absent)."""

    path: Path
    existed: bool
    hydra_existed: bool = False
    anchor: Path | None = None
    files: dict[str, bytes | None] = field(default_factory=dict)


def snapshot(path: str | Path) -> Snapshot:
    """The state of ``path`` that :func:`undo` restores: Hydra's files and every top-level ``*.log`` (whatever
    the job's name), as bytes; for a folder still to be made, the ancestor the job's folders will hang from."""
    path = Path(path).resolve()
    anchor = next((p for p in path.parents if p.exists()), None)
    files: dict[str, bytes | None] = {rel: ((path / rel).read_bytes() if (path / rel).is_file() else None)
                                      for rel in HYDRA_FILES}
    if path.is_dir():
        files.update({p.name: p.read_bytes() for p in path.glob("*.log") if p.is_file()})
    return Snapshot(path, path.is_dir(), (path / ".hydra").is_dir(), anchor, files)


def undo(out_dir: str | Path, before: Snapshot | None, since: float, log_name: str = "run.log") -> bool:
    """Undo what Hydra wrote into ``out_dir`` for a job that was then refused. Returns whether anything changed.

    Args:
        out_dir: the job's folder.
        before: its :func:`snapshot` from before Hydra started (None for a sweep's job).
        since: when this process started (``time.time()``); without a snapshot, only files written since are
            removed, and only when the folder holds nothing but them.
        log_name: the job log's file name.
    """
    out = Path(out_dir).resolve()
    names = (*HYDRA_FILES, log_name)
    if before is not None and before.path == out:
        for rel in sorted({*names, *before.files}):
            old, p = before.files.get(rel), out / rel
            if old is None:
                p.unlink(missing_ok=True)
            else:
                p.write_bytes(old)
        if not before.hydra_existed:
            _remove_if_empty(out / ".hydra")
        if not before.existed:  # the folder, and the parents the job made for it
            folder = out
            while folder != before.anchor and folder != folder.parent and _remove_if_empty(folder):
                folder = folder.parent
        return True
    present = {p.relative_to(out).as_posix() for p in out.rglob("*") if not p.is_dir()} if out.is_dir() else set()
    if not present or not present <= set(names) or any(os.stat(out / rel).st_mtime < since for rel in present):
        return False
    for rel in present:
        (out / rel).unlink()
    _remove_if_empty(out / ".hydra")
    _remove_if_empty(out)
    return True


def _remove_if_empty(folder: Path) -> bool:
    try:
        folder.rmdir()  # only succeeds on an empty folder
        return True
    except OSError:
        return False
