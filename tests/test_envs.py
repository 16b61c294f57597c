"""The environments: TRL's contract (check_env_class), the Episode adapter (check_env), scripted episodes, limits, registry."""

import inspect
import json
import os
import threading
import time

import pytest

from helpers.data import DatasetError, Task
from helpers.envs import (
    INFO_KEYS,
    STOP_REASONS,
    TRUNCATED,
    CalculatorEnv,
    CodeEnv,
    EnvCheckError,
    EnvError,
    Episode,
    MathEnv,
    check_env,
    check_env_class,
    extract_code,
    list_envs,
    load_code_tasks,
    make_env,
    new_env,
    parse_test,
    register_env,
    run_tests,
    tool_schemas,
    tool_signatures,
    typed_arguments,
)
from helpers.envs.code_env import CODE_TASKS as CODE_TASKS_PATH
from helpers.envs.code_env import code_task
from helpers.envs.episode import ToolThreads
from helpers.formats import format_tool_call, judge_answer
from helpers.sandbox import Limits, SandboxUnavailable, os_isolation
from helpers.worlds.arithmetic.tasks import make_tiny_tasks
from helpers.worlds.shop.tasks import make_agent_tasks


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


class BrokenEnv:
    """Breaks the contract in the three ways an env still can behind the adapter; check_env must catch them."""

    def reset(self, **row):
        return None

    def _judge(self, text):
        if "<answer>" not in text:
            raise ValueError("cannot parse")  # raises on bad model output
        return {"stop_reason": "done"}  # not a STOP_REASON

    def get_reward(self):
        return "high"  # not a number


def test_check_env_reports_violations():
    problems = check_env(BrokenEnv(), TASKS[:1], n_random=3)  # an env object is driven by an Episode
    text = "\n".join(problems)
    assert "step() raised ValueError: cannot parse" in text
    assert "not one of" in text
    assert "get_reward failed: TypeError: get_reward() returned str 'high', not a finite number" in text
    with pytest.raises(EnvCheckError, match="BrokenEnv"):
        check_env(BrokenEnv(), TASKS[:1], n_random=1, strict=True)


def test_check_env_catches_a_bad_solver():
    problems = check_env(make_env("math"), TASKS[:1], n_random=0, solver=lambda t: ["<answer>-1</answer>"])
    assert len(problems) == 1 and "expected reward 1.0" in problems[0]


def test_step_outside_an_episode_raises_env_error():
    env = make_env("math")
    with pytest.raises(EnvError, match="before reset"):
        env.step("<answer>1</answer>")
    env.reset(TASKS[0])
    assert env.step(4042).info["verdict"] == "correct"  # not a string: coerced once, with str()
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
    env = make_env("math")
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


def test_calculator_tool_schema_is_what_trl_renders():
    from transformers.utils import get_json_schema

    (schema,) = make_env("calculator").tools
    function = schema["function"]
    assert schema["type"] == "function" and function["name"] == "calculator"
    assert function["parameters"]["properties"]["expression"]["type"] == "string"
    assert function["parameters"]["required"] == ["expression"]
    assert schema == get_json_schema(CalculatorEnv().calculator) and [schema] == tool_schemas(CalculatorEnv())
    assert make_env("math").tools is None  # no tools: the chat template lists none


def test_tool_signatures_are_the_bound_tools_own_once_per_class():
    """What a call's arguments are bound to: each tool's signature without ``self``, the same for every instance."""
    first, second = CalculatorEnv(), CalculatorEnv()
    signatures = tool_signatures(first)
    assert list(signatures) == ["calculator"]
    assert signatures == {"calculator": inspect.signature(second.calculator)}
    assert list(signatures["calculator"].parameters) == ["expression"]
    signatures.clear()  # the caller's copy: the class's own stays whole
    assert list(tool_signatures(second)) == ["calculator"]
    assert tool_signatures(MathEnv()) == {}


def test_calculator_env_correct_episode():
    env = make_env("calculator")
    env.reset(TASKS[0])
    first = env.step("Let me compute.\n" + CALL)
    assert first.observation == [{"role": "tool", "content": "4042"}]
    assert (first.reward, first.done, first.info["tool_calls"], first.info["stop_reason"]) == (0.0, False, 1, None)
    final = env.step("<answer>4042</answer>")
    assert (final.reward, final.terminated, final.observation) == (1.0, True, [])
    assert final.info["verdict"] == "correct" and final.info["tool_calls"] == 1
    assert final.info["tool_errors"] == final.info["tool_failures"] == 0 and "env_reward" not in final.info


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
    "call, error, failed",
    [  # failed: TRL counts the call as failed (it could not be made, or raised); a tool's own error text is not
        ("<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"1+1\"\n</tool_call>", "error: malformed JSON", 1),
        ("<tool_call>\n[1, 2]\n</tool_call>", "error: tool call needs", 1),
        (format_tool_call("search", {"query": "x"}), "error: unknown tool 'search'; available: calculator", 1),
        (format_tool_call("calculator", {}), "error: calculator: missing a required argument: 'expression'", 1),
        (format_tool_call("calculator", {"expression": "1", "mode": "x"}), "error: calculator: got an unexpected keyword argument 'mode'", 1),
        (format_tool_call("calculator", {"expression": "__import__('os').system('id')"}), "error: function calls are not allowed", 0),
        (format_tool_call("calculator", {"expression": "1/0"}), "error: division by zero", 0),
    ],
)
def test_bad_tool_calls_become_error_observations(call, error, failed):
    env = make_env("calculator")
    env.reset(TASKS[0])
    result = env.step(call)
    assert not result.done
    (message,) = result.observation
    assert message["role"] == "tool" and message["content"].startswith(error), message
    assert result.info["tool_errors"] == 1 and result.info["tool_calls"] == 1 and result.info["tool_failures"] == failed
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


class SlowCalculator(CalculatorEnv):
    """The calculator and one more tool, a subclass's method (as TRL finds tools): one that can hang."""

    def sleep(self, seconds: float) -> str:
        """Wait this many seconds.

        Args:
            seconds: how long
        """
        time.sleep(float(seconds))
        return "done"

    def divide(self, a: int, b: int) -> str:
        """a / b, raising on a zero b.

        Args:
            a: the dividend
            b: the divisor
        """
        return str(a / b)


register_env("slow_calculator", SlowCalculator)


def test_tools_are_the_public_methods_in_name_order():
    env = make_env("slow_calculator")
    assert [schema["function"]["name"] for schema in env.tools] == ["calculator", "divide", "sleep"]
    assert list(env.toolbox) == ["calculator", "divide", "sleep"]
    env.reset(TASKS[0])
    result = env.step(format_tool_call("unknown", {}))
    assert result.observation[0]["content"] == "error: unknown tool 'unknown'; available: calculator, divide, sleep"


def test_a_tool_that_raises_is_an_error_and_a_failure():
    env = make_env("slow_calculator")
    env.reset(TASKS[0])
    result = env.step(format_tool_call("divide", {"a": 1, "b": 0}) + format_tool_call("divide", {"a": 3, "b": 2}))
    assert [m["content"] for m in result.observation] == ["error: tool raised ZeroDivisionError: division by zero", "1.5"]
    assert (result.info["tool_calls"], result.info["tool_errors"], result.info["tool_failures"]) == (2, 1, 1)
    result = env.step(format_tool_call("divide", {"a": "x", "b": 2}))  # a string that reads as no int goes through as written
    assert result.observation[0]["content"].startswith("error: tool raised TypeError") and result.info["tool_failures"] == 2
    result = env.step(format_tool_call("divide", {"a": "3", "b": "2"}))  # one that does arrives as an int, as in TRL
    assert result.observation[0]["content"] == "1.5" and result.info["tool_failures"] == 2


class Aliased:
    """A tool bound under another attribute name: TRL keys it by the function's own name, the one its schema shows."""

    def reset(self, **row) -> None:
        return None

    def _lookup(self, item: str) -> str:
        """The price of an item.

        Args:
            item: the item
        """
        return f"price of {item}"

    lookup = _lookup


class AsyncTool:
    def reset(self, **row) -> None:
        return None

    async def ask(self, question: str) -> str:
        """Ask.

        Args:
            question: the question
        """
        return "yes"


def test_tools_are_named_as_trl_names_them_and_async_ones_are_refused():
    env = Episode(Aliased())
    assert [schema["function"]["name"] for schema in env.tools] == list(env.toolbox) == ["_lookup"]
    env.reset(TASKS[0])
    assert env.step(format_tool_call("_lookup", {"item": "pen"})).observation[0]["content"] == "price of pen"
    with pytest.raises(TypeError, match="does not run async methods .*: ask"):
        Episode(AsyncTool())


class Typed:
    """A tool with an argument of every JSON type, for typed_arguments against transformers' parser."""

    def reset(self, **row) -> None:
        return None

    def act(self, n: int, x: float, flag: bool, items: list, options: dict, name: str, maybe: int | None = None) -> str:
        """Echo the arguments.

        Args:
            n: an int
            x: a float
            flag: a bool
            items: a list
            options: a dict
            name: a string
            maybe: an optional int
        """
        return repr((n, x, flag, items, options, name, maybe))


TYPED_CALLS = [
    {"n": "37", "x": "2.5", "flag": "true", "items": "[1, 2]", "options": '{"a": 1}', "name": "5", "maybe": "null"},
    {"n": "3.0", "x": "4", "flag": "0", "items": "[1", "options": "[1]", "name": 7, "maybe": "None"},
    {"n": " 12 ", "x": "nan", "flag": "yes", "items": [1, "2"], "options": "{}", "name": "true", "maybe": "8"},
    {"n": ["1", 2], "x": "1e400", "flag": "False", "items": "x", "options": "null", "name": "null", "maybe": "x"},
    {"n": 5, "x": 2.5, "flag": True, "items": [1], "options": {"b": [2]}, "name": "Ann", "unknown": "9"},
]


@pytest.mark.parametrize("arguments", TYPED_CALLS)
def test_tool_arguments_are_typed_as_trls_parser_types_them(arguments):
    """typed_arguments against the library: transformers' response parser with TRL's template for Qwen's tool
    format (TRL's parser for the tiny models and Qwen2.5), given the tools' schemas, on the same call."""
    response_parser = pytest.importorskip("transformers.utils.chat_parsing.response_parser")
    template = pytest.importorskip("trl.chat_template_utils").qwen3_template
    schema = tool_schemas(Typed())[0]
    text = format_tool_call("act", arguments) + "<|im_end|>"
    library = response_parser.parse_response(text, template, prefix="", tools=[schema])["tool_calls"][0]["function"]["arguments"]
    ours = typed_arguments(arguments, schema)
    if arguments["n"] == "3.0" and library["n"] == "3.0":  # transformers 5.15-5.19 left a whole float as written for an int
        assert ours["n"] == 3  # the rule of later versions (5.25), which a fresh install gets
        ours, library = {**ours, "n": None}, {**library, "n": None}
    assert ours == library


def test_the_adapter_calls_a_tool_with_typed_arguments():
    env = Episode(Typed())
    env.reset(TASKS[0])
    result = env.step(format_tool_call("act", {"n": "37", "x": "2.5", "flag": "false", "items": "[1]", "options": "{}", "name": "37"}))
    assert result.observation[0]["content"] == repr((37, 2.5, False, [1], {}, "37", None))
    assert typed_arguments({"n": "37"}, None) == {"n": "37"}  # no schema (a tool without one): as written


def test_a_tool_that_hangs_ends_at_the_step_timeout():
    env = make_env("slow_calculator", step_timeout=0.3)
    env.reset(TASKS[0])
    assert env.step(format_tool_call("sleep", {"seconds": "0.01"})).observation == [{"role": "tool", "content": "done"}]
    start = time.monotonic()
    result = env.step(format_tool_call("sleep", {"seconds": "30"}))
    assert time.monotonic() - start < 2.0
    assert (result.truncated, result.terminated, result.info["stop_reason"]) == (True, False, "timeout")
    assert "did not return" in result.info["limit"] and result.info["tool_errors"] == result.info["tool_failures"] == 1
    assert check_env(make_env("slow_calculator", step_timeout=0.3), TASKS, n_random=10) == []


def test_tool_calls_reuse_their_threads_and_a_hung_call_keeps_its_own():
    """Starting a thread for every call cost more than a shop tool's work: calls run on reused daemon threads."""
    threads = ToolThreads()
    for i in range(50):
        assert threads.run(lambda x: x + 1, {"x": i}, timeout=5.0) == (True, i + 1, None)
    assert threads.idle.qsize() == 1  # one thread served all fifty
    release = threading.Event()
    try:
        assert threads.run(lambda: release.wait(30), {}, timeout=0.1) == (False, None, None)  # hung: not waited for
        finished, value, error = threads.run(lambda: 1 / 0, {}, timeout=5.0)  # a second thread serves meanwhile
        assert (finished, value, type(error)) == (True, None, ZeroDivisionError)
        assert threads.idle.qsize() == 1
    finally:
        release.set()
    for _ in range(100):  # the hung call returned: its thread serves again
        if threads.idle.qsize() == 2:
            break
        time.sleep(0.01)
    assert threads.idle.qsize() == 2
    assert all(t.daemon for t in threading.enumerate() if t.name == "tool-call")  # none keeps the process alive


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

    env = make_env("test_echo", max_steps=3)
    assert isinstance(env, Episode) and isinstance(env.env, EchoEnv) and env.max_steps == 3  # the adapter and its limits
    register_env("test_echo", EchoEnv)  # the same definition again (a re-run notebook cell) is fine
    register_env("test_not_an_env", lambda: "oops")
    with pytest.raises(TypeError, match="str has no reset method"):
        make_env("test_not_an_env")
    with pytest.raises(ValueError, match="holds no ':'"):
        register_env("a:b", MathEnv)


def test_make_env_takes_any_class_by_module_and_name():
    env = make_env("helpers.envs.calculator:CalculatorEnv", max_steps=2, step_timeout=1.0)
    assert isinstance(env.env, CalculatorEnv) and (env.max_steps, env.step_timeout) == (2, 1.0)
    assert type(new_env("helpers.envs.calculator:CalculatorEnv")) is type(new_env("calculator")) is CalculatorEnv  # the bare env, for TRL
    for spec, why in [("helpers.envs.calculator:NoSuchEnv", "has no class 'NoSuchEnv'"),
                      ("no_such_module_xyz:Env", "cannot import 'no_such_module_xyz' \\(ModuleNotFoundError"),
                      (":Env", "expected 'package.module:ClassName'")]:
        with pytest.raises(ValueError, match=why):
            make_env(spec)


def test_stop_reasons_are_the_documented_ones():
    assert STOP_REASONS == ("answered", "max_steps", "timeout", "max_tokens", "error")
    assert set(TRUNCATED) <= set(STOP_REASONS) and "answered" not in TRUNCATED and "error" not in TRUNCATED


# --- TRL's contract: any class, driven by the one adapter ------------------------------------------------


class Notes:
    """A user's env on TRL's contract: reset(**row) gets every column and adds to the prompt;
    one tool; a private method (not a tool); get_reward from the env's state."""

    def __init__(self):
        self.row, self.notes = None, []

    def reset(self, **row) -> str:
        self.row, self.notes = row, []
        return f" (topic: {row['topic']})"

    def write(self, text: str) -> str:
        """Write a note.

        Args:
            text: what to write
        """
        self.notes.append(text)
        return f"{len(self.notes)} notes"

    def _count(self) -> int:
        return len(self.notes)

    def get_reward(self) -> float:
        return self._count() / 2


def test_a_class_on_trls_contract_runs_in_the_adapter():
    task = Task("n", [{"role": "system", "content": "S"}, {"role": "user", "content": "Take notes."}], "7", {"topic": "cats"})
    env = Episode(Notes(), max_steps=3)
    assert [schema["function"]["name"] for schema in env.tools] == ["write"]  # not reset, get_reward or _count
    messages = env.reset(task)
    assert messages[-1]["content"] == "Take notes. (topic: cats)" and task.prompt[-1]["content"] == "Take notes."  # as TRL appends it
    assert env.env.row == {"prompt": task.prompt, "answer": "7", "topic": "cats"}  # every column, as TRL passes them
    assert env.step(format_tool_call("write", {"text": "a"})).observation == [{"role": "tool", "content": "1 notes"}]
    final = env.step("<answer>7</answer>")
    assert final.info["correct"] and final.info["env_reward"] == {"Notes": 0.5}  # named after the class, as TRL names it
    assert final.reward == 0.5  # the env owns the episode's reward
    env.reset(task)
    cut = env.truncate("max_tokens")  # however the episode ends
    assert cut.info["env_reward"] == {"Notes": 0.0} and cut.info["verdict"] == "no_answer"
    assert check_env(Notes(), [task], n_random=5) == []


def test_task_row_refuses_a_metadata_key_that_would_overwrite_a_column():
    assert Task("a", [], "1", {"x": [1]}).row() == {"prompt": [], "answer": "1", "x": [1]}
    with pytest.raises(ValueError, match="task 'b': metadata key 'answer' would overwrite"):
        Task("b", [], "1", {"answer": "2"}).row()


class NoReset:
    def lookup(self, item: str) -> str:
        """Look up.

        Args:
            item: an item
        """
        return item


class Unhinted:
    def reset(self, **row):
        return None

    def lookup(self, item):
        """Look up.

        Args:
            item: an item
        """
        return item


class Undocumented(Unhinted):
    def lookup(self, item: str, shelf: int) -> str:
        """Look up.

        Args:
            item: an item
        """
        return item


class WordyReward(Unhinted):
    lookup = None

    def get_reward(self) -> float:
        return "high"


class NeedsArguments(MathEnv):
    def __init__(self, size):
        self.size = size


@pytest.mark.parametrize("cls, why", [
    (NoReset, "NoReset has no reset method; TRL calls reset(**row)"),
    (Unhinted, "Unhinted: Argument item is missing a type hint in function lookup"),
    (Undocumented, "Undocumented: Cannot generate JSON schema for lookup because the docstring has no description for the argument 'shelf'"),
    (WordyReward, "WordyReward.get_reward: TypeError: get_reward() returned str 'high', not a finite number"),
    (NeedsArguments, "NeedsArguments() raised TypeError: "),
    ("tests_no_such_module:Shop", "env 'tests_no_such_module:Shop': cannot import"),
])
def test_check_env_class_refuses_a_broken_class_in_one_line(cls, why):
    (problem,) = check_env_class(cls, TASKS[0])
    assert problem.startswith(why) and "\n" not in problem, problem


def test_check_env_class_passes_the_built_in_envs():
    assert check_env_class(MathEnv, TASKS[0]) == check_env_class("helpers.envs:CalculatorEnv", TASKS[0]) == []
    assert check_env_class(Notes) == []  # without a task: the class and its tools only


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


def code_env(max_steps=1, **kwargs):
    """One attempt unless asked (the adapter's default of 10 turns would send feedback after a wrong one)."""
    return make_env("code", allow_unsafe=UNSAFE, max_steps=max_steps, **kwargs)


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
    assert isinstance(make_env("code", allow_unsafe=True).env, CodeEnv)


@pytest.mark.parametrize("world, make_task", [
    ("math", lambda: make_tiny_tasks(1, seed=0, split="test")[0]),
    ("calculator", lambda: make_tiny_tasks(1, seed=0, split="test")[0]),
    ("shop", lambda: make_agent_tasks(1, seed=0, split="test")[0]),
])
def test_a_power_tower_answer_cannot_stall_a_world_that_judges_answers(world, make_task, monkeypatch):
    """Issue 28: `<answer>9^{9^{9}}</answer>` once held the GIL in sympy for minutes; each world's step now returns
    within math-verify's limit (MATH_VERIFY_SECONDS, cut shorter here) with the named verdict."""
    from helpers import formats

    monkeypatch.setattr(formats, "MATH_VERIFY_SECONDS", 0.5)
    formats.judge_answer("<answer>x</answer>", "0.5")  # start math-verify's worker: its start-up is not the check's time
    env = make_env(world, max_steps=5)
    for tower in ("9^{9^{9}}", "2^{2^{2^{5}}}"):
        env.reset(make_task())
        start = time.monotonic()
        result = env.step(f"<answer>{tower}</answer>")
        assert time.monotonic() - start < 5.0, (world, tower)
        assert result.info["stop_reason"] == "answered" and result.info["verdict"] == "check_timeout" and result.reward == 0.0
