"""Serve the agent, train it online from its users' feedback, and watch it in a simulated deployment (持续学习).

    python -m helpers.serve --preset tiny-agent --adapter runs/tiny-agent-seed0/checkpoint-20   # http://127.0.0.1:8000
    python -m helpers.serve train --preset tiny-agent            # the online trainer, beside the server, on the same store
    python -m helpers.serve rollback --version 2                 # point the service at an older adapter version
    python -m helpers.serve loadtest --clients 32 --seconds 30   # loopback load test across a hot swap (p50/p95)
    python -m helpers.serve simulate --seed 0                    # the simulated deployment (helpers.service.simulate)

One store (``--store``, default ``runs/serve/store.db``; ``helpers.service.store``) joins the processes: the
server writes episodes and feedback into it, the trainer reads them and writes adapter versions, and the
server follows the store's deployed pointer (the hot swap, ``helpers.service.agent``). The first start
registers ``--adapter`` (none: the preset's model alone) as version 0 and deploys it; a later start with
another ``--adapter`` registers and deploys that one.

On a CPU the server samples with the preset's backend (the workbook's engine for tiny-agent). Not built
here, named: the GPU path that puts vLLM's own OpenAI server (``--enable-lora``, runtime LoRA loading)
behind this one.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from helpers.floats import flush_denormals
from helpers.paths import in_repo

DEFAULT_STORE = "runs/serve/store.db"
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def open_store(path: str):
    from helpers.service.store import SQLiteStore

    return SQLiteStore(in_repo(path))  # a relative --store is the repository root's, where the service's processes run


def register_start(store, adapter: str | None) -> int:
    """Make sure a version is deployed: ``adapter`` (copied next to the store as ``adapters/v<N>``) when it is new,
    else the deployed one as it is. Returns the deployed version."""
    resolved = str(Path(adapter).resolve()) if adapter else ""
    try:
        version, _ = store.deployed()
        if adapter is None or store.get_setting("start.adapter") == resolved:
            return version  # a restart: keep whatever the trainer or an operator deployed since
    except LookupError:
        pass
    target = ""
    if adapter:
        missing = [name for name in ADAPTER_FILES if not (Path(adapter) / name).is_file()]
        if missing:
            raise SystemExit(f"--adapter {adapter}: not a LoRA adapter folder (no {missing[0]})")
        target = store.path.parent / "adapters" / f"start-{len(store.adapters())}"
        target.mkdir(parents=True, exist_ok=True)
        for name in ADAPTER_FILES:
            shutil.copyfile(Path(adapter) / name, target / name)
    version = store.add_adapter(str(target), None, None, None, "deployed", f"started with --adapter {adapter or '(none)'}")
    store.deploy(version, "the server's start")
    store.set_setting("start.adapter", resolved)
    return version


def serve(args) -> None:
    import torch

    import helpers.worlds  # noqa: F401  (registers the presets)
    from helpers.config import get_preset
    from helpers.serve_env import bound_socket, serve_on
    from helpers.service.agent import AgentPool
    from helpers.service.app import ServiceConfig, create_app

    sock = bound_socket(args.host, args.port)  # a port in use is refused before the model loads
    torch.set_num_threads(args.threads)
    config = get_preset(args.preset)
    store = open_store(args.store)
    version = register_start(store, args.adapter)
    pool = AgentPool(config, store, max_batch=args.max_batch)
    pool.start()
    app = create_app(pool, store, ServiceConfig(name=args.preset, rate=args.rate, burst=args.burst,
                                                 admin_token=args.admin_token, world_seed=args.world_seed))
    print(f"serving {args.preset} v{version} on http://{args.host}:{args.port} (store {store.path})", flush=True)
    serve_on(sock, app)


def train(args) -> None:
    import torch

    import helpers.worlds  # noqa: F401
    from helpers.config import get_preset
    from helpers.service.trainer import OnlineConfig, OnlineTrainer

    torch.set_num_threads(args.threads)
    store = open_store(args.store)
    online = OnlineConfig(batch_tasks=args.batch_tasks, group_size=args.group_size, gate_margin=args.gate_margin,
                          audit_rate=args.audit_rate, canary_tasks=args.canary_tasks, replay=args.replay, lr=args.lr)
    OnlineTrainer(get_preset(args.preset), store, online).run(max_updates=args.max_updates)


def rollback(args) -> None:
    if not (path := in_repo(args.store)).is_file():  # opening it would make an empty store, and the message would list no versions
        raise SystemExit(f"python -m helpers.serve rollback: no store at {path}; give the --store "
                         f"the server runs on (default {DEFAULT_STORE})")
    store = open_store(args.store)
    try:
        store.deploy(args.version, "rollback from the command line")
    except KeyError as e:  # a version the store does not hold: its message lists those it does
        raise SystemExit(f"python -m helpers.serve rollback: {e.args[0]} (store {store.path})") from None
    print(f"deployed v{args.version}; a running server swaps to it within a second")


def simulate(args) -> None:
    from helpers.service.simulate import SimConfig, run_simulation

    given = dict(seed=args.seed, out_dir=args.out, adapter=args.adapter, rounds=args.rounds, drift_round=args.drift_round,
                 users=args.users, adversarial=args.adversarial)
    run_simulation(SimConfig(**{key: value for key, value in given.items() if value is not None}))


def loadtest(args) -> None:
    import json

    from helpers.service.loadtest import run_load_test

    store = in_repo(args.store)  # the server it starts runs in the repository root: the same file, wherever this runs
    if store.parent.exists():
        # a fresh store each time: the test's own episodes only. Its folder goes whole, so it must be one an
        # earlier load test made (its new adapter is written first), or empty: --store store.db names the current folder
        if any(store.parent.iterdir()) and not (store.parent / "adapters" / "loadtest-new").is_dir():
            raise SystemExit(f"--store {args.store}: the load test deletes the store's folder, {store.parent}, which holds "
                             "other files; give a store in a folder of its own (default runs/serve-loadtest/store.db)")
        shutil.rmtree(store.parent)
    report = run_load_test(store, args.clients, args.seconds, args.adapter)
    print(json.dumps(report, indent=1))


def main(argv: list[str] | None = None) -> None:
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"serve": serve, "train": train, "rollback": rollback, "simulate": simulate, "loadtest": loadtest}
    if argv and not argv[0].startswith("-") and argv[0] not in commands:  # argparse would blame an unrecognized argument of serve
        raise SystemExit(f"python -m helpers.serve: unknown command {argv[0]!r}; choose from {', '.join(commands)} (none: serve)")
    command = argv.pop(0) if argv and argv[0] in commands else "serve"
    flush_denormals()  # before torch starts its threads (helpers.floats)
    parser = argparse.ArgumentParser(prog=f"python -m helpers.serve {command}", description=__doc__.splitlines()[0])
    if command != "simulate":  # the simulation makes its own store, in --out
        parser.add_argument("--store", default=DEFAULT_STORE, help="the SQLite file joining server, trainer and simulation")
    if command in ("serve", "train"):  # the others take no model of their own (loadtest serves the tiny agent)
        parser.add_argument("--preset", default="tiny-agent")
        parser.add_argument("--threads", type=int, default=1, help="torch CPU threads of this process")
    if command == "serve":
        parser.add_argument("--adapter", default=None, help="a LoRA adapter folder (a run's checkpoint-N) to start with")
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--rate", type=float, default=5.0, help="requests a second per user and endpoint")
        parser.add_argument("--burst", type=int, default=20)
        parser.add_argument("--max-batch", type=int, default=64, help="requests run as one batched rollout")
        parser.add_argument("--admin-token", default="", help="enables /v1/admin/* with this bearer token")
        parser.add_argument("--world-seed", type=int, default=0)
    elif command == "train":
        parser.add_argument("--batch-tasks", type=int, default=8, help="verifiable requests per update (B)")
        parser.add_argument("--group-size", type=int, default=8, help="episodes sampled per request (G)")
        parser.add_argument("--gate-margin", type=float, default=0.05,
                            help="refuse an update whose canary success is this far below the deployed or the starting version's")
        parser.add_argument("--audit-rate", type=float, default=0.2)
        parser.add_argument("--canary-tasks", type=int, default=144, help="held-out tasks with known answers (12 of each item)")
        parser.add_argument("--replay", type=int, default=4, help="old requests replayed in each update")
        parser.add_argument("--lr", type=float, default=1e-3)
        parser.add_argument("--max-updates", type=int, default=None, help="stop after this many updates (default: never)")
    elif command == "loadtest":
        parser.set_defaults(store="runs/serve-loadtest/store.db")
        parser.add_argument("--clients", type=int, default=32)
        parser.add_argument("--seconds", type=float, default=30.0)
        parser.add_argument("--adapter", default=None, help="the version serving before the swap (default: the tiny agent's model alone)")
    elif command == "rollback":
        parser.add_argument("--version", type=int, required=True)
    else:
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--out", default=None, help="default runs/serve-sim-seed<seed>")
        parser.add_argument("--adapter", default=None, help="the starting adapter (default: train the tiny-agent preset once)")
        parser.add_argument("--rounds", type=int, default=None)
        parser.add_argument("--drift-round", type=int, default=None)
        parser.add_argument("--users", type=int, default=None)
        parser.add_argument("--adversarial", type=float, default=None)
    args = parser.parse_args(argv)
    if command in ("serve", "train") and args.threads < 1:  # torch's own refusal is a traceback
        parser.error(f"--threads {args.threads}: give 1 or more")
    if command == "serve":
        from helpers.serve_env import check_port

        check_port(parser, args.port)
        if args.rate <= 0:  # the rate limiter divides by it: a 500 once a user's burst is spent
            parser.error(f"--rate {args.rate}: give more than 0 requests a second")
        if args.burst < 1:  # no token ever: a 429 for every request
            parser.error(f"--burst {args.burst}: give 1 or more")
    if command in ("serve", "train"):
        import helpers.worlds  # noqa: F401  (registers the presets)
        from helpers.config import PRESETS

        if args.preset not in PRESETS:
            parser.error(f"--preset {args.preset}: choose from {', '.join(sorted(PRESETS))}")
    commands[command](args)


if __name__ == "__main__":
    main()
