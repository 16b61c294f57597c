"""The environment contract (环境模块).

An environment is what makes RL *agentic*: the policy acts, the world answers,
and the world decides when the task is over.

    obs = env.reset(task)          # list of chat messages the policy sees first
    while not env.is_done():
        text = policy(obs_so_far)  # one assistant turn
        result = env.step(text)    # StepResult(observation, reward, terminated, truncated, info)

Observations are *chat messages* (``[{"role": "tool", "content": "42"}]``), not
strings: the rollout renders them with the tokenizer's chat template and appends
the new tokens, so the same env serves the tiny model and Qwen.

As in Gymnasium, ``terminated`` (the task reached an end: answered, gave up) is
kept apart from ``truncated`` (a limit cut it short: max_steps, timeout). Every
episode ends with a named ``stop_reason``. ``step`` never raises on bad model
output: a malformed tool call becomes an error observation the model can read.

``Env.step`` is a template: the part every env shares (the protocol check, counting
the step, ``str(action)``) is written once here, and a subclass writes only
``_step(text) -> StepResult``, what its world does with one turn. Long observations
are cut by one function, ``clip_observation``, so every env says the same thing when
it cuts.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

from helpers.data import Task
from helpers.formats import judge_answer

# Why an episode ended. The rollout adds "max_tokens" (token budget) itself, with ``env.truncate``.
STOP_REASONS = ("answered", "max_steps", "timeout", "max_tokens", "error")
TRUNCATED = ("max_steps", "max_tokens", "timeout")  # the stop reasons that mean "a limit cut it short"
TRUNCATED = ("max_steps", "max_tokens", "timeout")  # the stop reasons that mean "a limit cut it short"

# Keys every step's ``info`` carries (the final step's values describe the episode):
#   stop_reason  None until the episode ends, then one of STOP_REASONS
#   correct      the final answer was judged right
#   predicted    the answer the env read from the policy's text (None: nothing found)
#   verdict      why: "correct", "wrong_number", "wrong_answer", "no_answer", ... (None until judged)
#   tool_calls   tool calls made so far in this episode
#   tool_errors  of those, how many returned an "error: ..." result
INFO_KEYS = ("stop_reason", "correct", "predicted", "verdict", "tool_calls", "tool_errors")


def new_info(**values) -> dict:
    """An ``info`` dict with every key of ``INFO_KEYS`` at its start value, then ``values``."""
    info = {"stop_reason": None, "correct": False, "predicted": None, "verdict": None, "tool_calls": 0, "tool_errors": 0}
    info.update(copy.deepcopy(values))  # a copy: an env's defaults (lists, dicts) are never shared between episodes
    return info


def clip_observation(text: str, max_chars: int) -> str:
    """``text`` cut to ``max_chars`` characters, saying how much was cut (the model should know)."""
    if len(text) <= max_chars:
        return text
    return text[:max_chars] + f"\n... [truncated: {len(text) - max_chars} more characters]"


class EnvError(RuntimeError):
    """The *caller* broke the protocol (``step`` before ``reset`` or after the episode ended).

    Bad *model output* never raises; a bug in the rollout loop should, loudly.
    """


@dataclass
class StepResult:
    observation: list[dict]  # new messages for the policy; [] when the episode is over
    reward: float  # reward for this step (outcome reward on the final step)
    terminated: bool  # the task reached an end
    truncated: bool  # a limit cut the episode short
    info: dict = field(default_factory=dict)  # verdict, stop_reason, error counts, ...

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated


class Env:
    """Base class. Subclasses implement ``_step(text)``; most need no ``reset`` of their own.

    Class attributes a subclass may set:
        name:          registry name
        tools:         JSON schemas of the tools (passed to ``apply_chat_template(tools=...)``), or None
        info_defaults: the env's own ``info`` keys with their start values, e.g. ``{"strict_format": False}``
    """

    name: str = "base"
    tools: list[dict] | None = None
    info_defaults: dict = {}

    def __init__(self, max_steps: int = 1):
        if max_steps < 1:
            raise ValueError(f"max_steps must be at least 1, got {max_steps}")
        self.max_steps = max_steps
        self.task: Task | None = None
        self.steps = 0
        self.stop_reason: str | None = None
        self.info: dict = new_info(**self.info_defaults)  # the running episode's info; each StepResult gets a copy
        self.started = 0.0  # time.monotonic() at reset

    def reset(self, task: Task) -> list[dict]:
        """Start an episode of ``task``; returns a copy of its prompt messages."""
        return self._begin_episode(task)

    def step(self, action: str) -> StepResult:
        """One assistant turn. Checks the protocol, counts the step, then ``self._step(text)``."""
        self._check_can_step()
        self.steps += 1
        return self._step(action if isinstance(action, str) else str(action))

    def _step(self, text: str) -> StepResult:
        raise NotImplementedError(f"{type(self).__name__} must implement _step(text) -> StepResult")

    def is_done(self) -> bool:
        return self.stop_reason is not None

    def truncate(self, stop_reason: str = "max_tokens") -> StepResult:
        """End the episode from outside, e.g. when the rollout's token budget runs out.

        Returns the final StepResult (reward 0, truncated) with the full ``info``, so the
        rollout records every episode the same way however it ended.
        """
        if stop_reason not in STOP_REASONS:
            raise ValueError(f"unknown stop_reason {stop_reason!r}; expected one of {STOP_REASONS}")
        self._check_can_step()
        if self.info["verdict"] is None:
            self.info["verdict"] = "no_answer"
        return self._end(stop_reason)

    # --- helpers for subclasses ---------------------------------------------------------------

    def _begin_episode(self, task: Task) -> list[dict]:
        """Reset the episode state; returns a copy of the task's prompt messages."""
        if not isinstance(task, Task):
            raise TypeError(f"reset() needs a helpers.data.Task, got {type(task).__name__}")
        self.task, self.steps, self.stop_reason = task, 0, None
        self.info = new_info(**self.info_defaults)
        self.started = time.monotonic()
        return [dict(message) for message in task.prompt]

    def _check_can_step(self) -> None:
        if self.task is None:
            raise EnvError(f"{type(self).__name__}.step() called before reset(task)")
        if self.is_done():
            raise EnvError(f"{type(self).__name__}.step() called after the episode ended (stop_reason={self.stop_reason!r}); call reset(task) first")

    def _answered(self, text: str) -> StepResult:
        """``text`` is the final answer: judge it (``helpers.formats.judge_answer``) and end the episode."""
        self.info.update(judge_answer(text, self.task.answer))
        return self._end("answered", reward=1.0 if self.info["correct"] else 0.0)

    def _end(self, stop_reason: str, reward: float = 0.0) -> StepResult:
        """Finish the episode: ``terminated`` when answered, ``truncated`` for any limit or error."""
        self.stop_reason = stop_reason
        self.info["stop_reason"] = stop_reason
        terminated = stop_reason == "answered"
        return StepResult([], float(reward), terminated, not terminated, dict(self.info))
