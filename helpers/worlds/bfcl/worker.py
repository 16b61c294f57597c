"""BFCL's own code, called from the workbook: runs inside the isolated environment, JSON lines in and out.

    <bfcl-venv>/bin/python helpers/worlds/bfcl/worker.py        # started by helpers.worlds.bfcl.official

This file is the one piece of the workbook that runs with ``bfcl-eval`` imported (its provider SDKs
and pins clash with the workbook's: ``helpers.worlds.bfcl.official``). It imports nothing of
``helpers``, only the standard library and ``bfcl_eval``. Each line on stdin is one request
``{"op": ..., ...}``; each answer is one line on stdout, ``{"ok": true, "value": ...}`` or
``{"ok": false, "error": "..."}``. The operations call BFCL's functions and add no logic of their
own beyond the glue:

    entries    load_dataset_entry(category) and load_ground_truth_entry(category): the prompts as BFCL's
               generation reads them, and the possible answers
    judge      per result entry, the function ``bfcl evaluate`` runs on it (eval_runner's
               _evaluate_single_ast_entry, _evaluate_single_relevance_entry or
               _evaluate_single_multi_turn_entry) with the handler of MODEL: {"id", "valid", "error", ...};
               for an AST entry also how many calls the handler decoded (``decoded_calls``; None elsewhere)
    execute    one assistant step of a multi-turn episode on BFCL's simulators: the handler's
               decode_execute, then multi_turn_utils.execute_multi_turn_func_call (their state is kept
               under the episode's key, as BFCL's own inference keeps it under the model's name)
    release    forget an episode's simulator instances
    signatures the parameter names of every simulator method, in order (to write a positional
               ground-truth call, ``sort('final_report.pdf')``, as JSON arguments)
    models     the model names BFCL knows (its model table), which choose a handler
"""

import atexit
import copy
import functools
import importlib
import inspect
import json
import os
import shutil
import sys
import tempfile
import traceback

# bfcl_eval makes result/, score/ and .file_locks/ under BFCL_PROJECT_ROOT when imported (default: inside
# site-packages): a temporary folder of this process's own, removed when it exits, unless the caller set one.
if "BFCL_PROJECT_ROOT" not in os.environ:
    os.environ["BFCL_PROJECT_ROOT"] = tempfile.mkdtemp(prefix="bfcl-worker-")
    atexit.register(shutil.rmtree, os.environ["BFCL_PROJECT_ROOT"], True)

from bfcl_eval.constants.enums import Language, ReturnFormat  # noqa: E402
from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING  # noqa: E402
from bfcl_eval.eval_checker import eval_runner  # noqa: E402
from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils  # noqa: E402
from bfcl_eval.utils import is_java, is_js, is_multi_turn, is_relevance_or_irrelevance, load_dataset_entry, load_ground_truth_entry  # noqa: E402

MODEL = sys.argv[1] if len(sys.argv) > 1 else "Qwen/Qwen3-0.6B-FC"  # whose handler decodes the results (bfcl evaluate --model)
try:
    HANDLER = eval_runner.get_handler(MODEL)
except KeyError:  # not in BFCL's model table: every request answers so, in one line
    HANDLER = None
    UNKNOWN = f"BFCL has no model {MODEL!r} (bfcl_eval/constants/model_config.py lists them, e.g. Qwen/Qwen3-8B, Qwen/Qwen3-8B-FC)"
RESULT_MODEL = MODEL.replace("/", "_")  # the model's folder name in result/, as eval_runner.runner passes it on


def entries(category):
    prompts = load_dataset_entry(category)
    answers = None if is_relevance_or_irrelevance(category) else load_ground_truth_entry(category)
    return {"prompts": prompts, "answers": answers}


@functools.cache
def judged_data(category):
    """The prompts and ground truth by id, as ``bfcl evaluate``'s runner loads them (read once per category)."""
    prompts = {entry["id"]: entry for entry in load_dataset_entry(category, include_prereq=False, include_language_specific_hint=False)}
    answers = {} if is_relevance_or_irrelevance(category) else {a["id"]: a["ground_truth"] for a in load_ground_truth_entry(category)}
    return prompts, answers


def judge(category, results):
    """``bfcl evaluate``'s verdict on each result entry, by the function its runner calls for the category."""
    prompts, answers = judged_data(category)
    verdicts = []
    for result in results:
        entry_id, prompt = result["id"], copy.deepcopy(prompts[result["id"]])
        if is_relevance_or_irrelevance(category):
            verdict = eval_runner._evaluate_single_relevance_entry(HANDLER, entry_id, result["result"], prompt, RESULT_MODEL, category)
        elif is_multi_turn(category):
            verdict = eval_runner._evaluate_single_multi_turn_entry(HANDLER, entry_id, result["result"], copy.deepcopy(answers[entry_id]), prompt,
                                                                    RESULT_MODEL, category)
        else:
            language, return_format = ((Language.JAVA, ReturnFormat.JAVA) if is_java(category) else
                                       (Language.JAVASCRIPT, ReturnFormat.JAVASCRIPT) if is_js(category) else
                                       (Language.PYTHON, ReturnFormat.PYTHON))
            verdict = eval_runner._evaluate_single_ast_entry(HANDLER, entry_id, result["result"], copy.deepcopy(answers[entry_id]), prompt, RESULT_MODEL,
                                                             category, language=language, return_format=return_format, has_tool_call_tag=False)
            verdict["decoded_calls"] = decoded_calls(result["result"], return_format)
        error = verdict.get("error")
        error_type = verdict.get("error_type") or (error.get("error_type") if isinstance(error, dict) else None)
        verdicts.append({"id": entry_id, "valid": bool(verdict["valid"]), "error_type": error_type,
                         "error": None if verdict["valid"] else json.dumps(error, default=str)[:500],
                         "decoded_calls": verdict.get("decoded_calls")})
    return verdicts


def decoded_calls(result, return_format):
    """How many calls the handler reads in a single-turn result, as the AST checker decodes it (0: none, or it
    cannot decode it): a file written for another handler reads as no calls at all."""
    try:
        decoded = HANDLER.decode_ast(result, return_format, False)
    except Exception:
        return 0
    return len(decoded) if eval_runner.is_function_calling_format_output(decoded) else 0


def execute(key, entry, text):
    """One assistant step on the simulators of episode ``key``: the results BFCL's inference would show the model."""
    try:
        calls = HANDLER.decode_execute(text, has_tool_call_tag=False)
    except Exception as e:  # BFCL's inference answers an undecodable step with no execution at all
        return {"calls": [], "results": [], "error": f"{type(e).__name__}: {e}"}
    results, _ = multi_turn_utils.execute_multi_turn_func_call(calls, entry["initial_config"], entry["involved_classes"], key, entry["id"],
                                                               long_context="long_context" in entry["id"])
    return {"calls": calls, "results": [str(r) for r in results], "error": None}


def release(key):
    """Drop the simulator instances execute_multi_turn_func_call keeps in its module's globals for ``key``."""
    prefix = key.replace("-", "_").replace(".", "_").replace("/", "_").replace(":", "_") + "_"
    names = [name for name in vars(multi_turn_utils) if name.startswith(prefix) and name.endswith("_instance")]
    for name in names:
        delattr(multi_turn_utils, name)
    return len(names)


def signatures():
    found = {}
    for class_name, module_name in CLASS_FILE_PATH_MAPPING.items():
        try:
            cls = getattr(importlib.import_module(module_name), class_name)
        except ImportError:  # the memory and web-search backends need packages this environment leaves out
            continue
        for name, method in inspect.getmembers(cls, predicate=inspect.isfunction):
            if not name.startswith("_"):
                found[name] = [p for p in inspect.signature(method).parameters if p != "self"]
    return found


def models():
    """The names ``bfcl evaluate --model`` takes: BFCL's model table."""
    return sorted(eval_runner.MODEL_CONFIG_MAPPING)


OPS = {"entries": entries, "judge": judge, "execute": execute, "release": release, "signatures": signatures, "models": models}


def main():
    out = sys.stdout
    sys.stdout = sys.stderr  # BFCL's own prints must not corrupt the answers
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            if HANDLER is None:
                raise LookupError(UNKNOWN)
            answer = {"ok": True, "value": OPS[request.pop("op")](**request)}
        except Exception as e:
            answer = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-2000:]}
        out.write(json.dumps(answer, default=str) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
