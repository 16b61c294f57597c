"""Environment module (环境模块): the Env contract, the built-in envs, the registry, the checker.

    from helpers.envs import make_env, check_env
    env = make_env("calculator", max_steps=5)
    messages = env.reset(task)
    result = env.step(assistant_text)     # StepResult(observation, reward, terminated, truncated, info)

Built-in envs (registry name -> class):

    "math"        MathEnv        one answer, reward 1 if the number is right
    "calculator"  CalculatorEnv  multi-turn: call a calculator tool, then answer
    "code"        CodeEnv        write a Python function; reward = fraction of tests passed (sandboxed, judged outside)

What counts as an answer is decided in ``helpers.formats`` (``judge_answer``), not here.
"""

from helpers.envs.base import INFO_KEYS, STOP_REASONS, TRUNCATED, Env, EnvError, StepResult, clip_observation, new_info
from helpers.envs.calculator import CALCULATOR, CalculatorEnv
from helpers.envs.check import EnvCheckError, check_env
from helpers.envs.code_env import CodeEnv, extract_code, load_code_tasks, parse_test, run_tests
from helpers.envs.math_env import MathEnv
from helpers.envs.registry import list_envs, make_env, register_env
from helpers.envs.tools import Tool, ToolEnv, call_with_timeout

register_env("math", MathEnv)
register_env("calculator", CalculatorEnv)
register_env("code", CodeEnv)

__all__ = [
    "CALCULATOR",
    "INFO_KEYS",
    "STOP_REASONS",
    "TRUNCATED",
    "CalculatorEnv",
    "CodeEnv",
    "Env",
    "EnvCheckError",
    "EnvError",
    "MathEnv",
    "StepResult",
    "Tool",
    "ToolEnv",
    "call_with_timeout",
    "check_env",
    "clip_observation",
    "extract_code",
    "list_envs",
    "load_code_tasks",
    "make_env",
    "new_info",
    "parse_test",
    "register_env",
    "run_tests",
]
