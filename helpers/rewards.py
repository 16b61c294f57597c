"""Reward module (奖励模块): rule rewards, weighted hybrids, the reward report.

The reward decides what the agent learns. In this workbook a reward is a plain function

    reward(traj: Trajectory) -> float                     # or -> dict[str, float] of named parts

and rewards are mixed with weights, by function or by registered name:

    reward = combine({"correct": 1.0, "format": 0.1})     # the form TrainConfig.rewards uses
    rewards = score_trajectories(trajs, reward)           # sets traj.reward and traj.reward_parts
    print(reward_report(trajs))                           # is there any learning signal?

Every rule reward below says in its docstring what a policy can *game* it by: RL
optimises the number, not the intention, and a reward with a loophole is exploited
(``tool_call_bonus`` is this module's deliberate example). The model-judge reward
lives in ``helpers.judge``; it plugs into ``combine`` like any function here. The
same functions drive TRL's ``GRPOTrainer`` through ``helpers.ecosystem.trl_bridge.reward_funcs``;
the pictures of rewards (histogram, the interactive panel) are in ``helpers.viewer``.

Simplifications, named:

* A combined reward stores every part *unweighted* in ``traj.reward_parts`` (as TRL
  logs ``rewards/<name>/mean``) and the weighted sum in ``traj.reward``.
* A part that raises (anything but Ctrl-C, even an exception that cannot print its
  message), returns anything but a finite number (a string, a bool, NaN, inf), or
  changes the trajectory it reads, is worth 0 for that trajectory; so is a weighted sum
  that overflows. The error is written to ``traj.info["reward_errors"]`` and counted,
  so one bad row never stops training and never turns its group's advantages into NaN.
* Outcome checking is the env's own (``helpers.formats.judge_answer`` on the last turn, ``outcome``):
  the reward never disagrees with the env about what counts as correct, under TRL too.
* An env that defines ``get_reward()`` (TRL's environment contract) adds its value as one
  more part named after its class, weight 1, whatever the preset's weights say: TRL does
  the same, so a run means the same in both.
"""

from __future__ import annotations

import functools
import math
import pickle
import traceback
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from helpers.data import parse_gold_answer
from helpers.formats import judge_answer
from helpers.formats import ANSWER_CLOSE, ANSWER_OPEN, TOOL_CALL_OPEN, answers_match, extract_answer, to_number
from helpers.rollout import Trajectory

RewardFn = Callable[[Trajectory], "float | dict[str, float]"]

REWARDS: dict[str, RewardFn] = {}  # name -> reward function; configs refer to rewards by these names


def register_reward(name: str):
    """Decorator: make a reward usable by name in ``combine({"name": weight})`` and in configs."""

    def add(fn: RewardFn) -> RewardFn:
        REWARDS[name] = fn
        return fn

    return add


def reward_name(fn) -> str:
    """The name a reward is logged under: its registry name, else ``.name``, else its function name."""
    for name, registered in REWARDS.items():
        if registered is fn:
            return name
    if isinstance(getattr(fn, "name", None), str):
        return fn.name
    while isinstance(fn, functools.partial):  # partial(length_penalty, budget=128) -> "length_penalty"
        fn = fn.func
    return getattr(fn, "__name__", type(fn).__name__)


# ----------------------------------------------------------------------------------------------
# 1. Outcome: is the final answer right?
# ----------------------------------------------------------------------------------------------


def check_answer(text: str, reference: str | None) -> dict:
    """GSM8K-style outcome check, as the env does it: ``helpers.formats.judge_answer``.

    Returns the env's info keys: ``correct``, ``verdict`` (``"correct"``, ``"wrong_number"``,
    ``"wrong_answer"``, ``"check_timeout"``, ``"no_answer"``, or ``"no_reference"``), ``predicted``, ``strict_format``.
    The answer is found leniently (tag, ``\\boxed{}``, ``#### N``, the last number), so
    ``1,000``, ``$1000.00``, ``1000.`` and ``\\boxed{1000}`` all equal 1000; math-verify
    decides answers that are not plain numbers. The reference may also be a whole GSM8K
    solution ending in ``#### 1,000`` (TRL passes the dataset's ``answer`` column as is).
    """
    if reference is None:
        return {"correct": False, "verdict": "no_reference", "predicted": None, "strict_format": False}
    if "####" in reference:
        reference = parse_gold_answer(reference)
    return judge_answer(text, reference)


def outcome(traj: Trajectory) -> dict:
    """The env's verdict when the episode has one (``info["verdict"]``), else ``check_answer`` on the text the env
    would have judged: the last assistant turn (a trajectory rebuilt from TRL's completion, where an earlier
    turn's text is still there). A last turn that calls a tool was cut short (TRL's tool-calling limit): no answer,
    as ``Episode`` ignores an answer written beside a call."""
    info = traj.info or {}
    if info.get("verdict") is not None:
        return info
    turns = [m for m in traj.messages if m["role"] == "assistant"]
    last = turns[-1] if turns else {}
    text = last.get("content") or ""
    if last.get("tool_calls") or TOOL_CALL_OPEN in text:
        return judge_answer("", traj.task.answer)  # the judge's own "no_answer", whatever the reference
    return check_answer(text, traj.task.answer)


@register_reward("correct")
def correct(traj: Trajectory) -> float:
    """1.0 if the final answer is right, else 0.0 (the env's verdict, or ``check_answer``).

    The reward we actually want, and the only one here that cannot be satisfied without
    solving the task. Gamed by: a lenient checker. With the last-number fallback, an
    answer that lists many numbers ("maybe 12, or 15, or 18") is judged by its *last*
    one, and guessing the most common answer pays off on easy sets; a sparse 0/1
    signal also gives no gradient when every sample in a group fails (see
    ``reward_report``).

    Taught in notebooks/04_reward.ipynb §2.
    """
    return 1.0 if outcome(traj)["correct"] else 0.0


def env_reward(traj: Trajectory) -> float:
    """The env's own reward: what its ``get_reward()`` returned when the episode ended (TRL's
    contract; ``helpers.envs.Episode`` records it in ``info["env_reward"]`` as ``{class name: value}``).
    ``CombinedReward`` adds it by itself, under the class's name, weight 1. Raises when the call
    failed, so the part scores 0 and the error is counted.

    Gamed by: whatever the env's state can be pushed to without solving the task; the env's
    author decides what that is.
    """
    (value,) = traj.info["env_reward"].values()
    if value is None:
        raise RuntimeError(traj.info.get("env_reward_error", "get_reward() failed"))
    return value


# ----------------------------------------------------------------------------------------------
# 2. Shaping rewards: format, tool use, length, steps
# ----------------------------------------------------------------------------------------------


@register_reward("format")
def strict_format(traj: Trajectory) -> float:
    """1.0 if the completion holds exactly one non-empty ``<answer>...</answer>``, else 0.0.

    Teaches the format the env parses strictly. Gamed by: writing the tag with a wrong
    (or any) number in it: format alone pays for a confident wrong answer, so keep its
    weight small next to ``correct`` (0.1 against 1.0 is usual).
    """
    text = traj.completion_text
    if text.count(ANSWER_OPEN) != 1 or text.count(ANSWER_CLOSE) != 1:
        return 0.0
    inside = text.split(ANSWER_OPEN, 1)[1].split(ANSWER_CLOSE, 1)[0]
    return 1.0 if inside.strip() else 0.0


def tool_results(traj: Trajectory) -> list[str]:
    """Contents of the tool messages that were not errors, in order."""
    return [m["content"] for m in traj.messages if m["role"] == "tool" and not str(m["content"]).startswith("error:")]


@register_reward("tool_use")
def tool_use(traj: Trajectory) -> float:
    """1.0 if the calculator was called and one of its results *is* the final answer, else 0.0.

    Rewards using the verification tool and using what it said. Gamed by: calling the
    calculator on the answer itself (``{"expression": "42"}``) after guessing 42, which
    "verifies" nothing; and it pays on wrong answers whose wrong number came from a
    wrong expression. Use it as a small bonus next to ``correct``, never alone.
    """
    if traj.tool_calls == 0:
        return 0.0
    answer = extract_answer(_final_assistant_text(traj)).value
    return 1.0 if any(answers_match(answer, to_number(r)) for r in tool_results(traj)) else 0.0


def _final_assistant_text(traj: Trajectory) -> str:
    replies = [m.get("content") or "" for m in traj.messages if m["role"] == "assistant"]
    return replies[-1] if replies else ""


def generated_tokens(traj: Trajectory) -> int:
    """Tokens the policy wrote (mask == 1); whitespace words when there are no token ids."""
    if traj.mask:
        return traj.num_generated
    return len(traj.completion_text.split())


@register_reward("length")
def length_penalty(traj: Trajectory, budget: int = 256) -> float:
    """``-min(1, generated_tokens / budget)``: in [-1, 0], 0 for an empty reply.

    Counters rambling (and the cost of long rollouts). Gamed by: answering at once
    without working or tool calls, which can trade correctness for brevity when the
    weight is large; and by stopping early with no answer. Change the budget with
    ``functools.partial(length_penalty, budget=128)``.
    """
    return -min(1.0, generated_tokens(traj) / budget)


@register_reward("step_cost")
def step_cost(traj: Trajectory) -> float:
    """``-(assistant turns - 1)``: every turn after the first costs 1 (weight it by e.g. 0.05).

    Discourages needless extra turns (calling a tool again and again). Gamed by:
    skipping the tool even when it would help (a one-turn guess costs nothing), so
    a large weight teaches the agent to stop verifying.
    """
    turns = traj.turns or sum(m["role"] == "assistant" for m in traj.messages)
    return -float(max(0, turns - 1))


@register_reward("tool_call_bonus")
def tool_call_bonus(traj: Trajectory) -> float:
    """LOOPHOLE, on purpose: +1 for every calculator call, right answer or not.

    Meant as "encourage tool use"; exploited by calling the tool on every turn until
    the episode runs out of steps and never answering: more calls, more reward.
    Notebook 04 shows it exploited and fixed (pay ``tool_use`` instead: once, and
    only when the tool's result is the answer). Not for training.
    """
    return float(traj.tool_calls)


# ----------------------------------------------------------------------------------------------
# 3. Weighted hybrids, with every part logged and every error caught
# ----------------------------------------------------------------------------------------------


def get_reward(name_or_fn) -> RewardFn:
    """A reward function from a registered name, or the function itself."""
    if callable(name_or_fn):
        return name_or_fn
    if name_or_fn not in REWARDS:
        raise KeyError(f"unknown reward {name_or_fn!r}; registered: {sorted(REWARDS)} (or pass a function)")
    return REWARDS[name_or_fn]


def safe_call(fn: RewardFn, name: str, traj: Trajectory) -> tuple[dict[str, float], str | None]:
    """Run one reward on one trajectory: its parts as ``{name: value}`` and the error, if any.
    Never raises, but on Ctrl-C (``KeyboardInterrupt`` must still stop a run).

    A dict-valued reward gives ``{"name/key": value, ...}``. An exception of any kind (a
    ``SystemExit`` too), a value that is not a finite number, or a change to the trajectory
    gives ``{name: 0.0}``; the error is returned and recorded in
    ``traj.info["reward_errors"][name]`` (a later successful call clears it).

    A reward reads the trajectory; one that writes to it (a message, ``info["verdict"]``)
    would change what every later part reads. We compare the trajectory's pickled bytes
    before and after the call and put it back as it was.
    Simplification, named: a trajectory that pickle cannot copy (it holds a lock, a
    generator) is not checked.
    """
    errors = (traj.info or {}).get("reward_errors", {})
    errors.pop(name, None)
    before = _pickled(traj)
    error, parts = None, {}
    try:
        value = fn(traj)
        values = value if isinstance(value, dict) else {None: value}
        parts = {name if key is None else f"{name}/{key}": as_number(v) for key, v in values.items()}
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # whatever a user's reward raises is that part's error, not the run's
        error = e
    if before is not None and _pickled(traj) != before:
        vars(traj).update(vars(pickle.loads(before)))  # as it was before the call, for the next part
        error = error or RuntimeError(f"the reward {name!r} changed the trajectory it was given (a reward may only read it)")
    if error is not None:
        return {name: 0.0}, record_error(traj, name, error)
    return parts, None


def _pickled(traj: Trajectory) -> bytes | None:
    """The trajectory as bytes, to see whether a reward changed it; None when pickle cannot copy it."""
    try:
        return pickle.dumps(traj, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        return None


def as_number(value) -> float:
    """A reward value as a finite float, or a clear error: a string ("0.5") or a bool (True)
    is almost always a bug in the reward, and one NaN or inf would poison its whole group's
    advantages (and with it the optimizer step)."""
    if isinstance(value, bool) or not hasattr(value, "__float__"):  # a str has no __float__; numpy/torch scalars do
        raise TypeError(f"a reward must be a number, got {type(value).__name__} {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"reward is not a finite number: {number}")
    return number


def describe_error(error: BaseException, limit: int = 300) -> str:
    """``"TypeName: message"``, at most ``limit`` characters, for any exception: one whose
    ``__str__`` raises (or returns no string) reads ``TypeName: <message cannot be printed>``."""
    try:
        text = str(error)
    except Exception:
        text = "<message cannot be printed>"
    return (f"{type(error).__name__}: {text}" if text else type(error).__name__)[:limit]


def record_error(traj: Trajectory, name: str, error: BaseException) -> str:
    """Write a reward error into ``traj.info["reward_errors"][name]``; return its one-line message."""
    last = traceback.extract_tb(error.__traceback__)[-1] if error.__traceback__ else None
    message = describe_error(error) + (f" (in {last.name}, line {last.lineno})" if last else "")
    traj.info = dict(traj.info or {})
    traj.info.setdefault("reward_errors", {})[name] = message
    return message


def finite_total(traj: Trajectory, name: str, values: dict[str, float], total: float) -> tuple[float, str | None]:
    """``total``, a (weighted) sum of the finite ``values``, and None; or, when the sum is not finite
    (finite parts can still overflow: 1e308 * 2 = inf), 0.0 and the error, recorded in ``traj`` under ``name``
    as ``safe_call`` records a part's own. The one rule for a sum of parts, here and on TRL's path."""
    if math.isfinite(total):
        return total, None
    return 0.0, record_error(traj, name, OverflowError(f"weighted sum of {values} is {total}"))


@dataclass
class CombinedReward:
    """A weighted sum of rewards: ``reward = sum_k weight_k * part_k``.

    Calling it on a trajectory sets ``traj.reward_parts`` (each part unweighted) and
    ``traj.reward`` (the weighted sum) and returns the sum. An episode whose env has a
    ``get_reward()`` gets that value as one more part, named after the env's class, weight 1
    (``env_reward``), as TRL adds it to ``reward_funcs``. ``errors`` counts, per part,
    how many calls raised. Parts with a ``prepare(trajs)`` method (the judge, which can
    score a whole batch or a whole group at once) get the batch first in
    ``score_trajectories``.
    """

    parts: dict[str, tuple[RewardFn, float]]  # name -> (function, weight)
    errors: Counter = field(default_factory=Counter)
    name: str = "reward"

    def __call__(self, traj: Trajectory) -> float:
        values: dict[str, float] = {}
        total = 0.0
        parts = dict(self.parts)
        for name in (traj.info or {}).get("env_reward") or {}:  # the env's get_reward(): one more part, weight 1, as in TRL
            parts.setdefault(name, (env_reward, 1.0))
        for name, (fn, weight) in parts.items():
            got, error = safe_call(fn, name, traj)
            if error:
                self.errors[name] += 1
            values.update(got)
            total += weight * sum(got.values())
        total, error = finite_total(traj, self.name, values, total)
        if error:
            self.errors[self.name] += 1
        traj.reward_parts = values
        traj.reward = total
        return total

    def prepare(self, trajs: list[Trajectory]) -> None:
        """Give each batch-aware part the batch first. One that raises is counted in ``errors``
        and skipped: each trajectory is then scored by the part alone, which records its own errors."""
        for name, (fn, _) in self.parts.items():
            try:
                if hasattr(fn, "prepare"):
                    fn.prepare(trajs)
            except KeyboardInterrupt:
                raise
            except BaseException:
                self.errors[name] += 1

    @property
    def weights(self) -> dict[str, float]:
        return {name: weight for name, (_, weight) in self.parts.items()}


def combine(weights: dict) -> CombinedReward:
    """A weighted hybrid from ``{name_or_fn: weight}``, e.g. ``combine({"correct": 1.0, judge: 0.1})``.

    Taught in notebooks/04_reward.ipynb §3.
    """
    if not weights:
        raise ValueError("combine needs at least one reward, e.g. combine({'correct': 1.0})")
    parts = {}
    for key, weight in weights.items():
        fn = get_reward(key)
        name = key if isinstance(key, str) else reward_name(fn)
        if name in parts:
            raise ValueError(f"two rewards are both named {name!r}; give one a .name")
        try:
            parts[name] = (fn, as_number(weight))
        except (TypeError, ValueError) as e:
            raise ValueError(f"the weight of reward {name!r} must be a finite number, got {weight!r}") from e
    return CombinedReward(parts)


def as_reward(spec) -> CombinedReward:
    """Anything reward-like as a CombinedReward: a name, a function, a ``{name: weight}`` dict."""
    if isinstance(spec, CombinedReward):
        return spec
    if isinstance(spec, dict):
        return combine(spec)
    return combine({spec: 1.0})


def score_trajectories(trajs: list[Trajectory], reward) -> list[float]:
    """Score a batch in place (``traj.reward``, ``traj.reward_parts``) and return the rewards.

    ``reward`` is anything ``as_reward`` accepts. Batch-aware parts (a judge) are
    prepared with the whole batch first, so they can use a thread pool or judge a
    task's G samples side by side.

    Taught in notebooks/04_reward.ipynb §4.
    """
    reward = as_reward(reward)
    reward.prepare(trajs)
    return [reward(t) for t in trajs]


# ----------------------------------------------------------------------------------------------
# 4. Diagnostics: is there a learning signal, and why are answers wrong?
# ----------------------------------------------------------------------------------------------

REASONS = {  # verdict -> readable reason
    "no_answer": "no answer found",
    "wrong_number": "answer found, wrong number",
    "wrong_answer": "answer found, not a number",
    "no_reference": "task has no reference answer",
}


def wrong_reason(traj: Trajectory) -> str:
    """Why a trajectory's answer was judged wrong, in words (from the env's info when present)."""
    verdict = outcome(traj)["verdict"]
    reason = REASONS.get(verdict, verdict.replace("_", " "))
    stop = traj.stop_reason or (traj.info or {}).get("stop_reason", "")
    if verdict == "no_answer" and stop and stop != "answered":
        reason += f" (stopped by {stop})"
    return reason


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _std(values: list[float]) -> float:
    """The unbiased (Bessel-corrected) standard deviation, as torch.std and TRL's ``reward_std``."""
    if len(values) < 2:
        return 0.0
    m = _mean(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


@dataclass
class RewardReport:
    """What ``reward_report`` found. ``str(report)`` is the readable summary."""

    n: int
    parts: dict[str, list[float]]  # part name -> values (one per trajectory)
    rewards: list[float]  # total reward per trajectory
    n_groups: int
    flat_groups: int  # groups whose G rewards are all equal: advantage 0, no learning signal
    errors: list[tuple[str, int, str, str]]  # (task id, group index, part, error)
    wrong_reasons: Counter  # reason -> count, over trajectories whose answer was wrong
    examples: dict[str, list[str]]  # reason -> a few completions (tail)

    @property
    def flat_fraction(self) -> float:
        return self.flat_groups / self.n_groups if self.n_groups else 0.0

    @property
    def all_zero(self) -> bool:
        return all(r == 0 for r in self.rewards)

    def metrics(self) -> dict[str, float]:
        """The batch's reward figures under TRL's names (``reward``, ``reward_std``,
        ``rewards/<part>/mean`` and ``/std``, ``frac_reward_zero_std``), plus ours:
        ``all_zero_reward`` (1.0 when no sample earned anything) and ``reward_errors``."""
        out = {"reward": _mean(self.rewards), "reward_std": _std(self.rewards)}
        for name, values in self.parts.items():
            out[f"rewards/{name}/mean"], out[f"rewards/{name}/std"] = _mean(values), _std(values)
        out.update(frac_reward_zero_std=self.flat_fraction, all_zero_reward=float(self.all_zero),
                   reward_errors=float(len(self.errors)))
        return out

    def __str__(self) -> str:
        lines = [f"{self.n} trajectories in {self.n_groups} groups"]
        for name, values in self.parts.items():
            mean = sum(values) / len(values)
            lines.append(f"  {name:>16}: mean {mean:+.3f}  min {min(values):+.3f}  max {max(values):+.3f}  nonzero {sum(v != 0 for v in values)}/{len(values)}")
        lines.append(f"groups with all rewards equal (no learning signal): {self.flat_groups}/{self.n_groups} = {self.flat_fraction:.0%}")
        wrong = sum(self.wrong_reasons.values())
        if self.all_zero and wrong:
            reason, count = self.wrong_reasons.most_common(1)[0]
            lines.append(f"ALL REWARDS ARE ZERO. Most common reason: {reason} in {count / self.n:.0%} of trajectories")
        for reason, count in self.wrong_reasons.most_common():
            lines.append(f"  wrong: {reason}: {count}/{self.n}")
            for ex in self.examples.get(reason, []):
                lines.append(f"      e.g. ...{ex!r}")
        if self.errors:
            lines.append(f"REWARD ERRORS: {len(self.errors)} (each counted as 0)")
            for task_id, group, part, err in self.errors[:5]:
                lines.append(f"  {part} on {task_id}#{group}: {err}")
        return "\n".join(lines)


def reward_report(trajs: list[Trajectory], reward=None, n_examples: int = 2, tail: int = 80) -> RewardReport:
    """Diagnose a scored batch: per-part distribution, flat groups, why answers were wrong, errors.

    ``reward`` (optional, anything ``as_reward`` accepts) re-scores the batch first;
    without it the trajectories' existing ``reward`` and ``reward_parts`` are used.

    Taught in notebooks/04_reward.ipynb §7.
    """
    if not trajs:
        raise ValueError("reward_report needs at least one trajectory")
    if reward is not None:
        score_trajectories(trajs, reward)
    names = list(dict.fromkeys(k for t in trajs for k in t.reward_parts)) or ["reward"]
    parts = {k: [t.reward_parts.get(k, t.reward if k == "reward" else 0.0) for t in trajs] for k in names}
    groups: dict[str, list[float]] = {}
    for t in trajs:
        groups.setdefault(t.task_id, []).append(t.reward)
    flat = sum(max(g) - min(g) < 1e-9 for g in groups.values())
    errors = [(t.task_id, t.group, part, err) for t in trajs for part, err in (t.info or {}).get("reward_errors", {}).items()]
    reasons: Counter = Counter()
    examples: dict[str, list[str]] = {}
    for t in trajs:
        if outcome(t)["correct"]:
            continue
        reason = wrong_reason(t)
        reasons[reason] += 1
        if len(examples.setdefault(reason, [])) < n_examples:
            examples[reason].append(t.completion_text[-tail:])
    return RewardReport(len(trajs), parts, [t.reward for t in trajs], len(groups), flat, errors, reasons, examples)
