"""helpers.lab.pitfalls.preflight: each checklist item passes on a good config and fails on the bad one."""

from helpers.config import get_preset
from helpers.envs import make_env
from helpers.formats import format_tool_call
from helpers.lab.pitfalls import preflight
from helpers.policy import SamplingParams, ScriptedPolicy
from helpers.rewards import score_trajectories
from helpers.rollout import rollout
from helpers.worlds.arithmetic.tasks import make_tiny_tasks
from helpers.worlds.tinymodel import load_tokenizer


def verdicts(checklist) -> dict[str, bool]:
    return {item.helper: item.ok for item in checklist}


def test_shipped_presets_pass():
    tiny = preflight(get_preset("tiny-cpu"))
    assert tiny.ok, str(tiny)
    gsm8k = preflight(get_preset("gsm8k-24gb"), gpu_gb=24)
    assert gsm8k.ok and "helpers.lab.memory.check_fits" in verdicts(gsm8k), str(gsm8k)
    assert "[x]" in str(gsm8k) and "[ ]" not in str(gsm8k)
    # worlds whose reset needs columns of its own (the shop's item and prices, a game's deal) are probed with their own tasks
    agent = preflight(get_preset("tiny-agent"))
    assert agent.ok and agent[0].detail == "ShopEnv: no problems", str(agent)
    assert verdicts(preflight(get_preset("tiny-kuhn")))["helpers.envs.check_env"] is True


def test_each_item_fails_on_its_pitfall():
    too_small = preflight(get_preset("gsm8k-24gb"), gpu_gb=8)
    assert verdicts(too_small)["helpers.lab.memory.check_fits"] is False and not too_small.ok

    no_eval = preflight(get_preset("tiny-cpu", eval_every=0))
    assert verdicts(no_eval)["TrainConfig.eval_every, save_every"] is False

    blind = preflight(get_preset("tiny-cpu", log_kl=False))
    assert verdicts(blind)["helpers.health.check_health"] is False

    unbounded = preflight(get_preset("tiny-cpu", env_kwargs={"episode_timeout": None}))  # the adapter's limit, switched off
    assert verdicts(unbounded)["TrainConfig limits, Episode timeouts"] is False


def test_learning_signal_item_reads_the_first_batch():
    tokenizer = load_tokenizer()
    tasks = make_tiny_tasks(2, seed=0, split="test")
    looper = ScriptedPolicy(tokenizer, [format_tool_call("calculator", {"expression": "1+1"})])  # never answers
    trajs = rollout(tasks, lambda: make_env("calculator", max_steps=2), looper, group_size=2, sampling=SamplingParams(64), progress=False)
    score_trajectories(trajs, "correct")
    config = get_preset("tiny-cpu")
    assert verdicts(preflight(config, trajectories=trajs))["helpers.rewards.reward_report"] is False
    solver = ScriptedPolicy(tokenizer, [f"<answer>{tasks[0].answer}</answer>"])  # right on task 0, wrong on task 1
    varied = rollout(tasks, "calculator", solver, group_size=2, sampling=SamplingParams(64), progress=False)
    assert verdicts(preflight(config, trajectories=varied))["helpers.rewards.reward_report"] is False  # 1,1 and 0,0: both flat
    varied[1].reward = 0.0  # one sample of task 0 loses: that group now has a spread
    assert verdicts(preflight(config, trajectories=varied))["helpers.rewards.reward_report"] is True
