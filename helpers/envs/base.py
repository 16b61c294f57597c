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
"""

from __future__ import annotations

from dataclasses import dataclass, field

from helpers.data import Task

# Why an episode ended. The rollout adds "max_tokens" (token budget) itself.
STOP_REASONS = ("answered", "max_steps", "timeout", "max_tokens", "error")


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
    """Base class. Subclasses implement ``reset`` and ``step``.

    Class attributes a subclass may set:
        name:   registry name
        tools:  JSON schemas of the tools (passed to ``apply_chat_template(tools=...)``), or None
    """

    name: str = "base"
    tools: list[dict] | None = None

    def __init__(self, max_steps: int = 1):
        self.max_steps = max_steps
        self.task: Task | None = None
        self.steps = 0
        self.stop_reason: str | None = None

    def reset(self, task: Task) -> list[dict]:
        raise NotImplementedError

    def step(self, action: str) -> StepResult:
        raise NotImplementedError

    def is_done(self) -> bool:
        return self.stop_reason is not None
