"""Operating-system isolation of model-written programs (pass@1 scoring): Linux namespaces, an unprivileged
identity, a read-only filesystem with one size-capped writable folder, a seccomp-BPF system-call filter.

Two halves, both standard library only (the supervisor loads this file by path in a fresh interpreter):

* the harness side -- :func:`method` (which method this user gets), :func:`command` (the ``unshare`` command
  line the supervisor runs in), :data:`PROBE_PROGRAM` (what the executor's probe runs to learn what this
  machine offers: :func:`tasks.execution.probe`; the ``task.isolation`` setting is resolved there too);
* the sandbox side, run by the supervisor (trusted code) inside the new namespaces -- :func:`enter` (mounts,
  before the program process exists) and :func:`drop_privileges` (in the program process, before the program).

A program runs like this (``unshare`` from util-linux, present on every Linux)::

    unshare --pid --fork --kill-child --net --ipc --uts --mount --mount-proc [--user --map-root-user]
      +-- supervisor: PID 1 of a new PID namespace (its death kills every process in it); a private mount
          namespace: every mount read-only and nosuid, a tmpfs of max_file_mb on the work folder, directories
          the sandbox identity cannot traverse (/root) covered by an empty tmpfs that re-exposes only the
          interpreter's own trees; the shared temp folders (the harness's temp root holding every run's
          folder, /tmp, /var/tmp, /dev/shm) covered by an empty read-only tmpfs that re-exposes only this
          run's folder, so concurrent programs cannot read each other; no network (a new network namespace
          has only a down loopback)
            +-- program process: no_new_privs, empty capability bounding set, no capabilities; as root
                uid/gid 65534 (nobody) with no groups, so RLIMIT_NPROC holds; as another user the user
                namespace's root with every capability dropped (the kernel sees the user's own uid); then
                a seccomp filter (:func:`seccomp_program`: EPERM for new namespaces, mounts, keyrings,
                io_uring, memfd and System V IPC, ptrace, bpf, perf and the like; without allow_processes
                also fork/exec, threads still start)

The filter knows x86_64 and aarch64 (:data:`SYSCALLS`); on another architecture the privilege drop raises
:class:`SandboxError`, so the probe finds no isolation there (``namespaces`` refuses, ``auto`` falls back).

Methods: ``root`` (the harness runs as root and uid 65534 exists in its user namespace) and ``userns`` (any
other user: a user namespace maps the user to root inside it, so it may mount). The sandbox fails closed:
a mount, a privilege drop or the filter that does not succeed ends the run before the program starts, and the
harness raises instead of scoring.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import stat
import sys

#: The ``task.isolation`` choices: ``namespaces`` refuses to run unless OS isolation works; ``auto`` falls back
#: to the Python guard alone with a warning; ``none`` never isolates (a warning per run).
MODES = ("namespaces", "auto", "none")
#: The identity a program runs as when the harness is root (``nobody``).
SANDBOX_UID = SANDBOX_GID = 65534
NAMESPACE_FLAGS = ("--pid", "--fork", "--kill-child", "--net", "--ipc", "--uts", "--mount", "--mount-proc")
#: Files and folders a program may create in its temp folder (the tmpfs's inodes).
MAX_FILES = 4096
#: The warning logged when a run executes code without OS isolation (summary.md and the report say it in the
#: words of harness.rows.columns.CODE_ISOLATION_TEXT).
UNISOLATED = "code executed without OS isolation (the Python guard only)"

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_NOATIME, MS_NODIRATIME, MS_REMOUNT, MS_BIND, MS_MOVE, MS_REC = 1024, 2048, 32, 4096, 8192, 16384
MS_RELATIME, MS_STRICTATIME = 1 << 21, 1 << 24
PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP = 38, 24
SYS_MOUNT_SETATTR = 442  # the same number on every architecture (syscalls added after 5.0 are unified)
AT_FDCWD, AT_RECURSIVE = -100, 0x8000
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID = 0x1, 0x2
_MOUNT_FLAGS = {"ro": MS_RDONLY, "nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC,
                "noatime": MS_NOATIME, "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME,
                "strictatime": MS_STRICTATIME}


#: seccomp: the filter every sandboxed program process runs under (:func:`install_seccomp`).
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO, SECCOMP_RET_KILL_PROCESS = 0x7FFF0000, 0x00050000, 0x80000000
EPERM, ENOSYS = 1, 38
BPF_LD_W_ABS, BPF_JEQ_K, BPF_JSET_K, BPF_RET_K = 0x20, 0x15, 0x45, 0x06
#: clone flags: any new namespace (CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET); a thread.
CLONE_NEW_MASK, CLONE_THREAD = 0x7E020000, 0x00010000
#: The system calls the filter refuses with EPERM (namespaces and mounts, keyrings, io_uring, memory the
#: address-space limit does not count -- memfd, System V shared memory, message queues and semaphores --,
#: kernel interfaces a scored program never needs), by name; per architecture :data:`SYSCALLS` numbers them
#: (a name an architecture lacks, such as modify_ldt on aarch64, is skipped there). clone3 is refused with
#: ENOSYS (glibc then falls back to clone, whose flags the filter can read); clone with a namespace flag is
#: refused; without ``allow_processes`` also fork, vfork, execve, execveat and clone without CLONE_THREAD
#: (threads still start).
DENIED = ("unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "keyctl", "add_key", "request_key",
          "io_uring_setup", "io_uring_enter", "io_uring_register", "memfd_create", "memfd_secret", "userfaultfd",
          "bpf", "perf_event_open", "ptrace", "process_vm_readv", "process_vm_writev", "kexec_load",
          "kexec_file_load", "init_module", "finit_module", "delete_module", "open_by_handle_at",
          "name_to_handle_at", "fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree",
          "open_tree_attr", "mount_setattr", "fanotify_init", "swapon", "swapoff", "reboot", "shmget", "msgget",
          "semget", "modify_ldt")
DENIED_WITHOUT_PROCESSES = ("fork", "vfork", "execve", "execveat")
#: ``AUDIT_ARCH_*`` of the machine (``platform.machine()``) -> (that value, system call numbers by name).
#: Calls added since Linux 5.0 share one number on every architecture.
_UNIFIED = {"io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428,
            "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "clone3": 435,
            "mount_setattr": 442, "memfd_secret": 447, "open_tree_attr": 467}
SYSCALLS = {
    "x86_64": (0xC000003E, {**_UNIFIED, "unshare": 272, "setns": 308, "mount": 165, "umount2": 166,
                            "pivot_root": 155, "chroot": 161, "keyctl": 250, "add_key": 248, "request_key": 249,
                            "memfd_create": 319, "userfaultfd": 323, "bpf": 321, "perf_event_open": 298,
                            "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "kexec_load": 246,
                            "kexec_file_load": 320, "init_module": 175, "finit_module": 313,
                            "delete_module": 176, "open_by_handle_at": 304, "name_to_handle_at": 303,
                            "fanotify_init": 300, "swapon": 167, "swapoff": 168, "reboot": 169, "clone": 56,
                            "fork": 57, "vfork": 58, "execve": 59, "execveat": 322, "shmget": 29,
                            "msgget": 68, "semget": 64, "modify_ldt": 154}),
    "aarch64": (0xC00000B7, {**_UNIFIED, "unshare": 97, "setns": 268, "mount": 40, "umount2": 39,
                             "pivot_root": 41, "chroot": 51, "keyctl": 219, "add_key": 217, "request_key": 218,
                             "memfd_create": 279, "userfaultfd": 282, "bpf": 280, "perf_event_open": 241,
                             "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271,
                             "kexec_load": 104, "kexec_file_load": 294, "init_module": 105,
                             "finit_module": 273, "delete_module": 106, "open_by_handle_at": 265,
                             "name_to_handle_at": 264, "fanotify_init": 262, "swapon": 224, "swapoff": 225,
                             "reboot": 142, "clone": 220, "execve": 221, "execveat": 281, "shmget": 194,
                             "msgget": 186, "semget": 190}),
}
SYSCALLS["arm64"] = SYSCALLS["aarch64"]
#: x86_64's x32 ABI: system call numbers with this bit set (refused: they would bypass the numbers above).
X32_SYSCALL_BIT = 0x40000000
#: Folders every program could otherwise share with the others (and the host): covered by an empty read-only
#: tmpfs in each sandbox, with only the program's own run folder (and interpreter trees) bound back inside.
SHARED_TEMP_ROOTS = ("/tmp", "/var/tmp", "/dev/shm")


class SandboxError(RuntimeError):
    """The sandbox could not be set up (a mount, a privilege drop); the program must not run."""


# ------------------------------------------------------------------------------------------ harness side
def method() -> str:
    """``root`` when this process is root and uid :data:`SANDBOX_UID` is mapped in its user namespace, else
    ``userns``."""
    if os.geteuid() == 0 and _mapped("/proc/self/uid_map", SANDBOX_UID) and _mapped("/proc/self/gid_map",
                                                                                     SANDBOX_GID):
        return "root"
    return "userns"


def _mapped(path: str, ident: int) -> bool:
    try:
        with open(path) as f:
            for line in f:
                inside, _outside, count = (int(x) for x in line.split())
                if inside <= ident < inside + count:
                    return True
    except (OSError, ValueError):
        return False
    return False


def command(how: str) -> list[str]:
    """The ``unshare`` command line (a prefix) that starts the supervisor in new namespaces for method ``how``.

    Raises:
        FileNotFoundError: ``unshare`` is not on ``PATH``.
    """
    unshare = shutil.which("unshare")
    if unshare is None:
        raise FileNotFoundError("util-linux `unshare` not found on PATH")
    return [unshare, *NAMESPACE_FLAGS, *(("--user", "--map-root-user") if how == "userns" else ())]


def column(how: str | None) -> str:
    """The ``code_isolation`` value of a row scored under method ``how``: ``namespaces:root``,
    ``namespaces:userns`` or ``none``."""
    return "none" if how is None else f"namespaces:{how}"


PROBE_PROGRAM = """\
import os
assert os.getpid() == 2, os.getpid()                      # PID 1 is the supervisor: a new PID namespace
assert sorted(int(p) for p in os.listdir('/proc') if p.isdigit()) == [1, 2]
import socket
assert [name for _, name in socket.if_nameindex()] == ['lo']   # a new network namespace: loopback only
caps = [line.split() for line in open('/proc/self/status') if line.startswith('Cap')]
assert len(caps) == 5 and all(int(value, 16) == 0 for _, value in caps), caps   # no capability of any kind
assert os.statvfs('/').f_flag & os.ST_RDONLY and not os.statvfs('.').f_flag & os.ST_RDONLY   # read-only but here
assert [line.split()[1] for line in open('/proc/self/status') if line.startswith('Seccomp:')] == ['2']  # filtered
"""


# ------------------------------------------------------------------------------------------ sandbox side
def libc_handle():
    """The C library, with errno kept for :func:`ctypes.get_errno`."""
    return ctypes.CDLL(None, use_errno=True)


def _mount(libc, source, target, fstype, flags, data=None):
    enc = (lambda s: None if s is None else os.fsencode(s))
    if libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)) != 0:
        err = ctypes.get_errno()
        raise SandboxError(f"mount {source or ''} on {target} ({fstype or 'bind/remount'}): {os.strerror(err)}")


def _searchable(path: str, uid: int, gid: int) -> bool:
    st = os.stat(path)
    bits = (stat.S_IXUSR if st.st_uid == uid else stat.S_IXGRP if st.st_gid == gid else stat.S_IXOTH)
    return bool(st.st_mode & bits)


def blocked_ancestor(path: str, uid: int, gid: int) -> str | None:
    """The first directory above ``path`` that ``uid``/``gid`` cannot traverse, or ``None``."""
    parts = os.path.realpath(path).split(os.sep)[1:-1]
    current = ""
    for part in parts:
        current += os.sep + part
        if not _searchable(current, uid, gid):
            return current
    return None


def interpreter_trees() -> list[str]:
    """The directories the program's interpreter reads: its prefixes, its executable's folder and its
    ``sys.path`` (the topmost of nested ones)."""
    found = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                                           os.path.dirname(os.path.realpath(sys.executable)), *sys.path)
             if p and os.path.isdir(p)}
    return sorted(p for p in found if not any(p != q and p.startswith(q.rstrip(os.sep) + os.sep) for q in found))


def expose(libc, trees: list[str], uid: int, gid: int, stage: str) -> None:
    """Cover each directory the sandbox identity cannot traverse on the way to ``trees`` (``/root`` holding a
    pyenv) with an empty read-only tmpfs holding only those trees (bind mounts staged in ``stage``)."""
    covers: dict[str, list[str]] = {}
    for tree in trees:
        top = blocked_ancestor(tree + os.sep + "x", uid, gid)
        if top is not None and top != tree:
            covers.setdefault(top, []).append(tree)
    for n, (top, inside) in enumerate(sorted(covers.items())):
        if any(top.startswith(other + os.sep) for other in covers):
            continue  # already covered by an outer one
        inside = [t for t in trees if t.startswith(top + os.sep)]
        staged = []
        for i, tree in enumerate(inside):
            slot = os.path.join(stage, f"{n}_{i}")
            os.makedirs(slot)
            _mount(libc, tree, slot, None, MS_BIND | MS_REC)
            staged.append((slot, tree))
        _mount(libc, "tmpfs", top, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
        for slot, tree in staged:
            os.makedirs(tree, mode=0o755, exist_ok=True)
            _mount(libc, slot, tree, None, MS_MOVE)


def make_readonly(libc) -> None:
    """Every mount of this (private) mount namespace read-only and nosuid: one recursive ``mount_setattr``
    (Linux >= 5.12), else a bind remount per mount point keeping its own flags."""

    class MountAttr(ctypes.Structure):
        _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                    ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]

    attr = MountAttr(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, 0, 0, 0)
    if libc.syscall(ctypes.c_long(SYS_MOUNT_SETATTR), ctypes.c_long(AT_FDCWD), ctypes.c_char_p(b"/"),
                    ctypes.c_long(AT_RECURSIVE), ctypes.byref(attr), ctypes.c_long(ctypes.sizeof(attr))) == 0:
        return
    with open("/proc/self/mountinfo") as f:
        mounts = [(line.split()[4], line.split()[5]) for line in f]
    for point, options in mounts:
        point = point.encode().decode("unicode_escape")  # \040 for a space
        flags = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID
        for option in options.split(","):
            flags |= _MOUNT_FLAGS.get(option, 0)
        _mount(libc, None, point, None, flags)


def enter(cfg: dict) -> None:
    """Inside the new namespaces, before the program process exists: cover what the sandbox identity cannot
    traverse (method ``root``), cover the shared temp folders (:func:`temp_covers`: the harness's temp root
    holding every program's run folder, ``/tmp``, ``/var/tmp``, ``/dev/shm``) with an empty tmpfs holding only
    this run's folder ``cfg["run"]`` and the interpreter's trees, make every mount read-only, mount the work
    folder as a tmpfs of ``cfg["work_mb"]`` MiB (0: the kernel's default size) owned by the sandbox identity.

    Raises:
        SandboxError: a mount failed (the supervisor then ends the run before the program starts).
    """
    libc = libc_handle()
    uid, gid = cfg["uid"], cfg["gid"]
    try:
        trees = interpreter_trees()
        if cfg["method"] == "root":
            expose(libc, trees, uid, gid, cfg["stage"])
        run = cfg.get("run") or os.path.dirname(cfg["work"])
        for top in temp_covers(run):
            cover(libc, top, [run, *trees])
        make_readonly(libc)
        size = f"size={cfg['work_mb']}m," if cfg["work_mb"] > 0 else ""
        _mount(libc, "tmpfs", cfg["work"], "tmpfs", MS_NOSUID | MS_NODEV,
               f"{size}nr_inodes={MAX_FILES},mode=0700,uid={uid},gid={gid}")
    except OSError as e:
        raise SandboxError(f"sandbox mounts failed: {e}") from e


def drop_privileges(cfg: dict, allow_processes: bool = False) -> None:
    """In the program process, before the program: no_new_privs, an empty capability bounding set, then
    uid/gid ``cfg["uid"]``/``cfg["gid"]`` with no groups (method ``root``) or no capabilities at all (``userns``);
    verified in ``/proc/self/status``; last the seccomp filter (:func:`install_seccomp`; without
    ``allow_processes`` it also refuses new processes and ``exec``, threads still start).

    Raises:
        SandboxError: a step failed or the result is not what it should be.
    """
    libc = libc_handle()
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise SandboxError(f"PR_SET_NO_NEW_PRIVS: {os.strerror(ctypes.get_errno())}")
    for cap in range(64):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() != 22:  # EINVAL: no such cap
            raise SandboxError(f"PR_CAPBSET_DROP {cap}: {os.strerror(ctypes.get_errno())}")
    try:
        if cfg["method"] == "root":
            os.setgroups([])
            os.setresgid(cfg["gid"], cfg["gid"], cfg["gid"])
            os.setresuid(cfg["uid"], cfg["uid"], cfg["uid"])  # leaving uid 0 clears every capability
        else:
            header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
            data = (ctypes.c_uint32 * 6)()
            if libc.capset(ctypes.byref(header), ctypes.byref(data)) != 0:
                raise SandboxError(f"capset: {os.strerror(ctypes.get_errno())}")
    except OSError as e:
        raise SandboxError(f"dropping privileges failed: {e}") from e
    with open("/proc/self/status") as f:
        status = dict(line.split(":", 1) for line in f if ":" in line)
    caps = {k: int(status[k], 16) for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb") if k in status}
    if any(caps.values()) or status.get("NoNewPrivs", "").strip() != "1":
        raise SandboxError(f"privileges left after the drop: {caps}, NoNewPrivs={status.get('NoNewPrivs')}")
    if cfg["method"] == "root" and (os.getresuid() != (cfg["uid"],) * 3 or os.getgroups()):
        raise SandboxError(f"identity after the drop: uid {os.getresuid()}, groups {os.getgroups()}")
    install_seccomp(libc, allow_processes)


def seccomp_program(machine: str, allow_processes: bool) -> list[tuple[int, int, int, int]]:
    """The seccomp-BPF program (``(code, jt, jf, k)`` instructions) of architecture ``machine``
    (``platform.machine()``): another architecture's calls (i386 or x32 on x86_64) are refused; the calls of
    :data:`DENIED` return EPERM, clone3 ENOSYS, clone with a namespace flag EPERM; without ``allow_processes``
    also fork, vfork, execve, execveat and clone without CLONE_THREAD. Everything else is allowed.

    Raises:
        SandboxError: no system call table for ``machine`` (:data:`SYSCALLS`).
    """
    if machine not in SYSCALLS:
        raise SandboxError(f"no seccomp filter for architecture {machine!r} (known: {', '.join(SYSCALLS)})")
    arch, numbers = SYSCALLS[machine]
    eperm, enosys = SECCOMP_RET_ERRNO | EPERM, SECCOMP_RET_ERRNO | ENOSYS
    prog = [(BPF_LD_W_ABS, 0, 0, 4),                 # seccomp_data.arch
            (BPF_JEQ_K, 1, 0, arch),
            (BPF_RET_K, 0, 0, SECCOMP_RET_KILL_PROCESS),
            (BPF_LD_W_ABS, 0, 0, 0)]                 # seccomp_data.nr
    if machine == "x86_64":
        prog += [(BPF_JSET_K, 0, 1, X32_SYSCALL_BIT), (BPF_RET_K, 0, 0, SECCOMP_RET_KILL_PROCESS)]
    denied = [(name, eperm) for name in DENIED + (() if allow_processes else DENIED_WITHOUT_PROCESSES)
              if name in numbers]
    denied.append(("clone3", enosys))
    for name, ret in denied:
        prog += [(BPF_JEQ_K, 0, 1, numbers[name]), (BPF_RET_K, 0, 0, ret)]
    clone = [(BPF_LD_W_ABS, 0, 0, 16),              # args[0] (clone's flags), low 32 bits (little-endian)
             (BPF_JSET_K, 0, 1, CLONE_NEW_MASK), (BPF_RET_K, 0, 0, eperm)]
    if not allow_processes:
        clone += [(BPF_JSET_K, 1, 0, CLONE_THREAD), (BPF_RET_K, 0, 0, eperm)]
    prog += [(BPF_JEQ_K, 0, len(clone), numbers["clone"]), *clone, (BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW)]
    return prog


def install_seccomp(libc, allow_processes: bool) -> None:
    """Install :func:`seccomp_program` on this process (no_new_privs must be set; it is inherited by every
    thread and child and cannot be removed) and check ``/proc/self/status`` says so.

    Raises:
        SandboxError: an unknown architecture, or the kernel refused the filter.
    """
    import platform

    class SockFilter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                    ("k", ctypes.c_uint32)]

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]

    prog = seccomp_program(platform.machine(), allow_processes)
    filters = (SockFilter * len(prog))(*(SockFilter(*ins) for ins in prog))
    fprog = SockFprog(len(prog), ctypes.cast(filters, ctypes.POINTER(SockFilter)))
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise SandboxError(f"seccomp filter: {os.strerror(ctypes.get_errno())}")
    with open("/proc/self/status") as f:
        mode = [line.split()[1] for line in f if line.startswith("Seccomp:")]
    if mode != [str(SECCOMP_MODE_FILTER)]:
        raise SandboxError(f"seccomp filter not in force after installing it (Seccomp: {mode})")


def temp_covers(run_folder: str) -> list[str]:
    """The shared temp folders to cover in a sandbox: the folder holding ``run_folder`` (the harness's temp root,
    where every program's run folder lives) and :data:`SHARED_TEMP_ROOTS`, those that exist, outermost only."""
    found = {os.path.realpath(p) for p in (os.path.dirname(os.path.realpath(run_folder)), *SHARED_TEMP_ROOTS)
             if os.path.isdir(p)}
    found.discard(os.sep)
    return sorted(p for p in found if not any(p != q and p.startswith(q.rstrip(os.sep) + os.sep) for q in found))


def cover(libc, top: str, keep: list[str]) -> None:
    """Mount an empty tmpfs on ``top`` and bind back, at their own paths, only the folders of ``keep`` below it
    (each opened before ``top`` is covered; bound from ``/proc/self/fd``)."""
    inside = sorted({p for p in map(os.path.realpath, keep) if p.startswith(top.rstrip(os.sep) + os.sep)})
    inside = [p for p in inside if not any(p != q and p.startswith(q + os.sep) for q in inside)]
    fds = [os.open(p, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) for p in inside]
    try:
        _mount(libc, "tmpfs", top, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=64k,nr_inodes=256,mode=0755")
        for path, fd in zip(inside, fds):
            os.makedirs(path, mode=0o755, exist_ok=True)
            _mount(libc, f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
    finally:
        for fd in fds:
            os.close(fd)
