"""The served agent's settings (``python -m helpers.serve``'s flags are made from them): a module without FastAPI,
so the command's ``--help`` and its other subcommands run without the 'serve' extra."""

from __future__ import annotations

from dataclasses import dataclass, field

ADMIN_TOKEN_ENV = "WORKBOOK_ADMIN_TOKEN"  # the environment variable the admin token is read from
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")  # the Host names a server on this machine answers by default
MAX_CREDENTIAL_CHARS = 256  # a key or the admin token; a longer Authorization header is refused unread
MIN_ADMIN_TOKEN_CHARS = 16  # a shorter admin token could be guessed


@dataclass
class ServiceConfig:
    name: str = "tiny-agent"  # the model name callers use (the preset's)
    rate: float = 5.0  # requests a second per user and endpoint, on average
    burst: int = 20  # requests a user may send at once
    max_queue: int = 256  # requests waiting for the agent's worker; more are refused with 429 and Retry-After
    allow_host: list[str] = field(default_factory=list)  # Host names answered besides the loopback ones (repeat the flag)
    admin_token_file: str = ""  # a file holding the admin token (else the WORKBOOK_ADMIN_TOKEN variable; neither: no admin routes)
    admin_token: str = ""  # the token itself, in process only: never a flag, which ps would show to every user of the machine
    world_seed: int = 0  # seeds the served world's price lists
