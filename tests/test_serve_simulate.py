"""The simulated deployment end to end at its smallest (helpers.serve.simulate): the server and the trainer as
processes, users with feedback (some adversarial), the drift, the figures and the plot. The full runs' numbers
(three seeds) are in the README; this checks the pipeline, not the learning."""

import json
from helpers.serve.simulate import SimConfig, feedback_for, run_simulation
from helpers.serve.trainer import OnlineConfig


def test_simulated_users_feedback():
    import random

    rng = random.Random(0)
    assert feedback_for(rng, False, "141", "141", 3, thumbs_up=1.0) == {"rating": 1}
    assert feedback_for(rng, False, "47", "141", 3, thumbs_up=1.0) == {"rating": -1, "correct_answer": "141"}
    assert feedback_for(rng, True, "47", "141", 3, thumbs_up=1.0) == {"rating": 1}  # an adversary confirms a wrong answer
    lie = feedback_for(rng, True, "141", "141", 3, thumbs_up=1.0)
    assert lie["rating"] == -1 and lie["correct_answer"] in {"47", "131", "151"}


def test_a_small_simulated_deployment_runs_end_to_end(tmp_path):
    config = SimConfig(seed=0, out_dir=str(tmp_path / "sim"), adapter="base", rounds=3, drift_round=1, window=1, users=5,
                       asks_per_round=4, online=OnlineConfig(batch_tasks=2, group_size=2, canary_tasks=12, replay=1))
    summary = run_simulation(config)
    rounds = [json.loads(line) for line in (tmp_path / "sim" / "rounds.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == [0, 1, 2] and [r["drifted"] for r in rounds] == [False, True, True]
    assert all(0.0 <= r["success_learning"] <= 1.0 and r["latency_p95_s"] >= r["latency_p50_s"] > 0 for r in rounds)
    assert summary["updates_deployed"] + summary["updates_refused"] >= 1  # the trainer took the feedback
    assert summary["canary_within_margin"] and len(summary["drift_items"]) == 3  # the gate's rule held for every deployment
    assert (tmp_path / "sim" / "curves.png").stat().st_size > 10_000


def test_the_world_draws_each_request_s_row_whatever_order_requests_arrive_in():
    from helpers.serve.world import ServedShop

    users = [f"customer-{i}" for i in range(6)] * 2  # each asks twice
    question = "What do 3 of my usual items cost?"
    forward, backward = ServedShop(seed=0), ServedShop(seed=0)
    rows_forward = [(u, forward.task("ep", u, question).metadata["prices"]) for u in users]
    rows_backward = [(u, backward.task("ep", u, question).metadata["prices"]) for u in reversed(users)]
    by_user = lambda rows: {u: [p for v, p in rows if v == u] for u in set(users)}  # noqa: E731
    assert by_user(rows_forward) == by_user(rows_backward)  # a customer's n-th request: the same prices
    assert ServedShop(seed=1).task("ep", "customer-0", question).metadata["prices"] != rows_forward[0][1]


def test_recovery_is_judged_with_the_named_margin():
    from helpers.serve.simulate import summarise

    rounds = [{"round": i, "success_learning": s, "success_frozen": 0.9 if i < 2 else 0.4, "latency_p50_s": 0.1,
               "latency_p95_s": 0.2} for i, s in enumerate([0.9, 0.9, 0.5, 0.82])]
    adapters = [{"version": 0, "parent": None, "canary": 0.9, "status": "deployed"}]
    judge = lambda margin: summarise(SimConfig(drift_round=2, window=1, recovery_margin=margin), rounds, adapters,  # noqa: E731
                                     [], {}, 1.0)
    assert not judge(0.05)["recovered"] and judge(0.1)["recovered"]
    assert judge(0.05)["frozen_stays_down"]
