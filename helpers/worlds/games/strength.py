"""Exact measures of strength in Kuhn poker: a policy's move table, its exploitability, head-to-head values.

A policy's whole behaviour in Kuhn poker is one table: at each of the 12 information states,
the probability it plays ``pass`` and ``bet``. For a language model the table is read exactly
from its logits, no sampling: the probability of a move is the probability of the reply that
plays it, token by token,

    P(bet | state) = P("<answer>bet</answer><|im_end|>" | the conversation at that state)   (at temperature 1)

What the two legal replies leave over (any other text) is the ``illegal`` mass: in a game the
player would forfeit. The table is renormalised over the legal moves for the measures below
(the illegal mass is reported beside them).

From the table, with OpenSpiel's own algorithms:

* **exploitability** (``open_spiel.python.algorithms.exploitability``): how much a best response
  wins against the policy, per hand, averaged over the two seats: NashConv / 2. A Nash
  equilibrium has 0; the uniform random policy 0.458; lower is stronger, and no opponent can
  win more than that against it.
* **head to head** (``expected_game_score.policy_value``): the chips per hand policy A wins
  from policy B on average over every deal and both seats (A as player 1, then as player 2).
  Exact, so two policies' difference is never sampling noise.

    table = move_table(model, tokenizer)           # {"0": {"pass": 0.71, "bet": 0.29, "illegal": 0.0}, ...}
    exploitability(table)                          # 0.247 for the warm start
    head_to_head(trained, warm)                    # > 0: the trained policy wins chips from the warm start

Simplification, named: a move's probability is that of its canonical tokenization; the same
text spelled in other tokens (which the model could sample) counts as illegal mass.
"""

from __future__ import annotations

import torch

from helpers.worlds.games.game import MOVES, conversation, information_states, load_game, reply_for


def move_table(model, tokenizer, keys: list[str] | None = None) -> dict[str, dict[str, float]]:
    """``{information state: {"pass": p, "bet": p, "illegal": mass}}`` of ``model`` at temperature 1,
    exactly, in one batched forward pass (12 states x 2 replies; p renormalised over the legal moves)."""
    keys = keys or information_states()
    rows, starts = [], []  # one row per (state, move): prompt ids + reply ids; where the reply starts
    for key in keys:
        prompt = tokenizer.apply_chat_template(conversation(key), add_generation_prompt=True, tokenize=True, return_dict=False)
        for move in MOVES:
            reply = tokenizer.encode(reply_for(move), add_special_tokens=False) + [tokenizer.eos_token_id]
            rows.append(list(prompt) + reply)
            starts.append(len(prompt))
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])  # (2K, T)
    attention = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])  # (2K, T)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        logps = torch.log_softmax(model(input_ids=input_ids, attention_mask=attention).logits.float(), dim=-1)  # (2K, T, V)
    model.train(was_training)
    reply_logp = []
    for n, (row, start) in enumerate(zip(rows, starts)):
        positions = torch.arange(start, len(row))  # the reply's tokens, each predicted at the position before it
        reply_logp.append(logps[n, positions - 1, torch.tensor(row[start:])].sum().item())
    table = {}
    for i, key in enumerate(keys):
        probs = [float(torch.tensor(reply_logp[2 * i + j]).exp()) for j in range(len(MOVES))]
        legal = sum(probs)
        table[key] = {**{move: p / legal for move, p in zip(MOVES, probs)}, "illegal": 1.0 - legal}
    return table


def tabular_policy(table: dict[str, dict[str, float]]):
    """The table as OpenSpiel's ``TabularPolicy`` (the legal moves' probabilities, in OpenSpiel's action order)."""
    from open_spiel.python.policy import TabularPolicy  # OpenSpiel is an optional extra (game.load_game)

    policy = TabularPolicy(load_game())
    for key in policy.state_lookup:
        policy.policy_for_key(key)[:] = [table[key][move] for move in MOVES]
    return policy


def exploitability(table: dict[str, dict[str, float]]) -> float:
    """What a best response wins per hand against the table's policy, averaged over the seats (0 at a Nash equilibrium)."""
    from open_spiel.python.algorithms import exploitability as openspiel_exploitability  # optional extra, as above

    return float(openspiel_exploitability.exploitability(load_game(), tabular_policy(table)))


def head_to_head(a: dict[str, dict[str, float]], b: dict[str, dict[str, float]]) -> float:
    """Chips per hand table ``a`` wins from table ``b``, exactly, averaged over the two seats (zero-sum: b gets minus that)."""
    from open_spiel.python.algorithms.expected_game_score import policy_value  # optional extra, as above

    game = load_game()
    pa, pb = tabular_policy(a), tabular_policy(b)
    as_first = policy_value(game.new_initial_state(), [pa, pb])[0]
    as_second = policy_value(game.new_initial_state(), [pb, pa])[1]
    return float((as_first + as_second) / 2)


def best_response(table: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """The table of a best response to ``table`` in both seats: at each state, the move that wins most against it
    (OpenSpiel's ``BestResponsePolicy``; a pure strategy). Its head to head against ``table`` is the most any policy
    wins from it, and the mean over the seats of what it wins is ``table``'s exploitability."""
    from open_spiel.python.algorithms.best_response import BestResponsePolicy  # optional extra, as above

    game, policy = load_game(), tabular_policy(table)
    out = {}
    for seat in (0, 1):
        responder = BestResponsePolicy(game, seat, policy)
        for key in responder.infosets:  # the seat's information states, as OpenSpiel writes them ("0pb")
            out[key] = table_from_bets({key: float(MOVES[responder.best_response_action(key)] == "bet")})[key]
    return out


def illegal_mass(table: dict[str, dict[str, float]]) -> float:
    """The mean probability, over the 12 states, of a reply that plays no legal move."""
    return sum(row["illegal"] for row in table.values()) / len(table)


def table_from_bets(bet: dict[str, float]) -> dict[str, dict[str, float]]:
    """A table from each state's probability of ``bet`` (a scripted player, e.g. the warm start's demonstrator)."""
    return {key: {"pass": 1.0 - p, "bet": p, "illegal": 0.0} for key, p in bet.items()}
