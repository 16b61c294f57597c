"""A simulated deployment (持续学习): users ask and give feedback, the world drifts, the agent keeps learning.

    python -m helpers.serve simulate --seed 0          # runs/serve-sim-seed0/: rounds.jsonl, summary.json, curves.png

One command starts the real pieces as separate processes on one store: the server (``python -m
helpers.serve``) and the online trainer (``python -m helpers.serve train``); this process plays the users.

    the starting agent   runs/serve-start/checkpoint-10: the tiny-agent preset trained 10 steps (made once, if missing)
    users                ``users`` customers, ``adversarial`` of them adversarial (20 %)
    a round              ``asks_per_round`` customers each ask once, the same question to the learning agent
                         (model "tiny-agent": whatever is deployed) and to the frozen copy ("tiny-agent@v0"),
                         all at once; then they give feedback on the learning agent's answer; then the round
                         waits until the trainer has taken every full batch of that feedback (lock-step, so a
                         round means the same on a slow machine as on a fast one)
    the drift            at ``drift_round`` customers' habits change: they all buy the ``drift_items`` items the
                         starting agent handles worst (``worst_items``, measured at the start)

Seeded: the same command on the same machine gives the same curves. The users, their questions and
feedback come from one ``random.Random`` of the seed; the server draws each request's prices from (its
seed, the customer, their request count), not in the order concurrent requests arrive
(``helpers.serve.world``); the trainer reads feedback one piece at a time in id order, so its batches are
the feedback's, not the timing of its reads, and each update's sampling is seeded
(``helpers.serve.trainer.FeedbackQueue``); the audits are drawn with a key made from the seed
(``audit_key``); and a round begins only when the server serves the version the last round's feedback
made (``wait_for_swap``). Not pinned: which concurrent requests the server batches together, which can change
only float rounding in a greedy decode. Only the latencies differ between runs.

Honest users know their bill (the simulation reads the world's answer): a right answer gets a thumbs
up half the time, a wrong one a thumbs down and the correct answer. Adversarial users lie every time:
a right answer (or none) gets a thumbs down and a false correct answer (the unit price, the agent's old bad
habit, or the bill off by ten), a wrong one a thumbs up.

What is measured per round: served success of both agents (the world's answer), the deployed version
and its canary success, updates deployed and refused, the latency of the learning agent's requests.
``summary.json`` says whether the run meets the issue's bars: after the drift the learning agent comes
back to within ``recovery_margin`` of its success before it (the last ``window`` rounds against the ``window`` before
the drift) while the frozen one stays down, and the canary success never dropped by more than the gate's
margin: every deployed update's canary success, as the store recorded it, is at most ``gate_margin``
below its parent version's and below the starting version's (version 0, the starting agent; the gate's
two references, ``helpers.serve.trainer``).
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import statistics
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import helpers.worlds  # noqa: F401  (registers the tiny-agent preset)
from helpers.config import get_preset
from helpers.evaluation import evaluate
from helpers.loop import train
from helpers.paths import ROOT
from helpers.policy import load_adapter, load_model, make_policy
from helpers.serve.process import ServerProcess, ServiceProcess
from helpers.serve.store import SQLiteStore
from helpers.serve.trainer import (AUDIT_SECRET_KEY, SEEN_KEY, FeedbackQueue, OnlineConfig, agrees_with_truth, patient_rollout,
                                   reference, same_number, starting_version)
from helpers.serve.world import ServedShop, random_question
from helpers.worlds.shop.env import ShopEnv
from helpers.worlds.shop.tasks import QUANTITIES, make_agent_tasks
from helpers.worlds.shop.tasks import question as question_text

START_DIR = "runs/serve-start"  # the starting agent's run folder
START_STEPS = 10


@dataclass
class SimConfig:
    seed: int = 0  # draws the users, their questions and the canary set
    out_dir: str | None = None  # the run's folder; None: runs/serve-sim-seed<seed>
    adapter: str | None = None  # the starting adapter; None: runs/serve-start's checkpoint, trained when missing; "base": none
    rounds: int = 14  # rounds of asking and feedback
    drift_round: int = 4  # the first round after the drift
    window: int = 4  # rounds averaged for "before the drift" and "at the end"
    users: int = 40  # customers
    adversarial: float = 0.2  # share of adversarial users
    asks_per_round: int = 16  # customers asking in each round
    drift_items: int = 3  # the items customers buy after the drift: the starting agent's worst
    honest_thumbs_up: float = 0.5  # how often an honest user confirms a right answer
    recovery_margin: float = 0.05  # "recovered": the last window at most this below the window before the drift
    online: OnlineConfig = field(default_factory=OnlineConfig)  # the trainer's; its seed is replaced by ``seed``


def as_flags(config) -> list[str]:
    """A config dataclass of numbers as the flags that make it again: ``--batch-tasks 8 --group-size 8 ...``
    (``python -m helpers.serve train`` makes its flags from ``OnlineConfig``'s fields)."""
    return [text for f in fields(config) for text in (f"--{f.name.replace('_', '-')}", str(getattr(config, f.name)))]


def start_adapter(adapter: str | None) -> str:
    """The starting agent: ``adapter``, or the tiny-agent preset trained ``START_STEPS`` steps (made once); "" for "base"."""
    if adapter:
        return "" if adapter == "base" else adapter
    checkpoint = ROOT / START_DIR / f"checkpoint-{START_STEPS}"
    if not (checkpoint / "adapter_model.safetensors").is_file():
        print(f"simulate: training the starting agent ({START_DIR}, {START_STEPS} steps of tiny-agent)", flush=True)
        train(get_preset("tiny-agent", steps=START_STEPS, eval_every=0, pass_k=0, eval_tasks=100, out_dir=START_DIR))
    return str(checkpoint)


def worst_items(adapter: str, count: int, seed: int) -> tuple[list[str], dict[str, float]]:
    """The ``count`` items the agent answers worst (greedy, 12 held-out tasks of each), and every item's success."""
    config = get_preset("tiny-agent")
    model, tokenizer = load_model(config)
    policy = make_policy(config, load_adapter(model, adapter) if adapter else model.eval(), tokenizer)
    tasks = make_agent_tasks(144, seed=seed, split="validation")
    result = evaluate(policy, tasks, ShopEnv, max_new_tokens=config.max_new_tokens, max_steps=config.env_max_steps,
                      max_total_tokens=config.max_total_tokens, play=patient_rollout)
    right, seen = Counter(), Counter()
    for task, record in zip(tasks, result.records):
        seen[task.metadata["item"]] += 1
        right[task.metadata["item"]] += bool(record.get("correct"))
    success = {item: right[item] / seen[item] for item in sorted(seen)}
    return sorted(success, key=lambda item: (success[item], item))[:count], success


def false_answer(rng: random.Random, truth: str, quantity: int | None) -> str:
    """What an adversarial user claims: the unit price (the agent's old habit) or the bill off by ten."""
    bill = int(truth)
    if quantity and rng.random() < 0.5:
        return str(bill // quantity)
    return str(bill + rng.choice([-10, 10]))


def feedback_for(rng: random.Random, adversarial: bool, answer: str | None, truth: str, quantity: int | None,
                 thumbs_up: float) -> dict | None:
    """One simulated user's feedback on an answer (module docstring), or None (no feedback)."""
    right = same_number(answer, truth)
    if not adversarial:
        if right:
            return {"rating": 1} if rng.random() < thumbs_up else None
        return {"rating": -1, "correct_answer": truth}
    if right or answer is None:
        return {"rating": -1, "correct_answer": false_answer(rng, truth, quantity)}
    return {"rating": 1}


def ask(client, url: str, model: str, user: str, question: str, headers: dict | None = None) -> tuple[dict, float]:
    body = {"model": model, "user": user, "temperature": 0, "messages": [{"role": "user", "content": question}]}
    start = time.perf_counter()
    response = client.post(f"{url}/v1/chat/completions", json=body, headers=headers)  # headers: the user's key
    response.raise_for_status()
    return response.json()["episode"], time.perf_counter() - start


def wait_for_trainer(store, last_feedback: int, timeout: float = 900.0) -> None:
    """Until the trainer has read every feedback up to ``last_feedback`` and trained every full batch of it."""
    deadline = time.monotonic() + timeout
    while store.get_setting(SEEN_KEY, 0) < last_feedback:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the trainer did not catch up with feedback {last_feedback} in {timeout} s")
        time.sleep(0.2)


def audit_key(seed: int) -> str:
    """The simulation's audit key, written to the store before the trainer starts (a deployment's is random,
    ``helpers.serve.trainer.audit_secret``): the same audits in every run of a seed."""
    return hashlib.sha256(f"simulate-audit-{seed}".encode()).hexdigest()


def wait_for_swap(client, url: str, version: int, timeout: float = 300.0) -> None:
    """Until the server serves ``version`` (its watcher polls the store), so a round runs on the version its
    feedback made, whatever the machine's speed."""
    deadline = time.monotonic() + timeout
    while client.get(f"{url}/health").json()["deployed"] != version:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the server did not swap to v{version} in {timeout} s")
        time.sleep(0.1)


def run_simulation(config: SimConfig) -> dict:
    import httpx  # optional (the 'serve' extra): only the simulated users need it

    t_start = time.perf_counter()
    out = ROOT / (config.out_dir or f"runs/serve-sim-seed{config.seed}")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    adapter = start_adapter(config.adapter)
    drift_to, item_success = worst_items(adapter, config.drift_items, config.seed)
    print(f"simulate: starting agent's greedy success by item {item_success}; the drift moves customers to {drift_to}", flush=True)

    rng = random.Random(f"simulate-{config.seed}")
    users = [f"customer-{config.seed}-{i:02d}" for i in range(config.users)]
    adversaries = set(rng.sample(users, round(config.adversarial * config.users)))
    store_path = out / "store.db"
    trainer_args = as_flags(replace(config.online, seed=config.seed))  # the trainer process's OnlineConfig: this one
    rounds = []
    with ServerProcess(store_path, adapter=adapter or None, extra=["--rate", "1000", "--burst", "1000", "--world-seed", str(config.seed)],
                       log=out / "server.log") as server:
        store = SQLiteStore(store_path)
        store.set_setting(AUDIT_SECRET_KEY, audit_key(config.seed))
        with ServiceProcess("train", store_path, trainer_args, log=out / "trainer.log"), httpx.Client(timeout=300) as client:
            for round_no in range(config.rounds):
                if round_no == config.drift_round:
                    server.admin("world", {"items": drift_to})
                askers = rng.sample(users, config.asks_per_round)
                questions = [random_question(rng) for _ in askers]
                served: list = [None] * len(askers)

                def serve_one(k: int) -> None:
                    learning, latency = ask(client, server.url, "tiny-agent", askers[k], questions[k], server.auth(askers[k]))
                    frozen, _ = ask(client, server.url, "tiny-agent@v0", askers[k], questions[k], server.auth(askers[k]))
                    served[k] = (learning, frozen, latency)

                threads = [threading.Thread(target=serve_one, args=(k,)) for k in range(len(askers))]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
                if any(s is None for s in served):
                    raise RuntimeError(f"round {round_no}: a request failed; see {out / 'server.log'}")
                right = {"learning": 0, "frozen": 0}
                last_feedback = 0
                for user, (learning, frozen, _) in zip(askers, served):
                    record = store.episode(learning["id"])
                    truth, frozen_truth = record.truth, store.episode(frozen["id"]).truth
                    right["learning"] += same_number(learning["answer"], truth)
                    right["frozen"] += same_number(frozen["answer"], frozen_truth)
                    given = feedback_for(rng, user in adversaries, learning["answer"], truth, record.world["quantity"],
                                         config.honest_thumbs_up)
                    if given is not None:
                        response = client.post(f"{server.url}/v1/feedback", json={"episode_id": learning["id"], "user": user, **given},
                                               headers=server.auth(user))
                        response.raise_for_status()
                        last_feedback = response.json()["id"]
                if last_feedback:
                    wait_for_trainer(store, last_feedback)
                adapters = store.adapters()
                deployed = store.deployed()[0]
                wait_for_swap(client, server.url, deployed)
                latencies = sorted(latency for _, _, latency in served)
                rounds.append({
                    "round": round_no, "drifted": round_no >= config.drift_round, "t": time.perf_counter() - t_start,
                    "success_learning": right["learning"] / len(askers), "success_frozen": right["frozen"] / len(askers),
                    "served_versions": sorted({s[0]["adapter_version"] for s in served}), "deployed": deployed,
                    "canary_deployed": next(a["canary"] for a in adapters if a["version"] == deployed),
                    "updates_deployed": sum(a["status"] == "deployed" and a["parent"] is not None for a in adapters),
                    "updates_refused": sum(a["status"] == "refused" for a in adapters),
                    "latency_p50_s": statistics.median(latencies), "latency_p95_s": latencies[int(0.95 * (len(latencies) - 1))],
                })
                r = rounds[-1]
                print(f"round {round_no:3d}{' (drifted)' if r['drifted'] else ''} | learning {r['success_learning']:.2f} | "
                      f"frozen {r['success_frozen']:.2f} | v{deployed} canary {r['canary_deployed']} | deployed "
                      f"{r['updates_deployed']} refused {r['updates_refused']} | p50 {r['latency_p50_s']:.2f} s", flush=True)
        adapters = store.adapters()
    summary = summarise(config, rounds, adapters, drift_to, item_success, time.perf_counter() - t_start)
    (out / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rounds))
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    plot(rounds, config, out / "curves.png", summary["start_canary"])
    print(json.dumps({k: v for k, v in summary.items() if k not in ("config", "adapters")}, indent=1), flush=True)
    print(f"canary check: {summary['updates_deployed']} deployed updates, each at most {config.online.gate_margin} below its "
          f"parent's canary (largest drop {summary['largest_canary_drop_vs_parent']:.3f}) and below the starting version's "
          f"{summary['start_canary']} (lowest deployed {summary['deployed_canary_min']}, largest drop "
          f"{summary['largest_canary_drop_vs_start']:.3f}): {summary['canary_within_margin']}", flush=True)
    return summary


def summarise(config: SimConfig, rounds: list[dict], adapters: list[dict], drift_to: list[str], item_success: dict,
              wall_s: float) -> dict:
    """The run's figures and the issue's bars (module docstring)."""
    def mean(key: str, part: list[dict]) -> float:
        return sum(r[key] for r in part) / len(part)

    before = rounds[max(0, config.drift_round - config.window): config.drift_round]
    after_drift = rounds[config.drift_round: config.drift_round + 2]
    end = rounds[-config.window:]
    s = {
        "learning_before": mean("success_learning", before), "frozen_before": mean("success_frozen", before),
        "learning_right_after_drift": mean("success_learning", after_drift), "frozen_right_after_drift": mean("success_frozen", after_drift),
        "learning_end": mean("success_learning", end), "frozen_end": mean("success_frozen", end),
    }
    canary = {a["version"]: a["canary"] for a in adapters}
    start = starting_version(adapters)  # version 0: the starting agent
    updates = [a for a in adapters if a["status"] == "deployed" and a["parent"] is not None]
    drop_vs_parent = max((canary[a["parent"]] - a["canary"] for a in updates), default=0.0)
    drop_vs_start = max((canary[start] - a["canary"] for a in updates), default=0.0)
    s.update({
        "recovered": s["learning_end"] >= s["learning_before"] - config.recovery_margin,
        "frozen_stays_down": s["frozen_end"] < s["frozen_before"] - config.recovery_margin,
        "updates_deployed": len(updates), "updates_refused": sum(a["status"] == "refused" for a in adapters),
        "start_canary": canary[start],
        "deployed_canary_min": min((a["canary"] for a in updates), default=None),
        "deployed_canary_max": max((a["canary"] for a in updates), default=None),
        "largest_canary_drop_vs_parent": drop_vs_parent, "largest_canary_drop_vs_start": drop_vs_start,
        "canary_within_margin": max(drop_vs_parent, drop_vs_start) <= config.online.gate_margin + 1e-9,
        "drift_items": drift_to, "item_success_at_start": item_success,
        "latency_p50_s": statistics.median(r["latency_p50_s"] for r in rounds),
        "latency_p95_s": max(r["latency_p95_s"] for r in rounds),
        "wall_s": wall_s, "config": asdict(config), "adapters": adapters,
    })
    return s


def plot(rounds: list[dict], config: SimConfig, path: Path, start_canary: float | None) -> None:
    """Four panels over the rounds: served success (learning vs frozen), deployed canary (and the gate's floor:
    the starting version's canary minus the margin), updates, latency."""
    import matplotlib  # here, not at the top: the Agg backend, set at import, would replace a notebook's own

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [r["round"] for r in rounds]
    fig, axes = plt.subplots(1, 4, figsize=(17, 3.6))
    axes[0].plot(x, [r["success_learning"] for r in rounds], label="learning agent")
    axes[0].plot(x, [r["success_frozen"] for r in rounds], label="frozen copy (v0)", linestyle="--")
    axes[0].set_title("served success (greedy)")
    axes[1].step(x, [r["canary_deployed"] for r in rounds], where="post")
    if start_canary is not None:
        axes[1].axhline(start_canary - config.online.gate_margin, color="red", linestyle="--", linewidth=1,
                        label="starting version - margin")
    axes[1].set_title(f"deployed canary success (margin {config.online.gate_margin})")
    axes[2].step(x, [r["updates_deployed"] for r in rounds], where="post", label="deployed")
    axes[2].step(x, [r["updates_refused"] for r in rounds], where="post", label="refused by the gate")
    axes[2].set_title("updates")
    axes[3].plot(x, [r["latency_p50_s"] for r in rounds], label="p50")
    axes[3].plot(x, [r["latency_p95_s"] for r in rounds], label="p95")
    axes[3].set_title("latency of a request (s)")
    for ax in axes:
        ax.axvline(config.drift_round - 0.5, color="grey", linestyle=":", label="drift")
        ax.set_xlabel("round")
        ax.legend(fontsize=7)
    axes[0].set_ylim(0, 1.02)
    axes[1].set_ylim(0, 1.02)
    fig.suptitle(f"simulated deployment, seed {config.seed}: {config.users} users, {config.adversarial:.0%} adversarial")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# --- attacks on the feedback (notebook 11): made-up streams of feedback, no server or model ----------------------

ATTACKS = {
    "sybils": "24 new names, each a false correct answer on a verifiable question",
    "patient sybils": "12 new names, each 2 true answers (probation) and then 4 false ones",
    "audit dodging": "a new name, 8 false answers on questions without a known answer",
    "trusted dodging": "a user with 2 passed audits, then 8 false answers without a known answer",
    "framing": "4 false answers in victor's name, each on an id the public rule audits",
}
UNVERIFIABLE = "What do {} of my usual items cost?!"  # not the world's question (QUESTION): no known answer


def public_audit(feedback_id: int, rate: float) -> bool:
    """The audit draw before the audit key: a hash of the id alone, which any client can compute."""
    return int(hashlib.sha256(f"audit-{feedback_id}".encode()).hexdigest(), 16) % 10_000 < rate * 10_000


def attack_stream(attack: str, seed: int = 0, honest_users: int = 20, honest_pieces: int = 6,
                  audit_rate: float = 0.2) -> list[dict]:
    """One attack among honest traffic, as ``store.feedback_since`` returns feedback (ids in order), each piece
    marked ``lie`` (what it says is false). The honest users (and victor) give a thumbs up on a right answer or
    the correct answer on a wrong one; the attackers give false correct answers (``ATTACKS``)."""
    world, rng = ServedShop(seed), random.Random(f"attack-{attack}-{seed}")
    honest = [f"customer-{i:02d}" for i in range(honest_users)] + ["victor"]
    plan = [(user, False, True) for user in honest for _ in range(honest_pieces)]  # (user, lie, verifiable)
    rng.shuffle(plan)
    if attack == "sybils":
        attack_plan = [(f"sybil-{i:02d}", True, True) for i in range(24)]
    elif attack == "patient sybils":
        attack_plan = [(f"sybil-{i:02d}", k >= 2, True) for i in range(12) for k in range(6)]
    elif attack == "audit dodging":
        attack_plan = [("dodger", True, False)] * 8
    elif attack == "trusted dodging":
        attack_plan = [("dodger", False, True)] * 2 + [("dodger", True, False)] * 8
    elif attack == "framing":
        attack_plan = [("victor", True, True)] * 4
    else:
        raise ValueError(f"unknown attack {attack!r}; choose from {', '.join(ATTACKS)}")
    stream: list[dict] = []
    while plan or attack_plan:
        next_id = len(stream) + 1
        if attack == "framing":  # the attacker waits for an id the public rule audits
            take = attack_plan and public_audit(next_id, audit_rate) and len(stream) > len(plan)
        else:  # the attack's pieces in order, spread over the honest traffic
            take = attack_plan and rng.random() < len(attack_plan) / (len(plan) + len(attack_plan))
        user, lie, verifiable = attack_plan.pop(0) if take or not plan else plan.pop()
        quantity = rng.choice(QUANTITIES)
        question = question_text(quantity) if verifiable else UNVERIFIABLE.format(quantity)
        task = world.task(f"ep-{next_id}", user, question)
        bill = str(quantity * task.metadata["prices"][task.metadata["item"]])
        right = rng.random() < 0.5  # the agent's answer: right half the time
        answer = bill if right else str(int(bill) + 10)
        given = {"rating": 1, "correct_answer": None} if right and not lie else {"rating": -1, "correct_answer": bill}
        if lie:
            given = {"rating": -1, "correct_answer": str(int(bill) - 10)}
        stream.append({"id": next_id, "episode_id": task.id, "user": user, "answer": answer, "truth": task.answer,
                       "world": task.metadata, "question": question, "lie": lie, **given})
    return stream


def trained_by_the_old_rules(stream: list[dict], online: OnlineConfig) -> list[dict]:
    """What the trainer before the defences trained on: a user trusted until ``min_audits`` audits judged them,
    audits drawn by ``public_audit``, every reference of a trusted user taken (in batches, in id order)."""
    audited, agreed, pending, trained = Counter(), Counter(), [], []
    for feedback in stream:
        user = feedback["user"]
        if public_audit(feedback["id"], online.audit_rate) and (verdict := agrees_with_truth(feedback)) is not None:
            audited[user] += 1
            agreed[user] += verdict
        if reference(feedback) is not None:
            pending.append(feedback)
        judged_out = {u for u in audited if audited[u] >= online.min_audits
                      and (agreed[u] + 1) / (audited[u] + 2) < online.min_reputation}
        pending = [f for f in pending if f["user"] not in judged_out]
        while len(pending) >= online.batch_tasks:
            trained += pending[: online.batch_tasks]
            pending = pending[online.batch_tasks:]
    return trained


def trained_by_the_queue(stream: list[dict], online: OnlineConfig, key: str) -> list[dict]:
    """What the trainer's ``FeedbackQueue`` trains on, reading the same stream."""
    queue, trained = FeedbackQueue(online, key), []
    for feedback in stream:
        for batch in queue.push(feedback):
            trained += batch
            queue.trained += batch
    return trained


def measure_attacks(seed: int = 0, online: OnlineConfig = OnlineConfig()) -> list[dict]:
    """For each attack: the false references that reach training, and the honest ones, under both rules."""
    rows = []
    for attack in ATTACKS:
        stream = attack_stream(attack, seed, audit_rate=online.audit_rate)
        row = {"attack": attack, "false sent": sum(f["lie"] for f in stream)}
        for name, trained in (("old rules", trained_by_the_old_rules(stream, online)),
                              ("queue", trained_by_the_queue(stream, online, audit_key(seed)))):
            row[f"false trained ({name})"] = sum(f["lie"] for f in trained)
            row[f"honest trained ({name})"] = sum(not f["lie"] for f in trained)
            row[f"victor's trained ({name})"] = sum(f["user"] == "victor" and not f["lie"] for f in trained)
        rows.append(row)
    return rows
