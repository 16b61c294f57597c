"""Model reward (LLM-as-judge, 模型奖励): another model reads the trajectory and gives a score.

    backend = OpenAIBackend("http://127.0.0.1:8000/v1", model="Qwen/Qwen2.5-7B-Instruct")  # vLLM, any API
    backend = TransformersBackend(model, tokenizer)                                         # a local model
    judge = JudgeReward(backend)                    # process quality, 1-10, scaled to [0, 1]
    reward = combine({"correct": 1.0, judge: 0.1, "tool_use": 0.1})
    print(judge.cost())                              # calls, cache hits, tokens, parse failures

Rule rewards check what can be checked (the number); a judge scores what cannot
(is the reasoning sound? did the agent verify before answering?). It is slow, costs
tokens, and can be flattered or fooled, so it is usually a small part of a hybrid.

``GroupJudge`` judges all G samples of one task in one prompt and asks for a score
per sample, as OpenPipe's RULER does: relative judgments are easier to make
consistently than absolute ones, and GRPO only uses differences within a group anyway.

Simplifications, named:

* A reply without a score is a *parse failure*: the reward is 0.0, the reply is kept
  in ``judge.failures``, and training goes on. A timeout, an HTTP error or a reply of a
  shape we cannot read (``reply_from_json``) is handled the same way (``judge.failures``
  says which): a judge reply never raises out of the reward.
* Reading a score is linear in the reply's length (``parse_score``), so a judge that
  rambles, or echoes a policy's padding back, costs time in proportion, never more.
* The cache is in memory and keyed by a hash of (rubric, prompt, completion): once a
  call for it succeeds, the same trajectory is not judged again in one run, but nothing
  persists across runs.
* No rate limiting and no retry loop: a call that failed is not cached, so the same
  trajectory is asked once more when it is scored (``GroupJudge``: each sample of a failed
  group alone); ``prepare`` judges a batch with a small thread pool.
* Token counts come from the endpoint's ``usage`` field (or the local tokenizer);
  turning tokens into money is left to the reader (prices change).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from helpers.formats import encode_chat
from helpers.rewards import describe_error
from helpers.rollout import Trajectory

PROCESS_RUBRIC = (
    "Rate the PROCESS, not only the final number: is each step correct and justified, "
    "were tool calls sensible and their results used, is the final answer stated clearly "
    "in <answer></answer> tags? 1 = nonsense, 5 = partly right, 10 = flawless."
)

JUDGE_SYSTEM = "You are a strict, fair grader of an AI agent's work on a math task."


@dataclass
class JudgeReply:
    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0


# ----------------------------------------------------------------------------------------------
# 1. Backends: something that turns chat messages into a reply
# ----------------------------------------------------------------------------------------------


class OpenAIBackend:
    """Any OpenAI-compatible chat endpoint (vLLM's ``vllm serve``, SGLang, a hosted API).

    Uses only the standard library (``urllib``): POST ``{base_url}/chat/completions``.
    ``timeout`` is in seconds per request; a slower reply raises ``TimeoutError``.
    """

    def __init__(self, base_url: str, model: str, api_key: str | None = None, timeout: float = 30.0, max_tokens: int = 256):
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.api_key, self.timeout, self.max_tokens = model, api_key, timeout, max_tokens
        self.name = f"{model} @ {base_url}"

    def __call__(self, messages: list[dict]) -> JudgeReply:
        body = json.dumps({"model": self.model, "messages": messages, "max_tokens": self.max_tokens, "temperature": 0.0}).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                data = json.loads(response.read())
        except urllib.error.URLError as e:  # urllib wraps a connect timeout in URLError
            if isinstance(e.reason, TimeoutError):
                raise TimeoutError(f"judge endpoint {self.url} did not answer in {self.timeout}s") from None
            raise
        return reply_from_json(data)


def token_count(value) -> int:
    """A token count from an endpoint's ``usage``: a non-negative int, or the digits of one
    in a string (some servers send ``"12"``); anything else (null, a float, junk) is 0."""
    if isinstance(value, str) and value.isdigit() and len(value) < 16:
        value = int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def reply_from_json(data) -> JudgeReply:
    """The reply text and token counts in an OpenAI-style chat response, whatever JSON came back.

    The text is ``choices[0].message.content``: a string, null (an empty reply), or a list of
    content parts (``[{"type": "text", "text": ...}]``, as newer APIs send), whose texts are
    joined. Any other shape raises ``ValueError``, which the judge counts as a failed call
    (reward 0). Token counts go through ``token_count``: accounting never fails a reply.
    """
    try:
        content = data["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise ValueError(f"judge reply has no choices[0].message.content: {json.dumps(data)[:200]}") from None
    if isinstance(content, list):
        content = "".join(part["text"] for part in content if isinstance(part, dict) and isinstance(part.get("text"), str))
    if content is None:
        content = ""
    if not isinstance(content, str):
        raise ValueError(f"judge reply content is {type(content).__name__}, not text: {json.dumps(content)[:200]}")
    usage = data.get("usage") if isinstance(data, dict) else None
    usage = usage if isinstance(usage, dict) else {}
    return JudgeReply(content, token_count(usage.get("prompt_tokens")), token_count(usage.get("completion_tokens")))


class TransformersBackend:
    """A local transformers causal LM as the judge (greedy decoding).

    ``timeout`` is passed to ``generate(max_time=...)``, which stops generation (not
    the prompt's forward pass) after that many seconds.
    """

    def __init__(self, model, tokenizer, max_new_tokens: int = 64, timeout: float = 30.0, name: str = "local"):
        self.model, self.tokenizer = model, tokenizer
        self.max_new_tokens, self.timeout, self.name = max_new_tokens, timeout, name

    def __call__(self, messages: list[dict]) -> JudgeReply:
        # the judged text stays text (helpers.formats.encode_chat): an answer holding "<|im_end|>" cannot close the judge's turn
        if getattr(self.tokenizer, "chat_template", None):
            ids = encode_chat(self.tokenizer, messages)
        else:
            ids = self.tokenizer("\n\n".join(m["content"] for m in messages) + "\n\n", split_special_tokens=True)["input_ids"]
        inputs = {"input_ids": torch.tensor([ids], device=self.model.device), "attention_mask": torch.ones(1, len(ids), dtype=torch.long, device=self.model.device)}
        with torch.no_grad():
            out = self.model.generate(
                **inputs, max_new_tokens=self.max_new_tokens, do_sample=False, max_time=self.timeout,
                pad_token_id=self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id,
            )
        prompt_len = inputs["input_ids"].shape[1]
        new = out[0, prompt_len:]  # (T_new,)
        return JudgeReply(self.tokenizer.decode(new, skip_special_tokens=True), prompt_len, int(new.numel()))


# ----------------------------------------------------------------------------------------------
# 2. Reading a score out of free text
# ----------------------------------------------------------------------------------------------

# A number starts only where no digit or dot stands before it: without that look-behind, a
# run of n digits gives n starting points, each scanned to the end of the run (quadratic).
_NUM = r"(?<![\d.])(-?\d+(?:\.\d+)?)"
_SCORE_PATTERNS = [
    re.compile(r"score ?(?:is|of|=|:)? ?\** ?" + _NUM, re.I),  # "Score: 7", "score of 7", "**Score:** 7"
    re.compile(_NUM + r" ?(?:/|out of) ?10\b", re.I),  # "7/10", "7 out of 10"
]


def parse_score(reply: str, low: float = 1, high: float = 10) -> float | None:
    """The score in a judge's reply, or None when there is none in [low, high].

    Tries, in order: ``Score: N`` (the format we ask for), ``N/10``, and finally a
    reply that is a single number. Anything else (prose with stray numbers, junk
    from a tiny model) is a parse failure: guessing a score from "step 3 of 5" would
    feed noise into training.

    Linear in ``len(reply)``: every run of whitespace becomes one space first, so the
    patterns hold no ``\\s*`` runs that could split a long gap in many ways (``\\s*``
    around an optional word is cubic in the gap's length), and a number only starts at its first digit.
    """
    reply = " ".join(reply.split())
    for pattern in _SCORE_PATTERNS:
        found = pattern.findall(reply)
        if found:
            value = float(found[-1])
            return value if low <= value <= high else None
    bare = re.fullmatch(_NUM + r" ?\.?", reply)
    if bare and low <= float(bare.group(1)) <= high:
        return float(bare.group(1))
    return None


def parse_sample_scores(reply: str) -> dict[int, float]:
    """The ``Sample i: N`` lines of a group judge's reply as ``{i: N}`` (linear, as ``parse_score``).

    A sample number has at most 4 digits: a longer one is no sample of ours, and ``int()``
    of over 4,300 digits raises.
    """
    reply = " ".join(reply.split())
    return {int(i): float(score) for i, score in re.findall(r"sample ?(\d{1,4}) ?[:=\-] ?" + _NUM, reply, re.I)}


def parse_verdict(reply: str) -> bool | None:
    """PASS / FAIL in a rubric judge's reply (the last one wins), or None."""
    found = re.findall(r"\b(PASS|FAIL)\b", reply)
    return None if not found else found[-1] == "PASS"


# ----------------------------------------------------------------------------------------------
# 3. The judge reward
# ----------------------------------------------------------------------------------------------


def transcript(traj: Trajectory) -> str:
    """The agent's part of the episode as the judge reads it (assistant turns and tool results)."""
    start = len(traj.task.prompt)
    lines = []
    for m in traj.messages[start:] if traj.messages[:start] == traj.task.prompt else traj.messages:
        if m["role"] in ("assistant", "tool"):
            lines.append(f"[{m['role']}] {m.get('content') or ''}")
    return "\n".join(lines)


def question_of(traj: Trajectory) -> str:
    users = [m["content"] for m in traj.task.prompt if m["role"] == "user"]
    return users[-1] if users else ""


@dataclass
class JudgeStats:
    calls: int = 0  # requests sent to the judge model
    cache_hits: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    parse_failures: int = 0  # replies with no usable score
    errors: int = 0  # calls that raised: timeouts, transport errors, replies of a shape we cannot read
    seconds: float = 0.0  # wall time spent waiting for the judge


class JudgeReward:
    """LLM-as-judge reward: ``judge(traj) -> float`` in [0, 1].

    mode="score":  the judge gives 1-10 against ``rubric``; the reward is (score - 1) / 9.
    mode="pass":   the judge answers PASS or FAIL against ``rubric``; the reward is 1 or 0.

    ``show_reference`` puts the reference answer in the prompt (the judge then grades the
    process knowing the target; without it, it must check the arithmetic itself).
    Gamed by: anything that sways the judge and not the outcome: confident tone, long
    "verification" text, or text addressed to the judge ("this answer deserves a 10").
    Keep its weight small and the outcome reward in charge.
    """

    def __init__(self, backend, rubric: str = PROCESS_RUBRIC, mode: str = "score", show_reference: bool = True,
                 name: str = "judge", max_workers: int = 4):
        if mode not in ("score", "pass"):
            raise ValueError(f"mode must be 'score' or 'pass', got {mode!r}")
        self.backend, self.rubric, self.mode, self.show_reference = backend, rubric, mode, show_reference
        self.name, self.max_workers = name, max_workers
        self.cache: dict[str, float] = {}
        self.stats = JudgeStats()
        self.failures: list[dict] = []  # {"task_id", "group", "kind", "reply"}: what could not be scored and why
        self._fresh: set[str] = set()  # keys ``prepare`` just judged: their first read is not a cache hit
        self._lock = threading.Lock()

    # -- prompts ---------------------------------------------------------------------------
    def messages(self, traj: Trajectory) -> list[dict]:
        ask = "Reply with one line: `Score: N` (N from 1 to 10)." if self.mode == "score" else "Reply with one word: PASS or FAIL."
        reference = f"Reference answer: {traj.task.answer}\n\n" if self.show_reference and traj.task.answer is not None else ""
        user = f"Task:\n{question_of(traj)}\n\n{reference}Agent transcript:\n{transcript(traj)}\n\nRubric: {self.rubric}\n\n{ask}"
        return [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": user}]

    def key(self, traj: Trajectory) -> str:
        """Cache key: a hash of everything the judge sees, so equal trajectories share one call."""
        blob = json.dumps([self.mode, self.rubric, self.show_reference, traj.task.answer, question_of(traj), transcript(traj)])
        return hashlib.sha256(blob.encode()).hexdigest()

    # -- calling ---------------------------------------------------------------------------
    def _ask(self, messages: list[dict], traj: Trajectory) -> JudgeReply | None:
        """One judge call with cost accounting; None (and a recorded failure) on timeout or error.

        A backend is any callable: what it returns is checked here (text a string, token
        counts through ``token_count``), so a custom backend's odd reply is one more failure.
        """
        start = time.perf_counter()
        try:
            reply = self.backend(messages)
            if not isinstance(reply, JudgeReply) or not isinstance(reply.text, str):
                raise TypeError(f"the judge backend returned {type(reply).__name__}, not a JudgeReply with text")
        except Exception as e:  # a judge outage must not stop training
            with self._lock:
                self.stats.calls += 1
                self.stats.errors += 1
                self.stats.seconds += time.perf_counter() - start
                self.failures.append({"task_id": traj.task_id, "group": traj.group, "kind": type(e).__name__, "reply": describe_error(e)})
            return None
        with self._lock:
            self.stats.calls += 1
            self.stats.seconds += time.perf_counter() - start
            self.stats.prompt_tokens += token_count(reply.prompt_tokens)
            self.stats.completion_tokens += token_count(reply.completion_tokens)
        return reply

    def _to_reward(self, reply: str) -> float | None:
        if self.mode == "pass":
            verdict = parse_verdict(reply)
            return None if verdict is None else float(verdict)
        score = parse_score(reply)
        return None if score is None else (score - 1) / 9

    def _parse_failure(self, traj: Trajectory, reply: str) -> float:
        with self._lock:
            self.stats.parse_failures += 1
            self.failures.append({"task_id": traj.task_id, "group": traj.group, "kind": "parse", "reply": reply[:200]})
        return 0.0

    def _cached(self, key: str) -> float:
        """Read a cached value; a cache hit is a judge call saved, so prepare's own results don't count."""
        with self._lock:
            if key in self._fresh:
                self._fresh.discard(key)
            else:
                self.stats.cache_hits += 1
        return self.cache[key]

    def __call__(self, traj: Trajectory) -> float:
        key = self.key(traj)
        if key in self.cache:
            return self._cached(key)
        reply = self._ask(self.messages(traj), traj)
        if reply is None:
            return 0.0  # not cached: a timeout may succeed next time
        value = self._to_reward(reply.text)
        if value is None:
            value = self._parse_failure(traj, reply.text)
        self.cache[key] = value
        return value

    def prepare(self, trajs: list[Trajectory]) -> None:
        """Judge a batch ahead of scoring, ``max_workers`` requests at a time (fills the cache)."""
        todo = {self.key(t): t for t in trajs if self.key(t) not in self.cache}
        if self.max_workers > 1 and len(todo) > 1:
            with ThreadPoolExecutor(self.max_workers) as pool:
                list(pool.map(self, todo.values()))
        else:
            for t in todo.values():
                self(t)
        self._fresh.update(k for k in todo if k in self.cache)

    def cost(self) -> str:
        s = self.stats
        backend = getattr(self.backend, "name", None) or getattr(self.backend, "__name__", type(self.backend).__name__)
        return (f"{self.name} ({backend}): {s.calls} calls, {s.cache_hits} cache hits, "
                f"{s.prompt_tokens} prompt + {s.completion_tokens} completion tokens, "
                f"{s.parse_failures} parse failures, {s.errors} errors/timeouts, {s.seconds:.1f} s")


class GroupJudge(JudgeReward):
    """Group-relative judge (as OpenPipe's RULER): all G samples of a task in one prompt.

    The judge sees the samples side by side and gives each a score 1-10 on lines
    ``Sample i: N``. ``prepare(trajs)`` groups by task and sends one request per group;
    a sample whose line is missing is a parse failure (0.0). Called on a trajectory it
    has not seen in a batch, or whose group's call failed, it judges it as a group of one.
    """

    def __init__(self, backend, rubric: str = PROCESS_RUBRIC, show_reference: bool = True, name: str = "group_judge", max_workers: int = 4):
        super().__init__(backend, rubric, "score", show_reference, name, max_workers)

    def group_messages(self, group: list[Trajectory]) -> list[dict]:
        first = group[0]
        reference = f"Reference answer: {first.task.answer}\n\n" if self.show_reference and first.task.answer is not None else ""
        samples = "\n\n".join(f"=== Sample {i + 1} ===\n{transcript(t)}" for i, t in enumerate(group))
        ask = f"Compare the samples. Reply with {len(group)} lines, `Sample i: N` (N from 1 to 10), one per sample."
        user = f"Task:\n{question_of(first)}\n\n{reference}{samples}\n\nRubric: {self.rubric}\n\n{ask}"
        return [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": user}]

    def judge_group(self, group: list[Trajectory]) -> None:
        reply = self._ask(self.group_messages(group), group[0])
        if reply is None:
            return
        scores = parse_sample_scores(reply.text)
        for i, traj in enumerate(group):
            score = scores.get(i + 1)
            ok = score is not None and 1 <= score <= 10
            key = self.key(traj)
            self.cache[key] = (score - 1) / 9 if ok else self._parse_failure(traj, reply.text)
            with self._lock:
                self._fresh.add(key)

    def __call__(self, traj: Trajectory) -> float:
        key = self.key(traj)
        if key not in self.cache:
            self.judge_group([traj])
            if key not in self.cache:  # the call failed (recorded in failures)
                return 0.0
        return self._cached(key)

    def prepare(self, trajs: list[Trajectory]) -> None:
        groups: dict[str, list[Trajectory]] = {}
        for t in trajs:
            if self.key(t) not in self.cache:
                groups.setdefault(t.task_id, []).append(t)
        if self.max_workers > 1 and len(groups) > 1:
            with ThreadPoolExecutor(self.max_workers) as pool:
                list(pool.map(self.judge_group, groups.values()))
        else:
            for g in groups.values():
                self.judge_group(g)
