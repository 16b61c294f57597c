"""Self-play (自我博弈): one policy proposes tasks and solves them; the curriculum climbs by itself.

Agentic RL needs tasks, not answers; self-play needs not even the tasks. One policy (one
LoRA adapter) plays two roles, told apart only by the prompt:

* the **proposer** (system prompt ``PROPOSER_SYSTEM``) writes a new task in the world's
  grammar, ``<task>A*B</task>``; the env (``env.py``) checks it and
  computes its answer itself, so no label is needed. An invalid task is never solved;
* the **solver** (the one-call world's prompt, "What is A*B?", with the calculator)
  attempts every valid proposed task G times and is paid by outcome (``correct``).

The proposer is paid for tasks at the edge of the solver's ability. With p the solver's
success rate over its G attempts of a task (Absolute Zero, Zhao et al. 2025):

    r_propose = 1 - p    if 0 < p < 1                                   (learnability)
                0        if p = 0 (never solved) or p = 1 (always solved)
               -0.5      if the task is invalid (``invalid_reward``; Absolute Zero's: -0.5 well-formed, -1 malformed)

Worked example, G = 4 attempts per task:

    task        attempts   p      r_propose   why
    12*34       1 1 1 1    1.00   0           always solved: too easy, the solver learns nothing
    47*86       1 1 1 0    0.75   0.25        mostly solved
    123*45      1 0 0 0    0.25   0.75        at the edge: pays most
    987*654     0 0 0 0    0.00   0           never solved: too hard (or impossible), no signal either
    <task>47*   -          -      -0.5        invalid: the env refuses it, the proposer pays a penalty

Each role is then a GRPO group with its own baseline (SPIRAL's role-conditioned
advantages, in their simplest form): the P proposals sampled from one proposer prompt are
one group, the G attempts of one task are another,

    A_propose = (r_propose - mean over the P proposals) / std           (K, P)
    A_solve   = (r_solve   - mean over the task's G attempts) / std     (V, G)

and both go into one ``LoRAGRPO.update``. One baseline for everything would mix two
different reward scales (0/1 outcomes and learnability) and two different questions
(notebook 09 §2 makes the same argument for a game's two seats).

The proposer's advantages are then multiplied by ``proposer_weight`` (10 in the preset): the
loss averages over tokens (dapo), and the proposer's 16 replies of ~18 tokens are a few per
cent of a batch next to the solver's 128 episodes, so at weight 1 the solver's tokens drown
its signal. The adapter is shared, so the solver's own step stays small (lr 1e-3, and
``beta`` = 0.1 of KL to the warm start): larger steps made the greedy held-out success fall.

Why a penalty for invalid tasks and not just 0: once most valid tasks are trivial (paid 0),
an invalid one paid 0 is exactly as good, and nothing keeps the proposer in the grammar.

The world's files:

    env.py      ProposerEnv ("propose"): checks a proposal and computes its answer
    tasks.py    the solver's tasks and the fixed held-out set (dataset "selfplay")
    collect.py  play_round, the per-role advantages, SelfPlayCollector (the loop's step for self-play)
    presets.py  tiny-selfplay, and tiny-selfplay-fixed (the same compute on a fixed dataset)
    build.py    the warm start data/tiny-selfplay (python -m helpers.worlds.selfplay build)

    python -m helpers.train --preset tiny-selfplay        # the self-play run (the one loop, SelfPlayCollector)
    python -m helpers.train --preset tiny-selfplay-fixed  # the same compute on a fixed dataset, for comparison

Simplifications, named:

* The one-call world, one operation: a task is a product of two numbers of 2-3 digits;
  difficulty is their digits together (4..6).
* P = G (``num_generations``): a proposer group has as many samples as a solver group,
  so both roles' groups stack into one (K + V, G) advantage tensor and one update.
* The proposer prompt never changes (no examples of earlier tasks in it, unlike Absolute
  Zero): what it proposes changes only because its adapter does.
* Proposals are not kept from the held-out tasks (256 of the ~980,000 possible tasks);
  the fixed-dataset run's training split is kept from them by hash, as usual.
* The solver's batch metrics keep the main loop's names (``reward``, ``success``,
  ``tool_calls`` ...), so the health checks read them unchanged; the proposer's are
  ``proposer/...``.

Taught in notebooks/09_self_play.ipynb.
"""

from helpers.worlds.selfplay import collect, env, presets, tasks  # noqa: F401  (register "propose", "selfplay", the presets, the collector)
