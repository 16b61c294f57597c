"""The registries' one rule: how a world plugs a dataset, an env, a preset or a collector in by name.

Each registry is a plain dict (``helpers.data.DATASETS``, ``helpers.envs.registry``'s, ``helpers.config.PRESETS``,
``helpers.loop.COLLECTORS``) filled by the worlds when ``helpers.worlds`` is imported; ``register`` is the one
way in. Registering a name twice is an error (two worlds would silently fight for it) unless ``overwrite=True``
or the entry is the same definition again, as when a notebook cell that defines and registers one is re-run.
"""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


def same_definition(a: object, b: object) -> bool:
    """Two functions or classes defined by the same code (a notebook cell run twice): the same module and
    qualified name. Other objects (instances) have no definition of their own: never the same."""
    name = getattr(a, "__qualname__", None)
    return name is not None and name == getattr(b, "__qualname__", None) and getattr(a, "__module__", None) == getattr(b, "__module__", None)


def register(registry: dict, kind: str, name: str, entry: T, overwrite: bool = False) -> T:
    """Put ``entry`` into ``registry`` under ``name`` (``kind`` names the registry in the error); returns ``entry``."""
    old = registry.get(name)
    if old is not None and old is not entry and not overwrite and not same_definition(old, entry):
        raise ValueError(f"{kind} {name!r} is already registered (by {getattr(old, '__qualname__', old)}); "
                         "pass overwrite=True to replace it")
    registry[name] = entry
    return entry
