"""A run continued for more steps: ``--resume true --steps N`` with N larger than the run's steps.

The schedule is re-planned for the new total from the step reached (said in one line, recorded in
config.json), the curves and the summary continue; evaluation settings may change on resume; a change
of what is trained (the learning rate) is still refused in one line.
"""

import json

import pytest

from helpers.config import get_preset
from helpers.live import LiveCurves
from helpers.train import main, train


def flags(out_dir, *more):
    # "length" keeps rewards spread within groups whatever the checkpoint's skill, so every step updates the adapter.
    return ["--preset", "tiny-cpu", "--tasks-per-step", "2", "--num-generations", "4", "--max-new-tokens", "16",
            "--max-total-tokens", "128", "--eval-tasks", "2", "--pass-k", "0", "--eval-every", "0", "--save-every", "1",
            "--rewards", "correct=1.0,length=1.0", "--lr", "1e-3", "--out-dir", str(out_dir), *more]


def test_a_two_step_run_resumed_with_more_steps_continues_to_step_four(tmp_path, one_thread, capsys, monkeypatch):
    monkeypatch.setattr("helpers.loop.LiveCurves", lambda *a, **k: LiveCurves(None, notebook=False))
    main(flags(tmp_path / "run", "--steps", "2"))
    capsys.readouterr()
    resumed = main(flags(tmp_path / "run", "--steps", "4", "--resume", "true", "--eval-every", "3"))  # --eval-every changes too
    out = capsys.readouterr().out
    line = ("resume: steps 2 -> 4: the learning-rate schedule is re-planned for 4 steps from step 2 "
            "(linear decay to 0 at step 4); step 3 trains at lr 0.0005")
    assert line in out.splitlines()

    # The curves continue: one line per step 0..4, the resumed run's first two from the checkpoint.
    run = resumed.run_dir
    steps = [json.loads(row)["step"] for row in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2, 3, 4] and [m["step"] for m in resumed.history] == steps
    lrs = [m["learning_rate"] for m in resumed.history[1:]]
    assert lrs[:2] == pytest.approx([1e-3, 5e-4])  # the 2-step plan: 1e-3, then half of it
    assert lrs[2:] == pytest.approx([5e-4, 2.5e-4])  # the 4-step plan from step 2 on: (4-2)/4, (4-3)/4 of 1e-3
    assert "eval/success" in resumed.history[3] and "eval/success" in resumed.history[4]  # the new eval_every, and the end
    assert (run / "checkpoint-4").is_dir()

    config = json.loads((run / "config.json").read_text())
    assert config["steps"] == 4 and config["eval_every"] == 3
    (replan,) = config["schedule_replans"]
    assert replan["at_step"] == 2 and replan["steps_before"] == 2 and replan["steps"] == 4 and replan["line"] in line
    summary = json.loads((run / "summary.json").read_text())
    assert summary["before"] == resumed.before and summary["after"]["n"] == 2


def test_a_resume_that_changes_the_learning_rate_is_refused_in_one_line(tmp_path, one_thread, monkeypatch):
    monkeypatch.setattr("helpers.loop.LiveCurves", lambda *a, **k: LiveCurves(None, notebook=False))
    main(flags(tmp_path / "run", "--steps", "1"))
    before = (tmp_path / "run" / "config.json").read_text()
    with pytest.raises(SystemExit) as refused:
        main(flags(tmp_path / "run", "--steps", "2", "--resume", "true", "--lr", "5e-3"))
    message = str(refused.value)
    assert "lr 0.001 -> 0.005" in message and "steps" not in message.split("settings (")[1] and "\n" not in message
    with pytest.raises(SystemExit) as shorter:  # fewer steps than the run planned: not a continuation
        main(flags(tmp_path / "run", "--steps", "0", "--resume", "true"))
    assert "steps 1 -> 0" in str(shorter.value)
    assert (tmp_path / "run" / "config.json").read_text() == before


def test_the_same_steps_resume_records_no_replan(tmp_path, one_thread):
    config = get_preset("tiny-cpu", steps=1, tasks_per_step=2, num_generations=2, max_new_tokens=8, max_total_tokens=96,
                        eval_tasks=1, pass_k=0, save_every=1, out_dir=str(tmp_path / "run"))
    train(config, live=LiveCurves(None, notebook=False))
    train(get_preset("tiny-cpu", **{**config.__dict__, "resume": True, "pass_k": 1}), live=LiveCurves(None, notebook=False))
    assert "schedule_replans" not in json.loads((tmp_path / "run" / "config.json").read_text())
