"""The online trainer: users' feedback -> verifiable requests -> GRPO groups -> a candidate adapter -> the canary gate.

    python -m helpers.serve train --preset tiny-agent      # beside the server, on the same store

How feedback becomes a group-relative signal. A served request is one episode, and one episode's
reward says nothing GRPO can use: its advantage needs a group of answers to the same request. So
feedback is used to make a request *verifiable*: it gives the request a reference answer,

    correct_answer = "141"          -> the reference is 141 (the user says what it should have been)
    rating = +1 (no correct_answer) -> the reference is the answer the agent gave (the user confirms it)
    rating = -1 alone               -> no reference: stored and audited, not trained on

and the trainer replays the request (the stored world row: the customer's item, that moment's
prices) ``group_size`` times with the current adapter, scores each episode against the reference
(``helpers.rewards``' ``correct``), and takes GRPO's group advantages, exactly as in ``helpers.loop``:

    tasks  = B new verifiable requests + ``replay`` old ones  # one update = (B + replay) requests x G episodes
    trajs  = rollout(tasks, ShopEnv, policy, group_size=G)   # the same rollout as training and serving
    A      = group_advantages(group_rewards(trajs))          # (B + replay, G): each request is its own baseline
    trainer.update(collate(trajs, A, skip_zero_spread=True)) # LoRAGRPO: the clipped-ratio update

Experience replay: each update also replays ``replay`` requests drawn from those trained on before
(their references were trusted then; a user found out later loses them here too), one item each,
the items drawn evenly from those in the pool (``replay_sample``). A drifted traffic of a few items
would otherwise pull the adapter away from the rest (catastrophic forgetting), and the canary gate
would refuse update after update. Evenly by item, because the pool fills with what the traffic asks
now: drawn uniformly from the pool, the replay would come from the drifted items too, and the items
being forgotten would almost never be replayed. A replayed request the agent already answers right at temperature 1 in
every sample has no spread and costs only its sampling; one it starts to forget has, and pulls back.

A group whose G episodes all agree with the reference, or all disagree, has no spread and teaches
nothing (it is skipped): a false "correct" answer that the agent never produces costs nothing. A
false answer the agent sometimes does produce (the unit price, say) would teach it a bad habit; two
guards stand in front of that:

* Reputation (agreement with verifiable answers), kept by ``FeedbackQueue``, which reads the feedback
  in id order. An audit checks a piece against the world's own answer (a reviewer's spot check; in the
  simulation the world's ``truth``); a question the world does not recognise has none, and is never audited.
  A user's reputation is ``(agreed + 1) / (audited + 2)``.

      a new user              every verifiable piece audited until ``min_audits`` audits (probation);
                              nothing of theirs is trained on before: it waits
      a judged user           trusted at ``min_reputation`` or above: what waits is trained on, and a share
                              ``audit_rate`` of what follows is audited, drawn by HMAC of the feedback id with a
                              secret key made at the trainer's first start (``AUDIT_SECRET_KEY`` in the store's
                              settings), so the ids in replies and the counts in ``/v1/status`` predict nothing
      found out               below ``min_reputation``: what waits is dropped, and so is what the replay pool
                              holds of theirs and what they send later
      any audited piece       that disagrees with the world's answer is never a reference
      an unverifiable piece   a reference only from a trusted user, and at most one per audit they passed

  So a crowd of new names (sybils) teaches nothing until each has answered ``min_audits`` verifiable
  questions truthfully; wrong answers on unverifiable questions (audit dodging) never count from a user the
  audits have not judged; and a user who earned trust and then lies is audited at a rate no id reveals.
* The canary gate. Every update is a candidate version, saved (``adapters/u<time>/``, atomically, with
  checksums) and registered in the store, then evaluated greedily (as it will serve) on the canary set:
  ``canary_tasks`` held-out shop tasks with known answers, every item equally often. It is deployed
  only if its canary success is within ``gate_margin`` of two references, both stored in the store:

      canary(candidate) >= canary(deployed version) - gate_margin   # no single update loses more
      canary(candidate) >= canary(starting version) - gate_margin   # nor a run of small losses, added up

  else it is refused, and the trainer goes back to the deployed weights (and a fresh optimizer). The
  starting version is the one the server was started with (the last version registered without a
  parent; version 0 in a simulation): its canary success is measured once and written to the store.
  So the record checks the promise: every deployed version's canary success is at most ``gate_margin``
  below its parent's and below the starting version's. Catastrophic forgetting shows here: the canary
  covers all items while the traffic may be a few.

  Why not the best canary success so far? A score is a noisy measure, and the best of many noisy
  measures is a lucky one: a bar set by it refuses every later update. The canary must also be large
  enough that one task is a small step against the margin: on ``canary_tasks`` = 144 a task moves the
  score by 0.007, and a margin of 0.05 is 7 tasks.

Every version stays in the store; ``python -m helpers.serve rollback --version N`` (or the admin
endpoint) deploys any of them, and the trainer follows: when the deployed pointer moves under it, it
goes back to that version's weights.

Simplifications, named: one update at a time; requests are trained on in arrival order, once as new
and later only as replay; probation audits every new user's first verifiable pieces (a reviewer's time per
new user); the canary set is fixed and scored greedily, so a version's score is one
number, measured once and stored (the trainer refuses to start on a store whose scores were measured
with another ``canary_tasks``); the audit reads the world's answer, which a real deployment buys with a reviewer's time.
"""

from __future__ import annotations

import hashlib
import hmac
import random
import secrets
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from peft import PeftModel, set_peft_model_state_dict
from safetensors.torch import load_file

from helpers.config import TrainConfig
from helpers.data import Task
from helpers.evaluation import evaluate
from helpers.formats import to_number
from helpers.grpo import LoRAGRPO, collate, group_advantages, group_rewards
from helpers.loop import seed_everything, step_seed
from helpers.policy import SamplingParams, load_model, make_policy, quiet_peft
from helpers.rewards import combine, score_trajectories
from helpers.rollout import rollout
from helpers.serve.store import SQLiteStore
from helpers.worlds.shop.env import ShopEnv
from helpers.worlds.shop.tasks import SYSTEM, make_agent_tasks

CANARY_SEED = 7777  # the canary set: the shop's test split drawn with this seed (items in turn)
CURSOR_KEY = "trainer.cursor"  # the last feedback id the trainer has consumed (trained on or dropped)
SEEN_KEY = "trainer.seen"  # the last feedback id the trainer has read, written when it waits for more
CANARY_KEY = "trainer.canary_tasks"  # the canary set the store's canary scores were measured on
AUDIT_SECRET_KEY = "trainer.audit_secret"  # the HMAC key that draws which feedback is audited (made at first start)
MAX_WAITING = 10_000  # references waiting for their users to be trusted; the oldest go first beyond this


@dataclass
class OnlineConfig:
    batch_tasks: int = 8  # B: verifiable requests per update
    group_size: int = 8  # G: episodes sampled per request
    canary_tasks: int = 144  # held-out tasks with known answers, every item equally often (module docstring)
    gate_margin: float = 0.05  # a candidate this far below the deployed or the starting version's canary is refused
    audit_rate: float = 0.2  # share of feedback checked against the world's answer
    min_audits: int = 2  # a new user's verifiable pieces are all audited until this many; only then judged and trusted
    min_reputation: float = 0.5  # (agreed + 1) / (audited + 2) below this: the user is ignored
    replay: int = 4  # requests trained on before (of as many items), replayed in each update beside the B new ones
    lr: float = 3e-3  # below tiny-agent's 5e-3, at which the gate refused most updates after the drift (forgetting)
    poll_s: float = 0.5  # seconds between looks at the store
    seed: int = 0  # each update's sampling seed is a function of (seed, the feedback that completed its batch)


def patient_rollout(*args, **kwargs):
    """``helpers.rollout.rollout`` with wall-clock limits of an hour, for the canary and the updates: an episode's clock
    counts its whole batch's generation, and on a busy machine the defaults (120 s an episode, 10 s a step) turned
    slowness into failed episodes, so a canary score would depend on the machine's load. The shop's tools do not hang."""
    return rollout(*args, **kwargs, episode_timeout=3600.0, step_timeout=3600.0)


def audit_secret(store) -> str:
    """The store's audit key: made (random) at the trainer's first start, read back ever after. Simplification,
    named: one trainer per store (two starting at once on a new store could each write their own key)."""
    if store.get_setting(AUDIT_SECRET_KEY) is None:
        store.set_setting(AUDIT_SECRET_KEY, secrets.token_hex(32))
    return store.get_setting(AUDIT_SECRET_KEY)


def starting_version(adapters: list[dict]) -> int:
    """The version the server was started with: the last one registered without a parent (the gate's second reference)."""
    return [a["version"] for a in adapters if a["parent"] is None][-1]


def gate(canary: float, deployed: float, start: float, margin: float) -> str | None:
    """Why a candidate whose canary success is ``canary`` is refused (module docstring), or None: it is deployed.

    gate(0.93, deployed=0.97, start=0.92, margin=0.05) -> None (0.04 below the deployed version: within the margin)
    gate(0.86, deployed=0.89, start=0.92, margin=0.05) -> "0.060 below the starting version's 0.920"
    """
    for name, reference in (("deployed", deployed), ("starting", start)):
        if canary < reference - margin - 1e-9:  # a drop of exactly the margin is allowed
            return f"{reference - canary:.3f} below the {name} version's {reference:.3f}"
    return None


def same_number(a: str | None, b: str | None) -> bool:
    x, y = to_number(a) if a is not None else None, to_number(b) if b is not None else None
    return x is not None and y is not None and x == y


def reference(feedback: dict) -> str | None:
    """The answer a piece of feedback makes the request's reference (module docstring), or None."""
    if feedback["correct_answer"] is not None:
        return feedback["correct_answer"]
    if feedback["rating"] == 1:
        return feedback["answer"]
    return None


def agrees_with_truth(feedback: dict) -> bool | None:
    """Whether the feedback tells the truth about the world's answer (None: the world has none)."""
    truth = feedback["truth"]
    if truth is None:
        return None
    if feedback["correct_answer"] is not None:
        return same_number(feedback["correct_answer"], truth)
    return same_number(feedback["answer"], truth) == (feedback["rating"] == 1)


class Reputation:
    """Each user's audited agreement with the world's answers, and which feedback is audited (module docstring)."""

    def __init__(self, config: OnlineConfig, secret: str):
        self.config = config
        self.key = secret.encode()
        self.audited: Counter = Counter()
        self.agreed: Counter = Counter()

    def is_audited(self, feedback: dict) -> bool:
        """Every piece of a user still on probation (fewer than ``min_audits`` audits); after that a share
        ``audit_rate`` of feedback ids, drawn by HMAC with the store's secret: the same draw in every process
        and after a restart, and no caller can tell from an id which piece will be checked."""
        if self.audited[feedback["user"]] < self.config.min_audits:
            return True
        digest = hmac.new(self.key, f"audit-{feedback['id']}".encode(), hashlib.sha256).hexdigest()
        return int(digest, 16) % 10_000 < self.config.audit_rate * 10_000

    def see(self, feedback: dict) -> bool | None:
        """Audit ``feedback`` if it is drawn and the world knows the answer: True / False (it agreed or not), None: not audited."""
        if not self.is_audited(feedback):
            return None
        verdict = agrees_with_truth(feedback)
        if verdict is not None:
            self.audited[feedback["user"]] += 1
            self.agreed[feedback["user"]] += verdict
        return verdict

    def score(self, user: str) -> float:
        return (self.agreed[user] + 1) / (self.audited[user] + 2)

    def trusted(self, user: str) -> bool:
        """Judged (``min_audits`` audits, all of a new user's first verifiable pieces) and found honest enough."""
        return self.audited[user] >= self.config.min_audits and self.score(user) >= self.config.min_reputation

    def found_out(self, user: str) -> bool:
        return self.audited[user] >= self.config.min_audits and self.score(user) < self.config.min_reputation


class FeedbackQueue:
    """Feedback, read in id order, becomes batches of training references (module docstring).

    A function of the feedback sequence alone: whenever and in whatever chunks the trainer reads the store,
    the same feedback gives the same batches, so a seeded run is the same run.

        for batch in queue.push(feedback):   # audited if drawn; a reference waits for its user to be trusted;
            train(batch)                     # each batch: the first B waiting references of trusted users
            queue.trained += batch           # the replay pool (after the update: a batch does not replay itself)
    """

    def __init__(self, online: OnlineConfig, secret: str):
        self.online = online
        self.reputation = Reputation(online, secret)
        self.waiting: list[dict] = []  # references not yet trained on, oldest first
        self.trained: list[dict] = []  # references trained on: the replay pool
        self.unverified: Counter = Counter()  # references per user on questions without a known answer, taken so far

    def add(self, feedback: dict) -> None:
        verdict = self.reputation.see(feedback)
        if reference(feedback) is None or verdict is False:  # nothing to train on, or a reference an audit found false
            return
        self.waiting.append(feedback)
        del self.waiting[: max(0, len(self.waiting) - MAX_WAITING)]  # unjudged users' pieces cannot pile up

    def push(self, feedback: dict) -> Iterator[list[dict]]:
        """Read one piece of feedback; yield every batch it completes (module docstring)."""
        self.add(feedback)
        while (batch := self.next_batch()) is not None:
            yield batch

    def next_batch(self) -> list[dict] | None:
        """The first ``batch_tasks`` waiting references whose users are trusted now, or None. A question without a
        known answer (truth None: never audited) is taken only from a trusted user with a passed audit to pay for it:
        a user's unverifiable references never outnumber their passed audits."""
        out = self.reputation.found_out
        self.waiting = [f for f in self.waiting if not out(f["user"])]  # a user found out loses what waits
        self.trained = [f for f in self.trained if not out(f["user"])]  # and what would be replayed
        batch, taken = [], Counter()
        for feedback in self.waiting:
            user = feedback["user"]
            if not self.reputation.trusted(user):
                continue
            if feedback["truth"] is None:
                if self.unverified[user] + taken[user] >= self.reputation.agreed[user]:
                    continue
                taken[user] += 1
            batch.append(feedback)
            if len(batch) == self.online.batch_tasks:
                chosen = {id(f) for f in batch}
                self.waiting = [f for f in self.waiting if id(f) not in chosen]
                self.unverified.update(taken)
                return batch
        return None

    def replay_sample(self, rng: random.Random) -> list[dict]:
        """``replay`` requests of the pool, of ``replay`` different items drawn evenly (module docstring)."""
        by_item: dict[str, list[dict]] = {}
        for feedback in self.trained:
            by_item.setdefault(feedback["world"]["item"], []).append(feedback)
        items = rng.sample(sorted(by_item), min(self.online.replay, len(by_item)))
        return [rng.choice(by_item[item]) for item in items]


def request_task(feedback: dict, answer: str) -> Task:
    """The stored request as a task whose reference is ``answer``: the same question, the same world row."""
    prompt = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": feedback["question"]}]
    return Task(feedback["episode_id"], prompt, answer, dict(feedback["world"]))


class OnlineTrainer:
    """Reads feedback from the store, trains, gates and deploys (module docstring)."""

    def __init__(self, config: TrainConfig, store: SQLiteStore, online: OnlineConfig = OnlineConfig()):
        self.store, self.online = store, online
        self.config = replace(config, lr=online.lr, device="cpu" if config.device == "auto" else config.device)
        model, tokenizer = load_model(self.config)
        self.deployed, path = store.deployed()
        if path:
            with quiet_peft():
                model = PeftModel.from_pretrained(model, path, is_trainable=True)
        self.trainer = LoRAGRPO(model, self.config, total_steps=1_000_000)  # online: the lr stays (almost) constant
        self.policy = make_policy(self.config, self.trainer.model, tokenizer)
        self.canary_set = make_agent_tasks(online.canary_tasks, seed=CANARY_SEED, split="test")
        measured_on = store.get_setting(CANARY_KEY, online.canary_tasks)
        if measured_on != online.canary_tasks:
            raise SystemExit(f"{store.path}: its canary scores were measured on {measured_on} canary tasks, not "
                             f"{online.canary_tasks}: pass --canary-tasks {measured_on}, or start a new store")
        store.set_setting(CANARY_KEY, online.canary_tasks)
        self.start = starting_version(store.adapters())
        self.start_canary = self.canary_of(self.start)  # the gate's two references (module docstring)
        self.deployed_canary = self.canary_of(self.deployed)
        self.queue = FeedbackQueue(online, audit_secret(store))  # reputation, what waits, the replay pool
        self.rng = random.Random(online.seed)  # the replay draws
        self.adapter_root = store.path.parent / "adapters"
        self.updates = 0
        print(f"trainer: deployed v{self.deployed}, canary {self.deployed_canary:.3f}; starting version "
              f"v{self.start}, canary {self.start_canary:.3f}", flush=True)

    def canary(self, policy) -> float:
        c = self.config
        result = evaluate(policy, self.canary_set, ShopEnv, max_new_tokens=c.max_new_tokens, max_steps=c.env_max_steps,
                          max_total_tokens=c.max_total_tokens, play=patient_rollout)
        return result.metrics["success"]

    def canary_of(self, version: int) -> float:
        """``version``'s canary success: from the store, or measured (on its weights, then back) and stored."""
        stored = next(a["canary"] for a in self.store.adapters() if a["version"] == version)
        if stored is not None:
            return stored
        deployed = self.deployed
        self.reset_to(version)
        score = self.canary(self.policy)
        self.store.set_canary(version, score)
        self.reset_to(deployed)
        return score

    def run(self, max_updates: int | None = None) -> None:
        cursor = self.store.get_setting(CURSOR_KEY, 0)
        seen = 0
        for feedback in self.store.feedback_since(0, limit=10**9):  # a restart: the queue again from all seen
            if feedback["id"] > cursor:
                break
            for batch in self.queue.push(feedback):  # trained before the restart: the replay pool
                self.queue.trained += batch
            seen = feedback["id"]
        while max_updates is None or self.updates < max_updates:
            self.follow_rollback()
            fresh = self.store.feedback_since(seen)
            for feedback in fresh:  # one at a time, in id order: the batches are the feedback's, not the reads' timing
                seen = feedback["id"]
                for batch in self.queue.push(feedback):
                    self.update(batch + self.queue.replay_sample(self.rng), seed=step_seed(self.online.seed, seen))
                    self.queue.trained += batch
                    self.store.set_setting(CURSOR_KEY, seen)
                    if max_updates is not None and self.updates >= max_updates:
                        return
            if not fresh:
                self.store.set_setting(SEEN_KEY, seen)
                time.sleep(self.online.poll_s)

    def update(self, batch: list[dict], seed: int = 0) -> int:
        """One GRPO update on ``batch``'s requests (its sampling drawn with ``seed``), then the gate. Returns the new version."""
        c, o = self.config, self.online
        t0 = time.perf_counter()
        seed_everything(seed)
        tasks = [request_task(f, reference(f)) for f in batch]
        sampling = SamplingParams(c.max_new_tokens, c.temperature, c.top_p, seed=seed)
        trajs = patient_rollout(tasks, ShopEnv, self.policy, group_size=o.group_size, sampling=sampling,
                                max_steps=c.env_max_steps, max_total_tokens=c.max_total_tokens, progress=False)
        rewards = score_trajectories(trajs, combine(c.rewards))
        advantages = group_advantages(group_rewards(trajs), c.scale_rewards)  # (len(batch), G): B new + replay
        stats = self.trainer.update(collate(trajs, advantages, True, c.mask_truncated_completions))
        self.policy.sync(self.trainer.model)
        canary = self.canary(self.policy)
        refusal = gate(canary, self.deployed_canary, self.start_canary, o.gate_margin)
        folder = self.save()
        note = (f"{len(batch)} requests x {o.group_size}: reward {sum(rewards) / len(rewards):.3f}, "
                f"loss {stats.get('loss', float('nan')):.4f}; canary {canary:.3f} vs deployed v{self.deployed} "
                f"{self.deployed_canary:.3f} and starting v{self.start} {self.start_canary:.3f}, margin {o.gate_margin}"
                + (f": {refusal}" if refusal else ""))
        version = self.store.add_adapter(str(folder), self.deployed, canary, self.deployed_canary,
                                         "refused" if refusal else "deployed", note)
        if refusal is None:
            self.store.deploy(version, "passed the canary gate")
            self.deployed, self.deployed_canary = version, canary
        else:
            self.reset_to(self.deployed)
        self.updates += 1
        print(f"trainer: v{version} {'REFUSED' if refusal else 'deployed'} | {note} | {time.perf_counter() - t0:.1f} s", flush=True)
        return version

    def save(self) -> Path:
        folder = self.adapter_root / f"u{time.time_ns()}"
        self.trainer.save_checkpoint(folder)  # atomic (tmp folder + rename), with checksums
        return folder

    def reset_to(self, version: int) -> None:
        """Back to ``version``'s adapter weights, with a fresh optimizer (its moments point the refused way)."""
        path = self.store.adapter_path(version)
        if path:
            set_peft_model_state_dict(self.trainer.model, load_file(Path(path) / "adapter_model.safetensors"))
        else:  # the preset's model alone: an adapter whose B is 0
            with torch.no_grad():
                for name, parameter in self.trainer.model.named_parameters():
                    if "lora_B" in name:
                        parameter.zero_()
        self.trainer.optimizer.state.clear()
        self.policy.sync(self.trainer.model)
        self.deployed = version

    def follow_rollback(self) -> None:
        """An operator deployed another version: continue from its weights; its canary is the gate's reference now."""
        version, _ = self.store.deployed()
        if version != self.deployed:
            self.reset_to(version)
            self.deployed_canary = self.canary_of(version)
            print(f"trainer: following the deployment of v{version}, canary {self.deployed_canary:.3f}", flush=True)
