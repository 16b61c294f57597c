"""The benchmarks at their smallest: what they measure, what they report, and the order they measure it in."""

import pytest
import torch

from helpers.lab.bench import grpo, rollout


@pytest.fixture(scope="module")
def rollout_out():
    """One small run of the rollout bench: 2 tasks x G = 2, two repeats, every contender but vLLM."""
    threads = torch.get_num_threads()  # the bench sets one thread; the tests after it get theirs back
    yield rollout.run(num_tasks=2, group_size=2, max_new_tokens=8, naive_tasks=1, repeats=2, verbose=False)
    torch.set_num_threads(threads)


def test_rollout_bench_interleaves_the_limit_with_the_contenders(rollout_out):
    names = ["matmul", *(f"shop_{b}" for b in rollout.BACKENDS), "batched", "one_at_a_time",
             "single_turn_ours", "trl"]
    assert rollout_out["order"] == names * 2  # A B C ... A B C ...: each repeat measures every contender once
    assert len(rollout_out["matmul_gflops_runs"]) == 2 and rollout_out["matmul_gflops"] > 0


def test_rollout_bench_reports_fractions_of_the_limit_and_ratios(rollout_out):
    assert rollout_out["shop_hf"].episodes == 4 and rollout_out["shop_hf"].tokens > 0
    assert set(rollout_out["fractions"]) == set(rollout_out["runs"])
    assert all(0 < f <= 1 for values in rollout_out["fractions"].values() for f in values)
    # 2 x parameters: the shop world's model has a larger vocabulary than the calculator world's
    assert rollout_out["flops_per_token"]["data/tiny-agent"] > rollout_out["flops_per_token"]["data/tiny"] > 1e6
    for name in ("speedup_vs_one_at_a_time", "speedup_vs_trl"):
        assert len(rollout_out["ratios"][name]) == 2 and rollout_out[name] > 0
    text = rollout.table(rollout_out)
    assert "LIMIT float32 512x512 matmul" in text and "RATIO ours / TRL generation" in text
    assert rollout_out["cpu"] and f"thread(s) on {rollout_out['cpu']}: " in text  # a fraction is read with its chip


def test_rollout_bench_engine_contender(rollout_out):
    assert rollout_out["shop_engine"].episodes == rollout_out["shop_hf"].episodes
    assert len(rollout_out["ratios"]["engine_vs_hf"]) == 2 and rollout_out["engine_vs_hf"] > 0
    assert "RATIO engine / transformers, shop world" in rollout.table(rollout_out)


def test_rollout_bench_splits_the_shop_rollouts_wall_clock(rollout_out):
    text = rollout.table(rollout_out)
    for backend in rollout.BACKENDS:
        runs = rollout_out["runs"][f"shop_{backend}"]
        stats = sorted(runs, key=lambda r: r.tokens_per_s)[1].stats  # the median of two repeats: the faster one
        assert 0 < stats.generate_s and 0 < stats.env_s and 0 < stats.render_s
        assert stats.generate_s + stats.env_s + stats.render_s <= stats.total_s
        line = next(line for line in text.splitlines() if line.startswith(f"SPLIT {runs[0].name}"))
        assert f"{stats.total_s * 1e3:.0f} ms: policy.generate {stats.generate_s * 1e3:.0f} ms" in line
        assert "env" in line and "tokenizer" in line and "the rest" in line
    assert sum(line.startswith("SPLIT") for line in text.splitlines()) == len(rollout.BACKENDS)


def test_rollout_bench_refuses_an_unknown_backend():
    with pytest.raises(SystemExit):
        rollout.main(["--backends", "hf,tpu"])
    with pytest.raises(ValueError, match="backends"):
        rollout.run(backends=("tpu",), verbose=False)


def test_grpo_bench_alternates_trl_and_ours(one_thread):
    out = grpo.run(num_tasks=2, group_size=2, max_new_tokens=4, steps=3, verbose=False)
    assert out["order"] == ["trl", "ours"] * 6  # 3 full steps, then 3 updates, each pair TRL then ours
    for name in ("step", "update"):
        pairs = out[f"ratios_{name}"]
        assert len(pairs) == 2 and all(r > 0 for r in pairs)  # the warm-up pair dropped
        assert min(pairs) <= out[f"ratio_{name}"] <= max(pairs) and out[f"ratio_{name}_range"] == (min(pairs), max(pairs))
    assert out["ours_tokens"] > 0 and out["trl_tokens"] > 0
