"""Serve the agent, train it online from its users' feedback, and watch it in a simulated deployment (持续学习).

    python -m helpers.serve --preset tiny-agent --adapter runs/tiny-agent-seed0/checkpoint-20   # http://127.0.0.1:8000
    python -m helpers.serve key --user ann                       # a new key for ann, its last line (--revoke: withdraw ann's)
    python -m helpers.serve train --preset tiny-agent            # the online trainer, beside the server, on the same store
    python -m helpers.serve rollback --version 2                 # point the service at an older adapter version
    python -m helpers.serve loadtest --clients 32 --seconds 30   # loopback load test across a hot swap (p50/p95)
    python -m helpers.serve simulate --seed 0                    # the simulated deployment (helpers.serve.simulate)

Each subcommand's flags are made from its config dataclass, as ``python -m helpers.train``'s are from
``TrainConfig`` (``helpers.train.add_config_flags``): ``serve`` from ``ServiceConfig``, ``train`` from
``OnlineConfig``, ``simulate`` from ``SimConfig``; ``--help`` lists them with their defaults.

One store (``--store``, default ``runs/serve/store.db``; ``helpers.serve.store``) joins the processes: the
server writes episodes and feedback into it, the trainer reads them and writes adapter versions, and the
server follows the store's deployed pointer (the hot swap, ``helpers.serve.agent``). The first start
registers ``--adapter`` (none: the preset's model alone) as version 0 and deploys it; a later start with
another ``--adapter`` registers and deploys that one.

Chat and feedback need a user's key (``key``; the server reads keys from the store, so one made while it runs
works at once). The admin routes need the admin token, read from ``--admin-token-file`` or the
``WORKBOOK_ADMIN_TOKEN`` variable, never from the command line, which ``ps`` shows to every user of the machine.

On a CPU the server samples with the preset's backend (the workbook's engine for tiny-agent). Not built
here, named: the GPU path that puts vLLM's own OpenAI server (``--enable-lora``, runtime LoRA loading)
behind this one.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from dataclasses import fields
from pathlib import Path

import torch

import helpers.worlds  # noqa: F401  (registers the presets)
from helpers.config import PRESETS, get_preset
from helpers.ecosystem.openenv_server import bound_socket, check_port, serve_on
from helpers.floats import flush_denormals
from helpers.paths import in_repo
from helpers.serve.agent import AgentPool
from helpers.serve.config import ADMIN_TOKEN_ENV, LOOPBACK_HOSTS, MAX_CREDENTIAL_CHARS, MIN_ADMIN_TOKEN_CHARS, ServiceConfig
from helpers.serve.loadtest import run_load_test
from helpers.serve.simulate import SimConfig, run_simulation
from helpers.serve.store import SQLiteStore
from helpers.serve.trainer import OnlineConfig, OnlineTrainer
from helpers.train import add_config_flags, field_comments

DEFAULT_STORE = "runs/serve/store.db"
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def open_store(path: str) -> SQLiteStore:
    return SQLiteStore(in_repo(path))  # a relative --store is the repository root's, where the service's processes run


def config_from(args: argparse.Namespace, config_class: type, **given):
    """An instance of ``config_class`` from its flags' values in ``args`` (``add_config_flags``), and ``given``."""
    return config_class(**{f.name: getattr(args, f.name) for f in fields(config_class) if hasattr(args, f.name)}, **given)


def register_start(store, adapter: str | None) -> int:
    """Make sure a version is deployed: ``adapter`` (copied next to the store as ``adapters/start-<N>``) when it is new,
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
    note = f"started with --adapter {Path(adapter).name if adapter else '(none)'}"  # a name, not a path: /v1/status shows notes
    version = store.add_adapter(str(target), None, None, None, "deployed", note)
    store.deploy(version, "the server's start")
    store.set_setting("start.adapter", resolved)
    return version


def read_admin_token(path: str) -> str:
    """The admin token: the first line of ``path`` (``--admin-token-file``), else ``WORKBOOK_ADMIN_TOKEN``, else ""
    (the admin routes off). Refused in one line when it could be guessed or could not be sent in a header."""
    if path:
        try:
            token, where = Path(path).read_text().strip(), f"--admin-token-file {path}"
        except OSError as e:
            raise SystemExit(f"--admin-token-file {path}: {e.strerror}") from None
        if not token:
            raise SystemExit(f"--admin-token-file {path}: the file is empty")
    else:
        token, where = os.environ.get(ADMIN_TOKEN_ENV, "").strip(), ADMIN_TOKEN_ENV
    if token and not (MIN_ADMIN_TOKEN_CHARS <= len(token) <= MAX_CREDENTIAL_CHARS and token.isascii() and token.isprintable()
                      and " " not in token):
        raise SystemExit(f"{where}: the admin token must be {MIN_ADMIN_TOKEN_CHARS} to {MAX_CREDENTIAL_CHARS} printable ASCII "
                         "characters without spaces (python -c 'import secrets; print(secrets.token_urlsafe(32))' makes one)")
    return token


def serve(args) -> None:
    from helpers.serve.app import create_app  # FastAPI (the 'serve' extra): only this subcommand needs it

    admin_token = read_admin_token(args.admin_token_file)
    sock = bound_socket(args.host, args.port)  # a port in use is refused before the model loads
    torch.set_num_threads(args.threads)
    config = get_preset(args.preset)
    store = open_store(args.store)
    version = register_start(store, args.adapter)
    pool = AgentPool(config, store, max_batch=args.max_batch, max_queue=args.max_queue)
    pool.start()
    bound = [] if args.host in ("0.0.0.0", "::") else [args.host]  # the address it listens on is one of its names
    service = config_from(args, ServiceConfig, name=args.preset, admin_token=admin_token)
    service.allow_host = [*service.allow_host, *bound]
    app = create_app(pool, store, service)
    print(f"serving {args.preset} v{version} on http://{args.host}:{args.port} (store {store.path})\n"
          f"  answers to Host {', '.join(dict.fromkeys([*LOOPBACK_HOSTS, *service.allow_host]))} (--allow-host for more)\n"
          f"  chat and feedback need a key: python -m helpers.serve key --store {args.store} --user NAME\n"
          f"  admin routes {'on' if admin_token else f'off (no --admin-token-file or {ADMIN_TOKEN_ENV})'}", flush=True)
    serve_on(sock, app)


def make_key(args) -> None:
    """A new key for ``--user`` (printed as the last line, shown once), or ``--revoke``: withdraw all of theirs."""
    store = open_store(args.store)
    if args.revoke:
        print(f"revoked {store.revoke_keys(args.user)} key(s) of {args.user!r} (store {store.path})")
        return
    try:
        key = store.create_key(args.user)
    except ValueError as e:
        raise SystemExit(f"python -m helpers.serve key: {e}") from None
    print(f"a new key for {args.user!r} (store {store.path}); send it as 'Authorization: Bearer KEY'. Shown once:")
    print(key)


def train(args) -> None:
    torch.set_num_threads(args.threads)
    store = open_store(args.store)
    OnlineTrainer(get_preset(args.preset), store, config_from(args, OnlineConfig)).run(max_updates=args.max_updates)


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
    run_simulation(config_from(args, SimConfig))


def loadtest(args) -> None:
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


def build_parser(command: str) -> argparse.ArgumentParser:
    """The flags of one subcommand: its config dataclass's fields, and the options of the process."""
    parser = argparse.ArgumentParser(prog=f"python -m helpers.serve {command}", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    if command != "simulate":  # the simulation makes its own store, in --out
        parser.add_argument("--store", default=DEFAULT_STORE, help="the SQLite file joining server, trainer and simulation")
    if command in ("serve", "train"):  # the others take no model of their own (loadtest serves the tiny agent)
        parser.add_argument("--preset", default="tiny-agent")
        parser.add_argument("--threads", type=int, default=1, help="torch CPU threads of this process")
    if command == "serve":
        parser.add_argument("--adapter", default=None, help="a LoRA adapter folder (a run's checkpoint-N) to start with")
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--max-batch", type=int, default=64, help="requests run as one batched rollout")
        # the name is the preset's; the admin token is never a flag (ServiceConfig); --allow-host may be repeated
        add_config_flags(parser, ServiceConfig, ServiceConfig(), skip=("name", "admin_token", "allow_host"))
        parser.add_argument("--allow-host", "--allow_host", dest="allow_host", action="append", default=[], metavar="NAME",
                            help=field_comments(ServiceConfig)["allow_host"])
    elif command == "train":
        add_config_flags(parser, OnlineConfig, OnlineConfig())
        parser.add_argument("--max-updates", type=int, default=None, help="stop after this many updates (None: never)")
    elif command == "loadtest":
        parser.set_defaults(store="runs/serve-loadtest/store.db")
        parser.add_argument("--clients", type=int, default=32)
        parser.add_argument("--seconds", type=float, default=30.0)
        parser.add_argument("--adapter", default=None, help="the version serving before the swap (None: the tiny agent's model alone)")
    elif command == "rollback":
        parser.add_argument("--version", type=int, required=True)
    elif command == "key":
        parser.add_argument("--user", required=True, help="whose key: the name the store keeps with their episodes and feedback")
        parser.add_argument("--revoke", action="store_true", help="withdraw every key of --user instead of making one")
    else:
        add_config_flags(parser, SimConfig, SimConfig(), skip=("online",))  # the online trainer's: OnlineConfig's defaults
        parser.add_argument("--out", dest="out_dir", default=argparse.SUPPRESS, help="the same as --out-dir")
    return parser


COMMANDS = {"serve": serve, "train": train, "rollback": rollback, "simulate": simulate, "loadtest": loadtest, "key": make_key}


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and not argv[0].startswith("-") and argv[0] not in COMMANDS:  # argparse would blame an unrecognized argument of serve
        raise SystemExit(f"python -m helpers.serve: unknown command {argv[0]!r}; choose from {', '.join(COMMANDS)} (none: serve)")
    command = argv.pop(0) if argv and argv[0] in COMMANDS else "serve"
    flush_denormals()  # before torch starts its threads (helpers.floats)
    parser = build_parser(command)
    if command == "serve" and any(a.split("=")[0] in ("--admin-token", "--admin_token") for a in argv):
        # said before parsing: argparse would take --admin-token for an abbreviation of --admin-token-file
        parser.error("--admin-token: the admin token is read from --admin-token-file or the WORKBOOK_ADMIN_TOKEN "
                     "variable, not the command line (ps shows a command line to every user of the machine)")
    args = parser.parse_args(argv)
    if command in ("serve", "train") and args.threads < 1:  # torch's own refusal is a traceback
        parser.error(f"--threads {args.threads}: give 1 or more")
    if command == "serve":
        check_port(parser, args.port)
        if args.rate <= 0:  # the rate limiter divides by it: a 500 once a user's burst is spent
            parser.error(f"--rate {args.rate}: give more than 0 requests a second")
        if args.burst < 1:  # no token ever: a 429 for every request
            parser.error(f"--burst {args.burst}: give 1 or more")
        if args.max_queue < 1:  # no room ever: a 429 for every chat
            parser.error(f"--max-queue {args.max_queue}: give 1 or more")
    if command in ("serve", "train") and args.preset not in PRESETS:
        parser.error(f"--preset {args.preset}: choose from {', '.join(sorted(PRESETS))}")
    COMMANDS[command](args)


if __name__ == "__main__":
    main()
