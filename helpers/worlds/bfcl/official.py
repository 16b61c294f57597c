"""BFCL's own code in an environment of its own: made on first use, called through a subprocess with JSON.

    python = ensure_venv()                      # ~/.cache/agentic-rl-workbook/bfcl-venv (BFCL_VENV to move it)
    call("judge", category="simple_python", results=[{"id": "simple_python_0", "result": "<tool_call>..."}])
    call("judge", model="Qwen/Qwen3-8B", ...)   # the results decoded by another BFCL model's handler
    bfcl_evaluate({"simple_python": [...]})     # BFCL's own command line on the same results, offline
    bfcl_evaluate({...}, model="Qwen/Qwen3-8B") # as `bfcl evaluate --model Qwen/Qwen3-8B`

Why an environment of its own: ``bfcl-eval``'s checkers import its model-config table, which imports
every provider's handler, which import their SDKs (anthropic, cohere, mistralai, google-genai,
qwen-agent, boto3, writer, ...), with pins that clash with the workbook's (numpy 1.26.4 against
numpy 2, tree_sitter 0.21.3, filelock 3.20.0). Installed next to the workbook they would break it;
rewritten here they would no longer be BFCL's checker. So the workbook installs ``bfcl-eval`` once
into a venv of its own and runs BFCL's functions there (``worker.py``, one long-lived process per
workbook process, one JSON line per request).

What the venv gets (about half a gigabyte, built once): ``bfcl-eval==VERSION`` with
``--no-deps``, then ``REQUIREMENTS``: bfcl-eval's own requirements with its own version specifiers,
less the ones only model inference, the memory categories and web search import
(sentence-transformers, which pulls in torch, faiss-cpu, rank_bm25, google-search-results,
html2text, beautifulsoup4, networkx; its extras vllm and wandb are left out too), plus soundfile,
which qwen-agent imports without declaring it. With all of bfcl-eval's requirements the venv would
also hold torch (GBs); the checkers, the data and the simulators of the categories the workbook
supports never import them.

``bfcl evaluate`` (its command line) runs offline: it reads the result files and the data that
ship in the package, calls no API and needs no key (a missing ``.env`` is only a warning). It writes
under ``BFCL_PROJECT_ROOT``, which ``bfcl_evaluate`` points at a temporary folder.

The workbook's main venv never imports ``bfcl_eval``: its data files are JSON read through the
worker (``entries``), with BFCL's own loaders.

Simplification, named: the multi-turn checker and BFCL's simulators run the model's calls with
``eval`` (BFCL's design), in the worker process: a separate process, not a sandbox. The workbook
only sends it calls of the simulators' own functions with JSON arguments
(``helpers.worlds.bfcl.env``) or files of results a user gives it, as ``bfcl evaluate`` would.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

VERSION = "2026.3.23"  # bfcl-eval, BFCL v4: the data, the checkers and the simulators this world was checked against
MODEL = "Qwen/Qwen3-0.6B-FC"  # the model whose handler decodes results: it reads Qwen's <tool_call> JSON, the format every workbook model writes
REQUIREMENTS = [  # bfcl-eval's own requirements (its specifiers) that its checkers import, and soundfile (see the docstring)
    "numpy==1.26.4", "pandas", "tqdm", "requests", "filelock==3.20.0", "python-dotenv>=1.0.1", "typer>=0.12.5",
    "tabulate>=0.9.0", "overrides", "tenacity>=8.5.0", "mpmath==1.3.0", "tree_sitter==0.21.3", "tree-sitter-java==0.21.0",
    "tree-sitter-javascript==0.21.4", "openai>=1.86.0", "anthropic>=0.75.0", "mistralai==1.7.0", "cohere==5.18.0",
    "google-genai>=1.52.0", "writer-sdk>=2.1.0", "boto3", "qwen-agent", "datamodel-code-generator==0.25.7", "huggingface_hub",
    "pydantic>=2.8.2", "soundfile",
]
WORKER = Path(__file__).with_name("worker.py")


def venv_dir() -> Path:
    """Where the environment lives: ``$BFCL_VENV``, else ``~/.cache/agentic-rl-workbook/bfcl-venv``."""
    return Path(os.environ.get("BFCL_VENV") or Path.home() / ".cache" / "agentic-rl-workbook" / "bfcl-venv")


def venv_python() -> Path:
    return venv_dir() / "bin" / "python"


def ensure_venv(quiet: bool = True) -> Path:
    """The environment's Python, made first if it is not there yet (about a minute; once per machine).

    A file lock keeps two processes from building it at once; a marker written last (the version and
    the requirements) says it is complete, so a build that was killed is started again from scratch.
    """
    root = venv_dir()
    marker = root / "workbook-complete.json"
    wanted = {"bfcl-eval": VERSION, "requirements": REQUIREMENTS}
    if marker.is_file() and json.loads(marker.read_text()) == wanted:
        return venv_python()
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / (root.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it: wait, then look again
        if marker.is_file() and json.loads(marker.read_text()) == wanted:
            return venv_python()
        shutil.rmtree(root, ignore_errors=True)
        print(f"bfcl: making BFCL's own environment in {root} (bfcl-eval=={VERSION}; about a minute, once)", file=sys.stderr)
        started = time.time()
        pip = [str(root / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check"] + (["-q"] if quiet else [])
        for command in ([sys.executable, "-m", "venv", str(root)], pip + ["--no-deps", f"bfcl-eval=={VERSION}"], pip + REQUIREMENTS):
            run = subprocess.run(command, capture_output=True, text=True)
            if run.returncode != 0:
                raise RuntimeError(f"bfcl: making {root} failed at `{' '.join(command[:6])} ...`:\n{(run.stderr or run.stdout)[-2000:]}")
        marker.write_text(json.dumps(wanted))
        print(f"bfcl: environment ready in {time.time() - started:.0f} s", file=sys.stderr)
    return venv_python()


class Worker:
    """One ``worker.py`` process in the environment, started on the first request; one request at a time.
    ``model``: the BFCL model whose handler decodes the results it judges (``bfcl evaluate --model``'s)."""

    def __init__(self, model: str = MODEL):
        self.model = model
        self.process: subprocess.Popen | None = None
        self.log = None
        self.lock = threading.Lock()

    def start(self) -> None:
        python = ensure_venv()
        self.log = tempfile.TemporaryFile("w+")  # BFCL's own prints and warnings; its tail is shown if the worker dies
        self.process = subprocess.Popen([str(python), str(WORKER), self.model], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self.log, text=True, bufsize=1)

    def request(self, op: str, **arguments) -> object:
        """``op``'s value; a ``RuntimeError`` with BFCL's message when it raised there."""
        with self.lock:
            if self.process is None or self.process.poll() is not None:
                self.start()
            self.process.stdin.write(json.dumps({"op": op, **arguments}) + "\n")
            self.process.stdin.flush()
            line = self.process.stdout.readline()
        if not line:
            self.log.seek(0)
            raise RuntimeError(f"bfcl: the worker process ended (exit code {self.process.wait()}) during {op!r}:\n{self.log.read()[-3000:]}")
        answer = json.loads(line)
        if not answer["ok"]:
            raise RuntimeError(f"bfcl {op}: {answer['error']}\n{answer.get('traceback', '')}")
        return answer["value"]

    def close(self) -> None:
        """End the worker (its loop ends when its stdin closes), then close its output pipe and its log."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.stdin.close()
            self.process.wait(timeout=10)
        self.process.stdout.close()
        self.log.close()


_WORKERS: dict[str, Worker] = {}  # model -> its worker: one process per handler this process has asked for


def _close_workers() -> None:
    for worker in _WORKERS.values():
        worker.close()


atexit.register(_close_workers)


def call(op: str, model: str = MODEL, **arguments) -> object:
    """One request to this process's worker for ``model`` (whose handler decodes results):
    ``call("entries", category="simple_python")``. A model BFCL does not know is a ``RuntimeError`` naming it."""
    if model not in _WORKERS:
        _WORKERS[model] = Worker(model)
    return _WORKERS[model].request(op, **arguments)


def bfcl_evaluate(results: dict[str, list[dict]], timeout: float = 600, model: str = MODEL) -> dict[str, dict]:
    """BFCL's own ``bfcl evaluate --model <model>`` on ``{category: result entries}``, offline, in a temporary
    project folder: ``{category: {"accuracy", "correct_count", "total_count"}}``, read from the score files it writes.

    The results are written where it looks for them (``result/<model>/.../BFCL_v4_<category>_result.json``,
    under ``BFCL_PROJECT_ROOT``), and it runs with ``--partial-eval`` only when a file holds fewer entries
    than the category (without it, it refuses such a file)."""
    ensure_venv()
    sizes = {category: len(call("entries", category=category)["prompts"]) for category in results}
    with tempfile.TemporaryDirectory(prefix="bfcl-evaluate-") as root:
        folder = Path(root) / "result" / model.replace("/", "_")
        for category, entries in results.items():
            path = folder / category / f"BFCL_v4_{category}_result.json"  # any depth: the runner finds them with rglob
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(json.dumps(entry) + "\n" for entry in entries))
        partial = any(len(entries) < sizes[category] for category, entries in results.items())
        command = [str(venv_dir() / "bin" / "bfcl"), "evaluate", "--model", model, "--test-category", ",".join(results)]
        run = subprocess.run(command + (["--partial-eval"] if partial else []), capture_output=True, text=True, timeout=timeout,
                             env={**os.environ, "BFCL_PROJECT_ROOT": root}, cwd=root)
        if run.returncode != 0:
            raise RuntimeError(f"bfcl evaluate failed (exit code {run.returncode}):\n{(run.stderr or run.stdout)[-3000:]}")
        scores = {}
        for category in results:
            files = list((Path(root) / "score").rglob(f"BFCL_v4_{category}_score.json"))
            if len(files) != 1:
                raise RuntimeError(f"bfcl evaluate wrote {len(files)} score files for {category}:\n{run.stdout[-2000:]}")
            header = json.loads(files[0].read_text().splitlines()[0])
            scores[category] = {key: header[key] for key in ("accuracy", "correct_count", "total_count")}
        return scores
