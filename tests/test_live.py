"""Tests for helpers.live: console fallback, in-place notebook updates, the saved PNG."""

import IPython.display

from helpers.live import LiveCurves, format_line, in_notebook

STEP = {"reward": 0.5, "success": 0.5, "tool_calls": 0.25, "kl": 0.01, "completions/mean_length": 30.0,
        "t_rollout": 2.0, "t_reward": 0.01, "t_update": 1.0}


def test_console_fallback_prints_one_line_per_step(capsys, tmp_path):
    assert not in_notebook()  # pytest is not a Jupyter kernel
    live = LiveCurves(tmp_path, total_steps=2)
    assert live.notebook is False
    live.update(0, {"eval/success": 0.25, "eval/tool_calls": 0.5, "eval/pass@4": 0.75})
    live.update(1, STEP)
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("step    0/2") and "EVAL greedy 0.250" in lines[0] and "tools 0.50" in lines[0]
    assert "reward 0.500" in lines[1] and "rollout 2.00" in lines[1] and "tools 0.25" in lines[1]
    assert live.history["eval/pass@k"] == [(0, 0.75)]  # pass@4 is drawn as the pass@k curve
    png = live.close()
    assert png == tmp_path / "curves.png" and png.read_bytes()[:4] == b"\x89PNG"


def test_notebook_mode_updates_one_display_in_place(monkeypatch):
    shown, updates = [], []

    class Handle:
        def update(self, obj):
            updates.append(obj)

    def fake_display(obj, display_id=False):
        assert display_id is True  # a handle, so later steps replace the output instead of adding one
        shown.append(obj)
        return Handle()

    monkeypatch.setattr(IPython.display, "display", fake_display)
    live = LiveCurves(None, notebook=True)
    for step in range(3):
        live.update(step, {**STEP, "reward": step / 2})
    assert len(shown) == 2  # the figure and the text line, displayed once
    assert len(updates) == 4  # then both replaced at each later step
    assert isinstance(shown[0], IPython.display.Image)
    assert [y for _, y in live.history["reward"]] == [0.0, 0.5, 1.0]
    assert live.close() is None  # no run folder: nothing saved


def test_record_replays_history_silently(capsys):
    live = LiveCurves(None, notebook=False)
    live.record(4, STEP)
    assert capsys.readouterr().out == "" and live.history["kl"] == [(4, 0.01)]


def test_format_line_skips_missing_and_nan():
    line = format_line(7, {"reward": 0.1, "kl": float("nan")})
    assert line == "step    7 | reward 0.100"
