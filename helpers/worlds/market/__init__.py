"""The tiny market (小市场): one agent, three worlds, one run, as TRL's multi-environment training mixes them.

A market of environments is most useful when one agent trains on several at once. TRL's
``GRPOTrainer`` does it with ``environment_factory={"shop": ..., "calculator": ...}`` and a dataset
whose ``environment`` column picks each row's env; the workbook's loop does the same with a mixed
dataset (``helpers.data.mix_datasets``): each task names its environment, each episode is played
by that environment and judged by it, and the run reports each environment beside the whole.

    tiny-agent@shop                              the shop world: usual() -> lookup(item) -> calculator(...)
    tiny@calculator                              the one-call world: "What is 47*86?" with the calculator
    tiny-products@reasoning_gym_calculator       reasoning-gym's products generator, its verifier, the calculator

The world's files:

    build.py    the warm start data/tiny-market (python -m helpers.worlds.market build): SFT of the shop's
                tiny agent on demonstrations of all three worlds, and its baseline per world
    presets.py  tiny-mix: GRPO on the mix; the held-out success of each world is logged and should rise

    python -m helpers.train --preset tiny-mix
    python -m helpers.train --preset tiny-mix --env-class calculator=mypkg.calc:Calculator   # your class plays one world

Taught in notebooks/10_environment_market.ipynb.

Simplifications, named:

* One reward for every row (``config.rewards``, as TRL's ``reward_funcs`` apply to every row); what
  differs per world is the judging: each environment's verdict (its ``_judge`` or ``judge_answer``)
  and, where an env has one, its ``get_reward`` on its own rows only.
* The three worlds share one chat template and one tool format (Qwen2.5's); each prompt lists only
  its own environment's tools, as TRL renders them.
"""

from helpers.worlds.market import presets  # noqa: F401  (register the preset "tiny-mix")
