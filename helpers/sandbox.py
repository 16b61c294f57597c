"""Run untrusted Python behind an OS boundary, with limits (the CodeEnv's test runner).

    result = run_python("print(sum(range(10)))")
    result.stdout, result.returncode, result.error        # '45\\n', 0, None
    sandbox_layers()                                      # which layers are active on this machine

The code a policy writes is untrusted: early in RL training it is random, later it
may learn to game the tests, and it runs thousands of times unattended. ``run_python``
puts it in a child process behind the layers below and reports how it ended, in one
line (``result.error``), without ever raising for anything the code does.

The boundary (layers 1-3) is bubblewrap (``bwrap``, Debian/Ubuntu package ``bubblewrap``),
the tool Flatpak uses. Where it is missing or cannot create namespaces (some containers
forbid them), ``run_python`` refuses to run unless ``allow_unsafe=True``, and then it
prints a warning at every run: without layers 1-3 only layers 4-7 stand, and layer 7
is not a boundary. It works with any interpreter: a system one, a conda env, a venv
(whose ``python`` is a link into the base install: both folders are mounted).

1. Namespaces: the code gets its own PID namespace (it sees only its own processes and
   cannot signal ours), network namespace (no interface but its own loopback, which bwrap
   brings up: no way out, at any level below Python too), IPC namespace (System V shared
   memory of its own, freed when the episode ends), UTS namespace, and a mount
   namespace (layer 2). As a normal user, bwrap also makes a user namespace (that is
   what lets an unprivileged user create the others). When the whole namespace ends, the
   kernel kills every process left in it: a ``setsid()`` grandchild or a double fork
   cannot outlive the episode.
2. A filesystem view of its own: the system's ``/usr`` (and ``/bin``, ``/lib``... links)
   and the interpreter's install, read-only; a fresh ``/proc`` that shows only its own
   processes; a minimal ``/dev``; one writable folder, ``/sandbox``, also the working
   directory: a tmpfs of ``Limits.disk_bytes`` made for this episode, holding our files
   (``main.py``...) at the start and gone with the episode. Nothing else exists inside:
   no ``/home``, ``/etc``, ``/tmp``, no repository (so no test data to peek at), no other
   process's ``/proc`` entries; the folders above the interpreter's install (``/root`` when
   it lives there) hold only the way to it. Nothing of the episode is written on our
   disk. ``/`` and ``/dev`` (tmpfs that bwrap makes, which in a normal user's namespace belong
   to the code's uid) are remounted read-only once everything is in place.
3. An unprivileged user: the code runs with no capabilities and ``no_new_privs``
   (setuid programs do not raise it), and a seccomp filter refuses new user namespaces
   (``unshare``/``clone`` with ``CLONE_NEWUSER``; ``clone3``, whose flags a filter cannot
   read, answers ENOSYS and the C library falls back to ``clone``), so ``unshare -Urm``
   fails inside and the kernel surface that most container escapes start from stays
   shut, root or not. As a normal user the code is uid 65534 inside its user namespace,
   which is us outside. When we are root, bwrap makes no user namespace (it would map
   the code back to uid 0 outside, where ``RLIMIT_NPROC`` does not bind and root's files
   are its own); the launcher drops to a real uid of the episode's own
   (``EPISODE_UID_BASE`` and up: no account has it), so outside the boundary too it is
   nobody, and two episodes never share a process count.
4. Totals per episode, in a cgroup where the machine lets us make one (cgroup v2, or
   v1's memory and pids hierarchies; as root, or in a systemd-delegated user session):
   the memory of all its processes together, shared memory and the ``/sandbox`` files
   included (``memory.max``; over it, the kernel kills the episode and ``result.error``
   says "memory limit"), and its processes and threads together (``pids.max``). Where
   no cgroup can be made (``sandbox_layers()`` says so), these two totals are not kept:
   see "What it does NOT stop".
5. Resource limits (``setrlimit``) in each process: CPU seconds (``RLIMIT_CPU``), address
   space (``RLIMIT_AS``: allocating 10 GB fails with ``MemoryError``), processes
   (``RLIMIT_NPROC``, counted per episode: its own uid as root, its own user namespace
   otherwise), size of any file written (``RLIMIT_FSIZE``), open files, no core dumps;
   an empty environment (no API keys); ``python -I -S`` (isolated mode; ``-S``: standard
   library only unless ``Limits.site_packages``).
6. A wall-clock timeout for the episode and an output cap (past ``output_bytes`` on
   stdout or stderr), after which the whole namespace is killed (``SIGKILL`` to its first
   process, through a pidfd, and we wait until the kernel has ended every process in it).
   Standard input is a file in memory, not a pipe we write: a program that never reads
   it cannot hold us past the timeout.
7. A Python audit hook (PEP 578), installed before the code runs: it refuses process
   creation, signals, sockets, ``ctypes`` calls, writes outside the working directory
   and ``/proc`` entries but its own process's with a readable ``PermissionError``, so
   the usual accidents get a clear message. It lives inside the child's own interpreter, so
   the code can switch it off; layers 1-6 do not depend on it.

With a cgroup, the episode's memory (its processes, System V shared memory, memory files) is bounded
in total and the episode is killed at the limit ("memory limit"); its disk is the tmpfs's size; a fork or
thread bomb stops at ``max_processes`` tasks; a program that never reads its stdin returns at the timeout;
the code cannot signal our processes, read our environment or memory through ``/proc``, create anything
outside ``/sandbox``, reach a network or hold a capability, and a ``setsid()`` grandchild is dead when
``run_python`` returns.

``tests/test_sandbox_totals.py`` checks the totals with small limits (512 MB, 16 tasks,
32 MB), with a cgroup and without, and as a normal user; ``tests/test_sandbox.py`` the
attacks, from this interpreter and from a fresh venv's.

What it does NOT stop:

* Kernel exploits. Namespaces share the host's kernel; a kernel bug reachable from
  inside escapes all of the above (the seccomp filter only shuts user namespaces). For
  code from strangers use a VM-grade sandbox (gVisor, Firecracker, a hosted code runner).
* Reading what is mounted: the system libraries and the Python install are readable.
* Without a cgroup (a container with a read-only ``/sys/fs/cgroup``, such as Colab or
  Docker by default; an ssh session of a normal user), memory is bounded per process
  only: each process's address space is ``memory_bytes``, so the episode can hold up to
  ``max_processes`` times that, plus System V shared memory, which no rlimit counts (it
  is freed when the episode ends). Processes and threads stay bounded per episode
  (``RLIMIT_NPROC``, above), the disk by the tmpfs.
* CPU time in total: each process has ``cpu_seconds``; together they are bounded by the
  wall time times the cores.
* Side channels and timing (CPU caches, how long a test took).
* Which values the code returns: judging them is the caller's job (``helpers.envs.code_env``
  compares them outside the boundary).

Nothing left behind: the episode's files live in its tmpfs; its cgroups are removed when
it ends; without the boundary (``allow_unsafe``) its folder in the temp directory is
removed whatever the code did to the permissions inside. A trainer killed with
``kill -9`` leaves its cgroups (or unsafe folders) behind: each name holds the process
id and start time of its owner, and the next run removes those whose owner is gone.
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import platform
import re
import select
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from helpers.formats import parent_death_code

_MB = 1 << 20
_SIGNALS = {sig.value for sig in signal.Signals}
SANDBOX_UID = 65534  # the code's uid inside its user namespace ("nobody"), when we are not root
SANDBOX_DIR = "/sandbox"  # the one writable folder, as the code sees it
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")  # mounted read-only (or linked)


class SandboxUnavailable(RuntimeError):
    """No OS boundary here, and the caller did not pass ``allow_unsafe=True``."""


@dataclass
class Limits:
    """Limits for one run (one episode). Defaults suit small HumanEval-style programs."""

    wall_seconds: float = 10.0  # wall-clock time of the episode, then SIGKILL to the whole namespace
    cpu_seconds: int = 5  # RLIMIT_CPU of each process: SIGXCPU at the soft limit, SIGKILL one second later
    memory_bytes: int = 1024 * _MB  # all processes together (cgroup memory.max), and each one's address space (RLIMIT_AS)
    max_processes: int = 32  # processes and threads together (cgroup pids.max, and RLIMIT_NPROC)
    disk_bytes: int = 64 * _MB  # all files in /sandbox together (the tmpfs's size)
    file_bytes: int = 10 * _MB  # RLIMIT_FSIZE: the largest file the code may write
    open_files: int = 64  # RLIMIT_NOFILE
    output_bytes: int = 1 * _MB  # captured stdout, and separately stderr
    audit: bool = True  # install the audit hook (layer 7)
    site_packages: bool = False  # let the code import installed packages (drops -S)


@dataclass
class SandboxResult:
    """How a run ended. ``error`` is None for a normal exit (any exit code), else one line:

    ``"timeout: ..."``, ``"output limit: ..."``, ``"memory limit: ..."``,
    ``"killed by SIGXCPU (CPU time limit, ...)"``, ``"could not start: ..."``.
    """

    returncode: int | None  # exit code; negative = killed by that signal; None = never started
    stdout: str
    stderr: str
    wall_time: float
    error: str | None = None
    timed_out: bool = False
    output_truncated: bool = False
    user: str = ""  # the user the code ran as
    layers: tuple[str, ...] = field(default_factory=tuple)  # the layers that were active (sandbox_layers)

    @property
    def ok(self) -> bool:
        return self.error is None and self.returncode == 0


# The child's first code: drop to the episode's uid if we are root, limits, audit hook, then
# run main.py. Passed with ``python -I -c``; everything here runs before the untrusted code.
_LAUNCHER = r'''
import json, os, resource, signal, sys
cfg = json.loads(sys.argv[1])
if cfg["uid"] is not None and os.getuid() == 0:  # root inside the boundary: become the episode's own uid for real
    os.setgroups([])
    os.setgid(cfg["uid"])
    os.setuid(cfg["uid"])  # also clears every capability (uid 0 -> non-zero)
os.chdir(cfg["cwd"])
for name, value in cfg["rlimits"].items():
    which = getattr(resource, name)
    soft, hard = resource.getrlimit(which)
    value = value if hard == resource.RLIM_INFINITY else min(value, hard)
    new_hard = value + 1 if name == "RLIMIT_CPU" and hard == resource.RLIM_INFINITY else value
    resource.setrlimit(which, (value, new_hard))
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an oversized write raises OSError instead of killing us silently

if cfg["audit"]:
    ROOT = os.path.realpath(os.getcwd())
    DENY = {"os.system", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "subprocess.Popen",
            "os.kill", "os.killpg", "signal.pthread_kill", "signal.pidfd_send_signal", "os.symlink", "os.link", "os.chroot",
            "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo", "socket.gethostbyname"}
    DENY_IMPORT = {"subprocess", "_posixsubprocess", "multiprocessing", "_multiprocessing", "pty"}
    # ctypes may be imported (numpy needs it) but not used to reach C functions or raw memory
    ALLOW_CTYPES = {"ctypes.dlopen", "ctypes.addressof", "ctypes.create_string_buffer", "ctypes.create_unicode_buffer"}
    PATH_EVENTS = {"os.remove", "os.rmdir", "os.rename", "os.mkdir", "os.chmod", "os.chown", "os.truncate",
                   "os.utime", "shutil.rmtree", "shutil.move", "shutil.copyfile"}
    WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

    def _outside(path):
        if isinstance(path, int):
            return False  # an already-open file descriptor
        real = os.path.realpath(os.path.join(ROOT, os.fsdecode(path)))
        return real != ROOT and not real.startswith(ROOT + os.sep)

    def _hook(event, args):
        if event in DENY or (event.startswith("ctypes.") and event not in ALLOW_CTYPES) or (event == "ctypes.dlopen" and args[0] is not None):
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "import" and args[0] in DENY_IMPORT:
            raise PermissionError(f"sandbox: import {args[0]} is not allowed")
        if event == "open" and args[0] is not None:
            path, mode, flags = args
            writing = any(c in (mode or "") for c in "wax+") or bool((flags or 0) & WRITE_FLAGS)
            if writing and _outside(path):
                raise PermissionError(f"sandbox: writing outside the working directory is not allowed: {os.fsdecode(path)}")
            if not isinstance(path, int):
                text = os.path.realpath(os.fsdecode(path))
                if text.startswith("/proc/") and not (text + "/").startswith(f"/proc/{os.getpid()}/"):  # not /proc/2 for /proc/20
                    raise PermissionError(f"sandbox: reading other processes' /proc entries is not allowed: {text}")
        if event in PATH_EVENTS:
            for arg in args:
                if isinstance(arg, (str, bytes, os.PathLike)) and _outside(arg):
                    raise PermissionError(f"sandbox: {event} outside the working directory is not allowed: {os.fsdecode(arg)}")

    sys.addaudithook(_hook)

del cfg
with open("main.py") as _f:
    _source = _f.read()
exec(compile(_source, "main.py", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
'''


# --- layers 1-3: the bwrap command line ------------------------------------------------------------


@lru_cache(maxsize=None)
def _python_dirs(python: str) -> tuple[str, ...]:
    """The folders ``python`` needs inside: its prefixes (a venv and its base install), its own folder.

    Asked with ``-I`` but not ``-S``: a venv is found by ``site``, so with ``-S`` a venv's
    interpreter reports its base install only, and the venv (where its ``python`` link
    lives) would not be mounted.
    """
    probe = subprocess.run([python, "-I", "-c", "import sys; print(sys.prefix); print(sys.base_prefix); print(sys.exec_prefix)"],
                           capture_output=True, text=True, timeout=30)
    dirs = {os.path.realpath(line) for line in probe.stdout.splitlines() if line.strip()}
    dirs |= {os.path.dirname(os.path.abspath(python)), os.path.dirname(os.path.realpath(python))}
    return tuple(sorted(d for d in dirs if not any(d == s or d.startswith(s + "/") for s in SYSTEM_PATHS)))


def _bwrap_argv(python: str, limits: Limits, files: dict[str, int], seccomp: int) -> list[str]:
    """bwrap's arguments for layers 1-3 (see the module docstring); the interpreter command follows them.

    ``files``: name -> an open file whose contents bwrap copies into ``/sandbox``;
    ``seccomp``: an open file holding ``_seccomp_program()``.
    """
    argv = [shutil.which("bwrap") or "bwrap", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--clearenv", "--hostname", "sandbox"]
    if os.geteuid() == 0:  # no user namespace (see layer 3); the launcher needs exactly these two capabilities to drop its uid
        argv += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        argv += ["--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--cap-drop", "ALL"]
    for path in SYSTEM_PATHS:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    made = set()
    for path in _python_dirs(python):  # parents bwrap would create 0700 (unusable for the code's uid): make them 0755
        for parent in reversed(Path(path).parents[:-1]):
            if str(parent) not in made:
                made.add(str(parent))
                argv += ["--perms", "0755", "--dir", str(parent)]
        argv += ["--ro-bind", path, path]
    argv += ["--proc", "/proc", "--dev", "/dev", "--perms", "0777", "--size", str(limits.disk_bytes), "--tmpfs", SANDBOX_DIR]
    for name, fd in files.items():
        argv += ["--perms", "0644", "--file", str(fd), f"{SANDBOX_DIR}/{name}"]
    # The root and /dev are tmpfs that bwrap makes; in a user namespace they belong to the code's uid, which could
    # then write there (to RAM, past the disk bound). Read-only, once everything is in place; /sandbox stays writable.
    argv += ["--remount-ro", "/", "--remount-ro", "/dev"]
    return argv + ["--seccomp", str(seccomp)]


def _memory_file(data: bytes) -> int:
    """An open file in memory holding ``data``, read from its start (``memfd``: nothing on disk)."""
    fd = os.memfd_create("sandbox")
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


@lru_cache(maxsize=None)
def _boundary_problem(python: str) -> str | None:
    """None when bwrap can build layers 1-3 here for ``python``; else why not (probed once)."""
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed; on Debian/Ubuntu: apt-get install bubblewrap"
    if platform.machine() not in _SYSCALLS:
        return f"no seccomp filter written for this machine ({platform.machine()}; known: {', '.join(_SYSCALLS)})"
    fds = [_memory_file(b"pass\n"), _memory_file(_seccomp_program())]
    try:
        argv = [*_bwrap_argv(python, Limits(), {"main.py": fds[0]}, fds[1]), python, "-I", "-S", f"{SANDBOX_DIR}/main.py"]
        probe = subprocess.run(argv, capture_output=True, text=True, timeout=30, env={}, pass_fds=fds)
    except (OSError, subprocess.SubprocessError) as e:
        return f"bwrap could not run: {e}"
    finally:
        for fd in fds:
            os.close(fd)
    if probe.returncode != 0:
        return f"bwrap cannot create the namespaces here (exit {probe.returncode}: {probe.stderr.strip()[:200]})"
    return None


def _interpreter(python: str | None) -> str:
    """``python`` (default: this one) as an absolute path without ``..``, its links kept (``realpath`` would leave a venv
    for its base install). Inside, only the interpreter's own folders exist: started as ``../venv/bin/python``,
    ``sys.executable`` names a folder that is not there, and a relative path would be looked up from ``/sandbox``."""
    return os.path.abspath(python or sys.executable)


def os_isolation(python: str | None = None) -> bool:
    """True when layers 1-3 (the OS boundary) are available for ``python`` (default: this one)."""
    return _boundary_problem(_interpreter(python)) is None


def require_isolation(who: str, python: str | None = None, allow_unsafe: bool = False) -> None:
    """Raise ``SandboxUnavailable`` naming ``who`` (an env that runs model-written code) when the OS boundary
    is not available here and the caller did not pass ``allow_unsafe=True``: said when the env is made, not
    at its first episode, where the refusal would be one failed episode among many."""
    if not allow_unsafe and not os_isolation(python):
        raise SandboxUnavailable(f"{who} runs model-written code and needs the sandbox's OS boundary (bwrap), which is "
                                 "not available here (see helpers.sandbox.sandbox_layers()); install bubblewrap, or pass "
                                 "allow_unsafe=True to run with rlimits and the audit hook only")


def sandbox_layers(python: str | None = None, limits: Limits | None = None) -> tuple[str, ...]:
    """The layers ``run_python`` puts around the code here (see the module docstring), one short line each."""
    limits = limits or Limits()
    problem = _boundary_problem(_interpreter(python))
    if problem is None:
        user = "user namespace, " if os.geteuid() != 0 else ""
        uid = f"uid {SANDBOX_UID}" if os.geteuid() != 0 else "a uid of its own"
        layers = [f"namespaces ({user}pid, net, ipc, uts, mount) by bwrap", f"read-only system, one writable tmpfs of {limits.disk_bytes // _MB} MB",
                  f"{uid}, no capabilities, no new user namespaces"]
    else:
        layers = [f"NO OS isolation ({problem})"]
    if _cgroup_parents():
        layers.append("episode totals (memory, processes) by cgroup")
    else:
        layers.append("no cgroup: memory bounded per process only")
    layers += ["rlimits", "wall timeout, whole namespace killed" if problem is None else "wall timeout, process group killed"]
    return tuple(layers + (["audit hook"] if limits.audit else []))


_announced = False
_announce_lock = threading.Lock()  # graders run episodes from several threads; the line must still print once


def _announce(layers: tuple[str, ...]) -> None:
    """Say once per process which layers are active (the first run prints one line)."""
    global _announced
    with _announce_lock:
        if _announced:
            return
        _announced = True
    print("sandbox layers: " + "; ".join(layers), file=sys.stderr)


# --- layer 3: the seccomp filter that refuses new user namespaces -----------------------------------

# Per machine: the kernel's audit number for the ABI, then the syscall numbers of clone, unshare, clone3.
_SYSCALLS = {"x86_64": (0xC000003E, 56, 272, 435), "aarch64": (0xC00000B7, 220, 97, 435)}
_CLONE_NEWUSER = 0x10000000


def _seccomp_program() -> bytes:
    """A classic-BPF seccomp program (what ``bwrap --seccomp`` loads), written out by hand.

    Each instruction is ``(code, jump if true, jump if false, constant)``; a jump skips that
    many instructions. It reads ``struct seccomp_data``: the syscall number at offset 0, the
    ABI at 4, the low 32 bits of the first argument at 16 (little-endian machines only).
    Another ABI (32-bit calls through ``int 0x80``, x32) could reach the same kernel code
    under other numbers, so any call through one kills the process.
    """
    arch, clone, unshare, clone3 = _SYSCALLS[platform.machine()]
    load, equal, at_least, has_bits, give = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|JGE|JSET|K, BPF_RET|K
    kill, fail, allow = 0x80000000, 0x00050000, 0x7FFF0000  # SECCOMP_RET_KILL_PROCESS, SECCOMP_RET_ERRNO | errno, SECCOMP_RET_ALLOW
    program = [
        (load, 0, 0, 4),  # 0: the ABI
        (equal, 1, 0, arch),  # 1: ours -> 3
        (give, 0, 0, kill),  # 2: another ABI
        (load, 0, 0, 0),  # 3: the syscall number
        (at_least, 0, 1, 0x40000000),  # 4: x32's numbers (x86_64) -> 5, else -> 6
        (give, 0, 0, kill),  # 5
        (equal, 0, 1, clone3),  # 6: clone3 -> 7, else -> 8
        (give, 0, 0, fail | errno.ENOSYS),  # 7: "no clone3 here": the C library falls back to clone
        (equal, 1, 0, unshare),  # 8: unshare -> 10
        (equal, 0, 3, clone),  # 9: clone -> 10, else -> 13
        (load, 0, 0, 16),  # 10: its flags
        (has_bits, 0, 1, _CLONE_NEWUSER),  # 11: a new user namespace -> 12, else -> 13
        (give, 0, 0, fail | errno.EPERM),  # 12
        (give, 0, 0, allow),  # 13
    ]
    return b"".join(struct.pack("=HBBI", *instruction) for instruction in program)


# --- layer 3, as root: a uid for each episode -------------------------------------------------------

EPISODE_UID_BASE = 1 << 30  # far above real accounts and the usual subordinate-uid ranges (100000 + 65536 n)
EPISODES_AT_ONCE = 64  # sandboxes one process may run at the same time (each has its own uid)
_uids_in_use: set[int] = set()
_uids_lock = threading.Lock()


@contextmanager
def _episode_uid():
    """A uid no other running episode has: ``EPISODE_UID_BASE + 64 * our pid + slot``.

    Different processes get different ranges (pids are unique), slots inside one process
    are handed out and returned here. Only used when we are root (layer 3).
    """
    with _uids_lock:
        free = [slot for slot in range(EPISODES_AT_ONCE) if slot not in _uids_in_use]
        if not free:
            raise RuntimeError(f"more than {EPISODES_AT_ONCE} sandboxes at once in one process")
        _uids_in_use.add(free[0])
    try:
        yield EPISODE_UID_BASE + EPISODES_AT_ONCE * os.getpid() + free[0]
    finally:
        with _uids_lock:
            _uids_in_use.discard(free[0])


# --- layer 4: a cgroup per episode, where the machine lets us make one ------------------------------

# The first process of every episode, when there is a cgroup: it joins the episode's cgroups
# (each ``cgroup.procs`` file before the "--"), then becomes the command after it. So every
# process of the episode is born inside them.
_JOIN_CGROUPS = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'


def _our_cgroups() -> dict[str, tuple[str, str]]:
    """Per hierarchy, its mount point and our own cgroup's folder in it: ``"unified"`` (v2), ``"memory"``, ``"pids"`` (v1)."""
    mounts = {}  # hierarchy -> (mount root, mount point)
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _, fs = line.partition(" - ")
        fstype, _, options = fs.split()[:3]
        root, point = fields.split()[3:5]
        if fstype == "cgroup2":
            mounts["unified"] = (root, point)
        elif fstype == "cgroup":
            for controller in {"memory", "pids"} & set(options.split(",")):
                mounts[controller] = (root, point)
    ours = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for hierarchy in controllers.split(",") if controllers else ["unified"]:
            if hierarchy in mounts:
                root, point = mounts[hierarchy]
                inside = path[len(root):] if root != "/" and path.startswith(root) else path  # a container's mount shows a subtree
                ours[hierarchy] = (point, point + inside.rstrip("/"))
    return ours


@lru_cache(maxsize=None)
def _cgroup_parents() -> tuple[tuple[str, tuple[str, ...]], ...]:
    """Where an episode's cgroups are made: ``((parent folder, controllers), ...)``, or ``()`` (no cgroup here).

    v2: the nearest folder from our own cgroup up whose ``cgroup.subtree_control`` gives its
    children memory and pids, if we may write it (root; or a systemd-delegated user session,
    where it is often our cgroup's parent): one folder per episode. v1: our own folders in
    the memory and pids hierarchies: two. Probed once for real: a cgroup is made, limited,
    joined by a process and removed; if any of it fails, ``()``.
    """
    try:
        ours = _our_cgroups()
    except OSError:
        return ()  # no /proc: not Linux
    candidates = ()
    if "unified" in ours:
        point, folder = ours["unified"]
        while folder.startswith(point):
            try:
                enabled = set(Path(folder, "cgroup.subtree_control").read_text().split())
            except OSError:
                break
            if {"memory", "pids"} <= enabled and os.access(folder, os.W_OK):
                candidates = ((folder, ("memory", "pids")),)
                break
            folder = os.path.dirname(folder)
    if not candidates and all(c in ours and os.access(ours[c][1], os.W_OK) for c in ("memory", "pids")):
        candidates = ((ours["memory"][1], ("memory",)), (ours["pids"][1], ("pids",)))
    if not candidates:
        return ()
    try:
        with _episode_cgroups(candidates, Limits()) as procs:
            subprocess.run(["/bin/sh", "-c", _JOIN_CGROUPS, "sh", *procs, "--", "true"], check=True, timeout=30, capture_output=True)
    except (OSError, subprocess.SubprocessError):
        return ()
    return candidates


def _cgroup_settings(controller: str, limits: Limits) -> dict[str, str]:
    """The files to write in a cgroup, v2 and v1 names both (a file this kernel lacks is skipped)."""
    if controller == "pids":
        return {"pids.max": str(limits.max_processes)}
    memory = str(limits.memory_bytes)
    return {"memory.max": memory, "memory.swap.max": "0",  # v2
            "memory.limit_in_bytes": memory, "memory.memsw.limit_in_bytes": memory}  # v1 (memory+swap: after the limit)


_episodes = itertools.count()  # numbers the episodes of this process (the end of their cgroups' names)


@contextmanager
def _episode_cgroups(parents: tuple[tuple[str, tuple[str, ...]], ...], limits: Limits):
    """Make the episode's cgroups under ``parents`` and yield their ``cgroup.procs`` files; remove them after.

    Each is named after us (``_owner()``), so a run that finds it left behind by a killed
    trainer knows whose it was.
    """
    name = _owner() + str(next(_episodes))
    folders = []
    try:
        for parent, controllers in parents:
            folder = os.path.join(parent, name)
            os.mkdir(folder)
            folders.append(folder)
            for controller in controllers:
                for file, value in _cgroup_settings(controller, limits).items():
                    if os.path.exists(os.path.join(folder, file)):
                        Path(folder, file).write_text(value)
        yield [os.path.join(folder, "cgroup.procs") for folder in folders]
    finally:
        for folder in folders:
            _remove_cgroup(folder)


def _remove_cgroup(folder: str) -> bool:
    """rmdir an emptied cgroup (the kernel may take a moment to release its last process); False if it will not go."""
    for _ in range(100):
        try:
            os.rmdir(folder)
            return True
        except FileNotFoundError:
            return True
        except OSError:
            time.sleep(0.01)
    return False


def _oom_kills(procs_files: list[str]) -> int:
    """How many processes the kernel killed for the episode's memory limit (``oom_kill`` lines, v2 and v1 alike)."""
    kills = 0
    for procs in procs_files:
        for name in ("memory.events", "memory.oom_control"):
            path = os.path.join(os.path.dirname(procs), name)
            if os.path.exists(path):
                kills += sum(int(line.split()[1]) for line in Path(path).read_text().splitlines() if line.startswith("oom_kill "))
    return kills


# --- nothing left behind ----------------------------------------------------------------------------


def _start_time(pid: int) -> int:
    """When process ``pid`` started (clock ticks since boot): with the pid, it names one process for good."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


def _owner() -> str:
    """The start of every name we give (cgroups, unsafe folders): ``sandbox-<pid>-<start time>-``.

    Without ``/proc`` (not Linux) the start time is 0, and ``_owner_gone`` never says gone.
    """
    pid = os.getpid()
    try:
        return f"sandbox-{pid}-{_start_time(pid)}-"
    except OSError:
        return f"sandbox-{pid}-0-"


def _owner_gone(name: str) -> bool:
    """True when ``name`` is ``sandbox-<pid>-<start time>-...`` and that process no longer runs."""
    found = re.fullmatch(r"sandbox-(\d+)-(\d+)-.+", name)
    if found is None or not os.path.exists("/proc/self/stat"):
        return False  # not a name of ours, or no way to tell: never touched
    pid, start = map(int, found.groups())
    try:
        return _start_time(pid) != start  # the pid now belongs to another process
    except OSError:
        return True


@lru_cache(maxsize=None)
def _clear_stale() -> int:
    """Remove the cgroups and unsafe folders of runs whose trainer is gone (``kill -9``); once per process.

    Only names of our pattern whose owner no longer runs, and folders of our own uid; a
    cgroup that still holds a process is left alone (the kernel refuses its rmdir).
    """
    removed = 0
    for parent in {parent for parent, _ in _cgroup_parents()}:
        for name in os.listdir(parent):
            if _owner_gone(name) and _remove_cgroup(os.path.join(parent, name)):
                removed += 1
    temp = tempfile.gettempdir()
    for name in os.listdir(temp):
        path = os.path.join(temp, name)
        if _owner_gone(name) and not os.path.islink(path) and os.path.isdir(path) and os.lstat(path).st_uid == os.geteuid():
            removed += _remove_folder(path)
    if removed:
        print(f"sandbox: removed {removed} cgroups and folders left by runs that were killed", file=sys.stderr)
    return removed


def _remove_folder(path: str) -> bool:
    """Delete a folder the code wrote in, whatever it did to the permissions inside; False if something stayed.

    As a normal user, a subfolder the code made read-only (``chmod 0500``) cannot be
    emptied, so ``rmtree(ignore_errors=True)`` left it silently. We give every folder back
    its owner's rights first (links are deleted, never followed).
    """
    with suppress(OSError):
        os.chmod(path, 0o700)
    for parent, folders, _ in os.walk(path):  # top-down: each folder is made ours before it is listed
        for name in folders:
            if not os.path.islink(os.path.join(parent, name)):
                with suppress(OSError):
                    os.chmod(os.path.join(parent, name), 0o700)
    shutil.rmtree(path, ignore_errors=True)
    return not os.path.lexists(path)


# --- running ------------------------------------------------------------------------------------


def run_python(code: str, files: dict[str, str] | None = None, stdin: str = "", limits: Limits | None = None,
               python: str | None = None, allow_unsafe: bool = False) -> SandboxResult:
    """Run ``code`` as ``main.py`` in a fresh working folder behind the sandbox's layers.

    ``files``: more files to put next to it (name -> text), e.g. test data.
    ``stdin``: text the program may read on standard input (a file, not a pipe: it need not read it).
    ``python``: the interpreter (default: this one).
    ``allow_unsafe``: run even where the OS boundary (bwrap) is unavailable, with a warning
    each time; without it that case raises ``SandboxUnavailable``. Never raises for
    anything the code does.
    """
    limits = limits or Limits()
    python = _interpreter(python)
    files = {"main.py": code, **(files or {})}
    for name in files:
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"sandbox files must be plain names in the working directory, got {name!r}")
    isolated = os_isolation(python)
    layers = sandbox_layers(python, limits)
    if not isolated and not allow_unsafe:
        raise SandboxUnavailable(f"no OS isolation for untrusted code: {_boundary_problem(python)}. "
                                 "Install bubblewrap, or pass allow_unsafe=True to run with rlimits and the audit hook only.")
    _announce(layers)
    _clear_stale()
    if not isolated:
        print("WARNING: sandbox: running untrusted code WITHOUT OS isolation (allow_unsafe=True); the audit hook can be switched off from inside", file=sys.stderr)
    start = time.monotonic()
    with ExitStack() as episode:
        try:
            cgroups = episode.enter_context(_episode_cgroups(_cgroup_parents(), limits))
            uid = episode.enter_context(_episode_uid()) if isolated and os.geteuid() == 0 else None
        except (OSError, RuntimeError) as e:  # the machine ran out of cgroups, or we of uids
            return SandboxResult(None, "", "", time.monotonic() - start, error=f"could not start: {e}", layers=layers)
        if isolated:
            result = _run_isolated(python, files, stdin, limits, cgroups, uid, start)
        else:
            result = _run_unsafe(python, files, stdin, limits, cgroups, start)
    result.layers = layers
    return result


def _utf8(text: str) -> bytes:
    """``text`` as UTF-8, a lone surrogate (``"\\ud800"``, which no UTF-8 holds) written as its bytes all the
    same: the program then meets text it cannot decode (a ``SyntaxError`` for code), the code's own failure,
    where refusing to write it would read as the sandbox's."""
    return text.encode("utf-8", errors="surrogatepass")


def _config(limits: Limits, uid: int | None, cwd: str) -> str:
    """The launcher's settings (JSON): who to become, where to run, the rlimits, the hook."""
    return json.dumps({
        "audit": limits.audit,
        "uid": uid,
        "cwd": cwd,
        "rlimits": {
            "RLIMIT_CPU": limits.cpu_seconds,
            "RLIMIT_AS": limits.memory_bytes,
            "RLIMIT_NPROC": limits.max_processes,
            "RLIMIT_FSIZE": limits.file_bytes,
            "RLIMIT_NOFILE": limits.open_files,
            "RLIMIT_CORE": 0,
        },
    })


def _run_isolated(python: str, files: dict[str, str], stdin: str, limits: Limits, cgroups: list[str], uid: int | None,
                  start: float) -> SandboxResult:
    """The run behind bwrap: the files in memory, copied by bwrap into the episode's tmpfs."""
    inputs = {name: _memory_file(_utf8(text)) for name, text in files.items()}
    seccomp, stdin_file = _memory_file(_seccomp_program()), _memory_file(_utf8(stdin))
    info_read, info_write = os.pipe()  # bwrap writes {"child-pid": N} here: the namespace's first process, as we see it
    launcher = [python, "-I", *([] if limits.site_packages else ["-S"]), "-c", _LAUNCHER, _config(limits, uid, SANDBOX_DIR)]
    argv = [*_bwrap_argv(python, limits, inputs, seccomp), "--info-fd", str(info_write), *launcher]
    if cgroups:
        argv = ["/bin/sh", "-c", _JOIN_CGROUPS, "sh", *cgroups, "--", *argv]
    try:
        proc = subprocess.Popen(argv, env={}, stdin=stdin_file, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                pass_fds=[info_write, seccomp, *inputs.values()])
    except OSError as e:
        os.close(info_read)
        return SandboxResult(None, "", "", time.monotonic() - start, error=f"could not start: {e}")
    finally:
        for fd in [info_write, seccomp, stdin_file, *inputs.values()]:
            os.close(fd)  # the child has its copies
    namespace = _namespace_pidfd(proc, info_read, start + limits.wall_seconds)
    result = _collect(proc, namespace, limits, start)
    result.user = f"uid {uid} (the episode's own)" if uid is not None else f"uid {SANDBOX_UID} in a user namespace"
    if result.error is None and result.returncode is not None and result.returncode - 128 in _SIGNALS:
        # bwrap reports "killed by signal N" as exit code 128+N; a program's own exit(137) reads the same (we cannot tell)
        result.returncode = 128 - result.returncode
        result.error = _describe_signal(result.returncode, limits)
    if _oom_kills(cgroups):
        result.error = (f"memory limit: the episode's processes together used more than {limits.memory_bytes // _MB} MB "
                        "(shared memory and /sandbox files included); killed by the kernel")
    return result


def _run_unsafe(python: str, files: dict[str, str], stdin: str, limits: Limits, cgroups: list[str], start: float) -> SandboxResult:
    """The run without bwrap (``allow_unsafe``): a folder in the temp directory, our own user."""
    workdir = tempfile.mkdtemp(prefix=_owner())
    try:
        for name, text in files.items():
            Path(workdir, name).write_bytes(_utf8(text))
        # no bwrap --die-with-parent here: the launcher asks the kernel itself to end it with us (a sleeping program spends no CPU time)
        launcher = parent_death_code(watchdog=False) + _LAUNCHER
        argv = [python, "-I", *([] if limits.site_packages else ["-S"]), "-c", launcher, _config(limits, None, workdir)]
        if cgroups:
            argv = ["/bin/sh", "-c", _JOIN_CGROUPS, "sh", *cgroups, "--", *argv]
        with tempfile.TemporaryFile() as stdin_file:  # a file, not a pipe we write: it need not be read
            stdin_file.write(_utf8(stdin))
            stdin_file.seek(0)
            try:
                proc = subprocess.Popen(argv, cwd=workdir, env={}, stdin=stdin_file, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        start_new_session=True)
            except OSError as e:
                return SandboxResult(None, "", "", time.monotonic() - start, error=f"could not start: {e}")
        result = _collect(proc, None, limits, start)
        result.user = f"uid {os.geteuid()} (ours: no boundary)"
        if _oom_kills(cgroups):
            result.error = f"memory limit: the run's processes together used more than {limits.memory_bytes // _MB} MB; killed by the kernel"
        return result
    finally:
        _remove_folder(workdir)


def _namespace_pidfd(proc: subprocess.Popen, info_read: int, deadline: float) -> int | None:
    """A pidfd of the namespace's first process (killing it ends the namespace), or None.

    The pid comes from bwrap's ``--info-fd``; it is bwrap's child, so we check its parent
    before trusting it (a pid alone could in principle be reused).
    """
    data = b""
    try:
        while select.select([info_read], [], [], max(deadline - time.monotonic(), 0))[0]:
            chunk = os.read(info_read, 4096)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(info_read)
    try:
        pid = json.loads(data)["child-pid"]
        pidfd = os.pidfd_open(pid)
        ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (ValueError, KeyError, OSError):
        return None  # bwrap failed to start it, or it has already ended
    if ppid != proc.pid:
        os.close(pidfd)
        return None
    return pidfd


def _describe_signal(returncode: int, limits: Limits) -> str:
    sig = signal.Signals(-returncode)
    why = {
        signal.SIGXCPU: f"CPU time limit, {limits.cpu_seconds} s",
        signal.SIGKILL: "killed by the sandbox or the CPU hard limit",
        signal.SIGSEGV: "segmentation fault, often the memory limit",
        signal.SIGSYS: "a system call the seccomp filter forbids",
    }.get(sig, "")
    return f"killed by {sig.name}" + (f" ({why})" if why else "")


def _wait_unreaped(pid: int, deadline: float) -> bool:
    """Wait until ``pid`` exits, without reaping it (so its pid cannot be reused yet)."""
    while True:
        if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)


def _end_everything(proc: subprocess.Popen, namespace: int | None) -> None:
    """SIGKILL the namespace (the kernel then kills all in it) and our process group; wait for both."""
    if namespace is not None:
        try:
            signal.pidfd_send_signal(namespace, signal.SIGKILL)
        except ProcessLookupError:
            pass  # already gone
        select.select([namespace], [], [], 10)  # readable once it and (pid 1 of a namespace) everything in it have exited
        os.close(namespace)
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the unreaped leader keeps the group id ours
    except (ProcessLookupError, PermissionError):
        pass  # the group is already gone
    proc.wait()


def _collect(proc: subprocess.Popen, namespace: int | None, limits: Limits, start: float) -> SandboxResult:
    """Read both pipes with caps until exit or a limit, then end everything."""
    deadline = start + limits.wall_seconds
    buffers = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    error, timed_out, truncated = None, False, False
    timeout = f"timeout: still running after {limits.wall_seconds:g} s wall clock; all its processes killed"
    with selectors.DefaultSelector() as selector:
        for pipe in buffers:
            selector.register(pipe, selectors.EVENT_READ)
        while selector.get_map() and error is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                error, timed_out = timeout, True
                break
            for key, _ in selector.select(remaining):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fileobj)
                    continue
                buffer = buffers[key.fileobj]
                buffer += chunk
                if len(buffer) > limits.output_bytes:
                    del buffer[limits.output_bytes :]
                    stream = "stdout" if key.fileobj is proc.stdout else "stderr"
                    error, truncated = f"output limit: more than {limits.output_bytes} bytes on {stream}; all its processes killed", True
                    break
    if error is None and not _wait_unreaped(proc.pid, deadline):  # pipes closed; it may still be finishing
        error, timed_out = timeout, True
    _end_everything(proc, namespace)
    for pipe in buffers:
        pipe.close()
    returncode = proc.returncode
    if error is None and returncode < 0:
        error = _describe_signal(returncode, limits)
    stdout, stderr = (bytes(buffers[p]).decode("utf-8", errors="replace") for p in (proc.stdout, proc.stderr))
    return SandboxResult(returncode, stdout, stderr, time.monotonic() - start, error, timed_out, truncated)
