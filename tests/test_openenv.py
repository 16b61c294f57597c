"""A workbook env served over OpenEnv on loopback (helpers.ecosystem.openenv_server) and driven through the client
(helpers.ecosystem.remote): the same episodes as the local env, many sessions at once, and a training run."""

import concurrent.futures as cf
import os
import sys

import pytest
from local_server import free_port, local_server

try:
    import openenv  # noqa: F401
except ImportError:
    if os.environ.get("CI") == "true":
        raise
    pytest.skip("openenv-core is not installed (pip install -e '.[openenv]')", allow_module_level=True)

import helpers.worlds  # noqa: F401  (registers the shop world)
from helpers.config import get_preset
from helpers.data import load_dataset
from helpers.ecosystem.remote import RemoteEnv
from helpers.envs import Episode, make_env, tool_schemas
from helpers.loop import train
from helpers.worlds.shop.env import ShopEnv

# One scripted shop episode: every tool, a malformed call, an unknown tool, a wrong argument, then an answer.
TURNS = [
    '<tool_call>\n{"name": "usual", "arguments": {}}\n</tool_call>',
    '<tool_call>\n{"name": "lookup", "arguments": {"item": "pen"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "lookup", "arguments": {"thing": "pen"}}\n</tool_call>',
    '<tool_call>\n{"name": "search", "arguments": {}}\n</tool_call><tool_call>\n{"name": bad json</tool_call>',
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "3*4+1"}}\n</tool_call>',
    "<answer>13</answer>",
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """``python -m helpers.ecosystem.openenv_server shop`` on a free loopback port; its base URL. Stopped after the module."""
    port = free_port()
    command = [sys.executable, "-m", "helpers.ecosystem.openenv_server", "shop", "--port", str(port), "--max-sessions", "64"]
    with local_server(command, port, tmp_path_factory.mktemp("server") / "server.log", start_timeout=60) as url:
        yield url


def play(env: Episode, task) -> list:
    """The scripted episode's messages and results, in a form two envs can be compared by."""
    seen = [env.reset(task), env.tools]
    for turn in TURNS:
        result = env.step(turn)
        seen.append((result.observation, result.reward, result.terminated, result.truncated, result.info))
        if result.done:
            break
    return seen


def test_remote_episode_equals_local(server):
    remote = RemoteEnv(server)
    assert tool_schemas(remote) == tool_schemas(ShopEnv())
    for task in load_dataset("tiny-agent", "test", 3, seed=0):
        assert play(Episode(RemoteEnv(server)), task) == play(make_env("shop"), task)


def test_concurrent_sessions(server):
    """16 episodes at once, each in its own session, each with its own task's answers."""
    tasks = load_dataset("tiny-agent", "test", 16, seed=1)

    def episode(task):
        env = make_env("helpers.ecosystem.remote:RemoteEnv", base_url=server)
        env.reset(task)
        usual = env.step('<tool_call>\n{"name": "usual", "arguments": {}}\n</tool_call>').observation[0]["content"]
        local = make_env("shop")
        local.reset(task)
        return usual == local.step('<tool_call>\n{"name": "usual", "arguments": {}}\n</tool_call>').observation[0]["content"]

    with cf.ThreadPoolExecutor(16) as pool:
        assert all(pool.map(episode, tasks))


def test_training_through_the_client(server, tmp_path):
    config = get_preset("tiny-agent", steps=1, tasks_per_step=2, num_generations=2, eval_tasks=2, pass_k=0,
                        out_dir=str(tmp_path), env="helpers.ecosystem.remote:RemoteEnv", env_kwargs={"base_url": server})
    result = train(config)
    assert result.history[-1]["step"] == 1 and result.after


def test_trls_grpo_trainer_trains_through_the_client(server, tmp_path, one_thread):
    """TRL's own GRPOTrainer with ``environment_factory`` = the server's ``RemoteEnv`` class: TRL builds the env objects
    with no arguments, lists the served tools from their schemas, and each tool call it makes is a step over the socket."""
    from helpers.ecosystem.remote import remote_env_class
    from helpers.policy import load_model
    from helpers.ecosystem.trl_bridge import grpo_trainer

    config = get_preset("tiny-agent", steps=1, tasks_per_step=2, num_generations=4, grad_accum=1, num_iterations=1)
    model, tokenizer = load_model(config)
    tasks = load_dataset(config.dataset, "train", 8, seed=config.seed)
    trainer = grpo_trainer(config, model, tokenizer, tasks, tmp_path, environment=remote_env_class(server))
    trainer.train()
    assert [tool.__name__ for tool in trainer.tools] == ["calculator", "lookup", "usual"]
    logs = [entry for entry in trainer.state.log_history if "rewards/correct/mean" in entry]
    assert len(logs) == 1 and logs[0]["tools/call_frequency"] > 0 and logs[0]["tools/failure_frequency"] < 1
