"""The rollout's template memo never changes a token: in every world, a finished episode's token ids
are what the chat template gives for its final conversation, rendered from scratch.

``helpers.rollout.TemplateMemo`` renders each distinct prompt and observation once per rollout call and
reuses those tokens for every later episode that meets the same messages (module docstring of
``helpers.rollout``: why that is exact for an append-only template). Each world below runs groups of
episodes with a scripted policy, so the episodes of a group meet the same observations and the memo is
hit; then every episode is rendered again, whole, and compared token for token.
"""

from typing import Callable, NamedTuple

import pytest

import helpers.worlds  # noqa: F401  (registers the worlds' datasets and envs)
from helpers.data import load_dataset
from helpers.envs import load_code_tasks, make_env
from helpers.formats import format_tool_call
from helpers.policy import ScriptedPolicy
from helpers.rollout import render, rollout
from helpers.sandbox import os_isolation
from helpers.worlds.selfplay.env import proposer_task
from helpers.worlds.tinymodel import load_tokenizer

UNSAFE = not os_isolation()  # where bwrap cannot run, the code worlds run on the sandbox's unsafe layers (as tests/test_envs.py)
CALL = format_tool_call("calculator", {"expression": "6*7"})
OOPS = "<tool_call>\n{not json\n</tool_call>"  # a malformed call: an error observation
ANSWER = "<answer>42</answer>"


class World(NamedTuple):
    model: str  # the world's tokenizer
    env: str  # a registered env
    options: dict  # for make_env
    tasks: Callable[[], list]
    script: list[str]  # what every episode plays, turn by turn (ScriptedPolicy)
    turns: int  # assistant turns each episode takes (its max_steps): more than 1 where observations come back


# Every env the worlds register, each with its world's tokenizer. The scripts call tools whose results
# differ between tasks and repeat within a group (the memo's hits), bad calls included.
WORLDS = {
    "arithmetic": World("data/tiny", "calculator", {}, lambda: load_dataset("tiny", "test", 3, seed=0),
                        [CALL, OOPS, format_tool_call("calculator", {"expression": "1/0"}), ANSWER], 4),
    "gsm8k-tools": World("data/tiny", "calculator", {}, lambda: load_dataset("gsm8k-sample", "test", 3, seed=0), [CALL, ANSWER], 2),
    "gsm8k": World("data/tiny", "math", {}, lambda: load_dataset("gsm8k-sample", "test", 3, seed=0), [ANSWER], 1),
    "shop": World("data/tiny-agent", "shop", {}, lambda: load_dataset("tiny-agent", "test", 3, seed=0),
                  [format_tool_call("usual", {}), format_tool_call("lookup", {"item": "bag"}),
                   format_tool_call("lookup", {"item": "pens"}), CALL, OOPS, ANSWER], 6),
    "selfplay-solver": World("data/tiny-selfplay", "calculator", {}, lambda: load_dataset("selfplay", "test", 3, seed=0),
                             [CALL, ANSWER], 2),
    "selfplay-proposer": World("data/tiny-selfplay", "propose", {}, lambda: [proposer_task(f"propose-{i}") for i in range(3)],
                               ["<task>12*34</task>"], 1),
    "reasoning_gym": World("data/tiny", "reasoning_gym", {}, lambda: load_dataset("reasoning_gym/products", "test", 3, seed=0),
                           [ANSWER], 1),
    # A wrong attempt gets its test report back as an observation; then the second attempt ends the episode.
    "code": World("data/tiny", "code", {"allow_unsafe": UNSAFE}, lambda: load_code_tasks()[:2],
                  ["```python\ndef f():\n    return 0\n```"], 2),
    "humaneval": World("data/tiny", "humaneval", {"allow_unsafe": UNSAFE}, lambda: load_dataset("humaneval", "test", 2),
                       ["```python\nreturn None\n```"], 1),
}


@pytest.mark.parametrize("world", list(WORLDS))
def test_episode_tokens_are_the_templates_tokens_of_the_final_conversation(world):
    w = WORLDS[world]
    tokenizer = load_tokenizer(w.model)
    make = lambda: make_env(w.env, max_steps=w.turns, **w.options)  # noqa: E731
    trajs = rollout(w.tasks(), make, ScriptedPolicy(tokenizer, w.script), group_size=3, max_steps=w.turns,
                    max_total_tokens=4096, progress=False)
    assert [t.turns for t in trajs] == [w.turns] * len(trajs), [t.stop_reason for t in trajs]
    assert (trajs.stats.env_tokens > 0) == (w.turns > 1)  # observations came back where the script expects them
    tools = make().tools
    for traj in trajs:
        # The whole conversation through the template; the episode stops at its last <|im_end|> (before the "\n").
        ids = render(tokenizer, traj.messages, tools, add_generation_prompt=False)
        T = len(traj.token_ids)
        assert traj.token_ids == ids[:T], (world, traj.task_id, traj.group)
        assert tokenizer.decode(ids[T:]) == "\n"
    assert trajs.stats.retokenize_drift == 0


def test_a_template_that_looks_further_back_is_rendered_the_full_way():
    """The short render of an observation (the turn before it alone) is used only where the call's first
    observation shows it gives the full render's tokens. A template that numbers the messages fails that
    check, and the whole conversation is rendered for every observation: the tokens stay the template's."""
    tokenizer = load_tokenizer("data/tiny")
    numbered = "'\\n<tool_response ' + (loop.index0 | string) + '>\\n' + message.content"
    assert "'\\n<tool_response>\\n' + message.content" in tokenizer.chat_template
    tokenizer.chat_template = tokenizer.chat_template.replace("'\\n<tool_response>\\n' + message.content", numbered)
    make = lambda: make_env("calculator", max_steps=3)  # noqa: E731
    trajs = rollout(load_dataset("tiny", "test", 2, seed=0), make, ScriptedPolicy(tokenizer, [CALL, OOPS, ANSWER]),
                    group_size=2, max_steps=3, max_total_tokens=4096, progress=False)
    tools = make().tools
    for traj in trajs:
        assert traj.turns == 3 and "<tool_response 3>" in tokenizer.decode(traj.token_ids)
        assert traj.token_ids == render(tokenizer, traj.messages, tools, add_generation_prompt=False)[: len(traj.token_ids)]
