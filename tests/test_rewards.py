"""Tests for helpers.rewards: rule rewards on hand-made trajectories, hybrids, errors, TRL adapter, report."""

import functools
from fractions import Fraction

import pytest

from helpers import rewards as R
from helpers.config import TrainConfig
from helpers.data import Task
from helpers.ecosystem.trl_bridge import reward_funcs, to_trl_reward_func
from helpers.ecosystem.trl_bridge import trajectory_from_text as to_trl_trajectory
from helpers.formats import format_number, format_tool_call
from helpers.paths import GSM8K_SAMPLE
from helpers.rollout import Trajectory
from helpers.viewer import advantage_table, reward_panel, widgets_frontend
from helpers.worlds.gsm8k.tasks import load_gsm8k


def make_traj(turns, answer="1000", info=None, task_id="t0", group=0, mask=None):
    """A trajectory from a list of turns: str = assistant message, ("tool", text) = tool result."""
    prompt = [{"role": "system", "content": "Solve it."}, {"role": "user", "content": "What is 10 * 100?"}]
    messages = list(prompt)
    for turn in turns:
        if isinstance(turn, tuple):
            messages.append({"role": turn[0], "content": turn[1]})
        else:
            messages.append({"role": "assistant", "content": turn})
    mask = mask if mask is not None else []
    return Trajectory(
        task=Task(task_id, prompt, answer), group=group, token_ids=list(range(len(mask))), mask=mask,
        logprobs=[0.0] * len(mask), prompt_len=0, info=dict(info or {}), messages=messages,
        turns=sum(not isinstance(t, tuple) for t in turns),
    )


CALL = format_tool_call("calculator", {"expression": "10*100"})


# --- correct ---------------------------------------------------------------------------------


@pytest.mark.parametrize("written", ["1,000", "$1000.00", "1000.", r"\boxed{1000}", "<answer>1,000</answer>", "<answer>$1000.00</answer>"])
def test_correct_accepts_every_way_of_writing_1000(written):
    traj = make_traj([f"Ten hundreds make {written}"])
    assert R.correct(traj) == 1.0
    assert R.check_answer(f"so {written}", "1000")["verdict"] == "correct"


@pytest.mark.parametrize("written", ["1,001", "$100.00", "999.", r"\boxed{10000}"])
def test_correct_rejects_wrong_numbers(written):
    assert R.correct(make_traj([f"It is {written}"])) == 0.0
    assert R.check_answer(written, "1000")["verdict"] == "wrong_number"


def test_correct_verdicts_and_reference_forms():
    assert R.check_answer("I don't know", "1000")["verdict"] == "no_answer"
    assert R.check_answer("42", None)["verdict"] == "no_reference"
    assert R.check_answer("<answer>1,000</answer>", "Work...\n#### 1,000")["correct"]  # a whole GSM8K solution as reference
    # not plain numbers: math-verify decides
    assert R.check_answer(r"\boxed{\frac{1}{2}}", "0.5")["correct"]
    assert not R.check_answer(r"\boxed{\frac{1}{3}}", "0.5")["correct"]


def test_correct_prefers_env_verdict():
    # the text says 1000 but the env (which parses strictly) said wrong: the env wins
    traj = make_traj(["1000"], info={"correct": False, "verdict": "no_answer", "predicted": None})
    assert R.correct(traj) == 0.0
    assert R.correct(make_traj(["nothing"], info={"correct": True, "verdict": "correct"})) == 1.0


def _written_forms(value: Fraction) -> list[str]:
    """The gold number as people and models write it: 1,000 / $1000.00 / 1000. / \\boxed{1000}."""
    sign, v = ("-" if value < 0 else ""), abs(value)
    plain = format_number(v)
    whole, _, frac = plain.partition(".")
    commas = f"{int(whole):,}" + (f".{frac}" if frac else "")
    money = f"{float(v):.2f}" if len(frac) <= 2 else plain
    return [sign + commas, f"{sign}${money}", f"{sign}{plain}.", rf"\boxed{{{sign}{plain}}}"]


def test_gsm8k_sample_outcome_check_agrees_with_gold_in_every_form():
    tasks = load_gsm8k("train", source=GSM8K_SAMPLE)
    assert len(tasks) >= 20
    checked = 0
    for task in tasks:
        gold = Fraction(task.answer)
        for right, wrong in zip(_written_forms(gold), _written_forms(gold + 1)):
            for template in ("So the answer is {}", "<answer>{}</answer>"):
                assert R.check_answer(template.format(right), task.answer)["correct"], (task.id, right)
                assert not R.check_answer(template.format(wrong), task.answer)["correct"], (task.id, wrong)
                # the raw GSM8K solution (with #### N) works as the reference too
                assert R.check_answer(template.format(right), task.metadata["solution"])["correct"], (task.id, right)
                checked += 1
    assert checked == 8 * len(tasks)


# --- shaping rewards ------------------------------------------------------------------------


def test_format_needs_exactly_one_nonempty_tag():
    assert R.strict_format(make_traj(["<answer>7</answer>"])) == 1.0
    assert R.strict_format(make_traj(["<answer>7</answer> or <answer>8</answer>"])) == 0.0
    assert R.strict_format(make_traj(["<answer>7</answer>", "<answer>7</answer>"])) == 0.0  # across turns too
    assert R.strict_format(make_traj(["<answer> </answer>"])) == 0.0
    assert R.strict_format(make_traj([r"\boxed{1000}"])) == 0.0
    assert R.strict_format(make_traj(["<answer>7"])) == 0.0


def test_tool_use_needs_a_call_whose_result_is_the_answer():
    used = make_traj([CALL, ("tool", "1000"), "<answer>1,000</answer>"])
    assert R.tool_use(used) == 1.0
    assert R.tool_use(make_traj([CALL, ("tool", "1000"), "<answer>999</answer>"])) == 0.0  # called, ignored the result
    assert R.tool_use(make_traj(["<answer>1000</answer>"])) == 0.0  # no call
    assert R.tool_use(make_traj([CALL, ("tool", "error: bad expression"), "<answer>1000</answer>"])) == 0.0
    assert used.tool_calls == 2 - 1  # counted from the text
    assert make_traj([CALL], info={"tool_calls": 5}).tool_calls == 5  # the env's count wins


def test_length_penalty_counts_generated_tokens():
    traj = make_traj(["<answer>1000</answer>"], mask=[0] * 10 + [1] * 64)
    assert R.length_penalty(traj) == pytest.approx(-64 / 256)
    assert functools.partial(R.length_penalty, budget=32)(traj) == -1.0  # capped at -1
    assert R.length_penalty(make_traj(["one two three"])) == pytest.approx(-3 / 256)  # no tokens: words


def test_step_cost_and_loophole_bonus():
    looping = make_traj([CALL, ("tool", "1000"), CALL, ("tool", "1000"), CALL, ("tool", "1000")])
    assert R.step_cost(make_traj(["<answer>1000</answer>"])) == 0.0
    assert R.step_cost(looping) == -2.0
    assert R.tool_call_bonus(looping) == 3.0 and R.correct(looping) == 0.0


# --- hybrids, names, errors ------------------------------------------------------------------


def test_combine_by_name_logs_every_part_and_weights_the_sum():
    traj = make_traj([CALL, ("tool", "1000"), "<answer>1000</answer>"])
    reward = R.combine({"correct": 1.0, "format": 0.1, "tool_use": 0.1, "step_cost": 0.05})
    assert reward(traj) == pytest.approx(1.0 + 0.1 + 0.1 - 0.05)
    assert traj.reward == pytest.approx(1.15)
    assert traj.reward_parts == {"correct": 1.0, "format": 1.0, "tool_use": 1.0, "step_cost": -1.0}
    with pytest.raises(KeyError, match="unknown reward 'nope'"):
        R.combine({"nope": 1.0})


def test_combine_functions_and_dict_valued_rewards():
    def shaped(traj):
        return {"a": 1.0, "b": 2.0}

    reward = R.combine({shaped: 0.5, R.correct: 1.0})
    traj = make_traj(["<answer>3</answer>"])
    assert reward(traj) == pytest.approx(1.5)
    assert traj.reward_parts == {"shaped/a": 1.0, "shaped/b": 2.0, "correct": 0.0}


def test_reward_that_raises_is_caught_counted_and_reported():
    def broken(traj):
        if traj.group == 1:
            raise ValueError("cannot score this one")
        return 1.0

    trajs = [make_traj(["<answer>1000</answer>"], group=g) for g in range(3)]
    reward = R.combine({"correct": 1.0, broken: 1.0})
    assert R.score_trajectories(trajs, reward) == [2.0, 1.0, 2.0]  # the raising part counts 0
    assert reward.errors["broken"] == 1
    assert "ValueError: cannot score this one" in trajs[1].info["reward_errors"]["broken"]
    report = R.reward_report(trajs)
    assert report.errors == [("t0", 1, "broken", trajs[1].info["reward_errors"]["broken"])]
    assert "REWARD ERRORS: 1" in str(report)
    # a non-number return is an error too
    assert R.safe_call(lambda t: "high", "text", trajs[0])[0] == {"text": 0.0}
    parts, error = R.safe_call(lambda t: float("nan"), "nan", trajs[0])
    assert parts == {"nan": 0.0} and "not a finite number" in error


def test_an_env_with_get_reward_adds_a_part_named_after_its_class():
    """As TRL adds an environment's get_reward to reward_funcs: the class's name, weight 1, whatever the preset says."""
    owned = make_traj(["<answer>1000</answer>"], info={"env_reward": {"Shop": 0.25}})
    plain = make_traj(["<answer>1000</answer>"])
    failed = make_traj(["<answer>1000</answer>"], info={"env_reward": {"Shop": None}, "env_reward_error": "TypeError: no number"})
    reward = R.combine({"correct": 2.0})
    assert R.score_trajectories([owned, plain, failed], reward) == [2.25, 2.0, 2.0]
    assert owned.reward_parts == {"correct": 1.0, "Shop": 0.25} and plain.reward_parts == {"correct": 1.0}
    assert failed.reward_parts == {"correct": 1.0, "Shop": 0.0} and reward.errors["Shop"] == 1  # a failed call: an error scored 0
    assert "RuntimeError: TypeError: no number" in failed.info["reward_errors"]["Shop"]
    assert R.reward_report([owned, plain]).metrics()["rewards/Shop/mean"] == pytest.approx(0.125)  # logged under TRL's name


def test_config_names_resolve():
    reward = R.as_reward(TrainConfig().rewards)
    assert set(reward.weights) == set(TrainConfig().rewards)


# --- TRL adapter -----------------------------------------------------------------------------


def test_trl_adapter_plain_and_conversational():
    f = to_trl_reward_func("correct")
    assert f.__name__ == "correct"
    # plain-text dataset: completions are strings; dataset columns come as keyword lists
    out = f(prompts=["q1", "q2"], completions=["<answer>1,000</answer>", "I think 7"], completion_ids=[[1, 2], [3]],
            answer=["1000", "#### 8"], trainer_state=None, log_extra=None, log_metric=None)
    assert out == [1.0, 0.0]
    # chat dataset with tools: completions are message lists, as TRL's tool loop builds them
    prompts = [[{"role": "user", "content": "What is 10*100?"}]] * 2
    completions = [
        [{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "calculator", "arguments": {"expression": "10*100"}}}]},
         {"role": "tool", "name": "calculator", "content": "1000"}, {"role": "assistant", "content": "<answer>1000</answer>"}],
        [{"role": "assistant", "content": "<answer>1000</answer>"}],
    ]
    assert to_trl_reward_func(R.tool_use)(prompts, completions, answer=["1000", "1000"]) == [1.0, 0.0]
    assert to_trl_reward_func("format")(prompts, completions) == [1.0, 1.0]
    # the outcome is judged on the last turn, as Episode judges it: an answer beside an earlier call does not count,
    # and an episode cut at TRL's tool-calling limit (its last turn a call) has no answer
    call = {"role": "assistant", "content": "<answer>1000</answer>", "tool_calls": completions[0][0]["tool_calls"]}
    reply = {"role": "tool", "name": "calculator", "content": "1000"}
    late = [[call, reply, {"role": "assistant", "content": "I am not sure."}], [call, reply, call],
            [call, reply, {"role": "assistant", "content": "So: <answer>1000</answer>"}]]
    assert f([prompts[0]] * 3, late, answer=["1000"] * 3) == [0.0, 0.0, 1.0]
    assert R.outcome(to_trl_trajectory(prompts[0], late[1]))["verdict"] == "no_answer"
    # a raising reward returns 0 for the row instead of crashing the trainer
    assert to_trl_reward_func(lambda t: 1 / 0)(["q"], ["a"]) == [0.0]


def test_trl_reward_funcs_follow_the_config():
    funcs, weights = reward_funcs(TrainConfig(rewards={"correct": 1.0, "format": 0.1}))
    assert [f.__name__ for f in funcs] == ["correct", "format"] and weights == [1.0, 0.1]


# --- bad reward values: counted errors, never a poisoned batch -------------------------------------


@pytest.mark.parametrize("value", ["0.5", True, None, float("nan"), float("inf")])
def test_a_reward_that_is_not_a_finite_number_is_an_error_scored_zero(value):
    reward = R.combine({lambda t: value: 1.0})
    traj = make_traj(["<answer>1000</answer>"])
    assert reward(traj) == 0.0 and sum(reward.errors.values()) == 1
    assert "reward_errors" in traj.info


def test_finite_parts_whose_weighted_sum_overflows_are_an_error_scored_zero():
    huge = lambda t: 1e308  # noqa: E731
    huge.name = "huge"
    reward = R.combine({huge: 2.0})
    traj = make_traj(["<answer>1000</answer>"])
    assert reward(traj) == 0.0 and reward.errors["reward"] == 1
    assert "OverflowError" in traj.info["reward_errors"]["reward"]


@pytest.mark.parametrize("weight", [float("nan"), float("inf"), "1"])
def test_a_weight_that_is_not_a_finite_number_is_refused(weight):
    with pytest.raises(ValueError, match="weight of reward 'correct'"):
        R.combine({"correct": weight})


# --- diagnostics -----------------------------------------------------------------------------


def test_report_flat_groups_and_all_zero_reason():
    trajs = [make_traj(["I am not sure."], task_id=f"t{i // 4}", group=i % 4,
                       info={"correct": False, "verdict": "no_answer", "stop_reason": "max_steps"}) for i in range(8)]
    report = R.reward_report(trajs, reward="correct")
    assert report.all_zero and report.flat_groups == 2 and report.flat_fraction == 1.0
    assert report.wrong_reasons.most_common(1)[0] == ("no answer found (stopped by max_steps)", 8)
    text = str(report)
    assert "no answer found (stopped by max_steps) in 100% of trajectories" in text
    assert "I am not sure." in text  # an example is shown


def test_report_mixed_batch():
    trajs = [make_traj(["<answer>1000</answer>"], task_id="a", group=0), make_traj(["<answer>7</answer>"], task_id="a", group=1),
             make_traj(["<answer>7</answer>"], task_id="b", group=0), make_traj(["<answer>8</answer>"], task_id="b", group=1)]
    report = R.reward_report(trajs, reward={"correct": 1.0, "format": 0.1})
    assert report.n_groups == 2 and report.flat_groups == 1  # group b: both wrong, both formatted
    assert report.parts["correct"] == [1.0, 0.0, 0.0, 0.0]
    assert report.wrong_reasons == {"answer found, wrong number": 3}
    assert not report.all_zero


# --- advantages and the panel's static fallback -------------------------------------------------


def test_advantage_table_marks_flat_groups():
    trajs = [make_traj(["<answer>1000</answer>"], task_id="a", group=0), make_traj(["<answer>7</answer>"], task_id="a", group=1),
             make_traj(["<answer>7</answer>"], task_id="b", group=0), make_traj(["<answer>8</answer>"], task_id="b", group=1)]
    R.score_trajectories(trajs, "correct")
    lines = advantage_table(trajs).splitlines()
    assert lines[1].split()[:3] == ["a", "1.00", "0.00"] and "+0.71 -0.71" in lines[1] and "(flat)" not in lines[1]
    assert lines[2].endswith("(flat)")


def test_reward_panel_without_frontend_prints_static_output(monkeypatch, capsys):
    import matplotlib

    matplotlib.use("Agg")
    monkeypatch.setenv("WORKBOOK_WIDGETS", "0")
    assert not widgets_frontend()
    trajs = [make_traj([f"<answer>{n}</answer>"], task_id="a", group=g) for g, n in enumerate([1000, 5])]
    assert reward_panel(trajs, {"correct": 1.0, "format": 0.5}) is None
    out = capsys.readouterr().out
    assert "reward = 1*correct, 0.5*format" in out and "+0.71" in out
    assert [t.reward for t in trajs] == [1.5, 0.5]


# --- every part is total: whatever a reward does, a counted error and 0, never an exception --------


class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no message for you")


def raising(error):
    def reward(traj):
        raise error
    reward.__name__ = f"raises_{type(error).__name__}"
    return reward


@pytest.mark.parametrize("error", [ValueError("bad"), Unprintable(), SystemExit(3), RecursionError(), MemoryError(),
                                   type("Custom", (BaseException,), {})()], ids=lambda e: type(e).__name__)
def test_a_reward_that_raises_anything_is_a_counted_error_scored_zero(error):
    fn = raising(error)
    trajs = [make_traj(["<answer>1000</answer>"], group=g) for g in range(2)]
    reward = R.combine({"correct": 1.0, fn: 1.0})
    assert R.score_trajectories(trajs, reward) == [1.0, 1.0]
    assert reward.errors[fn.__name__] == 2
    message = trajs[0].info["reward_errors"][fn.__name__]
    assert message.startswith(type(error).__name__) and len(message) < 400
    if isinstance(error, Unprintable):
        assert message.startswith("Unprintable: <message cannot be printed>")
    assert to_trl_reward_func(fn)(["q"], ["<answer>1000</answer>"], answer=["1000"]) == [0.0]  # the TRL adapter's path


def test_ctrl_c_still_stops_scoring():
    with pytest.raises(KeyboardInterrupt):
        R.score_trajectories([make_traj(["x"])], raising(KeyboardInterrupt()))


def test_a_reward_that_changes_the_trajectory_is_an_error_and_the_change_is_undone():
    def cheat(traj):  # tells `correct`, which runs next, that the env judged the answer right
        traj.info["verdict"], traj.info["correct"] = "correct", True
        traj.messages[-1]["content"] = "<answer>1000</answer>"
        return 1.0

    def rewrites_and_raises(traj):
        traj.messages.append({"role": "assistant", "content": "more"})
        raise ValueError("oops")

    trajs = [make_traj(["<answer>7</answer>"], info={"verdict": "wrong_number", "correct": False})]
    reward = R.combine({cheat: 1.0, rewrites_and_raises: 1.0, "correct": 1.0})
    assert R.score_trajectories(trajs, reward) == [0.0]
    traj = trajs[0]
    assert traj.reward_parts == {"cheat": 0.0, "rewrites_and_raises": 0.0, "correct": 0.0}
    assert "changed the trajectory" in traj.info["reward_errors"]["cheat"]
    assert traj.info["reward_errors"]["rewrites_and_raises"].startswith("ValueError: oops")
    assert traj.messages[-1]["content"] == "<answer>7</answer>" and len(traj.messages) == 3 and traj.info["verdict"] == "wrong_number"
    assert reward.errors == {"cheat": 1, "rewrites_and_raises": 1}


def test_a_batch_part_whose_prepare_raises_is_counted_and_scored_alone():
    class Batchy:
        name = "batchy"

        def prepare(self, trajs):
            raise Unprintable()

        def __call__(self, traj):
            return 0.5

    reward = R.combine({Batchy(): 1.0, "correct": 1.0})
    assert R.score_trajectories([make_traj(["<answer>1000</answer>"])], reward) == [1.5]
    assert reward.errors == {"batchy": 1}


def test_odd_values_and_unprintable_reprs_are_errors_not_crashes():
    class Weird:
        def __float__(self):
            raise Unprintable()

        def __repr__(self):
            raise Unprintable()

    traj = make_traj(["<answer>1000</answer>"])
    for value in [Weird(), {"a": Weird()}, {Weird(): 1.0}, [1.0]]:
        parts, error = R.safe_call(lambda t: value, "odd", traj)
        assert parts == {"odd": 0.0} and error
