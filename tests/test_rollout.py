"""The rollout loop: masks, token-in/token-out, limits, timeouts, sampling, saving, viewing."""

import threading
import time

import pytest
import torch

from helpers.envs import Episode, MathEnv, StepResult, make_env
from helpers.formats import format_tool_call
from helpers.policy import HFPolicy, SamplingParams, ScriptedPolicy
from helpers.rollout import (
    env_pool,
    load_trajectories,
    render,
    rollout,
    save_trajectories,
    stop_token_ids,
)
from helpers.viewer import group_html, trajectory_html
from helpers.worlds.arithmetic.tasks import make_tiny_tasks
from helpers.worlds.tinymodel import load_tiny

torch.set_num_threads(1)

TASKS = make_tiny_tasks(3, seed=0, split="test")
TASK = TASKS[0]
CALL = format_tool_call("calculator", {"expression": TASK.metadata["expression"]})  # <tool_call>...</tool_call>
ANSWER = f"<answer>{TASK.answer}</answer>"


@pytest.fixture(scope="module")
def tiny():
    model, tokenizer = load_tiny()
    return model.float().eval(), tokenizer


class NeverDoneEnv(Episode):
    """A step-level double (what rollout drives): answers every turn with the same message and
    never ends the episode itself, so only the rollout's own limits can end it."""

    def __init__(self):
        super().__init__(MathEnv(), max_steps=1000)

    def step(self, action):
        self._check_can_step()
        self.steps += 1
        return StepResult([{"role": "user", "content": "Go on."}], 0.0, False, False, dict(self.info))


class HangingEnv(NeverDoneEnv):
    """A tool that hangs: step() sleeps far longer than the rollout's step timeout."""

    def step(self, action):
        time.sleep(3.0)
        return super().step(action)


def mask_oracle(tokenizer, traj):
    """The assistant-token mask the tiny chat template itself marks ({% generation %})."""
    out = tokenizer.apply_chat_template(
        traj.messages, tools=make_env("calculator").tools, return_dict=True, return_assistant_tokens_mask=True
    )
    return out["input_ids"], out["assistant_masks"]


def test_single_turn_mask_is_exactly_the_generated_tokens(tiny):
    _, tokenizer = tiny
    policy = ScriptedPolicy(tokenizer, [ANSWER])
    [traj] = rollout([TASK], "calculator", policy, group_size=1, progress=False)
    assert traj.stop_reason == "answered" and traj.reward == 1.0 and traj.info["correct"]
    prompt = render(tokenizer, TASK.prompt, make_env("calculator").tools, add_generation_prompt=True)
    reply = tokenizer.encode(ANSWER, add_special_tokens=False) + [tokenizer.eos_token_id]
    assert traj.token_ids == prompt + reply
    assert traj.mask == [0] * len(prompt) + [1] * len(reply)
    assert traj.prompt_len == len(prompt)


def test_multi_turn_mask_and_tokens_match_the_chat_template(tiny):
    _, tokenizer = tiny
    policy = ScriptedPolicy(tokenizer, [CALL, CALL, ANSWER])  # two tool calls, then the answer
    [traj] = rollout([TASK], "calculator", policy, group_size=1, max_steps=5, progress=False)
    assert traj.stop_reason == "answered" and traj.turns == 3 and traj.info["tool_calls"] == 2
    assert [m["role"] for m in traj.messages[-5:]] == ["assistant", "tool", "assistant", "tool", "assistant"]
    assert traj.messages[-4]["content"] == TASK.answer  # the calculator's result came back
    # Canonical tokens here, so the episode is exactly the template's rendering of the messages ...
    ids, oracle = mask_oracle(tokenizer, traj)
    T = len(traj.token_ids)
    assert traj.token_ids == ids[:T] and tokenizer.decode(ids[T:]) == "\n"  # the episode stops at the last <|im_end|>
    oracle = oracle[:T]
    # ... and the mask is the template's assistant mask, except the <|im_end|> after each
    # </tool_call>: the policy stopped at </tool_call>, the scaffolding closed the turn (mask 0).
    tool_close = tokenizer.convert_tokens_to_ids("</tool_call>")
    expected = [0 if i > 0 and traj.token_ids[i - 1] == tool_close else m for i, m in enumerate(oracle)]
    assert traj.mask == expected
    assert sum(traj.mask) == sum(len(tokenizer.encode(t, add_special_tokens=False)) for t in [CALL, CALL, ANSWER]) + 1


def test_sampled_episode_logprobs_match_a_fresh_forward_pass(tiny):
    """End to end: every mask-1 token's stored log-prob equals a forward pass over the
    whole finished episode (so env tokens were appended as tokens, not re-tokenised)."""
    model, tokenizer = tiny
    policy = HFPolicy(model, tokenizer)
    # A never-ending env gives every episode several turns with observations between them;
    # many stop tokens make the turns end early (and not on the eos, so the scaffolding adds it).
    sampling = SamplingParams(max_new_tokens=12, stop_token_ids=list(range(2, 200)), seed=0)
    trajs = rollout(TASKS[:2], NeverDoneEnv, policy, group_size=2, sampling=sampling, max_steps=3, progress=False)
    assert any(t.turns > 1 for t in trajs)
    for t in trajs:
        assert len(t.token_ids) == len(t.mask) == len(t.logprobs)
        assert all(lp == 0.0 for lp, m in zip(t.logprobs, t.mask) if m == 0)
        ids = torch.tensor([t.token_ids])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[0, :-1].float(), -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
        positions = [i for i, m in enumerate(t.mask) if m]
        assert positions and min(positions) >= t.prompt_len
        got = torch.tensor([t.logprobs[i] for i in positions])
        assert torch.allclose(got, logp[torch.tensor(positions) - 1], atol=1e-4)
    assert trajs.stats.generated_tokens == sum(sum(t.mask) for t in trajs)


def test_env_that_never_ends_stops_at_max_steps(tiny):
    _, tokenizer = tiny
    policy = ScriptedPolicy(tokenizer, ["I keep talking."])
    trajs = rollout([TASK], NeverDoneEnv, policy, group_size=2, max_steps=4, progress=False)
    for t in trajs:
        assert t.stop_reason == "max_steps" and t.info["stop_reason"] == "max_steps"
        assert t.turns == 4 and t.reward == 0.0
        assert t.info["verdict"] == "no_answer"  # the env was told (env.truncate) and filled its info


def test_hanging_tool_stops_at_its_timeout(tiny):
    _, tokenizer = tiny
    policy = ScriptedPolicy(tokenizer, ["call the slow tool"])
    rollout([TASK], NeverDoneEnv, policy, group_size=2, max_steps=2, progress=False)
    pool = env_pool()
    rollout([TASK], NeverDoneEnv, policy, group_size=2, max_steps=2, progress=False)
    assert env_pool() is pool  # steps that return in time leave the pool to the next turns and rollouts
    start = time.perf_counter()
    trajs = rollout([TASK], HangingEnv, policy, group_size=2, step_timeout=0.3, progress=False)
    elapsed = time.perf_counter() - start
    assert [t.stop_reason for t in trajs] == ["timeout", "timeout"]
    assert elapsed < 2.0  # did not wait for the 3 s step
    assert all(t.info["tool_failures"] == 0 for t in trajs)  # the env's own step hung, not a tool call
    assert env_pool() is not pool  # the hung steps' pool was retired: later steps get threads of their own


class ThreadProbe:
    """An environment on TRL's contract whose tool sleeps as long as asked, then says which thread ran it."""

    def reset(self, **row):
        return None

    def where(self, seconds: float) -> str:
        """Sleep, then name the thread that runs this tool.

        Args:
            seconds: how long to sleep first
        """
        time.sleep(seconds)
        return threading.current_thread().name


def test_tools_run_in_the_step_pools_threads_under_the_envs_own_step_timeout(tiny):
    """Handing each call to a tool thread and back cost more than a shop tool's work: on the rollout's pool,
    whose wait is the timeout, a step's tools run in the pool's thread; elsewhere they keep a thread of their own."""
    _, tokenizer = tiny
    quick = ScriptedPolicy(tokenizer, [format_tool_call("where", {"seconds": 0})])
    trajs = rollout([TASK], lambda: Episode(ThreadProbe(), max_steps=2), quick, group_size=2, max_steps=2, progress=False)
    for t in trajs:
        assert [m["content"].split("_")[0] for m in t.messages if m["role"] == "tool"] == ["env-step"]
    env = Episode(ThreadProbe())
    env.reset(TASK)
    assert env.step(format_tool_call("where", {"seconds": 0})).observation[0]["content"] == "tool-call"
    # The env's own step_timeout (0.3 s) still bounds its tools, though the rollout's is 10 s.
    hang = ScriptedPolicy(tokenizer, [format_tool_call("where", {"seconds": 30})])
    start = time.perf_counter()
    trajs = rollout([TASK], lambda: Episode(ThreadProbe(), step_timeout=0.3), hang, group_size=2, step_timeout=10.0, progress=False)
    assert [t.stop_reason for t in trajs] == ["timeout", "timeout"] and time.perf_counter() - start < 2.0
    assert all("did not return within the time limit (0.3 s)" in t.info["limit"] for t in trajs)
    assert all((t.info["tool_calls"], t.info["tool_errors"], t.info["tool_failures"]) == (1, 1, 1) for t in trajs)  # hung: failed


def test_episode_timeout(tiny):
    _, tokenizer = tiny
    policy = ScriptedPolicy(tokenizer, ["again"])
    slow = type("SlowEnv", (NeverDoneEnv,), {"step": lambda self, a: (time.sleep(0.15), NeverDoneEnv.step(self, a))[1]})
    [t] = rollout([TASK], slow, policy, group_size=1, max_steps=100, episode_timeout=0.5, progress=False)
    assert t.stop_reason == "timeout" and 1 < t.turns < 10


def test_token_limits(tiny):
    model, tokenizer = tiny
    # A turn that runs out of tokens before a stop token ends the episode: max_tokens.
    policy = ScriptedPolicy(tokenizer, [ANSWER])
    [t] = rollout([TASK], "calculator", policy, group_size=1, sampling=SamplingParams(max_new_tokens=3), progress=False)
    assert t.stop_reason == "max_tokens" and sum(t.mask) == 3 and t.reward == 0.0
    # The whole-episode budget caps prompt + turns + observations.
    policy = HFPolicy(model, tokenizer)
    budget = t.prompt_len + 40
    trajs = rollout([TASK], NeverDoneEnv, policy, group_size=3, sampling=SamplingParams(max_new_tokens=15, seed=0),
                    max_steps=50, max_total_tokens=budget, progress=False)
    for t in trajs:
        assert len(t.token_ids) <= budget
        assert t.stop_reason == "max_tokens"
    # A turn that stops on </tool_call> right at the budget still fits with its closing <|im_end|>.
    policy = ScriptedPolicy(tokenizer, [CALL])
    call_len = len(tokenizer.encode(CALL, add_special_tokens=False))
    prompt_len = len(render(tokenizer, TASK.prompt, make_env("calculator").tools, add_generation_prompt=True))
    [t] = rollout([TASK], "calculator", policy, group_size=1, sampling=SamplingParams(max_new_tokens=100),
                  max_total_tokens=prompt_len + call_len + 1, progress=False)
    assert len(t.token_ids) == prompt_len + call_len + 1 and t.token_ids[-1] == tokenizer.eos_token_id
    assert t.turns == 1 and t.stop_reason == "max_tokens" and t.info["tool_calls"] == 1
    # One token less, and the call no longer fits: it is cut, and the episode stays within the budget.
    [t] = rollout([TASK], "calculator", policy, group_size=1, sampling=SamplingParams(max_new_tokens=100),
                  max_total_tokens=prompt_len + call_len, progress=False)
    assert len(t.token_ids) == prompt_len + call_len and t.info["tool_calls"] == 0 and t.stop_reason == "max_tokens"


def test_group_samples_differ_and_greedy_samples_agree(tiny):
    model, tokenizer = tiny
    policy = HFPolicy(model, tokenizer)
    kw = dict(group_size=4, max_steps=1, progress=False)
    sampled = rollout([TASK], "math", policy, sampling=SamplingParams(max_new_tokens=16, temperature=1.0, seed=0), **kw)
    assert len({tuple(t.token_ids) for t in sampled}) > 1
    greedy = rollout([TASK], "math", policy, sampling=SamplingParams(max_new_tokens=16, temperature=0.0), **kw)
    assert len({tuple(t.token_ids) for t in greedy}) == 1
    assert [t.group for t in greedy] == [0, 1, 2, 3] and all(t.task_id == TASK.id for t in greedy)


def test_env_errors_are_recorded_not_raised(tiny):
    _, tokenizer = tiny
    broken = type("BrokenEnv", (NeverDoneEnv,), {"step": lambda self, a: 1 / 0})
    [t] = rollout([TASK], broken, ScriptedPolicy(tokenizer, ["hi"]), group_size=1, progress=False)
    assert t.stop_reason == "error" and "ZeroDivisionError" in t.info["error"]


def test_stop_tokens_include_the_tool_call_close(tiny):
    _, tokenizer = tiny
    assert stop_token_ids(tokenizer) == [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("</tool_call>")]


def test_save_load_and_view(tiny, tmp_path):
    _, tokenizer = tiny
    trajs = rollout(TASKS[:2], "calculator", ScriptedPolicy(tokenizer, [CALL, ANSWER]), group_size=2, progress=False)
    trajs[0].reward_parts = {"correct": 1.0}
    save_trajectories(tmp_path / "t.jsonl", trajs)
    loaded = load_trajectories(tmp_path / "t.jsonl")
    assert loaded == list(trajs)
    html = trajectory_html(loaded[0], tokenizer)
    assert html.count("<span style='background:#c8f0c8'") == sum(loaded[0].mask) + 1  # + the legend's swatch
    assert "answered" in html and "correct=1" in html
    assert group_html(loaded).count("<details>") == 4
    (tmp_path / "bad.jsonl").write_text('{"not": "a trajectory"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        load_trajectories(tmp_path / "bad.jsonl")


def test_benchmark_runs_and_reports_ratios():
    from helpers.lab.bench.__main__ import main
    from helpers.lab.bench.rollout import run, table

    out = run(num_tasks=1, group_size=2, max_new_tokens=4, naive_tasks=1, trl=False, verbose=False)
    assert out["batched"].episodes == out["one_at_a_time"].episodes == 2
    assert out["batched"].tokens > 0 and out["speedup_vs_one_at_a_time"] > 0
    assert "RATIO batched / one-at-a-time" in table(out)
    with pytest.raises(SystemExit, match="usage"):
        main([])
