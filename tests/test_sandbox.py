"""Hostile programs against the code executor (tasks/execution.py, tasks/sandbox.py): each tries one way out of
its sandbox -- writing outside its temp folder through every file API, deleting or renaming outside files,
processes through every module, signals to any other process, reading another process's environment or
memory, the network, a fork bomb, a disk fill, a memory bomb, a detached daemon, forging a pass. Each program
*passes* only when its escape worked (it checks for itself), so the suite asserts, for every one: the harness
survived, the program did not pass, nothing outside changed (files, a sentinel process, a listening socket, a
secret in the harness's environment), and a correct program still passes.

Every program runs from a separate harness process (an escape that kills the harness shows as its exit status,
not as a dead pytest), once with the harness as root and once as uid 65534 (a normal user: the harness is
started through ``setpriv`` in a mount namespace where the interpreter under /root is reachable).

To count what escapes another version of the executor (e.g. an export of an older commit):
``SPECDEC_SANDBOX_SUITE_ROOT=/path/to/tree pytest tests/test_sandbox.py``.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from tasks import execution, sandbox
from tests.hostile_programs import FIRST_SET, SECOND_SET, THIRD_SET
from tests.procs import alive as _alive

PROJECT = Path(__file__).resolve().parents[1]
ROOT = Path(os.environ.get("SPECDEC_SANDBOX_SUITE_ROOT", PROJECT))
SECRET_VAR = "SPECDEC_SUITE_SECRET"
NOBODY = 65534

HARNESS = """
import inspect, json, os, sys
sys.path.insert(0, os.getcwd())
from tasks.execution import run_program
kwargs = json.loads(sys.argv[1])
if "isolation" not in inspect.signature(run_program).parameters:
    kwargs.pop("isolation")  # an executor from before OS isolation
else:
    from tasks.sandbox import method
    kwargs["isolation"] = method()  # forced: no probe per harness process (the suite probed once)
try:
    r = run_program(sys.stdin.read(), **kwargs)
    print(json.dumps({"status": r.status, "detail": r.detail}))
except Exception as e:
    print(json.dumps({"status": "exception", "detail": repr(e)}))
"""

# Run as root in a private mount namespace: make the interpreter reachable for uid 65534, then become it.
AS_NOBODY = """
import os, sys
sys.path.insert(0, sys.argv[1])
from tasks import sandbox
sandbox.expose(sandbox.libc_handle(), sandbox.interpreter_trees(), 65534, 65534, sys.argv[2])
setpriv = sys.argv[3]
os.execv(setpriv, [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all",
                   "--bounding-set=-all", "--", sys.executable, *sys.argv[4:]])
"""


def _can_run_as_nobody() -> str:
    if os.geteuid() != 0:
        return "the harness already runs as a normal user"
    if shutil.which("setpriv") is None or shutil.which("unshare") is None:
        return "setpriv or unshare missing"
    return ""


USERS = [pytest.param("root", marks=pytest.mark.skipif(os.geteuid() != 0, reason="not root")),
         pytest.param("nobody", marks=pytest.mark.skipif(bool(_can_run_as_nobody()), reason=_can_run_as_nobody()))]
if os.geteuid() != 0:
    USERS = ["self"]


@pytest.fixture(scope="module", autouse=True)
def isolation_available():
    how, why = execution.probe()
    if how is None and ROOT == PROJECT:
        pytest.skip(f"no OS isolation on this machine: {why}")


@pytest.fixture(scope="module")
def listener():
    """A TCP server on 127.0.0.1 counting the connections it accepts."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.settimeout(0.2)
    accepted = []
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
                accepted.append(1)
                conn.close()
            except OSError:
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    stop.set()
    thread.join(2)
    server.close()


@pytest.fixture
def arena():
    """A world-writable folder outside any sandbox with a file and a folder that must survive unchanged."""
    base = Path(tempfile.mkdtemp(prefix="specdec_arena_"))
    base.chmod(0o777)
    keep = base / "keep.txt"
    keep.write_text("keep")
    keep.chmod(0o666)
    (base / "keep_dir").mkdir()
    (base / "keep_dir").chmod(0o777)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def _sentinel(user: str) -> subprocess.Popen:
    """A process a program might signal: owned by the harness's user."""
    cmd = ["sleep", "60"]
    if user == "nobody":
        cmd = [shutil.which("setpriv"), f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *cmd]
    return subprocess.Popen(cmd)


def _harness(program: str, user: str, secret: str, tmp: Path, **kwargs) -> subprocess.CompletedProcess:
    kwargs = {"timeout_s": 5.0, "isolation": "namespaces", **kwargs}
    cmd = [sys.executable, "-c", HARNESS, json.dumps(kwargs)]
    if user == "nobody":
        stage = tempfile.mkdtemp(prefix="stage_", dir=tmp)
        cmd = [shutil.which("unshare"), "--mount", "--propagation", "private", sys.executable, "-c", AS_NOBODY,
               str(PROJECT), str(stage), shutil.which("setpriv"), *cmd[1:]]
    env = {**os.environ, SECRET_VAR: secret}
    return subprocess.run(cmd, input=program, cwd=ROOT, env=env, capture_output=True, text=True, timeout=90)


def _fill(template: str, arena: Path, pid: int, port: int) -> str:
    return (template.replace("TARGET", repr(str(arena / "escaped"))).replace("EXISTING_DIR", repr(str(arena / "keep_dir")))
            .replace("EXISTING", repr(str(arena / "keep.txt"))).replace("SENTINEL_PID", str(pid))
            .replace("PORT", str(port)).replace("SECRET_VAR", repr(SECRET_VAR)))



def _check_contained(name: str, program: str, user: str, arena: Path, listener, tmp_path: Path,
                     **kwargs) -> None:
    port, accepted = listener
    accepted.clear()
    secret = secrets.token_hex(12)
    sentinel = _sentinel(user)
    try:
        out = _harness(_fill(program, arena, sentinel.pid, port), user, secret, tmp_path, **kwargs)
        if name == "daemon":
            time.sleep(0.6)  # the daemon acts 0.2 s after its parent ended
        escaped = []
        if out.returncode != 0:
            escaped.append(f"the harness died (exit {out.returncode}): {out.stderr[-500:]}")
        result = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else {"status": "?"}
        if result["status"] in ("passed", "exception"):
            escaped.append(f"status {result['status']}: {result.get('detail', '')[-300:]}")
        found = sorted(p.name for p in arena.iterdir())
        if found != ["keep.txt", "keep_dir"] or (arena / "keep.txt").read_text() != "keep" \
                or (arena / "keep.txt").stat().st_mode & 0o777 != 0o666 or list((arena / "keep_dir").iterdir()):
            escaped.append(f"files outside changed: {found}")
        if not _alive(sentinel.pid):
            escaped.append("the sentinel process was killed")
        if accepted:
            escaped.append(f"{len(accepted)} connection(s) reached the listening socket")
        if secret in out.stdout or secret in out.stderr:
            escaped.append("the harness's secret leaked")
        assert not escaped, f"{name} escaped: " + "; ".join(escaped)
    finally:
        sentinel.kill()
        sentinel.wait()


@pytest.mark.parametrize("user", USERS)
@pytest.mark.parametrize("name,program,kwargs", FIRST_SET, ids=[c[0] for c in FIRST_SET])
def test_hostile_program_is_contained(name, program, kwargs, user, arena, listener, tmp_path):
    _check_contained(name, program, user, arena, listener, tmp_path, **kwargs)


@pytest.mark.parametrize("user", USERS)
@pytest.mark.parametrize("name,program,kwargs", SECOND_SET, ids=[c[0] for c in SECOND_SET])
def test_second_hostile_set_is_contained(name, program, kwargs, user, arena, listener, tmp_path):
    _check_contained(name, program, user, arena, listener, tmp_path, **kwargs)


@pytest.mark.parametrize("user", USERS)
@pytest.mark.parametrize("name,program,kwargs", THIRD_SET, ids=[c[0] for c in THIRD_SET])
def test_kernel_interfaces_are_refused(name, program, kwargs, user, arena, listener, tmp_path):
    """The seccomp filter's classes (memfd, nested namespaces, keyrings, io_uring, ptrace, ...) and the covered
    shared temp folders: contained, and (where the run got that far) refused with EPERM or ENOSYS."""
    _check_contained(name, program, user, arena, listener, tmp_path, **kwargs)


def _status(out: subprocess.CompletedProcess) -> dict:
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


THREADS = ("import threading, concurrent.futures\nresults = []\n"
           "threads = [threading.Thread(target=results.append, args=(i,)) for i in range(4)]\n"
           "for t in threads:\n    t.start()\nfor t in threads:\n    t.join()\nassert sorted(results) == [0, 1, 2, 3]\n"
           "with concurrent.futures.ThreadPoolExecutor(4) as pool:\n"
           "    assert list(pool.map(abs, [-1, -2, 3])) == [1, 2, 3]\n")


@pytest.mark.parametrize("user", USERS)
def test_threads_work_and_processes_are_refused(user, tmp_path):
    """A correct solution that starts and joins threads passes; without ``allow_processes`` fork (through
    ``posix`` past the guard) is refused by the kernel (EPERM); with it a subprocess runs."""
    assert _status(_harness(THREADS, user, "x", tmp_path))["status"] == "passed"
    forked = _status(_harness("import posix\npid = posix.fork()\nif pid == 0:\n    posix._exit(0)\n", user, "x",
                              tmp_path))
    assert forked["status"] == "error" and "Operation not permitted" in forked["detail"], forked
    spawned = _status(_harness("import subprocess\nassert subprocess.run(['true']).returncode == 0\n" + THREADS,
                               user, "x", tmp_path, allow_processes=True))
    assert spawned["status"] == "passed", spawned


def test_concurrent_programs_cannot_read_each_other(tmp_path):
    """Two programs at once (each from a harness process started by a thread of this one): the second looks for
    the first's run folder (its source and stdout, by a secret only the first holds) in every shared temp folder
    and finds nothing of it; the first was running meanwhile (its folder is visible from here)."""
    user = "root" if os.geteuid() == 0 else "self"
    secret = secrets.token_hex(12)
    first = f"import time\nSOLUTION = {secret!r}\nprint(SOLUTION, flush=True)\ntime.sleep(4)\n"
    second = (f"import glob, os, sys, tempfile\nneedle = {secret[::-1]!r}[::-1]\nfound, seen = [], []\n"
              "here = os.path.dirname(os.getcwd())\n"
              "for root in {os.path.dirname(here), '/tmp', '/var/tmp', '/dev/shm', tempfile.gettempdir()}:\n"
              "    for d in glob.glob(os.path.join(root, '*')):\n        seen.append(d)\n"
              "        for f in ('program.py', 'stdout.txt', 'stderr.txt'):\n            try:\n"
              "                if needle in open(os.path.join(d, f)).read():\n"
              "                    found.append((d, f))\n"
              "            except OSError:\n                pass\n"
              "print(sorted(seen), file=sys.stderr)\nassert found, 'nothing of the other program'\n")
    results = {}
    runner = threading.Thread(target=lambda: results.setdefault(
        "first", _status(_harness(first, user, "x", tmp_path, timeout_s=10.0))))
    before = set(Path(tempfile.gettempdir()).glob("specdec_exec_*"))
    runner.start()
    try:
        deadline = time.monotonic() + 5
        while not set(Path(tempfile.gettempdir()).glob("specdec_exec_*")) - before and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.5)  # the first program is running
        others = set(Path(tempfile.gettempdir()).glob("specdec_exec_*")) - before
        assert others, "the first program's run folder never appeared"
        result = _status(_harness(second, user, "x", tmp_path))
        assert any((d / "program.py").exists() for d in others), "the first program ended too early"
    finally:
        runner.join(30)
    assert results["first"]["status"] == "passed", results["first"]
    # its own assertion: nothing of the other program found
    assert result["status"] == "failed" and "nothing of the other program" in result["detail"], result
    assert all(d.name not in result["detail"] for d in others), result["detail"]


def _run_bpf(prog, arch: int, nr: int, arg0: int = 0) -> int:
    """A tiny classic-BPF interpreter for the instructions the filter uses (seccomp_data: nr, arch, args[0])."""
    data = {0: nr, 4: arch, 16: arg0 & 0xFFFFFFFF}
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = prog[pc]
        if code == sandbox.BPF_LD_W_ABS:
            acc, pc = data[k], pc + 1
        elif code == sandbox.BPF_JEQ_K:
            pc += 1 + (jt if acc == k else jf)
        elif code == sandbox.BPF_JSET_K:
            pc += 1 + (jt if acc & k else jf)
        else:
            assert code == sandbox.BPF_RET_K
            return k


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_seccomp_program_semantics(machine):
    """The filter of each architecture, run through a BPF interpreter: what it refuses, what it lets through."""
    arch, nr = sandbox.SYSCALLS[machine]
    eperm, enosys = sandbox.SECCOMP_RET_ERRNO | 1, sandbox.SECCOMP_RET_ERRNO | 38
    allow, kill = sandbox.SECCOMP_RET_ALLOW, sandbox.SECCOMP_RET_KILL_PROCESS
    getpid = {"x86_64": 39, "aarch64": 172}[machine]
    thread = 0x3D0F00  # glibc's pthread_create flags: CLONE_VM|FS|FILES|SIGHAND|THREAD|SYSVSEM|SETTLS|*_TID
    for allow_processes in (False, True):
        prog = sandbox.seccomp_program(machine, allow_processes)
        assert len(prog) < 4096 and prog[-1][0] == sandbox.BPF_RET_K
        assert all(pc + 1 + max(jt, jf) < len(prog) for pc, (code, jt, jf, _) in enumerate(prog)
                   if code != sandbox.BPF_RET_K)
        run = functools.partial(_run_bpf, prog, arch)
        assert {name for name in sandbox.DENIED if name not in nr} <= {"modify_ldt"}
        for name in sandbox.DENIED:
            assert name not in nr or run(nr[name]) == eperm, name
        assert run(nr["clone3"], 0) == enosys
        assert run(getpid) == allow and run(nr["clone"], thread) == allow
        assert run(nr["clone"], thread | 0x10000000) == eperm and run(nr["clone"], 0x20000 | 17) == eperm
        assert run(nr["clone"], 17) == (allow if allow_processes else eperm)  # fork
        for name in ("fork", "vfork", "execve", "execveat"):
            if name in nr:
                assert run(nr[name]) == (allow if allow_processes else eperm), name
        assert _run_bpf(prog, 0x40000003, getpid) == kill  # another ABI (i386)
        if machine == "x86_64":
            assert run(0x40000000 | getpid) == kill  # x32
    with pytest.raises(sandbox.SandboxError, match="no seccomp filter for architecture"):
        sandbox.seccomp_program("riscv64", False)


@pytest.mark.parametrize("user", USERS)
def test_correct_and_wrong_programs_score_as_before(user, tmp_path):
    """Inside the sandbox (as uid 65534 under a root harness, as a user namespace's root under a normal user's)
    a correct program still passes (imports from the standard library, files in its temp folder) and a wrong
    one fails."""
    uid = {"root": NOBODY, "nobody": 0, "self": 0}[user]  # uid 65534, or a user namespace's root
    good = (f"import collections, fractions, json, os, re, tempfile\nassert os.getuid() == {uid}, os.getuid()\n"
            "assert [line.split()[3:5] for line in open('/proc/self/limits') if line.startswith('Max open files')] \\\n"
            "    == [['256', '256']]\n"
            "with open('scratch.txt', 'w') as f:\n    f.write('ok')\n"
            "with tempfile.NamedTemporaryFile('w') as f:\n    f.write('y')\n"
            "assert fractions.Fraction(1, 2) * 2 == 1 and collections.Counter('aab')['a'] == 2\n")
    for program, expected in ((good, "passed"), ("assert sum([1, 2]) == 4\n", "failed")):
        out = _harness(program, user, "x", tmp_path)
        assert out.returncode == 0, out.stderr[-2000:]
        assert json.loads(out.stdout.strip().splitlines()[-1])["status"] == expected, out.stdout[-2000:]


@pytest.mark.xfail(strict=True, reason="a known limit (docs/scoring.md, What stays open): the program shares its "
                                       "interpreter with the code that reports its pass, so one that reads the "
                                       "token's pipe and hands it back forges a pass; it escapes nothing")
def test_known_limit_in_process_tampering_forges_a_pass(arena, listener, tmp_path):
    program = ("import posix\ntoken = b''\nfor fd in range(3, 32):\n    try:\n        posix.set_blocking(fd, False)\n"
               "        token = token or posix.read(fd, 64)\n    except OSError:\n        pass\n"
               "for fd in range(3, 32):\n    try:\n        posix.write(fd, token)\n    except OSError:\n        pass\n"
               "posix._exit(0)\n")
    _check_contained("token_pipe", program, "root" if os.geteuid() == 0 else "self", arena, listener, tmp_path)
