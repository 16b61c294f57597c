"""The worlds (世界): each a folder holding its tasks, its environment, its presets and its warm start.

    import helpers.worlds              # registers every built-in world's datasets, envs, presets and collectors

    arithmetic/   the one-call world: copy the question into the calculator (tiny-cpu)
    shop/         the multi-step shop world: usual() -> lookup(item) -> calculator(...) (tiny-agent)
    market/       one agent on three worlds at once, each row played by its own env (tiny-mix; TRL's multi-environment)
    trail/        the long-horizon world: go(door) through six rooms, then the exit's code (tiny-long-horizon)
    selfplay/     one policy proposes tasks and solves them (tiny-selfplay, tiny-selfplay-fixed)
    games/        two-player zero-sum games: self-play in Kuhn poker with a baseline per seat (tiny-kuhn)
    bfcl/         BFCL's categories by BFCL's own checkers; its multi-turn simulators as a world (bfcl-multiturn-smoke)
    gsm8k/        GSM8K on Qwen2.5 (gsm8k-24gb(-tools), gsm8k-t4(-tools), and CPU smoke presets)
    reasoning_gym/  reasoning-gym's generators, "reasoning_gym/<generator>", each scored by its own verifier (reasoning-gym-cpu)
    humaneval/    HumanEval's 164 problems, their own tests run in the workbook's sandbox (a benchmark: test split only)
    gaia/         GAIA's validation questions (gated: a Hugging Face token), scored by the leaderboard's question_scorer (a benchmark)
    tinymodel.py  the tiny-model toolkit the tiny worlds share: chat template, tokenizer, model shape, save/load

A world plugs into the lower layers through their registries only (``register_dataset``,
``register_env``, ``register_preset``, ``register_collector``, ``register_reward``,
``register_benchmark``), so the loop, the rollout and the trainer never import a world; the
commands (``helpers.train``, ``helpers.evaluate``) import this package to have them all.
"""

from helpers.worlds import arithmetic, bfcl, gaia, games, gsm8k, humaneval, market, reasoning_gym, selfplay, shop, trail  # noqa: F401
