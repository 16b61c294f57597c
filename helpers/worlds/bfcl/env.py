"""BFCL's envs: a single-turn entry judged by BFCL's AST checker, and its multi-turn simulators as a world.

    env = make_env("bfcl", max_steps=1)                       # Episode(BfclEnv()): one reply, BFCL's verdict
    env = make_env("bfcl_multiturn", classes="GorillaFileSystem", max_steps=20)   # the file-system simulator's tools
    python -m helpers.evaluate --benchmark bfcl --answers result/        # BFCL's result files, scored by BFCL's checker
    python -m helpers.evaluate --benchmark bfcl/multi_turn_base:GorillaFileSystem --preset tiny-agent   # a model on the simulators

``BfclEnv`` (``"bfcl"``): the task's prompt already lists the function docs (``tasks.tools_system_prompt``);
the env has no tools of its own, so the model's one reply is the answer: its ``<tool_call>`` blocks
are the calls (none, for an irrelevance entry), and BFCL's checker judges the reply as the ``result``
of that entry, exactly as ``bfcl evaluate`` would judge it in a result file (``official``, the worker's
``judge``). Reward = valid (1.0 or 0.0), ``info["verdict"]`` = ``"correct"`` or BFCL's error type
(``simple_function_checker:missing_required``, ``irrelevance_error:decoder_success``, ...).

``BfclMultiTurnEnv`` (``"bfcl_multiturn"``): BFCL's stateful API simulators (``func_source_code``: the file
system, math, travel booking, trading, messaging, posting, ticketing, vehicle control) as an env on TRL's
contract. Its tools are the simulators' functions, made from BFCL's own function docs
(``multi_turn_func_doc``) as typed, docstringed methods; a call runs in BFCL's environment through
BFCL's own ``execute_multi_turn_func_call`` on the episode's instances, which keep their state for the
whole episode, and its result is what BFCL's inference would show the model. A reply without a call ends
a user turn: the env gives the next one (``_judge``'s feedback) until the entry has none left. Then
BFCL's multi-turn checker judges the episode, replaying its calls turn by turn against the ground
truth's (the state of every simulator and the results must match): ``get_reward()`` is its verdict,
1.0 or 0.0, for an episode that ended any way (an unfinished one is BFCL's "force-terminated", 0).

One env class hosts one set of simulators (``classes``, e.g. ``"GorillaFileSystem+TwitterAPI"``): TRL
reads an env's tools from its class, so each set is its own class (``multiturn_class``), and its tasks
are ``bfcl-splits/multi_turn_base:GorillaFileSystem+TwitterAPI``, the entries on those simulators only.
The model sees the functions of all the set's simulators, where BFCL shows only the entry's own: with a
set larger than an entry's, it has more functions to choose from than on the leaderboard.

Simplifications, named:

* The tool schemas are BFCL's docs through ``get_json_schema``: an argument's type and description,
  arrays' item types; BFCL's ``enum`` lists and nested ``properties`` of a dict argument are left out,
  as are the docs' ``response`` sections.
* Each tool call is recorded as one step of its turn (BFCL records one step per model reply, which may
  hold several calls); the checker runs a turn's calls in the same order either way.
* ``excluded_function`` and the miss-func and miss-param categories' turns without a question are not
  modelled: the env plays entries whose every turn has a user message (multi_turn_base,
  multi_turn_long_context) and lists all the functions of its simulators.
* Under TRL's ``GRPOTrainer`` (which ends an episode at the first reply without a call) an episode is
  the first user turn only, so entries with more turns score 0 there; the workbook's loop plays them all.
"""

from __future__ import annotations

import functools
import inspect
import json
import uuid
from collections import defaultdict
from pathlib import Path

from helpers.data import DatasetError
from helpers.envs.anchors import register_anchor, tool_history
from helpers.envs.registry import register_env
from helpers.benchmarks import Benchmark, register_benchmark
from helpers.rewards import env_reward, register_reward
from helpers.worlds.bfcl import official
from helpers.worlds.bfcl.tasks import SUPPORTED, category_of, is_multi_turn, load_category, parse_member, tool_call_text


def judge_results(category: str, results: list[dict], model: str = official.MODEL) -> list[dict]:
    """BFCL's verdict on each ``{"id", "result"}`` of one category: ``{"id", "valid", "error_type", "error"}``,
    each result decoded by the handler of BFCL's ``model`` (``bfcl evaluate --model``'s)."""
    return official.call("judge", model=model, category=category, results=results)


def verdict_info(verdict: dict) -> dict:
    valid = verdict["valid"]
    return {"correct": valid, "score": float(valid), "verdict": "correct" if valid else verdict["error_type"] or "invalid",
            "error": verdict["error"], "reward": float(valid)}


class BfclEnv:
    """One single-turn BFCL entry: reward 1.0 when BFCL's checker finds the reply valid, else 0.0."""

    def __init__(self):
        self.category, self.entry_id = None, None

    def reset(self, **row) -> None:
        """Keep the entry's id and category (a task of ``load_dataset("bfcl/<category>", "test")``)."""
        category, entry = row.get("category"), row.get("entry")
        if category not in SUPPORTED or not isinstance(entry, dict):
            raise ValueError("BfclEnv needs a row of a bfcl/<category> task (its 'category' and 'entry')")
        if is_multi_turn(category):
            raise ValueError(f"{category} is multi-turn: play it in the 'bfcl_multiturn' env (its simulators), not 'bfcl'")
        self.category, self.entry_id = category, entry["id"]
        return None

    def _judge(self, text: str) -> dict:
        (verdict,) = judge_results(self.category, [{"id": self.entry_id, "result": text}])
        return {"predicted": text[:500], **verdict_info(verdict)}


register_env("bfcl", BfclEnv)
register_anchor("bfcl", tool_history)  # the calls so far and their results: the state


# --- the multi-turn simulators as an env ---------------------------------------------------------

MULTI_TURN_STEPS = 20  # assistant turns of a multi-turn episode played by --benchmark: 2-5 user turns, each calls and a reply
TYPES = {"string": str, "integer": int, "float": float, "number": float, "boolean": bool, "dict": dict, "object": dict}


def python_type(schema: dict) -> type:
    """The Python type of a BFCL doc's parameter: ``{"type": "array", "items": {"type": "string"}}`` -> ``list[str]``."""
    if schema.get("type") == "array":
        item = TYPES.get(schema.get("items", {}).get("type"))
        return list[item] if item is not None else list
    return TYPES.get(schema.get("type"), str)


def make_tool(doc: dict):
    """A method for one BFCL function doc: keyword arguments with its types, a Google docstring with its
    descriptions; calling it runs the function on the episode's simulators (``BfclMultiTurnEnv._run``)."""
    name, properties = doc["name"], doc["parameters"].get("properties", {})
    required = set(doc["parameters"].get("required", []))

    def tool(self, **arguments) -> str:
        return self._run(name, arguments)

    parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    parameters += [inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY, annotation=python_type(schema),
                                     default=inspect.Parameter.empty if key in required else schema.get("default"))
                   for key, schema in properties.items()]
    tool.__signature__ = inspect.Signature(parameters, return_annotation=str)
    tool.__annotations__ = {p.name: p.annotation for p in parameters[1:]} | {"return": str}
    args = "".join(f"    {key}: {' '.join(schema.get('description', key).split())}\n" for key, schema in properties.items())
    tool.__doc__ = " ".join(doc["description"].split()) + ("\n\nArgs:\n" + args if args else "")
    tool.__name__ = tool.__qualname__ = name
    return tool


@functools.cache
def multiturn_class(classes: tuple[str, ...]) -> type:
    """The env class hosting one set of simulators, its tools made from their BFCL docs (made once per set)."""
    docs, covered = {}, set()
    for task in load_category("multi_turn_base"):  # BFCL's loader puts the docs of an entry's simulators in entry["function"]
        entry = task.metadata["entry"]
        if set(entry["involved_classes"]) <= set(classes):
            docs.update({doc["name"]: doc for doc in entry["function"]})
            covered.update(entry["involved_classes"])
    if covered != set(classes):
        raise ValueError(f"bfcl_multiturn: no multi_turn_base entry uses only {'+'.join(sorted(set(classes) - covered))} "
                         "among these simulators; name a set some entry uses (its involved_classes)")
    methods = {name: make_tool(doc) for name, doc in docs.items()}
    return type("BfclMultiTurnEnv", (BfclMultiTurnEnv,), {**methods, "classes": classes, "__doc__": BfclMultiTurnEnv.__doc__})


class BfclMultiTurnEnv:
    """A multi-turn BFCL entry on its simulators; ``get_reward()`` is BFCL's multi-turn checker's verdict.

    Made through ``new_env("bfcl_multiturn", classes="GorillaFileSystem+TwitterAPI")`` (``bfcl_multiturn``),
    which gives the class of that set of simulators its tools.
    """

    classes: tuple[str, ...] = ()

    def __init__(self):
        self.entry, self.category, self.key = None, None, None
        self.turns: list[list[str]] = []  # per user turn, the steps' texts (BFCL's result format)
        self.verdict: dict | None = None

    def reset(self, **row) -> None:
        """Start the entry's episode on fresh simulators (its ``initial_config``); the prompt is its first user turn."""
        category, entry = row.get("category"), row.get("entry")
        if not isinstance(entry, dict) or category is None or not is_multi_turn(category):
            raise ValueError("BfclMultiTurnEnv needs a row of a multi-turn bfcl task (its 'category' and 'entry')")
        if not set(entry["involved_classes"]) <= set(self.classes):
            raise ValueError(f"task {entry['id']} uses {'+'.join(sorted(entry['involved_classes']))}; this env hosts {'+'.join(self.classes)} "
                             f"(load bfcl-splits/{category}:{'+'.join(self.classes)})")
        if not all(turn for turn in entry["question"]):
            raise ValueError(f"task {entry['id']} has a turn without a user message ({category}): not modelled here")
        self._release()
        self.entry, self.category, self.key = entry, category, f"wb_{uuid.uuid4().hex}"
        self.turns, self.verdict = [[]], None
        return None

    def _run(self, name: str, arguments: dict) -> str:
        text = tool_call_text([(name, arguments)])
        self.turns[-1].append(text)
        state = {key: self.entry[key] for key in ("id", "initial_config", "involved_classes")}
        executed = official.call("execute", key=self.key, entry=state, text=text)
        if executed["error"]:
            return f"error: {executed['error']}"
        return executed["results"][0] if executed["results"] else "error: nothing was executed"

    def _judge(self, text: str) -> dict:
        """A reply without a call ends the user turn: the next turn comes back as feedback, or the last is judged."""
        self.turns[-1].append(text)
        questions = self.entry["question"]
        if len(self.turns) < len(questions):
            self.turns.append([])
            feedback = "\n".join(message["content"] for message in questions[len(self.turns) - 1])
            return {"feedback": feedback, "correct": False, "verdict": f"turn {len(self.turns) - 1} of {len(questions)} done"}
        return {"predicted": None, **verdict_info(self._verdict())}

    def _verdict(self) -> dict:
        if self.verdict is None:
            (self.verdict,) = judge_results(self.category, [{"id": self.entry["id"], "result": self.turns}])
            self._release()
        return self.verdict

    def _release(self) -> None:
        if self.key is not None:
            official.call("release", key=self.key)
            self.key = None

    def get_reward(self) -> float:
        """BFCL's multi-turn checker on the turns played (an episode cut short: force-terminated, 0.0)."""
        return float(self._verdict()["valid"])


def bfcl_multiturn(classes: str | tuple[str, ...] = "GorillaFileSystem"):
    """A new multi-turn env for one set of simulators: ``"GorillaFileSystem+TwitterAPI"`` or a tuple of names."""
    names = tuple(sorted(classes.split("+") if isinstance(classes, str) else classes))
    return multiturn_class(names)()


register_env("bfcl_multiturn", bfcl_multiturn)
register_anchor("bfcl_multiturn", tool_history)  # the calls so far and their results: the API state
# The part CombinedReward adds for the env's get_reward() is named after the class: registered under that name, a
# preset can name it as its only part (rewards={"BfclMultiTurnEnv": 1.0}) and it is counted once, as in TRL.
register_reward("BfclMultiTurnEnv")(env_reward)


# --- the benchmark: BFCL's result files, or a model's replies -----------------------------------


def read_results(path: str | Path) -> dict[str, list[dict]]:
    """BFCL's result format, ``{category: [{"id", "result", ...}, ...]}``: one file of JSON lines, or a folder
    holding ``BFCL_v4_<category>_result.json`` files at any depth (``bfcl generate``'s ``result/<model>/``)."""
    path = Path(path)
    files = sorted(path.rglob("BFCL_v4_*_result.json")) if path.is_dir() else [path]
    if not files or not all(f.is_file() for f in files):
        raise DatasetError(f"{path}: no BFCL result file (BFCL_v4_<category>_result.json, one {{\"id\", \"result\"}} per line)")
    by_category: dict[str, list[dict]] = defaultdict(list)
    for file in files:
        for line_no, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            entry = json.loads(line)
            if not isinstance(entry, dict) or "id" not in entry or "result" not in entry:
                raise DatasetError(f"{file}, row {line_no}: expected BFCL's {{\"id\", \"result\"}}, got {str(entry)[:80]}")
            by_category[category_of(entry["id"])].append(entry)
    return dict(by_category)


def score_results(name: str, path: str | Path, model: str | None = None) -> dict:
    """BFCL's per-category accuracy of a result file or folder, by BFCL's checker: what ``bfcl evaluate`` writes
    in each category's score file, ``{"accuracy", "correct_count", "total_count"}``, and the category's size
    (``of``). ``name`` is ``bfcl`` (every category in the file) or ``bfcl/<category>`` (that one only).

    ``model`` names the BFCL model whose handler wrote the file and so decodes it, as ``bfcl evaluate --model``
    does: a prompting handler (``Qwen/Qwen3-8B``) reads Python-call syntax, ``[f(a=1)]``; a function-calling one
    (``Qwen/Qwen3-8B-FC``, the default ``official.MODEL``) reads Qwen's ``<tool_call>`` JSON. Without it, a file
    whose entries mostly do not decode with the default handler is refused (a ``DatasetError`` saying how many
    and what to pass), not scored 0."""
    results = read_results(path)
    if model is not None and model not in official.call("models"):
        raise DatasetError(f"--answers-model {model}: BFCL has no such model (bfcl_eval/constants/model_config.py "
                           "lists them, e.g. Qwen/Qwen3-8B for Python-call syntax, Qwen/Qwen3-8B-FC for <tool_call> JSON)")
    if "/" in name:
        category, _ = parse_member(name.partition("/")[2])
        if category not in results:
            raise DatasetError(f"{path}: no {category} entries (it has {', '.join(sorted(results))})")
        results = {category: results[category]}
    scores, undecoded = {}, 0
    for category, entries in sorted(results.items()):
        verdicts = judge_results(category, entries, model or official.MODEL)
        correct = sum(v["valid"] for v in verdicts)
        undecoded += sum(v["decoded_calls"] == 0 for v in verdicts)  # a call-expecting entry the handler reads no call in
        scores[category] = {"accuracy": correct / len(entries), "correct_count": correct, "total_count": len(entries),
                            "of": len(load_category(category))}
    total = sum(len(entries) for entries in results.values())
    if model is None and undecoded > total / 2:
        raise DatasetError(f"{path}: {undecoded} of {total} results did not decode with the default handler ({official.MODEL}, "
                           "Qwen's <tool_call> JSON); --answers-model NAME chooses the BFCL model whose handler decodes them, "
                           "as bfcl evaluate --model NAME does (e.g. Qwen/Qwen3-8B for Python-call syntax, [f(a=1)])")
    return {"categories": scores, "answers_model": model or official.MODEL}


def member_config(name: str) -> dict:
    """How ``--benchmark name`` plays a member with a model: a single-turn category in ``BfclEnv`` (the
    benchmark's defaults, ``{}``), a multi-turn one on its simulators, named in the member
    (``bfcl/multi_turn_base:GorillaFileSystem``: one env class has one set of tools)."""
    category, classes = parse_member(name.partition("/")[2])
    if not is_multi_turn(category):
        return {}
    if classes is None:
        raise DatasetError(f"{name}: a multi-turn category is played on its simulators; name them, e.g. "
                           f"{name}:GorillaFileSystem (the entries that use only those)")
    return {"env": "bfcl_multiturn", "env_kwargs": {"classes": "+".join(classes)}, "env_max_steps": MULTI_TURN_STEPS}


def judge_output(task, output: str) -> dict:
    """One reply to a single-turn task, judged as the env judges it."""
    (verdict,) = judge_results(task.metadata["category"], [{"id": task.id, "result": output}])
    return verdict_info(verdict)


register_benchmark("bfcl", Benchmark(
    env="bfcl",
    judge=judge_output,
    answers_format='BFCL\'s result format: a BFCL_v4_<category>_result.json file or a folder of them, {"id": ..., "result": ...} per line',
    max_steps=1,
    max_new_tokens=512,
    max_total_tokens=8192,  # the live categories' function docs run to thousands of tokens
    members=", ".join(SUPPORTED) + " (BFCL's categories; bfcl alone, with --answers: every category of the file)",
    score_file=score_results,
    config_for=member_config,
))
