"""Dataset module (数据模块): the Task, loaders, prompt building, batching.

Agentic RL needs only the *task*: the prompt the policy sees. The reference
answer travels with the task so that the environment can check the policy's
answer, but it is never shown to the policy.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Task:
    """One problem for the agent.

    id:        stable identifier, e.g. ``"gsm8k-train-00012"``
    prompt:    chat messages the policy starts from, e.g.
               ``[{"role": "system", "content": ...}, {"role": "user", "content": ...}]``
    answer:    canonical reference answer (``"1000"``), or None when the env checks another way
    metadata:  anything else (source file and row, difficulty, test cases for code tasks, ...)
    """

    id: str
    prompt: list[dict]
    answer: str | None = None
    metadata: dict = field(default_factory=dict)
