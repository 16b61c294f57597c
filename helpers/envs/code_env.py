"""CodeEnv: write a Python function, the tests decide (HumanEval-style).

    tasks = load_code_tasks()                    # data/code_tasks.jsonl, 22 small functions
    env = make_env("code")                       # Episode(CodeEnv()): the adapter calls CodeEnv._judge on the final turn
    env.reset(tasks[0])                          # "Return the sum of a and b. ... def add(a, b) ..."
    result = env.step("```python\\ndef add(a, b):\\n    return a + b\\n```")
    result.reward, result.info["passed"], result.info["total"]        # 1.0, 4, 4

The policy's code is the last ```python block of its turn that defines the function
(else the last code block, else the whole text). Reward = fraction of the task's
tests that pass: partial credit gives GRPO a signal before the first fully correct
program.

Who judges: a policy that is paid for passing tests will, given time, learn to fake a
pass instead of earning one. So the solution never judges itself:

* A test is one call with literal arguments and a literal expected value,
  ``assert add(1, 2) == 3`` or ``assert is_even(7) is False`` (``parse_test``; a task
  file with any other shape is rejected when it is loaded).
* Inside the sandbox (``helpers.sandbox``: read its docstring for what it contains),
  a small harness (``HARNESS``) loads the solution and makes the calls, each with a
  per-call alarm (``test_seconds``). It receives the function name and the arguments
  only; the expected values never enter the sandbox, and nothing of the task file is
  mounted there, so there is nothing to peek at.
* Each return value leaves the sandbox as JSON text. Out here, the judge decodes it
  into plain Python data (None, bool, int, float, str, list, dict) and compares it with
  the expected value (after the same JSON round trip). An object whose ``__eq__`` is
  always true cannot be written as JSON, so it fails; a forged report of the harness is
  just a list of claimed return values, judged like real ones, so it fails unless the
  values are right.

Verdicts in ``info["verdict"]``: ``"correct"`` (all pass), ``"tests_failed"``, ``"error"``
(the solution does not load: syntax error, exception, ``MemoryError``; or the report is
missing or malformed), ``"timeout"``, ``"output_limit"``, ``"no_answer"`` (empty turn).
``info["error"]`` holds the reason in one line, ``info["failures"]`` the first failing
tests. The episode ends ``"answered"`` whatever the program did (a program that hangs
is a bad *answer*, scored 0); only a sandbox that cannot start ends it with ``"error"``.

With ``max_steps > 1`` (the adapter's limit) a failed attempt is not final: the env answers
with the test report as a user message and the policy may try again (the reward is that of
the last attempt).

In TRL the class has no tools and no ``get_reward``, so TRL never shows it the final text: there
the tests would run in a reward function on the completion. The ``_judge`` hook is this
workbook's way to judge a final turn inside the env.

Parsing the turn is linear in its length (``helpers.formats.code_blocks``); the run is
bounded by the sandbox's limits.

Simplifications, named:

* The tests are the task's visible asserts (no hidden test set); the prompt shows the
  description and the signature, not the asserts, but the multi-turn feedback quotes the
  failing asserts, which a later attempt could special-case.
* Positional literal arguments only, compared with ``==`` or ``is``. JSON has no tuples,
  sets or int dict keys: ``(1, 2)`` equals ``[1, 2]`` here, and a function returning a
  set fails.
* The arguments are visible to the solution (it has to compute on them).

Taught in notebooks/02_environment.ipynb.
"""

from __future__ import annotations

import ast
import json
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

from helpers.data import DatasetError, Task, check_unique_ids, read_jsonl
from helpers.formats import code_blocks
from helpers.paths import DATA
from helpers.sandbox import Limits, require_isolation, run_python

CODE_TASKS = DATA / "code_tasks.jsonl"
CODE_SYSTEM_PROMPT = (
    "You are a careful Python programmer. Write the complete function in one ```python code block. "
    "Use only the standard library; do not read input or print."
)
MAX_PREDICTED_CHARS = 4000  # the code kept in info["predicted"]
PLAIN_DATA = "None, bool, int, float, str, list, dict"

# The sandboxed program. It reads one JSON line on stdin (the token, the calls, the
# per-call seconds) before the solution exists in its namespace, and writes one line:
# the token, then [[returned, json_text_or_error], ...]. The token keeps ordinary
# prints apart from the report; it is no secret from the solution, and need not be.
HARNESS = r'''
import ast, json, os, signal, sys
request = json.loads(sys.stdin.readline())
token, seconds = request["token"], request["seconds"]
calls = [(name, [ast.literal_eval(arg) for arg in args]) for name, args in request["calls"]]
del request
with open("solution.py", "rb") as f:  # bytes: compile() decodes them; text that is not UTF-8 is then the solution's SyntaxError
    source = f.read()

class TestTimeout(BaseException):
    pass

def on_alarm(signum, frame):
    raise TestTimeout()

signal.signal(signal.SIGALRM, on_alarm)

def describe(e):
    if isinstance(e, TestTimeout):
        return f"timeout: took longer than {seconds} s"
    if isinstance(e, MemoryError):
        return "MemoryError (the sandbox's memory limit)"
    return f"{type(e).__name__}: {e}"[:300]

namespace = {"__name__": "solution"}
load_error = None
try:
    signal.setitimer(signal.ITIMER_REAL, seconds)
    exec(compile(source, "solution.py", "exec"), namespace)
except BaseException as e:  # SystemExit and KeyboardInterrupt too: the solution must not end the run
    load_error = describe(e)
finally:
    signal.setitimer(signal.ITIMER_REAL, 0)

results = []
for name, args in calls:
    if load_error is not None:
        results.append([False, "solution did not load: " + load_error])
        continue
    try:
        signal.setitimer(signal.ITIMER_REAL, seconds)
        function = namespace.get(name)
        if not callable(function):
            raise NameError(f"the solution defines no function {name!r}")
        value = function(*args)
        try:
            results.append([True, json.dumps(value)])
        except (TypeError, ValueError, RecursionError):
            results.append([False, f"returned a {type(value).__name__}, not plain data ({PLAIN_DATA})"])
    except BaseException as e:
        results.append([False, describe(e)])
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
os.write(1, ("\n" + token + json.dumps(results) + "\n").encode())  # os.write: works even if sys.stdout was replaced
'''.replace("{PLAIN_DATA}", PLAIN_DATA)


@dataclass(frozen=True)
class CodeTest:
    """One test, parsed: ``function(*arguments) <op> expected``; ``arguments`` are literal source texts."""

    source: str  # the assert as written in the task file
    function: str
    arguments: tuple[str, ...]
    op: str  # "==" or "is"
    expected: object  # plain data, after a JSON round trip

    def judge(self, returned: object) -> bool:
        return returned is self.expected if self.op == "is" else returned == self.expected


def parse_test(source: str) -> CodeTest:
    """``"assert f(1, [2]) == 3"`` -> CodeTest; ``ValueError`` saying what is wrong with any other shape."""
    try:
        return _parse_test(source)
    except (RecursionError, MemoryError):  # Python's parser and ast helpers recurse: a test nested thousands deep exhausts them
        raise ValueError(f"a test must be plain Python literals; {source[:60]!r}... is nested too deeply to read") from None


def _parse_test(source: str) -> CodeTest:
    shape = "a test must read 'assert f(literal, ...) == literal' or 'assert f(...) is True/False/None'"
    try:
        (node,) = ast.parse(source).body
    except (SyntaxError, ValueError):
        raise ValueError(f"{shape}; {source!r} is not one Python statement") from None
    compare = node.test if isinstance(node, ast.Assert) else None
    if not (isinstance(compare, ast.Compare) and len(compare.ops) == 1 and isinstance(compare.ops[0], (ast.Eq, ast.Is))
            and isinstance(compare.left, ast.Call) and isinstance(compare.left.func, ast.Name) and not compare.left.keywords):
        raise ValueError(f"{shape}, got {source!r}")
    call, op = compare.left, "is" if isinstance(compare.ops[0], ast.Is) else "=="
    try:
        for arg in call.args:
            ast.literal_eval(arg)
        expected = ast.literal_eval(compare.comparators[0])
        expected = json.loads(json.dumps(expected))  # the same round trip the returned value takes
    except (ValueError, TypeError, SyntaxError):
        raise ValueError(f"{shape}: arguments and expected value must be literals, and the expected value JSON data; got {source!r}") from None
    if op == "is" and expected not in (True, False, None):
        raise ValueError(f"{shape}: 'is' compares with True, False or None only; got {source!r}")
    return CodeTest(source, call.func.id, tuple(ast.unparse(arg) for arg in call.args), op, expected)


def extract_code(text: str, entry_point: str | None = None) -> str:
    """The program in a policy turn: the last code block defining ``entry_point``, else the last
    code block, else the whole text."""
    blocks = code_blocks(text)
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
    for key in ("id", "entry_point", "signature", "description"):  # text for the prompt: null would print as "None"
        if not isinstance(row[key], str) or not row[key].strip():
            raise DatasetError(f"{where}: {key!r} must be a non-empty string, got {type(row[key]).__name__} {str(row[key])[:60]!r}")
    tests = row["tests"]
    if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
        raise DatasetError(f"{where}: 'tests' must be a non-empty list of assert strings, got {type(tests).__name__} {str(tests)[:60]!r}")
    for i, test in enumerate(tests):
        try:
            parsed = parse_test(test)
        except ValueError as e:
            raise DatasetError(f"{where}: test {i}: {e}") from None
        if parsed.function != row["entry_point"]:
            raise DatasetError(f"{where}: test {i} calls {parsed.function!r}, not the entry point {row['entry_point']!r}")
    user = f"{row['description']}\n\nComplete this function:\n```python\n{row['signature']}\n```"
    prompt = [{"role": "system", "content": CODE_SYSTEM_PROMPT}, {"role": "user", "content": user}]
    metadata = {k: row[k] for k in ("entry_point", "signature", "description", "tests")}
    metadata["solution"] = row.get("solution")  # a reference solution, for checking the task itself; never shown
    return Task(row["id"], prompt, None, metadata)


def load_code_tasks(path: str | Path = CODE_TASKS) -> list[Task]:
    tasks = [code_task(row, f"{path}, row {line_no}") for line_no, row in read_jsonl(path)]
    check_unique_ids(tasks, str(path))
    return tasks


def _returned_values(stdout: str, token: str, n: int) -> list[list] | None:
    """The harness's report, ``[[returned, text], ...]`` for ``n`` calls, or None if missing or malformed.

    The report is untrusted text: JSON nested too deep or with huge integers is refused
    like any other malformed report.
    """
    line = next((line for line in reversed(stdout.splitlines()) if line.startswith(token)), None)
    if line is None:
        return None
    try:
        report = json.loads(line[len(token) :])
    except (ValueError, RecursionError):
        return None
    if not (isinstance(report, list) and len(report) == n
            and all(isinstance(r, list) and len(r) == 2 and isinstance(r[0], bool) and isinstance(r[1], str) for r in report)):
        return None
    return report


def _judge_call(test: CodeTest, returned: bool, text: str) -> list:
    """``[passed, error]`` for one call: the returned JSON text decoded here, compared by value."""
    if not returned:
        return [False, text]
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return [False, "returned something that is not JSON data"]
    if test.judge(value):
        return [True, None]
    return [False, f"assertion failed: returned {text[:80]}"]


def run_tests(code: str, tests: list[str], limits: Limits | None = None, test_seconds: float = 1.0, python: str | None = None,
              allow_unsafe: bool = False) -> dict:
    """Run ``code`` in the sandbox, call it as each test says, judge the returned values here.

    Returns ``passed``, ``total``, ``results`` (one ``[passed, error]`` per test), ``error`` (one
    line or None) and ``verdict``; see the module docstring. A test of the wrong shape is a
    bug in the task, not in the code: ``ValueError``.
    """
    parsed = [parse_test(test) for test in tests]
    token = secrets.token_hex(16)
    request = {"token": token, "seconds": test_seconds, "calls": [[t.function, list(t.arguments)] for t in parsed]}
    run = run_python(HARNESS, files={"solution.py": code}, stdin=json.dumps(request) + "\n", limits=limits or Limits(), python=python,
                     allow_unsafe=allow_unsafe)
    report = {"passed": 0, "total": len(tests), "results": None, "error": None, "verdict": None, "wall_time": round(run.wall_time, 3)}
    returned = _returned_values(run.stdout, token, len(parsed))
    if returned is not None:
        results = [_judge_call(test, ok, text) for test, (ok, text) in zip(parsed, returned)]
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
    # no valid report: the sandbox stopped the program, or it exited (or garbled the report) on its own
    if run.timed_out:
        report["verdict"], report["error"] = "timeout", run.error
    elif run.output_truncated:
        report["verdict"], report["error"] = "output_limit", run.error
    else:
        last = run.stderr.strip().splitlines()[-1:] or [""]
        reason = run.error or f"the program exited with code {run.returncode} without a valid report {last[0]}".strip()
        report["verdict"], report["error"] = "error", reason[:300]
    return report


class CodeEnv:
    """Write a function; reward = fraction of the task's tests that pass (judged outside the sandbox).

    An environment on TRL's contract with no tools: ``reset(**row)`` reads the task's ``tests`` and
    ``entry_point``, and the final turn is judged by the ``_judge`` hook (``helpers.envs.episode``),
    which runs the tests on the turn's code. Keyword arguments (all optional, so TRL can construct
    it with none): ``test_seconds`` (per call), ``limits`` (``helpers.sandbox.Limits``), ``python``
    (interpreter for the sandbox), ``allow_unsafe`` (run where the sandbox has no OS boundary,
    with a warning at every run; else that is an error).
    """

    def __init__(self, test_seconds: float = 1.0, limits: Limits | None = None, python: str | None = None, allow_unsafe: bool = False):
        require_isolation("CodeEnv", python, allow_unsafe)
        self.test_seconds = test_seconds
        self.limits = limits or Limits()
        self.python = python
        self.allow_unsafe = allow_unsafe
        self.tests: list[str] = []
        self.entry_point: str | None = None

    def reset(self, **row) -> None:
        """Keep the row's ``tests`` (asserts) and ``entry_point``; a malformed test is the task's bug, said now."""
        tests = row.get("tests")
        if not tests or not isinstance(tests, list):
            raise ValueError(f"CodeEnv needs a row with 'tests', a list of asserts (HumanEval-style tasks: see load_code_tasks); got {str(tests)[:60]!r}")
        for test in tests:
            parse_test(test)  # ValueError naming the malformed test
        self.tests, self.entry_point = list(tests), row.get("entry_point")
        return None

    def _judge(self, text: str) -> dict:
        """The final turn: run the tests on its code. ``info`` keys, the reward, and the test report as
        ``feedback`` for another attempt (``Episode`` sends it while attempts are left)."""
        total = len(self.tests)
        code = extract_code(text, self.entry_point)
        if not code.strip():
            report = {"predicted": None, "verdict": "no_answer", "correct": False, "passed": 0, "total": total,
                      "error": "no code found", "failures": []}
            return {**report, "reward": 0.0, "feedback": _feedback(report)}
        try:
            ran = run_tests(code, self.tests, self.limits, self.test_seconds, self.python, self.allow_unsafe)
        except Exception as e:  # the sandbox itself failed (disk full, ...): not the policy's fault
            return {"verdict": "error", "error": f"sandbox failed: {type(e).__name__}: {e}", "stop_reason": "error"}
        if ran["error"] and ran["error"].startswith("could not start"):
            return {"verdict": "error", "error": ran["error"], "stop_reason": "error"}
        failures = [f"{test}  ->  {error}" for test, (ok, error) in zip(self.tests, ran["results"] or []) if not ok]
        report = {"predicted": code[:MAX_PREDICTED_CHARS], "verdict": ran["verdict"], "correct": ran["verdict"] == "correct",
                  "passed": ran["passed"], "total": total, "error": ran["error"], "failures": failures[:3]}
        return {**report, "reward": ran["passed"] / total, "feedback": _feedback(report)}


def _feedback(report: dict) -> str:
    """The test report a failed attempt gets back, as a user message."""
    feedback = f"{report['passed']}/{report['total']} tests passed."
    if report["error"]:
        feedback += f"\nError: {report['error']}"
    if report["failures"]:
        feedback += "\nFailing:\n" + "\n".join(report["failures"])
    return feedback + "\nFix the function and send the complete code again."
