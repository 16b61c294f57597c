"""Start the server (or the trainer) as a child process, as the tests, the simulation and the chapter do.

    with ServerProcess(store_path, adapter=None, extra=["--rate", "1000"]) as server:
        httpx.post(f"{server.url}/v1/chat/completions", json={...}, headers=server.auth("ann"))   # ann's key
        server.admin("world", {"items": ["key"]})                  # with the server's admin token
        server.kill()            # SIGKILL: what the durability test does mid-write

The server's admin token is a random one made here, handed over in the child's environment (``WORKBOOK_ADMIN_TOKEN``),
not on its command line, where ``ps`` shows it to every user of the machine; ``server.admin`` sends it.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from helpers.formats import parent_death_code, start_child
from helpers.paths import ROOT, in_repo
from helpers.serve.config import ADMIN_TOKEN_ENV
from helpers.serve.store import SQLiteStore


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServiceProcess:
    """``python -m helpers.serve <command> ...`` as a child process, its output in ``log``; stopped on exit."""

    def __init__(self, command: str, store: str | Path, extra: list[str] | None = None, log: str | Path | None = None,
                 env: dict[str, str] | None = None):
        self.arguments = [command, "--store", str(store), *(extra or [])]
        self.args = [sys.executable, "-m", "helpers.serve", *self.arguments]  # what it runs, as a command line
        self.store_path = Path(store)
        self.log_path = Path(log) if log else Path(store).with_name(f"{command}.log")
        self.env = env or {}  # added to this process's environment
        self.process: subprocess.Popen | None = None

    def start(self):
        """Start the child. It runs ``parent_death_code`` first, so it ends with this process however this one ends
        (SIGKILL, SIGTERM, a notebook kernel killed on restart), then ``python -m helpers.serve`` with the same arguments."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log = open(self.log_path, "a")
        run = parent_death_code() + "\nimport runpy\nrunpy.run_module('helpers.serve', run_name='__main__', alter_sys=True)\n"
        self.process = start_child([sys.executable, "-c", run, *self.arguments], cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env})
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
    """The server on a free loopback port; ``start`` returns once ``/health`` answers. ``admin_token`` None: a
    random one (module docstring); "": the admin routes off."""

    def __init__(self, store: str | Path, adapter: str | None = None, extra: list[str] | None = None,
                 port: int | None = None, log: str | Path | None = None, admin_token: str | None = None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.admin_token = secrets.token_urlsafe(32) if admin_token is None else admin_token
        args = ["--port", str(self.port), *(["--adapter", str(adapter)] if adapter else []), *(extra or [])]
        super().__init__("serve", store, args, log, env={ADMIN_TOKEN_ENV: self.admin_token})
        self.keys: dict[str, str] = {}  # user -> the key auth() made for them
        self.keys_lock = threading.Lock()  # auth() is called from many client threads at once

    def auth(self, user: str) -> dict[str, str]:
        """The ``Authorization`` header for ``user``: a key made in the server's store the first time (the server
        reads keys from the store, so it holds at once), the same key after that."""
        with self.keys_lock:
            if user not in self.keys:
                store = SQLiteStore(in_repo(self.store_path))  # where the server, run in the repository root, has it
                self.keys[user] = store.create_key(user)
                store.close()
            return {"Authorization": f"Bearer {self.keys[user]}"}

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
