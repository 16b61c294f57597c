"""``--answers-model``: a BFCL result file is decoded by the handler of the BFCL model that wrote it, as
``bfcl evaluate --model NAME`` does; without it, a file the default handler cannot read is refused in one line.

BFCL's own simple_python ground truth, written in the two formats BFCL's handlers write: Python-call syntax
(prompting handlers, ``Qwen/Qwen3-8B``) and Qwen's ``<tool_call>`` JSON (function-calling ones, ``Qwen/Qwen3-8B-FC``).
"""

import json

import pytest

from helpers.evaluate import command as evaluate_command
from helpers.worlds.bfcl import official
from helpers.worlds.bfcl.tasks import load_category, python_call_text, reference_result, tool_call_text


def write(path, write_calls) -> list[dict]:
    rows = [{"id": task.id, "result": reference_result(task, write_calls)} for task in load_category("simple_python")]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return rows


def test_python_call_syntax_scores_100_percent_with_a_prompting_handler_as_bfcl_evaluate_does(tmp_path, capsys):
    path = tmp_path / "BFCL_v4_simple_python_result.json"
    rows = write(path, python_call_text)
    assert rows[0]["result"].startswith("[calculate_triangle_area(base=10, height=5")

    # Without --answers-model: not 0.0, but one line saying why, and a non-zero exit.
    with pytest.raises(SystemExit) as refused:
        evaluate_command(["--benchmark", "bfcl", "--answers", str(path)])
    message = str(refused.value)
    assert "400 of 400 results did not decode with the default handler" in message and "--answers-model" in message
    assert "\n" not in message and refused.value.code != 0

    line = evaluate_command(["--benchmark", "bfcl", "--answers", str(path), "--answers-model", "Qwen/Qwen3-8B"])
    ours = line["categories"]["simple_python"]
    assert ours["accuracy"] == 1.0 and ours["correct_count"] == ours["total_count"] == 400
    assert line["answers_model"] == "Qwen/Qwen3-8B"
    theirs = official.bfcl_evaluate({"simple_python": rows}, model="Qwen/Qwen3-8B")  # bfcl evaluate --model Qwen/Qwen3-8B
    assert theirs == {"simple_python": {k: ours[k] for k in ("accuracy", "correct_count", "total_count")}}


def test_a_function_calling_handlers_file_likewise(tmp_path):
    path = tmp_path / "BFCL_v4_simple_python_result.json"
    rows = write(path, tool_call_text)
    line = evaluate_command(["--benchmark", "bfcl", "--answers", str(path), "--answers-model", "Qwen/Qwen3-8B-FC"])
    ours = line["categories"]["simple_python"]
    assert ours["accuracy"] == 1.0
    assert official.bfcl_evaluate({"simple_python": rows}, model="Qwen/Qwen3-8B-FC") == {
        "simple_python": {k: ours[k] for k in ("accuracy", "correct_count", "total_count")}}
    # The same file read by a prompting handler does not decode: the named handler is the one used.
    assert evaluate_command(["--benchmark", "bfcl", "--answers", str(path), "--answers-model", "Qwen/Qwen3-8B"]
                            )["categories"]["simple_python"]["correct_count"] == 0


def test_an_unknown_model_and_a_benchmark_without_result_files_are_refused_in_one_line(tmp_path, capsys):
    path = tmp_path / "BFCL_v4_simple_python_result.json"
    write(path, tool_call_text)
    with pytest.raises(SystemExit) as unknown:
        evaluate_command(["--benchmark", "bfcl", "--answers", str(path), "--answers-model", "no/such-model"])
    assert str(unknown.value).endswith("--answers-model no/such-model: BFCL has no such model (bfcl_eval/constants/model_config.py "
                                      "lists them, e.g. Qwen/Qwen3-8B for Python-call syntax, Qwen/Qwen3-8B-FC for <tool_call> JSON)")
    with pytest.raises(SystemExit):
        evaluate_command(["--benchmark", "humaneval", "--answers", str(path), "--answers-model", "Qwen/Qwen3-8B"])
    assert "--answers-model" in capsys.readouterr().err
