"""The online trainer (helpers.serve.trainer): what feedback becomes, reputation, the canary gate, rollback."""

import random
import pytest
import torch

import helpers.worlds  # noqa: F401
from helpers.config import get_preset
from helpers.serve.__main__ import open_store, register_start
from helpers.serve.trainer import FeedbackQueue, OnlineConfig, OnlineTrainer, Reputation, agrees_with_truth, gate, reference
from helpers.serve.world import ServedShop, random_question


def fb(id=1, user="ann", rating=None, correct_answer=None, answer="141", truth="141"):
    return {"id": id, "user": user, "rating": rating, "correct_answer": correct_answer, "answer": answer, "truth": truth,
            "episode_id": f"ep-{id}", "question": "What do 3 of my usual items cost?", "world": {}}


def test_feedback_becomes_a_reference_only_when_it_says_what_is_right():
    assert reference(fb(correct_answer="150", rating=-1)) == "150"
    assert reference(fb(rating=1)) == "141"  # a thumbs up confirms the agent's answer
    assert reference(fb(rating=-1)) is None  # a thumbs down alone says what is wrong, not what is right
    assert agrees_with_truth(fb(rating=1)) is True
    assert agrees_with_truth(fb(rating=-1)) is False  # a right answer marked wrong
    assert agrees_with_truth(fb(rating=1, answer="47")) is False  # a wrong answer confirmed
    assert agrees_with_truth(fb(correct_answer="47")) is False
    assert agrees_with_truth(fb(correct_answer="141.0")) is True
    assert agrees_with_truth(fb(rating=1, truth=None)) is None  # the world has no answer: nothing to audit


def test_reputation_ignores_a_liar_after_two_audits_and_keeps_an_honest_user():
    reputation = Reputation(OnlineConfig(audit_rate=1.0, min_audits=2), "secret")
    reputation.see(fb(1, user="liar", rating=-1))
    assert not reputation.trusted("liar") and not reputation.found_out("liar")  # one audit: not judged, not trusted
    reputation.see(fb(2, user="liar", correct_answer="47"))
    assert reputation.found_out("liar") and reputation.score("liar") == 0.25
    for i in range(3, 6):
        reputation.see(fb(i, user="honest", rating=1))
    reputation.see(fb(6, user="honest", rating=1, answer="47"))  # one mistake
    assert reputation.trusted("honest")


def test_audits_are_drawn_with_the_secret_after_probation():
    online = OnlineConfig(audit_rate=0.2, min_audits=2)
    reputation = Reputation(online, "secret")
    assert reputation.is_audited(fb(1, user="new")) and reputation.is_audited(fb(2, user="new"))  # probation: all
    reputation.audited["old"] = 5
    draws = [reputation.is_audited(fb(i, user="old")) for i in range(5000)]
    assert 0.17 < sum(draws) / 5000 < 0.23
    other = Reputation(online, "another secret")
    other.audited["old"] = 5
    assert draws != [other.is_audited(fb(i, user="old")) for i in range(5000)]  # the key, not the id, decides


def test_the_gate_compares_with_the_deployed_and_the_starting_version_not_the_best_so_far():
    margin = 0.05
    # a lucky 0.97 does not lock out what follows: each candidate is held to its parent, not to the best seen
    assert gate(0.93, deployed=0.97, start=0.90, margin=margin) is None
    assert gate(0.90, deployed=0.93, start=0.90, margin=margin) is None  # the best-so-far rule refused this (0.97 - 0.05)
    assert gate(0.5, deployed=0.55, start=0.55, margin=margin) is None  # a drop of exactly the margin is allowed
    assert "deployed version's 0.970" in gate(0.91, deployed=0.97, start=0.90, margin=margin)  # one update, too far
    # a slow slide: each step within the margin of its parent, the sum not within it of the start
    assert "starting version's 0.900" in gate(0.84, deployed=0.86, start=0.90, margin=margin)


def test_replay_draws_items_evenly_not_the_pool_s_mix():
    pool = [{"id": i, "world": {"item": "key"}} for i in range(90)] + [{"id": 90 + i, "world": {"item": item}}
                                                                        for i, item in enumerate(["cake", "pen", "mug", "hat"])]
    queue, rng = FeedbackQueue(OnlineConfig(replay=4), "secret"), random.Random(0)
    queue.trained = pool
    draws = [queue.replay_sample(rng) for _ in range(200)]
    assert all(len({f["world"]["item"] for f in draw}) == 4 for draw in draws)  # four requests of four items
    cake = sum(any(f["world"]["item"] == "cake" for f in draw) for draw in draws) / len(draws)
    assert 0.65 < cake < 0.95  # 4 of 5 items each time: cake in 80 % of updates, not the 4 % its share of the pool gives


def make_trainer(tmp_path, start_canary=None, canary_tasks=12):
    store = open_store(str(tmp_path / "store.db"))
    register_start(store, None)  # the preset's model alone is version 0
    if start_canary is not None:
        store.set_canary(0, start_canary)  # as if measured before: the trainer reads it, it does not measure again
    online = OnlineConfig(batch_tasks=2, group_size=4, canary_tasks=canary_tasks, lr=0.0)  # lr 0: an update changes nothing
    return OnlineTrainer(get_preset("tiny-agent"), store, online)


@pytest.fixture
def trainer(tmp_path):
    return make_trainer(tmp_path)


def test_the_trainer_gates_each_update_against_its_parent_and_the_start_and_records_both(tmp_path, monkeypatch):
    trainer = make_trainer(tmp_path, start_canary=0.90)
    store = trainer.store
    assert (trainer.start, trainer.start_canary, trainer.deployed_canary) == (0, 0.90, 0.90)
    scores = [0.97, 0.91, 0.93, 0.90, 0.86, 0.84]  # the candidates' canary successes, in turn
    monkeypatch.setattr(trainer, "canary", lambda policy: scores.pop(0))
    assert [trainer.update(batch(seed=k)) for k in range(6)] == [1, 2, 3, 4, 5, 6]
    rows = store.adapters()
    assert [r["status"] for r in rows[1:]] == ["deployed", "refused", "deployed", "deployed", "deployed", "refused"]
    assert "deployed version's 0.970" in rows[2]["note"] and "starting version's 0.900" in rows[6]["note"]
    assert [(r["parent"], r["parent_canary"]) for r in rows[1:]] == [(0, 0.90), (1, 0.97), (1, 0.97), (3, 0.93), (4, 0.90),
                                                                     (5, 0.86)]  # the reference each was held to
    assert store.deployed()[0] == 5 and trainer.deployed_canary == 0.86


def test_the_trainer_refuses_a_store_measured_on_another_canary(tmp_path):
    make_trainer(tmp_path, start_canary=0.90)
    with pytest.raises(SystemExit, match="--canary-tasks 12"):
        make_trainer(tmp_path, canary_tasks=24)


def batch(n=2, seed=0):
    world, rng = ServedShop(seed), random.Random(seed)
    tasks = [world.task(f"ep-{i}", f"u{i}", random_question(rng)) for i in range(n)]
    return [{**fb(i, correct_answer=t.answer), "episode_id": t.id, "question": t.prompt[1]["content"], "world": t.metadata}
            for i, t in enumerate(tasks)]


def test_the_gate_deploys_a_harmless_update_refuses_a_harmful_one_and_rollback_is_followed(trainer):
    store = trainer.store
    first = trainer.update(batch())
    assert store.deployed()[0] == first and store.adapters()[first]["status"] == "deployed"
    bar = trainer.deployed_canary
    def poisoned_update(collated):  # a harmful update: the adapter scrambled
        with torch.no_grad():
            for name, parameter in trainer.trainer.model.named_parameters():
                if "lora_B" in name:
                    parameter.normal_(0.0, 1.0)
        return {"loss": 0.0}

    trainer.trainer.update = poisoned_update
    refused = trainer.update(batch(seed=1))
    row = store.adapters()[refused]
    assert row["status"] == "refused", row
    assert row["canary"] < bar - trainer.online.gate_margin
    assert store.deployed()[0] == first  # still the version before the refused one
    assert trainer.canary(trainer.policy) == pytest.approx(bar)  # and the trainer is back on its weights
    store.deploy(0, "test: roll back to the start")
    trainer.follow_rollback()
    assert trainer.deployed == 0
