"""The env registry: a new environment is one class plus one line.

    register_env("guess", GuessEnv)                # any callable that returns an Env
    env = make_env("guess", max_steps=7)           # what the training code calls
    list_envs()                                    # ['calculator', 'code', 'guess', 'math']

The trainer and the rollout only ever call ``make_env(config.env, **config.env_kwargs)``,
so adding an environment never changes them (open for extension, closed for
modification). ``register_env`` also works as a decorator: ``@register_env("guess")``.
"""

from __future__ import annotations

from typing import Callable

from helpers.envs.base import Env

_REGISTRY: dict[str, Callable[..., Env]] = {}


def _same_definition(a: Callable, b: Callable) -> bool:
    """Two factories defined by the same code (a notebook cell run twice)."""
    return getattr(a, "__module__", None) == getattr(b, "__module__", None) and getattr(a, "__qualname__", None) == getattr(b, "__qualname__", None)


def register_env(name: str, factory: Callable[..., Env] | None = None, overwrite: bool = False):
    """Register ``factory`` (an Env class or a function returning an Env) under ``name``.

    Registering a name twice is an error (two envs would silently fight for it) unless
    ``overwrite=True`` or the factory is the same definition again, as when a notebook
    cell that defines and registers an env is re-run.
    """
    if factory is None:  # used as a decorator
        return lambda f: register_env(name, f, overwrite)
    if not callable(factory):
        raise TypeError(f"register_env({name!r}, ...): factory must be callable, got {type(factory).__name__}")
    old = _REGISTRY.get(name)
    if old is not None and old is not factory and not overwrite and not _same_definition(old, factory):
        raise ValueError(f"env {name!r} is already registered (by {getattr(old, '__qualname__', old)}); pass overwrite=True to replace it")
    _REGISTRY[name] = factory
    return factory


def make_env(name: str, **kwargs) -> Env:
    """A new env instance: ``make_env("calculator", max_steps=5)``."""
    if name not in _REGISTRY:
        raise KeyError(f"unknown env {name!r}; registered: {', '.join(sorted(_REGISTRY))}")
    env = _REGISTRY[name](**kwargs)
    if not isinstance(env, Env):
        raise TypeError(f"the factory registered as {name!r} returned {type(env).__name__}, not an Env")
    return env


def list_envs() -> list[str]:
    return sorted(_REGISTRY)
