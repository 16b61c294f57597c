"""Anchor states (锚点状态): the environment's state before a turn, the key of GiGPO's step groups.

GiGPO (``helpers.grpo`` §1b) compares the turns of a task's episodes that start from the same
*state of the environment*. What that state is, each world says, as a function of the conversation
before the turn (every message the agent and the env exchanged, prompt first):

    tool_history(history)       every tool call so far in canonical form (name, arguments as sorted JSON), with its result
    register_anchor("shop", tool_history)     # in the world's env.py, beside register_env("shop", ShopEnv)
    anchor_for("shop")                        # -> tool_history; an env that registered none gets tool_history too

Why not the conversation's tokens: they hold the model's own sampled text. Two episodes that made
the same call, one written ``{"name": "usual", "arguments": {}}`` and one with other spacing or
another tokenisation, reached the same state, and a token prefix splits them into two groups, at
that turn and every turn after. A state the agent comes back to within an episode never matches a
longer prefix either. verl-agent (GiGPO's reference implementation) keys step groups on the
environment's observation (``anchor: text_obs``), for the same reason.

``tool_history`` is the state of any deterministic env whose only inputs are the tool calls: the
same calls in the same order give the same env. A world whose state is smaller (where the agent
stands, what it holds) registers an anchor that reads just that, so the turns taken from one state
group together however the agent got there, and a state the agent comes back to is one group
(``helpers.worlds.trail`` keys on the room the agent is in).

Simplifications, named: exact matching only (verl-agent can also cluster similar observations);
an anchor reads the messages, so trajectories without them (built from tokens alone) need an anchor
of their own (``helpers.grpo.token_prefix``).

Taught in notebooks/06b_turn_credit.ipynb §2.
"""

from __future__ import annotations

import json
from typing import Callable, Hashable

from helpers.formats import parse_tool_calls
from helpers.registry import register

Anchor = Callable[[list[dict]], Hashable]  # the conversation before a turn -> the env's state then

_ANCHORS: dict[str, Anchor] = {}


def canonical_calls(message: dict) -> tuple:
    """An assistant message as what the env saw: each tool call's name and its arguments as sorted JSON,
    or, for a turn without a well-formed call, its text stripped of surrounding whitespace.

    Both spellings of a call give the same value: the call as text (``<tool_call>`` blocks) and the
    ``tool_calls`` field TRL puts on messages it parsed."""
    calls = [(c["function"]["name"], c["function"].get("arguments")) for c in message.get("tool_calls") or []]
    calls += [(c.name, c.arguments) if c.error is None else ("malformed", c.raw.strip())
              for c in parse_tool_calls(message.get("content") or "")]
    if not calls:
        return (("text", (message.get("content") or "").strip()),)
    return tuple((name, canonical_json(arguments)) for name, arguments in calls)


def canonical_json(arguments) -> str:
    """Arguments as JSON with sorted keys and no optional spaces; arguments TRL kept as a JSON string are decoded
    first, and text that is not JSON stays as it is."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return arguments
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"))


def tool_history(history: list[dict]) -> tuple:
    """The state of a deterministic env: the calls made so far, canonical, each with what came back.

    The prompt (the messages before the first assistant turn) is left out: every episode of a
    task starts from it, and step groups are formed within a task."""
    first = next((i for i, m in enumerate(history) if m["role"] == "assistant"), len(history))
    return tuple(canonical_calls(m) if m["role"] == "assistant" else (m["role"], m.get("content") or "")
                 for m in history[first:])


def register_anchor(env: str, anchor: Anchor, overwrite: bool = False) -> Anchor:
    """Say what the state of registered env ``env`` is (``anchor(history) -> hashable``)."""
    return register(_ANCHORS, "anchor", env, anchor, overwrite)


def anchor_for(env: str) -> Anchor:
    """The anchor registered for ``env``; ``tool_history`` for one that registered none (a user's class)."""
    return _ANCHORS.get(env, tool_history)


def registered_anchors() -> dict[str, Anchor]:
    """Every env name with the anchor it registered (for the check that each world says what its state is)."""
    return dict(_ANCHORS)
