"""kill -9 of the server while feedback is being written: every acknowledged piece of feedback is in the store
after restart (helpers.serve.store: WAL + synchronous=FULL, the 201 only after the commit)."""

import threading
import time

import httpx

from helpers.serve.process import ServerProcess
from helpers.serve.store import EpisodeRecord, SQLiteStore

EPISODES = 2000  # more than the writers can acknowledge before the kill: they are still writing when it comes
WRITERS = 8


def fake_episode(i: int) -> EpisodeRecord:
    return EpisodeRecord(id=f"ep-{i:05d}", user=f"user-{i % WRITERS}", model="tiny-agent", adapter_version=0, question="q",
                         answer=str(i), stop_reason="answered", world={"item": "pen"}, truth=None, messages=[],
                         token_ids=[1, 2, 3], mask=[0, 1, 1], logprobs=[0.0, -0.5, -0.1], prompt_len=1, temperature=0.0,
                         latency_s=0.0)


def test_every_acknowledged_feedback_survives_kill_9(tmp_path):
    path = tmp_path / "store.db"
    store = SQLiteStore(path)
    for i in range(EPISODES):
        store.add_episode(fake_episode(i))
    store.close()

    acked: dict[str, tuple] = {}  # episode id -> (rating, correct answer) the server acknowledged with 201
    lock, stop = threading.Lock(), threading.Event()

    def writer(k: int, url: str) -> None:  # user-k, with their key (headers[k])
        with httpx.Client(timeout=5) as client:
            for i in range(k, EPISODES, WRITERS):
                if stop.is_set():
                    return
                body = {"episode_id": f"ep-{i:05d}", "user": f"user-{k}", "rating": 1 if i % 2 else -1, "correct_answer": str(i * 7)}
                try:
                    response = client.post(f"{url}/v1/feedback", json=body, headers=headers[k])
                except httpx.HTTPError:  # the kill: this one was never acknowledged
                    return
                if response.status_code == 201:
                    with lock:
                        acked[body["episode_id"]] = (body["rating"], body["correct_answer"])

    server = ServerProcess(path, extra=["--rate", "10000", "--burst", "10000"]).start()
    headers = [server.auth(f"user-{k}") for k in range(WRITERS)]
    threads = [threading.Thread(target=writer, args=(k, server.url)) for k in range(WRITERS)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 60
    while len(acked) < 150 and time.monotonic() < deadline:  # writes in full flow
        time.sleep(0.02)
    server.kill()  # SIGKILL mid-stream: requests in flight die with it
    stop.set()
    for thread in threads:
        thread.join()
    assert 150 <= len(acked) < EPISODES, "the kill came while feedback was still being written"

    store = SQLiteStore(path)  # a fresh open: SQLite recovers from its WAL
    stored = {row["episode_id"]: (row["rating"], row["correct_answer"]) for row in store.feedback_since(0, limit=EPISODES)}
    lost = {episode: value for episode, value in acked.items() if stored.get(episode) != value}
    assert not lost, f"{len(lost)} acknowledged feedback lost or changed, e.g. {list(lost.items())[:3]}"
    assert store._read("PRAGMA integrity_check")[0][0] == "ok"

    with ServerProcess(path) as restarted:  # and the restarted server serves on from the same store
        status = httpx.get(f"{restarted.url}/v1/status").json()
        assert status["feedback"] == len(stored) >= len(acked)
        episode = next(iter(acked))
        again = httpx.post(f"{restarted.url}/v1/feedback", json={"episode_id": episode, "rating": 1},
                           headers=restarted.auth(f"user-{int(episode[3:]) % WRITERS}"))
        assert again.status_code == 409  # the acknowledged feedback is there: a second one is a duplicate
