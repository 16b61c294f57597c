"""Benchmarks, run from the command line and printed as ratios measured side by side:

    python -m helpers.bench rollout     # batched rollout vs one episode at a time vs TRL's generation
    python -m helpers.bench grpo        # one GRPO step: time in rollout vs env vs training

CPU timings are noisy (other work shares the cores), so every benchmark measures
its contenders in one run, one after the other, and reports ratios, not absolute speeds.
"""
