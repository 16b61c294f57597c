"""BFCL's categories as tasks: ``bfcl/<category>`` (the benchmark) and ``bfcl-splits/<category>`` (for training).

    tasks = load_dataset("bfcl/simple_python", "test")              # all 400, in BFCL's order; ids are BFCL's
    tasks = load_dataset("bfcl-splits/multi_turn_base", "train")    # ~80 % of the 200, by a hash of the id
    tasks = load_dataset("bfcl-splits/multi_turn_base:GorillaFileSystem+MathAPI", "test")   # tasks on these simulators only
    reference_result(tasks[0])                                      # BFCL's ground truth, written as model output

The data is what ``bfcl-eval`` ships (``bfcl_eval/data/BFCL_v4_<category>.json`` and
``possible_answer/``), read by BFCL's own loaders in its environment (``official.call("entries")``:
``load_dataset_entry``, which also adds the function docs of the multi-turn simulators and the
language hints BFCL's generation adds). Each entry becomes a Task with BFCL's id, no reference answer
(BFCL's checker decides) and ``metadata = {"category", "entry", "ground_truth"}``.

What the model sees, for a single-turn category: the function docs as the tools of the prompt, in the
system turn, in the words of BFCL's handler for Qwen's function calling (``QwenFCHandler._format_prompt``:
"# Tools ... <tools>{doc}</tools> ... <tool_call>"), then the question; it answers with
``<tool_call>`` blocks (or, for the irrelevance categories, with none). For a multi-turn category the
task's prompt is the first user turn only: the simulators' functions are the tools of the env
(``helpers.worlds.bfcl.env``), which the chat template lists, and the env gives the later user turns.

Splits. BFCL is a test set: ``bfcl/<category>`` has one split, ``"test"``, the whole category, so its
numbers are the leaderboard's. ``bfcl-splits/<category>`` cuts the same entries 80/10/10 into
train/validation/test by a hash of the id (``split_of``): the same entry is always in the same split, so
a run that trains on ``train`` and evaluates on ``test`` never evaluates on what it trained on. Its
``test`` part is inside ``bfcl/<category>``, so after training on ``bfcl-splits`` the full category's
number is no longer a held-out number: report the held-out split's.

A member may end with ``:<Class>+<Class>`` (multi-turn only): the tasks whose simulators are all among
those, the set one env class hosts (TRL's contract: an env class has one set of tools).

Categories: ``SUPPORTED`` (BFCL's names; ``simple_python`` is the "simple" category): each one's ground
truth, written as model output by ``reference_result``, scores 100 % through BFCL's own checker
(tests/test_bfcl.py), but for four entries of live_simple (2 of 258) and live_multiple (2 of 1053) whose
possible answers contradict their own function docs, so that no output can pass them (``UNSATISFIABLE``). Left out: ``simple_java`` and ``simple_javascript`` (their answers are Java and
JavaScript values, which the workbook's models are not asked to write), the memory and web-search
categories (agentic: they need sentence-transformers and torch in BFCL's environment, or the network),
and ``format_sensitivity`` (not scored).
"""

from __future__ import annotations

import ast
import functools
import json
from typing import Callable

from helpers.data import DatasetError, Task, register_dataset_family
from helpers.worlds.arithmetic.tasks import split_of
from helpers.worlds.bfcl import official

SINGLE_TURN = ["simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance", "live_simple", "live_multiple",
               "live_parallel", "live_parallel_multiple", "live_irrelevance", "live_relevance"]
MULTI_TURN = ["multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context"]
SUPPORTED = SINGLE_TURN + MULTI_TURN

# Entries whose possible answer no output can match: BFCL's own data contradicts its function doc there
# (tests/test_bfcl.py checks that exactly these fail when the ground truth is written as model output).
UNSATISFIABLE = {
    "live_simple_106-63-0": "required 'auto_loan_payment_start' and 'bank_hours_start' have no acceptable value (an empty list; [] fails the type check)",
    "live_simple_112-68-0": "required 'acc_routing_start' and four more have no acceptable value (an empty list; [] fails the type check)",
    "live_multiple_862-181-3": "the answer has 'journey_start_time', which the function's doc does not have",
    "live_multiple_964-207-0": "the answer names 'question'; the function's one (required) parameter is 'statement'",
}

# QwenFCHandler._format_prompt's words around the function docs (bfcl_eval/model_handler/local_inference/qwen_fc.py)
TOOLS_OPEN = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
              "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
TOOLS_CLOSE = ('\n</tools>\n\nFor each function call, return a json object with function name and arguments within '
               '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')
NO_CALL = "None of the functions given can answer this question."  # the reference output of an irrelevance entry


def is_multi_turn(category: str) -> bool:
    return category.startswith("multi_turn")


def category_of(entry_id: str) -> str:
    """The category of a BFCL id: ``"live_simple_3-2-0"`` -> ``"live_simple"`` (the longest category it starts with)."""
    for category in sorted(SUPPORTED, key=len, reverse=True):
        if entry_id.startswith(category + "_"):
            return category
    raise DatasetError(f"BFCL id {entry_id!r} is not in a category the workbook supports: {', '.join(SUPPORTED)}")


def tools_system_prompt(functions: list[dict], system: str | None = None) -> str:
    """The system turn of a single-turn task: the entry's own system message (if any), then the function docs."""
    docs = "".join(f"\n{json.dumps(function)}" for function in functions)
    return (system + "\n\n" if system else "") + TOOLS_OPEN + docs + TOOLS_CLOSE


@functools.cache
def load_category(category: str) -> tuple[Task, ...]:
    """All tasks of one category, in BFCL's order (one request to BFCL's environment per category and process)."""
    if category not in SUPPORTED:
        raise DatasetError(f"bfcl has no category {category!r} here; supported: {', '.join(SUPPORTED)}")
    data = official.call("entries", category=category)
    answers = data["answers"] or [None] * len(data["prompts"])
    tasks = []
    for entry, answer in zip(data["prompts"], answers, strict=True):
        if answer is not None and answer["id"] != entry["id"]:
            raise DatasetError(f"bfcl {category}: ground truth {answer['id']!r} is not aligned with entry {entry['id']!r}")
        first = entry["question"][0]
        if is_multi_turn(category):
            prompt = [dict(message) for message in first]
        else:
            system = first[0]["content"] if first and first[0]["role"] == "system" else None
            rest = first[1:] if system is not None else first
            prompt = [{"role": "system", "content": tools_system_prompt(entry["function"], system)}, *map(dict, rest)]
        ground_truth = answer["ground_truth"] if answer is not None else None
        tasks.append(Task(entry["id"], prompt, None, {"category": category, "entry": entry, "ground_truth": ground_truth}))
    return tuple(tasks)


def parse_member(member: str) -> tuple[str, tuple[str, ...] | None]:
    """``"multi_turn_base:MathAPI+TradingBot"`` -> ``("multi_turn_base", ("MathAPI", "TradingBot"))``."""
    category, sep, classes = member.partition(":")
    if not sep:
        return category, None
    if not is_multi_turn(category):
        raise DatasetError(f"bfcl/{member}: only a multi-turn category takes ':<Class>+<Class>' (its simulators)")
    return category, tuple(sorted(classes.split("+")))


def select(member: str) -> list[Task]:
    category, classes = parse_member(member)
    tasks = list(load_category(category))
    if classes is not None:
        tasks = [t for t in tasks if set(t.metadata["entry"]["involved_classes"]) <= set(classes)]
        if not tasks:
            raise DatasetError(f"bfcl/{member}: no {category} task uses only the simulators {'+'.join(classes)}")
    return tasks


@register_dataset_family("bfcl")
def bfcl_dataset(member: str, split: str, n: int | None, seed: int) -> list[Task]:
    """The benchmark: the first ``n`` tasks (None: all) of the category's one split, ``"test"``; the seed is not used."""
    if split != "test":
        raise DatasetError(f"bfcl/{member} is BFCL's test set, one split 'test'; for train/validation/test use bfcl-splits/{member}")
    return select(member)[:n]


@register_dataset_family("bfcl-splits")
def bfcl_splits_dataset(member: str, split: str, n: int | None, seed: int) -> list[Task]:
    """The category cut 80/10/10 by a hash of each id (``split_of``): the first ``n`` of ``split``, BFCL's order."""
    tasks = [task for task in select(member) if split_of(task.id) == split]
    return tasks[:n]


# --- BFCL's ground truth, written as model output -----------------------------------------------


LEAVE_OUT = object()  # what ``chosen`` returns for a parameter the model does not write


def chosen(options: list, documented: bool = True, required: bool = False):
    """What a model writing the ground truth gives for a parameter whose acceptable values are ``options``:
    the first that is not ``""`` (BFCL's mark for "may be left out"; None, JSON's null, is a value like any
    other); ``LEAVE_OUT`` when there is none, or when ``""`` is acceptable and the function doc lacks the
    parameter (written, it would be "unexpected"); but ``""`` itself when it is the only acceptable value and the
    doc requires the parameter (left out, it would be "missing")."""
    if "" in options and not documented:
        return LEAVE_OUT
    value = next((option for option in options if option != ""), LEAVE_OUT)
    return "" if value is LEAVE_OUT and "" in options and required else value


def concrete(value):
    """A chosen value as the model writes it. A dict, alone or in a list of dicts, holds a list of acceptable
    values per key, one level deep (what BFCL's dict_checker and list_dict_checker read); the rest is literal."""
    if isinstance(value, dict):
        picked = {key: chosen(options) if isinstance(options, list) else options for key, options in value.items()}
        return {key: item for key, item in picked.items() if item is not LEAVE_OUT}
    if isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
        return [concrete(item) for item in value]
    return value


def tool_call_text(calls: list[tuple[str, dict]]) -> str:
    """Calls in Qwen's format, the format BFCL's QwenFCHandler decodes (one block per call)."""
    return "\n".join(f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>' for name, arguments in calls)


def python_call_text(calls: list[tuple[str, dict]]) -> str:
    """Calls in Python-call syntax, ``[f(a=1, b='x'), g()]``: what BFCL's prompting handlers (``Qwen/Qwen3-8B``, most
    prompt-mode models) write and decode."""
    return "[" + ", ".join(f"{name}({', '.join(f'{key}={value!r}' for key, value in arguments.items())})"
                           for name, arguments in calls) + "]"


def parse_call(text: str, signatures: dict[str, list[str]]) -> tuple[str, dict]:
    """A ground-truth call string, ``"mv(source='a', destination='b')"`` or ``"sort('a')"``, as (name, arguments);
    positional arguments take the simulator method's parameter names."""
    node = ast.parse(text, mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise DatasetError(f"bfcl ground truth {text!r} is not a plain function call")
    name = node.func.id
    arguments = {signatures[name][i]: ast.literal_eval(arg) for i, arg in enumerate(node.args)}
    arguments.update({kw.arg: ast.literal_eval(kw.value) for kw in node.keywords})
    return name, arguments


def reference_result(task: Task, write: Callable[[list[tuple[str, dict]]], str] = tool_call_text) -> object:
    """The ``result`` a model that writes BFCL's ground truth would have: a text for a single-turn entry, a list
    of turns (each a list of one step's text) for a multi-turn entry. An irrelevance entry's is a reply without
    a call; a live_relevance entry (which has no ground truth: any call counts) calls its first function.
    ``write`` spells the calls: ``tool_call_text`` (a function-calling handler's format) or ``python_call_text``
    (a prompting handler's)."""
    category, truth = task.metadata["category"], task.metadata["ground_truth"]
    if "irrelevance" in category:
        return NO_CALL
    if category == "live_relevance":
        return write([(task.metadata["entry"]["function"][0]["name"], {})])
    if is_multi_turn(category):
        signatures = simulator_signatures()
        return [[write([parse_call(call, signatures) for call in turn])] if turn else [NO_CALL] for turn in truth]
    docs = {function["name"]: function["parameters"] for function in task.metadata["entry"]["function"]}
    calls = []
    for call in truth:
        for name, arguments in call.items():
            doc = docs.get(name, {})
            values = {key: chosen(options, documented=key in doc.get("properties", {}), required=key in doc.get("required", []))
                      for key, options in arguments.items()}
            calls.append((name, {key: concrete(value) for key, value in values.items() if value is not LEAVE_OUT}))
    return write(calls)


def broken_result(task: Task) -> object:
    """An obviously wrong ``result``: a call of a function that does not exist (a plain reply for live_relevance,
    where any call would count)."""
    text = NO_CALL if task.metadata["category"] == "live_relevance" else tool_call_text([("no_such_function", {"x": 1})])
    turns = task.metadata["entry"]["question"]
    return [[text] for _ in turns] if is_multi_turn(task.metadata["category"]) else text


@functools.cache
def simulator_signatures() -> dict[str, list[str]]:
    """Every simulator method's parameter names, in order (from BFCL's environment)."""
    return official.call("signatures")
