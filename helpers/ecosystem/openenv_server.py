"""Serve a workbook environment as an OpenEnv environment: ``python -m helpers.ecosystem.openenv_server shop --port 8000``.

    python -m helpers.ecosystem.openenv_server shop            # http://127.0.0.1:8000, 128 sessions
    python -m helpers.ecosystem.openenv_server mypkg.games:Guess --host 0.0.0.0 --max-sessions 256

Any registered env name (``helpers.envs.list_envs()``, the worlds' included) or ``package.module:ClassName``
on TRL's contract. Each session (one episode's client, ``helpers.ecosystem.remote.RemoteEnv``) gets its own env
object; the protocol is ``helpers.ecosystem.remote``'s, the server OpenEnv's own ``create_app`` under uvicorn.
Serve at least tasks_per_step x num_generations sessions (the episodes of one rollout run at once), and
as many again while an evaluation runs beside training. It imports ``helpers.worlds``, which registers the
worlds' envs by name. The socket helpers (``check_port``, ``bound_socket``, ``serve_on``) serve the served agent
too (``python -m helpers.serve``).
"""

from __future__ import annotations

import argparse
import socket

import helpers.worlds  # noqa: F401  (registers the worlds' envs)
from helpers.envs import new_env


def check_port(parser: argparse.ArgumentParser, port: int) -> None:
    """Refuse a port outside 1-65535: uvicorn takes 0 (a random port it does not print) and wraps 99999 to 34463.
    Also the helpers.serve command's."""
    if not 1 <= port <= 65535:
        parser.error(f"--port {port}: give a port from 1 to 65535")


def bound_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` now, before anything loads, for uvicorn to serve on: a port another server
    holds is refused in one line (uvicorn would say so only after the service had loaded, below a line
    announcing it). Also the helpers.serve command's."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: a port a server just left is free
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise SystemExit(f"cannot listen on {host}:{port}: {error.strerror} (is another server there? give another --port)") from None
    return sock


def serve_on(sock: socket.socket, app) -> None:
    """Serve the ASGI ``app`` with uvicorn on the bound socket until the process is stopped."""
    import uvicorn  # optional (the 'openenv' and 'serve' extras): imported when a server starts

    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m helpers.ecosystem.openenv_server", description=__doc__.splitlines()[0])
    parser.add_argument("env", help="a registered env name (e.g. shop) or package.module:ClassName")
    parser.add_argument("--host", default="127.0.0.1", help="0.0.0.0 serves other machines too")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-sessions", type=int, default=128, help="concurrent sessions (episodes) the server holds")
    args = parser.parse_args(argv)
    check_port(parser, args.port)
    if args.max_sessions < 1:
        parser.error(f"--max-sessions {args.max_sessions}: give 1 or more")
    try:  # an unknown name fails now, with the registry's message, not at the first session
        new_env(args.env)
    except (KeyError, ValueError) as e:
        parser.error(e.args[0] if isinstance(e, KeyError) else str(e))
    sock = bound_socket(args.host, args.port)

    from helpers.ecosystem.remote import create_server_app  # OpenEnv (the 'openenv' extra): imported when a server starts

    serve_on(sock, create_server_app(lambda: new_env(args.env), args.env, max_sessions=args.max_sessions))


if __name__ == "__main__":
    main()
