"""The HTTP face of the service (FastAPI): OpenAI's chat completions, feedback, a status page and the web page.

    POST /v1/chat/completions   {"model": "tiny-agent", "messages": [{"role": "user", "content": "What do 3 of my
                                usual items cost?"}], "temperature": 0}                    (Bearer: the user's key)
                                -> OpenAI's chat.completion (choices[0].message.content = the final answer)
                                   + "episode": {id, adapter_version, messages (tool calls and results), stop_reason}
    POST /v1/feedback           {"episode_id": ..., "rating": 1 | -1, "correct_answer": "141"}   (Bearer: the user's key)
                                -> 201 {"id": ...} once it is on disk
    GET  /v1/episodes/{id}      the caller's own episode (Bearer: the user's key)
    GET  /v1/models, /v1/status, /health, /  (the web page)
    POST /v1/admin/rollback {"version": 2}, /v1/admin/world {"items": ["key", "cake"]}   (Bearer: the admin token)

The agent's tools run here, in the world (``helpers.serve.world``): the caller sends a question and
gets the answer and the whole episode. ``model`` names the deployed adapter (``"tiny-agent"``) or pins a
version that was deployed once (``"tiny-agent@v0"``: the frozen copy the simulation compares with).

Who is asking. Every chat and feedback carries a key (``Authorization: Bearer KEY``; ``python -m helpers.serve
key --user ann`` makes one, ``store.create_key`` in process), and the user is the key's (``helpers.serve.store``):
a body's ``user`` may repeat it and is refused when it names anyone else. Feedback is trained on, so a name
taken at its word would let anyone invent users (each with a fresh rate limit and a clean reputation) or speak in
someone else's name; a key is something a user has to be given.

What a web page could send is refused (``CheckHost``, ``read_body``): any page a browser opens can POST to
127.0.0.1, so a POST must be ``application/json`` (a cross-site ``text/plain`` or form POST needs no permission
from the browser, a JSON one does), and the ``Host`` header must name this server (loopback names, and
``--allow-host``): a page whose own name an attacker re-pointed at 127.0.0.1 (DNS rebinding) sends its own name.

Bad input gets a 4xx that says what is wrong and changes nothing: no key or an unknown one (401), a POST that is
not JSON (415), a body over ``MAX_BODY_BYTES`` (413, counted as it arrives), JSON that does not fit the schema or
values out of range (422), an unknown episode or model (404), feedback on another user's episode or a body
speaking for another user (403), a second piece of feedback on one episode (409), a caller over their rate or a
full queue (429, with Retry-After). Errors have OpenAI's shape, ``{"error": {"message", "type", "code"}}``.

Rate limits: a token bucket per user and endpoint (``RateLimits``): ``rate`` requests a second on
average, bursts of ``burst``.
"""

from __future__ import annotations

import asyncio
import math
import re
import secrets
import threading
import time
import uuid
from collections import OrderedDict
from pathlib import Path
from typing import Literal

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, model_validator
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from helpers.formats import extract_answer, format_number, to_number
from helpers.serve.agent import AgentPool, QueueFull
from helpers.serve.config import LOOPBACK_HOSTS, MAX_CREDENTIAL_CHARS, ServiceConfig
from helpers.serve.store import DuplicateFeedback, EpisodeRecord, SQLiteStore, UnknownEpisode
from helpers.serve.world import WORLD_ITEMS_KEY, ServedShop
from helpers.worlds.shop.tasks import ITEMS

MAX_BODY_BYTES = 16_384  # a chat request of a few messages; feedback is far smaller
MAX_ANSWER_CHARS = 24  # a correct answer is a number
MAX_BUCKETS = 10_000  # rate-limit buckets kept (the least recently used go first)
PAGE = Path(__file__).with_name("page.html")


# --- request bodies --------------------------------------------------------------------------------


class Message(BaseModel):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = Field(max_length=2000)


class ChatRequest(BaseModel):
    """OpenAI's request; fields we do not use (``n``, ``tools`` ...) are accepted and ignored, as many servers do."""

    model_config = ConfigDict(extra="ignore")
    model: str = Field("tiny-agent", max_length=64)
    messages: list[Message] = Field(min_length=1, max_length=16)
    user: str | None = Field(None, min_length=1, max_length=64)  # may repeat the key's user; another name is refused
    temperature: float = Field(1.0, ge=0.0, le=2.0)  # OpenAI's default; 0 = greedy
    stream: bool = False

    @model_validator(mode="after")
    def _has_question(self):
        if not any(m.role == "user" and m.content.strip() for m in self.messages):
            raise ValueError("messages need a user message with the question")
        if self.stream:
            raise ValueError("stream=true is not supported: the answer comes after the agent's tool calls")
        return self


class FeedbackRequest(BaseModel):
    """Thumbs up/down (``rating`` 1 / -1) and/or the correct answer (a number), on one episode, by its caller."""

    model_config = ConfigDict(extra="forbid")
    episode_id: str = Field(min_length=1, max_length=64)
    user: str | None = Field(None, min_length=1, max_length=64)  # may repeat the key's user; another name is refused
    rating: StrictInt | None = None
    correct_answer: str | None = Field(None, min_length=1, max_length=MAX_ANSWER_CHARS)

    @model_validator(mode="after")
    def _check(self):
        if self.rating is None and self.correct_answer is None:
            raise ValueError("give a rating (1 or -1), a correct_answer, or both")
        if self.rating is not None and self.rating not in (-1, 1):
            raise ValueError(f"rating must be 1 (thumbs up) or -1 (thumbs down), got {self.rating}")
        if self.correct_answer is not None:
            value = to_number(self.correct_answer)
            if value is None or not math.isfinite(float(value)) or abs(value) >= 10**9:
                raise ValueError(f"correct_answer must be a number below 1e9, got {self.correct_answer!r}")
            self.correct_answer = format_number(value)  # canonical: "1,000.0" -> "1000"
        return self


class AdminRollback(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: StrictInt = Field(ge=0, lt=2**63)  # SQLite's integers: a larger one would overflow in the store


class AdminWorld(BaseModel):
    """What the world's customers buy from now on (None: every item): the simulation's drift."""

    model_config = ConfigDict(extra="forbid")
    items: list[str] | None = Field(min_length=1, max_length=len(ITEMS))

    @model_validator(mode="after")
    def _known(self):
        unknown = sorted(set(self.items or []) - set(ITEMS))
        if unknown:
            raise ValueError(f"unknown items {unknown}; the shop sells {list(ITEMS)}")
        return self


# --- rate limits -------------------------------------------------------------------------------------


class RateLimits:
    """A token bucket per (user, endpoint): ``rate`` tokens a second, at most ``burst`` saved up.

    At most ``max_buckets`` buckets are kept, the least recently used dropped first: a table keeping one entry
    per name forever would grow with every name ever seen. A dropped bucket comes back full, a small gift to a user
    not seen while ``max_buckets`` others were, whose bucket had mostly refilled by then anyway."""

    def __init__(self, rate: float, burst: int, max_buckets: int = MAX_BUCKETS):
        self.rate, self.burst, self.max_buckets = rate, burst, max_buckets
        self.buckets: OrderedDict[tuple[str, str], tuple[float, float]] = OrderedDict()  # key -> (tokens, time), oldest first
        self.lock = threading.Lock()

    def wait_time(self, user: str, endpoint: str) -> float:
        """0 and one token taken, or the seconds until the next token (nothing taken)."""
        now = time.monotonic()
        key = (user, endpoint)
        with self.lock:
            tokens, then = self.buckets.pop(key, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - then) * self.rate)
            taken = 1.0 if tokens >= 1.0 else 0.0
            self.buckets[key] = (tokens - taken, now)  # now the most recently used
            if len(self.buckets) > self.max_buckets:
                self.buckets.popitem(last=False)
            return 0.0 if taken else (1.0 - tokens) / self.rate


# --- the app -------------------------------------------------------------------------------------------


def error(status: int, message: str, kind: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status, headers=headers)


def host_name(host: str) -> str:
    """The name in a ``Host`` header, without its port: ``127.0.0.1:8000`` -> ``127.0.0.1``, ``[::1]:8000`` -> ``::1``."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host


class CheckHost:
    """ASGI middleware: a request whose ``Host`` is not one of ``hosts`` gets 421 before any route runs.

    Why: DNS rebinding. A page on attacker.example can re-point its own name at 127.0.0.1 and then read and write
    this server as if it were its own site (the browser thinks it talks to attacker.example; its ``Host`` header
    says so). A server that answers only to the names it was started for is out of that page's reach."""

    def __init__(self, app, hosts: set[str]):
        self.app, self.hosts = app, hosts

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            given = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
            if host_name(given) not in self.hosts:
                refused = error(421, f"this server does not answer to Host {given[:100]!r}; start it with "
                                     f"--allow-host NAME to add a name", "misdirected_request")
                return await refused(scope, receive, send)
        return await self.app(scope, receive, send)


def too_large() -> JSONResponse:
    return error(413, f"body over {MAX_BODY_BYTES} bytes", "request_too_large", {"Connection": "close"})


async def read_body(request: Request) -> bytes | JSONResponse:
    """The body of a JSON POST, or the 4xx that says why not.

    Only ``application/json`` (415 otherwise): a browser sends a cross-site ``text/plain`` or form POST without
    asking anyone, while a JSON one needs the server's permission (a CORS preflight, which this server never grants).
    At most ``MAX_BODY_BYTES``, counted as the body arrives: a body without a Content-Length (chunked), read whole
    before its size is checked, would grow the server by its size (hundreds of MB for one POST)."""
    media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media_type != "application/json":
        return error(415, f"POST bodies must be application/json, not {media_type[:60] or 'untyped'!r}", "unsupported_media_type")
    declared = request.headers.get("content-length")
    if declared is not None and (not re.fullmatch(r"[0-9]{1,12}", declared) or int(declared) > MAX_BODY_BYTES):
        return too_large()
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_BODY_BYTES:
                return too_large()  # the rest is never read: the server closes the connection after this reply
    except ClientDisconnect:
        return error(400, "the client left before its body arrived", "invalid_request_error")
    return bytes(body)


async def parse(request: Request, model: type[BaseModel]):
    """The request body as ``model``, or the 4xx response that says why not."""
    body = await read_body(request)
    if isinstance(body, JSONResponse):
        return body
    try:
        return model.model_validate_json(body)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, p['loc'])) or 'body'}: {p['msg']}" for p in e.errors(include_url=False))
        return error(422, problems, "invalid_request_error")


def final_reply(messages: list[dict]) -> tuple[str, str | None]:
    """The agent's reply to the caller, and the number it answered (None without one).

    The reply is the last *assistant* turn: an episode cut short after a tool call (``max_steps``, the token
    budget) ends on the tool's result, which is the world's text, not the agent's. Only an episode that ends on
    the agent's turn has an answer; an ``<answer>`` written beside a tool call was not its final answer."""
    reply = next((m["content"] for m in reversed(messages) if m["role"] == "assistant"), "")
    found = extract_answer(reply) if messages and messages[-1]["role"] == "assistant" else None
    return reply, format_number(found.value) if found is not None and found.value is not None else None


def episode_view(record: EpisodeRecord) -> dict:
    """What a caller sees of an episode: no hidden world, no token lists."""
    return {"id": record.id, "adapter_version": record.adapter_version, "model": record.model, "answer": record.answer,
            "stop_reason": record.stop_reason, "messages": record.messages, "latency_s": record.latency_s}


def bearer(request: Request) -> str | None:
    """The credential of an ``Authorization: Bearer ...`` header; None when there is none or it cannot be one
    (not printable ASCII, or over ``MAX_CREDENTIAL_CHARS``): such a header is refused, it never reaches a comparison
    (``secrets.compare_digest`` raises TypeError on non-ASCII text: a 500)."""
    scheme, _, credential = request.headers.get("authorization", "").strip().partition(" ")
    credential = credential.strip()
    if scheme.lower() != "bearer" or not 0 < len(credential) <= MAX_CREDENTIAL_CHARS:
        return None
    return credential if credential.isascii() and credential.isprintable() else None


def public_adapter(row: dict) -> dict:
    """An adapter version as /v1/status shows it: no folder on disk (a path tells a caller about the machine)."""
    return {k: v for k, v in row.items() if k != "path"}


def create_app(pool: AgentPool, store: SQLiteStore, config: ServiceConfig = ServiceConfig()) -> FastAPI:
    """The FastAPI app over one agent pool and one store (module docstring); it answers only to the Host names
    ``LOOPBACK_HOSTS`` and ``config.allow_host``."""
    app = FastAPI(title="workbook agent service", docs_url=None, redoc_url=None)
    app.add_middleware(CheckHost, hosts={*LOOPBACK_HOSTS, *(host_name(h) for h in config.allow_host)})
    limits = RateLimits(config.rate, config.burst)
    pinned = re.compile(re.escape(config.name) + r"@v([0-9]{1,18})")  # ASCII digits only: "v²" is not a version
    world = ServedShop(config.world_seed)
    world_lock = threading.Lock()  # the world's random draws, one request at a time

    def limited(user: str, endpoint: str) -> JSONResponse | None:
        wait = limits.wait_time(user, endpoint)
        if wait > 0:
            return error(429, f"user {user!r} is over {config.rate:g} {endpoint} requests a second", "rate_limit_exceeded",
                         {"Retry-After": str(max(1, math.ceil(wait)))})
        return None

    def admin(request: Request) -> JSONResponse | None:
        given = bearer(request)
        if not config.admin_token or given is None or not secrets.compare_digest(given.encode(), config.admin_token.encode()):
            return error(403, "admin endpoints need the server's admin token (--admin-token-file or "
                              "WORKBOOK_ADMIN_TOKEN when it started)", "permission_error")
        return None

    async def caller(request: Request) -> str | JSONResponse:
        """The user whose key the request carries, or the 401."""
        key = bearer(request)
        user = None if key is None else await run_in_threadpool(store.key_user, key)
        if user is None:
            return error(401, "chat and feedback need a key: send 'Authorization: Bearer KEY' (python -m helpers.serve key "
                              "--user NAME makes one)", "authentication_error", {"WWW-Authenticate": "Bearer"})
        return user

    def speaks_for_another(body_user: str | None, user: str) -> JSONResponse | None:
        if body_user is not None and body_user != user:
            return error(403, f"this key is {user!r}'s; a request speaks only for its key's user, not {body_user!r}",
                         "permission_error")
        return None

    def resolve_model(name: str) -> int | None | JSONResponse:
        """None: the deployed version; an int: a pinned version that was deployed once; or the 404."""
        if name == config.name:
            return None
        match = pinned.fullmatch(name)
        if match and store.was_deployed(int(match[1])):
            return int(match[1])
        return error(404, f"unknown model {name!r}; serve {config.name!r} (the deployed adapter) or '{config.name}@vN' "
                          "for a version that was deployed (one the canary gate refused never is)", "model_not_found")

    @app.get("/health")
    def health():
        return {"ok": True, "deployed": pool.deployed}

    @app.get("/", response_class=HTMLResponse)
    def page():
        return PAGE.read_text()

    @app.get("/v1/models")
    def models():
        servable = {d["version"] for d in store.deployments()}
        versions = [{"id": f"{config.name}@v{v}", "object": "model"} for v in sorted(servable)]
        return {"object": "list", "data": [{"id": config.name, "object": "model", "deployed": pool.deployed}, *versions]}

    @app.get("/v1/status")
    def status():
        return {"deployed": pool.deployed, "world_items": pool.world_items, "adapters": [public_adapter(a) for a in store.adapters()],
                "deployments": store.deployments(), "swaps": pool.swaps, "feedback": store.feedback_count()}

    @app.get("/v1/episodes/{episode_id}")
    async def get_episode(episode_id: str, request: Request):
        user = await caller(request)
        if isinstance(user, JSONResponse):
            return user
        try:
            record = await run_in_threadpool(store.episode, episode_id)
        except UnknownEpisode:
            record = None
        if record is None or record.user != user:  # another user's episode is not there for this caller
            return error(404, f"no episode {episode_id[:64]!r} of yours", "not_found")
        return episode_view(record)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        started = time.perf_counter()
        user = await caller(request)
        if isinstance(user, JSONResponse):
            return user
        if (refused := limited(user, "chat")) is not None:
            return refused
        body = await parse(request, ChatRequest)
        if isinstance(body, JSONResponse):
            return body
        if (refused := speaks_for_another(body.user, user)) is not None:
            return refused
        version = resolve_model(body.model)
        if isinstance(version, JSONResponse):
            return version
        question = [m.content for m in body.messages if m.role == "user"][-1]
        episode_id = f"ep-{uuid.uuid4().hex[:16]}"
        with world_lock:
            task = world.task(episode_id, user, question, pool.world_items)
        try:
            future = pool.submit(task, version, body.temperature)
        except QueueFull as full:
            return error(429, f"the agent has {full.waiting} requests waiting; try again shortly", "server_busy",
                         {"Retry-After": str(full.retry_after)})
        trajectory, served_by = await asyncio.wrap_future(future)
        reply, answer = final_reply(trajectory.messages)
        record = EpisodeRecord(
            id=episode_id, user=user, model=body.model, adapter_version=served_by, question=question, answer=answer,
            stop_reason=trajectory.stop_reason, world=task.metadata, truth=task.answer, messages=trajectory.messages,
            token_ids=trajectory.token_ids, mask=trajectory.mask, logprobs=trajectory.logprobs,
            prompt_len=trajectory.prompt_len, temperature=body.temperature, latency_s=time.perf_counter() - started)
        await run_in_threadpool(store.add_episode, record)  # on disk before the caller hears of the episode
        completion = sum(trajectory.mask)
        return {
            "id": f"chatcmpl-{episode_id}", "object": "chat.completion", "created": int(record.created), "model": body.model,
            "choices": [{"index": 0, "finish_reason": "stop" if trajectory.stop_reason == "answered" else "length",
                         "message": {"role": "assistant", "content": reply}}],
            "usage": {"prompt_tokens": trajectory.prompt_len, "completion_tokens": completion,
                      "total_tokens": len(trajectory.token_ids)},
            "episode": episode_view(record),
        }

    @app.post("/v1/feedback", status_code=201)
    async def feedback(request: Request):
        user = await caller(request)
        if isinstance(user, JSONResponse):
            return user
        if (refused := limited(user, "feedback")) is not None:
            return refused
        body = await parse(request, FeedbackRequest)
        if isinstance(body, JSONResponse):
            return body
        if (refused := speaks_for_another(body.user, user)) is not None:
            return refused
        try:
            record = await run_in_threadpool(store.episode, body.episode_id)
        except UnknownEpisode:
            return error(404, f"no episode {body.episode_id!r}", "not_found")
        if record.user != user:
            return error(403, "feedback on an episode is given by the user who asked", "permission_error")
        try:
            feedback_id = await run_in_threadpool(store.add_feedback, body.episode_id, user, body.rating, body.correct_answer)
        except DuplicateFeedback:
            return error(409, f"episode {body.episode_id!r} already has feedback", "conflict")
        return JSONResponse({"id": feedback_id, **body.model_dump(), "user": user}, status_code=201)

    @app.post("/v1/admin/rollback")
    async def rollback(request: Request):
        if (refused := admin(request)) is not None:
            return refused
        body = await parse(request, AdminRollback)
        if isinstance(body, JSONResponse):
            return body
        if not pool.known(body.version):
            return error(404, f"no adapter version {body.version}", "not_found")
        await run_in_threadpool(store.deploy, body.version, "rollback by an operator")
        return {"deployed": body.version}

    @app.post("/v1/admin/world")
    async def set_world(request: Request):
        if (refused := admin(request)) is not None:
            return refused
        body = await parse(request, AdminWorld)
        if isinstance(body, JSONResponse):
            return body
        await run_in_threadpool(store.set_setting, WORLD_ITEMS_KEY, body.items)
        pool.world_items = body.items
        return body.model_dump()

    return app
