"""The code-execution supervisor (trusted code; :mod:`tasks.execution` runs it as a script in a fresh
interpreter, ``python -s tasks/supervisor.py <fd>``, and imports only its wait loop, :func:`wait_until`).

It reads its settings (program path, limits, the per-run pass token, the sandbox) as JSON from the pipe
``fd``, becomes a child subreaper, sets up the sandbox when there is one (:func:`tasks.sandbox.enter`: it is
then PID 1 of its own PID namespace), forks the program process (limits, privileges dropped and the seccomp
filter installed by :func:`tasks.sandbox.drop_privileges`, write guard, ``exec`` of the program) and waits for it within the wall-clock limit, then kills every descendant and exits
with its verdict: 80 passed, 81 failed, 82 error, 83 timeout, 84 the sandbox could not be set up (the program
did not run). Only the standard library: the program's interpreter must not load the harness
(``tasks/sandbox.py`` is loaded by its path).
"""

import json
import os
import signal
import sys
import time

CHILD_FAILED, CHILD_ERROR = 3, 4
PASSED, FAILED, ERROR, TIMEOUT, SANDBOX_FAILED = 80, 81, 82, 83, 84


def load_sandbox():
    """tasks/sandbox.py, loaded by its path (this script's folder is not on sys.path)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("specdec_sandbox",
                                                  os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                               "sandbox.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def note(text):
    try:
        os.write(2, ("\n[specdec-exec] " + text + "\n").encode("utf-8", "replace"))
    except OSError:
        pass


def refuse(what):
    def refused(*args, **kwargs):
        raise PermissionError(what + " is disabled by the code-execution guard (tasks/execution.py)")
    return refused


def guard(root, allow_processes):
    """Block writes outside `root` (and, unless allow_processes, processes, signals and native code)."""
    guard_writes(root)
    if not allow_processes:
        guard_processes()


def guard_writes(root):
    """Every write outside `root` (open, os.open, the os path functions, shutil.rmtree) raises PermissionError."""
    import builtins, io, shutil
    realpath, join, isabs, getcwd, readlink = (os.path.realpath, os.path.join, os.path.isabs, os.getcwd,
                                               os.readlink)
    root = realpath(root)

    def inside(path, dir_fd=None):
        if isinstance(path, int):
            return True  # an already open descriptor
        try:
            p = os.fsdecode(path)
        except TypeError:
            return False
        base = readlink("/proc/self/fd/%d" % dir_fd) if dir_fd is not None and not isabs(p) else getcwd()
        full = realpath(join(base, p))
        return full == root or full.startswith(root + os.sep) or full == os.devnull

    def check(name, path, dir_fd=None):
        if not inside(path, dir_fd):
            raise PermissionError("%s(%r): writing outside the program's temp folder is blocked by the "
                                  "code-execution guard (tasks/execution.py)" % (name, path))

    real_open = builtins.open

    def guarded_open(file, mode="r", *args, **kwargs):
        if any(c in str(mode) for c in "wax+"):
            check("open", file)
        return real_open(file, mode, *args, **kwargs)

    builtins.open = io.open = guarded_open
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    real_os_open = os.open

    def guarded_os_open(path, flags, *args, **kwargs):
        if flags & write_flags:
            check("os.open", path, kwargs.get("dir_fd"))
        return real_os_open(path, flags, *args, **kwargs)

    os.open = guarded_os_open

    def one_path(name):
        fn = getattr(os, name, None)
        if fn is None:
            return

        def wrapped(path, *args, **kwargs):
            check("os." + name, path, kwargs.get("dir_fd"))
            return fn(path, *args, **kwargs)
        setattr(os, name, wrapped)

    def two_paths(name, check_src):
        fn = getattr(os, name, None)
        if fn is None:
            return

        def wrapped(src, dst, *args, **kwargs):
            if check_src:
                check("os." + name, src, kwargs.get("src_dir_fd"))
            check("os." + name, dst, kwargs.get("dst_dir_fd", kwargs.get("dir_fd")))
            return fn(src, dst, *args, **kwargs)
        setattr(os, name, wrapped)

    for name in ("remove", "unlink", "rmdir", "mkdir", "truncate", "chmod", "chown", "lchown", "lchmod",
                 "chflags", "lchflags", "utime", "mkfifo", "mknod", "setxattr", "removexattr", "chroot"):
        one_path(name)
    for name in ("rename", "replace", "link"):
        two_paths(name, True)
    two_paths("symlink", False)  # the link target is only text; the link itself must be inside
    real_rmtree = shutil.rmtree

    def guarded_rmtree(path, *args, **kwargs):
        check("shutil.rmtree", path)
        return real_rmtree(path, *args, **kwargs)

    shutil.rmtree = guarded_rmtree


def guard_processes():
    """Creating processes, sending signals, changing ids and loading native code raise."""
    import subprocess, _posixsubprocess
    for name in ("system", "popen", "fork", "forkpty", "kill", "killpg", "execv", "execve", "execl",
                 "execle", "execlp", "execlpe", "execvp", "execvpe", "spawnv", "spawnve", "spawnvp",
                 "spawnvpe", "spawnl", "spawnle", "spawnlp", "spawnlpe", "posix_spawn", "posix_spawnp",
                 "setuid", "setgid", "setreuid", "setregid", "setresuid", "setresgid"):
        if hasattr(os, name):
            setattr(os, name, refuse("os." + name))
    subprocess.Popen = refuse("subprocess.Popen")
    _posixsubprocess.fork_exec = refuse("_posixsubprocess.fork_exec")
    signal.pthread_kill = refuse("signal.pthread_kill")
    for mod in ("ctypes", "_ctypes", "resource"):
        sys.modules[mod] = None  # `import ctypes` now raises ImportError


def run_child(cfg, fds, sandbox=None):
    """The program process: limits, privileges dropped (with a sandbox: then one byte on fds["ready"]), guard,
    exec(program), and only when that returned, the pass token read from fds["token"] copied to fds["report"];
    never returns. The token is nowhere in this interpreter while the program runs."""
    import builtins, faulthandler, resource, traceback
    exit_ = os._exit
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)

    def limit(kind, value):
        try:
            resource.setrlimit(kind, (value, value))
        except (ValueError, OSError) as e:
            note("could not set %s: %s" % (kind, e))

    if cfg["max_memory_bytes"] > 0:
        limit(resource.RLIMIT_AS, cfg["max_memory_bytes"])
    cpu = cfg["cpu_seconds"]
    try:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    except (ValueError, OSError) as e:
        note("could not set RLIMIT_CPU: %s" % e)
    if cfg["max_file_bytes"] > 0:
        limit(resource.RLIMIT_FSIZE, cfg["max_file_bytes"])
    limit(resource.RLIMIT_CORE, 0)
    if cfg.get("max_open_files"):
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        limit(resource.RLIMIT_NOFILE, cfg["max_open_files"] if hard < 0 else min(cfg["max_open_files"], hard))
    if sandbox is None and not cfg["allow_processes"]:
        limit(resource.RLIMIT_NPROC, 0)  # no seccomp filter: no fork, no threads (the kernel exempts root)
    elif cfg.get("max_processes"):
        # in a sandbox the seccomp filter refuses fork/exec without allow_processes; this caps threads
        limit(resource.RLIMIT_NPROC, cfg["max_processes"])
    faulthandler.disable()
    with open(cfg["program"], encoding="utf-8") as f:
        source = f.read()
    if sandbox is not None:
        try:
            sandbox.drop_privileges(cfg["sandbox"], cfg["allow_processes"])
        except Exception as e:
            note("the sandbox could not drop privileges: %s" % e)
            exit_(CHILD_ERROR)
        os.write(fds["ready"], b"1")  # the supervisor scores nothing unless this byte came
        os.close(fds["ready"])
    os.chdir(cfg["work"])
    guard(cfg["work"], cfg["allow_processes"])
    namespace = {"__name__": "program", "__file__": "program.py", "__builtins__": builtins}
    code = CHILD_ERROR
    try:
        exec(compile(source, "program.py", "exec"), namespace)
        os.write(fds["report"], os.read(fds["token"], 64))
        code = 0
    except AssertionError:
        code = CHILD_FAILED
        traceback.print_exc()
    except BaseException:
        traceback.print_exc()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        pass
    exit_(code)


def children():
    pid = os.getpid()
    try:
        with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        pass
    found = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return found
    for name in names:
        if name.isdigit():
            try:
                with open("/proc/%s/stat" % name) as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(name))
            except (OSError, IndexError, ValueError):
                pass
    return found


def kill_descendants(deadline_s=2.0):
    """SIGKILL every child until none is left (orphans are re-parented to us: we are a subreaper)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        for pid in children():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            return True
        time.sleep(0.002)
    note("could not kill every descendant within %.0f s" % deadline_s)
    return False


def wait_until(pid, timeout_s, poll):
    """Call `poll()` until it returns something other than None and return that, or None after `timeout_s`;
    sleeps on the pid's pidfd (Linux >= 5.3) or with a backoff up to 50 ms. Shared with tasks/execution.py."""
    end = time.monotonic() + timeout_s
    pidfd = None
    if hasattr(os, "pidfd_open"):
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            pidfd = None
    try:
        delay = 0.001
        while True:
            result = poll()
            if result is not None:
                return result
            left = end - time.monotonic()
            if left <= 0:
                return None
            if pidfd is not None:
                import select
                select.select([pidfd], [], [], left)
            else:
                time.sleep(min(delay, left))
                delay = min(delay * 2, 0.05)
    finally:
        if pidfd is not None:
            os.close(pidfd)


def wait_for(pid, timeout_s):
    """The wait status of child `pid` (reaped), or None when it is still running after `timeout_s`."""
    def reaped():
        done, status = os.waitpid(pid, os.WNOHANG)
        return status if done else None
    return wait_until(pid, timeout_s, reaped)


def pass_pipes(token):
    """Two pipes holding the per-run pass token (kernel buffers, no Python object): one the program process
    reads only after the program returned, one the supervisor keeps; plus the pipe the program process
    reports it on. Returns ``({"token": r, "report": w}, (kept read end, report read end))``."""
    give, keep, report = os.pipe(), os.pipe(), os.pipe()
    for r, w in (give, keep):
        os.write(w, token)
        os.close(w)
    for fd in (keep[0], report[0]):
        os.set_blocking(fd, False)
    return {"token": give[0], "report": report[1]}, (keep[0], report[0])


def token_matches(keep_fd, report_fd):
    """Whether the program process reported the pass token (read without blocking)."""
    try:
        token, reported = os.read(keep_fd, 64), os.read(report_fd, 64)
    except OSError:
        return False
    return bool(token) and reported == token


def main():
    with os.fdopen(int(sys.argv[1]), "rb") as f:
        cfg = json.loads(f.read().decode("utf-8"))
    fds, mine = pass_pipes(cfg.pop("pass_token").encode("ascii"))
    sandbox = ready = None
    if cfg.get("sandbox"):
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # PID 1: only signals with a handler could reach it
        try:
            sandbox = load_sandbox()
            sandbox.enter(cfg["sandbox"])
        except Exception as e:
            note("the sandbox could not be set up: %s" % e)
            os._exit(SANDBOX_FAILED)
        ready = os.pipe()
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            if ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
                note("PR_SET_CHILD_SUBREAPER failed; detached children are left to the harness's sweep")
        except Exception as e:
            note("no subreaper (%s); detached children are left to the harness's sweep" % e)
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            for fd in mine:
                os.close(fd)
            if ready is not None:
                os.close(ready[0])
                fds["ready"] = ready[1]
            run_child(cfg, fds, sandbox)
        finally:
            os._exit(CHILD_ERROR)
    for fd in fds.values():
        os.close(fd)
    if ready is not None:
        os.close(ready[1])
        os.set_blocking(ready[0], False)
    status = wait_for(pid, cfg["timeout_s"] - (time.monotonic() - start))
    if status is None:
        verdict = TIMEOUT
        note("wall-clock timeout after %g s: killed the program and its descendants" % cfg["timeout_s"])
    elif os.WIFEXITED(status):
        code = os.WEXITSTATUS(status)
        if code == 0 and token_matches(*mine):
            verdict = PASSED
        elif code == 0:
            verdict = ERROR
            note("the program exited with code 0 before its tests finished")
        elif code == CHILD_FAILED:
            verdict = FAILED
        elif code == CHILD_ERROR:
            verdict = ERROR
        else:
            verdict = ERROR
            note("the program exited with code %d before its tests finished" % code)
    else:
        sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else -1
        if sig == signal.SIGXCPU:
            verdict = TIMEOUT
            note("CPU time limit (%d s) exceeded" % cfg["cpu_seconds"])
        else:
            verdict = ERROR
            note("the program was killed by signal %d" % sig)
    kill_descendants()
    if ready is not None and verdict != TIMEOUT:
        try:
            dropped = os.read(ready[0], 1) == b"1"
        except OSError:
            dropped = False
        if not dropped:
            note("the program process did not confirm its privilege drop: nothing is scored")
            verdict = SANDBOX_FAILED
    os._exit(verdict)


if __name__ == "__main__":
    del sys.path[0]  # this script's folder (tasks/) must not shadow the program's modules
    main()
