"""GAIA's validation questions as Tasks, from the gated dataset on the Hugging Face hub (or a local copy of it).

    tasks = load_gaia()                                  # the 165 validation questions: needs a token and GAIA's terms accepted
    tasks = load_dataset("gaia", "test")                 # the registry's view of the same (the benchmark's tasks)
    tasks = load_dataset("gaia/2023_level1", "test")     # one level of them (configs 2023_level1, _level2, _level3)
    GAIA_DATASET=path/to/GAIA python -m helpers.evaluate --benchmark gaia --answers answers.jsonl   # a local copy

GAIA (Mialon et al. 2023) is ``gaia-benchmark/GAIA`` on the hub, read with
``datasets.load_dataset("gaia-benchmark/GAIA", "2023_all", split="validation")``. The dataset is
gated: its page asks each user to accept its terms (the answers must not end up in training data), and
the hub then serves it to that user's token only. Without a token, or with one whose user has not
accepted the terms, ``load_gaia`` raises ``GatedDatasetError`` saying what to do (``ACCESS_STEPS``).

``GAIA_DATASET`` (an environment variable) names another source for the same call: a folder holding a
copy of the dataset's repository (``huggingface-cli download gaia-benchmark/GAIA --repo-type dataset
--local-dir GAIA``), read by ``datasets`` exactly as the hub's, with no token. The tests use it for a
small fixture in GAIA's format that they write.

A row of GAIA is ``task_id``, ``Question``, ``Level`` (1-3), ``Final answer``, ``file_name`` (an attached
file, or ``""``) and ``Annotator Metadata`` (the annotator's steps and tools). A Task's prompt is GAIA's
own system prompt (``GAIA_SYSTEM_PROMPT``, from the paper: reason, then ``FINAL ANSWER: ...``) and the
question; the reference answer is ``Final answer``; the metadata keeps the level and the file's name.

Simplifications, named: the workbook's ``"test"`` split of ``gaia`` is GAIA's *validation* split, the
one whose answers are public (GAIA's own test answers are private, scored only by the leaderboard), and
``"train"`` is an error: GAIA is for evaluation only. Attached files are not downloaded or shown: a
question that needs one is asked without it (``metadata["file_name"]`` says which).
"""

from __future__ import annotations

import os

from huggingface_hub import get_token
from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

from helpers.data import DatasetError, Task, register_dataset, register_dataset_family

HUB_ID = "gaia-benchmark/GAIA"
CONFIGS = ("2023_all", "2023_level1", "2023_level2", "2023_level3")  # every question, or one level
ACCESS_STEPS = (
    f"GAIA ({HUB_ID}) is a gated dataset: the hub serves it only to a logged-in user who accepted its terms. To load it:\n"
    f"  1. open https://huggingface.co/datasets/{HUB_ID} while logged in and accept the terms (access is granted at once);\n"
    "  2. give this machine your token (https://huggingface.co/settings/tokens, 'read' is enough): run "
    "`huggingface-cli login` (or `hf auth login`), or set HF_TOKEN=hf_... in the environment;\n"
    "  3. run the command again. With no internet here, download the dataset elsewhere "
    f"(`huggingface-cli download {HUB_ID} --repo-type dataset --local-dir GAIA`) and set GAIA_DATASET=path/to/GAIA."
)

# GAIA's system prompt (Mialon et al. 2023, Figure 2): the answer format the scorer expects.
GAIA_SYSTEM_PROMPT = (
    "You are a general AI assistant. I will ask you a question. Report your thoughts, and finish your answer with the "
    "following template: FINAL ANSWER: [YOUR FINAL ANSWER]. YOUR FINAL ANSWER should be a number OR as few words as "
    "possible OR a comma separated list of numbers and/or strings. If you are asked for a number, don't use comma to "
    "write your number neither use units such as $ or percent sign unless specified otherwise. If you are asked for a "
    "string, don't use articles, neither abbreviations (e.g. for cities), and write the digits in plain text unless "
    "specified otherwise. If you are asked for a comma separated list, apply the above rules depending of whether the "
    "element to be put in the list is a number or a string."
)


class GatedDatasetError(DatasetError):
    """GAIA could not be read because this user has no access to it: the message says how to get it."""


def gaia_task(row: dict, where: str) -> Task:
    """One GAIA row as a Task; ``where`` names the source and row in errors."""
    missing = [key for key in ("task_id", "Question", "Level", "Final answer") if key not in row]
    if missing:
        raise DatasetError(f"{where}: not a GAIA row, it has no {missing} (keys: {sorted(row)})")
    prompt = [{"role": "system", "content": GAIA_SYSTEM_PROMPT}, {"role": "user", "content": row["Question"]}]
    metadata = {"level": int(row["Level"]), "file_name": row.get("file_name") or ""}
    return Task(row["task_id"], prompt, str(row["Final answer"]), metadata)


def hub_token() -> str | None:
    """The user's hub token (HF_TOKEN, or the one ``huggingface-cli login`` saved), or None."""
    return get_token()


def load_gaia(config: str = "2023_all", split: str = "validation", source: str | None = None) -> list[Task]:
    """GAIA's questions of ``config`` and ``split`` as Tasks, in the dataset's order.

    ``source`` is the hub's ``gaia-benchmark/GAIA`` (default: ``$GAIA_DATASET``, else the hub) or a
    folder with a copy of its repository; both are read by the same ``datasets.load_dataset`` call.
    From the hub, a missing token or a token without access is a ``GatedDatasetError`` (``ACCESS_STEPS``).
    """
    import datasets  # heavy to import: only a reader who asks for GAIA's questions pays for it

    source = source or os.environ.get("GAIA_DATASET") or HUB_ID
    if config not in CONFIGS:
        raise DatasetError(f"GAIA has no config {config!r}; choose from {CONFIGS}")
    from_hub = not os.path.isdir(source)
    if from_hub and hub_token() is None:  # ask before the hub does: its answer to no token is a bare 401
        raise GatedDatasetError(f"no Hugging Face token on this machine.\n{ACCESS_STEPS}")
    try:
        rows = datasets.load_dataset(source, config, split=split)
    except (GatedRepoError, RepositoryNotFoundError, datasets.exceptions.DatasetNotFoundError) as e:
        if not from_hub:
            raise
        raise GatedDatasetError(f"the hub refused {source} to this token ({type(e).__name__}: {str(e).splitlines()[0]}).\n"
                                f"{ACCESS_STEPS}") from e
    return [gaia_task(row, f"{source}[{config}/{split}], row {i + 1}") for i, row in enumerate(rows)]


def gaia_split(config: str, split: str, n: int | None) -> list[Task]:
    """The registry's splits: ``"test"`` is GAIA's validation split (the module docstring); the seed is not used."""
    if split == "train":
        raise DatasetError("GAIA is an evaluation set (165 validation questions): train on another dataset")
    return load_gaia(config, "validation")[:n]


@register_dataset("gaia")
def gaia_dataset(split: str, n: int | None, seed: int) -> list[Task]:
    """Every level: GAIA's 2023_all validation questions (165)."""
    return gaia_split("2023_all", split, n)


@register_dataset_family("gaia")
def gaia_config(member: str, split: str, n: int | None, seed: int) -> list[Task]:
    """``gaia/2023_level1`` (and _level2, _level3): one level's validation questions."""
    return gaia_split(member, split, n)
