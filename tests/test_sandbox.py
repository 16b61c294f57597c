"""The sandbox: hostile programs end within their limits with a clear error, and we survive."""

import os
import shutil
import time

import pytest

from helpers.sandbox import Limits, run_python

FAST = Limits(wall_seconds=3.0, cpu_seconds=2)


def test_normal_program():
    result = run_python("import sys\nprint(sum(range(10)))\nprint('warn', file=sys.stderr)", files={"data.txt": "x"})
    assert result.ok and result.stdout == "45\n" and result.stderr == "warn\n"
    assert result.returncode == 0 and result.error is None


def test_exit_code_and_exception_are_reported_not_raised():
    assert run_python("import sys; sys.exit(3)").returncode == 3
    result = run_python("1/0")
    assert result.returncode == 1 and "ZeroDivisionError" in result.stderr and not result.ok


def test_runs_isolated_in_an_empty_temporary_directory(monkeypatch):
    monkeypatch.setenv("SECRET_TOKEN", "hunter2")
    result = run_python("import os, sys\nprint(os.getcwd())\nprint(sorted(os.listdir('.')))\nprint(dict(os.environ))\nprint(sys.flags.isolated)")
    cwd, listing, environ, isolated = result.stdout.splitlines()
    assert "sandbox-" in cwd and not os.path.exists(cwd)  # deleted afterwards
    assert listing == "['main.py']"
    assert "hunter2" not in result.stdout and "SECRET_TOKEN" not in environ
    assert isolated == "1"


def test_infinite_loop_ends_at_the_wall_clock():
    start = time.monotonic()
    result = run_python("while True: pass", limits=Limits(wall_seconds=1.5, cpu_seconds=10))
    assert time.monotonic() - start < 4
    assert result.timed_out and result.error.startswith("timeout: still running after 1.5 s")


def test_cpu_limit_kills_a_busy_program():
    result = run_python("while True: pass", limits=Limits(wall_seconds=10, cpu_seconds=1))
    assert result.returncode < 0 and "SIGXCPU" in result.error and "CPU time limit" in result.error
    assert result.wall_time < 8


def test_allocating_10_gb_fails_with_memory_error():
    result = run_python("x = bytearray(10 * 1024**3)\nprint('allocated')", limits=FAST)
    assert "MemoryError" in result.stderr and "allocated" not in result.stdout
    assert result.wall_time < 3


def test_fork_bomb_is_contained_and_we_survive():
    pid = os.getpid()
    result = run_python("import os\nwhile True:\n    os.fork()", limits=FAST)
    assert "sandbox: os.fork is not allowed" in result.stderr
    for bypass in ["import subprocess", "import _posixsubprocess", "import multiprocessing", "import ctypes\nctypes.CDLL(None).fork()", "os.system('true')", "os.posix_spawn('/bin/true', ['true'], {})"]:
        result = run_python(f"import os\n{bypass}", limits=FAST)
        assert "PermissionError: sandbox:" in result.stderr, (bypass, result.stderr)
    assert os.getpid() == pid  # still us, still running


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("python3", path="/usr/bin"), reason="needs root and a system python the 'nobody' user can run")
def test_real_fork_bomb_under_an_unprivileged_user():
    """Without the audit hook, the OS layers hold: the child runs as nobody, where RLIMIT_NPROC binds."""
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    start = time.monotonic()
    result = run_python(code, python="/usr/bin/python3", limits=Limits(wall_seconds=2, cpu_seconds=2, max_processes=16, audit=False))
    assert result.user == "nobody"
    assert result.timed_out and time.monotonic() - start < 6


def test_writing_outside_the_temp_dir_is_refused(tmp_path):
    target = tmp_path / "escaped.txt"
    for code in [f"open({str(target)!r}, 'w').write('x')", f"import os\nos.open({str(target)!r}, os.O_CREAT | os.O_WRONLY)", "open('../escaped.txt', 'w')",
                 f"import os\nos.symlink({str(tmp_path)!r}, 'link')", f"import os\nos.remove({str(tmp_path)!r})"]:
        result = run_python(code, limits=FAST)
        assert "PermissionError: sandbox:" in result.stderr, (code, result.stderr)
    assert not target.exists() and tmp_path.exists()
    assert run_python("open('inside.txt', 'w').write('ok'); print(open('inside.txt').read())").stdout == "ok\n"


def test_reading_environment_variables_finds_nothing(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    result = run_python("import os\nprint(os.environ.get('OPENAI_API_KEY'))\nprint(open(f'/proc/{os.getppid()}/environ').read())", limits=FAST)
    assert result.stdout.splitlines()[0] == "None"
    assert "sk-secret" not in result.stdout
    assert "reading other processes' /proc entries is not allowed" in result.stderr


def test_printing_100_mb_is_cut_at_the_output_cap():
    start = time.monotonic()
    result = run_python("import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(100):\n    sys.stdout.write(chunk)", limits=Limits(output_bytes=1 << 20))
    assert time.monotonic() - start < 5
    assert result.output_truncated and result.error.startswith("output limit: more than 1048576 bytes on stdout")
    assert len(result.stdout) == 1 << 20


def test_big_files_hit_the_file_size_limit():
    result = run_python("open('big', 'wb').write(b'x' * (5 << 20))", limits=Limits(file_bytes=1 << 20))
    assert "File too large" in result.stderr


def test_network_and_signals_are_refused():
    assert "socket" in run_python("import socket\nsocket.create_connection(('127.0.0.1', 9))", limits=FAST).stderr
    assert "sandbox: os.kill is not allowed" in run_python("import os\nos.kill(os.getppid(), 9)", limits=FAST).stderr


def test_standard_library_only_unless_asked():
    assert "ModuleNotFoundError" in run_python("import transformers", limits=FAST).stderr
    assert run_python("import json, re, itertools; print('ok')", limits=FAST).stdout == "ok\n"
    assert run_python("import numpy; print('ok')", limits=Limits(site_packages=True)).stdout == "ok\n"
