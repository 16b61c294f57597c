"""Run untrusted Python in a separate, limited process (the CodeEnv's test runner).

    result = run_python("print(sum(range(10)))")
    result.stdout, result.returncode, result.error        # '45\\n', 0, None

The code a policy writes is untrusted: early in RL training it is random, later it
may learn to game the tests. ``run_python`` puts it in a child process with limits
and reports how it ended, in one line (``result.error``), without ever raising.

What the sandbox DOES (each a layer; later layers catch what earlier ones miss):

1. A separate process, ``python -I -S`` (isolated mode: no ``PYTHON*`` variables, no
   user site-packages, the script's directory not on ``sys.path``; ``-S``: no
   site-packages either, the standard library only, and a faster start), in a fresh,
   empty temporary working directory that is deleted afterwards.
2. An empty environment: no inherited variables (API keys, tokens, ``HOME``). Python
   itself then adds only ``LC_CTYPE=C.UTF-8`` (locale coercion, PEP 538).
3. Resource limits (``setrlimit``) in the child: CPU seconds (``RLIMIT_CPU``),
   address space (``RLIMIT_AS``: allocating 10 GB fails with ``MemoryError``),
   processes (``RLIMIT_NPROC``), size of any file written (``RLIMIT_FSIZE``),
   open files, no core dumps.
4. A wall-clock timeout, after which the whole process group is killed
   (``start_new_session`` makes the child a group leader; ``SIGKILL`` to the group).
5. Captured output is capped: past ``output_bytes`` on stdout or stderr the group is
   killed (printing 100 MB costs us 1 MB of memory, not 100).
6. A Python audit hook (PEP 578), installed before the code runs, refuses: creating
   processes (``os.fork``, ``os.system``, ``subprocess``, ``os.exec*``, ``posix_spawn``),
   signals to other processes (``os.kill``), sockets (connect, bind, DNS), ``ctypes``
   calls into C functions or raw memory (importing ``ctypes`` is allowed: numpy needs it),
   writing, deleting, renaming or linking files outside the working directory, and
   reading other processes' ``/proc`` entries (their environment).
7. When run as root (Colab, containers), the child drops to the ``nobody`` user if
   that user can run the interpreter (``SandboxResult.user`` says which). Root
   ignores ``RLIMIT_NPROC``, so without the drop layer 6 is what stops a fork bomb.

What the sandbox does NOT do (it is not a security boundary):

* No kernel isolation: no seccomp, no namespaces, no container. A determined attacker
  who gets past the audit hook (it lives inside the same Python process; CPython's
  own docs say audit hooks are not a sandbox) has the full rights of the user.
* No network namespace: layer 6 blocks Python's socket module only.
* No filesystem jail beyond the working directory for *writes* (layer 6): the code can
  *read* any file its user can read (the repository, ``/etc/passwd``), and as the same
  user it could read other processes' files.
* Limits are per process: ``RLIMIT_AS`` bounds each process, not their sum.
* Results the harness prints can be forged by code that inspects the harness (see
  ``helpers.envs.code_env``): fine for training small models, not for a leaderboard.

For untrusted code from the internet use a real sandbox (a container or VM with no
network, e.g. gVisor, Firecracker, or a hosted code-execution service).
"""

from __future__ import annotations

import json
import os
import pwd
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

_MB = 1 << 20


@dataclass
class Limits:
    """Limits for one run. Defaults suit small HumanEval-style programs."""

    wall_seconds: float = 10.0  # wall-clock time, then SIGKILL to the process group
    cpu_seconds: int = 5  # RLIMIT_CPU: SIGXCPU at the soft limit, SIGKILL one second later
    memory_bytes: int = 1024 * _MB  # RLIMIT_AS: virtual address space of the child
    max_processes: int = 32  # RLIMIT_NPROC: processes of the child's user (root ignores it)
    file_bytes: int = 10 * _MB  # RLIMIT_FSIZE: largest file the child may write
    open_files: int = 64  # RLIMIT_NOFILE
    output_bytes: int = 1 * _MB  # captured stdout, and separately stderr
    audit: bool = True  # install the audit hook (layer 6)
    site_packages: bool = False  # let the code import installed packages (drops -S)


@dataclass
class SandboxResult:
    """How a run ended. ``error`` is None for a normal exit (any exit code), else one line:

    ``"timeout: ..."``, ``"output limit: ..."``, ``"killed by SIGXCPU (CPU time limit, ...)"``,
    ``"could not start: ..."``.
    """

    returncode: int | None  # exit code; negative = killed by that signal; None = never started
    stdout: str
    stderr: str
    wall_time: float
    error: str | None = None
    timed_out: bool = False
    output_truncated: bool = False
    user: str = ""  # the user the code ran as

    @property
    def ok(self) -> bool:
        return self.error is None and self.returncode == 0


# The child's first code: limits, audit hook, then run main.py. Passed with ``python -I -c``.
_LAUNCHER = r'''
import json, os, resource, signal, sys
cfg = json.loads(sys.argv[1])
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
            "os.kill", "os.killpg", "signal.pthread_kill", "os.symlink", "os.link", "os.chroot",
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
                if text.startswith("/proc/") and not text.startswith(f"/proc/{os.getpid()}"):
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


@lru_cache(maxsize=None)
def _unprivileged_user(python: str) -> str | None:
    """"nobody" when we are root and that user can execute ``python``; else None (run as ourselves)."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("nobody")
    except KeyError:
        return None
    real = Path(os.path.realpath(python))
    for directory in real.parents:  # every directory on the way must be searchable by others
        if not os.stat(directory).st_mode & stat.S_IXOTH:
            return None
    if not os.stat(real).st_mode & stat.S_IXOTH:
        return None
    probe = subprocess.run([python, "-I", "-c", "pass"], user="nobody", extra_groups=[], env={}, cwd="/", capture_output=True, timeout=30)
    return "nobody" if probe.returncode == 0 else None  # the stdlib must be readable too


def _describe_signal(returncode: int, limits: Limits) -> str:
    sig = signal.Signals(-returncode)
    why = {
        signal.SIGXCPU: f"CPU time limit, {limits.cpu_seconds} s",
        signal.SIGKILL: "killed by the sandbox or the CPU hard limit",
        signal.SIGSEGV: "segmentation fault, often the memory limit",
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


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is already gone


def run_python(code: str, files: dict[str, str] | None = None, stdin: str = "", limits: Limits | None = None, python: str | None = None) -> SandboxResult:
    """Run ``code`` as ``main.py`` in a fresh temporary directory with ``limits``.

    ``files``: more files to write next to it (name -> text), e.g. test data.
    ``stdin``: text the program reads on standard input (kept small: it is written up front).
    ``python``: the interpreter (default: this one). Never raises for anything the code does.
    """
    limits = limits or Limits()
    python = python or sys.executable
    user = _unprivileged_user(python)
    workdir = tempfile.mkdtemp(prefix="sandbox-")
    start = time.monotonic()
    try:
        for name, text in {"main.py": code, **(files or {})}.items():
            path = Path(workdir, name)
            if path.parent != Path(workdir):
                raise ValueError(f"sandbox files must be plain names in the working directory, got {name!r}")
            path.write_text(text, encoding="utf-8")
        if user:
            for path in [workdir, *(str(p) for p in Path(workdir).iterdir())]:
                os.chown(path, pwd.getpwnam(user).pw_uid, pwd.getpwnam(user).pw_gid)
        config = {
            "audit": limits.audit,
            "rlimits": {
                "RLIMIT_CPU": limits.cpu_seconds,
                "RLIMIT_AS": limits.memory_bytes,
                "RLIMIT_NPROC": limits.max_processes,
                "RLIMIT_FSIZE": limits.file_bytes,
                "RLIMIT_NOFILE": limits.open_files,
                "RLIMIT_CORE": 0,
            },
        }
        try:
            proc = subprocess.Popen(
                [python, "-I", *([] if limits.site_packages else ["-S"]), "-c", _LAUNCHER, json.dumps(config)],
                cwd=workdir,
                env={},
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # its own process group, so one killpg ends every child
                user=user,
                extra_groups=[] if user else None,
            )
        except OSError as e:
            return SandboxResult(None, "", "", time.monotonic() - start, error=f"could not start: {e}")
        result = _collect(proc, stdin, limits, start)
        result.user = user or pwd.getpwuid(os.geteuid()).pw_name
        return result
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _collect(proc: subprocess.Popen, stdin: str, limits: Limits, start: float) -> SandboxResult:
    """Feed stdin, read both pipes with caps until exit or a limit, then kill the group."""
    try:
        proc.stdin.write(stdin.encode())
        proc.stdin.close()
    except BrokenPipeError:
        pass  # it exited without reading
    deadline = start + limits.wall_seconds
    buffers = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    error, timed_out, truncated = None, False, False
    with selectors.DefaultSelector() as selector:
        for pipe in buffers:
            selector.register(pipe, selectors.EVENT_READ)
        while selector.get_map() and error is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                error, timed_out = f"timeout: still running after {limits.wall_seconds:g} s wall clock; process group killed", True
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
                    error, truncated = f"output limit: more than {limits.output_bytes} bytes on {stream}; process group killed", True
                    break
    if error is None and not _wait_unreaped(proc.pid, deadline):  # pipes closed; it may still be finishing
        error, timed_out = f"timeout: still running after {limits.wall_seconds:g} s wall clock; process group killed", True
    _kill_group(proc.pid)  # also ends children it left behind; the unreaped leader keeps the group id ours
    proc.wait()
    for pipe in buffers:
        pipe.close()
    returncode = proc.returncode
    if error is None and returncode < 0:
        error = _describe_signal(returncode, limits)
    stdout, stderr = (bytes(buffers[p]).decode("utf-8", errors="replace") for p in (proc.stdout, proc.stderr))
    return SandboxResult(returncode, stdout, stderr, time.monotonic() - start, error, timed_out, truncated)
