"""The BFCL world: the Berkeley Function Calling Leaderboard's data, official checkers and multi-turn simulators.

``bfcl-eval`` (BFCL v4) ships the categories' entries, their ground truth, the AST and multi-turn checkers
and the stateful API simulators. Its checkers import every provider SDK, with pins that clash with the
workbook's, so BFCL's own code runs in an environment of its own that the workbook makes on first use,
called through a subprocess with JSON (``official``); nothing here rewrites its logic.

    official.py  the isolated environment (~/.cache/agentic-rl-workbook/bfcl-venv) and the worker client; bfcl_evaluate
    worker.py    runs inside it: BFCL's loaders, its checkers (as ``bfcl evaluate`` calls them), its simulators
    tasks.py     the datasets "bfcl/<category>" (the benchmark, test only) and "bfcl-splits/<category>" (80/10/10);
                 BFCL's ground truth written as model output (reference_result)
    env.py       BfclEnv ("bfcl": one reply, BFCL's AST checker), BfclMultiTurnEnv ("bfcl_multiturn": the simulators
                 as tools, BFCL's multi-turn checker as get_reward), the benchmark "bfcl"
    presets.py   bfcl-multiturn-smoke (CPU, tiny agent), bfcl-multiturn-24gb (GPU, Qwen2.5-1.5B-Instruct)

    python -m helpers.evaluate --benchmark bfcl --answers result/             # BFCL's result files: per-category accuracy
    python -m helpers.evaluate --benchmark bfcl/simple_python --preset tiny-agent --n 20     # a model, one category
    python -m helpers.train --preset bfcl-multiturn-smoke                    # the simulators as a world (CPU smoke)
"""

from helpers.worlds.bfcl import env, presets, tasks  # noqa: F401  (register the datasets, envs, presets and the benchmark)
