"""Benchmarks, run from the command line and printed as ratios measured side by side:

    python -m helpers.lab.bench rollout     # rollout tokens/s as a fraction of the machine's matmul limit; batched vs
                                            # one episode at a time; engine vs transformers; ours vs TRL's generation
    python -m helpers.lab.bench grpo        # one GRPO step, ours vs TRL's GRPOTrainer: full step and update only

CPU timings are noisy (other work shares the cores), so every benchmark measures its contenders
in one run, interleaved (A B A B ...: a change in load hits both sides alike), and reports the
median of the ratios within each round with their spread (min-max), not absolute speeds alone.
The load average is printed beside them.
"""
