"""The served agent over HTTP (helpers.serve, helpers.serve): chat completions with the episode, the store's
records, feedback, and every malformed request answered with a 4xx that changes nothing."""

import json

import httpx
import pytest

from helpers.serve.process import ServerProcess
from helpers.serve.store import SQLiteStore


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    store = tmp_path_factory.mktemp("serve") / "store.db"
    with ServerProcess(store, extra=["--burst", "40", "--rate", "0.01"]) as server:
        server.store_path = store
        yield server


def ask(server, user="ann", **extra):
    body = {"model": "tiny-agent", "temperature": 0,
            "messages": [{"role": "user", "content": "What do 3 of my usual items cost?"}], **extra}
    return httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=server.auth(user), timeout=60)


def test_chat_completion_returns_the_answer_and_the_episode_and_stores_what_training_needs(server):
    response = ask(server)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "chat.completion" and body["model"] == "tiny-agent"
    episode = body["episode"]
    assert body["choices"][0]["message"]["content"] == episode["messages"][-1]["content"]
    assert [m["role"] for m in episode["messages"][:2]] == ["system", "user"]
    assert episode["adapter_version"] == 0
    record = SQLiteStore(server.store_path).episode(episode["id"])
    assert len(record.token_ids) == len(record.mask) == len(record.logprobs) == body["usage"]["total_tokens"]
    assert sum(record.mask) == body["usage"]["completion_tokens"] > 0
    assert all(lp == 0.0 for lp, m in zip(record.logprobs, record.mask) if m == 0)
    assert record.world["item"] in record.world["prices"] and record.truth == str(3 * record.world["prices"][record.world["item"]])
    assert record.user == "ann"  # the key's user
    mine = httpx.get(f"{server.url}/v1/episodes/{episode['id']}", headers=server.auth("ann"))
    assert mine.json()["messages"] == episode["messages"]
    assert httpx.get(f"{server.url}/v1/episodes/{episode['id']}", headers=server.auth("bob")).status_code == 404  # not bob's


def test_good_feedback_is_stored_and_malformed_feedback_gets_a_clear_4xx_and_changes_nothing(server):
    episode = ask(server, user="bea").json()["episode"]["id"]
    url = f"{server.url}/v1/feedback"
    bea = server.auth("bea")
    ok = httpx.post(url, json={"episode_id": episode, "user": "bea", "rating": -1, "correct_answer": "1,234.0"}, headers=bea)
    assert ok.status_code == 201, ok.text
    assert ok.json()["correct_answer"] == "1234"
    store = SQLiteStore(server.store_path)
    before = store.feedback_count()
    other = ask(server, user="bea").json()["episode"]["id"]
    bad = [
        ({"episode_id": episode, "user": "bea", "rating": 1}, 409, "already has feedback"),  # duplicate
        ({"episode_id": "ep-nope", "user": "bea", "rating": 1}, 404, "no episode"),
        ({"episode_id": other, "user": "mallory", "rating": 1}, 403, "user who asked"),
        ({"episode_id": other, "user": "bea", "rating": 2}, 422, "rating must be 1"),
        ({"episode_id": other, "user": "bea", "rating": True}, 422, "rating"),
        ({"episode_id": other, "user": "bea", "rating": "1"}, 422, "rating"),
        ({"episode_id": other, "user": "bea", "correct_answer": "forty"}, 422, "must be a number"),
        ({"episode_id": other, "user": "bea", "correct_answer": "1e12"}, 422, "below 1e9"),
        ({"episode_id": other, "user": "bea", "correct_answer": "nan"}, 422, "number"),
        ({"episode_id": other, "user": "bea"}, 422, "give a rating"),
        ({"episode_id": other, "user": "bea", "rating": 1, "weight": 100}, 422, "Extra inputs"),
        ({"episode_id": other, "user": "", "rating": 1}, 422, "user"),
        ({"episode_id": other, "user": "bea", "rating": 1, "correct_answer": "9" * 200}, 422, "correct_answer"),
    ]
    for body, status, says in bad:
        response = httpx.post(url, json=body, headers=server.auth("mallory" if body.get("user") == "mallory" else "bea"))
        assert response.status_code == status, (body, response.text)
        assert says in response.json()["error"]["message"], (body, response.text)
    not_json = httpx.post(url, content=b"{not json", headers={"content-type": "application/json", **bea})
    assert not_json.status_code == 422
    huge = httpx.post(url, content=json.dumps({"episode_id": other, "user": "bea", "rating": 1, "pad": "x" * 20_000}),
                      headers={"content-type": "application/json", **bea})
    assert huge.status_code == 413 and "bytes" in huge.json()["error"]["message"]
    assert store.feedback_count() == before  # nothing changed
    assert httpx.post(url, json={"episode_id": other, "rating": 1}, headers=bea).status_code == 201  # still accepted after all that


def test_bad_chat_requests_get_4xx(server):
    assert ask(server, model="gpt-4").status_code == 404
    assert ask(server, model="tiny-agent@v99").status_code == 404
    assert ask(server, stream=True).status_code == 422
    assert ask(server, temperature=5).status_code == 422
    no_question = httpx.post(f"{server.url}/v1/chat/completions", json={"messages": [{"role": "system", "content": "hi"}]},
                             headers=server.auth("ann"))
    assert no_question.status_code == 422 and "user message" in no_question.json()["error"]["message"]
    assert ask(server, model="tiny-agent@v0").status_code == 200  # a pinned version


def test_admin_endpoints_need_the_token(server):
    assert httpx.post(f"{server.url}/v1/admin/rollback", json={"version": 0}).status_code == 403
    assert httpx.post(f"{server.url}/v1/admin/world", json={"items": ["key"]},
                      headers={"Authorization": "Bearer wrong"}).status_code == 403
    with pytest.raises(httpx.HTTPStatusError):
        server.admin("world", {"items": ["unicorn"]})


def test_a_user_over_the_rate_gets_429_with_retry_after(server):
    url = f"{server.url}/v1/feedback"
    spammer = server.auth("spammer")
    statuses = [httpx.post(url, json={"episode_id": "ep-nope", "rating": 1}, headers=spammer).status_code for _ in range(45)]
    assert statuses[:40] == [404] * 40  # the burst (40), each an unknown episode
    assert 429 in statuses[40:]
    refused = httpx.post(url, json={"episode_id": "ep-nope", "rating": 1}, headers=spammer)
    assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
    assert httpx.post(url, json={"episode_id": "ep-nope", "rating": 1}, headers=server.auth("someone-else")).status_code == 404  # per user


def test_the_web_page_is_served(server):
    page = httpx.get(server.url + "/")
    assert page.status_code == 200 and "/v1/chat/completions" in page.text and "/v1/feedback" in page.text


def test_the_store_protocol_lists_everything_the_service_asks_of_a_store():
    import re
    from pathlib import Path

    from helpers.serve.store import Store

    listed = {name for name in vars(Store) if not name.startswith("_")} | set(Store.__annotations__)
    sqlite = {name for name in vars(SQLiteStore) if not name.startswith("_")} | {"path"}
    assert listed <= sqlite, sorted(listed - sqlite)
    called = set()
    for source in Path("helpers/serve").glob("*.py"):
        called |= set(re.findall(r"\bstore\.(\w+)", source.read_text())) & sqlite  # not "store.db" or a Path's .parent
    assert called and called <= listed, sorted(called - listed)


def test_the_reply_is_the_agents_last_turn_even_when_the_episode_ends_on_a_tool_result():
    from helpers.serve.app import final_reply

    call = {"role": "assistant", "content": '<tool_call>\n{"name": "usual", "arguments": {}}\n</tool_call>'}
    answered = [{"role": "user", "content": "q"}, call, {"role": "tool", "content": '{"item": "pen"}'},
                {"role": "assistant", "content": "<answer>1,234.0</answer>"}]
    assert final_reply(answered) == ("<answer>1,234.0</answer>", "1234")
    cut_short = answered[:3]  # max_steps reached on the tool turn: the last message is the world's
    assert final_reply(cut_short) == (call["content"], None)
    beside_a_call = [{"role": "user", "content": "q"}, {"role": "assistant", "content": call["content"] + "<answer>5</answer>"},
                     {"role": "tool", "content": "7"}]
    assert final_reply(beside_a_call)[1] is None
