"""The GSM8K world: grade-school math word problems, on Qwen2.5-Instruct on a GPU (notebook 07).

The env is the generic one: ``math`` (one answer) or ``calculator`` (the calculator as a tool,
in Qwen2.5's own tool format); the answer is judged by ``helpers.formats.judge_answer``.

The world's files:

    tasks.py    GSM8K from the hub (dataset "gsm8k") or from a local file in its format ("gsm8k-sample": data/gsm8k_sample.jsonl)
    benchmark.py  the benchmarks "gsm8k" and "gsm8k-sample" (python -m helpers.evaluate --benchmark gsm8k)
    presets.py  gsm8k-24gb(-tools) and gsm8k-t4(-tools) for a GPU, gsm8k(-tools)-cpu-smoke for the CPU path of each

    python -m helpers.train --preset gsm8k-24gb-tools    # on one 24 GB GPU
"""

from helpers.worlds.gsm8k import benchmark, presets, tasks  # noqa: F401  (register the datasets, the benchmarks and the presets)
