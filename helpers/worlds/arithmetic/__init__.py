"""The one-call world (一步小世界): "What is 47*86?", solved by calling the calculator once and copying its answer.

The first look of notebooks 02-05: the smallest world where a tool helps. Every question is a
two-digit by two-digit product with a four-digit answer, too hard for the tiny model to compute
in its head but only copying for the calculator; the warm start (``data/tiny``) was shown both
ways, with and without the tool, and RL finds out which one pays.

The world's files:

    tasks.py    the tasks (dataset "tiny"), their hash split, demonstrations; the env is the generic "calculator"
    presets.py  tiny-cpu: learn to use the calculator on a laptop CPU
    build.py    the warm start data/tiny (python -m helpers.worlds.arithmetic build) and its baseline

    tasks = make_tiny_tasks(64, seed=0, split="test")   # or load_dataset("tiny", "test", 64)
    model, tokenizer = load_tiny()                      # helpers.worlds.tinymodel: data/tiny, offline
    python -m helpers.train --preset tiny-cpu

Simplifications, named:

* One kind of problem, so every question has the same length in tokens and the digits to copy
  always sit at the same distance back: the easiest copy a small transformer can learn.
* The question writes the expression exactly as the calculator takes it (``47*86``), so a tool
  call is a token-for-token copy.
"""

from helpers.worlds.arithmetic import presets, tasks  # noqa: F401  (register the dataset "tiny" and the preset "tiny-cpu")
