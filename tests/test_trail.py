"""The long-horizon tiny world: trails and splits, the env and its bad input, the anchor state (the room), the
demonstrator's habit in the middle room, how failures are told apart, the shipped checkpoint."""

import json
import random
from collections import Counter

import pytest

from helpers.envs import check_env, check_env_class, make_env
from helpers.envs.anchors import anchor_for
from helpers.formats import format_tool_call
from helpers.grpo import step_group_metrics, step_groups
from helpers.policy.base import ScriptedPolicy
from helpers.rollout import rollout
from helpers.worlds.trail.build import HABIT_ROOM, TRAIL_DIR, build, demonstration, failure_kind, middle_tries
from helpers.worlds.trail.env import TrailEnv, current_room
from helpers.worlds.trail.presets import SUCCESS_BAR
from helpers.worlds.trail.tasks import EPISODE, ROOMS, make_trail_tasks
from helpers.worlds.tinymodel import load_tokenizer


def go(door):
    return format_tool_call("go", {"door": door})


def solution(task):
    """The shortest walk: the sign's door in every room, then the code."""
    return [go(room["sign"]) for room in task.metadata["rooms"]] + [f"<answer>{task.answer}</answer>"]


def first_door_wrong(tasks):
    return next(t for t in tasks if t.metadata["rooms"][HABIT_ROOM - 1]["doors"][0] != t.metadata["rooms"][HABIT_ROOM - 1]["sign"])


@pytest.fixture(scope="module")
def task():
    return first_door_wrong(make_trail_tasks(8, seed=0, split="test"))


def test_trails_are_seeded_split_and_hidden():
    tasks = make_trail_tasks(40, seed=3, split="train")
    assert [t.metadata for t in tasks] == [t.metadata for t in make_trail_tasks(40, seed=3, split="train")]
    assert len({json.dumps(t.metadata, sort_keys=True) for t in tasks}) == 40
    for t in tasks:
        assert len(t.metadata["rooms"]) == ROOMS and t.answer == str(t.metadata["code"])
        assert "room 1:" in t.prompt[-1]["content"] and "room 2" not in t.prompt[-1]["content"]  # the rest is behind the doors
    held_out = {json.dumps(t.metadata, sort_keys=True) for t in make_trail_tasks(40, seed=3, split="test")}
    assert not held_out & {json.dumps(t.metadata, sort_keys=True) for t in tasks}
    with pytest.raises(ValueError, match="unknown split"):
        make_trail_tasks(1, split="dev")


def test_the_walk_earns_the_reward_and_a_locked_door_keeps_the_room(task):
    env = make_env("trail", max_steps=EPISODE["max_steps"])
    env.reset(task)
    room = task.metadata["rooms"][0]
    wrong = next(d for d in room["doors"] if d != room["sign"])
    assert env.step(go(wrong)).observation[0]["content"].startswith("locked. room 1:")
    assert env.step(go("purple")).observation[0]["content"] == "error: no door 'purple' in room 1"
    results = [env.step(text) for text in solution(task)]
    assert results[-2].observation[0]["content"] == f"exit: code {task.answer}"
    assert results[-1].reward == 1.0 and results[-1].info["stop_reason"] == "answered"
    assert check_env(make_env("trail", max_steps=EPISODE["max_steps"]), make_trail_tasks(3, seed=0, split="test"), solver=solution) == []
    assert check_env_class(TrailEnv, task) == []


def test_a_row_without_rooms_is_a_caller_error():
    with pytest.raises(ValueError, match="TrailEnv needs a row with 'rooms'"):
        TrailEnv().reset(rooms=[{"doors": ["red"], "sign": "blue"}], code=1)


def test_the_anchor_is_the_room_so_revisits_share_a_step_group(task):
    """Two episodes of one trail: one goes straight through room 4, one tries the first door twice there first. Every
    try in room 4 (the one's single try and the other's three) is in one step group; so is every turn in each room."""
    tokenizer = load_tokenizer(TRAIL_DIR)
    rooms = task.metadata["rooms"]
    straight = solution(task)
    looping = straight[:HABIT_ROOM - 1] + [go(rooms[HABIT_ROOM - 1]["doors"][0])] * 2 + straight[HABIT_ROOM - 1:]
    episodes = rollout([task], "trail", ScriptedPolicy(tokenizer, straight), group_size=1, progress=False,
                       max_steps=EPISODE["max_steps"], max_total_tokens=EPISODE["max_total_tokens"])
    episodes += rollout([task], "trail", ScriptedPolicy(tokenizer, looping), group_size=1, progress=False,
                        max_steps=EPISODE["max_steps"], max_total_tokens=EPISODE["max_total_tokens"])
    for g, e in enumerate(episodes):
        e.group, e.reward = g, 1.0  # both answer right
    assert [failure_kind(e) for e in episodes] == ["correct", "correct"] and [middle_tries(e) for e in episodes] == [1, 3]
    groups = step_groups(episodes, gamma=0.9, anchor=anchor_for("trail"))
    middle = next(sg for sg in groups if sg.members[0] == (0, HABIT_ROOM - 1))
    assert middle.members == [(0, 3), (1, 3), (1, 4), (1, 5)]  # room 4: one try, and three
    assert middle.nontrivial and middle.advantages("none")[0] > 0 > middle.advantages("none")[1]  # sooner earns more
    assert len(groups) == ROOMS + 1  # six rooms and the exit
    assert step_group_metrics(groups)["step_groups/later_turns_nontrivial"] > 0
    assert current_room([]) == "room 1" and current_room([{"role": "tool", "content": "exit: code 12"}]) == "exit"
    in_room_2 = [{"role": "tool", "content": "room 2: red gold blue. sign: gold"}]
    assert current_room(in_room_2 + [{"role": "tool", "content": "error: malformed JSON in tool call"}]) == "room 2"  # still there


def test_the_demonstrator_loops_in_the_middle_room_only():
    tasks = make_trail_tasks(300, seed=0, split="train")
    rng = random.Random(0)
    tries = Counter()
    for t in tasks:
        messages = demonstration(t, rng)
        for i, m in enumerate(messages):
            if m["role"] == "assistant" and "<tool_call>" in m["content"]:
                tries[current_room(messages[:i])] += 1
    per_room = {room: tries[room] / len(tasks) for room in tries}
    assert per_room[f"room {HABIT_ROOM}"] > 1.5 and all(v < 1.15 for r, v in per_room.items() if r != f"room {HABIT_ROOM}"), per_room


def test_a_looping_agent_runs_out_of_turns_in_the_middle(task):
    rooms = task.metadata["rooms"]
    script = [go(r["sign"]) for r in rooms[:HABIT_ROOM - 1]] + [go(rooms[HABIT_ROOM - 1]["doors"][0])]
    (episode,) = rollout([task], TrailEnv, ScriptedPolicy(load_tokenizer(TRAIL_DIR), script), group_size=1, progress=False,
                         max_steps=EPISODE["max_steps"], max_total_tokens=EPISODE["max_total_tokens"])
    assert episode.stop_reason == "max_steps" and failure_kind(episode) == "stuck_middle"
    assert middle_tries(episode) == EPISODE["max_steps"] - (HABIT_ROOM - 1)
    (episode,) = rollout([task], TrailEnv, ScriptedPolicy(load_tokenizer(TRAIL_DIR), script), group_size=1, progress=False,
                         max_steps=3 * EPISODE["max_steps"], max_total_tokens=EPISODE["max_total_tokens"])
    assert episode.stop_reason == "max_tokens" and failure_kind(episode) == "stuck_middle"  # the tokens ran out there first


def test_shipped_baseline_is_weak_in_the_middle():
    result = json.loads((TRAIL_DIR / "baseline.json").read_text())
    greedy = result["greedy"]
    assert greedy["temperature"] == 0.0 and greedy["success"] < SUCCESS_BAR, greedy  # something to learn
    failed = greedy["n"] - round(greedy["success"] * greedy["n"])
    assert greedy["failures"].get("stuck_middle", 0) >= 0.75 * failed, greedy  # and it is room 4's habit, under greedy
    assert result["sampled"]["success"] >= 0.2, result["sampled"]  # sampling finds the way often enough to learn from


def test_build_is_deterministic(tmp_path, one_thread):
    small = dict(train_tasks=30, steps=2, batch_size=4, eval_tasks=2, progress=False)
    first, second = build(tmp_path / "a", **small), build(tmp_path / "b", **small)
    assert first["sft_loss_every_50_steps"] == second["sft_loss_every_50_steps"]
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()
