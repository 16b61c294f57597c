"""The game world's held-out hands: every deal in both seats, against an opponent (dataset "kuhn_poker").

    tasks = load_dataset("kuhn_poker", "test", 120)     # 6 deals x 2 seats x 10 seeds of the random opponent

A task is one hand: the prompt is the system prompt and an empty user message (``KuhnPokerEnv.reset``
appends the first observation), the metadata the ``deal``, the policy's ``seat``, the ``opponent``
and its seed. Seats alternate (any even number of hands is seats balanced) and deals take turns,
so any multiple of 12 hands holds each deal in each seat equally often. There is no training
split: self-play makes its own hands.
"""

from __future__ import annotations

from helpers.data import Task, register_dataset
from helpers.worlds.games.game import DEALS, SYSTEM


def make_hands(n: int, seed: int = 0, opponent: str = "random") -> list[Task]:
    """``n`` hands: seats alternate, deals in turn (12 combinations), the opponent's seed from ``seed`` and the hand's index."""
    tasks = []
    for i in range(n):
        deal, seat = DEALS[(i // 2) % len(DEALS)], i % 2
        prompt = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ""}]
        metadata = {"deal": list(deal), "seat": seat, "opponent": opponent, "opponent_seed": seed * 1_000_003 + i}
        tasks.append(Task(f"kuhn-{seed}-{i:05d}", prompt, None, metadata))
    return tasks


@register_dataset("kuhn_poker")
def kuhn_dataset(split: str, n: int | None, seed: int) -> list[Task]:
    """Held-out hands against the random opponent (``n`` default 120); self-play needs no training split."""
    if split == "train":
        raise ValueError("kuhn_poker has no training split: its training hands are played by the collector (helpers.worlds.games.collect)")
    return make_hands(n if n is not None else 120, seed=seed)
