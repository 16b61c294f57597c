"""A server process on a free loopback port, for the tests that talk to one over HTTP (OpenEnv's, vLLM's)."""

import os
import signal
import socket
import subprocess
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

from helpers.paths import ROOT


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def local_server(command: list[str], port: int, log_path: Path, start_timeout: float, name: str = "the server"):
    """Start ``command`` (which listens on ``port``), wait until ``/health`` answers, yield its URL, kill it after.

    Its log goes to ``log_path``, not a pipe: a server logs every closed session, and a pipe nobody reads would fill
    and stop it. A server that exits or does not answer within ``start_timeout`` seconds fails the test with its log.
    The server runs in a process group of its own, killed whole: vLLM's server starts its engine in child processes,
    which killing the server alone left running after pytest had exited (~1.4 GB of memory)."""

    def kill() -> None:  # SIGKILL: terminate would wait for open sessions to close
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:  # the group is gone already
            pass

    with open(log_path, "w+b") as log:
        process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=log, start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + start_timeout
        while True:
            try:
                urllib.request.urlopen(f"{url}/health", timeout=1)
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    kill()
                    log.seek(0)
                    pytest.fail(f"{name} did not start: {log.read().decode()[-3000:]}")
                time.sleep(0.5)
        try:
            yield url
        finally:
            kill()
            process.wait(timeout=30)
