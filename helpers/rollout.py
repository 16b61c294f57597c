"""Rollout module (采样模块): the Trajectory and the loop that produces it."""

from __future__ import annotations

from dataclasses import dataclass, field

from helpers.data import Task


@dataclass
class Trajectory:
    """One episode of one task, as tokens and as messages.

    token_ids:    the whole episode: prompt, every assistant turn, every env/tool message   # (T,)
    mask:         1 where the policy generated the token, 0 for prompt and env tokens    # (T,)
    logprobs:     sampling log-prob of each token where mask == 1, 0.0 elsewhere          # (T,)
    prompt_len:   number of leading prompt tokens
    step_rewards: reward the env returned at each step
    reward:       final scalar reward (set by the reward module; env outcome by default)
    reward_parts: named parts of the reward, e.g. {"correct": 1.0, "format": 0.1}
    stop_reason:  answered / max_steps / timeout / max_tokens / error
    info:         the env's info from the last step (verdict, predicted answer, error counts)
    messages:     the decoded conversation, for display
    """

    task: Task
    group: int  # index of this sample among the G samples of its task
    token_ids: list[int]
    mask: list[int]
    logprobs: list[float]
    prompt_len: int
    step_rewards: list[float] = field(default_factory=list)
    reward: float = 0.0
    reward_parts: dict[str, float] = field(default_factory=dict)
    turns: int = 0
    stop_reason: str = ""
    wall_time: float = 0.0
    info: dict = field(default_factory=dict)
    messages: list[dict] = field(default_factory=list)

    @property
    def task_id(self) -> str:
        return self.task.id

    @property
    def completion_text(self) -> str:
        """All assistant turns joined: what text-based rewards read."""
        return "\n".join(m["content"] for m in self.messages if m["role"] == "assistant")
