"""The environment contract (环境模块): TRL's, so one class runs in TRL and in this workbook's loop.

An environment is what makes RL *agentic*: the policy acts, the world answers. Since TRL 1.16
``GRPOTrainer(environment_factory=Cls)`` takes environments, and this workbook uses the same
contract, so a class written here trains under TRL unchanged (and the other way round):

    class ShopEnv:
        def reset(self, **row) -> str | None:       # every column of the task's row (prompt, answer, item, prices, ...)
            self.item, self.prices = row["item"], row["prices"]
            return None                              # or a string, appended to the last user message
        def lookup(self, item: str) -> str:          # a public method = a tool: type hints + a Google-style docstring
            '''The price of one item in this shop.

            Args:
                item: the item's name, singular
            '''
            return str(self.prices[item])

The rules, as TRL applies them (``trl/trainer/grpo_trainer.py``):

* The class is constructed with no arguments, once, and reset for every episode: ``reset`` must
  clear all the state of the episode before (TRL reuses instances; this workbook's rollout makes
  one per episode, so a leak shows only under TRL).
* ``reset(**row)`` receives all the row's columns (``Task.row()``: ``prompt``, ``answer`` and
  the metadata) and returns a string, appended to the last user message, or None.
* Every public function of the class except ``reset`` and ``get_reward`` is a tool, listed in
  name order (``inspect.getmembers``); its JSON schema is ``transformers.utils.get_json_schema``
  of the method, so each argument needs a type hint and an ``Args:`` line in the docstring.
* A tool gets the arguments the model wrote, typed by that schema where the model wrote a string
  (``"37"`` for an ``int`` argument arrives as 37): ``typed_arguments``.
* A tool that raises becomes an error result and counts in ``tools/failure_frequency``.
* An optional ``get_reward() -> float`` is one more reward, named after the class, weight 1.

The teaching ``step(text)`` of Gymnasium style is not part of the class: it is one generic
adapter, ``helpers.envs.episode.Episode``, that parses a model turn and calls these methods
(the part TRL does inside its generation loop). This module holds what the adapter and its
callers share: the stop reasons, the ``info`` keys, ``StepResult``, and how tools are found.

As in Gymnasium, ``terminated`` (the task reached an end: answered) is kept apart from
``truncated`` (a limit cut it short: max_steps, timeout). Every episode ends with a named
``stop_reason``.

Taught in notebooks/02_environment.ipynb.
"""

from __future__ import annotations

import copy
import inspect
import json
import math
from dataclasses import dataclass, field

# Why an episode ended. The rollout adds "max_tokens" (token budget) itself, with ``Episode.truncate``.
STOP_REASONS = ("answered", "max_steps", "timeout", "max_tokens", "error")
TRUNCATED = ("max_steps", "max_tokens", "timeout")  # the stop reasons that mean "a limit cut it short"

# Keys every step's ``info`` carries (the final step's values describe the episode):
#   stop_reason    None until the episode ends, then one of STOP_REASONS
#   correct        the final answer was judged right
#   predicted      the answer read from the policy's text (None: nothing found)
#   verdict        why: "correct", "wrong_number", "wrong_answer", "no_answer", ... (None until judged)
#   tool_calls     tool calls made so far in this episode
#   tool_errors    of those, how many gave an "error: ..." result (a failure, or an error text the tool returned)
#   tool_failures  of those, how many could not be made, raised, or hung (TRL's failures; malformed JSON TRL reads as no call)
INFO_KEYS = ("stop_reason", "correct", "predicted", "verdict", "tool_calls", "tool_errors", "tool_failures")


def new_info(**values) -> dict:
    """An ``info`` dict with every key of ``INFO_KEYS`` at its start value, then ``values``."""
    info = {"stop_reason": None, "correct": False, "predicted": None, "verdict": None, "tool_calls": 0, "tool_errors": 0,
            "tool_failures": 0}
    info.update(copy.deepcopy(values))  # a copy: defaults (lists, dicts) are never shared between episodes
    return info


def clip_observation(text: str, max_chars: int) -> str:
    """``text`` cut to ``max_chars`` characters, saying how much was cut (the model should know)."""
    if len(text) <= max_chars:
        return text
    return text[:max_chars] + f"\n... [truncated: {len(text) - max_chars} more characters]"


class EnvError(RuntimeError):
    """The *caller* broke the protocol (``step`` before ``reset`` or after the episode ended).

    Bad *model output* never raises; a bug in the rollout loop should, loudly.
    """


@dataclass
class StepResult:
    observation: list[dict]  # new messages for the policy; [] when the episode is over
    reward: float  # reward for this step (outcome reward on the final step)
    terminated: bool  # the task reached an end
    truncated: bool  # a limit cut the episode short
    info: dict = field(default_factory=dict)  # verdict, stop_reason, error counts, ...

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated


def tool_methods(env) -> dict:
    """The tools of ``env`` as TRL finds them: every public function of its class but ``reset`` and
    ``get_reward``, in attribute-name order, as ``{name: bound method}`` keyed by the function's own
    ``__name__`` (TRL's key, and the name its schema shows the model: an alias ``lookup = _lookup``
    is the tool ``_lookup``)."""
    methods = [getattr(env, name) for name, _ in inspect.getmembers(type(env), predicate=inspect.isfunction)
               if name not in ("reset", "get_reward") and not name.startswith("_")]
    return {method.__name__: method for method in methods}


def tool_schemas(env) -> list[dict]:
    """The JSON schemas of ``env``'s tools, in TRL's order: what ``apply_chat_template(tools=...)``
    renders, for the workbook's loop exactly as for TRL (both call ``get_json_schema`` on the methods).

    A tool without type hints, or whose docstring has no ``Args:`` line for an argument, raises
    ``get_json_schema``'s own error, naming the argument.
    """
    if type(env) not in _SCHEMAS:  # a class's tools are the same for every instance: built once per class
        methods = tool_methods(env)
        if methods:
            from transformers.utils import get_json_schema  # transformers is heavy to import: only an env with tools needs it
        _SCHEMAS[type(env)] = [get_json_schema(method) for method in methods.values()]
    return list(_SCHEMAS[type(env)])


def tool_signatures(env) -> dict[str, inspect.Signature]:
    """``{name: inspect.Signature}`` of ``env``'s tools (``tool_methods``, bound: no ``self``), what a call's
    arguments are bound to before the tool runs. Built once per class, as ``tool_schemas`` is:
    ``inspect.signature`` costs ~8 us a call, against ~13 us for all the rest of a shop-world step."""
    if type(env) not in _SIGNATURES:
        _SIGNATURES[type(env)] = {name: inspect.signature(method) for name, method in tool_methods(env).items()}
    return dict(_SIGNATURES[type(env)])


_SCHEMAS: dict[type, list[dict]] = {}  # env class -> its tools' schemas (read, never changed, by the chat template)
_SIGNATURES: dict[type, dict[str, inspect.Signature]] = {}  # env class -> its tools' signatures


def typed_arguments(arguments: dict, schema: dict | None) -> dict:
    """The arguments a tool gets: those the model wrote, with each string typed by the tool's JSON
    ``schema`` (an entry of ``tool_schemas``), as TRL's response parser does (transformers >= 5.15,
    ``parse_response(..., tools=...)``): a string written for an ``integer``, ``number``,
    ``boolean``, ``null``, ``object`` or ``array`` argument becomes one where it reads as one
    (``"37"`` -> 37, ``"3.0"`` -> 3 for an integer, ``"2.5"`` -> 2.5, ``"true"`` -> True, ``"[1, 2]"`` ->
    [1, 2]); anything else, and every ``string`` argument, stays as written. Written by hand so the rule can
    be read here; ``tests/test_envs.py`` checks it against transformers' parser on the same calls (the rule
    of transformers 5.25; 5.15-5.19 left ``"3.0"`` as written for an integer).

        schema:    {"type": "function", "function": {"name": ..., "parameters": {"properties": {name: {...}}}}}
        arguments: {name: value} as parsed from the model's JSON
    """
    properties = ((schema or {}).get("function", {}).get("parameters") or {}).get("properties") or {}
    typed = dict(arguments)
    for name, value in arguments.items():
        types = _json_types(properties.get(name))
        if not types:
            continue
        if isinstance(value, str):
            typed[name] = _typed(value, types)
        elif isinstance(value, list) and "array" not in types:  # a list where one value was expected: each item
            typed[name] = [_typed(item, types) if isinstance(item, str) else item for item in value]
    return typed


def _json_types(schema) -> tuple[str, ...]:
    """The JSON types an argument's schema allows: its ``type`` (one or a list), those of its ``anyOf`` /
    ``oneOf`` choices, and "null" when ``nullable`` (how ``get_json_schema`` marks ``Optional``)."""
    if not isinstance(schema, dict):
        return ()
    declared = schema.get("type")
    types = [declared] if isinstance(declared, str) else [t for t in declared or [] if isinstance(t, str)]
    for union in ("anyOf", "oneOf"):
        for choice in schema.get(union) or []:
            types.extend(_json_types(choice))
    if schema.get("nullable") and "null" not in types:
        types.append("null")
    return tuple(types)


def _typed(text: str, types: tuple[str, ...]):
    """``text`` as the first of ``types`` it reads as (in the schema's order), else ``text`` itself."""
    for kind in types:
        try:
            if kind == "integer":
                try:
                    return int(text)
                except ValueError:  # JSON Schema's integers include whole numbers written as floats ("3.0")
                    number = float(text)
                    if not number.is_integer():
                        continue
                    return int(number)
            if kind == "number":
                number = float(text)
                if math.isfinite(number):  # NaN and infinities are not JSON numbers
                    return int(number) if number.is_integer() and "." not in text else number
            if kind == "boolean" and text.strip().lower() in ("true", "1", "false", "0"):
                return text.strip().lower() in ("true", "1")
            if kind == "null" and text.strip() in ("null", "None"):
                return None
            if kind in ("object", "array"):
                decoded = json.loads(text)
                if isinstance(decoded, dict if kind == "object" else list):
                    return decoded
        except ValueError:
            continue
    return text
