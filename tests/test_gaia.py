"""Tests for the GAIA world: GAIA's scorer (numbers with units and commas, lists, strings), a fixture in GAIA's
format read through the loader's own ``datasets.load_dataset`` call and scored through the benchmark command,
and the one error a user without a token or without access gets. Nothing here reaches the hub: the fixture is a
folder laid out as the dataset's repository (a README with its configs, ``2023/validation/metadata.jsonl``)
that the test writes, given to the loader as GAIA_DATASET.
"""

import json

import datasets
import huggingface_hub.constants
import pytest

import helpers.worlds  # noqa: F401  (registers the benchmarks)
from helpers.data import load_dataset
from helpers.envs import make_env
from helpers.evaluate import main as evaluate_main
from helpers.worlds.gaia.env import final_answer
from helpers.worlds.gaia.scorer import question_scorer
from helpers.worlds.gaia.tasks import ACCESS_STEPS, GatedDatasetError, load_gaia

# Four questions in GAIA's columns; the answers are of the scorer's three kinds.
ROWS = [
    {"task_id": "c61d22de-0001", "Question": "How many moons?", "Level": 1, "Final answer": "1000", "file_name": ""},
    {"task_id": "c61d22de-0002", "Question": "Which fruits?", "Level": 2, "Final answer": "apple, banana; 3", "file_name": ""},
    {"task_id": "c61d22de-0003", "Question": "Which bird?", "Level": 1, "Final answer": "sea gull", "file_name": ""},
    {"task_id": "c61d22de-0004", "Question": "What is the total in the sheet?", "Level": 3, "Final answer": "89706.00",
     "file_name": "c61d22de-0004.xlsx"},
]
README = """---
configs:
- config_name: 2023_all
  data_files:
  - split: validation
    path: 2023/validation/metadata.jsonl
---
"""


@pytest.fixture
def gaia_copy(tmp_path, monkeypatch):
    """A local copy of GAIA's repository holding ROWS, as GAIA_DATASET."""
    folder = tmp_path / "GAIA"
    (folder / "2023" / "validation").mkdir(parents=True)
    (folder / "README.md").write_text(README)
    rows = [{**row, "Annotator Metadata": {"Steps": "1. look it up", "Tools": "web browser"}} for row in ROWS]
    (folder / "2023" / "validation" / "metadata.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    monkeypatch.setenv("GAIA_DATASET", str(folder))
    return folder


@pytest.mark.parametrize("answer, truth, expected", [
    ("1000", "1000", True), ("$1,000", "1000", True), ("1,000.0", "1000", True), ("17%", "17", True),
    ("17 km", "17", False),  # no units are stripped but $ % and commas
    ("one thousand", "1000", False),
    ("Apple, BANANA; 3", "apple, banana; 3", True), ("apple; banana, 3.0", "apple, banana, 3", True),
    ("banana, apple, 3", "apple, banana, 3", False),  # element by element, in order
    ("apple, banana", "apple, banana, 3", False),  # lists of different lengths
    ("a.b, c", "ab, c", False),  # list elements keep their punctuation
    ("Sea Gull.", "seagull", True), ("the seagull", "seagull", False),  # strings lose spaces and punctuation only
])
def test_gaias_scorer(answer, truth, expected):
    assert question_scorer(answer, truth) is expected


def test_the_final_answer_is_what_follows_the_template():
    assert final_answer("I counted them.\nFINAL ANSWER: 3, 4\n") == "3, 4"
    assert final_answer("final answer: x FINAL ANSWER: y") == "y"
    assert final_answer("  17 ") == "17"


def test_a_copy_in_gaias_format_loads_through_the_same_call(gaia_copy):
    tasks = load_dataset("gaia", "test")
    assert [t.id for t in tasks] == [row["task_id"] for row in ROWS]
    assert [t.answer for t in tasks] == [row["Final answer"] for row in ROWS]
    assert tasks[3].metadata == {"level": 3, "file_name": "c61d22de-0004.xlsx"}
    assert tasks[0].prompt[0]["content"].startswith("You are a general AI assistant") and tasks[0].prompt[1]["content"] == ROWS[0]["Question"]
    assert load_dataset("gaia", "test", 2) == tasks[:2]
    with pytest.raises(ValueError, match="evaluation set"):
        load_dataset("gaia", "train")


def test_an_answers_file_scores_the_expected_fraction_through_the_command(gaia_copy, tmp_path):
    answers = ["$1,000", "Apple, banana; 3", "I think it is a gull.\nFINAL ANSWER: herring gull", "89706"]
    path = tmp_path / "answers.jsonl"
    path.write_text("".join(json.dumps({"task_id": row["task_id"], "completion": a}) + "\n" for row, a in zip(ROWS, answers)))
    line = evaluate_main(["--benchmark", "gaia", "--answers", str(path)])
    assert (line["tasks"], line["of"], line["samples"], line["score"], line["pass@1"]) == (4, 4, 4, 0.75, 0.75)
    assert line["failures"] == {"correct": 3, "wrong_answer": 1}


def test_the_env_judges_a_reply_with_gaias_scorer(gaia_copy):
    task = load_dataset("gaia", "test")[1]
    env = make_env("gaia", max_steps=1)
    env.reset(task)
    result = env.step("Both fruits, then the count.\nFINAL ANSWER: apple, banana, 3")
    assert (result.reward, result.info["verdict"], result.info["predicted"]) == (1.0, "correct", "apple, banana, 3")


def test_without_a_token_one_error_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.delenv("GAIA_DATASET", raising=False)
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "no-tokens"))
    with pytest.raises(GatedDatasetError) as caught:
        load_dataset("gaia", "test")
    message = str(caught.value)
    assert message.startswith("no Hugging Face token on this machine") and ACCESS_STEPS in message
    for step in ("https://huggingface.co/datasets/gaia-benchmark/GAIA", "accept the terms", "huggingface-cli login", "HF_TOKEN"):
        assert step in message


def test_a_token_without_access_gets_the_same_steps(monkeypatch):
    monkeypatch.delenv("GAIA_DATASET", raising=False)
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_real_token")

    def refused(*args, **kwargs):  # what datasets raises when the hub refuses a gated dataset to this token
        raise datasets.exceptions.DatasetNotFoundError("Dataset 'gaia-benchmark/GAIA' is a gated dataset on the Hub. "
                                                      "You must be authenticated to access it.")

    monkeypatch.setattr(datasets, "load_dataset", refused)
    with pytest.raises(GatedDatasetError, match="the hub refused gaia-benchmark/GAIA") as caught:
        load_gaia()
    assert ACCESS_STEPS in str(caught.value)
