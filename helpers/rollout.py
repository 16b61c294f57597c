"""Rollout module (采样模块): the Trajectory and the loop that produces it.

    trajs = rollout(tasks, lambda: make_env("calculator"), policy, group_size=8)
    trajs = rollout(tasks, ShopEnv, policy, group_size=8)   # an env class on TRL's contract, as GRPOTrainer(environment_factory=ShopEnv)
    trajs[0].token_ids, trajs[0].mask, trajs[0].reward, trajs[0].stop_reason
    trajs.stats.generate_s, trajs.stats.env_s            # where the time went

Each episode is driven through the env's teaching ``step(text)``: the factory returns an
``helpers.envs.Episode`` (what ``make_env`` gives), or a bare environment object, which is
wrapped in one with this call's limits.

What one call does, for ``len(tasks) * group_size`` episodes at once:

    reset every env, render its first messages to token ids (the prompt)
    while some episode is live:
        one batched policy.generate over the token ids of ALL live episodes   (one assistant turn each)
        step their envs in a thread pool, with a per-step timeout
        append each env's observation AS TOKENS; finished episodes leave the batch

Token-in/token-out (TITO). The episode is a list of token ids that only ever grows:
the policy's sampled tokens are appended as they were sampled (mask 1), and env
messages are rendered through the chat template and appended as the *new* tokens
only (mask 0). The text is never re-tokenised, so the tokens the trainer sees are
exactly the tokens the policy sampled, with their sampling log-probs. (Decoding a
turn to text and encoding it again can give other ids: BPE has many ways to spell
a string, and the model need not pick the canonical one. ``RolloutStats.retokenize_drift``
counts the turns where that happened.)

How the new tokens of an observation are found (as TRL's ``_get_tool_suffix_ids``):
render the conversation before (``prefix``) and after (``full``) the env's messages;
assert ``full`` starts with ``prefix`` (the template only appends; a template that
rewrites history, e.g. one that drops old reasoning, fails here with a clear error);
the new tokens are ``full`` after ``prefix``'s last end-of-turn token. For Qwen's
template and the tiny one that suffix starts with the ``"\\n"`` that follows
``<|im_end|>`` and ends with ``<|im_start|>assistant\\n``, the opening of the next turn.
The assistant's end of turn is handled like this:

* the turn ended on ``<|im_end|>`` (the eos): it was sampled, so it is in the episode with mask 1;
* the turn ended on ``</tool_call>`` (a stop token that is not the eos): the template's
  ``<|im_end|>`` is appended with mask 0 before the suffix. The policy did not write it,
  so it is not trained on: the model learns to stop at ``</tool_call>`` and the
  scaffolding closes the turn.

Each distinct prompt and each distinct observation is rendered once per call
(``TemplateMemo``). Rendering the whole conversation twice per observation was most of a
rollout's host-side time, and the G episodes of a group repeat one another: one prompt,
often the same tool results. The suffix after an assistant turn depends only on the new
messages (and the tools), for two reasons: the template only appends, rendering each
message from the message itself and the role of the one before it (here always the
assistant's); and ``<|im_end|>`` is a special token, which the tokenizer never merges
with its neighbours, so the tokens after it depend only on the text after it. So the
first observation of a call has its suffix computed the full way above, with the checks
(the template only appends; the rendered conversation is the episode's tokens, when the
episode has not drifted), and again from the assistant turn before it alone; when the two
agree, every later distinct observation of the call is rendered from that short context
(its own messages after that same assistant turn, whose tokens are rendered once), and
the episodes that meet the same observation later reuse those tokens. A template that
looked further back would pass the first check and could be wrong later;
``tests/test_rollout_tokens.py`` renders every world's finished episodes from scratch and
compares them token for token.

When an episode ends (``stop_reason``):

* the env says done: its own reason (``answered``, ``max_steps``, ``error`` ...);
* ``max_steps``: the policy has taken ``max_steps`` turns and the env still is not done
  (a guard against envs that never end);
* ``max_tokens``: a turn ran out of tokens before writing a stop token, or the whole
  episode would exceed ``max_total_tokens`` (a turn's budget is the smaller of
  ``max_new_tokens`` and what is left of ``max_total_tokens``). A turn cut mid-text is
  not a finished action, so it is *not* passed to the env (an answer in it does not
  count); the episode ends with ``env.truncate("max_tokens")``, reward 0; with
  ``TrainConfig.mask_truncated_completions`` (TRL's option of that name) the trainer leaves
  such cut-off episodes out of the loss instead of treating them as wrong answers;
* ``timeout``: one env step took longer than ``step_timeout`` (or the env's own ``step_timeout``,
  when shorter), or the episode has run longer than ``episode_timeout`` seconds.

Simplifications, named:

* Timeouts are checked between phases: a generate call is not interrupted, so an
  episode can overrun ``episode_timeout`` by one generation.
* A timed-out env step keeps running in its thread (Python cannot kill a thread); its
  result is ignored and the rollout moves on. The steps run in one thread pool per
  process (starting 32 threads costs more than a turn of the shop world's steps), and
  a step that times out retires that pool: its hung thread stays there, so a hung tool
  cannot starve later turns. A step's tools run in the pool's thread, not in one of their
  own as ``Episode`` gives them elsewhere: the pool's timeout is theirs, and a tool that
  hangs ends its episode here (``info["limit"]`` says so; ``env.truncate`` counts the call
  in ``tool_failures``, as ``Episode``'s own timer does). Tools that can truly hang (running
  code) should enforce their own limit in a subprocess (``helpers.sandbox``).
* ``reward`` is the env's reward at the end of the episode (0 when a rollout limit ended
  it, via ``env.truncate``); the reward module may replace it.
* Episodes of one ``rollout`` call share one ``SamplingParams``; a per-row token budget
  is applied by cutting a row's generation after the batch call.

Where this loop and TRL 1.16's differ on the token side (the env side: ``helpers.envs.episode``):

* A turn stops at ``</tool_call>`` here, so it holds at most one call and no text after it, and
  the scaffolding closes it (``<|im_end|>``, mask 0). TRL stops only at the eos: a turn may hold
  several calls and text after them, and the model writes ``<|im_end|>`` itself (trained on).
* "Truncated" here means a limit ended the episode (``max_steps``, ``max_tokens``, ``timeout``:
  ``helpers.envs.TRUNCATED``); in TRL it means the completion's last token is not the eos. So
  ``mask_truncated_completions`` and ``completions/clipped_ratio`` count different episodes.
* A tool result that would overflow ``max_total_tokens`` ends the episode here (``max_tokens``,
  reward 0); TRL drops the result and scores the episode as it stands. TRL also runs the
  complete calls of a turn cut by the budget (then drops their results); here a cut turn never
  reaches the env. ``max_total_tokens`` counts the prompt, TRL's ``max_completion_length`` does not.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

from tqdm.auto import tqdm

from helpers.data import Task, read_jsonl, write_jsonl
from helpers.envs import Episode, make_env
from helpers.envs.episode import steps_timed_by_caller
from helpers.formats import encode_chat, parse_tool_calls
from helpers.policy.base import Generation, Policy, SamplingParams


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

    Taught in notebooks/03_rollout.ipynb §4.
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

    @property
    def num_generated(self) -> int:
        """Tokens the policy wrote (mask == 1)."""
        return sum(self.mask)

    @property
    def tool_calls(self) -> int:
        """Tool calls in this episode: the env's count when it kept one, else counted in the
        assistant messages (our ``<tool_call>`` text and the ``tool_calls`` field TRL puts on
        parsed messages, for trajectories rebuilt from TRL completions)."""
        if "tool_calls" in (self.info or {}):
            return int(self.info["tool_calls"])
        return sum(len(parse_tool_calls(m.get("content") or "")) + len(m.get("tool_calls") or [])
                   for m in self.messages if m["role"] == "assistant")


@dataclass
class RolloutStats:
    """Where one rollout call spent its time and tokens (read by the trainer's logs)."""

    episodes: int = 0
    turns: int = 0  # assistant turns, all episodes together
    generated_tokens: int = 0  # mask == 1 tokens
    env_tokens: int = 0  # observation tokens appended (mask == 0, prompt excluded)
    generate_calls: int = 0  # batched policy.generate calls (one per turn)
    generate_s: float = 0.0  # inside policy.generate
    env_s: float = 0.0  # env.reset + env.step (tool calls)
    render_s: float = 0.0  # tokenizer work: rendering prompts and observations, decoding turns, the drift check
    total_s: float = 0.0
    retokenize_drift: int = 0  # turns whose tokens differ from the re-tokenised text (why TITO matters)

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / max(self.total_s, 1e-9)

    @property
    def episodes_per_s(self) -> float:
        return self.episodes / max(self.total_s, 1e-9)


class Rollout(list):
    """The trajectories of one ``rollout`` call (a plain list), plus ``.stats``."""

    def __init__(self, trajectories: list[Trajectory], stats: RolloutStats):
        super().__init__(trajectories)
        self.stats = stats


def stop_token_ids(tokenizer) -> list[int]:
    """The tokens that end an assistant turn: the end-of-turn (eos) and, where the
    vocabulary has it as one token, the closing tool-call tag, so the env runs the tool."""
    ids = [tokenizer.eos_token_id]
    tool_close = tokenizer.convert_tokens_to_ids("</tool_call>")
    if tool_close is not None and tool_close != tokenizer.unk_token_id:
        ids.append(tool_close)
    return ids


def render(tokenizer, messages: list[dict], tools: list[dict] | None, add_generation_prompt: bool) -> list[int]:
    """Token ids of ``messages`` through the tokenizer's chat template; the messages' text is ordinary
    characters, never a control token (``helpers.formats.encode_chat``: a user's ``<|im_start|>`` cannot open a turn)."""
    return encode_chat(tokenizer, messages, tools, add_generation_prompt)


def observation_tokens(
    tokenizer, messages: list[dict], new_messages: list[dict], tools: list[dict] | None, tokens_so_far: list[int] | None = None,
    prefix: list[int] | None = None,
) -> list[int]:
    """The tokens that ``new_messages`` add after ``messages`` (which end with an assistant
    turn), from the last end-of-turn on, through the opening of the next assistant turn.

    ``tokens_so_far``: the episode's tokens, when they are the canonical tokens of
    ``messages`` (no re-tokenisation drift); then the rendered prefix must equal them.
    ``prefix``: ``messages`` rendered (without the generation prompt), when the caller has it.

    >>> # tiny/Qwen template, after "...</tool_call><|im_end|>" + a tool message "4042":
    >>> # "\\n<|im_start|>user\\n<tool_response>\\n4042\\n</tool_response><|im_end|>\\n<|im_start|>assistant\\n"
    """
    prefix = prefix if prefix is not None else render(tokenizer, messages, tools, add_generation_prompt=False)
    full = render(tokenizer, messages + new_messages, tools, add_generation_prompt=True)
    if full[: len(prefix)] != prefix:
        raise ValueError(
            "the chat template rewrites earlier turns when a message is added, so observations cannot be "
            "appended as tokens; use a template that only appends (Qwen2.5's and the tiny one do)"
        )
    if tokenizer.eos_token_id not in prefix:
        raise ValueError("the chat template does not end the assistant turn with the eos token")
    last_eos = len(prefix) - 1 - prefix[::-1].index(tokenizer.eos_token_id)
    if tokens_so_far is not None and prefix[: last_eos + 1] != tokens_so_far:
        raise AssertionError("token-in/token-out broke: the rendered conversation differs from the episode's tokens")
    return full[last_eos + 1 :]


class TemplateMemo:
    """The chat template of one rollout call, rendered once per distinct prompt and once per
    distinct observation (module docstring: why an observation's tokens depend only on its
    messages). Keys are the messages and the tools as JSON; values are token ids."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.prompts: dict[str, list[int]] = {}  # (messages, tools) -> prompt tokens
        self.suffixes: dict[str, list[int]] = {}  # (new messages, tools) -> observation tokens
        self.short_is_exact: bool | None = None  # does the short render give the full one's tokens? (None: not yet seen)
        self.short_context: list[dict] = []  # the assistant turn short renders follow, and its tokens:
        self.short_prefix: list[int] = []  # the first observation's own, so its check covers every later one
        self.tools_json: dict[int, tuple[list[dict] | None, str]] = {}  # id(tools) -> (tools, as JSON): kept, so the id stays theirs

    def key(self, messages: list[dict], tools: list[dict] | None) -> str:
        """Messages and tools as one string, in their own key order (the template prints them in that order); a
        value JSON cannot hold is written as its ``str``, as the template prints it. Each episode's tools are
        one list, written out once."""
        if id(tools) not in self.tools_json:
            self.tools_json[id(tools)] = (tools, json.dumps(tools, default=str))
        return json.dumps(messages, default=str) + "\n" + self.tools_json[id(tools)][1]

    def prompt(self, messages: list[dict], tools: list[dict] | None) -> list[int]:
        key = self.key(messages, tools)
        if key not in self.prompts:
            self.prompts[key] = render(self.tokenizer, messages, tools, add_generation_prompt=True)
        return self.prompts[key]

    def observation(
        self, messages: list[dict], new_messages: list[dict], tools: list[dict] | None, tokens_so_far: list[int] | None
    ) -> list[int]:
        """``observation_tokens``, computed the first time ``new_messages`` are seen. The call's first observation
        is rendered the full way, with its checks, and also from a short conversation: the assistant turn
        before it and the new messages, without the tools. Where the two agree (the suffix depends only on
        the new messages and the role before them: module docstring), every later observation of the call
        is rendered the short way, after that same assistant turn (rendered once): a few messages instead of
        the whole conversation and the tools' schemas."""
        key = self.key(new_messages, tools)
        if key not in self.suffixes:
            if self.short_is_exact:
                self.suffixes[key] = observation_tokens(self.tokenizer, self.short_context, new_messages, None, prefix=self.short_prefix)
            else:
                self.suffixes[key] = observation_tokens(self.tokenizer, messages, new_messages, tools, tokens_so_far)
                if self.short_is_exact is None:
                    self.short_context = messages[-1:]
                    self.short_prefix = render(self.tokenizer, self.short_context, None, add_generation_prompt=False)
                    short = observation_tokens(self.tokenizer, self.short_context, new_messages, None, prefix=self.short_prefix)
                    self.short_is_exact = short == self.suffixes[key]
        return self.suffixes[key]


@dataclass
class _Episode:
    """The mutable state of one live episode (becomes a Trajectory when it ends)."""

    task: Task
    group: int
    env: object
    messages: list[dict]
    token_ids: list[int]
    start: float
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    prompt_len: int = 0
    step_rewards: list[float] = field(default_factory=list)
    turns: int = 0
    reward: float = 0.0  # the env's reward at the end of the episode
    info: dict = field(default_factory=dict)
    stop_reason: str | None = None
    wall_time: float = 0.0
    last_action: str = ""
    last_finish: str = ""
    drifted: bool = False  # some turn's tokens are not the canonical tokens of its text

    def to_trajectory(self) -> Trajectory:
        return Trajectory(
            task=self.task,
            group=self.group,
            token_ids=self.token_ids,
            mask=self.mask,
            logprobs=self.logprobs,
            prompt_len=self.prompt_len,
            step_rewards=self.step_rewards,
            reward=self.reward,
            turns=self.turns,
            stop_reason=self.stop_reason or "",
            wall_time=self.wall_time,
            info=self.info,
            messages=self.messages,
        )


_ENV_POOL: list[cf.ThreadPoolExecutor] = []  # the pool env steps run in (module docstring), made on first use


def env_pool() -> cf.ThreadPoolExecutor:
    """The thread pool that runs env steps: one per process, made on first use. The rollout times each step
    taken in it and retires the pool when one overruns, so the steps' tools run in its threads, not in
    threads of their own (``helpers.envs.episode.steps_timed_by_caller``)."""
    if not _ENV_POOL:
        _ENV_POOL.append(cf.ThreadPoolExecutor(max_workers=32, thread_name_prefix="env-step", initializer=steps_timed_by_caller))
    return _ENV_POOL[0]


def retire_env_pool(pool: cf.ThreadPoolExecutor) -> None:
    """After a step timed out in ``pool``: later steps go to a fresh pool; the old one keeps its hung thread
    and finishes what it was given (another rollout may be using it too), without anyone waiting for it."""
    if _ENV_POOL and _ENV_POOL[0] is pool:
        _ENV_POOL.clear()
    pool.shutdown(wait=False)


def rollout(
    tasks: list[Task],
    env_factory: Callable[[], object] | str,
    policy: Policy,
    group_size: int = 8,
    sampling: SamplingParams | None = None,
    max_steps: int = 8,
    max_total_tokens: int = 1024,
    episode_timeout: float = 120.0,
    step_timeout: float = 10.0,
    progress: bool = True,
) -> Rollout:
    """Run ``group_size`` episodes of every task, all in parallel; return their Trajectories.

    tasks:            the tasks; trajectories come back task-major: task 0's G samples, then task 1's, ...
    env_factory:      a function returning a fresh env (one per episode): an ``Episode``, or an object on
                      TRL's environment contract (an env class itself will do); or a registered env name; or, as
                      TRL's ``environment_factory``, a dict of such functions picked per task by ``task.environment``
    policy:           anything with ``generate(prompts, params)`` and ``tokenizer`` (``HFPolicy``, ``VLLMPolicy``)
    sampling:         temperature, top_p, max_new_tokens per turn; stop tokens default to ``stop_token_ids``
    max_steps:        assistant turns per episode at most (guard; the env may stop earlier)
    max_total_tokens: prompt + all turns + all observations, per episode (never exceeded)
    episode_timeout:  seconds of wall clock per episode; step_timeout: seconds per env step

    Taught in notebooks/03_rollout.ipynb §3.
    """
    if group_size < 1 or max_steps < 1:
        raise ValueError(f"group_size and max_steps must be >= 1, got {group_size} and {max_steps}")
    if isinstance(env_factory, str):
        env_name = env_factory
        env_factory = lambda: make_env(env_name)  # noqa: E731
    tokenizer = policy.tokenizer
    sampling = sampling or SamplingParams()
    if not sampling.stop_token_ids:
        sampling = replace(sampling, stop_token_ids=stop_token_ids(tokenizer))
    stats = RolloutStats(episodes=len(tasks) * group_size)
    memo = TemplateMemo(tokenizer)
    t_start = time.perf_counter()
    bar = tqdm(total=stats.episodes, desc="episodes", disable=not progress, leave=False)

    def finish(ep: _Episode, reason: str, final_reward: float = 0.0, **extra_info) -> None:
        """End an episode. If the env is still running (a rollout limit ended it), the env is
        told with ``env.truncate(reason)``, which returns the episode's full final info."""
        if not ep.env.is_done():
            try:
                result = ep.env.truncate(reason)
                ep.info, final_reward = dict(result.info), float(result.reward)
            except Exception as error:  # the env cannot be truncated (a step is still running in its thread)
                extra_info["truncate_error"] = f"{type(error).__name__}: {error}"
        ep.stop_reason = reason
        ep.info = {**ep.info, **extra_info, "stop_reason": reason}
        ep.reward = final_reward
        ep.wall_time = time.perf_counter() - ep.start
        bar.update(1)

    # Reset: every episode gets its own env; the prompt is the env's first messages, rendered.
    episodes = []
    for task in tasks:
        for g in range(group_size):
            t0 = time.perf_counter()
            env = env_factory[task.environment]() if isinstance(env_factory, dict) else env_factory()
            if not isinstance(env, Episode):  # a bare environment: the adapter gives it step(text)
                env = Episode(env, max_steps=max_steps, step_timeout=step_timeout, episode_timeout=episode_timeout)
            messages = list(env.reset(task))
            t1 = time.perf_counter()
            ids = memo.prompt(messages, env.tools)
            stats.env_s += t1 - t0
            stats.render_s += time.perf_counter() - t1
            ep = _Episode(task, g, env, messages, list(ids), start=t0, mask=[0] * len(ids), logprobs=[0.0] * len(ids))
            ep.prompt_len = len(ids)
            episodes.append(ep)
            if len(ids) + 2 > max_total_tokens:  # no room for one token and the end of turn
                finish(ep, "max_tokens")

    while live := [ep for ep in episodes if ep.stop_reason is None]:
        # 1. One batched generation: one assistant turn for every live episode.
        # Each turn's budget keeps one slot free for the <|im_end|> the scaffolding may add.
        budgets = [min(sampling.max_new_tokens, max_total_tokens - len(ep.token_ids) - 1) for ep in live]
        seed = None if sampling.seed is None else sampling.seed + stats.generate_calls
        params = replace(sampling, max_new_tokens=max(budgets), seed=seed)
        t0 = time.perf_counter()
        generations = policy.generate([ep.token_ids for ep in live], params)
        t1 = time.perf_counter()
        stats.generate_s += t1 - t0
        stats.generate_calls += 1
        _append_turns(live, generations, budgets, tokenizer, stats)
        stats.render_s += time.perf_counter() - t1
        for ep in live:
            if ep.last_finish == "length":  # cut mid-turn: not a finished action, so the env never sees it
                finish(ep, "max_tokens")
        live = [ep for ep in live if ep.stop_reason is None]
        if not live:
            continue

        # 2. Step the envs in parallel, each step under a timeout.
        t0 = time.perf_counter()
        pool = env_pool()
        futures = {pool.submit(ep.env.step, ep.last_action): ep for ep in live}
        time_left = max(episode_timeout - (t0 - ep.start) for ep in live)
        step_limit = min(step_timeout, *(ep.env.step_timeout for ep in live))  # the envs' own limit too: their tools run on the pool
        wait = max(0.0, min(step_limit, time_left))
        done, _ = cf.wait(futures, timeout=wait)
        if len(done) < len(futures):  # a hung step keeps its thread: retire its pool, we do not wait for it
            retire_env_pool(pool)
        stats.env_s += time.perf_counter() - t0

        # 3. Apply each step's result: end the episode, or append the observation as tokens.
        for future, ep in futures.items():
            if future not in done:  # a hung tool too (it runs in the step's thread): a limit ends the episode
                finish(ep, "timeout", limit=f"the env step did not return within the time limit ({wait:.3g} s)")
                continue
            try:
                result = future.result()
            except Exception as error:  # an env bug, not bad model output (envs never raise on that)
                finish(ep, "error", error=f"{type(error).__name__}: {error}")
                continue
            ep.step_rewards.append(float(result.reward))
            ep.info = dict(result.info)
            if result.terminated or result.truncated:
                finish(ep, result.info.get("stop_reason") or ep.env.stop_reason or "answered", result.reward)
            elif ep.turns >= max_steps:
                finish(ep, "max_steps")
            elif time.perf_counter() - ep.start > episode_timeout:
                finish(ep, "timeout")
            else:
                t1 = time.perf_counter()
                so_far = None if ep.drifted else ep.token_ids
                suffix = memo.observation(ep.messages, result.observation, ep.env.tools, so_far)
                stats.render_s += time.perf_counter() - t1
                if len(ep.token_ids) + len(suffix) + 2 > max_total_tokens:  # no room left for another turn
                    finish(ep, "max_tokens")
                    continue
                ep.token_ids += suffix
                ep.mask += [0] * len(suffix)
                ep.logprobs += [0.0] * len(suffix)
                ep.messages += result.observation
                stats.env_tokens += len(suffix)

    bar.close()
    stats.total_s = time.perf_counter() - t_start
    return Rollout([ep.to_trajectory() for ep in episodes], stats)


def _append_turns(episodes: list[_Episode], generations: list[Generation], budgets: list[int], tokenizer,
                  stats: RolloutStats) -> None:
    """Append one sampled turn to each episode: tokens (mask 1), log-probs, and the message.

    If a turn did not end on the eos (it stopped at ``</tool_call>``, or ran out of
    tokens), the template's end-of-turn token is appended with mask 0 (see module docstring).
    The turns' texts are decoded, and encoded again for the drift check, in one batched
    tokenizer call each, once per distinct turn (the G samples of a task often write the same one).
    """
    eos = tokenizer.eos_token_id
    turns = []  # (token_ids, logprobs, finish_reason) of each row, cut to its own budget
    for gen, budget in zip(generations, budgets):
        if len(gen.token_ids) > budget:  # this row's own budget is smaller than the batch's
            turns.append((gen.token_ids[:budget], gen.logprobs[:budget], "length"))
        else:
            turns.append((gen.token_ids, gen.logprobs, gen.finish_reason))
    # The text of a turn is its tokens without the eos: the template writes that one itself.
    bodies = [ids[:-1] if ids and ids[-1] == eos else ids for ids, _, _ in turns]
    distinct = list(dict.fromkeys(map(tuple, bodies)))
    texts = tokenizer.batch_decode([list(body) for body in distinct], skip_special_tokens=False)
    again = tokenizer(texts, add_special_tokens=False, split_special_tokens=True)["input_ids"]  # TITO check: the sampled tokens back? (as render reads the text)
    decoded = {body: (text, list(body) != encoded) for body, text, encoded in zip(distinct, texts, again)}  # -> (text, drifted)

    for ep, (token_ids, logprobs, finish_reason), body in zip(episodes, turns, bodies):
        text, drifted = decoded[tuple(body)]
        if drifted:
            stats.retokenize_drift += 1
            ep.drifted = True
        ep.token_ids += token_ids
        ep.mask += [1] * len(token_ids)
        ep.logprobs += list(logprobs)
        if len(body) == len(token_ids):  # did not end on the eos: the scaffolding closes the turn
            ep.token_ids.append(eos)
            ep.mask.append(0)
            ep.logprobs.append(0.0)
        ep.messages.append({"role": "assistant", "content": text})
        ep.turns += 1
        ep.last_action, ep.last_finish = text, finish_reason
        stats.turns += 1
        stats.generated_tokens += len(token_ids)


# --- saving and loading ----------------------------------------------------------------------


def save_trajectories(path: str | Path, trajectories: list[Trajectory]) -> None:
    """Write one JSON object per line (the Task nested as a dict). Non-JSON values in
    ``info`` (a Fraction, say) are written as their ``str``.

    ``asdict``, but the three per-token lists go in as they are: copying every number of every
    episode was most of the time an evaluation's file took to write (numbers need no converting).

    Taught in notebooks/03_rollout.ipynb §6.
    """
    rows = []
    for traj in trajectories:
        per_token = {"token_ids": traj.token_ids, "mask": traj.mask, "logprobs": traj.logprobs}
        rows.append({**asdict(replace(traj, token_ids=[], mask=[], logprobs=[])), **per_token})  # same keys, same order
    write_jsonl(path, rows)


def load_trajectories(path: str | Path) -> list[Trajectory]:
    """Read trajectories written by ``save_trajectories``."""
    trajectories = []
    for line_no, row in read_jsonl(path):
        try:
            row["task"] = Task(**row["task"])
            trajectories.append(Trajectory(**row))
        except (KeyError, TypeError) as error:
            raise ValueError(f"{path}:{line_no}: not a saved Trajectory ({error})") from None
    return trajectories
