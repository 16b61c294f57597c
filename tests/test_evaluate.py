"""Tests for helpers.evaluate: metrics of scripted policies whose right answers we know."""

import pytest

from helpers.data import Task
from helpers.envs import make_env
from helpers.evaluation import (
    breakdown,
    evaluate,
    load_records,
    pass_at_k,
    save_records,
)
from helpers.formats import format_tool_call
from helpers.policy import ScriptedPolicy
from helpers.worlds.arithmetic.tasks import TINY_SYSTEM
from helpers.worlds.tinymodel import load_tokenizer

CALL = format_tool_call("calculator", {"expression": "47*86"})


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


def task(i: int, answer: str = "4042") -> Task:
    prompt = [{"role": "system", "content": TINY_SYSTEM}, {"role": "user", "content": "What is 47 * 86?"}]
    return Task(f"t{i}", prompt, answer, {"expression": "47*86"})


def run(tokenizer, replies, tasks, **kw):
    env = lambda: make_env("calculator", max_steps=3)  # noqa: E731
    return evaluate(ScriptedPolicy(tokenizer, replies), tasks, env, max_steps=3, **kw)


def test_direct_correct_answer(tokenizer):
    result = run(tokenizer, ["<answer>4042</answer>"], [task(0), task(1)])
    m = result.metrics
    assert (m["success"], m["tool_calls"], m["turns"], m["completions/clipped_ratio"], m["n"]) == (1.0, 0.0, 1.0, 0.0, 2)
    assert breakdown(result.records) == {"correct": 2}
    assert result.records[0]["predicted"] == "4042" and result.records[0]["stop_reason"] == "answered"


def test_tool_then_answer_counts_tool_use_and_turns(tokenizer):
    result = run(tokenizer, [CALL, "<answer>4042</answer>"], [task(0)], k=2)
    m = result.metrics
    assert (m["success"], m["tool_calls"], m["turns"], m["pass@2"], m["pass@1"]) == (1.0, 1.0, 2.0, 1.0, 1.0)
    assert result.records[0]["tool_calls"] == 1 and result.records[0]["correct_of_2"] == 2


def test_tool_calls_are_logged_under_trls_names_too(tokenizer):
    """tools/call_frequency: calls per episode; tools/failure_frequency: failed calls / calls (as TRL counts failures)."""
    unknown = format_tool_call("search", {"query": "47*86"})  # a call that cannot be made: failed
    zero = format_tool_call("calculator", {"expression": "1/0"})  # the tool's own error text: not failed, in TRL's count
    result = run(tokenizer, [unknown, zero, "<answer>4042</answer>"], [task(0), task(1)])
    m = result.metrics
    assert m["tools/call_frequency"] == m["tool_calls"] == 2.0
    assert m["tools/failure_frequency"] == 0.5 and result.records[0]["tool_errors"] == 2  # both are errors the model reads
    assert run(tokenizer, ["<answer>4042</answer>"], [task(0)]).metrics["tools/failure_frequency"] == 0.0  # no calls, no failures


def test_half_right_and_the_breakdown_of_failures(tokenizer):
    # The same reply is right for the first task and a wrong number for the second.
    result = run(tokenizer, ["<answer>4042</answer>"], [task(0), task(1, answer="4043")])
    assert result.metrics["success"] == 0.5
    assert breakdown(result.records) == {"correct": 1, "wrong_number": 1}
    no_answer = run(tokenizer, ["I do not know."], [task(0)])
    assert breakdown(no_answer.records) == {"no_answer": 1}


def test_looping_agent_is_truncated(tokenizer):
    result = run(tokenizer, [CALL], [task(0)])  # calls the tool forever
    assert result.metrics["completions/clipped_ratio"] == 1.0 and result.metrics["success"] == 0.0
    assert result.records[0]["stop_reason"] == "max_steps" and result.records[0]["turns"] == 3
    assert breakdown(result.records) == {"truncated": 1}


def test_records_round_trip(tokenizer, tmp_path):
    result = run(tokenizer, [CALL, "<answer>4042</answer>"], [task(0), task(1)])
    path = save_records(tmp_path / "eval.jsonl", result.records)
    assert load_records(path) == result.records


def test_pass_at_k():
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 1, 4) == 1.0
    assert pass_at_k(10, 5, 1) == pytest.approx(0.5)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 2)


# --- the command line ------------------------------------------------------------------------


def saved_moved_adapter(tmp_path):
    """(base model, tokenizer, trainer, checkpoint folder): a LoRA adapter on the tiny model with its B
    moved off zero (so it can be told apart from the base model), saved as a run saves it."""
    import copy

    import torch

    from helpers.config import get_preset
    from helpers.grpo import LoRAGRPO
    from helpers.worlds.tinymodel import load_tiny

    model, tokenizer = load_tiny()
    torch.manual_seed(0)
    trainer = LoRAGRPO(copy.deepcopy(model), get_preset("tiny-cpu"))
    with torch.no_grad():
        for name, p in trainer.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)
    trainer.model.eval()
    return model, tokenizer, trainer, trainer.save_checkpoint(tmp_path / "checkpoint-1")


def test_command_line_evaluates_a_saved_adapter_like_the_trainer_does(tmp_path, capsys):
    """`python -m helpers.evaluate --adapter DIR` prints one JSON line that matches evaluating
    the same adapter in-process on the same tasks."""
    import json

    from helpers.config import get_preset
    from helpers.data import load_dataset
    from helpers.envs import make_env
    from helpers.evaluate import main
    from helpers.policy import HFPolicy

    _, tokenizer, trainer, checkpoint = saved_moved_adapter(tmp_path)

    line = main(["--preset", "tiny-cpu", "--adapter", str(checkpoint), "--n", "6", "--seed", "1234", "--k", "2"])
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed == json.loads(json.dumps(line))
    assert {"success", "pass@2", "pass@1", "tool_calls", "turns", "failures", "n"} <= set(printed) and printed["n"] == 6

    config = get_preset("tiny-cpu")
    tasks = load_dataset("tiny", "test", 6, seed=1234)
    direct = evaluate(HFPolicy(trainer.model, tokenizer), tasks, lambda: make_env(config.env, max_steps=config.env_max_steps),
                      k=2, temperature=config.temperature, max_new_tokens=config.max_new_tokens,
                      max_steps=config.env_max_steps, max_total_tokens=config.max_total_tokens, seed=1234)
    assert {k: printed[k] for k in direct.metrics} == direct.metrics


def test_command_line_refuses_a_folder_without_an_adapter(tmp_path):
    from helpers.evaluate import main

    with pytest.raises(SystemExit):
        main(["--preset", "tiny-cpu", "--adapter", str(tmp_path), "--n", "2"])


def test_load_adapter_puts_the_saved_adapter_back_quietly(tmp_path):
    """``load_adapter`` on a fresh base model gives the trained model's logits, in eval mode, without
    the FutureWarning peft triggers in transformers (the saved-outputs test forbids it in notebooks)."""
    import warnings

    import torch

    from helpers.policy import load_adapter
    from helpers.worlds.tinymodel import load_tiny

    model, _, trainer, checkpoint = saved_moved_adapter(tmp_path)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = load_adapter(load_tiny()[0], checkpoint)
    assert not [w for w in caught if "is_gradient_checkpointing" in str(w.message)]
    assert not loaded.training
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        expected, got, base = trainer.model(ids).logits, loaded(ids).logits, model(ids).logits
    assert torch.allclose(got, expected, atol=1e-6) and not torch.allclose(got, base, atol=1e-3)
