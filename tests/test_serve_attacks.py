"""The served agent under the attacks of issue 62 that its HTTP side answers (helpers.serve.app): no key, another
user's name, another user's episode, a web page's text/plain POST, a foreign Host, a 100 MB streamed body, the
requests that were 500s, a full queue, refused versions and file paths. Each test is one attack, tried as a caller
would, on a real server process."""

import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from helpers.serve.app import RateLimits
from helpers.serve.process import ServerProcess
from helpers.serve.store import SQLiteStore

QUESTION = {"role": "user", "content": "What do 3 of my usual items cost?"}
MB = 2**20


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    store = tmp_path_factory.mktemp("attacks") / "store.db"
    # one request in the worker's queue at most, one per batch: two chats at once fill it (the queue test)
    extra = ["--rate", "100", "--burst", "100", "--allow-host", "agent.example", "--max-queue", "1", "--max-batch", "1"]
    with ServerProcess(store, extra=extra) as server:
        yield server


def chat(server, headers: dict | None, **extra) -> httpx.Response:
    body = {"model": "tiny-agent", "temperature": 0, "messages": [QUESTION], **extra}
    return httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=headers, timeout=60)


def feedback(server, headers: dict | None, **body) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/feedback", json=body, headers=headers, timeout=60)


def counts(server) -> tuple[int, int]:
    store = SQLiteStore(server.store_path)
    return len(store.episodes()), store.feedback_count()


def key_command(server, *args: str) -> str:
    """``python -m helpers.serve key --store ... ARGS``: its last line."""
    done = subprocess.run([sys.executable, "-m", "helpers.serve", "key", "--store", str(server.store_path), *args],
                          capture_output=True, text=True, timeout=120, check=True)
    return done.stdout.strip().splitlines()[-1]


def test_without_a_valid_key_chat_and_feedback_get_401_and_nothing_is_stored(server):
    episode = chat(server, server.auth("ann")).json()["episode"]["id"]
    before = counts(server)
    refused = [chat(server, None), feedback(server, None, episode_id=episode, rating=1),
               chat(server, {"Authorization": "Bearer wb-guessed"}), chat(server, {"Authorization": "Basic YW5uOmFubg=="}),
               chat(server, {"Authorization": b"Bearer wb-\xb2\xb2"}),  # not ASCII
               chat(server, {"Authorization": "Bearer " + "k" * 10_000}),  # oversized
               httpx.get(f"{server.url}/v1/episodes/{episode}")]
    assert [r.status_code for r in refused] == [401] * len(refused), [r.text for r in refused]
    assert refused[0].headers["www-authenticate"] == "Bearer" and "helpers.serve key" in refused[0].json()["error"]["message"]
    assert counts(server) == before

    key = key_command(server, "--user", "carl")  # the command prints the new key as its last line
    assert chat(server, {"Authorization": f"Bearer {key}"}).status_code == 200
    assert "revoked 1 key" in key_command(server, "--user", "carl", "--revoke")
    assert chat(server, {"Authorization": f"Bearer {key}"}).status_code == 401  # withdrawn, at once


def test_a_key_speaks_only_for_its_own_user(server):
    ann, victor, mallory = server.auth("ann"), server.auth("victor"), server.auth("mallory")
    before = counts(server)
    as_victor = chat(server, mallory, user="victor")  # mallory's key, victor's name in the body
    assert as_victor.status_code == 403 and "mallory" in as_victor.json()["error"]["message"]
    theirs = chat(server, victor).json()["episode"]["id"]
    assert counts(server)[0] == before[0] + 1
    framed = [feedback(server, mallory, episode_id=theirs, rating=-1, correct_answer="1"),  # on victor's episode
              feedback(server, mallory, episode_id=theirs, user="victor", rating=-1, correct_answer="1")]  # ... in his name
    assert [r.status_code for r in framed] == [403, 403], [r.text for r in framed]
    assert counts(server)[1] == before[1]  # none of it stored
    mine = chat(server, ann, user="ann")  # repeating one's own name is fine
    assert mine.status_code == 200
    assert SQLiteStore(server.store_path).episode(mine.json()["episode"]["id"]).user == "ann"
    given = feedback(server, victor, episode_id=theirs, rating=1)
    assert given.status_code == 201 and given.json()["user"] == "victor"


def test_a_web_page_cannot_post_text_plain_or_a_form(server):
    ann, before = server.auth("ann"), counts(server)
    body = b'{"model": "tiny-agent", "temperature": 0, "messages": [{"role": "user", "content": "What do 3 of my usual items cost?"}]}'
    for content_type in ("text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded", "multipart/form-data", None):
        headers = {**ann, **({"Content-Type": content_type} if content_type else {})}
        response = httpx.post(f"{server.url}/v1/chat/completions", content=body, headers=headers, timeout=60)
        assert response.status_code == 415, (content_type, response.text)
    assert counts(server) == before
    json_utf8 = httpx.post(f"{server.url}/v1/chat/completions", content=body, timeout=60,
                           headers={**ann, "Content-Type": "application/json; charset=utf-8"})
    assert json_utf8.status_code == 200


def test_a_foreign_host_is_refused_before_any_route(server):
    for host in ("evil.example.com", f"evil.example.com:{server.port}", "127.0.0.1.evil.example", "", "localhost."):
        status = httpx.get(f"{server.url}/v1/status", headers={"Host": host})
        assert status.status_code == 421, (host, status.text)
    posted = chat(server, {**server.auth("ann"), "Host": "attacker.example"})  # DNS rebinding: the page's own name
    assert posted.status_code == 421
    for host in (f"127.0.0.1:{server.port}", f"localhost:{server.port}", f"[::1]:{server.port}", "agent.example"):
        assert httpx.get(f"{server.url}/v1/status", headers={"Host": host}).status_code == 200, host  # agent.example: --allow-host


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the server's memory from /proc")
def test_a_100_mb_chunked_body_is_refused_as_it_streams_and_the_server_does_not_grow(server):
    pid, sent, peak = server.process.pid, [0], [0]
    start = rss_bytes(pid)
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss_bytes(pid))
            time.sleep(0.002)

    def body():  # no Content-Length: httpx sends it chunked, the way the 200 MB POST of the issue came
        for _ in range(100 * MB // (64 * 1024)):
            sent[0] += 64 * 1024
            yield b"x" * (64 * 1024)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        response = httpx.post(f"{server.url}/v1/feedback", content=body(), timeout=120,
                              headers={**server.auth("ann"), "Content-Type": "application/json"})
    finally:
        done.set()
        sampler.join()
    assert response.status_code == 413 and "bytes" in response.json()["error"]["message"]
    growth = peak[0] - start
    print(f"streamed {sent[0] / MB:.1f} MB before the refusal; the server's RSS grew {growth / MB:.1f} MB at most")
    assert growth < 40 * MB
    assert chat(server, server.auth("ann")).status_code == 200  # and it serves on


def test_bad_requests_are_4xx_never_500(server):
    ann, admin = server.auth("ann"), {"Authorization": f"Bearer {server.admin_token}"}
    url = server.url
    responses = {
        "admin, non-ASCII token": httpx.post(f"{url}/v1/admin/rollback", json={"version": 0}, headers={"Authorization": b"Bearer \xb2"}),
        "admin, oversized token": httpx.post(f"{url}/v1/admin/rollback", json={"version": 0},
                                             headers={"Authorization": "Bearer " + "t" * 100_000}),
        "chat, non-ASCII key": chat(server, {"Authorization": "Bearer wb-é".encode("latin-1")}),
        "model v²": chat(server, ann, model="tiny-agent@v²"),
        "model v + 40 nines": chat(server, ann, model="tiny-agent@v" + "9" * 40),
        "model v-1": chat(server, ann, model="tiny-agent@v-1"),
        "model v٣ (Arabic-Indic 3)": chat(server, ann, model="tiny-agent@v٣"),
        "rollback 10**40": httpx.post(f"{url}/v1/admin/rollback", json={"version": 10**40}, headers=admin),
        "rollback 2**63": httpx.post(f"{url}/v1/admin/rollback", json={"version": 2**63}, headers=admin),
        "rollback -1": httpx.post(f"{url}/v1/admin/rollback", json={"version": -1}, headers=admin),
        "rollback 999": httpx.post(f"{url}/v1/admin/rollback", json={"version": 999}, headers=admin),
        "rating 10**40": feedback(server, ann, episode_id="ep-x", rating=10**40),
        "episode id an int": feedback(server, ann, episode_id=10**40, rating=1),
        "temperature 1e400": httpx.post(f"{url}/v1/chat/completions", headers={**ann, "Content-Type": "application/json"},
                                        content=b'{"temperature": 1e400, "messages": [{"role": "user", "content": "hi"}]}'),
        "a lone surrogate": httpx.post(f"{url}/v1/chat/completions", headers={**ann, "Content-Type": "application/json"},
                                       content=b'{"messages": [{"role": "user", "content": "cost \\ud800?"}]}'),
        "a JSON array": httpx.post(f"{url}/v1/feedback", json=[1] * 1000, headers=ann),
    }
    statuses = {name: r.status_code for name, r in responses.items()}
    assert all(400 <= s < 500 for s in statuses.values()), statuses
    assert statuses["model v + 40 nines"] == statuses["model v²"] == 404 and statuses["rollback 10**40"] == 422
    assert httpx.get(f"{url}/health").status_code == 200


def test_refused_versions_cannot_be_pinned_and_status_shows_no_paths(server):
    store = SQLiteStore(server.store_path)
    refused = store.add_adapter("/srv/secret-adapters/u1", 0, 0.1, 0.9, "refused", "a test: refused by the canary gate")
    pinned = chat(server, server.auth("ann"), model=f"tiny-agent@v{refused}")
    assert pinned.status_code == 404 and "refused" in pinned.json()["error"]["message"]
    assert f"tiny-agent@v{refused}" not in httpx.get(f"{server.url}/v1/models").text
    assert chat(server, server.auth("ann"), model="tiny-agent@v0").status_code == 200  # a deployed one still can be
    status = httpx.get(f"{server.url}/v1/status")
    assert status.status_code == 200 and status.json()["adapters"][refused]["status"] == "refused"
    assert "secret-adapters" not in status.text and str(server.store_path.parent) not in status.text
    assert all("path" not in row for row in status.json()["adapters"])


def test_a_full_queue_gets_429_with_retry_after(server):
    headers = [server.auth(f"crowd-{k}") for k in range(8)]
    results: list[httpx.Response] = []

    def one(k: int) -> None:
        results.append(chat(server, headers[k]))

    threads = [threading.Thread(target=one, args=(k,)) for k in range(8)]  # one in the worker, one waiting, the rest refused
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    statuses = sorted(r.status_code for r in results)
    assert set(statuses) == {200, 429} and statuses.count(200) >= 2, statuses
    busy = next(r for r in results if r.status_code == 429)
    assert int(busy.headers["retry-after"]) >= 1 and busy.json()["error"]["type"] == "server_busy"


def test_the_rate_limit_table_stays_bounded():
    limits = RateLimits(rate=0.001, burst=1, max_buckets=100)
    for k in range(10_000):  # 10 000 names, one request each
        assert limits.wait_time(f"name-{k}", "chat") == 0.0
    assert len(limits.buckets) == 100
    assert limits.wait_time("name-9999", "chat") > 0  # the recent ones are still limited


def test_the_admin_token_is_random_and_never_on_a_command_line(server, tmp_path):
    tokens = {ServerProcess(tmp_path / "s.db").admin_token for _ in range(3)}
    assert len(tokens) == 3 and all(len(t) >= 32 for t in tokens)
    command_line = Path(f"/proc/{server.process.pid}/cmdline").read_bytes() if Path("/proc").is_dir() else b""
    assert server.admin_token.encode() not in command_line and server.admin_token not in server.args
    assert server.admin("world", {"items": None}) == {"items": None}  # the server has it (from its environment)
    refused = subprocess.run([sys.executable, "-m", "helpers.serve", "--admin-token", "a-token-in-ps"],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "WORKBOOK_ADMIN_TOKEN" in refused.stderr


def test_the_admin_token_file_is_read_and_a_guessable_token_refused(tmp_path, monkeypatch):
    from helpers.serve.__main__ import read_admin_token

    token = tmp_path / "admin-token"
    token.write_text("s3cret-token-of-32-characters-xx\n")
    assert read_admin_token(str(token)) == "s3cret-token-of-32-characters-xx"
    monkeypatch.setenv("WORKBOOK_ADMIN_TOKEN", "from-the-environment-0123")
    assert read_admin_token("") == "from-the-environment-0123"
    for bad in ("short", "with a space in it, long enough", "nön-ascii-token-long-enough"):
        token.write_text(bad)
        with pytest.raises(SystemExit, match="admin token must be"):
            read_admin_token(str(token))
    monkeypatch.delenv("WORKBOOK_ADMIN_TOKEN")
    assert read_admin_token("") == ""  # the admin routes off


def test_the_key_command_refuses_a_name_it_cannot_store_in_one_line(tmp_path):
    from helpers.serve.__main__ import main as serve_main

    with pytest.raises(SystemExit, match=r"^python -m helpers.serve key: user 'a b': give 1 to 64"):
        serve_main(["key", "--store", str(tmp_path / "store.db"), "--user", "a b"])
