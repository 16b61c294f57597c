"""Environment module (环境模块): TRL's environment contract, the one adapter, the built-in envs, the registry, the checkers.

    from helpers.envs import make_env, check_env
    env = make_env("calculator", max_steps=5)     # an Episode driving a fresh CalculatorEnv()
    messages = env.reset(task)                    # CalculatorEnv().reset(**task.row()); the prompt
    result = env.step(assistant_text)             # StepResult(observation, reward, terminated, truncated, info)

An environment is a class on TRL's contract (``base.py``): ``reset(**row)``, public typed methods
with Google-style docstrings as its tools, optionally ``get_reward()``; the same class goes to
``trl.GRPOTrainer(environment_factory=...)``. ``Episode`` (``episode.py``) is the one generic
adapter that gives any such class the teaching ``step(text)``.

Built-in envs (registry name -> class):

    "math"        MathEnv        one answer, reward 1 if the number is right
    "calculator"  CalculatorEnv  multi-turn: call the calculator(expression) tool, then answer
    "code"        CodeEnv        write a Python function; reward = fraction of tests passed (sandboxed, judged outside)

The worlds register theirs (``helpers.worlds``: "shop", "propose"); ``make_env("package.module:ClassName")``
takes any class on the contract, and ``check_env_class`` says whether one follows it.

What counts as an answer is decided in ``helpers.formats`` (``judge_answer``), not here.

Taught in notebooks/02_environment.ipynb.
"""

from helpers.envs.anchors import anchor_for, register_anchor, tool_history
from helpers.envs.base import INFO_KEYS, STOP_REASONS, TRUNCATED, EnvError, StepResult, clip_observation, new_info, tool_methods, tool_schemas, tool_signatures, typed_arguments
from helpers.envs.calculator import CalculatorEnv
from helpers.envs.check import EnvCheckError, check_env, check_env_class
from helpers.envs.code_env import CodeEnv, extract_code, load_code_tasks, parse_test, run_tests
from helpers.envs.episode import LIMITS, Episode, call_with_timeout
from helpers.envs.math_env import MathEnv
from helpers.envs.registry import import_env_class, list_envs, make_env, new_env, register_env

register_env("math", MathEnv)
register_env("calculator", CalculatorEnv)
register_env("code", CodeEnv)
for _name in ("math", "calculator", "code"):  # deterministic tools: the calls so far and their results are the state
    register_anchor(_name, tool_history)

__all__ = [
    "INFO_KEYS",
    "LIMITS",
    "STOP_REASONS",
    "TRUNCATED",
    "CalculatorEnv",
    "CodeEnv",
    "EnvCheckError",
    "EnvError",
    "Episode",
    "MathEnv",
    "StepResult",
    "anchor_for",
    "call_with_timeout",
    "check_env",
    "check_env_class",
    "clip_observation",
    "extract_code",
    "import_env_class",
    "list_envs",
    "load_code_tasks",
    "make_env",
    "new_env",
    "new_info",
    "parse_test",
    "register_anchor",
    "register_env",
    "run_tests",
    "tool_history",
    "tool_methods",
    "tool_schemas",
    "tool_signatures",
    "typed_arguments",
]
