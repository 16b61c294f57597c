"""GSM8K as Tasks: from the Hugging Face hub, or from a local file in GSM8K's own format.

    tasks = load_gsm8k("train", source="data/gsm8k_sample.jsonl")  # or source="hub"
    load_dataset("gsm8k", "test")                                # the registry's view: the hub's 1,319 test problems

Simplifications, named: gold answers are parsed to one canonical number (``"1,000"`` ->
``"1000"``); GSM8K has no other kind of answer.

Taught in notebooks/01_dataset.ipynb §1.
"""

from __future__ import annotations

import re
from pathlib import Path

from helpers.data import (
    SYSTEM_PROMPT,
    DatasetError,
    Task,
    make_prompt,
    parse_gold_answer,
    read_jsonl,
    register_dataset,
    train_val_split,
)
from helpers.formats import ANSWER_CLOSE, ANSWER_OPEN
from helpers.paths import GSM8K_SAMPLE

_CALC_ANNOTATION = re.compile(r"<<[^>]*>>")  # GSM8K's calculator traces: "4*5=<<4*5=20>>20"


def solution_to_reply(solution: str) -> str:
    """A GSM8K solution rewritten in the workbook's answer format (for few-shot examples, SFT).

    Drops the ``<<a*b=c>>`` calculator annotations and replaces ``#### N`` by ``<answer>N</answer>``.
    """
    reasoning, _, _ = solution.rpartition("####")
    answer = parse_gold_answer(solution)
    return _CALC_ANNOTATION.sub("", reasoning).strip() + f"\nThe answer is {ANSWER_OPEN}{answer}{ANSWER_CLOSE}."


def gsm8k_task(
    row: dict, task_id: str, source: str, row_no: int, system: str | None = SYSTEM_PROMPT, few_shot: list[tuple[str, str]] | None = None
) -> Task:
    """One GSM8K row (``question``, ``answer`` ending in ``#### N``) as a Task.

    ``source`` and ``row_no`` (1-based line number) name the row in errors and in the metadata.
    """
    where = f"{source}, row {row_no}"
    question = row.get("question")
    if not isinstance(question, str) or not question.strip():
        raise DatasetError(f"{where}: row has no 'question' (keys: {sorted(row)})")
    solution = row.get("answer")
    if not isinstance(solution, str):
        raise DatasetError(f"{where}: row has no 'answer' text (keys: {sorted(row)})")
    answer = parse_gold_answer(solution, where)
    return Task(
        id=task_id,
        prompt=make_prompt(question.strip(), system=system, few_shot=few_shot),
        answer=answer,
        metadata={"question": question.strip(), "solution": solution, "source": source, "row": row_no},
    )


def load_gsm8k(
    split: str = "train",
    source: str | Path = "hub",
    max_samples: int | None = None,
    system: str | None = SYSTEM_PROMPT,
    few_shot: list[tuple[str, str]] | None = None,
) -> list[Task]:
    """GSM8K as Tasks, from the Hugging Face hub or from a local jsonl file.

    source="hub":  ``datasets.load_dataset("openai/gsm8k", "main", split=split)`` (needs internet
                   once; ``split`` is "train" or "test").
    source=path:   a jsonl file in GSM8K's own format, one ``{"question", "answer"}`` per line
                   (``split`` then only names the task ids: give two files two split names).
    max_samples:   keep the first N rows (files keep their order; shuffle with TaskSampler).

    Task ids are ``gsm8k-{split}-{row index:05d}``, stable across runs.

    Taught in notebooks/01_dataset.ipynb §1.
    """
    if source == "hub":
        import datasets  # imported here: reading a local file should not need it

        hub = datasets.load_dataset("openai/gsm8k", "main", split=split)
        rows = [(i + 1, row) for i, row in enumerate(hub)]  # rows numbered from 1, like file lines
        name = f"openai/gsm8k[{split}]"
    else:
        rows = read_jsonl(source)
        name = str(source)
    if max_samples is not None:
        rows = rows[:max_samples]
    if not rows:
        raise DatasetError(f"{name}: dataset is empty")
    return [
        gsm8k_task(row, f"gsm8k-{split}-{i:05d}", name, row_no, system, few_shot)
        for i, (row_no, row) in enumerate(rows)
    ]


@register_dataset("gsm8k")
def gsm8k_hub(split: str, n: int | None, seed: int) -> list[Task]:
    """GSM8K from the hub: its own train and test splits (no validation split: use train_val_split)."""
    if split == "validation":
        raise DatasetError("gsm8k has no validation split on the hub; split the train split with train_val_split")
    return load_gsm8k(split, "hub", max_samples=n)


@register_dataset("gsm8k-sample")
def gsm8k_sample(split: str, n: int | None, seed: int) -> list[Task]:
    """data/gsm8k_sample.jsonl (51 problems), split 80/20 by task id: plumbing only.
    "validation" and "test" are the same 20%."""
    train, held_out = train_val_split(load_gsm8k("sample", GSM8K_SAMPLE), val_fraction=0.2, seed=0)
    return (train if split == "train" else held_out)[:n]
