"""Hostile programs for tests/test_sandbox.py: ``(name, program, run_program kwargs)``. Each program passes only
when its escape worked. Placeholders filled by the test: TARGET (a path outside the sandbox that must not
appear), EXISTING / EXISTING_DIR (a file and a folder outside that must not change), SENTINEL_PID (a process
that must survive), PORT (a listening socket on 127.0.0.1 that must see no connection), SECRET_VAR (the name
of an environment variable of the harness whose value must not leak).

THIRD_SET reaches the kernel past the namespaces (the seccomp filter's classes): memory the address-space
limit does not count (memfd, System V shared memory, message queues, semaphores), nested user namespaces
(unshare, clone with a namespace flag, clone3), the kernel keyrings (state kept across runs), io_uring,
userfaultfd/bpf/perf_event_open, ptrace, a fork past the guard; and the shared temp folders.

Most undo the Python guard first (``posix``, ``_io``, re-imports): the guard is a second layer, the operating
system is the one under test. No program signals processes it does not own with anything but SIGCONT when it
aims at all of them (``kill -1``), so a run against an unisolated executor harms nothing else on the machine.
"""

H = "import os, sys, signal, time, posix\n"
UNGUARD_OPEN = "import _io, builtins, io\nbuiltins.open = io.open = _io.open\n"
CTYPES = ("for m in ('ctypes', '_ctypes'):\n    sys.modules.pop(m, None)\n"
          "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n")
WROTE = "\nassert os.path.exists(TARGET)\n"
SH_WRITE = "['sh', '-c', 'echo x > ' + TARGET]"

FIRST_SET = [
    # writing outside the temp folder, through every file API
    ("open", H + UNGUARD_OPEN + "open(TARGET, 'w').write('x')" + WROTE, {}),
    ("os_open", H + "fd = posix.open(TARGET, posix.O_WRONLY | posix.O_CREAT, 0o644)\nposix.write(fd, b'x')" + WROTE, {}),
    ("fileio", H + "import _io\nf = _io.FileIO(TARGET, 'w')\nf.write(b'x')\nf.close()" + WROTE, {}),
    ("ctypes_libc", H + CTYPES + "fd = libc.open(TARGET.encode(), 0o101, 0o644)\nassert fd >= 0, ctypes.get_errno()\n"
     "assert libc.write(fd, b'x', 1) == 1" + WROTE, {}),
    ("sqlite3", H + "import sqlite3\nc = sqlite3.connect(TARGET)\nc.execute('create table t (x)')\nc.commit()" + WROTE, {}),
    ("shutil", H + UNGUARD_OPEN + "import shutil\nshutil.copyfile('/etc/passwd', TARGET)" + WROTE, {}),
    ("pathlib", H + UNGUARD_OPEN + "import pathlib\npathlib.Path(TARGET).write_text('x')" + WROTE, {}),
    ("mkdir", H + "posix.mkdir(TARGET)" + WROTE, {}),
    ("symlink", H + "import _io\nposix.symlink(TARGET, 'link')\n_io.FileIO('link', 'w').write(b'x')" + WROTE, {}),
    # deleting, renaming, changing outside files
    ("unlink", H + "posix.unlink(EXISTING)\nassert not os.path.exists(EXISTING)\n", {}),
    ("rename", H + "posix.rename(EXISTING, TARGET)" + WROTE, {}),
    ("rmdir", H + "posix.rmdir(EXISTING_DIR)\nassert not os.path.exists(EXISTING_DIR)\n", {}),
    ("chmod", H + "posix.chmod(EXISTING, 0o600)\n", {}),
    # processes, through every module
    ("os_fork_exec", H + "pid = posix.fork()\nif pid == 0:\n    posix.execv('/bin/sh', " + SH_WRITE + ")\n"
     "posix.waitpid(pid, 0)" + WROTE, {}),
    ("subprocess", H + "for m in ('subprocess', '_posixsubprocess'):\n    sys.modules.pop(m, None)\n"
     "import subprocess\nsubprocess.run(" + SH_WRITE + ", check=True)" + WROTE, {}),
    ("posix_spawn", H + "pid = posix.posix_spawn('/bin/sh', " + SH_WRITE + ", {})\nposix.waitpid(pid, 0)" + WROTE, {}),
    ("system", H + "assert posix.system('echo x > ' + TARGET) == 0" + WROTE, {}),
    ("multiprocessing", H + "os.fork = posix.fork\nimport multiprocessing, _io\n"
     "def write():\n    _io.FileIO(TARGET, 'w').write(b'x')\n"
     "p = multiprocessing.get_context('fork').Process(target=write)\np.start()\np.join()" + WROTE, {}),
    ("pty", H + "os.forkpty = posix.forkpty\nimport pty, _io\npid, fd = pty.fork()\nif pid == 0:\n"
     "    _io.FileIO(TARGET, 'w').write(b'x')\n    posix._exit(0)\nposix.waitpid(pid, 0)" + WROTE, {}),
    ("ctypes_fork", H + CTYPES + "pid = libc.fork()\nassert pid >= 0, ctypes.get_errno()\nif pid == 0:\n"
     "    fd = libc.open(TARGET.encode(), 0o101, 0o644)\n    libc.write(fd, b'x', 1)\n    libc._exit(0)\n"
     "posix.waitpid(pid, 0)" + WROTE, {}),
    ("processes_allowed", H + "import subprocess\nsubprocess.run(" + SH_WRITE + ", check=True)" + WROTE,
     {"allow_processes": True}),
    # signalling any other process
    ("kill_parent", H + "ppid = os.getppid()\nposix.kill(ppid, signal.SIGKILL)\ntime.sleep(0.3)\n"
     "assert os.getppid() != ppid\n", {}),
    ("kill_grandparent", H + "ppid = os.getppid()\n"
     "gp = int(open('/proc/%d/stat' % ppid).read().rsplit(')', 1)[1].split()[1])\nassert gp > 1, gp\n"
     "posix.kill(gp, signal.SIGKILL)\ntime.sleep(0.3)\n", {}),
    ("kill_by_pid", H + "posix.kill(SENTINEL_PID, signal.SIGKILL)\n", {}),
    ("pidfd", H + "fd = os.pidfd_open(SENTINEL_PID)\nsignal.pidfd_send_signal(fd, signal.SIGKILL)\n", {}),
    ("kill_all", H + "posix.kill(-1, signal.SIGCONT)\n", {}),  # SIGCONT: harmless where it escapes
    # reading other processes' environment or memory
    ("environ", H + "found = []\nfor p in os.listdir('/proc'):\n    try:\n"
     "        env = open('/proc/%s/environ' % p, 'rb').read()\n    except (OSError, ValueError):\n        continue\n"
     "    found += [v for v in env.split(b'\\0') if v.startswith(SECRET_VAR.encode())]\n"
     "print(found, file=sys.stderr)\nassert found\n", {}),
    ("memory", H + "hits = []\nfor p in os.listdir('/proc'):\n    if not p.isdigit() or int(p) == os.getpid():\n"
     "        continue\n    try:\n        maps = open('/proc/%s/maps' % p).read().splitlines()\n"
     "        mem = open('/proc/%s/mem' % p, 'rb')\n    except OSError:\n        continue\n"
     "    for line in maps:\n        if line.endswith('[stack]'):\n"
     "            lo, hi = (int(x, 16) for x in line.split()[0].split('-'))\n            try:\n"
     "                mem.seek(lo)\n                data = mem.read(hi - lo)\n            except OSError:\n"
     "                continue\n            i = data.find(SECRET_VAR.encode() + b'=')\n"
     "            if i >= 0:\n                hits.append(data[i:i + 60])\nprint(hits, file=sys.stderr)\nassert hits\n", {}),
    # the network
    ("network", H + "import socket\ns = socket.create_connection(('127.0.0.1', PORT), timeout=2)\ns.sendall(b'x')\n", {}),
    # resource exhaustion
    ("fork_bomb", H + "kids = []\nfor _ in range(64):\n    pid = posix.fork()\n    if pid == 0:\n"
     "        time.sleep(5)\n        posix._exit(0)\n    kids.append(pid)\nassert len(kids) == 64\n", {}),
    ("disk_fill", H + "import _io\nfor n in range(6):\n    with _io.FileIO('fill%d' % n, 'w') as f:\n"
     "        f.write(b'x' * (3 << 20))\n", {"max_file_mb": 4}),
    ("memory_bomb", H + "x = bytearray(6 << 30)\n", {}),
    ("raise_memory_limit", H + "sys.modules.pop('resource', None)\nimport resource, mmap\n"
     "resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))\n"
     "m = mmap.mmap(-1, 6 << 30)\n", {}),
    ("daemon", H + "import _io\nif posix.fork() == 0:\n    os.setsid()\n    if posix.fork() == 0:\n"
     "        time.sleep(0.2)\n        _io.FileIO(TARGET, 'w').write(b'x')\n    posix._exit(0)\n"
     "assert False, 'daemon started'\n", {}),
    # forged passes
    ("exit_zero", H + "print('passed', flush=True)\nposix._exit(0)\nassert False\n", {}),
    ("exit_supervisor_code", H + "posix._exit(80)\n", {}),
    ("introspect_frames", H + "import gc\nframe, seen = sys._getframe(), []\nwhile frame is not None:\n"
     "    seen.append(frame.f_locals)\n    frame = frame.f_back\n"
     "seen += [o for o in gc.get_objects() if isinstance(o, dict)]\nfor d in seen:\n"
     "    for key in ('pass_code', 'pass_token'):\n        if isinstance(d.get(key), int):\n"
     "            posix._exit(d[key])\nassert False, 'no pass code found'\n", {}),
    ("print_marker", H + "print('all tests passed\\nPASS', flush=True)\nraise SystemExit(0)\n", {}),
]

SECOND_SET = [
    ("dir_fd_write", H + "d = posix.open(os.path.dirname(TARGET), posix.O_RDONLY)\n"
     "fd = posix.open(os.path.basename(TARGET), posix.O_WRONLY | posix.O_CREAT, 0o600, dir_fd=d)" + WROTE, {}),
    ("hard_link", H + "posix.link(EXISTING, TARGET)" + WROTE, {}),
    ("exec_in_place", H + "posix.execv('/bin/sh', " + SH_WRITE + ")\n", {}),
    ("reloaded_os_spawn", H + "import importlib\nfor n in ('fork', 'execv', 'execve', 'spawnv', '_spawnvef'):\n"
     "    os.__dict__.pop(n, None)\nos2 = importlib.reload(os)\n"
     "os2.spawnv(os2.P_WAIT, '/bin/sh', " + SH_WRITE + ")" + WROTE, {}),
    ("sees_other_processes", H + "pids = [p for p in os.listdir('/proc') if p.isdigit()]\nassert len(pids) > 3, pids\n", {}),
    ("udp_out", H + "import socket\nsocket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('127.0.0.1', PORT))\n", {}),
    ("inode_fill", H + "for n in range(8000):\n    posix.close(posix.open('f%d' % n, posix.O_CREAT | posix.O_WRONLY))\n", {}),
    ("tamper_then_fail", H + "import atexit\natexit.register(posix._exit, 0)\nassert False\n", {}),
]

SYSNO = ("import platform\nX86 = platform.machine() == 'x86_64'\n"
         "NR = dict(clone=56 if X86 else 220, add_key=248 if X86 else 217, keyctl=250 if X86 else 219,\n"
         "          request_key=249 if X86 else 218, userfaultfd=323 if X86 else 282, bpf=321 if X86 else 280,\n"
         "          perf_event_open=298 if X86 else 241, ptrace=101 if X86 else 117, clone3=435, io_uring_setup=425)\n")
NEWUSER_NEWNS = "0x10000000 | 0x00020000"
# each passes when the kernel let the call through (and, where it can, when it used it)
THIRD_SET = [
    ("memfd_bomb", H + "fds, chunk = [], b'm' * (1 << 20)\nfor i in range(12):\n    fd = os.memfd_create('x%d' % i)\n"
     "    for _ in range(63):\n        posix.write(fd, chunk)\n    fds.append(fd)\n"
     "assert sum(os.fstat(f).st_size for f in fds) > 700 << 20\n", {"max_memory_mb": 512}),
    ("nested_userns", H + CTYPES + "r = libc.unshare(" + NEWUSER_NEWNS + ")\nassert r == 0, ctypes.get_errno()\n"
     "assert libc.mount(b'tmpfs', b'/tmp', b'tmpfs', 0, b'size=2g') == 0, ctypes.get_errno()\n", {}),
    ("nested_userns_processes_allowed", H + CTYPES + "assert libc.unshare(" + NEWUSER_NEWNS + ") == 0\n",
     {"allow_processes": True}),
    ("clone_newuser", H + CTYPES + SYSNO + "pid = libc.syscall(NR['clone'], 0x10000000 | 17, 0, 0, 0, 0)\n"
     "if pid == 0:\n    posix._exit(0)\nassert pid > 0, ctypes.get_errno()\nposix.waitpid(pid, 0)\n",
     {"allow_processes": True}),
    ("clone3_newuser", H + CTYPES + SYSNO + "args = (ctypes.c_uint64 * 11)()\nargs[0] = 0x10000000\nargs[4] = 17\n"
     "pid = libc.syscall(NR['clone3'], ctypes.byref(args), ctypes.sizeof(args))\n"
     "if pid == 0:\n    posix._exit(0)\nassert pid > 0, ctypes.get_errno()\nposix.waitpid(pid, 0)\n",
     {"allow_processes": True}),
    ("keyring", H + CTYPES + SYSNO + "r = libc.syscall(NR['add_key'], b'user', b'specdec_suite', b'kept', 4, -4)\n"
     "assert r > 0, ctypes.get_errno()\nlibc.syscall(NR['keyctl'], 21, r)  # KEYCTL_INVALIDATE: leave nothing\n", {}),
    ("io_uring", H + CTYPES + SYSNO + "params = ctypes.create_string_buffer(120)\n"
     "r = libc.syscall(NR['io_uring_setup'], 4, params)\nassert r >= 0, ctypes.get_errno()\n", {}),
    ("kernel_interfaces", H + CTYPES + SYSNO +
     "attr = (ctypes.c_uint32 * 32)(1, 128)  # perf_event_attr: software, size 128, cpu clock\n"
     "attr[10] = 0x60  # exclude_kernel, exclude_hv\n"
     "got = [libc.syscall(NR['userfaultfd'], 0), libc.syscall(NR['bpf'], 0, None, 0),\n"
     "       libc.syscall(NR['perf_event_open'], attr, 0, -1, -1, 0)]\nprint(got, file=sys.stderr)\n"
     "assert any(r >= 0 for r in got)\n", {}),
    ("sysv_shm_bomb", H + CTYPES + "libc.shmat.restype = ctypes.c_void_p\n"
     "libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]\nheld = 0\nfor i in range(12):\n"
     "    sid = libc.shmget(0, 64 << 20, 0o1600)\n    assert sid >= 0, ctypes.get_errno()\n"
     "    addr = libc.shmat(sid, None, 0)\n    assert addr not in (None, ctypes.c_void_p(-1).value)\n"
     "    ctypes.memset(addr, 1, 64 << 20)\n    libc.shmdt(ctypes.c_void_p(addr))\n    held += 64\n"
     "assert held > 700\n", {"max_memory_mb": 512}),
    ("sysv_queues", H + CTYPES + "q = libc.msgget(0, 0o1600)\ns = libc.semget(0, 1000, 0o1600)\n"
     "assert q >= 0 or s >= 0, ctypes.get_errno()\n", {}),
    ("ptrace", H + CTYPES + SYSNO + "assert libc.syscall(NR['ptrace'], 0, 0, 0, 0) == 0, ctypes.get_errno()\n", {}),
    ("fork_without_processes", H + CTYPES + SYSNO + "pid = libc.syscall(NR['clone'], 17, 0, 0, 0, 0)\n"
     "if pid == 0:\n    posix._exit(0)\nassert pid > 0, ctypes.get_errno()\n", {}),
    ("shared_temp", H + "import _io\nfor d in ('/tmp', '/var/tmp', '/dev/shm'):\n    try:\n"
     "        _io.FileIO(os.path.join(d, 'specdec_suite_x'), 'w').write(b'x')\n        break\n"
     "    except OSError:\n        pass\nelse:\n    assert False, 'nothing shared writable'\n", {}),
]
