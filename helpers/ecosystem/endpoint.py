"""Evaluation as a service: any OpenAI-compatible endpoint plays the workbook's episodes.

    python -m helpers.ecosystem.endpoint --preset tiny-agent --base-url http://127.0.0.1:8000/v1    # vllm serve data/tiny-agent ...
    python -m helpers.ecosystem.endpoint --benchmark humaneval --base-url https://api.example.com/v1 --model some-model   # key: OPENAI_API_KEY

    endpoint = Endpoint("http://127.0.0.1:8000/v1")                  # the model: the first one the server lists
    result = evaluate_endpoint(endpoint, tasks, "shop", max_steps=5)  # helpers.evaluation.evaluate's EvalResult
    episodes = chat_rollout(tasks, "shop", endpoint, group_size=4, sampling=SamplingParams(40, temperature=1.0, seed=0))

A served model (``vllm serve``, SGLang, llama.cpp's server, a provider's API) is reached through the
chat completions API, ``client.chat.completions.create(messages=..., tools=...)``. Each episode is the
same env as in training and in ``helpers.evaluation.evaluate`` (an ``helpers.envs.Episode`` over a class
on TRL's contract): the env's tools go to the endpoint as their JSON schemas (``Episode.tools``, what
TRL renders too), the endpoint's tool calls run in the env, and its final text is judged by the env.
So the numbers are the same numbers (``episode_stats``, pass@k, a benchmark's score), of the same
tasks, judged the same way. The command is ``python -m helpers.evaluate`` (its flags, its checks, its
JSON line) with the endpoint in place of the local model: ``--base-url`` is the API's root, ``--model`` the served
model's name (default: the first the server lists), the key ``OPENAI_API_KEY`` (or ``--api-key``); the preset
gives only the tasks, env and limits. One turn:

    reply = endpoint.chat(history, env.tools, sampling)      # the assistant message, as the API returns it
    result = env.step(reply.text)                            # its tool calls as <tool_call> blocks, or its final text
    history += [reply.message, *tool messages answering reply.message's tool calls by id]

``reply.text`` writes each of the endpoint's tool calls back as a ``<tool_call>`` block
(``helpers.formats.format_tool_call``), the one format ``Episode.step`` parses; arguments that are not
JSON go in as written, so the env answers them with the same "malformed JSON" error a local model gets.

What differs from the token-level backends (``helpers.policy``: transformers, the engine, vLLM in
process), and why evaluation needs none of it:

* **Messages, not tokens.** The endpoint renders the conversation with *its own* chat template and
  parses its own tool calls (vLLM: ``--enable-auto-tool-choice --tool-call-parser hermes`` for Qwen's
  ``<tool_call>`` format). Training needs the exact token ids and their sampling log-probs
  (token-in/token-out, ``helpers.rollout``); judging an episode needs only its messages. So the
  trajectories here have no token ids, mask or log-probs, and any model behind any such API can
  be scored, not only one whose weights are on this machine.
* **The history is re-rendered each turn.** The endpoint's template writes the assistant's earlier
  turns from the parsed message (content + ``tool_calls``), not from the tokens it sampled, so a
  turn the model wrote in a non-canonical spelling comes back canonical. For a model trained on its
  template's own spelling (the tiny agent) the conversation is the same, and so are its tokens.
* **A turn ends where the model ends it.** The token-level rollout also stops a turn at
  ``</tool_call>`` (a stop token) and closes it itself; an endpoint stops at the model's end-of-turn
  token. A model that writes on after a tool call (a second call, say) gets that turn judged as written.
* **Limits.** ``max_new_tokens`` is the API's ``max_tokens``; ``max_total_tokens`` is checked with the
  token counts the endpoint reports (``usage``): a turn that ends past it is cut, ``max_tokens``, as
  a turn the rollout would have cut (simplification: the rollout also ends an episode whose next
  observation would not fit; here that shows at the next turn). ``completions/mean_length`` is the
  endpoint's count of the tokens it generated.
* **Seeds.** Each request sends ``seed`` (the sampling seed + the episode's index), which vLLM and
  OpenAI honour; greedy (temperature 0) needs none. Different engines and kernels can break a near
  tie between two tokens differently, so a greedy episode can differ from the local backend's.

Simplifications, named: episodes run in ``workers`` threads (the server batches the concurrent
requests); a request the endpoint refuses (HTTP 400: a prompt longer than its context, say) ends that
episode with stop reason ``error``, verdict ``endpoint_error`` and the endpoint's message in ``info["error"]``, any other API error
stops the evaluation; when the env answers fewer tool messages than the reply made calls (over
``max_calls_per_step``), the calls left over get the env's last message as their answer.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import time
from dataclasses import dataclass, replace
from typing import Callable

from tqdm.auto import tqdm

from helpers.config import TrainConfig
from helpers.data import Task
from helpers.envs import Episode, make_env
from helpers.evaluate import Player, build_parser, command
from helpers.evaluate import main as evaluate_main
from helpers.evaluation import EvalResult, evaluate
from helpers.formats import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, format_tool_call
from helpers.policy.base import SamplingParams
from helpers.rollout import Rollout, RolloutStats, Trajectory


@dataclass
class Reply:
    """One assistant turn from the endpoint."""

    message: dict  # the assistant message as the API returned it (content, tool_calls): the history sends it back
    text: str  # the same turn as the env reads it: the content, then each tool call as a <tool_call> block
    finish_reason: str  # "stop", "tool_calls" or "length" (the API's)
    prompt_tokens: int  # the endpoint's count of the conversation it rendered
    completion_tokens: int  # the endpoint's count of the tokens it generated


def tool_call_text(call: dict) -> str:
    """One API tool call (``{"id", "function": {"name", "arguments": JSON string}}``) as a ``<tool_call>`` block."""
    name, arguments = call["function"]["name"], call["function"]["arguments"]
    try:
        return format_tool_call(name, json.loads(arguments))
    except (ValueError, RecursionError):  # not JSON: as written, so the env reports the malformed call
        return f'{TOOL_CALL_OPEN}\n{{"name": {json.dumps(name)}, "arguments": {arguments}}}\n{TOOL_CALL_CLOSE}'


class Endpoint:
    """An OpenAI-compatible chat completions endpoint, and the model it serves.

    ``base_url``: the API's root, ``http://host:port/v1``. ``model``: the served model's name (None: the
    first the server lists at ``/v1/models``; vLLM lists the one it serves). ``api_key``: None reads
    ``OPENAI_API_KEY``, else sends ``"EMPTY"`` (vLLM checks no key unless started with ``--api-key``).
    """

    def __init__(self, base_url: str, model: str | None = None, api_key: str | None = None, timeout: float = 120.0):
        from openai import OpenAI  # optional (the 'openenv' extra and vLLM bring it): the pure functions work without it

        self.base_url = base_url
        self.client = OpenAI(base_url=base_url, api_key=api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY",
                             timeout=timeout, max_retries=2)
        if model is None:
            served = [m.id for m in self.client.models.list().data]
            if not served:
                raise ValueError(f"{base_url} lists no model at /models; pass model=... (--model)")
            model = served[0]
        self.model = model

    def __repr__(self) -> str:
        return f"Endpoint({self.base_url!r}, model={self.model!r})"

    def chat(self, messages: list[dict], tools: list[dict] | None, sampling: SamplingParams) -> Reply:
        """One assistant turn for the conversation ``messages`` (the API's format) with these ``tools``."""
        extra = {"tools": tools} if tools else {}
        if sampling.seed is not None:
            extra["seed"] = sampling.seed
        response = self.client.chat.completions.create(
            model=self.model, messages=messages, max_tokens=sampling.max_new_tokens, temperature=sampling.temperature,
            top_p=sampling.top_p, **extra)
        choice = response.choices[0]
        calls = [{"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
                 for c in choice.message.tool_calls or []]
        message = {"role": "assistant", "content": choice.message.content or ""}
        if calls:
            message["tool_calls"] = calls
        text = "\n".join([message["content"]] * bool(message["content"]) + [tool_call_text(c) for c in calls])
        usage = response.usage
        return Reply(message, text, choice.finish_reason, usage.prompt_tokens if usage else 0, usage.completion_tokens if usage else 0)


def answer_calls(reply: Reply, observation: list[dict]) -> list[dict]:
    """The env's observation as the API's messages: the i-th tool message answers the reply's i-th tool
    call (by its id); a user message (a world's feedback) goes as it is."""
    calls = reply.message.get("tool_calls", [])
    tool_messages = [m for m in observation if m["role"] == "tool"]
    answered = [{"role": "tool", "tool_call_id": call["id"], "content": tool_messages[min(i, len(tool_messages) - 1)]["content"]}
                for i, call in enumerate(calls) if tool_messages]
    if tool_messages and not calls:  # <tool_call> text the endpoint's parser did not take as a call: the env still ran it
        answered = [{"role": "tool", "tool_call_id": f"call_{i}", "content": m["content"]} for i, m in enumerate(tool_messages)]
    return answered + [dict(m) for m in observation if m["role"] != "tool"]


def play(task: Task, group: int, env, endpoint: Endpoint, sampling: SamplingParams, max_steps: int, max_total_tokens: int) -> Trajectory:
    """One episode of ``task`` through the endpoint; a ``Trajectory`` without tokens (module docstring)."""
    start = time.perf_counter()
    messages = env.reset(task)  # what the trajectory shows: the env's messages, the turns as the env read them
    history = [dict(m) for m in messages]  # what the endpoint is sent: the API's messages
    step_rewards, generated, turns, info, reward, stop_reason = [], 0, 0, {}, 0.0, None
    while stop_reason is None:
        try:
            reply = endpoint.chat(history, env.tools, sampling)
        except Exception as error:
            if type(error).__name__ != "BadRequestError":  # openai's 400: this request, not the endpoint, is the problem
                raise
            result = env.truncate("error")
            info = {**result.info, "verdict": "endpoint_error", "error": str(error)[:500]}
            reward, stop_reason = result.reward, "error"
            break
        turns += 1
        generated += reply.completion_tokens
        messages.append({"role": "assistant", "content": reply.text})
        if reply.finish_reason == "length" or reply.prompt_tokens + reply.completion_tokens + 1 > max_total_tokens:
            result = env.truncate("max_tokens")  # a turn cut mid-text is no action: the env never sees it
        else:
            result = env.step(reply.text)
        step_rewards.append(float(result.reward))
        info, reward = dict(result.info), float(result.reward)
        if result.done:
            stop_reason = result.info.get("stop_reason") or env.stop_reason
        elif turns >= max_steps:
            result = env.truncate("max_steps")
            info, reward, stop_reason = dict(result.info), float(result.reward), "max_steps"
        else:
            messages += result.observation
            history += [reply.message, *answer_calls(reply, result.observation)]
    info["completion_tokens"] = generated
    return Trajectory(task=task, group=group, token_ids=[], mask=[], logprobs=[], prompt_len=0, step_rewards=step_rewards,
                      reward=reward, turns=turns, stop_reason=stop_reason, wall_time=time.perf_counter() - start, info=info,
                      messages=messages)


def chat_rollout(
    tasks: list[Task],
    env_factory: Callable[[], object] | str,
    endpoint: Endpoint,
    group_size: int = 1,
    sampling: SamplingParams | None = None,
    max_steps: int = 8,
    max_total_tokens: int = 1024,
    episode_timeout: float = 120.0,
    step_timeout: float = 10.0,
    workers: int = 16,
    progress: bool = False,
) -> Rollout:
    """``helpers.rollout.rollout`` with an endpoint in place of a policy: ``group_size`` episodes of every
    task (task-major), each played turn by turn through ``endpoint``, ``workers`` at a time.

    Each episode's requests carry the seed ``sampling.seed + i`` (episode ``i``), so the G samples of a
    task differ and the same call gives the same samples where the endpoint honours seeds."""
    if group_size < 1 or max_steps < 1:
        raise ValueError(f"group_size and max_steps must be >= 1, got {group_size} and {max_steps}")
    sampling = sampling or SamplingParams()
    make = (lambda: make_env(env_factory, max_steps=max_steps)) if isinstance(env_factory, str) else env_factory
    start, n = time.perf_counter(), len(tasks) * group_size
    bar = tqdm(total=n, desc="episodes", disable=not progress, leave=False)

    def episode(i: int) -> Trajectory:
        env = make()
        if not isinstance(env, Episode):  # a bare environment: the adapter gives it step(text)
            env = Episode(env, max_steps=max_steps, step_timeout=step_timeout, episode_timeout=episode_timeout)
        seed = None if sampling.seed is None else sampling.seed + i
        traj = play(tasks[i // group_size], i % group_size, env, endpoint, replace(sampling, seed=seed), max_steps, max_total_tokens)
        bar.update(1)
        return traj

    with cf.ThreadPoolExecutor(max(1, min(workers, n))) as pool:
        trajectories = list(pool.map(episode, range(n)))
    bar.close()
    stats = RolloutStats(episodes=n, turns=sum(t.turns for t in trajectories),
                         generated_tokens=sum(t.info["completion_tokens"] for t in trajectories), total_s=time.perf_counter() - start)
    return Rollout(trajectories, stats)


def evaluate_endpoint(endpoint: Endpoint, tasks: list[Task], env_factory: Callable[[], object] | str, **options) -> EvalResult:
    """``helpers.evaluation.evaluate`` with the episodes played by ``endpoint`` (``chat_rollout``): the same
    arguments, the same ``EvalResult`` (one record per task, ``episode_stats``, pass@k from k sampled episodes
    per task). ``completions/mean_length`` and each record's ``completion_tokens`` are the endpoint's own
    token counts (its episodes hold no token ids)."""
    result = evaluate(endpoint, tasks, env_factory, play=chat_rollout, **options)
    for record, episode in zip(result.records, result.trajectories):
        record["completion_tokens"] = episode.info["completion_tokens"]
    generated = sum(t.info["completion_tokens"] for t in result.trajectories)
    result.metrics["completions/mean_length"] = generated / len(result.trajectories)
    return result


def build_endpoint_parser() -> argparse.ArgumentParser:
    """``python -m helpers.evaluate``'s flags, and the endpoint's."""
    parser = build_parser(prog="python -m helpers.ecosystem.endpoint",
                          description="Held-out evaluation of a served model (any OpenAI-compatible endpoint), on a preset's "
                                      "tasks or a public benchmark's; or a benchmark's score of a file of outputs.")
    parser.add_argument("--base-url", required=True, metavar="URL", help="the endpoint that plays the episodes (http://host:port/v1)")
    parser.add_argument("--model", default=None, help="the served model's name (default: the first the server lists)")
    parser.add_argument("--api-key", default=None, help="the API key (default: the OPENAI_API_KEY variable)")
    return parser


def no_server(base_url: str) -> str:
    return f"--base-url {base_url}: no server answers there; start it first (vllm serve MODEL ...), or check the host, the port and the /v1"


def served_model(args: argparse.Namespace, config: TrainConfig, parser: argparse.ArgumentParser) -> Player:
    """The endpoint at ``--base-url`` as the command's player (``helpers.evaluate.Player``)."""
    from openai import APIConnectionError  # optional, as in Endpoint

    if args.adapter is not None:
        parser.error("--adapter goes on a local model; serve the adapter with the model instead (vllm serve ... --lora-modules)")
    try:
        endpoint = Endpoint(args.base_url, model=args.model, api_key=args.api_key)
    except APIConnectionError:  # without --model it asks the server for its models
        parser.error(no_server(args.base_url))

    def play_tasks(tasks: list[Task], env_factory: Callable[[], object] | str, **options) -> EvalResult:
        try:
            return evaluate_endpoint(endpoint, tasks, env_factory, **options)
        except APIConnectionError:  # with --model the first request is the first turn's (or the server went away mid-run)
            parser.error(no_server(args.base_url))

    return Player(play_tasks, {"base_url": args.base_url, "model": endpoint.model}, config)


def main(argv: list[str] | None = None) -> dict:
    """``python -m helpers.ecosystem.endpoint --base-url URL [--model NAME] [--api-key KEY]`` and ``python -m
    helpers.evaluate``'s flags: prints and returns its JSON line, with ``base_url`` and ``model`` naming the player."""
    return evaluate_main(argv, build_endpoint_parser(), served_model)


if __name__ == "__main__":
    command(parser=build_endpoint_parser(), player=served_model)
