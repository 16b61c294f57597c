"""A loopback load test across a hot swap: N clients ask at once for a bounded time while a new adapter is deployed.

    python -m helpers.serve loadtest --clients 32 --seconds 30     # a fresh server and store in runs/serve-loadtest/
    report = load_test(server.url, deploy, clients=32, seconds=30, auth=server.auth)  # -> {"requests", "failed", "p50_s", ...}

Each client is a thread with its own user and key, asking the shop question again and again (greedy) until
the time is up. Halfway through, a new adapter version (written before the start) is registered and deployed:
the server's watcher loads it beside the serving one and swaps (``helpers.serve.agent``). The report
counts every request that did not come back 200 as failed, and the versions that served the requests
before and after the swap (``versions_before_swap``, ``versions_after_swap``), so a swap that failed or
stalled requests shows in it.
"""

from __future__ import annotations

import statistics
import threading
import time
from pathlib import Path

import torch
from peft import get_peft_model

import helpers.worlds  # noqa: F401  (registers the tiny-agent preset)
from helpers.config import get_preset
from helpers.grpo import lora_config
from helpers.policy import load_model, quiet_peft
from helpers.serve.process import ServerProcess
from helpers.serve.store import SQLiteStore

QUESTION = "What do 3 of my usual items cost?"


def perturbed_adapter(config, directory: Path, seed: int = 0, scale: float = 0.02) -> Path:
    """A LoRA adapter on the preset's model with small random weights: a new version that answers a little
    differently (what an update looks like to the server)."""
    model, _ = load_model(config)
    with quiet_peft():
        model = get_peft_model(model, lora_config(config))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * scale)
    model.save_pretrained(directory)
    return directory


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def load_test(url: str, deploy_new_version, clients: int = 32, seconds: float = 30.0, auth=None) -> dict:
    """``clients`` threads asking for ``seconds``; ``deploy_new_version()`` is called at half time and returns
    the version it deployed; ``auth(user)`` gives a user's key header (``ServerProcess.auth``). Returns the report
    (module docstring)."""
    import httpx  # optional (the 'serve' extra): only a load test's clients need it

    results: list[tuple[float, float, int, int | None]] = []  # (start, latency, status, version)
    lock = threading.Lock()
    headers = [auth(f"load-{k}") if auth else {} for k in range(clients)]  # the keys made before the clock starts
    end = time.monotonic() + seconds

    def client(k: int) -> None:
        body = {"model": "tiny-agent", "temperature": 0, "messages": [{"role": "user", "content": QUESTION}]}
        with httpx.Client(timeout=120, headers=headers[k]) as http:
            while time.monotonic() < end:
                start = time.monotonic()
                try:
                    response = http.post(f"{url}/v1/chat/completions", json=body)
                    status = response.status_code
                    version = response.json()["episode"]["adapter_version"] if status == 200 else None
                except httpx.HTTPError:
                    status, version = 0, None
                with lock:
                    results.append((start, time.monotonic() - start, status, version))

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for thread in threads:
        thread.start()
    time.sleep(seconds / 2)
    swap_at = time.monotonic()
    new_version = deploy_new_version()
    for thread in threads:
        thread.join()
    latencies = [latency for _, latency, status, _ in results if status == 200]
    return {
        "clients": clients, "seconds": seconds, "requests": len(results),
        "failed": sum(status != 200 for _, _, status, _ in results),
        "p50_s": percentile(latencies, 50) if latencies else None, "p95_s": percentile(latencies, 95) if latencies else None,
        "max_s": max(latencies) if latencies else None, "new_version": new_version,
        "versions_before_swap": sorted({v for start, _, s, v in results if s == 200 and start < swap_at}),
        "versions_after_swap": sorted({v for start, _, s, v in results if s == 200 and start >= swap_at}),
        "requests_per_s": len(results) / seconds,
    }


def run_load_test(store_path: Path, clients: int, seconds: float, adapter: str | None = None) -> dict:
    """A fresh server on ``store_path`` (the preset's model, or ``adapter``), the load test, the report."""
    store_path = Path(store_path)
    config = get_preset("tiny-agent")
    new_dir = perturbed_adapter(config, store_path.parent / "adapters" / "loadtest-new")
    with ServerProcess(store_path, adapter=adapter, extra=["--rate", "100000", "--burst", "100000"]) as server:
        store = SQLiteStore(store_path)

        def deploy() -> int:
            version = store.add_adapter(str(new_dir), store.deployed()[0], None, None, "deployed", "load test: a new version mid-load")
            store.deploy(version, "load test")
            return version

        return load_test(server.url, deploy, clients, seconds, auth=server.auth)
