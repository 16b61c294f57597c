"""Tests for helpers.train: the CLI, --env-class, the health checks, a short run and kill-and-resume equivalence."""

import json

import pytest
import torch
from safetensors.torch import load_file

import helpers.train
from helpers.config import get_preset
from helpers.health import check_health
from helpers.evaluation import load_records
from helpers.live import LiveCurves
from helpers.loop import TIME_SPLIT
from helpers.paths import ROOT
from helpers.rollout import load_trajectories
from helpers.train import build_parser, main, train
from helpers.worlds.tinymodel import load_tokenizer

TIMING = ("t_rollout", "t_reward", "t_update", "t_eval", "t_save", "tokens_per_s")


def test_cli_flags_are_typed_from_the_dataclass():
    args = vars(build_parser().parse_args([
        "--preset", "tiny-cpu", "--steps", "7", "--lr", "1e-4", "--resume", "true", "--max-train-tasks", "none",
        "--lora-target-modules", "q_proj,v_proj", "--rewards", "correct=1.0,format=0.1", "--seed", "2",
    ]))
    assert args == {"preset": "tiny-cpu", "steps": 7, "lr": 1e-4, "resume": True, "max_train_tasks": None,
                    "lora_target_modules": ["q_proj", "v_proj"], "rewards": {"correct": 1.0, "format": 0.1}, "seed": 2}
    assert vars(build_parser().parse_args(["--eval_every", "5"])) == {"preset": "tiny-cpu", "eval_every": 5}
    assert vars(build_parser().parse_args(["--torch-threads", "2", "--eval-subset", "50"])) == {
        "preset": "tiny-cpu", "torch_threads": 2, "eval_subset": 50}
    with pytest.raises(SystemExit):  # a typo in a value is a one-line argparse error, not a crash later
        build_parser().parse_args(["--steps", "ten"])


def test_cli_takes_the_presets_own_fields():
    """A preset whose config subclasses TrainConfig (self-play) gets a flag for each of its own fields too."""
    args = vars(build_parser("tiny-selfplay").parse_args(["--preset", "tiny-selfplay", "--proposer-weight", "5", "--lr", "2e-3"]))
    assert args == {"preset": "tiny-selfplay", "proposer_weight": 5.0, "lr": 2e-3}
    assert get_preset("tiny-selfplay", **{k: v for k, v in args.items() if k != "preset"}).proposer_weight == 5.0
    with pytest.raises(SystemExit):  # the main loop's presets have no such field
        build_parser("tiny-cpu").parse_args(["--proposer-weight", "5"])


FIXTURES = ROOT / "tests" / "fixtures"  # my_shop.py: an env class that imports nothing from helpers; broken_shops.py


def test_env_class_trains_with_a_class_that_imports_nothing_from_helpers(tmp_path, monkeypatch, one_thread):
    monkeypatch.syspath_prepend(str(FIXTURES))
    result = main(["--preset", "tiny-agent", "--env-class", "my_shop:MyShop", "--steps", "1", "--tasks-per-step", "2",
                   "--num-generations", "2", "--eval-tasks", "4", "--pass-k", "0", "--out-dir", str(tmp_path / "run")])
    assert json.loads((result.run_dir / "config.json").read_text())["env"] == "my_shop:MyShop"
    assert "rewards/MyShop/mean" in result.history[1]  # its get_reward is a reward part named after the class, as in TRL
    episodes = load_trajectories(result.run_dir / "eval" / "step-0001.trajectories.jsonl")
    assert all(set(t.info["env_reward"]) == {"MyShop"} for t in episodes)  # MyShop ran every held-out episode
    prompt = load_tokenizer(result.config.model).decode(episodes[0].token_ids[: episodes[0].prompt_len])
    assert "Tools: usual(), lookup(item), calculator(expression)" in prompt  # its tools, from its methods, in the template's order


@pytest.mark.parametrize("spec, reason", [
    ("broken_shops:NoReset", "NoReset has no reset method"),
    ("broken_shops:NoHints", "NoHints: Argument item is missing a type hint in function lookup"),
    ("broken_shops:NoArgsLine", "NoArgsLine: Cannot generate JSON schema for lookup because the docstring has no description for the argument 'item'"),
    ("broken_shops:WordyReward", "WordyReward.get_reward: TypeError: get_reward() returned str 'a lot', not a finite number"),
    ("no_such_module_xyz:Shop", "env 'no_such_module_xyz:Shop': cannot import 'no_such_module_xyz'"),
])
def test_env_class_refuses_a_broken_class_in_one_line_before_any_model_loads(spec, reason, monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES))
    monkeypatch.setattr(helpers.train, "train", lambda *args, **kwargs: pytest.fail("the run started"))
    with pytest.raises(SystemExit) as refused:
        main(["--preset", "tiny-agent", "--env-class", spec])
    message = str(refused.value)
    assert message.startswith(f"python -m helpers.train: environment class {spec} refused: ") and "\n" not in message
    assert reason in message, message


def healthy(step, reward=0.5, kl=0.01, **kw):
    return {"step": step, "reward": reward, "kl": kl, "entropy": 0.5, "all_zero_reward": 0.0, "completions/clipped_ratio": 0.0, **kw}


def kinds(history):
    return [kind for kind, _ in check_health(history)]


def test_health_checks_fire_on_the_classic_failures():
    steady = [healthy(s) for s in range(1, 7)]
    assert kinds(steady) == []
    assert kinds(steady + [healthy(7, kl=0.5)]) == ["kl_spike"]
    assert kinds(steady + [healthy(7, kl=0.04)]) == []  # 4x the median, but tiny: not a spike
    assert kinds(steady + [healthy(7, entropy=0.001)]) == ["entropy_collapse"]
    collapsing = steady + [healthy(7, reward=0.1), healthy(8, reward=0.0), healthy(9, reward=0.05)]
    assert "reward_collapse" in kinds(collapsing)
    assert kinds(steady + [healthy(7, reward=0.0, all_zero_reward=1.0)]) == ["all_zero_reward"]
    assert kinds(steady + [healthy(7, **{"completions/clipped_ratio": 0.6})]) == ["truncation"]


class KillAt(LiveCurves):
    """Live curves that raise at one step, as if the run were killed there (after the step's work)."""

    def __init__(self, step):
        super().__init__(None, notebook=False)
        self.kill_step = step

    def update(self, step, metrics):
        if step == self.kill_step:
            raise KeyboardInterrupt
        super().update(step, metrics)


def short_config(out_dir, **kw):
    # "length" keeps rewards spread within groups whatever the checkpoint's skill, so every step updates the adapter.
    settings = dict(steps=4, tasks_per_step=2, num_generations=4, max_new_tokens=16, max_total_tokens=128, eval_tasks=3,
                    eval_subset=2, pass_k=2, eval_every=2, save_every=2, log_trajectories_every=2,
                    rewards={"correct": 1.0, "length": 1.0}, lr=1e-3)
    return get_preset("tiny-cpu", **{**settings, **kw}, out_dir=str(out_dir))


def without_timing(history):
    return [{k: v for k, v in m.items() if k not in TIMING} for m in history]


def test_torch_threads_holds_for_the_run_and_is_given_back():
    from helpers.loop import torch_threads

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with torch_threads(1):
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2  # the caller's setting again
        with torch_threads(0):  # 0: torch's setting, untouched
            assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)


def test_a_run_flushes_denormal_floats(tmp_path):
    """``train`` turns on helpers.floats' mode at its start (the main job, and every notebook's run)."""
    torch.set_flush_denormal(False)  # (tests before this one may have turned it on)
    denormal = torch.tensor([1e-39])  # made after: a float converted with the mode on is already 0
    assert (denormal * 1.0).item() > 0
    train(short_config(tmp_path, steps=1), live=LiveCurves(tmp_path, notebook=False))
    assert (denormal * 1.0).item() == 0.0


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny batches: more threads only add noise on a shared machine
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
def test_short_run_and_kill_resume_give_the_same_numbers(tmp_path, one_thread):
    full = train(short_config(tmp_path / "full"), live=LiveCurves(tmp_path / "full", notebook=False))

    # The run folder holds what the issue asks for.
    run = full.run_dir
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [0, 1, 2, 3, 4]
    trl_names = {"reward", "reward_std", "rewards/correct/mean", "frac_reward_zero_std", "completions/mean_length",
                 "completions/clipped_ratio", "clip_ratio/region_mean", "entropy", "kl", "learning_rate", "grad_norm"}
    assert trl_names | {"success", "tool_calls", "turns", "t_rollout", "t_update"} <= set(lines[1])
    summary = json.loads((run / "summary.json").read_text())
    assert {"success", "tool_calls", "turns", "pass@2", "pass@1"} <= set(summary["before"]) & set(summary["after"])
    assert "eval/pass@2" in lines[0] and "eval/success" in lines[2] and "eval/pass@2" not in lines[2]
    assert "eval/pass@1" in lines[2]  # one sampled episode per task in between: the sampled-success curve
    assert "eval/pass@2" in lines[4] and "eval/success" not in lines[1]
    # Before and after on all eval_tasks; in between on the first eval_subset of the same tasks.
    assert [m.get("eval/n") for m in lines] == [3, None, 2, None, 3]
    ids = {step: [r["task_id"] for r in load_records(run / "eval" / f"step-{step:04d}.jsonl")] for step in (0, 2, 4)}
    assert ids[2] == ids[0][:2] and ids[4] == ids[0]
    # The time split: every part measured, the parts and "other" summing to the wall time.
    split = summary["time_split"]
    assert list(split) == [*TIME_SPLIT, "other"] and split == full.time_split
    assert sum(split.values()) == pytest.approx(summary["wall_s"]) and min(split.values()) >= 0
    assert all(split[part] > 0 for part in TIME_SPLIT)
    assert all(m["t_save"] >= 0 for m in lines) and summary["torch_threads"] == torch.get_num_threads()
    assert (run / "curves.png").exists() and (run / "trajectories" / "step-0002.jsonl").exists()
    assert (run / "eval" / "step-0004.jsonl").exists() and (run / "checkpoint-4").exists()
    assert full.line().startswith("before -> after (held-out, n=3): greedy success")
    assert lines[4]["kl"] > 0  # the adapter moved away from the reference

    # Killed during step 3 (after checkpoint-2), then resumed: the same numbers as the full run.
    with pytest.raises(KeyboardInterrupt):
        train(short_config(tmp_path / "killed"), live=KillAt(3))
    assert (tmp_path / "killed" / "checkpoint-2").exists() and not (tmp_path / "killed" / "checkpoint-4").exists()
    resumed = train(short_config(tmp_path / "killed", resume=True), live=LiveCurves(None, notebook=False))
    assert without_timing(resumed.history) == without_timing(full.history)
    assert resumed.after == full.after
    a = load_file(tmp_path / "full" / "checkpoint-4" / "adapter_model.safetensors")
    b = load_file(tmp_path / "killed" / "checkpoint-4" / "adapter_model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_run_closes_a_policy_that_holds_an_engine_when_it_ends_or_is_killed(tmp_path, one_thread, monkeypatch):
    """A vLLM policy holds the GPU's share (on CPU, worker processes) until ``close()``; the run closes it at its end,
    and when it is interrupted, so that a notebook's next cell does not find the memory still taken."""
    import helpers.policy

    closed = []

    class Closing:  # the real policy, plus the ``close`` that VLLMPolicy has
        def __init__(self, policy):
            self.policy = policy

        def __getattr__(self, name):
            return getattr(self.policy, name)

        def close(self):
            closed.append(True)

    make_policy = helpers.policy.make_policy
    monkeypatch.setattr(helpers.loop, "make_policy", lambda *args, **kw: Closing(make_policy(*args, **kw)))
    small = dict(steps=1, eval_every=0, pass_k=0, save_every=0, log_trajectories_every=0)
    train(short_config(tmp_path / "ends", **small), live=LiveCurves(None, notebook=False))
    assert closed == [True]
    with pytest.raises(KeyboardInterrupt):
        train(short_config(tmp_path / "killed", **small), live=KillAt(1))
    assert closed == [True, True]


@pytest.mark.slow
def test_resume_refuses_other_settings_falls_back_past_a_damaged_checkpoint_and_locks_the_folder(tmp_path, one_thread, capsys):
    from helpers.checkpoint import ResumeError, RunFolderBusy, run_folder_lock

    small = dict(steps=2, save_every=1, eval_every=0, eval_tasks=2, pass_k=0)
    full = train(short_config(tmp_path / "full", **small), live=LiveCurves(None, notebook=False))
    run = train(short_config(tmp_path / "run", **small), live=LiveCurves(None, notebook=False)).run_dir
    saved_config = (run / "config.json").read_text()

    # Other settings: refused in one line that names each field, and nothing in the folder changes.
    for changed, named in [(dict(lr=0.5), "lr 0.001 -> 0.5"), (dict(lora_r=4, lora_alpha=8), "lora_r 8 -> 4; lora_alpha 16 -> 8")]:
        with pytest.raises(ResumeError) as refused:
            train(short_config(tmp_path / "run", resume=True, **small, **changed), live=LiveCurves(None, notebook=False))
        assert named in str(refused.value) and "\n" not in str(refused.value)
    assert (run / "config.json").read_text() == saved_config and (run / "checkpoint-2").is_dir()

    # A run saved before a field was added to the config (its config.json lacks it) ran with that field's default.
    older = __import__("json").loads(saved_config)
    del older["mask_truncated_completions"]
    (run / "config.json").write_text(__import__("json").dumps(older))

    # A damaged newest checkpoint: found by its checksums, said so, and the run goes on from the one before it.
    adapter = run / "checkpoint-2" / "adapter_model.safetensors"
    damaged = bytearray(adapter.read_bytes())
    damaged[-1] ^= 0xFF
    adapter.write_bytes(bytes(damaged))
    capsys.readouterr()
    resumed = train(short_config(tmp_path / "run", resume=True, **small), live=LiveCurves(None, notebook=False))
    assert "checkpoint-2 is damaged (adapter_model.safetensors does not match its checksum)" in capsys.readouterr().out
    assert without_timing(resumed.history) == without_timing(full.history)

    # One run per folder: a second one stops at once, saying who holds it.
    with run_folder_lock(run):
        with pytest.raises(RunFolderBusy, match=f"pid {__import__('os').getpid()}"):
            train(short_config(tmp_path / "run", resume=True, **small), live=LiveCurves(None, notebook=False))


def test_the_readme_example_class_passes_the_contract_check_with_the_shops_tools():
    import re

    from helpers.envs import check_env_class, tool_schemas
    from helpers.worlds.shop.env import ShopEnv

    readme = (ROOT / "README.md").read_text()
    source = next(block for block in re.findall(r"```python\n(.*?)```", readme, re.S) if "class MyShop" in block)
    namespace = {}
    exec(source, namespace)  # the README's own text: a class that imports nothing from helpers
    assert check_env_class(namespace["MyShop"]) == []
    shape = lambda schemas: [(s["function"]["name"], sorted(s["function"]["parameters"]["properties"])) for s in schemas]  # noqa: E731
    assert shape(tool_schemas(namespace["MyShop"]())) == shape(tool_schemas(ShopEnv()))


def test_help_names_each_flag_once():
    """`--help` lists a one-word field once (`--lr FLOAT`), a field of several words in both spellings."""
    help_text = helpers.train.build_parser("tiny-agent").format_help()
    assert "--lr FLOAT" in help_text and "--lr FLOAT, --lr" not in help_text
    assert "--max-new-tokens INT, --max_new_tokens INT" in help_text
    assert helpers.train.build_parser("tiny-agent").parse_args(["--max_new_tokens", "7"]).max_new_tokens == 7
