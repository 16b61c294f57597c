"""The command lines refuse bad input in one line that says what to do, before they load, start or delete anything.

Each case here was a traceback, a misleading message or silent harm: ``--seed -1`` a numpy traceback after the run
folder was cleared, ``--n 0`` "dataset has no test tasks", ``serve_env --port 99999`` a server on port 34463,
``serve loadtest --store store.db`` the current folder deleted. One subprocess per command shows the whole path
(no traceback reaches the user); the other cases call ``main`` in this process, which is the same code and faster.
"""

import importlib.util
import os
import socket
import subprocess
import sys

import pytest

import helpers.loop
import helpers.train
from helpers.ecosystem.endpoint import main as endpoint_main
from helpers.ecosystem.openenv_server import main as serve_env_main
from helpers.evaluate import main as evaluate_main
from helpers.lab.bench import grpo, rollout
from helpers.checkpoint import ResumeError, run_folder_lock
from helpers.paths import ROOT
from helpers.policy.vllm import MISSING as VLLM_MISSING
from helpers.serve.__main__ import main as serve_main


def run(*args: str, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def refused(main, argv: list[str], capsys) -> str:
    """The one-line message ``main(argv)`` exits with: its SystemExit's, or argparse's last line on stderr."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code != 0
    message = exit_.value.code if isinstance(exit_.value.code, str) else capsys.readouterr().err.strip().splitlines()[-1]
    assert "\n" not in message
    return message


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # free again once the socket closes: nothing listens there


# --- python -m helpers.train ----------------------------------------------------------------------


def test_train_refuses_a_negative_seed_in_one_line(tmp_path):
    out = run("helpers.train", "--preset", "tiny-agent", "--seed", "-1", "--out-dir", str(tmp_path / "run"))
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip() == "python -m helpers.train: --seed -1: give a whole number from 0 to 2**32 - 1 (numpy's generator takes no other)"


@pytest.mark.parametrize("flags, reason", [
    (["--steps", "-1"], "--steps -1: give 0 or more"),  # ran, evaluated, and called it a run
    (["--torch-threads", "-3"], "--torch-threads -3: give 0 or more"),  # ignored
    (["--eval-tasks", "0"], "--eval-tasks 0: give 1 or more"),  # "dataset 'tiny-agent' has no test tasks"
    (["--model", "/no/such/model"], "--model /no/such/model: no folder /no/such/model"),  # "Repo id must be in the form ..."
    (["--model", "data/tinyy"], f"--model data/tinyy: no folder {ROOT / 'data/tinyy'}"),  # "couldn't connect to huggingface.co"
    (["--dtype", "bf16"], "--dtype bf16: not a torch dtype"),  # "module 'torch' has no attribute 'bf16'"
    (["--device", "gpu"], "--device gpu: not a torch device"),
    (["--device", "cuda:99"], "--device cuda:99: no such GPU here ("),  # a traceback after the model loaded
    (["--backend", "vlm"], "--backend vlm: choose from hf, engine, vllm"),
    (["--collect", "group"], "--collect group: choose from "),
    # the rest were tracebacks raised after the run folder was cleared (an earlier run's checkpoints gone)
    (["--env", "shopp"], "unknown env 'shopp'; registered: "),
    (["--dataset", "tiny-agnet"], "unknown dataset 'tiny-agnet'; choose from "),
    (["--rewards", "corect=1"], "unknown reward 'corect'; registered: "),
    (["--env-kwargs", "nope=1"], "ShopEnv.__init__() got an unexpected keyword argument 'nope'"),
])
def test_train_refuses_a_bad_flag_before_the_run_starts(flags, reason, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(helpers.train, "train", lambda *args, **kwargs: pytest.fail("the run started"))
    message = refused(helpers.train.main, ["--preset", "tiny-agent", "--out-dir", str(tmp_path / "run"), *flags], capsys)
    assert message.startswith(f"python -m helpers.train: {reason}"), message


def test_train_refuses_the_vllm_backend_without_vllm_in_one_line(tmp_path, monkeypatch, capsys):
    """Without vLLM (the README's first install has none) the vllm backend was an ImportError traceback, raised once
    the model had loaded and the run folder was made."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None if name == "vllm" else real(name, *args))
    monkeypatch.setattr(helpers.train, "train", lambda *args, **kwargs: pytest.fail("the run started"))
    message = refused(helpers.train.main, ["--preset", "tiny-agent", "--backend", "vllm", "--out-dir", str(tmp_path / "run")], capsys)
    assert message == f"python -m helpers.train: --backend vllm: {VLLM_MISSING}"
    assert not (tmp_path / "run").exists()


def test_train_says_in_one_line_that_a_hub_dataset_is_out_of_reach(tmp_path, monkeypatch, capsys):
    def offline(config):  # what datasets raises without a connection (no hub is reachable in CI, but a user's may be)
        raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(helpers.train, "look_up", offline)
    monkeypatch.setattr(helpers.train, "train", lambda *args, **kwargs: pytest.fail("the run started"))
    # --backend hf: the hub is tried whatever engine is installed (the preset's vLLM is refused first where it is missing)
    args = ["--preset", "gsm8k-t4", "--backend", "hf", "--device", "cpu", "--out-dir", str(tmp_path / "run")]
    message = refused(helpers.train.main, args, capsys)
    assert message.startswith("python -m helpers.train: --dataset gsm8k: Couldn't reach 'openai/gsm8k' on the Hub"), message
    assert "check the connection" in message


def test_a_run_with_an_unknown_name_keeps_the_folders_last_run(tmp_path):
    """``train`` itself (what a notebook calls) looks its names up before it clears the folder."""
    from helpers.config import get_preset

    run_dir = tmp_path / "run"
    (run_dir / "checkpoint-20").mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("{}\n")
    for bad in [{"env": "shopp"}, {"dataset": "tiny-agnet"}, {"rewards": {"corect": 1.0}}]:
        with pytest.raises((KeyError, ValueError)):
            helpers.loop.train(get_preset("tiny-agent", out_dir=str(run_dir), **bad))
        assert (run_dir / "checkpoint-20").is_dir() and (run_dir / "metrics.jsonl").read_text() == "{}\n", bad


def test_a_model_that_does_not_load_keeps_the_folders_last_run(tmp_path, monkeypatch):
    """A hub id with a typo, or the hub out of reach, fails only when the model loads: that must come before the
    folder's last run is cleared, as a notebook calls ``train`` without the command's checks. So must the rollout
    policy (vLLM's engine can fail to start)."""
    from helpers.config import get_preset

    run_dir = tmp_path / "run"
    (run_dir / "checkpoint-20").mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("{}\n")

    def unreachable(config):
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files (simulated)")

    def engine_fails(config, model, tokenizer):
        raise RuntimeError("vLLM's engine did not start (simulated)")

    for where, failing in [("load_model", unreachable), ("make_policy", engine_fails)]:
        with monkeypatch.context() as patch:
            patch.setattr(f"helpers.loop.{where}", failing)  # where the loop looks them up
            with pytest.raises((OSError, RuntimeError), match="simulated"):
                helpers.loop.train(get_preset("tiny-agent", out_dir=str(run_dir)))
        assert (run_dir / "checkpoint-20").is_dir() and (run_dir / "metrics.jsonl").read_text() == "{}\n", where


def test_a_hub_model_that_does_not_load_is_one_line_and_the_folder_keeps_its_last_run(tmp_path):
    """The real path, offline (no hub is reachable in CI; HF_HUB_OFFLINE=1 makes transformers fail at once instead of
    retrying): transformers' OSError was a traceback from deep inside its hub code."""
    run_dir = tmp_path / "run"
    (run_dir / "checkpoint-20").mkdir(parents=True)
    result = subprocess.run([sys.executable, "-m", "helpers.train", "--preset", "gsm8k-cpu-smoke", "--model", "nobody/no-such-model",
                             "--out-dir", str(run_dir)], cwd=ROOT, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("python -m helpers.train: model nobody/no-such-model: not a folder under"), last
    assert "check the id and the connection" in last
    assert (run_dir / "checkpoint-20").is_dir()


def test_evaluate_says_in_one_line_that_a_hub_model_does_not_load(monkeypatch, capsys):
    import transformers

    def unreachable(*args, **kwargs):
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files (simulated)\nCheck your connection.")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", unreachable)
    message = refused(evaluate_main, ["--benchmark", "gsm8k-sample", "--preset", "gsm8k-24gb", "--n", "2"], capsys)
    assert message.startswith("python -m helpers.evaluate: error: model Qwen/Qwen2.5-1.5B-Instruct: not a folder under"), message
    assert "(We couldn't connect to 'https://huggingface.co' to load the files (simulated))" in message
    # a local folder's own error is left as it is: it names the file that is missing
    from helpers.config import get_preset
    from helpers.policy import ModelUnavailable, load_model

    with pytest.raises(OSError, match="simulated") as raised:
        load_model(get_preset("tiny-agent"))
    assert not isinstance(raised.value, ModelUnavailable)


def test_train_refuses_an_out_dir_that_is_a_file(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(helpers.train, "train", lambda *args, **kwargs: pytest.fail("the run started"))
    (tmp_path / "notes.txt").write_text("")
    for out_dir in [tmp_path / "notes.txt", tmp_path / "notes.txt" / "run"]:  # FileExistsError, NotADirectoryError
        message = refused(helpers.train.main, ["--preset", "tiny-agent", "--out-dir", str(out_dir)], capsys)
        assert message == f"python -m helpers.train: --out-dir {out_dir}: {tmp_path / 'notes.txt'} is a file; give a folder (it is made if missing)"


def test_train_says_in_one_line_that_the_run_folder_is_busy(tmp_path, capsys):
    with run_folder_lock(tmp_path / "run"):  # another run holds the folder
        message = refused(helpers.train.main, ["--preset", "tiny-agent", "--steps", "0", "--out-dir", str(tmp_path / "run")], capsys)
    assert message.startswith(f"python -m helpers.train: {tmp_path / 'run'} is in use by another run (pid ")


def test_train_says_in_one_line_why_it_cannot_resume(tmp_path, monkeypatch, capsys):
    reason = "resume: run was trained with other settings (lr 0.005 -> 5.0); resume with the run's own settings, or start a new run in another out_dir"

    def differs(run_dir, config):
        raise ResumeError(reason)

    monkeypatch.setattr(helpers.loop, "resumable_checkpoint", differs)
    message = refused(helpers.train.main, ["--preset", "tiny-agent", "--resume", "true", "--out-dir", str(tmp_path / "run")], capsys)
    assert message == f"python -m helpers.train: {reason}"


# --- python -m helpers.evaluate -------------------------------------------------------------------


@pytest.mark.parametrize("answers, reason", [
    ("missing", ": file not found"),
    ("folder", ": a folder, not a file"),  # was "file not found", for a folder that is there
    ("invalid", ", row 1: not valid JSON"),
])
def test_evaluate_refuses_a_bad_answers_file_in_one_line(answers, reason, tmp_path):
    path = tmp_path / "samples.jsonl"
    if answers == "folder":
        path.mkdir()
    if answers == "invalid":
        path.write_text('{"task_id": "gsm8k-sample-0",\n')
    out = run("helpers.evaluate", "--benchmark", "gsm8k-sample", "--answers", str(path))
    # the command's one line for any DatasetError (reasoning_gym/nonexistent_task's too); main itself raises it, for its callers
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip().startswith(f"python -m helpers.evaluate: error: {path}{reason}"), out.stderr


@pytest.mark.parametrize("flags, reason", [
    (["--n", "0"], "--n 0: give 1 or more held-out tasks"),  # "dataset 'tiny-agent' has no test tasks"
    (["--n", "-5"], "--n -5: give 1 or more held-out tasks"),
    (["--n", "2", "--k", "-1"], "--k -1: give 0 or more (0: no pass@k)"),  # ran without pass@k
    (["--n", "2", "--temperature", "-1"], "--temperature -1.0: give 0 (greedy) or more"),  # sampled nonsense, all truncated
])
def test_evaluate_refuses_bad_numbers(flags, reason, capsys):
    message = refused(evaluate_main, ["--preset", "tiny-agent", *flags], capsys)
    assert message.startswith(f"python -m helpers.evaluate: error: {reason}"), message


@pytest.mark.parametrize("model", [[], ["--model", "served"]])  # without --model the server is asked for its models first
def test_the_endpoint_command_says_no_server_answers_at_the_base_url(model, capsys):
    pytest.importorskip("openai", reason="--base-url needs openai (the openenv extra)")
    url = f"http://127.0.0.1:{closed_port()}/v1"
    message = refused(endpoint_main, ["--preset", "tiny-agent", "--n", "1", "--base-url", url, *model], capsys)
    assert message.startswith(f"python -m helpers.ecosystem.endpoint: error: --base-url {url}: no server answers there; start it first")


def test_evaluate_refuses_an_opponent_it_cannot_import(capsys):
    pytest.importorskip("pyspiel", reason="the game world needs OpenSpiel (the games extra)")
    message = refused(evaluate_main, ["--preset", "tiny-kuhn", "--n", "2", "--opponent", "no_such_module_xyz:play"], capsys)
    assert message.startswith("python -m helpers.evaluate: error: --opponent no_such_module_xyz:play: cannot import it")


# --- python -m helpers.ecosystem.openenv_server and python -m helpers.serve ----------------------------------------


@pytest.mark.parametrize("command", ["helpers.ecosystem.openenv_server", "helpers.serve"])
@pytest.mark.parametrize("port", ["0", "-1", "99999"])  # 0: a random port it never printed; 99999: served on 34463
def test_servers_refuse_a_port_out_of_range(command, port, tmp_path):
    served = ["shop"] if command == "helpers.ecosystem.openenv_server" else ["--store", str(tmp_path / "store.db")]  # the env; the service's store
    out = run(command, *served, "--port", port)  # a subprocess: before, they served
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip().splitlines()[-1].endswith(f"error: --port {port}: give a port from 1 to 65535")


@pytest.mark.parametrize("command", ["helpers.ecosystem.openenv_server", "helpers.serve"])
def test_servers_refuse_a_port_in_use_before_they_load_anything(command, tmp_path):
    served = ["shop"] if command == "helpers.ecosystem.openenv_server" else ["--store", str(tmp_path / "store.db")]
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        out = run(command, *served, "--port", str(port))  # was: "serving ... on" then uvicorn's error, the model loaded
    assert out.returncode == 1 and "Traceback" not in out.stderr and "serving" not in out.stdout, (out.stdout, out.stderr)
    assert out.stderr.strip().startswith(f"cannot listen on 127.0.0.1:{port}: Address already in use"), out.stderr
    assert not (tmp_path / "store.db").exists()  # nothing was made


@pytest.mark.parametrize("argv, reason", [
    (["shopp"], "unknown env 'shopp'; registered: "),
    (["no_such_module_xyz:Shop"], "env 'no_such_module_xyz:Shop': cannot import 'no_such_module_xyz'"),
    (["shop", "--max-sessions", "0"], "--max-sessions 0: give 1 or more"),  # pydantic's validation error
])
def test_serve_env_refuses_a_bad_env_or_session_count(argv, reason, capsys):
    message = refused(serve_env_main, argv, capsys)
    assert message.startswith(f"python -m helpers.ecosystem.openenv_server: error: {reason}"), message


@pytest.mark.parametrize("flags, reason", [
    (["--rate", "0"], "--rate 0.0: give more than 0 requests a second"),  # served, then a 500 once a user's burst was spent
    (["--burst", "0"], "--burst 0: give 1 or more"),  # served, a 429 for every request
])
def test_serve_refuses_a_rate_limit_that_serves_no_one(flags, reason, tmp_path):
    out = run("helpers.serve", "--store", str(tmp_path / "store.db"), "--port", "8000", *flags)  # a subprocess: before, it served
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip().splitlines()[-1] == f"python -m helpers.serve serve: error: {reason}"


def test_serve_names_its_commands_for_an_unknown_one():
    out = run("helpers.serve", "rollbak", "--version", "2")  # was: "serve: error: unrecognized arguments: rollbak"
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip() == "python -m helpers.serve: unknown command 'rollbak'; choose from serve, train, rollback, simulate, loadtest, key (none: serve)"


@pytest.mark.parametrize("argv, reason", [
    (["--threads", "0"], "python -m helpers.serve serve: error: --threads 0: give 1 or more"),  # torch's RuntimeError
    (["--preset", "tiny-agnet"], "python -m helpers.serve serve: error: --preset tiny-agnet: choose from "),  # KeyError
    (["train", "--preset", "tiny-agnet"], "python -m helpers.serve train: error: --preset tiny-agnet: choose from "),
    # flags a command took and ignored: the simulation makes its own store and, like the load test, serves the tiny agent
    (["simulate", "--store", "x.db"], "python -m helpers.serve simulate: error: unrecognized arguments: --store x.db"),
    (["loadtest", "--preset", "gsm8k-24gb"], "python -m helpers.serve loadtest: error: unrecognized arguments: --preset gsm8k-24gb"),
    # --threads where no torch work of the command's own would read it (the processes they start run on one thread)
    (["simulate", "--threads", "1"], "python -m helpers.serve simulate: error: unrecognized arguments: --threads 1"),
    (["loadtest", "--threads", "2"], "python -m helpers.serve loadtest: error: unrecognized arguments: --threads 2"),
    (["rollback", "--version", "1", "--threads", "2"], "python -m helpers.serve rollback: error: unrecognized arguments: --threads 2"),
])
def test_serve_refuses_bad_flags_before_it_starts(argv, reason, tmp_path, capsys):
    message = refused(serve_main, [*argv, "--store", str(tmp_path / "store.db")], capsys)
    assert message.startswith(reason), message


def test_serve_rollback_to_a_version_the_store_does_not_hold(tmp_path, capsys):
    store = tmp_path / "store.db"
    message = refused(serve_main, ["rollback", "--version", "7", "--store", str(store)], capsys)  # a misspelt --store
    assert message == f"python -m helpers.serve rollback: no store at {store}; give the --store the server runs on (default runs/serve/store.db)"
    assert not store.exists()  # it made an empty store, and said the store knew no versions
    from helpers.serve.__main__ import open_store

    open_store(str(store)).close()
    message = refused(serve_main, ["rollback", "--version", "7", "--store", str(store)], capsys)
    assert message == f"python -m helpers.serve rollback: no adapter version 7; known: [] (store {store})"


def test_serve_loadtest_does_not_delete_a_folder_it_did_not_make(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    # a relative store is the repository root's, where the server it starts runs (it was the current folder's)
    for store, folder in [(str(tmp_path / "store.db"), tmp_path), ("store.db", ROOT)]:
        out = run("helpers.serve", "loadtest", "--store", store, "--seconds", "1", cwd=tmp_path)
        assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
        assert out.stderr.strip().startswith(f"--store {store}: the load test deletes the store's folder, {folder}, which holds other files")
    assert (tmp_path / "notes.txt").read_text() == "mine"  # the load test deleted its store's folder, whichever it was


# --- python -m helpers.lab.bench ----------------------------------------------------------------------


@pytest.mark.parametrize("bench", [rollout, grpo])
def test_bench_refuses_zero_threads(bench, capsys):
    message = refused(bench.main, ["--threads", "0"], capsys)
    assert message.endswith("error: --threads must be >= 1"), message  # was torch's RuntimeError


def test_bench_help_is_the_usage_and_success(capsys):
    from helpers.lab.bench.__main__ import main as bench_main

    bench_main(["--help"])  # was: the usage as an error, exit 1
    assert capsys.readouterr().out.startswith("usage: python -m helpers.lab.bench {rollout,grpo}")
    with pytest.raises(SystemExit, match="usage: python -m helpers.lab.bench"):
        bench_main(["rolout"])
