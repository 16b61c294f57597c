"""CodeEnv: write a Python function, the tests decide (HumanEval-style).

    tasks = load_code_tasks()                    # data/code_tasks.jsonl, 22 small functions
    env = make_env("code")
    env.reset(tasks[0])                          # "Return the sum of a and b. ... def add(a, b) ..."
    result = env.step("```python\\ndef add(a, b):\\n    return a + b\\n```")
    result.reward, result.info["passed"], result.info["total"]        # 1.0, 4, 4

The policy's code is the last ```python block of its turn that defines the function
(else the last code block, else the whole text). It runs with the task's asserts in
a separate, limited process (``helpers.sandbox``: read its docstring for what that
does and does not protect against). Reward = fraction of asserts that pass: partial
credit gives GRPO a signal before the first fully correct program.

How the tests run: a small harness (``HARNESS`` below) is the sandboxed program. It
``exec``s the solution, then each assert in its own namespace with a per-test alarm
(``test_seconds``), and finally writes one JSON line of results to stdout, behind a
random token it read from stdin, so plain ``print`` output cannot be mistaken for it.

Verdicts in ``info["verdict"]``: ``"correct"`` (all pass), ``"tests_failed"``, ``"error"``
(the solution does not load: syntax error, exception, ``MemoryError``), ``"timeout"``,
``"output_limit"``, ``"no_answer"`` (empty turn). ``info["error"]`` holds the reason in
one line, ``info["failures"]`` the first failing asserts. The episode ends ``"answered"``
whatever the program did (a program that hangs is a bad *answer*, scored 0); only a
sandbox that cannot start ends it with ``"error"``.

With ``max_steps > 1`` a failed attempt is not final: the env answers with the test
report as a user message and the policy may try again (the reward is that of the
last attempt).

Simplifications, named:

* Asserts are the tests (no hidden test set); the task prompt shows the signature only.
* The harness runs in the same process as the solution, so determined code can forge
  results (e.g. by patching the harness through ``sys._getframe``). Fine for training
  small models; not for evaluating adversarial ones.
"""

from __future__ import annotations

import json
import re
import secrets
from pathlib import Path

from helpers.data import DatasetError, Task, read_jsonl
from helpers.envs.base import Env, StepResult
from helpers.paths import DATA
from helpers.sandbox import Limits, run_python

CODE_TASKS = DATA / "code_tasks.jsonl"
CODE_SYSTEM_PROMPT = (
    "You are a careful Python programmer. Write the complete function in one ```python code block. "
    "Use only the standard library; do not read input or print."
)
MAX_PREDICTED_CHARS = 4000  # the code kept in info["predicted"]

_CODE_BLOCK_RE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.S)

HARNESS = r'''
import json, os, signal, sys
token = sys.stdin.readline().strip()
with open("tests.json") as f:
    config = json.load(f)
with open("solution.py") as f:
    source = f.read()

class TestTimeout(BaseException):
    pass

def on_alarm(signum, frame):
    raise TestTimeout()

signal.signal(signal.SIGALRM, on_alarm)

def describe(e):
    if isinstance(e, TestTimeout):
        return f"timeout: took longer than {config['test_seconds']} s"
    if isinstance(e, MemoryError):
        return "MemoryError (the sandbox's memory limit)"
    return f"{type(e).__name__}: {e}"[:300]

namespace = {"__name__": "solution"}
load_error = None
try:
    signal.setitimer(signal.ITIMER_REAL, config["test_seconds"])
    exec(compile(source, "solution.py", "exec"), namespace)
except BaseException as e:  # SystemExit and KeyboardInterrupt too: the solution must not end the run
    load_error = describe(e)
finally:
    signal.setitimer(signal.ITIMER_REAL, 0)

results = []
for test in config["tests"]:
    if load_error is not None:
        results.append([False, "solution did not load: " + load_error])
        continue
    try:
        signal.setitimer(signal.ITIMER_REAL, config["test_seconds"])
        exec(compile(test, "test", "exec"), dict(namespace))
        results.append([True, None])
    except AssertionError:
        results.append([False, "assertion failed"])
    except BaseException as e:
        results.append([False, describe(e)])
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
os.write(1, ("\n" + token + json.dumps(results) + "\n").encode())  # os.write: works even if sys.stdout was replaced
'''


def extract_code(text: str, entry_point: str | None = None) -> str:
    """The program in a policy turn: the last code block defining ``entry_point``, else the last
    code block, else the whole text."""
    blocks = _CODE_BLOCK_RE.findall(text)
    if entry_point:
        defining = [b for b in blocks if re.search(rf"def\s+{re.escape(entry_point)}\s*\(", b)]
        if defining:
            return defining[-1].strip("\n")
    if blocks:
        return blocks[-1].strip("\n")
    return text.strip("\n")


def code_task(row: dict, where: str) -> Task:
    """One row of code_tasks.jsonl (entry_point, signature, description, tests, solution) as a Task."""
    missing = [k for k in ("id", "entry_point", "signature", "description", "tests") if k not in row]
    if missing:
        raise DatasetError(f"{where}: code task is missing {missing}")
    if not row["tests"] or not all(isinstance(t, str) for t in row["tests"]):
        raise DatasetError(f"{where}: 'tests' must be a non-empty list of assert statements")
    user = f"{row['description']}\n\nComplete this function:\n```python\n{row['signature']}\n```"
    prompt = [{"role": "system", "content": CODE_SYSTEM_PROMPT}, {"role": "user", "content": user}]
    metadata = {k: row[k] for k in ("entry_point", "signature", "description", "tests")}
    metadata["solution"] = row.get("solution")  # a reference solution, for checking the task itself; never shown
    return Task(row["id"], prompt, None, metadata)


def load_code_tasks(path: str | Path = CODE_TASKS) -> list[Task]:
    return [code_task(row, f"{path}, row {line_no}") for line_no, row in read_jsonl(path)]


def run_tests(code: str, tests: list[str], limits: Limits | None = None, test_seconds: float = 1.0, python: str | None = None) -> dict:
    """Run ``code`` and then each assert in ``tests`` in the sandbox.

    Returns ``passed``, ``total``, ``results`` (one ``[ok, error]`` per test), ``error`` (one
    line or None) and ``verdict``; see the module docstring.
    """
    limits = limits or Limits()
    token = secrets.token_hex(16)
    files = {"solution.py": code, "tests.json": json.dumps({"tests": tests, "test_seconds": test_seconds})}
    run = run_python(HARNESS, files=files, stdin=token + "\n", limits=limits, python=python)
    report = {"passed": 0, "total": len(tests), "results": None, "error": None, "verdict": None, "wall_time": round(run.wall_time, 3)}
    line = next((line for line in reversed(run.stdout.splitlines()) if line.startswith(token)), None)
    if line is not None:
        results = json.loads(line[len(token) :])
        report["results"] = results
        report["passed"] = sum(ok for ok, _ in results)
        errors = [error for ok, error in results if not ok]
        load_failed = bool(errors) and errors[0].startswith("solution did not load")
        if load_failed:
            report["error"] = errors[0]
        if report["passed"] == len(tests):
            report["verdict"] = "correct"
        elif load_failed:
            report["verdict"] = "timeout" if "did not load: timeout" in errors[0] else "error"
        else:
            report["verdict"] = "tests_failed"
        return report
    # no results line: the sandbox stopped the program, or it exited on its own before reporting
    if run.timed_out:
        report["verdict"], report["error"] = "timeout", run.error
    elif run.output_truncated:
        report["verdict"], report["error"] = "output_limit", run.error
    else:
        last = run.stderr.strip().splitlines()[-1:] or [""]
        reason = run.error or f"the program exited with code {run.returncode} before reporting results {last[0]}".strip()
        report["verdict"], report["error"] = "error", reason[:300]
    return report


class CodeEnv(Env):
    """Write a function; reward = fraction of the task's asserts that pass in the sandbox.

    Keyword arguments: ``max_steps`` (attempts, default 1), ``test_seconds`` (per assert),
    ``limits`` (``helpers.sandbox.Limits``), ``python`` (interpreter for the sandbox),
    ``max_observation_chars`` (cap on the feedback message).
    """

    name = "code"
    tools = None

    def __init__(self, max_steps: int = 1, test_seconds: float = 1.0, limits: Limits | None = None, python: str | None = None, max_observation_chars: int = 2000):
        super().__init__(max_steps=max_steps)
        self.test_seconds = test_seconds
        self.limits = limits or Limits()
        self.python = python
        self.max_observation_chars = max_observation_chars
        self.info.update(passed=0, total=0, error=None, failures=[])

    def reset(self, task: Task) -> list[dict]:
        if not task.metadata.get("tests"):
            raise ValueError(f"task {task.id!r} has no metadata['tests']; CodeEnv needs HumanEval-style tasks (see load_code_tasks)")
        messages = self._begin_episode(task)
        self.info.update(passed=0, total=len(task.metadata["tests"]), error=None, failures=[])
        return messages

    def step(self, action: str) -> StepResult:
        self._check_can_step()
        self.steps += 1
        text = action if isinstance(action, str) else str(action)
        tests = self.task.metadata["tests"]
        code = extract_code(text, self.task.metadata.get("entry_point"))
        if not code.strip():
            self.info.update(predicted=None, verdict="no_answer", correct=False, passed=0, error="no code found", failures=[])
            return self._after_attempt(reward=0.0)
        try:
            report = run_tests(code, tests, self.limits, self.test_seconds, self.python)
        except Exception as e:  # the sandbox itself failed (disk full, ...): not the policy's fault
            self.info.update(verdict="error", error=f"sandbox failed: {type(e).__name__}: {e}")
            return self._end("error")
        if report["error"] and report["error"].startswith("could not start"):
            self.info.update(verdict="error", error=report["error"])
            return self._end("error")
        failures = [f"{test}  ->  {error}" for test, (ok, error) in zip(tests, report["results"] or []) if not ok]
        self.info.update(
            predicted=code[:MAX_PREDICTED_CHARS],
            verdict=report["verdict"],
            correct=report["verdict"] == "correct",
            passed=report["passed"],
            error=report["error"],
            failures=failures[:3],
        )
        return self._after_attempt(reward=report["passed"] / report["total"])

    def _after_attempt(self, reward: float) -> StepResult:
        if self.info["correct"] or self.steps >= self.max_steps:
            return self._end("answered", reward=reward)
        feedback = f"{self.info['passed']}/{self.info['total']} tests passed."
        if self.info["error"]:
            feedback += f"\nError: {self.info['error']}"
        if self.info["failures"]:
            feedback += "\nFailing:\n" + "\n".join(self.info["failures"])
        feedback += "\nFix the function and send the complete code again."
        cap = self.max_observation_chars
        if len(feedback) > cap:
            feedback = feedback[:cap] + f"\n... [truncated: {len(feedback) - cap} more characters]"
        return StepResult([{"role": "user", "content": feedback}], 0.0, False, False, dict(self.info))
