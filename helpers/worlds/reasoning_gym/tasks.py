"""reasoning-gym's generators as datasets: ``reasoning_gym/<generator>``, with its own verifier.

    tasks = load_dataset("reasoning_gym/chain_sum", "test", 64, seed=0)            # default difficulty
    tasks = load_dataset("reasoning_gym/products:max_digits=2", "train", 500)      # a config of the generator
    score_reply("... <answer>4959</answer>", **tasks[0].row())["score"]            # the generator's score_answer

reasoning-gym (``pip install -e '.[benchmarks]'``) generates questions procedurally: each of its
generators (``chain_sum``, ``products``, ``sudoku``, ``zebra_puzzles``... about 100) makes an
entry ``{"question", "answer", "metadata"}`` from a seed, and scores an answer with its own
``score_answer(answer, entry) -> float`` in [0, 1] (some give partial credit). A dataset name is
``reasoning_gym/<generator>``, optionally followed by the generator's config,
``:key=value,key=value`` (values read as JSON: ``max_digits=2``, ``allow_negation=true``,
``operators=["+","-"]``; a bare word is a string).

The splits are leak-free by construction: a question belongs to the split its text hashes to
(``helpers.worlds.arithmetic.tasks.split_of``, 80/10/10), whatever the seed or the number of tasks
asked for, so no test question is ever a training question; each split and seed also draws from
its own stream of generator seeds, and a split holds each question once.

What the policy sees: reasoning-gym's own "default" system prompt (think step by step, then
``<answer>answer here</answer>``) and the question. What is judged: the text of the last
``<answer>...</answer>`` (the package's ``extract_answer``), scored by the generator's
``score_answer``: the package's verifier, called, never re-implemented here.

Simplifications, named:

* The entry travels in the task (``metadata["entry"]``) as the generator made it, Python objects
  and all: the verifier reads it back as is. A JSON round trip would break some verifiers
  (``arc_agi`` and ``rearc`` compare tuples with lists: their own answer scores 0.05 after one).
* Held-out splits cost draws: a 64-task test split takes about 640 draws (its share is 10 %). Most
  generators make an entry at once; the slowest (``knight_swap``, ``zebra_puzzles``) take long enough
  that their test splits take a minute or more.
* A generator with few distinct questions (``chain_sum:max_terms=2,max_digits=1`` has 200) cannot
  fill a large split; after ``MAX_MISSES`` draws in a row that add nothing new, loading stops with an
  error saying so.
* Five generators (``boxnet``, ``graph_color``, ``propositional_logic``, ``rubiks_cube``,
  ``rush_hour``) accept many answers and give none (``Task.answer`` is None): only their verifier knows.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
import numbers
import re

from helpers.data import DatasetError, Task, register_dataset, register_dataset_family
from helpers.hub import import_extra
from helpers.worlds.arithmetic.tasks import SPLITS, TINY_SYSTEM, split_of

EXTRA = "benchmarks"  # the pyproject extra that installs reasoning-gym
CHUNK = 500  # entries drawn from one generator seed; the next chunk starts at seed + CHUNK (generators draw entry i from seed + i)
MAX_MISSES = 5000  # draws in a row that add no new question of the split: the generator has no more
DEFAULT_SIZE = {"train": 1000, "validation": 64, "test": 64}  # tasks when the caller asks for "all" (n=None)


def parse_member(member: str) -> tuple[str, dict]:
    """``"products:max_digits=2,allow_negation=true"`` -> ``("products", {"max_digits": 2, "allow_negation": True})``.

    Items are split at commas that start a new ``key=``, so a JSON list keeps its commas.
    """
    generator, _, options = member.partition(":")
    config: dict = {}
    for item in re.split(r",(?=\s*\w+=)", options) if options else []:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise DatasetError(f"reasoning_gym/{member}: expected the generator's config as key=value,key=value after ':', got {item!r}")
        try:
            config[key] = json.loads(value)
        except json.JSONDecodeError:
            config[key] = value.strip()  # a bare word: a string
    if {"seed", "size"} & set(config):
        raise DatasetError(f"reasoning_gym/{member}: 'seed' and 'size' are the loader's (load_dataset's seed and n), not the name's")
    return generator, config


def dataset_name(generator: str, config: dict) -> str:
    """The dataset name of a generator and config, as ``parse_member`` reads it: ``reasoning_gym/products:max_digits=2``."""
    options = ",".join(f"{key}={json.dumps(value, separators=(',', ':'))}" for key, value in config.items())
    return f"reasoning_gym/{generator}" + (f":{options}" if options else "")


def create(generator: str, config: dict, seed: int, size: int):
    """reasoning-gym's own ``create_dataset``; an unknown generator or a config it refuses is a ``DatasetError``."""
    rg = import_extra("reasoning_gym", EXTRA)
    known = rg.factory.DATASETS
    if generator not in known:
        raise DatasetError(f"reasoning_gym has no generator {generator!r}; it has {len(known)}: {', '.join(sorted(known))}")
    try:
        return rg.create_dataset(generator, seed=seed, size=size, **config)
    except (TypeError, ValueError, AssertionError) as e:  # an unknown field, a value its validate() refuses
        raise DatasetError(f"{dataset_name(generator, config)}: the generator refused its config "
                           f"({type(e).__name__}: {e}); see the fields of its config class in reasoning_gym") from None


def entries(generator: str, config: dict, split: str, seed: int):
    """The generator's entries for one split and seed, endlessly: chunks of ``CHUNK``, chunk ``c`` made with
    generator seed ``base + c * CHUNK``, where ``base`` is a hash of the generator, split and seed."""
    base = int(hashlib.sha256(f"reasoning_gym-{generator}-{split}-{seed}".encode()).hexdigest()[:8], 16)
    for chunk in itertools.count():
        dataset = create(generator, config, seed=base + chunk * CHUNK, size=CHUNK)
        for i in range(CHUNK):
            yield dataset[i]


def make_rg_tasks(generator: str, n: int, seed: int = 0, split: str = "train", config: dict | None = None,
                  system: str | None = None) -> list[Task]:
    """``n`` distinct tasks of one split from a reasoning-gym generator, drawn from ``seed``.

    ``config``: the generator's config fields (its difficulty: ``{"max_digits": 2}``); ``system``: the
    system prompt (default: reasoning-gym's "default" prompt). Each task's ``answer`` is the entry's
    answer (None where the generator gives none) and its metadata holds what the verifier needs:
    ``generator``, ``config`` and the ``entry`` itself.
    """
    if split not in SPLITS:
        raise DatasetError(f"unknown split {split!r}; choose from {list(SPLITS)}")
    config = dict(config or {})
    name = dataset_name(generator, config)
    if system is None:
        system = import_extra("reasoning_gym.utils", EXTRA).SYSTEM_PROMPTS["default"]
    drawn = entries(generator, config, split, seed)
    tasks: list[Task] = []
    seen: set[str] = set()
    misses = 0
    while len(tasks) < n:
        entry = next(drawn)
        question = entry["question"]
        if question in seen or split_of(question) != split:
            misses += 1
            if misses > MAX_MISSES:
                raise DatasetError(f"{name}: found only {len(tasks)} distinct {split} questions of the {n} asked for "
                                   f"({MAX_MISSES} draws in a row added none); ask for fewer, or widen the generator's config")
            continue
        seen.add(question)
        misses = 0
        answer = entry["answer"] if isinstance(entry["answer"], str) else None
        prompt = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        metadata = {"generator": generator, "config": config, "entry": entry}
        tasks.append(Task(f"{name}-{split}-{seed}-{len(tasks):05d}", prompt, answer, metadata))
    return tasks


@register_dataset_family("reasoning_gym")
def reasoning_gym_dataset(member: str, split: str, n: int | None, seed: int) -> list[Task]:
    """The dataset registry's view (``config.dataset = "reasoning_gym/chain_sum"``): ``n`` tasks of ``split``
    (None: ``DEFAULT_SIZE``)."""
    generator, config = parse_member(member)
    return make_rg_tasks(generator, n if n is not None else DEFAULT_SIZE[split], seed=seed, split=split, config=config)


@register_dataset("tiny-products")
def tiny_products_dataset(split: str, n: int | None, seed: int) -> list[Task]:
    """reasoning-gym's ``products`` generator with two-digit factors ("Solve the following multiplication:
    87 * 64. Give only the result as your final answer."), under the one-call world's short system prompt
    (``TINY_SYSTEM``) instead of reasoning-gym's 430-token one, which the tiny models never saw. Played by
    ``reasoning_gym_calculator`` and judged by the generator's verifier: the tiny market's third world."""
    return make_rg_tasks("products", n if n is not None else DEFAULT_SIZE[split], seed=seed, split=split,
                         config={"max_digits": 2}, system=TINY_SYSTEM)


# --- the verifier: the generator's own score_answer ------------------------------------------

_VERIFIERS: dict[str, object] = {}  # generator + config -> a dataset of that generator and config (its score_answer)


def verifier(generator: str, config: dict):
    """A dataset of ``generator`` with ``config``, made once: its ``score_answer`` is the verifier (some
    verifiers read the config, so it is the task's own; seed and size do not enter scoring)."""
    key = generator + json.dumps(config, sort_keys=True, default=str)
    if key not in _VERIFIERS:
        _VERIFIERS[key] = create(generator, config, seed=0, size=1)
    return _VERIFIERS[key]


def score_reply(text: str, generator: str, config: dict, entry: dict, **row) -> dict:
    """Judge one reply with the generator's verifier: ``{"predicted", "score", "correct", "verdict"}``.

    ``predicted`` is the last ``<answer>...</answer>`` of ``text`` (reasoning-gym's ``extract_answer``;
    None without one), ``score`` is ``score_answer(predicted, entry)`` in [0, 1], ``correct`` is
    ``score == 1``, and ``verdict`` says which: ``"correct"``, ``"partial"`` (0 < score < 1),
    ``"wrong_answer"``, or ``"no_answer"``. The other columns of a task's row (``**row``) are ignored, so
    ``score_reply(text, **task.row())`` works. The verifier's own exceptions propagate.

    ``extract_answer``'s pattern (``<answer>\\s?(.*?)\\s?</answer>``) scans from every ``<answer>`` to
    the text's end when no ``</answer>`` follows it, so its time grows with the square of the tags. Cut
    after the last ``</answer>``, every tag it tries closes, and the scan is linear; the answer is the same, since every match ends with a ``</answer>``.
    """
    close = text.rfind("</answer>")  # every match ends with it: the text after the last one cannot change the answer
    readable = text[: close + len("</answer>")] if close >= 0 else ""  # and reading only this part is linear (see below)
    predicted = import_extra("reasoning_gym.utils", EXTRA).extract_answer(readable)
    score = verifier(generator, config).score_answer(predicted, copy.deepcopy(entry))  # a copy: a verifier may not change the task
    if isinstance(score, bool) or not isinstance(score, numbers.Real) or not math.isfinite(score):
        raise TypeError(f"{generator}'s score_answer returned {type(score).__name__} {score!r}, not a finite number")
    score = float(score)
    if score >= 1.0:
        verdict = "correct"
    elif predicted is None:
        verdict = "no_answer"
    else:
        verdict = "partial" if score > 0 else "wrong_answer"
    return {"predicted": predicted, "score": score, "correct": score >= 1.0, "verdict": verdict}
