"""The environments: contract (check_env), scripted episodes, limits, registry."""

import json
import os
import time

import pytest

from helpers.data import DatasetError, Task
from helpers.envs import (
    INFO_KEYS,
    STOP_REASONS,
    TRUNCATED,
    CalculatorEnv,
    CodeEnv,
    Env,
    EnvCheckError,
    EnvError,
    MathEnv,
    StepResult,
    Tool,
    check_env,
    clip_observation,
    extract_code,
    list_envs,
    load_code_tasks,
    make_env,
    parse_test,
    register_env,
    run_tests,
)
from helpers.envs.code_env import CODE_TASKS as CODE_TASKS_PATH
from helpers.envs.code_env import code_task
from helpers.formats import format_tool_call, judge_answer
from helpers.sandbox import Limits, SandboxUnavailable, os_isolation


def arithmetic_task(expression: str, answer: str, i: int = 0) -> Task:
    prompt = [{"role": "system", "content": "Use the calculator. Answer as <answer>N</answer>."}, {"role": "user", "content": f"What is {expression}?"}]
    return Task(f"t{i}", prompt, answer, {"expression": expression})


TASKS = [arithmetic_task("47*86", "4042", 0), arithmetic_task("12*12-5", "139", 1), arithmetic_task("7/2", "3.5", 2)]
CALL = format_tool_call("calculator", {"expression": "47*86"})


def calculator_solver(task):
    return [format_tool_call("calculator", {"expression": task.metadata["expression"]}), f"So it is <answer>{task.answer}</answer>."]


# --- the contract -------------------------------------------------------------------------------


def test_check_env_passes_on_builtin_envs():
    assert check_env(make_env("math"), TASKS, n_random=15, solver=lambda t: [f"<answer>{t.answer}</answer>"]) == []
    assert check_env(make_env("calculator", max_steps=4), TASKS, n_random=30, solver=calculator_solver) == []


class BrokenEnv(Env):
    """Breaks the contract in three ways check_env must catch."""

    def reset(self, task):
        self.task, self.steps, self.stop_reason = task, 0, None
        return task.prompt  # no copy

    def step(self, action):
        if "<answer>" not in action:
            raise ValueError("cannot parse")  # raises on bad model output
        self.stop_reason = "done"  # not a STOP_REASON
        return StepResult([], 1.0, True, False, {"stop_reason": "done"})  # info keys missing


def test_check_env_reports_violations():
    problems = check_env(BrokenEnv(), TASKS[:1], n_random=3)
    text = "\n".join(problems)
    assert "step() raised ValueError" in text
    assert "not one of" in text and "info is missing keys" in text
    assert "must raise EnvError" in text
    with pytest.raises(EnvCheckError, match="BrokenEnv"):
        check_env(BrokenEnv(), TASKS[:1], n_random=1, strict=True)


def test_check_env_catches_a_bad_solver():
    problems = check_env(make_env("math"), TASKS[:1], n_random=0, solver=lambda t: ["<answer>-1</answer>"])
    assert len(problems) == 1 and "expected reward 1.0" in problems[0]


def test_step_outside_an_episode_raises_env_error():
    env = MathEnv()
    with pytest.raises(EnvError, match="before reset"):
        env.step("<answer>1</answer>")
    env.reset(TASKS[0])
    env.step("<answer>1</answer>")
    with pytest.raises(EnvError, match="after the episode ended"):
        env.step("<answer>1</answer>")


# --- MathEnv ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, reward, verdict, predicted, strict",
    [
        ("47*86 = 4042, so <answer>4042</answer>", 1.0, "correct", "4042", True),
        ("<answer>$4,042.00</answer>", 1.0, "correct", "4042", True),
        ("the answer is \\boxed{4042}", 1.0, "correct", "4042", False),
        ("it is 4042.", 1.0, "correct", "4042", False),  # lenient: the last number
        ("<answer>4041</answer>", 0.0, "wrong_number", "4041", True),
        ("<answer>4042</answer> or <answer>4041</answer>", 0.0, "wrong_number", "4041", False),  # the last tag counts
        ("I don't know", 0.0, "no_answer", None, False),
        ("<answer></answer>", 0.0, "no_answer", None, False),
        ("<answer>forty-two</answer>", 0.0, "wrong_answer", "forty-two", True),
    ],
)
def test_math_env_scripted(text, reward, verdict, predicted, strict):
    env = MathEnv()
    messages = env.reset(TASKS[0])
    assert messages == TASKS[0].prompt and messages is not TASKS[0].prompt
    result = env.step(text)
    assert (result.reward, result.terminated, result.truncated, result.observation) == (reward, True, False, [])
    assert result.info["verdict"] == verdict and result.info["predicted"] == predicted
    assert result.info["strict_format"] is strict
    assert result.info["stop_reason"] == env.stop_reason == "answered"
    assert result.info["correct"] is (reward == 1.0)
    assert all(key in result.info for key in INFO_KEYS)


def test_judge_uses_math_verify_for_non_numeric_answers():
    assert judge_answer("<answer>\\frac{7}{2}</answer>", "3.5")["verdict"] == "correct"
    assert judge_answer("<answer>7/2</answer>", "3.5")["correct"]
    assert judge_answer("<answer>x+1</answer>", "1+x")["correct"]  # a non-numeric gold
    assert judge_answer("<answer>x+2</answer>", "1+x")["verdict"] == "wrong_answer"


# --- CalculatorEnv --------------------------------------------------------------------------------


def test_calculator_tool_schema():
    (schema,) = CalculatorEnv.tools
    function = schema["function"]
    assert schema["type"] == "function" and function["name"] == "calculator"
    assert function["parameters"]["properties"]["expression"]["type"] == "string"
    assert function["parameters"]["required"] == ["expression"]
    assert make_env("calculator").tools == CalculatorEnv.tools


def test_calculator_env_correct_episode():
    env = make_env("calculator")
    env.reset(TASKS[0])
    first = env.step("Let me compute.\n" + CALL)
    assert first.observation == [{"role": "tool", "content": "4042"}]
    assert (first.reward, first.done, first.info["tool_calls"], first.info["stop_reason"]) == (0.0, False, 1, None)
    final = env.step("<answer>4042</answer>")
    assert (final.reward, final.terminated, final.observation) == (1.0, True, [])
    assert final.info["verdict"] == "correct" and final.info["tool_calls"] == 1 and final.info["tool_errors"] == 0


def test_calculator_env_wrong_and_no_answer():
    env = make_env("calculator")
    env.reset(TASKS[0])
    result = env.step("<answer>4000</answer>")
    assert (result.reward, result.info["verdict"], result.info["stop_reason"]) == (0.0, "wrong_number", "answered")
    env.reset(TASKS[0])
    result = env.step("I cannot do this.")
    assert (result.reward, result.info["verdict"]) == (0.0, "no_answer")


def test_two_calls_in_one_turn_give_two_messages():
    env = make_env("calculator")
    env.reset(TASKS[0])
    text = format_tool_call("calculator", {"expression": "1+1"}) + "\n" + format_tool_call("calculator", {"expression": "7/2"})
    result = env.step(text)
    assert result.observation == [{"role": "tool", "content": "2"}, {"role": "tool", "content": "3.5"}]


@pytest.mark.parametrize(
    "call, error",
    [
        ("<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"1+1\"\n</tool_call>", "error: malformed JSON"),
        ("<tool_call>\n[1, 2]\n</tool_call>", "error: tool call needs"),
        (format_tool_call("search", {"query": "x"}), "error: unknown tool 'search'; available: calculator"),
        (format_tool_call("calculator", {}), "error: calculator needs argument 'expression'"),
        (format_tool_call("calculator", {"expression": "1", "mode": "x"}), "error: calculator got unexpected argument 'mode'"),
        (format_tool_call("calculator", {"expression": "__import__('os').system('id')"}), "error: function calls are not allowed"),
        (format_tool_call("calculator", {"expression": "1/0"}), "error: division by zero"),
    ],
)
def test_bad_tool_calls_become_error_observations(call, error):
    env = make_env("calculator")
    env.reset(TASKS[0])
    result = env.step(call)
    assert not result.done
    (message,) = result.observation
    assert message["role"] == "tool" and message["content"].startswith(error), message
    assert result.info["tool_errors"] == 1 and result.info["tool_calls"] == 1
    final = env.step("<answer>4042</answer>")  # the model can still recover
    assert final.reward == 1.0 and final.info["tool_errors"] == 1


def test_25_tool_calls_in_a_row_end_at_max_steps():
    env = make_env("calculator", max_steps=10)
    env.reset(TASKS[0])
    results = []
    for _ in range(25):
        results.append(env.step(CALL))
        if results[-1].done:
            break
    last = results[-1]
    assert len(results) == 10
    assert (last.terminated, last.truncated, last.reward) == (False, True, 0.0)
    assert last.info["stop_reason"] == "max_steps" and last.info["verdict"] == "no_answer"
    assert last.info["tool_calls"] == 10 and "max_steps=10" in last.info["limit"]


def test_too_many_calls_in_one_turn_are_skipped():
    env = make_env("calculator", max_calls_per_step=3)
    env.reset(TASKS[0])
    result = env.step(CALL * 5)
    assert [m["content"] for m in result.observation] == ["4042"] * 3 + ["error: at most 3 tool calls per turn; 2 skipped"]
    assert result.info["tool_calls"] == 3


def test_long_tool_output_is_truncated_and_says_so():
    env = make_env("calculator", max_observation_chars=50)
    env.reset(TASKS[0])
    result = env.step(format_tool_call("calculator", {"expression": "7**500"}))  # 423 digits
    content = result.observation[0]["content"]
    assert content.startswith("3") and len(content) < 120
    assert content.endswith("[truncated: 373 more characters]")


SLOW = Tool("sleep", "Wait this many seconds.", {"seconds": "how long"}, fn=lambda seconds: time.sleep(float(seconds)) or "done")
register_env("slow_calculator", lambda **kw: CalculatorEnv(extra_tools=[SLOW], **kw))


def test_a_tool_that_hangs_ends_at_the_step_timeout():
    env = make_env("slow_calculator", step_timeout=0.3)
    env.reset(TASKS[0])
    assert env.step(format_tool_call("sleep", {"seconds": "0.01"})).observation == [{"role": "tool", "content": "done"}]
    start = time.monotonic()
    result = env.step(format_tool_call("sleep", {"seconds": "30"}))
    assert time.monotonic() - start < 2.0
    assert (result.truncated, result.terminated, result.info["stop_reason"]) == (True, False, "timeout")
    assert "did not return" in result.info["limit"] and result.info["tool_errors"] == 1
    assert check_env(make_env("slow_calculator", step_timeout=0.3), TASKS, n_random=10) == []


def test_episode_timeout():
    env = make_env("slow_calculator", step_timeout=5.0, episode_timeout=0.4)
    env.reset(TASKS[0])
    start = time.monotonic()
    result = env.step(format_tool_call("sleep", {"seconds": "30"}))  # the call is bounded by the episode's time left
    assert time.monotonic() - start < 2.0 and result.info["stop_reason"] == "timeout"
    env.reset(TASKS[0])
    time.sleep(0.45)  # a slow policy: the episode is over before it answers
    result = env.step("<answer>4042</answer>")
    assert result.info["stop_reason"] == "timeout" and result.reward == 0.0 and "episode_timeout" in result.info["limit"]


def test_truncate_from_outside():
    env = make_env("calculator")
    env.reset(TASKS[0])
    env.step(CALL)
    result = env.truncate("max_tokens")
    assert (result.truncated, result.info["stop_reason"], result.info["verdict"], result.info["tool_calls"]) == (True, "max_tokens", "no_answer", 1)
    with pytest.raises(ValueError, match="unknown stop_reason"):
        make_env("math").truncate("bored")


# --- registry ------------------------------------------------------------------------------------


def test_registry():
    assert {"math", "calculator"} <= set(list_envs())
    with pytest.raises(KeyError, match="unknown env 'nope'; registered: "):
        make_env("nope")
    with pytest.raises(ValueError, match="already registered"):
        register_env("math", CalculatorEnv)

    @register_env("test_echo")
    class EchoEnv(MathEnv):
        pass

    assert isinstance(make_env("test_echo"), EchoEnv)
    register_env("test_echo", EchoEnv)  # the same definition again (a re-run notebook cell) is fine
    register_env("test_not_an_env", lambda: "oops")
    with pytest.raises(TypeError, match="not an Env"):
        make_env("test_not_an_env")


def test_stop_reasons_are_the_documented_ones():
    assert STOP_REASONS == ("answered", "max_steps", "timeout", "max_tokens", "error")
    assert set(TRUNCATED) <= set(STOP_REASONS) and "answered" not in TRUNCATED and "error" not in TRUNCATED


# --- the template step() ----------------------------------------------------------------------------


class CountdownEnv(Env):
    """Only _step: the base class's step() does the protocol check, the counting and str(action)."""

    info_defaults = {"seen": []}

    def __init__(self, max_steps: int = 3):
        super().__init__(max_steps=max_steps)

    def _step(self, text):
        self.info["seen"].append(text)
        if self.steps >= self.max_steps:
            return self._end("max_steps")
        return StepResult([{"role": "user", "content": clip_observation(text * 100, 20)}], 0.0, False, False, dict(self.info))


def test_a_subclass_writes_only_step():
    env = CountdownEnv()
    with pytest.raises(EnvError, match="before reset"):
        env.step("x")
    assert env.reset(TASKS[0]) == TASKS[0].prompt
    first = env.step(12)  # not a string: coerced once, in Env.step
    assert env.steps == 1 and first.info["seen"] == ["12"]
    assert first.observation[0]["content"] == "1212121212121212121212" [:20] + "\n... [truncated: 180 more characters]"
    env.step("a")
    assert env.step("b").info["stop_reason"] == "max_steps"
    with pytest.raises(EnvError, match="after the episode ended"):
        env.step("c")
    env.reset(TASKS[0])
    assert env.info["seen"] == [] and env.steps == 0  # defaults are copied, never shared between episodes
    assert check_env(CountdownEnv(), TASKS, n_random=5) == []


def test_answer_envs_start_with_strict_format_false():
    for name in ("math", "calculator"):
        env = make_env(name)
        assert env.info["strict_format"] is False
        env.reset(TASKS[0])
        assert env.info["strict_format"] is False


# --- model output that broke step() (issue 15) --------------------------------------------------------


@pytest.mark.parametrize(
    "turn, error",
    [
        ('<tool_call>{"name": "calculator", "arguments": {"expression": ' + "9" * 5000 + "}}</tool_call>", "a number with too many digits"),
        # json raises RecursionError under the default recursion limit; a library that raised the limit
        # (hypothesis does, inside its tests) lets it parse into a list, which is not a tool call either: an error both ways
        ("<tool_call>" + "[" * 1000 + "]" * 1000 + "</tool_call>", "error:"),
        (format_tool_call("calculator", {"expression": "1+1\x00\x1b[2J"}), "error: not an arithmetic expression"),  # control bytes
        ('<tool_call>{"name": "calculator", "arguments": {"expression": "1\x00"}}</tool_call>', "error: malformed JSON"),  # raw ones
    ],
)
def test_hostile_tool_calls_become_error_observations(turn, error):
    env = make_env("calculator")
    env.reset(TASKS[0])
    result = env.step(turn)
    (message,) = result.observation
    assert error in message["content"] and result.info["tool_errors"] == 1 and not result.done


def test_megabytes_of_unclosed_tags_are_answered_fast():
    for turn in ["<tool_call>" * 100_000, "<answer>" * 100_000, "```python\n" * 100_000, "\\boxed{" * 100_000]:
        for name in ("math", "calculator"):
            env = make_env(name)
            env.reset(TASKS[0])
            start = time.perf_counter()
            result = env.step(turn)
            assert time.perf_counter() - start < 1.0, (name, turn[:12])
            assert result.done and result.info["verdict"] in ("no_answer", "wrong_answer"), result.info


# --- CodeEnv -------------------------------------------------------------------------------------

CODE_TASKS = load_code_tasks()
ADD = next(t for t in CODE_TASKS if t.metadata["entry_point"] == "add")
UNSAFE = not os_isolation()  # where bwrap cannot run, the CodeEnv tests run on the unsafe layers (they warn)
needs_boundary = pytest.mark.skipif(UNSAFE, reason="no OS boundary (bwrap) here: the tests and task file would be readable")


def code_env(**kwargs):
    return make_env("code", allow_unsafe=UNSAFE, **kwargs)


def test_code_tasks_file_is_sound():
    assert len(CODE_TASKS) >= 20 and len({t.id for t in CODE_TASKS}) == len(CODE_TASKS)
    env = code_env()
    for task in CODE_TASKS:  # each reference solution passes every assert; a stub passes none
        assert task.metadata["signature"] in task.prompt[-1]["content"] and task.metadata["solution"] not in task.prompt[-1]["content"]
        env.reset(task)
        result = env.step(f"```python\n{task.metadata['solution']}\n```")
        assert result.reward == 1.0, (task.id, result.info)
        env.reset(task)
        stub = f"{task.metadata['signature']}\n    return object()"  # a wrong answer of the right shape
        assert env.step(stub).reward == 0.0, task.id


def test_check_env_passes_on_code_env():
    assert check_env(code_env(), CODE_TASKS[:2], n_random=6, solver=lambda t: [t.metadata["solution"]]) == []


def test_extract_code():
    assert extract_code("Sure:\n```python\ndef f():\n    return 1\n```\nDone.") == "def f():\n    return 1"
    two = "```python\ndef add(a, b):\n    return a + b\n```\nUsage:\n```python\nprint(add(1, 2))\n```"
    assert extract_code(two, "add").startswith("def add")  # the block that defines the function
    assert extract_code("def add(a, b): return a+b") == "def add(a, b): return a+b"  # no block: the whole text


@pytest.mark.parametrize(
    "code, reward, verdict",
    [
        ("def add(a, b):\n    return a + b", 1.0, "correct"),
        ("def add(a, b):\n    return 3", 0.25, "tests_failed"),  # partial credit: 1 of 4 asserts
        ("def add(a, b)\n    return a + b", 0.0, "error"),
        ("", 0.0, "no_answer"),
    ],
)
def test_code_env_scripted(code, reward, verdict):
    env = code_env()
    env.reset(ADD)
    result = env.step(f"```python\n{code}\n```" if code else "")
    assert (result.reward, result.info["verdict"], result.info["stop_reason"], result.terminated) == (reward, verdict, "answered", True)
    assert result.info["total"] == 4 and result.info["correct"] is (verdict == "correct")


HOSTILE = [  # (name, code, verdict, text that must be in info["error"] or the failures)
    ("infinite loop", "def add(a, b):\n    return a + b\nwhile True:\n    pass", "timeout", "timeout"),
    ("10 GB", "buffer = bytearray(10 * 1024**3)\ndef add(a, b):\n    return a + b", "error", "MemoryError"),
    ("fork bomb", "import os\nwhile True:\n    os.fork()", "error", "os.fork is not allowed"),
    ("write outside", "open('/tmp/../etc/escaped_by_policy', 'w').write('x')\ndef add(a, b):\n    return a + b", "error", "writing outside the working directory"),
    ("print 100 MB", "import sys\nfor _ in range(100):\n    sys.stdout.write('x' * (1 << 20))\ndef add(a, b):\n    return a + b", "output_limit", "output limit"),
]


@pytest.mark.parametrize("name, code, verdict, reason", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_code_is_contained(name, code, verdict, reason):
    env = code_env(test_seconds=1.0, limits=Limits(wall_seconds=4, cpu_seconds=3))
    env.reset(ADD)
    start = time.monotonic()
    result = env.step(f"```python\n{code}\n```")
    assert time.monotonic() - start < 6
    assert (result.reward, result.info["verdict"], result.info["stop_reason"]) == (0.0, verdict, "answered")
    assert reason in result.info["error"], result.info
    assert not os.path.exists("/etc/escaped_by_policy")


def test_code_env_cannot_read_our_environment(monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "secret-key")
    env = code_env()
    env.reset(ADD)
    code = "import os\ndef add(a, b):\n    assert 'WANDB_API_KEY' not in os.environ\n    return a + b"
    assert env.step(code).reward == 1.0


def test_a_hanging_test_costs_only_its_own_credit():
    env = code_env(test_seconds=0.3)
    env.reset(ADD)
    result = env.step("def add(a, b):\n    while a == 1:\n        pass\n    return a + b")  # hangs on add(1, 2) only
    assert result.reward == 0.75 and result.info["verdict"] == "tests_failed"
    assert "timeout: took longer than 0.3 s" in result.info["failures"][0]


def test_code_env_multi_turn_feedback():
    env = code_env(max_steps=2)
    env.reset(ADD)
    first = env.step("def add(a, b):\n    return a - b")
    assert not first.done and first.reward == 0.0
    (feedback,) = first.observation
    assert feedback["role"] == "user" and "tests passed" in feedback["content"] and "assert add(1, 2) == 3" in feedback["content"]
    second = env.step("def add(a, b):\n    return a + b")
    assert second.done and second.reward == 1.0 and env.steps == 2


# --- reward integrity: the solution cannot judge itself (issue 15) ---------------------------------------


FORGE = """
import json, os, sys
frame = sys._getframe(1)  # the harness's frame: its token and calls
token, calls = frame.f_globals["token"], frame.f_globals["calls"]
os.write(1, ("\\n" + token + json.dumps([[True, "true"]] * len(calls)) + "\\n").encode())  # "all passed"
os._exit(0)
"""
ALWAYS_EQUAL = """
class Anything(int):
    def __eq__(self, other):
        return True
    __hash__ = int.__hash__
class Whatever:
    def __eq__(self, other):
        return True
def add(a, b):
    return Whatever() if a > 0 else Anything(-1)
"""
PEEK = f"""
import os, re, sys
def find_tests():
    for path in ["tests.json", "../tests.json", {str(CODE_TASKS_PATH)!r}]:  # where the tests were, or are, on disk
        try:
            return open(path).read()
        except OSError:
            pass
    return repr(sys._getframe(1).f_globals)  # the harness's variables
KNOWN = dict(re.findall(r"add\\((-?\\d+, -?\\d+)\\) == (-?\\d+)", find_tests()))
def add(a, b):
    return int(KNOWN.get(f"{{a}}, {{b}}", -1))
"""


@needs_boundary
@pytest.mark.parametrize("name, code", [("forged report", FORGE), ("always-equal objects", ALWAYS_EQUAL), ("peeking at the tests", PEEK)])
def test_cheating_earns_nothing(name, code):
    env = code_env()
    env.reset(ADD)
    result = env.step(f"```python\n{code}\n```")
    assert result.reward == 0.0 and not result.info["correct"], (name, result.info)


def test_values_are_compared_after_a_json_round_trip():
    tests = ["assert f(1) == [1, 2]", "assert f(2) is None", "assert f(3) == {'a': 1}", "assert f(4) == 2"]
    code = "def f(x):\n    return {1: (1, 2), 2: None, 3: {'a': True}, 4: 2.0}[x]"
    report = run_tests(code, tests, allow_unsafe=UNSAFE)
    assert report["passed"] == 4, report  # a tuple is a list in JSON; True == 1 and 2.0 == 2, as in Python
    report = run_tests("def f(x):\n    return {1, 2}", tests[:1], allow_unsafe=UNSAFE)
    assert report["results"] == [[False, "returned a set, not plain data (None, bool, int, float, str, list, dict)"]]


def test_code_task_rows_are_validated(tmp_path):
    row = {"id": "x", "entry_point": "add", "signature": "def add(a, b):", "description": "Add.", "tests": "assert add(1, 2) == 3"}
    with pytest.raises(DatasetError, match=r"tasks.jsonl, row 7: 'tests' must be a non-empty list of assert strings, got str"):
        code_task(row, "tasks.jsonl, row 7")
    for bad, why in [("assert add(1, 2)", "a test must read"), ("assert add(x, 2) == 3", "must be literals"),
                     ("assert sub(1, 2) == -1", "not the entry point 'add'"), ("assert add(1, 2) is 3", "'is' compares with")]:
        with pytest.raises(DatasetError, match=why):
            code_task({**row, "tests": [bad]}, "tasks.jsonl, row 7")
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps({**row, "tests": ["assert add(1, 2) == 3"]}) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(DatasetError, match=rf"{path}, row 2: 'tests'"):
        load_code_tasks(path)


def test_parse_test():
    test = parse_test("assert rotate_list([1, 2, 3], 5) == [2, 3, 1]")
    assert (test.function, test.arguments, test.op, test.expected) == ("rotate_list", ("[1, 2, 3]", "5"), "==", [2, 3, 1])
    assert parse_test("assert is_even(7) is False").judge(False) and not parse_test("assert is_even(7) is False").judge(0)


def test_code_env_without_a_boundary_needs_allow_unsafe(monkeypatch):
    from helpers import sandbox

    monkeypatch.setattr(sandbox, "_boundary_problem", lambda python: "bwrap is not installed (test)")
    with pytest.raises(SandboxUnavailable, match="allow_unsafe=True"):
        make_env("code")
    assert isinstance(make_env("code", allow_unsafe=True), CodeEnv)
