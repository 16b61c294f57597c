"""The served agent's settings (``python -m helpers.serve``'s flags are made from them): a module without FastAPI,
so the command's ``--help`` and its other subcommands run without the 'serve' extra."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ServiceConfig:
    name: str = "tiny-agent"  # the model name callers use (the preset's)
    rate: float = 5.0  # requests a second per user and endpoint, on average
    burst: int = 20  # requests a user may send at once
    admin_token: str = ""  # the bearer token that enables /v1/admin/*; "" turns them off
    world_seed: int = 0  # seeds the served world's price lists
