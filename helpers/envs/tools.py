"""Multi-turn tool use: the policy calls tools until it writes a final answer.

    env = ToolEnv([CALCULATOR])                         # CalculatorEnv is exactly this (envs/calculator.py)
    env.reset(task)
    env.step('<tool_call>\\n{"name": "calculator", "arguments": {"expression": "47*86"}}\\n</tool_call>')
        # -> StepResult(observation=[{"role": "tool", "content": "4042"}], reward=0.0, not done)
    env.step("<answer>4042</answer>")                   # no tool call: the final answer, judged as MathEnv does

A turn is a *tool turn* when it contains at least one ``<tool_call>`` block
(Qwen2.5's format, parsed by ``helpers.formats``); every call in it runs and each
result comes back as one ``{"role": "tool"}`` message. A turn without a tool call is
the final answer. Nothing the model writes makes ``step`` raise: malformed JSON (a
5,000-digit number, JSON nested 1,000 deep), an unknown tool, a missing argument or a
tool that raises all become an ``"error: ..."`` message the model can read, counted
in ``info["tool_errors"]``.

Parsing needs no timer, it is fast by construction: finding the blocks is one linear
scan of the turn (``helpers.formats.tool_call_blocks``), and only the first
``max_calls_per_step`` blocks are decoded (JSON decoding is linear too). So a turn of
megabytes of unclosed ``<tool_call>`` tags costs milliseconds; ``step_timeout``
bounds the tools themselves.

Limits (all keyword arguments of the env):

* ``max_steps``: assistant turns per episode; a tool turn at the limit ends the
  episode ``truncated`` with stop_reason ``"max_steps"``.
* ``step_timeout``: wall-clock seconds for all tool calls of one turn; each call runs
  in a worker thread, and a call that does not return in time ends the episode with
  stop_reason ``"timeout"``.
* ``episode_timeout``: wall-clock seconds from ``reset`` (the policy's generation time
  counts too); checked at each step and bounding each tool call.
* ``max_observation_chars``: a longer tool result is cut and says so.
* ``max_calls_per_step``: further calls in one turn are skipped with an error message.

Simplifications, named:

* Every tool argument is a required string (that is all a calculator needs); numbers
  are passed through as the model wrote them.
* Python cannot kill a thread: a tool that hangs keeps its worker thread (a daemon,
  so it never blocks exit) after the episode ends. Tools that may hang for real
  belong in a process, as ``CodeEnv`` does with ``helpers.sandbox``.
* If a turn has both tool calls and an ``<answer>``, the answer is ignored: the model
  has not seen the tool results yet.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable

from helpers.envs.base import Env, StepResult, clip_observation
from helpers.formats import ToolCall, parse_tool_call, tool_call_blocks


@dataclass
class Tool:
    """A function the policy may call.

    name:        what the model writes in ``"name"``
    description: one line the chat template shows the model
    parameters:  argument name -> description (each a required string)
    fn:          ``fn(**arguments) -> str``; its text is the tool message
    """

    name: str
    description: str
    parameters: dict[str, str]
    fn: Callable[..., str]

    @property
    def schema(self) -> dict:
        """The OpenAI/Qwen JSON schema for ``tokenizer.apply_chat_template(tools=[...])``."""
        properties = {arg: {"type": "string", "description": text} for arg, text in self.parameters.items()}
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": {"type": "object", "properties": properties, "required": list(self.parameters)},
            },
        }


def call_with_timeout(fn: Callable[..., object], arguments: dict, timeout: float) -> tuple[bool, str]:
    """Run ``fn(**arguments)`` in a daemon thread; ``(finished, text)``.

    ``finished`` is False when it did not return within ``timeout`` seconds.
    An exception inside the tool becomes an ``"error: ..."`` text.
    """
    box: dict[str, str] = {}

    def target():
        try:
            box["text"] = str(fn(**arguments))
        except Exception as e:  # the tool's bug must not crash the rollout
            box["text"] = f"error: tool raised {type(e).__name__}: {e}"

    worker = threading.Thread(target=target, name="tool-call", daemon=True)
    worker.start()
    worker.join(max(timeout, 0.0))
    if worker.is_alive():
        return False, ""
    return True, box["text"]


class ToolEnv(Env):
    """Multi-turn env with any list of ``Tool``s; the final answer is judged like MathEnv."""

    name = "tools"
    info_defaults = {"strict_format": False}

    def __init__(
        self,
        tools: list[Tool],
        max_steps: int = 10,
        step_timeout: float = 5.0,
        episode_timeout: float | None = 600.0,
        max_observation_chars: int = 2000,
        max_calls_per_step: int = 8,
    ):
        super().__init__(max_steps=max_steps)
        names = [tool.name for tool in tools]
        if len(set(names)) != len(names):
            raise ValueError(f"tool names must be unique, got {names}")
        self.toolbox = {tool.name: tool for tool in tools}
        self.tools = [tool.schema for tool in tools]  # instance copy of the class attribute
        self.step_timeout = step_timeout
        self.episode_timeout = episode_timeout
        self.max_observation_chars = max_observation_chars
        self.max_calls_per_step = max_calls_per_step

    def _step(self, text: str) -> StepResult:
        now = time.monotonic()
        episode_deadline = self.started + self.episode_timeout if self.episode_timeout is not None else float("inf")
        if now > episode_deadline:
            return self._limit("timeout", f"episode ran longer than episode_timeout={self.episode_timeout} s")

        blocks = tool_call_blocks(text)
        if not blocks:  # no tool call: this is the final answer
            return self._answered(text)

        step_deadline = min(now + self.step_timeout, episode_deadline)
        messages = []
        for i, raw in enumerate(blocks):
            if i == self.max_calls_per_step:
                skipped = len(blocks) - i
                messages.append(self._tool_message(f"error: at most {self.max_calls_per_step} tool calls per turn; {skipped} skipped"))
                break
            self.info["tool_calls"] += 1
            call = parse_tool_call(raw)
            finished, result = self._run(call, timeout=step_deadline - time.monotonic())
            if not finished:
                self.info["tool_errors"] += 1
                return self._limit("timeout", f"tool {call.name!r} did not return within the time limit ({self.step_timeout} s per step)")
            messages.append(self._tool_message(result))

        if self.steps >= self.max_steps:
            return self._limit("max_steps", f"no final answer after max_steps={self.max_steps} turns")
        return StepResult(messages, 0.0, False, False, dict(self.info))

    def _run(self, call: ToolCall, timeout: float) -> tuple[bool, str]:
        """One call -> (finished, result text). Bad calls become error text without running anything."""
        if call.error:
            return True, f"error: {call.error}"
        tool = self.toolbox.get(call.name)
        if tool is None:
            return True, f"error: unknown tool {call.name!r}; available: {', '.join(self.toolbox)}"
        missing = [arg for arg in tool.parameters if arg not in call.arguments]
        if missing:
            return True, f"error: {tool.name} needs argument {missing[0]!r}"
        unexpected = [arg for arg in call.arguments if arg not in tool.parameters]
        if unexpected:
            return True, f"error: {tool.name} got unexpected argument {unexpected[0]!r}"
        return call_with_timeout(tool.fn, call.arguments, timeout)

    def _tool_message(self, result: str) -> dict:
        if result.startswith("error:"):
            self.info["tool_errors"] += 1
        return {"role": "tool", "content": clip_observation(result, self.max_observation_chars)}

    def _limit(self, stop_reason: str, why: str) -> StepResult:
        """End the episode because a limit was hit; the policy never answered."""
        self.info["verdict"] = "no_answer"
        self.info["limit"] = why
        return self._end(stop_reason)

