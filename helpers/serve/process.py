"""Start the server (or the trainer) as a child process, as the tests, the simulation and the chapter do.

    with ServerProcess(store_path, adapter=None, extra=["--rate", "1000"]) as server:
        httpx.post(f"{server.url}/v1/chat/completions", json={...})
        server.kill()            # SIGKILL: what the durability test does mid-write
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from helpers.paths import ROOT


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServiceProcess:
    """``python -m helpers.serve <command> ...`` as a child process, its output in ``log``; stopped on exit."""

    def __init__(self, command: str, store: str | Path, extra: list[str] | None = None, log: str | Path | None = None):
        self.args = [sys.executable, "-m", "helpers.serve", command, "--store", str(store), *(extra or [])]
        self.log_path = Path(log) if log else Path(store).with_name(f"{command}.log")
        self.process: subprocess.Popen | None = None

    def start(self):
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log = open(self.log_path, "a")
        self.process = subprocess.Popen(self.args, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT,
                                        env={**os.environ, "PYTHONUNBUFFERED": "1"})
        return self

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL, no goodbye: nothing the process had not written is written."""
        if self.alive():
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()
        if self.process is not None:
            self.log.close()  # our end of its log file (closing twice, as stop() after kill() does, is fine)

    def stop(self, timeout: float = 10.0) -> None:
        if self.alive():
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.process is not None:
            self.log.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class ServerProcess(ServiceProcess):
    """The server on a free loopback port; ``start`` returns once ``/health`` answers."""

    def __init__(self, store: str | Path, adapter: str | None = None, extra: list[str] | None = None,
                 port: int | None = None, log: str | Path | None = None, admin_token: str = "sim-admin"):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.admin_token = admin_token
        args = ["--port", str(self.port), "--admin-token", admin_token, *(["--adapter", str(adapter)] if adapter else []), *(extra or [])]
        super().__init__("serve", store, args, log)

    def start(self, timeout: float = 300.0):
        import httpx  # optional (the 'serve' extra), as the server it talks to

        super().start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"the server exited with {self.process.returncode}; see {self.log_path}:\n"
                                   f"{self.log_path.read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self.stop()
        raise TimeoutError(f"the server did not answer /health within {timeout} s; see {self.log_path}")

    def admin(self, path: str, body: dict):
        import httpx  # optional (the 'serve' extra), as the server it talks to

        response = httpx.post(f"{self.url}/v1/admin/{path}", json=body, headers={"Authorization": f"Bearer {self.admin_token}"})
        response.raise_for_status()
        return response.json()
