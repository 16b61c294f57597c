"""The served agent: loaded adapter versions, one worker that batches requests, and the hot swap.

    pool = AgentPool(config, store)            # loads the deployed version (store.deployed())
    pool.start()                               # the worker thread and the watcher thread
    trajectory, version = pool.submit(task, version=None, temperature=0.0).result()

Batching. Requests wait in one queue; the worker takes every request waiting (up to ``max_batch``)
and runs them as ONE ``helpers.rollout.rollout`` call, one episode per request: the same rollout that
training uses, so a served episode has exactly a training episode's token ids, mask and sampling
log-probs. Thirty-two callers at once cost about one batched episode, not thirty-two.

Hot swap. A watcher thread polls the store's deployed pointer. When it moves (the trainer deployed a
version, or an operator rolled back), the watcher loads that adapter into a new policy *beside* the
serving one, then replaces one reference. The worker reads the reference once per batch, so a batch
in flight finishes on the weights it started with, the next batch runs on the new ones, and no
request waits for the load or fails because of it. Old versions are dropped (the frozen copy a
caller pins, ``model@v0``, is loaded again when asked for).

The queue is bounded (``max_queue``): a request that finds it full is refused at once (``QueueFull``, a 429 with
Retry-After), not queued behind minutes of work while its memory and its caller wait; callers beyond what the
worker can serve are told to come back, and the server's memory does not grow with them.

Simplifications, named: one worker, so batches run one after another (a long batch delays the next
one; vLLM's continuous batching does better on a GPU); all requests of a batch share one turn budget
(the server's); requests of different temperatures or versions in one batch run as separate rollouts.
"""

from __future__ import annotations

import concurrent.futures as cf
import copy
import math
import queue
import threading
import time
from dataclasses import dataclass

from helpers.config import TrainConfig
from helpers.data import Task
from helpers.policy import SamplingParams, load_adapter, load_model, make_policy
from helpers.rollout import Trajectory, rollout
from helpers.serve.store import SQLiteStore
from helpers.serve.world import WORLD_ITEMS_KEY
from helpers.worlds.shop.env import ShopEnv

KEEP_VERSIONS = 3  # loaded versions kept besides the deployed one (pinned callers' versions)


class QueueFull(Exception):
    """The worker's queue holds ``max_queue`` requests: come back in ``retry_after`` seconds (about one batch)."""

    def __init__(self, waiting: int, retry_after: int):
        super().__init__(f"{waiting} requests waiting; retry in {retry_after} s")
        self.waiting, self.retry_after = waiting, retry_after


@dataclass
class Pending:
    task: Task
    version: int | None  # None: whatever is deployed when the batch starts
    temperature: float
    future: cf.Future


def load_policy(config: TrainConfig, base_model, tokenizer, adapter_dir: str | None):
    """A rollout policy on a copy of ``base_model`` with the adapter in ``adapter_dir`` (None or "": the base alone)."""
    model = copy.deepcopy(base_model)
    model = load_adapter(model, adapter_dir) if adapter_dir else model.eval()
    return make_policy(config, model, tokenizer)


class AgentPool:
    """Adapter versions ready to serve, and the worker that serves them (module docstring)."""

    def __init__(self, config: TrainConfig, store: SQLiteStore, max_batch: int = 64, poll_s: float = 0.5, max_queue: int = 256):
        self.config, self.store, self.max_batch, self.poll_s, self.max_queue = config, store, max_batch, poll_s, max_queue
        self.base_model, self.tokenizer = load_model(config)
        self.lock = threading.Lock()  # guards self.policies (the worker reads, the watcher writes)
        self.policies: dict[int, object] = {}
        self.deployed, path = store.deployed()
        self.policies[self.deployed] = load_policy(config, self.base_model, self.tokenizer, path)
        self.world_items: list[str] | None = store.get_setting(WORLD_ITEMS_KEY)  # what customers buy now (None: all)
        self.swaps: list[tuple[float, int]] = []  # (time, version) of every swap, for the status page
        self.queue: queue.Queue = queue.Queue()  # bounded by submit (max_queue), so that stop's None always fits
        self.submitting = threading.Lock()  # the size check and the put, as one step
        self.batch_s = 1.0  # how long the last batch took: a full queue's Retry-After
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._work, name="agent-worker", daemon=True),
                        threading.Thread(target=self._watch, name="agent-watcher", daemon=True)]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self.queue.put(None)

    def submit(self, task: Task, version: int | None, temperature: float) -> cf.Future:
        """Queue one request; the future gives ``(trajectory, version that served it)``. Raises ``QueueFull`` when
        ``max_queue`` requests wait already."""
        future: cf.Future = cf.Future()
        with self.submitting:
            waiting = self.queue.qsize()
            if waiting >= self.max_queue:
                raise QueueFull(waiting, max(1, math.ceil(self.batch_s)))
            self.queue.put(Pending(task, version, temperature, future))
        return future

    def known(self, version: int) -> bool:
        try:
            self.store.adapter_path(version)
            return True
        except KeyError:
            return False

    # --- the worker: batches of requests through one rollout ---------------------------------------

    def _work(self) -> None:
        while not self.stopping.is_set():
            first = self.queue.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < self.max_batch:
                try:
                    item = self.queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self.stopping.set()
                    break
                batch.append(item)
            started = time.monotonic()
            deployed = self.deployed  # read once: this batch runs on the version deployed now
            groups: dict[tuple[int, float], list[Pending]] = {}
            for item in batch:
                groups.setdefault((deployed if item.version is None else item.version, item.temperature), []).append(item)
            for (version, temperature), items in groups.items():
                try:
                    trajectories = self._run(version, temperature, [item.task for item in items])
                except Exception as error:  # a bad request must not kill the worker: its callers get the error
                    for item in items:
                        item.future.set_exception(error)
                    continue
                for item, trajectory in zip(items, trajectories):
                    item.future.set_result((trajectory, version))
            self.batch_s = time.monotonic() - started

    def _run(self, version: int, temperature: float, tasks: list[Task]) -> list[Trajectory]:
        policy = self._policy(version)
        c = self.config
        sampling = SamplingParams(c.max_new_tokens, temperature, c.top_p)
        return list(rollout(tasks, ShopEnv, policy, group_size=1, sampling=sampling, max_steps=c.env_max_steps,
                            max_total_tokens=c.max_total_tokens, progress=False))

    def _policy(self, version: int):
        with self.lock:
            policy = self.policies.get(version)
        if policy is None:  # a pinned version not in memory: load it (this batch waits; the next ones do not)
            policy = load_policy(self.config, self.base_model, self.tokenizer, self.store.adapter_path(version))
            with self.lock:
                self.policies[version] = policy
                self._evict()
        return policy

    def _evict(self) -> None:
        """Keep the deployed version and the ``KEEP_VERSIONS`` most recent others (the caller holds the lock)."""
        others = sorted(v for v in self.policies if v != self.deployed)
        for version in others[:-KEEP_VERSIONS] if len(others) > KEEP_VERSIONS else []:
            del self.policies[version]

    # --- the watcher: follow the store's deployed pointer and the world's habits ------------------

    def _watch(self) -> None:
        while not self.stopping.wait(self.poll_s):
            try:
                self.poll()
            except Exception as error:  # a failed load keeps the serving version; the next poll tries again
                print(f"agent-watcher: {type(error).__name__}: {error}", flush=True)

    def poll(self) -> None:
        """Swap to the store's deployed version if it moved (loaded beside the serving one, then one reference
        replaced); read what the world's customers buy now."""
        self.world_items = self.store.get_setting(WORLD_ITEMS_KEY)
        version, path = self.store.deployed()
        if version == self.deployed:
            return
        with self.lock:
            policy = self.policies.get(version)
        if policy is None:
            policy = load_policy(self.config, self.base_model, self.tokenizer, path)  # the worker keeps serving meanwhile
        with self.lock:
            self.policies[version] = policy
            self.deployed = version
            self._evict()
        self.swaps.append((time.time(), version))
