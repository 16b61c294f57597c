"""Self-play's step in a two-player game: the policy plays both seats, each seat gets its own baseline.

    hands = play_hands(policy, config, step)                             # both seats sampled from the current policy
    read, baselines = update_baselines(baselines, hands.returns, decay)  # per hand and seat: read b, then update it
    advantages = rae_advantages(hands.chips, baseline_of_each_move)      # A = R - b[game, seat]: (N, 1)

``GameCollector`` hands each step's moves to the training loop (``helpers.loop``) as one batch:
every move the policy made is one single-turn episode (its prompt is the conversation of its seat
so far, ``game.conversation``), paid the chips its seat won in the hand. The formula and a worked
example of the role-conditioned advantages are in the world's docstring (``helpers.worlds.games``).

``config.opponent`` says who sits in the other seat:

    "self"   both seats are the current policy, and both seats' moves are trained (self-play)
    "warm"   the frozen warm start (its exact move table, sampled) sits in one seat, seats alternating by
             hand; only the policy's seat is trained: the fixed-opponent control
    "pool"   a past policy (a snapshot of its move table, one taken every ``pool_every`` steps, the
             warm start first) drawn each step: fictitious self-play, against cycling

Same compute: "warm" and "pool" play twice as many hands per step (``2 * hands_per_step``), so the
policy makes as many moves, and the update trains on as many, as in self-play.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import torch

from helpers.config import TrainConfig
from helpers.data import Task
from helpers.evaluation import episode_stats
from helpers.grpo import Advantages
from helpers.loop import Collected, register_collector, step_seed
from helpers.policy import SamplingParams
from helpers.rewards import reward_report
from helpers.rollout import rollout
from helpers.worlds.games.env import MoveEnv
from helpers.worlds.games.game import DEALS, GAME, MOVES, Match, conversation
from helpers.worlds.games.strength import exploitability, head_to_head, illegal_mass, move_table, table_from_bets

OPPONENTS = ("self", "warm", "pool")
UNIFORM = table_from_bets(dict.fromkeys(["0", "0pb", "1", "1pb", "2", "2pb", "1p", "1b", "2p", "2b", "0p", "0b"], 0.5))


@dataclass
class GameConfig(TrainConfig):
    # --- self-play in a game (the fields above are the main loop's, with the same meanings) ----------
    collect: str = "games"  # the loop makes each step's batch with GameCollector (below)
    hands_per_step: int = 16  # hands of self-play per step (~2.2 moves each, every one trained); "warm"/"pool" play 2x
    opponent: str = "self"  # "self" (self-play), "warm" (the frozen warm start: the control), "pool" (past policies)
    rae: bool = True  # role-conditioned advantages A = R - b[game, seat]; False: A = R (no baseline)
    rae_decay: float = 0.95  # SPIRAL's: each seat's baseline is an EMA of its games' returns, b <- decay * b + (1 - decay) * R
    pool_every: int = 10  # "pool": a snapshot of the policy joins the pool every this many steps


# ----------------------------------------------------------------------------------------------
# Role-conditioned advantages (SPIRAL's RAE)
# ----------------------------------------------------------------------------------------------


def update_baselines(baselines: dict[str, float], returns: list[tuple[int, float]], decay: float):
    """SPIRAL's role baselines, one game at a time: each (game, seat) is read, then moved toward the game's return.

        read      = b[game, seat]                                  # what this game's moves of the seat subtract
        b[game, seat] <- decay * b[game, seat] + (1 - decay) * R   # then the update, with the seat's return R

    returns: one (seat, R) per game and trained seat, in the order the games were played (a seat that moves twice
    in a hand still counts once). The baseline is read before its update, so a game's own return is not in the
    baseline it subtracts (SPIRAL: "get the baseline before updating to be unbiased"). Returns (the baselines read,
    one per entry of ``returns``; the new baselines, a new dict). A seat never seen starts at 0, as SPIRAL's EMA does.

    >>> read, after = update_baselines({}, [(0, -2.0), (1, 2.0), (0, 1.0), (1, -1.0)], 0.95)
    >>> [round(b, 3) for b in read], {key: round(b, 3) for key, b in after.items()}
    ([0.0, 0.0, -0.1, 0.1], {'kuhn_poker/seat0': -0.045, 'kuhn_poker/seat1': 0.045})
    """
    new, read = dict(baselines), []
    for seat, R in returns:
        key = f"{GAME}/seat{seat}"
        read.append(new.get(key, 0.0))
        new[key] = decay * read[-1] + (1 - decay) * R
    return read, new


def rae_advantages(chips, baselines=None):
    """``Advantages`` of shape (N, 1), one move per row: ``A = R - b``, with ``baselines`` the (N,) baseline each move
    subtracts (its seat's baseline as read for its game, ``update_baselines``); None: ``A = R`` (no RAE).

    >>> rae_advantages([-2.0, 2.0, 1.0, -1.0], [0.0, 0.0, -0.1, 0.1]).advantages.flatten()
    tensor([-2.0000,  2.0000,  1.1000, -1.1000])
    """
    R = torch.tensor(chips, dtype=torch.float32)  # (N,)
    b = torch.zeros_like(R) if baselines is None else torch.tensor(baselines, dtype=torch.float32)  # (N,)
    A = (R - b).unsqueeze(1)  # (N, 1): each move is its own "group" of one
    return Advantages(A, (A == 0).squeeze(1))  # (N,) a move with advantage exactly 0 carries no signal


# ----------------------------------------------------------------------------------------------
# One step of play: hands, both seats' moves sampled in batches
# ----------------------------------------------------------------------------------------------


@dataclass
class Hands:
    """One step's hands and the policy's moves in them."""

    matches: list  # Match per hand
    moves: list  # the policy's moves: single-turn Trajectories, reward = the chips its seat won
    seats: list[int]  # the seat of each move
    learner: list  # per hand, the policy's seat (None: both seats, self-play)

    @property
    def chips(self) -> list[float]:
        return [t.reward for t in self.moves]

    @property
    def keys(self) -> list[tuple[int, int]]:
        """(hand, seat) of each move."""
        return list(zip(_hand_of(self.moves), self.seats))

    @property
    def trained(self) -> list[tuple[int, int]]:
        """(hand, seat) of each trained seat of each hand, in hand order: both seats in self-play, the policy's
        seat against a fixed opponent (SPIRAL trains, and keeps a baseline for, the online player only)."""
        return [(h, s) for h, seat in enumerate(self.learner) for s in ((0, 1) if seat is None else (seat,))]

    @property
    def returns(self) -> list[tuple[int, float]]:
        """(seat, chips won) of each trained seat of each hand (``trained``): what the role baselines learn from."""
        return [(s, self.matches[h].returns()[s]) for h, s in self.trained]


def sample_move(row: dict[str, float], rng: random.Random) -> str:
    """A move drawn from one state's row of a move table (legal moves only)."""
    return MOVES[0] if rng.random() < row[MOVES[0]] else MOVES[1]


def play_hands(policy, config: GameConfig, step: int, opponent_table: dict | None = None) -> Hands:
    """Play a step's hands. ``opponent_table`` None: self-play, ``hands_per_step`` hands, both seats the policy;
    else ``2 * hands_per_step`` hands, the policy in seat 0 of even hands and seat 1 of odd ones, the table's
    moves (sampled) in the other seat. Each round, every hand waiting for the policy moves in one batched rollout."""
    rng = random.Random(step_seed(config.seed, step))
    n = config.hands_per_step * (1 if opponent_table is None else 2)
    matches = [Match(DEALS[rng.randrange(len(DEALS))]) for _ in range(n)]
    learner = [None if opponent_table is None else i % 2 for i in range(n)]
    moves, seats = [], []
    for turn in range(4):  # a hand has at most 3 moves; the last pass only lets the table answer
        for i, m in enumerate(matches):
            if not m.done and learner[i] is not None and m.to_move != learner[i]:
                m.play_move(sample_move(opponent_table[m.key(m.to_move)], rng))
        waiting = [i for i, m in enumerate(matches) if not m.done]
        if not waiting:
            break
        tasks = [Task(f"hand-{step}-{i}-{turn}", conversation(matches[i].key(matches[i].to_move)), None,
                      {"legal_moves": matches[i].legal_moves()}) for i in waiting]
        sampling = SamplingParams(config.max_new_tokens, config.temperature, config.top_p, seed=step_seed(config.seed, step) * 4 + turn)
        played = rollout(tasks, MoveEnv, policy, group_size=1, sampling=sampling, max_steps=1,
                         max_total_tokens=config.max_total_tokens, progress=False)
        for i, t in zip(waiting, played):
            seats.append(matches[i].to_move)
            matches[i].play(t.completion_text)  # an illegal reply forfeits the hand
            moves.append(t)
    for t, seat, hand in zip(moves, seats, _hand_of(moves)):
        t.reward = matches[hand].returns()[seat]
        t.reward_parts = {"chips": t.reward}
        t.info["seat"] = seat
    return Hands(matches, moves, seats, learner)


def _hand_of(moves: list) -> list[int]:
    """The hand index of each move (from its task id, ``hand-<step>-<hand>-<turn>``)."""
    return [int(t.task_id.split("-")[2]) for t in moves]


# ----------------------------------------------------------------------------------------------
# The collector
# ----------------------------------------------------------------------------------------------

# The live figure's panels (as helpers.live.PANELS: title, y label, [(metric, legend)]).
PANELS = [
    ("exploitability (exact; Nash = 0)", "chips per hand", [("strength/exploitability", "policy before the step's update")]),
    ("head to head (exact, seats balanced)", "chips per hand", [("strength/vs_warm", "vs the warm start"), ("strength/vs_random", "vs uniform random")]),
    ("held-out hands vs random opponent", "win rate", [("eval/success", "greedy"), ("eval/pass@1", "sampled")]),
    ("role baselines (RAE)", "chips", [("rae/baseline_seat0", "player 1"), ("rae/baseline_seat1", "player 2")]),
    ("KL to reference", "KL", [("kl", "k3 estimate")]),
    ("step time split", "seconds", [("t_rollout", "rollout"), ("t_reward", "reward + measures"), ("t_update", "update")]),
]

LINE_FIELDS = [
    ("strength/exploitability", "expl {:.3f}"),
    ("strength/vs_warm", "vs warm {:+.3f}"),
    ("game/illegal_moves", "illegal {:.3f}"),
    ("kl", "kl {:.4f}"),
    ("eval/success", "EVAL win vs random {:.3f}"),
]


def strength(table: dict, warm: dict) -> dict:
    """The exact measures of a move table: exploitability, chips per hand vs the warm start and vs uniform random."""
    return {"exploitability": exploitability(table), "vs_warm": head_to_head(table, warm),
            "vs_random": head_to_head(table, UNIFORM), "illegal": illegal_mass(table)}


@register_collector("games")
class GameCollector:
    """The training loop's collector for a two-player game (``config.collect = "games"``).

    Each step: the policy's exact move table is measured (exploitability, head to head), the
    step's hands are played (``play_hands``; the opponent as ``config.opponent`` says), the seats'
    baselines updated and the advantages computed (``rae_advantages``). State saved with every
    checkpoint: the baselines, the warm start's table and the pool. summary.json gets
    ``strength`` (before, after, and the curve: one list per measure, by number of updates) and the
    move tables before and after (rounded to 6 decimals).
    """

    panels = PANELS
    line_fields = LINE_FIELDS

    def __init__(self, config: GameConfig, policy, make_env, reward):
        if config.opponent not in OPPONENTS:
            raise ValueError(f"opponent must be one of {OPPONENTS}, got {config.opponent!r}")
        if not hasattr(policy, "model"):
            raise ValueError("the game world reads the policy's exact move table from its model: use backend='hf'")
        self.config, self.policy = config, policy
        self.warm = self.table()  # made before any update (or checkpoint load): the warm start's table
        self.before = strength(self.warm, self.warm)
        self.baselines: dict[str, float] = {}
        self.pool: list[dict] = [self.warm]

    def table(self) -> dict:
        return move_table(self.policy.model, self.policy.tokenizer)

    def __call__(self, step: int) -> Collected:
        c = self.config
        t0 = time.perf_counter()
        table = self.table()  # the policy that plays this step's hands
        measured = {f"strength/{k}": v for k, v in strength(table, self.warm).items()}
        if c.opponent == "pool" and step > 1 and (step - 1) % c.pool_every == 0:
            self.pool.append(table)
        t_measure = time.perf_counter() - t0
        opponent = {"self": None, "warm": self.warm, "pool": random.Random(step_seed(c.seed, step)).choice(self.pool)}[c.opponent]
        hands = play_hands(self.policy, c, step, opponent)
        t1 = time.perf_counter()
        read, self.baselines = update_baselines(self.baselines, hands.returns, c.rae_decay)
        of = dict(zip(hands.trained, read))  # (hand, seat) -> the baseline that hand's moves of the seat subtract
        advantages = rae_advantages(hands.chips, [of[k] for k in hands.keys] if c.rae else None)  # (N, 1)
        illegal = [t.info.get("verdict") == "illegal_move" for t in hands.moves]
        metrics = {**reward_report(hands.moves).metrics(), **episode_stats(hands.moves), **measured,
                   "game/hands": len(hands.matches), "game/moves": len(hands.moves),
                   "game/illegal_moves": sum(illegal) / len(illegal),
                   **{f"game/chips_seat{s}": _mean(t.reward for t, seat in zip(hands.moves, hands.seats) if seat == s) for s in (0, 1)},
                   **{f"rae/baseline_seat{s}": self.baselines.get(f"{GAME}/seat{s}") for s in (0, 1)}}
        return Collected(hands.moves, advantages, metrics, t_measure + time.perf_counter() - t1)

    def state_dict(self) -> dict:
        return {"baselines": self.baselines, "warm": self.warm, "pool": self.pool}

    def load_state_dict(self, state: dict) -> None:
        self.baselines, self.warm, self.pool = state["baselines"], state["warm"], state["pool"]

    def summary(self, history: list[dict]) -> dict:
        table = self.table()  # after the last update
        after = strength(table, self.warm)
        # measured before step s's update, i.e. the policy after s - 1 updates; then the one after the last update
        points = [(m["step"] - 1, {k.split("/")[1]: m[k] for k in m if k.startswith("strength/")}) for m in history if m["step"] > 0]
        points.append((self.config.steps, after))
        curve = {"step": [s for s, _ in points], **{k: [round(p[k], 4) for _, p in points] for k in after}}
        return {"strength": {"before": self.before, "after": after, "curve": curve}, "opponent": self.config.opponent,
                "rae": self.config.rae, "tables": {"before": _rounded(self.warm), "after": _rounded(table)}}


def _rounded(table: dict) -> dict:
    return {key: {move: round(p, 6) for move, p in row.items()} for key, row in table.items()}


def _mean(values) -> float | None:
    values = list(values)
    return sum(values) / len(values) if values else None
