"""Dataset module (数据模块): the Task, loaders, prompt building, batching.

Agentic RL needs only the *task*: the prompt the policy sees. The reference
answer travels with the task so that the environment can check the policy's
answer, but it is never shown to the policy.

    tasks = load_dataset("gsm8k-sample", "train")         # a registered dataset (helpers.worlds registers them)
    tasks = load_dataset("reasoning_gym/chain_sum", "test", 64)   # a member of a registered family of datasets
    tasks = load_dataset("tiny-agent@shop+tiny@calculator", "test", 64)   # a mix: each task names its environment
    train, val = train_val_split(tasks, val_fraction=0.2, seed=0)
    sampler = TaskSampler(train, batch_size=8, seed=0)
    batch = next(sampler)                                 # list of 8 Tasks
    text = render_prompt(tokenizer, batch[0].prompt)      # the string the model reads

Simplifications, named:

* ``TaskSampler`` drops the last ``len(tasks) % batch_size`` tasks of each epoch's
  shuffled order (like ``DataLoader(drop_last=True)``), so every batch has the same
  size; a different permutation each epoch means no task is left out for long.
"""

from __future__ import annotations

import copy
import itertools
import json
import random
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator

from helpers.formats import ANSWER_INSTRUCTION, format_number, to_number
from helpers.registry import register


@dataclass
class Task:
    """One problem for the agent.

    id:        stable identifier, e.g. ``"gsm8k-train-00012"``
    prompt:    chat messages the policy starts from, e.g.
               ``[{"role": "system", "content": ...}, {"role": "user", "content": ...}]``
    answer:    canonical reference answer (``"1000"``), or None when the env checks another way
    metadata:  anything else (source file and row, difficulty, test cases for code tasks, ...)
    environment: the registered env that plays it (``"shop"``), TRL's ``environment`` column; None: the run's
               one env (``config.env``). A mixed dataset (``mix_datasets``) sets it on every task.

    Taught in notebooks/01_dataset.ipynb §2.
    """

    id: str
    prompt: list[dict]
    answer: str | None = None
    metadata: dict = field(default_factory=dict)
    environment: str | None = None

    def __post_init__(self):
        # Splits, samplers and records key on the id: a list or None here would fail far away, in train_val_split.
        if not isinstance(self.id, str) or not self.id:
            raise DatasetError(f"a task id must be a non-empty string, got {type(self.id).__name__} {self.id!r}")

    def row(self) -> dict:
        """The task as one dataset row: ``{"prompt": ..., "answer": ..., **metadata}``, a deep copy.

        These are the columns TRL passes to an environment's ``reset(**row)``, so an env reads
        its hidden values (the shop's ``item`` and ``prices``) the same way in TRL and in this
        workbook's loop (``helpers.envs.Episode``). A metadata key named ``prompt`` or ``answer``
        would overwrite a column: that is the task's bug, and an error. The ``environment`` is not a
        column of the row: TRL routes on it and leaves it out of ``reset(**row)``, as the loop does.
        Taught in notebooks/02_environment.ipynb.
        """
        clash = sorted({"prompt", "answer"} & set(self.metadata))
        if clash:
            raise ValueError(f"task {self.id!r}: metadata key {clash[0]!r} would overwrite the row's column of that name")
        return copy.deepcopy({"prompt": self.prompt, "answer": self.answer, **self.metadata})


class DatasetError(ValueError):
    """Bad input data. The message is one line naming the file, and the row where there is one."""


# --- prompts ------------------------------------------------------------------------------

SYSTEM_PROMPT = "You are a helpful assistant that solves math word problems. " + ANSWER_INSTRUCTION


def make_prompt(question: str, system: str | None = SYSTEM_PROMPT, few_shot: list[tuple[str, str]] | None = None) -> list[dict]:
    """Chat messages for one question: system prompt, optional worked examples, the question.

    ``few_shot`` is a list of ``(question, reply)`` pairs; each becomes a user turn and
    an assistant turn, so the model sees the answer format used before it answers.
    The default system prompt states that format (``helpers.formats.ANSWER_INSTRUCTION``):
    the environment only accepts what the prompt asked for.

    Taught in notebooks/01_dataset.ipynb §3.
    """
    messages = [{"role": "system", "content": system}] if system else []
    for example_question, example_reply in few_shot or []:
        messages.append({"role": "user", "content": example_question})
        messages.append({"role": "assistant", "content": example_reply})
    messages.append({"role": "user", "content": question})
    return messages


def render_prompt(tokenizer, messages: list[dict], tools: list[dict] | None = None) -> str:
    """The exact text the model reads: the tokenizer's chat template, ready for the reply.

    ``add_generation_prompt=True`` appends the opening of the assistant turn
    (``<|im_start|>assistant\\n`` for Qwen), so generation starts inside the reply.
    ``tools`` are JSON schemas (an env's ``tools``); the template lists them in the system turn.

    Taught in notebooks/01_dataset.ipynb §3.
    """
    return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)


def parse_gold_answer(solution: str, where: str = "answer") -> str:
    """The canonical number after ``####`` in a GSM8K solution: ``"... #### 1,000"`` -> ``"1000"``.

    ``where`` names the file and row in the error message.

    The format of GSM8K's solutions; rewards accept such a solution as the reference too.

    Taught in notebooks/01_dataset.ipynb §1.
    """
    if "####" not in solution:
        raise DatasetError(f"{where}: answer has no '#### N' final line: {solution[-60:]!r}")
    final = solution.rsplit("####", 1)[1].strip()
    value = to_number(final)
    if value is None:
        raise DatasetError(f"{where}: final answer after '####' is not a number: {final!r}")
    return format_number(value)


def read_jsonl(path: str | Path) -> list[tuple[int, dict]]:
    """(line number, row) for every non-blank line of a jsonl file, with one-line errors.

    Taught in notebooks/01_dataset.ipynb §7.
    """
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"{path}: {'a folder, not a file' if path.is_dir() else 'file not found'}")
    rows = []
    with path.open("rb") as f:  # bytes: a bad UTF-8 byte is reported with its row, not as a bare UnicodeDecodeError
        for line_no, raw in enumerate(f, start=1):
            if line_no == 1:
                raw = raw.removeprefix(b"\xef\xbb\xbf")  # the byte-order mark Windows tools write first
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DatasetError(f"{path}, row {line_no}: not valid UTF-8 (byte {raw[e.start]:#04x} at column {e.start + 1})") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DatasetError(f"{path}, row {line_no}: not valid JSON ({e.msg})") from None
            except RecursionError:  # json's decoder recurses once per level of nesting
                raise DatasetError(f"{path}, row {line_no}: JSON nested too deeply to read") from None
            if not isinstance(row, dict):
                raise DatasetError(f"{path}, row {line_no}: expected a JSON object, got {type(row).__name__}")
            rows.append((line_no, row))
    return rows


def write_jsonl(path: str | Path, rows: list[dict], mode: str = "w") -> Path:
    """Write ``rows`` as JSON lines (``mode="a"`` appends); the folder is made if needed.
    Values JSON cannot hold (a Fraction, a Path) are written as their ``str``.
    The one writer of every JSONL file the workbook makes; ``read_jsonl`` reads them back."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open(mode, encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, default=str) + "\n")
    return path


# --- the dataset registry ------------------------------------------------------------------
# Mirrors ``helpers.envs.register_env``: a preset names its dataset (``config.dataset``), and
# ``load_dataset`` finds the function that makes its tasks. A loader takes the split, how many
# tasks (None = all) and a seed (generated worlds draw their tasks from it; files ignore it).
# A *family* is one loader for many names, ``"<prefix>/<member>"`` (reasoning-gym's ~100 generators:
# ``reasoning_gym/chain_sum``, ...); its loader also takes the member, the text after the first "/".

DatasetLoader = Callable[[str, "int | None", int], "list[Task]"]
FamilyLoader = Callable[[str, str, "int | None", int], "list[Task]"]
DATASETS: dict[str, DatasetLoader] = {}
DATASET_FAMILIES: dict[str, FamilyLoader] = {}
DATASET_SPLITS = ("train", "validation", "test")


def register_dataset(name: str):
    """Decorator: ``@register_dataset("tiny")`` on ``def loader(split, n, seed) -> list[Task]``."""

    return lambda loader: register(DATASETS, "dataset", name, loader)


def register_dataset_family(prefix: str):
    """Decorator: ``@register_dataset_family("reasoning_gym")`` on ``def loader(member, split, n, seed)``
    makes every name ``"reasoning_gym/<member>"`` a dataset; the loader refuses a member it does not know."""
    if not prefix or "/" in prefix:
        raise ValueError(f"a dataset family's prefix is a name without '/', got {prefix!r}")

    return lambda loader: register(DATASET_FAMILIES, "dataset family", prefix, loader)


def list_datasets() -> list[str]:
    """The registered datasets' names (importing ``helpers.worlds`` registers the built-in worlds');
    the families are ``list_dataset_families()``."""
    return sorted(DATASETS)


def list_dataset_families() -> list[str]:
    """The registered families, as the names they take: ``["reasoning_gym/<member>", ...]``."""
    return [f"{prefix}/<member>" for prefix in sorted(DATASET_FAMILIES)]


def load_dataset(name: str, split: str, n: int | None = None, seed: int = 0) -> list[Task]:
    """The tasks of one split of a registered dataset: ``load_dataset("tiny", "test", 64, seed=0)``,
    of a family's member: ``load_dataset("reasoning_gym/chain_sum", "test", 64)``, or of a mix of
    datasets, each with its environment: ``load_dataset("tiny-agent@shop+tiny@calculator", "test", 64)``
    (``mix_datasets``).

    Taught in notebooks/01_dataset.ipynb.
    """
    if split not in DATASET_SPLITS:
        raise DatasetError(f"unknown split {split!r}; choose from {DATASET_SPLITS}")
    prefix, _, member = name.partition("/")
    if "@" in name:
        tasks = mix_datasets(parse_mix(name), split, n, seed)
    elif name in DATASETS:
        tasks = DATASETS[name](split, n, seed)
    elif prefix in DATASET_FAMILIES and member:
        tasks = DATASET_FAMILIES[prefix](member, split, n, seed)
    else:
        hint = "" if DATASETS else " (none registered yet: `import helpers.worlds` registers the built-in worlds' datasets)"
        raise DatasetError(f"unknown dataset {name!r}; choose from {list_datasets() + list_dataset_families()}{hint}")
    if not tasks:
        raise DatasetError(f"dataset {name!r} has no {split} tasks")
    check_unique_ids(tasks, f"dataset {name!r} ({split})")
    return tasks


# --- mixed datasets: one run over several environments (TRL's multi-environment training) ---------
# TRL's GRPOTrainer takes ``environment_factory={"shop": ..., "calculator": ...}`` and reads each row's
# ``environment`` column to pick one. A mix names its parts the same way: ``dataset@environment``, joined
# by ``+``: ``"tiny-agent@shop+tiny@calculator+tiny-products@reasoning_gym_calculator"``.

MIX_PART = re.compile(r"(?P<dataset>[^@]+?)@(?P<environment>[\w.-]+(?::\w+)?)(?:\+|$)")


def parse_mix(spec: str) -> list[tuple[str, str]]:
    """``"tiny-agent@shop+tiny@calculator"`` -> ``[("tiny-agent", "shop"), ("tiny", "calculator")]``. A dataset
    name may hold ``+`` (a reasoning-gym config's list): a part ends at the ``@environment`` that follows it."""
    parts, end = [], 0
    for match in MIX_PART.finditer(spec):
        if match.start() != end:
            break
        parts.append((match["dataset"], match["environment"]))
        end = match.end()
    if end != len(spec) or not parts or spec.endswith("+"):
        raise DatasetError(f"mixed dataset {spec!r}: expected dataset@environment+dataset@environment, "
                           "e.g. tiny-agent@shop+tiny@calculator")
    return parts


def mix_datasets(parts: list[tuple[str, str]], split: str, n: int | None = None, seed: int = 0) -> list[Task]:
    """The tasks of several datasets, each task naming its part's environment, interleaved part by part
    (the first N tasks of a mix hold about N / len(parts) of each, so an evaluation on a subset still
    sees every environment). ``n`` is shared out evenly (the first parts take the remainder; with fewer
    than one task per part, the last parts get none); None: all of each part."""
    shares = [None] * len(parts) if n is None else [n // len(parts) + (i < n % len(parts)) for i in range(len(parts))]
    loaded = [[replace(task, environment=environment) for task in load_dataset(name, split, share, seed)]
              for (name, environment), share in zip(parts, shares) if share != 0]
    return [task for row in itertools.zip_longest(*loaded) for task in row if task is not None]


def environments_of(tasks: list[Task]) -> list[str | None]:
    """The distinct environments ``tasks`` name, in their first appearance's order (None: the run's env)."""
    return list(dict.fromkeys(task.environment for task in tasks))


# --- splits and batches ----------------------------------------------------------------------


def check_unique_ids(tasks: list[Task], source: str) -> None:
    """Raise ``DatasetError`` naming the first task id that appears twice in ``tasks``: two tasks with one
    id would be split, sampled and scored as one."""
    seen: set[str] = set()
    for task in tasks:
        if task.id in seen:
            raise DatasetError(f"{source}: task id {task.id!r} appears more than once; ids must be unique")
        seen.add(task.id)


def train_val_split(tasks: list[Task], val_fraction: float = 0.1, seed: int = 0) -> tuple[list[Task], list[Task]]:
    """Split tasks into train and validation by task id, so no task is on both sides.

    Tasks that share an id go to the same side (a duplicated row cannot leak).
    The same seed gives the same split; each side keeps the input order.

    Taught in notebooks/01_dataset.ipynb §5.
    """
    if not 0 < val_fraction < 1:
        raise DatasetError(f"val_fraction must be between 0 and 1, got {val_fraction}")
    ids = sorted({task.id for task in tasks})
    if len(ids) < 2:
        raise DatasetError(f"need at least 2 distinct task ids to split, got {len(ids)}")
    random.Random(seed).shuffle(ids)
    n_val = min(max(1, round(len(ids) * val_fraction)), len(ids) - 1)
    val_ids = set(ids[:n_val])
    train = [t for t in tasks if t.id not in val_ids]
    val = [t for t in tasks if t.id in val_ids]
    assert not {t.id for t in train} & {t.id for t in val}, "train/val split leaked a task id"
    return train, val


class TaskSampler:
    """Batches of tasks, forever, reshuffled every epoch; resumable.

    Epoch ``e`` visits the tasks in a permutation fixed by ``(seed, e)``: the same seed
    gives the same order, and each epoch has a different one. An epoch has
    ``len(tasks) // batch_size`` full batches (the remainder of that permutation is
    skipped, see the module docstring).

    ``state_dict()`` is the data position (epoch, batch within the epoch); a resumed
    training run calls ``load_state_dict`` and continues with exactly the next batch.

    Taught in notebooks/01_dataset.ipynb §6.
    """

    def __init__(self, tasks: list[Task], batch_size: int, seed: int = 0):
        if not tasks:
            raise DatasetError("TaskSampler: no tasks to sample from")
        if not 1 <= batch_size <= len(tasks):
            raise DatasetError(f"TaskSampler: batch_size must be between 1 and {len(tasks)} (the number of tasks), got {batch_size}")
        self.tasks = list(tasks)
        self.batch_size = batch_size
        self.seed = seed
        self.epoch = 0  # epochs completed
        self.position = 0  # batches already taken in the current epoch

    @property
    def batches_per_epoch(self) -> int:
        return len(self.tasks) // self.batch_size

    def epoch_order(self, epoch: int) -> list[int]:
        """Task indices in the order epoch ``epoch`` visits them."""
        order = list(range(len(self.tasks)))
        random.Random(f"{self.seed}-{epoch}").shuffle(order)  # string seeds are hashed deterministically
        return order

    def next_batch(self) -> list[Task]:
        if self.position == self.batches_per_epoch:
            self.epoch, self.position = self.epoch + 1, 0
        start = self.position * self.batch_size
        indices = self.epoch_order(self.epoch)[start : start + self.batch_size]
        self.position += 1
        return [self.tasks[i] for i in indices]

    def __iter__(self) -> Iterator[list[Task]]:
        return self

    def __next__(self) -> list[Task]:
        return self.next_batch()

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "batch_size": self.batch_size, "num_tasks": len(self.tasks)}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a saved data position; refuses a state saved for other data or settings."""
        for key, mine in [("seed", self.seed), ("batch_size", self.batch_size), ("num_tasks", len(self.tasks))]:
            if state[key] != mine:
                raise DatasetError(f"TaskSampler: cannot resume, saved {key}={state[key]} but this sampler has {key}={mine}")
        self.epoch, self.position = state["epoch"], state["position"]
