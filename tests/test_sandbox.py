"""The sandbox: hostile programs end within their limits with a clear error, and we survive.

The attack tests at the end run against the real OS boundary (bwrap) with the audit hook
switched off or emptied from inside, as an attacker would, with this interpreter and with
the interpreter of a fresh ``python -m venv`` (a link into its base install: what most
users run). They skip where bwrap cannot run, and fail instead in CI (``CI=true``), where
bubblewrap is installed: a boundary test that silently skips proves nothing.
The totals per episode, and a normal user's run, are in ``tests/test_sandbox_totals.py``.
"""

import os
import subprocess
import sys
import time
import uuid

import pytest

from helpers import sandbox
from helpers.sandbox import SANDBOX_UID, Limits, SandboxUnavailable, os_isolation, run_python, sandbox_layers

FAST = Limits(wall_seconds=3.0, cpu_seconds=2)
NO_HOOK = Limits(wall_seconds=5.0, cpu_seconds=3, audit=False)  # the hook switched off: only the OS boundary holds
BOUNDARY = os_isolation()
UNSAFE = not BOUNDARY  # without the boundary, the tests of layers 5-7 still run (allow_unsafe, with its warning)


def require_boundary(python=sys.executable):
    """Skip a test of the OS boundary where bwrap cannot run for ``python``; in CI, fail instead."""
    problem = sandbox._boundary_problem(python)
    if problem is not None:
        message = f"no OS boundary here for {python}: {problem}"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message} (CI installs bubblewrap: the boundary tests must run there)")
        pytest.skip(message)


@pytest.fixture
def boundary():
    require_boundary()


needs_boundary = pytest.mark.usefixtures("boundary")


@pytest.fixture(scope="session")
def venv_python(tmp_path_factory):
    """The interpreter of a fresh ``python -m venv`` (with the system's packages): a link, as users have it."""
    venv = tmp_path_factory.mktemp("venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    assert python.is_symlink()  # what made the venv's folder go unmounted (issue 28)
    return str(python)


@pytest.fixture(params=["this interpreter", "a fresh venv"])
def python(request):
    """The interpreter a boundary test runs under: ours, then a fresh venv's; the boundary required for each."""
    python = sys.executable if request.param == "this interpreter" else request.getfixturevalue("venv_python")
    require_boundary(python)
    return python

# Empty the audit hook's deny sets from inside, as the attacker did (gc finds the hook's sets).
CLEAR_HOOK = """
import gc
for o in gc.get_objects():
    if isinstance(o, set) and ({"os.fork", "subprocess", "os.remove", "ctypes.dlopen"} & o):
        o.clear()
"""


def run(code, **kwargs):
    return run_python(code, allow_unsafe=UNSAFE, **kwargs)


def test_normal_program():
    result = run("import sys\nprint(sum(range(10)))\nprint('warn', file=sys.stderr)", files={"data.txt": "x"})
    assert result.ok and result.stdout == "45\n" and result.stderr == "warn\n"
    assert result.returncode == 0 and result.error is None


def test_exit_code_and_exception_are_reported_not_raised():
    assert run("import sys; sys.exit(3)").returncode == 3
    assert run("import sys; sys.exit(200)").returncode == 200  # above 128, yet no signal's number + 128
    result = run("1/0")
    assert result.returncode == 1 and "ZeroDivisionError" in result.stderr and not result.ok


def test_layers_are_reported():
    layers = sandbox_layers()
    assert layers == run("pass").layers and layers[-1] == "audit hook"
    assert "audit hook" not in sandbox_layers(limits=NO_HOOK)
    if BOUNDARY:
        assert layers[0].startswith("namespaces (") and "no capabilities, no new user namespaces" in layers[2]


def test_layers_line_prints_once_when_threads_start_together(monkeypatch):
    """Graders run episodes from a thread pool; the line printed twice, run together, when two threads met it first."""
    import threading

    class SlowStderr:  # a write slow enough that every thread has read the flag before the first write ends
        lines = []

        def write(self, text):
            time.sleep(0.05)
            self.lines.append(text)

        def flush(self):
            pass

    monkeypatch.setattr(sandbox, "_announced", False)
    monkeypatch.setattr(sys, "stderr", SlowStderr())
    start = threading.Barrier(8)
    threads = [threading.Thread(target=lambda: (start.wait(), sandbox._announce(("rlimits",)))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert "".join(SlowStderr.lines) == "sandbox layers: rlimits\n"


def inside_uid(result) -> str:
    """The uid the code saw: 65534 in its user namespace, or (as root) the episode's own, as ``result.user`` says."""
    return result.user.split()[1]


def test_runs_isolated_in_an_empty_folder(monkeypatch, python):
    monkeypatch.setenv("SECRET_TOKEN", "hunter2")
    result = run_python("import os, sys\nprint(os.getcwd())\nprint(sorted(os.listdir('.')))\nprint(dict(os.environ))\nprint(sys.flags.isolated)\n"
                        "print(os.getuid())", files={"data.txt": "x"}, python=python)
    cwd, listing, environ, isolated, uid = result.stdout.splitlines()
    assert cwd == "/sandbox" and listing == "['data.txt', 'main.py']"
    assert "hunter2" not in result.stdout and "SECRET_TOKEN" not in environ
    assert isolated == "1" and uid == inside_uid(result) and int(uid) != 0
    assert uid == str(SANDBOX_UID) if os.geteuid() != 0 else int(uid) >= sandbox.EPISODE_UID_BASE


def test_infinite_loop_ends_at_the_wall_clock():
    start = time.monotonic()
    result = run("while True: pass", limits=Limits(wall_seconds=1.5, cpu_seconds=10))
    assert time.monotonic() - start < 4
    assert result.timed_out and result.error.startswith("timeout: still running after 1.5 s")


def test_cpu_limit_kills_a_busy_program():
    result = run("while True: pass", limits=Limits(wall_seconds=10, cpu_seconds=1))
    assert result.returncode < 0 and "SIGXCPU" in result.error and "CPU time limit" in result.error
    assert result.wall_time < 8


def test_allocating_10_gb_fails_with_memory_error():
    result = run("x = bytearray(10 * 1024**3)\nprint('allocated')", limits=FAST)
    assert "MemoryError" in result.stderr and "allocated" not in result.stdout
    assert result.wall_time < 3


def test_fork_bomb_is_refused_by_the_audit_hook():
    pid = os.getpid()
    result = run("import os\nwhile True:\n    os.fork()", limits=FAST)
    assert "sandbox: os.fork is not allowed" in result.stderr
    for bypass in ["import subprocess", "import _posixsubprocess", "import multiprocessing", "import ctypes\nctypes.CDLL(None).fork()",
                   "os.system('true')", "os.posix_spawn('/bin/true', ['true'], {})"]:
        result = run(f"import os\n{bypass}", limits=FAST)
        assert "PermissionError: sandbox:" in result.stderr, (bypass, result.stderr)
    assert os.getpid() == pid  # still us, still running


@needs_boundary
def test_real_fork_bomb_hits_the_process_limit():
    """Without the audit hook, the OS layers hold: uid 65534, where RLIMIT_NPROC binds."""
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    start = time.monotonic()
    result = run(code, limits=Limits(wall_seconds=2, cpu_seconds=2, max_processes=16, audit=False))
    assert result.timed_out and time.monotonic() - start < 6


def test_writing_outside_the_folder_is_refused_by_the_hook(tmp_path):
    target = tmp_path / "escaped.txt"
    for code in [f"open({str(target)!r}, 'w').write('x')", f"import os\nos.open({str(target)!r}, os.O_CREAT | os.O_WRONLY)", "open('../escaped.txt', 'w')",
                 f"import os\nos.symlink({str(tmp_path)!r}, 'link')", f"import os\nos.remove({str(tmp_path)!r})"]:
        result = run(code, limits=FAST)
        assert "PermissionError: sandbox:" in result.stderr, (code, result.stderr)
    assert not target.exists() and tmp_path.exists()
    assert run("open('inside.txt', 'w').write('ok'); print(open('inside.txt').read())").stdout == "ok\n"


def test_reading_environment_variables_finds_nothing(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    result = run("import os\nprint(os.environ.get('OPENAI_API_KEY'))\nprint(open(f'/proc/{os.getppid()}/environ').read())", limits=FAST)
    assert result.stdout.splitlines()[0] == "None"
    assert "sk-secret" not in result.stdout
    assert "reading other processes' /proc entries is not allowed" in result.stderr


def test_printing_100_mb_is_cut_at_the_output_cap():
    start = time.monotonic()
    result = run("import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(100):\n    sys.stdout.write(chunk)", limits=Limits(output_bytes=1 << 20))
    assert time.monotonic() - start < 5
    assert result.output_truncated and result.error.startswith("output limit: more than 1048576 bytes on stdout")
    assert len(result.stdout) == 1 << 20


def test_big_files_hit_the_file_size_limit():
    result = run("open('big', 'wb').write(b'x' * (5 << 20))", limits=Limits(file_bytes=1 << 20))
    assert "File too large" in result.stderr


def test_network_and_signals_are_refused_by_the_hook():
    assert "socket" in run("import socket\nsocket.create_connection(('127.0.0.1', 9))", limits=FAST).stderr
    assert "sandbox: os.kill is not allowed" in run("import os\nos.kill(os.getppid(), 9)", limits=FAST).stderr


def test_standard_library_only_unless_asked():
    assert "ModuleNotFoundError" in run("import transformers", limits=FAST).stderr
    assert run("import json, re, itertools; print('ok')", limits=FAST).stdout == "ok\n"
    assert run("import numpy; print('ok')", limits=Limits(site_packages=True)).stdout == "ok\n"


def test_a_venvs_interpreter_runs_behind_the_boundary(python):
    """Issue 28: from a venv, bwrap could not find the interpreter ("execvp .../.venv/bin/python")."""
    result = run_python("import sys; print(sys.prefix == sys.base_prefix)", python=python, limits=FAST)
    assert result.ok and result.stdout == "True\n", result  # -S: no site, so no venv prefix inside
    result = run_python("import sys, numpy; print(sys.prefix)", python=python, limits=Limits(site_packages=True))
    assert result.ok and result.stdout.strip() == os.path.dirname(os.path.dirname(python)), result  # the venv's own prefix


def test_an_interpreter_started_through_dotdot_runs_behind_the_boundary(tmp_path, monkeypatch):
    """Python started as ``../venv/bin/python`` keeps that path in ``sys.executable``. Inside the sandbox only the
    interpreter's own folders exist, so bwrap could not exec a path through a folder that is not mounted there, and
    the sandbox refused to run, blaming the namespaces. The same for a relative path, which bwrap looked up from
    ``/sandbox``."""
    require_boundary()
    up = "/".join([".."] * len(tmp_path.parts[1:]))
    detour = f"{tmp_path}/{up}{sys.executable}"  # /tmp/pytest-of-root/.../../../../work/main/.venv/bin/python
    assert os.path.samefile(detour, sys.executable)
    monkeypatch.setattr(sys, "executable", detour)
    assert os_isolation(), sandbox._boundary_problem(detour)
    assert run_python("print(6 * 7)", limits=FAST).stdout == "42\n"
    monkeypatch.chdir(tmp_path)
    relative = os.path.relpath(detour)  # ../../../work/main/.venv/bin/python
    assert not os.path.isabs(relative) and os_isolation(relative)
    assert run_python("print(6 * 7)", python=relative, limits=FAST).stdout == "42\n"


def test_no_boundary_needs_allow_unsafe_and_warns_every_run(monkeypatch, capsys):
    monkeypatch.setattr(sandbox, "_boundary_problem", lambda python: "bwrap is not installed (test)")
    with pytest.raises(SandboxUnavailable, match="allow_unsafe=True"):
        run_python("print(1)")
    for _ in range(2):
        result = run_python("print(1)", allow_unsafe=True)
        assert result.stdout == "1\n" and result.layers[0] == "NO OS isolation (bwrap is not installed (test))"
        assert "WARNING: sandbox: running untrusted code WITHOUT OS isolation" in capsys.readouterr().err


# --- the attacks of issue 15, against the real boundary (hook off or emptied) ---------------------


@pytest.fixture
def sleeper():
    """An unrelated process of ours that the sandboxed code will try to kill."""
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def test_signals_cannot_reach_our_processes(sleeper, python):
    code = f"""
import os, signal
for attempt in (lambda: os.kill({sleeper.pid}, 9), lambda: signal.pidfd_send_signal(os.pidfd_open({sleeper.pid}), 9),
                lambda: os.killpg({sleeper.pid}, 9), lambda: os.kill(-1, 9)):
    try:
        attempt()
        print("sent")
    except OSError as e:
        print("refused", type(e).__name__)
"""
    result = run_python(code, limits=NO_HOOK, python=python)
    assert result.stdout.count("refused ProcessLookupError") == 4, result  # even kill(-1): no process of ours exists in there
    time.sleep(0.2)
    assert sleeper.poll() is None  # still alive


@needs_boundary
def test_proc_shows_nothing_of_ours(monkeypatch):
    monkeypatch.setenv("SANDBOX_TEST_SECRET", "s3cr3t-value")
    me = os.getpid()
    code = f"""
import os
print(sorted(p for p in os.listdir('/proc') if p.isdigit()))
proc = os.open('/proc', os.O_RDONLY)
for path in ('{me}/environ', '{me}/mem', '{me}/cmdline'):
    for how in ('open', 'dir_fd'):
        try:
            fd = os.open('/proc/' + path, os.O_RDONLY) if how == 'open' else os.open(path, os.O_RDONLY, dir_fd=proc)
            print('READ', path, os.read(fd, 4096))
        except OSError as e:
            print('refused', path, how, type(e).__name__)
for pid in (p for p in os.listdir('/proc') if p.isdigit()):
    try:
        print('environ of', pid, open(f'/proc/{{pid}}/environ', 'rb').read())
    except OSError as e:
        print('refused environ of', pid, type(e).__name__)
"""
    result = run(code, limits=NO_HOOK)
    lines = result.stdout.splitlines()
    assert lines[0] in ("['1', '2']", "['1', '2', '3']"), result  # bwrap's init, us (maybe our reader): no process of ours
    assert "READ" not in result.stdout
    assert sum(line.startswith("refused ") and line.split()[1] != "environ" for line in lines) == 6
    assert "s3cr3t-value" not in result.stdout and "SANDBOX_TEST_SECRET" not in result.stdout


def test_nothing_outside_the_folder_can_be_created(tmp_path, python):
    (tmp_path / "keep.txt").write_text("unchanged")
    before = sorted(os.listdir(tmp_path))
    targets = [str(tmp_path / "x"), "/x", "/usr/x", "/tmp/x", "/dev/shm/x", "/proc/x", "/root/x"]
    code = f"""
import os, stat
targets = {targets!r}
open('inside', 'w').write('mine')
routes = {{
    'open': lambda t: open(t, 'w'),
    'os.open': lambda t: os.open(t, os.O_CREAT | os.O_WRONLY),
    'mkdir': lambda t: os.mkdir(t),
    'rename': lambda t: os.rename('inside', t),
    'link': lambda t: os.link('inside', t),
    'symlink': lambda t: os.symlink('/sandbox/inside', t),
    'mknod': lambda t: os.mknod(t, stat.S_IFREG | 0o644),
    'mkfifo': lambda t: os.mkfifo(t),
}}
for target in targets:
    for name, route in routes.items():
        try:
            route(target)
            print('CREATED', name, target)
        except OSError as e:
            print('refused', name, target, type(e).__name__)
print(os.listdir('.'))
"""
    result = run_python(code, limits=NO_HOOK, python=python)
    assert "CREATED" not in result.stdout, result.stdout
    assert result.stdout.count("refused") == len(targets) * 8
    assert sorted(os.listdir(tmp_path)) == before and (tmp_path / "keep.txt").read_text() == "unchanged"
    assert not os.path.exists("/x") and not os.path.exists("/tmp/x")


def test_clearing_the_hook_gains_nothing(tmp_path, python):
    marker = tmp_path / "marker"
    marker.write_text("before")
    code = CLEAR_HOOK + f"""
import os, socket, subprocess
print('id:', subprocess.run(['id', '-u'], capture_output=True, text=True).stdout.strip())
print('pid:', os.fork() > 0 or os._exit(0))
print('uid:', os.getuid(), os.geteuid())
status = open('/proc/self/status').read()
print('caps:', [line.split()[1] for line in status.splitlines() if line.startswith('CapEff')])
print('nnp:', [line.split()[1] for line in status.splitlines() if line.startswith('NoNewPrivs')])
for attempt in (lambda: os.setuid(0), lambda: open({str(marker)!r}, 'w').write('after'), lambda: open('/etc/shadow').read()):
    try:
        attempt()
        print('DID IT')
    except OSError as e:
        print('refused', type(e).__name__)
for address in (('1.1.1.1', 53), ('127.0.0.1', 9)):
    try:
        socket.create_connection(address, timeout=1)
        print('CONNECTED', address)
    except OSError as e:
        print('no network', e.errno)
print('interfaces:', sorted(line.split(':')[0].strip() for line in open('/proc/net/dev').readlines()[2:]))
"""
    result = run_python(code, limits=NO_HOOK, python=python)
    out, uid = result.stdout, inside_uid(result)
    assert f"id: {uid}" in out and f"uid: {uid} {uid}" in out and uid != "0", result  # it may fork now, as nobody
    assert "caps: ['0000000000000000']" in out and "nnp: ['1']" in out
    assert "DID IT" not in out and out.count("refused") == 3
    assert "CONNECTED" not in out and out.count("no network") == 2 and "interfaces: ['lo']" in out
    assert marker.read_text() == "before"


@needs_boundary
def test_a_setsid_grandchild_dies_with_the_episode():
    tag = f"sandbox-grandchild-{uuid.uuid4().hex}"
    code = CLEAR_HOOK + f"""
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.closerange(0, 3)  # a proper daemon: it holds none of our pipes
        os.execv('/usr/bin/sleep', [{tag!r}, '600'])
    os._exit(0)
time.sleep(0.3)  # let the grandchild start
print('parent exits')
"""
    result = run(code, limits=NO_HOOK)
    assert result.stdout == "parent exits\n", result

    def alive():
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:  # closed at once: -X dev counts every unclosed file
                    if tag.encode() in f.read():
                        found.append(pid)
            except OSError:
                pass
        return found

    assert alive() == []  # dead as soon as run_python returned, not a moment later
