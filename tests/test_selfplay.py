"""Tests for helpers.worlds.selfplay (collect, env, tasks, build): the learnability reward and the
per-role advantages on hand-computed groups, proposal checking, a short run and resume."""

import json
import random
import shutil

import pytest
import torch

from helpers.config import get_preset
from helpers.envs import make_env
from helpers.live import LiveCurves
from helpers.train import train
from helpers.worlds.selfplay.build import SELFPLAY_DIR, success_by_difficulty
from helpers.worlds.selfplay.collect import learnability, role_advantages
from helpers.worlds.selfplay.env import check_proposal, difficulty, proposer_task
from helpers.worlds.selfplay.tasks import selfplay_dataset

TIMING = ("t_rollout", "t_reward", "t_update", "t_eval", "t_save", "tokens_per_s")


def test_learnability_on_hand_computed_groups():
    attempts = torch.tensor([
        [1, 1, 1, 1],  # p = 1: always solved -> 0
        [1, 1, 1, 0],  # p = 0.75 -> 1 - p = 0.25
        [1, 0, 0, 0],  # p = 0.25 -> 0.75
        [0, 0, 0, 0],  # p = 0: never solved -> 0
        [0, 1, 0, 1],  # p = 0.5 -> 0.5
    ])
    assert torch.allclose(learnability(attempts), torch.tensor([0.0, 0.25, 0.75, 0.0, 0.5]))
    assert learnability(torch.zeros(0, 4)).shape == (0,)  # no valid task this round


def test_role_advantages_use_a_baseline_per_role():
    proposer = torch.tensor([[0.0, 0.25, 0.75, 0.0]])  # (K=1, G=4): mean 0.25, std sqrt(0.125)
    solver = torch.tensor([[1.0, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]])  # (V=3, G=4)
    adv = role_advantages(proposer, solver, "group")
    assert adv.advantages.shape == (4, 4)
    s = 0.125 ** 0.5 + 1e-4
    assert torch.allclose(adv.advantages[0], torch.tensor([-0.25, 0.0, 0.5, -0.25]) / s)
    assert torch.allclose(adv.advantages[1], torch.tensor([0.25, 0.25, 0.25, -0.75]) / (0.5 + 1e-4))
    assert torch.allclose(adv.advantages[2], torch.tensor([0.75, -0.25, -0.25, -0.25]) / (0.5 + 1e-4))
    assert adv.advantages[3].eq(0).all() and adv.zero_spread.tolist() == [False, False, False, True]
    # The proposer's best task (learnability 0.75) has a positive advantage with its own baseline;
    # against one baseline shared with the solver's 0/1 outcomes (mean 0.53 here) it would be pushed down less
    # than the 1s of an easy task are pushed up: the roles' scales mix.
    shared = torch.cat([proposer.flatten(), solver.flatten()])
    assert adv.advantages[0, 2] > 0 and 0.75 - shared.mean() < 1.0 - shared.mean()
    assert role_advantages(proposer, torch.zeros(0, 4)).advantages.shape == (1, 4)
    weighted = role_advantages(proposer, solver, "group", proposer_weight=4.0)  # the proposer's rows x 4, the solver's as they were
    assert torch.allclose(weighted.advantages[0], 4 * adv.advantages[0]) and torch.equal(weighted.advantages[1:], adv.advantages[1:])
    assert weighted.zero_spread.tolist() == adv.zero_spread.tolist()


def test_check_proposal_valid_invalid_and_out_of_range():
    assert check_proposal("<task>47*86</task>") == {"valid": True, "expression": "47*86", "answer": "4042", "difficulty": 4}
    assert check_proposal("  <task>999*12</task>\n")["answer"] == "11988"
    for text, why in [("<task>47*</task>", "grammar"), ("What is 47*86?", "grammar"), ("<task>4+5</task>", "grammar"),
                      ("<task>47*86</task> and more", "grammar"), ("<task>1000*3</task>", "out of range"),
                      ("<task>7*12</task>", "out of range"), ("<task>0*50</task>", "out of range"),
                      ("<task>07*5</task>", "leading zero"), ("<task>" + "9" * 5000 + "*2</task>", "grammar")]:
        result = check_proposal(text)
        assert result["valid"] is False and why in result["error"], (text[:30], result)
    assert difficulty("47*123") == 5 and difficulty("123*456") == 6


def test_check_proposal_never_raises_on_garbage():
    rng = random.Random(0)
    alphabet = "<task>/*0123456789 \n{}\"\\é\x00"
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        result = check_proposal(text)
        assert isinstance(result["valid"], bool) and (result["valid"] or result["error"])


def test_proposer_env_ends_in_one_turn_with_the_computed_answer():
    env = make_env("propose")
    assert env.reset(proposer_task())[0]["role"] == "system" and env.tools is None
    result = env.step("<task>12*34</task>")
    assert result.done and result.terminated and result.reward == 0.0  # the loop pays the proposer, not the env
    assert result.info["valid"] and result.info["answer"] == "408" and result.info["verdict"] == "valid_task"
    env.reset(proposer_task())
    result = env.step("<task>12*</task>")
    assert result.truncated and result.info["stop_reason"] == "error" and "grammar" in result.info["error"]


def test_held_out_set_is_fixed_and_spans_difficulties():
    tasks = selfplay_dataset("test", None, 0)
    assert len(tasks) == 256 and [t.id for t in tasks] == [t.id for t in selfplay_dataset("test", None, 0)]
    assert {t.metadata["difficulty"] for t in tasks} == {4, 5, 6}
    assert not {t.id.rsplit("-", 1)[1] for t in tasks} & {t.id.rsplit("-", 1)[1] for t in selfplay_dataset("train", 500, 0)}
    records = [{"task_id": "selfplay-test-17*12", "correct": True}, {"task_id": "selfplay-test-33*45", "correct": False},
               {"task_id": "selfplay-test-123*45", "correct": True}]
    assert success_by_difficulty(records) == {4: 0.5, 5: 1.0}


def short_config(out_dir, **kw):
    return get_preset("tiny-selfplay", steps=2, num_generations=4, eval_tasks=4, eval_every=0, save_every=1,
                      log_trajectories_every=1, out_dir=str(out_dir), **kw)


@pytest.mark.skipif(not (SELFPLAY_DIR / "model.safetensors").exists(), reason="data/tiny-selfplay not built")
def test_short_selfplay_run_and_resume_give_the_same_numbers(tmp_path, one_thread):
    full = train(short_config(tmp_path / "full"), preset_name="tiny-selfplay", live=LiveCurves(None, notebook=False))
    lines = [json.loads(line) for line in (full.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [0, 1, 2]
    assert {"proposer/validity", "proposer/difficulty", "proposer/learnability", "eval/success"} <= set(lines[2])
    summary = json.loads((full.run_dir / "summary.json").read_text())
    assert set(summary["proposer"]) == {"difficulty_first_tenth", "difficulty_last_tenth", "validity_first_tenth", "validity_last_tenth"}
    assert "success" in summary["before"] and "success" in summary["after"]
    saved = [json.loads(line) for line in (full.run_dir / "trajectories" / "step-0001.jsonl").read_text().splitlines()]
    assert sum(row["task"]["id"].startswith("propose-") for row in saved) == 2 * 4  # K = 2 groups of P = G = 4 proposals

    # "Killed" after checkpoint-1: its run folder as it was then, then resumed.
    shutil.copytree(full.run_dir, tmp_path / "killed")
    shutil.rmtree(tmp_path / "killed" / "checkpoint-2")
    resumed = train(short_config(tmp_path / "killed", resume=True), preset_name="tiny-selfplay",
                    live=LiveCurves(None, notebook=False))
    strip = lambda history: [{k: v for k, v in m.items() if k not in TIMING} for m in history]  # noqa: E731
    assert strip(resumed.history) == strip(full.history) and resumed.after == full.after
