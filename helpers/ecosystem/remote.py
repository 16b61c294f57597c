"""Environments over the wire: any env on TRL's contract served as an OpenEnv environment, and trained through OpenEnv's client.

    python -m helpers.ecosystem.openenv_server shop --port 8000    # serve the shop world (one session per episode)
    OPENENV_URL=http://127.0.0.1:8000 python -m helpers.train --preset tiny-agent --env-class helpers.ecosystem.remote:RemoteEnv
    make_env("helpers.ecosystem.remote:RemoteEnv", base_url="http://127.0.0.1:8000")   # an Episode, as for a local env
    GRPOTrainer(..., environment_factory=remote_env_class("http://127.0.0.1:8000"))  # TRL: the same class

OpenEnv (``openenv-core``) is the open standard for environments as services: a server holds one
environment per session and answers ``reset`` and ``step(action)`` with an observation, a reward and
``done``, over HTTP or a WebSocket. This module is both ends of one small protocol on it, at the level of
TRL's contract (``helpers.envs.base``) — the *tool call* — so the adapter that parses the model's turn
(``helpers.envs.Episode``) stays on the trainer's side, where the tokens are:

    reset(row={...})                              -> ServedObservation(text=env.reset(**row))
    step(ToolAction(tool="lookup", arguments={"item": "pen"}))
                                                  -> ServedObservation(result="3")   or error="ValueError: ..."
    step(ToolAction(tool="_tools"))               -> ServedObservation(tools=[schema, ...], rewarded=...)
    step(ToolAction(tool="_reward"))              -> ServedObservation(reward=env.get_reward())

Server side, ``ServedEnv`` wraps one env object (made by a factory, one per session) as an
``openenv.core.Environment``; ``create_server_app`` hands the factory to OpenEnv's own ``create_app``
(FastAPI, served by uvicorn in ``helpers.ecosystem.openenv_server``). Client side, ``RemoteEnv`` is an env on TRL's
contract whose tools are the served env's: its class is built once per server from the served tools'
JSON schemas (``remote_env_class``), so ``tool_schemas`` renders the same schemas as for the local
class, and each tool method is one ``step`` over OpenEnv's WebSocket client. Everything else —
parsing the model's turn, judging the final answer, the limits and their timers — is the local
``Episode``'s, unchanged: an episode over the wire is the local episode, token for token.

Why the tool call and not the whole turn as the action: the turn's text is judged against the task's
answer, which the trainer holds, and TRL's ``environment_factory`` wants exactly this object (reset
and typed tools). An OpenEnv environment from outside trains in the workbook's loop the same way when
its server speaks this protocol: wrap its env object with ``ServedEnv`` (or answer the three kinds of
step above), and point ``RemoteEnv`` at it.

Simplifications, named:

* Tool arguments are rebuilt from JSON schema types (string, integer, number, boolean, array,
  object); a schema's ``enum`` and ``nullable`` are kept in the description, not in the type hint.
* A tool that raises on the server comes back as ``RemoteToolError("ValueError: ...")``: the error
  observation names the remote exception's type inside the message, not as its own type.
* One WebSocket session per env object, opened at the first ``reset`` and closed when the object is
  collected (the rollout drops its envs when it returns; TRL keeps one object per slot); a session counts against
  the server's ``max_concurrent_envs``, so serve at least tasks x group size of them.
* ``seed`` and ``episode_id`` of OpenEnv's reset are not used: the task's row decides the episode.
"""

from __future__ import annotations

import inspect
import os
import weakref
from typing import Any, Callable

from openenv.core import Action, Environment, Observation, State, SyncEnvClient
from openenv.core.client_types import StepResult as WireResult
from openenv.core.env_client import EnvClient
from openenv.core.env_server import create_app
from pydantic import Field

from helpers.envs.base import tool_methods, tool_schemas

DEFAULT_URL = "http://127.0.0.1:8000"  # when neither base_url nor the OPENENV_URL variable says otherwise
TOOLS, REWARD = "_tools", "_reward"  # the two steps that are not tool calls (a tool's name never starts with "_")


# --- the wire types ------------------------------------------------------------------------------

class ToolAction(Action):
    """One call of the served env's tool ``tool`` (or ``_tools``, ``_reward``)."""

    tool: str = Field(description="the tool's name, or _tools (list them) or _reward (call get_reward)")
    arguments: dict[str, Any] = Field(default_factory=dict, description="the tool's arguments, as the client's Episode typed them")


class ServedObservation(Observation):
    """What the server answers; only the fields of the request's kind are set."""

    text: str | None = Field(default=None, description="reset: the string env.reset(**row) returned, or None")
    result: str | None = Field(default=None, description="a tool call: its result, str()-ed")
    error: str | None = Field(default=None, description="a tool call that raised: 'ValueError: ...'")
    tools: list[dict] = Field(default_factory=list, description="_tools: the env's tool schemas, in TRL's order")
    rewarded: bool = Field(default=False, description="_tools: the env has get_reward()")


# --- the server side -----------------------------------------------------------------------------

class ServedEnv(Environment):
    """One env object on TRL's contract, as an OpenEnv environment (one per session)."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # each session gets its own env object from the factory

    def __init__(self, env: object):
        super().__init__()
        self.env = env
        self.tools = tool_methods(env)
        self._state = State()

    def reset(self, seed: int | None = None, episode_id: str | None = None, row: dict | None = None, **_) -> ServedObservation:
        self._state = State(episode_id=episode_id)
        return ServedObservation(text=self.env.reset(**(row or {})))

    def step(self, action: ToolAction, timeout_s: float | None = None, **_) -> ServedObservation:
        self._state.step_count += 1
        if action.tool == TOOLS:
            return ServedObservation(tools=tool_schemas(self.env), rewarded=callable(getattr(self.env, "get_reward", None)))
        try:
            if action.tool == REWARD:
                return ServedObservation(reward=float(self.env.get_reward()))
            return ServedObservation(result=str(self.tools[action.tool](**action.arguments)))
        except Exception as e:  # the env's error goes back to the client's Episode, which reports it to the model
            return ServedObservation(error=f"{type(e).__name__}: {e}")

    @property
    def state(self) -> State:
        return self._state


def create_server_app(env_factory: Callable[[], object], name: str, max_sessions: int = 128):
    """OpenEnv's FastAPI app serving ``env_factory()`` objects, ``max_sessions`` sessions at once."""
    return create_app(lambda: ServedEnv(env_factory()), ToolAction, ServedObservation, env_name=name,
                      max_concurrent_envs=max_sessions)


# --- the client side -----------------------------------------------------------------------------

class RemoteToolError(RuntimeError):
    """A tool raised on the server; the message names the remote exception."""


class _Client(EnvClient):
    """OpenEnv's WebSocket client for this protocol: ToolAction out, ServedObservation back."""

    def _step_payload(self, action: ToolAction) -> dict:
        return action.model_dump()

    def _parse_result(self, payload: dict) -> WireResult:
        observation = ServedObservation(**{**payload.get("observation", {}), "reward": payload.get("reward"), "done": payload.get("done", False)})
        return WireResult(observation=observation, reward=observation.reward, done=observation.done)

    def _parse_state(self, payload: dict) -> State:
        return State(**payload)


def connect(base_url: str) -> SyncEnvClient:
    """A new session on the server at ``base_url`` (a blocking client over OpenEnv's async one)."""
    return _Client(base_url=base_url).sync()


def call(client: SyncEnvClient, tool: str, **arguments) -> ServedObservation:
    """One step: the served env's ``tool`` with ``arguments``; raises the tool's error."""
    observation = client.step(ToolAction(tool=tool, arguments=arguments)).observation
    if observation.error is not None:
        raise RemoteToolError(observation.error)
    return observation


class RemoteEnv:
    """An env on TRL's contract whose tools and reward are a served env's.

    ``RemoteEnv(base_url)`` (default: the ``OPENENV_URL`` variable, else ``DEFAULT_URL``) returns an
    object of the class ``remote_env_class(base_url)`` builds, so ``--env-class
    helpers.ecosystem.remote:RemoteEnv`` and TRL's no-argument construction both work.
    """

    base_url = DEFAULT_URL

    def __new__(cls, base_url: str | None = None):
        if cls is RemoteEnv:  # the generic name: the class built for this server
            cls = remote_env_class(base_url or os.environ.get("OPENENV_URL", DEFAULT_URL))
        return super().__new__(cls)

    def __init__(self, base_url: str | None = None):
        self._client: SyncEnvClient | None = None  # opened at the first reset

    def reset(self, **row) -> str | None:
        if self._client is None:
            self._client = connect(self.base_url)
            weakref.finalize(self, self._client.close)  # the session ends with the object
        return self._client.reset(row=row).observation.text


_CLASSES: dict[str, type] = {}  # base_url -> its RemoteEnv class


def remote_env_class(base_url: str) -> type:
    """The ``RemoteEnv`` subclass for the server at ``base_url``: one method per served tool, with the
    signature, type hints and Google docstring that give back its JSON schema, and ``get_reward``
    when the served env has one. Built once per server (one ``_tools`` step on a throwaway session)."""
    if base_url not in _CLASSES:
        client = connect(base_url)
        try:
            listing = call(client, TOOLS)
        finally:
            client.close()
        methods = {schema["function"]["name"]: _tool_method(schema["function"]) for schema in listing.tools}
        if listing.rewarded:
            methods["get_reward"] = _get_reward
        _CLASSES[base_url] = type("RemoteEnv", (RemoteEnv,), {"base_url": base_url, **methods})
    return _CLASSES[base_url]


_JSON_TYPES = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list, "object": dict}
_UNSET = object()  # the default of an optional argument the model left out: not sent


def _tool_method(function: dict) -> Callable:
    """A method that calls the served tool ``function["name"]``, shaped by its schema."""
    name, properties = function["name"], function.get("parameters", {}).get("properties", {})
    required = set(function.get("parameters", {}).get("required", []))

    def tool(self, **arguments):
        if self._client is None:
            raise RemoteToolError(f"{name} called before reset")
        return call(self._client, name, **{k: v for k, v in arguments.items() if v is not _UNSET}).result

    hints = {arg: _JSON_TYPES.get(_first_type(spec), Any) for arg, spec in properties.items()}
    tool.__name__ = tool.__qualname__ = name
    tool.__annotations__ = {**hints, "return": str}
    tool.__signature__ = inspect.Signature(
        [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        + [inspect.Parameter(arg, inspect.Parameter.KEYWORD_ONLY, default=inspect.Parameter.empty if arg in required else _UNSET,
                             annotation=hints[arg]) for arg in properties])
    args = "".join(f"\n    {arg}: {spec.get('description', arg)}" for arg, spec in properties.items())
    tool.__doc__ = function.get("description", name) + (f"\n\nArgs:{args}" if args else "")
    return tool


def _first_type(spec: dict) -> str | None:
    """The schema's type; of a list of types (``["string", "null"]``), the first that is not null."""
    kind = spec.get("type")
    return next((k for k in kind if k != "null"), None) if isinstance(kind, list) else kind


def _get_reward(self) -> float:
    """The served env's ``get_reward()``."""
    return call(self._client, REWARD).reward
