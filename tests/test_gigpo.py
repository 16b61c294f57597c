"""GiGPO (helpers.grpo §1b): step groups, per-turn advantages by hand, per-token batches, and a
tiny-agent run with --advantage gigpo killed and resumed."""

import copy
import json
import math
from dataclasses import replace

import pytest
import torch

from helpers.config import TrainConfig, get_preset
from helpers.data import Task
from helpers.envs.anchors import anchor_for, canonical_calls, register_anchor, tool_history
from helpers.formats import format_tool_call
from helpers.grpo import (
    LoRAGRPO, collate, compute_advantages, gigpo_advantages, group_advantages, group_rewards, grpo_loss, history_before,
    step_group_metrics, step_groups, turn_returns, turn_spans,
)
from helpers.live import LiveCurves
from helpers.rollout import Trajectory
from helpers.viewer import step_group_table

PROMPT = [5, 6, 7]


def episode(g: int, turns: list[list[int]], observations: list[list[int]], reward: float, task: Task) -> Trajectory:
    """An episode built by hand: the prompt, then each turn's generated tokens (mask 1) followed by its tool result
    (mask 0). Its messages spell each turn and result as its tokens, so equal tokens are an equal state."""
    ids, mask, messages = list(PROMPT), [0] * len(PROMPT), [{"role": "user", "content": "prompt"}]
    for k, turn in enumerate(turns):
        ids += turn
        mask += [1] * len(turn)
        messages.append({"role": "assistant", "content": f"tokens {turn}"})
        if k < len(observations):
            ids += observations[k]
            mask += [0] * len(observations[k])
            messages.append({"role": "tool", "content": f"tokens {observations[k]}"})
    return Trajectory(task=task, group=g, token_ids=ids, mask=mask, logprobs=[0.0] * len(ids), prompt_len=len(PROMPT),
                      reward=reward, turns=len(turns), messages=messages)


def worked_example() -> list[Trajectory]:
    """The docstring's group: 0 = usual, lookup(cake), calculator, answer (right); 1 = usual, lookup(cake), a guess
    (wrong); 2 = lookup(key), answer (wrong). Tokens: 10 11 usual(), 12 13 lookup(cake), 14 calculator, 15 16 17 answers,
    18 lookup(key); 20-23 tool results."""
    task = Task(id="order-1", prompt=[])
    return [
        episode(0, [[10, 11], [12, 13], [14], [15]], [[20], [21], [22]], 1.0, task),
        episode(1, [[10, 11], [12, 13], [16]], [[20], [21]], 0.0, task),
        episode(2, [[18], [17]], [[23]], 0.0, task),
    ]


def test_turn_spans_and_returns():
    ep = worked_example()[0]
    assert turn_spans(ep.mask) == [(3, 5), (6, 8), (9, 10), (11, 12)]
    assert turn_spans([1, 1, 0, 1]) == [(0, 2), (3, 4)] and turn_spans([0, 0]) == []
    assert turn_returns(ep, 0.5) == [0.125, 0.25, 0.5, 1.0]


def test_step_groups_of_the_worked_example():
    groups = step_groups(worked_example(), gamma=0.5)
    assert [(sg.turn, sg.members, sg.returns) for sg in groups] == [
        (0, [(0, 0), (1, 0), (2, 0)], [0.125, 0.0, 0.0]),  # the prompt: every episode's first turn
        (1, [(0, 1), (1, 1)], [0.25, 0.0]),  # after usual() and its result
        (2, [(0, 2), (1, 2)], [0.5, 0.0]),  # after lookup(cake): calculator (0) or a guess (1)
        (3, [(0, 3)], [1.0]),  # alone
        (1, [(2, 1)], [0.0]),  # after lookup(key): alone
    ]
    assert [sg.nontrivial for sg in groups] == [True, True, True, False, False]
    metrics = step_group_metrics(groups)
    assert metrics["step_groups/size_mean"] == 9 / 5
    assert metrics["step_groups/turns_nontrivial"] == 7 / 9 and metrics["step_groups/later_turns_nontrivial"] == 4 / 6


def test_gigpo_advantages_by_hand():
    """The worked example of helpers.grpo §1b, number by number (gamma 0.5, omega 1, no std)."""
    adv = gigpo_advantages(worked_example(), gamma=0.5, step_advantage_w=1.0, scale_rewards="none")
    torch.testing.assert_close(adv.advantages, torch.tensor([[2 / 3, -1 / 3, -1 / 3]]))
    expected = [
        [2 / 3 + 1 / 12, 2 / 3 + 1 / 8, 2 / 3 + 1 / 4, 2 / 3],
        [-1 / 3 - 1 / 24, -1 / 3 - 1 / 8, -1 / 3 - 1 / 4],  # the guess (last turn) takes the most blame
        [-1 / 3 - 1 / 24, -1 / 3],
    ]
    for got, want in zip(adv.turn_advantages[0], expected):
        torch.testing.assert_close(got, torch.tensor(want))
    assert adv.zero_spread.tolist() == [False]

    # With the std (scale_rewards="group", verl-agent's mean_std_norm) and omega = 0.5: each level divided by its group's std.
    eps = 1e-4
    adv = gigpo_advantages(worked_example(), gamma=0.5, step_advantage_w=0.5, scale_rewards="group")
    std_e = math.sqrt(((2 / 3) ** 2 + 2 * (1 / 3) ** 2) / 2)  # Bessel: divide by G - 1
    std_0 = math.sqrt(((1 / 12) ** 2 + 2 * (1 / 24) ** 2) / 2)
    std_1, std_2 = math.sqrt(2 * 0.125 ** 2), math.sqrt(2 * 0.25 ** 2)
    e = [2 / 3 / (std_e + eps), -1 / 3 / (std_e + eps)]
    want_1 = [e[1] + 0.5 * (-1 / 24) / (std_0 + eps), e[1] + 0.5 * (-0.125) / (std_1 + eps), e[1] + 0.5 * (-0.25) / (std_2 + eps)]
    torch.testing.assert_close(adv.turn_advantages[0][1], torch.tensor(want_1))
    torch.testing.assert_close(adv.turn_advantages[0][0][3], torch.tensor(e[0]))  # alone: the episode's advantage only


def shop_episode(g: int, calls: list[str], results: list[str], reward: float, task: Task) -> Trajectory:
    """A shop episode as text: each call's text (one token per character, mask 1) and each result (mask 0)."""
    ids, mask, messages = list(PROMPT), [0] * len(PROMPT), [{"role": "user", "content": "What do 3 of my usual items cost?"}]
    for k, call in enumerate(calls):
        ids, mask = ids + [ord(c) for c in call], mask + [1] * len(call)
        messages.append({"role": "assistant", "content": call})
        if k < len(results):
            ids, mask = ids + [ord(c) for c in results[k]], mask + [0] * len(results[k])
            messages.append({"role": "tool", "content": results[k]})
    return Trajectory(task=task, group=g, token_ids=ids, mask=mask, logprobs=[0.0] * len(ids), prompt_len=len(PROMPT),
                      reward=reward, turns=len(calls), messages=messages)


def test_episodes_that_reach_one_env_state_in_other_words_share_a_step_group():
    """Two episodes make the same calls with the same results, but one writes its first call with other spacing and
    key order: the env is in the same state before each later turn, so each later turn is in one step group (the
    conversation's text, what a token prefix keys on, splits every one of them)."""
    task = Task(id="order-1", prompt=[])
    tidy = '<tool_call>\n{"name": "usual", "arguments": {}}\n</tool_call>'
    loose = '<tool_call>\n{"arguments":{},   "name":"usual"}\n</tool_call>'
    lookup = format_tool_call("lookup", {"item": "pen"})
    calc = format_tool_call("calculator", {"expression": "3*47"})
    results = ['{"item": "pen"}', "47", "141"]
    trajs = [shop_episode(0, [tidy, lookup, calc, "<answer>141</answer>"], results, 1.0, task),
             shop_episode(1, [loose, lookup, calc, "<answer>140</answer>"], results, 0.0, task)]
    groups = step_groups(trajs, gamma=0.9)
    assert [(sg.turn, sg.members) for sg in groups] == [(0, [(0, 0), (1, 0)]), (1, [(0, 1), (1, 1)]),
                                                         (2, [(0, 2), (1, 2)]), (3, [(0, 3), (1, 3)])]
    assert step_group_metrics(groups)["step_groups/later_turns_nontrivial"] == 1.0
    assert tool_history(history_before(trajs[0], 2)) == tool_history(history_before(trajs[1], 2))
    verbatim = lambda history: tuple((m["role"], m["content"]) for m in history)  # noqa: E731  (the conversation's text)
    assert step_group_metrics(step_groups(trajs, 0.9, verbatim))["step_groups/later_turns_nontrivial"] == 0.0
    # TRL's parsed form of the same call (a tool_calls field, arguments as a JSON string) is the same state too
    trl = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "usual", "arguments": "{}"}}]}
    assert canonical_calls(trl) == canonical_calls({"role": "assistant", "content": tidy})


def test_every_registered_env_says_what_its_state_is():
    import helpers.worlds  # noqa: F401  (the worlds register their envs and anchors)
    from helpers.envs.anchors import registered_anchors
    from helpers.envs.registry import _REGISTRY

    ours = {name for name, factory in _REGISTRY.items() if factory.__module__.startswith("helpers.")}  # not tests' own envs
    assert {"shop", "calculator", "kuhn_poker", "bfcl_multiturn"} <= ours
    assert ours <= set(registered_anchors()), ours - set(registered_anchors())
    assert anchor_for("shop") is tool_history and anchor_for("mypkg.envs:Mine") is tool_history


def test_compute_advantages_uses_the_envs_anchor():
    """GiGPO in the trainer keys step groups on the config's env's anchor: here one that sees every state as the
    same, so every turn of the worked example is in one step group."""
    register_anchor("one-state-test", lambda history: "the only state", overwrite=True)
    config = TrainConfig(advantage="gigpo", env="one-state-test", gamma=0.5, scale_rewards="none")
    got = compute_advantages(worked_example(), config).turn_advantages[0]
    want = gigpo_advantages(worked_example(), gamma=0.5, scale_rewards="none", anchor=lambda history: 0).turn_advantages[0]
    default = gigpo_advantages(worked_example(), gamma=0.5, scale_rewards="none").turn_advantages[0]
    assert all(torch.equal(a, b) for a, b in zip(got, want)) and not all(torch.equal(a, b) for a, b in zip(got, default))


def test_omega_zero_is_grpo_and_zero_spread_needs_every_turn_flat():
    trajs = worked_example()
    grpo = group_advantages(group_rewards(trajs))
    gigpo = gigpo_advantages(trajs, step_advantage_w=0.0)
    for g, turns in enumerate(gigpo.turn_advantages[0]):
        assert torch.equal(turns, grpo.advantages[0, g].repeat(len(turns)))
    for t in trajs:
        t.reward = 0.0
    assert gigpo_advantages(trajs).zero_spread.tolist() == [True]  # all wrong: nothing to learn, at any level
    for t in trajs:
        t.reward = 1.0
    flat_outcome = gigpo_advantages(trajs, gamma=0.9)
    assert flat_outcome.advantages.eq(0).all() and not flat_outcome.zero_spread.item()  # all right: the shorter is preferred
    assert flat_outcome.turn_advantages[0][2][0] > 0 > flat_outcome.turn_advantages[0][0][0]
    assert gigpo_advantages(trajs, gamma=1.0).zero_spread.tolist() == [True]  # no discount: all equal again


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="step group"):
        gigpo_advantages(worked_example(), scale_rewards="batch")
    with pytest.raises(ValueError, match="advantage must be one of"):
        compute_advantages(worked_example(), TrainConfig(advantage="gipgo"))
    adv = gigpo_advantages(worked_example())
    adv.turn_advantages[0][0] = adv.turn_advantages[0][0][:2]
    with pytest.raises(ValueError, match="2 turn advantages for 4 turns"):
        collate(worked_example(), adv)


def test_collate_puts_each_turns_advantage_on_its_tokens():
    trajs = worked_example()
    adv = gigpo_advantages(trajs, gamma=0.5, scale_rewards="none")
    batch = collate(trajs, adv)
    assert batch.token_advantages.shape == batch.mask.shape == (3, 12)
    for n, t in enumerate(trajs):
        for (start, end), a in zip(turn_spans(t.mask), adv.turn_advantages[0][n]):
            assert batch.token_advantages[n, start:end].eq(a).all()
    assert batch.token_advantages[batch.mask == 0].eq(0).all()  # prompt, tool results and padding: none
    torch.testing.assert_close(batch.advantages, adv.advantages[0])  # the episode level stays (N,)
    assert collate(trajs, group_advantages(group_rewards(trajs))).token_advantages is None  # GRPO: as before
    assert collate(trajs, adv, skip_zero_spread=True).token_advantages.shape == (3, 12)


def test_per_token_advantages_equal_to_the_episodes_give_the_same_loss():
    """grpo_loss takes (N,) or (N, T): the same numbers on every token give the same loss and metrics."""
    gen = torch.Generator().manual_seed(0)
    logps, old = -torch.rand(3, 7, generator=gen), -torch.rand(3, 7, generator=gen)
    mask = (torch.rand(3, 7, generator=gen) > 0.3).long()
    adv = torch.tensor([0.5, -1.0, 2.0])
    for loss_type in ("grpo", "dr_grpo", "dapo"):
        a, ma = grpo_loss(logps, old, adv, mask, loss_type=loss_type, max_completion_length=7)
        b, mb = grpo_loss(logps, old, adv.unsqueeze(1).expand(3, 7), mask, loss_type=loss_type, max_completion_length=7)
        assert torch.equal(a, b) and ma == mb


def test_train_step_with_gigpo_moves_the_adapter_like_its_advantages_say(tiny, one_thread):
    """An update on the worked example: the guess's tokens (episode 1, turn 2) lose more log-prob than
    under GRPO, relative to the turns episode 1 shares with the good episode."""
    model, _ = tiny
    trajs = worked_example()
    for t in trajs:
        t.token_ids = [x + 20 for x in t.token_ids]  # real tokens of the tiny vocabulary
    batch = collate(trajs, group_advantages(group_rewards(trajs)))  # the tokens and mask, for measuring log-probs
    spans = turn_spans(trajs[1].mask)
    shared = batch.mask[1].bool() & (torch.arange(batch.mask.size(1)) < spans[1][1])  # episode 1's turns 0 and 1
    drops = {}
    for advantage in ("grpo", "gigpo"):
        torch.manual_seed(0)
        config = TrainConfig(lora_r=4, lora_alpha=8, lr=2e-2, num_generations=3, advantage=advantage, gamma=0.5)
        trainer = LoRAGRPO(copy.deepcopy(model), config)
        with torch.no_grad():
            before = trainer.logprobs(batch.input_ids, batch.mask)  # (N, T)
        for t, row in zip(trajs, before):
            t.logprobs = row[: len(t.token_ids)].tolist()  # sampled by this very policy
        assert math.isfinite(trainer.train_step(trajs)["loss"])
        with torch.no_grad():
            change = trainer.logprobs(batch.input_ids, batch.mask) - before  # (N, T)
        guess = change[1, spans[2][0]:spans[2][1]].mean()
        drops[advantage] = (guess - change[1][shared].mean()).item()
    assert drops["gigpo"] < drops["grpo"]


@pytest.mark.slow
def test_tiny_agent_with_gigpo_runs_logs_step_groups_and_resumes_exactly(tmp_path, one_thread):
    from helpers.train import main, train

    small = dict(steps=3, tasks_per_step=2, num_generations=4, eval_tasks=3, eval_subset=2, pass_k=1, eval_every=2,
                 save_every=1, log_trajectories_every=1)
    run = tmp_path / "full"
    full = main(["--preset", "tiny-agent", "--advantage", "gigpo", "--out-dir", str(run),
          *[f"--{k.replace('_', '-')}={v}" for k, v in small.items()]])
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [0, 1, 2, 3]
    assert json.loads((run / "config.json").read_text())["advantage"] == "gigpo"
    assert all(0 <= m["step_groups/turns_nontrivial"] <= 1 and m["step_groups/size_mean"] >= 1 for m in lines[1:])
    assert (run / "summary.json").exists() and (run / "curves.png").exists()

    config = get_preset("tiny-agent", advantage="gigpo", out_dir=str(tmp_path / "killed"), **small)

    class KillAt(LiveCurves):
        def update(self, step, metrics):
            if step == 2:
                raise KeyboardInterrupt
            super().update(step, metrics)

    with pytest.raises(KeyboardInterrupt):
        train(config, live=KillAt(None, notebook=False))
    resumed = train(replace(config, resume=True), live=LiveCurves(None, notebook=False))
    timing = ("t_rollout", "t_reward", "t_update", "t_eval", "t_save", "tokens_per_s")
    strip = lambda history: [{k: v for k, v in m.items() if k not in timing} for m in history]  # noqa: E731
    assert strip(resumed.history) == strip(full.history)


def test_step_group_table_lists_the_nontrivial_groups():
    table = step_group_table(worked_example(), gamma=0.5, scale_rewards="none")
    lines = table.splitlines()
    assert len(lines) == 4 and lines[3].split()[:2] == ["order-1", "2"]
    assert "0:2 -> 0.500, +0.25" in lines[3] and "1:2 -> 0.000, -0.25" in lines[3]
    assert len(step_group_table(worked_example(), 0.5, nontrivial_only=False).splitlines()) == 6


def test_the_advantage_view_shows_both_methods_turn_by_turn():
    from helpers.viewer import ADVANTAGE_COLOURS, advantages_html
    from helpers.worlds.tinymodel import load_tokenizer

    traj = worked_example()[1]
    turns = gigpo_advantages(worked_example(), gamma=0.5, scale_rewards="none").turn_advantages[0][1]
    page = advantages_html(traj, load_tokenizer(), {"GRPO": -1 / 3, "GiGPO": turns})
    assert page.count("[A ") == 3 and "[A -0.58]" in page  # a badge per GiGPO turn (-1/3 - 1/4 on the guess); none for GRPO
    assert "advantage <b>-0.33</b>" in page and "advantage <b>-0.38 -0.46 -0.58</b>" in page
    assert page.count(ADVANTAGE_COLOURS[-1]) == 2 * traj.num_generated + 1  # every policy token red in both (+ the legend)
    with pytest.raises(ValueError, match="2 turn advantages for the 3 turns"):
        advantages_html(traj, load_tokenizer(), {"GiGPO": turns[:2]})
