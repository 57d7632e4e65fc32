"""One writer per run folder: an exclusive lock on ``<folder>/writer.lock``, taken before anything is written.

Two processes writing one folder would time every cell twice while each loads the CPU the other measures on,
and the folder's summary would show one of them without a word. ``run.py`` takes the lock of the single run's
folder (or of a sweep's folder) before Hydra writes into it, and :func:`harness.job.app.main_job` takes the lock of
its job's folder; a second writer is refused in one line naming the holder. The lock is ``fcntl.flock``: the
kernel releases it when its holder exits or dies (a ``kill -9`` leaves no stale lock, only a stale file whose
holder line the next writer overwrites). The holder removes the file when it lets go. Shards of a run write to
folders of their own (``runner.shard``; a folder never mixes shards, :mod:`harness.job.resume`), so they run
concurrently, each under its own folder's lock.

Standard library only (``run.py`` takes the lock before torch is imported). POSIX; elsewhere no lock is taken.
"""

from __future__ import annotations

import errno
import os
import shlex
import socket
import stat
import sys
import time
from pathlib import Path

try:
    import fcntl
except ImportError:  # not POSIX: no lock
    fcntl = None  # type: ignore[assignment]

#: The lock file's name inside the run folder.
LOCK_NAME = "writer.lock"

#: Locks this process holds, by resolved folder: taking one again (run.py, then main_job) is a no-op.
_HELD: dict[Path, "FolderLock"] = {}


class FolderBusyError(RuntimeError):
    """Another live process holds the folder's lock; the message names it and the ways on."""


class FolderLock:
    """The exclusive lock of one run folder (see the module docstring); :meth:`release` lets it go."""

    def __init__(self, folder: Path, fd: int | None):
        self.folder = folder
        self.path = folder / LOCK_NAME
        self._fd = fd
        self._pid = os.getpid()  # a copy in another process (a launcher pickles the task) holds nothing

    @property
    def held(self) -> bool:
        return self._fd is not None and self._pid == os.getpid()

    def release(self) -> None:
        """Remove the lock file and let the lock go (idempotent; a no-op in another process)."""
        if not self.held:
            return
        try:
            self.path.unlink(missing_ok=True)  # while still held: no one else can have opened a newer file
        except OSError:
            pass
        os.close(self._fd)
        self._fd = None
        _HELD.pop(self.folder, None)

    def __enter__(self) -> "FolderLock":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def holder_line(argv: list[str] | None = None) -> str:
    """What the lock file says about its holder: pid, host, start time (UTC) and command."""
    command = shlex.join([sys.executable, *(sys.argv if argv is None else argv)])
    return (f"pid {os.getpid()} on {socket.gethostname()}, started "
            f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}: {command}")


def acquire(folder: str | Path, key: str = "hydra.run.dir") -> FolderLock:
    """Take the lock of ``folder`` (made if missing, with its parents), or the one this process holds already.

    Args:
        folder: the run (or sweep) folder.
        key: the setting that chose the folder (``hydra.run.dir``, ``hydra.sweep.dir``), named by the refusal.

    Returns:
        The lock; call :meth:`FolderLock.release` (or use it as a context manager) when done writing. A lock this
        process already held is returned as a no-op lock (its release leaves the outer one held).

    Raises:
        FolderBusyError: another live process holds it (the message names the holder).
        OSError: the folder cannot be made or the lock file cannot be created (e.g. ``/proc/x``, a read-only
            file system); ``run.py`` turns it into one ``error:`` line.
    """
    folder = Path(folder).resolve()
    if folder in _HELD:
        return FolderLock(folder, None)
    folder.mkdir(parents=True, exist_ok=True)
    if fcntl is None:
        return FolderLock(folder, None)
    path = folder / LOCK_NAME
    other = _nested_writer(folder)
    if other:
        raise FolderBusyError(
            f"{key}={folder}: {other}; two writers would time each cell twice on a shared CPU and mix their "
            f"records. Wait for it to end, or write elsewhere ({key}=<another folder>)")
    while True:
        fd = _open_lock_file(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read(fd)
            os.close(fd)
            raise FolderBusyError(
                f"{key}={folder}: the folder is being written by another process ({holder or 'holder unknown'}); "
                f"two writers would time each cell twice on a shared CPU and mix their rows. Wait for it to end, "
                f"or write elsewhere ({key}=<another folder>)") from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:  # its holder removed the file between our open and our lock
            same = False
        if same:
            break
        os.close(fd)
    os.ftruncate(fd, 0)
    os.write(fd, (holder_line() + "\n").encode())
    lock = FolderLock(folder, fd)
    _HELD[folder] = lock
    return lock


def _open_lock_file(path: Path) -> int:
    """Open (or create) the lock file without following a symlink planted in its place (as root, a link
    would let the holder line overwrite any file); anything but a regular file is refused (OSError)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, f"{LOCK_NAME} is not a regular file", str(path))
    return fd


def _held_elsewhere(path: Path) -> str | None:
    """The holder line of the lock file ``path`` when another live process holds it, else None. A lock this
    process holds, or one held by a process this one descends from (a launcher's worker running a sweep's job),
    is not another writer."""
    if path.parent in _HELD or not path.is_file() or path.is_symlink():
        return None
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read(fd)
            return None if _holder_pid(holder) in _ancestors() else (holder or "holder unknown")
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _holder_pid(holder: str) -> int | None:
    parts = holder.split()
    on_this_host = len(parts) > 3 and parts[0] == "pid" and parts[2] == "on" and parts[3].rstrip(",") == socket.gethostname()
    try:
        return int(parts[1]) if on_this_host else None
    except ValueError:
        return None


def _ancestors() -> set[int]:
    """This process's pid and its ancestors' (Linux ``/proc``; elsewhere the parent only)."""
    out, pid = {os.getpid()}, os.getppid()
    while pid > 1 and pid not in out:
        out.add(pid)
        try:
            stat_line = Path(f"/proc/{pid}/stat").read_text()
            pid = int(stat_line.rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return out


def _nested_writer(folder: Path) -> str | None:
    """Why ``folder`` cannot be written although its own lock is free: a folder above it (a sweep's root) or
    below it (a job of a sweep, a run inside this folder) is being written by another process."""
    for parent in folder.parents:
        holder = _held_elsewhere(parent / LOCK_NAME)
        if holder:
            return f"it lies inside {parent}, which is being written by another process ({holder})"
    try:
        below = [p for p in folder.rglob(LOCK_NAME) if p.parent != folder]
    except OSError:
        below = []
    for path in below:
        holder = _held_elsewhere(path)
        if holder:
            return f"{path.parent} inside it is being written by another process ({holder})"
    return None


def _read(fd: int) -> str:
    try:
        return os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
    except OSError:
        return ""
