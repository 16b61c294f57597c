"""Self-play in a two-player zero-sum game (自我博弈): Kuhn poker, both seats played by one policy.

A language model plays Kuhn poker (``game.py``: OpenSpiel's rules, written as text) against
itself: every hand, both seats are the current policy, and every move either seat made is trained
on the chips its seat won. In a zero-sum game there is no fixed task to get right: the opponent
improves as the policy does, so what the policy must learn keeps moving, and the end point of
that chase is a Nash equilibrium, a policy no opponent can beat on average.

Why a baseline per seat (role-conditioned advantage estimation, RAE; SPIRAL, Liu et al. 2025,
arXiv 2506.24119): the two seats of one game see different returns. In Kuhn poker player 1 moves
first, shows more, and loses 1/18 chip per hand at the equilibrium; with a weak policy in both
seats the gap can be larger. A move's advantage should say "better than this seat usually does",
so each (game, seat) keeps its own baseline, an exponential moving average of its games' returns. As in SPIRAL's
code, once per game and seat, in the order the games were played, the baseline is read, then updated with the
seat's return in that game:

    A(move)        = R(game, seat of the move) - b[game, seat]     # b as read before this game's update
    b[game, seat] <- decay * b[game, seat] + (1 - decay) * R(game, seat)

(decay ``rae_decay`` = 0.95, SPIRAL's ``role_baseline_ema_gamma``). Reading before updating keeps a game's own return
out of the baseline its moves subtract (SPIRAL: "to be unbiased"); a seat that moves twice in a hand (pass, then
call or fold) gets one update with the hand's return, and both its moves subtract the same baseline.

Worked example (a run's first step: both baselines start at 0, as SPIRAL's do; two hands):

    hand  move                         seat   R    b read   A = R - b   b after the hand
    1     J: bet (a bluff)              1    -2    0        -2          0.95*0 + 0.05*(-2) = -0.10
    1     K: bet (calls the bluff)      2    +2    0        +2          0.95*0 + 0.05*(+2) = +0.10
    2     Q: pass (checked down)        1    +1    -0.10    +1.10       0.95*(-0.10) + 0.05*(+1) = -0.045
    2     J: pass (checked down)        2    -1    +0.10    -1.10       0.95*(+0.10) + 0.05*(-1) = +0.045

Without RAE (``--rae false``) the advantage is the return itself, ``A = R``. A single baseline shared by both seats would be no
better: in self-play both seats' moves are in the batch, and their returns cancel hand by hand
(zero-sum) but not move by move (the seats make different numbers of moves), so a shared mean lies
between the seats' means and is right for neither (notebook 09, §2). What the runs measured with and without RAE is in notebooks/09_self_play.ipynb.

Where this differs from SPIRAL's RAE, named: SPIRAL runs several actor processes, each with its own pair of
baselines, where a run here keeps one pair; SPIRAL trains on a random subset of a step's moves (as many as its
batch), this loop on every move; against a fixed opponent SPIRAL trains one seat per actor, where the control here
alternates the policy's seat hand by hand (updating only that seat's baseline, as SPIRAL does); an illegal reply
costs the player 2 chips and pays the other 2 (zero-sum), where SPIRAL gives -1.5 and +0.5.

Why a KL penalty to the warm start as well (``beta``, the loop's KL term, TRL's name): gradient play in
a zero-sum game need not settle at an equilibrium; it can circle or drift round it, since each seat's
best move changes as the other's does. Pulling toward a fixed reference policy, a "magnet", makes the
last policy settle at a point between the reference and an equilibrium: the idea of magnetic mirror
descent (Sokota et al. 2023, arXiv 2206.05825), in its simplest form. The control gets the same
penalty, so the two runs differ by the opponent alone.

The measures of strength are exact (``strength.py``): the policy's move probabilities at all 12
information states, read from its logits, give its **exploitability** (OpenSpiel's; 0 at a Nash
equilibrium) and its **head-to-head** value against any other table (the warm start, uniform
random, another run's policy), every deal and both seats, no sampling noise.

The world's files:

    game.py      Kuhn poker as text: observations, replies, a hand (Match) on OpenSpiel's state
    env.py       KuhnPokerEnv ("kuhn_poker"): a hand against a plug-in opponent; MoveEnv: one move
    tasks.py     the held-out hands (dataset "kuhn_poker"): every deal in both seats vs a random opponent
    strength.py  the exact move table of a model, exploitability, head to head
    collect.py   play_hands, the role baselines and advantages, GameCollector (the loop's step)
    presets.py   tiny-kuhn (self-play; --opponent warm: the control)
    build.py     the warm start data/tiny-games: imitates a cautious player (python -m helpers.worlds.games build)

    python -m helpers.worlds.games build                              # the warm start (~3.5 min of CPU, one thread)
    python -m helpers.train --preset tiny-kuhn --seed 0               # self-play
    python -m helpers.train --preset tiny-kuhn --seed 0 --opponent warm --out-dir runs/tiny-kuhn-warm-seed{seed}   # the control
    python -m helpers.worlds.games compare runs/tiny-kuhn-seed0 runs/tiny-kuhn-warm-seed0    # exact head to head
    python -m helpers.evaluate --preset tiny-kuhn --adapter runs/tiny-kuhn-seed0/checkpoint-40 --opponent mymodule:my_player

Simplifications, named:

* One game (Kuhn poker); tic-tac-toe is not built (``game.py`` says why).
* Each move is a single-turn episode of its own: its prompt is the seat's conversation so far
  (``game.conversation``), its reward the chips the seat won in the hand. The hand is not one
  multi-turn trajectory, since two seats' turns interleave in it.
* The control's frozen opponent plays the warm start's exact move table (sampled), not the model:
  the same distribution, with the illegal mass left out (the warm start's is 0.002).
* The exact measures are of the policy before each step's update (the policy that played the
  step's hands); summary.json adds the one after the last update.

Taught in notebooks/09_self_play.ipynb.
"""

from helpers.worlds.games import collect, env, presets, tasks  # noqa: F401  (register "kuhn_poker", the preset, the collector)
