"""Run a model-written Python program in a separate process with a timeout, for pass@1 scoring.

:func:`run_program` writes the program to a temporary folder and runs it with the current interpreter in
isolated mode (``python -I``), as its own process group, with that folder as working directory, stdin
closed and an address-space limit. On timeout the whole process group is killed. The result says
``passed`` (ran to the end), ``failed`` (an ``AssertionError``: a test did not hold), ``timeout`` or
``error`` (any other exception, a syntax error, an early ``exit()``, a crash).

This is a guard against accidents, not a sandbox: the program can still read files and use the network
as the current user. Tasks call it only when ``allow_code_execution`` is true. What does not live here:
assembling the program from a completion and tests (the tasks do that).
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

STATUSES = ("passed", "failed", "timeout", "error")

# The driver exec()s the program and prints a random token only if the program ran to its end, so a
# program that calls exit(0) before the asserts does not count as passing. Exit code 3 = AssertionError.
_DRIVER = r"""
import sys, traceback
path, token, limit_mb = sys.argv[1], sys.argv[2], int(sys.argv[3])
if limit_mb > 0:
    try:
        import resource
        limit = limit_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (ImportError, ValueError, OSError):
        pass
with open(path, encoding="utf-8") as f:
    source = f.read()
namespace = {"__name__": "__main__", "__file__": path}
try:
    exec(compile(source, path, "exec"), namespace)
except AssertionError:
    traceback.print_exc()
    sys.exit(3)
sys.stdout.flush()
print("\n" + token, flush=True)
"""


@dataclass(frozen=True)
class ExecutionResult:
    """Outcome of one program run.

    Attributes:
        status: ``passed``, ``failed`` (assertion), ``timeout`` or ``error``.
        detail: the tail of stderr (the traceback), or why the run was stopped.
        duration_s: wall seconds of the run.
    """

    status: str
    detail: str = ""
    duration_s: float = 0.0

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, AttributeError):
        proc.kill()


def run_program(program: str, timeout_s: float = 10.0, max_memory_mb: int = 4096) -> ExecutionResult:
    """Execute ``program`` in a fresh Python process and report how it ended.

    Args:
        program: the complete source to run (setup code, solution, asserts).
        timeout_s: wall-clock limit in seconds; the process group is killed when it is exceeded.
        max_memory_mb: address-space limit of the child in MiB (``0`` = none; Linux/macOS only).

    Returns:
        An :class:`ExecutionResult`.

    Example:
        >>> run_program("assert 1 + 1 == 2").status
        'passed'
        >>> run_program("assert 1 + 1 == 3").status
        'failed'
    """
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    token = "__specdec_done_" + secrets.token_hex(8)
    with tempfile.TemporaryDirectory(prefix="specdec_exec_") as tmp:
        path = Path(tmp) / "program.py"
        path.write_text(program, encoding="utf-8")
        env = {"PATH": os.environ.get("PATH", ""), "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1",
               "HOME": tmp, "TMPDIR": tmp, "OMP_NUM_THREADS": "1"}
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-I", "-c", _DRIVER, str(path), token, str(int(max_memory_mb))],
            cwd=tmp, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            proc.communicate()
            return ExecutionResult("timeout", f"killed after {timeout_s:g} s", time.perf_counter() - t0)
        finally:
            if proc.poll() is None:  # e.g. KeyboardInterrupt while waiting
                _kill_group(proc)
                proc.wait()
        duration = time.perf_counter() - t0
    stdout = out.decode("utf-8", "replace")
    stderr = err.decode("utf-8", "replace")
    tail = stderr[-2000:]
    if proc.returncode == 0 and token in stdout:
        return ExecutionResult("passed", "", duration)
    if proc.returncode == 3:
        return ExecutionResult("failed", tail, duration)
    if proc.returncode == 0:
        tail = tail or "the program exited before reaching its end"
    return ExecutionResult("error", tail or f"exit code {proc.returncode}", duration)
