"""The lab: measurements and checks about the core, beside it, never inside it.

    bench/        speed benchmarks, ours against TRL's: ``python -m helpers.lab.bench rollout|grpo``
    mismatch.py   the train-inference mismatch that importance sampling corrects: ``python -m helpers.lab.mismatch``
    memory.py     will a run fit on a GPU: the memory plan of a colocated GRPO run
    pitfalls.py   the checklist before a long run (``preflight``)

The core never imports this room (pyproject.toml's import contract); each module here imports the core.
"""
