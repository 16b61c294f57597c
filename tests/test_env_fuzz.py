"""Property-based: every registered env answers any text, without raising, in bounded time.

Hypothesis builds adversarial turns from the pieces that broke envs before (issue 15):
huge integers in tool-call JSON, deep nesting, control bytes, surrogates, and thousands
of unclosed tags, mixed with the real formats. Bounded for CI: a fixed number of
examples per env (fewer for "code" and "humaneval", where each turn starts a sandbox), derandomized so a
failure reproduces, and a per-turn time limit.
"""

import os
import time

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from helpers.data import Task, load_dataset
from helpers.envs import StepResult, list_envs, load_code_tasks, make_env
from helpers.formats import format_tool_call
from helpers.sandbox import Limits, os_isolation

ENVS = list_envs()  # what `import helpers.envs` registers (tests that register more run later)
SECONDS_PER_TURN = 5.0  # generous for a loaded 2-core CI machine; a quadratic parser blows past it
CODE_TASK = load_code_tasks()[0]
# One task for every env but "code": the metadata of each built-in task kind (an env ignores what it does not read).
TASK = Task("fuzz", [{"role": "user", "content": "What do 6 of my usual items cost?"}], "42",
            {"expression": "6*7", "item": "apple", "prices": {"apple": 7, "pear": 3}})
SANDBOXED = {"allow_unsafe": not os_isolation(), "limits": Limits(wall_seconds=3, cpu_seconds=2)}
KWARGS = {"code": SANDBOXED, "humaneval": {**SANDBOXED, "timeout": 1.0}}
# The envs whose tasks carry what no other task does (the benchmarks, the games, the trail's rooms) play a task of
# their own dataset (a benchmark's extra: skipped without it, failed in CI).
BENCHMARK_DATASETS = {"humaneval": "humaneval", "reasoning_gym": "reasoning_gym/products:max_digits=2", "kuhn_poker": "kuhn_poker",
                      "reasoning_gym_calculator": "tiny-products", "trail": "tiny-trail",
                      "bfcl": "bfcl/simple_python", "bfcl_multiturn": "bfcl/multi_turn_base:GorillaFileSystem"}


def task_for(name: str) -> Task:
    if name == "code":
        return CODE_TASK
    if name not in BENCHMARK_DATASETS:
        return TASK
    try:
        return load_dataset(BENCHMARK_DATASETS[name], "test", 1)[0]
    except ImportError as e:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(str(e))

PIECES = ["<tool_call>", "</tool_call>", "<answer>", "</answer>", "```python\n", "```", "\\boxed{", "}", "####", "{", "[", "]",
          '"name"', '"arguments"', '"calculator"', '"expression"', ":", ",", "\x00", "\x1b[2J", "\udcff", "\u202e", "9" * 5000,
          "def add(a, b):\n    return a + b\n", "import os\nos.fork()\n", "1,000", "-", ".", '"lookup"', '"item"', '"apple"']


ISSUE_CASES = [
    '<tool_call>{"name": "calculator", "arguments": {"expression": ' + "9" * 5000 + "}}</tool_call>",  # ValueError before
    "<tool_call>" + "[" * 1000 + "]" * 1000 + "</tool_call>",  # RecursionError before
    "<tool_call>" * 20_000,  # quadratic before: 8,000 tags took 4 s
    "```python\n" * 20_000,  # the same for code blocks
    "\x00\x01\x1b[2J\udcff\r\x7f" * 1000,  # control bytes, a lone surrogate
]


turns = st.one_of(
    st.text(max_size=300),  # any unicode, control characters and lone surrogates included
    st.lists(st.sampled_from(PIECES), max_size=40).map("".join),  # real tags, broken and mixed
    st.tuples(st.sampled_from(["<tool_call>", "<answer>", "```python\n", "\\boxed{", "{", "[", "1,"]), st.integers(1, 200_000)).map(lambda p: p[0] * p[1]),
    st.integers(1, 1500).map(lambda depth: "<tool_call>" + "[" * depth + "]" * depth + "</tool_call>"),  # deep JSON
    st.integers(1, 6000).map(lambda digits: '<tool_call>{"name": "calculator", "arguments": {"expression": -' + "7" * digits + "}}</tool_call>"),  # huge ints
    st.tuples(st.text(max_size=20), st.dictionaries(st.text(max_size=10), st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
              lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=10), max_size=3))
    .map(lambda p: format_tool_call(*p)),  # well-formed JSON, any name and arguments
    st.text(alphabet="0123456789+-*/().^ ", max_size=60).map(lambda e: format_tool_call("calculator", {"expression": e})),
)


@pytest.mark.parametrize("name", ENVS)
def test_every_env_answers_any_text(name):
    task = task_for(name)
    env = make_env(name, **KWARGS.get(name, {}))

    @settings(max_examples=25 if name in ("code", "humaneval") else 100, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.lists(turns, min_size=1, max_size=3))
    def episode(actions):
        env.reset(task)
        for action in actions:
            start = time.perf_counter()
            result = env.step(action)
            elapsed = time.perf_counter() - start
            assert isinstance(result, StepResult) and isinstance(result.reward, float)
            assert elapsed < SECONDS_PER_TURN, f"{name}: {elapsed:.1f} s for a turn of {len(action)} characters"
            if result.done:
                break

    for case in ISSUE_CASES:  # always tried, before the generated examples
        episode = example([case])(episode)
    episode()
