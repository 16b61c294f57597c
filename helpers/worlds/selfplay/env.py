"""The proposer's environment (自我博弈: the proposer role): check a proposed task, compute its answer.

In self-play (``helpers.worlds.selfplay``) one policy plays two roles. As the *solver* it meets
the one-call world's tasks ("What is 47*86?") in ``CalculatorEnv``. As the *proposer*
it writes a new task in the world's grammar, and this env is its world: one turn, in
which the env parses the proposal, checks it, and works out the true answer itself,
so a proposed task never needs a label.

    env = make_env("propose")                   # Episode(ProposerEnv()): the adapter calls ProposerEnv._judge
    env.reset(proposer_task())                  # [system: how to propose, user: "Propose a task."]
    env.step("<task>47*86</task>").info         # {..., "valid": True, "expression": "47*86", "answer": "4042", "difficulty": 4}
    env.step("<task>47*</task>").info           # (after a reset) {..., "valid": False, "error": "not in the grammar ..."}

The grammar, one line:

    proposal := "<task>" A "*" B "</task>"      A, B: integers MIN_OPERAND..MAX_OPERAND, no leading zero

Difficulty of a valid task = the digits of its two operands together (4 for "47*86", 6 for
"123*456"): the solver's job is to copy the expression into the calculator and the result
into its answer, and every extra digit is one more to copy at a new distance. The warm
start solves difficulty 4 and 5 well and difficulty 6 (two three-digit operands) about half the time
(0.87, 0.89, 0.48: data/tiny-selfplay/baseline.json), so difficulty is what makes the tiny solver fail.

The env is a class on TRL's contract with no tools: ``reset`` does nothing, and its one turn is
judged by the ``_judge`` hook of the adapter (``helpers.envs.episode.Episode``), since the turn is
a proposal, not an answer to check against a reference.

Nothing the model writes makes ``step`` raise (the env contract): text outside the
grammar, an operand out of range, a megabyte of digits all end the episode with
``valid = False`` and a one-line ``error`` saying what was wrong, and earn no reward.

Simplifications, named:

* One operation (``*``), two operands: the one-call world's grammar, nothing more, so
  every valid task is one the solver's calculator can do in one call.
* The proposal must be the whole reply (surrounding spaces aside): a task in a sentence
  counts as malformed, which keeps the check a single regular expression.
* The reward is not the env's: it needs the solver's attempts, so the training loop
  (``helpers.worlds.selfplay``) pays the proposer after solving; the env's own reward is 0.

Taught in notebooks/09_self_play.ipynb.
"""

from __future__ import annotations

import re

from helpers.data import Task
from helpers.envs.anchors import register_anchor, tool_history
from helpers.envs.registry import register_env

MIN_OPERAND, MAX_OPERAND = 10, 999  # two or three digits: the lengths the warm start was taught to copy
PROPOSAL = re.compile(r"\s*<task>(\d{1,9})\*(\d{1,9})</task>\s*")  # at most 9 digits parsed: an "out of range", not a bignum
PROPOSER_SYSTEM = "You write tasks for a solver. Write one as <task>A*B</task>."
PROPOSER_QUESTION = "Propose a task."


def difficulty(expression: str) -> int:
    """Digits of the operands together: ``difficulty("47*86") == 4``, ``difficulty("47*123") == 5``."""
    return sum(len(operand) for operand in expression.split("*"))


def check_proposal(text: str) -> dict:
    """Parse and check one proposal. Never raises.

    Returns ``{"valid": True, "expression": "47*86", "answer": "4042", "difficulty": 4}``
    or ``{"valid": False, "error": "<one line>"}``.
    """
    match = PROPOSAL.fullmatch(text)
    if match is None:
        shown = text if len(text) <= 40 else text[:40] + "..."
        return {"valid": False, "error": f"not in the grammar <task>A*B</task>: {shown!r}"}
    a_text, b_text = match.groups()
    for operand in (a_text, b_text):
        if len(operand) > 1 and operand.startswith("0"):
            return {"valid": False, "error": f"operand {operand} has a leading zero"}
        if not MIN_OPERAND <= int(operand) <= MAX_OPERAND:
            return {"valid": False, "error": f"operand {operand} is out of range {MIN_OPERAND}..{MAX_OPERAND}"}
    expression = f"{a_text}*{b_text}"
    return {"valid": True, "expression": expression, "answer": str(int(a_text) * int(b_text)), "difficulty": difficulty(expression)}


def proposer_task(task_id: str = "propose") -> Task:
    """The proposer's prompt: the same two messages every time (the role is the system prompt)."""
    prompt = [{"role": "system", "content": PROPOSER_SYSTEM}, {"role": "user", "content": PROPOSER_QUESTION}]
    return Task(task_id, prompt, None, {"role": "proposer"})


class ProposerEnv:
    """One turn: the proposal is checked (``check_proposal``); the episode ends either way.

    ``info`` gets ``valid`` and, for a valid task, ``expression``, ``answer`` and ``difficulty``;
    for an invalid one, ``error``. Its ``verdict`` is ``"valid_task"`` or ``"invalid_task"``, and an
    invalid proposal ends the episode with stop reason ``"error"``.
    """

    def reset(self, **row) -> None:
        """Nothing to set up: every proposer prompt is the same."""
        return None

    def _judge(self, text: str) -> dict:
        """The proposal, checked: ``info`` keys and the stop reason for ``Episode`` (reward 0: the loop pays)."""
        checked = check_proposal(text)
        verdict = "valid_task" if checked["valid"] else "invalid_task"
        return {**checked, "verdict": verdict, "reward": 0.0, "stop_reason": "answered" if checked["valid"] else "error"}


register_env("propose", ProposerEnv)
register_anchor("propose", tool_history)  # the proposals so far and their checks: the state
