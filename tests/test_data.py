"""Tests for helpers.data: GSM8K loading, gold answers, prompts, splits, seeded batching, errors."""

import json
import re
from fractions import Fraction

import pytest

from helpers import data, hub
from helpers.data import (
    DatasetError,
    Task,
    TaskSampler,
    make_prompt,
    parse_gold_answer,
    render_prompt,
    train_val_split,
)
from helpers.formats import ANSWER_INSTRUCTION, to_number
from helpers.paths import GSM8K_SAMPLE
from helpers.worlds.gsm8k.tasks import load_gsm8k, solution_to_reply


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def make_tasks(n):
    return [Task(id=f"t{i}", prompt=make_prompt(f"q{i}"), answer=str(i)) for i in range(n)]


# --- gold answers -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "solution, expected",
    [
        ("2+3=<<2+3=5>>5\n#### 5", "5"),
        ("Big.\n#### 1,000", "1000"),
        ("#### 1,234,567", "1234567"),
        ("She lost money.\n#### -15", "-15"),
        ("Nothing left.\n#### 0", "0"),
        ("#### 2.50", "2.5"),
        ("#### $1,200", "1200"),
        ("#### 12.5%", "12.5"),
        ("#### 0.75", "0.75"),
        ("a #### in the text\n#### 7", "7"),  # the last #### counts
    ],
)
def test_parse_gold_answer_canonical(solution, expected):
    assert parse_gold_answer(solution) == expected


def test_parse_gold_answer_errors_name_the_row():
    with pytest.raises(DatasetError, match=r"f\.jsonl, row 3: answer has no '#### N'"):
        parse_gold_answer("the answer is 5", "f.jsonl, row 3")
    with pytest.raises(DatasetError, match="not a number: 'five'"):
        parse_gold_answer("#### five", "f.jsonl, row 3")


def test_solution_to_reply_uses_answer_tag_and_drops_annotations():
    reply = solution_to_reply("He buys 3*4=<<3*4=12>>12 eggs.\n#### 1,012")
    assert "<<" not in reply and "####" not in reply
    assert reply.endswith("<answer>1012</answer>.")
    assert "He buys 3*4=12 eggs." in reply


# --- loading -------------------------------------------------------------------------------


def test_load_local_jsonl(tmp_path):
    path = write_jsonl(tmp_path / "g.jsonl", [{"question": " How many? ", "answer": "1+1=<<1+1=2>>2\n#### 2"}, "", {"question": "Owe?", "answer": "#### -3"}])
    tasks = load_gsm8k("test", source=path)
    assert [t.id for t in tasks] == ["gsm8k-test-00000", "gsm8k-test-00001"]
    assert [t.answer for t in tasks] == ["2", "-3"]
    assert tasks[0].prompt[-1] == {"role": "user", "content": "How many?"}
    assert tasks[1].metadata["row"] == 3  # blank line 2 skipped, rows keep file line numbers
    assert tasks[0].metadata["source"] == str(path)


def test_answer_never_in_prompt(tmp_path):
    path = write_jsonl(tmp_path / "g.jsonl", [{"question": "Q?", "answer": "#### 98765"}])
    (task,) = load_gsm8k(source=path)
    assert "98765" not in json.dumps(task.prompt)


def test_max_samples(tmp_path):
    path = write_jsonl(tmp_path / "g.jsonl", [{"question": f"Q{i}", "answer": f"#### {i}"} for i in range(10)])
    assert [t.answer for t in load_gsm8k(source=path, max_samples=3)] == ["0", "1", "2"]


def test_hub_source_calls_load_dataset(monkeypatch):
    import datasets

    calls = []

    def fake_load_dataset(*args, **kwargs):
        calls.append((args, kwargs))
        return [{"question": "Q", "answer": "#### 1,000"}]

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    (task,) = load_gsm8k("test", source="hub")
    assert calls == [(("openai/gsm8k", "main"), {"split": "test"})]
    assert task.answer == "1000" and task.metadata["source"] == "openai/gsm8k[test]"


def test_shipped_sample_loads():
    tasks = load_gsm8k(source=GSM8K_SAMPLE)
    assert 45 <= len(tasks) <= 60
    values = [to_number(t.answer) for t in tasks]
    assert any(v < 0 for v in values) and any(v == 0 for v in values)
    assert any(v.denominator != 1 for v in values)  # a decimal answer
    assert any(v >= 1000 for v in values)
    raw = [t.metadata["solution"] for t in tasks]
    assert any(re.search(r"#### -?\d{1,3}(,\d{3})+", s) for s in raw)  # a thousands separator
    assert any("$" in t.metadata["question"] for t in tasks) and any("%" in t.metadata["question"] for t in tasks)
    assert len({t.metadata["question"] for t in tasks}) == len(tasks)


def test_shipped_sample_arithmetic_is_right():
    """Every <<expression=result>> annotation in the sample computes to its result."""
    checked = 0
    for task in load_gsm8k(source=GSM8K_SAMPLE):
        for expression, result in re.findall(r"<<([^=>]+)=([^>]+)>>", task.metadata["solution"]):
            value = eval(expression, {"__builtins__": {}})  # our own file: digits and + - * / ( )
            assert abs(value - float(result)) < 1e-9, f"{task.id}: {expression} != {result}"
            checked += 1
    assert checked >= 50


# --- bad input: one-line errors naming file and row ------------------------------------------


def test_missing_file(tmp_path):
    with pytest.raises(DatasetError, match=r"nope\.jsonl: file not found"):
        load_gsm8k(source=tmp_path / "nope.jsonl")


def test_row_without_question(tmp_path):
    path = write_jsonl(tmp_path / "g.jsonl", [{"question": "Q", "answer": "#### 1"}, {"prompt": "Q", "answer": "#### 1"}])
    with pytest.raises(DatasetError, match=r"g\.jsonl, row 2: row has no 'question'"):
        load_gsm8k(source=path)


def test_answer_without_hashes(tmp_path):
    path = write_jsonl(tmp_path / "g.jsonl", [{"question": "Q", "answer": "The answer is 4."}])
    with pytest.raises(DatasetError, match=r"g\.jsonl, row 1: answer has no '#### N'"):
        load_gsm8k(source=path)


def test_row_without_answer(tmp_path):
    path = write_jsonl(tmp_path / "g.jsonl", [{"question": "Q"}])
    with pytest.raises(DatasetError, match=r"g\.jsonl, row 1: row has no 'answer'"):
        load_gsm8k(source=path)


def test_empty_dataset(tmp_path):
    path = write_jsonl(tmp_path / "g.jsonl", ["", "  "])
    with pytest.raises(DatasetError, match=r"g\.jsonl: dataset is empty"):
        load_gsm8k(source=path)
    with pytest.raises(DatasetError, match="dataset is empty"):
        load_gsm8k(source=write_jsonl(tmp_path / "h.jsonl", [{"question": "Q", "answer": "#### 1"}]), max_samples=0)


def test_bad_json(tmp_path):
    path = write_jsonl(tmp_path / "g.jsonl", [{"question": "Q", "answer": "#### 1"}, "{not json"])
    with pytest.raises(DatasetError, match=r"g\.jsonl, row 2: not valid JSON"):
        load_gsm8k(source=path)


def test_errors_are_one_line_value_errors(tmp_path):
    with pytest.raises(ValueError) as info:
        load_gsm8k(source=write_jsonl(tmp_path / "g.jsonl", [{"answer": "#### 1"}]))
    assert "\n" not in str(info.value)


# --- prompts --------------------------------------------------------------------------------


def test_make_prompt_states_answer_format():
    messages = make_prompt("What is 6*7?")
    assert [m["role"] for m in messages] == ["system", "user"]
    assert ANSWER_INSTRUCTION in messages[0]["content"]
    assert messages[1]["content"] == "What is 6*7?"


def test_make_prompt_few_shot_and_no_system():
    messages = make_prompt("Q2", system=None, few_shot=[("Q1", "A1 <answer>1</answer>")])
    assert messages == [
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "A1 <answer>1</answer>"},
        {"role": "user", "content": "Q2"},
    ]


@pytest.fixture(scope="module")
def chatml_tokenizer():
    """A word-level tokenizer with a ChatML template (Qwen's format), built in memory."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    tokenizer.chat_template = (
        "{% if tools %}<|im_start|>tools\n{{ tools | tojson }}<|im_end|>\n{% endif %}"
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    return tokenizer


def test_render_prompt_ends_with_generation_prompt(chatml_tokenizer):
    text = render_prompt(chatml_tokenizer, make_prompt("What is 6*7?"))
    assert isinstance(text, str)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    assert "What is 6*7?" in text


def test_render_prompt_passes_tools(chatml_tokenizer):
    tool = {"type": "function", "function": {"name": "calculator", "parameters": {}}}
    assert '"calculator"' in render_prompt(chatml_tokenizer, make_prompt("Q"), tools=[tool])
    assert "calculator" not in render_prompt(chatml_tokenizer, make_prompt("Q"))


# --- splits ---------------------------------------------------------------------------------


def test_split_disjoint_complete_and_seeded():
    tasks = make_tasks(50)
    train, val = train_val_split(tasks, val_fraction=0.2, seed=1)
    assert len(val) == 10 and len(train) == 40
    assert not {t.id for t in train} & {t.id for t in val}
    assert sorted(t.id for t in train + val) == sorted(t.id for t in tasks)
    again_train, again_val = train_val_split(tasks, val_fraction=0.2, seed=1)
    assert [t.id for t in again_val] == [t.id for t in val]
    _, other_val = train_val_split(tasks, val_fraction=0.2, seed=2)
    assert {t.id for t in other_val} != {t.id for t in val}


def test_split_keeps_duplicates_on_one_side():
    tasks = make_tasks(20) + make_tasks(20)  # every id twice
    for seed in range(5):
        train, val = train_val_split(tasks, val_fraction=0.25, seed=seed)
        assert not {t.id for t in train} & {t.id for t in val}
        assert len(val) == 10  # 5 ids, both copies


def test_split_does_not_depend_on_input_order():
    tasks = make_tasks(30)
    _, val = train_val_split(tasks, 0.3, seed=0)
    _, val_reversed = train_val_split(tasks[::-1], 0.3, seed=0)
    assert {t.id for t in val} == {t.id for t in val_reversed}


@pytest.mark.parametrize("fraction", [0, 1, -0.1, 1.5])
def test_split_rejects_bad_fraction(fraction):
    with pytest.raises(DatasetError, match="val_fraction"):
        train_val_split(make_tasks(10), fraction)


def test_split_needs_two_tasks():
    with pytest.raises(DatasetError, match="at least 2"):
        train_val_split(make_tasks(1), 0.5)


# --- seeded batching ------------------------------------------------------------------------


def ids(batches):
    return [[t.id for t in batch] for batch in batches]


def take(sampler, n):
    return ids(next(sampler) for _ in range(n))


def test_sampler_same_seed_same_order():
    assert take(TaskSampler(make_tasks(10), 3, seed=7), 9) == take(TaskSampler(make_tasks(10), 3, seed=7), 9)
    assert take(TaskSampler(make_tasks(10), 3, seed=7), 9) != take(TaskSampler(make_tasks(10), 3, seed=8), 9)


def test_sampler_epochs_differ_and_cover_tasks():
    sampler = TaskSampler(make_tasks(12), batch_size=4, seed=0)
    epochs = [sum(take(sampler, 3), []) for _ in range(4)]
    assert all(sorted(e) == sorted(f"t{i}" for i in range(12)) for e in epochs)  # each epoch: every task once
    assert len({tuple(e) for e in epochs}) == 4  # and a different order each time
    assert sampler.epoch == 3 and sampler.position == 3


def test_sampler_batches_full_size_with_remainder():
    sampler = TaskSampler(make_tasks(10), batch_size=4, seed=0)
    assert sampler.batches_per_epoch == 2
    batches = take(sampler, 5)
    assert all(len(b) == 4 and len(set(b)) == 4 for b in batches)
    assert sampler.epoch == 2


def test_sampler_resume_continues_exactly():
    reference = take(TaskSampler(make_tasks(10), 3, seed=5), 10)
    first = TaskSampler(make_tasks(10), 3, seed=5)
    head = take(first, 4)  # crosses into epoch 1 (3 batches per epoch)
    state = json.loads(json.dumps(first.state_dict()))  # survives a round trip through a checkpoint
    resumed = TaskSampler(make_tasks(10), 3, seed=5)
    resumed.load_state_dict(state)
    assert head + take(resumed, 6) == reference


def test_sampler_refuses_state_for_other_data():
    state = TaskSampler(make_tasks(10), 3, seed=5).state_dict()
    with pytest.raises(DatasetError, match="num_tasks"):
        TaskSampler(make_tasks(11), 3, seed=5).load_state_dict(state)
    with pytest.raises(DatasetError, match="seed"):
        TaskSampler(make_tasks(10), 3, seed=6).load_state_dict(state)


def test_sampler_bad_arguments():
    with pytest.raises(DatasetError, match="no tasks"):
        TaskSampler([], 1)
    with pytest.raises(DatasetError, match="batch_size"):
        TaskSampler(make_tasks(3), 4)
    with pytest.raises(DatasetError, match="batch_size"):
        TaskSampler(make_tasks(3), 0)


def test_gold_answers_parse_back_exactly():
    for text in ["1000", "-15", "0", "2.5", "0.75"]:
        assert to_number(parse_gold_answer(f"#### {text}")) == Fraction(text)


def test_hub_reachable_respects_offline_and_failures(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub.hub_reachable() is False
    monkeypatch.delenv("HF_HUB_OFFLINE")

    def no_network(*args, **kwargs):
        raise OSError("no route")

    monkeypatch.setattr(hub.socket, "create_connection", no_network)
    assert hub.hub_reachable() is False


def test_a_bad_utf8_byte_is_reported_with_file_and_row(tmp_path):
    path = tmp_path / "g.jsonl"
    path.write_bytes(b'{"question": "Q", "answer": "#### 1"}\n{"question": "Q\xff", "answer": "#### 2"}\n')
    with pytest.raises(DatasetError, match=r"g\.jsonl, row 2: not valid UTF-8 \(byte 0xff at column 16\)"):
        load_gsm8k(source=path)


def test_the_dataset_registry_loads_each_split_and_refuses_unknown_names():
    from helpers.data import list_datasets, load_dataset

    assert {"tiny", "gsm8k", "gsm8k-sample"} <= set(list_datasets())
    train, test = load_dataset("gsm8k-sample", "train"), load_dataset("gsm8k-sample", "test")
    assert not {t.id for t in train} & {t.id for t in test}
    assert len(load_dataset("tiny", "test", 5, seed=3)) == 5
    with pytest.raises(DatasetError, match="unknown dataset"):
        load_dataset("gsm9k", "train")
    with pytest.raises(DatasetError, match="unknown split"):
        load_dataset("tiny", "dev")


def test_a_byte_order_mark_at_the_start_of_a_file_is_accepted(tmp_path):
    """Windows tools write a UTF-8 BOM first; the file still reads, and the first row is not corrupted."""
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + b'{"question": "Q", "answer": "#### 1"}\n{"question": "R", "answer": "#### 2"}\n')
    assert [t.answer for t in load_gsm8k(source=path)] == ["1", "2"]


@pytest.mark.parametrize("bad_id", [["a", "b"], None, "", 7])
def test_a_task_id_must_be_a_non_empty_string(bad_id):
    with pytest.raises(DatasetError, match="a task id must be a non-empty string"):
        Task(bad_id, [{"role": "user", "content": "Q"}])


def test_duplicate_ids_are_refused_where_tasks_are_loaded(tmp_path):
    from helpers.data import DATASETS, load_dataset, register_dataset
    from helpers.envs.code_env import load_code_tasks

    register_dataset("twice")(lambda split, n, seed: make_tasks(3) + make_tasks(1))
    try:
        with pytest.raises(DatasetError, match=r"dataset 'twice' \(train\): task id 't0' appears more than once"):
            load_dataset("twice", "train")
    finally:
        del DATASETS["twice"]
    row = {"id": "x", "entry_point": "add", "signature": "def add(a, b):", "description": "Add.", "tests": ["assert add(1, 2) == 3"]}
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(row) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(DatasetError, match="task id 'x' appears more than once"):
        load_code_tasks(path)
    path.write_text(json.dumps({**row, "id": ["x"]}) + "\n")
    with pytest.raises(DatasetError, match=r"tasks.jsonl, row 1: 'id' must be a non-empty string, got list"):
        load_code_tasks(path)


def test_registering_the_same_definition_again_is_allowed_another_one_is_not():
    """A notebook cell that defines and registers a dataset may be re-run; two different loaders may not share a name."""
    from helpers.data import DATASETS, register_dataset

    def define():
        def cell_loader(split, n, seed):
            return make_tasks(2)
        return cell_loader

    try:
        register_dataset("rerun")(define())
        register_dataset("rerun")(define())  # the same code again: a new function object, the same definition
        with pytest.raises(ValueError, match="dataset 'rerun' is already registered"):
            register_dataset("rerun")(lambda split, n, seed: make_tasks(3))
    finally:
        del DATASETS["rerun"]


def test_a_dataset_family_loads_every_member_by_name():
    """``register_dataset_family("fam")`` makes every "fam/<member>" a dataset; the loader gets the member."""
    from helpers.data import DATASET_FAMILIES, list_dataset_families, load_dataset, register_dataset_family

    @register_dataset_family("fam")
    def loader(member, split, n, seed):
        if member != "known":
            raise DatasetError(f"fam has no member {member!r}")
        return [Task(f"fam/{member}-{split}-{seed}-{i}", make_prompt("q")) for i in range(n or 3)]

    try:
        assert "fam/<member>" in list_dataset_families()
        assert [t.id for t in load_dataset("fam/known", "test", 2, seed=5)] == ["fam/known-test-5-0", "fam/known-test-5-1"]
        with pytest.raises(DatasetError, match="fam has no member 'other'"):
            load_dataset("fam/other", "test")
        with pytest.raises(DatasetError, match=r"unknown dataset 'fam'; choose from \[.*'fam/<member>'"):
            load_dataset("fam", "test")  # the prefix alone names no member
        with pytest.raises(ValueError, match="a dataset family's prefix is a name without '/'"):
            register_dataset_family("a/b")
    finally:
        del DATASET_FAMILIES["fam"]


def test_an_optional_package_that_is_missing_names_the_extra(monkeypatch):
    import sys

    from helpers.hub import import_extra

    monkeypatch.setitem(sys.modules, "some_benchmark_pkg", None)  # an import of it fails, as when it is not installed
    with pytest.raises(ImportError, match=r"some_benchmark_pkg is not installed; it comes with the workbook's 'benchmarks' extra: "
                                          r"pip install -e '\.\[benchmarks\]'"):
        import_extra("some_benchmark_pkg", "benchmarks")
    assert import_extra("json", "benchmarks").dumps(1) == "1"


def test_two_instances_under_one_name_are_a_conflict_not_a_rerun():
    from helpers.registry import register

    registry = {}
    register(registry, "benchmark", "b", object())
    with pytest.raises(ValueError, match="benchmark 'b' is already registered"):
        register(registry, "benchmark", "b", object())
