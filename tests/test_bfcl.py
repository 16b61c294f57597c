"""The BFCL world: its data through the dataset registry, BFCL's own checkers in their own environment,
``--benchmark bfcl --answers`` against ``bfcl evaluate`` on the same files, and the multi-turn simulators as an env.

BFCL's environment (helpers.worlds.bfcl.official) is made on first use: about a minute, once per machine
(BFCL_VENV points at another one).
"""

import json

import pytest

from helpers.data import DatasetError, load_dataset
from helpers.envs import check_env_class, make_env
from helpers.evaluate import main as evaluate_main
from helpers.rollout import load_trajectories
from helpers.train import main as train_main
from helpers.worlds.bfcl import official
from helpers.worlds.bfcl.env import member_config, multiturn_class
from helpers.worlds.bfcl.tasks import (LEAVE_OUT, MULTI_TURN, NO_CALL, SUPPORTED, UNSATISFIABLE, broken_result, chosen,
                                       load_category, reference_result, tool_call_text)


def write_results(folder, make) -> dict[str, list[dict]]:
    """Every supported category's results, ``make(task)`` each, in the folder layout ``bfcl evaluate`` reads."""
    results = {category: [{"id": task.id, "result": make(task)} for task in load_category(category)] for category in SUPPORTED}
    for category, entries in results.items():
        path = folder / "Qwen_Qwen3-0.6B-FC" / category / f"BFCL_v4_{category}_result.json"
        path.parent.mkdir(parents=True)
        path.write_text("".join(json.dumps(entry) + "\n" for entry in entries))
    return results


def test_the_ground_truth_scores_100_percent_and_bfcl_evaluate_agrees(tmp_path, capsys):
    results = write_results(tmp_path / "result", reference_result)
    line = evaluate_main(["--benchmark", "bfcl", "--answers", str(tmp_path / "result")])
    ours = line["categories"]
    assert sorted(ours) == sorted(SUPPORTED)
    for category, score in ours.items():
        unsatisfiable = sum(entry_id.startswith(category + "_") for entry_id in UNSATISFIABLE)
        assert score["total_count"] == score["of"] == len(load_category(category))
        assert score["correct_count"] == score["total_count"] - unsatisfiable, category  # 100 % of what can be passed
    failed = {v["id"] for category in ("live_simple", "live_multiple")
              for v in official.call("judge", category=category, results=results[category]) if not v["valid"]}
    assert failed == set(UNSATISFIABLE)
    theirs = official.bfcl_evaluate(results)  # BFCL's own command line, offline, on the same files
    assert {c: {k: s[k] for k in ("accuracy", "correct_count", "total_count")} for c, s in ours.items()} == theirs
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["categories"] == ours


def test_the_ground_truth_writer_tells_left_out_from_empty_and_null():
    """BFCL's possible answers mark "may be left out" with ""; None (null) is a value. live_multiple_507-149-4 needs a
    required "" written, live_multiple_1038-265-0 a null written (both were once left out, and failed)."""
    assert chosen(["", "Economy"]) == "Economy"
    assert chosen([""]) is LEAVE_OUT and chosen([""], required=True) == ""
    assert chosen([None]) is None and chosen([None], required=True) is None
    assert chosen(["", "x"], documented=False) is LEAVE_OUT  # a parameter the doc lacks: written, it is "unexpected"
    assert chosen([]) is LEAVE_OUT


def test_an_obviously_broken_answers_file_scores_0_and_bfcl_evaluate_agrees(tmp_path):
    results = write_results(tmp_path / "result", broken_result)
    ours = evaluate_main(["--benchmark", "bfcl", "--answers", str(tmp_path / "result")])["categories"]
    assert all(score["correct_count"] == 0 and score["accuracy"] == 0.0 for score in ours.values())
    small = {category: results[category] for category in ("simple_python", "irrelevance", "live_relevance", "multi_turn_base")}
    theirs = official.bfcl_evaluate(small)
    assert all(theirs[category] == {"accuracy": 0.0, "correct_count": 0, "total_count": len(small[category])} for category in small)


def test_one_category_of_a_file_and_a_subset_of_entries(tmp_path):
    tasks = load_category("parallel")[:5]
    path = tmp_path / "BFCL_v4_parallel_result.json"
    rows = [{"id": t.id, "result": reference_result(t)} for t in tasks[:3]] + [{"id": t.id, "result": NO_CALL} for t in tasks[3:]]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    score = evaluate_main(["--benchmark", "bfcl/parallel", "--answers", str(path)])["categories"]
    assert score == {"parallel": {"accuracy": 0.6, "correct_count": 3, "total_count": 5, "of": 200}}
    assert official.bfcl_evaluate({"parallel": rows}) == {"parallel": {"accuracy": 0.6, "correct_count": 3, "total_count": 5}}  # --partial-eval
    with pytest.raises(DatasetError, match="no simple_python entries"):
        evaluate_main(["--benchmark", "bfcl/simple_python", "--answers", str(path)])
    path.write_text(json.dumps({"task_id": "x", "completion": "y"}) + "\n")
    with pytest.raises(DatasetError, match="expected BFCL's"):
        evaluate_main(["--benchmark", "bfcl", "--answers", str(path)])


def test_the_datasets_are_bfcl_entries_with_leak_free_splits():
    tasks = load_dataset("bfcl/simple_python", "test")
    assert len(tasks) == 400 and tasks[0].id == "simple_python_0" and tasks[0].answer is None
    system, question = tasks[0].prompt
    assert system["role"] == "system" and '"name": "calculate_triangle_area"' in system["content"] and "<tool_call>" in system["content"]
    assert question == {"role": "user", "content": tasks[0].metadata["entry"]["question"][0][0]["content"]}
    with pytest.raises(DatasetError, match="one split 'test'"):
        load_dataset("bfcl/simple_python", "train")
    with pytest.raises(DatasetError, match="no category"):
        load_dataset("bfcl/simple_java", "test")
    for category in ("live_multiple", "multi_turn_base"):
        splits = {split: {t.id for t in load_dataset(f"bfcl-splits/{category}", split)} for split in ("train", "validation", "test")}
        assert not (splits["train"] & splits["test"] or splits["train"] & splits["validation"] or splits["validation"] & splits["test"])
        assert set().union(*splits.values()) == {t.id for t in load_category(category)}
        assert 0.7 < len(splits["train"]) / len(load_category(category)) < 0.9
    gfs = load_dataset("bfcl-splits/multi_turn_base:GorillaFileSystem", "train")
    assert gfs and all(t.metadata["entry"]["involved_classes"] == ["GorillaFileSystem"] for t in gfs)
    assert {t.id for t in gfs} <= {t.id for t in load_dataset("bfcl-splits/multi_turn_base", "train")}


def test_the_single_turn_env_is_judged_by_bfcls_checker():
    task = load_dataset("bfcl/multiple", "test", 1)[0]
    for text, reward, verdict in [(reference_result(task), 1.0, "correct"), (NO_CALL, 0.0, "multiple_function_checker:wrong_count"),
                                  (tool_call_text([("no_such_function", {})]), 0.0, "simple_function_checker:wrong_func_name")]:
        env = make_env("bfcl", max_steps=1)
        env.reset(task)
        result = env.step(text)
        assert (result.reward, result.info["verdict"], result.terminated) == (reward, verdict, True)


def play(env, turns: list[list[str]]):
    """Play a multi-turn result through the env: each step's text, then a reply without a call ends the turn."""
    for turn in turns:
        for step in turn:
            if not env.is_done():
                result = env.step(step)
        if not env.is_done() and turn[-1] != NO_CALL:
            result = env.step("Done.")
    return result


def test_the_multi_turn_simulators_are_an_env_the_official_checker_judges():
    cls = multiturn_class(("GorillaFileSystem",))
    tasks = load_dataset("bfcl-splits/multi_turn_base:GorillaFileSystem", "test")
    assert check_env_class(cls) == []
    env = make_env("bfcl_multiturn", classes="GorillaFileSystem", max_steps=40)
    assert {tool["function"]["name"] for tool in env.tools} >= {"cd", "ls", "mv", "grep", "sort", "diff"}
    for task in tasks[:2]:
        env = make_env("bfcl_multiturn", classes="GorillaFileSystem", max_steps=40)
        messages = env.reset(task)
        assert messages == task.prompt
        result = play(env, reference_result(task))
        assert (result.reward, result.info["verdict"], result.info["env_reward"]) == (1.0, "correct", {"BfclMultiTurnEnv": 1.0})
        assert result.info["tool_errors"] == 0
        env = make_env("bfcl_multiturn", classes="GorillaFileSystem", max_steps=40)
        env.reset(task)
        first = env.step(tool_call_text([("ls", {"a": True})]))
        assert "current_directory_content" in first.observation[0]["content"]  # the simulator's own answer
        result = play(env, [[NO_CALL] for _ in task.metadata["entry"]["question"]])
        assert result.reward == 0.0 and result.info["correct"] is False
    other = load_dataset("bfcl/multi_turn_base", "test")
    with pytest.raises(ValueError, match="this env hosts GorillaFileSystem"):
        make_env("bfcl_multiturn", classes="GorillaFileSystem").reset(next(t for t in other if "TradingBot" in t.metadata["entry"]["involved_classes"]))
    assert MULTI_TURN[0] == "multi_turn_base"


def test_a_model_plays_a_benchmark_member_in_its_env(capsys):
    assert member_config("bfcl/live_simple") == {}
    assert member_config("bfcl/multi_turn_base:TwitterAPI+GorillaFileSystem") == {
        "env": "bfcl_multiturn", "env_kwargs": {"classes": "GorillaFileSystem+TwitterAPI"}, "env_max_steps": 20}
    with pytest.raises(DatasetError, match="name them"):
        member_config("bfcl/multi_turn_base")
    line = evaluate_main(["--benchmark", "bfcl/multi_turn_base:GorillaFileSystem", "--preset", "bfcl-multiturn-smoke", "--n", "1",
                          "--k", "0", "--max-new-tokens", "16"])
    assert line["n"] == 1 and line["score"] == 0.0  # the tiny agent never solves one: the path, not the skill


def test_the_smoke_preset_trains_on_the_simulators(tmp_path):
    result = train_main(["--preset", "bfcl-multiturn-smoke", "--steps", "1", "--eval-tasks", "1", "--out-dir", str(tmp_path / "run")])
    assert result.config.env == "bfcl_multiturn" and result.history[1]["reward_errors"] == 0.0
    episodes = load_trajectories(result.run_dir / "trajectories" / "step-0001.jsonl")
    assert len(episodes) == 4 and all(set(t.reward_parts) == {"BfclMultiTurnEnv"} for t in episodes)


def test_help_lists_the_benchmarks_and_bfcls_categories(capsys):
    with pytest.raises(SystemExit):
        evaluate_main(["--help"])
    text = capsys.readouterr().out
    assert "bfcl/<member>\n" in text and "members: simple_python, multiple, parallel," in text and "multi_turn_base" in text
    assert "humaneval\n" in text and "reasoning_gym/<member>\n" in text


def test_the_worker_ends_with_the_process_and_leaves_nothing_open():
    import subprocess
    import sys

    from helpers.paths import ROOT

    script = "from helpers.worlds.bfcl.official import call\nprint(len(call('entries', category='simple_python')['prompts']))"
    out = subprocess.run([sys.executable, "-X", "dev", "-c", script], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.stdout.split() == ["400"], out.stderr
    assert "ResourceWarning" not in out.stderr, out.stderr  # was: its output pipe and its log left open
