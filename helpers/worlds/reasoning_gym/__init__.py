"""The reasoning-gym world: reasoning-gym's procedural generators as datasets, each scored by its own verifier.

reasoning-gym (``pip install -e '.[benchmarks]'``) makes questions from a seed, about 100 kinds
(arithmetic, algebra, logic, games, graphs, ...), and scores an answer with each generator's own
``score_answer``. This world plugs it into the workbook's registries:

    tasks.py    datasets "reasoning_gym/<generator>[:config]" with leak-free splits, and the verifier (score_reply)
    env.py      ReasoningGymEnv ("reasoning_gym"): one turn, judged by the verifier; the reward part
                "reasoning_gym"; the benchmark "reasoning_gym" (python -m helpers.evaluate --benchmark ...)
    presets.py  reasoning-gym-cpu: the path on a CPU with the tiny model

    tasks = load_dataset("reasoning_gym/chain_sum", "test", 64)
    python -m helpers.train --preset reasoning-gym-cpu
    python -m helpers.evaluate --benchmark reasoning_gym/chain_sum --n 64

Importing this world imports nothing of reasoning-gym: the package is imported where a task is
made or scored, and without it that is an ``ImportError`` naming the extra.
"""

from helpers.worlds.reasoning_gym import env, presets, tasks  # noqa: F401  (register the family, env, reward, benchmark, preset)
