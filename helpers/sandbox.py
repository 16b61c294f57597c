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
prints a warning at every run: without layers 1-3 only layers 4-6 stand, and layer 6
is not a boundary.

1. Namespaces: the code gets its own PID namespace (it sees only its own processes and
   cannot signal ours), network namespace (no interfaces but a loopback that is down:
   no network at all, at any level below Python too), IPC and UTS namespaces, and a
   mount namespace (layer 2). As a normal user, bwrap also makes a user namespace
   (that is what lets an unprivileged user create the others) and forbids nested ones.
   When the whole namespace ends, the kernel kills every process left in it: a
   ``setsid()`` grandchild or a double fork cannot outlive the episode.
2. A filesystem view of its own: the system's ``/usr`` (and ``/bin``, ``/lib``... links)
   and the interpreter's install, read-only; a fresh ``/proc`` that shows only its own
   processes; a minimal ``/dev``; one writable folder, ``/sandbox`` (an empty temp
   directory of ours, deleted afterwards), which is also the working directory. Nothing
   else exists inside: no ``/home``, ``/root``, ``/etc``, ``/tmp``, no repository (so no
   test data to peek at), no other process's ``/proc`` entries.
3. An unprivileged user: the code runs as uid 65534 (``nobody``) with no capabilities
   and ``no_new_privs`` (setuid programs do not raise it). When we are root, bwrap does
   not make a user namespace (it would map the code back to uid 0 outside, where
   ``RLIMIT_NPROC`` does not bind and root's files are its own); the launcher drops to
   the real uid 65534 instead, so outside the boundary too it is nobody.
4. Resource limits (``setrlimit``) in the child: CPU seconds (``RLIMIT_CPU``), address
   space (``RLIMIT_AS``: allocating 10 GB fails with ``MemoryError``), processes
   (``RLIMIT_NPROC``), size of any file written (``RLIMIT_FSIZE``), open files, no core
   dumps; an empty environment (no API keys); ``python -I -S`` (isolated mode; ``-S``:
   standard library only unless ``Limits.site_packages``).
5. A wall-clock timeout and an output cap (past ``output_bytes`` on stdout or stderr),
   after which the whole namespace is killed (``SIGKILL`` to its first process, through
   a pidfd, and we wait until the kernel has ended every process in it).
6. A Python audit hook (PEP 578), the second layer, installed before the code runs: it
   refuses process creation, signals, sockets, ``ctypes`` calls, writes outside the
   working directory and other processes' ``/proc`` entries with a readable
   ``PermissionError``, so the usual accidents get a clear message. It lives inside the
   child's own interpreter, so the code can switch it off; layers 1-5 do not depend on it.

How it was tested (``tests/test_sandbox.py``, run against the real boundary; those
tests skip, saying why, where bwrap cannot run): with the audit hook switched off, the
code cannot kill a ``sleep 60`` of ours (``os.kill``, ``signal.pidfd_send_signal``),
cannot read our environment or memory through ``/proc`` (with or without ``dir_fd``),
cannot create anything outside ``/sandbox`` (``open``, ``os.mkdir``, ``rename``, ``link``,
``symlink``, ``mknod``), has no network and no capabilities, is not uid 0, and its
``setsid()`` grandchild is dead when ``run_python`` returns.

What it does NOT stop:

* Kernel exploits. Namespaces share the host's kernel; a kernel bug reachable from
  inside (no seccomp filter here) escapes all of the above. For code from strangers use
  a VM-grade sandbox (gVisor, Firecracker, a hosted code runner).
* Reading what is mounted: the system libraries and the Python install are readable.
* Resource totals: the limits are per process (``RLIMIT_AS`` bounds each process, not
  their sum; the files in ``/sandbox`` are bounded one by one, not in total), and
  ``RLIMIT_NPROC`` counts all processes of uid 65534 on the host when we are root.
  A cgroup would bound the sum; we do not set one up.
* Side channels and timing (CPU caches, how long a test took).
* Which values the code returns: judging them is the caller's job (``helpers.envs.code_env``
  compares them outside the boundary).
"""

from __future__ import annotations

import json
import os
import pwd
import select
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

_MB = 1 << 20
_SIGNALS = {sig.value for sig in signal.Signals}
SANDBOX_UID = 65534  # "nobody" on Debian, Ubuntu, Fedora
SANDBOX_DIR = "/sandbox"  # the one writable folder, as the code sees it
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")  # mounted read-only (or linked)


class SandboxUnavailable(RuntimeError):
    """No OS boundary here, and the caller did not pass ``allow_unsafe=True``."""


@dataclass
class Limits:
    """Limits for one run. Defaults suit small HumanEval-style programs."""

    wall_seconds: float = 10.0  # wall-clock time, then SIGKILL to the whole namespace
    cpu_seconds: int = 5  # RLIMIT_CPU: SIGXCPU at the soft limit, SIGKILL one second later
    memory_bytes: int = 1024 * _MB  # RLIMIT_AS: virtual address space of each process
    max_processes: int = 32  # RLIMIT_NPROC: processes of uid 65534 (of our user, without the boundary)
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
    layers: tuple[str, ...] = field(default_factory=tuple)  # the layers that were active (sandbox_layers)

    @property
    def ok(self) -> bool:
        return self.error is None and self.returncode == 0


# The child's first code: drop to uid 65534 if we are root, limits, audit hook, then run
# main.py. Passed with ``python -I -c``; everything here runs before the untrusted code.
_LAUNCHER = r'''
import json, os, resource, signal, sys
cfg = json.loads(sys.argv[1])
if cfg["uid"] is not None and os.getuid() == 0:  # root inside the boundary: become nobody for real
    os.setgroups([])
    os.setgid(cfg["uid"])
    os.setuid(cfg["uid"])  # also clears every capability (uid 0 -> non-zero)
if cfg["cwd"]:
    os.chdir(cfg["cwd"])  # only now: the folder belongs to uid 65534, and root here has no right to override that
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


# --- layers 1-3: the bwrap command line ------------------------------------------------------------


@lru_cache(maxsize=None)
def _python_dirs(python: str) -> tuple[str, ...]:
    """The folders ``python`` needs inside: its prefixes (a venv and its base install)."""
    probe = subprocess.run([python, "-I", "-S", "-c", "import sys; print(sys.prefix); print(sys.base_prefix); print(sys.exec_prefix)"],
                           capture_output=True, text=True, timeout=30)
    dirs = {os.path.realpath(line) for line in probe.stdout.splitlines() if line.strip()}
    dirs.add(os.path.dirname(os.path.realpath(python)))
    return tuple(sorted(d for d in dirs if not any(d == s or d.startswith(s + "/") for s in SYSTEM_PATHS)))


def _bwrap_argv(python: str, workdir: str) -> list[str]:
    """bwrap's arguments for layers 1-3 (see the module docstring); the interpreter command follows them."""
    root = os.geteuid() == 0
    argv = [shutil.which("bwrap") or "bwrap", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--clearenv", "--hostname", "sandbox"]
    if root:  # no user namespace (see layer 3); the launcher needs exactly these two capabilities to drop to nobody
        argv += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        argv += ["--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--disable-userns", "--cap-drop", "ALL"]
    for path in SYSTEM_PATHS:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    made = set()
    for path in _python_dirs(python):  # parents bwrap would create 0700 (unusable for nobody): make them 0755
        for parent in reversed(Path(path).parents[:-1]):
            if str(parent) not in made:
                made.add(str(parent))
                argv += ["--perms", "0755", "--dir", str(parent)]
        argv += ["--ro-bind", path, path]
    argv += ["--proc", "/proc", "--dev", "/dev", "--bind", workdir, SANDBOX_DIR]
    return argv


@lru_cache(maxsize=None)
def _boundary_problem(python: str) -> str | None:
    """None when bwrap can build layers 1-3 here for ``python``; else why not (probed once)."""
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed; on Debian/Ubuntu: apt-get install bubblewrap"
    with tempfile.TemporaryDirectory(prefix="sandbox-probe-") as workdir:
        try:
            probe = subprocess.run([*_bwrap_argv(python, workdir), python, "-I", "-S", "-c", "pass"], capture_output=True, text=True, timeout=30, env={})
        except (OSError, subprocess.SubprocessError) as e:
            return f"bwrap could not run: {e}"
    if probe.returncode != 0:
        return f"bwrap cannot create the namespaces here (exit {probe.returncode}: {probe.stderr.strip()[:200]})"
    return None


def os_isolation(python: str | None = None) -> bool:
    """True when layers 1-3 (the OS boundary) are available for ``python`` (default: this one)."""
    return _boundary_problem(python or sys.executable) is None


def sandbox_layers(python: str | None = None, limits: Limits | None = None) -> tuple[str, ...]:
    """The layers ``run_python`` puts around the code here (see the module docstring), one short line each."""
    limits = limits or Limits()
    problem = _boundary_problem(python or sys.executable)
    if problem is None:
        user = "user namespace, " if os.geteuid() != 0 else ""
        layers = [f"namespaces ({user}pid, net, ipc, uts, mount) by bwrap", "read-only system, one writable folder",
                  f"uid {SANDBOX_UID}, no capabilities", "rlimits", "wall timeout, whole namespace killed"]
    else:
        layers = [f"NO OS isolation ({problem})", "rlimits", "wall timeout, process group killed"]
    return tuple(layers + (["audit hook"] if limits.audit else []))


_announced = False


def _announce(layers: tuple[str, ...]) -> None:
    """Say once per process which layers are active (the first run prints one line)."""
    global _announced
    if not _announced:
        print("sandbox layers: " + "; ".join(layers), file=sys.stderr)
        _announced = True


# --- running ------------------------------------------------------------------------------------


def run_python(code: str, files: dict[str, str] | None = None, stdin: str = "", limits: Limits | None = None,
               python: str | None = None, allow_unsafe: bool = False) -> SandboxResult:
    """Run ``code`` as ``main.py`` in a fresh temporary folder behind the sandbox's layers.

    ``files``: more files to write next to it (name -> text), e.g. test data.
    ``stdin``: text the program reads on standard input (kept small: it is written up front).
    ``python``: the interpreter (default: this one).
    ``allow_unsafe``: run even where the OS boundary (bwrap) is unavailable, with a warning
    each time; without it that case raises ``SandboxUnavailable``. Never raises for
    anything the code does.
    """
    limits = limits or Limits()
    python = python or sys.executable
    isolated = os_isolation(python)
    layers = sandbox_layers(python, limits)
    if not isolated and not allow_unsafe:
        raise SandboxUnavailable(f"no OS isolation for untrusted code: {_boundary_problem(python)}. "
                                 "Install bubblewrap, or pass allow_unsafe=True to run with rlimits and the audit hook only.")
    _announce(layers)
    if not isolated:
        print("WARNING: sandbox: running untrusted code WITHOUT OS isolation (allow_unsafe=True); the audit hook can be switched off from inside", file=sys.stderr)
    workdir = tempfile.mkdtemp(prefix="sandbox-")
    start = time.monotonic()
    try:
        for name, text in {"main.py": code, **(files or {})}.items():
            path = Path(workdir, name)
            if path.parent != Path(workdir):
                raise ValueError(f"sandbox files must be plain names in the working directory, got {name!r}")
            path.write_text(text, encoding="utf-8")
        drop = isolated and os.geteuid() == 0  # the launcher becomes uid 65534, which must own its folder
        if drop:
            for path in [workdir, *(str(p) for p in Path(workdir).iterdir())]:
                os.chown(path, SANDBOX_UID, SANDBOX_UID)
        config = {
            "audit": limits.audit,
            "uid": SANDBOX_UID if drop else None,
            "cwd": SANDBOX_DIR if isolated else None,
            "rlimits": {
                "RLIMIT_CPU": limits.cpu_seconds,
                "RLIMIT_AS": limits.memory_bytes,
                "RLIMIT_NPROC": limits.max_processes,
                "RLIMIT_FSIZE": limits.file_bytes,
                "RLIMIT_NOFILE": limits.open_files,
                "RLIMIT_CORE": 0,
            },
        }
        argv = [python, "-I", *([] if limits.site_packages else ["-S"]), "-c", _LAUNCHER, json.dumps(config)]
        info_read, info_write = os.pipe() if isolated else (None, None)
        if isolated:  # bwrap writes {"child-pid": N} here: the namespace's first process, as we see it
            argv = [*_bwrap_argv(python, workdir), "--info-fd", str(info_write), *argv]
        try:
            proc = subprocess.Popen(argv, cwd=workdir, env={}, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True, pass_fds=[info_write] if isolated else [])
        except OSError as e:
            if isolated:
                os.close(info_read)
            return SandboxResult(None, "", "", time.monotonic() - start, error=f"could not start: {e}", layers=layers)
        finally:
            if isolated:
                os.close(info_write)  # bwrap has its copy
        namespace = _namespace_pidfd(proc, info_read, start + limits.wall_seconds) if isolated else None
        result = _collect(proc, namespace, stdin, limits, start)
        result.layers = layers
        result.user = "nobody" if isolated else pwd.getpwuid(os.geteuid()).pw_name
        if isolated and result.error is None and result.returncode is not None and result.returncode - 128 in _SIGNALS:
            # bwrap reports "killed by signal N" as exit code 128+N; a program's own exit(137) reads the same (we cannot tell)
            result.returncode = 128 - result.returncode
            result.error = _describe_signal(result.returncode, limits)
        return result
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


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


def _collect(proc: subprocess.Popen, namespace: int | None, stdin: str, limits: Limits, start: float) -> SandboxResult:
    """Feed stdin, read both pipes with caps until exit or a limit, then end everything."""
    try:
        proc.stdin.write(stdin.encode())
        proc.stdin.close()
    except BrokenPipeError:
        pass  # it exited without reading
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
