"""Live training curves: one figure updated in place in a notebook, console lines elsewhere.

    live = LiveCurves(run_dir)          # picks notebook or console mode by itself
    for step in ...:
        live.update(step, metrics)      # metrics: the dict the training loop logs
    live.close()                        # saves run_dir/curves.png

In a notebook the figure is shown once with ``display(..., display_id=True)`` and
then replaced through its handle (``handle.update``), so the cell shows one figure
that changes, not a new image per step and not a flickering ``clear_output``. A
second handle holds the latest one-line summary under it.

Outside a notebook (``python -m helpers.train``) every update prints one line.
``Reporters`` also sends the metrics to TensorBoard or trackio when a run asks for them
(``report_to``), under the same names.

Simplification: the figure is redrawn from scratch on every update (six small
line plots: matplotlib's text layout and PNG encoding), so in a notebook each training
step takes longer than on the command line, which draws the figure once, at the end
(``curves.png``); blitting would cut it, at the price of its complexity.
"""

from __future__ import annotations

import io
import math
from dataclasses import asdict
from pathlib import Path


# (panel title, y-axis label, [(metric key, legend label), ...]). The training loop
# logs these keys; "eval/..." keys appear only on evaluation steps (sparse points).
# "eval/pass@k" stands for the run's pass@k, whatever its k (the loop logs e.g. "eval/pass@4").
PANELS = [
    ("training reward", "mean reward", [("reward", "train samples")]),
    ("held-out success", "success rate", [("eval/success", "greedy"), ("eval/pass@1", "sampled (one try)"),
                                          ("eval/pass@k", "pass@k (any of k tries)")]),
    ("tool calls and turns per episode", "per episode", [("tool_calls", "tool calls (train)"), ("eval/tool_calls", "tool calls (held-out)"),
                                                         ("turns", "turns (train)"), ("eval/turns", "turns (held-out)")]),
    ("KL to reference", "KL", [("kl", "k3 estimate")]),
    ("completion length", "tokens", [("completions/mean_length", "policy tokens per episode")]),
    ("step time split", "seconds", [("t_rollout", "rollout"), ("t_reward", "reward"), ("t_update", "update")]),
]

# Keys of the one-line console summary, with their print formats, in order.
LINE_FIELDS = [
    ("reward", "reward {:.3f}"),
    ("success", "success {:.2f}"),
    ("tool_calls", "tools {:.2f}"),
    ("kl", "kl {:.4f}"),
    ("clip_ratio/region_mean", "clip {:.3f}"),
    ("completions/mean_length", "len {:.1f}"),
    ("eval/success", "EVAL greedy {:.3f}"),
    ("eval/pass@1", "sampled {:.3f}"),
    ("eval/tool_calls", "tools {:.2f}"),
    ("eval/n", "n={}"),  # held-out tasks: all eval_tasks, or eval_subset between the first and the last evaluation
]


def series_key(key: str) -> str:
    """The curve a logged key belongs to: ``eval/pass@4`` -> ``eval/pass@k``; other keys are their own."""
    if key.startswith("eval/pass@") and key != "eval/pass@1":
        return "eval/pass@k"
    return key


def in_notebook() -> bool:
    """True inside a Jupyter kernel (including nbval's), False in a terminal or plain Python."""
    from IPython import get_ipython  # IPython and matplotlib are imported where a notebook or a figure needs them

    shell = get_ipython()
    return shell is not None and shell.__class__.__name__ == "ZMQInteractiveShell"


def format_line(step: int, metrics: dict, total_steps: int | None = None, fields: list = LINE_FIELDS) -> str:
    """One console line for a step: the headline metrics and the time split.

    >>> format_line(3, {"reward": 0.5, "t_rollout": 1.0, "t_reward": 0.01, "t_update": 0.5}, 10)
    'step    3/10 | reward 0.500 | time 1.5s (rollout 1.00 reward 0.01 update 0.50)'
    """
    head = f"step {step:4d}" + (f"/{total_steps}" if total_steps else "")
    parts = [head]
    for key, fmt in fields:
        value = metrics.get(key)
        if value is not None and not (isinstance(value, float) and math.isnan(value)):
            parts.append(fmt.format(value))
    times = [metrics.get(k) for k in ("t_rollout", "t_reward", "t_update")]
    if all(t is not None for t in times):
        parts.append(f"time {sum(times):.1f}s (rollout {times[0]:.2f} reward {times[1]:.2f} update {times[2]:.2f})")
    return " | ".join(parts)


class LiveCurves:
    """Collects metrics per step and shows them as curves (notebook) or lines (console).

    run_dir:      where ``close()`` saves ``curves.png`` (None: do not save)
    notebook:     force a mode; None detects it with ``in_notebook()``
    total_steps:  printed as ``step 3/60``
    title:        a label over the figure and before every line (e.g. "CPU SMOKE RUN"), so no picture of a
                  run can be taken for another kind of run
    panels, line_fields: what to draw and print (default ``PANELS`` and ``LINE_FIELDS``; self-play has its own)

    Taught in notebooks/06_training_loop.ipynb §2.
    """

    def __init__(self, run_dir: str | Path | None = None, notebook: bool | None = None, total_steps: int | None = None,
                 title: str | None = None, panels: list = PANELS, line_fields: list = LINE_FIELDS):
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.notebook = in_notebook() if notebook is None else notebook
        self.total_steps = total_steps
        self.title = title
        self.panels, self.line_fields = panels, line_fields
        self.history: dict[str, list[tuple[int, float]]] = {key: [] for _, _, series in panels for key, _ in series}
        self._fig = None
        self._fig_handle = None
        self._text_handle = None

    def record(self, step: int, metrics: dict) -> None:
        """Add this step's metrics to the curves without showing anything (a resumed run replays its history)."""
        for key, value in metrics.items():
            curve = series_key(key)
            if curve in self.history and isinstance(value, (int, float)) and not math.isnan(value):
                self.history[curve].append((step, float(value)))

    def update(self, step: int, metrics: dict) -> None:
        """Record this step's metrics and refresh the display."""
        self.record(step, metrics)
        line = (f"{self.title} | " if self.title else "") + format_line(step, metrics, self.total_steps, self.line_fields)
        if self.notebook:
            self._show(line)
        else:
            print(line, flush=True)

    def figure(self):
        """Draw the six panels from the history and return the matplotlib figure."""
        from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global state

        if self._fig is None:
            self._fig = Figure(figsize=(13, 6.5))
            self._fig.subplots(2, 3)
        for ax, (title, ylabel, series) in zip(self._fig.axes, self.panels):
            ax.clear()
            for key, label in series:
                points = self.history[key]
                if points:
                    xs, ys = zip(*points)
                    ax.plot(xs, ys, marker="o" if len(points) < 30 else None, markersize=3, label=label)
            if len(series) > 1 and ax.lines:
                ax.legend(fontsize=8)
            ax.set_title(title, fontsize=10)
            ax.set_xlabel("step")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
            if ylabel in ("success rate", "fraction"):
                ax.set_ylim(-0.02, 1.02)
        if self.title:
            self._fig.suptitle(self.title, fontsize=11)
        self._fig.tight_layout()
        return self._fig

    def png(self) -> bytes:
        """The current figure as PNG bytes (what the notebook display shows)."""
        buffer = io.BytesIO()
        self.figure().savefig(buffer, format="png", dpi=80)
        return buffer.getvalue()

    def _show(self, line: str) -> None:
        from IPython.display import Image, display

        image = Image(data=self.png(), format="png")
        if self._fig_handle is None:
            self._fig_handle = display(image, display_id=True)
            self._text_handle = display(line, display_id=True)
        else:
            self._fig_handle.update(image)
            self._text_handle.update(line)

    def save(self, path: str | Path | None = None) -> Path | None:
        """Save the curves as PNG (default ``run_dir/curves.png``) and return the path."""
        path = Path(path) if path is not None else (self.run_dir / "curves.png" if self.run_dir else None)
        if path is None:
            return None
        path.parent.mkdir(parents=True, exist_ok=True)
        self.figure().savefig(path, dpi=100)
        return path

    def close(self) -> Path | None:
        """End of run: save the PNG. The notebook figure stays as last drawn."""
        return self.save()


class Reporters:
    """Optional TensorBoard / trackio logging, used only when asked for and installed."""

    def __init__(self, names: list[str], run_dir: Path, config):
        self.tb = self.trackio = None
        for name in names:
            try:
                if name == "tensorboard":  # optional packages: imported only when asked for
                    from torch.utils.tensorboard import SummaryWriter

                    self.tb = SummaryWriter(str(run_dir / "tensorboard"))
                elif name == "trackio":
                    import trackio

                    trackio.init(project="agentic-rl-workbook", name=run_dir.name, config=asdict(config))
                    self.trackio = trackio
                else:
                    raise ValueError(f"unknown reporter {name!r}; choose tensorboard or trackio")
            except ImportError:
                print(f"report_to: {name} is not installed, skipping it (pip install {name})")

    def log(self, metrics: dict) -> None:
        numbers = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and k != "step"}
        if self.tb is not None:
            for key, value in numbers.items():
                self.tb.add_scalar(key, value, metrics["step"])
        if self.trackio is not None:
            self.trackio.log(numbers, step=metrics["step"])

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.trackio is not None:
            self.trackio.finish()
