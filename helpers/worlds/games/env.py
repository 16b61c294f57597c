"""The game world's environments: a hand against an opponent, and one move of a hand.

``KuhnPokerEnv`` ("kuhn_poker") is a hand of Kuhn poker against an opponent the env plays itself,
on TRL's contract (``reset(**row)``, no tools; each reply is a move, judged by ``_judge``):

    env = make_env("kuhn_poker", max_steps=3)
    env.reset(task)            # task.metadata: deal, seat, opponent ("random" or "module:function"), opponent_seed
    env.step("<answer>bet</answer>")   # the opponent answers; the next observation comes back as a user message,
                                       # or the hand ends: reward = the chips won, verdict "won" / "lost" / ...

The opponent is a plug-in: any function ``(observation: str, legal_moves: list[str]) -> str``
named ``"package.module:function"`` in the task's ``opponent`` column, importing nothing from the
workbook; it is called with the text the policy would read in its seat. ``"random"`` is the
built-in one (a random legal move, drawn from the task's ``opponent_seed``). The plug-in returns
the move itself (``"bet"``), not a tagged reply.

Every way a hand can end has a name (``info["verdict"]``), and none raises:

    won / lost           the hand was played out (fold or showdown); reward = OpenSpiel's payoff
    illegal_move         the policy's reply was not a legal move: it forfeits ILLEGAL_PENALTY chips
    opponent_illegal     the opponent returned something that is not a legal move: it forfeits
    opponent_error       the opponent raised: it forfeits (the exception's type and text in ``info["opponent_error"]``)

``MoveEnv`` is one move and nothing else: the self-play collector (``collect.py``) plays both
seats itself and needs only each reply checked. Its verdict is ``"move"`` or ``"illegal_move"``.
"""

from __future__ import annotations

import importlib
import random
from typing import Callable

from helpers.envs.anchors import register_anchor, tool_history
from helpers.envs.registry import register_env
from helpers.worlds.games.game import Match, parse_move, random_move

BUILT_IN_OPPONENTS = {"random": random_move}


def load_opponent(spec: str | Callable) -> Callable[[str, list[str]], str]:
    """A plug-in opponent from ``"package.module:function"`` (or a built-in name, or the function itself)."""
    if callable(spec):
        return spec
    if spec in BUILT_IN_OPPONENTS:
        return BUILT_IN_OPPONENTS[spec]
    module_name, _, name = spec.partition(":")
    if not module_name or not name:
        raise ValueError(f"opponent {spec!r}: give 'package.module:function' (or one of {sorted(BUILT_IN_OPPONENTS)})")
    function = getattr(importlib.import_module(module_name), name, None)
    if not callable(function):
        raise ValueError(f"opponent {spec!r}: {module_name} has no function {name!r}")
    return function


class KuhnPokerEnv:
    """A hand of Kuhn poker in one seat against an opponent the env plays (see the module docstring)."""

    def reset(self, **row) -> str:
        """Deal the task's cards, let the opponent move if it is first, and return the seat's first observation."""
        self.match, self.seat = Match(tuple(row["deal"])), int(row["seat"])
        self.rng = random.Random(row.get("opponent_seed", 0))
        spec = row.get("opponent") or "random"
        self.opponent = (lambda observation, legal_moves: self.rng.choice(legal_moves)) if spec == "random" else load_opponent(spec)
        self.opponent_error: str | None = None
        self._opponent_moves()
        return self.match.observation(self.seat)

    def _opponent_moves(self) -> None:
        """The opponent plays until it is the policy's turn or the hand is over; a failure forfeits the hand."""
        while not self.match.done and self.match.to_move != self.seat:
            legal = self.match.legal_moves()
            try:
                move = self.opponent(self.match.observation(1 - self.seat), list(legal))
            except Exception as e:  # a plug-in's bug ends the hand, counted, never the rollout
                self.opponent_error = f"{type(e).__name__}: {e}"[:200]
                self.match.forfeit(1 - self.seat, "opponent_error")
                return
            if not (isinstance(move, str) and move.strip().lower() in legal):
                self.match.forfeit(1 - self.seat, f"opponent_illegal: {str(move)[:40]!r}")
                return
            self.match.play_move(move.strip().lower())

    def _judge(self, text: str) -> dict:
        """The policy's move: play it, let the opponent answer, and end the hand or show the next observation."""
        if not self.match.done:  # (done already: the opponent forfeited before the policy's first move)
            if not self.match.play(text):
                return self._end("illegal_move", text)
            self._opponent_moves()
        if not self.match.done:
            return {"correct": False, "verdict": "playing", "predicted": parse_move(text), "feedback": self.match.observation(self.seat)}
        forfeited = self.match.forfeited
        verdict = ("opponent_error" if self.opponent_error else "opponent_illegal") if forfeited == 1 - self.seat else None
        return self._end(verdict, text)

    def _end(self, verdict: str | None, text: str) -> dict:
        chips = self.match.returns()[self.seat]
        verdict = verdict or ("won" if chips > 0 else "lost")
        info = {"correct": chips > 0, "verdict": verdict, "predicted": parse_move(text), "reward": chips, "chips": chips,
                "seat": self.seat, "moves": self.match.history}
        if self.opponent_error:
            info["opponent_error"] = self.opponent_error
        return info


class MoveEnv:
    """One move: ``reset`` takes the state's ``legal_moves``, the reply is checked (reward 0: the collector pays)."""

    def reset(self, **row) -> None:
        """Keep the legal moves of the state; the observation is already in the task's prompt."""
        self.legal_moves = row["legal_moves"]

    def _judge(self, text: str) -> dict:
        move = parse_move(text, self.legal_moves)
        return {"correct": move is not None, "verdict": "move" if move else "illegal_move", "predicted": move, "reward": 0.0}


def match_report(trajectories) -> dict:
    """The hands of ``KuhnPokerEnv`` episodes, counted: wins, draws, losses (by the chips won), the mean chips
    per hand, and how many ended by a name other than play (the policy's illegal move, the opponent's
    illegal move or exception). An episode cut short by a limit counts as 0 chips (a draw: Kuhn poker has none otherwise)."""
    chips = [t.info.get("chips", 0.0) for t in trajectories]
    verdicts = [t.info.get("verdict") for t in trajectories]
    return {"hands": len(chips), "wins": sum(c > 0 for c in chips), "draws": sum(c == 0 for c in chips),
            "losses": sum(c < 0 for c in chips), "chips_per_hand": sum(chips) / max(len(chips), 1),
            **{name: verdicts.count(name) for name in ("illegal_move", "opponent_illegal", "opponent_error")}}


register_env("kuhn_poker", KuhnPokerEnv)
register_anchor("kuhn_poker", tool_history)  # the moves so far and the replies: the state of the hand (the cards are the task's)
