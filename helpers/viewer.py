"""Pictures of trajectories and rewards, for notebooks: the mask made visible, the reward panel.

    show_trajectory(traj, tokenizer)     # one episode, every token coloured by who wrote it
    show_group(trajs, tokenizer)         # the G samples of a task: a summary table + each episode
    reward_panel(trajs, {"correct": 1.0, "format": 0.1})   # sliders: re-weight, re-score, see the advantages

Colours: green = written by the policy (mask 1, trained on), blue = env / tool
tokens (mask 0), grey = the prompt (mask 0). Hover a token to see its id and its
sampling log-prob. A newline is shown as ``↵`` and then breaks the line.

The functions return ``IPython.display.HTML`` objects (a notebook shows the last one in
a cell); ``trajectory_html`` gives the raw HTML string, e.g. to write to a file.
"""

from __future__ import annotations

import html

from helpers.grpo import advantage_table
from helpers.rewards import score_trajectories
from helpers.rollout import Trajectory

COLOURS = {"policy": "#c8f0c8", "env": "#cfe3ff", "prompt": "#eeeeee"}

_STYLE = (
    "<style>.traj{font-family:monospace;font-size:12px;line-height:1.7;white-space:pre-wrap;word-break:break-all}"
    ".traj span{border-radius:2px;padding:0 1px;margin:0 0.5px}"
    ".traj-head{font-family:sans-serif;font-size:13px;margin:4px 0}</style>"
)


def _header(traj: Trajectory) -> str:
    parts = ", ".join(f"{k}={v:g}" for k, v in traj.reward_parts.items()) or "-"
    verdict = traj.info.get("verdict", "-")
    return (
        f"<div class='traj-head'><b>{html.escape(traj.task_id)}</b> · sample {traj.group} · "
        f"reward <b>{traj.reward:g}</b> (parts: {html.escape(parts)}) · stop: <b>{html.escape(traj.stop_reason)}</b> · "
        f"verdict: {html.escape(str(verdict))} · turns {traj.turns} · "
        f"{traj.num_generated} policy / {len(traj.token_ids)} tokens · {traj.wall_time:.2f} s</div>"
    )


def _legend() -> str:
    keys = [("policy", "policy (mask 1)"), ("env", "env / tool (mask 0)"), ("prompt", "prompt (mask 0)")]
    return "<div class='traj-head'>" + " ".join(f"<span style='background:{COLOURS[k]}'>&nbsp;{t}&nbsp;</span>" for k, t in keys) + "</div>"


def trajectory_html(traj: Trajectory, tokenizer, legend: bool = True) -> str:
    """One trajectory as HTML: a header line, then every token coloured by its mask.

    Taught in notebooks/03_rollout.ipynb §4.
    """
    spans = []
    for i, (token, m, lp) in enumerate(zip(traj.token_ids, traj.mask, traj.logprobs)):
        who = "policy" if m else ("prompt" if i < traj.prompt_len else "env")
        text = tokenizer.decode([token], skip_special_tokens=False)
        shown = html.escape(text).replace("\n", "↵\n")
        tip = f"id {token} · {who}" + (f" · logprob {lp:.3f}" if m else "")
        spans.append(f"<span style='background:{COLOURS[who]}' title='{tip}'>{shown}</span>")
    return (_STYLE + (_legend() if legend else "")) + _header(traj) + "<div class='traj'>" + "".join(spans) + "</div>"


def group_html(trajs: list[Trajectory], tokenizer=None) -> str:
    """A table of the trajectories (reward, stop reason, turns, tokens), then each one
    in a collapsible block: token-coloured with a tokenizer, message by message without."""
    rows = "".join(
        f"<tr><td>{html.escape(t.task_id)}</td><td>{t.group}</td><td>{t.reward:g}</td><td>{html.escape(t.stop_reason)}</td>"
        f"<td>{html.escape(str(t.info.get('verdict', '-')))}</td><td>{t.turns}</td><td>{t.num_generated}</td><td>{len(t.token_ids)}</td></tr>"
        for t in trajs
    )
    table = (
        "<table><tr><th>task</th><th>sample</th><th>reward</th><th>stop</th><th>verdict</th><th>turns</th>"
        f"<th>policy tokens</th><th>all tokens</th></tr>{rows}</table>"
    )
    blocks = []
    for t in trajs:
        body = trajectory_html(t, tokenizer, legend=False) if tokenizer is not None else _header(t) + _messages_html(t)
        summary = f"{html.escape(t.task_id)} · sample {t.group} · reward {t.reward:g} · {html.escape(t.stop_reason)}"
        blocks.append(f"<details><summary>{summary}</summary>{body}</details>")
    return _STYLE + _legend() + table + "".join(blocks)


def _messages_html(traj: Trajectory) -> str:
    """Message-level view (no tokenizer): assistant messages in the policy colour."""
    out = []
    for i, m in enumerate(traj.messages):
        who = "policy" if m["role"] == "assistant" else ("env" if i >= len(traj.task.prompt) else "prompt")
        out.append(f"<div style='background:{COLOURS[who]}'><b>{html.escape(m['role'])}:</b> {html.escape(m['content'])}</div>")
    return "<div class='traj'>" + "".join(out) + "</div>"


def show_trajectory(traj: Trajectory, tokenizer):
    """Display one trajectory in a notebook (see ``trajectory_html``)."""
    from IPython.display import HTML

    return HTML(trajectory_html(traj, tokenizer))


def show_group(trajs: list[Trajectory], tokenizer=None):
    """Display a group of trajectories in a notebook (see ``group_html``)."""
    from IPython.display import HTML

    return HTML(group_html(trajs, tokenizer))


# --- rewards: histogram and the interactive panel of notebook 04 ------------------------------


def plot_reward_histogram(trajs: list[Trajectory], part: str = "total", ax=None, title: str = ""):
    """Histogram of the total reward (``part="total"``) or of one logged part, over scored trajectories."""
    import matplotlib.pyplot as plt

    values = [t.reward if part == "total" else t.reward_parts.get(part, 0.0) for t in trajs]
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3))
    ax.hist(values, bins=20)
    ax.set_title(title or f"reward histogram: {part}")
    ax.set_xlabel(f"{part} reward")
    ax.set_ylabel("trajectories")
    return ax


def widgets_frontend() -> bool:
    """True when ipywidgets can be shown *and* a frontend will draw them.

    A kernel run by nbval or ``nbconvert --execute`` has no frontend: widgets there would
    print as ``VBox(...)``. We look for JupyterLab / Notebook (``JPY_SESSION_NAME``), Colab,
    or VS Code; ``WORKBOOK_WIDGETS=1`` / ``0`` forces the answer.
    """
    import os
    import sys

    from helpers.live import in_notebook

    if os.environ.get("WORKBOOK_WIDGETS") in ("0", "1"):
        return os.environ["WORKBOOK_WIDGETS"] == "1"
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    frontend = "JPY_SESSION_NAME" in os.environ or "google.colab" in sys.modules or "VSCODE_PID" in os.environ
    return in_notebook() and frontend


def reward_panel(trajs: list[Trajectory], weights: dict[str, float], scale_rewards: str = "group", max_groups: int = 8):
    """Sliders for the weights of ``weights`` and a dropdown of parts; re-scores ``trajs`` live.

    Every change re-scores the trajectories with ``combine(weights)`` and redraws the
    per-group advantage table and the reward histogram. Without a widget frontend (CI,
    nbconvert) it prints the same table and histogram once, for the given weights.
    Returns the panel widget, or None in the static case.

    Taught in notebooks/04_reward.ipynb §9.
    """
    import matplotlib.pyplot as plt

    def draw(current: dict[str, float], part: str) -> None:
        score_trajectories(trajs, {k: w for k, w in current.items() if w != 0} or {"correct": 0.0})
        shown = ", ".join(f"{w:g}*{k}" for k, w in current.items() if w != 0) or "0"
        print(f"reward = {shown}\n")
        print(advantage_table(trajs, scale_rewards, max_groups))
        plot_reward_histogram(trajs, part, title=f"{part}: reward = {shown}")
        plt.tight_layout()
        plt.show()

    if not widgets_frontend():
        draw(dict(weights), "total")
        return None

    import ipywidgets as W
    from IPython.display import display

    sliders = {k: W.FloatSlider(value=w, min=-1.0, max=2.0, step=0.05, description=k, continuous_update=False) for k, w in weights.items()}
    dropdown = W.Dropdown(options=["total", *weights], value="total", description="histogram")
    out = W.Output()

    def redraw(_=None):
        with out:
            out.clear_output(wait=True)
            draw({k: s.value for k, s in sliders.items()}, dropdown.value)

    for widget in [*sliders.values(), dropdown]:
        widget.observe(redraw, names="value")
    panel = W.VBox([W.HBox([W.VBox(list(sliders.values())), dropdown]), out])
    display(panel)
    redraw()
    return panel
