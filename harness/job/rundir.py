"""What a refused job leaves in its run folder: nothing it did not find there, every file as it was, timestamps
included.

Hydra makes the job's folder and writes ``.hydra/{config,hydra,overrides}.yaml``, the job's log and, for a sweep,
``multirun.yaml`` at the sweep's root before the job's own code runs, so a refusal that only the job can make (an
unknown sample id, an empty data file, an offset past the data, another run's rows) would leave a new empty folder,
or rewrite a finished run's record. ``run.py`` takes a :class:`Snapshot` of the single run's folder, or a
:class:`SweepSnapshot` of the sweep's folder tree, before Hydra starts (:func:`remember`), and on such a refusal
:func:`undo_refused` puts back exactly what was there: Hydra's files byte for byte with their access and
modification times (or gone), the folders the job made gone; a file the job did not change is not touched, so
the user's ``*.log`` files keep their times. In a sweep, a job that finished updates the snapshot of its folder
(:meth:`SweepSnapshot.finished_job`): a later job refused in the same folder (``hydra.sweep.subdir=same``) puts
back what the finished job wrote, and ``multirun.yaml`` is put back only when no job of the sweep finished.
:func:`before` also tells ``runner.resume=false`` what the folder's ``.hydra/`` and logs held before Hydra
rewrote them, so they move to ``superseded/`` with the old rows (:func:`harness.job.resume.supersede`).
Without a snapshot (another launcher's worker process), a refused job's Hydra files are removed only when the
folder holds nothing else and the files were written by this process. Standard library only.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Files Hydra writes into a job's folder before the job runs (the log's name is the job's: ``run.log``).
HYDRA_FILES = (".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml")
#: What Hydra writes at a sweep's root before its first job.
SWEEP_FILE = "multirun.yaml"
#: When this module was imported (``run.py`` imports it before Hydra writes anything).
PROCESS_STARTED = time.time()

Times = tuple[int, int]  # (atime_ns, mtime_ns)


@dataclass
class Snapshot:
    """A folder before Hydra touched it: whether it and its ``.hydra/`` existed, its nearest existing ancestor,
    Hydra's files and every top-level ``*.log`` (bytes; None: absent), and the times of those files and of the
    folder and its ``.hydra/`` (``"."``, ``".hydra"``)."""

    path: Path
    existed: bool
    hydra_existed: bool = False
    anchor: Path | None = None
    files: dict[str, bytes | None] = field(default_factory=dict)
    times: dict[str, Times] = field(default_factory=dict)


def _times(p: Path) -> Times:
    st = p.stat()
    return st.st_atime_ns, st.st_mtime_ns


def snapshot(path: str | Path) -> Snapshot:
    """The state of ``path`` that :func:`undo` restores: Hydra's files (``multirun.yaml`` included) and every
    top-level ``*.log`` (whatever the job's name), as bytes with their times; for a folder still to be made, the
    ancestor the job's folders will hang from."""
    path = Path(path).resolve()
    anchor = next((p for p in path.parents if p.exists()), None)
    files: dict[str, bytes | None] = {rel: None for rel in (*HYDRA_FILES, SWEEP_FILE)}
    if path.is_dir():
        files.update({p.name: None for p in path.glob("*.log") if p.is_file()})
    times: dict[str, Times] = {}
    for rel in list(files):
        p = path / rel
        if p.is_file():
            files[rel], times[rel] = p.read_bytes(), _times(p)
    for rel in (".", ".hydra"):
        if (path / rel).is_dir():
            times[rel] = _times(path / rel)
    return Snapshot(path, path.is_dir(), (path / ".hydra").is_dir(), anchor, files, times)


@dataclass
class SweepSnapshot:
    """A sweep's folder tree before Hydra touched it: its root's :class:`Snapshot` (``multirun.yaml``), one for
    every folder under it holding Hydra files or logs, and the times of every folder under it."""

    root: Snapshot
    folders: dict[Path, Snapshot] = field(default_factory=dict)
    dirs: dict[Path, Times] = field(default_factory=dict)
    finished: int = 0

    def job(self, folder: str | Path) -> Snapshot | None:
        """What ``folder`` (a job's folder) held before the sweep, or after the last job of this process that
        finished in it; None for a folder outside the sweep's root."""
        folder = Path(folder).resolve()
        if folder == self.root.path:
            return self.root
        if folder in self.folders:
            return self.folders[folder]
        if self.root.path not in folder.parents:
            return None
        files: dict[str, bytes | None] = {rel: None for rel in HYDRA_FILES}
        if folder in self.dirs:
            return Snapshot(folder, True, False, None, files, {".": self.dirs[folder]})
        anchor = next((p for p in folder.parents if p in self.dirs or p == self.root.anchor), None)
        return Snapshot(folder, False, False, anchor, files)

    def finished_job(self, folder: str | Path) -> None:
        """A job finished in ``folder``: what it wrote is the record a later refused job puts back."""
        folder = Path(folder).resolve()
        self.finished += 1
        if folder.is_dir():
            self.folders[folder] = snapshot(folder)
            for p in (folder, *folder.parents):
                if p == self.root.path or self.root.path not in p.parents:
                    break
                self.dirs[p] = _times(p)


def sweep_snapshot(root: str | Path) -> SweepSnapshot:
    """:class:`SweepSnapshot` of a sweep's folder (``hydra.sweep.dir``), made or not."""
    snap = SweepSnapshot(snapshot(root))
    if not snap.root.existed:
        return snap
    for d, subdirs, names in os.walk(snap.root.path):
        d = Path(d)
        snap.dirs[d] = _times(d)
        if ".hydra" in subdirs or any(n.endswith(".log") for n in names):
            snap.folders[d] = snapshot(d)
        subdirs[:] = [s for s in subdirs if s != ".hydra"]
    return snap


#: What ``run.py`` recorded before Hydra started (:func:`remember`).
_BEFORE: Snapshot | SweepSnapshot | None = None


def remember(before: Snapshot | SweepSnapshot | None) -> None:
    """Record the state of the folder (or sweep tree) this process's jobs will write, before Hydra writes it."""
    global _BEFORE
    _BEFORE = before


def remembered() -> Snapshot | SweepSnapshot | None:
    return _BEFORE


def before(folder: str | Path) -> Snapshot | None:
    """What ``folder`` held before this process's Hydra wrote into it (None: not recorded)."""
    if isinstance(_BEFORE, SweepSnapshot):
        return _BEFORE.job(folder)
    if isinstance(_BEFORE, Snapshot) and _BEFORE.path == Path(folder).resolve():
        return _BEFORE
    return None


def put_back(path: Path, old: bytes | None, times: Times | None) -> bool:
    """Make ``path`` hold ``old`` (None: absent) with ``times``; a file already so is not touched. Returns
    whether anything changed."""
    if old is None:
        if path.is_file() or path.is_symlink():
            path.unlink()
            return True
        return False
    changed = False
    if not path.is_file() or path.read_bytes() != old:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(old)
        changed = True
    if times is not None and _times(path)[1] != times[1]:
        os.utime(path, ns=times)
        changed = True
    return changed


def undo(out_dir: str | Path, before: Snapshot | None, since: float, log_name: str | None = "run.log",
         lock: Any = None) -> bool:
    """Undo what Hydra wrote into ``out_dir`` for a job that was then refused. Returns whether anything changed.

    Args:
        out_dir: the job's folder (or a sweep's root).
        before: its :func:`snapshot` from before Hydra started (None: not recorded).
        since: when this process started (``time.time()``); without a snapshot, only files written since are
            removed, and only when the folder holds nothing but them.
        log_name: the job log's file name (None: no log, a sweep's root).
        lock: the folder's :class:`harness.job.runlock.FolderLock`, released once the files are back and before the
            folders this process made are removed.
    """
    out = Path(out_dir).resolve()
    names = (*HYDRA_FILES, SWEEP_FILE, *((log_name,) if log_name else ()))
    if before is not None and before.path == out:
        for rel in sorted({*names, *before.files}):
            put_back(out / rel, before.files.get(rel), before.times.get(rel))
        if lock is not None:
            lock.release()
        if not before.hydra_existed:
            _remove_if_empty(out / ".hydra")
        for rel in (".hydra", "."):  # creating and removing files inside changed the folders' times
            if rel in before.times and (out / rel).is_dir():
                os.utime(out / rel, ns=before.times[rel])
        if not before.existed:  # the folder, and the parents the job made for it
            folder = out
            while folder != before.anchor and folder != folder.parent and _remove_if_empty(folder):
                folder = folder.parent
        return True
    if lock is not None:
        lock.release()
    present = {p.relative_to(out).as_posix() for p in out.rglob("*") if not p.is_dir()} if out.is_dir() else set()
    if not present or not present <= set(names) or any(os.stat(out / rel).st_mtime < since for rel in present):
        return False
    for rel in present:
        (out / rel).unlink()
    _remove_if_empty(out / ".hydra")
    _remove_if_empty(out)
    return True


def undo_refused(out_dir: str | Path, since: float, log_name: str = "run.log", lock: Any = None) -> None:
    """Undo a refused job's Hydra writes with what :func:`remember` recorded: its folder, and for a sweep where no
    job finished yet, the sweep's root (``multirun.yaml``). ``lock`` (the folder's or sweep's) is released on the
    way (see :func:`undo`)."""
    out = Path(out_dir).resolve()
    if isinstance(_BEFORE, SweepSnapshot):
        root = _BEFORE.root
        if out != root.path:
            undo(out, _BEFORE.job(out), since, log_name)
        if not _BEFORE.finished:
            undo(root.path, root, since, log_name if out == root.path else None, lock=lock)
        return
    undo(out, before(out), since, log_name, lock=lock)


def tidy(before: Snapshot | SweepSnapshot | None) -> None:
    """Remove the folder of ``before`` (a sweep's root) and the parents made for it, if this process made them
    and they are empty (a command that ran no job, e.g. ``--cfg job``)."""
    snap = before.root if isinstance(before, SweepSnapshot) else before
    if snap is None or snap.existed:
        return
    folder = snap.path
    while folder != snap.anchor and folder != folder.parent and _remove_if_empty(folder):
        folder = folder.parent


def pin(argv: list[str], key: str, value: str) -> list[str]:
    """``argv`` (a ``run.py`` command line's arguments) with the override ``key=value``: in place of one given,
    else after the last override (Hydra's parser takes the overrides as one run of arguments: one placed after
    an option such as ``-m`` or ``--cfg job`` that follows overrides is refused)."""
    out = [a for a in argv if not a.startswith(f"{key}=")]
    where = next((i for i, a in enumerate(argv) if a.startswith(f"{key}=")), None)
    if where is None:
        last = [i for i, a in enumerate(out) if "=" in a and not a.startswith("-")]
        where = last[-1] + 1 if last else len(out)
    else:
        where -= sum(1 for a in argv[:where] if a.startswith(f"{key}="))
    return [*out[:where], f"{key}={value}", *out[where:]]


def _remove_if_empty(folder: Path) -> bool:
    try:
        folder.rmdir()  # only succeeds on an empty folder
        return True
    except OSError:
        return False
