"""Attacks on the feedback the online trainer learns from (helpers.serve.trainer): sybils, audit dodging, framing.

Each test writes served episodes and feedback into a store, runs the trainer's own loop (``OnlineTrainer.run``)
with its update replaced by a recorder, and reads what would have been trained on."""

import hashlib
import random

import pytest

import helpers.serve.trainer as trainer_module
from helpers.config import get_preset
from helpers.serve.__main__ import open_store, register_start
from helpers.serve.store import EpisodeRecord
from helpers.serve.trainer import OnlineConfig, OnlineTrainer
from helpers.serve.world import ServedShop, random_question

UNVERIFIABLE = "What do 3 of my usual items cost?!"  # the world's pattern does not match: no known answer


class Caught(Exception):
    """The trainer read everything and waits for more: the test is over."""


class Deployment:
    """A store with a starting version, served episodes written as the server writes them, and feedback."""

    def __init__(self, tmp_path, seed=0):
        self.store = open_store(str(tmp_path / "store.db"))
        register_start(self.store, None)
        self.store.set_canary(0, 0.9)  # as if measured: the trainer does not evaluate at its start
        self.world, self.rng, self.count = ServedShop(seed), random.Random(seed), 0

    def episode(self, user, question=None, wrong=False) -> EpisodeRecord:
        """One served request of ``user``; the agent's answer is the world's, or a wrong one."""
        self.count += 1
        question = question or random_question(self.rng)
        task = self.world.task(f"ep-{self.count}", user, question)
        answer = str(int(task.answer or 100) + (10 if wrong or task.answer is None else 0))
        record = EpisodeRecord(id=task.id, user=user, model="tiny-agent", adapter_version=0, question=question,
                               answer=answer, stop_reason="answered", world=task.metadata, truth=task.answer, messages=[],
                               token_ids=[], mask=[], logprobs=[], prompt_len=0, temperature=0.0, latency_s=0.0)
        self.store.add_episode(record)
        return record

    def honest(self, user, pieces=3) -> list[int]:
        """``pieces`` thumbs up on right answers of verifiable questions: ids of the feedback."""
        return [self.store.add_feedback(self.episode(user).id, user, 1, None) for _ in range(pieces)]

    def lie(self, user, question=None) -> int:
        """A false correct answer on a right answer."""
        record = self.episode(user, question)
        return self.store.add_feedback(record.id, user, -1, str(int(record.answer) + 10))

    def trained(self, **online) -> list[dict]:
        """Every reference the trainer's loop puts in a batch, reading the store until it waits for more."""
        online = OnlineConfig(**{"batch_tasks": 2, "replay": 0, "canary_tasks": 12, "lr": 0.0, **online})
        trainer = OnlineTrainer(get_preset("tiny-agent"), self.store, online)
        batches = []

        def record(batch, seed=0):
            batches.append(batch)
            trainer.updates += 1

        def stop(seconds):
            raise Caught

        trainer.update = record
        original = trainer_module.time.sleep
        trainer_module.time.sleep = stop
        try:
            with pytest.raises(Caught):
                trainer.run()
        finally:
            trainer_module.time.sleep = original
        return [feedback for batch in batches for feedback in batch]


def public_audit(feedback_id: int, rate: float = 0.2) -> bool:
    """What anyone could compute about a feedback id from the rule before the audit key."""
    return int(hashlib.sha256(f"audit-{feedback_id}".encode()).hexdigest(), 16) % 10_000 < rate * 10_000


def test_sybils_teach_nothing(tmp_path):
    """24 new names, one wrong correct_answer each: none becomes a reference; honest users still teach."""
    deployment = Deployment(tmp_path)
    sybil_ids = {deployment.lie(f"sybil-{i:02d}") for i in range(24)}
    honest_ids = {i for user in ("ann", "bob") for i in deployment.honest(user, pieces=3)}
    trained = {f["id"] for f in deployment.trained()}
    assert not trained & sybil_ids
    assert trained <= honest_ids and len(trained) >= 4  # each passed probation (two audits), then was trained on


def test_wrong_answers_on_unverifiable_questions_are_not_trained_on(tmp_path):
    """Audit dodging: a new user's answers where the world has none are never references; a trusted user's
    at most one per audit they passed."""
    deployment = Deployment(tmp_path)
    dodges = {deployment.lie("dodger", UNVERIFIABLE) for _ in range(8)}
    deployment.honest("ann", pieces=2)  # two passed audits: trusted, with two unverifiable references to spend
    anns = [deployment.lie("ann", UNVERIFIABLE) for _ in range(5)]
    deployment.honest("bob", pieces=2)
    trained = {f["id"] for f in deployment.trained()}
    assert not trained & dodges
    assert len(trained & set(anns)) == 2


def test_predicted_audits_cannot_frame_an_honest_user(tmp_path):
    """Wrong answers sent in victor's name on the ids the old public rule audits: with the store's secret key the
    attacker cannot aim at audits, and victor stays trusted (the per-user keys of the server stop the sending)."""
    deployment = Deployment(tmp_path)
    deployment.store.set_setting("trainer.audit_secret", "a fixed key for the test")  # AUDIT_SECRET_KEY: the same draws each run
    victors = deployment.honest("victor", pieces=4)
    framed = 0
    while framed < 3:  # the attacker answers in victor's name only when the next id is one the public rule audits
        if public_audit(deployment.store.feedback_count() + 1):
            deployment.lie("victor")
            framed += 1
        else:
            deployment.honest("filler")
    later = deployment.honest("victor", pieces=2)
    trained = {f["id"] for f in deployment.trained()}
    assert set(later) <= trained and set(victors) <= trained  # still trusted: his honest feedback is trained on
