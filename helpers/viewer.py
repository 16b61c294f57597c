"""Pictures of trajectories and rewards, for notebooks: the mask made visible, the reward panel.

    show_trajectory(traj, tokenizer)     # one episode, every token coloured by who wrote it
    show_group(trajs, tokenizer)         # the G samples of a task: a summary table + each episode
    show_advantages(traj, tokenizer, {"GRPO": 0.71, "GiGPO": [0.9, 0.8, 1.2, 0.7]})   # side by side, per turn
    reward_panel(trajs, {"correct": 1.0, "format": 0.1})   # sliders: re-weight, re-score, see the advantages
    print(advantage_table(trajs))        # each group's rewards and GRPO advantages, as text
    print(step_group_table(trajs, gamma=0.95))   # GiGPO's step groups: members, returns, step advantages

Colours: green = written by the policy (mask 1, trained on), blue = env / tool
tokens (mask 0), grey = the prompt (mask 0). Hover a token to see its id and its
sampling log-prob. A newline is shown as ``↵`` and then breaks the line.

The functions return ``IPython.display.HTML`` objects (a notebook shows the last one in
a cell); ``trajectory_html`` gives the raw HTML string, e.g. to write to a file.
"""

from __future__ import annotations

import html
import os
import sys

import ipywidgets as W
import matplotlib.pyplot as plt
from IPython.display import HTML, display

from helpers.envs.anchors import Anchor, tool_history
from helpers.grpo import group_advantages, group_rewards, group_trajectories, step_groups, turn_spans
from helpers.live import in_notebook
from helpers.rewards import reward_name, score_trajectories
from helpers.rollout import Trajectory

COLOURS = {"policy": "#c8f0c8", "env": "#cfe3ff", "prompt": "#eeeeee"}
ADVANTAGE_COLOURS = {1: "#9be39b", 0: "#ffffff", -1: "#f5a3a3"}  # sign of the advantage -> policy-token colour

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


def _legend(by_advantage: bool = False) -> str:
    keys = [(COLOURS["policy"], "policy (mask 1)")] if not by_advantage else [
        (ADVANTAGE_COLOURS[1], "policy, pushed up (A > 0)"), (ADVANTAGE_COLOURS[-1], "policy, pushed down (A < 0)")]
    keys += [(COLOURS["env"], "env / tool (mask 0)"), (COLOURS["prompt"], "prompt (mask 0)")]
    return "<div class='traj-head'>" + " ".join(f"<span style='background:{c}'>&nbsp;{t}&nbsp;</span>" for c, t in keys) + "</div>"


def trajectory_html(traj: Trajectory, tokenizer, legend: bool = True, advantage: float | list[float] | None = None) -> str:
    """One trajectory as HTML: a header line, then every token coloured by its mask.

    With ``advantage`` (the episode's GRPO advantage), the policy's tokens are coloured by
    what the update does to them instead: green = pushed up (A > 0), red = pushed down
    (A < 0), white = untouched (A = 0). Every policy token of the episode gets the same
    colour, whatever turn it is in: an outcome reward has no opinion about single turns.
    With one number per turn (a list, e.g. GiGPO's ``Advantages.turn_advantages[b][g]``) each
    turn is coloured by its own, and a badge before the turn gives the number.

    Taught in notebooks/03_rollout.ipynb §4, notebooks/06_training_loop.ipynb and 06b_turn_credit.ipynb.
    """
    per_turn = isinstance(advantage, (list, tuple)) or getattr(advantage, "ndim", 0) > 0  # a list or a (K,) tensor
    turns = [float(a) for a in advantage] if per_turn else None
    advantage = advantage if per_turn or advantage is None else float(advantage)
    starts = {start: k for k, (start, _) in enumerate(turn_spans(traj.mask))}
    if per_turn and len(turns) != len(starts):
        raise ValueError(f"{len(turns)} turn advantages for the {len(starts)} turns of {traj.task_id}/{traj.group}")
    spans, a = [], None if per_turn else advantage  # a: the number the current token's turn gets
    for i, (token, m, lp) in enumerate(zip(traj.token_ids, traj.mask, traj.logprobs)):
        if per_turn and i in starts:
            a = turns[starts[i]]
            spans.append(f"<b style='font-size:10px;color:#555'>[A {a:+.2f}]</b>")
        policy = COLOURS["policy"] if a is None else ADVANTAGE_COLOURS[(a > 0) - (a < 0)]
        who = "policy" if m else ("prompt" if i < traj.prompt_len else "env")
        text = tokenizer.decode([token], skip_special_tokens=False)
        shown = html.escape(text).replace("\n", "↵\n")
        tip = f"id {token} · {who}" + (f" · logprob {lp:.3f}" if m else "") + (f" · advantage {a:+.2f}" if m and a is not None else "")
        spans.append(f"<span style='background:{policy if m else COLOURS[who]}' title='{tip}'>{shown}</span>")
    shown_advantage = "" if advantage is None else (f"{advantage:+.2f}" if not per_turn else " ".join(f"{x:+.2f}" for x in turns))
    head = _header(traj) if advantage is None else _header(traj).replace("</div>", f" · advantage <b>{shown_advantage}</b></div>", 1)
    return (_STYLE + (_legend(advantage is not None) if legend else "")) + head + "<div class='traj'>" + "".join(spans) + "</div>"


def advantages_html(traj: Trajectory, tokenizer, columns: dict[str, float | list[float]]) -> str:
    """One episode side by side under several advantages: ``{"GRPO": 0.71, "GiGPO": [0.9, 0.8, 1.2, 0.7]}``,
    each column coloured as ``trajectory_html`` colours it (a number for the episode, or one per turn).

    Taught in notebooks/06b_turn_credit.ipynb.
    """
    cells = "".join(f"<div style='flex:1;min-width:0'><div class='traj-head'><b>{html.escape(name)}</b></div>"
                    f"{trajectory_html(traj, tokenizer, legend=False, advantage=value)}</div>" for name, value in columns.items())
    return _STYLE + _legend(True) + f"<div style='display:flex;gap:12px'>{cells}</div>"


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
    return HTML(trajectory_html(traj, tokenizer))


def show_group(trajs: list[Trajectory], tokenizer=None):
    """Display a group of trajectories in a notebook (see ``group_html``)."""
    return HTML(group_html(trajs, tokenizer))


def show_advantages(traj: Trajectory, tokenizer, columns: dict[str, float | list[float]]):
    """Display one episode under several advantages, side by side (see ``advantages_html``)."""
    return HTML(advantages_html(traj, tokenizer, columns))


# --- advantages as text: the groups of GRPO, the step groups of GiGPO ----------------------------


def advantage_table(trajs: list[Trajectory], scale_rewards: str = "group", max_groups: int | None = None) -> str:
    """One line per group: its G rewards and the GRPO advantages they give (``helpers.grpo.group_advantages``).

    A group whose rewards are all equal is marked ``(flat)``: its advantages are 0 and it
    teaches nothing. Trajectories must already be scored.

    Taught in notebooks/04_reward.ipynb §10 (``helpers.viewer.reward_panel``) and 08_pitfalls.ipynb §2.
    """
    groups = group_trajectories(trajs)[:max_groups]
    rewards = group_rewards([t for g in groups for t in g])  # (B, G)
    adv = group_advantages(rewards, scale_rewards)
    width = max(len(g[0].task_id) for g in groups)
    G = rewards.size(1)
    lines = [f"{'task':<{width}}  {'rewards':<{6 * G}}  advantages ({scale_rewards})"]
    for i, g in enumerate(groups):
        r = " ".join(f"{x:5.2f}" for x in rewards[i].tolist())
        a = " ".join(f"{x:+5.2f}" for x in adv.advantages[i].tolist())
        lines.append(f"{g[0].task_id:<{width}}  {r}  {a}" + ("  (flat)" if adv.zero_spread[i] else ""))
    return "\n".join(lines)


def step_group_table(trajs: list[Trajectory], gamma: float, scale_rewards: str = "group", max_groups: int | None = None,
                     nontrivial_only: bool = True, anchor: Anchor = tool_history) -> str:
    """One line per step group of the first ``max_groups`` tasks: its members (sample:turn), their returns
    and their step advantages A_S (before the weight omega); only the non-trivial ones by default.

    Taught in notebooks/06b_turn_credit.ipynb.
    """
    tasks = group_trajectories(trajs)[:max_groups]
    shown = [sg for sg in step_groups([t for g in tasks for t in g], gamma, anchor) if sg.nontrivial or not nontrivial_only]
    width = max([len("task"), *(len(sg.task_id) for sg in shown)])
    lines = [f"{'task':<{width}}  turn  members (sample:turn -> return, A_S)"]
    for sg in shown:
        members = "   ".join(f"{g}:{k} -> {r:.3f}, {a:+.2f}"
                             for (g, k), r, a in zip(sg.members, sg.returns, sg.advantages(scale_rewards).tolist()))
        lines.append(f"{sg.task_id:<{width}}  {sg.turn:>4}  {members}")
    return "\n".join(lines)


# --- rewards: histogram and the interactive panel of notebook 04 ------------------------------


def plot_reward_histogram(trajs: list[Trajectory], part: str = "total", ax=None, title: str = ""):
    """Histogram of the total reward (``part="total"``) or of one logged part, over scored trajectories."""
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
    if os.environ.get("WORKBOOK_WIDGETS") in ("0", "1"):
        return os.environ["WORKBOOK_WIDGETS"] == "1"
    frontend = "JPY_SESSION_NAME" in os.environ or "google.colab" in sys.modules or "VSCODE_PID" in os.environ
    return in_notebook() and frontend


def reward_panel(trajs: list[Trajectory], weights: dict, scale_rewards: str = "group", max_groups: int = 8):
    """Sliders for the weights of ``weights`` and a dropdown of parts; re-scores ``trajs`` live.

    ``weights`` is what ``combine`` takes: reward names or your own functions ``traj -> float``
    as keys (a function's slider is labelled with its logged name, ``reward_name``). Every
    change re-scores the trajectories with ``combine(weights)`` and redraws the per-group
    advantage table and the reward histogram. Without a widget frontend (CI, nbconvert, a
    static render on GitHub; ``WORKBOOK_WIDGETS=1`` / ``0`` forces the answer, see
    ``widgets_frontend``) it prints the table once for the given weights and draws the
    histogram of the total and of every part with a non-zero weight side by side: a still
    picture of the panel.
    Returns the panel widget, or None in the static case.

    Taught in notebooks/04_reward.ipynb §10.
    """
    keys = {reward_name(k) if not isinstance(k, str) else k: k for k in weights}  # label -> what combine takes
    if len(keys) != len(weights):
        raise ValueError(f"two rewards share a name: {list(keys)}")

    def score(current: dict[str, float]) -> str:
        score_trajectories(trajs, {keys[n]: w for n, w in current.items() if w != 0} or {"correct": 0.0})
        shown = ", ".join(f"{w:g}*{n}" for n, w in current.items() if w != 0) or "0"
        print(f"reward = {shown}\n")
        print(advantage_table(trajs, scale_rewards, max_groups))
        return shown

    def draw(current: dict[str, float], part: str) -> None:
        shown = score(current)
        plot_reward_histogram(trajs, part, title=f"{part}: reward = {shown}")
        plt.tight_layout()
        plt.show()

    start = {name: float(weights[k]) for name, k in keys.items()}
    if not widgets_frontend():
        shown = score(start)
        parts = ["total", *(n for n in keys if start[n] != 0)]  # a part with weight 0 is not computed
        fig, axes = plt.subplots(1, len(parts), figsize=(2.6 * len(parts), 2.6), sharey=True, squeeze=False)
        for ax, part in zip(axes[0], parts):
            plot_reward_histogram(trajs, part, ax=ax, title=part if part == "total" else f"{part} (w={start[part]:g})")
        fig.suptitle(f"reward panel, static view (no widget frontend): reward = {shown}", fontsize=10)
        plt.tight_layout()
        plt.show()
        return None

    sliders = {n: W.FloatSlider(value=w, min=-1.0, max=2.0, step=0.05, description=n, continuous_update=False) for n, w in start.items()}
    dropdown = W.Dropdown(options=["total", *keys], value="total", description="histogram")
    out = W.Output()

    def redraw(_=None):
        with out:
            out.clear_output(wait=True)
            draw({n: s.value for n, s in sliders.items()}, dropdown.value)

    for widget in [*sliders.values(), dropdown]:
        widget.observe(redraw, names="value")
    panel = W.VBox([W.HBox([W.VBox(list(sliders.values())), dropdown]), out])
    display(panel)
    redraw()
    return panel
