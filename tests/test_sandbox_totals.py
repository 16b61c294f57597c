"""The sandbox's totals per episode, its user namespaces, a normal user's run, and what it leaves behind (issue 28).

Each attack runs against the real boundary with the audit hook off, as root (as CI and
Colab run) and, in ``test_a_normal_users_run``, as a normal user. Where the machine gives
us no cgroup, the memory totals cannot hold: those tests skip (fail in CI, as every
boundary test), and the fallback's own promises are tested with the cgroup switched off.
"""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from helpers import sandbox
from helpers.sandbox import Limits, run_python
from tests.test_sandbox import require_boundary

HOSTILE = dict(wall_seconds=8, cpu_seconds=6, audit=False)  # the hook off: only the OS layers hold
MB = 1 << 20
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def boundary():
    require_boundary()


@pytest.fixture
def cgroup():
    """The cgroup of layer 4: skip without one (fail in CI, which runs as root on a machine that has them)."""
    if not sandbox._cgroup_parents():
        message = "no cgroup can be made here: memory is bounded per process only (the fallback, tested below)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture
def no_cgroup(monkeypatch):
    """The fallback, on any machine: as where /sys/fs/cgroup is read-only (Colab, Docker)."""
    monkeypatch.setattr(sandbox, "_cgroup_parents", lambda: ())
    assert "no cgroup: memory bounded per process only" in sandbox.sandbox_layers()


# --- memory: all processes together, shared memory and files included ------------------------------

PROCESSES_200_MB = """
import os, time
for i in range(8):
    if os.fork() == 0:
        x = b"1" * (200 << 20)
        print("child", i, "holds 200 MB", flush=True)
        time.sleep(3)
        os._exit(0)
for i in range(8):
    os.wait()
"""

SYSV_SHARED_MEMORY = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
for i in range(12):  # 12 segments of 256 MB, each detached once filled: no address space holds them
    segment = libc.shmget(0, 256 << 20, 0o1600)
    address = libc.shmat(segment, None, 0)
    ctypes.memset(address, 1, 256 << 20)
    libc.shmdt(ctypes.c_void_p(address))
    print("holding", 256 * (i + 1), "MB of System V shared memory", flush=True)
"""

MEMFD = """
import os
files = []
for i in range(12):
    files.append(os.memfd_create("x"))
    os.write(files[-1], b"1" * (100 << 20))
    print("holding", 100 * (i + 1), "MB in memory files", flush=True)
"""


@pytest.mark.usefixtures("cgroup")
@pytest.mark.parametrize("code", [PROCESSES_200_MB, SYSV_SHARED_MEMORY, MEMFD], ids=["8 processes", "System V shm", "memfd"])
def test_memory_is_bounded_for_the_whole_episode(code):
    limits = Limits(**HOSTILE, memory_bytes=512 * MB, file_bytes=200 * MB)  # 512 MB per process too: only the total stops them
    result = run_python(code, limits=limits)
    assert result.error.startswith("memory limit: the episode's processes together used more than 512 MB"), result
    held = [int(line.split()[1]) for line in result.stdout.splitlines() if line.startswith("holding")]
    assert max(held, default=0) <= 512 and result.wall_time < 8, result


# --- disk: the files of /sandbox together ----------------------------------------------------------


def test_disk_is_bounded_for_the_whole_episode_and_nothing_reaches_ours():
    before = set(os.listdir(tempfile.gettempdir()))
    code = """
import os
written = 0
try:
    for i in range(100):
        with open(f"f{i}", "wb") as f:
            f.write(b"1" * (10 << 20))
        written += 1
except OSError as e:
    print(e.strerror)
print(written, sum(os.path.getsize(f) for f in os.listdir(".")))
"""
    result = run_python(code, limits=Limits(**HOSTILE, disk_bytes=32 * MB))
    reason, counts = result.stdout.splitlines()
    files, total = map(int, counts.split())
    assert reason == "No space left on device" and files == 3 and total <= 32 * MB, result
    assert set(os.listdir(tempfile.gettempdir())) == before  # the episode's folder is a tmpfs of its own


# --- processes and threads ----------------------------------------------------------------------------

FORK_BOMB = """
import os, threading, time
threading.stack_size(256 << 10)  # small stacks: the process count, not the address space, stops the threads
made = 0
for start in (lambda: os.fork() == 0 and (time.sleep(30), os._exit(0)), lambda: threading.Thread(target=time.sleep, args=(30,)).start()):
    try:
        while True:
            start()
            made += 1
    except (OSError, RuntimeError):
        pass
print(made, flush=True)
time.sleep(30)
"""

INNOCENT = """
import threading
threads = [threading.Thread(target=sum, args=([1],)) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("8 threads")
"""


def processes_and_threads_are_bounded_per_episode():
    """A fork-and-thread bomb stops at max_processes, and an episode running beside it still starts its threads."""
    limits = Limits(**HOSTILE, max_processes=16)
    hostile = {}
    bomb = threading.Thread(target=lambda: hostile.update(result=run_python(FORK_BOMB, limits=Limits(**{**HOSTILE, "wall_seconds": 4}, max_processes=16))))
    bomb.start()
    time.sleep(1.5)  # the bomb is at its limit by now
    innocent = run_python(INNOCENT, limits=limits)
    bomb.join()
    assert innocent.ok and innocent.stdout == "8 threads\n", innocent
    made = int(hostile["result"].stdout.split()[0])
    assert 8 <= made < 16, hostile["result"]  # bwrap's two processes and the launcher count too


@pytest.mark.usefixtures("cgroup")
def test_processes_and_threads_are_bounded_per_episode():
    processes_and_threads_are_bounded_per_episode()


@pytest.mark.usefixtures("no_cgroup")
def test_without_a_cgroup_processes_are_still_bounded_per_episode():
    """RLIMIT_NPROC counts per uid: each episode has its own (as root) or its own user namespace."""
    processes_and_threads_are_bounded_per_episode()


@pytest.mark.usefixtures("no_cgroup")
def test_without_a_cgroup_memory_is_bounded_per_process():
    result = run_python("x = bytearray(600 << 20)", limits=Limits(**HOSTILE, memory_bytes=512 * MB))
    assert "MemoryError" in result.stderr, result


# --- wall time, nested namespaces -----------------------------------------------------------------------


def test_the_wall_timeout_holds_when_stdin_is_never_read():
    """It returned after 25 s when stdin was a pipe we wrote (issue 28); now stdin is a file in memory."""
    start = time.monotonic()
    result = run_python("import time; time.sleep(60)", stdin="x" * 200_000, limits=Limits(wall_seconds=2))
    assert result.timed_out and time.monotonic() - start < 4, result
    assert run_python("import sys; print(len(sys.stdin.read()))", stdin="x" * 200_000).stdout == "200000\n"


def test_no_new_user_namespaces_inside():
    code = """
import ctypes, os, subprocess, threading
done = subprocess.run(["unshare", "-Urm", "id", "-u"], capture_output=True, text=True)
print("unshare:", done.returncode, done.stdout.strip(), done.stderr.strip())
libc = ctypes.CDLL(None, use_errno=True)
print("unshare(CLONE_NEWUSER):", libc.unshare(0x10000000), os.strerror(ctypes.get_errno()))
threads = [threading.Thread(target=print, args=("thread",)) for _ in range(2)]  # clone3 answers ENOSYS: threads fall back to clone
[t.start() for t in threads]
[t.join() for t in threads]
print("fork:", os.wait()[1] if os.fork() else os._exit(0))
"""
    result = run_python(code, limits=Limits(**HOSTILE))
    lines = result.stdout.splitlines()
    assert lines[0] == "unshare: 1  unshare: unshare failed: Operation not permitted", result
    assert lines[1] == "unshare(CLONE_NEWUSER): -1 Operation not permitted"
    assert lines[2:] == ["thread", "thread", "fork: 0"], result


# --- a normal user's run ------------------------------------------------------------------------------

NORMAL_USER = """
import os, sys, tempfile
sys.path.insert(0, {repo!r})
from helpers import sandbox
from helpers.sandbox import Limits, run_python

layers = sandbox.sandbox_layers()
print("layers:", layers[0], "|", layers[3])
result = run_python("import os; print(os.getuid(), os.getcwd())")
print("inside:", result.stdout.strip(), result.user)
result = run_python("import subprocess; print(subprocess.run(['unshare', '-Urm', 'true']).returncode)", limits=Limits(audit=False))
print("unshare:", result.stdout.strip())
# bwrap's / and /dev are tmpfs that belong to the code's uid in a user namespace: read-only, so /sandbox is the one place
write = "for path in ('/x', '/dev/shm/y', '/dev/z', '/sandbox/ok', '/dev/null'):\\n    try:\\n        open(path, 'w').write('x')\\n        print(path)\\n    except OSError:\\n        pass"
print("writable:", run_python(write, limits=Limits(audit=False)).stdout.split())
# RLIMIT_NPROC counts the episode's user namespace only, not our user's 25 processes
import subprocess
outside = [subprocess.Popen(["sleep", "30"]) for _ in range(24)]
result = run_python({innocent!r}, limits=Limits(max_processes=16))
print("threads:", result.stdout.strip())
for process in outside:
    process.kill()
# without the boundary: a folder in the temp directory, which the code makes hard to delete
code = "import os; os.makedirs('a/b'); open('a/b/f', 'w').write('x'); os.chmod('a/b', 0o500); os.chmod('a', 0o500); print('locked')"
sandbox._boundary_problem.cache_clear()
sandbox._boundary_problem = lambda python: "switched off for this test"
result = run_python(code, limits=Limits(audit=False), allow_unsafe=True)
print("unsafe:", result.stdout.strip(), [name for name in os.listdir(tempfile.gettempdir()) if name.startswith(sandbox._owner())])
"""


def others_may_reach(path: Path) -> bool:
    """Whether a user who owns nothing here may reach ``path``: every folder above it lets others in (o+x)."""
    return all(folder.stat().st_mode & 0o001 for folder in path.resolve().parents) and bool(path.resolve().stat().st_mode & 0o001)


def interpreter_for(uid: int) -> str:
    """An interpreter that user ``uid`` may run: ours, unless a parent folder shuts others out (pyenv under /root)."""
    for python in (sys.executable, "/usr/bin/python3"):
        if others_may_reach(Path(python)):
            return python
    pytest.fail("no interpreter here that a normal user may run")


@pytest.fixture
def helpers_for_others():
    """A folder holding ``helpers`` that any user may read: the clone, or, where a folder above it shuts others out
    (a clone under mktemp's 0700), a copy of the package in /tmp, readable by all whatever the umask, removed after."""
    if others_may_reach(REPO):
        yield REPO
        return
    folder = Path(tempfile.mkdtemp(prefix="workbook-normal-user-", dir="/tmp"))
    try:
        shutil.copytree(REPO / "helpers", folder / "helpers", ignore=shutil.ignore_patterns("__pycache__"))
        for path in [folder, *folder.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        yield folder
    finally:
        shutil.rmtree(folder)


@pytest.mark.skipif(os.geteuid() != 0, reason="run as a normal user already: the whole suite is this test")
def test_a_normal_users_run(tmp_path, helpers_for_others):
    """Root runs the suite in CI; the normal user's path (a user namespace, no cgroup) runs here as uid 54321."""
    tmp_path.chmod(0o777)
    python = interpreter_for(54321)
    done = subprocess.run([python, "-c", NORMAL_USER.format(repo=str(helpers_for_others), innocent=INNOCENT)], user=54321, group=54321, extra_groups=[], capture_output=True,
                          text=True, timeout=120, env={"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path)}, cwd=tmp_path)
    lines = done.stdout.splitlines()
    assert lines[0] == "layers: namespaces (user namespace, pid, net, ipc, uts, mount) by bwrap | no cgroup: memory bounded per process only", done
    assert lines[1] == "inside: 65534 /sandbox uid 65534 in a user namespace", done
    assert lines[2] == "unshare: 1", done
    assert lines[3] == "writable: ['/sandbox/ok', '/dev/null']", done
    assert lines[4] == "threads: 8 threads", done
    assert lines[5] == "unsafe: locked []", done  # its folder, chmod 0500 inside, is gone


# --- nothing left behind when the trainer is killed ------------------------------------------------------

TRAINER = """
import sys
sys.path.insert(0, {repo!r})
from helpers import sandbox
if {unsafe}:  # no boundary: the episode runs in a folder of the temp directory
    sandbox._boundary_problem = lambda python: "switched off for this test"
sandbox.run_python("import os, time; os.makedirs('a'); os.chmod('a', 0o500); time.sleep({seconds})",
                   limits=sandbox.Limits(wall_seconds=60, audit=False), allow_unsafe=True)
"""


def leftovers(pid: int, folders: list[str]) -> list[str]:
    """What a trainer of process id ``pid`` has made in ``folders`` (cgroups, unsafe folders)."""
    return [os.path.join(folder, name) for folder in folders for name in os.listdir(folder) if name.startswith(f"sandbox-{pid}-")]


def kill_a_trainer_mid_episode(folders: list[str], unsafe: bool, seconds: float, env=None) -> list[str]:
    """Start a trainer whose episode sleeps ``seconds``, ``kill -9`` it once its leftovers exist; return them."""
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER.format(repo=str(REPO), unsafe=unsafe, seconds=seconds)], env=env)
    deadline = time.monotonic() + 30
    while not leftovers(trainer.pid, folders) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # the episode has started
    trainer.send_signal(signal.SIGKILL)
    trainer.wait()
    return leftovers(trainer.pid, folders)


@pytest.mark.usefixtures("cgroup")
def test_a_killed_trainers_cgroups_are_cleared_by_the_next_run():
    folders = sorted({parent for parent, _ in sandbox._cgroup_parents()})
    left = kill_a_trainer_mid_episode(folders, unsafe=False, seconds=60)
    assert left, "the killed trainer's cgroups should still be there"
    for _ in range(100):  # its namespace dies with it (bwrap --die-with-parent): the cgroups empty
        if all(not Path(folder, "cgroup.procs").read_text() for folder in left):
            break
        time.sleep(0.05)
    assert sandbox._clear_stale.__wrapped__() >= len(left)  # what the next run does first
    assert not any(os.path.exists(folder) for folder in left)


def test_a_killed_unsafe_trainers_folder_is_cleared_and_only_that(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    left = kill_a_trainer_mid_episode([str(tmp_path)], unsafe=True, seconds=0.5, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert len(left) == 1 and os.path.isdir(left[0])
    gone = subprocess.Popen(["true"])
    gone.wait()
    keep = [tmp_path / f"{sandbox._owner()}99", tmp_path / "sandbox-abc", tmp_path / "sandbox-x-y-z", tmp_path / "not-ours"]
    stale = tmp_path / f"sandbox-{gone.pid}-12345-0"  # a process that is gone
    for folder in [*keep, stale]:
        folder.mkdir()
    time.sleep(0.6)  # the orphaned episode (no namespace without the boundary) has ended
    assert sandbox._clear_stale.__wrapped__() >= 2  # and the killed trainer's cgroups, where there are some
    assert sorted(os.listdir(tmp_path)) == sorted(folder.name for folder in keep)


def test_a_folder_the_code_locked_is_removed(tmp_path):
    """As a normal user, a chmod 0500 subfolder defeated rmtree(ignore_errors=True); ``test_a_normal_users_run`` runs it so."""
    folder = tmp_path / "sandbox-1-2-3"
    (folder / "a" / "b").mkdir(parents=True)
    (folder / "a" / "b" / "f").write_text("x")
    os.symlink("/usr", folder / "a" / "link")  # a link is deleted, never followed
    for locked, mode in [(folder / "a" / "b", 0o500), (folder / "a", 0o000), (folder, 0o500)]:
        locked.chmod(mode)
    assert sandbox._remove_folder(str(folder)) and not folder.exists()
    assert os.stat("/usr").st_mode & 0o777 == 0o755
