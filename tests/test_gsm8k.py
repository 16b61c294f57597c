"""The GSM8K path: presets, lenient vs strict scoring, the full evaluation, the CPU smoke run."""

import json

import pytest

from helpers.config import get_preset
from helpers.ecosystem.trl_bridge import batch_split
from helpers.evaluation import breakdown, evaluate, save_records
from helpers.formats import format_number, to_number
from helpers.lab.memory import check_fits, memory_plan
from helpers.paths import GSM8K_SAMPLE, TINY_DIR
from helpers.policy.base import Generation
from helpers.worlds.gsm8k.tasks import load_gsm8k


def test_gsm8k_24gb_preset_is_what_the_issue_asks_for():
    c = get_preset("gsm8k-24gb")
    assert c.model == "Qwen/Qwen2.5-1.5B-Instruct" and c.dtype == "bfloat16" and c.gradient_checkpointing
    assert c.use_lora and set(c.lora_target_modules) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert c.backend == "vllm" and c.vllm_sleep_mode and c.num_generations == 8 and c.max_new_tokens <= 512
    assert c.lr == 1e-5 and (c.env, c.dataset, c.env_max_steps) == ("math", "gsm8k", 1)
    assert c.eval_tasks >= 1319  # the whole test split


def test_t4_and_smoke_presets():
    t4 = get_preset("gsm8k-t4")
    assert t4.model == "Qwen/Qwen2.5-0.5B-Instruct" and "bfloat16" not in (t4.dtype, t4.vllm_dtype)  # a T4 has no bf16
    t4_tools = get_preset("gsm8k-t4-tools")  # the agentic run on a T4: the 0.5B model with the calculator
    assert (t4_tools.model, t4_tools.env, t4_tools.env_max_steps) == (t4.model, "calculator", get_preset("gsm8k-24gb-tools").env_max_steps)
    assert check_fits("gsm8k-t4-tools", gpu_gb=15).peak_gib < 15
    smoke = get_preset("gsm8k-cpu-smoke")
    assert (smoke.model, smoke.dataset, smoke.env, smoke.backend, smoke.device) == ("data/tiny", "gsm8k-sample", "math", "hf", "cpu")


class OraclePolicy:
    """Answers each GSM8K question in a chosen style, so the evaluation's numbers are known in advance.

    tag: right, in the asked-for format | hash: right, as "#### N" (lenient only) | wrong: tag with
    answer + 1 | none: no number at all | long: rambles past max_new_tokens (truncated).
    """

    def __init__(self, tokenizer, tasks, styles):
        self.tokenizer = tokenizer
        self.plan = {t.metadata["question"]: (t.answer, s) for t, s in zip(tasks, styles)}

    def reply(self, answer: str, style: str) -> str:
        wrong = format_number(to_number(answer) + 1)
        return {
            "tag": f"Step by step it comes to {answer}. <answer>{answer}</answer>",
            "hash": f"So it is {answer}.\n#### {answer}",
            "wrong": f"I think <answer>{wrong}</answer>",
            "none": "I am not sure about this one.",
            "long": "Let me think. " * 40,
        }[style]

    def generate(self, prompts, params):
        out = []
        for prompt in prompts:
            text = self.tokenizer.decode(prompt, skip_special_tokens=False)
            answer, style = next(v for q, v in self.plan.items() if q in text)
            ids = self.tokenizer.encode(self.reply(answer, style), add_special_tokens=False) + [self.tokenizer.eos_token_id]
            finish = "stop" if len(ids) <= params.max_new_tokens else "length"
            ids = ids[: params.max_new_tokens]
            out.append(Generation(ids, [0.0] * len(ids), finish))
        return out


def test_full_evaluation_reports_lenient_and_strict_accuracy_and_breakdown(tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(TINY_DIR)
    tasks = load_gsm8k("test", GSM8K_SAMPLE)
    styles = [("tag", "hash", "wrong", "none", "long")[i % 5] for i in range(len(tasks))]
    count = {s: styles.count(s) for s in set(styles)}
    policy = OraclePolicy(tokenizer, tasks, styles)
    result = evaluate(policy, tasks, "math", max_new_tokens=64, max_steps=1, max_total_tokens=1024)
    n = len(tasks)
    m = result.metrics
    assert m["n"] == n
    assert m["success"] == pytest.approx((count["tag"] + count["hash"]) / n)  # lenient: "#### N" counts
    assert m["strict_success"] == pytest.approx(count["tag"] / n)  # strict: only the <answer> tag
    assert m["strict_format"] == pytest.approx((count["tag"] + count["wrong"]) / n)
    assert breakdown(result.records) == {
        "correct": count["tag"] + count["hash"], "wrong_number": count["wrong"], "no_answer": count["none"], "truncated": count["long"],
    }
    path = save_records(tmp_path / "eval.jsonl", result.records)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == n and {"task_id", "answer", "predicted", "verdict", "strict_format", "completion"} <= set(rows[0])


def test_memory_plan_reads_the_tiny_model_from_its_folder():
    from transformers import AutoConfig

    plan = memory_plan("gsm8k-cpu-smoke", gpu_gb=16)
    c = AutoConfig.from_pretrained(TINY_DIR)
    assert (plan.shape.hidden, plan.shape.layers, plan.shape.vocab) == (c.hidden_size, c.num_hidden_layers, c.vocab_size)
    assert any(term == "hf generate: KV cache" for term, _, _ in plan.rows) and plan.fits


@pytest.mark.slow
def test_tools_cpu_smoke_run_end_to_end(tmp_path):
    """gsm8k-24gb-tools' path (calculator env, Qwen's tool-call format) runs on the tiny model through the CLI."""
    from helpers.train import main

    result = main(["--preset", "gsm8k-tools-cpu-smoke", "--steps", "1", "--pass-k", "0", "--out-dir", str(tmp_path)])
    assert {"success", "tool_calls", "tool_result_used", "turns"} <= set(result.after)
    assert result.after["n"] == result.before["n"] >= 5


def test_tools_preset_is_the_agentic_gsm8k_run():
    tools, baseline = get_preset("gsm8k-24gb-tools"), get_preset("gsm8k-24gb")
    assert tools.env == "calculator" and tools.env_max_steps == 5 and baseline.env == "math"
    assert (tools.model, tools.dataset, tools.rewards) == (baseline.model, baseline.dataset, baseline.rewards)
    assert memory_plan(tools, 24).fits


@pytest.mark.slow
def test_cpu_smoke_run_end_to_end(tmp_path):
    """Data -> rollout -> reward -> GRPO -> evaluation on the sample, through the CLI entry point."""
    from helpers.train import main

    run = tmp_path / "run"
    result = main(["--preset", "gsm8k-cpu-smoke", "--steps", "1", "--pass-k", "0", "--out-dir", str(run)])
    held_out = result.before["n"]
    assert held_out >= 5 and result.after["n"] == held_out
    assert {"success", "strict_success", "strict_format"} <= set(result.after)
    for step in (0, 1):  # per-problem records before and after
        assert len((run / "eval" / f"step-{step:04d}.jsonl").read_text().splitlines()) == held_out
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2
    assert (run / "checkpoint-1").is_dir() and (run / "summary.json").exists()


def test_trl_multi_gpu_dry_run(capsys):
    """The scaling-out script builds TRL's config, dataset and rewards from the same preset (no GPU, no hub)."""
    import importlib.util

    from helpers.paths import ROOT

    spec = importlib.util.spec_from_file_location("trl_multi_gpu", ROOT / "scripts" / "trl_multi_gpu.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["--preset", "gsm8k-24gb", "--dataset", "gsm8k-sample", "--generation", "vllm-server", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "correct: tag -> 1.0, '#### N' -> 1.0" in out  # lenient correctness is what GRPO optimises
    assert "format: tag -> 1.0, '#### N' -> 0.0" in out  # strict format is logged with weight 0
    assert "per_device_train_batch_size=8, gradient_accumulation_steps=16, num_generations=8" in out
    assert "loss_type=dapo" in out and "vllm_mode=server" in out
    # 16 tasks x 8 samples per optimizer step over 4 processes: micro-batches of 8, 4 of them on each
    assert batch_split(get_preset("gsm8k-24gb"), 4) == (8, 4)
