"""The HTTP face of the service (FastAPI): OpenAI's chat completions, feedback, a status page and the web page.

    POST /v1/chat/completions   {"model": "tiny-agent", "messages": [{"role": "user", "content": "What do 3 of my
                                usual items cost?"}], "user": "ann", "temperature": 0}
                                -> OpenAI's chat.completion (choices[0].message.content = the final answer)
                                   + "episode": {id, adapter_version, messages (tool calls and results), stop_reason}
    POST /v1/feedback           {"episode_id": ..., "user": "ann", "rating": 1 | -1, "correct_answer": "141"}
                                -> 201 {"id": ...} once it is on disk
    GET  /v1/models, /v1/status, /v1/episodes/{id}, /health, /  (the web page)
    POST /v1/admin/rollback {"version": 2}, /v1/admin/world {"items": ["key", "cake"]}   (Bearer admin token)

The agent's tools run here, in the world (``helpers.serve.world``): the caller sends a question and
gets the answer and the whole episode. ``model`` names the deployed adapter (``"tiny-agent"``) or pins a
version (``"tiny-agent@v0"``: the frozen copy the simulation compares with).

Bad input gets a 4xx that says what is wrong and changes nothing: a body over ``MAX_BODY_BYTES`` (413),
JSON that does not fit the schema or values out of range (422), an unknown episode or model (404),
feedback by someone other than the episode's caller (403), a second piece of feedback on one episode
(409), a caller over their rate (429, with Retry-After). Errors have OpenAI's shape,
``{"error": {"message", "type", "code"}}``.

Rate limits: a token bucket per user and endpoint (``RateLimits``): ``rate`` requests a second on
average, bursts of ``burst``. Simplification, named: the ``user`` field is taken at its word (no
accounts or keys); a deployment puts authentication in front and keys the buckets by account.
"""

from __future__ import annotations

import asyncio
import math
import secrets
import threading
import time
import uuid
from pathlib import Path
from typing import Literal

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, model_validator
from starlette.concurrency import run_in_threadpool

from helpers.formats import extract_answer, format_number, to_number
from helpers.serve.agent import AgentPool
from helpers.serve.config import ServiceConfig
from helpers.serve.store import DuplicateFeedback, EpisodeRecord, SQLiteStore, UnknownEpisode
from helpers.serve.world import WORLD_ITEMS_KEY, ServedShop
from helpers.worlds.shop.tasks import ITEMS

MAX_BODY_BYTES = 16_384  # a chat request of a few messages; feedback is far smaller
MAX_ANSWER_CHARS = 24  # a correct answer is a number
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
    user: str = Field("anonymous", min_length=1, max_length=64)
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
    user: str = Field(min_length=1, max_length=64)
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
    version: StrictInt = Field(ge=0)


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
    """A token bucket per (user, endpoint): ``rate`` tokens a second, at most ``burst`` saved up."""

    def __init__(self, rate: float, burst: int):
        self.rate, self.burst = rate, burst
        self.buckets: dict[tuple[str, str], tuple[float, float]] = {}  # key -> (tokens, time)
        self.lock = threading.Lock()

    def wait_time(self, user: str, endpoint: str) -> float:
        """0 and one token taken, or the seconds until the next token (nothing taken)."""
        now = time.monotonic()
        with self.lock:
            tokens, then = self.buckets.get((user, endpoint), (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - then) * self.rate)
            if tokens >= 1.0:
                self.buckets[(user, endpoint)] = (tokens - 1.0, now)
                return 0.0
            self.buckets[(user, endpoint)] = (tokens, now)
            return (1.0 - tokens) / self.rate


# --- the app -------------------------------------------------------------------------------------------


def error(status: int, message: str, kind: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status, headers=headers)


async def parse(request: Request, model: type[BaseModel]):
    """The request body as ``model``, or the 4xx response that says why not."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > MAX_BODY_BYTES):
        return error(413, f"body over {MAX_BODY_BYTES} bytes", "request_too_large")
    body = await request.body()
    if len(body) > MAX_BODY_BYTES:
        return error(413, f"body over {MAX_BODY_BYTES} bytes", "request_too_large")
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


def create_app(pool: AgentPool, store: SQLiteStore, config: ServiceConfig = ServiceConfig()) -> FastAPI:
    """The FastAPI app over one agent pool and one store (module docstring)."""
    app = FastAPI(title="workbook agent service", docs_url=None, redoc_url=None)
    limits = RateLimits(config.rate, config.burst)
    world = ServedShop(config.world_seed)
    world_lock = threading.Lock()  # the world's random draws, one request at a time

    def limited(user: str, endpoint: str) -> JSONResponse | None:
        wait = limits.wait_time(user, endpoint)
        if wait > 0:
            return error(429, f"user {user!r} is over {config.rate:g} {endpoint} requests a second", "rate_limit_exceeded",
                         {"Retry-After": str(max(1, math.ceil(wait)))})
        return None

    def admin(request: Request) -> JSONResponse | None:
        given = request.headers.get("authorization", "")
        if not config.admin_token or not secrets.compare_digest(given, f"Bearer {config.admin_token}"):
            return error(403, "admin endpoints need the server's admin token (--admin-token)", "permission_error")
        return None

    def resolve_model(name: str) -> int | None | JSONResponse:
        """None: the deployed version; an int: a pinned version; or the 404."""
        if name == config.name:
            return None
        prefix = f"{config.name}@v"
        if name.startswith(prefix) and name[len(prefix):].isdigit() and pool.known(int(name[len(prefix):])):
            return int(name[len(prefix):])
        return error(404, f"unknown model {name!r}; serve {config.name!r} (the deployed adapter) or "
                          f"'{prefix}N' for a stored version", "model_not_found")

    @app.get("/health")
    def health():
        return {"ok": True, "deployed": pool.deployed}

    @app.get("/", response_class=HTMLResponse)
    def page():
        return PAGE.read_text()

    @app.get("/v1/models")
    def models():
        versions = [{"id": f"{config.name}@v{a['version']}", "object": "model", "status": a["status"]} for a in store.adapters()]
        return {"object": "list", "data": [{"id": config.name, "object": "model", "deployed": pool.deployed}, *versions]}

    @app.get("/v1/status")
    def status():
        return {"deployed": pool.deployed, "world_items": pool.world_items, "adapters": store.adapters(),
                "deployments": store.deployments(), "swaps": pool.swaps, "feedback": store.feedback_count()}

    @app.get("/v1/episodes/{episode_id}")
    def get_episode(episode_id: str):
        try:
            return episode_view(store.episode(episode_id))
        except UnknownEpisode:
            return error(404, f"no episode {episode_id!r}", "not_found")

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        started = time.perf_counter()
        body = await parse(request, ChatRequest)
        if isinstance(body, JSONResponse):
            return body
        if (refused := limited(body.user, "chat")) is not None:
            return refused
        version = resolve_model(body.model)
        if isinstance(version, JSONResponse):
            return version
        question = [m.content for m in body.messages if m.role == "user"][-1]
        episode_id = f"ep-{uuid.uuid4().hex[:16]}"
        with world_lock:
            task = world.task(episode_id, body.user, question, pool.world_items)
        trajectory, served_by = await asyncio.wrap_future(pool.submit(task, version, body.temperature))
        reply, answer = final_reply(trajectory.messages)
        record = EpisodeRecord(
            id=episode_id, user=body.user, model=body.model, adapter_version=served_by, question=question, answer=answer,
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
        body = await parse(request, FeedbackRequest)
        if isinstance(body, JSONResponse):
            return body
        if (refused := limited(body.user, "feedback")) is not None:
            return refused
        try:
            record = await run_in_threadpool(store.episode, body.episode_id)
        except UnknownEpisode:
            return error(404, f"no episode {body.episode_id!r}", "not_found")
        if record.user != body.user:
            return error(403, "feedback on an episode is given by the user who asked", "permission_error")
        try:
            feedback_id = await run_in_threadpool(store.add_feedback, body.episode_id, body.user, body.rating, body.correct_answer)
        except DuplicateFeedback:
            return error(409, f"episode {body.episode_id!r} already has feedback", "conflict")
        return JSONResponse({"id": feedback_id, **body.model_dump()}, status_code=201)

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
