"""Kuhn poker as text (the game world's rules): OpenSpiel plays the game, this module writes it down.

Kuhn poker (Kuhn 1950) is the smallest real poker: three cards J < Q < K, one dealt to each of
two players, both ante 1 chip. Player 1 moves first; each move is ``pass`` (check, or fold when
facing a bet) or ``bet`` (bet 1, or call a bet). The hand ends at a fold (the bettor takes the
pot) or a showdown (the higher card takes it): a player wins or loses 1 chip, or 2 when a bet
was called. Every hand is one of these five move sequences:

    moves             ends in        player 1 gets
    pass, pass        showdown       +1 / -1
    bet, bet          showdown       +2 / -2
    pass, bet, bet    showdown       +2 / -2
    bet, pass         player 2 folds +1
    pass, bet, pass   player 1 folds -1

The rules, the deal and the payoffs are OpenSpiel's (``pyspiel.load_game("kuhn_poker")``, the
``games`` extra: ``pip install open-spiel==2.0.2``); this module only turns a state into the
text a player reads and a reply into a move:

    match = Match(deal=(0, 2))               # player 1 holds J, player 2 holds K
    match.observation(0)                     # 'Your card: J. You are player 1. Moves so far: none. Legal moves: pass (check), bet.'
    match.play("<answer>bet</answer>")       # True: a legal move, played
    match.returns()                          # [0.0, 0.0] until the hand ends

What a player knows is its *information state*: its card and the moves so far, OpenSpiel's
``information_state_string`` ("0pb": J, after pass and bet). There are 12 of them (3 cards x 4
histories at which someone moves). Everything a policy does in this game is one pair of
probabilities (pass, bet) at each of the 12; the world's exact measures of strength read that
table (``helpers.worlds.games.strength``).

A move that is not legal (no ``<answer>`` tag, a word that is no move) is an outcome with a
name, never an exception: the hand ends and the player who made it forfeits ``ILLEGAL_PENALTY``
chips to the other (``Match.forfeit``), so the game stays zero-sum.

Simplifications, named:

* One game, Kuhn poker. Tic-tac-toe (the issue's second game) is not built: Kuhn poker's
  exploitability is exact and a hand is three moves, which is what a 2-core CPU can train in minutes.
* A player's earlier turns in a hand are written back canonically (``<answer>pass</answer>``)
  when its next prompt is rendered (``conversation``), whatever spacing its reply had.
"""

from __future__ import annotations

import random
from functools import cache

from helpers.formats import ANSWER_CLOSE, ANSWER_OPEN, between

GAME = "kuhn_poker"  # OpenSpiel's name
CARDS = "JQK"  # OpenSpiel's cards 0, 1, 2
MOVES = ("pass", "bet")  # OpenSpiel's actions 0 ("Pass") and 1 ("Bet")
DEALS = [(a, b) for a in range(3) for b in range(3) if a != b]  # (player 1's card, player 2's card): 6 deals, each 1/6
ILLEGAL_PENALTY = 2.0  # chips a player forfeits for a move that is not legal: the most a hand can lose
SYSTEM = ("You play Kuhn poker: cards J < Q < K, one each, ante 1. pass = check or fold, bet = bet or call. "
          "Reply <answer>move</answer>.")


@cache
def load_game():
    """OpenSpiel's Kuhn poker (``pyspiel``, imported here: the workbook runs without it until a game is played)."""
    try:
        import pyspiel
    except ImportError as e:
        raise ImportError("the game world needs OpenSpiel: pip install open-spiel==2.0.2 (or the workbook's "
                          "`games` extra: pip install -e '.[games]')") from e
    return pyspiel.load_game(GAME)


def observation_for(key: str) -> str:
    """What a player reads at the information state ``key`` (OpenSpiel's string: card digit + moves as p/b).
    The legal moves say what they mean here, as a poker player would: facing a bet, pass folds and bet calls.

    >>> observation_for("1p")
    'Your card: Q. You are player 2. Moves so far: pass. Legal moves: pass (check), bet.'
    >>> observation_for("1b")
    'Your card: Q. You are player 2. Moves so far: bet. Legal moves: pass (fold), bet (call).'
    """
    card, history = CARDS[int(key[0])], key[1:]
    moves = ", ".join(MOVES["pb".index(c)] for c in history) or "none"
    legal = "pass (fold), bet (call)" if history.endswith("b") else "pass (check), bet"
    return f"Your card: {card}. You are player {len(history) % 2 + 1}. Moves so far: {moves}. Legal moves: {legal}."


def reply_for(move: str) -> str:
    """The reply that plays ``move``: ``<answer>bet</answer>``."""
    return f"{ANSWER_OPEN}{move}{ANSWER_CLOSE}"


def parse_move(text: str, legal_moves: list[str] | tuple[str, ...] = MOVES) -> str | None:
    """The move a reply plays (the last ``<answer>`` block, spaces and case ignored), or None: not a legal move."""
    answers = between(text, ANSWER_OPEN, ANSWER_CLOSE)
    move = answers[-1].strip().lower() if answers else None
    return move if move in legal_moves else None


def conversation(key: str) -> list[dict]:
    """The messages a player has seen at information state ``key``: the system prompt, then for each of
    its own earlier turns in the hand its observation and its reply, then the observation now.

    >>> [m["content"][:24] for m in conversation("0pb")][1:]
    ['Your card: J. You are pl', '<answer>pass</answer>', 'Your card: J. You are pl']
    """
    messages = [{"role": "system", "content": SYSTEM}]
    seat, history = len(key[1:]) % 2, key[1:]
    for turn in range(seat, len(history), 2):  # the player's own earlier moves
        messages += [{"role": "user", "content": observation_for(key[0] + history[:turn])},
                     {"role": "assistant", "content": reply_for(MOVES["pb".index(history[turn])])}]
    return messages + [{"role": "user", "content": observation_for(key)}]


def information_states() -> list[str]:
    """The 12 information states, player 1's first (``['0', '0pb', '1', '1pb', ...]``): OpenSpiel's order."""
    from open_spiel.python.policy import TabularPolicy  # OpenSpiel is an optional extra (load_game)

    return list(TabularPolicy(load_game()).state_lookup)


class Match:
    """One hand between two seats (0 = player 1, 1 = player 2) on OpenSpiel's state; moves as text.

    ``forfeited`` is the seat that made a move that is not legal (None: no one), ``why`` says what it was.
    """

    def __init__(self, deal: tuple[int, int]):
        if tuple(deal) not in DEALS:
            raise ValueError(f"deal must be two different cards of 0, 1, 2 (J, Q, K), got {deal!r}")
        self.state = load_game().new_initial_state()
        for card in deal:  # the two chance nodes: player 1's card, then player 2's
            self.state.apply_action(card)
        self.deal = tuple(deal)
        self.forfeited: int | None = None
        self.why = ""

    @property
    def done(self) -> bool:
        return self.forfeited is not None or self.state.is_terminal()

    @property
    def to_move(self) -> int:
        """The seat whose turn it is (0 or 1)."""
        return self.state.current_player()

    @property
    def history(self) -> str:
        """The moves so far as OpenSpiel writes them in information states: ``"pb"``."""
        return self.key(0)[1:]

    def key(self, seat: int) -> str:
        """The information state of ``seat``: OpenSpiel's string ("0pb")."""
        return self.state.information_state_string(seat)

    def observation(self, seat: int) -> str:
        return observation_for(self.key(seat))

    def legal_moves(self) -> list[str]:
        return [MOVES[action] for action in self.state.legal_actions()]

    def play(self, reply: str) -> bool:
        """Play the reply of the seat to move. A reply that is no legal move forfeits the hand (returns False)."""
        move = parse_move(reply, self.legal_moves())
        if move is None:
            self.forfeit(self.to_move, f"not a legal move: {reply[:40]!r}")
            return False
        self.play_move(move)
        return True

    def play_move(self, move: str) -> None:
        """Play a legal move by name (``"bet"``) for the seat to move."""
        self.state.apply_action(MOVES.index(move))

    def forfeit(self, seat: int, why: str) -> None:
        """End the hand: ``seat`` loses ``ILLEGAL_PENALTY`` chips to the other."""
        self.forfeited, self.why = seat, why

    def returns(self) -> list[float]:
        """Chips won by each seat: OpenSpiel's payoffs, or the forfeit; 0 while the hand goes on."""
        if self.forfeited is not None:
            return [ILLEGAL_PENALTY if seat != self.forfeited else -ILLEGAL_PENALTY for seat in (0, 1)]
        return [float(r) for r in self.state.returns()]


def random_move(observation: str, legal_moves: list[str]) -> str:
    """An opponent that plays a uniformly random legal move (the plug-in signature, Python's global ``random``)."""
    return random.choice(legal_moves)
