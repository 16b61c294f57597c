"""Episode: the teaching ``step(text)`` over any environment on TRL's contract (环境模块).

    env = Episode(ShopEnv(), max_steps=5)              # what make_env("shop", max_steps=5) returns
    messages = env.reset(task)                         # ShopEnv().reset(**task.row()); the task's prompt
    env.tools                                          # the tools' JSON schemas, as TRL renders them
    env.step('<tool_call>\\n{"name": "usual", "arguments": {}}\\n</tool_call>')
        # -> StepResult(observation=[{"role": "tool", "content": '{"item": "pen"}'}], reward=0.0, not done)
    env.step("<answer>141</answer>")                   # no tool call: the final answer, judged; reward 1.0

An environment class (``helpers.envs.base``) has ``reset(**row)`` and its tools, nothing more; TRL
drives it from inside its generation loop. ``Episode`` is that driving, written out once, for the
workbook's loop (``helpers.rollout``) and for the notebook: it parses a model turn, calls the
env's methods, and answers in Gymnasium's shape, ``StepResult(observation, reward, terminated,
truncated, info)``.

A turn is a *tool turn* when the env has tools and the turn holds at least one ``<tool_call>``
block (Qwen2.5's format, parsed by ``helpers.formats``): every call in it runs and each result
comes back as one ``{"role": "tool"}`` message. A turn without a tool call is the final answer,
judged by ``helpers.formats.judge_answer`` against ``task.answer`` (``info`` gets ``correct``,
``verdict``, ``predicted``, ``strict_format``); the reward is 1.0 if correct, else 0.0.

Nothing the model writes makes ``step`` raise: malformed JSON (a 5,000-digit number, JSON
nested 1,000 deep), an unknown tool, a missing or unexpected argument, a tool that raises
(a ``TypeError`` from an argument of the wrong type too) all become an ``"error: ..."`` message
the model can read, counted in ``info["tool_errors"]``, and, when the call could not be made,
raised or hung, in ``info["tool_failures"]`` (TRL's ``tools/failure_frequency``; for malformed
JSON see the simplifications). Parsing is linear in the turn (``tool_call_blocks`` is one
scan, and only the first ``max_calls_per_step`` blocks are decoded), so megabytes of unclosed
tags cost milliseconds; ``step_timeout`` bounds the tools themselves.

Two things an environment may add:

* ``get_reward() -> float`` (TRL's): the env owns the outcome. It is called when the episode
  ends, however it ended; its value is the episode's reward, and ``info["env_reward"]`` records
  it as ``{class name: value}`` so that the reward module adds it as one more part, named after
  the class, weight 1, as TRL does (``helpers.rewards.CombinedReward``). One that raises or
  returns no finite number scores 0 and says why in ``info["env_reward_error"]``.
* ``_judge(text) -> dict`` (this workbook's hook; TRL never exposes a name that starts with
  ``_``): for a world whose final turn is judged its own way (the code env runs the tests on the
  code, the proposer env checks a proposal). Its keys go into ``info`` (``correct``, ``verdict``,
  ``predicted`` and any of the world's own), except three the adapter reads:

      reward       the episode's reward (0.0 when absent)
      stop_reason  "answered" (default), or "error": the env itself failed, or refused the turn
      feedback     a text for another attempt: while the answer is wrong and turns are left, it
                   comes back as a user message and the episode goes on

Limits (keyword arguments, ``LIMITS``; TRL has only the first, as ``max_tool_calling_iterations``):

* ``max_steps``: assistant turns per episode; a tool turn at the limit ends the episode
  ``truncated`` with stop_reason ``"max_steps"``.
* ``step_timeout``: wall-clock seconds for all tool calls of one turn; each call runs in a worker
  thread, and a call that does not return in time ends the episode with stop_reason ``"timeout"``.
  (In the rollout, whose step pool times each step itself, the calls run in the pool's thread and
  the rollout ends an episode whose step overruns: ``steps_timed_by_caller``. ``truncate`` then finds
  the call still running and counts it as hung, as the timer here does.)
* ``episode_timeout``: wall-clock seconds from ``reset`` (the policy's generation time counts
  too); checked at each step and bounding each tool call.
* ``max_observation_chars``: a longer tool result (or feedback) is cut and says so.
* ``max_calls_per_step``: further calls in one turn are skipped with an error message.

Where this loop and TRL 1.16's tool loop differ. A class that passes ``check_env_class`` runs in
both; these change what it sees or earns (the token side, one call per turn and the token budget,
is in ``helpers.rollout``):

* Arguments: each string is typed by the tool's schema, as TRL's parser does (``typed_arguments``:
  ``"37"`` for an ``int`` arrives as 37; a number where the hint says ``str`` arrives as a number:
  the tool decides). Arguments written as a JSON *string* are decoded here; TRL passes the string
  on (a ``TypeError``).
* Parsing: a ``<tool_call>`` block that is not valid JSON, or JSON without a ``"name"``, is a
  failed call here, with an error message the model can read; TRL's parser fails on the whole
  turn instead and takes it as plain text, so TRL sees no call and the turn ends the episode.
* Results are ``str()``-ed (TRL passes a list on as multimodal content); a tool message has no
  ``"name"`` key (TRL adds the tool's). The error texts are the workbook's (``error: unknown tool
  'search'; available: ...``), the ones the tiny models were trained to read; TRL sends
  ``str({"error": str(e)})``.
* The turn at ``max_steps``: its tool calls run (and count, and ``get_reward`` sees what they did)
  before the episode ends; TRL does not run the calls of the turn after its last iteration.
* ``get_reward`` returning None, NaN or raising: 0 here, with the reason in
  ``info["env_reward_error"]``; TRL ignores a None (NaN) and stops training on a raise. Async tools and an
  async ``get_reward`` are refused here (``TypeError`` at construction); TRL runs them.
* Threads and instances: tools run in worker threads, many episodes at once (an object made in
  ``reset`` that must stay in its thread, such as a sqlite connection, fails here), and the
  rollout builds one instance per episode; TRL calls tools in the trainer's thread, one after
  another, on instances it keeps and reuses across batches, so state ``reset`` does not clear
  leaks from one episode into the next there.
* The limits above but ``max_steps`` are this workbook's.

Simplifications, named:

* Python cannot kill a thread: a tool that hangs keeps its worker thread (a daemon, so it never
  blocks exit) after the episode ends. Tools that may hang for real belong in a process, as the
  code env's sandbox (``helpers.sandbox``).
* The final turn's judging and ``get_reward`` run without a timer: ``judge_answer`` is a linear
  scan, and the code env's sandbox has limits of its own.
* If a turn has both tool calls and an ``<answer>``, the answer is ignored: the model has not
  seen the tool results yet.

Taught in notebooks/02_environment.ipynb.
"""

from __future__ import annotations

import inspect
import math
import numbers
import queue
import threading
import time
from typing import Callable

from helpers.data import Task
from helpers.envs.base import (STOP_REASONS, EnvError, StepResult, clip_observation, new_info, tool_methods, tool_schemas,
                                tool_signatures, typed_arguments)
from helpers.formats import ToolCall, judge_answer, parse_tool_call, tool_call_blocks

LIMITS = ("max_steps", "step_timeout", "episode_timeout", "max_observation_chars", "max_calls_per_step")  # Episode's options


_THIS_THREAD = threading.local()


def call_with_timeout(fn: Callable[..., object], arguments: dict, timeout: float) -> tuple[bool, object, Exception | None]:
    """Run ``fn(**arguments)`` in a daemon thread: ``(finished, returned value, raised exception)``.

    ``finished`` is False when it did not return within ``timeout`` seconds. In a thread marked with
    ``steps_timed_by_caller`` the call runs right here, and always finishes (the caller keeps the time).
    """
    if getattr(_THIS_THREAD, "timed_by_caller", False):
        return True, *run_tool(fn, arguments)
    return _TOOL_THREADS.run(fn, arguments, timeout)


def run_tool(fn: Callable[..., object], arguments: dict) -> tuple[object, Exception | None]:
    """``(returned value, raised exception)`` of ``fn(**arguments)``: the tool's bug must not crash the rollout."""
    try:
        return fn(**arguments), None
    except Exception as e:
        return None, e


def steps_timed_by_caller() -> None:
    """Mark the current thread as one whose owner times every step taken in it, and abandons the thread
    when a step overruns (the rollout's step pool, ``helpers.rollout.env_pool``, which waits at most the
    episode's ``step_timeout``). The tools of a step taken there run in that thread: a second thread would
    only add a handoff there and back, which costs more than a small tool's own work."""
    _THIS_THREAD.timed_by_caller = True


class ToolThreads:
    """Daemon threads that run tool calls, each reused once its call returns: starting a thread for every
    call costs more than a small tool's work (the join waits for the new thread to be scheduled).
    Daemon threads, so a tool that never returns does not keep the process from exiting; a thread whose
    call timed out is left to it, and serves again if the call ever returns."""

    def __init__(self):
        self.idle: queue.SimpleQueue = queue.SimpleQueue()  # the inboxes of the threads waiting for a call

    def run(self, fn: Callable[..., object], arguments: dict, timeout: float) -> tuple[bool, object, Exception | None]:
        try:
            inbox = self.idle.get_nowait()
        except queue.Empty:
            inbox = queue.SimpleQueue()
            threading.Thread(target=self._serve, args=(inbox,), name="tool-call", daemon=True).start()
        box: dict = {"value": None, "error": None}
        done = threading.Event()
        inbox.put((fn, arguments, box, done))
        finished = done.wait(max(timeout, 0.0))
        return finished, box["value"], box["error"]

    def _serve(self, inbox: queue.SimpleQueue) -> None:
        while True:
            fn, arguments, box, done = inbox.get()
            box["value"], box["error"] = run_tool(fn, arguments)
            self.idle.put(inbox)  # idle again before the caller hears back, so its next call finds this thread
            done.set()


_TOOL_THREADS = ToolThreads()


class Episode:
    """Drives one environment (an object on TRL's contract) turn by turn; reset it for every episode.

    Attributes the rollout reads: ``tools`` (JSON schemas, or None: no tools), ``stop_reason`` (None
    while the episode runs), ``info`` (the running episode's info; each StepResult gets a copy),
    ``steps`` (turns so far), ``env`` (the environment itself).
    """

    def __init__(
        self,
        env,
        max_steps: int = 10,
        step_timeout: float = 5.0,
        episode_timeout: float | None = 600.0,
        max_observation_chars: int = 2000,
        max_calls_per_step: int = 8,
    ):
        if not callable(getattr(env, "reset", None)):
            raise TypeError(f"{type(env).__name__} has no reset method; an environment needs reset(**row) (TRL's contract)")
        if max_steps < 1:
            raise ValueError(f"max_steps must be at least 1, got {max_steps}")
        self.env = env
        self.toolbox = tool_methods(env)  # name -> bound method, in TRL's order (by name)
        methods = {**self.toolbox, "get_reward": getattr(env, "get_reward", None)}
        if asynchronous := [name for name, method in methods.items() if inspect.iscoroutinefunction(method)]:
            raise TypeError(f"{type(env).__name__}: Episode does not run async methods (TRL does): {', '.join(asynchronous)}; "
                            "make them plain functions")
        self.tools = tool_schemas(env) or None  # None: the chat template lists no tools
        self.schema_of = {schema["function"]["name"]: schema for schema in self.tools or []}  # tool name -> its JSON schema
        self.signature_of = tool_signatures(env)  # tool name -> its signature
        self.owns_reward = callable(getattr(env, "get_reward", None))
        self.judge = getattr(env, "_judge", None)  # the world's own final-turn judging, or None: judge_answer
        self.max_steps = max_steps
        self.step_timeout = step_timeout
        self.episode_timeout = episode_timeout
        self.max_observation_chars = max_observation_chars
        self.max_calls_per_step = max_calls_per_step
        self.task: Task | None = None
        self.steps = 0
        self.stop_reason: str | None = None
        self.info = self._new_info()
        self.started = 0.0  # time.monotonic() at reset
        self.calling: str | None = None  # the tool whose call is running now, if any

    @property
    def name(self) -> str:
        return type(self.env).__name__

    def reset(self, task: Task) -> list[dict]:
        """Start an episode of ``task``: ``env.reset(**task.row())``. Returns the messages the policy
        sees first: a copy of the task's prompt, with the string reset returned (if any) appended to
        the last message, as TRL does."""
        if not isinstance(task, Task):
            raise TypeError(f"reset() needs a helpers.data.Task, got {type(task).__name__}")
        self.task, self.steps, self.stop_reason, self.calling = task, 0, None, None
        self.info = self._new_info()
        self.started = time.monotonic()
        try:
            observation = self.env.reset(**task.row())
        except Exception as error:  # a task the env cannot play is the caller's bug: say which task
            error.add_note(f"in {self.name}.reset(**row) of task {task.id!r}")
            raise
        messages = [dict(message) for message in task.prompt]
        if observation is not None:
            if not isinstance(observation, str):
                raise TypeError(f"{self.name}.reset returned {type(observation).__name__}; it must return a string or None")
            messages[-1]["content"] += observation
        return messages

    def step(self, action: str) -> StepResult:
        """One assistant turn: run its tool calls, or judge it as the final answer."""
        self._check_can_step()
        self.steps += 1
        text = action if isinstance(action, str) else str(action)
        now = time.monotonic()
        episode_deadline = self.started + self.episode_timeout if self.episode_timeout is not None else math.inf
        if now > episode_deadline:
            return self._limit("timeout", f"episode ran longer than episode_timeout={self.episode_timeout} s")

        blocks = tool_call_blocks(text) if self.toolbox else []  # an env without tools: every turn is the answer
        if not blocks:
            return self._final(text)

        step_deadline = min(now + self.step_timeout, episode_deadline)
        messages = []
        for i, raw in enumerate(blocks):
            if i == self.max_calls_per_step:
                skipped = len(blocks) - i
                messages.append(self._tool_message(f"error: at most {self.max_calls_per_step} tool calls per turn; {skipped} skipped"))
                break
            self.info["tool_calls"] += 1
            call = parse_tool_call(raw)
            self.calling = call.name  # until it returns; if the episode ends first, _end counts the call as hung
            result = self._call(call, timeout=step_deadline - time.monotonic())
            if result is None:
                return self._limit("timeout", f"tool {call.name!r} did not return within the time limit ({self.step_timeout} s per step)")
            self.calling = None
            messages.append(self._tool_message(result))

        if self.steps >= self.max_steps:
            return self._limit("max_steps", f"no final answer after max_steps={self.max_steps} turns")
        return StepResult(messages, 0.0, False, False, dict(self.info))

    def is_done(self) -> bool:
        return self.stop_reason is not None

    def truncate(self, stop_reason: str = "max_tokens") -> StepResult:
        """End the episode from outside, e.g. when the rollout's token budget runs out.

        Returns the final StepResult (truncated) with the full ``info``, so the rollout records
        every episode the same way however it ended. A tool call still running then (its step's
        caller stopped waiting for it) is counted as hung (``_end``).
        """
        if stop_reason not in STOP_REASONS:
            raise ValueError(f"unknown stop_reason {stop_reason!r}; expected one of {STOP_REASONS}")
        self._check_can_step()
        if self.info["verdict"] is None:
            self.info["verdict"] = "no_answer"
        return self._end(stop_reason)

    # --- the parts of a turn ----------------------------------------------------------------------

    def _new_info(self) -> dict:
        """A fresh ``info``. ``judge_answer`` reports the strict format, so episodes it judges start
        with ``strict_format`` False (an episode cut short was not in the format)."""
        return new_info(strict_format=False) if self.judge is None else new_info()

    def _check_can_step(self) -> None:
        if self.task is None:
            raise EnvError(f"{self.name}.step() called before reset(task)")
        if self.is_done():
            raise EnvError(f"{self.name}.step() called after the episode ended (stop_reason={self.stop_reason!r}); call reset(task) first")

    def _call(self, call: ToolCall, timeout: float) -> str | None:
        """One call's result text, or None when the tool did not return within ``timeout``."""
        if call.error:
            return self._failure(call.error)
        tool = self.toolbox.get(call.name)
        if tool is None:
            return self._failure(f"unknown tool {call.name!r}; available: {', '.join(self.toolbox)}")
        arguments = typed_arguments(call.arguments, self.schema_of[call.name])  # "37" -> 37 for an int, as in TRL
        try:
            self.signature_of[call.name].bind(**arguments)  # a missing or unexpected argument, without running anything
        except TypeError as e:
            return self._failure(f"{call.name}: {e}")
        finished, value, error = call_with_timeout(tool, arguments, timeout)
        if not finished:
            return None
        if error is not None:
            return self._failure(f"tool raised {type(error).__name__}: {error}")
        return str(value)

    def _failure(self, why: str) -> str:
        """A call that could not be made or raised (TRL's ``tools/failure_frequency``; malformed JSON: module docstring)."""
        self.info["tool_failures"] += 1
        return f"error: {why}"

    def _tool_message(self, result: str) -> dict:
        if result.startswith("error:"):
            self.info["tool_errors"] += 1
        return {"role": "tool", "content": clip_observation(result, self.max_observation_chars)}

    def _final(self, text: str) -> StepResult:
        """The turn without a tool call: the final answer, judged by ``judge_answer`` or the env's ``_judge``."""
        if self.judge is None:
            self.info.update(judge_answer(text, self.task.answer))
            return self._end("answered", reward=1.0 if self.info["correct"] else 0.0)
        judged = dict(self.judge(text))
        reward, stop_reason, feedback = judged.pop("reward", 0.0), judged.pop("stop_reason", "answered"), judged.pop("feedback", None)
        self.info.update(judged)
        if feedback is not None and stop_reason == "answered" and not self.info["correct"] and self.steps < self.max_steps:
            observation = [{"role": "user", "content": clip_observation(feedback, self.max_observation_chars)}]
            return StepResult(observation, 0.0, False, False, dict(self.info))
        return self._end(stop_reason, reward)

    def _limit(self, stop_reason: str, why: str) -> StepResult:
        """End the episode because a limit was hit; the policy never answered."""
        self.info["verdict"] = "no_answer"
        self.info["limit"] = why
        return self._end(stop_reason)

    def _end(self, stop_reason: str, reward: float = 0.0) -> StepResult:
        """Finish the episode: ``terminated`` when answered, ``truncated`` for any limit or error.
        An env with ``get_reward`` owns the episode's reward, however it ended (as in TRL). A tool call that
        has not returned (``step``'s own timer, or a caller that stopped waiting for the step, gave up on it)
        hung: it counts in ``tool_errors`` and ``tool_failures``."""
        if self.calling is not None:
            self.info["tool_errors"] += 1
            self.info["tool_failures"] += 1
        if self.owns_reward:
            reward = self._env_reward()
        self.stop_reason = stop_reason
        self.info["stop_reason"] = stop_reason
        terminated = stop_reason == "answered"
        return StepResult([], float(reward), terminated, not terminated, dict(self.info))

    def _env_reward(self) -> float:
        """``env.get_reward()``, recorded as ``info["env_reward"] = {class name: value}``; 0 and the
        reason in ``info["env_reward_error"]`` when it raises or returns no finite number."""
        try:
            value = self.env.get_reward()
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
                raise TypeError(f"get_reward() returned {type(value).__name__} {str(value)[:40]!r}, not a finite number")
        except Exception as e:
            self.info["env_reward"] = {self.name: None}
            self.info["env_reward_error"] = f"{type(e).__name__}: {e}"
            return 0.0
        self.info["env_reward"] = {self.name: float(value)}
        return float(value)
